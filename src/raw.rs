//! Every raw `RedisModule_*` call the module makes, each wrapped in a small safe function with a
//! `// SAFETY:` note. The rest of the crate is safe Rust.
//!
//! Why raw calls at all: the redis-module crate's hash helpers take `&str` fields (an owner with a
//! NUL byte crashed the server, non-UTF-8 owners were refused), it has no `GetExpire`, no
//! `PublishMessage`, and no `SetCommandInfo` (key specs, arity) on the 6.2 compatibility level
//! that loads on Redis 7.0.

use std::ffi::{c_int, c_void, CStr};
use std::ptr::{self, NonNull};

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};

use redis_module::{raw, Context, RedisString};

use crate::waiting::{self, Outcome};

/// An API function pointer, filled in by `RedisModule_Init` before any command can run.
macro_rules! api {
    ($name:ident) => {
        // SAFETY: Redis writes these pointers once, in RedisModule_Init (OnLoad), before any of
        // our code runs; afterwards they are only read, always on Redis's main thread.
        match unsafe { raw::$name } {
            Some(f) => f,
            None => missing_api(stringify!($name)),
        }
    };
}

#[cold]
fn missing_api(name: &'static str) -> ! {
    // Caught by the handler guard in `commands`: the client gets an error, the server lives.
    panic!("this server does not provide {name}")
}

/// The APIs the commands rely on; `commands::check_server` refuses to load without them.
pub fn missing_apis() -> Vec<&'static str> {
    macro_rules! check {
        ($($name:ident),*) => {{
            let mut missing = Vec::new();
            $(
                // SAFETY: as in `api!`: read-only access to a pointer set by RedisModule_Init.
                if unsafe { raw::$name }.is_none() {
                    missing.push(stringify!($name));
                }
            )*
            missing
        }};
    }
    check!(
        RedisModule_OpenKey,
        RedisModule_CloseKey,
        RedisModule_KeyType,
        RedisModule_ValueLength,
        RedisModule_HashGet,
        RedisModule_HashSet,
        RedisModule_StringDMA,
        RedisModule_StringSet,
        RedisModule_DeleteKey,
        RedisModule_GetExpire,
        RedisModule_SetExpire,
        RedisModule_Milliseconds,
        RedisModule_Replicate,
        RedisModule_PublishMessage,
        RedisModule_PublishMessageShard,
        RedisModule_FreeString,
        RedisModule_StringPtrLen,
        RedisModule_GetContextFlags,
        RedisModule_GetSelectedDb,
        RedisModule_SelectDb,
        RedisModule_BlockClient,
        RedisModule_UnblockClient,
        RedisModule_SetDisconnectCallback,
        RedisModule_GetBlockedClientHandle,
        RedisModule_GetBlockedClientPrivateData,
        RedisModule_ReplicateVerbatim,
        RedisModule_CreateStringFromLongLong,
        RedisModule_SubscribeToServerEvent,
        RedisModule_AvoidReplicaTraffic,
        RedisModule_SetModuleOptions,
        RedisModule_SignalModifiedKey,
        RedisModule_NotifyKeyspaceEvent,
        RedisModule_GetCurrentUserName,
        RedisModule_GetClientUserNameById,
        RedisModule_GetClientId,
        RedisModule_GetModuleUserFromUserName,
        RedisModule_FreeModuleUser,
        RedisModule_ACLCheckKeyPermissions,
        RedisModule_ACLCheckChannelPermissions,
        RedisModule_ACLAddLogEntry
    )
}

/// The current Unix time in milliseconds, from the same clock Redis uses for expiries.
pub fn now_ms() -> i64 {
    let now = api!(RedisModule_Milliseconds);
    // SAFETY: takes no arguments and only reads the clock.
    unsafe { now() }
}

/// What a key holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyKind {
    Empty,
    Hash,
    String,
    Other,
}

/// An open key, closed on drop.
pub struct LockKey {
    ctx: *mut raw::RedisModuleCtx,
    /// NULL when a key opened read-only does not exist.
    key: *mut raw::RedisModuleKey,
}

impl LockKey {
    /// Opens `name` for reading, or for reading and writing.
    pub fn open(ctx: &Context, name: &RedisString, writable: bool) -> Self {
        let mode = if writable {
            raw::REDISMODULE_READ | raw::REDISMODULE_WRITE
        } else {
            raw::REDISMODULE_READ
        };
        let open = api!(RedisModule_OpenKey);
        // SAFETY: `ctx` is the context of the command being executed and `name` a live string
        // owned by the caller; both outlive the returned key, which is closed in Drop.
        let key = unsafe { open(ctx.get_raw(), name.inner, mode as c_int) };
        Self { ctx: ctx.get_raw(), key }
    }

    /// What the key holds. Expired keys read as empty (Redis expires them on open).
    pub fn kind(&self) -> KeyKind {
        if self.key.is_null() {
            return KeyKind::Empty;
        }
        let key_type = api!(RedisModule_KeyType);
        // SAFETY: `self.key` is a non-null key opened by `open` and not yet closed.
        match unsafe { key_type(self.key) } as isize {
            raw::REDISMODULE_KEYTYPE_EMPTY => KeyKind::Empty,
            raw::REDISMODULE_KEYTYPE_HASH => KeyKind::Hash,
            raw::REDISMODULE_KEYTYPE_STRING => KeyKind::String,
            _ => KeyKind::Other,
        }
    }

