//! The module's timers: one for the earliest event of the schedule (waiter timeouts, checks at
//! a holder's lease deadline), and a 0 ms one for work that server events may not do themselves
//! (settle every lock, roll back grants to clients that left). Both do their work as the module's
//! own (`store::module_work`), and neither writes while writes are paused.

use std::cell::{Cell, RefCell};
use std::sync::atomic::Ordering;
use std::time::Duration;

use redis_module::raw::RedisModuleTimerID;
use redis_module::{Context, RedisString};

use super::{bump, release_hold, rw_release, settle, unblock, with_queues, Outcome, STATS};
use crate::error::LockError;
use crate::queue::{End, Event, LockName, WaiterId};
use crate::raw;
use crate::request_rules::Record;
use crate::rules::{Kind, Reply, Request};
use crate::store;
use crate::store::request::RequestRecord;
use crate::store::waiters::{self, Stamp};

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

/// Undoes now the grants on `lock` whose clients left before their reply (a command on the
/// lock is about to read it: `session_end::apply_pending`); the timer undoes the others.
pub fn undo_now(ctx: &Context, lock: &LockName) {
    let mine: Vec<Undo> = DEFERRED.with(|d| {
        let mut d = d.borrow_mut();
        let (mine, rest) =
            std::mem::take(&mut d.rollback).into_iter().partition(|u| u.lock == *lock);
        d.rollback = rest;
        mine
    });
    for undo in &mine {
        undo_grant(ctx, undo);
    }
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
    let walked = super::QUEUES.with(|q| q.try_borrow().map_or(0, |q| q.walked()));
    raw::work::done().wrapping_add(walked)
}

/// How often work that writes is retried while writes are paused (`CLIENT PAUSE`, `FAILOVER`):
/// a waiter owed a lock is served within this of the pause's end.
const PAUSE_RETRY: Duration = Duration::from_millis(1);

fn run_deferred(ctx: &Context, (): ()) {
    if raw::writes_paused() {
        // Keep the work (still armed) and look again shortly.
        ctx.create_timer(PAUSE_RETRY, run_deferred, ());
        return;
    }
    store::module_work(ctx, || {
        let work = DEFERRED.with(|d| std::mem::take(&mut *d.borrow_mut()));
        if !raw::is_master(ctx) {
            // Demoted meanwhile (a `FAILOVER` ends its pause as a replica): never write here,
            // and session holds end with their leases.
            super::session::forget();
            if !work.rollback.is_empty() {
                ctx.log_notice(&format!(
                    "rlock: {} grant(s) to clients that left were not undone: this server is no \
                     longer a master (their holds end with their leases)",
                    work.rollback.len()
                ));
            }
            return;
        }
        let budget = Budget::start();
        for undo in &work.rollback {
            undo_grant(ctx, undo);
        }
        let more_ends = work.session_ends && super::session_end::end_pending(ctx, &budget);
        if more_ends {
            // More than one tick's worth: the rest at the next tick, other clients served first.
            defer(ctx, |d| d.session_ends = true);
        }
        if work.settle_all {
            for lock in &with_queues(|q| q.locks()) {
                settle_lock(ctx, lock);
            }
        }
        let more_walk = work.promotion_walk && super::promotion::step(ctx, &budget);
        if more_walk {
            defer(ctx, |d| d.promotion_walk = true);
        }
        budget.end(more_ends || more_walk);
    });
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
    store::module_work(ctx, || {
        let now = raw::now_ms();
        // While writes are paused nothing is granted: lease checks wait for the pause's end
        // (retried every PAUSE_RETRY), timeouts still end their waits.
        let paused = raw::writes_paused();
        let mut later = Vec::new();
        let budget = Budget::start();
        // The lock a latch awaiter's timeout just settled (see `time_out`).
        let mut settled = None;
        let mut split = false;
        while let Some(event) = with_queues(|q| q.pop_due(now)) {
            if !matches!(event, Event::Timeout(_)) {
                settled = None;
            }
            match event {
                Event::Timeout(id) => time_out(ctx, id, paused, &mut settled),
                Event::LeaseCheck(lock) if paused => later.push((lock, false)),
                Event::LeaseCheck(lock) => poll_lock(ctx, &lock, now),
                Event::Check(lock) if paused => later.push((lock, true)),
                Event::Check(lock) => check_lock(ctx, &lock, now, true),
            }
            if budget.spent() && with_queues(|q| q.next_due()).is_some_and(|at| at <= now) {
                // The rest is due too: at the next tick, 0 ms from now, clients served first.
                split = true;
                break;
            }
        }
        budget.end(split);
        let retry_at = now.saturating_add(PAUSE_RETRY.as_millis() as i64);
        with_queues(|q| {
            for (lock, own) in &later {
                if *own {
                    q.schedule_check(lock, retry_at);
                } else {
                    q.schedule_lease_check(lock, retry_at);
                }
            }
        });
    });
    arm(ctx);
}

