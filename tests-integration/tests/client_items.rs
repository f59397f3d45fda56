//! The Rust client's regression tests of issue 24, one per item it reproduced on a real server
//! (the drops, items 9, 10, 11 and the drop half of 6, are in `client_drops.rs`):
//!
//! - `rw`: mutual exclusion of read-write locks (items 1, 2, 3): a guard that outlived its grant
//!   never joins or renews the same owner's hold on the *other* side;
//! - `permits`: permits never lost (items 4, 5, 7 and the release half of 6): a grant racing a
//!   dropped acquire, a wait cancelled while the server is stalled, a release after a killed
//!   connection, `try_acquire(.., ZERO)`;
//! - `deadlines`: the loss signal and every call bounded by its deadline (items 8, 12);
//! - `handles`: MultiLock/RedLock guards tied to their grant, and what item 14 left open (an ACL
//!   user without `COMMAND`, `hold_count` on a wrong type, a zero lease).
//!
//! Every test names its item. "Permits conserved" means available + held = total, read on the
//! server (`RSEM.INFO`), with nothing held by the test at the time it is read.

#[path = "client_items/deadlines.rs"]
mod deadlines;
#[path = "client_items/handles.rs"]
mod handles;
#[path = "client_items/permits.rs"]
mod permits;
#[path = "client_items/rw.rs"]
mod rw;

use std::time::Duration;

use redis::Value;
use rlock_client::{LockClient, Options};
use rlock_tests_integration::{hgetall, poll, Server};

/// How long anything the client does in the background (a give-back, a cancel) may take.
const LIMIT: Duration = Duration::from_secs(10);

/// A lease long enough that a hold it leaks is still there when the test looks.
const LONG: Duration = Duration::from_secs(60);

async fn client(server: &Server) -> LockClient {
    LockClient::open(server.url()).await.expect("client")
}

async fn client_with(server: &Server, options: Options) -> LockClient {
    LockClient::with_options(server.client(), options).await.expect("client")
}

/// The hash `name` (a lock or read-write lock) as text pairs, read on a connection of the test.
fn fields(server: &Server, name: &str) -> Vec<(String, String)> {
    hgetall(&mut server.conn(), name.as_bytes())
        .into_iter()
        .map(|(f, v)| {
            (String::from_utf8_lossy(&f).into_owned(), String::from_utf8_lossy(&v).into_owned())
        })
        .collect()
}

/// The value of field `field` of the hash `name`.
fn field(server: &Server, name: &str, field: &str) -> Option<String> {
    fields(server, name).into_iter().find(|(f, _)| f == field).map(|(_, v)| v)
}

/// Polls (blocking) until the key `name` is gone.
fn until_gone(server: &Server, name: &str, what: &str) {
    let mut con = server.conn();
    poll(what, LIMIT, || {
        let n: i64 = redis::cmd("EXISTS").arg(name).query(&mut con).expect("EXISTS");
        (n == 0).then_some(())
    });
}

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
    let info: Value = redis::cmd("RSEM.INFO").arg(name).query(&mut server.conn()).expect("INFO");
    let pairs = match info {
        Value::Nil => return (0, 0),
        Value::Array(items) => items,
        other => panic!("RSEM.INFO {name}: {other:?}"),
    };
    let get = |wanted: &str| {
        pairs
            .chunks(2)
            .find_map(|kv| match kv {
                [Value::BulkString(k), Value::Int(v)] if k == wanted.as_bytes() => Some(*v),
                [Value::SimpleString(k), Value::Int(v)] if k == wanted => Some(*v),
                _ => None,
            })
            .unwrap_or_else(|| panic!("RSEM.INFO {name} has no {wanted}: {pairs:?}"))
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
