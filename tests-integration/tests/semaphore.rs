//! `RSEM.*` counting semaphores on a real server: Redisson's `RSemaphore` layout (a string of
//! available permits, `redisson_sc:{name}` messages), replies, errors, fair FIFO waiting without
//! barging, several waiters served by one release, permits given back when a granted client is
//! gone, and a Redisson client's scripts on the same semaphore.

use std::time::{Duration, Instant};

use redis::{Connection, Value};

use rlock_tests_integration::{
    blocked_clients, cmd, digest, info_field, permit_ids, pexpiretime, poll, rsem_info, run,
    run_checked, run_str, wait_blocked, wait_replica_online, Pending, Server,
};

const LIMIT: Duration = Duration::from_secs(10);

fn get(con: &mut Connection, key: &str) -> Option<String> {
    redis::cmd("GET").arg(key).query(con).expect("GET")
}

/// Redisson's `tryAcquire(p)` script (the model's §3): DECRBY when enough permits are there.
const REDISSON_TRY_ACQUIRE: &str = "local v = redis.call('get', KEYS[1]); \
     if v ~= false and tonumber(v) >= tonumber(ARGV[1]) then \
     redis.call('decrby', KEYS[1], ARGV[1]); return 1 end; return 0";

/// Redisson's `release(p)`: INCRBY, then publish the new count.
const REDISSON_RELEASE: &str = "local v = redis.call('incrby', KEYS[1], ARGV[1]); \
     redis.call('publish', KEYS[2], v); return v";

#[test]
fn set_add_acquire_release_on_redissons_layout() {
    let server = Server::start();
    let mut con = server.conn();
    let mut sub = server.conn();
    sub.set_read_timeout(Some(LIMIT)).expect("timeout");
    let mut pubsub = sub.as_pubsub();
    pubsub.subscribe("redisson_sc:{S}").expect("subscribe");
    let mut message =
        || pubsub.get_message().expect("message").get_payload::<String>().expect("payload");

    assert_eq!(cmd(&mut con, &["RSEM.AVAILABLE", "S"]), Value::Int(0));
    assert_eq!(cmd(&mut con, &["RSEM.INFO", "S"]), Value::Nil);
    assert_eq!(cmd(&mut con, &["RSEM.SETPERMITS", "S", "3"]), Value::Int(1));
    assert_eq!(message(), "3");
    assert_eq!(cmd(&mut con, &["RSEM.SETPERMITS", "S", "9"]), Value::Int(0), "it exists");
    assert_eq!(get(&mut con, "S").as_deref(), Some("3"), "a plain integer string");
    assert_eq!(cmd(&mut con, &["RSEM.ACQUIRE", "S", "2"]), Value::Int(1));
    assert_eq!(cmd(&mut con, &["RSEM.ACQUIRE", "S", "2"]), Value::Int(0), "one left");
    assert_eq!(cmd(&mut con, &["RSEM.AVAILABLE", "S"]), Value::Int(1));
    assert_eq!(cmd(&mut con, &["RSEM.RELEASE", "S", "2"]), Value::Int(3));
    assert_eq!(message(), "3");
    assert_eq!(cmd(&mut con, &["RSEM.ADDPERMITS", "S", "-5"]), Value::Int(-2));
    assert_eq!(cmd(&mut con, &["RSEM.ACQUIRE", "S", "1"]), Value::Int(0));
    assert_eq!(cmd(&mut con, &["RSEM.ADDPERMITS", "S", "4"]), Value::Int(2));
    assert_eq!(message(), "2");
    // A release creates a missing semaphore, as Redisson's INCRBY does; it keeps a TTL.
    assert_eq!(cmd(&mut con, &["RSEM.RELEASE", "T", "1"]), Value::Int(1));
    cmd(&mut con, &["PEXPIRE", "T", "60000"]);
    assert_eq!(cmd(&mut con, &["RSEM.ACQUIRE", "T", "1"]), Value::Int(1));
    let pttl: i64 = redis::cmd("PTTL").arg("T").query(&mut con).expect("PTTL");
    assert!(pttl > 58_000, "DECRBY keeps the expiry: {pttl}");
}

#[test]
fn bad_input_gets_a_clear_error_and_changes_nothing() {
    let server = Server::start();
    let mut con = server.conn();
    cmd(&mut con, &["SET", "bad", "x"]);
    cmd(&mut con, &["HSET", "h", "f", "1"]);
    cmd(&mut con, &["RSEM.SETPERMITS", "S", "1"]);
    let before = digest(&mut con);
    let cases: &[(&[&str], &str)] = &[
        (&["RSEM.ACQUIRE", "S"], "ERR wrong number of arguments"),
        (&["RSEM.ACQUIRE", "S", "0"], "ERR permits must be positive"),
        (&["RSEM.ACQUIRE", "S", "-1"], "ERR permits must be positive"),
        (&["RSEM.ACQUIRE", "S", "1", "WAIT"], "ERR timeout-ms"),
        (&["RSEM.ACQUIRE", "S", "1", "LATER"], "ERR syntax error"),
        (&["RSEM.RELEASE", "S", "0"], "ERR permits must be positive"),
        (&["RSEM.SETPERMITS", "S", "-1"], "ERR permits must not be negative"),
        (&["RSEM.ADDPERMITS", "S", "1.5"], "ERR delta is not an integer"),
        (&["RSEM.ADDPERMITS", "S", "9223372036854775807"], "ERR permit count overflow"),
        (&["RSEM.ACQUIRE", "bad", "1"], "ERR the semaphore's value is not an integer"),
        (&["RSEM.RELEASE", "bad", "1"], "ERR the semaphore's value is not an integer"),
        (&["RSEM.AVAILABLE", "h"], "WRONGTYPE"),
        (&["RSEM.RELEASE", "h", "1"], "WRONGTYPE"),
        (&["RSEM.INFO", "S", "x"], "ERR wrong number of arguments"),
    ];
    for (args, expected) in cases {
        let err = run_str(&mut con, args).unwrap_err();
        assert!(err.starts_with(expected), "{args:?}: {err}");
    }
    assert_eq!(digest(&mut con), before, "no error changed anything");
}

