//! # rlock: native reentrant distributed locks for Redis
//!
//! A Redis module adding `RLOCK.*` commands that implement Redisson's reentrant lock inside the
//! server, on Redisson's own data layout (a hash `owner -> hold count`, the lease as the key's
//! expiry), so Redisson clients and rlock clients agree on who holds a lock.
//!
//! # Layout
//! Floors point down: each layer calls only the ones below it.
//! - `lib.rs`: the one command table (name, handler, flags, key spec, arity, summary,
//!   arguments; the arguments' descriptions shared by several commands in `arg_docs.rs`),
//!   module settings, load-time checks.
//! - [`commands`]: one handler per command: parse, go through the door, decide with the
//!   rules, reply (`RLOCK.*`, `RWLOCK.*` in `rw`, `RSEM.*` in `sem`, the counted give-back of
//!   permits in `permits`).
//! - `door`: the one path of every command that writes, in floor order: **load**
//!   (`door::load`, every such command's first step: the lock's pending ends applied, owed
//!   whatever it replies; an acquire's `door::enter` goes on: what the queues know of its
//!   `REQUEST` id, the `SESSION` binding; then the store's checks: may this master grant, the
//!   request's record, where a retry replays its grant and goes no further, the token counter)
//!   → **decide** (the command opens the lock once, its owed waiters served first, and asks
//!   the pure rules for a plan) → **write** (the token, the lock, then what a grant writes
//!   beside it, the counter and the record, through `store::request::Beside`, the one writer
//!   of those for an acquire's grant and a waiter's; then the session binding) → **wake** (a wait queued after the deadlock
//!   search; a release hands off). Everything that can refuse is checked after the load and
//!   before the command writes anything of its own. The handlers read these steps in order;
//!   `RLOCK.RELEASE`, `RWLOCK.RELEASE` and `RSEM.RELEASE ... ID` (and `RLOCK.CANCEL`'s give-back)
//!   load, then call one function of `waiting` for the rest (`release_hold`, `rw_release`,
//!   `sem_give_back_ids`), which the module's own work uses too (a grant undone, a session
//!   end). Timers, server events and session ends are the module's own work (`waiting`).
//! - [`events`]: what the server tells the module outside commands (server events, the cron
//!   tick, `INFO rlock`; no keyspace events).
//! - [`waiting`]: server-side waiting on Redis: blocking, hand-off (several grants at once where
//!   the lock kind allows), timers (the poll of locks with waiters), cluster redirects; in
//!   floors of its own, without a circle (its `mod.rs` lists them): the queues at the bottom,
//!   the timers' work ([`waiting::schedule::Tick`]) at the top.
//! - [`store`]: a lock on Redis: open its key, read a `View`, apply a `Plan` (write, notify,
//!   replicate), the unlock message, derived keys (token counter, release latch), ACL checks;
//!   the read-write lock's and the semaphore's layouts; what waiting asks of each lock kind.
//! - Plain Rust, driven by unit tests without a server: [`rules`] (the reentrant lock rules and
//!   what a waiter asks for), [`rw_rules`] (the read-write lock), [`sem_rules`] (the
//!   semaphore), [`deadlock_rules`] (the wait-for graph's search, sans I/O: it asks,
//!   `waiting::deadlock` answers from the queues and keys), [`queue`] (FIFO
//!   queues and the schedule of timed events), [`args`] (argument parsing), [`names`] (Redisson's derived names), [`dump`] (a lock hash in `DUMP` format, for
//!   replication as one `RESTORE`), [`cluster`] (key slots, slot ownership),
//!   [`replicas`] (failover safety), [`server`] (which server, which capabilities),
//!   [`sessions`] (session holds: bindings to connections, lock-delays), [`error`] (the one
//!   error enum and its replies), [`version`] (the module's version and commit).
//! - [`raw`]: the floor: every unsafe `RedisModule_*` call, by concern, each with a
//!   `// SAFETY:` note; it knows no caller (callbacks come in through traits). Commands enter
//!   through [`raw::dispatch`], which lends each handler the client's arguments.

#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

mod arg_docs;
pub mod args;
pub mod cluster;
pub mod commands;
pub mod deadlock_rules;
mod door;
pub mod dump;
pub mod error;
pub mod events;
pub mod latch_rules;
pub mod names;
pub mod queue;
pub mod raw;
pub mod replicas;
pub mod request_rules;
pub mod rules;
pub mod rw_rules;
pub mod sem_rules;
pub mod server;
pub mod sessions;
pub mod store;
pub mod version;
pub mod waiting;

