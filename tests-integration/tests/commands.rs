//! The RLOCK.* command contract against a real redis-server with the module loaded.

use std::time::Duration;

use redis::{Connection, Value};

use rlock_tests_integration::{
    cmd, digest, exists, hgetall, pexpiretime, poll, run, run_str, Server,
};

fn int(v: &Value) -> i64 {
    match v {
        Value::Int(n) => *n,
        other => panic!("expected an integer, got {other:?}"),
    }
}

fn hget(con: &mut Connection, key: &str, field: &str) -> Option<i64> {
    redis::cmd("HGET").arg(key).arg(field).query(con).expect("HGET")
}

#[test]
fn acquire_replies_nil_when_free_or_reentered_and_the_pttl_when_held() {
    let server = Server::start();
    let mut con = server.conn();
    assert_eq!(cmd(&mut con, &["RLOCK.ACQUIRE", "l", "a", "10000"]), Value::Nil);
    assert_eq!(hget(&mut con, "l", "a"), Some(1));
    let pttl = int(&cmd(&mut con, &["PTTL", "l"]));
    assert!((9_000..=10_000).contains(&pttl), "lease set: {pttl}");

    assert_eq!(cmd(&mut con, &["RLOCK.ACQUIRE", "l", "a", "20000"]), Value::Nil);
    assert_eq!(hget(&mut con, "l", "a"), Some(2));
    let pttl = int(&cmd(&mut con, &["PTTL", "l"]));
    assert!((19_000..=20_000).contains(&pttl), "re-entry resets the lease: {pttl}");

    let before = digest(&mut con);
    let busy = int(&cmd(&mut con, &["RLOCK.ACQUIRE", "l", "b", "5000"]));
    assert!((19_000..=20_000).contains(&busy), "the holder's remaining lease: {busy}");
    assert_eq!(digest(&mut con), before, "a failed acquire changes nothing");
    assert_eq!(hget(&mut con, "l", "b"), None);

    // A lock hash with no expiry (set by hand): -1.
    cmd(&mut con, &["HSET", "forever", "x", "1"]);
    assert_eq!(int(&cmd(&mut con, &["RLOCK.ACQUIRE", "forever", "b", "5000"])), -1);
}

#[test]
fn reentrancy_counts_one_two_one_zero_and_deletes_only_at_zero() {
    let server = Server::start();
    let mut con = server.conn();
    assert_eq!(cmd(&mut con, &["RLOCK.ACQUIRE", "l", "a", "30000"]), Value::Nil);
    assert_eq!(hget(&mut con, "l", "a"), Some(1));
    assert_eq!(cmd(&mut con, &["RLOCK.ACQUIRE", "l", "a", "30000"]), Value::Nil);
    assert_eq!(hget(&mut con, "l", "a"), Some(2));
    assert_eq!(int(&cmd(&mut con, &["RLOCK.RELEASE", "l", "a"])), 0);
    assert_eq!(hget(&mut con, "l", "a"), Some(1));
    assert!(exists(&mut con, "l"));
    assert_eq!(int(&cmd(&mut con, &["RLOCK.RELEASE", "l", "a"])), 1);
    assert!(!exists(&mut con, "l"), "deleted at zero");
    assert_eq!(cmd(&mut con, &["RLOCK.RELEASE", "l", "a"]), Value::Nil, "no lock: nil");
}

#[test]
fn release_resets_the_lease_only_when_given_one() {
    let server = Server::start();
    let mut con = server.conn();
    for _ in 0..3 {
        cmd(&mut con, &["RLOCK.ACQUIRE", "l", "a", "100000"]);
    }
    let expiry = pexpiretime(&mut con, b"l");
    assert_eq!(int(&cmd(&mut con, &["RLOCK.RELEASE", "l", "a"])), 0);
    assert_eq!(pexpiretime(&mut con, b"l"), expiry, "no lease given: expiry unchanged");
    assert_eq!(int(&cmd(&mut con, &["RLOCK.RELEASE", "l", "a", "5000"])), 0);
    let pttl = int(&cmd(&mut con, &["PTTL", "l"]));
    assert!((4_000..=5_000).contains(&pttl), "lease reset to 5000: {pttl}");
}

