//! Effects propagated to replicas and the AOF, whether anything may be propagated at all, and
//! whether writes are paused.

use std::ffi::{c_int, c_void, CStr};
use std::sync::atomic::{AtomicBool, Ordering};

use redis_module::{raw, Context, RedisString};

use super::context::flags;
use super::info::ServerInfo;

/// Propagates `command args...` to replicas and the AOF (not executed locally). Binary-safe.
pub fn replicate(ctx: &Context, command: &CStr, args: &[&RedisString]) {
    propagate(ctx, command, c"v", args);
}

/// Propagates `command args...` to replicas only, never the AOF: what Redis does with its own
/// `PUBLISH` (replaying a message from the AOF would reach nobody). With no replica and no
/// backlog Redis propagates nothing, so an effect propagated with it stays a single command
/// (no `MULTI`/`EXEC` around it).
pub fn replicate_to_replicas(ctx: &Context, command: &CStr, args: &[&RedisString]) {
    propagate(ctx, command, c"vA", args);
}

fn propagate(ctx: &Context, command: &CStr, format: &CStr, args: &[&RedisString]) {
    let replicate = api!(RedisModule_Replicate);
    super::work::add(1);
    let mut argv: Vec<*mut raw::RedisModuleString> = args.iter().map(|a| a.inner).collect();
    // SAFETY: the "v" format takes an array of RedisModuleString pointers and its length ("A"
    // only sets a flag); the strings are live for the call and Redis retains what it keeps.
    // `command` and `format` are NUL-terminated.
    unsafe {
        replicate(ctx.get_raw(), command.as_ptr(), format.as_ptr(), argv.as_mut_ptr(), argv.len());
    }
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

/// Whether Redis may propagate writes anywhere: the module's conservative mirror of Redis's
/// own `shouldPropagate` (AOF on, or a master with a replication backlog or replicas).
///
/// The AOF and role come live from the context flags. Backlog and replicas are not visible to
/// modules, so a sticky flag stands for them: set at load if the server has either, and by every
/// fork (a full sync forks before it streams anything to a replica), replica change, role
/// change and slot export. It never goes back to false while the module is loaded.
pub fn propagation_possible(ctx: &Context) -> bool {
    let flags = flags(ctx);
    flags & raw::REDISMODULE_CTX_FLAGS_AOF != 0
        || flags & raw::REDISMODULE_CTX_FLAGS_MASTER == 0
        || REPLICATION_SEEN.load(Ordering::Relaxed)
}

/// Whether Redis may propagate writes to replicas (a replica, a replication backlog, or this
/// server being a replica itself): [`propagation_possible`] without the AOF.
pub fn replicas_possible(ctx: &Context) -> bool {
    flags(ctx) & raw::REDISMODULE_CTX_FLAGS_MASTER == 0 || REPLICATION_SEEN.load(Ordering::Relaxed)
}

/// See [`propagation_possible`]; true until `watch_replication` has looked.
static REPLICATION_SEEN: AtomicBool = AtomicBool::new(true);

/// Marks that this server may now have a replication backlog or replicas.
pub fn note_replication() {
    REPLICATION_SEEN.store(true, Ordering::Relaxed);
}

/// At load: subscribes to the events that can start replication, and reads whether it has
/// already started.
///
/// # Errors
/// A message for the log when Redis refuses a subscription.
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

/// Whether `INFO replication` shows a backlog or replicas; `None` if unreadable.
fn replication_started(ctx: &Context) -> Option<bool> {
    let info = ServerInfo::read(ctx, c"replication")?;
    let backlog = info.signed(c"repl_backlog_active")?;
    let replicas = info.signed(c"connected_slaves")?;
    Some(backlog != 0 || replicas != 0)
}

extern "C" fn replication_event(
    _ctx: *mut raw::RedisModuleCtx,
    _event: raw::RedisModuleEvent,
    _subevent: u64,
    _data: *mut c_void,
) {
    note_replication();
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
