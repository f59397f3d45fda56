//! Issue 23's fresh attack before stopping (round 3): defects a hostile user found in this
//! round's changes and the paths of the round before. Each test failed on the code before its
//! fix (or is ignored, naming the defect it shows).

use std::time::{Duration, Instant};

use redis::{Connection, Value};
use rlock_tests_integration::{
    cmd, digest, info_field, poll, run_str, wait_blocked, Pending, Server,
};

/// A read-write lock hash with `fields` readers holding `count` read holds each (a foreign
/// writer's: no hold key exists), written in one pipeline.
fn foreign_readers(con: &mut Connection, name: &str, fields: usize, count: u64) {
    let mut pipe = redis::pipe();
    pipe.cmd("HSET").arg(name).arg("mode").arg("read").ignore();
    for i in 0..fields {
        pipe.cmd("HSET").arg(name).arg(format!("r{i}")).arg(count).ignore();
    }
    let () = pipe.query(con).expect("HSET pipeline");
}

/// The 1,000-read-holds-per-owner limit bounds one owner's count, not a lock's: a foreign hash
/// of 20,000 readers at 1,000 holds each made one `RWLOCK.RELEASE` read 20 million hold keys
/// (5.8 s with the server blocked, every other client waiting), and so would every dead-reader
/// check and every later release. A release, and a waiter's dead-reader check, now refuse a
/// lock with more read holds in all than a release may walk (nothing changes), at once.
#[test]
fn a_lock_with_more_read_holds_in_all_than_a_release_may_walk_is_refused_at_once() {
    let server = Server::start();
    let mut con = server.conn();
    con.set_read_timeout(Some(Duration::from_secs(60))).expect("timeout");
    // Just past the limit: refused, nothing changes.
    foreign_readers(&mut con, "K", 101, 1000);
    let before = digest(&mut con);
    for mode in ["READ", "WRITE"] {
        let err = run_str(&mut con, &["RWLOCK.RELEASE", "K", "r1", mode]).unwrap_err();
        assert!(err.starts_with("ERR the lock holds more than 100000 read holds"), "{err}");
    }
    assert_eq!(digest(&mut con), before, "nothing changes on the refusal");
    // RWLOCK.INFO reads only the hash: it still reports the lock.
    let Value::Array(info) = cmd(&mut con, &["RWLOCK.INFO", "K"]) else { panic!("INFO") };
    assert!(info.contains(&Value::Int(101_000)), "{info:?}");
    // RWLOCK.FORCERELEASE clears it.
    assert_eq!(cmd(&mut con, &["RWLOCK.FORCERELEASE", "K"]), Value::Int(1));

    // 20 million holds: the refusal comes at once, not after a walk of every hold key.
    foreign_readers(&mut con, "K", 20_000, 1000);
    let before = digest(&mut con);
    let started = Instant::now();
    let err = run_str(&mut con, &["RWLOCK.RELEASE", "K", "r1", "READ"]).unwrap_err();
    let took = started.elapsed();
    assert!(err.starts_with("ERR the lock holds more than"), "{err}");
    assert!(took < Duration::from_millis(500), "the release blocked the server for {took:?}");
    assert_eq!(digest(&mut con), before);

    // A writer waiting for it: its dead-reader check must not block the server either.
    let mut waiter = server.conn();
    waiter.set_read_timeout(Some(Duration::from_secs(60))).expect("timeout");
    let started = Instant::now();
    let reply = run_str(&mut waiter, &["RWLOCK.ACQUIRE", "K", "w", "WRITE", "1000", "WAIT", "300"]);
    assert_eq!(reply, Ok(Value::Int(-1)), "timed out: the lock is still held");
    let took = started.elapsed();
    assert!(took < Duration::from_millis(1500), "the wait's checks blocked for {took:?}");
    assert_eq!(digest(&mut con), before);
}

/// A waiter for leased permits was granted when the count alone sufficed without the lease
/// "zset" being looked at: a foreign writer had made `{s}:timeout` a list, the count went down
/// (5 -> 3), the `ZADD` of the ids failed (its error ignored), and the waiter got two ids that
/// no zset holds: permits lost for good (no lease ends, no release by id finds them). The
/// grant now checks the zset's type before anything is written: the waiter is not granted.
#[test]
fn a_leased_waiter_is_not_granted_when_the_lease_zset_holds_another_type() {
    let server = Server::start();
    let mut con = server.conn();
    cmd(&mut con, &["SET", "s", "0"]);
    let waiter =
        Pending::start_str(&server, &["RSEM.ACQUIRE", "s", "2", "LEASE", "60000", "WAIT", "400"]);
    wait_blocked(&mut con, 1);
    // Foreign writes: the lease zset becomes a list, then permits come back with a SET (found
    // by the waiters' poll).
    cmd(&mut con, &["RPUSH", "{s}:timeout", "x"]);
    cmd(&mut con, &["SET", "s", "5"]);
    let (reply, _) = waiter.reply(Duration::from_secs(10));
    assert!(
        matches!(reply, Ok(Value::Nil)) || matches!(&reply, Err(e) if e.starts_with("WRONGTYPE")),
        "granted ids it could not record: {reply:?}"
    );
    assert_eq!(cmd(&mut con, &["GET", "s"]), Value::BulkString(b"5".to_vec()), "count unchanged");
    assert_eq!(cmd(&mut con, &["LLEN", "{s}:timeout"]), Value::Int(1));
    // Every other path refuses such a semaphore with WRONGTYPE before writing.
    for args in [
        &["RSEM.ACQUIRE", "s", "1", "LEASE", "1000"][..],
        &["RSEM.ACQUIRE", "s", "1"],
        &["RSEM.RELEASE", "s", "1"],
        &["RSEM.RENEW", "s", "0123456789abcdef", "1000"],
        &["RSEM.INFO", "s"],
    ] {
        let err = run_str(&mut con, args).unwrap_err();
        assert!(err.starts_with("WRONGTYPE"), "{args:?}: {err}");
    }
    assert_eq!(cmd(&mut con, &["GET", "s"]), Value::BulkString(b"5".to_vec()));
}

