//! Where real deployments differ (issue 9): write pauses, fencing tokens under nested hand-offs,
//! Redisson's naming of derived keys for braced names, ACL users limited to key patterns and
//! channels, eviction, counters at their limit, SWAPDB/MOVE/RENAME, writable replicas, WATCH and
//! keyspace notifications, a module reload. Each test is a regression test for one defect found
//! by trying to break rlock, named after it.

use std::time::{Duration, Instant};

use redis::{Connection, Value};
use rlock_tests_integration::{
    blocked_clients, cmd, digest, granted_token, hgetall, info_field, poll, run_str, wait_blocked,
    Pending, Server,
};

const LIMIT: Duration = Duration::from_secs(10);

fn exists(con: &mut Connection, key: &str) -> bool {
    redis::cmd("EXISTS").arg(key).query::<i64>(con).expect("EXISTS") == 1
}

fn get(con: &mut Connection, key: &str) -> Option<String> {
    redis::cmd("GET").arg(key).query(con).expect("GET")
}

/// A connection authenticated as `user` (created with `nopass`).
fn conn_as(server: &Server, user: &str) -> Connection {
    let mut con = server.conn();
    cmd(&mut con, &["AUTH", user, "any"]);
    con
}

// ---- 1. writes paused ----------------------------------------------------------------------

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
fn d1_a_lease_ending_during_client_pause_write_is_handed_off_after_it() {
    lease_end_during_pause("WRITE");
}

#[test]
fn d1_a_lease_ending_during_client_pause_all_is_handed_off_after_it() {
    lease_end_during_pause("ALL");
}

