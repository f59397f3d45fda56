//! What the queues say about themselves: who waits for a lock and how many (`*.WAITERS`, the
//! kinds' rules), each queue's counters and how long the waits that ended lasted (`*.INFO`,
//! `INFO rlock`).

use std::hash::Hash;

use super::{QueueStats, Queues, WaitTimes, Waiter};

impl<H: Copy + Eq + Hash, R> Queues<H, R> {
    /// The first `count` waiters of the lock `key` of database `db` whose request is
    /// `matching`, in queue order. Visits the queue until it has `count` of them (dead ids of
    /// waiters that left are skipped; the queue is compacted when they outnumber live ones).
    #[must_use]
    pub fn list(
        &self,
        db: i32,
        key: &[u8],
        count: usize,
        matching: impl Fn(&R) -> bool,
    ) -> Vec<&Waiter<H, R>> {
        let Some(queue) = self.queue(db, key) else { return Vec::new() };
        queue
            .ids()
            .filter_map(|id| self.waiters.get(&id))
            .filter(|w| matching(&w.request))
            .take(count)
            .collect()
    }

    /// How many clients wait for the lock `key` of database `db`.
    #[must_use]
    pub fn waiting(&self, db: i32, key: &[u8]) -> usize {
        self.queue(db, key).map_or(0, |q| q.live)
    }

    /// How many clients wait for the lock `key` of database `db` with a request `matching`.
    #[must_use]
    pub fn waiting_for(&self, db: i32, key: &[u8], matching: impl Fn(&R) -> bool) -> usize {
        let Some(queue) = self.queue(db, key) else { return 0 };
        let waiters = queue.line.iter().chain(&queue.aside).filter_map(|id| self.waiters.get(id));
        waiters.filter(|w| matching(&w.request)).count()
    }

    /// The sum of `value` over the waiters of the lock `key` of database `db`, saturating (a
    /// sum of client-chosen numbers never wraps).
    #[must_use]
    pub fn waiting_sum(&self, db: i32, key: &[u8], value: impl Fn(&R) -> u64) -> u64 {
        let Some(queue) = self.queue(db, key) else { return 0 };
        let waiters = queue.line.iter().chain(&queue.aside).filter_map(|id| self.waiters.get(id));
        waiters.fold(0, |sum: u64, w| sum.saturating_add(value(&w.request)))
    }

    /// The counters of the lock `key`'s queue in database `db` (zero when nobody waits).
    #[must_use]
    pub fn stats(&self, db: i32, key: &[u8]) -> QueueStats {
        self.queue(db, key).map_or_else(QueueStats::default, |q| q.stats)
    }

    /// How long the waits that ended lasted (every end: granted, timed out, left).
    #[must_use]
    pub fn wait_times(&self) -> WaitTimes {
        self.wait_times
    }

    /// Forgets how long the waits that ended lasted (the module is loaded again: `INFO rlock`
    /// starts from zero).
    pub fn reset_wait_times(&mut self) {
        self.wait_times = WaitTimes::default();
    }

    /// Records a wait that began at `since` and ended at `now` (Unix ms) in [`Self::wait_times`]
    /// (for waiters taken out by [`Self::pop_head`] or [`Self::drain`]).
    pub fn record_wait(&mut self, since: i64, now: i64) {
        self.wait_times.record(now.saturating_sub(since));
    }
}
