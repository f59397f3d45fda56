//! A counting semaphore on Redis, on Redisson's `RSemaphore` layout: a string holding the
//! available permits. Reads it into a [`SemState`] and applies a [`SemPlan`], notified and
//! replicated as the plain command Redisson's scripts run (`SET`, `INCRBY`, `DECRBY`).

use redis_module::{CallOptionsBuilder, CallReply, CallResult, Context, RedisString};

use super::access::check_key;
use super::replicating;
use crate::error::LockError;
use crate::names;
use crate::raw::{self, Key, KeyKind, KeyUse};
use crate::sem_rules::{self, SemPlan, SemState, SemWrite};

/// A semaphore's key, open (closed on drop).
pub struct SemKey<'a> {
    ctx: &'a Context,
    name: &'a RedisString,
    key: Key,
}

impl<'a> SemKey<'a> {
    /// Opens the semaphore `name` for reading, or for reading and writing.
    pub fn open(ctx: &'a Context, name: &'a RedisString, writable: bool) -> Self {
        Self { ctx, name, key: Key::open(ctx, name, writable) }
    }

    /// The key as the rules see it.
    ///
    /// # Errors
    /// `WRONGTYPE` for a key that is not a string; [`LockError::CorruptPermits`] for a string
    /// that is not an integer.
    pub fn state(&self) -> Result<SemState, LockError> {
        match self.key.kind() {
            KeyKind::Empty => Ok(SemState { available: None }),
            KeyKind::String => Ok(SemState {
                available: Some(sem_rules::parse_available(&self.key.string_value())?),
            }),
            KeyKind::Hash | KeyKind::Other => Err(LockError::WrongType),
        }
    }

    /// Carries out `plan`'s write, notified and replicated (whenever Redis may propagate
    /// anything, see `store::replicating`). `state` is what [`Self::state`] read.
    pub fn apply(&self, state: SemState, plan: &SemPlan) {
        let (ctx, name) = (self.ctx, self.name);
        let (value, event, command, argument) = match plan.write {
            SemWrite::Keep => return,
            SemWrite::Set(count) => (count, c"set", c"SET", count),
            SemWrite::Add(delta) if delta >= 0 => {
                (state.available().saturating_add(delta), c"incrby", c"INCRBY", delta)
            }
            SemWrite::Add(delta) => {
                (state.available().saturating_add(delta), c"decrby", c"DECRBY", -delta)
            }
        };
        // INCRBY and DECRBY keep the key's expiry; RM_StringSet drops it, so it is put back.
        let kept = match plan.write {
            SemWrite::Add(_) if self.key.kind() != KeyKind::Empty => Some(self.key.pttl()),
            _ => None,
        }
        .filter(|&pttl| pttl >= 0);
        let now = raw::now_ms();
        self.key.string_set(&raw::int_string(ctx, value));
        if let Some(pttl) = kept {
            self.key.set_expire_at(now.saturating_add(pttl));
        }
        raw::signal_modified(ctx, name);
        raw::notify(ctx, raw::Notify::String, event, name);
        if replicating(ctx) {
            raw::replicate(ctx, command, &[name, &raw::int_string(ctx, argument)]);
        } else {
            raw::count_unpropagated_write(ctx);
        }
    }
}

/// The available permits of the semaphore `name` (0 when it is missing).
///
/// # Errors
/// As [`SemKey::state`].
pub fn available(ctx: &Context, name: &RedisString) -> Result<i64, LockError> {
    Ok(SemKey::open(ctx, name, false).state()?.available())
}

/// The permits available at `now` without writing anything: the count plus the leased permits
/// whose lease ended and which the next write (or the reclaim timer) puts back (a Redisson
/// client's leases included). `None` when the semaphore is missing.
///
/// # Errors
/// As [`SemKey::state`].
pub fn available_now(
    ctx: &Context,
    name: &RedisString,
    now: i64,
) -> Result<Option<i64>, LockError> {
    let Some(count) = SemKey::open(ctx, name, false).state()?.available else { return Ok(None) };
    let ended = match Leases::of(ctx, name) {
        Ok(leases) if leases.exists(ctx)? => {
            let now = now.to_string();
            match leases.call(ctx, "ZCOUNT", &[b"-inf", now.as_bytes()], false)? {
                CallReply::I64(n) => n.to_i64(),
                _ => 0,
            }
        }
        _ => 0,
    };
    Ok(Some(count.saturating_add(ended)))
}

