//! Who waits: `RLOCK.WAITERS`, `RWLOCK.WAITERS`, `RSEM.WAITERS`, the per-queue figures of the
//! `*.INFO` replies and the wait-time buckets of `INFO rlock`.

use std::collections::HashMap;
use std::time::Duration;

use redis::{Connection, Value};
use rlock_tests_integration::{cmd, info_field, int, queue, queue_str, run_str, Cluster, Server};

const LIMIT: Duration = Duration::from_secs(10);

/// A RESP2 flat field/value array (or a RESP3 map) as field -> value.
fn fields(value: &Value) -> HashMap<String, Value> {
    match value {
        Value::Array(items) => items
            .chunks(2)
            .map(|p| match &p[0] {
                Value::BulkString(name) => {
                    (String::from_utf8_lossy(name).into_owned(), p[1].clone())
                }
                other => panic!("field name {other:?}"),
            })
            .collect(),
        Value::Map(pairs) => pairs
            .iter()
            .map(|(k, v)| match k {
                Value::BulkString(name) => (String::from_utf8_lossy(name).into_owned(), v.clone()),
                other => panic!("field name {other:?}"),
            })
            .collect(),
        other => panic!("not a map: {other:?}"),
    }
}

/// The rows of a `*.WAITERS` reply.
fn rows(value: &Value) -> Vec<HashMap<String, Value>> {
    match value {
        Value::Array(rows) => rows.iter().map(fields).collect(),
        other => panic!("not an array: {other:?}"),
    }
}

fn bytes(value: &Value) -> Vec<u8> {
    match value {
        Value::BulkString(b) => b.clone(),
        other => panic!("not a bulk string: {other:?}"),
    }
}

/// The names of a row's fields in reply order (RESP2).
fn names(value: &Value) -> Vec<String> {
    match value {
        Value::Array(items) => items
            .iter()
            .step_by(2)
            .map(|n| String::from_utf8_lossy(&bytes(n)).into_owned())
            .collect(),
        other => panic!("not a flat array: {other:?}"),
    }
}

#[test]
fn rlock_waiters_lists_each_waiter_in_queue_order_with_its_times_and_request_id() {
    let server = Server::start();
    let mut con = server.conn();
    assert_eq!(cmd(&mut con, &["RLOCK.WAITERS", "l"]), Value::Array(vec![]));
    cmd(&mut con, &["RLOCK.ACQUIRE", "l", "holder", "60000"]);
    let odd: &[u8] = b"o\r\nw\0ner \xff";
    let b = queue_str(
        &server,
        &mut con,
        &["RLOCK.ACQUIRE", "l", "b", "60000", "WAIT", "30000", "REQUEST", "r1"],
    );
    let c = queue_str(&server, &mut con, &["RLOCK.ACQUIRE", "l", "c", "60000", "WAIT", "0"]);
    let d = queue(&server, &mut con, &[b"RLOCK.ACQUIRE", b"l", odd, b"60000", b"WAIT", b"20000"]);
    let reply = cmd(&mut con, &["RLOCK.WAITERS", "l"]);
    let Value::Array(raw_rows) = &reply else { panic!("{reply:?}") };
    assert_eq!(names(&raw_rows[0]), ["owner", "waited_ms", "left_ms", "request"]);
    let listed = rows(&reply);
    let owners: Vec<Vec<u8>> = listed.iter().map(|r| bytes(&r["owner"])).collect();
    assert_eq!(owners, [b"b".to_vec(), b"c".to_vec(), odd.to_vec()], "queue order, binary-safe");
    assert_eq!(bytes(&listed[0]["request"]), b"r1");
    assert_eq!(listed[1]["request"], Value::Nil);
    let left = int(&listed[0]["left_ms"]);
    assert!((1..=30_000).contains(&left), "ms left of WAIT 30000: {left}");
    assert_eq!(int(&listed[1]["left_ms"]), -1, "WAIT 0 waits without limit");
    assert!((1..=20_000).contains(&int(&listed[2]["left_ms"])));
    for row in &listed {
        assert!((0..10_000).contains(&int(&row["waited_ms"])), "{row:?}");
    }
    assert!(
        int(&listed[0]["waited_ms"]) >= int(&listed[2]["waited_ms"]),
        "the first waited longest"
    );
    let first = rows(&cmd(&mut con, &["RLOCK.WAITERS", "l", "count", "1"]));
    assert_eq!(first.len(), 1);
    assert_eq!(bytes(&first[0]["owner"]), b"b");
    // A hand-off takes the head out.
    assert_eq!(cmd(&mut con, &["RLOCK.RELEASE", "l", "holder"]), Value::Int(1));
    assert_eq!(b.reply(LIMIT).0, Ok(Value::Nil));
    let owners: Vec<Vec<u8>> =
        rows(&cmd(&mut con, &["RLOCK.WAITERS", "l"])).iter().map(|r| bytes(&r["owner"])).collect();
    assert_eq!(owners, [b"c".to_vec(), odd.to_vec()]);
    cmd(&mut con, &["RLOCK.FORCERELEASE", "l"]);
    c.reply(LIMIT).0.expect("c granted");
    cmd(&mut con, &["RLOCK.FORCERELEASE", "l"]);
    d.reply(LIMIT).0.expect("d granted");
    assert_eq!(cmd(&mut con, &["RLOCK.WAITERS", "l"]), Value::Array(vec![]));
}

