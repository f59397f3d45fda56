//! rlock beside the rest of Redis: Redisson's Lua on the same keys, replicas and AOF files
//! without the module, ACL key permissions.

use std::time::Duration;

use redis::{Connection, Script, Value};
use rlock_tests_integration::{cmd, hgetall, pexpiretime, poll, run_str, wait_link_up, Server};

/// Redisson's acquire, re-derived from the lock model: KEYS[1] = lock, ARGV = lease, owner.
const LUA_ACQUIRE: &str = r"
if redis.call('exists', KEYS[1]) == 0 or redis.call('hexists', KEYS[1], ARGV[2]) == 1 then
    redis.call('hincrby', KEYS[1], ARGV[2], 1)
    redis.call('pexpire', KEYS[1], ARGV[1])
    return nil
end
return redis.call('pttl', KEYS[1])";

/// Redisson's release: KEYS = lock, channel; ARGV = message, lease, owner.
const LUA_RELEASE: &str = r"
if redis.call('hexists', KEYS[1], ARGV[3]) == 0 then
    return nil
end
local counter = redis.call('hincrby', KEYS[1], ARGV[3], -1)
if counter > 0 then
    redis.call('pexpire', KEYS[1], ARGV[2])
    return 0
end
redis.call('del', KEYS[1])
redis.call('publish', KEYS[2], ARGV[1])
return 1";

struct Redisson {
    acquire: Script,
    release: Script,
}

impl Redisson {
    fn new() -> Self {
        Self { acquire: Script::new(LUA_ACQUIRE), release: Script::new(LUA_RELEASE) }
    }

    fn acquire(&self, con: &mut Connection, key: &str, owner: &str) -> Option<i64> {
        self.acquire.key(key).arg(30_000).arg(owner).invoke(con).expect("lua acquire")
    }

    fn release(&self, con: &mut Connection, key: &str, owner: &str) -> Option<i64> {
        self.release
            .key(key)
            .key(format!("redisson_lock__channel:{{{key}}}"))
            .arg(0)
            .arg(30_000)
            .arg(owner)
            .invoke(con)
            .expect("lua release")
    }
}

fn info_count(con: &mut Connection, key: &str) -> (Vec<u8>, i64) {
    let Value::Array(flat) = cmd(con, &["RLOCK.INFO", key]) else { panic!("no lock at {key}") };
    let mut owner = None;
    let mut count = None;
    for pair in flat.chunks(2) {
        match (&pair[0], &pair[1]) {
            (Value::BulkString(f), Value::BulkString(v)) if f == b"owner" => {
                owner = Some(v.clone())
            }
            (Value::BulkString(f), Value::Int(n)) if f == b"count" => count = Some(*n),
            _ => {}
        }
    }
    (owner.expect("owner"), count.expect("count"))
}

