//! The module's timers, armed here and run by the floors above: one timer for the earliest
//! event of the queues' schedule (timeouts, lease checks, own checks), and a 0 ms timer for
//! work that server events may not do themselves ([`Deferred`]). What a tick does is the
//! [`Tick`] of [`Ticker`], implemented by `tick` (the top floor): this floor never calls up.

use std::cell::{Cell, RefCell};
use std::sync::atomic::Ordering;
use std::time::Duration;

use redis_module::raw::RedisModuleTimerID;
use redis_module::{Context, RedisString};

use super::state::{bump, lock_name, scheduled_checks, with_queues, QUEUES, STATS};
use crate::queue::LockName;
use crate::raw;
use crate::rules::Request;
use crate::store::waiters::Stamp;

/// What the module's timers do when they fire (implemented by the floor above, `tick`).
pub trait Tick {
    /// The schedule timer fired: the events due now.
    fn scheduled(ctx: &Context);
    /// The 0 ms timer fired (writes not paused): the deferred `work`.
    fn deferred(ctx: &Context, work: Deferred);
}

/// The one [`Tick`] (its implementation lives with the work it does).
pub struct Ticker;

thread_local! {
    /// The armed schedule timer: when it fires, and its id.
    static TIMER: Cell<Option<(i64, RedisModuleTimerID)>> = const { Cell::new(None) };
    static DEFERRED: RefCell<Deferred> = RefCell::new(Deferred::default());
}

/// Work that events may not do themselves, done on a 0 ms timer.
#[derive(Default)]
pub struct Deferred {
    armed: bool,
    /// Every lock with waiters (after a flush, a `SWAPDB`, replicas back in sync).
    pub settle_all: bool,
    /// Grants to clients that left before their reply: undo them.
    pub rollback: Vec<Undo>,
    /// Session holds whose connection closed wait to be ended (`session`).
    pub session_ends: bool,
    /// The walk for leased semaphores and read-write locks after a promotion or a load from
    /// disk goes on (`promotion`).
    pub promotion_walk: bool,
}

/// A grant to undo: its client left before its reply.
pub struct Undo {
    pub lock: LockName,
    pub request: Request,
    /// Its leased permits' ids.
    pub ids: Vec<Vec<u8>>,
    /// What tells the grant apart from a later hold of the same owner.
    pub stamp: Stamp,
}

/// The server is no longer a master: grants waiting to be undone are not this server's to undo
/// any more (a replica must not write; the new master's data decides).
pub fn forget_rollbacks() {
    DEFERRED.with(|d| {
        if let Ok(mut d) = d.try_borrow_mut() {
            d.rollback.clear();
        }
    });
}

/// Whether a grant to acquire request `id` on `lock` waits to be undone (its client left before
/// its reply): the request is as good as cancelled (the undo makes its record say so), so a
/// retry that comes first must not replay the grant.
pub fn undo_pending(lock: &LockName, id: &[u8]) -> bool {
    DEFERRED.with(|d| {
        d.try_borrow().is_ok_and(|d| {
            d.rollback.iter().any(|u| u.lock == *lock && u.request.id.as_deref() == Some(id))
        })
    })
}

/// Whether any grant waits to be undone (cheap: every write command asks).
pub fn undos_pending() -> bool {
    DEFERRED.with(|d| d.try_borrow().is_ok_and(|d| !d.rollback.is_empty()))
}

/// Whether a grant on `lock` waits to be undone.
pub fn undo_due(lock: &LockName) -> bool {
    DEFERRED.with(|d| d.try_borrow().is_ok_and(|d| d.rollback.iter().any(|u| u.lock == *lock)))
}

/// Takes the grants on `lock` waiting to be undone out of the deferred work (a command on the
/// lock undoes them now: `undo::undo_now`).
pub fn take_rollbacks_of(lock: &LockName) -> Vec<Undo> {
    DEFERRED.with(|d| {
        let mut d = d.borrow_mut();
        let (mine, rest) =
            std::mem::take(&mut d.rollback).into_iter().partition(|u| u.lock == *lock);
        d.rollback = rest;
        mine
    })
}

/// `SWAPDB first second`: a grant waiting to be undone was written in the database that is
/// now the other one (its waiters, clients, stay in theirs).
pub fn swapped(first: i32, second: i32) {
    DEFERRED.with(|d| {
        if let Ok(mut d) = d.try_borrow_mut() {
            for undo in &mut d.rollback {
                let db = &mut undo.lock.db;
                if *db == first {
                    *db = second;
                } else if *db == second {
                    *db = first;
                }
            }
        }
    });
}

/// Queues work for the 0 ms timer, arming it if needed.
pub fn defer(ctx: &Context, add: impl FnOnce(&mut Deferred)) {
    let arm_now = DEFERRED.with(|d| {
        let mut d = d.borrow_mut();
        add(&mut d);
        !std::mem::replace(&mut d.armed, true)
    });
    if arm_now {
        // A fn item with () data: the timer's data is zero-sized.
        ctx.create_timer(Duration::ZERO, run_deferred, ());
    }
}

/// The most work one timer tick does, in units of [`raw::work`] (about one key read each: a key
/// opened, a hash field scanned, a command propagated; a client unblocked is
/// [`raw::work::UNBLOCK`]) and queue entries walked: a few ms of the server's time. Past it,
/// the tick stops after the item at hand and the rest is done at the next tick, 0 ms later,
/// the server serving its clients in between: 12,000 timeouts due at once, or the ends of a
/// connection bound to 40,000 read holds, take several ticks instead of one long stall.
pub const TICK_BUDGET: u64 = 4_000;

