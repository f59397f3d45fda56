//! What the waiting machinery asks of a lock's layout, whatever its kind: can the waiter at the
//! head be granted now (and if so, the grant, checked and ready to write), and what does a wait
//! that ends without a grant reply. `waiting` stays the same for every kind: it asks, writes the
//! grants in queue order, and schedules a look at the holder's lease end.

use redis_module::{Context, RedisString};

use super::derived::TokenCounter;
use super::latch::LatchKey;
use super::request::{Beside, RequestRecord};
use super::rw::RwKey;
use super::sem::{self, Leases, SemKey};
use super::LockKey;
use crate::error::LockError;
use crate::latch_rules;
use crate::raw;
use crate::request_rules::{Granted, Record, REQUEST_RECORD_MS};
use crate::rules::{self, Kind, Plan, Reply, Request, View};
use crate::rw_rules::{self, Acquired, Effect, Mode, RwPlan};
use crate::sem_rules::{self, SemPlan, SemState};

/// A waiter's request record, with its lock kind, owner, and `OWNERLESS` (counted permits).
type WaiterRecord = (RequestRecord, Kind, Vec<u8>, bool);

/// The waiter at the head of a queue, as the lock stands now.
pub enum Head<'a> {
    /// It can be granted: write it with [`Grant::write`].
    Grant(Grant<'a>),
    /// It cannot yet; look again at `recheck_at` (Unix ms: its holder's lease end; `None`: at
    /// the waiters' next poll).
    Wait { recheck_at: Option<i64> },
    /// It can never be granted as it asked (a fencing token that cannot be issued, an upgrade
    /// that would wait for itself): answer it with this error and look at the next one.
    Refuse(LockError),
}

/// A grant to a waiter, checked: everything that can refuse was asked before anything is
/// written.
pub struct Grant<'a> {
    write: Write<'a>,
    token: Option<(TokenCounter, u64)>,
    /// The waiter's request record (it asked with `REQUEST id`), with its lock kind and owner
    /// (boxed: most waiters have none).
    record: Option<Box<WaiterRecord>>,
}

enum Write<'a> {
    Reentrant {
        key: LockKey<'a>,
        owner: RedisString,
        plan: Plan,
    },
    Rw {
        key: RwKey<'a>,
        plan: RwPlan,
    },
    /// An awaiter of an open latch: nothing to write.
    Latch,
    /// Semaphore permits; leased ones with their zset, lease end and count.
    Permits {
        key: SemKey<'a>,
        state: SemState,
        plan: SemPlan,
        leased: Option<(Leases, i64, u64)>,
    },
}

/// A grant, written.
pub struct Written {
    /// The waiter's reply.
    pub reply: Reply,
    /// When the lease just granted is over (Unix ms): look at the queue again then.
    pub lease_over_at: Option<i64>,
    /// When a read hold or a leased permit just granted ends (Unix ms): look at the lock then.
    pub reap_at: Option<i64>,
    /// The leased permits' ids (the reply, instead of `reply`, when there are any).
    pub ids: Vec<Vec<u8>>,
    /// What identifies this grant on the lock, should it have to be undone.
    pub stamp: Stamp,
}

/// What identifies a grant on the lock, so that undoing it (its client left before its reply)
/// undoes that grant and nothing else: by the time the undo runs (a timer, perhaps after a
/// pause), the same owner may hold the lock again by a grant of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stamp {
    /// Nothing to tell apart: counted permits are anonymous, leased ones are undone by id.
    None,
    /// The owner's hold count after the grant and the key's deadline (Unix ms) it set: a
    /// reentrant lock's hold, a read-write lock's write hold.
    Hold { count: u64, expire_at: i64 },
    /// A read hold: its index and its hold key's deadline (Unix ms).
    ReadHold { index: u64, expire_at: i64 },
}

/// When to look again at a lock whose holder has `pttl` ms left at `now` (-1: no expiry).
const fn recheck(now: i64, pttl: i64) -> Option<i64> {
    if pttl >= 0 {
        Some(rules::lease_over_at(now, pttl))
    } else {
        None
    }
}

