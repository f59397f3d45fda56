//! The floor of the module: every raw `RedisModule_*` call, each wrapped in a small safe function
//! with a `// SAFETY:` note, one file per concern. The rest of the crate is safe Rust.
//!
//! `raw` knows no caller: it imports nothing from the crate, and the callbacks Redis makes into
//! the module (a blocked client's reply, a server event) reach the layers above through the
//! traits they implement ([`blocking::BlockHandler`], [`events::ServerEvents`]).
//!
//! Why raw calls at all: the redis-module crate's hash helpers take `&str` fields (an owner with a
//! NUL byte crashed the server, non-UTF-8 owners were refused), it has no `GetExpire`, no
//! `PublishMessage`, and no `SetCommandInfo` (key specs, arity) on the 6.2 compatibility level
//! that loads on Redis 7.0.
//!
//! - [`context`]: the clock, the context's flags and database, strings, notifications, publish.
//! - [`keys`]: an open key: kind, hash fields, string value, expiry, delete.
//! - [`blocking`]: blocked clients and their callbacks.
//! - [`replication`]: effects propagated to replicas and the AOF, paused writes.
//! - [`info`]: reading the server's `INFO` sections.
//! - [`events`]: server events, module options.
//! - [`acl`]: the calling client's ACL user.
//! - [`command_info`]: arity, docs, key specs and arguments for `COMMAND INFO` / `COMMAND DOCS`.
//! - [`defrag`]: no defrag warning at load on servers without the defrag callbacks API.
//! - [`reply`]: map replies.
//! - [`scan`]: a walk over a database's key names, a step at a time.
//! - [`dispatch`]: the entry of every command (its arguments borrowed), registering commands.
//! - [`work`]: the meter of the work done (keys opened, fields scanned, clients unblocked).

use std::panic::{catch_unwind, AssertUnwindSafe};

use redis_module::Context;

/// Declares the server APIs the module calls, once: `api!(Name)` compiles only for a name in the
/// `required` list, and [`missing_apis`] checks exactly that list at load, so the two cannot
/// drift. `optional_api!(Name)` gives an `Option` for the APIs some servers lack.
macro_rules! declare_apis {
    (required: [$($required:ident),* $(,)?], optional: [$($optional:ident),* $(,)?] $(,)?) => {
        /// The required APIs this server lacks; `lib.rs` refuses to load without them.
        pub fn missing_apis() -> Vec<&'static str> {
            let mut missing = Vec::new();
            $(
                // SAFETY: Redis writes these pointers once, in RedisModule_Init (OnLoad), before
                // any of our code runs; afterwards they are only read, on Redis's main thread.
                if unsafe { redis_module::raw::$required }.is_none() {
                    missing.push(stringify!($required));
                }
            )*
            missing
        }

        /// A required API's function pointer (`missing_apis` checked it at load).
        macro_rules! api {
            $(
                ($required) => {
                    // SAFETY: as in `missing_apis`: a pointer written once by RedisModule_Init.
                    match unsafe { redis_module::raw::$required } {
                        Some(f) => f,
                        None => crate::raw::missing_api(stringify!($required)),
                    }
                };
            )*
        }

        /// An optional API's function pointer, `None` on servers without it.
        macro_rules! optional_api {
            $(
                ($optional) => {
                    // SAFETY: as in `missing_apis`: a pointer written once by RedisModule_Init.
                    unsafe { redis_module::raw::$optional }
                };
            )*
        }
    };
}

declare_apis! {
    required: [
        RedisModule_OpenKey,
        RedisModule_CloseKey,
        RedisModule_CreateCommand,
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
        RedisModule_CreateString,
        RedisModule_CreateStringFromLongLong,
        RedisModule_SubscribeToServerEvent,
        RedisModule_AvoidReplicaTraffic,
        RedisModule_SetModuleOptions,
        RedisModule_SignalModifiedKey,
        RedisModule_NotifyKeyspaceEvent,
        RedisModule_GetCurrentUserName,
        RedisModule_GetClientUserNameById,
        RedisModule_GetClientId,
        RedisModule_GetClientInfoById,
        RedisModule_GetModuleUserFromUserName,
        RedisModule_FreeModuleUser,
        RedisModule_ACLCheckKeyPermissions,
        RedisModule_ACLCheckChannelPermissions,
        RedisModule_ACLAddLogEntry,
        RedisModule_ScanCursorCreate,
        RedisModule_ScanCursorDestroy,
        RedisModule_ScanKey,
        RedisModule_Scan,
    ],
    optional: [
        RedisModule_SetAbsExpire,
        RedisModule_GetAbsExpire,
        RedisModule_ClusterKeySlot,
        RedisModule_GetServerInfo,
        RedisModule_ServerInfoGetFieldSigned,
        RedisModule_ServerInfoGetFieldC,
        RedisModule_FreeServerInfo,
        RedisModule_GetCommand,
        RedisModule_SetCommandInfo,
    ],
}

#[cold]
fn missing_api(name: &'static str) -> ! {
    // Caught by the handler guard in `commands`: the client gets an error, the server lives.
    panic!("this server does not provide {name}")
}

pub mod acl;
pub mod blocking;
pub mod command_info;
pub mod context;
pub mod defrag;
pub mod dispatch;
pub mod events;
pub mod info;
pub mod keys;
pub mod replication;
pub mod reply;
pub mod scan;
pub mod work;

pub use acl::{KeyUse, User};
pub use blocking::{block_client, may_block, unblock_client, BlockHandler, Blocked};
pub use context::{
    connection_id, count_string, in_cluster, int_string, is_master, key_slot, notify, now_ms,
    publish, publish_shard, select_db, selected_db, signal_modified, Notify,
};
pub use keys::{Key, KeyKind, KeyRef, OwnedString};
pub use replication::{
    count_unpropagated_write, note_replication, propagation_possible, replicas_possible, replicate,
    replicate_to_replicas, writes_paused,
};

/// Runs a callback body; a panic is logged instead of unwinding into Redis.
pub fn guard_callback(ctx: &Context, body: impl FnOnce()) {
    if catch_unwind(AssertUnwindSafe(body)).is_err() {
        ctx.log_warning("rlock: a callback panicked; its work was abandoned");
    }
}
