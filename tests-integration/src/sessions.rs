//! What the session tests share (issue 27 §1): the `INFO rlock` session counters, and a
//! process of its own that a test kills as a crashed worker.

use std::process::Child;

use redis::Connection;

use crate::info_field;

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
