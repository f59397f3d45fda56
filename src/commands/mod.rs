//! The command handlers, one per command: parse the arguments into their typed struct, go
//! through the door (`door`: load, decide, write, wake; every command that writes loads first),
//! reply. No key is touched here directly: `store` opens and writes keys, `waiting` blocks and
//! hands off.

pub mod latch;
mod permits;
pub mod request;
pub mod rw;
pub mod sem;
pub mod waiters;

pub use request::cancel;

use std::panic::{catch_unwind, AssertUnwindSafe};

use redis_module::{Context, RedisError, RedisResult, RedisString, RedisValue};

use crate::args;
use crate::door::{self, Entered, Entry};
use crate::error::{LockError, Refusal};
use crate::raw::{self, reply::Field};
use crate::request_rules::{Asked, Granted};
use crate::rules::{self, Deadline, Kind, Reply, Request, View};
use crate::sessions::{self, Held};
use crate::store::derived::{Latch, TokenCounter};
use crate::store::{self, access::check_publish, LockKey, Unlocked};
use crate::waiting;

/// Runs a handler body; a panic becomes an error reply (and a log line) instead of a dead
/// server. Every handler goes through here.
pub(crate) fn guarded(
    ctx: &Context,
    body: impl FnOnce() -> Result<RedisValue, LockError>,
) -> RedisResult {
    guarded_naming(ctx, || body().map_err(Refusal::Plain))
}

/// [`guarded`] for a handler whose refusals may name its request id ([`Refusal`]).
pub(crate) fn guarded_naming(
    ctx: &Context,
    body: impl FnOnce() -> Result<RedisValue, Refusal>,
) -> RedisResult {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(result) => result.map_err(Into::into),
        Err(_) => {
            ctx.log_warning("rlock: a command handler panicked; the client got an error reply");
            Err(RedisError::from(LockError::Internal))
        }
    }
}

/// `RLOCK.ACQUIRE key owner lease-ms [WAIT timeout-ms] [TOKEN] [REQUEST id] [SESSION
/// [LOCKDELAY lockdelay-ms]] [GT]`, through the door ([`door`]: load, decide, write, wake).
pub fn acquire(ctx: &Context, argv: &[RedisString]) -> RedisResult {
    guarded_naming(ctx, || {
        let cmd = args::Acquire::parse(argv)?;
        sessions::check_owner(cmd.owner.as_slice())?;
        let now = raw::now_ms();
        let deadline = Deadline::after(now, cmd.lease)?;
        // Load: everything that can refuse is checked before anything is written.
        let entry = Entry {
            key: cmd.key,
            session: cmd.session,
            unlocked: Unlocked::Lock,
            request: cmd.request,
            asked: Asked::Lock { owner: cmd.owner.as_slice(), token: cmd.token },
            token: cmd.token,
            now,
        };
        let admitted = match door::enter(ctx, entry)? {
            Entered::Replay(reply) => return Ok(reply),
            Entered::Fresh(admitted) => admitted,
        };
        // Decide, on the lock as its waiters left it.
        let (key, view) = waiting::settled_view(ctx, cmd.key, cmd.owner)?;
        let extend = rules::Extend::new(cmd.gt, key.raw().expire_at());
        let plan = rules::acquire(view, deadline, extend)?;
        if let (Reply::Int(holder_pttl), Some(wait)) = (plan.reply, cmd.wait) {
            // Never block where no grant can happen (MULTI, Lua, a writable replica).
            if raw::may_block(ctx) && raw::is_master(ctx) {
                let request = Request {
                    kind: Kind::Reentrant,
                    owner: cmd.owner.to_vec(),
                    lease: cmd.lease,
                    token: cmd.token,
                    id: cmd.request.map(|id| id.to_vec()),
                    session: admitted.bind,
                    gt: cmd.gt,
                    ownerless: false,
                };
                // The caller's user name, looked up once (the search's keys and the waiter).
                let user = raw::User::current_name(ctx);
                let open = Some(key.raw());
                waiting::deadlock::refuse_cycle(ctx, cmd.key, &request, open, user.as_deref())?;
                drop(key);
                let lock = waiting::lock_name(ctx, cmd.key);
                waiting::block_as(ctx, lock, request, wait, holder_pttl, user);
                return Ok(RedisValue::NoReply);
            }
        }
        if let Reply::Int(pttl) = plan.reply {
            return Ok(store::to_value(rules::busy(pttl, cmd.token)));
        }
        // Write.
        let token = admitted.token(ctx)?;
        key.apply(Some(cmd.owner), &plan);
        drop(key);
        // Until the lease ends (with `GT`, perhaps later than `deadline`).
        let until = plan.expire_at.map_or(deadline.unix_ms(), Deadline::unix_ms);
        let granted = || Some((Granted::Lock { owner: cmd.owner.to_vec(), token }, Some(until)));
        let bound = || match plan.write {
            rules::Write::SetCount(count) if plan.expire_at.is_some() => {
                Some((Held::Lock(cmd.owner.to_vec()), count == 1, until))
            }
            _ => None,
        };
        admitted.written(ctx, cmd.key, token, granted, bound);
        Ok(store::to_value(rules::granted(token)))
    })
}

