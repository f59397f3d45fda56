//! What a flush does to the module's memory of holds, and how a reload gets it back.
//!
//! A flush (`FLUSHALL`, `FLUSHDB`) empties databases: the session bindings, the ends waiting to
//! be applied and the locks' own checks of those databases go with their data. But
//! `DEBUG RELOAD` and `DEBUG LOADAOF` fire the same flush event, then load the data back within
//! the same command: dropping that memory for good would leave the reloaded holds to end only
//! with their leases (a session hold surviving its connection's close, a permit's reclaim or a
//! dead reader's reap never scheduled). So a flush sets what it dropped aside; a load from disk
//! that starts before the server runs anything else (the reload's), or inside which the flush
//! happens (Valkey 9 empties the data once the file's header is read), brings it back when it
//! ends, and otherwise it is discarded at the next cron tick (the server's event loop runs
//! neither the cron nor timers while a command, and the reload inside it, runs).

use std::cell::{Cell, RefCell};

use redis_module::Context;

use super::schedule::{forget_checks, schedule_check};
use super::session;
use crate::queue::LockName;
use crate::sessions::Dropped;

/// What the last flush dropped.
struct SetAside {
    sessions: Dropped,
    checks: Vec<(LockName, i64)>,
    /// A load from disk started since the flush.
    loading: bool,
}

thread_local! {
    static SET_ASIDE: RefCell<Option<SetAside>> = const { RefCell::new(None) };
    /// A load from disk is under way.
    static LOADING: Cell<bool> = const { Cell::new(false) };
}

/// Database `db` (`None`: every database) was flushed: its bindings, pending ends and checks
/// go, set aside in case a load brings the data back (replacing whatever an earlier flush set
/// aside: that one was not a reload's).
pub fn flushed(ctx: &Context, db: Option<i32>) {
    let checks = forget_checks(ctx, db);
    let sessions = session::flushed(db);
    let aside = (!checks.is_empty() || !sessions.is_empty()).then_some(SetAside {
        sessions,
        checks,
        loading: LOADING.get(),
    });
    SET_ASIDE.with(|s| *s.borrow_mut() = aside);
}

/// A load from disk (RDB or AOF) started.
pub fn loading_started() {
    LOADING.set(true);
    SET_ASIDE.with(|s| {
        if let Some(aside) = s.borrow_mut().as_mut() {
            aside.loading = true;
        }
    });
}

/// A load from disk ended on a master: if it followed a flush (a reload), what the flush set
/// aside comes back: the bindings (each end still checks that its hold is there and is the one
/// bound, by owner or permit id and lease end), the pending ends, and the checks.
pub fn loaded(ctx: &Context) {
    LOADING.set(false);
    let Some(aside) = SET_ASIDE.with(|s| s.borrow_mut().take()) else { return };
    if !aside.loading {
        return;
    }
    session::restore(ctx, aside.sessions);
    for (lock, at) in &aside.checks {
        schedule_check(ctx, lock, *at);
    }
}

/// No reload followed the flush (the cron ticks between commands), or a load failed, or the
/// server is no longer a master: what the flush set aside is dropped for good.
pub fn settled() {
    SET_ASIDE.with(|s| {
        if let Ok(mut s) = s.try_borrow_mut() {
            s.take();
        }
    });
}

/// A load ended that brings nothing back (it failed, it was a replica's sync, or the server is
/// not a master): what a flush set aside is dropped for good.
pub fn not_reloaded() {
    LOADING.set(false);
    settled();
}
