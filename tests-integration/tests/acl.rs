//! ACL users limited to key patterns and channels: every key and channel beyond argv is checked
//! for the right user (the caller, or the waiter its grant is for).

use std::thread;
use std::time::Duration;

use redis::{Connection, Value};

use rlock_tests_integration::{
    blocked_clients, cmd, conn_as, digest, exists, granted_token, hgetall, poll, queue_str,
    rsem_info, run_str, tag_is_free, wait_blocked, Pending, Server,
};

const LIMIT: Duration = Duration::from_secs(20);

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
    tag_is_free(&server, &mut admin, "k", "ru", LIMIT);
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

/// `args` sent as `user` on its own connection and thread (a blocking command).
fn start_as(
    server: &Server,
    user: &str,
    args: &[&str],
) -> thread::JoinHandle<Result<Value, String>> {
    let mut con = conn_as(server, user);
    con.set_read_timeout(Some(Duration::from_secs(60))).expect("timeout");
    let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
    thread::spawn(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        run_str(&mut con, &args)
    })
}

fn join(handle: thread::JoinHandle<Result<Value, String>>) -> Result<Value, String> {
    poll("the command's reply", LIMIT, || handle.is_finished().then_some(()));
    handle.join().expect("command thread")
}

/// `ACL LOG` entries as (username, object).
fn acl_log(con: &mut Connection) -> Vec<(String, String)> {
    let entries: Vec<Value> = redis::cmd("ACL").arg("LOG").query(con).expect("ACL LOG");
    let text = |kv: &[Value], name: &str| {
        let at = kv.iter().position(|v| *v == Value::BulkString(name.as_bytes().to_vec()))?;
        redis::from_redis_value::<String>(kv[at + 1].clone()).ok()
    };
    entries
        .into_iter()
        .filter_map(|e| {
            let Value::Array(kv) = e else { return None };
            Some((text(&kv, "username")?, text(&kv, "object")?))
        })
        .collect()
}

// ---- A read waiter is checked before it blocks --------------------------------------------

#[test]
fn a_read_waiter_that_may_not_write_its_hold_key_is_refused_before_it_blocks() {
    let server = Server::start();
    let mut admin = server.conn();
    cmd(&mut admin, &["ACL", "SETUSER", "lim", "on", "nopass", "~K", "~K2", "&*", "+@all"]);
    let mut lim = conn_as(&server, "lim");
    // A free read lock is refused: its grant would write {K}:o:rwlock_timeout:1.
    let err = run_str(&mut lim, &["RWLOCK.ACQUIRE", "K", "o", "READ", "60000"]).unwrap_err();
    assert!(err.starts_with("NOPERM"), "{err}");

    cmd(&mut admin, &["RWLOCK.ACQUIRE", "K2", "w", "WRITE", "60000"]);
    let before = digest(&mut admin);
    let waiter =
        start_as(&server, "lim", &["RWLOCK.ACQUIRE", "K2", "o", "READ", "60000", "WAIT", "5000"]);
    // Refused at once, or (wrongly) blocked: then the hand-off shows what it would write.
    poll("the waiter to block or reply", LIMIT, || {
        (waiter.is_finished() || blocked_clients(&mut admin) == 1).then_some(())
    });
    let blocked = !waiter.is_finished();
    if blocked {
        assert_eq!(cmd(&mut admin, &["RWLOCK.RELEASE", "K2", "w", "WRITE"]), Value::Int(1));
    }
    let reply = join(waiter);
    assert!(!blocked, "blocked although its grant may not be written; then replied {reply:?}");
    let err = reply.unwrap_err();
    assert!(err.starts_with("NOPERM"), "{err}");
    assert!(!exists(&mut admin, "{K2}:o:rwlock_timeout:1"));
    assert_eq!(digest(&mut admin), before, "nothing changes on NOPERM");
}

// ---- A hand-off checks as the waiter --------------------------------------------------------

