//! A hostile user's attacks on the Rust client's hold engine (issue 24), each against a real
//! server with the built module loaded. Every test here reproduced a defect on the engine as
//! merged (it failed there), or is an attack that held and is kept as a guard against regressions.

use std::time::Duration;

use rlock_client::{Error, LockClient, Options};
use rlock_tests_integration::{hgetall, poll, Server};

/// How long anything the client does in the background (a give-back, a cancel) may take.
const LIMIT: Duration = Duration::from_secs(10);

/// A lease long enough that a hold it leaks is still there when the test looks.
const LONG: Duration = Duration::from_secs(60);

async fn client(server: &Server) -> LockClient {
    LockClient::open(server.url()).await.expect("client")
}

/// The hash `name` as text pairs.
fn fields(server: &Server, name: &str) -> Vec<(String, String)> {
    hgetall(&mut server.conn(), name.as_bytes())
        .into_iter()
        .map(|(f, v)| {
            (String::from_utf8_lossy(&f).into_owned(), String::from_utf8_lossy(&v).into_owned())
        })
        .collect()
}

/// Polls (blocking, at most [`LIMIT`]) until the key `name` is gone.
fn until_gone(server: &Server, name: &str, what: &str) {
    let mut con = server.conn();
    poll(what, LIMIT, || {
        let n: i64 = redis::cmd("EXISTS").arg(name).query(&mut con).expect("EXISTS");
        (n == 0).then_some(())
    });
}

/// A write guard (explicit short lease) outlives its lease on the client's clock while the
/// same handle's read hold (same owner: write -> read re-entry) keeps the hash, and so the
/// write field, alive on the server (Redisson's model: a write hold has no lease of its own,
/// it lives as long as the key). The handle's next `write()` acquire must not take a second
/// count on that still-present write field under the same owner and then disown the first:
/// after every guard is released or dropped, nothing may stay held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_taken_again_through_the_read_leaves_no_write_held_by_nobody() {
    let server = Server::start();
    let (mine, theirs) = (client(&server).await, client(&server).await);
    let rw = mine.rw_lock("ghost");
    let stale = rw.write().acquire(Some(Duration::from_millis(800))).await.expect("write");
    let reading = rw.read().acquire(Some(LONG)).await.expect("write -> read re-entry");
    poll("the write guard's 0.8 s to pass", LIMIT, || stale.is_lost().then_some(()));
    let again = rw.write().try_acquire(Duration::ZERO, Some(LONG)).await;
    let after_again = fields(&server, "ghost");
    if let Ok(w) = again {
        w.release().await.expect("release the new write guard");
    }
    drop(stale);
    reading.release().await.expect("release the read");
    // Every guard is gone: the lock must be free (within what background work may take).
    let their_rw = theirs.rw_lock("ghost");
    let foreign = their_rw.write().try_acquire(LIMIT, Some(LONG)).await;
    assert!(
        foreign.is_ok(),
        "every guard of ours is released or dropped, yet another client cannot take write for \
         {LIMIT:?}: {foreign:?}; the server holds {:?} (after the second write: {after_again:?})",
        fields(&server, "ghost")
    );
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

/// Which side holds in [`clones_used_concurrently_keep_mutual_exclusion_and_leave_nothing`].
#[derive(Default)]
struct Holders([std::sync::atomic::AtomicI64; 2]);

/// One client's tasks on clones of one handle (they share holds: re-entries) race another
/// client's, each acquire dropped at a random point (a random `timeout`), each guard released
/// or dropped at random. A guard of one client never coexists with a guard of the other, and
/// when every task is done nothing is held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clones_used_concurrently_keep_mutual_exclusion_and_leave_nothing() {
    use std::sync::atomic::Ordering::SeqCst;
    use std::sync::Arc;
    let server = Server::start();
    let seed = rlock_tests_integration::fuzz_seed();
    for (round, name) in ["clones", "clones-rw"].into_iter().enumerate() {
        let holders = Arc::new(Holders::default());
        let (mut tasks, mut clients) = (Vec::new(), Vec::new());
        for side in 0..2usize {
            let c = client(&server).await;
            let handle = if round == 0 { c.lock(name) } else { c.rw_lock(name).write().clone() };
            for t in 0..3u64 {
                let (handle, holders) = (handle.clone(), Arc::clone(&holders));
                let mut rng =
                    seed ^ (side as u64 * 97 + t * 13 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
                tasks.push(tokio::spawn(async move {
                    let mut next = move || {
                        rng ^= rng << 13;
                        rng ^= rng >> 7;
                        rng ^= rng << 17;
                        rng
                    };
                    for _ in 0..25 {
                        let cut = Duration::from_millis(next() % 40);
                        let lease = (next() % 2 == 0).then_some(LONG);
                        let got = tokio::time::timeout(cut, handle.acquire(lease)).await;
                        let Ok(Ok(guard)) = got else { continue };
                        holders.0[side].fetch_add(1, SeqCst);
                        let other = holders.0[1 - side].load(SeqCst);
                        assert_eq!(other, 0, "both clients hold {name} (seed {seed})");
                        tokio::time::sleep(Duration::from_millis(next() % 5)).await;
                        assert!(!guard.is_lost(), "a guard lost without a stall");
                        holders.0[side].fetch_sub(1, SeqCst);
                        if next() % 2 == 0 {
                            drop(guard);
                        } else {
                            let _ = guard.release().await;
                        }
                    }
                }));
            }
            clients.push(c);
        }
        for task in tasks {
            task.await.expect("task");
        }
        until_gone(&server, name, "nothing held when every task is done");
        drop(clients);
    }
}
