//! A hostile look at issue 27's module work: session holds (`SESSION [LOCKDELAY ms]`), who
//! waits (`*.WAITERS`, the wait-time buckets) and deadlock detection. Each test named after a
//! defect failed on the code it was written against; the defect is named in its doc comment.
//! The others pin down behaviour the attack found sound.

use std::time::{Duration, Instant};

use redis::{Connection, Value};
use rlock_tests_integration::{
    client_id, cmd, hgetall, info_field, int, kill_client, poll, wait_blocked, Pending, Server,
};

const LIMIT: Duration = Duration::from_secs(20);

fn rlock_info(con: &mut Connection, field: &str) -> i64 {
    info_field(con, "rlock", field)
}

/// Defect: `INFO rlock`'s wait-time buckets (`rlock_wait_ms_*`) were not reset when the module
/// was loaded again (`MODULE UNLOAD` + `MODULE LOAD`, the library staying mapped), while every
/// other counter was: `rlock_waits:0` beside `rlock_wait_ms_count:1`, a histogram counting
/// waits that, by the other counters, never happened. A session binding present at the unload
/// refuses it (the hold would no longer end with its connection: lifecycle.rs); once the hold
/// is released the unload goes through and the new load starts with no binding.
#[test]
fn wait_time_buckets_start_from_zero_after_a_module_reload() {
    let server = Server::builder().config("enable-module-command", "yes").start();
    let mut con = server.conn();
    cmd(&mut con, &["RLOCK.ACQUIRE", "k", "h", "60000"]);
    let waiter = Pending::start_str(&server, &["RLOCK.ACQUIRE", "k", "w", "60000", "WAIT", "20"]);
    assert!(matches!(waiter.reply(LIMIT).0, Ok(Value::Int(_))), "timed out");
    assert_eq!(rlock_info(&mut con, "rlock_wait_ms_count"), 1);
    let mut session = server.conn();
    cmd(&mut session, &["RLOCK.ACQUIRE", "s", "o", "60000", "SESSION"]);
    assert_eq!(rlock_info(&mut con, "rlock_session_holds"), 1);
    poll("no module timer armed", LIMIT, || {
        (rlock_info(&mut con, "rlock_timers_armed") == 0).then_some(())
    });
    assert!(
        rlock_tests_integration::run_str(&mut con, &["MODULE", "UNLOAD", "rlock"]).is_err(),
        "a session hold is bound"
    );
    assert_eq!(cmd(&mut session, &["RLOCK.RELEASE", "s", "o"]), Value::Int(1));
    assert_eq!(cmd(&mut con, &["MODULE", "UNLOAD", "rlock"]), Value::Okay);
    let path = rlock_tests_integration::module_path();
    cmd(&mut con, &["MODULE", "LOAD", path.to_str().expect("path")]);
    assert_eq!(rlock_info(&mut con, "rlock_waits"), 0);
    for field in ["rlock_wait_ms_count", "rlock_wait_ms_sum", "rlock_wait_ms_le_inf"] {
        assert_eq!(rlock_info(&mut con, field), 0, "{field} after the reload");
    }
    assert_eq!(rlock_info(&mut con, "rlock_session_holds"), 0);
}

/// Polls `look` as fast as the server answers until it returns `done`; returns every value seen
/// and the longest time one look took (the server blocked meanwhile).
fn watch(
    con: &mut Connection,
    done: i64,
    mut look: impl FnMut(&mut Connection) -> i64,
) -> (Vec<i64>, Duration) {
    let start = Instant::now();
    let (mut seen, mut longest) = (Vec::new(), Duration::ZERO);
    loop {
        let asked = Instant::now();
        let value = look(con);
        longest = longest.max(asked.elapsed());
        seen.push(value);
        if value == done {
            return (seen, longest);
        }
        assert!(start.elapsed() < LIMIT, "not done after {LIMIT:?}: {:?}", seen.last());
    }
}

/// Defect: a connection closing with many session holds had all of them ended in one timer
/// tick, the server answering nobody meanwhile, and each leased permit was ended on its own
/// (a lease lookup, a `ZREM`, an `INCRBY`, a publish and a hand-off per permit: about 28 µs
/// each here): a client that took 100,000 leased permits with `SESSION` (ten acquires) and
/// then disconnected stalled the server for about 3 s. The ends are now applied a bounded
/// batch per timer tick (other clients are served between two), and the permits of one
/// semaphore are given back together.
#[test]
fn a_close_with_many_session_holds_never_stalls_the_server() {
    let server = Server::start();
    let mut admin = server.conn();
    admin.set_read_timeout(Some(LIMIT)).expect("timeout");
    let total: i64 = 100_000;
    cmd(&mut admin, &["RSEM.SETPERMITS", "s", &total.to_string()]);
    let mut holder = server.conn();
    holder.set_read_timeout(Some(LIMIT)).expect("timeout");
    let holder_id = client_id(&mut holder);
    for _ in 0..10 {
        let ids = cmd(&mut holder, &["RSEM.ACQUIRE", "s", "10000", "LEASE", "600000", "SESSION"]);
        assert!(matches!(ids, Value::Array(ref ids) if ids.len() == 10_000), "granted");
    }
    assert_eq!(rlock_info(&mut admin, "rlock_session_holds"), total);
    kill_client(&mut admin, holder_id);
    let (seen, longest) = watch(&mut admin, total, |con| int(&cmd(con, &["RSEM.AVAILABLE", "s"])));
    assert!(
        seen.iter().any(|&n| n > 0 && n < total),
        "the server answered while the ends were being applied: saw only {seen:?}"
    );
    assert!(longest < Duration::from_secs(1), "a look waited {longest:?}");
    assert_eq!(rlock_info(&mut admin, "rlock_session_ends"), total);
    assert_eq!(rlock_info(&mut admin, "rlock_session_holds"), 0);
    assert_eq!(cmd(&mut admin, &["EXISTS", "{s}:timeout"]), Value::Int(0));

    // Many reentrant locks on one connection: the same.
    let locks: i64 = 20_000;
    let mut holder = server.conn();
    holder.set_read_timeout(Some(LIMIT)).expect("timeout");
    let holder_id = client_id(&mut holder);
    let mut pipe = redis::pipe();
    for i in 0..locks {
        pipe.cmd("RLOCK.ACQUIRE").arg(format!("l{i}")).arg("o").arg(600_000).arg("SESSION");
    }
    pipe.query::<Vec<Value>>(&mut holder).expect("acquires");
    let keys = |con: &mut Connection| int(&cmd(con, &["DBSIZE"]));
    assert_eq!(keys(&mut admin), locks + 1);
    kill_client(&mut admin, holder_id);
    let (seen, longest) = watch(&mut admin, 1, keys);
    assert!(
        seen.iter().any(|&n| n > 1 && n < locks + 1),
        "the server answered while the ends were being applied: saw only {seen:?}"
    );
    assert!(longest < Duration::from_secs(1), "a look waited {longest:?}");
    assert_eq!(rlock_info(&mut admin, "rlock_session_ends"), total + locks);
    assert_eq!(rlock_info(&mut admin, "rlock_session_holds"), 0);
}

