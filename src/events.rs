//! What the server tells the module, outside commands: keyspace events, flushes, `SWAPDB`, slot
//! migrations, the cron tick (replica checks), loading from disk, role changes, and the
//! `INFO rlock` sections. Each event only records or defers work: module code must not write
//! inside them, so the writing is done on a timer by `waiting`.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};

use redis_module::server_events::{FlushSubevent, LoadingSubevent, ServerRole};
use redis_module::{Context, InfoContext, NotifyEvent, RedisResult};

use crate::names::HOLD_INFIX;
use crate::queue::LockName;
use crate::raw::{self, events::ServerEvents};
use crate::replicas;
use crate::waiting::{self, timers::defer, STATS};

/// Keyspace events (in the `redis_module!` table): a lock with waiters that was deleted,
/// expired or evicted is handed off on a 0 ms timer; a read-write lock whose read hold another
/// client created is checked when that hold ends.
pub fn on_keyspace_event(ctx: &Context, _event: NotifyEvent, name: &str, key: &[u8]) {
    let db = raw::selected_db(ctx);
    keep_the_clients_database(ctx, name, db);
    // The module's own notifications (its writes hand off themselves) are not news.
    if raw::notifying() {
        return;
    }
    // Another client (a Redisson reader) gave a read hold a lease: its read-write lock is looked
    // at, so the hold is reaped when it ends.
    if name == "expire" && key.windows(HOLD_INFIX.len()).any(|w| w == HOLD_INFIX) {
        defer(ctx, |d| d.read_holds.push(LockName { db, key: key.to_vec() }));
    }
    if !waiting::anyone_waits() {
        return;
    }
    // Counted as waiting when the queues are in use: this event fired inside the module's own
    // work, so settle anyway.
    if waiting::waiting(db, key) > 0 {
        defer(ctx, |d| d.settle.push(LockName { db, key: key.to_vec() }));
    }
}

/// Valkey 8.1 (valkey PR #1819, until #4024) runs keyspace subscribers on the client executing
/// the command, after selecting the event's database on it, and never selects the client's own
/// back: with any module subscribed, a `MOVE` left its client in the destination database.
/// `MOVE` notifies `move_from` (in the client's database) just before `move_to`: select that
/// database back then. Elsewhere the context's client is a temporary one and this is harmless.
fn keep_the_clients_database(ctx: &Context, event: &str, db: i32) {
    thread_local! {
        static MOVED_FROM: Cell<Option<i32>> = const { Cell::new(None) };
    }
    match event {
        "move_from" => MOVED_FROM.set(Some(db)),
        "move_to" => {
            if let Some(from) = MOVED_FROM.take() {
                raw::select_db(ctx, from);
            }
        }
        _ => {}
    }
}

#[linkme::distributed_slice(redis_module::server_events::FLUSH_SERVER_EVENTS_LIST)]
fn on_flush(ctx: &Context, subevent: FlushSubevent) {
    if subevent == FlushSubevent::Ended && waiting::anyone_waits() {
        defer(ctx, |d| d.settle_all = true);
    }
}

/// The server events subscribed through `raw::events`.
pub struct Events;

impl ServerEvents for Events {
    /// `SWAPDB` moved whole databases: every lock with waiters is looked at again (handed off if
    /// its database no longer holds it, checked at its new holder's deadline otherwise).
    fn on_swapdb(ctx: &Context) {
        if waiting::anyone_waits() {
            defer(ctx, |d| d.settle_all = true);
        }
    }

    fn on_slots_moved(ctx: &Context) {
        waiting::cluster::on_slots_moved(ctx);
    }
}

/// Checks this master's replicas on every cron tick (`replicas`); when grants become allowed
/// again, the waiters held back meanwhile are served.
#[linkme::distributed_slice(redis_module::server_events::CRON_SERVER_EVENTS_LIST)]
fn on_cron(ctx: &Context, _: u64) {
    if !raw::is_master(ctx) {
        replicas::not_master();
        return;
    }
    let links: Vec<_> = raw::info::replica_lines(ctx)
        .unwrap_or_default()
        .iter()
        .filter_map(|line| replicas::parse_link(line))
        .collect();
    if replicas::record_check(raw::now_ms(), &links) && waiting::anyone_waits() {
        defer(ctx, |d| d.settle_all = true);
    }
}

/// A master loaded its data from disk (a restart): grants the last fsync missed may be lost,
/// so tokens from now on start above any this server issued before (`replicas`).
#[linkme::distributed_slice(redis_module::server_events::LOADING_SERVER_EVENTS_LIST)]
fn on_loading(ctx: &Context, subevent: LoadingSubevent) {
    thread_local! {
        static FROM_DISK: Cell<bool> = const { Cell::new(false) };
    }
    match subevent {
        LoadingSubevent::RdbStarted | LoadingSubevent::AofStarted => FROM_DISK.set(true),
        LoadingSubevent::ReplStarted => FROM_DISK.set(false),
        LoadingSubevent::Ended => {
            if FROM_DISK.replace(false) && raw::is_master(ctx) {
                replicas::raise_token_floor(raw::now_ms());
            }
        }
        LoadingSubevent::Failed => FROM_DISK.set(false),
    }
}

/// Promoted: tokens from now on are above any the old master issued, and the new master
/// starts with no replicas seen. Demoted to a replica: every waiter gets an error.
#[linkme::distributed_slice(redis_module::server_events::ROLE_CHANGED_SERVER_EVENTS_LIST)]
fn on_role_changed(ctx: &Context, role: ServerRole) {
    raw::note_replication();
    replicas::not_master();
    if role == ServerRole::Primary {
        replicas::raise_token_floor(raw::now_ms());
    } else {
        waiting::demoted(ctx);
    }
}

#[linkme::distributed_slice(redis_module::server_events::INFO_COMMAND_HANDLER_LIST)]
fn info(ctx: &InfoContext, _for_crash_report: bool) -> RedisResult<()> {
    let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
    let (required, in_sync, allowed, refused) = replicas::summary(raw::now_ms());
    let (server, capabilities) = crate::server::get()
        .map_or_else(|| (String::new(), String::new()), |s| (s.describe(), s.capabilities()));
    ctx.builder()
        .add_section("waits")
        .field("waiting_clients", waiting::total_waiting().to_string())?
        .field("waits", get(&STATS.waits).to_string())?
        .field("handoffs", get(&STATS.handoffs).to_string())?
        .field("timeouts", get(&STATS.timeouts).to_string())?
        .field("left_while_waiting", get(&STATS.left).to_string())?
        .field("grants_rolled_back", get(&STATS.rollbacks).to_string())?
        .field("dead_reader_reaps", get(&STATS.reaps).to_string())?
        .field("timers_armed", waiting::timers_armed().to_string())?
        .build_section()?
        .add_section("replicas")
        .field("replicas_required", required.to_string())?
        .field("replicas_in_sync", in_sync.to_string())?
        .field("grants_allowed", u8::from(allowed).to_string())?
        .field("grants_refused", refused.to_string())?
        .field("token_floor", replicas::token_floor().to_string())?
        .build_section()?
        .add_section("server")
        .field("server", server)?
        .field("capabilities", capabilities)?
        .build_section()?
        .build_info()?;
    Ok(())
}
