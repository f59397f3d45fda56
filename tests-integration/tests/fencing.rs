//! Fencing tokens: `RLOCK.ACQUIRE ... TOKEN`, strictly increasing per lock name.

use std::time::Duration;

use redis::{Connection, Value};

use rlock_client::{LockClient, Options};
use rlock_tests_integration::{
    blocked_clients, cmd, digest, exists, granted_token, hgetall, poll, run_str, wait_blocked,
    wait_link_up, Pending, Server,
};

const LIMIT: Duration = Duration::from_secs(10);

fn acquire_token(con: &mut Connection, key: &str, owner: &str, lease: &str) -> i64 {
    granted_token(&cmd(con, &["RLOCK.ACQUIRE", key, owner, lease, "TOKEN"]))
}

#[test]
fn tokens_increase_across_every_kind_of_grant() {
    let server = Server::start();
    let mut con = server.conn();
    let mut seen = vec![acquire_token(&mut con, "l", "a", "30000")];
    seen.push(acquire_token(&mut con, "l", "a", "30000")); // re-entry, as Redisson's RFencedLock
    let busy = cmd(&mut con, &["RLOCK.ACQUIRE", "l", "b", "30000", "TOKEN"]);
    assert!(
        matches!(&busy, Value::Array(p) if p[0] == Value::Int(0) && matches!(p[1], Value::Int(n) if n > 0)),
        "{busy:?}"
    );
    cmd(&mut con, &["RLOCK.RELEASE", "l", "a"]);
    cmd(&mut con, &["RLOCK.RELEASE", "l", "a"]);
    seen.push(acquire_token(&mut con, "l", "b", "100")); // after a release
    poll("the lease to end", LIMIT, || {
        (cmd(&mut con, &["RLOCK.PTTL", "l"]) == Value::Int(-2)).then_some(())
    });
    seen.push(acquire_token(&mut con, "l", "c", "30000")); // after an expiry
    cmd(&mut con, &["RLOCK.FORCERELEASE", "l"]);
    seen.push(acquire_token(&mut con, "l", "d", "30000")); // after a force-release
                                                           // A hand-off to a waiter that asked for a token.
    let waiter =
        Pending::start_str(&server, &["RLOCK.ACQUIRE", "l", "e", "30000", "WAIT", "0", "TOKEN"]);
    poll("the waiter", LIMIT, || (blocked_clients(&mut con) == 1).then_some(()));
    cmd(&mut con, &["RLOCK.RELEASE", "l", "d"]);
    seen.push(granted_token(&waiter.reply(LIMIT).0.expect("granted")));
    // A plain acquire (no TOKEN) does not move the counter.
    cmd(&mut con, &["RLOCK.RELEASE", "l", "e"]);
    cmd(&mut con, &["RLOCK.ACQUIRE", "l", "f", "30000"]);
    cmd(&mut con, &["RLOCK.RELEASE", "l", "f"]);
    seen.push(acquire_token(&mut con, "l", "g", "30000"));

    assert!(seen.windows(2).all(|w| w[1] > w[0]), "strictly increasing: {seen:?}");
    assert_eq!(seen, (1..=7).collect::<Vec<i64>>());
    let Value::Array(info) = cmd(&mut con, &["RLOCK.INFO", "l"]) else { panic!("info") };
    assert_eq!((&info[8], &info[9]), (&Value::BulkString(b"token".to_vec()), &Value::Int(7)));
    assert_eq!(
        cmd(&mut con, &["GET", "redisson_lock_token:{l}"]),
        Value::BulkString(b"7".to_vec())
    );
    // Another lock name has its own counter.
    assert_eq!(acquire_token(&mut con, "other", "a", "30000"), 1);
}

#[test]
fn a_wait_that_times_out_with_token_replies_zero_and_the_pttl() {
    let server = Server::start();
    let mut con = server.conn();
    cmd(&mut con, &["RLOCK.ACQUIRE", "l", "a", "60000"]);
    let reply = cmd(&mut con, &["RLOCK.ACQUIRE", "l", "b", "1000", "TOKEN", "WAIT", "100"]);
    assert!(
        matches!(&reply, Value::Array(p) if p[0] == Value::Int(0) && matches!(p[1], Value::Int(n) if n > 50_000)),
        "{reply:?}"
    );
}

#[test]
fn a_bad_token_counter_is_refused_and_nothing_changes() {
    let server = Server::start();
    let mut con = server.conn();
    cmd(&mut con, &["SET", "redisson_lock_token:{l}", "not a number"]);
    cmd(&mut con, &["HSET", "redisson_lock_token:{h}", "x", "1"]);
    let before = digest(&mut con);
    let err =
        run_str(&mut con, &["RLOCK.ACQUIRE", "l", "a", "30000", "TOKEN"]).expect_err("corrupt");
    assert!(err.starts_with("ERR the fencing token counter"), "{err}");
    let err =
        run_str(&mut con, &["RLOCK.ACQUIRE", "h", "a", "30000", "TOKEN"]).expect_err("wrong type");
    assert!(err.starts_with("WRONGTYPE"), "{err}");
    assert_eq!(digest(&mut con), before, "no lock taken, no counter touched");
    let err = run_str(&mut con, &["RLOCK.ACQUIRE", "l", "a", "30000", "TOKEN", "TOKEN"])
        .expect_err("twice");
    assert_eq!(err, "ERR syntax error");
}

