//! A guard's deadline is the longest lease the server confirmed for its hold
//! (one deadline, never a second shorter one), and every call returns by its deadline, a stalled
//! server included.

use std::time::Duration;

use rlock_client::{Error, Options};
use rlock_tests_integration::lock_client::{client, client_with, fields, until_gone};
use rlock_tests_integration::{cmd, wait_blocked, Server};
use tokio::time::{sleep, sleep_until, timeout, Instant};

use super::{release_ids, until_conserved, LIMIT, LONG};

/// A watchdog guard (3 s lease) and a re-entry of the same hold with a 20 s lease the
/// server confirmed; then renewals stall (the server is stopped 5 s). Both guards stand for one
/// hold the server keeps for 20 s: neither may report it lost about 3 s in (at the watchdog's
/// own, shorter deadline). And after the stall, the next `acquire()` on that handle re-enters
/// the confirmed hold: it must not return a guard that is born lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guard_is_valid_until_the_longest_lease_the_server_confirmed() {
    let server = Server::start();
    let watchdog = Duration::from_secs(3);
    let client = client_with(&server, Options::default().watchdog_timeout(watchdog)).await;
    let lock = client.lock("l");
    let first = lock.acquire(None).await.expect("a watchdog guard");
    let confirmed = lock.acquire(Some(Duration::from_secs(20))).await.expect("a 20 s re-entry");
    let pttl: i64 = redis::cmd("PTTL").arg("l").query(&mut server.conn()).expect("PTTL");
    assert!(pttl > 19_000, "the server confirmed 20 s: {pttl} ms");

    server.pause();
    let stalled = Instant::now();
    sleep(Duration::from_millis(4_500)).await; // past the watchdog's 3 s, well within the 20 s
    let (first_lost, confirmed_lost) = (first.is_lost(), confirmed.is_lost());
    let (first_until, confirmed_until) = (first.valid_until(), confirmed.valid_until());
    sleep_until(stalled + Duration::from_secs(5)).await;
    server.resume();
    let pttl: i64 = redis::cmd("PTTL").arg("l").query(&mut server.conn()).expect("PTTL");
    assert!(
        !first_lost && !confirmed_lost,
        "4.5 s into a stall, with a 20 s lease confirmed, the guards report lost: watchdog guard \
         {first_lost} (valid until {first_until:?}), 20 s guard {confirmed_lost} (valid until \
         {confirmed_until:?}); the server holds it {pttl} ms more"
    );

    let again = lock.acquire(Some(Duration::from_secs(5))).await.expect("a re-entry");
    let born_lost = again.is_lost();
    let resolves = timeout(Duration::from_millis(200), again.lost()).await.is_ok();
    assert!(
        !born_lost && !resolves,
        "a re-entry of the confirmed hold (the server holds {:?}) is born lost: is_lost() \
         {born_lost}, lost() resolves at once: {resolves}",
        fields(&server, "l")
    );
    drop((first, confirmed, again));
    until_gone(&server, "l", "the guards' drops to free the lock");
}

/// How one call of [`try_acquire_returns_by_its_deadline_when_the_server_stalls`] ended.
enum Outcome {
    Granted,
    NotGranted,
    Failed(String),
}

impl std::fmt::Display for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Granted => f.write_str("granted"),
            Self::NotGranted => f.write_str("not granted"),
            Self::Failed(e) => write!(f, "failed: {e}"),
        }
    }
}

/// A lock or permit guard's acquire, as an [`Outcome`] (a guard is dropped: released).
fn outcome<G>(result: Result<G, Error>) -> Outcome {
    match result {
        Ok(_guard) => Outcome::Granted,
        Err(Error::TimedOut) => Outcome::NotGranted,
        Err(e) => Outcome::Failed(format!("{e:?}")),
    }
}

