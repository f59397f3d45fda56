//! Bad arguments to the Rust client's constructors and calls (leases, waits and timeouts too
//! long for the clock arithmetic, zeros that mean nothing, leases below the server's
//! millisecond, watchdog timeouts below 100 ms (a busy loop of renewals), permit counts the
//! server refuses, an empty or self-defeating MultiLock/RedLock) are refused at once with a
//! clear error: no panic, nothing sent to the server. Waits beyond the longest duration wait
//! without limit.

use std::time::Duration;

use rlock_client::{Error, LockClient, MultiLock, Options, RedLock, SessionOptions, MAX_DURATION};
use rlock_tests_integration::{hgetall, module_calls, poll, Server};

/// A lease or timeout past the longest the client takes.
const TOO_LONG: Duration = Duration::from_millis((1 << 60) + 1);

/// Whether `result` is the refusal of a bad argument (not a server's answer or a timeout).
fn refused<T: std::fmt::Debug>(result: &Result<T, Error>) -> bool {
    matches!(result, Err(Error::InvalidArgument(_) | Error::ZeroLease))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_arguments_are_refused_at_once_and_nothing_is_sent() {
    assert_eq!(TOO_LONG, MAX_DURATION + Duration::from_millis(1));
    let server = Server::start();
    let mut con = server.conn();
    let client = LockClient::open(server.url()).await.expect("client");
    let other = LockClient::open(server.url()).await.expect("client");
    let (lock, rw, sem) = (client.lock("l"), client.rw_lock("rw"), client.semaphore("s"));
    let leased = client.leased_semaphore("p");
    // too long for the clock arithmetic, or shorter than the server's millisecond
    let bad = [
        Some(TOO_LONG),
        Some(Duration::MAX),
        Some(Duration::from_nanos(1)),
        Some(Duration::from_micros(999)),
    ];
    let wait = Duration::from_secs(1);
    let mut answers: Vec<(String, bool, String)> = Vec::new();
    let mut note = |what: &str, ok: bool, debug: String| answers.push((what.into(), ok, debug));
    let before = module_calls(&mut con);

    for lease in bad {
        let r = lock.acquire(lease).await;
        note("lock acquire, bad lease", refused(&r), format!("{r:?}"));
        let r = lock.try_acquire(wait, lease).await;
        note("lock try_acquire, bad lease", refused(&r), format!("{r:?}"));
        let r = rw.read().acquire(lease).await;
        note("read, bad lease", refused(&r), format!("{r:?}"));
        let r = rw.write().try_acquire(wait, lease).await;
        note("write, bad lease", refused(&r), format!("{r:?}"));
        let r = leased.acquire(1, lease).await;
        note("leased, bad lease", refused(&r), format!("{r:?}"));
        let r = client.owner().lock("o").acquire(lease).await;
        note("owner's lock, bad lease", refused(&r), format!("{r:?}"));
        let r = MultiLock::new(vec![client.lock("m")]).acquire(lease).await;
        note("MultiLock, bad lease", refused(&r), format!("{r:?}"));
        let r = RedLock::new(std::slice::from_ref(&client), "r").try_acquire(wait, lease).await;
        note("RedLock, bad lease", refused(&r), format!("{r:?}"));
    }
    for (what, permits) in [("zero", 0), ("above i64::MAX", u64::MAX)] {
        let r = sem.acquire(permits).await;
        note(&format!("semaphore acquire, {what}"), refused(&r), format!("{r:?}"));
        let r = sem.try_acquire(permits, Duration::ZERO).await;
        note(&format!("semaphore try_acquire, {what}"), refused(&r), format!("{r:?}"));
        let r = sem.release(permits).await;
        note(&format!("semaphore release, {what}"), refused(&r), format!("{r:?}"));
        let r = leased.acquire(permits, None).await;
        note(&format!("leased acquire, {what}"), refused(&r), format!("{r:?}"));
    }
    let r = leased.try_acquire(10_001, Duration::ZERO, None).await;
    note("leased, above the server's 10,000", refused(&r), format!("{r:?}"));
    let r = sem.try_set_permits(u64::MAX).await;
    note("try_set_permits above i64::MAX", refused(&r), format!("{r:?}"));

    let r = MultiLock::new(Vec::new()).acquire(None).await;
    note("an empty MultiLock", refused(&r), format!("{r:?}"));
    let r = MultiLock::new(vec![rw.write().clone()]).try_acquire(wait, None).await;
    note("a MultiLock of a write side", refused(&r), format!("{r:?}"));
    let r = MultiLock::new(vec![client.lock("m"), client.lock("m")]).try_acquire(wait, None).await;
    note("a MultiLock of one lock twice", refused(&r), format!("{r:?}"));
    let r = RedLock::new(&[], "r").try_acquire(wait, None).await;
    note("an empty RedLock", refused(&r), format!("{r:?}"));
    let twice = [client.clone(), client.clone(), other.clone()];
    let r = RedLock::new(&twice, "r").try_acquire(wait, None).await;
    note("a RedLock with one client twice", refused(&r), format!("{r:?}"));
    let red = || RedLock::new(std::slice::from_ref(&client), "r");
    let r = red().node_timeout(Duration::ZERO).try_acquire(wait, None).await;
    note("a RedLock's zero node timeout", refused(&r), format!("{r:?}"));
    let r = red().node_timeout(Duration::MAX).try_acquire(wait, None).await;
    note("a RedLock's huge node timeout", refused(&r), format!("{r:?}"));
    let r = red().retry_delay(Duration::MAX).try_acquire(wait, None).await;
    note("a RedLock's huge retry delay", refused(&r), format!("{r:?}"));

    let options = [
        ("a zero watchdog timeout", Options::default().watchdog_timeout(Duration::ZERO)),
        ("a huge watchdog timeout", Options::default().watchdog_timeout(Duration::MAX)),
        ("a 1 ns watchdog timeout", Options::default().watchdog_timeout(Duration::from_nanos(1))),
        ("a 2 ms watchdog timeout", Options::default().watchdog_timeout(Duration::from_millis(2))),
        (
            "a watchdog timeout just under 100 ms",
            Options::default().watchdog_timeout(Duration::from_micros(99_999)),
        ),
        ("a huge replica ack timeout", Options::default().replica_ack(1, Duration::MAX)),
        ("a huge AOF ack timeout", Options::default().aof_ack(true, 0, Duration::MAX)),
    ];
    for (what, options) in options {
        let r = LockClient::with_options(server.client(), options).await;
        note(what, refused(&r), format!("{r:?}"));
    }
    let sessions = [
        ("a zero keepalive", SessionOptions::default().keepalive(Duration::ZERO)),
        ("a huge keepalive", SessionOptions::default().keepalive(Duration::MAX)),
        ("a lock delay above 60 s", SessionOptions::default().lock_delay(Duration::MAX)),
    ];
    for (what, options) in sessions {
        let r = client.session_with(options).await;
        note(what, refused(&r), format!("{r:?}"));
    }

    let sent = module_calls(&mut con) - before;
    let wrong: Vec<String> =
        answers.iter().filter(|(_, ok, _)| !ok).map(|(w, _, d)| format!("{w}: {d}")).collect();
    assert!(
        wrong.is_empty() && sent == 0,
        "{sent} rlock command(s) reached the server; not refused at once:\n{}",
        wrong.join("\n")
    );
    for (_, _, debug) in &answers {
        assert!(!debug.contains("InvalidArgument(\"\")"), "an error must say why: {debug}");
    }
    for key in ["l", "rw", "o", "m", "r"] {
        assert!(hgetall(&mut con, key.as_bytes()).is_empty(), "{key} is held");
    }
}

/// A wait longer than the longest duration is a wait without limit (as documented), not a
/// server's refusal of its `WAIT` budget: it is still waiting when dropped, and leaves nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_beyond_the_longest_duration_waits_without_limit() {
    let server = Server::start();
    let client = LockClient::open(server.url()).await.expect("client");
    let held = client.lock("l").acquire(Some(Duration::from_secs(60))).await.expect("held");
    let lease = Some(Duration::from_secs(5));
    for wait in [Duration::from_millis(u64::MAX), Duration::MAX] {
        let lock = client.lock("l");
        let waiting = lock.try_acquire(wait, lease);
        let outcome = tokio::time::timeout(Duration::from_millis(300), waiting).await;
        assert!(outcome.is_err(), "a {wait:?} wait ended: {outcome:?}");
        let sem = client.semaphore("s");
        let waiting = sem.try_acquire(1, wait);
        let outcome = tokio::time::timeout(Duration::from_millis(300), waiting).await;
        assert!(outcome.is_err(), "a {wait:?} semaphore wait ended: {outcome:?}");
    }
    held.release().await.expect("release");
    poll("the dropped waits to leave nothing", Duration::from_secs(10), || {
        hgetall(&mut server.conn(), b"l").is_empty().then_some(())
    });
}
