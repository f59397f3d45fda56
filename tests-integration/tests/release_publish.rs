//! A release that hands the lock on publishes nothing, so it needs no permission on the unlock
//! channel (no hand-off pays the channel's ACL check). A release that
//! publishes (nobody waits, or every waiter is refused) is checked as before: refused with
//! `NOPERM` before anything changes when nobody waits; when the waiters it expected are all
//! refused at the hand-off, the release is done and its message is left out (with an `ACL LOG`
//! entry), never published by a user who may not.

use std::time::Duration;

use redis::{Connection, Value};
use rlock_tests_integration::{cmd, conn_as, digest, run_str, wait_blocked, Pending, Server};

const LIMIT: Duration = Duration::from_secs(10);

/// A server with the user `lim`: every command, keys `locks:*`, no channel.
fn limited() -> (Server, Connection, Connection) {
    let server = Server::start();
    let mut admin = server.conn();
    cmd(
        &mut admin,
        &["ACL", "SETUSER", "lim", "on", "nopass", "~locks:*", "resetchannels", "+@all"],
    );
    let lim = conn_as(&server, "lim");
    (server, admin, lim)
}

/// The next message the subscriber `sub` receives (within [`LIMIT`]). A test publishes a marker
/// after a release: the release published nothing when the marker comes first.
fn first_message(sub: &mut redis::PubSub<'_>) -> String {
    sub.set_read_timeout(Some(LIMIT)).expect("timeout");
    let msg = sub.get_message().expect("a message within the limit");
    msg.get_payload::<String>().expect("text")
}

fn acl_log(admin: &mut Connection) -> String {
    let log: Vec<Value> = redis::cmd("ACL").arg("LOG").query(admin).expect("ACL LOG");
    format!("{log:?}")
}

#[test]
fn a_release_that_hands_a_reentrant_lock_on_needs_no_channel_permission() {
    let (server, mut admin, mut lim) = limited();
    let mut listener = server.conn();
    let mut sub = listener.as_pubsub();
    sub.subscribe("redisson_lock__channel:{locks:x}").expect("SUBSCRIBE");
    assert_eq!(cmd(&mut lim, &["RLOCK.ACQUIRE", "locks:x", "h", "30000"]), Value::Nil);
    let waiter =
        Pending::start_str(&server, &["RLOCK.ACQUIRE", "locks:x", "w", "30000", "WAIT", "0"]);
    wait_blocked(&mut admin, 1);
    assert_eq!(cmd(&mut lim, &["RLOCK.RELEASE", "locks:x", "h"]), Value::Int(1));
    assert_eq!(waiter.reply(LIMIT).0, Ok(Value::Nil), "the waiter holds it");
    cmd(&mut admin, &["PUBLISH", "redisson_lock__channel:{locks:x}", "marker"]);
    assert_eq!(first_message(&mut sub), "marker", "the hand-off published nothing");
    assert!(!acl_log(&mut admin).contains("channel"), "nothing was denied");

    // With nobody waiting the release would publish: refused, nothing changed.
    cmd(&mut admin, &["RLOCK.FORCERELEASE", "locks:x"]);
    assert_eq!(first_message(&mut sub), "0", "the force release's own message");
    assert_eq!(cmd(&mut lim, &["RLOCK.ACQUIRE", "locks:x", "h", "30000"]), Value::Nil);
    let before = digest(&mut admin);
    let err = run_str(&mut lim, &["RLOCK.RELEASE", "locks:x", "h"]).unwrap_err();
    assert!(err.starts_with("NOPERM"), "{err}");
    assert_eq!(digest(&mut admin), before, "still held");
}

#[test]
fn a_release_whose_waiters_are_all_refused_leaves_its_message_out() {
    let (server, mut admin, mut lim) = limited();
    let mut listener = server.conn();
    let mut sub = listener.as_pubsub();
    sub.subscribe("redisson_lock__channel:{locks:x}").expect("SUBSCRIBE");
    assert_eq!(cmd(&mut lim, &["RLOCK.ACQUIRE", "locks:x", "h", "30000"]), Value::Nil);
    let args = ["RLOCK.ACQUIRE", "locks:x", "w", "30000", "WAIT", "0", "TOKEN"];
    let waiter = Pending::start_str(&server, &args);
    wait_blocked(&mut admin, 1);
    // The waiter's token cannot be issued: it is refused at the hand-off.
    cmd(&mut admin, &["SET", "redisson_lock_token:{locks:x}", "9223372036854775807"]);
    assert_eq!(cmd(&mut lim, &["RLOCK.RELEASE", "locks:x", "h"]), Value::Int(1));
    let (reply, _) = waiter.reply(LIMIT);
    assert!(reply.as_ref().is_err_and(|e| e.contains("cannot grow")), "{reply:?}");
    assert_eq!(cmd(&mut admin, &["EXISTS", "locks:x"]), Value::Int(0), "released");
    cmd(&mut admin, &["PUBLISH", "redisson_lock__channel:{locks:x}", "marker"]);
    assert_eq!(first_message(&mut sub), "marker", "lim may not publish: nothing was");
    assert!(acl_log(&mut admin).contains("redisson_lock__channel:{locks:x}"));
}

#[test]
fn a_release_that_hands_a_read_write_lock_on_needs_no_channel_permission() {
    let (server, mut admin, mut lim) = limited();
    let mut listener = server.conn();
    let mut sub = listener.as_pubsub();
    sub.subscribe("redisson_rwlock:{locks:x}").expect("SUBSCRIBE");
    let write = ["RWLOCK.ACQUIRE", "locks:x", "h", "WRITE", "30000"];
    assert_eq!(cmd(&mut lim, &write), Value::Nil);
    let args = ["RWLOCK.ACQUIRE", "locks:x", "w", "WRITE", "30000", "WAIT", "0"];
    let waiter = Pending::start_str(&server, &args);
    wait_blocked(&mut admin, 1);
    assert_eq!(cmd(&mut lim, &["RWLOCK.RELEASE", "locks:x", "h", "WRITE"]), Value::Int(1));
    assert_eq!(waiter.reply(LIMIT).0, Ok(Value::Nil), "the waiter holds it");
    cmd(&mut admin, &["PUBLISH", "redisson_rwlock:{locks:x}", "marker"]);
    assert_eq!(first_message(&mut sub), "marker", "the hand-off published nothing");

    // With nobody waiting the release would publish: refused, nothing changed.
    cmd(&mut admin, &["RWLOCK.FORCERELEASE", "locks:x"]);
    assert_ne!(first_message(&mut sub), "marker", "the force release's own message");
    assert_eq!(cmd(&mut lim, &write), Value::Nil);
    let before = digest(&mut admin);
    let err = run_str(&mut lim, &["RWLOCK.RELEASE", "locks:x", "h", "WRITE"]).unwrap_err();
    assert!(err.starts_with("NOPERM"), "{err}");
    assert_eq!(digest(&mut admin), before, "still held");
}
