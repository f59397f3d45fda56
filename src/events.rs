//! What the server tells the module, outside commands: flushes, `SWAPDB`, slot migrations, the
//! cron tick (replica checks), loading from disk, role changes, and the `INFO rlock` sections.
//! Each event only records or defers work: module code must not write inside them, so the
//! writing is done on a timer by `waiting`. No keyspace events: with a subscriber, Redis builds a
//! module context for every `DEL` and expiry of every key; `waiting` polls its locks instead.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};

use redis_module::server_events::{LoadingSubevent, ServerRole};
use redis_module::{Context, InfoContext, RedisResult};

use crate::queue::WAIT_BUCKETS_MS;
use crate::raw::{self, events::ServerEvents};
use crate::replicas::{self, RecordNews};
use crate::waiting::{self, schedule::defer, STATS};

/// The server events subscribed through `raw::events`.
pub struct Events;

impl ServerEvents for Events {
    /// `SWAPDB` moved whole databases: every lock with waiters is looked at again (handed off if
    /// its database no longer holds it, checked at its new holder's deadline otherwise); grants
    /// waiting to be undone follow their data to its new database.
    fn on_swapdb(ctx: &Context, first: i32, second: i32) {
        waiting::schedule::swapped(first, second);
        waiting::session::swapped(first, second);
        waiting::swap_checks(first, second);
        if waiting::anyone_waits() {
            defer(ctx, |d| d.settle_all = true);
        }
    }

    /// A flush emptied database `db` (-1: all): its locks' own checks and session bindings are
    /// dropped (their keys are gone: nothing is left to reap or reclaim, and the names are not
    /// kept until the old deadlines), set aside for a reload that brings the data back
    /// (`waiting::lifecycle`), and every lock with waiters is looked at again.
    fn on_flushed(ctx: &Context, db: i32) {
        waiting::lifecycle::flushed(ctx, (db >= 0).then_some(db));
        if waiting::anyone_waits() {
            defer(ctx, |d| d.settle_all = true);
        }
    }

    fn on_slots_moved(ctx: &Context) {
        waiting::cluster::on_slots_moved(ctx);
    }

    /// A connection closed: its session holds end (on the module's timer).
    fn on_client_closed(ctx: &Context, id: u64) {
        waiting::session::client_closed(ctx, id);
    }
}

/// Checks this master's replicas on every cron tick (`replicas`); when grants become allowed
/// again, the waiters held back meanwhile are served.
#[linkme::distributed_slice(redis_module::server_events::CRON_SERVER_EVENTS_LIST)]
fn on_cron(ctx: &Context, _: u64) {
    // Between commands: a flush's set-aside memory was not a reload's.
    waiting::lifecycle::settled();
    if !raw::is_master(ctx) {
        replicas::not_master();
        return;
    }
    waiting::session::prune(raw::now_ms());
    let links: Vec<_> = raw::info::replica_lines(ctx)
        .unwrap_or_default()
        .iter()
        .filter_map(|line| replicas::parse_link(line))
        .collect();
    if replicas::record_check(raw::now_ms(), &links) && waiting::anyone_waits() {
        defer(ctx, |d| d.settle_all = true);
    }
    match replicas::keep_record(raw::now_ms()) {
        RecordNews::Nothing => {}
        RecordNews::Written(path, count) => ctx.log_notice(&format!(
            "rlock: this master has had replicas: wrote {} ({count} online; a restart here \
             grants nothing for rlock.replica-max-lag + 1.5 s, nor until {count} are in sync \
             again; delete the file to run the server standalone)",
            path.display()
        )),
        RecordNews::Counted(path, count) => ctx.log_notice(&format!(
            "rlock: {} now counts {count} replica(s) online (a restart here needs {count} in \
             sync again)",
            path.display()
        )),
        RecordNews::WriteFailed(path, e) => ctx.log_warning(&format!(
            "rlock: cannot write {} ({e}): a restart will not remember that this master has \
             had replicas, or how many",
            path.display()
        )),
        RecordNews::Found(path, count) => {
            ctx.log_warning(&replicas::found_message(&path, count));
        }
        RecordNews::Deleted(path) => ctx.log_notice(&format!(
            "rlock: {} was deleted: this master runs standalone until a replica is online",
            path.display()
        )),
    }
}

/// A setting changed (`CONFIG SET`): the ones the store's writes depend on are read again.
#[linkme::distributed_slice(redis_module::server_events::CONFIG_CHANGED_SERVER_EVENTS_LIST)]
fn on_config_changed(ctx: &Context, names: &[&str]) {
    crate::store::settings::refresh(ctx, Some(names));
}

