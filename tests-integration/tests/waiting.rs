//! Server-side waiting: `RLOCK.ACQUIRE ... WAIT timeout-ms` and the FIFO hand-off.

use std::io::Write;
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use redis::{Connection, Value};

use rlock_tests_integration::{
    blocked_clients, cmd, hgetall, info_field, pexpiretime, poll, run_str, wait_blocked,
    wait_link_up, Pending, Server,
};

const LIMIT: Duration = Duration::from_secs(10);

fn holder(con: &mut Connection, key: &str) -> Vec<(Vec<u8>, Vec<u8>)> {
    hgetall(con, key.as_bytes())
}

fn held_by(owner: &str, count: u64) -> Vec<(Vec<u8>, Vec<u8>)> {
    vec![(owner.as_bytes().to_vec(), count.to_string().into_bytes())]
}

/// Waits until exactly `n` clients are blocked.
fn until_blocked(con: &mut Connection, n: i64) {
    poll(&format!("{n} blocked clients"), LIMIT, || (blocked_clients(con) == n).then_some(()));
}

/// Starts a waiter and waits until it is queued (so waiters queue in start order).
fn wait_for(
    server: &Server,
    con: &mut Connection,
    key: &str,
    owner: &str,
    timeout: &str,
) -> Pending {
    let before = blocked_clients(con);
    let pending =
        Pending::start_str(server, &["RLOCK.ACQUIRE", key, owner, "30000", "WAIT", timeout]);
    until_blocked(con, before + 1);
    pending
}

#[test]
fn a_release_hands_the_lock_to_the_waiter_inside_the_release() {
    let server = Server::start();
    let mut con = server.conn();
    cmd(&mut con, &["RLOCK.ACQUIRE", "l", "a", "30000"]);
    let waiter = wait_for(&server, &mut con, "l", "b", "0");
    assert_eq!(cmd(&mut con, &["RLOCK.RELEASE", "l", "a"]), Value::Int(1));
    // The hand-off happened inside RELEASE: the waiter already holds the lock. (How fast its
    // reply arrives is a benchmark figure, BENCHMARKS.md, not a test's.)
    assert_eq!(holder(&mut con, "l"), held_by("b", 1));
    let (reply, _) = waiter.reply(LIMIT);
    assert_eq!(reply, Ok(Value::Nil));
    let pttl = cmd(&mut con, &["PTTL", "l"]);
    assert!(matches!(pttl, Value::Int(n) if n > 29_000), "the waiter's own lease: {pttl:?}");
    assert_eq!(blocked_clients(&mut con), 0);
}

#[test]
fn staggered_waiters_are_served_in_order_one_woken_per_release() {
    let server = Server::start();
    let mut con = server.conn();
    cmd(&mut con, &["RLOCK.ACQUIRE", "l", "h", "30000"]);
    let mut waiters: Vec<Pending> =
        ["w1", "w2", "w3"].iter().map(|w| wait_for(&server, &mut con, "l", w, "0")).collect();
    let mut current = "h";
    for (i, next) in ["w1", "w2", "w3"].iter().enumerate() {
        assert_eq!(cmd(&mut con, &["RLOCK.RELEASE", "l", current]), Value::Int(1));
        let first = waiters.remove(0);
        let (reply, _) = first.reply(LIMIT);
        assert_eq!(reply, Ok(Value::Nil), "{next}");
        assert_eq!(holder(&mut con, "l"), held_by(next, 1));
        let still_waiting = 2 - i as i64;
        assert_eq!(blocked_clients(&mut con), still_waiting, "exactly one woken");
        assert!(waiters.iter().all(|w| !w.replied()), "the others still wait");
        current = next;
    }
    assert_eq!(cmd(&mut con, &["RLOCK.RELEASE", "l", current]), Value::Int(1));
    assert_eq!(cmd(&mut con, &["EXISTS", "l"]), Value::Int(0));
}

