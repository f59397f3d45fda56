//! A counting semaphore on Redis, on Redisson's `RSemaphore` layout: a string holding the
//! available permits. Reads it into a [`SemState`] and applies a [`SemPlan`], notified and
//! replicated as the plain command Redisson's scripts run (`SET`, `INCRBY`, `DECRBY`).

use redis_module::{Context, RedisString};

use super::replicating;
use crate::error::LockError;
use crate::raw::{self, Key, KeyKind};
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
