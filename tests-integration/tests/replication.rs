//! What read-write locks and semaphores replicate: one command per key a write touches (a read
//! grant is a `RESTORE` of the hash and a `SET ... PXAT` of its hold key, counted on a replica
//! without the module), and a module-less replica and an AOF replayed without the module hold
//! the master's keys byte for byte (`DUMP`), with the same absolute deadlines (`PEXPIRETIME`)
//! and `DEBUG DIGEST`, after read grants, re-entries, releases, write grants, hand-offs to
//! waiters, read holds that expire, long owners, and counted and leased permits.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use redis::{Connection, Value};

use rlock_tests_integration::{
    all_keys, blocked_clients, cmd, digest, permit_ids, pexpiretime, poll, queue_str, run_str,
    wait_link_up, wait_replica_online, Server,
};

const LIMIT: Duration = Duration::from_secs(10);

/// `cmdstat_<name>` calls from `INFO commandstats` (0 when the command never ran).
fn calls(con: &mut Connection, name: &str) -> i64 {
    let info: String = redis::cmd("INFO").arg("commandstats").query(con).expect("INFO");
    let prefix = format!("cmdstat_{name}:calls=");
    info.lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// The commands a replica ran for one master write, by name: after `write` on the master, a
/// marker `INCR` is waited for on the replica and the counts taken from its command stats.
fn replicated(
    m: &mut Connection,
    r: &mut Connection,
    write: impl FnOnce(&mut Connection),
) -> BTreeMap<&'static str, i64> {
    const NAMES: [&str; 13] = [
        "restore",
        "set",
        "hset",
        "hdel",
        "del",
        "pexpireat",
        "multi",
        "exec",
        "incrby",
        "decrby",
        "zadd",
        "zrem",
        "publish",
    ];
    cmd(r, &["CONFIG", "RESETSTAT"]);
    write(m);
    let marker: i64 = redis::cmd("INCR").arg("marker").query(m).expect("INCR");
    poll("the marker on the replica", LIMIT, || {
        let got: Option<i64> = redis::cmd("GET").arg("marker").query(r).expect("GET");
        (got == Some(marker)).then_some(())
    });
    NAMES.iter().map(|&n| (n, calls(r, n))).filter(|(_, c)| *c > 0).collect()
}

