//! Server-side waiting, the plain-Rust part: a FIFO queue of waiters per lock and one schedule of
//! timed events (waiter timeouts, checks at a holder's lease deadline). No Redis here: `waiting`
//! drives it, and unit tests drive it directly.
//!
//! A waiter carries its lock kind's request (`R`, opaque here): the queue knows order and time,
//! the kind's rules decide who at the head can be granted. A hand-off looks at the head
//! ([`Queues::head`]), grants it, and looks again, so one hand-off can grant several waiters in
//! order (readers up to the next writer, semaphore waiters while permits last) and stops at the
//! first it cannot grant.
//!
//! Every operation is O(1) or O(log n) in the number of waiters: a waiter leaving from the middle
//! of a queue (timeout, disconnect) is removed from the waiter table at once and its id skipped
//! lazily when it reaches the head; the queue is compacted when dead ids outnumber live ones.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::hash::Hash;

mod stats;

pub use stats::{End, QueueStats, WaitTimes, WAIT_BUCKETS_MS};

/// A waiter's id, unique for the life of the module.
pub type WaiterId = u64;

/// A lock: a key in one database.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LockName {
    pub db: i32,
    pub key: Vec<u8>,
}

/// A client waiting for a lock. `H` is the server's handle on the blocked client, `R` what it
/// asks for (its lock kind's request).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Waiter<H, R> {
    pub id: WaiterId,
    pub lock: LockName,
    pub request: R,
    pub handle: H,
    /// The ACL user it asked as (its grant is checked as that user); `None`: no user.
    pub user: Option<Vec<u8>>,
    /// Where its timeout sits in the schedule, if it has one.
    timeout: Option<Slot>,
    /// Its tag (an acquire's request id), unique among its lock's waiters.
    tag: Option<Vec<u8>>,
    /// When it started waiting (Unix ms; 0 until [`Queues::set_since`]).
    pub since: i64,
    /// The owner it is indexed under ([`Queues::set_owner`]): a waiter that holds nothing
    /// (a semaphore's) has none.
    owner: Option<Vec<u8>>,
}

impl<H, R> Waiter<H, R> {
    /// When its wait budget runs out (Unix ms); `None`: it waits without limit (or its timeout
    /// is being served now).
    #[must_use]
    pub fn timeout_at(&self) -> Option<i64> {
        self.timeout.map(|(at, _)| at)
    }

    /// Its tag (an acquire's request id), if it has one.
    #[must_use]
    pub fn tag(&self) -> Option<&[u8]> {
        self.tag.as_deref()
    }
}

/// A timed event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A waiter's wait budget ran out.
    Timeout(WaiterId),
    /// A lock with waiters reaches its holder's lease deadline: see whether it expired.
    LeaseCheck(LockName),
    /// A lock's own check, waiters or not (a read-write lock whose read hold ends: its reader
    /// may have to leave).
    Check(LockName),
}

/// How often a lock with waiters is looked at while its head cannot be granted (Unix ms
/// between looks): a lock freed without an rlock command (a Redisson client's unlock script, a
/// `DEL`, eviction, a `SET` of permits) is handed off within this. The module subscribes to no
/// keyspace event, so that loading it costs other workloads nothing.
pub const POLL_MS: i64 = 10;

/// At most this many such looks a second over all locks: with more locks waited for, each is
/// looked at less often.
pub const POLLS_PER_SECOND: usize = 5_000;

/// A position in the schedule: (time in Unix ms, sequence number for ties).
type Slot = (i64, u64);

#[derive(Debug, Default)]
struct Queue {
    order: VecDeque<WaiterId>,
    live: usize,
    lease_check: Option<Slot>,
    stats: QueueStats,
}

/// All queues, the waiter table and the schedule.
#[derive(Debug)]
pub struct Queues<H, R> {
    by_db: HashMap<i32, HashMap<Vec<u8>, Queue>>,
    waiters: HashMap<WaiterId, Waiter<H, R>>,
    by_handle: HashMap<H, WaiterId>,
    /// Tagged waiters by (database, lock, tag).
    by_tag: HashMap<(i32, Vec<u8>, Vec<u8>), WaiterId>,
    /// Waiters by database, then owner: where each owner waits (the wait-for graph's edges
    /// start here; looked up by a borrowed owner, without a copy). An owner may wait in several
    /// queues at once (several connections).
    by_owner: HashMap<i32, HashMap<Vec<u8>, BTreeSet<WaiterId>>>,
    /// How long the waits that ended lasted.
    wait_times: WaitTimes,
    schedule: BTreeMap<Slot, Event>,
    /// Each lock's own check (`Event::Check`), waiters or not.
    checks: HashMap<LockName, Slot>,
    next_id: WaiterId,
    next_seq: u64,
}

impl<H, R> Default for Queues<H, R> {
    fn default() -> Self {
        Self {
            by_db: HashMap::new(),
            waiters: HashMap::new(),
            by_handle: HashMap::new(),
            by_tag: HashMap::new(),
            by_owner: HashMap::new(),
            wait_times: WaitTimes::default(),
            schedule: BTreeMap::new(),
            checks: HashMap::new(),
            next_id: 1,
            next_seq: 0,
        }
    }
}