/// FIFO without barging: a head asking for 5 is not overtaken by a later waiter asking for 1,
/// and a newcomer takes nothing while anyone waits.
#[test]
fn waiters_are_served_in_order_and_nobody_overtakes_a_large_request() {
    let server = Server::start();
    let mut con = server.conn();
    cmd(&mut con, &["RSEM.SETPERMITS", "S", "0"]);
    let big = Pending::start_str(&server, &["RSEM.ACQUIRE", "S", "5", "WAIT", "0"]);
    wait_blocked(&mut con, 1);
    let small = Pending::start_str(&server, &["RSEM.ACQUIRE", "S", "1", "WAIT", "0"]);
    wait_blocked(&mut con, 2);
    assert_eq!(cmd(&mut con, &["RSEM.RELEASE", "S", "1"]), Value::Int(1), "nobody served yet");
    assert!(!small.replied(), "the small request waits behind the large one");
    assert_eq!(cmd(&mut con, &["RSEM.ACQUIRE", "S", "1"]), Value::Int(0), "no barging");
    let info: Vec<Value> = match cmd(&mut con, &["RSEM.INFO", "S"]) {
        Value::Array(v) => v,
        other => panic!("{other:?}"),
    };
    assert_eq!(info[7], Value::Int(2), "waiters: {info:?}");
    assert_eq!(info[9], Value::Int(6), "waiting permits: {info:?}");
    assert_eq!(cmd(&mut con, &["RSEM.RELEASE", "S", "4"]), Value::Int(0), "5 went to the head");
    assert_eq!(big.reply(LIMIT).0, Ok(Value::Int(1)));
    assert!(!small.replied());
    assert_eq!(cmd(&mut con, &["RSEM.RELEASE", "S", "1"]), Value::Int(0));
    assert_eq!(small.reply(LIMIT).0, Ok(Value::Int(1)));
    assert_eq!(get(&mut con, "S").as_deref(), Some("0"));
}

#[test]
fn one_release_serves_several_waiters_and_a_timeout_takes_nothing() {
    let server = Server::start();
    let mut con = server.conn();
    cmd(&mut con, &["RSEM.SETPERMITS", "S", "0"]);
    let waiters: Vec<Pending> = (0..3)
        .map(|i| {
            let p = Pending::start_str(&server, &["RSEM.ACQUIRE", "S", "1", "WAIT", "0"]);
            wait_blocked(&mut con, i + 1);
            p
        })
        .collect();
    let handoffs = info_field(&mut con, "rlock", "rlock_handoffs");
    assert_eq!(cmd(&mut con, &["RSEM.RELEASE", "S", "3"]), Value::Int(0));
    for w in waiters {
        assert_eq!(w.reply(LIMIT).0, Ok(Value::Int(1)));
    }
    assert_eq!(info_field(&mut con, "rlock", "rlock_handoffs"), handoffs + 3);
    let started = Instant::now();
    let late = Pending::start_str(&server, &["RSEM.ACQUIRE", "S", "1", "WAIT", "200"]);
    let (reply, at) = late.reply(LIMIT);
    assert_eq!(reply, Ok(Value::Int(0)), "timed out: not taken");
    assert!(at - started >= Duration::from_millis(195), "{:?}", at - started);
    assert_eq!(blocked_clients(&mut con), 0);
    // Inside MULTI a WAIT is one non-blocking try.
    let replies: Vec<Value> = redis::pipe()
        .atomic()
        .cmd("RSEM.ACQUIRE")
        .arg("S")
        .arg(1)
        .arg("WAIT")
        .arg(0)
        .query(&mut con)
        .expect("MULTI");
    assert_eq!(replies, vec![Value::Int(0)]);
}

#[test]
fn permits_granted_to_a_client_that_is_gone_come_back() {
    let server = Server::start();
    let mut con = server.conn();
    cmd(&mut con, &["RSEM.SETPERMITS", "S", "0"]);
    let gone = Pending::start_str(&server, &["RSEM.ACQUIRE", "S", "2", "WAIT", "0"]);
    wait_blocked(&mut con, 1);
    let mut tx = redis::pipe();
    tx.atomic();
    tx.cmd("RSEM.RELEASE").arg("S").arg(2);
    tx.cmd("CLIENT").arg("KILL").arg("ID").arg(gone.client_id());
    let (left, killed): (i64, i64) = tx.query(&mut con).expect("MULTI/EXEC");
    assert_eq!((left, killed), (0, 1), "granted, then its client killed");
    assert!(gone.reply(LIMIT).0.is_err());
    poll("the permits back", LIMIT, || (get(&mut con, "S").as_deref() == Some("2")).then_some(()));
    assert_eq!(info_field(&mut con, "rlock", "rlock_grants_rolled_back"), 1);
}

