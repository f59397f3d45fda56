//! Leases granted on a master end on its promoted replica as they would have on the master: a
//! leased permit comes back (the count, the lease zset, `redisson_sc` published) just after its
//! lease ends, and a read-write lock's reader whose every hold ended leaves, with nobody touching
//! the lock; a waiter blocked on the new master is served then.

use std::time::{Duration, Instant};

use redis::{Connection, Value};
use rlock_tests_integration::{cmd, info_field, poll, run_str, wait_replica_online, Server};

const LIMIT: Duration = Duration::from_secs(10);

/// `GET key` as a count (a plain read: it does not touch the semaphore as `RSEM.*` does).
fn count(con: &mut Connection, key: &str) -> Option<i64> {
    redis::cmd("GET")
        .arg(key)
        .query::<Option<String>>(con)
        .expect("GET")
        .map(|v| v.parse().expect("a count"))
}

fn zcard(con: &mut Connection, key: &str) -> i64 {
    redis::cmd("ZCARD").arg(key).query(con).expect("ZCARD")
}

/// A master with `permits` on each of `sems` (name, database, lease ms: one permit leased for
/// that long), its replica in sync, then the replica promoted. Returns both servers.
fn promoted_with(sems: &[(&str, i64, u64)]) -> (Server, Server) {
    promoted_among(sems, 0)
}

/// [`promoted_with`], beside `others` other keys (`DEBUG POPULATE`, before the replica syncs).
fn promoted_among(sems: &[(&str, i64, u64)], others: u64) -> (Server, Server) {
    let master = Server::start();
    if others > 0 {
        cmd(&mut master.conn(), &["DEBUG", "POPULATE", &others.to_string(), "other"]);
    }
    let replica = Server::builder().replica_of(&master).start();
    wait_replica_online(&master);
    let mut m = master.conn();
    for &(name, db, lease) in sems {
        cmd(&mut m, &["SELECT", &db.to_string()]);
        cmd(&mut m, &["RSEM.SETPERMITS", name, "3"]);
        cmd(&mut m, &["RSEM.ACQUIRE", name, "1", "LEASE", &lease.to_string()]);
    }
    let acked: i64 = redis::cmd("WAIT").arg(1).arg(5000).query(&mut m).expect("WAIT");
    assert_eq!(acked, 1, "the replica has the grants");
    cmd(&mut replica.conn(), &["REPLICAOF", "NO", "ONE"]);
    (master, replica)
}

#[test]
fn a_promoted_replica_gives_back_an_ended_leased_permit_untouched_and_publishes_it() {
    // Two databases, Redisson's two name forms, and one lease that outlives the test.
    let sems = [("ls", 0, 1_500), ("app{7}:ls", 3, 1_500), ("long", 0, 60_000)];
    let (_master, replica) = promoted_with(&sems);
    let mut sub = replica.conn();
    sub.set_read_timeout(Some(LIMIT)).expect("timeout");
    let mut sub = sub.as_pubsub();
    sub.subscribe("redisson_sc:{ls}").expect("subscribe");
    let mut r = replica.conn();
    let started = Instant::now();
    assert_eq!(count(&mut r, "ls"), Some(2), "the lease has not ended yet");
    poll("the ended lease's permit back on the new master", LIMIT, || {
        (count(&mut r, "ls") == Some(3)).then_some(())
    });
    assert!(started.elapsed() < Duration::from_millis(1_500 + 2_000), "at the lease end");
    assert_eq!(zcard(&mut r, "{ls}:timeout"), 0, "its lease left the zset");
    let msg = sub.get_message().expect("the semaphore's message");
    assert_eq!(msg.get_channel_name(), "redisson_sc:{ls}");
    assert_eq!(msg.get_payload_bytes(), b"3");
    cmd(&mut r, &["SELECT", "3"]);
    poll("the permit back in database 3", LIMIT, || {
        (count(&mut r, "app{7}:ls") == Some(3)).then_some(())
    });
    assert_eq!(zcard(&mut r, "app{7}:ls:timeout"), 0);
    cmd(&mut r, &["SELECT", "0"]);
    assert_eq!(count(&mut r, "long"), Some(2), "a live lease stays");
    assert_eq!(zcard(&mut r, "{long}:timeout"), 1);
}