impl<H: Copy + Eq + Hash, R> Queues<H, R> {
    /// Puts a waiter at the tail of `lock`'s queue; `timeout_at` (Unix ms) schedules its
    /// timeout.
    pub fn push(
        &mut self,
        lock: LockName,
        request: R,
        handle: H,
        timeout_at: Option<i64>,
    ) -> WaiterId {
        let id = self.next_id;
        self.next_id += 1;
        let timeout = timeout_at.map(|at| self.add_event(at, Event::Timeout(id)));
        let queue = self.by_db.entry(lock.db).or_default().entry(lock.key.clone()).or_default();
        queue.order.push_back(id);
        queue.live += 1;
        queue.stats.waits = queue.stats.waits.saturating_add(1);
        self.by_handle.insert(handle, id);
        let waiter = Waiter {
            id,
            lock,
            request,
            handle,
            user: None,
            timeout,
            tag: None,
            since: 0,
            owner: None,
        };
        self.waiters.insert(id, waiter);
        id
    }

    /// Tags waiter `id` with `tag` (an acquire's request id), unique among its lock's waiters:
    /// false, and nothing tagged, when another waiter of the lock has it (or `id` has a tag).
    pub fn set_tag(&mut self, id: WaiterId, tag: Vec<u8>) -> bool {
        let Some(waiter) = self.waiters.get_mut(&id) else { return false };
        let index = (waiter.lock.db, waiter.lock.key.clone(), tag);
        if waiter.tag.is_some() || self.by_tag.contains_key(&index) {
            return false;
        }
        waiter.tag = Some(index.2.clone());
        self.by_tag.insert(index, id);
        true
    }

    /// The waiter of the lock `key` of database `db` tagged `tag`.
    #[must_use]
    pub fn find_tagged(&self, db: i32, key: &[u8], tag: &[u8]) -> Option<WaiterId> {
        if self.by_tag.is_empty() {
            return None;
        }
        self.by_tag.get(&(db, key.to_vec(), tag.to_vec())).copied()
    }

    /// Records when waiter `id` started waiting (Unix ms).
    pub fn set_since(&mut self, id: WaiterId, now: i64) {
        if let Some(waiter) = self.waiters.get_mut(&id) {
            waiter.since = now;
        }
    }

    /// Indexes waiter `id` under `owner` ([`Self::waits_of`]); an empty owner (a semaphore
    /// waiter's) is not indexed. Once per waiter.
    pub fn set_owner(&mut self, id: WaiterId, owner: &[u8]) {
        let Some(waiter) = self.waiters.get_mut(&id) else { return };
        if owner.is_empty() || waiter.owner.is_some() {
            return;
        }
        waiter.owner = Some(owner.to_vec());
        let owners = self.by_owner.entry(waiter.lock.db).or_default();
        owners.entry(owner.to_vec()).or_default().insert(id);
    }