#[test]
fn redisson_lua_and_rlock_commands_agree_on_holder_and_counts() {
    let server = Server::start();
    let mut con = server.conn();
    let lua = Redisson::new();

    assert_eq!(lua.acquire(&mut con, "l", "A"), None, "Lua takes the free lock");
    assert_eq!(cmd(&mut con, &["RLOCK.ACQUIRE", "l", "A", "30000"]), Value::Nil, "rlock re-enters");
    assert_eq!(info_count(&mut con, "l"), (b"A".to_vec(), 2));
    assert!(lua.acquire(&mut con, "l", "B").is_some_and(|p| p > 0), "Lua sees A holding");
    let busy = cmd(&mut con, &["RLOCK.ACQUIRE", "l", "B", "30000"]);
    assert!(matches!(busy, Value::Int(p) if p > 0), "rlock sees A holding: {busy:?}");
    assert_eq!(lua.acquire(&mut con, "l", "A"), None, "Lua re-enters to 3");
    assert_eq!(info_count(&mut con, "l"), (b"A".to_vec(), 3));

    assert_eq!(lua.release(&mut con, "l", "B"), None, "B never held it");
    assert_eq!(cmd(&mut con, &["RLOCK.RELEASE", "l", "A"]), Value::Int(0));
    assert_eq!(lua.release(&mut con, "l", "A"), Some(0));
    assert_eq!(info_count(&mut con, "l"), (b"A".to_vec(), 1));
    assert_eq!(cmd(&mut con, &["RLOCK.RELEASE", "l", "A"]), Value::Int(1), "rlock frees it");
    assert_eq!(lua.release(&mut con, "l", "A"), None, "and Lua agrees it is gone");

    assert_eq!(cmd(&mut con, &["RLOCK.ACQUIRE", "l", "B", "30000"]), Value::Nil);
    assert!(lua.acquire(&mut con, "l", "A").is_some_and(|p| p > 0), "Lua sees B holding");
    assert_eq!(lua.acquire(&mut con, "l", "B"), None);
    assert_eq!(info_count(&mut con, "l"), (b"B".to_vec(), 2));
    assert_eq!(lua.release(&mut con, "l", "B"), Some(0));
    assert_eq!(lua.release(&mut con, "l", "B"), Some(1), "Lua frees the rlock-taken lock");
    assert_eq!(cmd(&mut con, &["RLOCK.PTTL", "l"]), Value::Int(-2));
}

#[test]
fn a_replica_without_the_module_gets_the_hash_its_expiry_and_the_unlock_message() {
    let master = Server::start();
    let replica = Server::builder().without_module().replica_of(&master).start();
    let mut m = master.conn();
    let mut r = replica.conn();
    wait_link_up(&mut r);

    cmd(&mut m, &["RLOCK.ACQUIRE", "l", "owner-1", "60000"]);
    cmd(&mut m, &["RLOCK.ACQUIRE", "l", "owner-1", "60000"]);
    cmd(&mut m, &["RLOCK.ACQUIRE", "gone", "owner-2", "60000"]);
    cmd(&mut m, &["RLOCK.RENEW", "gone", "owner-2", "90000"]);
    let expected = hgetall(&mut m, b"l");
    let expiry = pexpiretime(&mut m, b"l");
    poll("the lock on the replica", Duration::from_secs(10), || {
        (hgetall(&mut r, b"l") == expected && pexpiretime(&mut r, b"gone") > 0).then_some(())
    });
    assert_eq!(expected, vec![(b"owner-1".to_vec(), b"2".to_vec())]);
    assert_eq!(pexpiretime(&mut r, b"l"), expiry, "same absolute expiry");
    assert_eq!(pexpiretime(&mut r, b"gone"), pexpiretime(&mut m, b"gone"), "renewal replicated");

    // Subscribers on the replica hear the release, as they do with Redisson's Lua.
    let mut sub = replica.conn();
    sub.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    let mut sub = sub.as_pubsub();
    sub.subscribe("redisson_lock__channel:{gone}").expect("subscribe");
    cmd(&mut m, &["RLOCK.RELEASE", "gone", "owner-2"]);
    let msg = sub.get_message().expect("unlock message on the replica");
    assert_eq!(msg.get_payload_bytes(), b"0");
    poll("the delete on the replica", Duration::from_secs(10), || {
        (cmd(&mut r, &["EXISTS", "gone"]) == Value::Int(0)).then_some(())
    });

    // Release to 1 and force-release replicate too.
    cmd(&mut m, &["RLOCK.RELEASE", "l", "owner-1"]);
    poll("count 1 on the replica", Duration::from_secs(10), || {
        (hgetall(&mut r, b"l") == vec![(b"owner-1".to_vec(), b"1".to_vec())]).then_some(())
    });
    cmd(&mut m, &["RLOCK.FORCERELEASE", "l"]);
    poll("the force-release on the replica", Duration::from_secs(10), || {
        (cmd(&mut r, &["EXISTS", "l"]) == Value::Int(0)).then_some(())
    });
    assert!(!replica.log().contains("unknown command"), "{}", replica.log());
}

