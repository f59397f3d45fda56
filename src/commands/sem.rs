//! The `RSEM.*` handlers for counting semaphores: Redisson's `RSemaphore` (`sem_rules`), on its
//! data layout, with fair server-side waiting (FIFO, no barging, several waiters served by one
//! release while permits last).

use redis_module::{Context, RedisResult, RedisString, RedisValue};

use super::guarded;
use crate::args;
use crate::args::Lease;
use crate::door::{self, Entered, Entry};
use crate::error::LockError;
use crate::raw::{self, reply::Field};
use crate::request_rules::{Asked, Granted, REQUEST_RECORD_MS};
use crate::rules::{Deadline, Reply};
use crate::rules::{Kind, Request};
use crate::sem_rules::{self, SemPlan, SemState};
use crate::sessions::{self, Held};
use crate::store::sem::{Leases, SemKey};
use crate::store::{self, Unlocked};
use crate::waiting;

/// The count after a change that raised it, its waiters served and the rest published; the
/// plan's own reply otherwise.
/// `count_left`: the reply is the count left after the waiters were served (`ADDPERMITS`, as
/// a counted `RSEM.RELEASE` replies: what the key holds and what was published), not the
/// plan's.
fn after(
    ctx: &Context,
    name: &RedisString,
    key: SemKey<'_>,
    state: SemState,
    plan: &SemPlan,
    count_left: bool,
) -> Result<RedisValue, LockError> {
    if plan.raised {
        let left = super::permits::came_back(ctx, name, key, state, plan)?;
        if count_left {
            return Ok(RedisValue::Integer(left));
        }
    } else {
        key.apply(state, plan);
    }
    Ok(store::to_value(plan.reply))
}

/// `RSEM.SETPERMITS key permits`
pub fn set_permits(ctx: &Context, argv: &[RedisString]) -> RedisResult {
    guarded(ctx, || {
        let cmd = args::SemCount::parse_set(argv)?;
        door::load(ctx, cmd.key);
        let set = SemKey::open(ctx, cmd.key, false).state()?.available.is_some();
        // Refused where grants are: lost with a replaced master, the change would leave the
        // count short or over its total. A semaphore already set is left as it is (reply 0),
        // refused or not: only the reclaim below is skipped where the count may not change
        // (Redisson's `trySetPermits` at start-up answers while a replica is away).
        if let Err(refused) = store::may_change_count(ctx) {
            return if set { Ok(RedisValue::Integer(0)) } else { Err(refused) };
        }
        // Leases that ended give their permits back first, and the next end is watched, as
        // for every RSEM write; a semaphore not set yet is set as asked (what a lease zset
        // left without its count brings back comes after, as any RSEM command would).
        if set {
            waiting::sem_reclaim_due(ctx, cmd.key)?;
        }
        let key = SemKey::open(ctx, cmd.key, true);
        let state = key.state()?;
        let plan = sem_rules::set_permits(state, cmd.permits);
        after(ctx, cmd.key, key, state, &plan, false)
    })
}

/// `RSEM.ADDPERMITS key delta`
pub fn add_permits(ctx: &Context, argv: &[RedisString]) -> RedisResult {
    guarded(ctx, || {
        let cmd = args::SemAdd::parse(argv)?;
        door::load(ctx, cmd.key);
        // Refused where grants are: lost with a replaced master, the change would leave the
        // count short or over its total.
        store::may_change_count(ctx)?;
        // Decide first: a change the count cannot hold is refused before anything is written.
        sem_rules::add_permits(SemKey::open(ctx, cmd.key, false).state()?, cmd.delta)?;
        // Leases that ended give their permits back first, and the next end is watched, as
        // for every RSEM write: with permits added, in the reclaim's own write (the reclaim
        // takes back no more than the count can hold beside them), as a counted release.
        let added = u64::try_from(cmd.delta).unwrap_or(0);
        if let Some(left) = waiting::sem_reclaim_due_giving_back(ctx, cmd.key, added)? {
            return Ok(RedisValue::Integer(left));
        }
        // Nothing came back: the change on its own (taking permits away: the count, with
        // whatever came back, still holds it).
        let key = SemKey::open(ctx, cmd.key, true);
        let state = key.state()?;
        let plan = sem_rules::add_permits(state, cmd.delta)?;
        after(ctx, cmd.key, key, state, &plan, true)
    })
}