#[test]
fn forty_waiters_are_served_in_arrival_order() {
    let server = Server::start();
    let mut con = server.conn();
    cmd(&mut con, &["RLOCK.ACQUIRE", "l", "holder", "30000"]);
    let waiters: Vec<Pending> =
        (0..40).map(|i| wait_for(&server, &mut con, "l", &format!("w{i:02}"), "0")).collect();
    let Value::Array(info) = cmd(&mut con, &["RLOCK.INFO", "l"]) else { panic!("info") };
    assert_eq!(info[7], Value::Int(40), "waiters in RLOCK.INFO: {info:?}");

    let mut current = "holder".to_owned();
    for (i, waiter) in waiters.into_iter().enumerate() {
        assert_eq!(cmd(&mut con, &["RLOCK.RELEASE", "l", &current]), Value::Int(1));
        current = format!("w{i:02}");
        assert_eq!(holder(&mut con, "l"), held_by(&current, 1), "served in order");
        assert_eq!(waiter.reply(LIMIT).0, Ok(Value::Nil));
    }
    assert_eq!(info_field(&mut con, "rlock", "rlock_handoffs"), 40);
}

#[test]
fn a_timeout_replies_the_holders_pttl_after_the_timeout() {
    let server = Server::start();
    let mut con = server.conn();
    cmd(&mut con, &["RLOCK.ACQUIRE", "l", "a", "60000"]);
    let started = Instant::now();
    let waiter = Pending::start_str(&server, &["RLOCK.ACQUIRE", "l", "b", "1000", "WAIT", "1000"]);
    let (reply, at) = waiter.reply(LIMIT);
    let waited = at - started;
    let Ok(Value::Int(pttl)) = reply else { panic!("{reply:?}") };
    assert!((57_000..=59_100).contains(&pttl), "the holder's remaining lease: {pttl}");
    // Never early (the server's ms clock may round the start down by under 1 ms); late only by
    // what a loaded 2-core machine may add (how prompt timeouts are is a benchmark figure).
    assert!(
        waited >= Duration::from_millis(995) && waited <= Duration::from_secs(3),
        "timed out after {waited:?}, not after 1 s"
    );
    assert_eq!(holder(&mut con, "l"), held_by("a", 1));
    assert_eq!(blocked_clients(&mut con), 0);
    assert_eq!(info_field(&mut con, "rlock", "rlock_timeouts"), 1);
}

#[test]
fn when_the_holders_lease_ends_the_head_waiter_holds_it_by_the_modules_own_timer() {
    let server = Server::start();
    let mut con = server.conn();
    // Redis's own expiry of idle keys is off: only the module's timer at the deadline can free
    // the lock. The figure (0-2 ms, p99) is measured by the benchmarks; here the grant must come
    // after the deadline, never before, with a margin a loaded 2-core machine keeps.
    cmd(&mut con, &["DEBUG", "SET-ACTIVE-EXPIRE", "0"]);
    for round in 0..5 {
        let key = format!("l{round}");
        cmd(&mut con, &["RLOCK.ACQUIRE", &key, "dead", "300"]);
        let deadline = pexpiretime(&mut con, key.as_bytes());
        let waiter =
            Pending::start_str(&server, &["RLOCK.ACQUIRE", &key, "next", "30000", "WAIT", "0"]);
        assert_eq!(waiter.reply(LIMIT).0, Ok(Value::Nil));
        // The grant time, on the server's clock: its lease is 30 000 ms from the grant.
        let granted_at = pexpiretime(&mut con, key.as_bytes()) - 30_000;
        let late = granted_at - deadline;
        assert!(
            (0..=1_000).contains(&late),
            "granted {late} ms after the deadline (round {round})"
        );
        assert_eq!(holder(&mut con, &key), held_by("next", 1));
    }
}

#[test]
fn del_forcerelease_and_flushall_hand_off_too() {
    let server = Server::start();
    let mut con = server.conn();
    cmd(&mut con, &["RLOCK.ACQUIRE", "l", "a", "30000"]);
    let w1 = wait_for(&server, &mut con, "l", "b", "0");
    let w2 = wait_for(&server, &mut con, "l", "c", "0");
    let w3 = wait_for(&server, &mut con, "l", "d", "0");

    cmd(&mut con, &["DEL", "l"]);
    assert_eq!(w1.reply(LIMIT).0, Ok(Value::Nil));
    assert_eq!(holder(&mut con, "l"), held_by("b", 1));

    assert_eq!(cmd(&mut con, &["RLOCK.FORCERELEASE", "l"]), Value::Int(1));
    assert_eq!(holder(&mut con, "l"), held_by("c", 1), "handed off inside FORCERELEASE");
    assert_eq!(w2.reply(LIMIT).0, Ok(Value::Nil));

    cmd(&mut con, &["FLUSHALL"]);
    assert_eq!(w3.reply(LIMIT).0, Ok(Value::Nil));
    assert_eq!(holder(&mut con, "l"), held_by("d", 1));
}

