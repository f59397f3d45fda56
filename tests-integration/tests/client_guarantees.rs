//! The client keeps the module's guarantees: an acquire that hands out no guard leaves nothing
//! held (cancelled, stalled, failed), a guard acts only on its own grant, loss is reported
//! promptly, drops release without a runtime, MultiLock/RedLock keep their budgets.

use std::time::Duration;

use tokio::time::{sleep, timeout, Instant};

use rlock_client::{Error, LockClient, MultiLock, Options, RedLock, Remaining};
use rlock_tests_integration::lock_client::{client, until_gone};
use rlock_tests_integration::{blocked_clients, hgetall, poll, Server};

const LIMIT: Duration = Duration::from_secs(10);

/// The lock's holders, read on a connection of the test's own.
fn holders(server: &Server, name: &str) -> Vec<(Vec<u8>, Vec<u8>)> {
    hgetall(&mut server.conn(), name.as_bytes())
}

/// Polls (blocking) until nobody holds `name`.
fn until_free(server: &Server, name: &str, what: &str) {
    poll(what, LIMIT, || holders(server, name).is_empty().then_some(()));
}

// ---- an acquire that hands out no guard leaves nothing held -------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_cancelled_while_the_server_stalls_leaves_nothing_held() {
    let server = Server::start();
    let client = client(&server).await;
    let lock = client.lock("l");
    server.pause();
    let cancelled = timeout(
        Duration::from_millis(100),
        lock.try_acquire(Duration::from_secs(5), Some(Duration::from_secs(60))),
    )
    .await;
    assert!(cancelled.is_err(), "still waiting when dropped");
    sleep(Duration::from_millis(200)).await; // the stall goes on past the cancellation
    server.resume();
    until_free(&server, "l", "the cancelled grant to be undone");
    let other = client.lock("l");
    let g = other.try_acquire(Duration::from_secs(2), Some(Duration::from_secs(5))).await;
    g.expect("another handle takes it").release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stall_longer_than_the_response_timeout_is_a_typed_error_and_no_hold() {
    let server = Server::start();
    let client = client(&server).await;
    let lock = client.lock("l");
    server.pause();
    let started = Instant::now();
    let result = lock.try_acquire(Duration::from_millis(300), Some(Duration::from_secs(60))).await;
    let took = started.elapsed();
    server.resume();
    assert!(matches!(result, Err(Error::TimedOut)), "{result:?}");
    assert!(took < Duration::from_millis(1_500), "the budget holds: {took:?}");
    until_free(&server, "l", "the unanswered grant to be undone");
    // Without a budget, the response timeout ends it the same way.
    server.pause();
    let result = lock.acquire(Some(Duration::from_secs(60))).await;
    server.resume();
    assert!(matches!(result, Err(Error::TimedOut)), "{result:?}");
    until_free(&server, "l", "the unanswered grant to be undone");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_reentries_leave_no_extra_hold() {
    let server = Server::start();
    let client = client(&server).await;
    let lock = client.lock("l");
    let outer = lock.acquire(Some(Duration::from_secs(60))).await.expect("outer");
    for i in 0..300u64 {
        let reentry = lock.acquire(Some(Duration::from_secs(60)));
        // Cancel at every point from "not sent yet" to "answered".
        let _ = timeout(Duration::from_micros(i * 7 % 900), reentry).await;
    }
    assert_eq!(lock.hold_count().await.expect("count"), 1, "only the outer guard");
    outer.release().await.expect("release");
    assert!(holders(&server, "l").is_empty(), "the last release frees it");
}

// ---- a stale guard never acts on a later hold ---------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guard_whose_lease_ran_out_cannot_release_a_later_hold() {
    let server = Server::start();
    let client = client(&server).await;
    let lock = client.lock("l");
    let g1 = lock.acquire(Some(Duration::from_millis(300))).await.expect("g1");
    until_free(&server, "l", "g1's lease to run out");
    let g2 = lock.acquire(Some(Duration::from_secs(60))).await.expect("g2");
    assert!(g1.is_lost(), "g1 learns its hold is gone");
    assert!(matches!(g1.release().await, Err(Error::NotHeld)));
    assert_eq!(holders(&server, "l"), vec![(g2.owner().as_bytes().to_vec(), b"1".to_vec())]);
    g2.release().await.expect("g2 releases its own hold");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watchdog_guard_whose_lock_was_deleted_reports_it_and_never_renews_a_later_hold() {
    let server = Server::start();
    let options = Options::default().watchdog_timeout(Duration::from_millis(900));
    let client = LockClient::with_options(server.client(), options).await.expect("client");
    let lock = client.lock("l");
    let g1 = lock.acquire(None).await.expect("g1");
    assert!(lock.force_release().await.expect("deleted"));
    let g2 = lock.acquire(Some(Duration::from_secs(60))).await.expect("g2");
    timeout(LIMIT, g1.lost()).await.expect("g1 reports the loss");
    assert!(matches!(g1.release().await, Err(Error::NotHeld)));
    assert_eq!(holders(&server, "l"), vec![(g2.owner().as_bytes().to_vec(), b"1".to_vec())]);
    g2.release().await.expect("release");
}

// ---- saturating budgets -------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_too_large_to_add_to_now_waits_without_limit_instead_of_panicking() {
    let servers: Vec<Server> = (0..3).map(|_| Server::start()).collect();
    let mut clients = Vec::new();
    for s in &servers {
        clients.push(client(s).await);
    }
    let lease = Some(Duration::from_secs(5));
    let g = clients[0].lock("l").try_acquire(Duration::MAX, lease).await.expect("single");
    g.release().await.expect("release");
    let multi = MultiLock::new(clients.iter().map(|c| c.lock("m")).collect());
    multi.try_acquire(Duration::MAX, lease).await.expect("multi").release().await.expect("r");
    let red = RedLock::new(&clients, "r");
    red.try_acquire(Duration::MAX, lease).await.expect("redlock").release().await.expect("r");
}