/// Runs `release` (which hands the lock to the one waiter, blocked with `wait`), kills that
/// waiter before its reply and swaps databases 0 and 1, all in one `MULTI`: the grant is undone
/// (its client left) after the swap moved it to database 1.
fn grant_undone_after_a_swap(
    server: &Server,
    con: &mut Connection,
    wait: &[&str],
    release: &[&str],
) {
    let waiter = Pending::start_str(server, wait);
    wait_blocked(con, 1);
    let id = waiter.client_id().to_string();
    let mut pipe = redis::pipe();
    pipe.atomic();
    pipe.cmd(release[0]).arg(&release[1..]).ignore();
    pipe.cmd("CLIENT").arg("KILL").arg("ID").arg(&id).ignore();
    pipe.cmd("SWAPDB").arg(0).arg(1).ignore();
    let () = pipe.query(con).expect("MULTI");
    drop(waiter);
    // The undo is counted when the client goes, and runs on the module's next timer tick.
    poll("the undo", Duration::from_secs(10), || {
        (info_field(con, "rlock_waits", "rlock_grants_rolled_back") > 0
            && info_field(con, "rlock_waits", "rlock_timers_armed") == 0)
            .then_some(())
    });
}

/// A grant whose client left before its reply is undone on a 0 ms timer; a `SWAPDB` in
/// between (same event-loop turn: one `MULTI` here) moved the grant to the other database, but
/// the undo still looked in the old one: a semaphore permit was given back to whatever
/// semaphore the swap brought in under that name (one made from nothing here) while the real
/// one lost it for good, and a reentrant hold was left to its lease. The undo now follows the
/// swap.
#[test]
fn a_grant_undone_after_a_swapdb_is_undone_in_the_database_it_moved_to() {
    let server = Server::start();
    let mut con = server.conn();
    // Counted permits: the permit goes back to the semaphore that was granted from.
    cmd(&mut con, &["RSEM.SETPERMITS", "s", "0"]);
    grant_undone_after_a_swap(
        &server,
        &mut con,
        &["RSEM.ACQUIRE", "s", "1", "WAIT", "10000"],
        &["RSEM.RELEASE", "s", "1"],
    );
    assert_eq!(cmd(&mut con, &["EXISTS", "s"]), Value::Int(0), "no semaphore made from nothing");
    cmd(&mut con, &["SELECT", "1"]);
    assert_eq!(cmd(&mut con, &["GET", "s"]), Value::BulkString(b"1".to_vec()), "permit back");
    cmd(&mut con, &["FLUSHALL"]);
    cmd(&mut con, &["SELECT", "0"]);

    // A reentrant lock: the hold of the client that left is released where it now is.
    cmd(&mut con, &["RLOCK.ACQUIRE", "k", "A", "60000"]);
    grant_undone_after_a_swap(
        &server,
        &mut con,
        &["RLOCK.ACQUIRE", "k", "W", "60000", "WAIT", "10000"],
        &["RLOCK.RELEASE", "k", "A"],
    );
    cmd(&mut con, &["SELECT", "1"]);
    assert_eq!(cmd(&mut con, &["EXISTS", "k"]), Value::Int(0), "the gone client's hold stays");
}

/// A writer waiting for a read-write lock whose hash a foreign writer corrupted (a read count
/// that is not a number): the waiters' poll asked for a dead-reader check every 10 ms and each
/// one logged its failure, 100 warnings a second for as long as anyone waited (8.6 million
/// lines a day from one key and one client). The warning is now logged at most once per
/// 10 s.
#[test]
fn a_corrupt_lock_with_a_waiter_does_not_flood_the_log() {
    let server = Server::start();
    let mut con = server.conn();
    cmd(&mut con, &["HSET", "K", "mode", "read", "x", "abc"]);
    let reply = run_str(&mut con, &["RWLOCK.ACQUIRE", "K", "w", "WRITE", "1000", "WAIT", "1000"]);
    assert_eq!(reply, Ok(Value::Int(-1)), "timed out");
    let warnings = server.log().matches("could not check a read-write lock").count();
    assert!((1..=2).contains(&warnings), "{warnings} warnings in one second");
}