#[test]
fn release_by_another_owner_changes_nothing() {
    let server = Server::start();
    let mut con = server.conn();
    cmd(&mut con, &["RLOCK.ACQUIRE", "l", "a", "30000"]);
    cmd(&mut con, &["RLOCK.ACQUIRE", "l", "a", "30000"]);
    let before = digest(&mut con);
    assert_eq!(cmd(&mut con, &["RLOCK.RELEASE", "l", "b"]), Value::Nil);
    assert_eq!(cmd(&mut con, &["RLOCK.RELEASE", "l", "b", "10"]), Value::Nil);
    assert_eq!(digest(&mut con), before);
    assert_eq!(hget(&mut con, "l", "a"), Some(2));
}

#[test]
fn renew_resets_a_holders_lease_and_never_creates_a_lock() {
    let server = Server::start();
    let mut con = server.conn();
    assert_eq!(int(&cmd(&mut con, &["RLOCK.RENEW", "l", "a", "5000"])), 0);
    assert!(!exists(&mut con, "l"), "renew creates nothing");

    cmd(&mut con, &["RLOCK.ACQUIRE", "l", "a", "5000"]);
    let before = digest(&mut con);
    assert_eq!(int(&cmd(&mut con, &["RLOCK.RENEW", "l", "b", "60000"])), 0);
    assert_eq!(digest(&mut con), before, "a non-holder's renew changes nothing");

    assert_eq!(int(&cmd(&mut con, &["RLOCK.RENEW", "l", "a", "60000"])), 1);
    let pttl = int(&cmd(&mut con, &["PTTL", "l"]));
    assert!((59_000..=60_000).contains(&pttl), "renewed: {pttl}");
    assert_eq!(hget(&mut con, "l", "a"), Some(1), "renew leaves the count");
}

#[test]
fn lease_expiry_frees_the_lock_and_the_old_owners_release_replies_nil() {
    let server = Server::start();
    let mut con = server.conn();
    // In one transaction, so a stalled machine cannot let the 100 ms lease run out in between.
    cmd(&mut con, &["MULTI"]);
    cmd(&mut con, &["RLOCK.ACQUIRE", "l", "a", "100"]);
    cmd(&mut con, &["RLOCK.ACQUIRE", "l", "b", "100"]);
    let Value::Array(replies) = cmd(&mut con, &["EXEC"]) else { panic!("EXEC") };
    assert_eq!(replies[0], Value::Nil);
    assert!(int(&replies[1]) > 0, "held by a");
    poll("the lease to run out", Duration::from_secs(5), || {
        (int(&cmd(&mut con, &["RLOCK.PTTL", "l"])) == -2).then_some(())
    });
    assert_eq!(cmd(&mut con, &["RLOCK.RELEASE", "l", "a"]), Value::Nil);
    assert_eq!(cmd(&mut con, &["RLOCK.ACQUIRE", "l", "b", "10000"]), Value::Nil);
    assert_eq!(hget(&mut con, "l", "b"), Some(1));
}

#[test]
fn pttl_replies_minus_two_minus_one_or_the_lease() {
    let server = Server::start();
    let mut con = server.conn();
    assert_eq!(int(&cmd(&mut con, &["RLOCK.PTTL", "l"])), -2);
    cmd(&mut con, &["RLOCK.ACQUIRE", "l", "a", "7000"]);
    let pttl = int(&cmd(&mut con, &["RLOCK.PTTL", "l"]));
    assert!((6_000..=7_000).contains(&pttl), "{pttl}");
    cmd(&mut con, &["PERSIST", "l"]);
    assert_eq!(int(&cmd(&mut con, &["RLOCK.PTTL", "l"])), -1);
}

#[test]
fn forcerelease_deletes_any_holders_lock_and_publishes() {
    let server = Server::start();
    let mut con = server.conn();
    let mut sub = server.conn();
    sub.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
    let mut sub = sub.as_pubsub();
    sub.subscribe("redisson_lock__channel:{l}").expect("subscribe");

    assert_eq!(int(&cmd(&mut con, &["RLOCK.FORCERELEASE", "l"])), 0);
    cmd(&mut con, &["RLOCK.ACQUIRE", "l", "a", "30000"]);
    cmd(&mut con, &["RLOCK.ACQUIRE", "l", "a", "30000"]);
    assert_eq!(int(&cmd(&mut con, &["RLOCK.FORCERELEASE", "l"])), 1);
    assert!(!exists(&mut con, "l"));
    let msg = sub.get_message().expect("the unlock message");
    assert_eq!(msg.get_channel_name(), "redisson_lock__channel:{l}");
    assert_eq!(msg.get_payload_bytes(), b"0");
}