/// A restricted user's release hands the lock to a waiter with full access: the waiter's user is
/// checked, not the releaser's (which got the waiter NOPERM and left the lock free).
#[test]
fn a_hand_off_checks_the_waiters_user_not_the_releasers() {
    let server = Server::start();
    let mut admin = server.conn();
    cmd(&mut admin, &["ACL", "SETUSER", "lim", "on", "nopass", "~K", "&*", "+@all"]);
    let mut lim = conn_as(&server, "lim");
    assert_eq!(cmd(&mut lim, &["RWLOCK.ACQUIRE", "K", "w", "WRITE", "60000"]), Value::Nil);
    let waiter = Pending::start_str(
        &server,
        &["RWLOCK.ACQUIRE", "K", "r", "READ", "60000", "WAIT", "10000"],
    );
    wait_blocked(&mut admin, 1);
    cmd(&mut admin, &["ACL", "LOG", "RESET"]);
    assert_eq!(cmd(&mut lim, &["RWLOCK.RELEASE", "K", "w", "WRITE"]), Value::Int(1));
    assert_eq!(waiter.reply(LIMIT).0, Ok(Value::Nil));
    assert!(exists(&mut admin, "{K}:r:rwlock_timeout:1"));
    let fields = hgetall(&mut admin, b"K");
    assert!(fields.contains(&(b"r".to_vec(), b"1".to_vec())), "{fields:?}");
    assert_eq!(acl_log(&mut admin), vec![], "nobody was refused");
}

/// Two readers wait behind a writer; the first one's user loses access to `{K}:*` while it
/// waits. The hand-off (from `release`, or from the timer at the writer's lease end) refuses it
/// with NOPERM, logged against ITS user, and grants the next one: the lock is not left free.
fn waiter_who_lost_access(by_timer: bool) {
    let server = Server::start();
    let mut admin = server.conn();
    cmd(&mut admin, &["ACL", "SETUSER", "lim", "on", "nopass", "~K", "~{K}:*", "&*", "+@all"]);
    let lease = if by_timer { "1000" } else { "60000" };
    assert_eq!(cmd(&mut admin, &["RWLOCK.ACQUIRE", "K", "w", "WRITE", lease]), Value::Nil);
    let first =
        start_as(&server, "lim", &["RWLOCK.ACQUIRE", "K", "a", "READ", "60000", "WAIT", "10000"]);
    wait_blocked(&mut admin, 1);
    let second = Pending::start_str(
        &server,
        &["RWLOCK.ACQUIRE", "K", "b", "READ", "60000", "WAIT", "10000"],
    );
    wait_blocked(&mut admin, 2);
    cmd(&mut admin, &["ACL", "SETUSER", "lim", "resetkeys", "~K"]);
    cmd(&mut admin, &["ACL", "LOG", "RESET"]);
    if !by_timer {
        assert_eq!(cmd(&mut admin, &["RWLOCK.RELEASE", "K", "w", "WRITE"]), Value::Int(1));
    }
    let err = join(first).unwrap_err();
    assert!(err.starts_with("NOPERM"), "{err}");
    assert_eq!(second.reply(LIMIT).0, Ok(Value::Nil), "the next waiter is granted");
    assert!(!exists(&mut admin, "{K}:a:rwlock_timeout:1"));
    assert!(exists(&mut admin, "{K}:b:rwlock_timeout:1"));
    let log = acl_log(&mut admin);
    assert_eq!(log, vec![("lim".to_owned(), "{K}:a:rwlock_timeout:1".to_owned())]);
}

#[test]
fn a_waiter_whose_user_lost_access_is_refused_by_a_release_and_the_next_granted() {
    waiter_who_lost_access(false);
}

#[test]
fn a_waiter_whose_user_lost_access_is_refused_by_the_lease_timer_and_the_next_granted() {
    waiter_who_lost_access(true);
}