#[test]
fn rwlock_waiters_show_each_waiters_mode_in_queue_order() {
    let server = Server::start();
    let mut con = server.conn();
    cmd(&mut con, &["RWLOCK.ACQUIRE", "rw", "w0", "WRITE", "60000"]);
    let mut pending = Vec::new();
    for (owner, mode) in [("r1", "READ"), ("w1", "WRITE"), ("r2", "READ")] {
        pending.push(queue_str(
            &server,
            &mut con,
            &["RWLOCK.ACQUIRE", "rw", owner, mode, "60000", "WAIT", "30000"],
        ));
    }
    let reply = cmd(&mut con, &["RWLOCK.WAITERS", "rw"]);
    let Value::Array(raw_rows) = &reply else { panic!("{reply:?}") };
    assert_eq!(names(&raw_rows[0]), ["owner", "mode", "waited_ms", "left_ms", "request"]);
    let listed: Vec<(Vec<u8>, Vec<u8>)> =
        rows(&reply).iter().map(|r| (bytes(&r["owner"]), bytes(&r["mode"]))).collect();
    let want: Vec<(Vec<u8>, Vec<u8>)> = [("r1", "read"), ("w1", "write"), ("r2", "read")]
        .iter()
        .map(|(o, m)| (o.as_bytes().to_vec(), m.as_bytes().to_vec()))
        .collect();
    assert_eq!(listed, want);
    // The writer's release grants the reader at the head only (a writer is next).
    assert_eq!(cmd(&mut con, &["RWLOCK.RELEASE", "rw", "w0", "WRITE"]), Value::Int(1));
    let owners: Vec<Vec<u8>> = rows(&cmd(&mut con, &["RWLOCK.WAITERS", "rw"]))
        .iter()
        .map(|r| bytes(&r["owner"]))
        .collect();
    assert_eq!(owners, [b"w1".to_vec(), b"r2".to_vec()]);
    let info = fields(&cmd(&mut con, &["RWLOCK.INFO", "rw"]));
    assert_eq!((int(&info["queue_waits"]), int(&info["queue_handoffs"])), (3, 1), "{info:?}");
    cmd(&mut con, &["RWLOCK.FORCERELEASE", "rw"]);
    cmd(&mut con, &["RWLOCK.FORCERELEASE", "rw"]);
    for p in pending {
        p.reply(LIMIT).0.expect("granted");
    }
}

