//! Checks and timers after releases: a partial release keeps the checks the remaining holds
//! need; a lock moved by `RENAME`/`MOVE`/`SWAPDB` or dropped by `FLUSHALL ASYNC` leaves no timer
//! behind (the module idles and unloads).

use std::time::Duration;

use redis::Value;

use rlock_tests_integration::idle::{
    assert_idle_and_unload, timers_armed, unloadable_server, waiting_clients,
};
use rlock_tests_integration::{cmd, in_thread, info_field, poll, run_str, Server};

const LIMIT: Duration = Duration::from_secs(10);

// ---- a partial release keeps the checks ------------------------------------------------------

/// A reader holding twice releases once: its remaining hold ends by its lease, and the writer
/// waiting behind it is served within a few hundred ms of that, not at its own timeout.
#[test]
fn a_partial_read_release_keeps_the_check_that_serves_the_writer() {
    let server = Server::start();
    let mut con = server.conn();
    assert_eq!(cmd(&mut con, &["RWLOCK.ACQUIRE", "rw", "r", "READ", "600"]), Value::Nil);
    assert_eq!(cmd(&mut con, &["RWLOCK.ACQUIRE", "rw", "r", "READ", "600"]), Value::Nil);
    let writer =
        in_thread(&server, &["RWLOCK.ACQUIRE", "rw", "w", "WRITE", "30000", "WAIT", "8000"]);
    poll("the writer waits", LIMIT, || (waiting_clients(&mut con) == 1).then_some(()));
    assert_eq!(cmd(&mut con, &["RWLOCK.RELEASE", "rw", "r", "READ"]), Value::Int(0));
    let (reply, took) = writer.join().expect("writer");
    assert_eq!(reply, Value::Nil, "the writer holds it");
    assert!(took < Duration::from_millis(3000), "served {took:?} after asking (lease 600 ms)");
}

/// Two readers: one releases (a partial release of the lock), the other's lease ends while the
/// key lives on (RWLOCK.RENEW of the first made it longer before): the dead reader is removed
/// and the waiting writer served.
#[test]
fn a_release_by_one_reader_keeps_the_dead_reader_check_of_the_other() {
    let server = Server::start();
    let mut con = server.conn();
    assert_eq!(cmd(&mut con, &["RWLOCK.ACQUIRE", "rw", "a", "READ", "60000"]), Value::Nil);
    assert_eq!(cmd(&mut con, &["RWLOCK.ACQUIRE", "rw", "b", "READ", "500"]), Value::Nil);
    let writer =
        in_thread(&server, &["RWLOCK.ACQUIRE", "rw", "w", "WRITE", "30000", "WAIT", "8000"]);
    poll("the writer waits", LIMIT, || (waiting_clients(&mut con) == 1).then_some(()));
    assert_eq!(cmd(&mut con, &["RWLOCK.RELEASE", "rw", "a", "READ"]), Value::Int(0));
    let (reply, took) = writer.join().expect("writer");
    assert_eq!(reply, Value::Nil, "the writer holds it");
    assert!(took < Duration::from_millis(3000), "served {took:?} after asking (b's lease 500 ms)");
}

/// Two leased permits of two, a waiter for two: one released by id (a partial release), the
/// other's lease ends, and the reclaim serves the waiter.
#[test]
fn releasing_one_of_two_leased_permits_keeps_the_reclaim_of_the_other() {
    let server = Server::start();
    let mut con = server.conn();
    cmd(&mut con, &["RSEM.SETPERMITS", "s", "2"]);
    let a: Vec<Vec<u8>> = redis::cmd("RSEM.ACQUIRE")
        .arg("s")
        .arg(1)
        .arg("LEASE")
        .arg(60_000)
        .query(&mut con)
        .expect("a");
    let _b: Vec<Vec<u8>> = redis::cmd("RSEM.ACQUIRE")
        .arg("s")
        .arg(1)
        .arg("LEASE")
        .arg(500)
        .query(&mut con)
        .expect("b");
    let waiter = in_thread(&server, &["RSEM.ACQUIRE", "s", "2", "WAIT", "8000"]);
    poll("the waiter waits", LIMIT, || (waiting_clients(&mut con) == 1).then_some(()));
    let released: i64 =
        redis::cmd("RSEM.RELEASE").arg("s").arg("ID").arg(&a[0]).query(&mut con).expect("release");
    assert_eq!(released, 1);
    let (reply, took) = waiter.join().expect("waiter");
    assert_eq!(reply, Value::Int(1), "the waiter got both permits");
    assert!(took < Duration::from_millis(3000), "served {took:?} after asking (lease 500 ms)");
}

