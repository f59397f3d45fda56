//! The replica guard where it does not belong: it refuses grants, and only grants. A latch
//! grants nothing, so its awaiters are answered whatever the guard says; the smallest
//! `rlock.stall-ms` the module accepts never makes a healthy master refuse (the cron's own gap
//! is no stall); and a refusal says which rule refused, in its reply and in `INFO rlock`.

use std::time::{Duration, Instant};

use redis::{Connection, Value};
use rlock_tests_integration::{
    cmd, info_field, info_text, poll, queue_str, run_str, wait_replica_online, Server,
};

const LIMIT: Duration = Duration::from_secs(20);

fn refusal(con: &mut Connection) -> Option<String> {
    match run_str(con, &["RLOCK.ACQUIRE", "g", "a", "60000"]) {
        Err(e) if e.starts_with("NOREPLICAS ") => Some(e),
        Err(e) => panic!("another error: {e}"),
        Ok(_) => {
            cmd(con, &["RLOCK.RELEASE", "g", "a"]);
            None
        }
    }
}

/// A master whose guard refuses every grant: it requires a replica and has none.
fn refusing_master() -> (Server, Connection) {
    let server = Server::start();
    let mut con = server.conn();
    cmd(&mut con, &["CONFIG", "SET", "rlock.min-replicas", "1"]);
    poll("the guard to refuse", LIMIT, || refusal(&mut con).map(|_| ()));
    (server, con)
}

#[test]
fn a_latch_counted_down_while_the_guard_refuses_grants_answers_its_awaiters() {
    let (server, mut con) = refusing_master();
    for opening in [&["RLATCH.COUNTDOWN", "l"][..], &["RLATCH.DELETE", "l"]] {
        assert_eq!(cmd(&mut con, &["RLATCH.SETCOUNT", "l", "1"]), Value::Int(1));
        let mut other = server.conn();
        let first = queue_str(&server, &mut other, &["RLATCH.AWAIT", "l", "5000"]);
        let second = queue_str(&server, &mut other, &["RLATCH.AWAIT", "l", "5000"]);
        cmd(&mut con, opening);
        // Set again at once, before any poll: an awaiter answered only when grants resume
        // would never see this opening.
        assert_eq!(cmd(&mut con, &["RLATCH.SETCOUNT", "l", "1"]), Value::Int(1), "{opening:?}");
        for waiter in [first, second] {
            assert_eq!(
                waiter.reply(LIMIT).0,
                Ok(Value::Int(1)),
                "{opening:?}: opened, not timed out"
            );
        }
        assert!(refusal(&mut con).is_some(), "the guard still refuses grants");
        cmd(&mut con, &["DEL", "l"]);
    }
}

#[test]
fn a_latch_deleted_by_a_plain_del_while_the_guard_refuses_is_seen_at_the_next_poll() {
    let (server, mut con) = refusing_master();
    assert_eq!(cmd(&mut con, &["RLATCH.SETCOUNT", "l", "1"]), Value::Int(1));
    let mut other = server.conn();
    let waiter = queue_str(&server, &mut other, &["RLATCH.AWAIT", "l", "5000"]);
    let started = Instant::now();
    cmd(&mut con, &["DEL", "l"]);
    assert_eq!(waiter.reply(LIMIT).0, Ok(Value::Int(1)));
    assert!(started.elapsed() < Duration::from_secs(4), "at a poll, not at the timeout");
}