/// Looks at the waiter at the head of the lock `name`'s queue, asking `request` at `now`. What
/// its grant writes beyond the lock key (read hold keys, token counter, lease zset) is checked
/// against the ACL user `access::acting_as` names (the waiter's).
pub fn consider<'a>(
    ctx: &'a Context,
    name: &'a RedisString,
    request: &Request,
    now: i64,
) -> Head<'a> {
    let write = match request.kind {
        Kind::Reentrant => {
            let owner = RedisString::create_from_slice(ctx.get_raw(), &request.owner);
            let key = LockKey::open(ctx, name, true);
            let Ok(view) = key.view(Some(&owner)) else {
                // Not a lock any more (WRONGTYPE, a corrupt count): nobody is granted.
                return Head::Wait { recheck_at: None };
            };
            let Some(plan) = request.grant(view, now, key.raw().expire_at()) else {
                let pttl = if let View::Held { pttl, .. } = view { pttl } else { -1 };
                return Head::Wait { recheck_at: recheck(now, pttl) };
            };
            Write::Reentrant { key, owner, plan }
        }
        Kind::Rw(mode) => {
            let key = RwKey::open(ctx, name, true);
            let Ok(state) = key.state_of(Some(&request.owner)) else {
                return Head::Wait { recheck_at: None };
            };
            // A writer whose read holds all ended holds no read side (not an upgrade).
            let state = match mode {
                Mode::Write => match key.with_live_reads(state, &request.owner, now) {
                    Ok(state) => state,
                    Err(e) => return Head::Refuse(e),
                },
                Mode::Read => state,
            };
            let deadline =
                rules::Deadline::after(now, request.lease).unwrap_or(rules::Deadline::LAST);
            let own = match key.own_holds(&state, &request.owner, request.gt, now) {
                Ok(own) => own,
                Err(e) => return Head::Refuse(e),
            };
            let reads = own.as_ref().map_or(rw_rules::Reads::Set, rw_rules::Reads::Gt);
            let owner = &request.owner;
            let plan = match rw_rules::acquire(&state, mode, owner, now, deadline, false, reads) {
                Ok(Acquired::Granted(plan)) => plan,
                Ok(Acquired::Busy(pttl)) => return Head::Wait { recheck_at: recheck(now, pttl) },
                Ok(Acquired::Upgrade(_)) => return Head::Refuse(LockError::Upgrade),
                Err(e) => return Head::Refuse(e),
            };
            if let Err(e) = key.check(&plan) {
                return Head::Refuse(e);
            }
            Write::Rw { key, plan }
        }
        Kind::Latch => {
            // Every awaiter of an open latch is answered (the hand-off goes on to the next);
            // a latch retyped or spoiled under its awaiters answers them with that error.
            return match LatchKey::open(ctx, name, false).count() {
                Ok(count) if latch_rules::is_open(count) => {
                    Head::Grant(Grant { write: Write::Latch, token: None, record: None })
                }
                Ok(_) => Head::Wait { recheck_at: None },
                Err(e) => Head::Refuse(e),
            };
        }
        Kind::Permits(permits) | Kind::Leased(permits) => {
            let leased = if let Kind::Leased(_) = request.kind {
                // Checked as the waiter (`access::acting_as`).
                let leases = match Leases::for_caller(ctx, name) {
                    Ok(leases) => leases,
                    Err(e @ LockError::NoPermLeases) => return Head::Refuse(e),
                    Err(_) => return Head::Wait { recheck_at: None },
                };
                // The ids must be recordable before the count is written: a lease "zset" of
                // another type (a foreign writer's list) grants nothing, as a count that is not
                // an integer does not.
                if leases.exists(ctx).is_err() {
                    return Head::Wait { recheck_at: None };
                }
                let until = rules::Deadline::after(now, request.lease)
                    .unwrap_or(rules::Deadline::LAST)
                    .unix_ms();
                Some((leases, until, permits))
            } else {
                None
            };
            // Leases that ended (a Redisson client's too) give their permits back (a bounded
            // batch) when the count alone cannot grant: a queue served in one go reclaims no
            // more batches than it needs.
            let short = SemKey::open(ctx, name, false)
                .state()
                .map_or(true, |state| sem_rules::grant_waiter(state, permits).is_none());
            if short && sem::reclaim(ctx, name, now, 0).is_err() {
                return Head::Wait { recheck_at: None };
            }
            let key = SemKey::open(ctx, name, true);
            let Ok(state) = key.state() else { return Head::Wait { recheck_at: None } };
            let Some(plan) = sem_rules::grant_waiter(state, permits) else {
                // Permits that come back without an RSEM command (a Redisson client's
                // `INCRBY`, a `SET`) are found by the waiters' poll.
                return Head::Wait { recheck_at: None };
            };
            Write::Permits { key, state, plan, leased }
        }
    };
    let token = if request.token {
        match next_token(ctx, name) {
            Ok(token) => Some(token),
            Err(e) => return Head::Refuse(e),
        }
    } else {
        None
    };
    let record = match request.id.as_deref().map(|id| record_of(ctx, name, id)).transpose() {
        Ok(record) => record.map(|record| {
            Box::new((record, request.kind, request.owner.clone(), request.ownerless))
        }),
        Err(e) => return Head::Refuse(e),
    };
    Head::Grant(Grant { write, token, record })
}