/// `RSEM.ACQUIRE key permits [LEASE lease-ms] [WAIT timeout-ms] [REQUEST id]`
pub fn acquire(ctx: &Context, argv: &[RedisString]) -> RedisResult {
    super::guarded_naming(ctx, || {
        let cmd = args::SemAcquire::parse(argv)?;
        let now = raw::now_ms();
        let until = cmd.lease.map(|lease| Deadline::after(now, lease)).transpose()?;
        let leases = cmd.lease.map(|_| Leases::for_caller(ctx, cmd.key)).transpose()?;
        // Load: everything that can refuse is checked before anything is written.
        let entry = Entry {
            key: cmd.key,
            session: cmd.session,
            unlocked: Unlocked::Permits(0),
            request: cmd.request,
            asked: match cmd.lease {
                Some(_) => Asked::Leased(cmd.permits),
                None => Asked::Permits(cmd.permits),
            },
            token: false,
            now,
        };
        let admitted = match door::enter(ctx, entry)? {
            Entered::Replay(reply) => return Ok(reply),
            Entered::Fresh(admitted) => admitted,
        };
        let (bind, beside) = (admitted.bind, admitted.beside);
        waiting::sem_reclaim_due(ctx, cmd.key)?;
        // Waiters first: permits they are owed go to them.
        waiting::settle(ctx, cmd.key);
        let queued = waiting::in_line(raw::selected_db(ctx), cmd.key.as_slice()) > 0;
        let key = SemKey::open(ctx, cmd.key, true);
        let state = key.state()?;
        let plan = sem_rules::acquire(state, cmd.permits, queued);
        if plan.reply == Reply::Int(0) {
            // Never block where no grant can happen (MULTI, Lua, a writable replica).
            if let Some(wait) = cmd.wait.filter(|_| raw::may_block(ctx) && raw::is_master(ctx)) {
                drop(key);
                let request = Request {
                    kind: match cmd.lease {
                        Some(_) => Kind::Leased(cmd.permits),
                        None => Kind::Permits(cmd.permits),
                    },
                    owner: Vec::new(),
                    lease: cmd.lease.unwrap_or(Lease::UNUSED),
                    token: false,
                    id: cmd.request.map(|id| id.to_vec()),
                    session: bind,
                    gt: false,
                    ownerless: cmd.ownerless,
                };
                // Polled while it waits (`waiting`): permits may come back without an RSEM
                // command (a Redisson client's INCRBY).
                let lock = waiting::lock_name(ctx, cmd.key);
                waiting::block(ctx, lock, request, wait, -1);
                return Ok(RedisValue::NoReply);
            }
            return Ok(if cmd.lease.is_some() {
                RedisValue::Null
            } else {
                store::to_value(plan.reply)
            });
        }
        // Everything the grant writes is made before the first write (the count is bounded by
        // the parser: `args::sem::MAX_LEASED`).
        let ids = leases.as_ref().map(|_| store::sem::new_ids(cmd.permits));
        key.apply(state, &plan);
        drop(key);
        let (Some(leases), Some(until), Some(ids)) = (leases, until, ids) else {
            // Until released, or (`OWNERLESS`) 60 s.
            let until = cmd.ownerless.then(|| now.saturating_add(REQUEST_RECORD_MS));
            beside.write(ctx, None, || Some((Granted::Permits(cmd.permits), until)));
            return Ok(store::to_value(plan.reply));
        };
        let refs: Vec<&[u8]> = ids.iter().map(Vec::as_slice).collect();
        leases.lease(ctx, &refs, until.unix_ms())?;
        for id in &ids {
            let held = Held::Permit(id.clone());
            waiting::session::granted(ctx, cmd.key, held, true, bind, until.unix_ms());
        }
        beside.write(ctx, None, || Some((Granted::Leased(ids.clone()), Some(until.unix_ms()))));
        waiting::schedule_check(ctx, &waiting::lock_name(ctx, cmd.key), until.over_at());
        Ok(store::ids_value(&ids))
    })
}

