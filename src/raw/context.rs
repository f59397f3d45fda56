//! The clock, the context's flags and selected database, strings, keyspace notifications,
//! publishing, key slots.

use std::cell::Cell;
use std::ffi::{c_int, CStr};
use std::mem::ManuallyDrop;

use redis_module::{raw, Context, RedisString};

/// The current Unix time in milliseconds, from the same clock Redis uses for expiries.
pub fn now_ms() -> i64 {
    let now = api!(RedisModule_Milliseconds);
    // SAFETY: takes no arguments and only reads the clock.
    unsafe { now() }
}

/// The context's flags (`REDISMODULE_CTX_FLAGS_*`).
pub(crate) fn flags(ctx: &Context) -> u32 {
    let flags = api!(RedisModule_GetContextFlags);
    super::dispatch::remembered_flags(ctx.get_raw(), || {
        // SAFETY: live context; only reads flags.
        unsafe { flags(ctx.get_raw()) as u32 }
    })
}

/// Whether this server runs in cluster mode.
pub fn in_cluster(ctx: &Context) -> bool {
    flags(ctx) & raw::REDISMODULE_CTX_FLAGS_CLUSTER != 0
}

/// Whether this server is a master (and so may write).
pub fn is_master(ctx: &Context) -> bool {
    flags(ctx) & raw::REDISMODULE_CTX_FLAGS_MASTER != 0
}

/// The id of the connection whose command runs in `ctx` (inside `MULTI`/`EXEC` too), if it is
/// one: `None` inside a script (`EVAL`, `FCALL`: the context's client is the script engine's
/// own, which never disconnects) or another module's call (a temporary client), which Redis
/// does not list among its clients.
pub fn connection_id(ctx: &Context) -> Option<u64> {
    if flags(ctx) & raw::REDISMODULE_CTX_FLAGS_LUA != 0 {
        return None;
    }
    let (client_id, info_by_id) =
        (api!(RedisModule_GetClientId), api!(RedisModule_GetClientInfoById));
    // SAFETY: live context. `GetClientInfoById` fills the version-1 structure we pass (its
    // version field set, as the API requires) and only for a client Redis lists.
    unsafe {
        let id = client_id(ctx.get_raw());
        if id == 0 {
            return None;
        }
        let mut info: raw::RedisModuleClientInfo = std::mem::zeroed();
        info.version = 1;
        let found = info_by_id(std::ptr::addr_of_mut!(info).cast(), id);
        (found == raw::REDISMODULE_OK as c_int).then_some(id)
    }
}

/// The database the context's client has selected.
pub fn selected_db(ctx: &Context) -> i32 {
    let get = api!(RedisModule_GetSelectedDb);
    // SAFETY: live context; only reads the client's db id.
    unsafe { get(ctx.get_raw()) }
}

/// Selects `db` for the context (timer and event contexts have their own client).
pub fn select_db(ctx: &Context, db: i32) -> bool {
    let select = api!(RedisModule_SelectDb);
    // SAFETY: live context; Redis validates the id.
    unsafe { select(ctx.get_raw(), db) == raw::REDISMODULE_OK as c_int }
}

/// A hold count as a Redis string, for a hash value and its replicated command: 1 (every fresh
/// hold) is one string made once and shared, read by the server and never changed (a hash
/// set copies its value); other counts are made as [`int_string`].
pub fn count_string(ctx: &Context, n: i64) -> CountString {
    if n != 1 {
        return CountString::Made(int_string(ctx, n));
    }
    let mut one = ONE.get();
    if one.is_null() {
        let create = api!(RedisModule_CreateString);
        // SAFETY: no context: a string of its own (not freed with any context), with one
        // reference, which the module keeps for as long as it is loaded.
        one = unsafe { create(std::ptr::null_mut(), c"1".as_ptr(), 1) };
        ONE.set(one);
    }
    CountString::Shared(ManuallyDrop::new(RedisString::from_redis_module_string(
        ctx.get_raw(),
        one,
    )))
}

