//! What other clients see of rlock's writes: `WATCH` aborted by real changes only, and the
//! keyspace notifications Redisson's scripts raise.

use std::time::Duration;

use redis::Value;

use rlock_tests_integration::{cmd, digest, Server};

/// `WATCH k`, then `other` runs `no_op` (which changes nothing): the transaction still runs.
fn watch_survives(setup: &[&[&str]], no_op: &[&str]) {
    let server = Server::start();
    let mut con = server.conn();
    let mut other = server.conn();
    for c in setup {
        cmd(&mut other, c);
    }
    cmd(&mut con, &["WATCH", "k"]);
    let before = digest(&mut other);
    cmd(&mut other, no_op);
    assert_eq!(digest(&mut other), before, "{no_op:?} is a no-op");
    cmd(&mut con, &["MULTI"]);
    cmd(&mut con, &["SET", "x", "1"]);
    let exec = cmd(&mut con, &["EXEC"]);
    assert_ne!(exec, Value::Nil, "{no_op:?} aborted the WATCH");
}

#[test]
fn no_ops_do_not_abort_a_watch() {
    let held: &[&[&str]] = &[&["RLOCK.ACQUIRE", "k", "h", "60000"]];
    watch_survives(held, &["RLOCK.ACQUIRE", "k", "other", "60000"]);
    watch_survives(held, &["RLOCK.RELEASE", "k", "other"]);
    watch_survives(held, &["RLOCK.RENEW", "k", "other", "60000"]);
    watch_survives(&[], &["RLOCK.RELEASE", "k", "nobody"]);
    watch_survives(&[], &["RLOCK.FORCERELEASE", "k"]);
}

#[test]
fn a_real_change_does_abort_a_watch() {
    let server = Server::start();
    let mut con = server.conn();
    let mut other = server.conn();
    cmd(&mut con, &["WATCH", "k"]);
    cmd(&mut other, &["RLOCK.ACQUIRE", "k", "h", "60000"]);
    cmd(&mut con, &["MULTI"]);
    cmd(&mut con, &["SET", "x", "1"]);
    assert_eq!(cmd(&mut con, &["EXEC"]), Value::Nil);
}

/// The keyspace events `ops` raise on `k`, in order.
fn events(ops: &[&[&str]]) -> Vec<String> {
    let server = Server::start();
    let mut con = server.conn();
    cmd(&mut con, &["CONFIG", "SET", "notify-keyspace-events", "KA"]);
    let mut sub = server.conn();
    sub.set_read_timeout(Some(Duration::from_millis(300))).expect("timeout");
    let mut sub = sub.as_pubsub();
    sub.subscribe("__keyspace@0__:k").expect("subscribe");
    for op in ops {
        cmd(&mut con, op);
    }
    let mut seen = Vec::new();
    while let Ok(msg) = sub.get_message() {
        seen.push(msg.get_payload::<String>().expect("event"));
    }
    seen
}

#[test]
fn rlock_raises_the_notifications_redissons_scripts_raise() {
    let acquire: &[&str] = &["RLOCK.ACQUIRE", "k", "a", "60000"];
    let release: &[&str] = &["RLOCK.RELEASE", "k", "a"];
    assert_eq!(events(&[acquire]), ["hincrby", "expire"]);
    assert_eq!(
        events(&[acquire, acquire, release]),
        ["hincrby", "expire", "hincrby", "expire", "hincrby"]
    );
    assert_eq!(events(&[acquire, release]), ["hincrby", "expire", "hincrby", "del"]);
    assert_eq!(
        events(&[acquire, &["RLOCK.RENEW", "k", "a", "60000"]]),
        ["hincrby", "expire", "expire"]
    );
    assert_eq!(events(&[acquire, &["RLOCK.FORCERELEASE", "k"]]), ["hincrby", "expire", "del"]);
    // No-ops raise nothing.
    assert_eq!(
        events(&[&["RLOCK.RELEASE", "k", "a"], &["RLOCK.RENEW", "k", "a", "100"]]),
        Vec::<String>::new()
    );
}
