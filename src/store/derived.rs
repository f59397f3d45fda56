//! The keys a lock derives from its name, named by Redisson's rules (`names`): the fencing-token
//! counter and the release latch (and, in `request`, the acquire's request record). Neither keeps a key handle: each is read, then written, on a
//! key opened and closed at once, so nothing (a hand-off granting a token in between) can leave
//! a handle stale.

use redis_module::{Context, RedisString};

use super::access::check_key;
use super::replicating;
use crate::error::LockError;
use crate::names;
use crate::raw::{self, Key, KeyKind, KeyUse};
use crate::replicas;
use crate::rules;

/// A derived name as a Redis string; in cluster mode it must live in the lock's slot.
pub(super) fn derived_name(
    ctx: &Context,
    lock: &RedisString,
    name: &[u8],
) -> Result<RedisString, LockError> {
    if raw::in_cluster(ctx) && !names::same_slot(lock.as_slice(), name) {
        return Err(LockError::CrossSlot);
    }
    Ok(RedisString::create_from_slice(ctx.get_raw(), name))
}

/// Writes a string key's value (and, if given, its deadline) with its notifications and
/// replication (`SET`, then `PEXPIREAT`).
pub(super) fn store_string(
    ctx: &Context,
    name: &RedisString,
    value: &RedisString,
    event: &std::ffi::CStr,
    until: Option<i64>,
) {
    {
        let key = Key::open(ctx, name, true);
        key.string_set(value);
        if let Some(until) = until {
            key.set_expire_at(until);
        }
    }
    raw::signal_modified(ctx, name);
    raw::notify(ctx, raw::Notify::String, event, name);
    if until.is_some() {
        raw::notify(ctx, raw::Notify::Generic, c"expire", name);
    }
    if replicating(ctx) {
        raw::replicate(ctx, c"SET", &[name, value]);
        if let Some(until) = until {
            raw::replicate(ctx, c"PEXPIREAT", &[name, &raw::int_string(ctx, until)]);
        }
    } else {
        raw::count_unpropagated_write(ctx);
    }
}

/// A lock's fencing-token counter, named by Redisson's rule (`names::token`, where RFencedLock
/// keeps its own): a plain integer string, never expiring, incremented by every grant that asks
/// for a token, so each token is strictly greater than every one before it, across releases,
/// expiries, restarts and failovers (it is replicated as plain data).
pub struct TokenCounter {
    name: RedisString,
}

impl TokenCounter {
    /// The counter of `lock`, for a grant made by the module itself (a hand-off).
    ///
    /// # Errors
    /// [`LockError::CrossSlot`] in cluster mode for a name whose counter lives in another slot.
    pub fn for_grant(ctx: &Context, lock: &RedisString) -> Result<Self, LockError> {
        let name = derived_name(ctx, lock, &names::token(lock.as_slice()))?;
        Ok(Self { name })
    }

    /// The counter of `lock` for the calling client, which must be allowed to write it.
    ///
    /// # Errors
    /// As [`Self::for_grant`], and `NOPERM` when the caller's ACL user may not use the key.
    pub fn for_caller(ctx: &Context, lock: &RedisString) -> Result<Self, LockError> {
        let counter = Self::for_grant(ctx, lock)?;
        check_key(ctx, &counter.name, KeyUse::ReadWrite, LockError::NoPermToken)?;
        Ok(counter)
    }

    /// The counter of `lock` for reading by the calling client (`RLOCK.INFO`).
    ///
    /// # Errors
    /// `NOPERM` when the caller's ACL user may not read the key.
    pub fn for_reading(ctx: &Context, lock: &RedisString) -> Result<Self, LockError> {
        let name = RedisString::create_from_slice(ctx.get_raw(), &names::token(lock.as_slice()));
        check_key(ctx, &name, KeyUse::Read, LockError::NoPermToken)?;
        Ok(Self { name })
    }

    /// The last token granted (0: none yet).
    ///
    /// # Errors
    /// `WRONGTYPE` or [`LockError::CorruptToken`] when the counter key holds anything else.
    pub fn current(&self, ctx: &Context) -> Result<u64, LockError> {
        let key = Key::open(ctx, &self.name, false);
        match key.kind() {
            KeyKind::Empty => rules::parse_token(None),
            KeyKind::String => rules::parse_token(Some(&key.string_value())),
            KeyKind::Hash | KeyKind::Other => Err(LockError::WrongType),
        }
    }

    /// The token of the next grant ([`rules::next_token`] above the failover floor); nothing
    /// is written.
    ///
    /// # Errors
    /// As [`Self::current`], and [`LockError::TokenExhausted`].
    pub fn next(&self, ctx: &Context) -> Result<u64, LockError> {
        rules::next_token(self.current(ctx)?, replicas::token_floor())
    }

    /// Stores `token` (from [`Self::next`]) and replicates it (`SET`, an absolute value).
    pub fn store(self, ctx: &Context, token: u64) {
        replicas::token_granted(token);
        let value = raw::int_string(ctx, token as i64);
        store_string(ctx, &self.name, &value, c"incrby", None);
    }
}

/// How long a release's result is remembered for retries with the same `REQUEST` id.
const RELEASE_LATCH_MS: i64 = 10_000;

/// A release request's latch (Redisson's unlock latch, named by `names::latch`): the result of
/// the first release with that id ([`rules::remembered`]), kept for [`RELEASE_LATCH_MS`].
pub struct Latch {
    name: RedisString,
}

impl Latch {
    /// The latch of request `id` on `lock`, for the calling client, which must be allowed to
    /// write it.
    ///
    /// # Errors
    /// [`LockError::CrossSlot`], or `NOPERM` when the caller's ACL user may not use the key.
    pub fn for_caller(
        ctx: &Context,
        lock: &RedisString,
        id: &RedisString,
    ) -> Result<Self, LockError> {
        let name = derived_name(ctx, lock, &names::latch(lock.as_slice(), id.as_slice()))?;
        check_key(ctx, &name, KeyUse::ReadWrite, LockError::NoPermLatch)?;
        Ok(Self { name })
    }

    /// The first release's result, if this request was seen.
    ///
    /// # Errors
    /// `WRONGTYPE` or [`LockError::CorruptLatch`] when the latch key holds anything else.
    pub fn result(&self, ctx: &Context) -> Result<Option<i64>, LockError> {
        let key = Key::open(ctx, &self.name, false);
        match key.kind() {
            KeyKind::Empty => Ok(None),
            KeyKind::String => match key.string_value().as_slice() {
                b"0" => Ok(Some(0)),
                b"1" => Ok(Some(1)),
                _ => Err(LockError::CorruptLatch),
            },
            KeyKind::Hash | KeyKind::Other => Err(LockError::WrongType),
        }
    }

    /// Remembers `result` for retries.
    pub fn remember(self, ctx: &Context, result: i64) {
        let value = raw::int_string(ctx, result);
        let until = raw::now_ms().saturating_add(RELEASE_LATCH_MS);
        store_string(ctx, &self.name, &value, c"set", Some(until));
    }
}