#[test]
fn a_redisson_client_shares_the_count_and_each_side_wakes_the_other() {
    let server = Server::start();
    let mut con = server.conn();
    let eval = |con: &mut Connection, script: &str, keys: &[&str], args: &[&str]| -> i64 {
        let mut c = redis::cmd("EVAL");
        c.arg(script).arg(keys.len()).arg(keys).arg(args);
        c.query(con).expect("script")
    };
    cmd(&mut con, &["RSEM.SETPERMITS", "S", "2"]);
    // Permits are counted once across both.
    assert_eq!(eval(&mut con, REDISSON_TRY_ACQUIRE, &["S"], &["1"]), 1);
    assert_eq!(cmd(&mut con, &["RSEM.ACQUIRE", "S", "1"]), Value::Int(1));
    assert_eq!(eval(&mut con, REDISSON_TRY_ACQUIRE, &["S"], &["1"]), 0);
    assert_eq!(cmd(&mut con, &["RSEM.ACQUIRE", "S", "1"]), Value::Int(0));
    // A Redisson release (INCRBY + publish) serves an rlock waiter.
    let waiter = Pending::start_str(&server, &["RSEM.ACQUIRE", "S", "1", "WAIT", "0"]);
    wait_blocked(&mut con, 1);
    assert_eq!(eval(&mut con, REDISSON_RELEASE, &["S", "redisson_sc:{S}"], &["1"]), 1);
    assert_eq!(waiter.reply(LIMIT).0, Ok(Value::Int(1)));
    assert_eq!(get(&mut con, "S").as_deref(), Some("0"));
    // An rlock release tells Redisson's waiters how many permits there are.
    let mut sub = server.conn();
    sub.set_read_timeout(Some(LIMIT)).expect("timeout");
    let mut pubsub = sub.as_pubsub();
    pubsub.subscribe("redisson_sc:{S}").expect("subscribe");
    assert_eq!(cmd(&mut con, &["RSEM.RELEASE", "S", "2"]), Value::Int(2));
    let payload: String = pubsub.get_message().expect("message").get_payload().expect("payload");
    assert_eq!(payload, "2");
}

#[test]
fn a_replica_without_the_module_holds_the_same_count() {
    let master = Server::start();
    let replica = Server::builder().without_module().replica_of(&master).start();
    rlock_tests_integration::wait_replica_online(&master);
    let mut con = master.conn();
    cmd(&mut con, &["RSEM.SETPERMITS", "S", "5"]);
    cmd(&mut con, &["RSEM.ACQUIRE", "S", "2"]);
    cmd(&mut con, &["RSEM.RELEASE", "S", "1"]);
    cmd(&mut con, &["RSEM.ADDPERMITS", "S", "-1"]);
    let leased = permit_ids(&cmd(&mut con, &["RSEM.ACQUIRE", "S", "2", "LEASE", "60000"]));
    let released: i64 =
        redis::cmd("RSEM.RELEASE").arg("S").arg("ID").arg(&leased[0]).query(&mut con).expect("ID");
    assert_eq!(released, 1);
    let _: i64 = redis::cmd("WAIT").arg(1).arg(5000).query(&mut con).expect("WAIT");
    let mut r = replica.conn();
    assert_eq!(get(&mut r, "S").as_deref(), Some("2"));
    let zset = |c: &mut Connection| -> Vec<(Vec<u8>, i64)> {
        redis::cmd("ZRANGE")
            .arg("{S}:timeout")
            .arg(0)
            .arg(-1)
            .arg("WITHSCORES")
            .query(c)
            .expect("ZRANGE")
    };
    assert_eq!(zset(&mut r), zset(&mut con), "the same leases, ids and ends");
    assert_eq!(zset(&mut r).len(), 1);
}

// ---- leased permits (RPermitExpirableSemaphore) ---------------------------------------------

fn zscore(con: &mut Connection, id: &[u8]) -> Option<i64> {
    let score: Option<f64> =
        redis::cmd("ZSCORE").arg("{S}:timeout").arg(id).query(con).expect("ZSCORE");
    score.map(|s| s as i64)
}

#[test]
fn leased_permits_have_ids_on_redissons_zset_and_release_all_or_nothing() {
    let server = Server::start();
    let mut con = server.conn();
    cmd(&mut con, &["RSEM.SETPERMITS", "S", "3"]);
    let now = rlock_tests_integration::server_time_ms(&mut con);
    let granted = permit_ids(&cmd(&mut con, &["RSEM.ACQUIRE", "S", "2", "LEASE", "60000"]));
    assert_eq!(granted.len(), 2);
    assert!(granted.iter().all(|id| id.len() == 16), "16 raw bytes each");
    for id in &granted {
        let score = zscore(&mut con, id).expect("leased");
        assert!(
            (now + 59_000..=now + 61_000).contains(&score),
            "absolute server-clock end: {score}"
        );
    }
    assert_eq!(get(&mut con, "S").as_deref(), Some("1"), "the count holds the unleased permits");
    let info = cmd(&mut con, &["RSEM.INFO", "S"]);
    let Value::Array(info) = info else { panic!("{info:?}") };
    assert_eq!(info[3], Value::Int(2), "leased: {info:?}");
    assert!(matches!(info[5], Value::Int(n) if n > 58_000), "next_expiry_ms: {info:?}");
    // All or nothing: one unknown id, nothing released.
    let before = digest(&mut con);
    let reply = redis::cmd("RSEM.RELEASE")
        .arg("S")
        .arg("ID")
        .arg(&granted[0])
        .arg(b"nope".as_slice())
        .query::<i64>(&mut con);
    assert_eq!(reply, Ok(0));
    assert_eq!(digest(&mut con), before);
    // Renew moves one lease; release by ids gives them back.
    let renewed: i64 = redis::cmd("RSEM.RENEW")
        .arg("S")
        .arg(&granted[0])
        .arg(5_000)
        .query(&mut con)
        .expect("renew");
    assert_eq!(renewed, 1);
    assert!(zscore(&mut con, &granted[0]).is_some_and(|s| s < now + 10_000));
    let released: i64 = redis::cmd("RSEM.RELEASE")
        .arg("S")
        .arg("ID")
        .arg(&granted[0])
        .arg(&granted[1])
        .query(&mut con)
        .expect("release");
    assert_eq!(released, 2);
    assert_eq!(get(&mut con, "S").as_deref(), Some("3"));
    assert_eq!(cmd(&mut con, &["EXISTS", "{S}:timeout"]), Value::Int(0));
}

