//! Issue 23, items D, E, J, K: the read-write lock under a hostile attack. A read waiter that
//! may not write its hold key is refused before it blocks (D); a hand-off checks what it writes
//! against the WAITER's ACL user, from a command or a timer, for every lock kind (E); a lock's
//! cost per command and per poll does not grow with its number of readers (J); a count in the
//! hash never sizes a loop or an allocation (K). Each test failed on the code before its fix.

use std::thread;
use std::time::{Duration, Instant};

use redis::{Connection, Value};
use rlock_tests_integration::{
    blocked_clients, cmd, digest, granted_token, hgetall, poll, run_str, wait_blocked, Pending,
    Server,
};

const LIMIT: Duration = Duration::from_secs(10);

fn exists(con: &mut Connection, key: &str) -> bool {
    redis::cmd("EXISTS").arg(key).query::<i64>(con).expect("EXISTS") == 1
}

/// A connection authenticated as `user` (created with `nopass`).
fn conn_as(server: &Server, user: &str) -> Connection {
    let mut con = server.conn();
    cmd(&mut con, &["AUTH", user, "any"]);
    con
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

// ---- D. a read waiter is checked before it blocks --------------------------------------------

#[test]
fn d_a_read_waiter_that_may_not_write_its_hold_key_is_refused_before_it_blocks() {
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
    // Refused at once, or (the defect) blocked: then the hand-off shows what it would write.
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

// ---- E. a hand-off checks as the waiter --------------------------------------------------------

/// A restricted user's release hands the lock to a waiter with full access: the waiter's user is
/// checked, not the releaser's (which got the waiter NOPERM and left the lock free).
#[test]
fn e_a_hand_off_checks_the_waiters_user_not_the_releasers() {
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
fn e_a_waiter_whose_user_lost_access_is_refused_by_a_release_and_the_next_granted() {
    waiter_who_lost_access(false);
}

#[test]
fn e_a_waiter_whose_user_lost_access_is_refused_by_the_lease_timer_and_the_next_granted() {
    waiter_who_lost_access(true);
}

/// The same rule for a reentrant lock's token counter.
#[test]
fn e_a_token_waiter_whose_user_lost_the_counter_is_refused_and_the_next_granted() {
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
fn e_a_leased_permit_waiter_whose_user_lost_the_zset_is_refused_and_the_next_granted() {
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

// ---- J. cost independent of the number of readers ---------------------------------------------

/// `n` readers on Redisson's layout, as its scripts write them: one field and one hold key each.
fn readers(con: &mut Connection, name: &str, n: usize) {
    let script = "for i = 1, tonumber(ARGV[1]) do \
                    redis.call('HSET', KEYS[1], 'r' .. i, 1) \
                    redis.call('SET', '{' .. KEYS[1] .. '}:r' .. i .. ':rwlock_timeout:1', 1, 'PX', 600000) \
                  end \
                  redis.call('HSET', KEYS[1], 'mode', 'read') \
                  return redis.call('PEXPIRE', KEYS[1], 600000)";
    cmd(con, &["EVAL", script, "1", name, &n.to_string()]);
}

fn usec_per_call(con: &mut Connection, command: &str) -> f64 {
    let info: String = redis::cmd("INFO").arg("commandstats").query(con).expect("INFO");
    let line = info
        .lines()
        .find(|l| l.starts_with(&format!("cmdstat_{command}:")))
        .unwrap_or_else(|| panic!("no stats for {command}: {info}"));
    let value = line.split(',').find_map(|kv| kv.strip_prefix("usec_per_call=")).expect("usec");
    value.parse().expect("a number")
}

fn cpu_seconds(con: &mut Connection) -> f64 {
    let info: String = redis::cmd("INFO").arg("cpu").query(con).expect("INFO cpu");
    ["used_cpu_sys:", "used_cpu_user:"]
        .iter()
        .map(|f| {
            let line = info.lines().find_map(|l| l.strip_prefix(f)).expect("cpu field");
            line.trim().parse::<f64>().expect("a number")
        })
        .sum()
}

/// The acquire's server cost (µs per call) on a lock with `n` readers and a waiting writer.
fn acquire_cost(server: &Server, con: &mut Connection, name: &str) -> f64 {
    cmd(con, &["CONFIG", "RESETSTAT"]);
    for i in 0..200 {
        // A re-entry (granted) and a newcomer (queued behind the writer: busy).
        cmd(con, &["RWLOCK.ACQUIRE", name, "r1", "READ", "60000"]);
        cmd(con, &["RWLOCK.ACQUIRE", name, &format!("new{i}"), "READ", "60000"]);
    }
    let _ = server;
    usec_per_call(con, "rwlock.acquire")
}

#[test]
fn j_a_lock_with_20000_readers_costs_what_one_with_10_costs() {
    let server = Server::start();
    let mut con = server.conn();
    readers(&mut con, "small", 10);
    readers(&mut con, "big", 20_000);
    let _small = Pending::start_str(
        &server,
        &["RWLOCK.ACQUIRE", "small", "w", "WRITE", "60000", "WAIT", "100000"],
    );
    let _big = Pending::start_str(
        &server,
        &["RWLOCK.ACQUIRE", "big", "w", "WRITE", "60000", "WAIT", "100000"],
    );
    wait_blocked(&mut con, 2);

    // The waiters' poll looks at both locks every 10 ms: over 2 s the server stays nearly idle
    // (it spent ~90 % of a core opening every hold key of `big` at each look).
    let (cpu, started) = (cpu_seconds(&mut con), Instant::now());
    thread::sleep(Duration::from_secs(2));
    let share = (cpu_seconds(&mut con) - cpu) / started.elapsed().as_secs_f64();
    eprintln!("waiting: {:.1} % of a core", share * 100.0);
    assert!(share < 0.25, "the server used {:.0} % of a core waiting", share * 100.0);

    let small = acquire_cost(&server, &mut con, "small");
    let big = acquire_cost(&server, &mut con, "big");
    eprintln!("acquire: {big:.2} µs with 20,000 readers, {small:.2} µs with 10");
    assert!(
        big < small * 5.0 + 20.0,
        "acquire: {big:.1} µs with 20,000 readers, {small:.1} µs with 10"
    );
}

// ---- K. counts in the hash bound nothing ---------------------------------------------------------

/// A read count written by a foreign `HSET` (9e18) hung the server in a release: now it is a
/// corrupt count, and nothing changes.
#[test]
fn k_a_huge_foreign_read_count_is_refused_by_a_release_not_looped_over() {
    let server = Server::start();
    let mut con = server.conn();
    con.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
    cmd(&mut con, &["HSET", "K", "mode", "read", "x", "9000000000000000000"]);
    let before = digest(&mut con);
    let err = run_str(&mut con, &["RWLOCK.RELEASE", "K", "x", "READ"]).unwrap_err();
    assert!(err.starts_with("ERR the lock hash holds a hold count"), "{err}");
    assert_eq!(digest(&mut con), before);
    // Another reader's release, and the INFO, see the same corrupt count.
    cmd(&mut con, &["HSET", "K", "y", "1"]);
    let err = run_str(&mut con, &["RWLOCK.RELEASE", "K", "y", "READ"]).unwrap_err();
    assert!(err.starts_with("ERR the lock hash holds a hold count"), "{err}");
    let err = run_str(&mut con, &["RWLOCK.INFO", "K"]).unwrap_err();
    assert!(err.starts_with("ERR the lock hash holds a hold count"), "{err}");
}

/// A read count above the documented maximum (1,000) is corrupt for a renewal (10^10 made
/// `RENEW` allocate one effect per hold until the OOM killer came).
#[test]
fn k_a_read_count_above_the_maximum_is_refused_by_a_renewal() {
    let server = Server::start();
    let mut con = server.conn();
    con.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
    for count in ["1001", "10000000000"] {
        cmd(&mut con, &["HSET", "K", "mode", "read", "x", count]);
        let before = digest(&mut con);
        let err = run_str(&mut con, &["RWLOCK.RENEW", "K", "x", "1000"]).unwrap_err();
        assert!(err.starts_with("ERR the lock hash holds a hold count"), "{count}: {err}");
        let err = run_str(&mut con, &["RWLOCK.ACQUIRE", "K", "x", "READ", "1000"]).unwrap_err();
        assert!(err.starts_with("ERR the lock hash holds a hold count"), "{count}: {err}");
        assert_eq!(digest(&mut con), before, "{count}");
    }
}

/// An owner re-enters the read lock at most 1,000 times; the next re-entry is refused with a
/// clear error and nothing changes.
#[test]
fn k_read_re_entry_stops_at_the_documented_maximum() {
    let server = Server::start();
    let mut con = server.conn();
    let mut pipe = redis::pipe();
    for _ in 0..1000 {
        pipe.cmd("RWLOCK.ACQUIRE").arg("K").arg("o").arg("READ").arg("60000");
    }
    let replies: Vec<Value> = pipe.query(&mut con).expect("pipeline");
    assert!(replies.iter().all(|r| *r == Value::Nil), "every re-entry up to 1,000 is granted");
    let before = digest(&mut con);
    let err = run_str(&mut con, &["RWLOCK.ACQUIRE", "K", "o", "READ", "60000"]).unwrap_err();
    assert!(err.starts_with("ERR read hold limit"), "{err}");
    let err = run_str(&mut con, &["RWLOCK.ACQUIRE", "K", "o", "READ", "60000", "WAIT", "100"]);
    assert!(err.unwrap_err().starts_with("ERR read hold limit"));
    assert_eq!(digest(&mut con), before);
    // Renewing and releasing all 1,000 holds works.
    assert_eq!(cmd(&mut con, &["RWLOCK.RENEW", "K", "o", "30000"]), Value::Int(1));
    for _ in 0..999 {
        assert_eq!(cmd(&mut con, &["RWLOCK.RELEASE", "K", "o", "READ"]), Value::Int(0));
    }
    assert_eq!(cmd(&mut con, &["RWLOCK.RELEASE", "K", "o", "READ"]), Value::Int(1));
    assert_eq!(cmd(&mut con, &["DBSIZE"]), Value::Int(0));
}