/// `RLOCK.RELEASE key owner [lease-ms] [REQUEST id]`
pub fn release(ctx: &Context, argv: &[RedisString]) -> RedisResult {
    guarded(ctx, || {
        let cmd = args::Release::parse(argv)?;
        door::load(ctx, cmd.key);
        let deadline = cmd.lease.map(|lease| Deadline::after(raw::now_ms(), lease)).transpose()?;
        // Decide, write, wake: `waiting::release_hold`, which also undoes a grant whose client
        // left.
        latched(ctx, cmd.key, cmd.request, || {
            waiting::release_hold(ctx, cmd.key, cmd.owner, deadline)
        })
    })
}

/// A release with an optional `REQUEST id` (Redisson's unlock latch): a retried request replies
/// what the first one did and changes nothing; a first one runs `release` and remembers its
/// result.
pub(crate) fn latched(
    ctx: &Context,
    lock: &RedisString,
    request: Option<&RedisString>,
    release: impl FnOnce() -> Result<Reply, LockError>,
) -> Result<RedisValue, LockError> {
    let latch = request.map(|id| Latch::for_caller(ctx, lock, id)).transpose()?;
    if let Some(latch) = &latch {
        if let Some(first) = latch.result(ctx)? {
            return Ok(RedisValue::Integer(first));
        }
        // Unknown here: not a late resend of one forgotten during a stall.
        store::may_take_unknown_id(ctx)?;
    }
    let reply = release()?;
    if let (Some(latch), Some(result)) = (latch, rules::remembered(reply)) {
        latch.remember(ctx, result);
    }
    Ok(store::to_value(reply))
}

/// `RLOCK.RENEW key owner lease-ms [GT]`
pub fn renew(ctx: &Context, argv: &[RedisString]) -> RedisResult {
    guarded(ctx, || {
        let cmd = args::Renew::parse(argv)?;
        sessions::check_owner(cmd.owner.as_slice())?;
        let deadline = Deadline::after(raw::now_ms(), cmd.lease)?;
        door::load(ctx, cmd.key);
        store::may_grant(ctx)?;
        let key = LockKey::open(ctx, cmd.key, true);
        let extend = rules::Extend::new(cmd.gt, key.raw().expire_at());
        let plan = rules::renew(key.view(Some(cmd.owner))?, deadline, extend);
        key.apply(Some(cmd.owner), &plan);
        drop(key);
        if let Some(at) = plan.expire_at.filter(|_| waiting::session::watching(false)) {
            let held = Held::Lock(cmd.owner.to_vec());
            waiting::session::renewed(ctx, cmd.key, held, at.unix_ms());
        }
        Ok(store::to_value(plan.reply))
    })
}

/// `RLOCK.FORCERELEASE key`
pub fn force_release(ctx: &Context, argv: &[RedisString]) -> RedisResult {
    guarded(ctx, || {
        let cmd = args::KeyOnly::parse(argv)?;
        door::load(ctx, cmd.key);
        waiting::settle(ctx, cmd.key);
        let key = LockKey::open(ctx, cmd.key, true);
        let plan = rules::force_release(key.view(None)?);
        check_publish(ctx, cmd.key, plan.publish.then_some(Unlocked::Lock))?;
        if key.apply(None, &plan) {
            drop(key);
            // A read-write lock's hash deleted here leaves no read hold to look at (it may
            // have had some).
            waiting::forget_check(ctx, cmd.key, true);
            waiting::session::lock_ended(ctx, cmd.key);
            waiting::freed(ctx, cmd.key, Unlocked::Lock);
        }
        Ok(store::to_value(plan.reply))
    })
}

/// `RLOCK.PTTL key`
pub fn pttl(ctx: &Context, argv: &[RedisString]) -> RedisResult {
    guarded(ctx, || {
        let cmd = args::KeyOnly::parse(argv)?;
        let view = LockKey::open(ctx, cmd.key, false).view(None)?;
        Ok(RedisValue::Integer(rules::pttl(view)))
    })
}

/// A counter as a reply integer (saturating).
pub(crate) fn clamp(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// `RLOCK.INFO key`
pub fn info(ctx: &Context, argv: &[RedisString]) -> RedisResult {
    guarded(ctx, || {
        let cmd = args::KeyOnly::parse(argv)?;
        let key = LockKey::open(ctx, cmd.key, false);
        let pttl = match key.view(None)? {
            View::Free => return Ok(RedisValue::Null),
            View::Held { pttl, .. } => pttl,
        };
        if key.holders() != 1 {
            // A read-write lock is named as every other RLOCK.* command names it.
            let rw = key.is_rw_lock();
            return Err(if rw { LockError::NotAReentrantLock } else { LockError::NotALock });
        }
        drop(key);
        let (owner, count) = store::only_field(ctx, cmd.key)?;
        let count = rules::parse_count(&count)?;
        let waiters = waiting::waiting(raw::selected_db(ctx), cmd.key.as_slice());
        let token = TokenCounter::for_reading(ctx, cmd.key)?.current(ctx)?;
        let queue = waiting::listing::queue_stats(raw::selected_db(ctx), cmd.key.as_slice());
        raw::reply::reply_map(
            ctx,
            &[
                ("owner", Field::Bytes(&owner)),
                ("count", Field::Int(count as i64)),
                ("pttl", Field::Int(pttl)),
                ("waiters", Field::Int(waiters as i64)),
                ("token", Field::Int(token as i64)),
                ("queue_waits", Field::Int(clamp(queue.waits))),
                ("queue_handoffs", Field::Int(clamp(queue.handoffs))),
                ("queue_timeouts", Field::Int(clamp(queue.timeouts))),
            ],
        );
        Ok(RedisValue::NoReply)
    })
}