/// A leased permit whose holder died comes back when its lease ends, by the server's timer,
/// whether or not any command runs; a waiter is served then.
#[test]
fn a_dead_holders_leased_permit_comes_back_at_its_lease_end_and_serves_a_waiter() {
    let server = Server::start();
    let mut con = server.conn();
    cmd(&mut con, &["RSEM.SETPERMITS", "S", "1"]);
    let _dead = permit_ids(&cmd(&mut con, &["RSEM.ACQUIRE", "S", "1", "LEASE", "200"]));
    assert_eq!(get(&mut con, "S").as_deref(), Some("0"));
    let started = Instant::now();
    let waiter =
        Pending::start_str(&server, &["RSEM.ACQUIRE", "S", "1", "LEASE", "30000", "WAIT", "0"]);
    let (reply, at) = waiter.reply(LIMIT);
    let got = permit_ids(&reply.expect("granted"));
    assert_eq!(got.len(), 1);
    assert!(at - started >= Duration::from_millis(150), "not before the lease ended");
    assert!(zscore(&mut con, &got[0]).is_some(), "the waiter's own lease");
    // Nobody waiting: it still comes back on time, and Redisson waiters are told.
    let mut sub = server.conn();
    sub.set_read_timeout(Some(LIMIT)).expect("timeout");
    let mut pubsub = sub.as_pubsub();
    pubsub.subscribe("redisson_sc:{S}").expect("subscribe");
    let renewed: i64 =
        redis::cmd("RSEM.RENEW").arg("S").arg(&got[0]).arg(100).query(&mut con).expect("renew");
    assert_eq!(renewed, 1);
    let payload: String = pubsub.get_message().expect("reclaimed").get_payload().expect("payload");
    assert_eq!(payload, "1");
    assert_eq!(get(&mut con, "S").as_deref(), Some("1"));
}

#[test]
fn leased_permits_granted_to_a_client_that_is_gone_are_released() {
    let server = Server::start();
    let mut con = server.conn();
    cmd(&mut con, &["RSEM.SETPERMITS", "S", "0"]);
    let gone =
        Pending::start_str(&server, &["RSEM.ACQUIRE", "S", "2", "LEASE", "60000", "WAIT", "0"]);
    wait_blocked(&mut con, 1);
    let mut tx = redis::pipe();
    tx.atomic();
    tx.cmd("RSEM.RELEASE").arg("S").arg(2);
    tx.cmd("CLIENT").arg("KILL").arg("ID").arg(gone.client_id());
    let (left, killed): (i64, i64) = tx.query(&mut con).expect("MULTI/EXEC");
    assert_eq!((left, killed), (0, 1));
    assert!(gone.reply(LIMIT).0.is_err());
    poll("the permits back", LIMIT, || (get(&mut con, "S").as_deref() == Some("2")).then_some(()));
    assert_eq!(cmd(&mut con, &["EXISTS", "{S}:timeout"]), Value::Int(0), "its ids released");
}

/// Redisson's `tryRelease(ids)` and `tryAcquire` (the model's §4) on the same semaphore.
const REDISSON_PES_RELEASE: &str = "for i = 3, #ARGV do \
     local s = redis.call('zscore', KEYS[2], ARGV[i]); \
     if s == false or tonumber(s) <= tonumber(ARGV[1]) then return 0 end end; \
     local k = 0; for i = 3, #ARGV do k = k + redis.call('zrem', KEYS[2], ARGV[i]) end; \
     redis.call('incrby', KEYS[1], k); redis.call('publish', KEYS[3], k); return k";
const REDISSON_PES_ACQUIRE: &str = "local v = tonumber(redis.call('get', KEYS[1]) or '0'); \
     if v >= 1 then redis.call('decrby', KEYS[1], 1); \
     redis.call('zadd', KEYS[2], ARGV[2], ARGV[3]); return 'OK' end; return false";