    /// The number of fields of a hash (0 for an empty key).
    pub fn field_count(&self) -> usize {
        if self.key.is_null() {
            return 0;
        }
        let value_length = api!(RedisModule_ValueLength);
        // SAFETY: `self.key` is a non-null open key.
        unsafe { value_length(self.key) }
    }

    /// A hash field's value, binary-safe. `None` when the field (or the key) does not exist.
    /// Call only when `kind()` is `Hash` or `Empty`.
    pub fn hash_get(&self, field: &RedisString) -> Option<OwnedString> {
        if self.key.is_null() {
            return None;
        }
        let hash_get = api!(RedisModule_HashGet);
        let mut value: *mut raw::RedisModuleString = ptr::null_mut();
        // SAFETY: the key is open and is a hash or empty (the caller checked its kind). The
        // variadic arguments are one (field, out-pointer) pair ended by NULL, as HashGet expects
        // with REDISMODULE_HASH_NONE; `field` is a live string and `value` a local out-pointer
        // that receives a new string (ours to free) or NULL.
        unsafe {
            hash_get(
                self.key,
                raw::REDISMODULE_HASH_NONE as c_int,
                field.inner,
                &mut value as *mut *mut raw::RedisModuleString,
                ptr::null_mut::<c_void>(),
            );
        }
        NonNull::new(value).map(|ptr| OwnedString { ctx: self.ctx, ptr })
    }

    /// Sets a hash field, creating the hash when the key is empty. The key must be writable.
    pub fn hash_set(&self, field: &RedisString, value: &RedisString) {
        if self.key.is_null() {
            return;
        }
        let hash_set = api!(RedisModule_HashSet);
        // SAFETY: the key is open for writing and is a hash or empty; the variadic arguments are
        // one (field, value) pair of live strings ended by NULL. HashSet copies what it keeps.
        unsafe {
            hash_set(
                self.key,
                raw::REDISMODULE_HASH_NONE as c_int,
                field.inner,
                value.inner,
                ptr::null_mut::<c_void>(),
            );
        }
    }

    /// A string key's value (a copy). Call only when `kind()` is `String`.
    pub fn string_value(&self) -> Vec<u8> {
        if self.key.is_null() {
            return Vec::new();
        }
        let dma = api!(RedisModule_StringDMA);
        let mut len: usize = 0;
        // SAFETY: the key is open and holds a string (the caller checked its kind); READ access
        // returns a pointer to `len` bytes that stay valid until the key is modified or closed,
        // and they are copied out before either.
        unsafe {
            let data = dma(self.key, &mut len, raw::REDISMODULE_READ as c_int);
            if data.is_null() {
                return Vec::new();
            }
            std::slice::from_raw_parts(data.cast::<u8>(), len).to_vec()
        }
    }

    /// Sets a string value (replacing what the key held). The key must be writable.
    pub fn string_set(&self, value: &RedisString) {
        if self.key.is_null() {
            return;
        }
        let set = api!(RedisModule_StringSet);
        // SAFETY: the key is open for writing; StringSet copies the live string it is given.
        unsafe { set(self.key, value.inner) };
    }

    /// Deletes the key. The key must be writable.
    pub fn delete(&self) {
        if self.key.is_null() {
            return;
        }
        let delete = api!(RedisModule_DeleteKey);
        // SAFETY: `self.key` is a non-null key opened for writing.
        unsafe { delete(self.key) };
    }

    /// The remaining lease in ms; -1 when the key has no expiry (or does not exist).
    pub fn pttl(&self) -> i64 {
        if self.key.is_null() {
            return -1;
        }
        let get_expire = api!(RedisModule_GetExpire);
        // SAFETY: `self.key` is a non-null open key.
        unsafe { get_expire(self.key) }
    }

    /// Sets the key to expire at `deadline_ms` (Unix ms), exactly: the value replicated as
    /// `PEXPIREAT` must be the one stored here. A deadline already past expires the key at once.
    ///
    /// `RedisModule_SetAbsExpire` (6.2.2+) stores it as given. Without it, `SetExpire` takes a
    /// relative time and adds its own reading of the clock, so the clock is read around the
    /// call: when it did not move, the stored deadline is exact.
    pub fn set_expire_at(&self, deadline_ms: i64) {
        if self.key.is_null() {
            return;
        }
        // SAFETY: read-only access to a pointer set by RedisModule_Init.
        if let Some(set_abs) = unsafe { raw::RedisModule_SetAbsExpire } {
            // SAFETY: `self.key` is a non-null key opened for writing that holds a value; the
            // deadline is a non-negative Unix time (never REDISMODULE_NO_EXPIRE).
            unsafe { set_abs(self.key, deadline_ms.max(0)) };
            return;
        }
        let set_expire = api!(RedisModule_SetExpire);
        for _ in 0..4 {
            let before = now_ms();
            // Never -1 (REDISMODULE_NO_EXPIRE would remove the expiry).
            let relative = deadline_ms.saturating_sub(before).max(0);
            // SAFETY: `self.key` is a non-null key opened for writing that holds a value.
            unsafe { set_expire(self.key, relative) };
            if now_ms() == before {
                return;
            }
        }
    }
}

