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
//!
//! # Layout
//! Floors point down: `index`, `figures` and `schedule` add to [`Queues`] what this file
//! defines; `stats` (the counters' types) stands below it.
//! - this file: the types, and the queues themselves (push, head, remove, drain);
//! - `line`: one lock's queue (its line and the waiters apart from it) and the walk to a
//!   list's first live id;
//! - `index`: what a waiter is found by besides its id and handle (its tag, its owner) and
//!   what it carries (its ACL user, its start);
//! - `figures`: who waits and how many, each queue's counters, how long waits lasted;
//! - `schedule`: the schedule of timed events (timeouts, lease checks, each lock's own check);
//! - `stats`: what the queues count (ends, per-queue counters, wait times);
//! - `id_hash`: the fast hasher of the maps keyed by module-numbered values (ids, handles,
//!   databases; lock names, owners and tags keep SipHash).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::Hash;

mod figures;
mod id_hash;
mod index;
mod line;
mod schedule;
mod stats;

use id_hash::IdMap;
use line::{live_front, Queue};
pub use stats::{End, QueueStats, WaitTimes, WAIT_BUCKETS_MS};

/// A waiter's id, unique for the life of the module.
pub type WaiterId = u64;

/// A lock: a key in one database.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LockName {
    pub db: i32,
    pub key: Vec<u8>,
}

/// What a waiter carries besides its request ([`Queues::enqueue`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Joining {
    /// The ACL user it asked as.
    pub user: Option<Vec<u8>>,
    /// When it started waiting (Unix ms).
    pub since: i64,
    /// Its owner (empty: none, a semaphore waiter's), indexed ([`Queues::waits_of`]).
    pub owner: Vec<u8>,
    /// Its tag (an acquire's request id).
    pub tag: Option<Vec<u8>>,
    /// It holds nothing and stands in nobody's line (a latch's awaiter): it is answered apart
    /// from the lock's other waiters ([`Queues::first_apart`]), who pass it by
    /// ([`Queues::in_line_head`]).
    pub apart: bool,
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
    /// It waits apart from the line ([`Joining::apart`]).
    apart: bool,
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

/// All queues, the waiter table and the schedule.
#[derive(Debug)]
pub struct Queues<H, R> {
    by_db: IdMap<i32, HashMap<Vec<u8>, Queue>>,
    waiters: IdMap<WaiterId, Waiter<H, R>>,
    by_handle: IdMap<H, WaiterId>,
    /// Tagged waiters by (database, lock, tag).
    by_tag: HashMap<(i32, Vec<u8>, Vec<u8>), WaiterId>,
    /// Waiters by database, then owner: where each owner waits (the wait-for graph's edges
    /// start here; looked up by a borrowed owner, without a copy). An owner may wait in several
    /// queues at once (several connections).
    by_owner: IdMap<i32, HashMap<Vec<u8>, BTreeSet<WaiterId>>>,
    /// How long the waits that ended lasted.
    wait_times: WaitTimes,
    schedule: BTreeMap<Slot, Event>,
    /// Each lock's own check (`Event::Check`), waiters or not.
    checks: HashMap<LockName, Slot>,
    next_id: WaiterId,
    next_seq: u64,
    /// Queue entries looked at so far (heads found, ids of waiters that left skipped, lists
    /// compacted): the queues' share of the work a timer tick is bounded by.
    walked: u64,
}

impl<H, R> Default for Queues<H, R> {
    fn default() -> Self {
        Self {
            by_db: IdMap::default(),
            waiters: IdMap::default(),
            by_handle: IdMap::default(),
            by_tag: HashMap::new(),
            by_owner: IdMap::default(),
            wait_times: WaitTimes::default(),
            schedule: BTreeMap::new(),
            checks: HashMap::new(),
            next_id: 1,
            next_seq: 0,
            walked: 0,
        }
    }
}

impl<H: Copy + Eq + Hash, R> Queues<H, R> {
    /// Puts a waiter at the tail of `lock`'s queue; `timeout_at` (Unix ms) schedules its
    /// timeout. It carries nothing else (see [`Self::enqueue`]).
    pub fn push(
        &mut self,
        lock: LockName,
        request: R,
        handle: H,
        timeout_at: Option<i64>,
    ) -> WaiterId {
        self.enqueue(lock, request, handle, timeout_at, Joining::default())
    }