    /// The waiters of database `db` indexed under `owner` ([`Self::set_owner`]), oldest first.
    pub fn waits_of(&self, db: i32, owner: &[u8]) -> impl Iterator<Item = &Waiter<H, R>> + '_ {
        self.by_owner
            .get(&db)
            .and_then(|owners| owners.get(owner))
            .into_iter()
            .flatten()
            .filter_map(|id| self.waiters.get(id))
    }

    /// Whether any waiter of database `db` is indexed under `owner`: one lookup, no copy.
    #[must_use]
    pub fn owner_waits(&self, db: i32, owner: &[u8]) -> bool {
        self.by_owner.get(&db).is_some_and(|owners| owners.contains_key(owner))
    }

    /// Whether any waiter is indexed under an owner (in any database).
    #[must_use]
    pub fn any_owner_waits(&self) -> bool {
        !self.by_owner.is_empty()
    }

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
            .order
            .iter()
            .filter_map(|id| self.waiters.get(id))
            .filter(|w| matching(&w.request))
            .take(count)
            .collect()
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

    /// Records the ACL user waiter `id` asked as.
    pub fn set_user(&mut self, id: WaiterId, user: Option<Vec<u8>>) {
        if let Some(waiter) = self.waiters.get_mut(&id) {
            waiter.user = user;
        }
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
        let waiters = queue.order.iter().filter_map(|id| self.waiters.get(id));
        waiters.filter(|w| matching(&w.request)).count()
    }

    /// The sum of `value` over the waiters of the lock `key` of database `db`, saturating (a
    /// sum of client-chosen numbers never wraps).
    #[must_use]
    pub fn waiting_sum(&self, db: i32, key: &[u8], value: impl Fn(&R) -> u64) -> u64 {
        let Some(queue) = self.queue(db, key) else { return 0 };
        let waiters = queue.order.iter().filter_map(|id| self.waiters.get(id));
        waiters.fold(0, |sum: u64, w| sum.saturating_add(value(&w.request)))
    }

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

    /// How many clients wait, over all locks.
    #[must_use]
    pub fn total(&self) -> usize {
        self.waiters.len()
    }

    /// The waiter with this id, while it waits.
    #[must_use]
    pub fn get(&self, id: WaiterId) -> Option<&Waiter<H, R>> {
        self.waiters.get(&id)
    }

    /// The waiting client with this server handle.
    #[must_use]
    pub fn find(&self, handle: H) -> Option<WaiterId> {
        self.by_handle.get(&handle).copied()
    }

    /// The longest-waiting client of a lock, left in its queue (a hand-off asks the lock
    /// kind's rules whether it can be granted, then [`Self::remove`]s it).
    pub fn head(&mut self, db: i32, key: &[u8]) -> Option<&Waiter<H, R>> {
        let queue = self.by_db.get_mut(&db)?.get_mut(key)?;
        // Ids of waiters that left are skipped (and dropped) here.
        while let Some(&id) = queue.order.front() {
            if self.waiters.contains_key(&id) {
                return self.waiters.get(&id);
            }
            queue.order.pop_front();
        }
        None
    }

    /// Takes the longest-waiting client of a lock out of its queue.
    pub fn pop_head(&mut self, db: i32, key: &[u8]) -> Option<Waiter<H, R>> {
        let queue = self.by_db.get_mut(&db)?.get_mut(key)?;
        while let Some(id) = queue.order.pop_front() {
            if self.waiters.contains_key(&id) {
                return self.remove(id);
            }
        }
        None
    }

    /// Removes a waiter (granted, timed out, or gone), wherever it stands in its queue, as
    /// [`End::Left`], its wait time not recorded.
    pub fn remove(&mut self, id: WaiterId) -> Option<Waiter<H, R>> {
        self.remove_as(id, End::Left, None)
    }

    /// Removes a waiter, counting how it ended in its queue's counters and, given the time
    /// `now` (Unix ms), its wait time in [`Self::wait_times`].
    pub fn remove_as(&mut self, id: WaiterId, end: End, now: Option<i64>) -> Option<Waiter<H, R>> {
        let mut waiter = self.waiters.remove(&id)?;
        if let Some(now) = now {
            self.wait_times.record(now.saturating_sub(waiter.since));
        }
        self.by_handle.remove(&waiter.handle);
        if let Some(owner) = waiter.owner.take() {
            if let Some(owners) = self.by_owner.get_mut(&waiter.lock.db) {
                if let Some(ids) = owners.get_mut(&owner) {
                    ids.remove(&id);
                    if ids.is_empty() {
                        owners.remove(&owner);
                    }
                }
                if owners.is_empty() {
                    self.by_owner.remove(&waiter.lock.db);
                }
            }
        }
        if let Some(tag) = waiter.tag.take() {
            self.by_tag.remove(&(waiter.lock.db, waiter.lock.key.clone(), tag));
        }
        if let Some(slot) = waiter.timeout {
            self.schedule.remove(&slot);
        }
        let LockName { db, key } = &waiter.lock;
        let Some(queues) = self.by_db.get_mut(db) else { return Some(waiter) };
        let Some(queue) = queues.get_mut(key.as_slice()) else { return Some(waiter) };
        match end {
            End::Granted => queue.stats.handoffs = queue.stats.handoffs.saturating_add(1),
            End::TimedOut => queue.stats.timeouts = queue.stats.timeouts.saturating_add(1),
            End::Left => {}
        }
        queue.live -= 1;
        if queue.live > 0 {
            if queue.order.len() > 2 * queue.live + 16 {
                let waiters = &self.waiters;
                queue.order.retain(|id| waiters.contains_key(id));
            }
            return Some(waiter);
        }
        // The last waiter left: the queue and its lease check go.
        if let Some(slot) = queue.lease_check {
            self.schedule.remove(&slot);
        }
        queues.remove(key.as_slice());
        if queues.is_empty() {
            self.by_db.remove(db);
        }
        Some(waiter)
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

    /// Drops the own checks of every lock of database `db` (`None`: of every database).
    pub fn drop_checks(&mut self, db: Option<i32>) {
        let schedule = &mut self.schedule;
        self.checks.retain(|lock, slot| {
            let keep = db.is_some_and(|db| lock.db != db);
            if !keep {
                schedule.remove(slot);
            }
            keep
        });
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

    /// Every lock somebody waits for.
    #[must_use]
    pub fn locks(&self) -> Vec<LockName> {
        let mut locks: Vec<LockName> = self
            .by_db
            .iter()
            .flat_map(|(&db, q)| q.keys().map(move |key| LockName { db, key: key.clone() }))
            .collect();
        locks.sort();
        locks
    }

    /// Removes every waiter, each queue in FIFO order.
    pub fn drain(&mut self) -> Vec<Waiter<H, R>> {
        let mut all = Vec::with_capacity(self.total());
        for lock in self.locks() {
            while let Some(w) = self.pop_head(lock.db, &lock.key) {
                all.push(w);
            }
        }
        all
    }

    fn queue(&self, db: i32, key: &[u8]) -> Option<&Queue> {
        self.by_db.get(&db)?.get(key)
    }

    fn add_event(&mut self, at: i64, event: Event) -> Slot {
        let slot = (at, self.next_seq);
        self.next_seq += 1;
        self.schedule.insert(slot, event);
        slot
    }
}