/// A waiter's budget ran out. A free lock goes to its head first (perhaps this waiter), unless
/// writes are paused.
///
/// `settled`: the lock the previous event of this tick settled, if that event was the timeout
/// of a latch awaiter (else `None`). A latch awaiter that times out right after another of the
/// same lock does not settle it again: nothing ran in between but an awaiter leaving, which
/// changes neither the latch nor the lock's line (12,000 awaiters timing out together read
/// their latch once, not 12,000 times).
fn time_out(ctx: &Context, id: WaiterId, paused: bool, settled: &mut Option<LockName>) {
    let Some((lock, apart)) =
        with_queues(|q| q.get(id).map(|w| (w.lock.clone(), w.request.kind == Kind::Latch)))
    else {
        *settled = None;
        return;
    };
    let again = apart && settled.as_ref() == Some(&lock);
    if !paused && !again {
        settle_lock(ctx, &lock);
    }
    *settled = (apart && !paused).then(|| lock.clone());
    let Some(waiter) = with_queues(|q| q.remove_as(id, End::TimedOut, Some(raw::now_ms()))) else {
        return; // granted just now
    };
    bump(&STATS.timeouts);
    let outcome = if raw::select_db(ctx, lock.db) {
        match waiters::not_granted(ctx, &lock.key, &waiter.request) {
            Ok(reply) => Outcome::TimedOut(reply),
            Err(e) => Outcome::Failed(e),
        }
    } else {
        Outcome::Failed(LockError::Internal)
    };
    unblock(waiter, outcome);
}

/// Selects the lock's database and gives its name, for work done from a timer.
fn open_db(ctx: &Context, lock: &LockName) -> Option<RedisString> {
    raw::select_db(ctx, lock.db).then(|| RedisString::create_from_slice(ctx.get_raw(), &lock.key))
}

/// Settles the lock from a timer.
fn settle_lock(ctx: &Context, lock: &LockName) {
    if let Some(name) = open_db(ctx, lock) {
        settle(ctx, &name);
    }
}

/// Undoes a grant whose client left before its reply: releases the hold it was granted (as
/// `RLOCK.RELEASE` / `RWLOCK.RELEASE` would), handing off if that frees the lock; unless the lock
/// no longer shows that grant as it was made (the same owner took it again meanwhile, by a grant
/// of its own): that hold is not the one to release.
///
/// A grant to a request with an id (`REQUEST id`) is undone only if its record does not say
/// it was cancelled already (`RLOCK.CANCEL` gave it back), and its record then says cancelled
/// (so a later `RLOCK.CANCEL` does not give it back twice, and a retry gets nothing).
fn undo_grant(ctx: &Context, undo: &Undo) {
    let Undo { lock, request, ids, stamp } = undo;
    let Some(name) = open_db(ctx, lock) else { return };
    let record =
        request.id.as_deref().and_then(|id| RequestRecord::for_caller(ctx, &name, id).ok());
    let stored = record.as_ref().map(|record| record.read(ctx));
    if matches!(stored, Some(Ok(Some(Record::Cancelled | Record::Released)))) {
        // Given back already (`RLOCK.CANCEL`, or `RSEM.RELEASE ... REQUEST id`).
        return;
    }
    release_grant(ctx, &name, request, ids, *stamp);
    // Not over the record of a request on another lock that holds its record key.
    if let (Some(record), false) = (record, matches!(stored, Some(Err(LockError::RequestMismatch))))
    {
        record.cancel(ctx, raw::now_ms());
    }
}

/// The release part of [`undo_grant`].
fn release_grant(
    ctx: &Context,
    name: &RedisString,
    request: &Request,
    ids: &[Vec<u8>],
    stamp: Stamp,
) {
    if !waiters::still_granted(ctx, name, request, stamp) {
        ctx.log_notice(
            "rlock: a grant to a client that left was not undone: the lock no longer shows it \
             as it was made (its hold ends with its lease)",
        );
        return;
    }
    let undone = match request.kind {
        Kind::Reentrant => {
            let owner = RedisString::create_from_slice(ctx.get_raw(), &request.owner);
            release_hold(ctx, name, &owner, None)
        }
        Kind::Rw(mode) => rw_release(ctx, name, &request.owner, mode),
        Kind::Permits(permits) => super::sem_release(ctx, name, permits).map(|_| Reply::Nil),
        // An awaiter holds nothing: nothing to give back.
        Kind::Latch => Ok(Reply::Nil),
        Kind::Leased(_) => {
            let ids: Vec<&[u8]> = ids.iter().map(Vec::as_slice).collect();
            super::sem_release_ids(ctx, name, &ids).map(|_| Reply::Nil)
        }
    };
    if let Err(e) = undone {
        ctx.log_warning(&format!("rlock: could not release a grant whose client left: {e}"));
    }
}