#[test]
fn the_smallest_stall_setting_keeps_a_healthy_master_granting() {
    let master = Server::start();
    let mut con = master.conn();
    let _replica = Server::builder().replica_of(&master).start();
    wait_replica_online(&master);
    poll("the master to count its replica", LIMIT, || {
        (info_field(&mut con, "rlock_replicas", "rlock_replicas_in_sync") == 1).then_some(())
    });
    poll("grants to be allowed", LIMIT, || refusal(&mut con).is_none().then_some(()));
    // The least value the setting accepts.
    assert_eq!(cmd(&mut con, &["CONFIG", "SET", "rlock.stall-ms", "100"]), Value::Okay);
    assert!(run_str(&mut con, &["CONFIG", "SET", "rlock.stall-ms", "99"]).is_err());
    let mut refused = Vec::new();
    for i in 0..40 {
        std::thread::sleep(Duration::from_millis(50));
        if let Some(e) = refusal(&mut con) {
            refused.push((i, e));
        }
    }
    assert!(refused.is_empty(), "{} of 40 acquires refused: {refused:?}", refused.len());
    assert_eq!(info_text(&mut con, "rlock", "rlock_guard_refuses"), "none");
}

/// A change of `hz` on a healthy master: the gap that spans it ran at the old cron period, and
/// the last check made at a short period stays valid until the first at a long one; neither is
/// a stall nor a stale check.
#[test]
fn changing_hz_keeps_a_healthy_master_granting() {
    let master = Server::builder().config("hz", "1").start();
    let mut con = master.conn();
    let _replica = Server::builder().replica_of(&master).start();
    wait_replica_online(&master);
    poll("grants to be allowed", LIMIT, || refusal(&mut con).is_none().then_some(()));
    assert_eq!(cmd(&mut con, &["CONFIG", "SET", "rlock.stall-ms", "100"]), Value::Okay);
    for (from, to) in [("1", "500"), ("500", "1"), ("1", "100"), ("100", "1")] {
        assert_eq!(cmd(&mut con, &["CONFIG", "SET", "hz", from]), Value::Okay);
        // Two checks at the old period (one second apart at hz 1).
        std::thread::sleep(Duration::from_millis(2_100));
        poll("grants to be allowed", LIMIT, || refusal(&mut con).is_none().then_some(()));
        assert_eq!(cmd(&mut con, &["CONFIG", "SET", "hz", to]), Value::Okay);
        let mut refused = Vec::new();
        for i in 0..60 {
            std::thread::sleep(Duration::from_millis(25));
            if let Some(e) = refusal(&mut con) {
                refused.push((i, e));
            }
        }
        assert!(
            refused.is_empty(),
            "hz {from} -> {to}: {} of 60 refused: {refused:?}",
            refused.len()
        );
    }
}

#[test]
fn a_refusal_names_the_rule_that_refused_in_its_reply_and_in_info() {
    let (_server, mut con) = refusing_master();
    let reply = refusal(&mut con).expect("refused");
    assert!(reply.contains("too few of its replicas are in sync"), "{reply}");
    assert_eq!(info_text(&mut con, "rlock", "rlock_guard_refuses"), "too_few_replicas");
    assert_eq!(info_field(&mut con, "rlock_replicas", "rlock_grants_allowed"), 0);
    assert_eq!(info_field(&mut con, "rlock_replicas", "rlock_stall_threshold_ms"), 1500);

    // A stall over the threshold: the quarantine, named as such.
    let master = Server::start();
    let mut con = master.conn();
    let _replica = Server::builder().replica_of(&master).start();
    wait_replica_online(&master);
    poll("grants to be allowed", LIMIT, || refusal(&mut con).is_none().then_some(()));
    let mut stall = master.conn();
    stall.set_read_timeout(Some(LIMIT)).expect("timeout");
    cmd(&mut stall, &["DEBUG", "SLEEP", "2"]);
    let reply = poll("the quarantine to refuse", LIMIT, || {
        refusal(&mut con).filter(|e| e.contains("stalled"))
    });
    assert!(reply.contains("rlock.stall-ms"), "{reply}");
    assert_eq!(info_text(&mut con, "rlock", "rlock_guard_refuses"), "stall_quarantine");
    poll("the quarantine to end", LIMIT, || refusal(&mut con).is_none().then_some(()));
    assert_eq!(info_text(&mut con, "rlock", "rlock_guard_refuses"), "none");
}
