//! # The bench's floor module
//!
//! A second Redis module, built only for `rlock-bench` and never shipped (not in `make
//! install`, `dist` or the `.deb`), that does the module-API work each rlock path needs and
//! nothing else: no lock rules, no owners, no ACL checks of derived names, no leases beyond the
//! one expiry, no deadlock search. BENCHMARKS.md states every rlock row of sections 1 and 4 as a
//! ratio to this module's same path, so what stands above it is rlock's own cost.
//!
//! Waiting (section 4), per key, FIFO, one client served per call:
//! - `FLOOR.BLOCK key timeout-ms`: blocks the client with `RedisModule_BlockClient` and queues it
//!   (a plain `VecDeque`); `FLOOR.UNBLOCK key` unblocks the head with
//!   `RedisModule_UnblockClient` (the pipe-write path rlock uses) and replies 1, or 0 when nobody
//!   waits, in which case it leaves a token that the next `FLOOR.BLOCK` takes at once (as a
//!   free lock is taken), so a loop never loses its turn.
//! - `FLOOR.BLOCKK key timeout-ms` / `FLOOR.SIGNAL key`: the same with
//!   `RedisModule_BlockClientOnKeys` and `RedisModule_SignalKeyAsReady` (tokens of their own).
//!   Redis 7.0 serves clients blocked on a key only while the key exists: create it first.
//!
//! Writes (section 1), each replicated as ONE command with `RedisModule_Replicate`, as rlock
//! does, when Redis may propagate anything (else the write is only counted):
//! - `FLOOR.HSET key field value ttl-ms`: a one-field hash with an absolute expiry through the
//!   key API, replicated as `RESTORE key <unix-ms> <payload> REPLACE ABSTTL`.
//! - `FLOOR.HDEL key field [channel message]`: deletes the field (the key with its last field,
//!   replicated as `DEL`, else as `HDEL`), then publishes `message` when a channel is given.
//! - `FLOOR.PUBLISH channel message`: `RedisModule_PublishMessage`.
//!
//! Every argument is validated, nothing panics across the FFI boundary (handlers and callbacks
//! are guarded), and nothing changes on an error.

mod wait;
mod write;

use std::ffi::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};

use redis_module::{raw, redis_module, Context, RedisError, RedisResult, RedisString, Status};

/// A required server API (checked at load by [`init`], which refuses to load without it).
macro_rules! api {
    ($name:ident) => {
        // SAFETY: Redis writes these pointers once, in RedisModule_Init, before any command or
        // callback of this module runs; afterwards they are only read, on the main thread.
        match unsafe { redis_module::raw::$name } {
            Some(f) => f,
            None => crate::missing(stringify!($name)),
        }
    };
}
pub(crate) use api;

/// The APIs [`api!`] is used with; the module refuses to load on a server without one.
fn missing_apis() -> Vec<&'static str> {
    macro_rules! check {
        ($($name:ident),* $(,)?) => {{
            let mut missing = Vec::new();
            $(
                // SAFETY: as in `api!`: a pointer written once by RedisModule_Init.
                if unsafe { raw::$name }.is_none() {
                    missing.push(stringify!($name));
                }
            )*
            missing
        }};
    }
    check!(
        RedisModule_BlockClient,
        RedisModule_BlockClientOnKeys,
        RedisModule_UnblockClient,
        RedisModule_SetDisconnectCallback,
        RedisModule_GetBlockedClientHandle,
        RedisModule_GetBlockedClientReadyKey,
        RedisModule_SignalKeyAsReady,
        RedisModule_GetContextFlags,
        RedisModule_ReplyWithLongLong,
        RedisModule_ReplyWithNull,
        RedisModule_OpenKey,
        RedisModule_CloseKey,
        RedisModule_KeyType,
        RedisModule_ValueLength,
        RedisModule_HashSet,
        RedisModule_DeleteKey,
        RedisModule_SetAbsExpire,
        RedisModule_Milliseconds,
        RedisModule_NotifyKeyspaceEvent,
        RedisModule_Replicate,
        RedisModule_ReplicateVerbatim,
        RedisModule_PublishMessage,
        RedisModule_SubscribeToServerEvent,
        RedisModule_StringPtrLen,
    )
}

#[cold]
fn missing(name: &'static str) -> ! {
    // Unreachable after `init`'s check; a guard turns it into an error reply if it ever is.
    panic!("this server does not provide {name}")
}

/// Runs a command handler; a panic becomes an error reply instead of unwinding into Redis.
fn guarded(
    ctx: &Context,
    args: Vec<RedisString>,
    handler: fn(&Context, Vec<RedisString>) -> RedisResult,
) -> RedisResult {
    catch_unwind(AssertUnwindSafe(|| handler(ctx, args)))
        .unwrap_or_else(|_| Err(RedisError::Str("ERR floor: internal error")))
}