/// The work budget of one timer tick ([`TICK_BUDGET`]), measured from its start.
pub(super) struct Budget {
    start: u64,
    limit: u64,
}

impl Budget {
    pub(super) fn start() -> Self {
        Self { start: work_done(), limit: TICK_BUDGET }
    }

    /// No limit: work a command must see done before it goes on (the pending ends of the lock
    /// it reads), whatever it costs.
    pub(super) fn unbounded() -> Self {
        Self { start: work_done(), limit: u64::MAX }
    }

    /// The work done since the tick began.
    pub(super) fn used(&self) -> u64 {
        work_done().wrapping_sub(self.start)
    }

    /// The work the tick may still do (0: spent).
    pub(super) fn left(&self) -> u64 {
        self.limit.saturating_sub(self.used())
    }

    /// Whether the tick did all it may.
    pub(super) fn spent(&self) -> bool {
        self.left() == 0
    }

    /// The tick ends: its work counted in `INFO rlock`, and whether it stopped with work left.
    pub(super) fn end(self, split: bool) {
        STATS.timer_work.fetch_add(self.used(), Ordering::Relaxed);
        if split {
            bump(&STATS.ticks_split);
        }
    }
}

/// The work done so far ([`raw::work`] and the queue entries walked, wrapping).
fn work_done() -> u64 {
    let walked = QUEUES.with(|q| q.try_borrow().map_or(0, |q| q.walked()));
    raw::work::done().wrapping_add(walked)
}

/// How often work that writes is retried while writes are paused (`CLIENT PAUSE`, `FAILOVER`):
/// a waiter owed a lock is served within this of the pause's end.
pub(super) const PAUSE_RETRY: Duration = Duration::from_millis(1);

fn run_deferred(ctx: &Context, (): ()) {
    if raw::writes_paused() {
        // Keep the work (still armed) and look again shortly.
        ctx.create_timer(PAUSE_RETRY, run_deferred, ());
        return;
    }
    let work = DEFERRED.with(|d| std::mem::take(&mut *d.borrow_mut()));
    <Ticker as Tick>::deferred(ctx, work);
    arm(ctx);
}

/// Re-arms the schedule timer for the earliest event, if it is not armed for it already; with
/// nothing scheduled, stops it (no timer outlives the waits).
pub fn arm(ctx: &Context) {
    let next = with_queues(|q| q.next_due());
    let armed = TIMER.get();
    match (next, armed) {
        (None, None) => return,
        (Some(next), Some((when, _))) if when <= next => return,
        _ => {}
    }
    if let Some((_, id)) = armed {
        // Zero-sized data, as created below.
        let _ = ctx.stop_timer::<()>(id);
        TIMER.set(None);
    }
    if let Some(next) = next {
        let id = ctx.create_timer(delay_until(next), run_schedule, ());
        TIMER.set(Some((next, id)));
    }
}

/// How many of these timers are armed (schedule, deferred work).
pub fn armed() -> u64 {
    let deferred = DEFERRED.with(|d| d.try_borrow().map_or(true, |d| d.armed));
    u64::from(TIMER.get().is_some()) + u64::from(deferred)
}

/// The timer period that reaches Unix ms `at`: computed from the µs clock (Redis adds the period
/// to its own µs clock), rounded up so the timer never fires before `at` begins.
fn delay_until(at: i64) -> Duration {
    let now_us = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX));
    let left_us = u64::try_from(at.saturating_mul(1000).saturating_sub(now_us)).unwrap_or(0);
    Duration::from_millis(left_us.div_ceil(1000))
}

fn run_schedule(ctx: &Context, (): ()) {
    TIMER.set(None);
    <Ticker as Tick>::scheduled(ctx);
    arm(ctx);
}
/// Looks at `lock` at `at` (Unix ms), whether anyone waits for it or not.
pub fn schedule_check(ctx: &Context, lock: &LockName, at: i64) {
    with_queues(|q| q.schedule_check(lock, at));
    arm(ctx);
}

/// Database `db` (`None`: every database) was flushed: the own checks of its locks go (and the
/// schedule timer with them, when nothing else is scheduled); returns them (lock, when).
pub fn forget_checks(ctx: &Context, db: Option<i32>) -> Vec<(LockName, i64)> {
    let dropped = QUEUES.with(|q| q.try_borrow_mut().map(|mut q| q.drop_checks(db)).ok());
    if dropped.is_some() {
        arm(ctx);
    }
    dropped.unwrap_or_default()
}

/// At most this many own checks are looked at again at once when a freed lock's check was
/// not under its name ([`forget_check`]).
const RELOOK_AT_MOST: usize = 16;

/// The lock `name` holds nothing a check would look at any more (a read-write lock freed, a
/// semaphore without leases): its own check goes, and the schedule timer with it when nothing
/// else is scheduled. (No allocation when no lock has a check: this runs on RSEM writes.)
///
/// `had_checked_holds`: what was just released had a check (the last read hold, the last
/// leased permit). Found under no name, that check waits under the name the lock had before a
/// `RENAME` or `MOVE` (no keyspace event tells the module), keeping a timer armed and `MODULE
/// UNLOAD` refused until the hold's old deadline: when few checks are scheduled, each is
/// looked at now instead (a live one reschedules itself, a stale one goes).
pub fn forget_check(ctx: &Context, name: &RedisString, had_checked_holds: bool) {
    if scheduled_checks() == 0 {
        return;
    }
    let dropped = with_queues(|q| q.drop_check(&lock_name(ctx, name)));
    if dropped
        || (had_checked_holds && with_queues(|q| q.relook_checks(RELOOK_AT_MOST, raw::now_ms())))
    {
        arm(ctx);
    }
}