#[test]
fn an_aof_restart_keeps_counts_and_absolute_deadlines_with_or_without_the_module() {
    let mut server =
        Server::builder().config("appendonly", "yes").config("appendfsync", "always").start();
    let mut con = server.conn();
    cmd(&mut con, &["RLOCK.ACQUIRE", "l", "a", "60000"]);
    cmd(&mut con, &["RLOCK.ACQUIRE", "l", "a", "60000"]);
    cmd(&mut con, &["RLOCK.ACQUIRE", "l", "a", "60000"]);
    cmd(&mut con, &["RLOCK.RELEASE", "l", "a"]);
    cmd(&mut con, &["RLOCK.ACQUIRE", "freed", "a", "60000"]);
    cmd(&mut con, &["RLOCK.RELEASE", "freed", "a"]);
    let expiry = pexpiretime(&mut con, b"l");
    let ttl_before = match cmd(&mut con, &["PTTL", "l"]) {
        Value::Int(n) => n,
        other => panic!("{other:?}"),
    };
    drop(con);

    // Make the remaining lease visibly shorter than a fresh one before restarting.
    std::thread::sleep(Duration::from_millis(300));
    server.restart();
    let mut con = server.conn();
    assert_eq!(hgetall(&mut con, b"l"), vec![(b"a".to_vec(), b"2".to_vec())]);
    assert_eq!(pexpiretime(&mut con, b"l"), expiry, "the absolute deadline survives");
    let Value::Int(ttl_after) = cmd(&mut con, &["RLOCK.PTTL", "l"]) else { panic!("pttl") };
    assert!(
        ttl_after < ttl_before && ttl_after > 0,
        "lease not reset: {ttl_before} -> {ttl_after}"
    );
    assert_eq!(cmd(&mut con, &["EXISTS", "freed"]), Value::Int(0));
    drop(con);

    server.restart_without_module();
    let mut con = server.conn();
    assert_eq!(hgetall(&mut con, b"l"), vec![(b"a".to_vec(), b"2".to_vec())]);
    assert_eq!(pexpiretime(&mut con, b"l"), expiry, "a plain Redis replays the same AOF");
    assert_eq!(cmd(&mut con, &["EXISTS", "freed"]), Value::Int(0));
}

#[test]
fn acl_key_patterns_are_enforced_and_a_read_only_permission_allows_only_pttl_and_info() {
    let server = Server::start();
    let mut admin = server.conn();
    cmd(&mut admin, &["ACL", "SETUSER", "locker", "on", ">pw", "+@all", "~lock:*"]);
    // RLOCK.INFO also reads the lock's token counter: the reader may read those too.
    let reader = ["ACL", "SETUSER", "reader", "on", ">pw", "+@all", "%R~lock:*"];
    cmd(&mut admin, &[&reader[..], &["%R~redisson_lock_token:{lock:*"]].concat());
    cmd(&mut admin, &["RLOCK.ACQUIRE", "lock:1", "x", "30000"]);

    let mut locker = server.conn();
    cmd(&mut locker, &["AUTH", "locker", "pw"]);
    assert_eq!(cmd(&mut locker, &["RLOCK.ACQUIRE", "lock:2", "a", "30000"]), Value::Nil);
    for args in [
        &["RLOCK.ACQUIRE", "other:1", "a", "30000"][..],
        &["RLOCK.RELEASE", "other:1", "a"],
        &["RLOCK.RENEW", "other:1", "a", "30000"],
        &["RLOCK.PTTL", "other:1"],
        &["RLOCK.INFO", "other:1"],
        &["RLOCK.FORCERELEASE", "other:1"],
    ] {
        let err = run_str(&mut locker, args).expect_err("outside the key pattern");
        assert!(err.starts_with("NOPERM"), "{args:?}: {err}");
    }

    let mut reader = server.conn();
    cmd(&mut reader, &["AUTH", "reader", "pw"]);
    assert!(matches!(cmd(&mut reader, &["RLOCK.PTTL", "lock:1"]), Value::Int(n) if n > 0));
    assert!(matches!(cmd(&mut reader, &["RLOCK.INFO", "lock:1"]), Value::Array(_)));
    for args in [
        &["RLOCK.ACQUIRE", "lock:1", "a", "30000"][..],
        &["RLOCK.RELEASE", "lock:1", "x"],
        &["RLOCK.RENEW", "lock:1", "x", "30000"],
        &["RLOCK.FORCERELEASE", "lock:1"],
    ] {
        let err = run_str(&mut reader, args).expect_err("read-only permission");
        assert!(err.starts_with("NOPERM"), "{args:?}: {err}");
    }
    assert!(
        run_str(&mut reader, &["RLOCK.PTTL", "other:1"]).is_err_and(|e| e.starts_with("NOPERM"))
    );
    assert_eq!(hgetall(&mut admin, b"lock:1"), vec![(b"x".to_vec(), b"1".to_vec())]);
}

