//! The `RLATCH.*` handlers: Redisson's `RCountDownLatch` (`latch_rules`) on its data layout,
//! with awaiting in the server: `RLATCH.AWAIT` blocks until the latch opens, and every awaiter
//! is answered at once when it does (a broadcast, unlike a lock's one-at-a-time hand-off),
//! however it opens: an `RLATCH.COUNTDOWN` to zero or an `RLATCH.DELETE` at once, a Redisson
//! client's script or a plain `DEL` at the waiters' next poll.

use redis_module::{Context, RedisResult, RedisString, RedisValue};

use super::guarded;
use crate::args::{self, Lease};
use crate::door;
use crate::error::LockError;
use crate::latch_rules::{self, LatchPlan};
use crate::raw;
use crate::rules::{Kind, Request};
use crate::store::latch::LatchKey;
use crate::store::{self, access::check_publish, Unlocked};
use crate::waiting;

/// Applies `plan` to the latch `name` (`current`: its count as read), every refusal checked
/// first: awaiters answered when it opens, its message published.
fn apply(
    ctx: &Context,
    name: &RedisString,
    key: LatchKey<'_>,
    current: Option<i64>,
    plan: &LatchPlan,
) -> Result<RedisValue, LockError> {
    check_publish(ctx, name, plan.publish.map(Unlocked::Latch))?;
    key.apply(current, plan);
    drop(key);
    if plan.opens {
        waiting::latch_opened(ctx, name);
    }
    if let Some(message) = plan.publish {
        store::publish_unlock(ctx, name, Unlocked::Latch(message));
    }
    Ok(store::to_value(plan.reply))
}

/// The latch `name` opened for writing, its awaiters answered first if it is open already (it
/// was deleted or counted down outside rlock since the waiters' last poll).
fn settled<'a>(
    ctx: &'a Context,
    name: &'a RedisString,
) -> Result<(LatchKey<'a>, Option<i64>), LockError> {
    waiting::settle(ctx, name);
    let key = LatchKey::open(ctx, name, true);
    let current = key.count()?;
    Ok((key, current))
}

/// `RLATCH.SETCOUNT key count`
pub fn set_count(ctx: &Context, argv: &[RedisString]) -> RedisResult {
    guarded(ctx, || {
        let cmd = args::LatchSet::parse(argv)?;
        door::load(ctx, cmd.key);
        let (key, current) = settled(ctx, cmd.key)?;
        let plan = latch_rules::set_count(current, cmd.count);
        apply(ctx, cmd.key, key, current, &plan)
    })
}

/// `RLATCH.COUNTDOWN key [amount]`
pub fn count_down(ctx: &Context, argv: &[RedisString]) -> RedisResult {
    guarded(ctx, || {
        let cmd = args::LatchCountDown::parse(argv)?;
        door::load(ctx, cmd.key);
        let (key, current) = settled(ctx, cmd.key)?;
        let plan = latch_rules::count_down(current, cmd.amount);
        apply(ctx, cmd.key, key, current, &plan)
    })
}

/// `RLATCH.DELETE key`
pub fn delete(ctx: &Context, argv: &[RedisString]) -> RedisResult {
    guarded(ctx, || {
        let cmd = args::KeyOnly::parse(argv)?;
        door::load(ctx, cmd.key);
        let (key, current) = settled(ctx, cmd.key)?;
        let plan = latch_rules::delete(current);
        apply(ctx, cmd.key, key, current, &plan)
    })
}

/// `RLATCH.COUNT key`
pub fn count(ctx: &Context, argv: &[RedisString]) -> RedisResult {
    guarded(ctx, || {
        let cmd = args::KeyOnly::parse(argv)?;
        let count = LatchKey::open(ctx, cmd.key, false).count()?;
        Ok(RedisValue::Integer(count.unwrap_or(0)))
    })
}

/// `RLATCH.AWAIT key timeout-ms`
pub fn await_open(ctx: &Context, argv: &[RedisString]) -> RedisResult {
    guarded(ctx, || {
        let cmd = args::LatchAwait::parse(argv)?;
        let count = LatchKey::open(ctx, cmd.key, false).count()?;
        if latch_rules::is_open(count) {
            return Ok(RedisValue::Integer(1));
        }
        // Never block where nobody could open it for this client (MULTI, Lua, a replica,
        // which runs no rlock command): answered as a timeout that ended at once.
        if !raw::may_block(ctx) || !raw::is_master(ctx) {
            return Ok(RedisValue::Integer(0));
        }
        let request = Request {
            kind: Kind::Latch,
            owner: Vec::new(),
            lease: Lease::UNUSED,
            token: false,
            id: None,
            session: None,
            gt: false,
            ownerless: false,
        };
        waiting::block(ctx, waiting::lock_name(ctx, cmd.key), request, cmd.wait, -1);
        Ok(RedisValue::NoReply)
    })
}
