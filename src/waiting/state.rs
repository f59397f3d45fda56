//! The waiting machinery's state, at the bottom of its floors: the queues of every lock
//! (blocked clients, FIFO), the counters of `INFO rlock`, and what the floors above ask of them
//! (who waits, a lock's name, a waiter unblocked with its outcome). Nothing here calls up.

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};

use redis_module::{Context, RedisString};

use crate::error::LockError;
use crate::queue::{LockName, Queues, Waiter};
use crate::raw::{self, Blocked};
use crate::rules::{Reply, Request};
use crate::store::waiters::Stamp;

/// What a blocked waiter is unblocked with; its reply callback turns it into the reply.
#[derive(Debug)]
pub enum Outcome {
    /// It holds the lock as it asked (`request`): reply `reply` (nil, or `[1, token]`).
    /// With leased permits, `ids` (their ids) is the reply.
    /// `stamp` tells this grant apart, should it have to be undone.
    Granted { lock: LockName, request: Request, reply: Reply, ids: Vec<Vec<u8>>, stamp: Stamp },
    /// Its budget ran out: reply `reply` (the holder's remaining lease, or `[0, pttl]`).
    TimedOut(Reply),
    /// A latch awaiter whose latch opened: reply 1 (it holds nothing: nothing to undo).
    Opened,
    /// Reply this error.
    Failed(LockError),
    /// Reply this cluster redirection (`MOVED ...`, `ASK ...`, `CLUSTERDOWN ...`).
    Redirect(String),
}

thread_local! {
    // Redis runs every module callback on its main thread. Borrows of this cell never span a
    // call into Redis that may call back into this module (a key expiring on open fires a
    // keyspace event, say).
    pub(super) static QUEUES: RefCell<Queues<Blocked, Request>> = RefCell::new(Queues::default());
}

/// Counters for `INFO rlock`.
pub struct Stats {
    pub waits: AtomicU64,
    pub handoffs: AtomicU64,
    pub timeouts: AtomicU64,
    pub left: AtomicU64,
    pub rollbacks: AtomicU64,
    /// Read-write lock checks that removed readers whose every hold lease had ended.
    pub reaps: AtomicU64,
    /// Latches opened by `RLATCH.COUNTDOWN` (to zero) or `RLATCH.DELETE`.
    pub latch_opens: AtomicU64,
    /// Latch awaiters answered 1 because their latch opened (counted apart from hand-offs).
    pub latch_releases: AtomicU64,
    /// Work the module's timer ticks did, in units of `raw::work` and queue entries walked.
    pub timer_work: AtomicU64,
    /// Timer ticks that stopped at their budget (`timers::TICK_BUDGET`), leaving the rest of
    /// their work to the next tick.
    pub ticks_split: AtomicU64,
}

pub static STATS: Stats = Stats {
    waits: AtomicU64::new(0),
    handoffs: AtomicU64::new(0),
    timeouts: AtomicU64::new(0),
    left: AtomicU64::new(0),
    rollbacks: AtomicU64::new(0),
    reaps: AtomicU64::new(0),
    latch_opens: AtomicU64::new(0),
    latch_releases: AtomicU64::new(0),
    timer_work: AtomicU64::new(0),
    ticks_split: AtomicU64::new(0),
};

pub(super) fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

pub(super) fn with_queues<R>(f: impl FnOnce(&mut Queues<Blocked, Request>) -> R) -> R {
    QUEUES.with(|q| f(&mut q.borrow_mut()))
}

/// How many clients wait, over all locks (counted as waiting when the queues are in use: this is
/// asked from events that may fire inside the module's own work).
pub fn total_waiting() -> usize {
    QUEUES.with(|q| q.try_borrow().map_or(1, |q| q.total()))
}

/// `SWAPDB first second`: the own checks of the two databases' locks follow their data.
pub fn swap_checks(first: i32, second: i32) {
    QUEUES.with(|q| {
        if let Ok(mut q) = q.try_borrow_mut() {
            q.swap_checks(first, second);
        }
    });
}

/// How many locks have a check of their own scheduled (`INFO rlock`).
pub fn scheduled_checks() -> usize {
    QUEUES.with(|q| q.try_borrow().map_or(0, |q| q.checks()))
}

/// Whether anyone waits for any lock (the fast path of every command).
pub fn anyone_waits() -> bool {
    total_waiting() > 0
}

/// How many clients wait for the lock `key` of database `db` (counted as waiting when the
/// queues are in use).
pub fn waiting(db: i32, key: &[u8]) -> usize {
    QUEUES.with(|q| q.try_borrow().map_or(1, |q| q.waiting(db, key)))
}

/// How many clients wait in the line of the lock `key` of database `db`: those a newcomer must
/// not pass (a latch's awaiters, waiting apart, are in nobody's way; counted as waiting when
/// the queues are in use).
pub fn in_line(db: i32, key: &[u8]) -> usize {
    QUEUES.with(|q| q.try_borrow().map_or(1, |q| q.in_line(db, key)))
}

/// Whether anyone waits for the lock `name` (no allocation: this runs on every RLOCK write).
pub(super) fn waits_for(ctx: &Context, name: &RedisString) -> bool {
    anyone_waits() && with_queues(|q| q.waiting(raw::selected_db(ctx), name.as_slice()) > 0)
}

/// The lock `name` in the context's selected database.
pub fn lock_name(ctx: &Context, name: &RedisString) -> LockName {
    LockName { db: raw::selected_db(ctx), key: name.as_slice().to_vec() }
}

/// Unblocks a waiter taken out of its queue.
pub(super) fn unblock(waiter: Waiter<Blocked, Request>, outcome: Outcome) {
    raw::unblock_client::<Waiting>(waiter.handle, Some(outcome));
}

/// Schedules the next look at a lock whose waiters (if any are left) wait: at `due` (its
/// holder's lease end, if known) or at the next poll, whichever comes first.
pub(super) fn look_again(lock: &LockName, due: Option<i64>) {
    with_queues(|q| {
        let at = q.look_again_at(raw::now_ms(), due);
        q.schedule_lease_check(lock, at);
    });
}

/// The blocked-client callbacks of `RLOCK.ACQUIRE ... WAIT` (see [`BlockHandler`]).
pub struct Waiting;
/// Selects the lock's database and gives its name, for work done from a timer.
pub(super) fn open_db(ctx: &Context, lock: &LockName) -> Option<RedisString> {
    raw::select_db(ctx, lock.db).then(|| RedisString::create_from_slice(ctx.get_raw(), &lock.key))
}
