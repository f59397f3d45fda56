//! ACL users limited to key patterns and channels: every key and channel beyond argv is checked
//! for the right user (the caller, or the waiter its grant is for).

use std::time::Duration;

use redis::{Connection, Value};

use rlock_tests_integration::{
    blocked_clients, cmd, digest, granted_token, poll, queue_str, run_str, wait_blocked, Server,
};

const LIMIT: Duration = Duration::from_secs(20);

/// The request id `id` may wait on `key` again: nothing of an earlier waiter's tag is left.
fn tag_is_free(server: &Server, con: &mut Connection, key: &str, id: &str) {
    let args = ["RLOCK.ACQUIRE", key, "w", "60000", "WAIT", "0", "REQUEST", id];
    let again = queue_str(server, con, &args);
    let waiters = run_str(con, &["RLOCK.WAITERS", key]).expect("WAITERS");
    assert!(format!("{waiters:?}").contains(id), "{waiters:?}");
    assert_eq!(run_str(con, &["RLOCK.CANCEL", key, id]), Ok(Value::Int(1)), "cancel by id");
    assert!(matches!(again.reply(LIMIT).0, Ok(Value::Int(_))), "answered as a timeout");
}

/// A connection of `server` authenticated as `user` (made `nopass`).
fn conn_as(server: &Server, user: &str) -> Connection {
    let mut con = server.conn();
    con.set_read_timeout(Some(Duration::from_secs(60))).expect("timeout");
    cmd(&mut con, &["AUTH", user, "any"]);
    con
}

#[test]
fn a_wait_after_auth_to_another_user_is_granted_as_that_user() {
    let server = Server::start();
    let mut admin = server.conn();
    for user in ["u1", "u2"] {
        cmd(&mut admin, &["ACL", "SETUSER", user, "on", "nopass", "+@all", "~*", "&*"]);
    }
    cmd(&mut admin, &["RWLOCK.ACQUIRE", "rw", "W", "WRITE", "60000"]);
    // One connection: a wait as u1 (it times out), AUTH u2, a wait as u2 (it stays queued).
    let mut con = conn_as(&server, "u1");
    let (tx, rx) = std::sync::mpsc::channel();
    let waiter = std::thread::spawn(move || {
        let read = ["RWLOCK.ACQUIRE", "rw", "A", "READ", "60000", "WAIT"];
        let first = run_str(&mut con, &[&read[..], &["30"]].concat());
        tx.send(first).expect("send");
        cmd(&mut con, &["AUTH", "u2", "any"]);
        run_str(&mut con, &[&read[..], &["0"]].concat())
    });
    assert!(matches!(rx.recv_timeout(LIMIT).expect("first"), Ok(Value::Int(_))));
    wait_blocked(&mut admin, 1);
    // u2 may no longer write the read hold key its grant writes; u1 still may.
    cmd(&mut admin, &["ACL", "SETUSER", "u2", "resetkeys", "~rw"]);
    cmd(&mut admin, &["RWLOCK.RELEASE", "rw", "W", "WRITE"]);
    let reply = waiter.join().expect("waiter");
    let e = reply.expect_err("checked as u2, the user it waited as");
    assert!(e.starts_with("NOPERM"), "{e}");
    let fields: Vec<String> = redis::cmd("HKEYS").arg("rw").query(&mut admin).expect("HKEYS");
    assert!(fields.is_empty(), "nothing granted to A: {fields:?}");
}

#[test]
fn a_waiter_whose_user_is_deleted_leaves_and_the_next_one_is_served() {
    let server = Server::start();
    let mut admin = server.conn();
    cmd(&mut admin, &["ACL", "SETUSER", "u", "on", "nopass", "+@all", "~*", "&*"]);
    cmd(&mut admin, &["RLOCK.ACQUIRE", "k", "H", "60000"]);
    let mut u = conn_as(&server, "u");
    let u_id: i64 = redis::cmd("CLIENT").arg("ID").query(&mut u).expect("id");
    let u_wait = std::thread::spawn(move || {
        run_str(&mut u, &["RLOCK.ACQUIRE", "k", "U", "60000", "WAIT", "0", "REQUEST", "ru"])
    });
    wait_blocked(&mut admin, 1);
    let next = queue_str(&server, &mut admin, &["RLOCK.ACQUIRE", "k", "V", "60000", "WAIT", "0"]);
    cmd(&mut admin, &["ACL", "DELUSER", "u"]);
    assert!(u_wait.join().expect("u").is_err(), "u's connection is closed");
    poll("u's waiter left", LIMIT, || (blocked_clients(&mut admin) == 1).then_some(()));
    let list = format!("{:?}", run_str(&mut admin, &["RLOCK.WAITERS", "k"]));
    assert!(!list.contains("\"U\"") && !list.contains("ru"), "{list}");
    let clients: String = redis::cmd("CLIENT").arg("LIST").query(&mut admin).expect("LIST");
    assert!(!clients.contains(&format!("id={u_id} ")), "{clients}");
    cmd(&mut admin, &["RLOCK.RELEASE", "k", "H"]);
    assert_eq!(next.reply(LIMIT).0, Ok(Value::Nil), "the next waiter is served");
    let fields: Vec<String> = redis::cmd("HKEYS").arg("k").query(&mut admin).expect("HKEYS");
    assert_eq!(fields, ["V"]);
    // The same request id may wait again (its tag left with the deleted user's waiter).
    cmd(&mut admin, &["RLOCK.FORCERELEASE", "k"]);
    cmd(&mut admin, &["RLOCK.ACQUIRE", "k", "H", "60000"]);
    tag_is_free(&server, &mut admin, "k", "ru");
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

#[test]
fn a_user_limited_to_lock_keys_cannot_touch_counters_latches_or_the_channel() {
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
fn a_read_only_user_cannot_read_the_counter_through_info() {
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
