//! Pieces the live fuzz runs share: their length, blocking waiters on their own connections,
//! and the end-of-run comparison of a module-less replica with the master.

use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use redis::{Connection, Value};

use crate::{digest, poll, run, Server};

/// The run's length: `RLOCK_FUZZ_STEPS`, else `default`.
#[must_use]
pub fn fuzz_steps(default: usize) -> usize {
    std::env::var("RLOCK_FUZZ_STEPS").ok().and_then(|s| s.parse().ok()).unwrap_or(default)
}

/// A blocking command (`... WAIT timeout`) on its own connection and thread: its one reply,
/// then the reply to a `PING` sent after it (`PONG` unless a second reply was queued).
pub struct BlockedCall {
    /// The connection's client id (`CLIENT KILL ID`, `CLIENT UNBLOCK`).
    pub id: i64,
    /// The command sent.
    pub args: Vec<String>,
    /// When it was sent.
    pub started: Instant,
    thread: JoinHandle<(Result<Value, String>, Result<Value, String>)>,
}

impl BlockedCall {
    /// Sends `args` on a new connection of `server` (read timeout `limit`) from a new thread.
    ///
    /// # Panics
    /// When the connection cannot be made.
    #[must_use]
    pub fn start(server: &Server, args: Vec<String>, limit: Duration) -> Self {
        let mut con = server.conn();
        con.set_read_timeout(Some(limit)).expect("timeout");
        let id: i64 = redis::cmd("CLIENT").arg("ID").query(&mut con).expect("CLIENT ID");
        let sent = args.clone();
        let thread = thread::spawn(move || {
            let argv: Vec<&[u8]> = sent.iter().map(|a| a.as_bytes()).collect();
            let reply = run(&mut con, &argv);
            let ping = run(&mut con, &[b"PING"]);
            (reply, ping)
        });
        Self { id, args, started: Instant::now(), thread }
    }

    /// Whether its reply (and the `PING` after it) came.
    #[must_use]
    pub fn finished(&self) -> bool {
        self.thread.is_finished()
    }

    /// Its reply and the `PING`'s, waiting at most `limit`.
    ///
    /// # Panics
    /// When they do not come within `limit` (naming `at`).
    pub fn join(self, limit: Duration, at: &str) -> (Result<Value, String>, Result<Value, String>) {
        let what = format!("{at}: the reply of {:?} (client {})", self.args, self.id);
        poll(&what, limit, || self.finished().then_some(()));
        self.thread.join().expect("waiter thread")
    }
}

/// Every key of the current database of `con`.
///
/// # Panics
/// When `KEYS` fails.
#[must_use]
pub fn all_keys(con: &mut Connection) -> Vec<Vec<u8>> {
    let mut keys: Vec<Vec<u8>> = redis::cmd("KEYS").arg("*").query(con).expect("KEYS");
    keys.sort();
    keys
}

/// Makes every key of db 0 permanent, then waits (at most `limit`) until `replica` has the
/// master's `DEBUG DIGEST` and the same `DUMP` of every key. `at` names the run in failures.
///
/// # Panics
/// When they still differ after `limit`.
pub fn assert_replica_matches(master: &Server, replica: &Server, limit: Duration, at: &str) {
    let (mut m, mut r) = (master.conn(), replica.conn());
    for key in all_keys(&mut m) {
        let _: Value = redis::cmd("PERSIST").arg(key).query(&mut m).expect("PERSIST");
    }
    let acked: i64 = redis::cmd("WAIT").arg(1).arg(10_000).query(&mut m).expect("WAIT");
    assert_eq!(acked, 1, "{at}: the replica acknowledged");
    let until = Instant::now() + limit;
    loop {
        let keys = all_keys(&mut m);
        let same_keys = all_keys(&mut r) == keys;
        let mut dumps_differ: Vec<String> = Vec::new();
        for k in &keys {
            let a: Value = redis::cmd("DUMP").arg(k).query(&mut m).expect("DUMP");
            let b: Value = redis::cmd("DUMP").arg(k).query(&mut r).expect("DUMP");
            if a != b {
                dumps_differ.push(format!("{}: {a:?} / {b:?}", String::from_utf8_lossy(k)));
            }
        }
        let (dm, dr) = (digest(&mut m), digest(&mut r));
        if same_keys && dumps_differ.is_empty() && dm == dr {
            return;
        }
        assert!(
            Instant::now() < until,
            "{at}: the module-less replica differs from the master: digests {dm} / {dr}, \
             same keys {same_keys}, DUMP differs for {dumps_differ:?}"
        );
        thread::sleep(Duration::from_millis(20));
    }
}