/// Runs a callback body; a panic is logged instead of unwinding into Redis.
fn guard_callback(ctx: &Context, body: impl FnOnce()) {
    if catch_unwind(AssertUnwindSafe(body)).is_err() {
        ctx.log_warning("floor: a callback panicked; its work was abandoned");
    }
}

/// The largest timeout or TTL accepted, in ms (about 31 years: no overflow when added to now).
const MAX_MS: i64 = 1_000_000_000_000;

/// `arg` as milliseconds in `min..=MAX_MS`, or an error naming the argument.
fn parse_ms(arg: &RedisString, name: &str, min: i64) -> Result<i64, RedisError> {
    std::str::from_utf8(arg.as_slice())
        .ok()
        .and_then(|s| s.parse::<i64>().ok())
        .filter(|v| (min..=MAX_MS).contains(v))
        .ok_or_else(|| {
            RedisError::String(format!("ERR {name} must be an integer from {min} to {MAX_MS} (ms)"))
        })
}

/// The context's flags.
fn flags(ctx: &Context) -> u32 {
    let get = api!(RedisModule_GetContextFlags);
    // SAFETY: a live context (command or callback).
    (unsafe { get(ctx.get_raw()) }) as u32
}

/// Whether Redis may propagate writes anywhere (AOF on, a replica, or a master that has had a
/// replica or a fork since load): rlock's own rule, so both sides replicate alike.
fn propagation_possible(ctx: &Context) -> bool {
    let f = flags(ctx);
    f & raw::REDISMODULE_CTX_FLAGS_AOF != 0
        || f & raw::REDISMODULE_CTX_FLAGS_MASTER == 0
        || REPLICATION_SEEN.load(Ordering::Relaxed)
}

/// Set (for good) once this server may have a replication backlog or replicas.
static REPLICATION_SEEN: AtomicBool = AtomicBool::new(true);

extern "C" fn replication_event(
    _ctx: *mut raw::RedisModuleCtx,
    _event: raw::RedisModuleEvent,
    _subevent: u64,
    _data: *mut c_void,
) {
    REPLICATION_SEEN.store(true, Ordering::Relaxed);
}

fn init(ctx: &Context, args: &[RedisString]) -> Status {
    if !args.is_empty() {
        ctx.log_warning("floor: takes no module arguments");
        return Status::Err;
    }
    let missing = missing_apis();
    if !missing.is_empty() {
        ctx.log_warning(&format!("floor: this server lacks {}", missing.join(", ")));
        return Status::Err;
    }
    let subscribe = api!(RedisModule_SubscribeToServerEvent);
    for id in [raw::REDISMODULE_EVENT_FORK_CHILD, raw::REDISMODULE_EVENT_REPLICA_CHANGE] {
        // SAFETY: a live load-time context; `replication_event` has the callback signature
        // Redis expects and ignores the event data.
        let status = unsafe {
            subscribe(
                ctx.get_raw(),
                raw::RedisModuleEvent { id, dataver: 1 },
                Some(replication_event),
            )
        };
        if status != raw::REDISMODULE_OK as i32 {
            ctx.log_warning("floor: cannot subscribe to the replication events");
            return Status::Err;
        }
    }
    // SAFETY: as in `api!`: a pointer written once by RedisModule_Init.
    if unsafe { raw::RedisModule_GetServerInfo }.is_some() {
        let info = ctx.server_info("replication");
        let field = |name: &str| info.field(name).map(|v| v.to_string_lossy());
        let started = field("repl_backlog_active").is_none_or(|v| v != "0")
            || field("connected_slaves").is_none_or(|v| v != "0");
        REPLICATION_SEEN.store(started, Ordering::Relaxed);
    }
    Status::Ok
}

fn block(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    guarded(ctx, args, wait::block)
}
fn unblock(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    guarded(ctx, args, wait::unblock)
}
fn block_on_key(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    guarded(ctx, args, wait::block_on_key)
}
fn signal(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    guarded(ctx, args, wait::signal)
}
fn hset(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    guarded(ctx, args, write::hset)
}
fn hdel(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    guarded(ctx, args, write::hdel)
}
fn publish(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    guarded(ctx, args, write::publish)
}

redis_module! {
    name: "floor",
    version: 1,
    allocator: (redis_module::alloc::RedisAlloc, redis_module::alloc::RedisAlloc),
    data_types: [],
    init: init,
    commands: [
        ["floor.block", block, "write deny-oom", 1, 1, 1, ""],
        ["floor.unblock", unblock, "write", 1, 1, 1, ""],
        ["floor.blockk", block_on_key, "write deny-oom", 1, 1, 1, ""],
        ["floor.signal", signal, "write", 1, 1, 1, ""],
        ["floor.hset", hset, "write deny-oom", 1, 1, 1, ""],
        ["floor.hdel", hdel, "write", 1, 1, 1, ""],
        ["floor.publish", publish, "pubsub fast", 0, 0, 0, ""],
    ],
}