#[test]
fn a_redisson_client_releases_rlock_leases_by_id_and_the_reverse() {
    let server = Server::start();
    let mut con = server.conn();
    cmd(&mut con, &["RSEM.SETPERMITS", "S", "2"]);
    let now = rlock_tests_integration::server_time_ms(&mut con);
    let ours = permit_ids(&cmd(&mut con, &["RSEM.ACQUIRE", "S", "1", "LEASE", "60000"]));
    let keys = ["S", "{S}:timeout", "redisson_sc:{S}"];
    let released: i64 = redis::cmd("EVAL")
        .arg(REDISSON_PES_RELEASE)
        .arg(3)
        .arg(&keys)
        .arg(now)
        .arg("x")
        .arg(&ours[0])
        .query(&mut con)
        .expect("Redisson release");
    assert_eq!(released, 1, "Redisson released an rlock lease by id");
    assert_eq!(get(&mut con, "S").as_deref(), Some("2"));
    let theirs = *b"0123456789abcdef";
    let ok: Option<String> = redis::cmd("EVAL")
        .arg(REDISSON_PES_ACQUIRE)
        .arg(2)
        .arg(&keys[..2])
        .arg(now)
        .arg(now + 60_000)
        .arg(&theirs[..])
        .query(&mut con)
        .expect("Redisson acquire");
    assert_eq!(ok.as_deref(), Some("OK"));
    let released: i64 = redis::cmd("RSEM.RELEASE")
        .arg("S")
        .arg("ID")
        .arg(&theirs[..])
        .query(&mut con)
        .expect("release");
    assert_eq!(released, 1, "rlock released a Redisson lease by id");
    assert_eq!(get(&mut con, "S").as_deref(), Some("2"));
    // A Redisson lease that already ended: AVAILABLE counts it back without writing, and the
    // next write reclaims it.
    let dead = *b"fedcba9876543210";
    let ok: Option<String> = redis::cmd("EVAL")
        .arg(REDISSON_PES_ACQUIRE)
        .arg(2)
        .arg(&keys[..2])
        .arg(now)
        .arg(now - 1)
        .arg(&dead[..])
        .query(&mut con)
        .expect("Redisson acquire");
    assert_eq!(ok.as_deref(), Some("OK"));
    let before = digest(&mut con);
    assert_eq!(cmd(&mut con, &["RSEM.AVAILABLE", "S"]), Value::Int(2));
    assert_eq!(digest(&mut con), before, "AVAILABLE writes nothing");
    assert_eq!(cmd(&mut con, &["RSEM.ACQUIRE", "S", "2"]), Value::Int(1), "reclaimed, then taken");
    assert_eq!(cmd(&mut con, &["EXISTS", "{S}:timeout"]), Value::Int(0));
}

/// A lease that ends while writes are paused is reclaimed after the pause, never during it (a
/// module write to an expired key during a pause aborts the server), and its waiter is served.
#[test]
fn a_lease_ending_during_client_pause_is_reclaimed_after_it() {
    let server = Server::start();
    let mut con = server.conn();
    cmd(&mut con, &["RSEM.SETPERMITS", "S", "1"]);
    let _dead = permit_ids(&cmd(&mut con, &["RSEM.ACQUIRE", "S", "1", "LEASE", "200"]));
    let waiter =
        Pending::start_str(&server, &["RSEM.ACQUIRE", "S", "1", "LEASE", "30000", "WAIT", "0"]);
    wait_blocked(&mut con, 1);
    let paused_at = Instant::now();
    cmd(&mut con, &["CLIENT", "PAUSE", "1000", "WRITE"]);
    let (reply, at) = waiter.reply(LIMIT);
    assert_eq!(permit_ids(&reply.expect("granted")).len(), 1);
    assert!(at - paused_at >= Duration::from_millis(900), "granted during the pause");
    assert_eq!(cmd(&mut con, &["PING"]), Value::SimpleString("PONG".into()), "alive");
    assert!(!server.log().contains("ASSERTION"), "{}", server.log());
}

