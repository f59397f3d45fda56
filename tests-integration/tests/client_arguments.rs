//! Bad arguments to the Rust client's constructors and calls (leases, waits and timeouts too
//! long for the clock arithmetic, zeros that mean nothing, leases below the server's
//! millisecond, watchdog timeouts below 100 ms (a busy loop of renewals), permit counts the
//! server refuses, an empty or self-defeating MultiLock/RedLock) are refused at once with a
//! clear error: no panic, nothing sent to the server. Waits beyond the longest duration wait
//! without limit.

use std::time::Duration;

use rlock_client::{Error, LockClient, MultiLock, Options, RedLock, SessionOptions, MAX_DURATION};
use rlock_tests_integration::lock_client::client;
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

/// How long anything the client does in the background (a give-back, a cancel) may take.
const LIMIT: Duration = Duration::from_secs(10);

/// A lease long enough that a hold it leaks is still there when the test looks.
const LONG: Duration = Duration::from_secs(60);

/// Polls (blocking, at most [`LIMIT`]) until the key `name` is gone.
fn until_gone(server: &Server, name: &str, what: &str) {
    let mut con = server.conn();
    poll(what, LIMIT, || {
        let n: i64 = redis::cmd("EXISTS").arg(name).query(&mut con).expect("EXISTS");
        (n == 0).then_some(())
    });
}

/// The longest wait that still fits the monotonic clock, minus `margin`: a deadline the client
/// can represent, close to the clock's end (a user's "wait practically forever").
fn wait_near_the_clock_s_end(margin: Duration) -> Duration {
    let now = tokio::time::Instant::now();
    let (mut fits, mut overflows) = (Duration::ZERO, Duration::MAX);
    while overflows.saturating_sub(fits) > Duration::from_millis(1) {
        let mid = fits + (overflows - fits) / 2;
        if now.checked_add(mid).is_some() {
            fits = mid;
        } else {
            overflows = mid;
        }
    }
    fits.saturating_sub(margin)
}

/// A wait the clock can represent but not plus the client's half-second grace must not panic:
/// it waits (here it is granted at once, or times out on a busy lock by the test's own bound).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_near_the_clock_s_end_never_panics() {
    let server = Server::start();
    let me = client(&server).await;
    let wait = wait_near_the_clock_s_end(Duration::from_millis(100));
    let lock = me.lock("far");
    let guard = tokio::spawn(async move { lock.try_acquire(wait, Some(LONG)).await }).await;
    let guard = guard.expect("Lock::try_acquire with a far wait panicked");
    guard.expect("a free lock is granted").release().await.expect("release");

    let sem = me.semaphore("far-sem");
    sem.try_set_permits(1).await.expect("permits");
    let taken = tokio::spawn(async move { sem.try_acquire(1, wait).await }).await;
    assert!(matches!(taken, Ok(Ok(true))), "Semaphore::try_acquire far wait: {taken:?}");

    let leased = me.leased_semaphore("far-leased");
    leased.try_set_permits(1).await.expect("permits");
    let taken = tokio::spawn(async move { leased.try_acquire(1, wait, Some(LONG)).await }).await;
    let permit = taken.expect("LeasedSemaphore::try_acquire with a far wait panicked");
    permit.expect("granted").release().await.expect("release");
}

/// `Options` built from the user's numbers (`Duration::MAX` acknowledgement timeouts) never
/// panic: opening the client refuses them at once (`InvalidArgument`), and the longest timeout
/// taken (`MAX_DURATION`) acquires without a panic, leaving nothing held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duration_max_acknowledgement_timeouts_never_panic() {
    let server = Server::start();
    let options = Options::default().replica_ack(0, Duration::MAX);
    let redis = server.client();
    let opened =
        tokio::spawn(async move { LockClient::with_options(redis, options).await.map(|_| ()) })
            .await;
    let refused = matches!(opened, Ok(Err(Error::InvalidArgument(_))));
    assert!(refused, "replica_ack(0, Duration::MAX) must be refused, not {opened:?}");
    let options = Options::default().replica_ack(0, rlock_client::MAX_DURATION);
    let me = LockClient::with_options(server.client(), options).await.expect("client");
    let lock = me.lock("ack-max");
    let took = tokio::spawn(async move {
        let held = lock.try_acquire(Duration::from_millis(200), Some(LONG)).await;
        if let Ok(guard) = held {
            guard.release().await.expect("release");
        }
    })
    .await;
    assert!(took.is_ok(), "an acquire with replica_ack(0, Duration::MAX) panicked");
    until_gone(&server, "ack-max", "nothing held");
}

/// Huge numbers from the user (permits, leases, watchdog timeouts) are typed errors or work;
/// never a panic, and nothing is left held or taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn huge_numbers_are_answered_and_leave_nothing_held() {
    let server = Server::start();
    let me = client(&server).await;
    let lock = me.lock("huge");
    let r = lock.acquire(Some(Duration::MAX)).await;
    assert!(matches!(r, Err(Error::InvalidArgument(_))), "a lease beyond the longest: {r:?}");
    let near = Duration::from_millis(i64::MAX as u64);
    if let Ok(guard) = lock.try_acquire(Duration::ZERO, Some(near)).await {
        assert!(!guard.is_lost(), "a granted i64::MAX ms lease is valid");
        guard.release().await.expect("release");
    }
    until_gone(&server, "huge", "nothing held after huge leases");

    let options = Options::default().watchdog_timeout(Duration::from_secs(1 << 40));
    let far = LockClient::with_options(server.client(), options).await.expect("client");
    let guard = far.lock("huge-wd").acquire(None).await.expect("a very long watchdog lease");
    assert!(!guard.is_lost());
    guard.release().await.expect("release");

    let sem = me.semaphore("huge-sem");
    sem.try_set_permits(3).await.expect("permits");
    for n in [0, u64::MAX, i64::MAX as u64] {
        let r = sem.try_acquire(n, Duration::from_millis(100)).await;
        assert!(!matches!(r, Ok(true)) || n == 0, "{n} permits of 3: {r:?}");
    }
    let leased = me.leased_semaphore("huge-leased");
    leased.try_set_permits(3).await.expect("permits");
    for n in [0, u64::MAX, 10_001] {
        let r = leased.try_acquire(n, Duration::from_millis(100), Some(LONG)).await;
        assert!(r.is_err(), "{n} leased permits of 3: {r:?}");
    }
    let total: i64 = sem.available().await.expect("available");
    assert_eq!(total, 3, "no counted permit taken by refused requests");
    poll("leased permits conserved", LIMIT, || {
        let n: i64 = redis::cmd("RSEM.AVAILABLE")
            .arg("huge-leased")
            .query(&mut server.conn())
            .expect("AVAILABLE");
        (n == 3).then_some(())
    });
}