#[test]
fn a_newcomer_does_not_jump_the_queue() {
    let server = Server::start();
    let mut con = server.conn();
    cmd(&mut con, &["RLOCK.ACQUIRE", "l", "a", "30000"]);
    let waiter = wait_for(&server, &mut con, "l", "b", "0");
    // The lock is deleted behind the module's back, and a newcomer asks at once: the waiter
    // gets it first, whether the event's timer or the newcomer's command runs first.
    let (deleted, newcomer): (i64, Value) = redis::pipe()
        .cmd("DEL")
        .arg("l")
        .cmd("RLOCK.ACQUIRE")
        .arg("l")
        .arg("newcomer")
        .arg(30_000)
        .query(&mut con)
        .expect("pipeline");
    assert_eq!(deleted, 1);
    assert!(matches!(newcomer, Value::Int(n) if n > 0), "the newcomer waits: {newcomer:?}");
    assert_eq!(waiter.reply(LIMIT).0, Ok(Value::Nil));
    assert_eq!(holder(&mut con, "l"), held_by("b", 1));
}

#[test]
fn killed_and_unblocked_waiters_leave_the_queue_and_the_next_is_served() {
    let server = Server::start();
    let mut con = server.conn();
    cmd(&mut con, &["RLOCK.ACQUIRE", "l", "a", "60000"]);
    let killed = wait_for(&server, &mut con, "l", "killed", "0");
    let timed_out = wait_for(&server, &mut con, "l", "unblocked-timeout", "0");
    let errored = wait_for(&server, &mut con, "l", "unblocked-error", "0");
    let served = wait_for(&server, &mut con, "l", "served", "0");

    cmd(&mut con, &["CLIENT", "KILL", "ID", &killed.client_id().to_string()]);
    let (reply, _) = killed.reply(LIMIT);
    assert!(reply.is_err(), "the killed client's connection is gone: {reply:?}");

    let unblocked =
        cmd(&mut con, &["CLIENT", "UNBLOCK", &timed_out.client_id().to_string(), "TIMEOUT"]);
    assert_eq!(unblocked, Value::Int(1));
    let (reply, _) = timed_out.reply(LIMIT);
    assert!(
        matches!(reply, Ok(Value::Int(n)) if n > 50_000),
        "a timeout reply, the PTTL: {reply:?}"
    );

    let unblocked =
        cmd(&mut con, &["CLIENT", "UNBLOCK", &errored.client_id().to_string(), "ERROR"]);
    assert_eq!(unblocked, Value::Int(1));
    let (reply, _) = errored.reply(LIMIT);
    assert!(reply.as_ref().is_err_and(|e| e.starts_with("UNBLOCKED")), "{reply:?}");

    until_blocked(&mut con, 1);
    let Value::Array(info) = cmd(&mut con, &["RLOCK.INFO", "l"]) else { panic!("info") };
    assert_eq!(info[7], Value::Int(1), "only one waiter left");
    assert_eq!(cmd(&mut con, &["RLOCK.RELEASE", "l", "a"]), Value::Int(1));
    assert_eq!(served.reply(LIMIT).0, Ok(Value::Nil));
    assert_eq!(holder(&mut con, "l"), held_by("served", 1));
    assert_eq!(info_field(&mut con, "rlock", "rlock_left_while_waiting"), 3);
}