/// A semaphore's leased permits: the zset `{name}:timeout` (Redisson's `suffixName`) of permit
/// ids (16 bytes) scored by their lease's end in Unix ms (`sem_rules::NO_LEASE`: none). Read and
/// written with the commands themselves (`ZRANGEBYSCORE`, `ZADD`, `ZREM`, ...), called from the
/// module and replicated as they are.
pub struct Leases {
    name: RedisString,
}

impl Leases {
    /// The lease zset of the semaphore `sem`, for the module's own work.
    ///
    /// # Errors
    /// [`LockError::CrossSlot`] in cluster mode for a name whose zset lives in another slot.
    pub fn of(ctx: &Context, sem: &RedisString) -> Result<Self, LockError> {
        let name = names::suffixed(sem.as_slice(), b"timeout");
        if raw::in_cluster(ctx) && !names::same_slot(sem.as_slice(), &name) {
            return Err(LockError::CrossSlot);
        }
        Ok(Self { name: RedisString::create_from_slice(ctx.get_raw(), &name) })
    }

    /// The lease zset of `sem` for the calling client, which must be allowed to use it.
    ///
    /// # Errors
    /// As [`Self::of`], and `NOPERM`.
    pub fn for_caller(ctx: &Context, sem: &RedisString) -> Result<Self, LockError> {
        let leases = Self::of(ctx, sem)?;
        check_key(ctx, &leases.name, KeyUse::ReadWrite, LockError::NoPermLeases)?;
        Ok(leases)
    }

    fn exists(&self, ctx: &Context) -> Result<bool, LockError> {
        match Key::open(ctx, &self.name, false).kind() {
            KeyKind::Empty => Ok(false),
            KeyKind::Other => Ok(true),
            KeyKind::Hash | KeyKind::String => Err(LockError::WrongType),
        }
    }