#[test]
fn a_waiter_on_a_promoted_replica_is_served_when_the_lease_it_waits_for_ends() {
    let (_master, replica) = promoted_with(&[("ls", 0, 1_500)]);
    let mut r = replica.conn();
    r.set_read_timeout(Some(LIMIT)).expect("timeout");
    let started = Instant::now();
    let got = cmd(&mut r, &["RSEM.ACQUIRE", "ls", "3", "WAIT", "8000"]);
    assert_eq!(got, Value::Int(1), "all three permits taken");
    let waited = started.elapsed();
    assert!(waited < Duration::from_millis(1_500 + 2_000), "served at the lease end: {waited:?}");
    assert_eq!(count(&mut r, "ls"), Some(0));
}

#[test]
fn a_promotion_looks_for_leased_semaphores_a_tick_budget_at_a_time() {
    let (_master, replica) = promoted_among(&[("ls", 0, 1_000)], 200_000);
    let mut r = replica.conn();
    // The server answers while the walk goes on (it takes many ticks).
    let started = Instant::now();
    for _ in 0..20 {
        let ping = Instant::now();
        cmd(&mut r, &["PING"]);
        assert!(ping.elapsed() < Duration::from_millis(200), "PING took {:?}", ping.elapsed());
    }
    poll("the ended lease's permit back among 200,000 keys", LIMIT, || {
        (count(&mut r, "ls") == Some(3)).then_some(())
    });
    // The permit may come back at the walk's first ticks (its lease can end before the
    // promotion: the WAIT for the replica takes up to its 1 s ack period); the walk goes on.
    poll("the walk split over many ticks", LIMIT, || {
        (info_field(&mut r, "rlock", "rlock_timer_ticks_split") > 10).then_some(())
    });
    assert!(started.elapsed() < LIMIT);
}

#[test]
fn waiters_on_a_promoted_replica_are_served_when_a_dead_reader_s_hold_or_a_lock_delay_ends() {
    let master = Server::start();
    let replica = Server::builder().replica_of(&master).start();
    wait_replica_online(&master);
    let mut m = master.conn();
    // A reader whose only hold ends in 1 s while the hash lasts 30 s (a shorter renewal never
    // shortens the hash).
    cmd(&mut m, &["RWLOCK.ACQUIRE", "rw", "reader", "READ", "30000"]);
    cmd(&mut m, &["RWLOCK.RENEW", "rw", "reader", "1000", "READ"]);
    // A session hold ended by its connection's close: a 1.5 s lock-delay follows.
    let mut session = master.conn();
    cmd(&mut session, &["RLOCK.ACQUIRE", "l", "holder", "30000", "SESSION", "LOCKDELAY", "1500"]);
    drop(session);
    poll("the lock-delay in place", LIMIT, || {
        let owners: Vec<String> = redis::cmd("HKEYS").arg("l").query(&mut m).ok()?;
        (owners.len() == 1 && owners[0] != "holder").then_some(())
    });
    let acked: i64 = redis::cmd("WAIT").arg(1).arg(5000).query(&mut m).expect("WAIT");
    assert_eq!(acked, 1, "the replica has it all");
    let started = Instant::now();
    cmd(&mut replica.conn(), &["REPLICAOF", "NO", "ONE"]);
    let mut r = replica.conn();
    r.set_read_timeout(Some(LIMIT)).expect("timeout");
    let writer = cmd(&mut r, &["RWLOCK.ACQUIRE", "rw", "writer", "WRITE", "5000", "WAIT", "8000"]);
    assert_eq!(writer, Value::Nil, "the writer got the lock once the dead reader left");
    let waited = started.elapsed();
    assert!(waited < Duration::from_millis(1_000 + 2_000), "at the hold's end: {waited:?}");
    let next = cmd(&mut r, &["RLOCK.ACQUIRE", "l", "next", "5000", "WAIT", "8000"]);
    assert_eq!(next, Value::Nil, "the lock is granted when its lock-delay ends");
    let waited = started.elapsed();
    assert!(waited < Duration::from_millis(1_500 + 2_000), "at the delay's end: {waited:?}");
}