#[test]
fn tokens_keep_increasing_across_an_aof_restart_and_a_failover() {
    let mut server =
        Server::builder().config("appendonly", "yes").config("appendfsync", "always").start();
    let mut con = server.conn();
    for owner in ["a", "b", "c"] {
        acquire_token(&mut con, "l", owner, "30000");
        cmd(&mut con, &["RLOCK.RELEASE", "l", owner]);
    }
    let before_restart = rlock_tests_integration::server_time_ms(&mut con);
    drop(con);
    server.restart();
    let mut con = server.conn();
    // A restart may have lost grants the last fsync missed: tokens jump above the floor the
    // restart raised (its time in ms x 1,000,000), beyond any token issued before it.
    let d = acquire_token(&mut con, "l", "d", "30000");
    assert!(d > 3, "the counter survived the restart: {d}");
    assert!(d >= before_restart * 1_000_000, "{d} is above the restart's floor");

    // A replica (with the module) promoted: the counter came along, and the promotion raised
    // the floor again, above anything the old master issued (even unreplicated).
    let replica = Server::builder().replica_of(&server).start();
    let mut r = replica.conn();
    wait_link_up(&mut r);
    cmd(&mut con, &["RLOCK.RELEASE", "l", "d"]);
    let e = acquire_token(&mut con, "l", "e", "30000");
    assert_eq!(e, d + 1, "one master issues consecutive tokens");
    poll("the counter on the replica", LIMIT, || {
        (cmd(&mut r, &["GET", "redisson_lock_token:{l}"])
            == Value::BulkString(e.to_string().into_bytes()))
        .then_some(())
    });
    // The old master goes on issuing tokens the replica never sees (a split brain).
    cmd(&mut con, &["CONFIG", "SET", "rlock.min-replicas", "0"]);
    cmd(&mut r, &["REPLICAOF", "NO", "ONE"]);
    let before_promotion = rlock_tests_integration::server_time_ms(&mut r);
    cmd(&mut con, &["RLOCK.RELEASE", "l", "e"]);
    let unreplicated = acquire_token(&mut con, "l", "x", "30000");
    cmd(&mut r, &["RLOCK.FORCERELEASE", "l"]);
    let f = acquire_token(&mut r, "l", "f", "30000");
    assert!(
        f > unreplicated,
        "the promoted replica goes above the old master: {f} > {unreplicated}"
    );
    assert!(f >= (before_promotion - 1000) * 1_000_000, "{f} is above the promotion's floor");
}

/// A resource that checks tokens: it refuses a write whose token is older than the newest it
/// has seen (KEYS[1] = resource; ARGV = token, value).
const GUARDED_WRITE: &str = r"
local newest = tonumber(redis.call('hget', KEYS[1], 'token') or '0')
if tonumber(ARGV[1]) < newest then return 0 end
redis.call('hset', KEYS[1], 'token', ARGV[1], 'value', ARGV[2])
return 1";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_holder_s_stale_write_is_refused_by_a_resource_that_checks_tokens() {
    let server = Server::start();
    let client = LockClient::with_options(server.client(), Options::default().fencing(true))
        .await
        .expect("client");
    let script = redis::Script::new(GUARDED_WRITE);
    let mut con = server.client().get_multiplexed_async_connection().await.expect("con");

    // A takes the lock with a short lease, then stalls (GC, swap, a paused VM) past it.
    let a = client.lock("job").acquire(Some(Duration::from_millis(200))).await.expect("A");
    let token_a = a.token().expect("A's token");
    tokio::time::sleep(Duration::from_millis(400)).await;

    // Meanwhile B takes the lock (A's lease ran out) and writes.
    let b = client.lock("job").try_acquire(LIMIT, Some(Duration::from_secs(30))).await.expect("B");
    let token_b = b.token().expect("B's token");
    assert!(token_b > token_a, "{token_b} > {token_a}");
    let written: i64 = script
        .key("resource")
        .arg(token_b)
        .arg("from B")
        .invoke_async(&mut con)
        .await
        .expect("B writes");
    assert_eq!(written, 1);

    // A wakes up, still believing it holds the lock, and writes: refused.
    let written: i64 = script
        .key("resource")
        .arg(token_a)
        .arg("from A")
        .invoke_async(&mut con)
        .await
        .expect("A writes");
    assert_eq!(written, 0, "the stale holder's write is refused");
    let value: String =
        redis::cmd("HGET").arg("resource").arg("value").query_async(&mut con).await.expect("HGET");
    assert_eq!(value, "from B");
    assert!(matches!(a.release().await, Err(rlock_client::Error::NotHeld)));
    b.release().await.expect("release");
}