/// The request record a grant to a waiter writes, checked (as the waiter, see
/// `access::acting_as`), nothing written: a request cancelled meanwhile (the record says so) is
/// never granted.
fn record_of(ctx: &Context, name: &RedisString, id: &[u8]) -> Result<RequestRecord, LockError> {
    let record = RequestRecord::for_caller(ctx, name, id)?;
    match record.read(ctx)? {
        Some(Record::Cancelled) => Err(LockError::RequestCancelled),
        Some(Record::Granted(_) | Record::Released) | None => Ok(record),
    }
}

/// The counter and the next token of a grant to a waiter, checked (as the waiter, see
/// `access::acting_as`), nothing written.
fn next_token(ctx: &Context, name: &RedisString) -> Result<(TokenCounter, u64), LockError> {
    let counter = TokenCounter::for_caller(ctx, name)?;
    let token = counter.next(ctx)?;
    Ok((counter, token))
}

impl Grant<'_> {
    /// Writes and replicates the grant as the waiter's hold: the lock, then what the grant
    /// writes beside it ([`Beside`]: its token, its request's record).
    pub fn write(self, ctx: &Context) -> Written {
        let Self { write, token, record } = self;
        let (counter, token) = token.map_or((None, None), |(c, t)| (Some(c), Some(t)));
        let (record, asked) = record.map_or((None, None), |record| {
            let (record, kind, owner, ownerless) = *record;
            (Some(record), Some((kind, owner, ownerless)))
        });
        let beside = Beside { counter, record };
        // When the grant's lease ends (Unix ms): its request record lasts that long.
        let (lease_over_at, reap_at, stamp, until) = match write {
            Write::Reentrant { key, owner, plan } => {
                key.apply(Some(&owner), &plan);
                let stamp = match (plan.write, plan.expire_at) {
                    (rules::Write::SetCount(count), Some(at)) => {
                        Stamp::Hold { count, expire_at: at.unix_ms() }
                    }
                    _ => Stamp::None,
                };
                let until = plan.expire_at.map(rules::Deadline::unix_ms);
                (plan.expire_at.map(|d| d.over_at()), None, stamp, until)
            }
            Write::Rw { key, plan } => {
                key.apply(&plan);
                (lease_end(&plan), reap_hint(&plan), rw_stamp(&plan), plan.grant_until())
            }
            Write::Latch => {
                return Written {
                    reply: Reply::Int(1),
                    lease_over_at: None,
                    reap_at: None,
                    ids: Vec::new(),
                    stamp: Stamp::None,
                };
            }
            Write::Permits { key, state, plan, leased } => {
                key.apply(state, &plan);
                drop(key);
                let Some((leases, until, permits)) = leased else {
                    beside.write(ctx, None, || match asked? {
                        // Until released, or (`OWNERLESS`) 60 s.
                        (Kind::Permits(n), _, ownerless) => {
                            let until =
                                ownerless.then(|| raw::now_ms().saturating_add(REQUEST_RECORD_MS));
                            Some((Granted::Permits(n), until))
                        }
                        _ => None,
                    });
                    return Written {
                        reply: plan.reply,
                        lease_over_at: None,
                        reap_at: None,
                        ids: Vec::new(),
                        stamp: Stamp::None,
                    };
                };
                let ids = sem::new_ids(permits);
                let refs: Vec<&[u8]> = ids.iter().map(Vec::as_slice).collect();
                let _ = leases.lease(ctx, &refs, until);
                beside.write(ctx, None, || Some((Granted::Leased(ids.clone()), Some(until))));
                let reap_at = Some(rules::Deadline::at(until).over_at());
                return Written {
                    reply: Reply::Nil,
                    lease_over_at: None,
                    reap_at,
                    ids,
                    stamp: Stamp::None,
                };
            }
        };
        beside.write(ctx, token, || {
            let (kind, owner, _) = asked?;
            let granted = match kind {
                Kind::Rw(mode) => Granted::Rw { mode, owner, token },
                _ => Granted::Lock { owner, token },
            };
            let until = until.unwrap_or_else(|| raw::now_ms().saturating_add(REQUEST_RECORD_MS));
            Some((granted, Some(until)))
        });
        Written { reply: rules::granted(token), lease_over_at, reap_at, ids: Vec::new(), stamp }
    }
}

