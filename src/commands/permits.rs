//! Counted permits given back to a semaphore: `RSEM.RELEASE key permits` (also by `REQUEST id` or
//! `ONCE id`, `request.rs`), a cancelled request's counted permits (`RLOCK.CANCEL`), and the
//! permits `RSEM.SETPERMITS` and `RSEM.ADDPERMITS` add. Decide, write, wake, after the caller's
//! load (`door::load`).

use redis_module::{Context, RedisString};

use crate::error::LockError;
use crate::sem_rules::{self, SemPlan, SemState};
use crate::store::access::check_publish;
use crate::store::sem::SemKey;
use crate::store::Unlocked;
use crate::waiting;

/// Gives back `permits` of the semaphore `name`; returns the count left after its waiters were
/// served.
///
/// # Errors
/// `WRONGTYPE`, a value that is not an integer, an overflow, or `NOPERM` for the lease zset or
/// the channel; nothing is written then.
pub(super) fn give_back(ctx: &Context, name: &RedisString, permits: u64) -> Result<i64, LockError> {
    // Decide: the count must hold what comes back (refused before the reclaim writes anything).
    sem_rules::release(SemKey::open(ctx, name, false).state()?, permits)?;
    // Write, wake: leases that ended come back with these permits, in one write, when any did.
    if let Some(left) = waiting::sem_reclaim_due_giving_back(ctx, name, permits)? {
        return Ok(left);
    }
    // None did (the reclaim wrote nothing): these permits on their own.
    let key = SemKey::open(ctx, name, true);
    let state = key.state()?;
    let plan = sem_rules::release(state, permits)?;
    came_back(ctx, name, key, state, &plan)
}

/// Applies `plan`, which raises the count of the semaphore `name` (`state`: the count as read),
/// the caller's permission to publish the count checked first; then its waiters are served and
/// the count left is published. Returns it.
///
/// # Errors
/// `NOPERM` for the channel (nothing is written then), or as `store::sem::available`.
pub(super) fn came_back(
    ctx: &Context,
    name: &RedisString,
    key: SemKey<'_>,
    state: SemState,
    plan: &SemPlan,
) -> Result<i64, LockError> {
    check_publish(ctx, name, Some(Unlocked::Permits(0)))?;
    key.apply(state, plan);
    drop(key);
    waiting::sem_raised(ctx, name)
}