/// The same rule for a reentrant lock's token counter.
#[test]
fn a_token_waiter_whose_user_lost_the_counter_is_refused_and_the_next_granted() {
    let server = Server::start();
    let mut admin = server.conn();
    let setuser = ["ACL", "SETUSER", "tok", "on", "nopass", "~L", "~redisson_lock_token:*", "&*"];
    cmd(&mut admin, &[&setuser[..], &["+@all"]].concat());
    assert_eq!(cmd(&mut admin, &["RLOCK.ACQUIRE", "L", "h", "60000"]), Value::Nil);
    let first =
        start_as(&server, "tok", &["RLOCK.ACQUIRE", "L", "a", "60000", "WAIT", "10000", "TOKEN"]);
    wait_blocked(&mut admin, 1);
    let second = Pending::start_str(
        &server,
        &["RLOCK.ACQUIRE", "L", "b", "60000", "WAIT", "10000", "TOKEN"],
    );
    wait_blocked(&mut admin, 2);
    cmd(&mut admin, &["ACL", "SETUSER", "tok", "resetkeys", "~L"]);
    cmd(&mut admin, &["RLOCK.RELEASE", "L", "h"]);
    let err = join(first).unwrap_err();
    assert!(err.starts_with("NOPERM"), "{err}");
    let (reply, _) = second.reply(LIMIT);
    assert_eq!(granted_token(&reply.expect("granted")), 1);
    let log = acl_log(&mut admin);
    assert_eq!(log, vec![("tok".to_owned(), "redisson_lock_token:{L}".to_owned())]);
}

/// The same rule for a semaphore's lease zset.
#[test]
fn a_leased_permit_waiter_whose_user_lost_the_zset_is_refused_and_the_next_granted() {
    let server = Server::start();
    let mut admin = server.conn();
    cmd(&mut admin, &["ACL", "SETUSER", "sem", "on", "nopass", "~S", "~{S}:*", "&*", "+@all"]);
    assert_eq!(cmd(&mut admin, &["RSEM.SETPERMITS", "S", "1"]), Value::Int(1));
    assert_eq!(cmd(&mut admin, &["RSEM.ACQUIRE", "S", "1"]), Value::Int(1));
    let first =
        start_as(&server, "sem", &["RSEM.ACQUIRE", "S", "1", "LEASE", "60000", "WAIT", "10000"]);
    wait_blocked(&mut admin, 1);
    let second =
        Pending::start_str(&server, &["RSEM.ACQUIRE", "S", "1", "LEASE", "60000", "WAIT", "10000"]);
    wait_blocked(&mut admin, 2);
    cmd(&mut admin, &["ACL", "SETUSER", "sem", "resetkeys", "~S"]);
    cmd(&mut admin, &["RSEM.RELEASE", "S", "1"]);
    let err = join(first).unwrap_err();
    assert!(err.starts_with("NOPERM"), "{err}");
    let (reply, _) = second.reply(LIMIT);
    assert!(matches!(reply, Ok(Value::Array(ref ids)) if ids.len() == 1), "{reply:?}");
    let log = acl_log(&mut admin);
    assert_eq!(log, vec![("sem".to_owned(), "{S}:timeout".to_owned())]);
}

fn zcard(con: &mut Connection, key: &str) -> i64 {
    redis::cmd("ZCARD").arg(key).query(con).expect("ZCARD")
}

// ---- INFO and AVAILABLE read the lease zset: the caller must be allowed to ----------------------

#[test]
fn info_and_available_check_read_access_to_the_lease_zset() {
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
    let fields = rsem_info(&mut lim, "sem:s").expect("a semaphore");
    assert_eq!(fields["leased"], 2, "{fields:?}");
    assert_eq!(rsem_info(&mut lim, "sem:plain").expect("a semaphore")["leased"], 0);
}

// ---- a reclaim a client command triggers publishes: check the channel ---------------------------

#[test]
fn a_reclaim_triggered_by_a_user_who_may_not_publish_is_refused() {
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