// ---- guards dropped where no runtime will run again ---------------------------------------------

#[test]
fn a_guard_dropped_outside_any_runtime_is_released() {
    let server = Server::start();
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("rt");
    let guard = runtime.block_on(async {
        let client = LockClient::open(server.url()).await.expect("client");
        client.lock("l").acquire(Some(Duration::from_secs(60))).await.expect("acquire")
    });
    drop(runtime);
    assert!(!holders(&server, "l").is_empty());
    drop(guard); // on a plain thread, the runtime gone
    assert!(holders(&server, "l").is_empty(), "released at the drop");
}

#[test]
fn a_guard_dropped_at_the_end_of_a_current_thread_main_is_released() {
    let server = Server::start();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("rt");
    runtime.block_on(async {
        let client = LockClient::open(server.url()).await.expect("client");
        let _guard = client.lock("l").acquire(Some(Duration::from_secs(60))).await.expect("g");
        // `main` ends here: the guard drops, and the runtime never runs again.
    });
    drop(runtime);
    assert!(holders(&server, "l").is_empty(), "released at the drop");
}

#[test]
fn guards_of_tasks_cancelled_by_a_runtime_shutdown_are_released() {
    let server = Server::start();
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("rt");
    runtime.block_on(async {
        let client = LockClient::open(server.url()).await.expect("client");
        for i in 0..5 {
            let lock = client.lock(format!("l{i}"));
            let guard = lock.acquire(Some(Duration::from_secs(60))).await.expect("g");
            tokio::spawn(async move {
                let _held = guard;
                std::future::pending::<()>().await;
            });
        }
    });
    runtime.shutdown_timeout(Duration::from_millis(100));
    for i in 0..5 {
        assert!(holders(&server, &format!("l{i}")).is_empty(), "l{i} released");
    }
}

// ---- re-entry never shortens what a live guard relies on ----------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shorter_reentry_does_not_undercut_a_watchdog_guard() {
    let server = Server::start();
    let client = client(&server).await;
    let lock = client.lock("l");
    let g1 = lock.acquire(None).await.expect("watchdog guard (30 s)");
    let g2 = lock.acquire(Some(Duration::from_millis(500))).await.expect("re-entered");
    g2.release().await.expect("release the re-entry");
    let pttl: i64 = redis::cmd("PTTL").arg("l").query(&mut server.conn()).expect("PTTL");
    assert!(pttl > 20_000, "the watchdog's lease stands: {pttl} ms");
    assert!(!g1.is_lost());
    g1.release().await.expect("release");
}

