//! The replica guard where it does not belong: it refuses grants, and only grants. A latch
//! grants nothing, so its awaiters are answered whatever the guard says; the smallest
//! `rlock.stall-ms` the module accepts never makes a healthy master refuse (the cron's own gap
//! is no stall); and a refusal says which rule refused, in its reply and in `INFO rlock`.

use std::time::{Duration, Instant};

use redis::{Connection, Value};

use rlock_tests_integration::{
    attach_replica, cmd, info_field, info_text, poll, queue_str, run_str, wait_blocked,
    wait_replica_online, Pending, Server,
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

/// A held reentrant lock and a semaphore whose one permit is leased, both for `lease_ms`, each
/// with a waiter; returns the two waiters (lock, semaphore).
fn held_with_waiters(master: &Server, con: &mut Connection, lease_ms: &str) -> (Pending, Pending) {
    assert_eq!(cmd(con, &["RLOCK.ACQUIRE", "l", "h", lease_ms]), Value::Nil);
    assert_eq!(cmd(con, &["RSEM.SETPERMITS", "s", "1"]), Value::Int(1));
    let ids = cmd(con, &["RSEM.ACQUIRE", "s", "1", "LEASE", lease_ms]);
    assert!(matches!(ids, Value::Array(ref a) if a.len() == 1), "{ids:?}");
    let lock = Pending::start_str(master, &["RLOCK.ACQUIRE", "l", "w", "60000", "WAIT", "0"]);
    let sem = Pending::start_str(master, &["RSEM.ACQUIRE", "s", "1", "WAIT", "0"]);
    wait_blocked(con, 2);
    (lock, sem)
}

fn both_served(lock: Pending, sem: Pending) {
    let (reply, _) = lock.reply(LIMIT);
    assert_eq!(reply, Ok(Value::Nil), "the lock's waiter is granted");
    let (reply, _) = sem.reply(LIMIT);
    assert_eq!(reply, Ok(Value::Int(1)), "the semaphore's waiter is granted");
}

#[test]
fn waiters_held_back_by_a_stall_quarantine_are_served_when_it_ends() {
    let master = Server::start();
    let mut con = master.conn();
    let _replica = attach_replica(&master, &mut con, LIMIT);
    let (lock, sem) = held_with_waiters(&master, &mut con, "1500");
    // A 2 s stall starts the grant quarantine; both leases end inside it.
    let mut stall = master.conn();
    stall.set_read_timeout(Some(LIMIT)).expect("timeout");
    cmd(&mut stall, &["DEBUG", "SLEEP", "2"]);
    poll("the quarantine to refuse grants", LIMIT, || {
        let allowed = info_field(&mut con, "rlock_replicas", "rlock_grants_allowed");
        (allowed == 0).then_some(())
    });
    both_served(lock, sem);
}

#[test]
fn waiters_held_back_by_a_lost_replica_are_served_when_the_guard_is_turned_off() {
    let master = Server::start();
    let mut con = master.conn();
    let replica = attach_replica(&master, &mut con, LIMIT);
    let (lock, sem) = held_with_waiters(&master, &mut con, "800");
    // The replica leaves (promoted by hand): the master refuses grants, and the leases end.
    cmd(&mut replica.conn(), &["REPLICAOF", "NO", "ONE"]);
    poll("the master to refuse grants", LIMIT, || {
        (info_field(&mut con, "rlock_replicas", "rlock_grants_allowed") == 0).then_some(())
    });
    poll("both leases to end", LIMIT, || {
        let lock = cmd(&mut con, &["RLOCK.PTTL", "l"]) == Value::Int(-2);
        let leased = cmd(&mut con, &["ZCARD", "{s}:timeout"]);
        let ended = cmd(&mut con, &["ZCOUNT", "{s}:timeout", "(0", "+inf"]) == Value::Int(0)
            || leased == Value::Int(0);
        (lock && ended).then_some(())
    });
    // What the README tells an operator to do.
    cmd(&mut con, &["CONFIG", "SET", "rlock.min-replicas", "0"]);
    both_served(lock, sem);
}

fn refused(con: &mut Connection, key: &str) -> bool {
    matches!(run_str(con, &["RLOCK.ACQUIRE", key, "a", "60000"]), Err(e) if e.starts_with("NOREPLICAS"))
}

#[test]
fn a_master_restarted_before_its_failover_is_noticed_grants_nothing_until_a_replica_is_back() {
    let mut master = Server::start();
    let mut con = master.conn();
    assert!(!master.dir().join("rlock-had-replicas").exists(), "nothing to remember yet");
    let mut replica = attach_replica(&master, &mut con, LIMIT);
    poll("the master to remember its replica", LIMIT, || {
        master.dir().join("rlock-had-replicas").exists().then_some(())
    });
    // The replica goes (promoted elsewhere, say), and the master restarts before anything
    // demotes it: it must not grant as a standalone server.
    replica.kill();
    master.restart();
    let mut con = master.conn();
    assert_eq!(info_field(&mut con, "rlock_replicas", "rlock_replicas_required"), 1);
    assert!(refused(&mut con, "l"), "a restarted master that had replicas grants nothing");
    // A replica in sync again: grants resume.
    let _replica = attach_replica(&master, &mut con, LIMIT);
    poll("grants with the replica back", LIMIT, || {
        (run_str(&mut con, &["RLOCK.ACQUIRE", "l", "a", "60000"]) == Ok(Value::Nil)).then_some(())
    });
    // The documented opt-out still works on a restarted master.
    drop(_replica);
    master.restart();
    let mut con = master.conn();
    assert!(refused(&mut con, "m"));
    cmd(&mut con, &["CONFIG", "SET", "rlock.min-replicas", "0"]);
    assert_eq!(run_str(&mut con, &["RLOCK.ACQUIRE", "m", "a", "60000"]), Ok(Value::Nil));
}

#[test]
fn a_stall_over_the_operators_threshold_is_quarantined() {
    let master = Server::builder().config("rlock.stall-ms", "800").start();
    let mut con = master.conn();
    let _replica = attach_replica(&master, &mut con, LIMIT);
    assert_eq!(run_str(&mut con, &["RLOCK.ACQUIRE", "l", "a", "60000"]), Ok(Value::Nil));
    // A 1.1 s stall: under the old fixed 1.5 s threshold, above the operator's 0.8 s.
    cmd(&mut con, &["DEBUG", "SLEEP", "1.1"]);
    let resumed = std::time::Instant::now();
    poll("a check after the stall", LIMIT, || {
        (info_field(&mut con, "rlock_replicas", "rlock_grants_allowed") == 0).then_some(())
    });
    assert!(refused(&mut con, "m"), "quarantined after the stall");
    let granted_at = poll("grants after the quarantine", LIMIT, || {
        (run_str(&mut con, &["RLOCK.ACQUIRE", "m", "a", "60000"]) == Ok(Value::Nil))
            .then(std::time::Instant::now)
    });
    assert!(granted_at - resumed >= Duration::from_millis(2_500), "no quarantine");
    // The setting is the module's own, checked like the others.
    let err = run_str(&mut con, &["CONFIG", "SET", "rlock.stall-ms", "50"]).expect_err("50");
    assert!(err.starts_with("ERR"), "{err}");
}

/// A `REQUEST` retry of a grant still in place is refused by a guard that refuses grants, as a
/// fresh acquire is: the replay is a grant's answer, and a master that may have been replaced
/// gives none (the caller retries on the current master, where the id makes it exact).
#[test]
fn a_request_retry_of_a_grant_in_place_is_refused_while_the_guard_refuses() {
    let server = Server::start();
    let mut con = server.conn();
    let acquires: [&[&str]; 3] = [
        &["RLOCK.ACQUIRE", "l", "o", "60000", "REQUEST", "r1"],
        &["RWLOCK.ACQUIRE", "rw", "o", "WRITE", "60000", "REQUEST", "r2"],
        &["RSEM.ACQUIRE", "s", "1", "LEASE", "60000", "REQUEST", "r3"],
    ];
    cmd(&mut con, &["RSEM.SETPERMITS", "s", "1"]);
    for acquire in acquires {
        run_str(&mut con, acquire).unwrap_or_else(|e| panic!("{acquire:?}: {e}"));
    }
    cmd(&mut con, &["CONFIG", "SET", "rlock.min-replicas", "1"]);
    poll("the guard to refuse", LIMIT, || refusal(&mut con).map(|_| ()));
    for acquire in acquires {
        let retry = run_str(&mut con, acquire);
        assert!(
            matches!(&retry, Err(e) if e.starts_with("NOREPLICAS ")),
            "{acquire:?} retried: {retry:?}"
        );
    }
    // The refusal order: a `SESSION` acquire that could never bind (inside a script) is told
    // so first, before the guard's refusal.
    let script = "return redis.call('RLOCK.ACQUIRE', KEYS[1], 'o', '60000', 'SESSION')";
    let in_script = run_str(&mut con, &["EVAL", script, "1", "n"]);
    assert!(
        matches!(&in_script, Err(e) if e.contains("SESSION needs the caller's own connection")),
        "{in_script:?}"
    );
}
