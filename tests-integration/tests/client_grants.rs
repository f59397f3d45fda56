//! The Rust client's guards stand for exactly the grant the server made them for, on a real
//! server:
//!
//! - `permits`: no permit is ever lost: a grant racing a dropped acquire, a wait cancelled while
//!   the server is stalled, a release after a killed connection, `try_acquire(.., ZERO)`;
//! - `deadlines`: a guard's deadline is the longest lease the server confirmed, and every call
//!   returns by its deadline, a stalled server included;
//! - `handles`: MultiLock/RedLock guards tied to their grant, an ACL user without `COMMAND`,
//!   `hold_count` on a key of another type, a zero lease.
//!
//! What a read-write lock's guards hold through the other side is in `client_rwlock.rs`; guards
//! dropped without `release()` are in `client_drops.rs`. "Permits conserved" means available +
//! held = total, read on the server (`RSEM.INFO`), with nothing held by the test at the time it
//! is read.

#[path = "client_grants/deadlines.rs"]
mod deadlines;
#[path = "client_grants/handles.rs"]
mod handles;
#[path = "client_grants/permits.rs"]
mod permits;

use std::time::Duration;

use redis::Value;
use rlock_tests_integration::{rsem_info, Server};

/// How long anything the client does in the background (a give-back, a cancel) may take.
const LIMIT: Duration = Duration::from_secs(10);

/// A lease long enough that a hold it leaks is still there when the test looks.
const LONG: Duration = Duration::from_secs(60);

/// `CLIENT KILL TYPE normal`: every normal connection but the one asking.
fn kill_normal(server: &Server) {
    let _: Value = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("normal")
        .query(&mut server.conn())
        .expect("CLIENT KILL");
}

/// A semaphore's `(available, leased)` as the server counts them (`RSEM.INFO`; `(0, 0)` when it
/// does not exist).
fn permits(server: &Server, name: &str) -> (i64, i64) {
    let Some(info) = rsem_info(&mut server.conn(), name) else { return (0, 0) };
    let get = |wanted: &str| {
        *info.get(wanted).unwrap_or_else(|| panic!("RSEM.INFO {name} has no {wanted}: {info:?}"))
    };
    (get("available"), get("leased"))
}

/// Waits (at most [`LIMIT`]) until the semaphore `name` has all of its `total` permits back
/// (nothing leased, nothing missing from the count); the error names the state last seen.
fn conserved(server: &Server, name: &str, total: i64) -> Result<(), String> {
    let until = std::time::Instant::now() + LIMIT;
    loop {
        let (available, leased) = permits(server, name);
        if available == total && leased == 0 {
            return Ok(());
        }
        if std::time::Instant::now() >= until {
            return Err(format!(
                "after {LIMIT:?} the semaphore {name} has {available} available and {leased} \
                 leased of {total}, with nothing held by the test: {} permit(s) lost",
                total - available
            ));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// [`conserved`], or a failure naming `what`.
fn until_conserved(server: &Server, name: &str, total: i64, what: &str) {
    if let Err(e) = conserved(server, name, total) {
        panic!("{what}: {e}");
    }
}

/// `RSEM.RELEASE name ID ..` of the ids an `RSEM.ACQUIRE ... LEASE` answered; how many it released.
fn release_ids(con: &mut redis::Connection, name: &str, granted: &Value) -> i64 {
    let ids: Vec<Vec<u8>> = redis::from_redis_value(granted.clone()).expect("permit ids");
    let mut release = redis::cmd("RSEM.RELEASE");
    release.arg(name).arg("ID").arg(ids);
    release.query(con).expect("RSEM.RELEASE ID")
}
