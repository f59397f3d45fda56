//! A server whose module may be unloaded, and the module's idle state read from `INFO rlock`
//! (no timer armed, no check scheduled, no client waiting): what the unload and timer tests
//! share.

use std::time::Duration;

use redis::{Connection, Value};

use crate::helpers::{cmd, info_field, poll};
use crate::server::Server;

/// How long the module may take to disarm its last timer.
const IDLE_LIMIT: Duration = Duration::from_secs(20);

/// A server started with `enable-module-command yes` (so a test may `MODULE UNLOAD` / `LOAD`).
#[must_use]
pub fn unloadable_server() -> Server {
    Server::builder().config("enable-module-command", "yes").start()
}

/// The module's timers armed (`rlock_timers_armed`).
#[must_use]
pub fn timers_armed(con: &mut Connection) -> i64 {
    info_field(con, "rlock", "rlock_timers_armed")
}

/// The clients waiting in the module (`rlock_waiting_clients`).
#[must_use]
pub fn waiting_clients(con: &mut Connection) -> i64 {
    info_field(con, "rlock", "rlock_waiting_clients")
}

/// Idle (no timer armed, no check scheduled, polled with a bound) and the module unloads.
///
/// # Panics
/// When a timer stays armed, a check is scheduled, or the unload is refused.
pub fn assert_idle_and_unload(con: &mut Connection) {
    poll("no module timer armed", IDLE_LIMIT, || (timers_armed(con) == 0).then_some(()));
    assert_eq!(info_field(con, "rlock", "rlock_scheduled_checks"), 0);
    assert_eq!(cmd(con, &["MODULE", "UNLOAD", "rlock"]), Value::Okay);
}