#[test]
fn release_to_zero_publishes_zero_on_the_redisson_channel() {
    let server = Server::start();
    let mut con = server.conn();
    let mut sub = server.conn();
    sub.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
    let mut sub = sub.as_pubsub();
    sub.subscribe("redisson_lock__channel:{orders:42}").expect("subscribe");

    cmd(&mut con, &["RLOCK.ACQUIRE", "orders:42", "a", "30000"]);
    cmd(&mut con, &["RLOCK.ACQUIRE", "orders:42", "a", "30000"]);
    let receivers = |con: &mut Connection| -> i64 {
        redis::cmd("PUBSUB")
            .arg("NUMSUB")
            .arg("redisson_lock__channel:{orders:42}")
            .query::<(String, i64)>(con)
            .expect("NUMSUB")
            .1
    };
    assert_eq!(receivers(&mut con), 1);
    assert_eq!(int(&cmd(&mut con, &["RLOCK.RELEASE", "orders:42", "a"])), 0);
    assert_eq!(int(&cmd(&mut con, &["RLOCK.RELEASE", "orders:42", "a"])), 1);
    let msg = sub.get_message().expect("the unlock message");
    assert_eq!(msg.get_channel_name(), "redisson_lock__channel:{orders:42}");
    assert_eq!(msg.get_payload_bytes(), b"0");
    // Exactly one message: the release that left the lock held published nothing.
    sub.set_read_timeout(Some(Duration::from_millis(200))).expect("timeout");
    assert!(sub.get_message().is_err(), "only the release to zero publishes");
}

#[test]
fn info_replies_nil_or_owner_count_pttl_waiters_token() {
    let server = Server::start();
    let mut con = server.conn();
    assert_eq!(cmd(&mut con, &["RLOCK.INFO", "l"]), Value::Nil);
    cmd(&mut con, &["RLOCK.ACQUIRE", "l", "a", "30000"]);
    cmd(&mut con, &["RLOCK.ACQUIRE", "l", "a", "30000"]);

    // RESP2: a flat field/value array.
    let Value::Array(flat) = cmd(&mut con, &["RLOCK.INFO", "l"]) else { panic!("array") };
    let mut fields = std::collections::HashMap::new();
    for pair in flat.chunks(2) {
        let Value::BulkString(name) = &pair[0] else { panic!("field name {pair:?}") };
        fields.insert(String::from_utf8(name.clone()).expect("utf8"), pair[1].clone());
    }
    // The queue's figures (`queue_*`) come last: clients reading by position keep working.
    assert_eq!(fields.len(), 8, "{fields:?}");
    assert_eq!(fields["owner"], Value::BulkString(b"a".to_vec()));
    assert_eq!(fields["count"], Value::Int(2));
    assert!((29_000..=30_000).contains(&int(&fields["pttl"])));
    assert_eq!(fields["waiters"], Value::Int(0));
    assert_eq!(fields["token"], Value::Int(0), "no token asked for yet");

    // RESP3: a map.
    let mut con3 = server.conn_resp3();
    let Value::Map(map) = cmd(&mut con3, &["RLOCK.INFO", "l"]) else { panic!("map") };
    assert_eq!(map.len(), 8);
    assert!(
        map.contains(&(Value::BulkString(b"count".to_vec()), Value::Int(2)))
            || map.contains(&(Value::SimpleString("count".into()), Value::Int(2))),
        "{map:?}"
    );
}