    /// [`Self::push`], the waiter carrying `joining` from the start (its user, start, owner
    /// index and tag, as [`Self::set_user`], [`Self::set_since`], [`Self::set_owner`] and
    /// [`Self::set_tag`] would set them, in one insert). A tag another waiter of the lock has
    /// is not set.
    pub fn enqueue(
        &mut self,
        lock: LockName,
        request: R,
        handle: H,
        timeout_at: Option<i64>,
        joining: Joining,
    ) -> WaiterId {
        let id = self.next_id;
        self.next_id += 1;
        let timeout = timeout_at.map(|at| self.add_event(at, Event::Timeout(id)));
        let queue = self.by_db.entry(lock.db).or_default().entry(lock.key.clone()).or_default();
        queue.list_mut(joining.apart).push_back(id);
        queue.live += 1;
        queue.apart += usize::from(joining.apart);
        queue.stats.waits = queue.stats.waits.saturating_add(1);
        self.by_handle.insert(handle, id);
        let Joining { user, since, owner, tag, apart } = joining;
        let owner = (!owner.is_empty()).then(|| {
            let owners = self.by_owner.entry(lock.db).or_default();
            owners.entry(owner.clone()).or_default().insert(id);
            owner
        });
        let tag = tag.filter(|tag| {
            let index = (lock.db, lock.key.clone(), tag.clone());
            !self.by_tag.contains_key(&index) && self.by_tag.insert(index, id).is_none()
        });
        let waiter = Waiter { id, lock, request, handle, user, timeout, tag, since, owner, apart };
        self.waiters.insert(id, waiter);
        id
    }

    /// Queue entries looked at so far (wrapping): heads found, ids of waiters that left
    /// skipped, lists compacted. Finding a head costs O(1) amortized, however many wait apart
    /// from the line or in it.
    #[must_use]
    pub const fn walked(&self) -> u64 {
        self.walked
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
        let line = live_front(&mut queue.line, &self.waiters, &mut self.walked);
        let aside = live_front(&mut queue.aside, &self.waiters, &mut self.walked);
        let id = match (line, aside) {
            (Some(a), Some(b)) => a.min(b),
            (a, b) => a.or(b)?,
        };
        self.waiters.get(&id)
    }

    /// The longest-waiting client of a lock that stands in its line (not [`Joining::apart`]),
    /// left in its queue, however many wait apart.
    pub fn in_line_head(&mut self, db: i32, key: &[u8]) -> Option<&Waiter<H, R>> {
        let queue = self.by_db.get_mut(&db)?.get_mut(key)?;
        let id = live_front(&mut queue.line, &self.waiters, &mut self.walked)?;
        self.waiters.get(&id)
    }

    /// The longest-waiting client of a lock that waits apart from its line
    /// ([`Joining::apart`]), left in its queue; `None` at once when none does.
    pub fn first_apart(&mut self, db: i32, key: &[u8]) -> Option<&Waiter<H, R>> {
        let queue = self.by_db.get_mut(&db)?.get_mut(key)?;
        if queue.apart == 0 {
            return None;
        }
        let id = live_front(&mut queue.aside, &self.waiters, &mut self.walked)?;
        self.waiters.get(&id)
    }

    /// Takes every waiter of a lock that waits apart from its line ([`Joining::apart`]) out
    /// of its queue, in order, each ending as `end` at `now` (an open latch's awaiters,
    /// wherever they stand).
    pub fn take_apart(&mut self, db: i32, key: &[u8], end: End, now: i64) -> Vec<Waiter<H, R>> {
        let Some(queue) = self.by_db.get_mut(&db).and_then(|q| q.get_mut(key)) else {
            return Vec::new();
        };
        if queue.apart == 0 {
            return Vec::new();
        }
        let ids = std::mem::take(&mut queue.aside);
        self.walked += ids.len() as u64;
        ids.into_iter().filter_map(|id| self.remove_as(id, end, Some(now))).collect()
    }

    /// How many clients wait for the lock `key` of database `db` in its line (not
    /// [`Joining::apart`]): those a newcomer must not pass.
    #[must_use]
    pub fn in_line(&self, db: i32, key: &[u8]) -> usize {
        self.queue(db, key).map_or(0, |q| q.live - q.apart)
    }

    /// Takes the longest-waiting client of a lock out of its queue.
    pub fn pop_head(&mut self, db: i32, key: &[u8]) -> Option<Waiter<H, R>> {
        let id = self.head(db, key)?.id;
        self.remove(id)
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
        queue.apart -= usize::from(waiter.apart);
        if queue.live > 0 {
            let live = if waiter.apart { queue.apart } else { queue.live - queue.apart };
            let list = queue.list_mut(waiter.apart);
            if list.len() > 2 * live + 16 {
                self.walked += list.len() as u64;
                let waiters = &self.waiters;
                list.retain(|id| waiters.contains_key(id));
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