impl Drop for LockKey {
    fn drop(&mut self) {
        if self.key.is_null() {
            return;
        }
        let close = api!(RedisModule_CloseKey);
        // SAFETY: `self.key` was opened by `open` and is closed exactly once, here.
        unsafe { close(self.key) };
    }
}

/// A string returned by Redis that we own (from `HashGet`); freed on drop.
pub struct OwnedString {
    ctx: *mut raw::RedisModuleCtx,
    ptr: NonNull<raw::RedisModuleString>,
}

impl OwnedString {
    /// The string's bytes.
    pub fn as_bytes(&self) -> &[u8] {
        let ptr_len = api!(RedisModule_StringPtrLen);
        let mut len: usize = 0;
        // SAFETY: `self.ptr` is a live string we own; the returned buffer lives as long as it,
        // which the borrow of `self` enforces.
        unsafe {
            let data = ptr_len(self.ptr.as_ptr(), &mut len);
            std::slice::from_raw_parts(data.cast::<u8>(), len)
        }
    }
}

impl Drop for OwnedString {
    fn drop(&mut self) {
        let free = api!(RedisModule_FreeString);
        // SAFETY: HashGet gave us one reference to this string (automatic memory is not enabled
        // on our contexts), released exactly once, here, with the context it was made with.
        unsafe { free(self.ctx, self.ptr.as_ptr()) };
    }
}

/// Propagates `command args...` to replicas and the AOF (not executed locally). Binary-safe.
pub fn replicate(ctx: &Context, command: &CStr, args: &[&RedisString]) {
    let replicate = api!(RedisModule_Replicate);
    let mut argv: Vec<*mut raw::RedisModuleString> = args.iter().map(|a| a.inner).collect();
    // SAFETY: the "v" format takes an array of RedisModuleString pointers and its length; the
    // strings are live for the call and Redis retains what it keeps. `command` is NUL-terminated.
    unsafe {
        replicate(ctx.get_raw(), command.as_ptr(), c"v".as_ptr(), argv.as_mut_ptr(), argv.len());
    }
}

/// An integer as a Redis string (for replicated arguments and hash values).
pub fn int_string(ctx: &Context, n: i64) -> RedisString {
    let create = api!(RedisModule_CreateStringFromLongLong);
    let free = api!(RedisModule_FreeString);
    // SAFETY: live context; returns a new string with one reference, which `RedisString::new`
    // retains once more and the explicit free below gives back, leaving the RedisString the
    // only owner.
    unsafe {
        let s = create(ctx.get_raw(), n);
        let owned = RedisString::new(NonNull::new(ctx.get_raw()), s);
        free(ctx.get_raw(), s);
        owned
    }
}

/// Whether Redis may propagate writes anywhere: the module's conservative mirror of Redis's
/// own `shouldPropagate` (AOF on, or a master with a replication backlog or replicas).
///
/// The AOF and role come live from the context flags. Backlog and replicas are not visible to
/// modules, so a sticky flag stands for them: set at load if the server has either, and by every
/// fork (a full sync forks before it streams anything to a replica), replica change and role
/// change. It never goes back to false while the module is loaded.
pub fn propagation_possible(ctx: &Context) -> bool {
    let flags = api!(RedisModule_GetContextFlags);
    // SAFETY: live context; only reads flags.
    let flags = unsafe { flags(ctx.get_raw()) } as u32;
    flags & raw::REDISMODULE_CTX_FLAGS_AOF != 0
        || flags & raw::REDISMODULE_CTX_FLAGS_MASTER == 0
        || REPLICATION_SEEN.load(Ordering::Relaxed)
}

/// See [`propagation_possible`]; true until `watch_replication` has looked.
static REPLICATION_SEEN: AtomicBool = AtomicBool::new(true);

/// Marks that this server may now have a replication backlog or replicas.
pub fn note_replication() {
    REPLICATION_SEEN.store(true, Ordering::Relaxed);
}

/// At load: subscribes to the events that can start replication, and reads whether it has
/// already started.
pub fn watch_replication(ctx: &Context) -> Result<(), String> {
    let subscribe = api!(RedisModule_SubscribeToServerEvent);
    for id in [raw::REDISMODULE_EVENT_FORK_CHILD, raw::REDISMODULE_EVENT_REPLICA_CHANGE] {
        // SAFETY: live load-time context; `replication_event` has the callback signature Redis
        // expects and ignores the event data.
        let status = unsafe {
            subscribe(
                ctx.get_raw(),
                raw::RedisModuleEvent { id, dataver: 1 },
                Some(replication_event),
            )
        };
        if status != raw::REDISMODULE_OK as c_int {
            return Err(format!("cannot subscribe to server event {id}"));
        }
    }
    let started = replication_started(ctx).unwrap_or(true);
    REPLICATION_SEEN.store(started, Ordering::Relaxed);
    Ok(())
}