#[test]
fn owners_and_keys_are_binary_safe_nul_bytes_included() {
    let server = Server::start();
    let mut con = server.conn();
    let key: &[u8] = b"lock\0\xff:1";
    let owner: &[u8] = b"uuid\0:\x80\x01";
    let other: &[u8] = b"uuid\0:\x80\x02"; // differs after the NUL byte
    assert_eq!(run(&mut con, &[b"RLOCK.ACQUIRE", key, owner, b"30000"]), Ok(Value::Nil));
    assert_eq!(run(&mut con, &[b"RLOCK.ACQUIRE", key, owner, b"30000"]), Ok(Value::Nil));
    assert_eq!(hgetall(&mut con, key), vec![(owner.to_vec(), b"2".to_vec())]);
    let busy = run(&mut con, &[b"RLOCK.ACQUIRE", key, other, b"30000"]);
    assert!(matches!(busy, Ok(Value::Int(n)) if n > 0), "{busy:?}");
    assert_eq!(run(&mut con, &[b"RLOCK.RELEASE", key, other]), Ok(Value::Nil));

    let Ok(Value::Array(info)) = run(&mut con, &[b"RLOCK.INFO", key]) else { panic!("info") };
    assert!(info.contains(&Value::BulkString(owner.to_vec())), "{info:?}");

    let mut sub = server.conn();
    sub.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
    let mut sub = sub.as_pubsub();
    let channel = [b"redisson_lock__channel:{".as_slice(), key, b"}"].concat();
    sub.subscribe(&channel).expect("subscribe");
    assert_eq!(run(&mut con, &[b"RLOCK.RELEASE", key, owner]), Ok(Value::Int(0)));
    assert_eq!(run(&mut con, &[b"RLOCK.RELEASE", key, owner]), Ok(Value::Int(1)));
    let msg = sub.get_message().expect("unlock message");
    assert_eq!(msg.get_channel::<Vec<u8>>().expect("channel"), channel);
    assert_eq!(run(&mut con, &[b"EXISTS", key]), Ok(Value::Int(0)));
}

#[test]
fn wrong_arity_gets_redis_standard_reply() {
    let server = Server::start();
    let mut con = server.conn();
    let cases: &[&[&str]] = &[
        &["RLOCK.ACQUIRE"],
        &["RLOCK.ACQUIRE", "l"],
        &["RLOCK.ACQUIRE", "l", "a"],
        &["RLOCK.RELEASE", "l"],
        &["RLOCK.RENEW", "l", "a"],
        &["RLOCK.PTTL"],
        &["RLOCK.PTTL", "l", "extra"],
        &["RLOCK.FORCERELEASE"],
        &["RLOCK.FORCERELEASE", "l", "extra"],
        &["RLOCK.INFO"],
        &["RLOCK.INFO", "l", "extra"],
    ];
    for args in cases {
        let err = run_str(&mut con, args).expect_err("wrong arity must fail");
        assert_eq!(
            err,
            format!("ERR wrong number of arguments for '{}' command", args[0].to_lowercase()),
            "{args:?}"
        );
    }
}