/// `RSEM.RELEASE key permits [REQUEST id | ONCE id]` or `RSEM.RELEASE key ID id [id ...]`
pub fn release(ctx: &Context, argv: &[RedisString]) -> RedisResult {
    super::guarded_naming(ctx, || match args::SemRelease::parse(argv)? {
        // Counted permits: refused, before anything of the command's own is written, where
        // grants are (`store::may_give_back`). Leased ones are given back (their leases end on a
        // new master anyway).
        args::SemRelease::Count { key, permits, request: Some(id), once } => {
            door::load(ctx, key);
            store::may_give_back(ctx)?;
            super::request::release_counted(ctx, key, permits, id.as_slice(), once)
        }
        args::SemRelease::Count { key, permits, request: None, .. } => {
            door::load(ctx, key);
            store::may_give_back(ctx)?;
            Ok(RedisValue::Integer(super::permits::give_back(ctx, key, permits)?))
        }
        args::SemRelease::Ids { key, ids } => {
            door::load(ctx, key);
            // Decide, write, wake: `waiting::sem_give_back_ids`, which session ends use too.
            let ids: Vec<&[u8]> = ids.iter().map(RedisString::as_slice).collect();
            Ok(RedisValue::Integer(waiting::sem_give_back_ids(ctx, key, &ids)?))
        }
    })
}

/// `RSEM.RENEW key id lease-ms`
pub fn renew(ctx: &Context, argv: &[RedisString]) -> RedisResult {
    guarded(ctx, || {
        let cmd = args::sem::parse_renew(argv)?;
        sessions::check_permit(cmd.owner.as_slice())?;
        let until = Deadline::after(raw::now_ms(), cmd.lease)?;
        door::load(ctx, cmd.key);
        store::may_grant(ctx)?;
        let leases = Leases::for_caller(ctx, cmd.key)?;
        waiting::sem_reclaim_due(ctx, cmd.key)?;
        let id = cmd.owner.as_slice();
        if leases.scores(ctx, &[id])?[0].is_none() {
            return Ok(RedisValue::Integer(0));
        }
        leases.lease(ctx, &[id], until.unix_ms())?;
        waiting::session::renewed(ctx, cmd.key, Held::Permit(id.to_vec()), until.unix_ms());
        waiting::schedule_check(ctx, &waiting::lock_name(ctx, cmd.key), until.over_at());
        Ok(RedisValue::Integer(1))
    })
}

/// `RSEM.AVAILABLE key`
pub fn available(ctx: &Context, argv: &[RedisString]) -> RedisResult {
    guarded(ctx, || {
        let cmd = args::KeyOnly::parse(argv)?;
        let available = store::sem::available_now(ctx, cmd.key, raw::now_ms())?;
        Ok(RedisValue::Integer(available.unwrap_or(0)))
    })
}

/// `RSEM.INFO key`
pub fn info(ctx: &Context, argv: &[RedisString]) -> RedisResult {
    guarded(ctx, || {
        let cmd = args::KeyOnly::parse(argv)?;
        let now = raw::now_ms();
        // It reports the lease zset, even that it is empty: the caller must be allowed to read it.
        let leases = Leases::for_reading(ctx, cmd.key)?;
        let Some(available) = store::sem::available_now(ctx, cmd.key, now)? else {
            return Ok(RedisValue::Null);
        };
        let (waiters, permits) =
            waiting::waiting_permits(raw::selected_db(ctx), cmd.key.as_slice());
        let (leased, earliest) = leases.map_or(Ok((0, None)), |l| l.summary(ctx, now))?;
        let queue = waiting::listing::queue_stats(raw::selected_db(ctx), cmd.key.as_slice());
        raw::reply::reply_map(
            ctx,
            &[
                ("available", Field::Int(available)),
                ("leased", Field::Int(leased)),
                ("next_expiry_ms", Field::Int(earliest.map_or(-1, |at| (at - now).max(0)))),
                ("waiters", Field::Int(waiters as i64)),
                ("waiting_permits", Field::Int(permits)),
                ("queue_waits", Field::Int(super::clamp(queue.waits))),
                ("queue_handoffs", Field::Int(super::clamp(queue.handoffs))),
                ("queue_timeouts", Field::Int(super::clamp(queue.timeouts))),
            ],
        );
        Ok(RedisValue::NoReply)
    })
}