/// One section of the server's `INFO`, read once and freed on drop.
struct ServerInfo<'a> {
    ctx: &'a Context,
    data: NonNull<raw::RedisModuleServerInfoData>,
}

impl<'a> ServerInfo<'a> {
    /// `section` of `INFO`; `None` if the server cannot give it.
    fn read(ctx: &'a Context, section: &CStr) -> Option<Self> {
        // SAFETY: read-only access to a pointer set by RedisModule_Init.
        let get = unsafe { raw::RedisModule_GetServerInfo }?;
        // SAFETY: live context and a NUL-terminated section name; the data is freed once, in
        // Drop, with the same context.
        let data = unsafe { get(ctx.get_raw(), section.as_ptr()) };
        Some(Self { ctx, data: NonNull::new(data)? })
    }

    /// An integer field; `None` if missing or not an integer.
    fn signed(&self, field: &CStr) -> Option<i64> {
        // SAFETY: read-only access to a pointer set by RedisModule_Init.
        let get = unsafe { raw::RedisModule_ServerInfoGetFieldSigned }?;
        let mut err: c_int = 0;
        // SAFETY: the info data is alive (owned by self); the name is NUL-terminated.
        let value = unsafe { get(self.data.as_ptr(), field.as_ptr(), &mut err) };
        (err == 0).then_some(value)
    }

    /// A field's text, copied; `None` if missing.
    fn text(&self, field: &CStr) -> Option<Vec<u8>> {
        // SAFETY: read-only access to a pointer set by RedisModule_Init.
        let get = unsafe { raw::RedisModule_ServerInfoGetFieldC }?;
        // SAFETY: the info data is alive (owned by self); the name is NUL-terminated; the
        // returned C string lives as long as the data and is copied before it is freed.
        unsafe {
            let value = get(self.data.as_ptr(), field.as_ptr());
            (!value.is_null()).then(|| CStr::from_ptr(value).to_bytes().to_vec())
        }
    }
}

impl Drop for ServerInfo<'_> {
    fn drop(&mut self) {
        // SAFETY: read-only access to a pointer set by RedisModule_Init.
        if let Some(free) = unsafe { raw::RedisModule_FreeServerInfo } {
            // SAFETY: data from GetServerInfo with this context, freed exactly once.
            unsafe { free(self.ctx.get_raw(), self.data.as_ptr()) };
        }
    }
}

/// Whether `INFO replication` shows a backlog, replicas or a fork child; `None` if unreadable.
fn replication_started(ctx: &Context) -> Option<bool> {
    let info = ServerInfo::read(ctx, c"replication")?;
    let backlog = info.signed(c"repl_backlog_active")?;
    let replicas = info.signed(c"connected_slaves")?;
    Some(backlog != 0 || replicas != 0)
}

/// The `slave<i>` lines of `INFO replication` (`ip=...,port=...,state=online,offset=...,lag=0`),
/// one per attached replica, whatever its state; `None` if the section cannot be read.
pub fn replica_lines(ctx: &Context) -> Option<Vec<Vec<u8>>> {
    let info = ServerInfo::read(ctx, c"replication")?;
    let count = info.signed(c"connected_slaves")?;
    let lines = (0..count.max(0))
        .filter_map(|i| info.text(&std::ffi::CString::new(format!("slave{i}")).ok()?))
        .collect();
    Some(lines)
}

/// What this server is, and which optional APIs it provides (read at load).
pub fn server_info(ctx: &Context) -> crate::server::Server {
    let info = ServerInfo::read(ctx, c"server");
    let text = |field: &CStr| {
        let value = info.as_ref()?.text(field)?;
        Some(String::from_utf8_lossy(&value).into_owned())
    };
    let (flavor, version) = match text(c"valkey_version") {
        Some(v) => (crate::server::Flavor::Valkey, Some(v)),
        None => (crate::server::Flavor::Redis, text(c"redis_version")),
    };
    // SAFETY: read-only access to pointers set by RedisModule_Init.
    let (abs_expire, key_slot_api) =
        unsafe { (raw::RedisModule_SetAbsExpire, raw::RedisModule_ClusterKeySlot) };
    crate::server::Server {
        flavor,
        version: version.as_deref().and_then(crate::server::Version::parse),
        abs_expire: abs_expire.is_some(),
        key_slot_api: key_slot_api.is_some(),
    }
}

/// The hash slot of `key`, computed by the server when it offers `RedisModule_ClusterKeySlot`
/// (7.4+, Valkey 8+), else by the module's own CRC16 (`cluster::key_slot`, the same function).
pub fn key_slot(ctx: &Context, key: &[u8]) -> u16 {
    // SAFETY: read-only access to a pointer set by RedisModule_Init.
    match unsafe { raw::RedisModule_ClusterKeySlot } {
        Some(slot_of) => {
            let name = RedisString::create_from_slice(ctx.get_raw(), key);
            // SAFETY: a valid string owned by `name` for the duration of the call.
            let slot = unsafe { slot_of(name.inner) };
            u16::try_from(slot).unwrap_or_else(|_| crate::cluster::key_slot(key))
        }
        None => crate::cluster::key_slot(key),
    }
}