fn info_int(con: &mut Connection, section: &str, field: &str) -> i64 {
    rlock_tests_integration::info_field(con, section, field)
}

/// With no AOF and no replica, writes are only counted, not replicated; a replica that
/// attaches later gets the locks by full sync, and from then on every effect, including across
/// a partial resync.
#[test]
fn a_replica_attached_late_and_resyncing_partially_sees_every_lock() {
    let master = Server::start();
    let mut m = master.conn();
    cmd(&mut m, &["RLOCK.ACQUIRE", "before", "a", "60000"]);
    cmd(&mut m, &["RLOCK.ACQUIRE", "before", "a", "60000"]);
    cmd(&mut m, &["RLOCK.ACQUIRE", "freed-before", "a", "60000"]);
    cmd(&mut m, &["RLOCK.RELEASE", "freed-before", "a"]);

    let replica = Server::builder().without_module().replica_of(&master).start();
    let mut r = replica.conn();
    wait_link_up(&mut r);
    cmd(&mut m, &["RLOCK.ACQUIRE", "after", "b", "60000"]);
    cmd(&mut m, &["RLOCK.RELEASE", "before", "a"]);
    poll("the late replica in sync", Duration::from_secs(10), || {
        (hgetall(&mut r, b"after") == vec![(b"b".to_vec(), b"1".to_vec())]
            && hgetall(&mut r, b"before") == vec![(b"a".to_vec(), b"1".to_vec())])
        .then_some(())
    });
    assert_eq!(pexpiretime(&mut r, b"before"), pexpiretime(&mut m, b"before"));
    assert_eq!(cmd(&mut r, &["EXISTS", "freed-before"]), Value::Int(0));

    // The link drops; the master goes on; the replica comes back by a partial resync from the
    // master's backlog (its cached master), not a full one.
    assert_eq!(info_int(&mut m, "stats", "sync_full"), 1);
    cmd(&mut m, &["CLIENT", "KILL", "TYPE", "replica"]);
    cmd(&mut m, &["RLOCK.ACQUIRE", "while-away", "c", "60000"]);
    cmd(&mut m, &["RLOCK.RELEASE", "after", "b"]);
    poll("the partial resync", Duration::from_secs(20), || {
        (info_int(&mut m, "stats", "sync_partial_ok") == 1).then_some(())
    });
    wait_link_up(&mut r);
    poll("the changes made while away", Duration::from_secs(10), || {
        (hgetall(&mut r, b"while-away") == vec![(b"c".to_vec(), b"1".to_vec())]
            && cmd(&mut r, &["EXISTS", "after"]) == Value::Int(0))
        .then_some(())
    });
    assert_eq!(info_int(&mut m, "stats", "sync_full"), 1, "no second full sync");
    assert!(!replica.log().contains("unknown command"), "{}", replica.log());
}

