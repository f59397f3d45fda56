//! # rlock: native reentrant distributed locks for Redis
//!
//! A Redis module adding `RLOCK.*` commands that implement Redisson's reentrant lock inside the
//! server, on Redisson's own data layout (a hash `owner -> hold count`, the lease as the key's
//! expiry), so Redisson clients and rlock clients agree on who holds a lock.
//!
//! # Layout
//! - `lib.rs`: the `redis_module!` table, one row per command (name, handler, flags, keys).
//! - [`commands`]: one handler per command: parse, read the key, apply the rules, write and
//!   replicate, reply. The only code that touches keys.
//! - [`args`]: argument parsing into a typed struct per command.
//! - [`rules`]: the lock rules as plain Rust (acquire, release, renew, force-release), which
//!   unit tests drive without a server.
//! - [`queue`]: server-side waiting as plain Rust: FIFO queues per lock, the schedule of
//!   timeouts and lease checks.
//! - [`waiting`]: server-side waiting on Redis: blocking, hand-off, timers, keyspace and server
//!   events, `INFO rlock` stats.
//! - [`replicas`]: failover safety: a master that lost its replicas grants nothing; the token
//!   floor raised on promotion.
//! - [`names`]: the keys and channels a lock derives from its name (Redisson's `prefixName`).
//! - [`server`]: which server the module runs in and the optional capabilities it uses there.
//! - [`cluster`]: Redis Cluster as plain Rust: key slots, slot ownership from `CLUSTER NODES`.
//! - [`error`]: the one error enum and its conversion to error replies.
//! - [`raw`]: every unsafe `RedisModule_*` call, each with a `// SAFETY:` note.

#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod args;
pub mod cluster;
pub mod commands;
pub mod error;
pub mod names;
pub mod queue;
pub mod raw;
pub mod replicas;
pub mod rules;
pub mod server;
pub mod waiting;

use redis_module::configuration::ConfigurationFlags;
use redis_module::{redis_module, Context, RedisString, Status};

/// Redis's allocator inside the server (the module's memory shows in `INFO memory`); the system
/// allocator for the server-free tests, which link this crate outside redis-server.
#[cfg(not(feature = "system-alloc"))]
type Allocator = redis_module::alloc::RedisAlloc;
#[cfg(feature = "system-alloc")]
type Allocator = std::alloc::System;

#[cfg(not(feature = "system-alloc"))]
const ALLOCATOR: Allocator = redis_module::alloc::RedisAlloc;
#[cfg(feature = "system-alloc")]
const ALLOCATOR: Allocator = std::alloc::System;

/// The module arguments (`loadmodule librlock.so min-replicas 1`) are the settings of the
/// `configurations` table, by name without the `rlock.` prefix; anything else (a typo, or the
/// prefixed name, which Redis would otherwise ignore) refuses the load rather than leave a
/// safety setting silently at its default.
const ARGUMENTS: [&str; 2] = ["min-replicas", "replica-max-lag"];

fn init(ctx: &Context, args: &[RedisString]) -> Status {
    for pair in args.chunks(2) {
        let name = pair[0].to_string_lossy();
        if pair.len() != 2 || !ARGUMENTS.contains(&name.as_str()) {
            ctx.log_warning(&format!(
                "rlock: unknown module argument '{name}' (or no value): the arguments are \
                 min-replicas <n> and replica-max-lag <seconds>"
            ));
            return Status::Err;
        }
    }
    if !commands::check_server(ctx) {
        return Status::Err;
    }
    commands::set_docs(ctx);
    Status::Ok
}

redis_module! {
    name: "rlock",
    version: 1,
    allocator: (Allocator, ALLOCATOR),
    data_types: [],
    init: init,
    commands: [
        // name,                 handler,                  flags,               keys: first, last, step, ACL categories
        ["rlock.acquire",      commands::acquire,       "write deny-oom",    1, 1, 1, ""],
        ["rlock.release",      commands::release,       "write",             1, 1, 1, ""],
        ["rlock.renew",        commands::renew,         "write deny-oom",    1, 1, 1, ""],
        ["rlock.forcerelease", commands::force_release, "write",             1, 1, 1, ""],
        ["rlock.pttl",         commands::pttl,          "readonly fast",     1, 1, 1, ""],
        ["rlock.info",         commands::info,          "readonly fast",     1, 1, 1, ""],
    ],
    // A lock with waiters that is deleted, expires or is evicted is handed off to its head.
    event_handlers: [
        [@GENERIC @EXPIRED @EVICTED: waiting::on_keyspace_event],
    ],
    // `CONFIG SET rlock.min-replicas 0`, or `loadmodule librlock.so rlock.min-replicas 1`.
    configurations: [
        i64: [
            // -1: one replica in sync once one has been online; 0: off; n: n replicas.
            ["min-replicas", &replicas::MIN_REPLICAS, -1, -1, 1_000, ConfigurationFlags::DEFAULT, None],
            // Seconds since a replica's last acknowledgement for it to count as in sync.
            ["replica-max-lag", &replicas::MAX_LAG, 2, 1, 3_600, ConfigurationFlags::DEFAULT, None],
        ],
        string: [],
        bool: [],
        enum: [],
        module_args_as_configuration: true,
    ]
}