/// How long the dead reader's hold lasts: past the `WAIT` (up to a replica's 1 s ack period),
/// so the replica is promoted before the old master drops it.
const DEAD_HOLD_MS: u64 = 2_000;

/// A reader whose only hold ends in [`DEAD_HOLD_MS`] and one whose hold lasts 30 s, on the lock
/// `name` of database `db` of `m`.
fn dead_and_live_readers(m: &mut Connection, name: &str, db: i64) {
    cmd(m, &["SELECT", &db.to_string()]);
    let lease = DEAD_HOLD_MS.to_string();
    assert_eq!(cmd(m, &["RWLOCK.ACQUIRE", name, "dead:1", "READ", &lease]), Value::Nil);
    assert_eq!(cmd(m, &["RWLOCK.ACQUIRE", name, "live:1", "READ", "30000"]), Value::Nil);
}

fn has_field(con: &mut Connection, key: &str, field: &str) -> bool {
    cmd(con, &["HEXISTS", key, field]) == Value::Int(1)
}

#[test]
fn a_promoted_replica_drops_a_dead_reader_untouched_and_its_owner_may_then_ask_to_write() {
    let master = Server::start();
    let replica = Server::builder().replica_of(&master).start();
    wait_replica_online(&master);
    let mut m = master.conn();
    // Two databases and Redisson's two name forms. The live reader keeps each hash 30 s: the
    // dead reader's field is left for the module to drop.
    let locks = [("rw", 0), ("app{7}:rw", 3)];
    for (name, db) in locks {
        dead_and_live_readers(&mut m, name, db);
    }
    let granted = Instant::now();
    let acked: i64 = redis::cmd("WAIT").arg(1).arg(5000).query(&mut m).expect("WAIT");
    assert_eq!(acked, 1, "the replica has the holds");
    cmd(&mut replica.conn(), &["REPLICAOF", "NO", "ONE"]);
    let mut r = replica.conn();
    r.set_read_timeout(Some(LIMIT)).expect("timeout");
    for (name, db) in locks {
        cmd(&mut r, &["SELECT", &db.to_string()]);
        assert!(has_field(&mut r, name, "dead:1"), "promoted with the dead reader of {name}");
    }
    for (name, db) in locks {
        cmd(&mut r, &["SELECT", &db.to_string()]);
        poll(&format!("the dead reader of {name} to leave the new master"), LIMIT, || {
            (!has_field(&mut r, name, "dead:1")).then_some(())
        });
        assert!(has_field(&mut r, name, "live:1"), "the live reader of {name} stays");
    }
    let took = granted.elapsed();
    assert!(took < Duration::from_millis(DEAD_HOLD_MS + 2_000), "at the hold's end: {took:?}");
    assert_eq!(info_field(&mut r, "rlock", "rlock_dead_reader_reaps"), 2);
    // Its owner holds nothing now: asking to write waits for the live reader (and times out),
    // never refused as an upgrade.
    cmd(&mut r, &["SELECT", "0"]);
    let asked =
        run_str(&mut r, &["RWLOCK.ACQUIRE", "rw", "dead:1", "WRITE", "5000", "WAIT", "100"]);
    assert!(matches!(asked, Ok(Value::Int(pttl)) if pttl > 0), "busy, not refused: {asked:?}");
}