/// A lock with waiters at its holder's deadline or its poll: a reentrant lock's waiters are
/// settled (one key opened); so are a read-write lock's (a few fields read, whatever its number
/// of readers), whose dead readers are looked for at its own check (every hold key read, spaced
/// by its cost, see `store::rw::reap`), brought forward to the earliest time that spacing
/// allows; a semaphore gets its full
/// check first (ended leases reclaimed: a Redisson client's too).
fn poll_lock(ctx: &Context, lock: &LockName, now: i64) {
    // Its line's head decides (a latch's awaiters wait apart from it, and are answered by any
    // of these looks).
    let kind = with_queues(|q| {
        let in_line = q.in_line_head(lock.db, &lock.key).map(|w| w.request.kind);
        in_line.or_else(|| q.head(lock.db, &lock.key).map(|w| w.request.kind))
    });
    match kind {
        Some(Kind::Reentrant | Kind::Latch) => settle_lock(ctx, lock),
        Some(Kind::Rw(_)) => {
            settle_lock(ctx, lock);
            // Its dead readers are looked for as soon as the spacing of its checks allows, even
            // when its own check is scheduled later (at a live hold's end): holds a Redisson
            // client wrote are in no schedule, and a dead one must not keep the waiters until
            // some live reader's release.
            let at = store::rw::reap_allowed_at(lock.db, &lock.key).map_or(now, |at| at.max(now));
            with_queues(|q| q.schedule_check(lock, at));
        }
        _ => check_lock(ctx, lock, now, false),
    }
}

/// The least time between two warnings of a lock check that failed (a corrupt lock with a
/// waiter is checked at every poll, every 10 ms).
const WARN_EVERY_MS: i64 = 10_000;

/// Logs `message`, unless a check's warning was logged less than [`WARN_EVERY_MS`] before `now`.
fn warn_limited(ctx: &Context, now: i64, message: &str) {
    thread_local! {
        static LAST: Cell<Option<i64>> = const { Cell::new(None) };
    }
    if LAST.get().is_none_or(|last| now.saturating_sub(last) >= WARN_EVERY_MS) {
        LAST.set(Some(now));
        ctx.log_warning(message);
    }
}

/// A look at a lock: a read-write lock's readers whose every hold lease ended leave, a
/// semaphore's permits whose lease ended come back (a Redisson client's too), and the next
/// check is scheduled; then its waiters get what it can grant. Run at a lock's own check and at
/// each look at a lock with waiters (its holder's deadline, the poll). Only a master writes: a
/// replica gets the master's writes. `warn`: log what cannot be done (not on every poll).
fn check_lock(ctx: &Context, lock: &LockName, now: i64, warn: bool) {
    if !raw::is_master(ctx) {
        return;
    }
    let Some(name) = open_db(ctx, lock) else { return };
    // A semaphore (a string, or a missing count whose leases are out): its permits whose lease
    // ended come back.
    if super::kinds::is_semaphore(ctx, &name) {
        match super::sem_reclaim(ctx, &name, now) {
            Ok(Some(at)) => with_queues(|q| q.schedule_check(lock, at)),
            Ok(None) => {}
            Err(e) if warn => {
                warn_limited(ctx, now, &format!("rlock: could not reclaim leased permits: {e}"));
            }
            Err(_) => {}
        }
        settle(ctx, &name);
        return;
    }
    match store::rw::reap(ctx, &name, now) {
        Ok(reaped) => {
            if reaped.removed {
                bump(&STATS.reaps);
            }
            match reaped.freed {
                Some(mode) => super::freed(ctx, &name, store::Unlocked::Rw(mode)),
                None => settle(ctx, &name),
            }
            if let Some(at) = reaped.next {
                with_queues(|q| q.schedule_check(lock, at));
            }
        }
        Err(e) => {
            if warn {
                warn_limited(ctx, now, &format!("rlock: could not check a read-write lock: {e}"));
            }
            settle(ctx, &name);
        }
    }
}