thread_local! {
    // Redis calls the module on its main thread only.
    static ONE: Cell<*mut raw::RedisModuleString> = const { Cell::new(std::ptr::null_mut()) };
}

/// What [`count_string`] gives: the shared 1, never freed, or a count made for this use.
pub enum CountString {
    Shared(ManuallyDrop<RedisString>),
    Made(RedisString),
}

impl std::ops::Deref for CountString {
    type Target = RedisString;

    fn deref(&self) -> &RedisString {
        match self {
            Self::Shared(one) => one,
            Self::Made(count) => count,
        }
    }
}

/// An integer as a Redis string (for replicated arguments and hash values).
pub fn int_string(ctx: &Context, n: i64) -> RedisString {
    let create = api!(RedisModule_CreateStringFromLongLong);
    // SAFETY: live context (the module does not use automatic memory, so the string is not
    // freed with the context); returns a new string with one reference, which the RedisString
    // takes over (not retaining it again) and gives back when dropped.
    unsafe { RedisString::from_redis_module_string(ctx.get_raw(), create(ctx.get_raw(), n)) }
}

/// The hash slot of `key` as the server computes it (`RedisModule_ClusterKeySlot`, 7.4+ and
/// Valkey 8+); `None` on servers without the API.
pub fn key_slot(ctx: &Context, key: &[u8]) -> Option<u16> {
    let slot_of = optional_api!(RedisModule_ClusterKeySlot)?;
    let name = RedisString::create_from_slice(ctx.get_raw(), key);
    // SAFETY: a valid string owned by `name` for the duration of the call.
    let slot = unsafe { slot_of(name.inner) };
    u16::try_from(slot).ok()
}

/// Marks `name` as modified (aborts `WATCH`es on it, invalidates client-side caching).
pub fn signal_modified(ctx: &Context, name: &RedisString) {
    let signal = api!(RedisModule_SignalModifiedKey);
    // SAFETY: live context and key name; Redis copies what it keeps.
    unsafe { signal(ctx.get_raw(), name.inner) };
}

/// The class of a keyspace notification (`notify-keyspace-events` letters `g`, `$`, `h`, `z`).
#[derive(Debug, Clone, Copy)]
pub enum Notify {
    Generic,
    String,
    Hash,
    Zset,
}

/// Raises the keyspace notification `event` on `name`, as Redis's own command would.
pub fn notify(ctx: &Context, class: Notify, event: &CStr, name: &RedisString) {
    let notify = api!(RedisModule_NotifyKeyspaceEvent);
    let class = match class {
        Notify::Generic => raw::REDISMODULE_NOTIFY_GENERIC,
        Notify::String => raw::REDISMODULE_NOTIFY_STRING,
        Notify::Hash => raw::REDISMODULE_NOTIFY_HASH,
        Notify::Zset => raw::REDISMODULE_NOTIFY_ZSET,
    };
    // SAFETY: live context, a NUL-terminated event name and a live key name; Redis copies what
    // it keeps.
    unsafe { notify(ctx.get_raw(), class, event.as_ptr(), name.inner) };
}

/// Publishes `message` on `channel` to this server's subscribers (cluster-wide in cluster
/// mode). Not propagated to replicas: replicate a `PUBLISH` for that.
pub fn publish(ctx: &Context, channel: &RedisString, message: &RedisString) {
    let publish = api!(RedisModule_PublishMessage);
    // SAFETY: live context and strings; PublishMessage does not keep them.
    unsafe { publish(ctx.get_raw(), channel.inner, message.inner) };
}

/// Publishes to the shard's subscribers (`SPUBLISH`); in cluster mode Redis forwards it to the
/// shard's replicas over the cluster bus.
pub fn publish_shard(ctx: &Context, channel: &RedisString, message: &RedisString) {
    let publish = api!(RedisModule_PublishMessageShard);
    // SAFETY: live context and strings; PublishMessageShard does not keep them.
    unsafe { publish(ctx.get_raw(), channel.inner, message.inner) };
}