#[test]
fn every_bad_argument_gets_an_error_naming_it_and_changes_nothing() {
    let server = Server::start();
    let mut con = server.conn();
    cmd(&mut con, &["RLOCK.ACQUIRE", "held", "a", "30000"]);
    cmd(&mut con, &["SET", "str", "v"]);
    cmd(&mut con, &["HSET", "corrupt", "a", "abc", "z", "1"]);
    cmd(&mut con, &["HSET", "zero", "a", "0"]);
    cmd(&mut con, &["HSET", "negative", "a", "-3"]);
    let before = digest(&mut con);

    let lease_err = "ERR lease-ms must be positive";
    let lease_not_int = "ERR lease-ms is not an integer";
    let lease_range = "ERR lease-ms is out of range (1 to 9223372036854775807)";
    let huge_err = "ERR lease-ms is too large: now + lease-ms overflows";
    let owner_err = "ERR owner must not be empty";
    let syntax = "ERR syntax error";
    let timeout_err = "ERR timeout-ms is not an integer";
    let timeout_negative = "ERR timeout-ms must not be negative";
    let timeout_missing = "ERR timeout-ms is missing after WAIT";
    let timeout_range = "ERR timeout-ms is out of range (0 to 9223372036854775807)";
    let wrongtype = "WRONGTYPE Operation against a key holding the wrong kind of value";
    let corrupt =
        "ERR the lock hash holds a hold count for this owner that is not a positive integer";
    let max = i64::MAX.to_string();
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["RLOCK.ACQUIRE", "held", "a", "0"], lease_err),
        (vec!["RLOCK.ACQUIRE", "held", "a", "-5"], lease_err),
        (vec!["RLOCK.ACQUIRE", "held", "a", "abc"], lease_not_int),
        (vec!["RLOCK.ACQUIRE", "held", "a", "1.5"], lease_not_int),
        (vec!["RLOCK.ACQUIRE", "held", "a", " 5"], lease_not_int),
        (vec!["RLOCK.ACQUIRE", "held", "a", "+5"], lease_not_int),
        (vec!["RLOCK.ACQUIRE", "held", "a", ""], lease_not_int),
        (vec!["RLOCK.ACQUIRE", "held", "a", "99999999999999999999"], lease_range),
        (vec!["RLOCK.ACQUIRE", "new", "a", &max], huge_err),
        (vec!["RLOCK.ACQUIRE", "held", "", "100"], owner_err),
        (vec!["RLOCK.ACQUIRE", "held", "a", "100", "extra"], syntax),
        (vec!["RLOCK.ACQUIRE", "str", "a", "100"], wrongtype),
        (vec!["RLOCK.ACQUIRE", "corrupt", "a", "100"], corrupt),
        (vec!["RLOCK.ACQUIRE", "held", "b", "100", "WAIT"], timeout_missing),
        (vec!["RLOCK.ACQUIRE", "held", "b", "100", "WAIT", "-1"], timeout_negative),
        (vec!["RLOCK.ACQUIRE", "held", "b", "100", "WAIT", "1.5"], timeout_err),
        (vec!["RLOCK.ACQUIRE", "held", "b", "100", "wait", "soon"], timeout_err),
        (vec!["RLOCK.ACQUIRE", "held", "b", "100", "WAIT", "99999999999999999999"], timeout_range),
        (vec!["RLOCK.ACQUIRE", "held", "b", "100", "WAIT", "5", "WAIT", "5"], syntax),
        (vec!["RLOCK.ACQUIRE", "held", "b", "100", "NOWAIT"], syntax),
        (vec!["RLOCK.ACQUIRE", "held", "b", "0", "WAIT", "5"], lease_err),
        (vec!["RLOCK.ACQUIRE", "zero", "a", "100"], corrupt),
        (vec!["RLOCK.ACQUIRE", "negative", "a", "100"], corrupt),
        (vec!["RLOCK.RELEASE", "held", "a", "0"], lease_err),
        (vec!["RLOCK.RELEASE", "held", "a", "x"], lease_not_int),
        (vec!["RLOCK.RELEASE", "held", "a", &max], huge_err),
        (vec!["RLOCK.RELEASE", "held", ""], owner_err),
        (vec!["RLOCK.RELEASE", "held", "a", "100", "extra"], syntax),
        (vec!["RLOCK.RELEASE", "str", "a"], wrongtype),
        (vec!["RLOCK.RELEASE", "corrupt", "a"], corrupt),
        (vec!["RLOCK.RENEW", "held", "a", "0"], lease_err),
        (vec!["RLOCK.RENEW", "held", "a", &max], huge_err),
        (vec!["RLOCK.RENEW", "held", "", "100"], owner_err),
        (vec!["RLOCK.RENEW", "held", "a", "100", "extra"], syntax),
        (vec!["RLOCK.RENEW", "str", "a", "100"], wrongtype),
        (vec!["RLOCK.RENEW", "corrupt", "a", "100"], corrupt),
        (vec!["RLOCK.PTTL", "str"], wrongtype),
        (vec!["RLOCK.FORCERELEASE", "str"], wrongtype),
        (vec!["RLOCK.INFO", "str"], wrongtype),
        (
            vec!["RLOCK.INFO", "corrupt"],
            "ERR the key is a hash but not a reentrant lock (it needs exactly one owner field)",
        ),
        (vec!["RLOCK.INFO", "zero"], corrupt),
    ];
    for (args, expected) in &cases {
        assert_eq!(run_str(&mut con, args).as_ref(), Err(&expected.to_string()), "{args:?}");
    }
    assert_eq!(digest(&mut con), before, "no error changed anything");
    // The server is alive and the lock intact.
    assert_eq!(hget(&mut con, "held", "a"), Some(1));
}

