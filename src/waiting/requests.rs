//! Waiters by request id (exact cancellation): whether a request waits for a lock, and taking it
//! out of the queue (`RLOCK.CANCEL`), its client answered at once as a wait that timed out.

use redis_module::{Context, RedisString};

use super::schedule as timers;
use super::state::{bump, unblock, with_queues, Outcome, STATS};
use crate::queue::End;
use crate::raw;
use crate::store::waiters;

/// Whether request `id` waits in the queue of the lock `name` (the context's database).
pub fn waits_as(ctx: &Context, name: &RedisString, id: &[u8]) -> bool {
    super::state::anyone_waits()
        && with_queues(|q| q.find_tagged(raw::selected_db(ctx), name.as_slice(), id).is_some())
}

/// Takes request `id` out of the queue of the lock `name`, if it waits there: its client gets
/// the reply of a wait that timed out (the holder's remaining lease, `0` for a semaphore, nil
/// for leased permits) without delay. Returns whether it waited.
pub fn dequeue(ctx: &Context, name: &RedisString, id: &[u8]) -> bool {
    let db = raw::selected_db(ctx);
    let Some(waiter) = with_queues(|q| {
        let found = q.find_tagged(db, name.as_slice(), id)?;
        q.remove_as(found, End::Left, Some(raw::now_ms()))
    }) else {
        return false;
    };
    bump(&STATS.left);
    let outcome = match waiters::not_granted(ctx, &waiter.lock.key, &waiter.request) {
        Ok(reply) => Outcome::TimedOut(reply),
        Err(e) => Outcome::Failed(e),
    };
    unblock(waiter, outcome);
    timers::arm(ctx);
    true
}