/// Subscribes to the server's atomic slot migration events, and (Valkey 9) opts in to atomic
/// slot migration, which Valkey refuses while any loaded module has not.
///
/// Valkey 9 (event 19): an export starting may start propagation to the target (as a replica
/// would), so writes are replicated as effects from then on; an export or import ending, or
/// an export aborting, has the waiters checked against the new slot owners at once.
/// Redis 8.4 (events 18 and 19, from its `redismodule.h`; not run here, no binary exists for
/// this platform): the same, on its migrate and trim subevents.
pub fn watch_slot_migrations(
    ctx: &Context,
    events: crate::server::SlotMigrationEvents,
) -> Result<(), String> {
    use crate::server::SlotMigrationEvents;
    let subscribe = api!(RedisModule_SubscribeToServerEvent);
    let ids: &[u64] = match events {
        SlotMigrationEvents::Valkey => &[VALKEY_EVENT_ATOMIC_SLOT_MIGRATION],
        SlotMigrationEvents::Redis => &[
            raw::REDISMODULE_EVENT_CLUSTER_SLOT_MIGRATION,
            raw::REDISMODULE_EVENT_CLUSTER_SLOT_MIGRATION_TRIM,
        ],
    };
    for &id in ids {
        // SAFETY: live load-time context; `slot_migration_event` has the callback signature
        // the server expects and reads only the event id and subevent, never the data.
        let status = unsafe {
            subscribe(
                ctx.get_raw(),
                raw::RedisModuleEvent { id, dataver: 1 },
                Some(slot_migration_event),
            )
        };
        if status != raw::REDISMODULE_OK as c_int {
            return Err(format!("cannot subscribe to slot migration event {id}"));
        }
    }
    if events == SlotMigrationEvents::Valkey {
        ASM_OPT_IN.store(true, Ordering::Relaxed);
    }
    Ok(())
}

/// Valkey 9's `VALKEYMODULE_EVENT_ATOMIC_SLOT_MIGRATION` (valkeymodule.h).
const VALKEY_EVENT_ATOMIC_SLOT_MIGRATION: u64 = 19;
/// Valkey 9's `VALKEYMODULE_OPTIONS_HANDLE_ATOMIC_SLOT_MIGRATION`.
const VALKEY_OPTIONS_HANDLE_ATOMIC_SLOT_MIGRATION: c_int = 1 << 5;
/// Whether to opt in to Valkey 9's atomic slot migration (`set_module_options`).
static ASM_OPT_IN: AtomicBool = AtomicBool::new(false);

extern "C" fn slot_migration_event(
    ctx: *mut raw::RedisModuleCtx,
    event: raw::RedisModuleEvent,
    subevent: u64,
    _data: *mut c_void,
) {
    let context = Context::new(ctx);
    let started = if ASM_OPT_IN.load(Ordering::Relaxed) {
        // EXPORT_STARTED
        subevent == 1
    } else {
        // MIGRATE_STARTED (event 18)
        event.id == raw::REDISMODULE_EVENT_CLUSTER_SLOT_MIGRATION && subevent == 3
    };
    if started {
        note_replication();
    } else {
        guard_callback(&context, || waiting::on_slots_moved(&context));
    }
}

extern "C" fn replication_event(
    _ctx: *mut raw::RedisModuleCtx,
    _event: raw::RedisModuleEvent,
    _subevent: u64,
    _data: *mut c_void,
) {
    note_replication();
}