#[test]
fn commands_work_in_multi_exec_and_lua() {
    let server = Server::start();
    let mut con = server.conn();
    let (first, again, other, released): (Value, Value, i64, i64) = redis::pipe()
        .atomic()
        .cmd("RLOCK.ACQUIRE")
        .arg("l")
        .arg("a")
        .arg(30000)
        .cmd("RLOCK.ACQUIRE")
        .arg("l")
        .arg("a")
        .arg(30000)
        .cmd("RLOCK.ACQUIRE")
        .arg("l")
        .arg("b")
        .arg(30000)
        .cmd("RLOCK.RELEASE")
        .arg("l")
        .arg("a")
        .query(&mut con)
        .expect("MULTI/EXEC");
    assert_eq!((first, again), (Value::Nil, Value::Nil));
    assert!(other > 0);
    assert_eq!(released, 0);
    assert_eq!(hget(&mut con, "l", "a"), Some(1));

    let script = redis::Script::new(
        "local r = redis.call('RLOCK.ACQUIRE', KEYS[1], ARGV[1], ARGV[2]); \
         local p = redis.call('RLOCK.PTTL', KEYS[1]); \
         local n = redis.call('RLOCK.RELEASE', KEYS[1], ARGV[1]); \
         return {r == false and 'nil' or r, p, n}",
    );
    let (reply, pttl, released): (String, i64, i64) =
        script.key("s").arg("a").arg(20000).invoke(&mut con).expect("script");
    assert_eq!(reply, "nil");
    // A fresh 20 s lease, not another: inside a script Valkey 8.1+ reads PTTL against the
    // script's start, while the lease starts at the command's own clock reading, so it can read
    // a millisecond or two over the lease.
    assert!((19_000..=20_005).contains(&pttl), "{pttl}");
    assert_eq!(released, 1);
    assert!(!exists(&mut con, "s"));
}

#[test]
fn key_positions_serve_command_getkeys() {
    let server = Server::start();
    let mut con = server.conn();
    for args in [
        vec!["RLOCK.ACQUIRE", "k1", "a", "1"],
        vec!["RLOCK.RELEASE", "k1", "a"],
        vec!["RLOCK.RENEW", "k1", "a", "1"],
        vec!["RLOCK.PTTL", "k1"],
        vec!["RLOCK.FORCERELEASE", "k1"],
        vec!["RLOCK.INFO", "k1"],
    ] {
        let keys: Vec<String> =
            redis::cmd("COMMAND").arg("GETKEYS").arg(&args).query(&mut con).expect("GETKEYS");
        assert_eq!(keys, vec!["k1".to_owned()], "{args:?}");
    }
}

#[test]
fn under_oom_acquire_and_renew_are_refused_but_release_works() {
    let server = Server::start();
    let mut con = server.conn();
    cmd(&mut con, &["RLOCK.ACQUIRE", "l", "a", "30000"]);
    cmd(&mut con, &["RLOCK.ACQUIRE", "f", "a", "30000"]);
    cmd(&mut con, &["CONFIG", "SET", "maxmemory-policy", "noeviction"]);
    cmd(&mut con, &["CONFIG", "SET", "maxmemory", "1"]);
    let oom = run_str(&mut con, &["RLOCK.ACQUIRE", "m", "a", "30000"]).expect_err("OOM");
    assert!(oom.starts_with("OOM"), "{oom}");
    let oom = run_str(&mut con, &["RLOCK.RENEW", "l", "a", "30000"]).expect_err("OOM");
    assert!(oom.starts_with("OOM"), "{oom}");
    assert_eq!(int(&cmd(&mut con, &["RLOCK.RELEASE", "l", "a"])), 1);
    assert_eq!(int(&cmd(&mut con, &["RLOCK.FORCERELEASE", "f"])), 1);
    assert_eq!(int(&cmd(&mut con, &["RLOCK.PTTL", "l"])), -2);
    cmd(&mut con, &["CONFIG", "SET", "maxmemory", "0"]);
}