#[test]
fn wait_never_blocks_inside_multi_or_lua_or_when_reentering() {
    let server = Server::start();
    let mut con = server.conn();
    cmd(&mut con, &["RLOCK.ACQUIRE", "l", "a", "30000"]);
    let started = Instant::now();
    let (busy,): (i64,) = redis::pipe()
        .atomic()
        .cmd("RLOCK.ACQUIRE")
        .arg("l")
        .arg("b")
        .arg(1000)
        .arg("WAIT")
        .arg(0)
        .query(&mut con)
        .expect("MULTI/EXEC");
    assert!(busy > 0);
    let lua = cmd(
        &mut con,
        &["EVAL", "return redis.call('RLOCK.ACQUIRE', KEYS[1], 'b', 1000, 'WAIT', 0)", "1", "l"],
    );
    assert!(matches!(lua, Value::Int(n) if n > 0), "{lua:?}");
    assert_eq!(cmd(&mut con, &["RLOCK.ACQUIRE", "l", "a", "30000", "WAIT", "0"]), Value::Nil);
    assert_eq!(holder(&mut con, "l"), held_by("a", 2), "re-entered without blocking");
    assert!(started.elapsed() < Duration::from_secs(2));
    assert_eq!(blocked_clients(&mut con), 0);
    // A free lock with WAIT: taken at once.
    assert_eq!(cmd(&mut con, &["RLOCK.ACQUIRE", "free", "a", "30000", "WAIT", "0"]), Value::Nil);
}

#[test]
fn info_counts_waiters_and_the_module_section_counts_waits() {
    let server = Server::start();
    let mut con = server.conn();
    cmd(&mut con, &["RLOCK.ACQUIRE", "l", "a", "30000"]);
    let w1 = wait_for(&server, &mut con, "l", "b", "0");
    let w2 = wait_for(&server, &mut con, "l", "c", "0");
    let Value::Array(info) = cmd(&mut con, &["RLOCK.INFO", "l"]) else { panic!("info") };
    assert_eq!((&info[6], &info[7]), (&Value::BulkString(b"waiters".to_vec()), &Value::Int(2)));
    assert_eq!(info_field(&mut con, "rlock", "rlock_waiting_clients"), 2);
    assert_eq!(info_field(&mut con, "rlock", "rlock_waits"), 2);
    cmd(&mut con, &["RLOCK.RELEASE", "l", "a"]);
    cmd(&mut con, &["RLOCK.RELEASE", "l", "b"]);
    assert_eq!(w1.reply(LIMIT).0, Ok(Value::Nil));
    assert_eq!(w2.reply(LIMIT).0, Ok(Value::Nil));
    assert_eq!(info_field(&mut con, "rlock", "rlock_waiting_clients"), 0);
    assert_eq!(info_field(&mut con, "rlock", "rlock_handoffs"), 2);
}

#[test]
fn a_hand_off_publishes_nothing_a_release_without_waiters_publishes_zero() {
    let server = Server::start();
    let mut con = server.conn();
    let mut sub = server.conn();
    sub.set_read_timeout(Some(Duration::from_millis(300))).expect("timeout");
    let mut sub = sub.as_pubsub();
    sub.subscribe("redisson_lock__channel:{l}").expect("subscribe");
    cmd(&mut con, &["RLOCK.ACQUIRE", "l", "a", "30000"]);
    let waiter = wait_for(&server, &mut con, "l", "b", "0");
    cmd(&mut con, &["RLOCK.RELEASE", "l", "a"]);
    assert_eq!(waiter.reply(LIMIT).0, Ok(Value::Nil));
    assert!(sub.get_message().is_err(), "the lock never became free: no message");
    cmd(&mut con, &["RLOCK.RELEASE", "l", "b"]);
    sub.set_read_timeout(Some(LIMIT)).expect("timeout");
    assert_eq!(sub.get_message().expect("unlock message").get_payload_bytes(), b"0");
}