fn get(con: &mut Connection, key: &str) -> Option<String> {
    redis::cmd("GET").arg(key).query(con).expect("GET")
}

/// `MULTI; DEL k; RLOCK.ACQUIRE k X ... TOKEN; EXEC` with a TOKEN waiter queued: the acquire hands
/// the lock to the waiter first; the two grants must never share a token.
fn nested_handoff_tokens(caller: &str) {
    let server = Server::start();
    let mut con = server.conn();
    cmd(&mut con, &["RLOCK.ACQUIRE", "k", "h", "60000"]);
    let waiter =
        Pending::start_str(&server, &["RLOCK.ACQUIRE", "k", "X", "60000", "WAIT", "0", "TOKEN"]);
    wait_blocked(&mut con, 1);
    cmd(&mut con, &["MULTI"]);
    cmd(&mut con, &["DEL", "k"]);
    cmd(&mut con, &["RLOCK.ACQUIRE", "k", caller, "60000", "TOKEN"]);
    let Value::Array(results) = cmd(&mut con, &["EXEC"]) else { panic!("EXEC") };
    let (reply, _) = waiter.reply(LIMIT);
    let first = granted_token(&reply.expect("the waiter's reply"));
    assert_eq!(first, 1, "the waiter is served first");
    let counter: i64 = get(&mut con, "redisson_lock_token:{k}").expect("counter").parse().unwrap();
    match &results[1] {
        // Same owner: it re-entered after the hand-off, with the next token.
        Value::Array(_) if caller == "X" => {
            assert_eq!(granted_token(&results[1]), 2);
            assert_eq!(counter, 2);
        }
        // Another owner: busy, holding nothing; the counter is the waiter's.
        Value::Array(items) => {
            assert_eq!(items[0], Value::Int(0), "busy: {items:?}");
            assert_eq!(counter, 1);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_nested_hand_off_and_a_reentry_never_share_a_token() {
    nested_handoff_tokens("X");
}

#[test]
fn a_nested_hand_off_leaves_another_owner_busy_with_the_counter_intact() {
    nested_handoff_tokens("Y");
}

/// A waiter asking for a token, then one without, queue behind a holder; `spoil` then makes the
/// token impossible. The release must answer the first with the error (`refused` starts or is
/// in its text), never a grant, and hand the lock to the second.
fn spoiled_token_refuses_the_waiter_and_grants_the_next(spoil: &[&str], refused: &str) {
    let server = Server::start();
    let mut con = server.conn();
    cmd(&mut con, &["RLOCK.ACQUIRE", "job", "h", "30000"]);
    let w1 =
        Pending::start_str(&server, &["RLOCK.ACQUIRE", "job", "w1", "30000", "WAIT", "0", "TOKEN"]);
    wait_blocked(&mut con, 1);
    let w2 = Pending::start_str(&server, &["RLOCK.ACQUIRE", "job", "w2", "30000", "WAIT", "0"]);
    wait_blocked(&mut con, 2);
    cmd(&mut con, spoil);
    assert_eq!(cmd(&mut con, &["RLOCK.RELEASE", "job", "h"]), Value::Int(1));
    let (r1, _) = w1.reply(LIMIT);
    assert!(r1.as_ref().is_err_and(|e| e.contains(refused)), "{r1:?}");
    assert_eq!(w2.reply(LIMIT).0, Ok(Value::Nil), "the next waiter gets the lock");
    assert_eq!(hgetall(&mut con, b"job"), vec![(b"w2".to_vec(), b"1".to_vec())]);
}

// ---- a counter at its limit ---------------------------------------------------------------------

#[test]
fn a_counter_that_cannot_grow_refuses_before_anything_is_written() {
    let server = Server::start();
    let mut con = server.conn();
    cmd(&mut con, &["SET", "redisson_lock_token:{job}", "9223372036854775807"]);
    let before = digest(&mut con);
    let err = run_str(&mut con, &["RLOCK.ACQUIRE", "job", "c1", "30000", "TOKEN"]).unwrap_err();
    assert!(err.starts_with("ERR") && err.contains("cannot grow"), "{err}");
    assert_eq!(digest(&mut con), before, "no lock written");
    assert!(!exists(&mut con, "job"));
}

#[test]
fn a_hand_off_never_grants_with_an_error_or_a_nil_token() {
    spoiled_token_refuses_the_waiter_and_grants_the_next(
        &["SET", "redisson_lock_token:{job}", "9223372036854775807"],
        "cannot grow",
    );
}