#[test]
fn aof_switched_on_at_run_time_keeps_every_lock_across_a_restart() {
    let mut server = Server::start();
    let mut con = server.conn();
    cmd(&mut con, &["RLOCK.ACQUIRE", "before", "a", "60000"]);
    // `always`: the SIGKILL below must not lose the last second (everysec may postpone writes).
    cmd(&mut con, &["CONFIG", "SET", "appendfsync", "always"]);
    cmd(&mut con, &["CONFIG", "SET", "appendonly", "yes"]);
    poll("the AOF rewrite", Duration::from_secs(20), || {
        (info_int(&mut con, "persistence", "aof_rewrite_in_progress") == 0
            && info_int(&mut con, "persistence", "aof_enabled") == 1)
            .then_some(())
    });
    cmd(&mut con, &["RLOCK.ACQUIRE", "after", "b", "60000"]);
    cmd(&mut con, &["RLOCK.ACQUIRE", "after", "b", "60000"]);
    let expiry = pexpiretime(&mut con, b"after");
    drop(con);
    server.keep_config("appendonly", "yes");
    server.keep_config("appendfsync", "always");
    server.restart_without_module();
    let mut con = server.conn();
    assert_eq!(hgetall(&mut con, b"before"), vec![(b"a".to_vec(), b"1".to_vec())]);
    assert_eq!(hgetall(&mut con, b"after"), vec![(b"b".to_vec(), b"2".to_vec())]);
    assert_eq!(pexpiretime(&mut con, b"after"), expiry);
}

#[test]
fn every_write_counts_toward_rdb_save_points_and_failed_commands_do_not() {
    let server = Server::start();
    let mut con = server.conn();
    let changes =
        |con: &mut Connection| info_int(con, "persistence", "rdb_changes_since_last_save");
    let start = changes(&mut con);
    cmd(&mut con, &["RLOCK.ACQUIRE", "l", "a", "60000"]);
    cmd(&mut con, &["RLOCK.ACQUIRE", "l", "a", "60000"]);
    cmd(&mut con, &["RLOCK.RENEW", "l", "a", "60000"]);
    cmd(&mut con, &["RLOCK.RELEASE", "l", "a"]);
    cmd(&mut con, &["RLOCK.RELEASE", "l", "a"]);
    assert_eq!(changes(&mut con) - start, 5, "five writes");
    cmd(&mut con, &["RLOCK.ACQUIRE", "m", "a", "60000"]);
    let before = changes(&mut con);
    cmd(&mut con, &["RLOCK.ACQUIRE", "m", "b", "60000"]);
    cmd(&mut con, &["RLOCK.RELEASE", "m", "b"]);
    cmd(&mut con, &["RLOCK.RENEW", "m", "b", "60000"]);
    cmd(&mut con, &["RLOCK.PTTL", "m"]);
    assert_eq!(changes(&mut con), before, "refusals and reads write nothing");
}

/// What the AOF records of an rlock acquire and release: one command each (the acquire's
/// `RESTORE ... ABSTTL`, the release's `DEL`), as Redis records a client's `DEL` + `PUBLISH`
/// (its `PUBLISH` goes to replicas only, see the replica test above): no unlock message and no
/// `MULTI`/`EXEC`.
#[test]
fn the_aof_gets_a_releases_effect_but_never_its_unlock_message() {
    let server =
        Server::builder().config("appendonly", "yes").config("appendfsync", "always").start();
    let mut con = server.conn();
    cmd(&mut con, &["RLOCK.ACQUIRE", "aof-lock", "a", "60000"]);
    let mut sub = server.conn();
    sub.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    let mut sub = sub.as_pubsub();
    sub.subscribe("redisson_lock__channel:{aof-lock}").expect("subscribe");
    cmd(&mut con, &["RLOCK.RELEASE", "aof-lock", "a"]);
    let msg = sub.get_message().expect("the unlock message is published");
    assert_eq!(msg.get_payload_bytes(), b"0");
    drop(sub);
    cmd(&mut con, &["SET", "aof-marker", "1"]);

    let mut aof = Vec::new();
    let dir = server.dir().join("appendonlydir");
    for entry in std::fs::read_dir(&dir).expect("the AOF directory") {
        let path = entry.expect("an AOF file").path();
        if path.to_string_lossy().ends_with(".incr.aof") {
            aof.extend(std::fs::read(&path).expect("read the AOF"));
        }
    }
    let text = String::from_utf8_lossy(&aof).to_ascii_uppercase();
    assert!(text.contains("AOF-MARKER"), "the AOF was read: {text}");
    assert!(text.contains("$3\r\nDEL\r\n$8\r\nAOF-LOCK"), "the release's DEL: {text}");
    assert!(!text.contains("PUBLISH"), "no unlock message in the AOF: {text}");
    let releases = text.split("$3\r\nDEL\r\n").count() - 1;
    assert_eq!(releases, 1, "{text}");
    assert!(text.contains("$7\r\nRESTORE\r\n$8\r\nAOF-LOCK"), "the acquire, whole: {text}");
    assert!(!text.contains("MULTI"), "every effect is one command: {text}");
}