// ---- loss reported promptly after a restart -----------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_loss_after_a_restart_is_reported_at_the_first_renewal_not_a_period_later() {
    let mut server = Server::start();
    let options = Options::default().watchdog_timeout(Duration::from_secs(6)); // renews every 2 s
    let client = LockClient::with_options(server.client(), options).await.expect("client");
    let guard = client.lock("l").acquire(None).await.expect("acquire");
    let acquired = Instant::now();
    server.restart_same_port(); // SIGKILL, no persistence: the lock is gone
    let thief = LockClient::open(server.url()).await.expect("other client");
    let taken = thief.lock("l").acquire(Some(Duration::from_secs(60))).await.expect("taken");
    timeout(LIMIT, guard.lost()).await.expect("the loss is reported");
    // The first renewal (at 2 s) fails on the dead connection; the retry a moment later finds
    // the lock taken. (Waiting a whole period before retrying reported it at 4 s.)
    let after = acquired.elapsed();
    assert!(after < Duration::from_millis(3_500), "reported {after:?} after the grant");
    taken.release().await.expect("release");
}

// ---- a server without the module; RedLock release with a stalled node ---------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opening_a_server_without_the_module_is_a_typed_error() {
    let server = Server::builder().without_module().start();
    let result = LockClient::open(server.url()).await;
    assert!(matches!(result, Err(Error::NoModule)), "{result:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redlock_release_with_a_stalled_node_takes_one_node_timeout() {
    let servers: Vec<Server> = (0..3).map(|_| Server::start()).collect();
    let mut clients = Vec::new();
    for s in &servers {
        clients.push(client(s).await);
    }
    let red = RedLock::new(&clients, "r").node_timeout(Duration::from_millis(100));
    let guard = red.try_acquire(Duration::from_secs(2), Some(Duration::from_secs(10))).await;
    let guard = guard.expect("redlock");
    servers[2].pause();
    let started = Instant::now();
    let released = guard.release().await;
    let took = started.elapsed();
    servers[2].resume();
    released.expect("a majority released");
    assert!(took < Duration::from_secs(1), "release took {took:?}");
}