#[test]
fn rsem_waiters_show_permits_and_whether_they_are_leased() {
    let server = Server::start();
    let mut con = server.conn();
    cmd(&mut con, &["RSEM.SETPERMITS", "s", "0"]);
    let a =
        queue_str(&server, &mut con, &["RSEM.ACQUIRE", "s", "2", "WAIT", "30000", "REQUEST", "q"]);
    let b =
        queue_str(&server, &mut con, &["RSEM.ACQUIRE", "s", "1", "LEASE", "60000", "WAIT", "0"]);
    let reply = cmd(&mut con, &["RSEM.WAITERS", "s"]);
    let Value::Array(raw_rows) = &reply else { panic!("{reply:?}") };
    assert_eq!(names(&raw_rows[0]), ["permits", "leased", "waited_ms", "left_ms", "request"]);
    let listed = rows(&reply);
    assert_eq!((int(&listed[0]["permits"]), int(&listed[0]["leased"])), (2, 0));
    assert_eq!(bytes(&listed[0]["request"]), b"q");
    assert_eq!((int(&listed[1]["permits"]), int(&listed[1]["leased"])), (1, 1));
    assert_eq!(int(&listed[1]["left_ms"]), -1);
    assert_eq!(cmd(&mut con, &["RSEM.RELEASE", "s", "3"]), Value::Int(0));
    assert_eq!(a.reply(LIMIT).0, Ok(Value::Int(1)));
    assert!(matches!(b.reply(LIMIT).0, Ok(Value::Array(ids)) if ids.len() == 1));
    assert_eq!(cmd(&mut con, &["RSEM.WAITERS", "s"]), Value::Array(vec![]));
}

#[test]
fn count_is_bounded_and_bad_input_gets_its_error() {
    let server = Server::start();
    let mut con = server.conn();
    let count_error = "ERR count (after COUNT) must be an integer from 1 to 1000";
    for command in ["RLOCK.WAITERS", "RWLOCK.WAITERS", "RSEM.WAITERS"] {
        for bad in ["0", "1001", "-1", "abc", "01", "99999999999999999999999", ""] {
            assert_eq!(
                run_str(&mut con, &[command, "k", "COUNT", bad]).unwrap_err(),
                count_error,
                "{command} COUNT {bad:?}"
            );
        }
        assert_eq!(run_str(&mut con, &[command, "k", "COUNT"]).unwrap_err(), count_error);
        assert_eq!(
            run_str(&mut con, &[command, "k", "COUNT", "5", "x"]).unwrap_err(),
            "ERR syntax error"
        );
        assert_eq!(
            run_str(&mut con, &[command, "k", "LIMIT", "5"]).unwrap_err(),
            "ERR syntax error"
        );
        let arity = run_str(&mut con, &[command]).unwrap_err();
        assert!(arity.starts_with("ERR wrong number of arguments"), "{arity}");
        assert_eq!(run_str(&mut con, &[command, "k", "COUNT", "1000"]), Ok(Value::Array(vec![])));
    }
    cmd(&mut con, &["SET", "str", "x"]);
    cmd(&mut con, &["RLOCK.ACQUIRE", "re", "a", "60000"]);
    cmd(&mut con, &["RWLOCK.ACQUIRE", "rw", "a", "READ", "60000"]);
    cmd(&mut con, &["LPUSH", "list", "x"]);
    let wrongtype = |con: &mut Connection, args: &[&str]| {
        let e = run_str(con, args).unwrap_err();
        assert!(e.starts_with("WRONGTYPE"), "{args:?}: {e}");
    };
    wrongtype(&mut con, &["RLOCK.WAITERS", "str"]);
    wrongtype(&mut con, &["RLOCK.WAITERS", "rw"]);
    wrongtype(&mut con, &["RWLOCK.WAITERS", "re"]);
    wrongtype(&mut con, &["RWLOCK.WAITERS", "list"]);
    wrongtype(&mut con, &["RSEM.WAITERS", "re"]);
    wrongtype(&mut con, &["RSEM.WAITERS", "list"]);
}

#[test]
fn a_user_limited_to_a_key_pattern_lists_only_those_keys_even_read_only() {
    let server = Server::start();
    let mut admin = server.conn();
    cmd(&mut admin, &["ACL", "SETUSER", "rw", "on", "nopass", "+@all", "~lock:*", "&*"]);
    cmd(&mut admin, &["ACL", "SETUSER", "ro", "on", "nopass", "+@all", "%R~lock:*"]);
    cmd(&mut admin, &["RLOCK.ACQUIRE", "lock:a", "h", "60000"]);
    let w =
        queue_str(&server, &mut admin, &["RLOCK.ACQUIRE", "lock:a", "w", "60000", "WAIT", "30000"]);
    for user in ["rw", "ro"] {
        let mut con = server.conn();
        cmd(&mut con, &["AUTH", user, "x"]);
        let listed = rows(&cmd(&mut con, &["RLOCK.WAITERS", "lock:a"]));
        assert_eq!(listed.len(), 1, "{user}");
        assert_eq!(bytes(&listed[0]["owner"]), b"w");
        for command in ["RLOCK.WAITERS", "RWLOCK.WAITERS", "RSEM.WAITERS"] {
            let e = run_str(&mut con, &[command, "other:a"]).unwrap_err();
            assert!(e.starts_with("NOPERM"), "{user} {command}: {e}");
        }
    }
    cmd(&mut admin, &["RLOCK.FORCERELEASE", "lock:a"]);
    w.reply(LIMIT).0.expect("granted");
}

