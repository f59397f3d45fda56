//! What the module's timers do ([`Tick`] for [`Ticker`]), at the top of the waiting floors:
//! deferred work (grants to undo, session ends, every lock settled, the promotion walk) and
//! the schedule's events (timeouts, lease checks, own checks), each tick bounded by its work
//! budget.

use std::cell::Cell;

use redis_module::Context;

use super::hand_off::settle;
use super::schedule::{defer, Budget, Deferred, Tick, Ticker, PAUSE_RETRY};
use super::state::{bump, open_db, unblock, with_queues, Outcome, STATS};
use super::undo::undo_grant;
use crate::error::LockError;
use crate::queue::{End, Event, LockName, WaiterId};
use crate::raw;
use crate::rules::Kind;
use crate::store::{self, waiters};

impl Tick for Ticker {
    fn deferred(ctx: &Context, work: Deferred) {
        store::module_work(ctx, || {
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
    }

    fn scheduled(ctx: &Context) {
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
    }
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

/// Settles the lock from a timer.
fn settle_lock(ctx: &Context, lock: &LockName) {
    if let Some(name) = open_db(ctx, lock) {
        settle(ctx, &name);
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
        match super::kinds::sem_reclaim(ctx, &name, now) {
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
                Some(mode) => super::hand_off::freed(ctx, &name, store::Unlocked::Rw(mode)),
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