// ---- MultiLock with a stalled node; multi watchdogs and transient errors ------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multilock_with_a_stalled_node_keeps_its_budget_and_leaks_nothing() {
    let servers: Vec<Server> = (0..3).map(|_| Server::start()).collect();
    let mut clients = Vec::new();
    for s in &servers {
        clients.push(client(s).await);
    }
    let multi = MultiLock::new(clients.iter().map(|c| c.lock("m")).collect());
    servers[1].pause();
    let started = Instant::now();
    let result = multi.try_acquire(Duration::from_millis(100), Some(Duration::from_secs(30))).await;
    let took = started.elapsed();
    servers[1].resume();
    assert!(matches!(result, Err(Error::TimedOut)), "{result:?}");
    assert!(took < Duration::from_millis(1_000), "gave up after {took:?}");
    for (i, s) in servers.iter().enumerate() {
        until_free(s, "m", &format!("server {i} to hold nothing"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multilock_acquire_dropped_midway_leaks_nothing() {
    let servers: Vec<Server> = (0..3).map(|_| Server::start()).collect();
    let mut clients = Vec::new();
    for s in &servers {
        clients.push(client(s).await);
    }
    let multi = MultiLock::new(clients.iter().map(|c| c.lock("m")).collect());
    // Nodes 0 and 1 grant at once; node 2 stalls with the acquire in flight; then it is dropped.
    servers[2].pause();
    let dropped = timeout(Duration::from_millis(100), multi.acquire(Some(Duration::from_secs(30))));
    assert!(dropped.await.is_err(), "still taking when dropped");
    servers[2].resume();
    for (i, s) in servers.iter().enumerate() {
        until_free(s, "m", &format!("server {i} to hold nothing"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multilock_watchdog_survives_a_killed_connection() {
    let servers: Vec<Server> = (0..3).map(|_| Server::start()).collect();
    let options = Options::default().watchdog_timeout(Duration::from_millis(1_500));
    let mut clients = Vec::new();
    for s in &servers {
        clients.push(LockClient::with_options(s.client(), options.clone()).await.expect("c"));
    }
    let multi = MultiLock::new(clients.iter().map(|c| c.lock("m")).collect());
    let guard = multi.acquire(None).await.expect("multi");
    let () = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("normal")
        .query(&mut servers[0].conn())
        .expect("CLIENT KILL");
    // Several renewal periods (500 ms) later: still held everywhere, not reported lost.
    sleep(Duration::from_millis(2_000)).await;
    assert!(!guard.is_lost(), "one failed renewal is not a loss");
    for s in &servers {
        assert_eq!(holders(s, "m").len(), 1, "still held");
    }
    guard.release().await.expect("release");
}

// ---- the randomized cancellation run ---------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_cancellations_with_stalls_and_killed_connections_leave_nothing_behind() {
    let server = Server::start();
    let seed = rlock_tests_integration::fuzz_seed();
    eprintln!("seed {seed} (replay with RLOCK_FUZZ_SEED={seed})");
    let mut rng = rlock_tests_integration::Rng(seed);
    let baseline =
        rlock_tests_integration::info_field(&mut server.conn(), "clients", "connected_clients");
    let client = client(&server).await;
    let handles: Vec<_> = (0..4).map(|_| client.lock("l")).collect();
    {
        for step in 0..1_500 {
            let lock = &handles[rng.below(handles.len())];
            let wait = Duration::from_millis(rng.below(30) as u64);
            let cancel_after = Duration::from_micros(rng.below(2_000) as u64);
            match rng.below(30) {
                0 | 1 => {
                    // A stall the attempt runs into: cancelled while its command is in flight.
                    server.pause();
                    let attempt = lock.try_acquire(wait, Some(Duration::from_secs(30)));
                    let _ = timeout(Duration::from_millis(5), attempt).await;
                    sleep(Duration::from_millis(rng.below(40) as u64)).await;
                    server.resume();
                }
                2 => {
                    let _: redis::RedisResult<i64> = redis::cmd("CLIENT")
                        .arg("KILL")
                        .arg("TYPE")
                        .arg("normal")
                        .query(&mut server.conn());
                }
                _ => {}
            }
            let attempt = lock.try_acquire(wait, Some(Duration::from_secs(30)));
            if let Ok(Ok(guard)) = timeout(cancel_after, attempt).await {
                if step % 2 == 0 {
                    let _ = guard.release().await;
                } // else: dropped
            }
        }
    }
    // Everything cancelled, released or dropped: nothing held, nobody waiting, no connection
    // left. A cancelled attempt whose command reached the server late may hold the lock for a
    // moment until its undo releases it (within a few seconds); a leak holds it for its whole
    // 30 s lease, past this bound.
    let until = std::time::Instant::now() + LIMIT;
    let checker = client.lock("l");
    loop {
        let held = holders(&server, "l");
        let remaining = checker.remaining_lease().await.expect("pttl");
        if held.is_empty() && remaining == Remaining::NotLocked {
            break;
        }
        assert!(
            std::time::Instant::now() < until,
            "seed {seed}: still held by {held:?} ({remaining:?}); handles {:?}",
            handles.iter().map(|h| h.owner().to_owned()).collect::<Vec<_>>()
        );
        sleep(Duration::from_millis(5)).await;
    }
    let mut con = server.conn();
    poll("no waiter", LIMIT, || (blocked_clients(&mut con) == 0).then_some(()));
    // The client keeps two: its shared connection and its background releaser's (dropped
    // guards were released through it).
    poll("the connections back to the baseline", LIMIT, || {
        let now = rlock_tests_integration::info_field(&mut con, "clients", "connected_clients");
        (now <= baseline + 2).then_some(())
    });
}

/// A lease long enough that a hold it leaks is still there when the test looks.
const LONG: Duration = Duration::from_secs(60);

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