#[test]
fn resp3_gets_an_array_of_maps_and_multi_and_lua_may_list() {
    let server = Server::start();
    let mut con = server.conn_resp3();
    cmd(&mut con, &["RLOCK.ACQUIRE", "l", "h", "60000"]);
    let w = queue_str(&server, &mut con, &["RLOCK.ACQUIRE", "l", "w", "60000", "WAIT", "30000"]);
    let reply = cmd(&mut con, &["RLOCK.WAITERS", "l"]);
    let Value::Array(listed) = &reply else { panic!("{reply:?}") };
    assert!(matches!(&listed[0], Value::Map(pairs) if pairs.len() == 4), "{reply:?}");
    assert_eq!(bytes(&fields(&listed[0])["owner"]), b"w");
    let mut plain = server.conn();
    let lua = cmd(&mut plain, &["EVAL", "return redis.call('RLOCK.WAITERS', KEYS[1])", "1", "l"]);
    assert_eq!(bytes(&rows(&lua)[0]["owner"]), b"w");
    let ro = cmd(
        &mut plain,
        &["EVAL_RO", "return redis.call('RLOCK.WAITERS', KEYS[1], 'COUNT', '1')", "1", "l"],
    );
    assert_eq!(rows(&ro).len(), 1);
    let exec: Value = redis::pipe()
        .atomic()
        .cmd("RLOCK.WAITERS")
        .arg("l")
        .cmd("RSEM.WAITERS")
        .arg("l2")
        .query(&mut plain)
        .expect("MULTI");
    let Value::Array(results) = exec else { panic!("{exec:?}") };
    assert_eq!(bytes(&rows(&results[0])[0]["owner"]), b"w");
    assert_eq!(results[1], Value::Array(vec![]));
    cmd(&mut con, &["RLOCK.FORCERELEASE", "l"]);
    w.reply(LIMIT).0.expect("granted");
}

#[test]
fn in_a_cluster_waiters_route_by_slot_and_braces() {
    let cluster = Cluster::start(3);
    let key = cluster.key_on(0, "w:");
    let node = &cluster.nodes[0];
    let mut con = node.conn();
    cmd(&mut con, &["RLOCK.ACQUIRE", &key, "h", "60000"]);
    let braced = format!("{{{key}}}:other");
    cmd(&mut con, &["RLOCK.ACQUIRE", &braced, "h", "60000"]);
    let w = queue_str(node, &mut con, &["RLOCK.ACQUIRE", &key, "w", "60000", "WAIT", "30000"]);
    let v = queue_str(node, &mut con, &["RLOCK.ACQUIRE", &braced, "v", "60000", "WAIT", "30000"]);
    assert_eq!(bytes(&rows(&cmd(&mut con, &["RLOCK.WAITERS", &key]))[0]["owner"]), b"w");
    assert_eq!(bytes(&rows(&cmd(&mut con, &["RLOCK.WAITERS", &braced]))[0]["owner"]), b"v");
    let slot = cluster.slot(key.as_bytes());
    for other in &cluster.nodes[1..] {
        for command in ["RLOCK.WAITERS", "RWLOCK.WAITERS", "RSEM.WAITERS"] {
            for name in [&key, &braced] {
                let e = run_str(&mut other.conn(), &[command, name]).unwrap_err();
                assert_eq!(
                    e,
                    format!("MOVED {slot} 127.0.0.1:{}", node.port()),
                    "{command} {name}"
                );
            }
        }
    }
    cmd(&mut con, &["RLOCK.FORCERELEASE", &key]);
    cmd(&mut con, &["RLOCK.FORCERELEASE", &braced]);
    w.reply(LIMIT).0.expect("granted");
    v.reply(LIMIT).0.expect("granted");
}

