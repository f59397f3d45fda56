//! What the session tests share (holds bound to a connection): the `INFO rlock` session
//! counters, and a process of its own that a test kills as a crashed worker.

use std::process::Child;
use std::time::Duration;

use redis::Connection;

use crate::{client_id, cmd, exists, info_field, kill_client, poll, Server};

/// Session holds bound now (`INFO rlock`'s `rlock_session_holds`).
#[must_use]
pub fn session_holds(con: &mut Connection) -> i64 {
    info_field(con, "rlock", "rlock_session_holds")
}

/// Holds ended so far because their session closed (`INFO rlock`'s `rlock_session_ends`).
#[must_use]
pub fn session_ends(con: &mut Connection) -> i64 {
    info_field(con, "rlock", "rlock_session_ends")
}

/// A process of its own, killed (SIGKILL) and reaped when dropped.
pub struct Process(pub Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Closes a fresh session hold on its own lock (`barrier`) and waits until its end was applied:
/// every close before it was processed by then (ends are applied in the order the closes came).
///
/// # Panics
/// When the end does not come within 10 s.
pub fn barrier(server: &Server, admin: &mut Connection) {
    let mut con = server.conn();
    let id = client_id(&mut con);
    cmd(&mut con, &["RLOCK.ACQUIRE", "barrier", "b", "60000", "SESSION"]);
    kill_client(admin, id);
    let limit = Duration::from_secs(10);
    poll("the barrier's end", limit, || (!exists(admin, "barrier")).then_some(()));
}