/// A counted-only semaphore (no lease zset) looks its lease zset up once per counted command
/// (to reclaim ended leases a Redisson client may have made), not once more to schedule the
/// next reclaim: one keyspace miss per command.
#[test]
fn a_counted_command_looks_for_the_lease_zset_once() {
    let server = Server::start();
    let mut con = server.conn();
    cmd(&mut con, &["RSEM.SETPERMITS", "S", "5"]);
    let misses = |con: &mut Connection| info_field(con, "stats", "keyspace_misses");
    for args in [&["RSEM.ACQUIRE", "S", "1"][..], &["RSEM.RELEASE", "S", "1"]] {
        let before = misses(&mut con);
        assert_eq!(cmd(&mut con, args), Value::Int(if args[0] == "RSEM.ACQUIRE" { 1 } else { 5 }));
        assert_eq!(misses(&mut con) - before, 1, "{args:?}: the missing {{S}}:timeout, once");
    }
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

/// The most leased permits one `RSEM.ACQUIRE ... LEASE` may take (and ids one `RSEM.RELEASE ...
/// ID` may name); see README.
const MAX_LEASED: usize = 10_000;

fn zcard(con: &mut Connection, key: &str) -> i64 {
    redis::cmd("ZCARD").arg(key).query(con).expect("ZCARD")
}

/// Waits until the replica acknowledged everything the master wrote so far.
fn synced(master: &mut Connection) {
    let acked: i64 = redis::cmd("WAIT").arg(1).arg(5000).query(master).expect("WAIT");
    assert_eq!(acked, 1, "the replica acknowledged");
}

// ---- the count is parsed exactly as INCRBY parses it --------------------------------------------

#[test]
fn a_count_incrby_refuses_is_refused_and_master_and_replica_agree() {
    let master = Server::start();
    let replica = Server::builder().without_module().replica_of(&master).start();
    wait_replica_online(&master);
    let (mut con, mut rep) = (master.conn(), replica.conn());
    let not_integer = "ERR the semaphore's value is not an integer";
    for bad in ["05", "-0", "007", "+5", " 5", "5 ", "0x5", "1e3", "-", "", "9223372036854775808"] {
        cmd(&mut con, &["SET", "S", bad]);
        let incrby = run_str(&mut con, &["INCRBY", "S", "0"]).unwrap_err();
        assert!(incrby.starts_with("ERR value is not an integer"), "{bad:?}: {incrby}");
        let before = digest(&mut con);
        for args in [
            &["RSEM.RELEASE", "S", "2"][..],
            &["RSEM.ACQUIRE", "S", "1"],
            &["RSEM.ADDPERMITS", "S", "1"],
            &["RSEM.AVAILABLE", "S"],
            &["RSEM.INFO", "S"],
        ] {
            assert_eq!(run_str(&mut con, args), Err(not_integer.to_owned()), "{bad:?} {args:?}");
        }
        assert_eq!(digest(&mut con), before, "{bad:?}: nothing changed");
    }
    // What INCRBY accepts, the module accepts, to the last value.
    for (good, after) in
        [("0", "1"), ("-5", "-4"), ("-9223372036854775808", "-9223372036854775807"), ("12", "13")]
    {
        cmd(&mut con, &["SET", "S", good]);
        assert_eq!(cmd(&mut con, &["RSEM.AVAILABLE", "S"]), Value::Int(good.parse().unwrap()));
        cmd(&mut con, &["RSEM.RELEASE", "S", "1"]);
        assert_eq!(get(&mut con, "S").as_deref(), Some(after), "{good}");
    }
    // A count INCRBY refuses (`05`), released and acquired on: the master and a replica without
    // the module never part.
    cmd(&mut con, &["SET", "S", "05"]);
    let _ = run_str(&mut con, &["RSEM.RELEASE", "S", "2"]);
    let _ = run_str(&mut con, &["RSEM.ACQUIRE", "S", "1"]);
    synced(&mut con);
    assert_eq!(get(&mut con, "S"), get(&mut rep, "S"), "master and replica agree");
    assert_eq!(get(&mut con, "S").as_deref(), Some("05"));
}

// ---- a TTL on the count is kept exactly ---------------------------------------------------------

#[test]
fn a_ttl_on_the_count_does_not_drift_over_many_acquires_and_releases() {
    let master = Server::start();
    let replica = Server::builder().without_module().replica_of(&master).start();
    wait_replica_online(&master);
    let (mut con, mut rep) = (master.conn(), replica.conn());
    con.set_read_timeout(Some(Duration::from_secs(60))).expect("timeout");
    cmd(&mut con, &["SET", "S", "1000000"]);
    cmd(&mut con, &["PEXPIRE", "S", "3600000"]);
    let deadline = pexpiretime(&mut con, b"S");
    // Each pair re-sets the TTL twice: one clock tick between two readings moved it by 1 ms
    // (300,000 pairs moved it by 15 to 25 ms).
    for _ in 0..30 {
        let mut pipe = redis::pipe();
        for _ in 0..5_000 {
            pipe.cmd("RSEM.ACQUIRE").arg("S").arg(1).ignore();
            pipe.cmd("RSEM.RELEASE").arg("S").arg(1).ignore();
        }
        pipe.query::<()>(&mut con).expect("pairs");
    }
    assert_eq!(get(&mut con, "S").as_deref(), Some("1000000"));
    assert_eq!(pexpiretime(&mut con, b"S"), deadline, "the master keeps the exact deadline");
    synced(&mut con);
    assert_eq!(pexpiretime(&mut rep, b"S"), deadline, "so does the replica");
}

// ---- a release by id that would overflow changes nothing ----------------------------------------

#[test]
fn a_release_by_id_that_overflows_the_count_keeps_the_permit() {
    let master = Server::start();
    let replica = Server::builder().without_module().replica_of(&master).start();
    wait_replica_online(&master);
    let (mut con, mut rep) = (master.conn(), replica.conn());
    cmd(&mut con, &["RSEM.SETPERMITS", "S", "1"]);
    let id = permit_ids(&cmd(&mut con, &["RSEM.ACQUIRE", "S", "1", "LEASE", "60000"])).remove(0);
    cmd(&mut con, &["RSEM.ADDPERMITS", "S", "9223372036854775807"]);
    let before = digest(&mut con);
    let err = run(&mut con, &[b"RSEM.RELEASE", b"S", b"ID", &id]).unwrap_err();
    assert_eq!(err, "ERR permit count overflow");
    assert_eq!(digest(&mut con), before, "the permit is still leased");
    // The same id twice is one permit: the count check counts it once.
    cmd(&mut con, &["SET", "S", "9223372036854775806"]);
    let released = run(&mut con, &[b"RSEM.RELEASE", b"S", b"ID", &id, &id]);
    assert_eq!(released, Ok(Value::Int(1)));
    assert_eq!(get(&mut con, "S").as_deref(), Some("9223372036854775807"));
    synced(&mut con);
    assert_eq!(get(&mut rep, "S").as_deref(), Some("9223372036854775807"));
    assert_eq!(zcard(&mut rep, "{S}:timeout"), 0);
}

// ---- the permits the waiters ask for do not wrap ------------------------------------------------

#[test]
fn waiting_permits_saturate_instead_of_wrapping() {
    let server = Server::start();
    let mut con = server.conn();
    cmd(&mut con, &["RSEM.SETPERMITS", "S", "0"]);
    let max = "9223372036854775807";
    let a = Pending::start_str(&server, &["RSEM.ACQUIRE", "S", max, "WAIT", "10000"]);
    let b = Pending::start_str(&server, &["RSEM.ACQUIRE", "S", max, "WAIT", "10000"]);
    wait_blocked(&mut con, 2);
    let fields = rsem_info(&mut con, "S").expect("a semaphore");
    assert_eq!(fields["waiters"], 2, "{fields:?}");
    assert_eq!(fields["waiting_permits"], i64::MAX, "{fields:?}");
    for pending in [a, b] {
        cmd(&mut con, &["CLIENT", "UNBLOCK", &pending.client_id().to_string()]);
        assert_eq!(pending.reply(LIMIT).0, Ok(Value::Int(0)));
    }
}

// ---- sizes a client sends are bounded before anything is written --------------------------------

#[test]
fn a_leased_acquire_of_too_many_permits_is_refused_and_changes_nothing() {
    let server = Server::start();
    let mut con = server.conn();
    cmd(&mut con, &["RSEM.SETPERMITS", "s", "9223372036854775807"]);
    let too_many = "ERR permits with LEASE must be at most 10000 per call";
    for permits in ["9223372036854775807", "4294967296", "3000000", "10001"] {
        let args = ["RSEM.ACQUIRE", "s", permits, "LEASE", "1000"];
        let args: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
        // Inside MULTI, as the argument fuzz found it, between two digests.
        let (reply, changed) = run_checked(&mut con, &args).expect("server alive");
        assert_eq!(reply, Err(too_many.to_owned()), "{permits}");
        assert!(!changed, "{permits}: nothing changed");
        assert_eq!(run(&mut con, &args), Err(too_many.to_owned()), "{permits}");
    }
    assert_eq!(get(&mut con, "s").as_deref(), Some("9223372036854775807"));
    // A waiter asking too many is refused before it blocks.
    cmd(&mut con, &["RSEM.SETPERMITS", "t", "0"]);
    let err = run_str(&mut con, &["RSEM.ACQUIRE", "t", "10001", "LEASE", "1000", "WAIT", "0"])
        .unwrap_err();
    assert_eq!(err, too_many);
    assert_eq!(blocked_clients(&mut con), 0);
    // The limit itself is granted.
    let granted = permit_ids(&cmd(&mut con, &["RSEM.ACQUIRE", "s", "10000", "LEASE", "60000"]));
    assert_eq!(granted.len(), MAX_LEASED);
    assert_eq!(zcard(&mut con, "{s}:timeout"), MAX_LEASED as i64);
    assert!(!server.log().contains("panicked"), "{}", server.log());
}

#[test]
fn a_release_naming_too_many_ids_is_refused_and_changes_nothing() {
    let server = Server::start();
    let mut con = server.conn();
    cmd(&mut con, &["RSEM.SETPERMITS", "s", "20000"]);
    let mut granted = permit_ids(&cmd(&mut con, &["RSEM.ACQUIRE", "s", "10000", "LEASE", "60000"]));
    granted.extend(permit_ids(&cmd(&mut con, &["RSEM.ACQUIRE", "s", "1", "LEASE", "60000"])));
    let before = digest(&mut con);
    let mut args: Vec<&[u8]> = vec![b"RSEM.RELEASE", b"s", b"ID"];
    args.extend(granted.iter().map(Vec::as_slice));
    assert_eq!(
        run(&mut con, &args),
        Err("ERR at most 10000 permit ids (after ID) per call".into())
    );
    assert_eq!(digest(&mut con), before, "nothing released");
    args.pop();
    assert_eq!(run(&mut con, &args), Ok(Value::Int(MAX_LEASED as i64)));
}

/// Ended leases a foreign writer put in the zset (200,000 of them) come back in bounded
/// batches: a command puts back at most one batch, the timer the rest, a batch a tick.
#[test]
fn a_huge_foreign_zset_of_ended_leases_is_reclaimed_in_bounded_batches() {
    let server = Server::start();
    let mut con = server.conn();
    con.set_read_timeout(Some(Duration::from_secs(60))).expect("timeout");
    let members = 200_000;
    let script = "for i = 1, tonumber(ARGV[1]) do \
                  redis.call('zadd', KEYS[1], 1000, string.format('%016d', i)) end";
    let _: () = redis::cmd("EVAL")
        .arg(script)
        .arg(1)
        .arg("{s}:timeout")
        .arg(members)
        .query(&mut con)
        .expect("ZADD");
    cmd(&mut con, &["SET", "s", "0"]);
    // The module has not looked at `s` yet: one command reclaims one batch.
    let exec: Vec<Value> = redis::pipe()
        .atomic()
        .cmd("RSEM.ACQUIRE")
        .arg("s")
        .arg(1)
        .cmd("ZCARD")
        .arg("{s}:timeout")
        .query(&mut con)
        .expect("MULTI");
    assert_eq!(exec[0], Value::Int(1), "a batch came back");
    let Value::Int(left) = exec[1] else { panic!("{exec:?}") };
    assert!(left >= members - MAX_LEASED as i64, "at most one batch per call: {left} left");
    // The rest come back by the timer.
    poll("every ended lease back", LIMIT, || (zcard(&mut con, "{s}:timeout") == 0).then_some(()));
    assert_eq!(get(&mut con, "s"), Some((members - 1).to_string()));
}

// ---- a semaphore whose count key is missing is still a semaphore --------------------------------

#[test]
fn leases_of_a_semaphore_whose_count_key_was_deleted_are_reclaimed_by_the_timer() {
    let server = Server::start();
    let mut con = server.conn();
    cmd(&mut con, &["RSEM.SETPERMITS", "S", "1"]);
    cmd(&mut con, &["RSEM.ACQUIRE", "S", "1", "LEASE", "150"]);
    cmd(&mut con, &["DEL", "S"]);
    // The timer at the lease end puts the permit back (INCRBY creates the count, as Redisson's
    // reclaim does), with no command to trigger it.
    poll("the lease reclaimed", LIMIT, || {
        (get(&mut con, "S").as_deref() == Some("1")).then_some(())
    });
    assert_eq!(zcard(&mut con, "{S}:timeout"), 0);
    assert!(!server.log().contains("panicked"), "{}", server.log());
}

/// A change of the count (`RSEM.ADDPERMITS`, `RSEM.SETPERMITS` of an existing semaphore) is an
/// `RSEM` write, and every `RSEM` write reclaims ended leases first (docs/waiting.md): its
/// reply is the count `RSEM.AVAILABLE` reports, and the ended lease leaves the zset. A Redisson
/// client's lease that already ended (rlock has not looked at the semaphore yet) stayed in the
/// zset after `RSEM.ADDPERMITS` and the reply left it out (1, while `RSEM.AVAILABLE` said 2).
#[test]
fn a_count_change_reclaims_ended_leases_first() {
    let server = Server::start();
    let mut con = server.conn();
    for (name, delta, want) in [("S", "1", 2), ("T", "-1", 0)] {
        cmd(&mut con, &["SET", name, "0"]);
        let zset = format!("{{{name}}}:timeout");
        // A lease that ended long ago, as Redisson's tryAcquire(leaseTime) leaves it.
        cmd(&mut con, &["ZADD", &zset, "1000", "0123456789abcdef"]);
        let available = cmd(&mut con, &["RSEM.AVAILABLE", name]);
        assert_eq!(available, Value::Int(1), "{name}: AVAILABLE counts the ended lease");
        assert_eq!(
            cmd(&mut con, &["RSEM.ADDPERMITS", name, delta]),
            Value::Int(want),
            "{name}: ADDPERMITS {delta} replies the count with the ended lease back"
        );
        assert_eq!(zcard(&mut con, &zset), 0, "{name}: the ended lease reclaimed");
        assert_eq!(cmd(&mut con, &["RSEM.AVAILABLE", name]), Value::Int(want));
    }
}

/// Once rlock has looked at a semaphore through a count change, a Redisson client's live lease
/// on it is reclaimed by the timer at its end, as after any other `RSEM` command
/// (docs/waiting.md: "once rlock has looked at the semaphore (any `RSEM` command, or a
/// waiter)"). After `RSEM.ADDPERMITS` or `RSEM.SETPERMITS` no timer was set: the lease stayed
/// in the zset, its permit out of the count, long after its end (`RSEM.ACQUIRE` and
/// `RSEM.RELEASE` set it).
#[test]
fn a_count_change_sets_the_reclaim_timer_for_a_foreign_lease() {
    let server = Server::start();
    let mut con = server.conn();
    for (name, change) in
        [("S", ["RSEM.ADDPERMITS", "S", "0"]), ("T", ["RSEM.SETPERMITS", "T", "5"])]
    {
        cmd(&mut con, &["SET", name, "1"]);
        let zset = format!("{{{name}}}:timeout");
        let end = rlock_tests_integration::server_time_ms(&mut con) + 300;
        cmd(&mut con, &["ZADD", &zset, &end.to_string(), "0123456789abcdef"]);
        cmd(&mut con, &change);
        poll(&format!("{name}: the lease reclaimed at its end after {change:?}"), LIMIT, || {
            (zcard(&mut con, &zset) == 0).then_some(())
        });
        assert_eq!(get(&mut con, name).as_deref(), Some("2"), "{name}: the permit back");
    }
}

/// `RSEM.ADDPERMITS` "replies the new count": the count the semaphore holds after the command,
/// which is also what it publishes on `redisson_sc:{S}` (the count left after its waiters were
/// served), as `RSEM.RELEASE` replies. With a waiter for 2 permits, `ADDPERMITS S 3` replied 3
/// while the key held 1 right after and 1 was published.
#[test]
fn addpermits_replies_the_count_left_after_the_waiters_it_served() {
    let server = Server::start();
    let mut con = server.conn();
    let mut sub = server.conn();
    sub.set_read_timeout(Some(LIMIT)).expect("timeout");
    let mut pubsub = sub.as_pubsub();
    pubsub.subscribe("redisson_sc:{S}").expect("subscribe");
    cmd(&mut con, &["RSEM.SETPERMITS", "S", "0"]);
    let set: String = pubsub.get_message().expect("message").get_payload().expect("payload");
    assert_eq!(set, "0");
    let waiter = Pending::start_str(&server, &["RSEM.ACQUIRE", "S", "2", "WAIT", "10000"]);
    wait_blocked(&mut con, 1);
    let reply = cmd(&mut con, &["RSEM.ADDPERMITS", "S", "3"]);
    let held = get(&mut con, "S");
    let (granted, _) = waiter.reply(LIMIT);
    assert_eq!(granted.expect("granted"), Value::Int(1), "the waiter was served");
    let published: String = pubsub.get_message().expect("message").get_payload().expect("payload");
    assert_eq!((held.as_deref(), published.as_str()), (Some("1"), "1"));
    assert_eq!(reply, Value::Int(1), "the reply is the count left, as held and published");
}