use std::ffi::CStr;

use redis_module::configuration::ConfigurationFlags;
use redis_module::{redis_module, Context, RedisString, Status};

use arg_docs::{
    COUNT, GT, KEY, LEASE, LEASED, MODE, OWNER, REQUEST, SEM_RELEASED, SEM_REQUEST, SESSION, TOKEN,
    WAIT,
};
use raw::command_info::{
    ArgDoc, ArgType, CommandDoc, KEY_ACCESS, KEY_DELETE, KEY_RO, KEY_RW, KEY_UPDATE,
};
use raw::defrag::QUIET_DEFRAG;

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
const ARGUMENTS: [&str; 3] = ["min-replicas", "replica-max-lag", "stall-ms"];

fn init(ctx: &Context, args: &[RedisString]) -> Status {
    for pair in args.chunks(2) {
        let name = pair[0].to_string_lossy();
        if pair.len() != 2 || !ARGUMENTS.contains(&name.as_str()) {
            ctx.log_warning(&format!(
                "rlock: unknown module argument '{name}' (or no value): the arguments are \
                 min-replicas <n>, replica-max-lag <seconds> and stall-ms <ms>"
            ));
            return Status::Err;
        }
    }
    for &(name, entry, flags) in ENTRIES {
        if let Err(e) = raw::dispatch::create_command(ctx, name, entry, flags) {
            ctx.log_warning(&format!("rlock: {e}"));
            return Status::Err;
        }
    }
    match check_server(ctx) {
        Ok(()) => Status::Ok,
        Err(e) => {
            ctx.log_warning(&format!("rlock: {e}"));
            Status::Err
        }
    }
}

/// `MODULE UNLOAD`: refused while a session hold is bound to a connection or its end waits to
/// be applied. The bindings live only in the module's memory: a hold that outlived them would
/// no longer end when its connection closes, as its client was promised (docs/sessions.md).
fn deinit(ctx: &Context) -> Status {
    if waiting::session::promised(raw::now_ms()) {
        ctx.log_warning(&format!(
            "rlock: MODULE UNLOAD refused: {} session hold(s) are bound to their connections \
             (SESSION) or wait to be ended, and would no longer end when their connection \
             closes; release them (or let their leases end) and unload again",
            waiting::session::bound()
        ));
        return Status::Err;
    }
    Status::Ok
}

/// At load: the server must provide every API the commands use; subscribes to the events the
/// module watches, sets the command docs and the module options.
fn check_server(ctx: &Context) -> Result<(), String> {
    let missing = raw::missing_apis();
    if !missing.is_empty() {
        return Err(format!("this server lacks {}", missing.join(", ")));
    }
    raw::replication::watch_replication(ctx)?;
    raw::events::watch_swapdb::<events::Events>(ctx)?;
    raw::events::watch_flush::<events::Events>(ctx)?;
    raw::events::watch_client_closed::<events::Events>(ctx)?;
    let server = server::detect(ctx);
    if let Some(migrations) = server.slot_migration_events() {
        raw::events::watch_slot_migrations::<events::Events>(ctx, migrations)?;
    }
    for doc in COMMANDS {
        // Not fatal: the commands work without it, but a read-only ACL key permission will not
        // be enough for RLOCK.PTTL / RLOCK.INFO.
        if let Err(e) = raw::command_info::set_command_info(ctx, doc) {
            ctx.log_warning(&format!("rlock: {e}"));
        }
    }
    ctx.log_notice(&format!(
        "rlock {} (commit {}) running on {}; optional capabilities in use: {}",
        version::VERSION,
        version::COMMIT,
        server.describe(),
        server.capabilities()
    ));
    server::set(server);
    raw::events::set_module_options(ctx);
    waiting::reset_stats();
    replicas::reset();
    let running = raw::info::has_served_clients(ctx).unwrap_or(true);
    // At the server's start (not a MODULE LOAD into a running one): a restart of a master
    // that had replicas, with its quarantine.
    if let Some((path, count)) = replicas::recall(!running) {
        ctx.log_notice(&replicas::found_message(&path, count));
    }
    // Loaded into a running server (MODULE LOAD, an upgrade): the previous instance's token
    // high-water mark went with its memory, and an evicted counter would restart below a
    // token it granted. The floor rises as at a restart, above every token granted before.
    if running {
        replicas::raise_token_floor(next_millisecond());
        ctx.log_notice(&format!(
            "rlock: loaded into a running server: fencing tokens start at the token floor {} \
             (above every token granted before the load)",
            replicas::failover_floor()
        ));
    }
    store::settings::refresh(ctx, None);
    Ok(())
}

