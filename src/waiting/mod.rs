//! Server-side waiting: the Redis side of `RLOCK.ACQUIRE ... WAIT`.
//!
//! A waiter is a client blocked with `RedisModule_BlockClient` and queued FIFO per lock
//! ([`Queues`]) with its lock kind's request ([`Request`]). When the lock can be granted, the
//! longest-waiting client becomes a holder in the same event, and only then is it unblocked:
//! exactly one client wakes per grant, and nobody can take the lock in between. One hand-off
//! grants waiters from the head for as long as the kind's rules grant them (one, for a
//! reentrant lock), and stops at the first it cannot grant.
//!
//! How a lock becomes free, and where the hand-off happens:
//! - `RLOCK.RELEASE` to zero, `RLOCK.FORCERELEASE`: inside the command (nothing is published,
//!   the lock never became free);
//! - the holder's lease ends: a timer at the deadline opens the key (Redis expires it), then
//!   hands off ([`timers`]);
//! - `FLUSHALL`/`FLUSHDB`, `SWAPDB`: a server event (`events`) marks the lock and a 0 ms timer
//!   hands off (module code must not write inside those events);
//! - anything else (a Redisson client's unlock script, `DEL`, eviction, a `RENAME`): the same
//!   timer polls every lock with waiters, every [`crate::queue::POLL_MS`] ms in one tick (less
//!   often with many locks: at most [`crate::queue::POLLS_PER_SECOND`] looks a second), and
//!   hands off. The module subscribes to no keyspace event: with one,
//!   Redis would build a module context for every `DEL` and expiry of every key, lock or not.
//!
//! Until the hand-off, any `RLOCK.*` write on the lock hands off first ("settles" it), so no
//! RLOCK client jumps the queue.
//!
//! Timeouts are the module's own (one timer for the earliest event of the schedule), never
//! Redis's: a waiter is decided once, granted or timed out, so a timeout cannot race a grant.
//! A client that leaves while waiting (disconnect, `CLIENT KILL`, `CLIENT UNBLOCK`) leaves its
//! queue at once; one that leaves after being granted but before its reply gets its hold
//! released (deferred to a timer), so no lock stays with a client that is gone.
//!
//! In cluster mode, waiters whose slot moved away are redirected ([`cluster`]).
//!
//! A flush drops the session bindings, pending ends and checks of the databases it empties,
//! set aside for a reload that loads the data back in the same command ([`lifecycle`]).

//!
//! # Floors
//! Each file uses only the files listed after it (`mod.rs`, this face, uses them all):
//! - [`tick`]: what the timers do (deferred work, the schedule's events);
//! - [`session_end`]: the holds of closed connections ended, a lock's pending ends applied;
//! - [`promotion`]: the walk for leases and read holds after a promotion or a load;
//! - [`undo`]: grants to clients that left before their reply, released;
//! - [`kinds`]: the read-write lock's and the semaphore's releases and their waiters;
//! - [`hand_off`]: settle, hand off, free, the reentrant lock's release;
//! - [`lifecycle`]: flushes and reloads (bindings and checks set aside);
//! - [`block`], [`replies`]: a client blocked, its reply and its leaving;
//! - [`session`]: the session bindings (`SESSION` holds);
//! - [`cluster`], [`requests`], [`deadlock`], [`listing`]: redirects, waiters by request id,
//!   the deadlock search, `*.WAITERS`;
//! - [`schedule`]: the timers armed (their work is [`schedule::Tick`], done by [`tick`]);
//! - [`state`]: the queues and counters.

mod block;
pub mod cluster;
pub mod deadlock;
mod hand_off;
mod kinds;
pub mod lifecycle;
pub mod listing;
pub mod promotion;
mod replies;
mod requests;
pub mod schedule;
pub mod session;
mod session_end;
mod state;
mod tick;
mod undo;

pub use block::{block, block_as};
pub use hand_off::{
    check_release_publish, freed, freed_as, hand_off, latch_opened, release_hold, settle,
    settled_view, Publish,
};
pub use kinds::{
    rw_applied, rw_release, sem_give_back_ids, sem_raised, sem_reclaim, sem_reclaim_due,
    sem_reclaim_due_giving_back, sem_reclaim_keeping, sem_release, sem_release_ids, waiting_in,
    waiting_permits,
};
pub use requests::{dequeue, waits_as};
pub use schedule::{forget_check, forget_checks, schedule_check};
pub use session_end::apply_pending;
pub use state::{
    anyone_waits, in_line, lock_name, scheduled_checks, swap_checks, total_waiting, waiting,
    Outcome, Stats, Waiting, STATS,
};

use std::sync::atomic::Ordering;

use redis_module::Context;

use crate::error::LockError;
use crate::queue::Queues;
use crate::raw;
use state::{bump, unblock, with_queues};

/// At load: `INFO rlock` starts from zero (a reloaded module may find its old statics and
/// thread-locals: the wait-time buckets live with the queues).
pub fn reset_stats() {
    let counters = [
        &STATS.waits,
        &STATS.handoffs,
        &STATS.timeouts,
        &STATS.left,
        &STATS.rollbacks,
        &STATS.reaps,
        &STATS.latch_opens,
        &STATS.latch_releases,
        &STATS.timer_work,
        &STATS.ticks_split,
    ];
    for counter in counters {
        counter.store(0, Ordering::Relaxed);
    }
    with_queues(Queues::reset_wait_times);
    session::reset();
}

/// How many timers of this module are armed (schedule, deferred work, cluster sweep).
pub fn timers_armed() -> u64 {
    schedule::armed() + u64::from(cluster::sweeping())
}

/// The server became a replica: no lock can be granted here any more; every waiter gets an
/// error, and grants waiting to be undone are left to the new master's data (a replica never
/// writes: their holds end with their leases).
pub fn demoted(ctx: &Context) {
    schedule::forget_rollbacks();
    promotion::stop();
    session::forget();
    let now = raw::now_ms();
    for waiter in with_queues(|q| {
        let drained = q.drain();
        for waiter in &drained {
            q.record_wait(waiter.since, now);
        }
        drained
    }) {
        bump(&STATS.left);
        unblock(waiter, Outcome::Failed(LockError::Demoted));
    }
    schedule::arm(ctx);
}
