//! Exact cancellation (issue 24, part A): `REQUEST id` on every acquire (a retry replies the
//! first grant and adds nothing), `RLOCK.CANCEL key id` (gives a grant back, dequeues a waiter,
//! and makes sure the request never gets anything later), and the side-checked
//! `RWLOCK.RENEW key owner lease-ms READ|WRITE`.

use std::time::Duration;

use redis::{Connection, Value};
use rlock_tests_integration::{cmd, hgetall, pexpiretime, run_str, Server};

const LIMIT: Duration = Duration::from_secs(10);

fn exists(con: &mut Connection, key: &str) -> bool {
    redis::cmd("EXISTS").arg(key).query::<i64>(con).expect("EXISTS") == 1
}

// ---- A3. RWLOCK.RENEW ... READ|WRITE ---------------------------------------------------------

/// A write hold is not renewed by a `READ` renewal of the same owner (its read hold would keep
/// the write guard alive), nor a read hold by a `WRITE` renewal; without a side, every hold of
/// the owner is renewed, as before.
#[test]
fn a3_a_side_renewal_renews_only_the_side_the_owner_holds() {
    let server = Server::start();
    let mut con = server.conn();
    // A write hold only.
    cmd(&mut con, &["RWLOCK.ACQUIRE", "w", "o", "WRITE", "1000"]);
    let before = pexpiretime(&mut con, b"w");
    assert_eq!(cmd(&mut con, &["RWLOCK.RENEW", "w", "o", "60000", "READ"]), Value::Int(0));
    assert_eq!(pexpiretime(&mut con, b"w"), before, "a READ renewal leaves the write hold");
    assert_eq!(cmd(&mut con, &["RWLOCK.RENEW", "w", "o", "60000", "WRITE"]), Value::Int(1));
    assert!(pexpiretime(&mut con, b"w") > before + 50_000, "the write hold renewed");
    // A read hold only.
    cmd(&mut con, &["RWLOCK.ACQUIRE", "r", "o", "READ", "1000"]);
    let hold = b"{r}:o:rwlock_timeout:1";
    let (hash, key) = (pexpiretime(&mut con, b"r"), pexpiretime(&mut con, hold));
    assert_eq!(cmd(&mut con, &["RWLOCK.RENEW", "r", "o", "60000", "write"]), Value::Int(0));
    assert_eq!((pexpiretime(&mut con, b"r"), pexpiretime(&mut con, hold)), (hash, key));
    assert_eq!(cmd(&mut con, &["RWLOCK.RENEW", "r", "o", "60000", "read"]), Value::Int(1));
    assert!(pexpiretime(&mut con, hold) > key + 50_000, "the read hold renewed");
    assert!(pexpiretime(&mut con, b"r") > hash + 50_000, "and the hash covers it");
    // Both sides (a write hold, then a read re-entry): each side renews alone.
    cmd(&mut con, &["RWLOCK.ACQUIRE", "b", "o", "WRITE", "1000"]);
    cmd(&mut con, &["RWLOCK.ACQUIRE", "b", "o", "READ", "1000"]);
    let hold = b"{b}:o:rwlock_timeout:1";
    let key = pexpiretime(&mut con, hold);
    assert_eq!(cmd(&mut con, &["RWLOCK.RENEW", "b", "o", "60000", "WRITE"]), Value::Int(1));
    assert_eq!(pexpiretime(&mut con, hold), key, "WRITE leaves the read hold's lease");
    assert_eq!(cmd(&mut con, &["RWLOCK.RENEW", "b", "o", "60000", "READ"]), Value::Int(1));
    assert!(pexpiretime(&mut con, hold) > key + 50_000);
    // Without a side: as before, every hold.
    cmd(&mut con, &["RWLOCK.ACQUIRE", "n", "o", "WRITE", "1000"]);
    cmd(&mut con, &["RWLOCK.ACQUIRE", "n", "o", "READ", "1000"]);
    let (hash, key) =
        (pexpiretime(&mut con, b"n"), pexpiretime(&mut con, b"{n}:o:rwlock_timeout:1"));
    assert_eq!(cmd(&mut con, &["RWLOCK.RENEW", "n", "o", "60000"]), Value::Int(1));
    assert!(pexpiretime(&mut con, b"n") > hash + 50_000);
    assert!(pexpiretime(&mut con, b"{n}:o:rwlock_timeout:1") > key + 50_000);
    // Another owner, or a free lock: 0 with or without a side.
    for args in [
        &["RWLOCK.RENEW", "w", "x", "1000", "WRITE"][..],
        &["RWLOCK.RENEW", "free", "o", "1000", "READ"],
        &["RWLOCK.RENEW", "free", "o", "1000"],
    ] {
        assert_eq!(cmd(&mut con, args), Value::Int(0), "{args:?}");
    }
    assert!(!exists(&mut con, "free"), "nothing created");
    // Bad input.
    for (args, err) in [
        (&["RWLOCK.RENEW", "w", "o", "1000", "BOTH"][..], "ERR mode must be READ or WRITE"),
        (&["RWLOCK.RENEW", "w", "o", "1000", "READ", "x"], "ERR syntax error"),
        (&["RWLOCK.RENEW", "w", "o"], "ERR wrong number of arguments"),
    ] {
        let e = run_str(&mut con, args).expect_err("refused");
        assert!(e.starts_with(err), "{args:?}: {e}");
    }
    assert_eq!(
        hgetall(&mut con, b"w"),
        vec![(b"mode".to_vec(), b"write".to_vec()), (b"o:write".to_vec(), b"1".to_vec()),]
    );
    let _ = LIMIT;
}