#[test]
fn the_server_under_test_is_the_one_asked_for() {
    let server = Server::start();
    let mut con = server.conn();
    let info: String = redis::cmd("INFO").arg("server").query(&mut con).expect("INFO");
    let asked = std::env::var("REDIS_SERVER").unwrap_or_else(|_| "redis-server".to_owned());
    let version =
        info.lines().find(|l| l.starts_with("valkey_version:") || l.starts_with("redis_version:"));
    eprintln!("server under test: {asked}: {version:?}");
    assert_eq!(asked.contains("valkey"), info.contains("valkey_version:"), "{info}");
    // The module saw the same server at load, and says which optional capabilities it uses.
    let seen: String = redis::cmd("INFO").arg("rlock_server").query(&mut con).expect("INFO");
    let flavor = if info.contains("valkey_version:") { "valkey" } else { "redis" };
    let field = |name: &str| info.lines().find_map(|l| l.strip_prefix(name)).map(str::trim);
    let version = field("valkey_version:").or_else(|| field("redis_version:")).unwrap_or_default();
    assert!(seen.contains(&format!("rlock_server:{flavor} {version}")), "{seen}");
    assert!(seen.contains("rlock_capabilities:abs_expire"), "{seen}");
    // rlock from the module under test, and otherwise only the server's built-in modules
    // (Redis 8's vectorset, Valkey 9's lua), which are not loaded from a file.
    let modules: Vec<std::collections::HashMap<String, redis::Value>> =
        redis::cmd("MODULE").arg("LIST").query(&mut con).expect("MODULE LIST");
    let text = |m: &std::collections::HashMap<String, redis::Value>, f: &str| match m.get(f) {
        Some(redis::Value::BulkString(b)) => String::from_utf8_lossy(b).into_owned(),
        Some(redis::Value::SimpleString(s)) => s.clone(),
        _ => String::new(),
    };
    let module = rlock_tests_integration::module_path();
    let rlock: Vec<_> = modules.iter().filter(|m| text(m, "name") == "rlock").collect();
    assert_eq!(rlock.len(), 1, "the rlock module is loaded once: {modules:?}");
    assert_eq!(std::path::Path::new(&text(rlock[0], "path")), module.as_path());
    for other in modules.iter().filter(|m| text(m, "name") != "rlock") {
        assert!(!text(other, "path").ends_with(".so"), "only built-in modules besides: {other:?}");
    }
}

// ---- number errors ---------------------------------------------------------------------------

