//! What the calling client may touch beyond its command's key: the keys and channel a lock
//! derives from its name are checked against the caller's ACL user, as Redis checks the keys
//! of its own commands. The module's own work (timers, events) has no caller and is not checked.

use redis_module::{Context, RedisString};

use super::{outside_command, unlock_channel, Unlocked};
use crate::error::LockError;
use crate::raw::{self, KeyUse};

/// Refuses with `denied` (and an `ACL LOG` entry) when the calling client's ACL user may not use
/// `key` so.
///
/// # Errors
/// `denied`.
pub fn check_key(
    ctx: &Context,
    key: &RedisString,
    how: KeyUse,
    denied: LockError,
) -> Result<(), LockError> {
    if outside_command() {
        return Ok(());
    }
    match raw::User::current(ctx) {
        Some(user) if !user.may_use_key(key, how) => {
            user.log_denied(ctx, key, false);
            Err(denied)
        }
        _ => Ok(()),
    }
}

/// Refuses with `NOPERM` (and an `ACL LOG` entry) when the calling client's ACL user may not
/// publish on the lock's unlock channel. `freeing`: the release the operation may announce, if
/// it may free the lock.
///
/// # Errors
/// [`LockError::NoPermChannel`].
pub fn check_publish(
    ctx: &Context,
    name: &RedisString,
    freeing: Option<Unlocked>,
) -> Result<(), LockError> {
    let Some(unlocked) = freeing.filter(|_| !outside_command()) else { return Ok(()) };
    let Some(user) = raw::User::current(ctx) else { return Ok(()) };
    let channel = unlock_channel(ctx, name, unlocked);
    if user.may_publish(&channel) {
        Ok(())
    } else {
        user.log_denied(ctx, &channel, true);
        Err(LockError::NoPermChannel)
    }
}