    fn call(
        &self,
        ctx: &Context,
        command: &str,
        args: &[&[u8]],
        write: bool,
    ) -> Result<CallReply<'static>, LockError> {
        let mut argv: Vec<&[u8]> = vec![self.name.as_slice()];
        argv.extend_from_slice(args);
        let options = if write {
            CallOptionsBuilder::new().replicate().errors_as_replies().build()
        } else {
            CallOptionsBuilder::new().errors_as_replies().build()
        };
        let reply: CallResult<'static> = ctx.call_ext(command, &options, argv.as_slice());
        reply.map_err(|_| LockError::WrongType)
    }

    /// The ids whose lease ended by `now`.
    ///
    /// # Errors
    /// `WRONGTYPE` when the zset's key holds something else.
    pub fn expired(&self, ctx: &Context, now: i64) -> Result<Vec<Vec<u8>>, LockError> {
        if !self.exists(ctx)? {
            return Ok(Vec::new());
        }
        let now = now.to_string();
        match self.call(ctx, "ZRANGEBYSCORE", &[b"-inf", now.as_bytes()], false)? {
            CallReply::Array(items) => Ok(items
                .iter()
                .filter_map(|i| match i {
                    Ok(CallReply::String(s)) => Some(s.as_bytes().to_vec()),
                    _ => None,
                })
                .collect()),
            _ => Ok(Vec::new()),
        }
    }

    /// Each id's lease end (`None`: not a permit of this semaphore).
    ///
    /// # Errors
    /// `WRONGTYPE` when the zset's key holds something else.
    pub fn scores(&self, ctx: &Context, ids: &[&[u8]]) -> Result<Vec<Option<i64>>, LockError> {
        if !self.exists(ctx)? {
            return Ok(vec![None; ids.len()]);
        }
        ids.iter()
            .map(|id| match self.call(ctx, "ZSCORE", &[id], false)? {
                CallReply::String(s) => {
                    Ok(s.to_string().and_then(|s| s.parse::<f64>().ok()).map(|f| f as i64))
                }
                CallReply::Double(d) => Ok(Some(d.to_double() as i64)),
                _ => Ok(None),
            })
            .collect()
    }

    /// Leases `ids` until `until` (Unix ms), adding them or moving an existing one's end.
    pub fn lease(&self, ctx: &Context, ids: &[&[u8]], until: i64) -> Result<(), LockError> {
        let score = until.to_string();
        let mut args: Vec<&[u8]> = Vec::with_capacity(ids.len() * 2);
        for id in ids {
            args.push(score.as_bytes());
            args.push(id);
        }
        self.call(ctx, "ZADD", &args, true).map(|_| ())
    }

    /// Removes `ids`; returns how many were there.
    pub fn remove(&self, ctx: &Context, ids: &[&[u8]]) -> Result<i64, LockError> {
        match self.call(ctx, "ZREM", ids, true)? {
            CallReply::I64(n) => Ok(n.to_i64()),
            _ => Ok(0),
        }
    }

    /// How many leases are live at `now`, and when the earliest of them ends.
    ///
    /// # Errors
    /// `WRONGTYPE` when the zset's key holds something else.
    pub fn summary(&self, ctx: &Context, now: i64) -> Result<(i64, Option<i64>), LockError> {
        if !self.exists(ctx)? {
            return Ok((0, None));
        }
        let after = format!("({now}");
        let live = match self.call(ctx, "ZCOUNT", &[after.as_bytes(), b"+inf"], false)? {
            CallReply::I64(n) => n.to_i64(),
            _ => 0,
        };
        let before = format!("({}", sem_rules::NO_LEASE);
        let earliest = match self.call(
            ctx,
            "ZRANGEBYSCORE",
            &[after.as_bytes(), before.as_bytes(), b"WITHSCORES", b"LIMIT", b"0", b"1"],
            false,
        )? {
            CallReply::Array(items) => match items.get(1) {
                Some(Ok(CallReply::String(s))) => {
                    s.to_string().and_then(|s| s.parse::<f64>().ok()).map(|f| f as i64)
                }
                Some(Ok(CallReply::Double(d))) => Some(d.to_double() as i64),
                _ => None,
            },
            _ => None,
        };
        Ok((live, earliest))
    }
}

/// Reclaims the semaphore `name`'s permits whose lease ended by `now`: their ids leave the zset
/// and the count goes up by as many. Returns how many came back.
///
/// # Errors
/// `WRONGTYPE` or a corrupt count.
pub fn reclaim(ctx: &Context, name: &RedisString, now: i64) -> Result<i64, LockError> {
    // A name whose zset would live in another slot has no leases (leased acquires refuse it).
    let Ok(leases) = Leases::of(ctx, name) else { return Ok(0) };
    if !leases.exists(ctx)? {
        return Ok(0);
    }
    check_key(ctx, &leases.name, KeyUse::ReadWrite, LockError::NoPermLeases)?;
    let expired = leases.expired(ctx, now)?;
    if expired.is_empty() {
        return Ok(0);
    }
    let ids: Vec<&[u8]> = expired.iter().map(Vec::as_slice).collect();
    // The count is checked before anything is written: a corrupt count refuses the reclaim.
    let state = SemKey::open(ctx, name, false).state()?;
    state.available().checked_add(ids.len() as i64).ok_or(LockError::PermitsOverflow)?;
    let back = leases.remove(ctx, &ids)?;
    if back > 0 {
        let key = SemKey::open(ctx, name, true);
        let state = key.state()?;
        key.apply(
            state,
            &SemPlan { write: SemWrite::Add(back), raised: true, reply: crate::rules::Reply::Nil },
        );
    }
    Ok(back)
}

/// `count` new permit ids: 16 random bytes each, as Redisson (3.17+) writes them.
#[must_use]
pub fn new_ids(count: u64) -> Vec<Vec<u8>> {
    (0..count).map(|_| uuid::Uuid::new_v4().as_bytes().to_vec()).collect()
}