/// Every integer argument of every command, each odd spelling Redis itself refuses (`""`,
/// `-0`, `+1`, `0x10`, ` 1`, `1 `, over and under i64): an `ERR` naming that argument, nothing
/// changed. i64::MAX is a number (a valid one, or out of the argument's own range).
#[test]
fn every_integer_argument_refuses_every_odd_spelling_and_changes_nothing() {
    let server = Server::start();
    let mut con = server.conn();
    cmd(&mut con, &["SET", "unrelated", "1"]);
    cmd(&mut con, &["RSEM.SETPERMITS", "S", "3"]);
    cmd(&mut con, &["RLOCK.ACQUIRE", "L", "a", "60000"]);
    cmd(&mut con, &["RWLOCK.ACQUIRE", "R", "a", "READ", "60000"]);
    let before = digest(&mut con);
    let odd = ["", "-0", "+1", "0x10", " 1", "1 ", "9223372036854775808", "-9223372036854775809"];
    // (the command with X where the number goes, the argument's name)
    let forms: [(&[&str], &str); 14] = [
        (&["RLOCK.ACQUIRE", "L", "b", "X"], "lease-ms"),
        (&["RLOCK.ACQUIRE", "L", "b", "10", "WAIT", "X"], "timeout-ms"),
        (&["RLOCK.RENEW", "L", "a", "X"], "lease-ms"),
        (&["RWLOCK.ACQUIRE", "R", "b", "READ", "X"], "lease-ms"),
        (&["RWLOCK.ACQUIRE", "R", "b", "WRITE", "10", "WAIT", "X"], "timeout-ms"),
        (&["RWLOCK.RENEW", "R", "a", "X"], "lease-ms"),
        (&["RSEM.ACQUIRE", "S", "X"], "permits"),
        (&["RSEM.ACQUIRE", "S", "1", "LEASE", "X"], "lease-ms"),
        (&["RSEM.ACQUIRE", "S", "1", "WAIT", "X"], "timeout-ms"),
        (&["RSEM.RELEASE", "S", "X"], "permits"),
        (&["RSEM.SETPERMITS", "S", "X"], "permits"),
        (&["RSEM.ADDPERMITS", "S", "X"], "delta"),
        (&["RSEM.RENEW", "S", "someid", "X"], "lease-ms"),
        (&["RLOCK.RELEASE", "L", "a", "X"], "lease-ms"),
    ];
    let mut wrong = Vec::new();
    for (form, name) in forms {
        for value in odd {
            let args: Vec<&str> = form.iter().map(|a| if *a == "X" { value } else { a }).collect();
            match run_str(&mut con, &args) {
                Err(e) if e.starts_with(&format!("ERR {name} ")) => {}
                other => wrong.push(format!("{args:?}: {other:?}")),
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    assert_eq!(digest(&mut con), before, "an error changed something");
}

#[test]
fn command_info_shows_the_flags_and_key_specs() {
    let server = Server::start();
    let mut con = server.conn();
    let expected = [
        ("rlock.acquire", -4, &["write", "denyoom"][..], &["RW", "access", "update"][..]),
        ("rlock.release", -3, &["write"], &["RW", "access", "delete"]),
        ("rlock.renew", -4, &["write", "denyoom"], &["RW", "update"]),
        ("rlock.forcerelease", 2, &["write"], &["RW", "delete"]),
        ("rlock.pttl", 2, &["readonly", "fast"], &["RO", "access"]),
        ("rlock.info", 2, &["readonly", "fast"], &["RO", "access"]),
        ("rlock.cancel", 3, &["write"], &["RW", "access", "delete"]),
        ("rwlock.acquire", -5, &["write", "denyoom"], &["RW", "access", "update"]),
        ("rwlock.renew", -4, &["write", "denyoom"], &["RW", "update"]),
        ("rsem.acquire", -3, &["write", "denyoom"], &["RW", "access", "update"]),
    ];
    for (name, arity, flags, key_flags) in expected {
        let info: Value =
            redis::cmd("COMMAND").arg("INFO").arg(name).query(&mut con).expect("INFO");
        let Value::Array(mut entries) = info else { panic!("{info:?}") };
        let Value::Array(entry) = entries.remove(0) else { panic!("{name}: no info") };
        assert_eq!(entry[1], Value::Int(arity), "{name}: arity");
        let strings = |v: &Value| -> Vec<String> {
            match v {
                Value::Array(items) | Value::Set(items) => items
                    .iter()
                    .filter_map(|i| redis::from_redis_value::<String>(i.clone()).ok())
                    .collect(),
                _ => Vec::new(),
            }
        };
        let got = strings(&entry[2]);
        for flag in flags {
            assert!(got.iter().any(|f| f == flag), "{name}: flags {got:?} lack {flag}");
        }
        // Key specs: [... "flags", [..] ...] in entry 8.
        let specs = format!("{:?}", entry[8]);
        for flag in key_flags {
            assert!(
                specs.contains(&format!("\"{flag}\"")),
                "{name}: key spec {specs} lacks {flag}"
            );
        }
        let docs: Value =
            redis::cmd("COMMAND").arg("DOCS").arg(name).query(&mut con).expect("DOCS");
        let docs = format!("{docs:?}");
        assert!(docs.contains("summary") && docs.contains("since"), "{name}: {docs}");
        // The arguments (redis-cli's hints read them): names, option words, optional flags.
        let arguments: &[&str] = match name {
            "rlock.acquire" => {
                &["key", "owner", "lease-ms", "timeout-ms", "WAIT", "TOKEN", "REQUEST", "optional"]
            }
            "rlock.cancel" => &["key", "id"],
            "rwlock.acquire" => &["key", "owner", "READ", "WRITE", "lease-ms", "REQUEST"],
            "rwlock.renew" => &["key", "owner", "lease-ms", "READ", "WRITE", "optional"],
            "rsem.acquire" => &["key", "permits", "LEASE", "timeout-ms", "REQUEST"],
            "rlock.release" => &["key", "owner", "lease-ms", "REQUEST", "optional"],
            "rlock.renew" => &["key", "owner", "lease-ms"],
            _ => &["key"],
        };
        assert!(docs.contains("arguments"), "{name}: no arguments in {docs}");
        for word in arguments {
            assert!(docs.contains(&format!("\"{word}\"")), "{name}: {word} missing in {docs}");
        }
    }
}