/// What identifies a read-write grant: the read hold it added, or the write count and the
/// hash's deadline it set.
fn rw_stamp(plan: &RwPlan) -> Stamp {
    let expire_at = plan.effects.iter().find_map(|e| match e {
        Effect::ExpireAt(deadline) => Some(deadline.unix_ms()),
        _ => None,
    });
    plan.effects
        .iter()
        .find_map(|e| match (e, expire_at) {
            (Effect::AddHold { index, deadline, .. }, _) => {
                Some(Stamp::ReadHold { index: *index, expire_at: deadline.unix_ms() })
            }
            (Effect::SetWrites { count, .. }, Some(expire_at)) => {
                Some(Stamp::Hold { count: *count, expire_at })
            }
            _ => None,
        })
        .unwrap_or(Stamp::None)
}

/// Whether the grant `stamp` made to `request` on the lock `name` still stands as it was made
/// (the owner's count and the deadline the grant set): only then may it be undone. A lock the
/// owner holds again by a later grant, or that changed hands, is left alone: its hold ends with
/// its lease.
pub fn still_granted(ctx: &Context, name: &RedisString, request: &Request, stamp: Stamp) -> bool {
    match (request.kind, stamp) {
        (Kind::Permits(_) | Kind::Leased(_) | Kind::Latch, _) => true,
        (_, Stamp::None) => false,
        (Kind::Reentrant, Stamp::Hold { count, expire_at }) => {
            let owner = RedisString::create_from_slice(ctx.get_raw(), &request.owner);
            let held = LockKey::open(ctx, name, false).view(Some(&owner));
            matches!(held, Ok(View::Held { mine: Some(mine), .. }) if mine == count)
                && super::expire_time(ctx, name) == Some(expire_at)
        }
        (Kind::Rw(_), Stamp::Hold { count, expire_at }) => {
            let state = RwKey::open(ctx, name, false).state_of(Some(&request.owner));
            matches!(state, Ok(s) if s.writes_of(&request.owner) == count)
                && super::expire_time(ctx, name) == Some(expire_at)
        }
        (Kind::Rw(_), Stamp::ReadHold { index, expire_at }) => {
            let state = RwKey::open(ctx, name, false).state_of(Some(&request.owner));
            let Ok(state) = state else { return false };
            let hold = crate::names::read_hold(name.as_slice(), &request.owner, index);
            let hold = RedisString::create_from_slice(ctx.get_raw(), &hold);
            state.reads_of(&request.owner) == index
                && super::expire_time(ctx, &hold) == Some(expire_at)
        }
        (Kind::Reentrant, Stamp::ReadHold { .. }) => false,
    }
}

/// When the lease a read-write plan sets on the hash is over.
fn lease_end(plan: &RwPlan) -> Option<i64> {
    plan.effects.iter().find_map(|e| match e {
        Effect::ExpireAt(deadline) => Some(deadline.over_at()),
        _ => None,
    })
}

/// When the earliest read hold a read-write plan creates or renews ends: its readers are looked
/// at then (a reader whose every hold ended leaves).
#[must_use]
pub fn reap_hint(plan: &RwPlan) -> Option<i64> {
    plan.effects
        .iter()
        .filter_map(|e| match e {
            Effect::AddHold { deadline, .. } | Effect::RenewHold { deadline, .. } => {
                Some(deadline.over_at())
            }
            _ => None,
        })
        .min()
}

/// What a wait for the lock `name` that ends without a grant replies (timed out, or `CLIENT
/// UNBLOCK`), read in the context's selected database: the holder's remaining lease (-1: no
/// expiry) as a busy acquire; 0 when nobody holds it at this instant but it could not be
/// granted (writes paused): retry at once.
///
/// # Errors
/// `WRONGTYPE` when the key now holds something else.
pub fn not_granted(ctx: &Context, name: &[u8], request: &Request) -> Result<Reply, LockError> {
    if let Kind::Permits(_) | Kind::Leased(_) | Kind::Latch = request.kind {
        return Ok(request.not_granted(0));
    }
    let name = RedisString::create_from_slice(ctx.get_raw(), name);
    let pttl = match LockKey::open(ctx, &name, false).view(None)? {
        View::Held { pttl, .. } => pttl,
        View::Free => 0,
    };
    Ok(request.not_granted(pttl))
}

/// The mode of a read-write lock waiter (`None`: another kind).
#[must_use]
pub const fn rw_mode(request: &Request) -> Option<Mode> {
    match request.kind {
        Kind::Rw(mode) => Some(mode),
        Kind::Reentrant | Kind::Permits(_) | Kind::Leased(_) | Kind::Latch => None,
    }
}

/// The permits a semaphore waiter asks for (0: another kind).
#[must_use]
pub const fn permits(request: &Request) -> u64 {
    match request.kind {
        Kind::Permits(n) | Kind::Leased(n) => n,
        Kind::Reentrant | Kind::Rw(_) | Kind::Latch => 0,
    }
}