#[test]
fn a_replica_without_the_module_ends_with_the_waiter_as_holder() {
    let master = Server::start();
    let replica = Server::builder().without_module().replica_of(&master).start();
    let mut m = master.conn();
    let mut r = replica.conn();
    wait_link_up(&mut r);
    cmd(&mut m, &["RLOCK.ACQUIRE", "l", "a", "30000"]);
    let waiter = wait_for(&master, &mut m, "l", "b", "0");
    cmd(&mut m, &["RLOCK.RELEASE", "l", "a"]);
    assert_eq!(waiter.reply(LIMIT).0, Ok(Value::Nil));
    let expiry = pexpiretime(&mut m, b"l");
    poll("the grant on the replica", LIMIT, || {
        (holder(&mut r, "l") == held_by("b", 1)).then_some(())
    });
    assert_eq!(pexpiretime(&mut r, b"l"), expiry);

    // An expiry hand-off (from the module's timer) replicates too.
    cmd(&mut m, &["RLOCK.RENEW", "l", "b", "200"]);
    let waiter = wait_for(&master, &mut m, "l", "c", "0");
    assert_eq!(waiter.reply(LIMIT).0, Ok(Value::Nil));
    poll("the expiry hand-off on the replica", LIMIT, || {
        (holder(&mut r, "l") == held_by("c", 1)).then_some(())
    });
    assert_eq!(pexpiretime(&mut r, b"l"), pexpiretime(&mut m, b"l"));
    assert!(!replica.log().contains("unknown command"), "{}", replica.log());
}

#[test]
fn waiters_get_an_error_when_the_server_becomes_a_replica() {
    let server = Server::start();
    let other = Server::builder().without_module().start();
    let mut con = server.conn();
    cmd(&mut con, &["RLOCK.ACQUIRE", "l", "a", "30000"]);
    let waiter = wait_for(&server, &mut con, "l", "b", "0");
    cmd(&mut con, &["REPLICAOF", "127.0.0.1", &other.port().to_string()]);
    let (reply, _) = waiter.reply(LIMIT);
    // Redis 7.0 itself unblocks every blocked client with UNBLOCKED on demotion; the module's
    // own role-change handler answers READONLY where the server does not.
    assert!(
        reply.as_ref().is_err_and(|e| e.starts_with("UNBLOCKED") || e.starts_with("READONLY")),
        "{reply:?}"
    );
    let mut con = server.conn();
    assert_eq!(blocked_clients(&mut con), 0);
    assert_eq!(info_field(&mut con, "rlock", "rlock_waiting_clients"), 0, "the queue is empty");
}

#[test]
fn eight_processes_incrementing_under_wait_lose_nothing_and_never_overlap() {
    const PROCESSES: usize = 8;
    const ITERATIONS: usize = 200;
    let server = Server::start();
    let workers: Vec<_> = (0..PROCESSES)
        .map(|_| {
            Command::new(env!("CARGO_BIN_EXE_lock_worker"))
                .args([&server.url(), "counter-lock", "counter", &ITERATIONS.to_string()])
                .stdout(Stdio::piped())
                .spawn()
                .expect("worker")
        })
        .collect();
    let mut intervals: Vec<(u128, u128)> = Vec::new();
    for worker in workers {
        let out = worker.wait_with_output().expect("worker output");
        assert!(out.status.success(), "a worker failed: {}", String::from_utf8_lossy(&out.stderr));
        for line in String::from_utf8(out.stdout).expect("utf8").lines() {
            let (start, end) = line.split_once(' ').expect("interval");
            intervals.push((start.parse().expect("start"), end.parse().expect("end")));
        }
    }
    let mut con = server.conn();
    assert_eq!(cmd(&mut con, &["GET", "counter"]), Value::BulkString(b"1600".to_vec()));
    assert_eq!(intervals.len(), PROCESSES * ITERATIONS);
    intervals.sort_unstable();
    for pair in intervals.windows(2) {
        assert!(pair[1].0 > pair[0].1, "hold intervals overlap: {:?} and {:?}", pair[0], pair[1]);
    }
    assert_eq!(blocked_clients(&mut con), 0);
}

#[test]
fn an_evicted_lock_is_handed_to_its_waiter() {
    let server = Server::start();
    let mut con = server.conn();
    cmd(&mut con, &["RLOCK.ACQUIRE", "l", "a", "60000"]);
    let waiter = wait_for(&server, &mut con, "l", "b", "0");
    // The lock is the only key with a TTL: under volatile-ttl it is what gets evicted.
    cmd(&mut con, &["SET", "filler", &"x".repeat(10_000)]);
    cmd(&mut con, &["CONFIG", "SET", "maxmemory-policy", "volatile-ttl"]);
    cmd(&mut con, &["CONFIG", "SET", "maxmemory", "1"]);
    let (reply, _) = waiter.reply(LIMIT);
    cmd(&mut con, &["CONFIG", "SET", "maxmemory", "0"]);
    assert_eq!(reply, Ok(Value::Nil), "granted after the eviction");
    assert!(info_field(&mut con, "stats", "evicted_keys") >= 1);
    assert_eq!(info_field(&mut con, "rlock", "rlock_handoffs"), 1);
}