/// The clock's next millisecond, waited for (at most a few ms): the token floor of a load into
/// a running server is above every token an instance loaded and unloaded within the current
/// millisecond granted (its floor was this millisecond's, or an earlier one's).
fn next_millisecond() -> i64 {
    let start = raw::now_ms();
    let give_up = std::time::Instant::now() + std::time::Duration::from_millis(5);
    let mut now = start;
    while now <= start && std::time::Instant::now() < give_up {
        std::hint::spin_loop();
        now = raw::now_ms();
    }
    now.max(start.saturating_add(1))
}

/// A command name as a C string, at compile time.
const fn c_name(name: &'static str) -> &'static CStr {
    match CStr::from_bytes_with_nul(name.as_bytes()) {
        Ok(name) => name,
        Err(_) => panic!("a command name must not contain NUL"),
    }
}

/// A command's complexity for `COMMAND DOCS`: O(1) unless its row says otherwise.
macro_rules! o1_unless {
    () => {
        "O(1)"
    };
    ($complexity:literal) => {
        $complexity
    };
}

/// The one command table: expands into the `redis_module!` registration and [`COMMANDS`] (the
/// docs, key specs and arguments set at load), so the two cannot drift.
macro_rules! rlock_module {
    (
        commands: [$([
            $name:literal, $handler:path, $flags:literal, $key_flags:expr, $arity:literal,
            $summary:literal, $args:expr $(, $complexity:literal)? $(,)?
        ]),* $(,)?],
        $($rest:tt)*
    ) => {
        /// Arity, docs, key spec and arguments of every command, as registered.
        pub const COMMANDS: &[CommandDoc] = &[$(CommandDoc {
            name: c_name(concat!($name, "\0")),
            summary: c_name(concat!($summary, "\0")),
            complexity: c_name(concat!(o1_unless!($($complexity)?), "\0")),
            arity: $arity,
            key_flags: $key_flags,
            args: $args,
        }),*];

        /// Every command's name, entry and flags, registered at load (one key, at position 1).
        const ENTRIES: &[(&CStr, raw::dispatch::Entry, &CStr)] = &[$((
            c_name(concat!($name, "\0")),
            {
                extern "C" fn entry(
                    ctx: *mut redis_module::raw::RedisModuleCtx,
                    argv: *mut *mut redis_module::raw::RedisModuleString,
                    argc: std::ffi::c_int,
                ) -> std::ffi::c_int {
                    // SAFETY: Redis calls a command's entry with its live context and arguments.
                    unsafe { raw::dispatch::run(ctx, argv, argc, $handler) }
                }
                entry
            },
            c_name(concat!($flags, "\0")),
        )),*];

        redis_module! {
            name: "rlock",
            version: version::MODULE_VERSION,
            allocator: (Allocator, ALLOCATOR),
            // Not a data type: keeps the crate from logging a defrag warning (`raw::defrag`).
            data_types: [QUIET_DEFRAG],
            init: init,
            deinit: deinit,
            $($rest)*
        }
    };
}

rlock_module! {
    commands: [
        // name, handler, flags, key spec flags, arity (-N: at least N), summary, arguments
        ["rlock.acquire", commands::acquire, "write deny-oom",
            KEY_RW | KEY_ACCESS | KEY_UPDATE, -4, // as HINCRBY
            "Acquires or re-enters a reentrant lock; replies nil (with TOKEN: [1, token]) when held, else the holder's remaining lease in ms (with TOKEN: [0, pttl])",
            &[KEY, OWNER, LEASE, WAIT, TOKEN, REQUEST, SESSION, GT]],
        ["rlock.release", commands::release, "write",
            KEY_RW | KEY_ACCESS | KEY_DELETE, -3, // as LPOP: may delete
            "Releases one hold; 1: freed (and published), 0: still held, nil: not the holder",
            &[KEY, OWNER, LEASE.optional(), REQUEST]],
        ["rlock.renew", commands::renew, "write deny-oom",
            KEY_RW | KEY_UPDATE, -4,
            "Resets the lease of a lock the owner holds (with GT: only if that extends it); 1: renewed (or held), 0: not held",
            &[KEY, OWNER, LEASE, GT]],
        ["rlock.forcerelease", commands::force_release, "write",
            KEY_RW | KEY_DELETE, 2,
            "Deletes a lock whoever holds it and publishes the unlock message",
            &[KEY]],
        ["rlock.cancel", commands::cancel, "write",
            KEY_RW | KEY_ACCESS | KEY_DELETE, 3,
            "Undoes an acquire made with REQUEST id (any kind); 2: its grant given back, 1: it was waiting and left the queue, 0: nothing to undo",
            &[KEY, ArgDoc::new(c"id", ArgType::String)]],
        ["rlock.pttl", commands::pttl, "readonly fast",
            KEY_RO | KEY_ACCESS, 2,
            "Remaining lease in ms; -2: no lock, -1: no expiry",
            &[KEY]],
        ["rlock.info", commands::info, "readonly fast",
            KEY_RO | KEY_ACCESS, 2,
            "A reentrant lock's owner, count (its holds), pttl (remaining lease in ms), waiters, token (the last fencing token) and queue_waits, queue_handoffs and queue_timeouts (since the queue formed); nil if free",
            &[KEY]],
        ["rlock.waiters", commands::waiters::rlock, "readonly",
            KEY_RO | KEY_ACCESS, -2,
            "The first COUNT (default 10, at most 1000) waiters of a reentrant lock in queue order: owner, ms waited, ms left, request id",
            &[KEY, COUNT], "O(COUNT)"],
        ["rwlock.acquire", commands::rw::acquire, "write deny-oom",
            KEY_RW | KEY_ACCESS | KEY_UPDATE, -5,
            "Acquires or re-enters a read-write lock's read or write hold; replies nil (with TOKEN, WRITE only: [1, token]) when held, else the remaining lease in ms (with TOKEN: [0, pttl])",
            &[KEY, OWNER, MODE, LEASE, WAIT, TOKEN, REQUEST, SESSION, GT]],
        ["rwlock.release", commands::rw::release, "write",
            KEY_RW | KEY_ACCESS | KEY_DELETE, -4,
            "Releases one read or write hold; 1: freed (or write hold ended), 0: still held, nil: no such hold",
            &[KEY, OWNER, MODE, REQUEST],
            "O(1) for WRITE; O(N) for READ, where N is the number of read holds of the lock"],
        ["rwlock.renew", commands::rw::renew, "write deny-oom",
            KEY_RW | KEY_UPDATE, -4,
            "Resets the lease of every hold of the owner (or, with READ|WRITE, of that side's holds only; with GT, never shortening one); 1: renewed, 0: holds nothing (on that side)",
            &[KEY, OWNER, LEASE, MODE.optional(), GT],
            "O(H) where H is the number of read holds of the owner"],
        ["rwlock.forcerelease", commands::rw::force_release, "write",
            KEY_RW | KEY_DELETE, 2,
            "Deletes a read-write lock whoever holds it and publishes its release",
            &[KEY]],
        ["rwlock.info", commands::rw::info, "readonly fast",
            KEY_RO | KEY_ACCESS, 2,
            "A read-write lock's mode, writer, write_count, readers (how many owners hold read), read_holds, pttl, waiting_readers, waiting_writers, token and queue_waits, queue_handoffs and queue_timeouts (since the queue formed); nil if free",
            &[KEY], "O(N) where N is the number of read holds of the lock"],
        ["rwlock.waiters", commands::waiters::rwlock, "readonly",
            KEY_RO | KEY_ACCESS, -2,
            "The first COUNT (default 10, at most 1000) waiters of a read-write lock in queue order: owner, mode, ms waited, ms left, request id",
            &[KEY, COUNT], "O(COUNT)"],
        ["rsem.setpermits", commands::sem::set_permits, "write deny-oom",
            KEY_RW | KEY_UPDATE, 3,
            "Sets a semaphore's permits if it does not exist; 1: set, 0: it exists",
            &[KEY, ArgDoc::new(c"permits", ArgType::Integer)]],
        ["rsem.addpermits", commands::sem::add_permits, "write deny-oom",
            KEY_RW | KEY_UPDATE, 3,
            "Adds (or, negative, takes away) permits; replies the new count",
            &[KEY, ArgDoc::new(c"delta", ArgType::Integer)]],
        ["rsem.acquire", commands::sem::acquire, "write deny-oom",
            KEY_RW | KEY_ACCESS | KEY_UPDATE, -3,
            "Takes permits; 1 (or, with LEASE, their ids): taken, 0 (nil): not enough or WAIT timed out",
            &[KEY, ArgDoc::new(c"permits", ArgType::Integer),
              LEASED, WAIT, SEM_REQUEST],
            "O(1); with LEASE, O(P log N) where P is the number of permits taken and N the number of leased permits; plus O(log N) for each ended lease put back (at most 10000)"],
        ["rsem.release", commands::sem::release, "write deny-oom",
            KEY_RW | KEY_UPDATE, -3,
            "Gives permits back, or leased permits by ID; replies the count left, or how many ids were released",
            &[KEY, SEM_RELEASED],
            "O(1); with ID, O(K log N) where K is the number of ids and N the number of leased permits; plus O(log N) for each ended lease put back (at most 10000)"],
        ["rsem.renew", commands::sem::renew, "write deny-oom",
            KEY_RW | KEY_UPDATE, 4,
            "Gives a leased permit a new lease; 1: renewed, 0: no such live permit",
            &[KEY, ArgDoc::new(c"id", ArgType::String), LEASE],
            "O(log N) where N is the number of leased permits; plus O(log N) for each ended lease put back (at most 10000)"],
        ["rsem.available", commands::sem::available, "readonly fast",
            KEY_RO | KEY_ACCESS, 2,
            "Available permits (0 when the semaphore is missing)",
            &[KEY], "O(log N) where N is the number of leased permits"],
        ["rsem.info", commands::sem::info, "readonly fast",
            KEY_RO | KEY_ACCESS, 2,
            "A semaphore's available and leased permits, next_expiry_ms (-1: no lease), waiters, waiting_permits (what they ask for) and queue_waits, queue_handoffs and queue_timeouts (since the queue formed); nil if missing",
            &[KEY], "O(log N) where N is the number of leased permits"],
        ["rsem.waiters", commands::waiters::rsem, "readonly",
            KEY_RO | KEY_ACCESS, -2,
            "The first COUNT (default 10, at most 1000) waiters of a semaphore in queue order: permits, leased or not, ms waited, ms left, request id",
            &[KEY, COUNT], "O(COUNT)"],
        ["rlatch.setcount", commands::latch::set_count, "write deny-oom",
            KEY_RW | KEY_UPDATE, 3,
            "Sets a count-down latch's count if it does not exist (and publishes 1); 1: set, 0: it exists",
            &[KEY, ArgDoc::new(c"count", ArgType::Integer)]],
        ["rlatch.countdown", commands::latch::count_down, "write",
            KEY_RW | KEY_ACCESS | KEY_DELETE, -2, // as LPOP: may delete
            "Counts a latch down by amount (default 1), never below zero; at zero deletes it, publishes 0 and answers every awaiter; replies the count left",
            &[KEY, ArgDoc::new(c"amount", ArgType::Integer).optional()],
            "O(1); O(N) when it opens the latch, where N is the number of awaiters"],
        ["rlatch.count", commands::latch::count, "readonly fast",
            KEY_RO | KEY_ACCESS, 2,
            "A latch's remaining count (0 when it is missing: open)",
            &[KEY]],
        ["rlatch.delete", commands::latch::delete, "write",
            KEY_RW | KEY_DELETE, 2,
            "Deletes a latch (publishing 1, as Redisson) and answers every awaiter; 1: deleted, 0: it was missing",
            &[KEY], "O(N) where N is the number of awaiters"],
        ["rlatch.await", commands::latch::await_open, "readonly",
            KEY_RO | KEY_ACCESS, 3,
            "Waits in the server until the latch is open (its count at zero, or the key deleted); 1: open, 0: timed out (timeout-ms 0: no limit)",
            &[KEY, ArgDoc::new(c"timeout-ms", ArgType::Integer)]],
    ],
    // No keyspace event handlers: a lock freed outside rlock's commands is found by the waiters'
    // poll (`waiting`), so loading the module costs other workloads' DEL and expiry nothing.
    // `CONFIG SET rlock.min-replicas 0`, or `loadmodule librlock.so min-replicas 1`.
    configurations: [
        i64: [
            // -1: one replica in sync once one has been online; 0: off; n: n replicas.
            ["min-replicas", &replicas::MIN_REPLICAS, -1, -1, 1_000, ConfigurationFlags::DEFAULT, None],
            // Seconds since a replica's last acknowledgement for it to count as in sync.
            ["replica-max-lag", &replicas::MAX_LAG, 2, 1, 3_600, ConfigurationFlags::DEFAULT, None],
            // A gap this long between two replica checks (ms) is a stall: quarantine. Keep it at
            // or below Sentinel's down-after-milliseconds.
            ["stall-ms", &replicas::STALL, 1_500, 100, 60_000, ConfigurationFlags::DEFAULT, None],
        ],
        string: [],
        bool: [],
        enum: [],
        module_args_as_configuration: true,
    ]
}