/// A lock, how to occupy it, how to wait for it (as `OWNER`), how to free it.
type Case<'a> = (&'a str, &'a [&'a str], &'a [&'a str], &'a [&'a str]);

/// A session waiter (with a lock-delay) whose connection closes after the hand-off granted it
/// but before its reply: the grant is rolled back (the next waiter is served at once, no
/// lock-delay: the hold never reached its client) and its binding goes with it; on each kind of
/// hold.
#[test]
fn a_session_waiter_gone_between_its_grant_and_its_reply_is_rolled_back_and_unbound() {
    let server = Server::start();
    let mut admin = server.conn();
    cmd(&mut admin, &["RSEM.SETPERMITS", "s", "1"]);
    let kinds: [Case; 4] = [
        (
            "l",
            &["RLOCK.ACQUIRE", "l", "h", "60000"],
            &["RLOCK.ACQUIRE", "l", "OWNER", "60000"],
            &["RLOCK.RELEASE", "l", "h"],
        ),
        (
            "r",
            &["RWLOCK.ACQUIRE", "r", "h", "WRITE", "60000"],
            &["RWLOCK.ACQUIRE", "r", "OWNER", "READ", "60000"],
            &["RWLOCK.RELEASE", "r", "h", "WRITE"],
        ),
        (
            "w",
            &["RWLOCK.ACQUIRE", "w", "h", "READ", "60000"],
            &["RWLOCK.ACQUIRE", "w", "OWNER", "WRITE", "60000"],
            &["RWLOCK.RELEASE", "w", "h", "READ"],
        ),
        (
            "s",
            &["RSEM.ACQUIRE", "s", "1"],
            &["RSEM.ACQUIRE", "s", "1", "LEASE", "60000"],
            &["RSEM.RELEASE", "s", "1"],
        ),
    ];
    for (i, (key, occupy, acquire, vacate)) in kinds.iter().enumerate() {
        cmd(&mut admin, occupy);
        let with = |owner: &str, session: bool| -> Vec<String> {
            let mut args: Vec<String> = acquire.iter().map(|a| a.replace("OWNER", owner)).collect();
            args.extend(["WAIT", "0"].map(String::from));
            if session {
                args.extend(["SESSION", "LOCKDELAY", "60000"].map(String::from));
            }
            args
        };
        let first = with("first", true);
        let first: Vec<&str> = first.iter().map(String::as_str).collect();
        let first = Pending::start_str(&server, &first);
        wait_blocked(&mut admin, 1);
        let second = with("second", false);
        let second: Vec<&str> = second.iter().map(String::as_str).collect();
        let second = Pending::start_str(&server, &second);
        wait_blocked(&mut admin, 2);
        // The release hands the lock to the first waiter, which is gone before its reply.
        cmd(&mut admin, &["MULTI"]);
        cmd(&mut admin, vacate);
        cmd(&mut admin, &["CLIENT", "KILL", "ID", &first.client_id().to_string()]);
        assert!(matches!(cmd(&mut admin, &["EXEC"]), Value::Array(_)));
        let (reply, _) = second.reply(LIMIT);
        assert!(reply.is_ok(), "{key}: the second waiter is served: {reply:?}");
        let _ = first.reply(LIMIT);
        assert_eq!(rlock_info(&mut admin, "rlock_grants_rolled_back"), i as i64 + 1, "{key}");
        assert_eq!(rlock_info(&mut admin, "rlock_session_holds"), 0, "{key}: binding gone");
        assert_eq!(rlock_info(&mut admin, "rlock_session_ends"), 0, "{key}: nothing ended");
        assert_eq!(rlock_info(&mut admin, "rlock_lock_delays"), 0, "{key}: no lock-delay");
        if *key != "s" {
            let holders: Vec<Vec<u8>> =
                hgetall(&mut admin, key.as_bytes()).into_iter().map(|(f, _)| f).collect();
            assert!(holders.iter().any(|f| f.starts_with(b"second")), "{key}: {holders:?}");
            assert!(!holders.iter().any(|f| f.starts_with(b"first")), "{key}: {holders:?}");
        }
    }
}
