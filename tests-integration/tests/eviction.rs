//! Eviction: an `allkeys-*` policy (set at start or at run time) that evicts a lock's token
//! counter never makes tokens go back.

use std::time::Duration;

use redis::{Connection, Value};

use rlock_tests_integration::{
    cmd, granted_token, info_field, poll, wait_blocked, Pending, Server,
};

const LIMIT: Duration = Duration::from_secs(10);

/// The token of `owner`'s grant of `key` (then released).
fn token_then_release(con: &mut Connection, key: &str, owner: &str) -> i64 {
    let token = granted_token(&cmd(con, &["RLOCK.ACQUIRE", key, owner, "30000", "TOKEN"]));
    assert_eq!(cmd(con, &["RLOCK.RELEASE", key, owner]), Value::Int(1));
    token
}

#[test]
fn tokens_keep_increasing_when_an_allkeys_policy_evicts_the_counter() {
    // A cache server (allkeys-*) gives tokens, and an evicted counter never
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
fn a_policy_switched_to_allkeys_at_run_time_keeps_tokens_increasing() {
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