fn expect(pairs: &[(&'static str, i64)]) -> BTreeMap<&'static str, i64> {
    pairs.iter().copied().collect()
}

#[test]
fn a_read_write_lock_write_replicates_one_command_per_key() {
    let master = Server::start();
    let replica = Server::builder().without_module().replica_of(&master).start();
    let (mut m, mut r) = (master.conn(), replica.conn());
    wait_link_up(&mut r);

    let read = |who: &'static str| {
        move |m: &mut Connection| {
            assert_eq!(cmd(m, &["RWLOCK.ACQUIRE", "L", who, "READ", "60000"]), Value::Nil);
        }
    };
    // A fresh read grant: the hash (mode, reader, deadline) and its first hold key (two keys:
    // Redis wraps them in MULTI/EXEC).
    let one_each = expect(&[("exec", 1), ("multi", 1), ("restore", 1), ("set", 1)]);
    assert_eq!(replicated(&mut m, &mut r, read("a:1")), one_each);
    // A re-entry, and a second reader: the hash again, and one new hold key each.
    assert_eq!(replicated(&mut m, &mut r, read("a:1")), one_each);
    assert_eq!(replicated(&mut m, &mut r, read("b:1")), one_each);
    // A write grant: the hash alone.
    let write = |m: &mut Connection| {
        assert_eq!(cmd(m, &["RWLOCK.ACQUIRE", "W", "w:1", "WRITE", "60000"]), Value::Nil);
    };
    assert_eq!(replicated(&mut m, &mut r, write), expect(&[("restore", 1)]));
    // Read releases, the last one freeing the lock: one command for the hash (its new content,
    // or DEL) and one DEL for the hold key, each time.
    for (who, freed) in [("b:1", 0), ("a:1", 0), ("a:1", 1)] {
        let release = |m: &mut Connection| {
            assert_eq!(cmd(m, &["RWLOCK.RELEASE", "L", who, "READ"]), Value::Int(freed));
        };
        let got = replicated(&mut m, &mut r, release);
        let writes: i64 = got
            .iter()
            .filter(|(n, _)| !["multi", "exec", "publish"].contains(n))
            .map(|(_, c)| c)
            .sum();
        assert_eq!(writes, 2, "{who}: {got:?}");
        assert_eq!(got.get("del").copied().unwrap_or(0), 1 + freed, "{who}: {got:?}");
    }
    // Counted and leased permits: one command per key.
    cmd(&mut m, &["RSEM.SETPERMITS", "S", "5"]);
    // The set-up write reaches the replica before its command stats are reset.
    assert_eq!(cmd(&mut m, &["WAIT", "1", "10000"]), Value::Int(1));
    let counted = |m: &mut Connection| {
        assert_eq!(cmd(m, &["RSEM.ACQUIRE", "S", "1"]), Value::Int(1));
    };
    assert_eq!(replicated(&mut m, &mut r, counted), expect(&[("decrby", 1)]));
    let mut id = Vec::new();
    let got = replicated(&mut m, &mut r, |m: &mut Connection| {
        id = permit_ids(&cmd(m, &["RSEM.ACQUIRE", "S", "1", "LEASE", "60000"])).remove(0);
    });
    assert_eq!(got, expect(&[("decrby", 1), ("exec", 1), ("multi", 1), ("zadd", 1)]));
    let got = replicated(&mut m, &mut r, |m: &mut Connection| {
        let renewed: i64 =
            redis::cmd("RSEM.RENEW").arg("S").arg(&id).arg(90_000).query(m).expect("RENEW");
        assert_eq!(renewed, 1);
    });
    assert_eq!(got, expect(&[("zadd", 1)]));
    let got = replicated(&mut m, &mut r, |m: &mut Connection| {
        let released: i64 =
            redis::cmd("RSEM.RELEASE").arg("S").arg("ID").arg(&id).query(m).expect("RELEASE");
        assert_eq!(released, 1);
    });
    let released = expect(&[("exec", 1), ("incrby", 1), ("multi", 1), ("publish", 1), ("zrem", 1)]);
    assert_eq!(got, released);
    let got = replicated(&mut m, &mut r, |m: &mut Connection| {
        assert_eq!(cmd(m, &["RSEM.RELEASE", "S", "1"]), Value::Int(5));
    });
    assert_eq!(got, expect(&[("exec", 1), ("incrby", 1), ("multi", 1), ("publish", 1)]));
    // A release while a lease has ended (a Redisson client's, unknown to the module): the
    // reclaimed permit and the released one come back in one INCRBY (and one message).
    cmd(&mut m, &["ZADD", "{S}:timeout", "1", "ended-permit-id"]);
    assert_eq!(cmd(&mut m, &["WAIT", "1", "10000"]), Value::Int(1));
    let got = replicated(&mut m, &mut r, |m: &mut Connection| {
        assert_eq!(cmd(m, &["RSEM.RELEASE", "S", "1"]), Value::Int(7));
    });
    let reclaimed =
        expect(&[("exec", 1), ("incrby", 1), ("multi", 1), ("publish", 1), ("zrem", 1)]);
    assert_eq!(got, reclaimed);
}

/// One key as compared: its encoding, `DUMP` (`None` for a hash table, whose `DUMP` lists
/// fields in the order of the server's own hash seed), `DEBUG DIGEST-VALUE`, `PEXPIRETIME`.
#[derive(Debug, Clone, PartialEq)]
struct KeyState {
    encoding: String,
    dump: Option<Value>,
    digest: Value,
    expire_at: i64,
}

type Snapshot = (BTreeMap<Vec<u8>, KeyState>, String);

/// Every key's state, and the whole `DEBUG DIGEST`.
fn snapshot(con: &mut Connection) -> Snapshot {
    let keys = all_keys(con);
    let per_key = keys
        .into_iter()
        .map(|k| {
            let encoding: String =
                redis::cmd("OBJECT").arg("ENCODING").arg(&k).query(con).expect("ENCODING");
            // A string's in-memory encoding is not compared (a module's RM_StringSet stores an
            // integer as text, a replica's SET as an integer: the DUMPs agree).
            let string = ["int", "embstr", "raw"].contains(&encoding.as_str());
            let encoding = if string { "string".to_owned() } else { encoding };
            let dump = (encoding != "hashtable")
                .then(|| redis::cmd("DUMP").arg(&k).query(con).expect("DUMP"));
            let digest =
                redis::cmd("DEBUG").arg("DIGEST-VALUE").arg(&k).query(con).expect("DIGEST");
            let expire_at = pexpiretime(con, &k);
            (k, KeyState { encoding, dump, digest, expire_at })
        })
        .collect();
    (per_key, digest(con))
}

/// Asserts `got` is `expected`, naming the keys that differ. With `loose_tables`, a key the
/// master holds as a hash table may be a listpack in `got`, with the same content (on Valkey,
/// a hash that once held a long owner and now holds a few short fields is sent whole; see
/// `store::whole`).
fn same(expected: &Snapshot, got: &Snapshot, what: &str, loose_tables: bool) {
    let keys: BTreeSet<&Vec<u8>> = expected.0.keys().chain(got.0.keys()).collect();
    let differ: Vec<String> = keys
        .into_iter()
        .filter(|k| match (expected.0.get(*k), got.0.get(*k)) {
            (Some(e), Some(g)) if loose_tables && e.encoding == "hashtable" => {
                (&e.digest, e.expire_at) != (&g.digest, g.expire_at)
            }
            (e, g) => e != g,
        })
        .map(|k| {
            let text = String::from_utf8_lossy(k);
            format!("{text}: {:?} / {:?}", expected.0.get(k), got.0.get(k))
        })
        .collect();
    assert!(differ.is_empty(), "{what}: keys differ: {differ:#?}");
    assert_eq!(got.1, expected.1, "{what}: DEBUG DIGEST");
}

fn rw(con: &mut Connection, args: &[&str]) -> Value {
    cmd(con, &[&["RWLOCK.ACQUIRE"][..], args].concat())
}

/// Read-write lock and semaphore writes of every kind on a master with AOF on and a replica
/// without the module.
fn scenario(master: &Server, m: &mut Connection) {
    // Read grants, a re-entry, a reader whose hold expires, a release to 1.
    rw(m, &["L", "r:1", "READ", "60000"]);
    rw(m, &["L", "r:1", "READ", "60000"]);
    rw(m, &["L", "r:2", "READ", "60000"]);
    rw(m, &["L", "r:3", "READ", "300"]);
    cmd(m, &["RWLOCK.RELEASE", "L", "r:1", "READ"]);
    // A writer waits; the readers leave (the last by expiry): the lock is handed to it.
    let writer =
        queue_str(master, m, &["RWLOCK.ACQUIRE", "L", "w:1", "WRITE", "60000", "WAIT", "0"]);
    cmd(m, &["RWLOCK.RELEASE", "L", "r:1", "READ"]);
    cmd(m, &["RWLOCK.RELEASE", "L", "r:2", "READ"]);
    assert_eq!(writer.reply(LIMIT).0, Ok(Value::Nil), "handed to the writer");
    // A reader waits behind it; the writer re-enters, reads beside its write, then downgrades:
    // the reader joins by hand-off.
    let reader =
        queue_str(master, m, &["RWLOCK.ACQUIRE", "L", "r:4", "READ", "60000", "WAIT", "0"]);
    rw(m, &["L", "w:1", "WRITE", "60000"]);
    cmd(m, &["RWLOCK.RELEASE", "L", "w:1", "WRITE"]);
    rw(m, &["L", "w:1", "READ", "60000"]);
    assert_eq!(cmd(m, &["RWLOCK.RELEASE", "L", "w:1", "WRITE"]), Value::Int(1));
    assert_eq!(reader.reply(LIMIT).0, Ok(Value::Nil), "handed to the reader");
    cmd(m, &["RWLOCK.RENEW", "L", "r:4", "90000"]);
    // A write hold renewed; a lock freed; a force-release.
    rw(m, &["W", "w:2", "WRITE", "60000"]);
    cmd(m, &["RWLOCK.RENEW", "W", "w:2", "90000"]);
    rw(m, &["F", "r:5", "READ", "60000"]);
    cmd(m, &["RWLOCK.RELEASE", "F", "r:5", "READ"]);
    rw(m, &["G", "r:6", "READ", "60000"]);
    rw(m, &["G", "r:7", "READ", "60000"]);
    cmd(m, &["RWLOCK.FORCERELEASE", "G"]);
    // In a transaction (and a script, where the commands are allowed): replicated inside it.
    let mut pipe = redis::pipe();
    pipe.atomic()
        .cmd("RWLOCK.ACQUIRE")
        .arg("T")
        .arg("t:1")
        .arg("READ")
        .arg(60_000)
        .cmd("RWLOCK.ACQUIRE")
        .arg("T")
        .arg("t:2")
        .arg("READ")
        .arg(60_000)
        .cmd("RWLOCK.RELEASE")
        .arg("T")
        .arg("t:1")
        .arg("READ");
    let _: Value = pipe.query(m).expect("MULTI");
    let script = "return redis.call('RWLOCK.ACQUIRE', KEYS[1], 't:3', 'READ', '60000')";
    let _ = run_str(m, &["EVAL", script, "1", "T"]);
    // Long owners (past hash-max-listpack-value): the hash is a hash table on the master; a
    // short reader joins while the long one holds, and again once it has left.
    let long = "o".repeat(100);
    rw(m, &["B", &long, "READ", "60000"]);
    rw(m, &["B", "s:1", "READ", "60000"]);
    cmd(m, &["RWLOCK.RELEASE", "B", &long, "READ"]);
    rw(m, &["B", "s:2", "READ", "60000"]);
    rw(m, &["B", "s:1", "READ", "60000"]);
    // Many readers: past the size a hash goes out whole.
    for i in 0..40 {
        rw(m, &["M", &format!("reader-with-a-longer-name:{i}"), "READ", "60000"]);
    }
    cmd(m, &["RWLOCK.RELEASE", "M", "reader-with-a-longer-name:7", "READ"]);

    // Counted permits.
    cmd(m, &["RSEM.SETPERMITS", "S", "5"]);
    cmd(m, &["RSEM.ACQUIRE", "S", "2"]);
    cmd(m, &["RSEM.RELEASE", "S", "1"]);
    cmd(m, &["RSEM.ADDPERMITS", "S", "-1"]);
    // Leased ones: released by id, renewed, one expiring (reclaimed), and a waiter served.
    let leased = permit_ids(&cmd(m, &["RSEM.ACQUIRE", "S", "2", "LEASE", "60000"]));
    redis::cmd("RSEM.RELEASE").arg("S").arg("ID").arg(&leased[0]).query::<i64>(m).expect("ID");
    redis::cmd("RSEM.RENEW").arg("S").arg(&leased[1]).arg(90_000).query::<i64>(m).expect("renew");
    let _expiring = permit_ids(&cmd(m, &["RSEM.ACQUIRE", "S", "1", "LEASE", "300"]));
    let waiter = queue_str(master, m, &["RSEM.ACQUIRE", "S", "2", "LEASE", "60000", "WAIT", "0"]);
    assert!(matches!(waiter.reply(LIMIT).0, Ok(Value::Array(_))), "served once reclaimed");
    cmd(m, &["RSEM.ADDPERMITS", "S", "3"]);
    let counted_waiter = queue_str(master, m, &["RSEM.ACQUIRE", "S", "6", "WAIT", "0"]);
    cmd(m, &["RSEM.RELEASE", "S", "4"]);
    assert_eq!(counted_waiter.reply(LIMIT).0, Ok(Value::Int(1)));
    // The short read hold has expired and its reader was removed.
    poll("the expired reader removed", LIMIT, || {
        (cmd(m, &["HEXISTS", "L", "r:3"]) == Value::Int(0)).then_some(())
    });
}

#[test]
fn a_module_less_replica_and_aof_hold_rw_locks_and_semaphores_byte_for_byte() {
    // Uncompressed DUMPs: the bytes themselves are compared.
    let mut master = Server::builder()
        .config("appendonly", "yes")
        .config("appendfsync", "always")
        .config("rdbcompression", "no")
        .start();
    let replica = Server::builder()
        .without_module()
        .config("sanitize-dump-payload", "yes")
        .config("rdbcompression", "no")
        .replica_of(&master)
        .start();
    let (mut m, mut r) = (master.conn(), replica.conn());
    wait_link_up(&mut r);
    scenario(&master, &mut m);
    let acked: i64 = redis::cmd("WAIT").arg(1).arg(10_000).query(&mut m).expect("WAIT");
    assert_eq!(acked, 1);
    let expected = snapshot(&mut m);
    assert!(expected.0.len() > 10, "{:?}", expected.0.keys());
    let valkey = rlock_tests_integration::valkey_major(&mut m).is_some();
    same(&expected, &snapshot(&mut r), "the module-less replica", valkey);
    assert!(!replica.log().contains("Bad data format"), "{}", replica.log());
    drop(m);

    master.restart_without_module();
    let mut m = master.conn();
    same(&expected, &snapshot(&mut m), "the AOF replayed without the module", valkey);
}

/// A key as compared: encoding, `DEBUG DIGEST-VALUE`, `PEXPIRETIME`.
fn state(con: &mut Connection, key: &str) -> (String, Value, i64) {
    let encoding: String = redis::cmd("OBJECT").arg("ENCODING").arg(key).query(con).expect("ENC");
    let digest: Value =
        redis::cmd("DEBUG").arg("DIGEST-VALUE").arg(key).query(con).expect("DIGEST-VALUE");
    (encoding, digest, pexpiretime(con, key.as_bytes()))
}

/// Waits until the replica has run everything the master sent so far (a marker `INCR`).
fn synced(m: &mut Connection, r: &mut Connection) {
    let marker: i64 = redis::cmd("INCR").arg("marker").query(m).expect("INCR");
    poll("the marker on the replica", LIMIT, || {
        let got: Option<i64> = redis::cmd("GET").arg("marker").query(r).expect("GET");
        (got == Some(marker)).then_some(())
    });
}

/// A lock taken by an owner longer than `hash-max-listpack-value` is a hash table on the
/// master (and on the replica, which got `HSET`). The limit is then raised on both servers (to
/// let such owners go out whole, as docs/operations.md suggests) and the owner re-enters: the
/// master's hash stays a hash table, so the replica must not be sent a listpack. The
/// read-write lock scans its hash before it sends it whole; the reentrant lock must not send
/// a listpack for a hash it does not keep as one either.
#[test]
fn a_reentry_after_the_listpack_limit_was_raised_keeps_the_replica_s_encoding() {
    let master = Server::start();
    let replica = Server::builder().without_module().replica_of(&master).start();
    let (mut m, mut r) = (master.conn(), replica.conn());
    wait_link_up(&mut r);
    if rlock_tests_integration::valkey_major(&mut m).is_some() {
        // Valkey lends a small hash table's fields in one scan step: a hash table may go out
        // whole there (see store::whole), for both kinds of lock.
        return;
    }
    let long = "o".repeat(100);
    assert_eq!(cmd(&mut m, &["RLOCK.ACQUIRE", "L", &long, "60000"]), Value::Nil);
    assert_eq!(cmd(&mut m, &["RWLOCK.ACQUIRE", "W", &long, "WRITE", "60000"]), Value::Nil);
    synced(&mut m, &mut r);
    for con in [&mut m, &mut r] {
        cmd(con, &["CONFIG", "SET", "hash-max-listpack-value", "200"]);
    }
    assert_eq!(cmd(&mut m, &["RLOCK.ACQUIRE", "L", &long, "60000"]), Value::Nil);
    assert_eq!(cmd(&mut m, &["RWLOCK.ACQUIRE", "W", &long, "WRITE", "60000"]), Value::Nil);
    synced(&mut m, &mut r);
    for key in ["W", "L"] {
        let expected = state(&mut m, key);
        assert_eq!(expected.0, "hashtable", "{key} on the master");
        assert_eq!(state(&mut r, key), expected, "{key} on the module-less replica");
    }
}

fn exists(con: &mut Connection, key: &str) -> bool {
    redis::cmd("EXISTS").arg(key).query::<i64>(con).expect("EXISTS") == 1
}

#[test]
fn a_writable_replica_never_blocks_a_waiter_it_cannot_serve() {
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

/// `DUMP key` on `con`.
fn dump(con: &mut Connection, key: &str) -> Value {
    cmd(con, &["DUMP", key])
}

#[test]
fn a_module_less_replica_keeps_the_masters_hash_encoding_under_the_servers_listpack_limit() {
    // The limit set in the config file on both, and changed at run time on both.
    let master = Server::builder().config("hash-max-listpack-value", "32").start();
    let replica = Server::builder()
        .without_module()
        .config("hash-max-listpack-value", "32")
        .replica_of(&master)
        .start();
    wait_replica_online(&master);
    let mut con = master.conn();
    let mut rcon = replica.conn();
    let check = |con: &mut Connection, rcon: &mut Connection, key: &str, owner: &str| {
        assert_eq!(cmd(con, &["RLOCK.ACQUIRE", key, owner, "60000"]), Value::Nil);
        assert_eq!(cmd(con, &["RLOCK.ACQUIRE", key, owner, "60000"]), Value::Nil);
        cmd(con, &["WAIT", "1", "5000"]);
        let encoding = cmd(con, &["OBJECT", "ENCODING", key]);
        assert_eq!(cmd(rcon, &["OBJECT", "ENCODING", key]), encoding, "{key}");
        assert_eq!(dump(rcon, key), dump(con, key), "{key}: the replica's hash differs");
    };
    let owner38 = "o".repeat(38);
    check(&mut con, &mut rcon, "l38", &owner38);
    check(&mut con, &mut rcon, "l20", &"p".repeat(20));
    for c in [&mut con, &mut rcon] {
        cmd(c, &["CONFIG", "SET", "hash-max-listpack-value", "100"]);
    }
    check(&mut con, &mut rcon, "l70", &"q".repeat(70));
    for c in [&mut con, &mut rcon] {
        cmd(c, &["CONFIG", "SET", "hash-max-listpack-value", "8"]);
    }
    check(&mut con, &mut rcon, "l10", &"r".repeat(10));
}
