//! Hostile round h3: what a module-less replica holds after lock writes replicated whole
//! (`RESTORE ... REPLACE ABSTTL`), against the master's own encoding of the same hash.

use redis::{Connection, Value};
use rlock_tests_integration::{cmd, pexpiretime, poll, wait_link_up, Server};
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(10);

/// A key as compared: encoding, `DEBUG DIGEST-VALUE`, `PEXPIRETIME`.
fn state(con: &mut Connection, key: &str) -> (String, Value, i64) {
    let encoding: String = redis::cmd("OBJECT").arg("ENCODING").arg(key).query(con).expect("ENC");
    let digest: Value =
        redis::cmd("DEBUG").arg("DIGEST-VALUE").arg(key).query(con).expect("DIGEST-VALUE");
    (encoding, digest, pexpiretime(con, key.as_bytes()))
}

/// Waits until the replica has run everything the master sent so far (a marker `INCR`).
fn synced(m: &mut Connection, r: &mut Connection) {
    let marker: i64 = redis::cmd("INCR").arg("marker").query(m).expect("INCR");
    poll("the marker on the replica", LIMIT, || {
        let got: Option<i64> = redis::cmd("GET").arg("marker").query(r).expect("GET");
        (got == Some(marker)).then_some(())
    });
}

/// A lock taken by an owner longer than `hash-max-listpack-value` is a hash table on the
/// master (and on the replica, which got `HSET`). The limit is then raised on both servers (to
/// let such owners go out whole, as docs/operations.md suggests) and the owner re-enters: the
/// master's hash stays a hash table, so the replica must not be sent a listpack. The
/// read-write lock scans its hash before it sends it whole; the reentrant lock must not send
/// a listpack for a hash it does not keep as one either.
#[test]
fn a_reentry_after_the_listpack_limit_was_raised_keeps_the_replica_s_encoding() {
    let master = Server::start();
    let replica = Server::builder().without_module().replica_of(&master).start();
    let (mut m, mut r) = (master.conn(), replica.conn());
    wait_link_up(&mut r);
    if rlock_tests_integration::valkey_major(&mut m).is_some() {
        // Valkey lends a small hash table's fields in one scan step: a hash table may go out
        // whole there (see store::whole), for both kinds of lock.
        return;
    }
    let long = "o".repeat(100);
    assert_eq!(cmd(&mut m, &["RLOCK.ACQUIRE", "L", &long, "60000"]), Value::Nil);
    assert_eq!(cmd(&mut m, &["RWLOCK.ACQUIRE", "W", &long, "WRITE", "60000"]), Value::Nil);
    synced(&mut m, &mut r);
    for con in [&mut m, &mut r] {
        cmd(con, &["CONFIG", "SET", "hash-max-listpack-value", "200"]);
    }
    assert_eq!(cmd(&mut m, &["RLOCK.ACQUIRE", "L", &long, "60000"]), Value::Nil);
    assert_eq!(cmd(&mut m, &["RWLOCK.ACQUIRE", "W", &long, "WRITE", "60000"]), Value::Nil);
    synced(&mut m, &mut r);
    for key in ["W", "L"] {
        let expected = state(&mut m, key);
        assert_eq!(expected.0, "hashtable", "{key} on the master");
        assert_eq!(state(&mut r, key), expected, "{key} on the module-less replica");
    }
}
