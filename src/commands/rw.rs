//! The `RWLOCK.*` handlers: Redisson's read-write lock (`rw_rules`), on its own data layout, with
//! the same server-side waiting as `RLOCK.ACQUIRE ... WAIT` (fair: a newcomer reader waits
//! behind a queued writer; a writer's release grants every reader at the head at once).

use redis_module::{Context, RedisResult, RedisString, RedisValue};

use super::guarded;
use crate::args::{self, Mode};
use crate::door::{self, Entered, Entry};
use crate::error::LockError;
use crate::raw::{self, reply::Field};
use crate::request_rules::{Asked, Granted};
use crate::rules::{self, Deadline, Kind, Reply, Request};
use crate::rw_rules::{self, Acquired, Reads};
use crate::sessions::{self, Held};
use crate::store::derived::TokenCounter;
use crate::store::rw::RwKey;
use crate::store::{self, access::check_publish, Unlocked};
use crate::waiting;

/// What an acquire comes to, every refusal checked and nothing written yet.
enum Decision<'a> {
    /// Grant `plan` (with `token`, if asked).
    Grant { key: RwKey<'a>, plan: rw_rules::RwPlan, token: Option<u64> },
    /// Wait for it (the hold key a read grant writes is allowed); `pttl`: the holder's lease.
    Block { pttl: i64 },
    /// Not granted: reply busy with `pttl`.
    Busy { pttl: i64 },
}

/// Decides `cmd` on the lock as it stands (`queued`: others wait for it).
fn decide<'a>(
    ctx: &'a Context,
    cmd: &args::RwAcquire<'a, RedisString>,
    counter: Option<&TokenCounter>,
    now: i64,
    deadline: Deadline,
    queued: bool,
) -> Result<Decision<'a>, LockError> {
    let owner = cmd.owner.as_slice();
    let key = RwKey::open(ctx, cmd.key, true);
    let state = key.state_of(Some(owner))?;
    // A writer whose read holds all ended by their leases holds no read side, whatever its
    // field says until the next dead-reader check: it waits as any writer does (the check
    // comes, or its wait's poll brings it), not refused as an upgrade.
    let state = match cmd.mode {
        Mode::Write => key.with_live_reads(state, owner, now)?,
        Mode::Read => state,
    };
    let own = key.own_holds(&state, owner, cmd.gt, now)?;
    let reads = own.as_ref().map_or(Reads::Set, Reads::Gt);
    let pttl = match rw_rules::acquire(&state, cmd.mode, owner, now, deadline, queued, reads)? {
        Acquired::Granted(plan) => {
            key.check(&plan)?;
            let token = counter.map(|c| c.next(ctx)).transpose()?;
            return Ok(Decision::Grant { key, plan, token });
        }
        Acquired::Upgrade(_) if cmd.wait.is_some() => return Err(LockError::Upgrade),
        Acquired::Busy(pttl) | Acquired::Upgrade(pttl) => pttl,
    };
    // Never block where no grant can happen (MULTI, Lua, a writable replica).
    if cmd.wait.is_none() || !raw::may_block(ctx) || !raw::is_master(ctx) {
        return Ok(Decision::Busy { pttl });
    }
    if cmd.mode == Mode::Read {
        // Its grant writes this hold key: may it? (Checked again, as its user, when it is
        // granted.)
        key.check_hold(owner, state.reads_of(owner) + 1)?;
    }
    Ok(Decision::Block { pttl })
}

