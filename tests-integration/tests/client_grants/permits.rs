//! No permit is ever lost by the client. A grant that races a dropped acquire future, a wait
//! cancelled while the server is stalled, a guard's release after a killed connection: each
//! leaves the semaphore with every permit it had (available + held = total). And
//! `try_acquire(.., ZERO)` tries once, for every kind.

use std::time::Duration;

use redis::Value;
use rlock_client::{Error, LockClient};
use rlock_tests_integration::lock_client::client;
use rlock_tests_integration::{cmd, fuzz_seed, wait_blocked, Rng, Server};
use tokio::sync::watch;
use tokio::time::{sleep, sleep_until, timeout, Instant};

use super::{conserved, kill_normal, permits, until_conserved, LONG};

/// Permits of the busy semaphores of [`grants_racing_dropped_acquires`], all held by the test at
/// the start of a round.
const TOTAL: usize = 100;
/// Waiters queued in a round; the test then hands some of its permits to them.
const WAITERS: usize = 20;
const ROUNDS: usize = 25;

/// Which semaphore [`grants_racing_dropped_acquires`] runs on.
#[derive(Clone, Copy, Debug)]
enum Permits {
    Counted,
    Leased,
}

/// Runs `acquire` until `cancel` turns true, then drops it: by `select!` (either branch may win
/// when both are ready: `style` 0), or by a `timeout` of `jitter` started then.
async fn cancelled_by<T>(
    acquire: impl std::future::Future<Output = Result<T, Error>>,
    cancel: watch::Receiver<bool>,
    style: usize,
    jitter: Duration,
) -> Option<T> {
    async fn signalled(mut cancel: watch::Receiver<bool>) {
        let _ = cancel.wait_for(|c| *c).await;
    }
    tokio::pin!(acquire);
    if style == 0 {
        tokio::select! {
            got = &mut acquire => got.ok(),
            () = signalled(cancel) => None,
        }
    } else {
        tokio::select! {
            biased;
            got = &mut acquire => got.ok(),
            () = signalled(cancel) => timeout(jitter, acquire).await.ok()?.ok(),
        }
    }
}

/// One waiter of [`grants_racing_dropped_acquires`]: `acquire(1)`, cancelled when `cancel` turns
/// true; a permit it got is released at once. `true` when it got one.
async fn waiter(
    client: LockClient,
    kind: Permits,
    cancel: watch::Receiver<bool>,
    (style, jitter): (usize, Duration),
) -> bool {
    match kind {
        Permits::Counted => {
            let sem = client.semaphore("s");
            let got = cancelled_by(sem.acquire(1), cancel, style, jitter).await.is_some();
            if got {
                sem.release(1).await.expect("give the permit back");
            }
            got
        }
        Permits::Leased => {
            let sem = client.leased_semaphore("s");
            let got = cancelled_by(sem.acquire(1, Some(LONG)), cancel, style, jitter).await;
            match got {
                Some(guard) => {
                    guard.release().await.expect("give the permit back");
                    true
                }
                None => false,
            }
        }
    }
}

