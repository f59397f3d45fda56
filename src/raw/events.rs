//! Server events the module subscribes to with its own callbacks (the ones the redis-module
//! crate does not offer), and the module options. The callbacks reach the caller's
//! [`ServerEvents`] (raw knows no caller).

use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicBool, Ordering};

use redis_module::{raw, Context};

use super::guard_callback;
use super::replication::note_replication;

/// What the layer above does on the server events subscribed here.
pub trait ServerEvents: 'static {
    /// `SWAPDB first second` moved whole databases (without any keyspace event).
    fn on_swapdb(ctx: &Context, first: i32, second: i32);
    /// `FLUSHDB` (of database `db`) or `FLUSHALL` (`db` is -1) ended.
    fn on_flushed(ctx: &Context, db: i32);
    /// An atomic slot migration ended (exported, imported, aborted) or migrated keys were
    /// trimmed: slot ownership changed.
    fn on_slots_moved(ctx: &Context);
    /// The connection of client `id` closed (it quit, was killed, timed out, or its peer went
    /// away). Called for every connection: keep it cheap.
    fn on_client_closed(ctx: &Context, id: u64);
}

/// At load: calls `E::on_client_closed` whenever a client connection closes.
///
/// # Errors
/// A message for the log when Redis refuses the subscription.
pub fn watch_client_closed<E: ServerEvents>(ctx: &Context) -> Result<(), String> {
    let subscribe = api!(RedisModule_SubscribeToServerEvent);
    // SAFETY: live load-time context; `client_event` has the callback signature Redis expects
    // and reads the event data as the `RedisModuleClientInfo` (version 1) Redis passes.
    let status = unsafe {
        subscribe(
            ctx.get_raw(),
            raw::RedisModuleEvent { id: raw::REDISMODULE_EVENT_CLIENT_CHANGE, dataver: 1 },
            Some(client_event::<E>),
        )
    };
    if status == raw::REDISMODULE_OK as c_int {
        Ok(())
    } else {
        Err("cannot subscribe to the client change server event".to_owned())
    }
}

extern "C" fn client_event<E: ServerEvents>(
    ctx: *mut raw::RedisModuleCtx,
    _event: raw::RedisModuleEvent,
    subevent: u64,
    data: *mut c_void,
) {
    if subevent != raw::REDISMODULE_SUBEVENT_CLIENT_CHANGE_DISCONNECTED || data.is_null() {
        return;
    }
    // SAFETY: for REDISMODULE_EVENT_CLIENT_CHANGE, Redis passes a live `RedisModuleClientInfo`
    // of the version subscribed (1) for the duration of the callback (checked non-null above).
    let id = unsafe { (*data.cast::<raw::RedisModuleClientInfo>()).id };
    let context = Context::new(ctx);
    guard_callback(&context, || E::on_client_closed(&context, id));
}

/// Which server's atomic slot migration events to subscribe to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlotMigrationEvents {
    /// Valkey 9+: event 19 (`VALKEYMODULE_EVENT_ATOMIC_SLOT_MIGRATION`), and the module must opt
    /// in with an option bit or Valkey refuses atomic slot migration.
    Valkey,
    /// Redis 8.4+: events 18 (`CLUSTER_SLOT_MIGRATION`) and 19 (`..._TRIM`).
    Redis,
}

/// At load: calls `E::on_swapdb` after every `SWAPDB`.
///
/// # Errors
/// A message for the log when Redis refuses the subscription.
pub fn watch_swapdb<E: ServerEvents>(ctx: &Context) -> Result<(), String> {
    let subscribe = api!(RedisModule_SubscribeToServerEvent);
    // SAFETY: live load-time context; `swapdb_event` has the callback signature Redis expects
    // and ignores the event data.
    let status = unsafe {
        subscribe(
            ctx.get_raw(),
            raw::RedisModuleEvent { id: raw::REDISMODULE_EVENT_SWAPDB, dataver: 1 },
            Some(swapdb_event::<E>),
        )
    };
    if status == raw::REDISMODULE_OK as c_int {
        Ok(())
    } else {
        Err("cannot subscribe to the SWAPDB server event".to_owned())
    }
}