/// `RWLOCK.ACQUIRE key owner READ|WRITE lease-ms [WAIT timeout-ms] [TOKEN] [REQUEST id]
/// [SESSION [LOCKDELAY lockdelay-ms]] [GT]`
pub fn acquire(ctx: &Context, argv: &[RedisString]) -> RedisResult {
    super::guarded_naming(ctx, || {
        let cmd = args::RwAcquire::parse(argv)?;
        rw_rules::check_owner(cmd.owner.as_slice())?;
        sessions::check_owner(cmd.owner.as_slice())?;
        let now = raw::now_ms();
        let deadline = Deadline::after(now, cmd.lease)?;
        // Load: everything that can refuse is checked before anything is written.
        let entry = Entry {
            key: cmd.key,
            session: cmd.session,
            unlocked: Unlocked::Rw(cmd.mode),
            request: cmd.request,
            asked: Asked::Rw { mode: cmd.mode, owner: cmd.owner.as_slice(), token: cmd.token },
            token: cmd.token,
            now,
        };
        let admitted = match door::enter(ctx, entry)? {
            Entered::Replay(reply) => return Ok(reply),
            Entered::Fresh(admitted) => admitted,
        };
        let counter = admitted.beside.counter.as_ref();
        let db = raw::selected_db(ctx);
        if waiting::waiting(db, cmd.key.as_slice()) > 0 {
            // Refusals first, even of the hand-off below: a command that replies an error
            // writes nothing. (One refusal can follow the hand-off: the waiter it grants may be
            // this owner's read, and then its write is an upgrade; that grant was owed.)
            drop(decide(ctx, &cmd, counter, now, deadline, true)?);
            // Waiters first: a lock they are owed goes to them (on its own key handle).
            waiting::settle(ctx, cmd.key);
        }
        let queued = waiting::in_line(db, cmd.key.as_slice()) > 0;
        match decide(ctx, &cmd, counter, now, deadline, queued)? {
            Decision::Grant { key, plan, token } => {
                key.apply(&plan);
                drop(key);
                let bind = admitted.bind;
                let (mode, owner) = (cmd.mode, cmd.owner.to_vec());
                let until = plan.grant_until().unwrap_or(deadline.unix_ms());
                let granted = || Some((Granted::Rw { mode, owner, token }, Some(until)));
                admitted.written(ctx, cmd.key, token, granted, || None);
                waiting::session::rw_granted(ctx, cmd.key, cmd.owner.as_slice(), &plan, bind);
                waiting::rw_applied(ctx, cmd.key, &plan);
                Ok(store::to_value(rules::granted(token)))
            }
            Decision::Block { pttl } => {
                let request = Request {
                    kind: Kind::Rw(cmd.mode),
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
                waiting::deadlock::refuse_cycle(ctx, cmd.key, &request, None, user.as_deref())?;
                let wait = cmd.wait.unwrap_or(args::WaitFor::Ever);
                let lock = waiting::lock_name(ctx, cmd.key);
                waiting::block_as(ctx, lock, request, wait, pttl, user);
                Ok(RedisValue::NoReply)
            }
            Decision::Busy { pttl } => Ok(store::to_value(rules::busy(pttl, cmd.token))),
        }
    })
}

/// `RWLOCK.RELEASE key owner READ|WRITE [REQUEST id]`
pub fn release(ctx: &Context, argv: &[RedisString]) -> RedisResult {
    guarded(ctx, || {
        let cmd = args::RwRelease::parse(argv)?;
        rw_rules::check_owner(cmd.owner.as_slice())?;
        door::load(ctx, cmd.key);
        // Decide, write, wake: `waiting::rw_release`, which also undoes a grant whose client left.
        super::latched(ctx, cmd.key, cmd.request, || {
            waiting::rw_release(ctx, cmd.key, cmd.owner.as_slice(), cmd.mode)
        })
    })
}

/// `RWLOCK.RENEW key owner lease-ms [READ|WRITE] [GT]`
pub fn renew(ctx: &Context, argv: &[RedisString]) -> RedisResult {
    guarded(ctx, || {
        let cmd = args::RwRenew::parse(argv)?;
        rw_rules::check_owner(cmd.owner.as_slice())?;
        sessions::check_owner(cmd.owner.as_slice())?;
        let now = raw::now_ms();
        let deadline = Deadline::after(now, cmd.lease)?;
        door::load(ctx, cmd.key);
        store::may_grant(ctx)?;
        let key = RwKey::open(ctx, cmd.key, true);
        let owner = cmd.owner.as_slice();
        // An owner whose read holds all ended by their leases holds no read side, whatever
        // its field says until the next dead-reader check: nothing of it is renewed.
        let state = key.with_live_reads(key.state_of(Some(owner))?, owner, now)?;
        let own = key.own_holds(&state, owner, cmd.gt, now)?;
        let reads = own.as_ref().map_or(Reads::Set, Reads::Gt);
        let plan = match cmd.mode {
            None => rw_rules::renew(&state, owner, now, deadline, reads),
            Some(side) => rw_rules::renew_side(&state, owner, side, now, deadline, reads),
        };
        key.check(&plan)?;
        key.apply(&plan);
        drop(key);
        if plan.reply == Reply::Int(1) {
            // Every read hold renewed ends at the deadline (the read side's binding with them);
            // the write side lasts as the hash does.
            if cmd.mode != Some(Mode::Write) {
                let held = Held::Read(owner.to_vec());
                waiting::session::renewed(ctx, cmd.key, held, reads.until(deadline).unix_ms());
            }
            // The hash's lease (the write hold's) moved whichever side was renewed.
            waiting::session::write_lease_moved(ctx, cmd.key, owner);
        }
        waiting::rw_applied(ctx, cmd.key, &plan);
        Ok(store::to_value(plan.reply))
    })
}

/// `RWLOCK.FORCERELEASE key`
pub fn force_release(ctx: &Context, argv: &[RedisString]) -> RedisResult {
    guarded(ctx, || {
        let cmd = args::KeyOnly::parse(argv)?;
        door::load(ctx, cmd.key);
        let mode = RwKey::open(ctx, cmd.key, false).state_of(None)?.mode;
        if mode.is_some() || waiting::waiting(raw::selected_db(ctx), cmd.key.as_slice()) > 0 {
            // Refused before the hand-off below: whatever holds the lock then, it is freed.
            check_publish(ctx, cmd.key, Some(Unlocked::Rw(Mode::Write)))?;
        }
        waiting::settle(ctx, cmd.key);
        let key = RwKey::open(ctx, cmd.key, true);
        let plan = rw_rules::force_release(&key.state_of(None)?);
        check_publish(ctx, cmd.key, plan.freed.map(Unlocked::Rw))?;
        key.apply(&plan);
        drop(key);
        waiting::rw_applied(ctx, cmd.key, &plan);
        Ok(store::to_value(plan.reply))
    })
}

/// `RWLOCK.INFO key`
pub fn info(ctx: &Context, argv: &[RedisString]) -> RedisResult {
    guarded(ctx, || {
        let cmd = args::KeyOnly::parse(argv)?;
        let state = RwKey::open(ctx, cmd.key, false).state()?;
        let Some(mode) = state.mode else { return Ok(RedisValue::Null) };
        let db = raw::selected_db(ctx);
        let waiting_in = |mode| waiting::waiting_in(db, cmd.key.as_slice(), mode) as i64;
        let token = TokenCounter::for_reading(ctx, cmd.key)?.current(ctx)?;
        let (writer, write_count) = match &state.writer {
            Some((owner, count)) => (Field::Bytes(owner), *count as i64),
            None => (Field::Nil, 0),
        };
        let read_holds: u64 = state.readers.values().sum();
        let queue = waiting::listing::queue_stats(db, cmd.key.as_slice());
        raw::reply::reply_map(
            ctx,
            &[
                ("mode", Field::Bytes(mode.as_bytes())),
                ("writer", writer),
                ("write_count", Field::Int(write_count)),
                ("readers", Field::Int(state.readers.len() as i64)),
                ("read_holds", Field::Int(read_holds as i64)),
                ("pttl", Field::Int(state.pttl)),
                ("waiting_readers", Field::Int(waiting_in(Mode::Read))),
                ("waiting_writers", Field::Int(waiting_in(Mode::Write))),
                ("token", Field::Int(token as i64)),
                ("queue_waits", Field::Int(super::clamp(queue.waits))),
                ("queue_handoffs", Field::Int(super::clamp(queue.handoffs))),
                ("queue_timeouts", Field::Int(super::clamp(queue.timeouts))),
            ],
        );
        Ok(RedisValue::NoReply)
    })
}