/// For both kinds: the test holds all 100 permits of a semaphore; 20 acquires wait in the
/// server; the test gives some permits back (handed off to the first waiters at once) and, as
/// the grants arrive, every acquire is dropped (`select!` against a cancel signal, or a short
/// `timeout` from it). After each round (every waiter done, every permit it got released, the
/// test's own released) all 100 permits are back.
async fn grants_racing_dropped_acquires(kind: Permits) {
    let server = Server::start();
    let client = client(&server).await;
    let seed = fuzz_seed();
    eprintln!("seed {seed} (replay with RLOCK_FUZZ_SEED={seed})");
    let mut rng = Rng(seed);
    let mut con = server.conn();
    let total = TOTAL.to_string();
    cmd(&mut con, &["RSEM.SETPERMITS", "s", &total]);
    for round in 0..ROUNDS {
        // The test's permits: a count, or ids.
        let mut ids: Vec<Vec<u8>> = match kind {
            Permits::Counted => {
                assert_eq!(cmd(&mut con, &["RSEM.ACQUIRE", "s", &total]), Value::Int(1));
                Vec::new()
            }
            Permits::Leased => {
                let granted = cmd(&mut con, &["RSEM.ACQUIRE", "s", &total, "LEASE", "600000"]);
                redis::from_redis_value(granted).expect("ids")
            }
        };
        let (cancel, cancelled) = watch::channel(false);
        let waiters: Vec<_> = (0..WAITERS)
            .map(|_| {
                let how = (rng.below(2), Duration::from_micros(rng.below(2_000) as u64));
                tokio::spawn(waiter(client.clone(), kind, cancelled.clone(), how))
            })
            .collect();
        wait_blocked(&mut con, WAITERS as i64);
        // Hand `n` permits off, and cancel every waiter as their grants come.
        let n = 1 + rng.below(WAITERS);
        let cancel_after = Duration::from_micros(rng.below(1_500) as u64);
        let give = match kind {
            Permits::Counted => {
                let mut c = redis::cmd("RSEM.RELEASE");
                c.arg("s").arg(n);
                c
            }
            Permits::Leased => {
                let mut c = redis::cmd("RSEM.RELEASE");
                c.arg("s").arg("ID").arg(ids.split_off(TOTAL - n));
                c
            }
        };
        let mut giver = server.client().get_multiplexed_async_connection().await.expect("con");
        let (given, ()) = tokio::join!(give.query_async::<i64>(&mut giver), async {
            sleep(cancel_after).await;
            cancel.send_replace(true);
        });
        given.expect("the test gives permits back");
        let mut got = 0;
        for w in waiters {
            got += usize::from(w.await.expect("waiter"));
        }
        match kind {
            Permits::Counted => {
                cmd(&mut con, &["RSEM.RELEASE", "s", &(TOTAL - n).to_string()]);
            }
            Permits::Leased => {
                let mut c = redis::cmd("RSEM.RELEASE");
                c.arg("s").arg("ID").arg(ids);
                let released: i64 = c.query(&mut con).expect("the test's permits back");
                assert_eq!(released, (TOTAL - n) as i64);
            }
        }
        let what = format!(
            "seed {seed}, {kind:?}, round {round}: {n} handed off, {got} taken by the waiters"
        );
        until_conserved(&server, "s", TOTAL as i64, &what);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_counted_grant_racing_a_dropped_acquire_is_never_lost() {
    grants_racing_dropped_acquires(Permits::Counted).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leased_grant_racing_a_dropped_acquire_is_never_lost() {
    grants_racing_dropped_acquires(Permits::Leased).await;
}

/// A counted and a leased wait are pending on two semaphores of one permit each, whose
/// holder leased it for 3 s; the server stalls (SIGSTOP) 8 s, the holder's lease ending during
/// the stall; both waits are cancelled (their futures dropped) during the stall; then the
/// server resumes, puts the ended leases back and serves the queues it still has. No permit may
/// be lost: a grant made as the server resumes, to a wait the caller gave up, must come back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waits_cancelled_while_the_server_is_stalled_lose_no_permit() {
    let server = Server::start();
    let client = client(&server).await;
    let mut con = server.conn();
    for name in ["c", "l"] {
        cmd(&mut con, &["RSEM.SETPERMITS", name, "1"]);
        let held = cmd(&mut con, &["RSEM.ACQUIRE", name, "1", "LEASE", "3000"]);
        assert!(matches!(held, Value::Array(ref ids) if ids.len() == 1), "the holder of {name}");
    }

    let (counted, leased) = (client.semaphore("c"), client.leased_semaphore("l"));
    let counted_wait = tokio::spawn(async move { counted.acquire(1).await });
    let leased_wait = tokio::spawn(async move { leased.acquire(1, Some(LONG)).await });
    wait_blocked(&mut con, 2);

    server.pause();
    let stalled = Instant::now();
    sleep(Duration::from_secs(1)).await;
    counted_wait.abort();
    leased_wait.abort();
    let counted_end = counted_wait.await;
    let leased_end = leased_wait.await;
    sleep_until(stalled + Duration::from_secs(8)).await;
    server.resume();

    assert!(counted_end.is_err_and(|e| e.is_cancelled()), "the counted wait was cancelled");
    assert!(leased_end.is_err_and(|e| e.is_cancelled()), "the leased wait was cancelled");
    let counted = conserved(&server, "c", 1);
    let leased = conserved(&server, "l", 1);
    assert!(
        counted.is_ok() && leased.is_ok(),
        "waits cancelled during an 8 s stall, the holder's lease ending in it:\ncounted: \
         {counted:?}\nleased: {leased:?}"
    );
}

/// `PermitGuard::release()` after the client's connections were
/// killed (`CLIENT KILL TYPE normal`) retries, as `LockGuard::release()` does, and succeeds:
/// the permits are back, not leased until their lease ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_guard_released_after_a_killed_connection_retries_and_succeeds() {
    let server = Server::start();
    let client = client(&server).await;
    let lock = client.lock("l");
    let guard = lock.acquire(Some(LONG)).await.expect("lock");
    kill_normal(&server);
    guard.release().await.expect("a lock guard's release retries after the kill");

    let sem = client.leased_semaphore("s");
    assert!(sem.try_set_permits(2).await.expect("set"));
    let guard = sem.acquire(1, Some(LONG)).await.expect("permit");
    kill_normal(&server);
    let released = guard.release().await;
    let (available, leased) = permits(&server, "s");
    assert!(
        released.is_ok() && (available, leased) == (2, 0),
        "a permit guard's release after the kill: {released:?}; the server has {available} \
         available and {leased} leased of 2"
    );
}

/// `try_acquire(.., Duration::ZERO)` tries once, for every kind, as
/// `Lock::try_acquire(ZERO, ..)` does: it takes what is free, and answers "not now" at once when
/// nothing is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn try_acquire_with_a_zero_wait_takes_what_is_free_for_every_kind() {
    let server = Server::start();
    let client = client(&server).await;
    let zero = Duration::ZERO;
    let mut problems = Vec::new();

    let lock = client.lock("l").try_acquire(zero, Some(LONG)).await;
    if let Err(e) = &lock {
        problems.push(format!("a free lock: {e:?}"));
    }
    let rw = client.rw_lock("rw");
    let read = rw.read().try_acquire(zero, Some(LONG)).await;
    if let Err(e) = &read {
        problems.push(format!("a free read-write lock's read side: {e:?}"));
    }
    drop(read);
    let write = client.rw_lock("rw2").write().try_acquire(zero, Some(LONG)).await;
    if let Err(e) = &write {
        problems.push(format!("a free read-write lock's write side: {e:?}"));
    }
    let counted = client.semaphore("c");
    counted.try_set_permits(3).await.expect("set");
    let took = counted.try_acquire(1, zero).await;
    let left = counted.available().await.expect("available");
    if !matches!(took, Ok(true)) || left != 2 {
        problems.push(format!("a counted semaphore with 3 free: {took:?}, {left} left"));
    }
    let leased = client.leased_semaphore("s");
    leased.try_set_permits(3).await.expect("set");
    let guard = leased.try_acquire(1, zero, Some(LONG)).await;
    if let Err(e) = &guard {
        problems.push(format!("a leased semaphore with 3 free: {e:?}"));
    }

    // Nothing free: "not now", at once.
    counted.add_permits(-2).await.expect("none left");
    leased.add_permits(-3).await.expect("none left");
    let started = Instant::now();
    let busy = counted.try_acquire(1, zero).await;
    if !matches!(busy, Ok(false)) {
        problems.push(format!("a counted semaphore with none free: {busy:?}"));
    }
    let busy = leased.try_acquire(1, zero, Some(LONG)).await;
    if !matches!(busy, Err(Error::TimedOut)) {
        problems.push(format!("a leased semaphore with none free: {busy:?}"));
    }
    let busy = client.lock("l").try_acquire(zero, Some(LONG)).await;
    if lock.is_ok() && !matches!(busy, Err(Error::TimedOut)) {
        problems.push(format!("a held lock, another handle: {busy:?}"));
    }
    let took = started.elapsed();
    if took > Duration::from_millis(500) {
        problems.push(format!("three tries with nothing free took {took:?}"));
    }
    drop((lock, write, guard));
    assert!(problems.is_empty(), "try_acquire(.., ZERO):\n{}", problems.join("\n"));
}