/// Every lock write a replica gets as one `RESTORE ... ABSTTL` rebuilds the hash the master
/// holds, byte for byte (`DUMP` agrees, so the encoding is the one the master's own `HSET` made),
/// with the same absolute deadline, on a replica without the module that validates every
/// payload deeply (`sanitize-dump-payload yes`): owners short and long (past the listpack
/// limits), numeric, negative, binary, and counts from 1 up.
#[test]
fn a_replica_restores_each_lock_write_as_the_masters_hash_byte_for_byte() {
    let master = Server::start();
    let replica = Server::builder()
        .without_module()
        .config("sanitize-dump-payload", "yes")
        .replica_of(&master)
        .start();
    let mut m = master.conn();
    let mut r = replica.conn();
    wait_link_up(&mut r);
    for con in [&mut m, &mut r] {
        cmd(con, &["CONFIG", "SET", "rdbcompression", "no"]);
    }
    let owners: Vec<Vec<u8>> = vec![
        b"c1:7".to_vec(),
        b"123".to_vec(),
        b"-5".to_vec(),
        b"007".to_vec(),
        b"9223372036854775807".to_vec(),
        b"a\0b\xff{x}".to_vec(),
        vec![b'o'; 64],
        vec![b'o'; 65],
        vec![b'p'; 5_000],
        vec![b'q'; 20_000],
    ];
    let mut keys = Vec::new();
    for (i, owner) in owners.iter().enumerate() {
        let key = format!("restore-{i}");
        for _ in 0..=(i % 3) * 150 {
            redis::cmd("RLOCK.ACQUIRE")
                .arg(&key)
                .arg(owner.as_slice())
                .arg(60_000)
                .query::<Value>(&mut m)
                .expect("acquire");
        }
        keys.push(key);
    }
    // A release to a lower count, and a renewal, are lock writes too.
    redis::cmd("RLOCK.RELEASE").arg("restore-1").arg(&owners[1][..]).query::<Value>(&mut m).ok();
    cmd(&mut m, &["SET", "restore-marker", "1"]);
    poll("the writes on the replica", Duration::from_secs(10), || {
        (cmd(&mut r, &["EXISTS", "restore-marker"]) == Value::Int(1)).then_some(())
    });
    for key in &keys {
        assert!(!hgetall(&mut m, key.as_bytes()).is_empty(), "{key}");
        assert_eq!(hgetall(&mut r, key.as_bytes()), hgetall(&mut m, key.as_bytes()), "{key}");
        assert_eq!(pexpiretime(&mut r, key.as_bytes()), pexpiretime(&mut m, key.as_bytes()));
        let encoding = |con: &mut Connection| cmd(con, &["OBJECT", "ENCODING", key]);
        assert_eq!(encoding(&mut r), encoding(&mut m), "{key}");
        let dump = |con: &mut Connection| cmd(con, &["DUMP", key]);
        assert_eq!(dump(&mut r), dump(&mut m), "{key}: the same bytes");
    }
    assert!(!replica.log().contains("Bad data format"), "{}", replica.log());
}