#[test]
fn queue_figures_count_waits_hand_offs_and_timeouts_and_info_buckets_every_wait() {
    let server = Server::start();
    let mut con = server.conn();
    let before = info_field(&mut con, "rlock_wait_times", "rlock_wait_ms_count");
    assert_eq!(before, 0);
    cmd(&mut con, &["RLOCK.ACQUIRE", "l", "h", "60000"]);
    let info = fields(&cmd(&mut con, &["RLOCK.INFO", "l"]));
    assert_eq!(info.len(), 8, "{info:?}");
    let Value::Array(items) = cmd(&mut con, &["RLOCK.INFO", "l"]) else { panic!() };
    assert_eq!(
        names(&Value::Array(items)),
        [
            "owner",
            "count",
            "pttl",
            "waiters",
            "token",
            "queue_waits",
            "queue_handoffs",
            "queue_timeouts"
        ]
    );
    let timing_out =
        queue_str(&server, &mut con, &["RLOCK.ACQUIRE", "l", "t", "60000", "WAIT", "50"]);
    let a = queue_str(&server, &mut con, &["RLOCK.ACQUIRE", "l", "a", "60000", "WAIT", "0"]);
    let b = queue_str(&server, &mut con, &["RLOCK.ACQUIRE", "l", "b", "60000", "WAIT", "0"]);
    assert!(matches!(timing_out.reply(LIMIT).0, Ok(Value::Int(_))));
    assert_eq!(cmd(&mut con, &["RLOCK.RELEASE", "l", "h"]), Value::Int(1));
    a.reply(LIMIT).0.expect("a granted");
    let info = fields(&cmd(&mut con, &["RLOCK.INFO", "l"]));
    let figures = [&info["queue_waits"], &info["queue_handoffs"], &info["queue_timeouts"]].map(int);
    assert_eq!(figures, [3, 1, 1], "{info:?}");
    assert_eq!(int(&info["waiters"]), 1);
    // The wait-time buckets: two waits ended (the timeout of 50 ms, a's grant), cumulative.
    let le = |con: &mut Connection, b: &str| {
        info_field(con, "rlock_wait_times", &format!("rlock_wait_ms_le_{b}"))
    };
    assert_eq!(info_field(&mut con, "rlock_wait_times", "rlock_wait_ms_count"), 2);
    assert_eq!(le(&mut con, "inf"), 2);
    assert_eq!(le(&mut con, "10"), 0, "the 50 ms timeout waited longer");
    let mut last = 0;
    for bound in ["1", "5", "10", "50", "100", "500", "1000", "5000", "10000", "inf"] {
        let n = le(&mut con, bound);
        assert!(n >= last, "cumulative: le_{bound} = {n} < {last}");
        last = n;
    }
    assert!(info_field(&mut con, "rlock_wait_times", "rlock_wait_ms_sum") >= 50);
    // The last waiter's grant empties the queue: its figures go with it.
    cmd(&mut con, &["RLOCK.FORCERELEASE", "l"]);
    b.reply(LIMIT).0.expect("b granted");
    let info = fields(&cmd(&mut con, &["RLOCK.INFO", "l"]));
    assert_eq!(int(&info["queue_waits"]), 0, "{info:?}");
    // RSEM.INFO appends the same three at its end.
    cmd(&mut con, &["RSEM.SETPERMITS", "s", "0"]);
    let s = queue_str(&server, &mut con, &["RSEM.ACQUIRE", "s", "1", "WAIT", "0"]);
    let Value::Array(items) = cmd(&mut con, &["RSEM.INFO", "s"]) else { panic!() };
    let sem = names(&Value::Array(items.clone()));
    assert_eq!(&sem[5..], ["queue_waits", "queue_handoffs", "queue_timeouts"], "{sem:?}");
    assert_eq!(items[11], Value::Int(1));
    cmd(&mut con, &["RSEM.RELEASE", "s", "1"]);
    s.reply(LIMIT).0.expect("granted");
}
