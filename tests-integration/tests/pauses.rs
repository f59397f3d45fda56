//! Writes paused (`CLIENT PAUSE WRITE`/`ALL`, `FAILOVER`): a lease ending, a waiter timing out
//! or a grant rolled back during a pause writes nothing until it ends, then is served.

use std::time::{Duration, Instant};

use redis::{Connection, Value};

use rlock_tests_integration::{cmd, hgetall, info_field, poll, wait_blocked, Pending, Server};

const LIMIT: Duration = Duration::from_secs(10);

fn exists(con: &mut Connection, key: &str) -> bool {
    redis::cmd("EXISTS").arg(key).query::<i64>(con).expect("EXISTS") == 1
}

/// A lease that ends during `CLIENT PAUSE` must not make the module write (the server aborted
/// in dbAdd): the waiter is served after the pause, and never during it.
fn lease_end_during_pause(mode: &str) {
    let server = Server::start();
    let mut con = server.conn();
    cmd(&mut con, &["RLOCK.ACQUIRE", "k", "holder", "300"]);
    let waiter = Pending::start_str(&server, &["RLOCK.ACQUIRE", "k", "w", "30000", "WAIT", "0"]);
    wait_blocked(&mut con, 1);
    let paused_at = Instant::now();
    cmd(&mut con, &["CLIENT", "PAUSE", "1500", mode]);
    let (reply, at) = waiter.reply(LIMIT);
    assert_eq!(reply, Ok(Value::Nil), "the waiter is granted; log:\n{}", server.log());
    assert!(
        at.duration_since(paused_at) >= Duration::from_millis(1400),
        "granted during the pause ({:?} after it began)",
        at.duration_since(paused_at)
    );
    assert_eq!(cmd(&mut con, &["PING"]), Value::SimpleString("PONG".into()), "alive");
    assert_eq!(hgetall(&mut con, b"k"), vec![(b"w".to_vec(), b"1".to_vec())]);
    assert!(!server.log().contains("ASSERTION"), "{}", server.log());
}

#[test]
fn a_lease_ending_during_client_pause_write_is_handed_off_after_it() {
    lease_end_during_pause("WRITE");
}

#[test]
fn a_lease_ending_during_client_pause_all_is_handed_off_after_it() {
    lease_end_during_pause("ALL");
}

#[test]
fn a_lease_ending_while_a_failover_pauses_writes_is_handed_off_after_it() {
    let master = Server::start();
    let replica = Server::builder().replica_of(&master).start();
    rlock_tests_integration::wait_replica_online(&master);
    let mut con = master.conn();
    cmd(&mut con, &["RLOCK.ACQUIRE", "k", "holder", "300"]);
    let waiter = Pending::start_str(&master, &["RLOCK.ACQUIRE", "k", "w", "30000", "WAIT", "0"]);
    wait_blocked(&mut con, 1);
    // A replica that cannot catch up: FAILOVER pauses writes for its whole timeout, then gives
    // up and the master stays a master.
    replica.pause();
    let started = Instant::now();
    cmd(&mut con, &["FAILOVER", "TIMEOUT", "1500"]);
    let (reply, at) = waiter.reply(LIMIT);
    replica.resume();
    assert_eq!(reply, Ok(Value::Nil), "log:\n{}", master.log());
    assert!(at.duration_since(started) >= Duration::from_millis(1000), "granted during the pause");
    assert_eq!(hgetall(&mut con, b"k"), vec![(b"w".to_vec(), b"1".to_vec())]);
    assert!(!master.log().contains("ASSERTION"), "{}", master.log());
}

#[test]
fn a_waiter_timing_out_during_a_pause_writes_nothing_and_is_answered() {
    let server = Server::start();
    let mut con = server.conn();
    cmd(&mut con, &["RLOCK.ACQUIRE", "k", "holder", "200"]);
    let waiter = Pending::start_str(&server, &["RLOCK.ACQUIRE", "k", "w", "30000", "WAIT", "600"]);
    wait_blocked(&mut con, 1);
    cmd(&mut con, &["CLIENT", "PAUSE", "1500", "WRITE"]);
    // The lease is over but the key cannot be deleted: no holder, nothing granted: retry now (0).
    let (reply, _) = waiter.reply(LIMIT);
    assert_eq!(reply, Ok(Value::Int(0)), "log:\n{}", server.log());
    cmd(&mut con, &["CLIENT", "UNPAUSE"]);
    assert!(!exists(&mut con, "k"), "nothing granted");
    assert_eq!(cmd(&mut con, &["PING"]), Value::SimpleString("PONG".into()));
}

#[test]
fn a_grant_rolled_back_during_a_pause_is_released_after_it_not_during_it() {
    let server = Server::start();
    let mut con = server.conn();
    cmd(&mut con, &["RLOCK.ACQUIRE", "k", "holder", "60000"]);
    // A waiter whose connection is killed in the same transaction as the release that grants it:
    // its grant is rolled back on a timer, which comes due while writes are paused.
    let waiter = Pending::start_str(&server, &["RLOCK.ACQUIRE", "k", "w", "60000", "WAIT", "0"]);
    wait_blocked(&mut con, 1);
    let id = waiter.client_id().to_string();
    cmd(&mut con, &["MULTI"]);
    cmd(&mut con, &["RLOCK.RELEASE", "k", "holder"]);
    cmd(&mut con, &["CLIENT", "KILL", "ID", &id]);
    cmd(&mut con, &["CLIENT", "PAUSE", "2000", "WRITE"]);
    cmd(&mut con, &["EXEC"]);
    let paused_at = Instant::now();
    let _ = waiter.reply(LIMIT);
    poll("the rollback queued", LIMIT, || {
        (info_field(&mut con, "rlock", "rlock_grants_rolled_back") == 1).then_some(())
    });
    let still_held = exists(&mut con, "k");
    // Conclusive only if the pause surely still lasted when EXISTS ran.
    if paused_at.elapsed() < Duration::from_millis(1500) {
        assert!(still_held, "the module wrote (released the grant) while writes were paused");
    }
    poll("the rolled-back grant released", LIMIT, || (!exists(&mut con, "k")).then_some(()));
    assert!(paused_at.elapsed() >= Duration::from_millis(1900), "released during the pause");
    assert_eq!(cmd(&mut con, &["PING"]), Value::SimpleString("PONG".into()));
    assert!(!server.log().contains("ASSERTION"), "{}", server.log());
}
