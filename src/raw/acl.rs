//! ACL users (the calling client's, or one named: a waiter's): key and channel permissions,
//! `ACL LOG` entries.

use std::ffi::c_int;
use std::ptr::NonNull;

use redis_module::{raw, Context, RedisString};

/// An ACL user: the calling client's ([`User::current`]) or one named ([`User::named`]).
pub struct User {
    user: NonNull<raw::RedisModuleUser>,
}

/// What a key is used for, as ACL key permissions see it.
#[derive(Debug, Clone, Copy)]
pub enum KeyUse {
    /// Read only (`%R~`).
    Read,
    /// Read and written (`~`, or `%RW~`).
    ReadWrite,
}

impl User {
    /// The user of the client whose command runs in `ctx`: `None` when there is none (timers,
    /// events, and the internal clients of other modules' `RM_Call`, which act as the
    /// superuser). Inside a script, the script's caller.
    pub fn current(ctx: &Context) -> Option<Self> {
        Self::named(ctx, &Self::current_name(ctx)?)
    }

    /// The name of [`Self::current`]'s user (kept by a waiter, to check its grant as it).
    pub fn current_name(ctx: &Context) -> Option<Vec<u8>> {
        let (get_flags, get_name, by_id, client_id, ptr_len, free) = (
            api!(RedisModule_GetContextFlags),
            api!(RedisModule_GetCurrentUserName),
            api!(RedisModule_GetClientUserNameById),
            api!(RedisModule_GetClientId),
            api!(RedisModule_StringPtrLen),
            api!(RedisModule_FreeString),
        );
        // SAFETY: live context. `GetCurrentUserName` dereferences the context client's user,
        // which internal clients leave NULL: it is used only inside a script, whose client
        // always carries the caller's user. Elsewhere the lookup by client id returns NULL for
        // a client without a user, or one Redis does not list (internal clients). The name is
        // a new string we own: its bytes are copied out, then it is freed once.
        unsafe {
            let in_script = get_flags(ctx.get_raw()) as u32 & raw::REDISMODULE_CTX_FLAGS_LUA != 0;
            let name = if in_script {
                get_name(ctx.get_raw())
            } else {
                by_id(ctx.get_raw(), client_id(ctx.get_raw()))
            };
            if name.is_null() {
                return None;
            }
            let mut len: usize = 0;
            let data = ptr_len(name, &mut len);
            let bytes = std::slice::from_raw_parts(data.cast::<u8>(), len).to_vec();
            free(ctx.get_raw(), name);
            Some(bytes)
        }
    }

    /// The ACL user called `name`: `None` when there is no such user (any more).
    pub fn named(ctx: &Context, name: &[u8]) -> Option<Self> {
        let from_name = api!(RedisModule_GetModuleUserFromUserName);
        let name = RedisString::create_from_slice(ctx.get_raw(), name);
        // SAFETY: a live string, which the lookup only reads (and does not keep); the user
        // handle is ours until `FreeModuleUser` in Drop.
        let user = unsafe { from_name(name.inner) };
        NonNull::new(user).map(|user| Self { user })
    }

    /// Whether the user may use `key` so (its key patterns).
    pub fn may_use_key(&self, key: &RedisString, how: KeyUse) -> bool {
        let check = api!(RedisModule_ACLCheckKeyPermissions);
        let flags = match how {
            KeyUse::Read => raw::REDISMODULE_CMD_KEY_ACCESS,
            KeyUse::ReadWrite => {
                raw::REDISMODULE_CMD_KEY_ACCESS
                    | raw::REDISMODULE_CMD_KEY_UPDATE
                    | raw::REDISMODULE_CMD_KEY_INSERT
            }
        };
        // SAFETY: a live user handle and key string; the check only reads them.
        unsafe {
            check(self.user.as_ptr(), key.inner, flags as c_int) == raw::REDISMODULE_OK as c_int
        }
    }

    /// Whether the user may publish on `channel` (a literal channel, not a pattern).
    pub fn may_publish(&self, channel: &RedisString) -> bool {
        let check = api!(RedisModule_ACLCheckChannelPermissions);
        // SAFETY: a live user handle and channel string; 0 = a literal channel (no pattern flag)
        // in every server's reading of this argument.
        unsafe { check(self.user.as_ptr(), channel.inner, 0) == raw::REDISMODULE_OK as c_int }
    }

    /// Records a refused key or channel in `ACL LOG`, as Redis does for its own commands.
    pub fn log_denied(&self, ctx: &Context, object: &RedisString, channel: bool) {
        let log = api!(RedisModule_ACLAddLogEntry);
        let reason = if channel {
            raw::RedisModuleACLLogEntryReason_REDISMODULE_ACL_LOG_CHANNEL
        } else {
            raw::RedisModuleACLLogEntryReason_REDISMODULE_ACL_LOG_KEY
        };
        // SAFETY: a command context, a live user handle and object string; Redis copies them.
        unsafe { log(ctx.get_raw(), self.user.as_ptr(), object.inner, reason) };
    }
}

impl Drop for User {
    fn drop(&mut self) {
        let free = api!(RedisModule_FreeModuleUser);
        // SAFETY: the handle came from GetModuleUserFromUserName and is freed once, here.
        unsafe { free(self.user.as_ptr()) };
    }
}
