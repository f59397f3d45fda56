//! What the calling client may touch beyond its command's key: the keys and channel a lock
//! derives from its name are checked against the caller's ACL user, as Redis checks the keys
//! of its own commands. A grant to a waiter is checked against the WAITER's user, whoever or
//! whatever (a command, a timer) hands the lock on ([`acting_as`]). Other work of the module's
//! own (timers, events) has no caller and is not checked.

use std::cell::RefCell;

use redis_module::{Context, RedisString};

use super::{outside_command, unlock_channel, Unlocked};
use crate::error::LockError;
use crate::raw::{self, KeyUse};

thread_local! {
    /// Set while a waiter's grant is considered: `Some(name)`, check as that user;
    /// `Some(None)`, the waiter had no user (an internal client): check nothing.
    static ACTING: RefCell<Option<Option<Vec<u8>>>> = const { RefCell::new(None) };
}

/// Restores the previous acting user on drop (a panic included).
struct Restore(Option<Option<Vec<u8>>>);

impl Drop for Restore {
    fn drop(&mut self) {
        let previous = self.0.take();
        ACTING.with(|a| *a.borrow_mut() = previous);
    }
}

/// Runs `f` (a waiter's grant being considered) with every check of this module made as the
/// ACL user named `user` (the waiter's, captured when it blocked), not as the client whose
/// command or timer hands the lock on. A user that no longer exists may use nothing.
pub fn acting_as<R>(user: Option<&[u8]>, f: impl FnOnce() -> R) -> R {
    let previous = ACTING.with(|a| a.borrow_mut().replace(user.map(<[u8]>::to_vec)));
    let _restore = Restore(previous);
    f()
}

/// Who the checks run as now.
enum Checked {
    /// Nobody: the module's own work, or a waiter without a user.
    Nobody,
    User(raw::User),
    /// A waiter whose user was deleted: refused, with nobody to log against.
    Gone,
}

fn checked(ctx: &Context) -> Checked {
    checked_with(ctx, || raw::User::current_name(ctx))
}

/// [`checked`], the calling client's user name given by `caller` (asked only when it is the
/// one the checks run as).
fn checked_with(ctx: &Context, caller: impl FnOnce() -> Option<Vec<u8>>) -> Checked {
    let acting = ACTING.with(|a| a.borrow().clone());
    match acting {
        Some(Some(name)) => raw::User::named(ctx, &name).map_or(Checked::Gone, Checked::User),
        Some(None) => Checked::Nobody,
        None if outside_command() => Checked::Nobody,
        None => caller()
            .and_then(|name| raw::User::named(ctx, &name))
            .map_or(Checked::Nobody, Checked::User),
    }
}

/// Refuses with `denied` (and an `ACL LOG` entry) when the calling client's ACL user (or the
/// acting waiter's, see [`acting_as`]) may not use `key` so.
///
/// # Errors
/// `denied`.
pub fn check_key(
    ctx: &Context,
    key: &RedisString,
    how: KeyUse,
    denied: LockError,
) -> Result<(), LockError> {
    KeyChecker::new(ctx).check(ctx, key, how, denied)
}

/// [`check_key`] for many keys: the ACL user is looked up once.
pub struct KeyChecker(Checked);

impl KeyChecker {
    /// Checks as the calling client's ACL user, or the acting waiter's.
    pub fn new(ctx: &Context) -> Self {
        Self(checked(ctx))
    }

    /// [`Self::new`] for a command that looked its caller's user name up already (`name`, as
    /// [`raw::User::current_name`] gives it): the name is not looked up again.
    pub fn for_caller_named(ctx: &Context, name: Option<&[u8]>) -> Self {
        Self(checked_with(ctx, || name.map(<[u8]>::to_vec)))
    }

    /// Whether the caller may use `key` so, without refusing or logging anything (a look the
    /// module takes on its own account: a key it may not read is left out of it).
    pub fn may(&self, key: &RedisString, how: KeyUse) -> bool {
        match &self.0 {
            Checked::User(user) => user.may_use_key(key, how),
            Checked::Gone => false,
            Checked::Nobody => true,
        }
    }

    /// As [`check_key`].
    ///
    /// # Errors
    /// `denied`.
    pub fn check(
        &self,
        ctx: &Context,
        key: &RedisString,
        how: KeyUse,
        denied: LockError,
    ) -> Result<(), LockError> {
        match &self.0 {
            Checked::User(user) if !user.may_use_key(key, how) => {
                user.log_denied(ctx, key, false);
                Err(denied)
            }
            Checked::Gone => Err(denied),
            Checked::User(_) | Checked::Nobody => Ok(()),
        }
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
    let Some(unlocked) = freeing else { return Ok(()) };
    let user = match checked(ctx) {
        Checked::User(user) => user,
        Checked::Nobody => return Ok(()),
        Checked::Gone => return Err(LockError::NoPermChannel),
    };
    let channel = unlock_channel(ctx, name, unlocked);
    if user.may_publish(&channel) {
        Ok(())
    } else {
        user.log_denied(ctx, &channel, true);
        Err(LockError::NoPermChannel)
    }
}