/// Counts a write command whose effects go nowhere (see [`propagation_possible`]): bumps the
/// server's dirty counter, as replicating would, for RDB save points. Call only from a command
/// context and only when `propagation_possible` is false: Redis then propagates nothing.
pub fn count_unpropagated_write(ctx: &Context) {
    let verbatim = api!(RedisModule_ReplicateVerbatim);
    // SAFETY: a command context, whose client's argv is valid. With no AOF, no backlog and no
    // replicas, Redis's alsoPropagate returns before reading it and only `server.dirty` moves.
    unsafe { verbatim(ctx.get_raw()) };
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

/// Command metadata for `COMMAND INFO` / `COMMAND DOCS`, set at load time.
pub struct CommandDoc {
    pub name: &'static CStr,
    pub summary: &'static CStr,
    pub complexity: &'static CStr,
    /// Redis arity: N exactly, or -N for at least N (the command name counts).
    pub arity: i32,
    /// `REDISMODULE_CMD_KEY_*` flags of the one key, at position 1.
    pub key_flags: u64,
}

/// Key-spec flags (redismodule.h).
pub const KEY_RO: u64 = raw::REDISMODULE_CMD_KEY_RO as u64;
pub const KEY_RW: u64 = raw::REDISMODULE_CMD_KEY_RW as u64;
pub const KEY_ACCESS: u64 = raw::REDISMODULE_CMD_KEY_ACCESS as u64;
pub const KEY_UPDATE: u64 = raw::REDISMODULE_CMD_KEY_UPDATE as u64;
pub const KEY_DELETE: u64 = raw::REDISMODULE_CMD_KEY_DELETE as u64;

static COMMAND_INFO_VERSION: raw::RedisModuleCommandInfoVersion =
    raw::RedisModuleCommandInfoVersion {
        version: 1,
        sizeof_historyentry: size_of::<raw::RedisModuleCommandHistoryEntry>(),
        sizeof_keyspec: size_of::<raw::RedisModuleCommandKeySpec>(),
        sizeof_arg: size_of::<raw::RedisModuleCommandArg>(),
    };

/// Sets a registered command's arity, docs and key spec (one key at argument 1 with
/// `key_flags`). On Redis 7.0 this is what makes a read-only key permission (`%R~`) enough for
/// the read-only commands. A no-op on servers without `SetCommandInfo` (before 7.0).
///
/// # Errors
/// A message for the log when the command is unknown or Redis refuses the info.
pub fn set_command_info(ctx: &Context, doc: &CommandDoc) -> Result<(), String> {
    // SAFETY: read-only access to pointers set by RedisModule_Init.
    let (Some(get_command), Some(set_info)) =
        (unsafe { raw::RedisModule_GetCommand }, unsafe { raw::RedisModule_SetCommandInfo })
    else {
        return Ok(());
    };
    // SAFETY: live context at load time and a NUL-terminated name.
    let command = unsafe { get_command(ctx.get_raw(), doc.name.as_ptr()) };
    if command.is_null() {
        return Err(format!("{:?} is not registered", doc.name));
    }
    // Two key specs: ours, then the all-zero terminator Redis looks for.
    let spec = raw::RedisModuleCommandKeySpec {
        notes: ptr::null(),
        flags: doc.key_flags,
        begin_search_type: raw::RedisModuleKeySpecBeginSearchType_REDISMODULE_KSPEC_BS_INDEX,
        bs: raw::RedisModuleCommandKeySpec__bindgen_ty_1 {
            index: raw::RedisModuleCommandKeySpec__bindgen_ty_1__bindgen_ty_1 { pos: 1 },
        },
        find_keys_type: raw::RedisModuleKeySpecFindKeysType_REDISMODULE_KSPEC_FK_RANGE,
        fk: raw::RedisModuleCommandKeySpec__bindgen_ty_2 {
            range: raw::RedisModuleCommandKeySpec__bindgen_ty_2__bindgen_ty_1 {
                lastkey: 0,
                keystep: 1,
                limit: 0,
            },
        },
    };
    // SAFETY: an all-zero key spec is the terminator (null pointers, zero flags, INVALID/OMITTED
    // search types), a valid value of this plain C struct.
    let terminator: raw::RedisModuleCommandKeySpec = unsafe { std::mem::zeroed() };
    let mut specs = [spec, terminator];
    let info = raw::RedisModuleCommandInfo {
        version: &COMMAND_INFO_VERSION,
        summary: doc.summary.as_ptr(),
        complexity: doc.complexity.as_ptr(),
        since: c"0.1.0".as_ptr(),
        history: ptr::null_mut(),
        tips: ptr::null(),
        arity: doc.arity,
        key_specs: specs.as_mut_ptr(),
        args: ptr::null_mut(),
    };
    // SAFETY: `command` belongs to this module; `info` and everything it points to (static C
    // strings, the version struct, the terminated key-spec array on our stack) are valid for the
    // call, and SetCommandInfo copies what it keeps.
    let status = unsafe { set_info(command, &info) };
    if status == raw::REDISMODULE_OK as c_int {
        Ok(())
    } else {
        Err(format!("Redis refused the command info of {:?}", doc.name))
    }
}

/// A value in a map reply.
pub enum Field<'a> {
    Bytes(&'a [u8]),
    Int(i64),
}

/// Replies a map, fields in the given order (a flat field/value array under RESP2).
pub fn reply_map(ctx: &Context, fields: &[(&str, Field<'_>)]) {
    let ctx = ctx.get_raw();
    // The crate's reply helpers are safe functions over the live command context.
    raw::reply_with_map(ctx, fields.len() as std::ffi::c_long);
    for (name, value) in fields {
        raw::reply_with_string_buffer(ctx, name.as_ptr().cast(), name.len());
        match value {
            Field::Bytes(b) => raw::reply_with_string_buffer(ctx, b.as_ptr().cast(), b.len()),
            Field::Int(n) => raw::reply_with_long_long(ctx, *n),
        };
    }
}

/// Whether the command may block its client: not inside MULTI/EXEC, a Lua script, or another
/// context where Redis denies blocking.
pub fn may_block(ctx: &Context) -> bool {
    let flags = api!(RedisModule_GetContextFlags);
    // SAFETY: live context; only reads flags.
    let flags = unsafe { flags(ctx.get_raw()) } as u32;
    flags
        & (raw::REDISMODULE_CTX_FLAGS_MULTI
            | raw::REDISMODULE_CTX_FLAGS_LUA
            | raw::REDISMODULE_CTX_FLAGS_DENY_BLOCKING)
        == 0
}

/// Whether this server runs in cluster mode.
pub fn in_cluster(ctx: &Context) -> bool {
    let flags = api!(RedisModule_GetContextFlags);
    // SAFETY: live context; only reads flags.
    let flags = unsafe { flags(ctx.get_raw()) } as u32;
    flags & raw::REDISMODULE_CTX_FLAGS_CLUSTER != 0
}

/// Whether this server is a master (and so may write).
pub fn is_master(ctx: &Context) -> bool {
    let flags = api!(RedisModule_GetContextFlags);
    // SAFETY: live context; only reads flags.
    let flags = unsafe { flags(ctx.get_raw()) } as u32;
    flags & raw::REDISMODULE_CTX_FLAGS_MASTER != 0
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

/// A blocked client, as an integer so it can key maps. Valid from `block_client` until the one
/// `unblock_client` call for it.
pub type Blocked = usize;

/// Blocks the calling client until `unblock_client`. Redis's own timeout is off (0): the module
/// times waits out itself, so a timeout can never race a grant. The callbacks land in `waiting`.
pub fn block_client(ctx: &Context) -> Blocked {
    let block = api!(RedisModule_BlockClient);
    let on_disconnect = api!(RedisModule_SetDisconnectCallback);
    // SAFETY: live command context; the callbacks are `extern "C"` functions of this module
    // with the signatures Redis expects, and `free_outcome` frees exactly what
    // `unblock_client` allocates.
    let bc = unsafe {
        let bc = block(
            ctx.get_raw(),
            Some(reply_trampoline),
            Some(timeout_trampoline),
            Some(free_outcome),
            0,
        );
        on_disconnect(bc, Some(disconnect_trampoline));
        bc
    };
    bc as Blocked
}

/// Unblocks a client blocked by `block_client`, once; its reply callback then gets `outcome`.
pub fn unblock_client(bc: Blocked, outcome: Option<Outcome>) {
    let unblock = api!(RedisModule_UnblockClient);
    let data = outcome.map_or(ptr::null_mut(), |o| Box::into_raw(Box::new(o)).cast::<c_void>());
    // SAFETY: `bc` came from `block_client` and `waiting` unblocks each client exactly once
    // (it leaves the waiter table when it is unblocked). Ownership of `data` passes to Redis,
    // which hands it back to `free_outcome`.
    unsafe { unblock(bc as *mut raw::RedisModuleBlockedClient, data) };
}

/// The outcome given to `unblock_client`, seen from a blocked client's callback context.
fn outcome_of<'a>(ctx: *mut raw::RedisModuleCtx) -> Option<&'a Outcome> {
    let get = api!(RedisModule_GetBlockedClientPrivateData);
    // SAFETY: the private data of our blocked clients is NULL or a `Box<Outcome>` made by
    // `unblock_client`; Redis frees it (through `free_outcome`) only after the callbacks that
    // can see it have returned, so the reference does not outlive it.
    unsafe { get(ctx).cast::<Outcome>().as_ref() }
}

/// Runs a callback body; a panic is logged instead of unwinding into Redis.
pub fn guard_callback(ctx: &Context, body: impl FnOnce()) {
    if catch_unwind(AssertUnwindSafe(body)).is_err() {
        ctx.log_warning("rlock: a callback panicked; its work was abandoned");
    }
}

extern "C" fn reply_trampoline(
    ctx: *mut raw::RedisModuleCtx,
    _argv: *mut *mut raw::RedisModuleString,
    _argc: c_int,
) -> c_int {
    let context = Context::new(ctx);
    guard_callback(&context, || waiting::reply(&context, outcome_of(ctx)));
    raw::REDISMODULE_OK as c_int
}

/// Called only for `CLIENT UNBLOCK <id> [TIMEOUT]` (Redis's own timeout is off).
extern "C" fn timeout_trampoline(
    ctx: *mut raw::RedisModuleCtx,
    _argv: *mut *mut raw::RedisModuleString,
    _argc: c_int,
) -> c_int {
    let context = Context::new(ctx);
    let handle = api!(RedisModule_GetBlockedClientHandle);
    // SAFETY: a timeout callback's context carries its blocked client.
    let bc = unsafe { handle(ctx) } as Blocked;
    guard_callback(&context, || waiting::unblocked_by_command(&context, bc));
    raw::REDISMODULE_OK as c_int
}

/// The client left while blocked: disconnected, killed, or `CLIENT UNBLOCK ... ERROR`.
extern "C" fn disconnect_trampoline(
    ctx: *mut raw::RedisModuleCtx,
    bc: *mut raw::RedisModuleBlockedClient,
) {
    let context = Context::new(ctx);
    guard_callback(&context, || waiting::client_gone(&context, bc as Blocked, outcome_of(ctx)));
}

extern "C" fn free_outcome(_ctx: *mut raw::RedisModuleCtx, data: *mut c_void) {
    if !data.is_null() {
        // SAFETY: non-NULL private data is always a `Box<Outcome>` from `unblock_client`, and
        // Redis calls this once per blocked client.
        drop(unsafe { Box::from_raw(data.cast::<Outcome>()) });
    }
}

/// Whether writes are paused (`CLIENT PAUSE ... WRITE|ALL`, `FAILOVER`). Redis then keeps keys
/// that are logically expired stored (a lookup reports them missing): a module write that
/// "creates" such a key aborts the server in `dbAdd`. Timers must not write while this holds.
/// (Redis's own expiry and this call read the same pause state; asking also ends a pause whose
/// time is up, as Redis's own checks do.)
pub fn writes_paused() -> bool {
    let avoid = api!(RedisModule_AvoidReplicaTraffic);
    // SAFETY: takes no arguments and only reads (and, if its time is up, ends) the pause state.
    unsafe { avoid() != 0 }
}

/// At load: the module signals modified keys itself (`signal_modified`), only when something
/// changed, so a no-op (a busy acquire, a release by a non-holder) does not abort a `WATCH`.
pub fn set_module_options(ctx: &Context) {
    let set = api!(RedisModule_SetModuleOptions);
    let mut options = raw::REDISMODULE_OPTION_NO_IMPLICIT_SIGNAL_MODIFIED as c_int;
    if ASM_OPT_IN.load(Ordering::Relaxed) {
        options |= VALKEY_OPTIONS_HANDLE_ATOMIC_SLOT_MIGRATION;
    }
    // SAFETY: live load-time context; the options are flags the server defines (the slot
    // migration one only on Valkey 9+, see `watch_slot_migrations`).
    unsafe { set(ctx.get_raw(), options) };
}

/// Marks `name` as modified (aborts `WATCH`es on it, invalidates client-side caching).
pub fn signal_modified(ctx: &Context, name: &RedisString) {
    let signal = api!(RedisModule_SignalModifiedKey);
    // SAFETY: live context and key name; Redis copies what it keeps.
    unsafe { signal(ctx.get_raw(), name.inner) };
}

/// The class of a keyspace notification (`notify-keyspace-events` letters `g`, `$`, `h`).
#[derive(Debug, Clone, Copy)]
pub enum Notify {
    Generic,
    String,
    Hash,
}

thread_local! {
    /// Set while the module raises a notification (its own subscriber ignores those).
    static NOTIFYING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Whether the keyspace event being delivered was raised by this module.
pub fn notifying() -> bool {
    NOTIFYING.get()
}

/// Raises the keyspace notification `event` on `name`, as Redis's own command would.
pub fn notify(ctx: &Context, class: Notify, event: &CStr, name: &RedisString) {
    let notify = api!(RedisModule_NotifyKeyspaceEvent);
    let class = match class {
        Notify::Generic => raw::REDISMODULE_NOTIFY_GENERIC,
        Notify::String => raw::REDISMODULE_NOTIFY_STRING,
        Notify::Hash => raw::REDISMODULE_NOTIFY_HASH,
    };
    NOTIFYING.set(true);
    // SAFETY: live context, a NUL-terminated event name and a live key name; Redis copies what
    // it keeps.
    unsafe { notify(ctx.get_raw(), class, event.as_ptr(), name.inner) };
    NOTIFYING.set(false);
}

/// The ACL user of the client running the current command.
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
        let (get_flags, get_name, by_id, client_id, from_name, free) = (
            api!(RedisModule_GetContextFlags),
            api!(RedisModule_GetCurrentUserName),
            api!(RedisModule_GetClientUserNameById),
            api!(RedisModule_GetClientId),
            api!(RedisModule_GetModuleUserFromUserName),
            api!(RedisModule_FreeString),
        );
        // SAFETY: live context. `GetCurrentUserName` dereferences the context client's user,
        // which internal clients leave NULL: it is used only inside a script, whose client
        // always carries the caller's user. Elsewhere the lookup by client id returns NULL for
        // a client without a user, or one Redis does not list (internal clients). The name is
        // a new string we own and free once, after the lookup (which does not keep it). The user
        // handle is ours until `FreeModuleUser` in Drop.
        let user = unsafe {
            let in_script = get_flags(ctx.get_raw()) as u32 & raw::REDISMODULE_CTX_FLAGS_LUA != 0;
            let name = if in_script {
                get_name(ctx.get_raw())
            } else {
                by_id(ctx.get_raw(), client_id(ctx.get_raw()))
            };
            if name.is_null() {
                return None;
            }
            let user = from_name(name);
            free(ctx.get_raw(), name);
            user
        };
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

/// At load: calls `waiting::on_swapdb` after every `SWAPDB` (which moves keys between
/// databases without any keyspace event).
pub fn watch_swapdb(ctx: &Context) -> Result<(), String> {
    let subscribe = api!(RedisModule_SubscribeToServerEvent);
    // SAFETY: live load-time context; `swapdb_event` has the callback signature Redis expects
    // and ignores the event data.
    let status = unsafe {
        subscribe(
            ctx.get_raw(),
            raw::RedisModuleEvent { id: raw::REDISMODULE_EVENT_SWAPDB, dataver: 1 },
            Some(swapdb_event),
        )
    };
    if status == raw::REDISMODULE_OK as c_int {
        Ok(())
    } else {
        Err("cannot subscribe to the SWAPDB server event".to_owned())
    }
}

extern "C" fn swapdb_event(
    ctx: *mut raw::RedisModuleCtx,
    _event: raw::RedisModuleEvent,
    _subevent: u64,
    _data: *mut c_void,
) {
    let context = Context::new(ctx);
    guard_callback(&context, || waiting::on_swapdb(&context));
}