/// Runs `call` in a task of its own, timing it from its start.
fn timed(
    kind: &'static str,
    call: impl std::future::Future<Output = Outcome> + Send + 'static,
) -> tokio::task::JoinHandle<(&'static str, Duration, Outcome)> {
    tokio::spawn(async move {
        let started = Instant::now();
        let outcome = call.await;
        (kind, started.elapsed(), outcome)
    })
}

/// `try_acquire` with a 1 s wait, for every kind, each against a busy lock or
/// semaphore; once every wait is in the server, the server stalls (SIGSTOP) for 6 s. Every call
/// returns within about 1.5 s of its start (its deadline and a small grace), not when the
/// server resumes; none reports a grant; and once the holders let go, nothing is held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn try_acquire_returns_by_its_deadline_when_the_server_stalls() {
    const BOUND: Duration = Duration::from_millis(1_600);
    let server = Server::start();
    let client = client(&server).await;
    let mut con = server.conn();
    cmd(&mut con, &["RLOCK.ACQUIRE", "lock", "holder", "60000"]);
    cmd(&mut con, &["RWLOCK.ACQUIRE", "read", "holder", "WRITE", "60000"]);
    cmd(&mut con, &["RWLOCK.ACQUIRE", "write", "holder", "READ", "60000"]);
    cmd(&mut con, &["RSEM.SETPERMITS", "counted", "1"]);
    cmd(&mut con, &["RSEM.ACQUIRE", "counted", "1"]);
    cmd(&mut con, &["RSEM.SETPERMITS", "leased", "1"]);
    let ids = cmd(&mut con, &["RSEM.ACQUIRE", "leased", "1", "LEASE", "60000"]);

    let wait = Duration::from_secs(1);
    let (lock, read) = (client.lock("lock"), client.rw_lock("read"));
    let write = client.rw_lock("write");
    let (counted, leased) = (client.semaphore("counted"), client.leased_semaphore("leased"));
    let calls = vec![
        timed("lock", async move { outcome(lock.try_acquire(wait, Some(LONG)).await) }),
        timed("read", async move { outcome(read.read().try_acquire(wait, Some(LONG)).await) }),
        timed("write", async move { outcome(write.write().try_acquire(wait, Some(LONG)).await) }),
        timed("counted", async move {
            match counted.try_acquire(1, wait).await {
                Ok(true) => {
                    counted.release(1).await.expect("give the permit back");
                    Outcome::Granted
                }
                Ok(false) => Outcome::NotGranted,
                Err(e) => Outcome::Failed(format!("{e:?}")),
            }
        }),
        timed("leased", async move { outcome(leased.try_acquire(1, wait, Some(LONG)).await) }),
    ];
    wait_blocked(&mut con, 5);
    server.pause();
    let stalled = Instant::now();
    sleep_until(stalled + Duration::from_secs(6)).await;
    server.resume();

    let mut problems = Vec::new();
    for call in calls {
        let (kind, took, outcome) = timeout(LIMIT, call).await.expect("answered").expect("task");
        if took > BOUND || !matches!(outcome, Outcome::NotGranted) {
            problems.push(format!("{kind}: {outcome} after {took:?}"));
        }
    }
    cmd(&mut con, &["RLOCK.RELEASE", "lock", "holder"]);
    cmd(&mut con, &["RWLOCK.RELEASE", "read", "holder", "WRITE"]);
    cmd(&mut con, &["RWLOCK.RELEASE", "write", "holder", "READ"]);
    cmd(&mut con, &["RSEM.RELEASE", "counted", "1"]);
    assert_eq!(release_ids(&mut con, "leased", &ids), 1, "the leased holder's permit");
    assert!(
        problems.is_empty(),
        "try_acquire(wait 1 s) with the server stalled 6 s (bound {BOUND:?}):\n{}",
        problems.join("\n")
    );
    for name in ["lock", "read", "write"] {
        until_gone(&server, name, &format!("{name}: nothing held once the holder let go"));
    }
    until_conserved(&server, "counted", 1, "after the stall, counted");
    until_conserved(&server, "leased", 1, "after the stall, leased");
}