/// At load: calls `E::on_flushed` after every `FLUSHDB` and `FLUSHALL` (with the database
/// flushed, which the redis-module crate's flush event does not give).
///
/// # Errors
/// A message for the log when Redis refuses the subscription.
pub fn watch_flush<E: ServerEvents>(ctx: &Context) -> Result<(), String> {
    let subscribe = api!(RedisModule_SubscribeToServerEvent);
    // SAFETY: live load-time context; `flush_event` has the callback signature Redis expects
    // and reads the event data as the `RedisModuleFlushInfo` Redis passes for this event.
    let status = unsafe {
        subscribe(
            ctx.get_raw(),
            raw::RedisModuleEvent { id: raw::REDISMODULE_EVENT_FLUSHDB, dataver: 1 },
            Some(flush_event::<E>),
        )
    };
    if status == raw::REDISMODULE_OK as c_int {
        Ok(())
    } else {
        Err("cannot subscribe to the FLUSHDB server event".to_owned())
    }
}

extern "C" fn flush_event<E: ServerEvents>(
    ctx: *mut raw::RedisModuleCtx,
    _event: raw::RedisModuleEvent,
    subevent: u64,
    data: *mut c_void,
) {
    if subevent != raw::REDISMODULE_SUBEVENT_FLUSHDB_END || data.is_null() {
        return;
    }
    // SAFETY: for REDISMODULE_EVENT_FLUSHDB, Redis passes a live `RedisModuleFlushInfo` for the
    // duration of the callback (checked non-null above).
    let db = unsafe { (*data.cast::<raw::RedisModuleFlushInfo>()).dbnum };
    let context = Context::new(ctx);
    guard_callback(&context, || E::on_flushed(&context, db));
}

extern "C" fn swapdb_event<E: ServerEvents>(
    ctx: *mut raw::RedisModuleCtx,
    _event: raw::RedisModuleEvent,
    _subevent: u64,
    data: *mut c_void,
) {
    // SAFETY: for the SWAPDB event Redis passes a `RedisModuleSwapDbInfo` (version 1: both
    // database numbers), valid for the callback; a NULL pointer is not read.
    let dbs = unsafe { data.cast::<raw::RedisModuleSwapDbInfo>().as_ref() }
        .map(|info| (info.dbnum_first, info.dbnum_second));
    let context = Context::new(ctx);
    if let Some((first, second)) = dbs {
        guard_callback(&context, || E::on_swapdb(&context, first, second));
    }
}

/// Subscribes to the server's atomic slot migration events, and (Valkey 9) opts in to atomic
/// slot migration, which Valkey refuses while any loaded module has not.
///
/// Valkey 9 (event 19): an export starting may start propagation to the target (as a replica
/// would), so writes are replicated as effects from then on; an export or import ending, or
/// an export aborting, calls `E::on_slots_moved`.
/// Redis 8.4 (events 18 and 19, from its `redismodule.h`; not run here, no binary exists for
/// this platform): the same, on its migrate and trim subevents.
///
/// # Errors
/// A message for the log when the server refuses a subscription.
pub fn watch_slot_migrations<E: ServerEvents>(
    ctx: &Context,
    events: SlotMigrationEvents,
) -> Result<(), String> {
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
                Some(slot_migration_event::<E>),
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

extern "C" fn slot_migration_event<E: ServerEvents>(
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
        guard_callback(&context, || E::on_slots_moved(&context));
    }
}

/// At load: the module signals modified keys itself (`signal_modified`), only when something
/// changed, so a no-op (a busy acquire, a release by a non-holder) does not abort a `WATCH`;
/// and on Valkey 9 it handles atomic slot migration.
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
