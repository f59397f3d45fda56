//! A client blocks for a lock: queued FIFO behind its lock's waiters, with its timeout and its
//! lock's next look scheduled.

use redis_module::Context;

use super::cluster;
use super::schedule::arm;
use super::state::{bump, with_queues, Waiting, STATS};
use crate::args::WaitFor;
use crate::queue::{Joining, LockName};
use crate::raw;
use crate::rules::{self, Kind, Request};

/// Blocks the calling client until it holds the lock or `wait` passes. `holder_pttl`: the
/// current holder's remaining lease (-1: none), when the lock is worth checking again.
pub fn block(ctx: &Context, lock: LockName, request: Request, wait: WaitFor, holder_pttl: i64) {
    block_as(ctx, lock, request, wait, holder_pttl, raw::User::current_name(ctx));
}

/// [`block`], for a command that looked its caller's ACL user name up already (`user`, as
/// [`raw::User::current_name`] gives it).
pub fn block_as(
    ctx: &Context,
    lock: LockName,
    request: Request,
    wait: WaitFor,
    holder_pttl: i64,
    user: Option<Vec<u8>>,
) {
    let bc = raw::block_client::<Waiting>(ctx);
    let now = raw::now_ms();
    let timeout_at = match wait {
        WaitFor::Ever => None,
        WaitFor::Millis(ms) => Some(now.saturating_add(i64::try_from(ms).unwrap_or(i64::MAX))),
    };
    // The tag is unique: the command refused an id already waiting on this lock.
    // A latch's awaiter holds nothing: it waits apart from the line (see [`hand_off`]).
    let joining = Joining {
        user,
        since: now,
        owner: request.owner.clone(),
        tag: request.id.clone(),
        apart: request.kind == Kind::Latch,
    };
    with_queues(|q| {
        q.enqueue(lock.clone(), request, bc, timeout_at, joining);
        let lease_over = (holder_pttl >= 0).then(|| rules::lease_over_at(now, holder_pttl));
        let at = q.look_again_at(now, lease_over);
        q.schedule_lease_check(&lock, at);
    });
    bump(&STATS.waits);
    arm(ctx);
    cluster::watch(ctx);
}