/// A master loaded its data from disk (a restart): grants the last fsync missed may be lost,
/// so tokens from now on start above any this server issued before (`replicas`), and its leased
/// semaphores and read-write locks get the lease checks the file does not hold
/// (`waiting::promotion`). A load right after a flush (`DEBUG RELOAD`, `DEBUG LOADAOF`) gets
/// back the memory the flush dropped.
#[linkme::distributed_slice(redis_module::server_events::LOADING_SERVER_EVENTS_LIST)]
fn on_loading(ctx: &Context, subevent: LoadingSubevent) {
    thread_local! {
        static FROM_DISK: Cell<bool> = const { Cell::new(false) };
    }
    match subevent {
        LoadingSubevent::RdbStarted | LoadingSubevent::AofStarted => {
            FROM_DISK.set(true);
            waiting::lifecycle::loading_started();
        }
        LoadingSubevent::ReplStarted => {
            FROM_DISK.set(false);
            waiting::lifecycle::not_reloaded();
        }
        LoadingSubevent::Ended => {
            if FROM_DISK.replace(false) && raw::is_master(ctx) {
                replicas::raise_token_floor(raw::now_ms());
                waiting::lifecycle::loaded(ctx);
                waiting::promotion::loaded(ctx);
            } else {
                waiting::lifecycle::not_reloaded();
            }
        }
        LoadingSubevent::Failed => {
            FROM_DISK.set(false);
            waiting::lifecycle::not_reloaded();
        }
    }
}

/// Promoted: tokens from now on are above any the old master issued, the new master starts
/// with no replicas seen, and its leased semaphores and read-write locks get the lease checks
/// the old master had (`waiting::promotion`). Demoted to a replica: every waiter gets an error.
#[linkme::distributed_slice(redis_module::server_events::ROLE_CHANGED_SERVER_EVENTS_LIST)]
fn on_role_changed(ctx: &Context, role: ServerRole) {
    raw::note_replication();
    replicas::not_master();
    if role == ServerRole::Primary {
        replicas::raise_token_floor(raw::now_ms());
        waiting::promotion::promoted(ctx);
    } else {
        waiting::demoted(ctx);
    }
}

#[linkme::distributed_slice(redis_module::server_events::INFO_COMMAND_HANDLER_LIST)]
fn info(ctx: &InfoContext, _for_crash_report: bool) -> RedisResult<()> {
    let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
    let guard = replicas::summary(raw::now_ms());
    let (server, capabilities) = crate::server::get()
        .map_or_else(|| (String::new(), String::new()), |s| (s.describe(), s.capabilities()));
    let builder = ctx
        .builder()
        .add_section("waits")
        .field("waiting_clients", waiting::total_waiting().to_string())?
        .field("waits", get(&STATS.waits).to_string())?
        .field("handoffs", get(&STATS.handoffs).to_string())?
        .field("timeouts", get(&STATS.timeouts).to_string())?
        .field("left_while_waiting", get(&STATS.left).to_string())?
        .field("grants_rolled_back", get(&STATS.rollbacks).to_string())?
        .field("dead_reader_reaps", get(&STATS.reaps).to_string())?
        .field("latch_opens", get(&STATS.latch_opens).to_string())?
        .field("latch_releases", get(&STATS.latch_releases).to_string())?
        .field("timers_armed", waiting::timers_armed().to_string())?
        .field("scheduled_checks", waiting::scheduled_checks().to_string())?
        .field("timer_work", get(&STATS.timer_work).to_string())?
        .field("timer_ticks_split", get(&STATS.ticks_split).to_string())?
        .build_section()?;
    let times = waiting::listing::wait_times();
    let mut builder = builder.add_section("wait_times");
    for (bound, count) in WAIT_BUCKETS_MS.iter().zip(times.le) {
        builder = builder.field(&format!("wait_ms_le_{bound}"), count.to_string())?;
    }
    builder
        .field("wait_ms_le_inf", times.count.to_string())?
        .field("wait_ms_count", times.count.to_string())?
        .field("wait_ms_sum", times.sum_ms.to_string())?
        .build_section()?
        .add_section("replicas")
        .field("replicas_required", guard.required.to_string())?
        .field("replicas_in_sync", guard.in_sync.to_string())?
        .field("replicas_before_restart", guard.before_restart.to_string())?
        .field("grants_allowed", u8::from(guard.refusing.is_none()).to_string())?
        .field("guard_refuses", guard.refusing.map_or("none", replicas::Refused::name))?
        .field("grants_refused", guard.refused.to_string())?
        .field("stall_threshold_ms", replicas::stall_ms().to_string())?
        .field("token_floor", replicas::failover_floor().to_string())?
        .field(
            "had_replicas_file",
            replicas::record_path().map(|p| p.display().to_string()).unwrap_or_default(),
        )?
        .build_section()?
        .add_section("sessions")
        .field("session_holds", waiting::session::bound().to_string())?
        .field("session_ends", get(&waiting::session::SESSION_STATS.ends).to_string())?
        .field("lock_delays", get(&waiting::session::SESSION_STATS.delays).to_string())?
        .build_section()?
        .add_section("server")
        .field("version", crate::version::VERSION)?
        .field("git_sha", crate::version::COMMIT)?
        .field("server", server)?
        .field("capabilities", capabilities)?
        .build_section()?
        .build_info()?;
    Ok(())
}