/// In one transaction, `owner` releases the lock `l` and the waiting client `gone` is killed,
/// in that order (`release_first`) or the other; returns (release reply, kill reply).
fn release_and_kill(
    con: &mut Connection,
    owner: &str,
    gone: &Pending,
    release_first: bool,
) -> (i64, i64) {
    let mut tx = redis::pipe();
    tx.atomic();
    let release = redis::cmd("RLOCK.RELEASE").arg("l").arg(owner).clone();
    let kill = redis::cmd("CLIENT").arg("KILL").arg("ID").arg(gone.client_id()).clone();
    if release_first {
        tx.add_command(release).add_command(kill);
        tx.query(con).expect("MULTI/EXEC")
    } else {
        tx.add_command(kill).add_command(release);
        let (killed, released): (i64, i64) = tx.query(con).expect("MULTI/EXEC");
        (released, killed)
    }
}

#[test]
fn a_waiter_gone_between_its_grant_and_its_reply_never_keeps_the_lock() {
    let server = Server::start();
    let mut con = server.conn();
    cmd(&mut con, &["RLOCK.ACQUIRE", "l", "h", "60000"]);
    let gone = wait_for(&server, &mut con, "l", "gone", "0");
    let next = wait_for(&server, &mut con, "l", "next", "0");
    // In one transaction: the release grants the lock to `gone`, then `gone` is killed before
    // Redis could send it the reply. Its hold is released and the next waiter is served.
    let (released, killed) = release_and_kill(&mut con, "h", &gone, true);
    assert_eq!((released, killed), (1, 1));
    assert!(gone.reply(LIMIT).0.is_err(), "the killed client got no grant");
    assert_eq!(next.reply(LIMIT).0, Ok(Value::Nil));
    assert_eq!(holder(&mut con, "l"), held_by("next", 1));
    assert_eq!(info_field(&mut con, "rlock", "rlock_grants_rolled_back"), 1);

    // The same with nobody else waiting: the lock ends free, and Redisson waiters are told.
    let gone = wait_for(&server, &mut con, "l", "gone-too", "0");
    let mut sub = server.conn();
    sub.set_read_timeout(Some(LIMIT)).expect("timeout");
    let mut sub = sub.as_pubsub();
    sub.subscribe("redisson_lock__channel:{l}").expect("subscribe");
    release_and_kill(&mut con, "next", &gone, true);
    assert!(gone.reply(LIMIT).0.is_err());
    assert_eq!(sub.get_message().expect("unlock message").get_payload_bytes(), b"0");
    assert_eq!(cmd(&mut con, &["RLOCK.PTTL", "l"]), Value::Int(-2));
    assert_eq!(blocked_clients(&mut con), 0);
}

