//! Semaphore hardening (issue 23): each test is a regression test for one defect a hostile
//! attack on `RSEM.*` found, named after its item (F, G, H, L, M, 1, and the two suspicious
//! ones: the reclaim's publish and a missing count key).

use std::collections::HashMap;
use std::time::Duration;

use redis::{Connection, Value};
use rlock_tests_integration::{
    blocked_clients, cmd, digest, pexpiretime, poll, run, run_checked, run_str, wait_blocked,
    wait_replica_online, Pending, Server,
};

const LIMIT: Duration = Duration::from_secs(10);

/// The most leased permits one `RSEM.ACQUIRE ... LEASE` may take (and ids one `RSEM.RELEASE ...
/// ID` may name); see README.
const MAX_LEASED: usize = 10_000;

fn get(con: &mut Connection, key: &str) -> Option<String> {
    redis::cmd("GET").arg(key).query(con).expect("GET")
}

fn zcard(con: &mut Connection, key: &str) -> i64 {
    redis::cmd("ZCARD").arg(key).query(con).expect("ZCARD")
}

/// A connection authenticated as `user` (created with `nopass`).
fn conn_as(server: &Server, user: &str) -> Connection {
    let mut con = server.conn();
    cmd(&mut con, &["AUTH", user, "any"]);
    con
}

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

/// `RSEM.INFO` as a map of its integer fields.
fn info(con: &mut Connection, key: &str) -> HashMap<String, i64> {
    let reply = cmd(con, &["RSEM.INFO", key]);
    let Value::Array(items) = reply else { panic!("RSEM.INFO: {reply:?}") };
    items
        .chunks(2)
        .map(|kv| match kv {
            [Value::BulkString(k), Value::Int(v)] => (String::from_utf8_lossy(k).into_owned(), *v),
            other => panic!("RSEM.INFO field: {other:?}"),
        })
        .collect()
}

fn ids(reply: &Value) -> Vec<Vec<u8>> {
    let Value::Array(items) = reply else { panic!("ids: {reply:?}") };
    items
        .iter()
        .map(|v| match v {
            Value::BulkString(id) => id.clone(),
            other => panic!("id: {other:?}"),
        })
        .collect()
}

/// Waits until the replica acknowledged everything the master wrote so far.
fn synced(master: &mut Connection) {
    let acked: i64 = redis::cmd("WAIT").arg(1).arg(5000).query(master).expect("WAIT");
    assert_eq!(acked, 1, "the replica acknowledged");
}

// ---- F: INFO and AVAILABLE read the lease zset: the caller must be allowed to ----------------

#[test]
fn f_info_and_available_check_read_access_to_the_lease_zset() {
    let server = Server::start();
    let mut admin = server.conn();
    cmd(&mut admin, &["RSEM.SETPERMITS", "sem:s", "5"]);
    cmd(&mut admin, &["RSEM.SETPERMITS", "sem:plain", "5"]);
    cmd(&mut admin, &["RSEM.ACQUIRE", "sem:s", "2", "LEASE", "60000"]);
    cmd(&mut admin, &["ACL", "SETUSER", "lim", "on", "nopass", "~sem:*", "allchannels", "+@all"]);
    let mut lim = conn_as(&server, "lim");
    let refused = run_str(&mut lim, &["ZCARD", "{sem:s}:timeout"]).unwrap_err();
    assert!(refused.starts_with("NOPERM"), "Redis refuses ZCARD: {refused}");

    cmd(&mut admin, &["ACL", "LOG", "RESET"]);
    for command in ["RSEM.INFO", "RSEM.AVAILABLE"] {
        let err = run_str(&mut lim, &[command, "sem:s"]).unwrap_err();
        assert!(err.starts_with("NOPERM") && err.contains("lease zset"), "{command}: {err}");
    }
    assert!(acl_log_objects(&mut admin).contains(&"{sem:s}:timeout".to_owned()));
    // INFO always reports the zset (even that it is empty); AVAILABLE reads it only when it
    // exists, so a plain semaphore stays readable with the key pattern alone.
    let err = run_str(&mut lim, &["RSEM.INFO", "sem:plain"]).unwrap_err();
    assert!(err.starts_with("NOPERM"), "{err}");
    assert_eq!(cmd(&mut lim, &["RSEM.AVAILABLE", "sem:plain"]), Value::Int(5));

    // A read permission on the zset is enough.
    cmd(&mut admin, &["ACL", "SETUSER", "lim", "%R~{sem:*}:timeout"]);
    assert_eq!(cmd(&mut lim, &["RSEM.AVAILABLE", "sem:s"]), Value::Int(3));
    let fields = info(&mut lim, "sem:s");
    assert_eq!(fields["leased"], 2, "{fields:?}");
    assert_eq!(info(&mut lim, "sem:plain")["leased"], 0);
}

// ---- G: the count is parsed exactly as INCRBY parses it -------------------------------------

#[test]
fn g_a_count_incrby_refuses_is_refused_and_master_and_replica_agree() {
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
    // The sequence: the master and a replica without the module never part.
    cmd(&mut con, &["SET", "S", "05"]);
    let _ = run_str(&mut con, &["RSEM.RELEASE", "S", "2"]);
    let _ = run_str(&mut con, &["RSEM.ACQUIRE", "S", "1"]);
    synced(&mut con);
    assert_eq!(get(&mut con, "S"), get(&mut rep, "S"), "master and replica agree");
    assert_eq!(get(&mut con, "S").as_deref(), Some("05"));
}

