//! A counting semaphore on Redis, on Redisson's `RSemaphore` layout: a string holding the
//! available permits. Reads it into a [`SemState`] and applies a [`SemPlan`], notified and
//! replicated as the plain command Redisson's scripts run (`SET`, `INCRBY`, `DECRBY`).

use redis_module::{CallOptionsBuilder, CallReply, CallResult, Context, RedisString};

use super::access::{check_key, check_publish};
use super::{replicating, Unlocked};
use crate::args::sem::MAX_LEASED;
use crate::error::LockError;
use crate::names;
use crate::raw::{self, Key, KeyKind, KeyUse};
use crate::sem_rules::{self, SemPlan, SemState, SemWrite};

/// The longest text of an integer `INCRBY` reads (`-9223372036854775808`): a longer value is
/// refused without being copied, whatever size a foreign writer gave it.
const MAX_INTEGER_LEN: usize = 20;

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

    /// Deletes the key (the caller notifies and replicates).
    pub(crate) fn delete(&self) {
        self.key.delete();
    }

    /// The key as the rules see it.
    ///
    /// # Errors
    /// `WRONGTYPE` for a key that is not a string; [`LockError::CorruptPermits`] for a string
    /// that is not an integer.
    pub fn state(&self) -> Result<SemState, LockError> {
        match self.key.kind() {
            KeyKind::Empty => Ok(SemState { available: None }),
            KeyKind::String if self.key.string_len() > MAX_INTEGER_LEN => {
                Err(LockError::CorruptPermits)
            }
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
        // INCRBY and DECRBY keep the key's expiry; RM_StringSet drops it, so it is put back:
        // the absolute deadline as stored, never recomputed from a clock (which moved it by a
        // millisecond whenever the clock ticked between two readings, and not on replicas).
        let kept = match plan.write {
            SemWrite::Add(_) => Some(self.key.expire_at()).filter(|&at| at >= 0),
            _ => None,
        };
        self.key.string_set(&raw::int_string(ctx, value));
        if let Some(at) = kept {
            self.key.set_expire_at(at);
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
/// client's leases included). `None` when the semaphore is missing. The lease zset is read only
/// when it exists, and then only by a caller allowed to read it.
///
/// # Errors
/// As [`SemKey::state`], and `NOPERM` for the lease zset.
pub fn available_now(
    ctx: &Context,
    name: &RedisString,
    now: i64,
) -> Result<Option<i64>, LockError> {
    let Some(count) = SemKey::open(ctx, name, false).state()?.available else { return Ok(None) };
    let ended = match Leases::of(ctx, name) {
        Ok(leases) if leases.exists(ctx)? => {
            check_key(ctx, &leases.name, KeyUse::Read, LockError::NoPermLeases)?;
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

    /// The lease zset of `sem` for reading by the calling client (`RSEM.INFO`, which reports
    /// it whether or not it exists); `None` for a name whose zset would live in another cluster
    /// slot (it has no leases).
    ///
    /// # Errors
    /// `NOPERM` when the caller's ACL user may not read the zset.
    pub fn for_reading(ctx: &Context, sem: &RedisString) -> Result<Option<Self>, LockError> {
        let Ok(leases) = Self::of(ctx, sem) else { return Ok(None) };
        check_key(ctx, &leases.name, KeyUse::Read, LockError::NoPermLeases)?;
        Ok(Some(leases))
    }

    /// Whether the zset exists.
    ///
    /// # Errors
    /// `WRONGTYPE` when its key holds anything but a sorted set (a list, say: a foreign
    /// writer's), checked here rather than left to the commands called on it, so that a grant
    /// can refuse before it writes the count.
    pub fn exists(&self, ctx: &Context) -> Result<bool, LockError> {
        let key = Key::open(ctx, &self.name, false);
        match key.kind() {
            KeyKind::Empty => Ok(false),
            KeyKind::Other if key.is_zset() => Ok(true),
            KeyKind::Other | KeyKind::Hash | KeyKind::String => Err(LockError::WrongType),
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
        // Counted as a key read per argument (a member looked up, added or removed).
        raw::work::add(u64::try_from(argv.len()).unwrap_or(u64::MAX));
        let options = if write {
            CallOptionsBuilder::new().replicate().errors_as_replies().build()
        } else {
            CallOptionsBuilder::new().errors_as_replies().build()
        };
        let reply: CallResult<'static> = ctx.call_ext(command, &options, argv.as_slice());
        reply.map_err(|_| LockError::WrongType)
    }

    /// The ids whose lease ended by `now`, at most `limit` of them (earliest first), whatever
    /// size a foreign writer gave the zset.
    ///
    /// # Errors
    /// `WRONGTYPE` when the zset's key holds something else.
    pub fn expired(
        &self,
        ctx: &Context,
        now: i64,
        limit: usize,
    ) -> Result<Vec<Vec<u8>>, LockError> {
        if !self.exists(ctx)? {
            return Ok(Vec::new());
        }
        let (now, limit) = (now.to_string(), limit.to_string());
        let args: [&[u8]; 5] = [b"-inf", now.as_bytes(), b"LIMIT", b"0", limit.as_bytes()];
        match self.call(ctx, "ZRANGEBYSCORE", &args, false)? {
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

    /// Each id's lease end (`None`: not a permit of this semaphore), in one `ZMSCORE`.
    ///
    /// # Errors
    /// `WRONGTYPE` when the zset's key holds something else.
    pub fn scores(&self, ctx: &Context, ids: &[&[u8]]) -> Result<Vec<Option<i64>>, LockError> {
        if ids.is_empty() || !self.exists(ctx)? {
            return Ok(vec![None; ids.len()]);
        }
        let CallReply::Array(items) = self.call(ctx, "ZMSCORE", ids, false)? else {
            return Ok(vec![None; ids.len()]);
        };
        let mut scores: Vec<Option<i64>> = items
            .iter()
            .map(|item| match item {
                Ok(CallReply::String(s)) => {
                    s.to_string().and_then(|s| s.parse::<f64>().ok()).map(|f| f as i64)
                }
                Ok(CallReply::Double(d)) => Some(d.to_double() as i64),
                _ => None,
            })
            .collect();
        scores.resize(ids.len(), None);
        Ok(scores)
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

/// What a reclaim did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reclaimed {
    /// How many permits came back.
    pub back: i64,
    /// A whole batch came back: more ended leases may be left for the next look.
    pub more: bool,
    /// The lease zset was there (when not, nothing needs reclaiming later either, until a
    /// leased grant or a Redisson client makes it).
    pub leases: bool,
    /// The caller's `reserve` came back in the same write (the reclaim wrote the count).
    pub reserved: bool,
}

/// Reclaims the semaphore `name`'s permits whose lease ended by `now`, at most [`MAX_LEASED`]
/// of them (a bounded batch per command or timer tick, whatever a foreign writer put in the
/// zset): their ids leave the zset and the count goes up by as many. Everything that can refuse
/// is checked first: the zset's and the channel's ACL for a calling client (the permits that come
/// back are published), the count.
///
/// # Errors
/// `WRONGTYPE`, a corrupt count, an overflow, `NOPERM`.
///
/// `reserve`: permits the caller gives back (a release): the reclaim leaves room for them in
/// the count, and when it writes the count it adds them in the same write (`reserved`: one
/// `INCRBY`, replicated once, instead of the reclaim's and the release's). Only as many ended leases come back as the count can hold (the
/// rest stay in the zset until it can): a count near the largest integer never turns the
/// reclaim, and every command that begins with it, into an error.
pub fn reclaim(
    ctx: &Context,
    name: &RedisString,
    now: i64,
    reserve: u64,
) -> Result<Reclaimed, LockError> {
    let none = Reclaimed { back: 0, more: false, leases: true, reserved: false };
    let no_leases = Reclaimed { leases: false, ..none };
    // A name whose zset would live in another slot has no leases (leased acquires refuse it).
    let Ok(leases) = Leases::of(ctx, name) else { return Ok(no_leases) };
    if !leases.exists(ctx)? {
        return Ok(no_leases);
    }
    check_key(ctx, &leases.name, KeyUse::ReadWrite, LockError::NoPermLeases)?;
    // Checked before anything is written: a corrupt count refuses the reclaim.
    let state = SemKey::open(ctx, name, false).state()?;
    let reserve = i64::try_from(reserve).unwrap_or(i64::MAX);
    let room = i64::MAX.saturating_sub(state.available().max(0)).saturating_sub(reserve);
    let batch = usize::try_from(room).unwrap_or(usize::MAX).min(MAX_LEASED);
    if batch == 0 {
        return Ok(none);
    }
    let expired = leases.expired(ctx, now, batch)?;
    if expired.is_empty() {
        return Ok(none);
    }
    let ids: Vec<&[u8]> = expired.iter().map(Vec::as_slice).collect();
    // And so does a caller who may not publish the count they bring back. (The room left
    // holds the batch and the reserve: no overflow.)
    let reserve = reserve as u64;
    let plan = sem_rules::release(state, ids.len() as u64 + reserve)?;
    check_publish(ctx, name, Some(Unlocked::Permits(0)))?;
    let back = leases.remove(ctx, &ids)?;
    let total = back.max(0) as u64 + reserve;
    if total > 0 {
        let key = SemKey::open(ctx, name, true);
        let state = key.state()?;
        let plan = match plan.write {
            SemWrite::Add(n) if n as u64 == total => plan,
            _ => sem_rules::release(state, total)?,
        };
        key.apply(state, &plan);
    }
    // A full batch of MAX_LEASED may leave more to reclaim; a batch cut short by the room left
    // in the count waits for the count to come down (the next command, or check, reclaims).
    let more = batch == MAX_LEASED && expired.len() >= MAX_LEASED;
    Ok(Reclaimed { back, more, leases: true, reserved: reserve > 0 })
}

/// `count` new permit ids: 16 random bytes each, as Redisson (3.17+) writes them. `count` is a
/// parsed, bounded request (at most `args::sem::MAX_LEASED`).
#[must_use]
pub fn new_ids(count: u64) -> Vec<Vec<u8>> {
    (0..count).map(|_| uuid::Uuid::new_v4().as_bytes().to_vec()).collect()
}