// ---- keys moved or dropped behind the module's back -------------------------------------------

#[test]
fn a_renamed_read_hold_released_under_its_new_name_leaves_no_timer() {
    let server = unloadable_server();
    let mut con = server.conn();
    cmd(&mut con, &["RWLOCK.ACQUIRE", "rw", "a", "READ", "60000"]);
    cmd(&mut con, &["RENAME", "rw", "rw2"]);
    assert_eq!(cmd(&mut con, &["RWLOCK.RELEASE", "rw2", "a", "READ"]), Value::Int(1));
    assert_idle_and_unload(&mut con);
}

/// The look again after a RENAME keeps the check of another lock's live read hold.
#[test]
fn a_renamed_lock_released_keeps_the_checks_of_other_live_holds() {
    let server = unloadable_server();
    let mut con = server.conn();
    cmd(&mut con, &["RWLOCK.ACQUIRE", "live", "a", "READ", "60000"]);
    cmd(&mut con, &["RWLOCK.ACQUIRE", "rw", "a", "READ", "60000"]);
    cmd(&mut con, &["RENAME", "rw", "rw2"]);
    assert_eq!(cmd(&mut con, &["RWLOCK.RELEASE", "rw2", "a", "READ"]), Value::Int(1));
    poll("the stale check gone", LIMIT, || {
        (info_field(&mut con, "rlock", "rlock_scheduled_checks") == 1).then_some(())
    });
    assert_eq!(timers_armed(&mut con), 1, "live's hold is still looked at");
    assert!(run_str(&mut con, &["MODULE", "UNLOAD", "rlock"]).is_err(), "live is held");
    assert_eq!(cmd(&mut con, &["RWLOCK.RELEASE", "live", "a", "READ"]), Value::Int(1));
    assert_idle_and_unload(&mut con);
}

#[test]
fn a_moved_read_hold_released_in_its_new_database_leaves_no_timer() {
    let server = unloadable_server();
    let mut con = server.conn();
    cmd(&mut con, &["RWLOCK.ACQUIRE", "rw", "a", "READ", "60000"]);
    cmd(&mut con, &["MOVE", "rw", "1"]);
    cmd(&mut con, &["SELECT", "1"]);
    assert_eq!(cmd(&mut con, &["RWLOCK.RELEASE", "rw", "a", "READ"]), Value::Int(1));
    assert_idle_and_unload(&mut con);
}

#[test]
fn a_swapped_read_hold_released_in_its_new_database_leaves_no_timer() {
    let server = unloadable_server();
    let mut con = server.conn();
    cmd(&mut con, &["RWLOCK.ACQUIRE", "rw", "a", "READ", "60000"]);
    cmd(&mut con, &["SWAPDB", "0", "1"]);
    cmd(&mut con, &["SELECT", "1"]);
    assert_eq!(cmd(&mut con, &["RWLOCK.RELEASE", "rw", "a", "READ"]), Value::Int(1));
    assert_idle_and_unload(&mut con);
}

#[test]
fn a_flushall_async_leaves_no_timer() {
    let server = unloadable_server();
    let mut con = server.conn();
    cmd(&mut con, &["RWLOCK.ACQUIRE", "rw", "a", "READ", "60000"]);
    cmd(&mut con, &["RSEM.SETPERMITS", "s", "1"]);
    cmd(&mut con, &["RSEM.ACQUIRE", "s", "1", "LEASE", "60000"]);
    cmd(&mut con, &["FLUSHALL", "ASYNC"]);
    assert_idle_and_unload(&mut con);
}