// ---- H: a TTL on the count is kept exactly --------------------------------------------------

#[test]
fn h_a_ttl_on_the_count_does_not_drift_over_many_acquires_and_releases() {
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

// ---- L: a release by id that would overflow changes nothing ---------------------------------

#[test]
fn l_a_release_by_id_that_overflows_the_count_keeps_the_permit() {
    let master = Server::start();
    let replica = Server::builder().without_module().replica_of(&master).start();
    wait_replica_online(&master);
    let (mut con, mut rep) = (master.conn(), replica.conn());
    cmd(&mut con, &["RSEM.SETPERMITS", "S", "1"]);
    let id = ids(&cmd(&mut con, &["RSEM.ACQUIRE", "S", "1", "LEASE", "60000"])).remove(0);
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

// ---- M: the permits the waiters ask for do not wrap ------------------------------------------

#[test]
fn m_waiting_permits_saturate_instead_of_wrapping() {
    let server = Server::start();
    let mut con = server.conn();
    cmd(&mut con, &["RSEM.SETPERMITS", "S", "0"]);
    let max = "9223372036854775807";
    let a = Pending::start_str(&server, &["RSEM.ACQUIRE", "S", max, "WAIT", "10000"]);
    let b = Pending::start_str(&server, &["RSEM.ACQUIRE", "S", max, "WAIT", "10000"]);
    wait_blocked(&mut con, 2);
    let fields = info(&mut con, "S");
    assert_eq!(fields["waiters"], 2, "{fields:?}");
    assert_eq!(fields["waiting_permits"], i64::MAX, "{fields:?}");
    for pending in [a, b] {
        cmd(&mut con, &["CLIENT", "UNBLOCK", &pending.client_id().to_string()]);
        assert_eq!(pending.reply(LIMIT).0, Ok(Value::Int(0)));
    }
}

// ---- 1: sizes a client sends are bounded before anything is written ------------------------

#[test]
fn i1_a_leased_acquire_of_too_many_permits_is_refused_and_changes_nothing() {
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
    let granted = ids(&cmd(&mut con, &["RSEM.ACQUIRE", "s", "10000", "LEASE", "60000"]));
    assert_eq!(granted.len(), MAX_LEASED);
    assert_eq!(zcard(&mut con, "{s}:timeout"), MAX_LEASED as i64);
    assert!(!server.log().contains("panicked"), "{}", server.log());
}

#[test]
fn i1_a_release_naming_too_many_ids_is_refused_and_changes_nothing() {
    let server = Server::start();
    let mut con = server.conn();
    cmd(&mut con, &["RSEM.SETPERMITS", "s", "20000"]);
    let mut granted = ids(&cmd(&mut con, &["RSEM.ACQUIRE", "s", "10000", "LEASE", "60000"]));
    granted.extend(ids(&cmd(&mut con, &["RSEM.ACQUIRE", "s", "1", "LEASE", "60000"])));
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
fn i1_a_huge_foreign_zset_of_ended_leases_is_reclaimed_in_bounded_batches() {
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

// ---- Suspicious 1: a reclaim a client command triggers publishes: check the channel --------

#[test]
fn s1_a_reclaim_triggered_by_a_user_who_may_not_publish_is_refused() {
    let server = Server::start();
    let mut admin = server.conn();
    cmd(&mut admin, &["SET", "S", "0"]);
    // A Redisson client's lease that ended (no rlock timer knows of it).
    cmd(&mut admin, &["ZADD", "{S}:timeout", "1000", "0123456789abcdef"]);
    cmd(&mut admin, &["ACL", "SETUSER", "nopub", "on", "nopass", "~*", "resetchannels", "+@all"]);
    let mut nopub = conn_as(&server, "nopub");
    cmd(&mut admin, &["ACL", "LOG", "RESET"]);
    let before = digest(&mut admin);
    for args in [&["RSEM.ACQUIRE", "S", "1"][..], &["RSEM.RELEASE", "S", "1"]] {
        let err = run_str(&mut nopub, args).unwrap_err();
        assert!(err.starts_with("NOPERM") && err.contains("publish"), "{args:?}: {err}");
    }
    assert_eq!(digest(&mut admin), before, "nothing reclaimed, nothing published");
    assert!(acl_log_objects(&mut admin).contains(&"redisson_sc:{S}".to_owned()));
    // AVAILABLE writes nothing: it counts the ended lease.
    assert_eq!(cmd(&mut nopub, &["RSEM.AVAILABLE", "S"]), Value::Int(1));
    // Allowed to publish, the same user reclaims and takes it.
    cmd(&mut admin, &["ACL", "SETUSER", "nopub", "&redisson_sc:*"]);
    assert_eq!(cmd(&mut nopub, &["RSEM.ACQUIRE", "S", "1"]), Value::Int(1));
    assert_eq!(zcard(&mut admin, "{S}:timeout"), 0);
}

// ---- Suspicious 2: a semaphore whose count key is missing is still a semaphore -------------

#[test]
fn s2_leases_of_a_semaphore_whose_count_key_was_deleted_are_reclaimed_by_the_timer() {
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
