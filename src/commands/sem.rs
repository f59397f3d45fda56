//! The `RSEM.*` handlers for counting semaphores: Redisson's `RSemaphore` (`sem_rules`), on its
//! data layout, with fair server-side waiting (FIFO, no barging, several waiters served by one
//! release while permits last).

use redis_module::{Context, RedisResult, RedisString, RedisValue};

use super::guarded;
use crate::args;
use crate::args::Lease;
use crate::raw::{self, reply::Field};
use crate::rules::{Kind, Request};
use crate::sem_rules::{self, SemPlan, SemState};
use crate::store::sem::SemKey;
use crate::store::waiters::SEMAPHORE_RECHECK_MS;
use crate::store::{self, access::check_publish, Unlocked};
use crate::waiting;

/// The count after a change that raised it, its waiters served and the rest published; the
/// plan's own reply otherwise.
fn after(
    ctx: &Context,
    name: &RedisString,
    key: SemKey<'_>,
    state: SemState,
    plan: &SemPlan,
) -> Result<RedisValue, crate::error::LockError> {
    if plan.raised {
        check_publish(ctx, name, Some(Unlocked::Permits(0)))?;
    }
    key.apply(state, plan);
    drop(key);
    if plan.raised {
        waiting::sem_raised(ctx, name)?;
    }
    Ok(store::to_value(plan.reply))
}

/// `RSEM.SETPERMITS key permits`
pub fn set_permits(ctx: &Context, argv: Vec<RedisString>) -> RedisResult {
    guarded(ctx, || {
        let cmd = args::SemCount::parse_set(&argv)?;
        let key = SemKey::open(ctx, cmd.key, true);
        let state = key.state()?;
        let plan = sem_rules::set_permits(state, cmd.permits);
        after(ctx, cmd.key, key, state, &plan)
    })
}

/// `RSEM.ADDPERMITS key delta`
pub fn add_permits(ctx: &Context, argv: Vec<RedisString>) -> RedisResult {
    guarded(ctx, || {
        let cmd = args::SemAdd::parse(&argv)?;
        let key = SemKey::open(ctx, cmd.key, true);
        let state = key.state()?;
        let plan = sem_rules::add_permits(state, cmd.delta)?;
        after(ctx, cmd.key, key, state, &plan)
    })
}

/// `RSEM.ACQUIRE key permits [WAIT timeout-ms]`
pub fn acquire(ctx: &Context, argv: Vec<RedisString>) -> RedisResult {
    guarded(ctx, || {
        let cmd = args::SemAcquire::parse(&argv)?;
        store::may_grant(ctx)?;
        // Waiters first: permits they are owed go to them.
        waiting::settle(ctx, cmd.key);
        let queued = waiting::waiting(raw::selected_db(ctx), cmd.key.as_slice()) > 0;
        let key = SemKey::open(ctx, cmd.key, true);
        let state = key.state()?;
        let plan = sem_rules::acquire(state, cmd.permits, queued);
        if plan.reply == crate::rules::Reply::Int(0) {
            // Never block where no grant can happen (MULTI, Lua, a writable replica).
            if let Some(wait) = cmd.wait.filter(|_| raw::may_block(ctx) && raw::is_master(ctx)) {
                drop(key);
                let request = Request {
                    kind: Kind::Permits(cmd.permits),
                    owner: Vec::new(),
                    lease: Lease::UNUSED,
                    token: false,
                };
                // Checked again shortly (`store::waiters`): permits may come back without an
                // RSEM command (a Redisson client's INCRBY).
                let lock = waiting::lock_name(ctx, cmd.key);
                waiting::block(ctx, lock, request, wait, SEMAPHORE_RECHECK_MS);
                return Ok(RedisValue::NoReply);
            }
        }
        key.apply(state, &plan);
        Ok(store::to_value(plan.reply))
    })
}

/// `RSEM.RELEASE key permits`
pub fn release(ctx: &Context, argv: Vec<RedisString>) -> RedisResult {
    guarded(ctx, || {
        let cmd = args::SemCount::parse_release(&argv)?;
        Ok(RedisValue::Integer(waiting::sem_release(ctx, cmd.key, cmd.permits)?))
    })
}

/// `RSEM.AVAILABLE key`
pub fn available(ctx: &Context, argv: Vec<RedisString>) -> RedisResult {
    guarded(ctx, || {
        let cmd = args::KeyOnly::parse(&argv)?;
        Ok(RedisValue::Integer(store::sem::available(ctx, cmd.key)?))
    })
}

/// `RSEM.INFO key`
pub fn info(ctx: &Context, argv: Vec<RedisString>) -> RedisResult {
    guarded(ctx, || {
        let cmd = args::KeyOnly::parse(&argv)?;
        let state = SemKey::open(ctx, cmd.key, false).state()?;
        let Some(available) = state.available else { return Ok(RedisValue::Null) };
        let (waiters, permits) =
            waiting::waiting_permits(raw::selected_db(ctx), cmd.key.as_slice());
        raw::reply::reply_map(
            ctx,
            &[
                ("available", Field::Int(available)),
                ("leased", Field::Int(0)),
                ("next_expiry_ms", Field::Int(-1)),
                ("waiters", Field::Int(waiters as i64)),
                ("waiting_permits", Field::Int(permits as i64)),
            ],
        );
        Ok(RedisValue::NoReply)
    })
}
