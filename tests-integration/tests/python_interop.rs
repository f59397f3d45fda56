//! The Python package (`python/src/redis_rlock`, run by `python3`) against the Rust crate
//! (`rlock-client`), redis-cli and raw commands, on one server with the module, for every kind:
//! a hold taken by the package is seen held (Redisson's layout, raw refusals, the crate's
//! queries) and waited on by the others, whose waiters are served FIFO when the package releases;
//! and a hold taken by the crate is seen by the package (`locked()`, a refused try) whose waiter
//! is served when the crate releases.
//!
//! Each Python side is a small inline script driven over its stdin/stdout: it prints what it
//! sees and waits for `go` before each release. Every read of its output is bounded. When
//! `python3` or redis-py is missing the tests say so and pass, unless `RLOCK_REQUIRE_PYTHON` is
//! set (`make test` sets it, after installing redis-py), when they fail instead.

use std::time::Duration;

use redis::Value;
use rlock_client::Error;
use rlock_tests_integration::lock_client::client;
use rlock_tests_integration::python::{python_ready, redis_cli, Py, STEP};
use rlock_tests_integration::{cmd, hgetall, wait_blocked, Pending, Server};

const LEASE: Option<Duration> = Some(Duration::from_secs(30));

fn pairs(pairs: &[(&str, &str)]) -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut v: Vec<_> =
        pairs.iter().map(|(f, x)| (f.as_bytes().to_vec(), x.as_bytes().to_vec())).collect();
    v.sort();
    v
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A spawned crate acquire, awaited with a bound.
async fn served<T>(task: tokio::task::JoinHandle<rlock_client::Result<T>>) -> T {
    tokio::time::timeout(STEP, task)
        .await
        .expect("the waiter was not served")
        .expect("task")
        .expect("acquire")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_held_by_either_language_is_seen_and_its_waiters_are_served_fifo() {
    if !python_ready() {
        return;
    }
    let server = Server::start();
    let mut con = server.conn();
    let client = client(&server).await;

    // The package holds: redis-cli sees Redisson's hash, raw and crate acquires are refused.
    let mut py = Py::start(
        &server,
        r#"
lock = rl.Lock(r, "pl", lease=30)
assert lock.acquire()
say("held", lock.hold.owner.decode())
go()
lock.release()
say("released")
"#,
    );
    let owner = py.line("held").remove(0);
    assert_eq!(redis_cli(&server, &["HGETALL", "pl"]), [owner.as_str(), "1"]);
    assert!(
        matches!(cmd(&mut con, &["RLOCK.ACQUIRE", "pl", "cli", "30000"]), Value::Int(ms) if ms > 0)
    );
    let lock = client.lock("pl");
    assert!(lock.is_locked().await.expect("is_locked"));
    let refused = lock.try_acquire(Duration::from_millis(50), LEASE).await;
    assert!(matches!(refused, Err(Error::TimedOut)), "{refused:?}");
    // A crate waiter, then a raw one: the package's release serves the crate's, alone.
    let waiter = tokio::spawn(async move { lock.acquire(LEASE).await });
    wait_blocked(&mut con, 1);
    let raw =
        Pending::start_str(&server, &["RLOCK.ACQUIRE", "pl", "cli", "30000", "WAIT", "20000"]);
    wait_blocked(&mut con, 2);
    py.go();
    py.line("released");
    let guard = served(waiter).await;
    assert_eq!(hgetall(&mut con, b"pl"), pairs(&[(guard.owner(), "1")]));
    wait_blocked(&mut con, 1);
    assert!(!raw.replied());
    guard.release().await.expect("release");
    assert_eq!(raw.reply(STEP).0, Ok(Value::Nil));
    assert_eq!(hgetall(&mut con, b"pl"), pairs(&[("cli", "1")]));
    py.finish();

    // The crate holds: the package sees it locked, is refused, and its waiter (then a raw one)
    // is served when the crate's guard is released.
    let guard = client.lock("rl").acquire(LEASE).await.expect("acquire");
    let mut py = Py::start(
        &server,
        r#"
lock = rl.Lock(r, "rl")
say("seen", lock.locked(), lock.acquire(timeout=0.05))
assert lock.acquire(timeout=20)
say("acquired", lock.hold.owner.decode())
go()
lock.release()
say("released")
"#,
    );
    assert_eq!(py.line("seen"), ["True", "False"]);
    wait_blocked(&mut con, 1);
    let raw =
        Pending::start_str(&server, &["RLOCK.ACQUIRE", "rl", "cli", "30000", "WAIT", "20000"]);
    wait_blocked(&mut con, 2);
    guard.release().await.expect("release");
    let owner = py.line("acquired").remove(0);
    assert_eq!(hgetall(&mut con, b"rl"), pairs(&[(&owner, "1")]));
    assert!(!raw.replied());
    py.go();
    py.line("released");
    assert_eq!(raw.reply(STEP).0, Ok(Value::Nil));
    py.finish();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rwlock_read_hold_of_either_language_is_shared_and_excludes_writers() {
    if !python_ready() {
        return;
    }
    let server = Server::start();
    let mut con = server.conn();
    let client = client(&server).await;

    // The package reads: Redisson's layout, a crate reader shares it, writers wait.
    let mut py = Py::start(
        &server,
        r#"
rw = rl.RWLock(r, "prw", lease=30)
assert rw.read.acquire()
say("held", rw.read.hold.owner.decode())
go()
rw.read.release()
say("released")
"#,
    );
    let owner = py.line("held").remove(0);
    assert_eq!(hgetall(&mut con, b"prw"), pairs(&[("mode", "read"), (&owner, "1")]));
    let lease_key = format!("{{prw}}:{owner}:rwlock_timeout:1");
    assert_eq!(redis_cli(&server, &["GET", &lease_key]), ["1"]);
    let writing = ["RWLOCK.ACQUIRE", "prw", "cli", "WRITE", "30000"];
    assert!(matches!(cmd(&mut con, &writing), Value::Int(ms) if ms > 0));
    let rw = client.rw_lock("prw");
    let shared = rw.read().try_acquire(Duration::from_millis(50), LEASE).await.expect("shared");
    shared.release().await.expect("release");
    let refused = rw.write().try_acquire(Duration::from_millis(50), LEASE).await;
    assert!(matches!(refused, Err(Error::TimedOut)), "{refused:?}");
    let write = rw.write().clone();
    let waiter = tokio::spawn(async move { write.acquire(LEASE).await });
    wait_blocked(&mut con, 1);
    py.go();
    py.line("released");
    let guard = served(waiter).await;
    let writer = format!("{}:write", guard.owner());
    assert_eq!(hgetall(&mut con, b"prw"), pairs(&[("mode", "write"), (&writer, "1")]));
    guard.release().await.expect("release");
    py.finish();

    // The crate reads: the package sees it, shares it, and its writer waits for the release.
    let reading = client.rw_lock("rrw").read().acquire(LEASE).await.expect("read");
    let mut py = Py::start(
        &server,
        r#"
rw = rl.RWLock(r, "rrw")
say("seen", rw.read.locked(), rw.write.locked(), rw.write.acquire(timeout=0.05))
assert rw.read.acquire(timeout=5)
rw.read.release()
say("shared")
assert rw.write.acquire(timeout=20)
say("acquired", rw.write.hold.owner.decode())
rw.write.release()
"#,
    );
    assert_eq!(py.line("seen"), ["True", "True", "False"]);
    py.line("shared");
    wait_blocked(&mut con, 1);
    reading.release().await.expect("release");
    py.line("acquired");
    py.finish();
    assert!(hgetall(&mut con, b"rrw").is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rwlock_write_hold_of_either_language_excludes_all_and_hands_over_fifo() {
    if !python_ready() {
        return;
    }
    let server = Server::start();
    let mut con = server.conn();
    let client = client(&server).await;

    // The package writes: both sides refused; a crate writer then a raw reader queue, and are
    // served in that order.
    let mut py = Py::start(
        &server,
        r#"
rw = rl.RWLock(r, "pw", lease=30)
assert rw.write.acquire()
say("held", rw.write.hold.owner.decode())
go()
rw.write.release()
say("released")
"#,
    );
    let owner = py.line("held").remove(0);
    let field = format!("{owner}:write");
    assert_eq!(redis_cli(&server, &["HGET", "pw", "mode"]), ["write"]);
    assert_eq!(hgetall(&mut con, b"pw"), pairs(&[("mode", "write"), (&field, "1")]));
    assert!(matches!(
        cmd(&mut con, &["RWLOCK.ACQUIRE", "pw", "cli", "READ", "30000"]),
        Value::Int(_)
    ));
    let rw = client.rw_lock("pw");
    for side in [rw.read(), rw.write()] {
        let refused = side.try_acquire(Duration::from_millis(50), LEASE).await;
        assert!(matches!(refused, Err(Error::TimedOut)), "{refused:?}");
    }
    let write = rw.write().clone();
    let waiter = tokio::spawn(async move { write.acquire(LEASE).await });
    wait_blocked(&mut con, 1);
    let raw = Pending::start_str(
        &server,
        &["RWLOCK.ACQUIRE", "pw", "cli", "READ", "30000", "WAIT", "20000"],
    );
    wait_blocked(&mut con, 2);
    py.go();
    py.line("released");
    let guard = served(waiter).await;
    wait_blocked(&mut con, 1);
    assert!(!raw.replied());
    guard.release().await.expect("release");
    assert_eq!(raw.reply(STEP).0, Ok(Value::Nil));
    assert_eq!(hgetall(&mut con, b"pw"), pairs(&[("mode", "read"), ("cli", "1")]));
    py.finish();

    // The crate writes: the package is refused either side, and its reader is served on release.
    let writing = client.rw_lock("rw").write().acquire(LEASE).await.expect("write");
    let mut py = Py::start(
        &server,
        r#"
rw = rl.RWLock(r, "rw")
say("seen", rw.read.locked(), rw.read.acquire(timeout=0.05), rw.write.acquire(timeout=0.05))
assert rw.read.acquire(timeout=20)
say("acquired", rw.read.hold.owner.decode())
go()
rw.read.release()
"#,
    );
    assert_eq!(py.line("seen"), ["True", "False", "False"]);
    wait_blocked(&mut con, 1);
    writing.release().await.expect("release");
    let owner = py.line("acquired").remove(0);
    assert_eq!(hgetall(&mut con, b"rw"), pairs(&[("mode", "read"), (&owner, "1")]));
    py.go();
    py.finish();
    assert!(hgetall(&mut con, b"rw").is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counted_permits_taken_by_either_language_are_waited_for_and_handed_over_fifo() {
    if !python_ready() {
        return;
    }
    let server = Server::start();
    let mut con = server.conn();
    let client = client(&server).await;

    // The package takes both permits: the count reads 0 everywhere; a crate waiter then a raw
    // one are served one release each, in order.
    let mut py = Py::start(
        &server,
        r#"
sem = rl.Semaphore(r, "ps")
assert sem.try_set_permits(2)
assert sem.acquire(2)
say("held", sem.available())
go()
sem.release(1)
say("released")
go()
sem.release(1)
say("released")
"#,
    );
    assert_eq!(py.line("held"), ["0"]);
    assert_eq!(redis_cli(&server, &["GET", "ps"]), ["0"]);
    assert_eq!(cmd(&mut con, &["RSEM.ACQUIRE", "ps", "1"]), Value::Int(0));
    let sem = client.semaphore("ps");
    assert_eq!(sem.available().await.expect("available"), 0);
    assert!(!sem.try_acquire(1, Duration::from_millis(50)).await.expect("try"));
    let waiter = tokio::spawn(async move { sem.acquire(1).await });
    wait_blocked(&mut con, 1);
    let raw = Pending::start_str(&server, &["RSEM.ACQUIRE", "ps", "1", "WAIT", "20000"]);
    wait_blocked(&mut con, 2);
    py.go();
    py.line("released");
    served(waiter).await;
    wait_blocked(&mut con, 1);
    assert!(!raw.replied());
    py.go();
    py.line("released");
    assert_eq!(raw.reply(STEP).0, Ok(Value::Int(1)));
    assert_eq!(redis_cli(&server, &["GET", "ps"]), ["0"]);
    py.finish();

    // The crate takes the only permit: the package sees none, and its waiter is served when
    // the crate gives it back; its guard gives back exactly that permit.
    let sem = client.semaphore("rs");
    assert!(sem.try_set_permits(1).await.expect("set"));
    sem.acquire(1).await.expect("acquire");
    let mut py = Py::start(
        &server,
        r#"
sem = rl.Semaphore(r, "rs")
say("seen", sem.available(), sem.acquire(1, timeout=0.05))
hold = sem.permits(1, timeout=20)
assert hold is not None
say("acquired", sem.available())
go()
hold.release()
say("released", sem.available())
"#,
    );
    assert_eq!(py.line("seen"), ["0", "False"]);
    wait_blocked(&mut con, 1);
    assert_eq!(sem.release(1).await.expect("release"), 0);
    assert_eq!(py.line("acquired"), ["0"]);
    py.go();
    assert_eq!(py.line("released"), ["1"]);
    py.finish();
    assert_eq!(sem.available().await.expect("available"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leased_permits_of_either_language_are_in_redissons_zset_and_handed_over_fifo() {
    if !python_ready() {
        return;
    }
    let server = Server::start();
    let mut con = server.conn();
    let client = client(&server).await;

    // The package leases the only permit: its id is the zset's member; a crate waiter then a
    // raw one are served in order.
    let mut py = Py::start(
        &server,
        r#"
sem = rl.LeasedSemaphore(r, "pls", lease=30)
assert sem.try_set_permits(1)
hold = sem.acquire(1)
assert hold is not None
say("held", hold.ids[0].hex())
go()
hold.release()
say("released")
"#,
    );
    let id = py.line("held").remove(0);
    let ids: Vec<Vec<u8>> =
        redis::cmd("ZRANGE").arg("{pls}:timeout").arg(0).arg(-1).query(&mut con).expect("ZRANGE");
    assert_eq!(ids.iter().map(|i| hex(i)).collect::<Vec<_>>(), [id]);
    assert_eq!(redis_cli(&server, &["GET", "pls"]), ["0"]);
    assert_eq!(cmd(&mut con, &["RSEM.ACQUIRE", "pls", "1", "LEASE", "30000"]), Value::Nil);
    let sem = client.leased_semaphore("pls");
    assert_eq!(sem.available().await.expect("available"), 0);
    let refused = sem.try_acquire(1, Duration::from_millis(50), LEASE).await;
    assert!(matches!(refused, Err(Error::TimedOut)), "{refused:?}");
    let waiter = tokio::spawn(async move { sem.acquire(1, LEASE).await });
    wait_blocked(&mut con, 1);
    let raw = Pending::start_str(
        &server,
        &["RSEM.ACQUIRE", "pls", "1", "LEASE", "30000", "WAIT", "20000"],
    );
    wait_blocked(&mut con, 2);
    py.go();
    py.line("released");
    let guard = served(waiter).await;
    let ids: Vec<Vec<u8>> =
        redis::cmd("ZRANGE").arg("{pls}:timeout").arg(0).arg(-1).query(&mut con).expect("ZRANGE");
    assert_eq!(ids, guard.ids());
    assert!(!raw.replied());
    guard.release().await.expect("release");
    match raw.reply(STEP).0 {
        Ok(Value::Array(ids)) => assert_eq!(ids.len(), 1),
        other => panic!("the raw waiter: {other:?}"),
    }
    py.finish();

    // The crate leases the only permit (watchdog): the package sees none, and its waiter is
    // served on the crate's release.
    let sem = client.leased_semaphore("rls");
    assert!(sem.try_set_permits(1).await.expect("set"));
    let guard = sem.acquire(1, None).await.expect("acquire");
    let mut py = Py::start(
        &server,
        r#"
sem = rl.LeasedSemaphore(r, "rls")
say("seen", sem.available(), sem.acquire(1, timeout=0.05))
hold = sem.acquire(1, timeout=20, lease=30)
assert hold is not None
say("acquired", hold.ids[0].hex())
go()
hold.release()
say("released", sem.available())
"#,
    );
    assert_eq!(py.line("seen"), ["0", "None"]);
    wait_blocked(&mut con, 1);
    guard.release().await.expect("release");
    let id = py.line("acquired").remove(0);
    let ids: Vec<Vec<u8>> =
        redis::cmd("ZRANGE").arg("{rls}:timeout").arg(0).arg(-1).query(&mut con).expect("ZRANGE");
    assert_eq!(ids.iter().map(|i| hex(i)).collect::<Vec<_>>(), [id]);
    py.go();
    assert_eq!(py.line("released"), ["1"]);
    py.finish();
}