#[test]
fn a_waiter_killed_before_the_release_is_never_granted() {
    let server = Server::start();
    let mut con = server.conn();
    cmd(&mut con, &["RLOCK.ACQUIRE", "l", "h", "60000"]);
    let gone = wait_for(&server, &mut con, "l", "gone", "0");
    let (released, killed) = release_and_kill(&mut con, "h", &gone, false);
    assert_eq!((killed, released), (1, 1));
    assert!(gone.reply(LIMIT).0.is_err());
    assert_eq!(cmd(&mut con, &["RLOCK.PTTL", "l"]), Value::Int(-2), "nobody got it");
    assert_eq!(info_field(&mut con, "rlock", "rlock_handoffs"), 0);
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

#[test]
fn a_wait_ending_on_a_key_of_another_type_replies_wrongtype() {
    let server = Server::start();
    let mut con = server.conn();
    cmd(&mut con, &["RLOCK.ACQUIRE", "k", "h", "60000"]);
    let waiter = Pending::start_str(&server, &["RLOCK.ACQUIRE", "k", "w", "30000", "WAIT", "400"]);
    wait_blocked(&mut con, 1);
    cmd(&mut con, &["MULTI"]);
    cmd(&mut con, &["DEL", "k"]);
    cmd(&mut con, &["SET", "k", "a string"]);
    cmd(&mut con, &["EXEC"]);
    let (reply, _) = waiter.reply(LIMIT);
    assert!(reply.as_ref().is_err_and(|e| e.starts_with("WRONGTYPE")), "{reply:?}");
}

fn wait(server: &Server, con: &mut Connection, owner: &str, lease: &str) -> Pending {
    let before = blocked_clients(con);
    let pending = Pending::start_str(server, &["RLOCK.ACQUIRE", "l", owner, lease, "WAIT", "0"]);
    poll("the waiter to block", LIMIT, || (blocked_clients(con) == before + 1).then_some(()));
    pending
}

#[test]
fn exactly_one_waiter_is_woken_per_del_unlink_flushdb_and_expiry() {
    let server = Server::start();
    let mut con = server.conn();
    cmd(&mut con, &["RLOCK.ACQUIRE", "l", "h", "60000"]);
    let w1 = wait(&server, &mut con, "w1", "60000");
    let w2 = wait(&server, &mut con, "w2", "60000");
    let w3 = wait(&server, &mut con, "w3", "300");
    let w4 = wait(&server, &mut con, "w4", "60000");
    let w5 = wait(&server, &mut con, "w5", "60000");
    let mut waiting = 5;
    for (event, served, owner) in [
        (Some(&["DEL", "l"][..]), w1, "w1"),
        (Some(&["UNLINK", "l"]), w2, "w2"),
        (Some(&["FLUSHDB"]), w3, "w3"),
        (None, w4, "w4"), // w3's 300 ms lease runs out
    ] {
        if let Some(event) = event {
            cmd(&mut con, event);
        }
        assert_eq!(served.reply(LIMIT).0, Ok(Value::Nil), "{owner} after {event:?}");
        waiting -= 1;
        // The hand-off is one step: had it woken more than one, they would be gone already.
        assert_eq!(blocked_clients(&mut con), waiting, "after {event:?}");
        assert_eq!(hgetall(&mut con, b"l"), vec![(owner.as_bytes().to_vec(), b"1".to_vec())]);
    }
    assert_eq!(info_field(&mut con, "rlock", "rlock_handoffs"), 4);
    cmd(&mut con, &["DEL", "l"]);
    assert_eq!(w5.reply(LIMIT).0, Ok(Value::Nil));
}

#[test]
fn a_waiter_that_just_disconnects_leaves_the_queue() {
    let server = Server::start();
    let mut con = server.conn();
    cmd(&mut con, &["RLOCK.ACQUIRE", "l", "h", "60000"]);
    // A bare socket: send the blocking command, then close the socket (no QUIT, no kill).
    let mut socket = TcpStream::connect(("127.0.0.1", server.port())).expect("connect");
    socket
        .write_all(b"*6\r\n$13\r\nRLOCK.ACQUIRE\r\n$1\r\nl\r\n$4\r\ngone\r\n$5\r\n60000\r\n$4\r\nWAIT\r\n$1\r\n0\r\n")
        .expect("send");
    poll("the waiter to block", LIMIT, || (blocked_clients(&mut con) == 1).then_some(()));
    let next = wait(&server, &mut con, "next", "60000");
    drop(socket);
    poll("the gone waiter to leave", LIMIT, || {
        (info_field(&mut con, "rlock", "rlock_left_while_waiting") == 1).then_some(())
    });
    assert_eq!(info_field(&mut con, "rlock", "rlock_waiting_clients"), 1);
    assert_eq!(cmd(&mut con, &["RLOCK.RELEASE", "l", "h"]), Value::Int(1));
    assert_eq!(next.reply(LIMIT).0, Ok(Value::Nil), "the next waiter, not the gone one");
    assert_eq!(hgetall(&mut con, b"l"), vec![(b"next".to_vec(), b"1".to_vec())]);
}