#[test]
fn d1_a_lease_ending_while_a_failover_pauses_writes_is_handed_off_after_it() {
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
fn d1_a_waiter_timing_out_during_a_pause_writes_nothing_and_is_answered() {
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
fn d1_a_grant_rolled_back_during_a_pause_is_released_after_it_not_during_it() {
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

// ---- 2. tokens under a nested hand-off -------------------------------------------------------

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
fn d2_a_nested_hand_off_and_a_reentry_never_share_a_token() {
    nested_handoff_tokens("X");
}

#[test]
fn d2_a_nested_hand_off_leaves_another_owner_busy_with_the_counter_intact() {
    nested_handoff_tokens("Y");
}

// ---- 3. derived names of braced lock names ---------------------------------------------------

#[test]
fn d3_braced_names_derive_keys_and_channels_by_redissons_prefixname_rule() {
    let server = Server::start();
    let mut con = server.conn();
    let mut sub = server.conn();
    sub.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
    let mut sub = sub.as_pubsub();
    sub.subscribe("redisson_lock__channel:{user1}:lock").expect("subscribe");
    for name in ["{user1}:lock", "orders{42}", "a}b"] {
        cmd(&mut con, &["RLOCK.ACQUIRE", name, "o", "30000", "TOKEN"]);
        let counter = if name.contains('{') {
            format!("redisson_lock_token:{name}")
        } else {
            format!("redisson_lock_token:{{{name}}}")
        };
        assert_eq!(get(&mut con, &counter).as_deref(), Some("1"), "{counter}");
        assert_eq!(cmd(&mut con, &["RLOCK.RELEASE", name, "o", "REQUEST", "r1"]), Value::Int(1));
        let latch = if name.contains('{') {
            format!("redisson_unlock_latch:{name}:r1")
        } else {
            format!("redisson_unlock_latch:{{{name}}}:r1")
        };
        assert!(exists(&mut con, &latch), "{latch}");
    }
    let msg = sub.get_message().expect("the unlock message of {user1}:lock");
    assert_eq!(msg.get_channel_name(), "redisson_lock__channel:{user1}:lock");
    assert_eq!(msg.get_payload_bytes(), b"0");
}

// ---- 4. ACL: derived keys and the channel ----------------------------------------------------

fn acl_log_objects(con: &mut Connection) -> Vec<String> {
    let entries: Vec<Value> = redis::cmd("ACL").arg("LOG").query(con).expect("ACL LOG");
    entries
        .into_iter()
        .filter_map(|e| {
            let Value::Array(kv) = e else { return None };
            let at = kv.iter().position(|v| *v == Value::BulkString(b"object".to_vec()))?;
            redis::from_redis_value::<String>(kv[at + 1].clone()).ok()
        })
        .collect()
}

#[test]
fn d4_a_user_limited_to_lock_keys_cannot_touch_counters_latches_or_the_channel() {
    let server = Server::start();
    let mut admin = server.conn();
    cmd(
        &mut admin,
        &["ACL", "SETUSER", "lim", "on", "nopass", "~locks:*", "resetchannels", "+@all"],
    );
    let mut lim = conn_as(&server, "lim");
    let before = digest(&mut admin);
    let err = run_str(&mut lim, &["RLOCK.ACQUIRE", "locks:x", "o", "10000", "TOKEN"]).unwrap_err();
    assert!(err.starts_with("NOPERM"), "{err}");
    assert_eq!(digest(&mut admin), before, "nothing changes on NOPERM");
    assert!(acl_log_objects(&mut admin).contains(&"redisson_lock_token:{locks:x}".to_owned()));

    cmd(&mut lim, &["RLOCK.ACQUIRE", "locks:x", "o", "10000"]);
    let before = digest(&mut admin);
    let err = run_str(&mut lim, &["RLOCK.RELEASE", "locks:x", "o", "REQUEST", "r"]).unwrap_err();
    assert!(err.starts_with("NOPERM"), "{err}");
    let err = run_str(&mut lim, &["RLOCK.RELEASE", "locks:x", "o"]).unwrap_err();
    assert!(err.starts_with("NOPERM"), "the release would publish: {err}");
    let err = run_str(&mut lim, &["RLOCK.FORCERELEASE", "locks:x"]).unwrap_err();
    assert!(err.starts_with("NOPERM"), "{err}");
    assert_eq!(digest(&mut admin), before, "still held, no latch");
    assert!(acl_log_objects(&mut admin).contains(&"redisson_lock__channel:{locks:x}".to_owned()));

    // Nor through a script or a transaction.
    let script = "return redis.call('RLOCK.ACQUIRE', KEYS[1], 'o', '10000', 'TOKEN')";
    let err = run_str(&mut lim, &["EVAL", script, "1", "locks:x"]).unwrap_err();
    assert!(err.starts_with("NOPERM"), "{err}");
    cmd(&mut lim, &["MULTI"]);
    cmd(&mut lim, &["RLOCK.RELEASE", "locks:x", "o", "REQUEST", "r"]);
    let err = run_str(&mut lim, &["EXEC"]).unwrap_err();
    assert!(err.starts_with("NOPERM"), "{err}");
    assert_eq!(digest(&mut admin), before, "still nothing changed");

    // Granted the channel and the derived keys, the same user does it all.
    cmd(
        &mut admin,
        &[
            "ACL",
            "SETUSER",
            "lim",
            "&redisson_lock__channel:*",
            "~redisson_lock_token:*",
            "~redisson_unlock_latch:*",
        ],
    );
    assert_eq!(cmd(&mut lim, &["RLOCK.RELEASE", "locks:x", "o", "REQUEST", "r"]), Value::Int(1));
    let token = cmd(&mut lim, &["RLOCK.ACQUIRE", "locks:x", "o", "10000", "TOKEN"]);
    assert_eq!(granted_token(&token), 1);
}

#[test]
fn d4_a_read_only_user_cannot_read_the_counter_through_info() {
    let server = Server::start();
    let mut admin = server.conn();
    cmd(&mut admin, &["RLOCK.ACQUIRE", "locks:x", "o", "10000", "TOKEN"]);
    cmd(&mut admin, &["ACL", "SETUSER", "ro", "on", "nopass", "%R~locks:*", "+@all"]);
    let mut ro = conn_as(&server, "ro");
    assert!(matches!(cmd(&mut ro, &["RLOCK.PTTL", "locks:x"]), Value::Int(n) if n > 0));
    let err = run_str(&mut ro, &["RLOCK.INFO", "locks:x"]).unwrap_err();
    assert!(err.starts_with("NOPERM"), "{err}");
    cmd(&mut admin, &["ACL", "SETUSER", "ro", "%R~redisson_lock_token:*"]);
    assert!(matches!(cmd(&mut ro, &["RLOCK.INFO", "locks:x"]), Value::Array(_)));
}

// ---- 5. eviction ----------------------------------------------------------------------------

/// The token of `owner`'s grant of `key` (then released).
fn token_then_release(con: &mut Connection, key: &str, owner: &str) -> i64 {
    let token = granted_token(&cmd(con, &["RLOCK.ACQUIRE", key, owner, "30000", "TOKEN"]));
    assert_eq!(cmd(con, &["RLOCK.RELEASE", key, owner]), Value::Int(1));
    token
}

#[test]
fn d5_tokens_keep_increasing_when_an_allkeys_policy_evicts_the_counter() {
    // Issue 23, item 2: a cache server (allkeys-*) gives tokens, and an evicted counter never
    // restarts below a token already given.
    let server = Server::builder().config("maxmemory-policy", "allkeys-random").start();
    let mut con = server.conn();
    let first = token_then_release(&mut con, "job", "c1");
    let other = token_then_release(&mut con, "other", "c1");
    assert!(other > 0);
    // Real eviction: memory just above what is used, then filler until the counter goes.
    let used = info_field(&mut con, "memory", "used_memory");
    cmd(&mut con, &["CONFIG", "SET", "maxmemory", &(used + 2_000_000).to_string()]);
    let filler = "x".repeat(10_000);
    let mut i = 0;
    poll("the token counter to be evicted", Duration::from_secs(30), || {
        for _ in 0..50 {
            i += 1;
            cmd(&mut con, &["SET", &format!("filler:{i}"), &filler]);
        }
        (cmd(&mut con, &["EXISTS", "redisson_lock_token:{job}"]) == Value::Int(0)).then_some(())
    });
    cmd(&mut con, &["CONFIG", "SET", "maxmemory", "0"]);
    let after = token_then_release(&mut con, "job", "c2");
    assert!(after > first && after > other, "{after} after {first} and {other}");
    // A hand-off too.
    cmd(&mut con, &["DEL", "redisson_lock_token:{job}"]);
    cmd(&mut con, &["RLOCK.ACQUIRE", "job", "h", "30000"]);
    let waiter =
        Pending::start_str(&server, &["RLOCK.ACQUIRE", "job", "w", "30000", "WAIT", "0", "TOKEN"]);
    wait_blocked(&mut con, 1);
    assert_eq!(cmd(&mut con, &["RLOCK.RELEASE", "job", "h"]), Value::Int(1));
    let handed = granted_token(&waiter.reply(LIMIT).0.expect("granted"));
    assert!(handed > after, "{handed} after {after}");
}

#[test]
fn d5_a_policy_switched_to_allkeys_at_run_time_keeps_tokens_increasing() {
    let server = Server::start();
    let mut con = server.conn();
    let first = token_then_release(&mut con, "job", "c1");
    assert_eq!(first, 1, "per-lock counters as Redisson's");
    let other = token_then_release(&mut con, "other", "c1");
    assert_eq!(other, 1);
    cmd(&mut con, &["CONFIG", "SET", "maxmemory-policy", "allkeys-lru"]);
    // A switch back does not forget that counters may have been evicted meanwhile.
    cmd(&mut con, &["CONFIG", "SET", "maxmemory-policy", "noeviction"]);
    cmd(&mut con, &["DEL", "redisson_lock_token:{job}"]);
    let after = token_then_release(&mut con, "job", "c2");
    assert!(after > first, "{after} after {first}");
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

// ---- 6 and 10. a counter at its limit -------------------------------------------------------

#[test]
fn d6_a_counter_that_cannot_grow_refuses_before_anything_is_written() {
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
fn d6_a_hand_off_never_grants_with_an_error_or_a_nil_token() {
    spoiled_token_refuses_the_waiter_and_grants_the_next(
        &["SET", "redisson_lock_token:{job}", "9223372036854775807"],
        "cannot grow",
    );
}

// ---- 7. SWAPDB, MOVE, RENAME -----------------------------------------------------------------

/// A lock with no expiry (taken by hand), a waiter, then `change` takes the lock out of db 0:
/// the waiter is served promptly.
fn waiter_follows(change: &[&str]) {
    let server = Server::start();
    let mut con = server.conn();
    cmd(&mut con, &["HSET", "k", "h", "1"]);
    let waiter = Pending::start_str(&server, &["RLOCK.ACQUIRE", "k", "w", "30000", "WAIT", "0"]);
    wait_blocked(&mut con, 1);
    cmd(&mut con, change);
    assert_eq!(waiter.reply(LIMIT).0, Ok(Value::Nil), "{change:?}; log:\n{}", server.log());
    let db0 = hgetall(&mut con, b"k");
    cmd(&mut con, &["SELECT", "1"]);
    let db1 = hgetall(&mut con, b"k");
    assert_eq!(db0, vec![(b"w".to_vec(), b"1".to_vec())], "{change:?}; db 1: {db1:?}");
}

#[test]
fn d7_a_waiter_is_served_when_swapdb_takes_the_lock_away() {
    waiter_follows(&["SWAPDB", "0", "1"]);
}

#[test]
fn d7_a_waiter_is_served_when_the_lock_is_moved_or_renamed_away() {
    waiter_follows(&["MOVE", "k", "1"]);
    waiter_follows(&["RENAME", "k", "elsewhere"]);
}

#[test]
fn d7_a_move_leaves_its_client_in_its_own_database() {
    // Valkey 8.1 left the client of a MOVE in the destination database whenever a module
    // listened to keyspace events (valkey PR #4024); rlock selects it back.
    let server = Server::start();
    let mut con = server.conn();
    cmd(&mut con, &["SET", "k", "v"]);
    assert_eq!(cmd(&mut con, &["MOVE", "k", "1"]), Value::Int(1));
    assert_eq!(cmd(&mut con, &["EXISTS", "k"]), Value::Int(0), "still in db 0, where k is gone");
    cmd(&mut con, &["SET", "j", "v"]);
    assert_eq!(cmd(&mut con, &["MOVE", "j", "1"]), Value::Int(1));
}

#[test]
fn d7_a_waiter_sees_the_lock_swapdb_brings_in() {
    let server = Server::start();
    let mut con = server.conn();
    cmd(&mut con, &["RLOCK.ACQUIRE", "k", "h", "60000"]);
    let waiter = Pending::start_str(&server, &["RLOCK.ACQUIRE", "k", "w", "30000", "WAIT", "0"]);
    wait_blocked(&mut con, 1);
    // db 1 holds the same lock with a short lease: after the swap, db 0's waiter gets it when
    // that lease ends, not 60 s later.
    cmd(&mut con, &["SELECT", "1"]);
    cmd(&mut con, &["RLOCK.ACQUIRE", "k", "h1", "300"]);
    cmd(&mut con, &["SWAPDB", "0", "1"]);
    assert_eq!(waiter.reply(LIMIT).0, Ok(Value::Nil));
    cmd(&mut con, &["SELECT", "0"]);
    assert_eq!(hgetall(&mut con, b"k"), vec![(b"w".to_vec(), b"1".to_vec())]);
}

// ---- 8. writable replicas and the replies of ended waits ------------------------------------

#[test]
fn d8_a_writable_replica_never_blocks_a_waiter_it_cannot_serve() {
    let master = Server::start();
    let replica = Server::builder().replica_of(&master).config("replica-read-only", "no").start();
    let mut m = master.conn();
    cmd(&mut m, &["RLOCK.ACQUIRE", "k", "h", "60000"]);
    let mut r = replica.conn();
    rlock_tests_integration::wait_link_up(&mut r);
    poll("the lock replicated", LIMIT, || exists(&mut r, "k").then_some(()));
    // Busy: the holder's lease at once, not a wait that no hand-off could ever end.
    let reply = cmd(&mut r, &["RLOCK.ACQUIRE", "k", "w", "30000", "WAIT", "0"]);
    assert!(matches!(reply, Value::Int(n) if n > 0), "{reply:?}");
    assert_eq!(blocked_clients(&mut r), 0);
}

#[test]
fn d8_a_wait_ending_on_a_key_of_another_type_replies_wrongtype() {
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

// ---- 9. WATCH and keyspace notifications ----------------------------------------------------

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
fn d9_no_ops_do_not_abort_a_watch() {
    let held: &[&[&str]] = &[&["RLOCK.ACQUIRE", "k", "h", "60000"]];
    watch_survives(held, &["RLOCK.ACQUIRE", "k", "other", "60000"]);
    watch_survives(held, &["RLOCK.RELEASE", "k", "other"]);
    watch_survives(held, &["RLOCK.RENEW", "k", "other", "60000"]);
    watch_survives(&[], &["RLOCK.RELEASE", "k", "nobody"]);
    watch_survives(&[], &["RLOCK.FORCERELEASE", "k"]);
}

#[test]
fn d9_a_real_change_does_abort_a_watch() {
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
fn d9_rlock_raises_the_notifications_redissons_scripts_raise() {
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

// ---- 10. smaller ones -------------------------------------------------------------------------

#[test]
fn d10_info_counters_start_from_zero_after_a_module_reload() {
    let server = Server::builder().config("enable-module-command", "yes").start();
    let mut con = server.conn();
    cmd(&mut con, &["RLOCK.ACQUIRE", "k", "h", "60000"]);
    let waiter = Pending::start_str(&server, &["RLOCK.ACQUIRE", "k", "w", "60000", "WAIT", "100"]);
    let (reply, _) = waiter.reply(LIMIT);
    assert!(matches!(reply, Ok(Value::Int(n)) if n > 0), "timed out: {reply:?}");
    assert_eq!(info_field(&mut con, "rlock", "rlock_waits"), 1);
    poll("no module timer armed", LIMIT, || {
        (info_field(&mut con, "rlock", "rlock_timers_armed") == 0).then_some(())
    });
    cmd(&mut con, &["MODULE", "UNLOAD", "rlock"]);
    let path = rlock_tests_integration::module_path();
    cmd(&mut con, &["MODULE", "LOAD", path.to_str().expect("path")]);
    assert_eq!(info_field(&mut con, "rlock", "rlock_waits"), 0);
    assert_eq!(info_field(&mut con, "rlock", "rlock_timeouts"), 0);
}

#[test]
fn d10_a_latch_holding_a_foreign_string_is_named_not_called_wrongtype() {
    let server = Server::start();
    let mut con = server.conn();
    cmd(&mut con, &["RLOCK.ACQUIRE", "k", "h", "60000"]);
    cmd(&mut con, &["SET", "redisson_unlock_latch:{k}:r", "x"]);
    let err = run_str(&mut con, &["RLOCK.RELEASE", "k", "h", "REQUEST", "r"]).unwrap_err();
    assert!(err.starts_with("ERR the unlock latch"), "{err}");
    cmd(&mut con, &["HSET", "redisson_unlock_latch:{k}:h", "f", "v"]);
    let err = run_str(&mut con, &["RLOCK.RELEASE", "k", "h", "REQUEST", "h"]).unwrap_err();
    assert!(err.starts_with("WRONGTYPE"), "{err}");
}
