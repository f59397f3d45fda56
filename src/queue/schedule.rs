//! The schedule of timed events: waiter timeouts (armed by [`Queues::push`]), a lock's lease
//! check while it has waiters, each lock's own check (waiters or not), and when to look at a
//! lock with waiters again.

use std::collections::HashMap;
use std::hash::Hash;

use super::{Event, LockName, Queues, Slot, POLLS_PER_SECOND, POLL_MS};

impl<H: Copy + Eq + Hash, R> Queues<H, R> {
    /// When to look at a lock with waiters again, at `now`: at `due` (its holder's lease end, if
    /// known) or at the next poll, whichever comes first. Polls fall on multiples of their period,
    /// [`POLL_MS`], longer when more locks are waited for than [`POLLS_PER_SECOND`] allows at
    /// that period.
    #[must_use]
    pub fn look_again_at(&self, now: i64, due: Option<i64>) -> i64 {
        let locks: usize = self.by_db.values().map(HashMap::len).sum();
        let spread =
            i64::try_from(locks.saturating_mul(1000) / POLLS_PER_SECOND).unwrap_or(i64::MAX);
        let period = POLL_MS.max(spread);
        // On a grid of the period: every lock's poll comes due in the same timer tick, so the
        // server wakes up once a period, however many locks are waited for.
        let poll = (now / period).saturating_add(1).saturating_mul(period);
        due.map_or(poll, |due| due.min(poll))
    }

    /// Schedules a check of `lock` at `at` (its holder's lease deadline), replacing the previous
    /// one. Does nothing for a lock nobody waits for.
    pub fn schedule_lease_check(&mut self, lock: &LockName, at: i64) {
        let Some(current) = self.queue(lock.db, &lock.key).map(|q| q.lease_check) else {
            return;
        };
        if current.is_some_and(|(when, _)| when == at) {
            return;
        }
        if let Some(slot) = current {
            self.schedule.remove(&slot);
        }
        let slot = self.add_event(at, Event::LeaseCheck(lock.clone()));
        if let Some(queue) = self.by_db.get_mut(&lock.db).and_then(|q| q.get_mut(&lock.key)) {
            queue.lease_check = Some(slot);
        }
    }

    /// Schedules `lock`'s own check at `at` (Unix ms), whether anyone waits for it or not; an
    /// earlier check already scheduled stays (it schedules the next one itself).
    pub fn schedule_check(&mut self, lock: &LockName, at: i64) {
        if self.checks.get(lock).is_some_and(|&(when, _)| when <= at) {
            return;
        }
        if let Some(slot) = self.checks.remove(lock) {
            self.schedule.remove(&slot);
        }
        let slot = self.add_event(at, Event::Check(lock.clone()));
        self.checks.insert(lock.clone(), slot);
    }

    /// Whether `lock` has its own check scheduled.
    #[must_use]
    pub fn has_check(&self, lock: &LockName) -> bool {
        self.checks.contains_key(lock)
    }

    /// Drops `lock`'s own check (its holds are gone); whether it had one.
    pub fn drop_check(&mut self, lock: &LockName) -> bool {
        let Some(slot) = self.checks.remove(lock) else { return false };
        self.schedule.remove(&slot);
        true
    }

    /// Every own check is moved to `now` (each then reschedules itself at its lock's next
    /// deadline, or goes when its lock holds nothing), when there are at most `at_most`;
    /// whether they were.
    pub fn relook_checks(&mut self, at_most: usize, now: i64) -> bool {
        if self.checks.len() > at_most {
            return false;
        }
        let locks: Vec<LockName> = self.checks.keys().cloned().collect();
        locks.iter().for_each(|lock| self.schedule_check(lock, now));
        true
    }

    /// Drops the own checks of every lock of database `db` (`None`: of every database); returns
    /// them (lock, when), to be scheduled again should the flush be a reload's.
    pub fn drop_checks(&mut self, db: Option<i32>) -> Vec<(LockName, i64)> {
        let schedule = &mut self.schedule;
        let mut dropped = Vec::new();
        self.checks.retain(|lock, slot| {
            let keep = db.is_some_and(|db| lock.db != db);
            if !keep {
                schedule.remove(slot);
                dropped.push((lock.clone(), slot.0));
            }
            keep
        });
        dropped
    }

    /// `SWAPDB first second`: the own checks of the locks of the two databases follow their data.
    pub fn swap_checks(&mut self, first: i32, second: i32) {
        let swap = |db: i32| match db {
            db if db == first => second,
            db if db == second => first,
            db => db,
        };
        let moved: Vec<(LockName, Slot)> = self
            .checks
            .iter()
            .filter(|(lock, _)| lock.db == first || lock.db == second)
            .map(|(lock, slot)| (lock.clone(), *slot))
            .collect();
        for (lock, _) in &moved {
            self.checks.remove(lock);
        }
        for (lock, slot) in moved {
            let lock = LockName { db: swap(lock.db), key: lock.key };
            self.schedule.insert(slot, Event::Check(lock.clone()));
            self.checks.insert(lock, slot);
        }
    }

    /// How many locks have a check scheduled.
    #[must_use]
    pub fn checks(&self) -> usize {
        self.checks.len()
    }

    /// The time of the earliest scheduled event.
    #[must_use]
    pub fn next_due(&self) -> Option<i64> {
        self.schedule.keys().next().map(|&(when, _)| when)
    }

    /// Takes the earliest event due at `now` or before, if any.
    pub fn pop_due(&mut self, now: i64) -> Option<Event> {
        let (&slot, _) = self.schedule.iter().next().filter(|((when, _), _)| *when <= now)?;
        let event = self.schedule.remove(&slot)?;
        match &event {
            Event::Timeout(id) => {
                if let Some(w) = self.waiters.get_mut(id) {
                    w.timeout = None;
                }
            }
            Event::LeaseCheck(lock) => {
                if let Some(q) = self.by_db.get_mut(&lock.db).and_then(|q| q.get_mut(&lock.key)) {
                    q.lease_check = None;
                }
            }
            Event::Check(lock) => {
                self.checks.remove(lock);
            }
        }
        Some(event)
    }
}
