//! The async client crate against a real redis-server with the module.

use std::sync::Arc;
use std::time::Duration;

use redis::AsyncCommands;
use rlock_client::{Error, LockClient, Options, Remaining};
use rlock_tests_integration::lock_client::client;
use rlock_tests_integration::Server;
use tokio::time::{sleep, timeout, Instant};

/// Polls an async condition every few ms for at most `limit`.
async fn eventually<F, Fut>(what: &str, limit: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let until = Instant::now() + limit;
    while !check().await {
        assert!(Instant::now() < until, "timed out after {limit:?} waiting for {what}");
        sleep(Duration::from_millis(5)).await;
    }
}

async fn subscribers(server: &Server, channel: &str) -> i64 {
    let mut con = server.client().get_multiplexed_async_connection().await.expect("con");
    let (_, n): (String, i64) = redis::cmd("PUBSUB")
        .arg("NUMSUB")
        .arg(channel)
        .query_async(&mut con)
        .await
        .expect("NUMSUB");
    n
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_release_and_the_queries() {
    let server = Server::start();
    let client = client(&server).await;
    let lock = client.lock("l");
    assert!(lock.owner().starts_with(client.id()));
    assert!(!lock.is_locked().await.expect("is_locked"));
    assert_eq!(lock.remaining_lease().await.expect("pttl"), Remaining::NotLocked);

    let guard = lock.acquire(Some(Duration::from_secs(10))).await.expect("acquire");
    assert!(lock.is_locked().await.expect("is_locked"));
    assert_eq!(lock.hold_count().await.expect("count"), 1);
    match lock.remaining_lease().await.expect("pttl") {
        Remaining::Lease(d) => assert!(d > Duration::from_secs(9) && d <= Duration::from_secs(10)),
        other => panic!("{other:?}"),
    }
    guard.release().await.expect("release");
    assert!(!lock.is_locked().await.expect("is_locked"));
    assert_eq!(lock.hold_count().await.expect("count"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reentry_is_per_handle() {
    let server = Server::start();
    let client = client(&server).await;
    let lock = client.lock("l");
    let outer = lock.acquire(Some(Duration::from_secs(30))).await.expect("outer");
    let inner = lock.clone().acquire(Some(Duration::from_secs(30))).await.expect("re-entry");
    assert_eq!(lock.hold_count().await.expect("count"), 2);

    let other = client.lock("l");
    assert_ne!(other.owner(), lock.owner());
    let refused = other.try_acquire(Duration::from_millis(50), Some(Duration::from_secs(30))).await;
    assert!(matches!(refused, Err(Error::TimedOut)), "{refused:?}");

    inner.release().await.expect("inner");
    assert_eq!(lock.hold_count().await.expect("count"), 1);
    assert!(lock.is_locked().await.expect("still locked"));
    outer.release().await.expect("outer");
    assert!(!lock.is_locked().await.expect("free"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_after_the_lease_ran_out_or_a_force_release_reports_not_held() {
    let server = Server::start();
    let client = client(&server).await;
    let lock = client.lock("l");
    let guard = lock.acquire(Some(Duration::from_millis(100))).await.expect("acquire");
    eventually("the lease to run out", Duration::from_secs(5), || async {
        !lock.is_locked().await.expect("is_locked")
    })
    .await;
    assert!(matches!(guard.release().await, Err(Error::NotHeld)));

    let guard = lock.acquire(Some(Duration::from_secs(30))).await.expect("acquire");
    assert!(client.lock("l").force_release().await.expect("force"));
    assert!(!client.lock("l").force_release().await.expect("force again"));
    assert!(matches!(guard.release().await, Err(Error::NotHeld)));
}

async fn info_int(server: &Server, section: &str, field: &str) -> i64 {
    let mut con = server.client().get_multiplexed_async_connection().await.expect("con");
    let info: String = redis::cmd("INFO").arg(section).query_async(&mut con).await.expect("INFO");
    info.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':')?.trim().parse().ok())
        .unwrap_or_else(|| panic!("INFO {section} has no {field}"))
}

async fn blocked_clients(server: &Server) -> i64 {
    info_int(server, "clients", "blocked_clients").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_is_handed_the_lock_by_the_server_on_release() {
    let server = Server::start();
    let client = client(&server).await;
    let holder = client.lock("l").acquire(Some(Duration::from_secs(60))).await.expect("holder");

    let waiter_lock = client.lock("l");
    let waiter = tokio::spawn(async move {
        waiter_lock.try_acquire(Duration::from_secs(30), Some(Duration::from_secs(30))).await
    });
    // The waiter waits in the server (not in a retry loop, not on pub/sub).
    eventually("the waiter to block", Duration::from_secs(5), || async {
        blocked_clients(&server).await == 1
    })
    .await;
    assert_eq!(subscribers(&server, "redisson_lock__channel:{l}").await, 0);
    let released_at = Instant::now();
    holder.release().await.expect("release");
    let guard = timeout(Duration::from_secs(10), waiter).await.expect("woken").expect("task");
    let guard = guard.expect("acquired");
    assert!(released_at.elapsed() < Duration::from_secs(2), "handed over at release");
    assert_eq!(guard.lock().hold_count().await.expect("count"), 1);
    guard.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_wait_leaves_the_queue_and_takes_no_lock() {
    let server = Server::start();
    let client = client(&server).await;
    let holder = client.lock("l").acquire(Some(Duration::from_secs(60))).await.expect("holder");
    let waiter = client.lock("l");
    let cancelled =
        timeout(Duration::from_millis(300), waiter.try_acquire(Duration::from_secs(30), None))
            .await;
    assert!(cancelled.is_err(), "still waiting when dropped");
    eventually(
        "the cancelled waiter to leave the server's queue",
        Duration::from_secs(5),
        || async { blocked_clients(&server).await == 0 },
    )
    .await;
    holder.release().await.expect("release");
    // Nobody is handed the lock: the cancelled waiter is gone.
    assert_eq!(client.lock("l").remaining_lease().await.expect("pttl"), Remaining::NotLocked);
    assert_eq!(waiter.hold_count().await.expect("count"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_cancelled_as_the_grant_arrives_leaves_no_lock_held() {
    let server = Server::start();
    let client = client(&server).await;
    // The three ways the race ends; the test runs until the hardest one (the cancellation won
    // but the server had already granted: the client must release that grant) was seen.
    let (mut granted_first, mut cancelled_before, mut cancelled_after) = (0, 0, 0);
    let mut round = 0;
    while round < 20 || cancelled_after == 0 {
        assert!(round < 400, "in {round} rounds the cancellation never lost to a grant");
        let handoffs = info_int(&server, "rlock", "rlock_handoffs").await;
        let holder = client.lock("l").acquire(Some(Duration::from_secs(60))).await.expect("holder");
        let waiter = client.lock("l");
        let waiting = {
            let waiter = waiter.clone();
            // If the grant wins outright, the guard is dropped here, which releases it; if the
            // cancellation wins, the client must release a grant that raced it.
            tokio::spawn(async move { waiter.try_acquire(Duration::from_secs(30), None).await })
        };
        eventually("the waiter to block", Duration::from_secs(5), || async {
            blocked_clients(&server).await == 1
        })
        .await;
        // Release and cancel at once: the grant and the cancellation race.
        let (released, ()) = tokio::join!(holder.release(), async {
            for _ in 0..round % 4 {
                tokio::task::yield_now().await;
            }
            waiting.abort();
        });
        released.expect("release");
        // Either the grant won (the task finished with a guard, dropped here, which releases)
        // or the cancellation did (the client must release a grant that raced it).
        let cancelled = match waiting.await {
            Ok(Ok(guard)) => {
                granted_first += 1;
                drop(guard);
                false
            }
            Ok(Err(e)) => panic!("round {round}: {e}"),
            Err(_) => true,
        };
        let until = Instant::now() + Duration::from_secs(10);
        while client.lock("l").remaining_lease().await.expect("pttl") != Remaining::NotLocked {
            if Instant::now() > until {
                let mut con =
                    server.client().get_multiplexed_async_connection().await.expect("con");
                let held: Vec<(String, String)> = con.hgetall("l").await.expect("hgetall");
                let info: String =
                    redis::cmd("INFO").arg("rlock").query_async(&mut con).await.expect("info");
                panic!("round {round}: still held by {held:?} (waiter {}); {info}", waiter.owner());
            }
            sleep(Duration::from_millis(5)).await;
        }
        if cancelled {
            // The server had handed the lock over before the cancellation reached it.
            if info_int(&server, "rlock", "rlock_handoffs").await > handoffs {
                cancelled_after += 1;
            } else {
                cancelled_before += 1;
            }
        }
        assert_eq!(waiter.hold_count().await.expect("count"), 0);
        assert_eq!(blocked_clients(&server).await, 0);
        round += 1;
    }
    eprintln!(
        "{round} rounds: the grant won {granted_first}, the cancellation won before the grant \
         {cancelled_before}, after it {cancelled_after}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_takes_the_lock_when_a_dead_holders_lease_runs_out() {
    let server = Server::start();
    let client = client(&server).await;
    let holder = client.lock("l").acquire(Some(Duration::from_millis(400))).await.expect("holder");
    std::mem::forget(holder); // the holder "dies": no release, no message

    let started = Instant::now();
    let guard = client
        .lock("l")
        .try_acquire(Duration::from_secs(10), Some(Duration::from_secs(30)))
        .await
        .expect("acquired after the lease");
    let waited = started.elapsed();
    assert!(waited >= Duration::from_millis(250), "it waited for the lease: {waited:?}");
    assert!(waited < Duration::from_secs(5), "retried on the PTTL: {waited:?}");
    guard.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn try_acquire_gives_up_when_the_budget_is_spent() {
    let server = Server::start();
    let client = client(&server).await;
    let holder = client.lock("l").acquire(Some(Duration::from_secs(60))).await.expect("holder");
    let started = Instant::now();
    let result = client.lock("l").try_acquire(Duration::from_millis(300), None).await;
    let waited = started.elapsed();
    assert!(matches!(result, Err(Error::TimedOut)), "{result:?}");
    // The server keeps time in whole milliseconds: its deadline may fall up to 1 ms before the
    // client's, and the WAIT budget is sent floored to a millisecond.
    assert!(waited >= Duration::from_millis(298) && waited < Duration::from_secs(3), "{waited:?}");
    holder.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_incrementing_non_atomically_under_the_lock_lose_no_update() {
    const TASKS: usize = 8;
    const INCREMENTS: usize = 50;
    let server = Server::start();
    let client = client(&server).await;
    let redis = server.client();
    let mut tasks = Vec::new();
    for _ in 0..TASKS {
        let lock = client.lock("counter-lock");
        let redis = redis.clone();
        tasks.push(tokio::spawn(async move {
            let mut con = redis.get_multiplexed_async_connection().await.expect("con");
            for _ in 0..INCREMENTS {
                let guard = lock.acquire(Some(Duration::from_secs(10))).await.expect("acquire");
                let value: i64 =
                    con.get::<_, Option<i64>>("counter").await.expect("get").unwrap_or(0);
                tokio::task::yield_now().await; // invite a lost update if the lock were broken
                let () = con.set("counter", value + 1).await.expect("set");
                guard.release().await.expect("release");
            }
        }));
    }
    for task in tasks {
        timeout(Duration::from_secs(120), task).await.expect("no deadlock").expect("task");
    }
    let mut con = redis.get_multiplexed_async_connection().await.expect("con");
    let total: i64 = con.get("counter").await.expect("get");
    assert_eq!(total, (TASKS * INCREMENTS) as i64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watchdog_keeps_the_lock_past_three_leases_and_reports_its_loss() {
    let server = Server::start();
    let options = Options::default().watchdog_timeout(Duration::from_millis(300));
    let client = LockClient::with_options(server.client(), options).await.expect("client");
    let lock = client.lock("l");
    let guard = lock.acquire(None).await.expect("acquire");
    let started = Instant::now();
    // Four leases' time: the lock must never lapse.
    while started.elapsed() < Duration::from_millis(1_200) {
        match lock.remaining_lease().await.expect("pttl") {
            Remaining::Lease(d) => assert!(d <= Duration::from_millis(300)),
            other => panic!("the lock lapsed after {:?}: {other:?}", started.elapsed()),
        }
        assert_eq!(lock.hold_count().await.expect("count"), 1);
        sleep(Duration::from_millis(50)).await;
    }
    assert!(!guard.is_lost());

    // Deleted behind the holder's back: the next renewal finds it gone.
    let mut con = server.client().get_multiplexed_async_connection().await.expect("con");
    let _: i64 = con.del("l").await.expect("del");
    timeout(Duration::from_secs(3), guard.lost()).await.expect("loss reported");
    assert!(guard.is_lost());
    assert!(matches!(guard.release().await, Err(Error::NotHeld)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_a_guard_releases_the_lock_in_the_background() {
    let server = Server::start();
    let client = client(&server).await;
    let lock = Arc::new(client.lock("l"));
    let guard = lock.acquire(None).await.expect("acquire");
    assert!(lock.is_locked().await.expect("locked"));
    drop(guard);
    eventually("the background release", Duration::from_secs(5), || async {
        !lock.is_locked().await.expect("is_locked")
    })
    .await;
}

// ---- read-write locks ----------------------------------------------------------------------

async fn hash(server: &Server, name: &str) -> Vec<(String, String)> {
    let mut con = server.client().get_multiplexed_async_connection().await.expect("con");
    let mut pairs: Vec<(String, String)> = con.hgetall(name).await.expect("HGETALL");
    pairs.sort();
    pairs
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rw_readers_share_and_a_writer_waits_for_them_in_the_server() {
    let server = Server::start();
    let client = client(&server).await;
    let (a, b, c) = (client.rw_lock("cfg"), client.rw_lock("cfg"), client.rw_lock("cfg"));
    let ra = a.read().acquire(Some(Duration::from_secs(10))).await.expect("read a");
    let rb = b.read().acquire(Some(Duration::from_secs(10))).await.expect("read b");
    assert_eq!(hash(&server, "cfg").await.len(), 3, "mode and two readers");
    let busy = c.write().try_acquire(Duration::from_millis(50), None).await;
    assert!(matches!(busy, Err(Error::TimedOut)), "{busy:?}");
    let writer = {
        let w = c.write().clone();
        tokio::spawn(async move { w.acquire(Some(Duration::from_secs(10))).await })
    };
    eventually("the writer to wait", Duration::from_secs(5), || async {
        blocked_clients(&server).await == 1
    })
    .await;
    ra.release().await.expect("release a");
    assert!(!writer.is_finished(), "a reader still holds");
    rb.release().await.expect("release b");
    let wg = timeout(Duration::from_secs(5), writer).await.expect("granted").expect("task");
    let wg = wg.expect("write guard");
    assert_eq!(wg.token(), None, "no fencing without the option");
    assert!(hash(&server, "cfg").await.contains(&("mode".to_owned(), "write".to_owned())));
    wg.release().await.expect("release the write");
    assert!(!a.read().is_locked().await.expect("is_locked"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rw_a_writer_reads_then_downgrades_and_an_upgrade_is_refused_not_waited_for() {
    let server = Server::start();
    let client = client(&server).await;
    let cfg = client.rw_lock("cfg");
    let w = cfg.write().acquire(Some(Duration::from_secs(10))).await.expect("write");
    // Write -> read on the same lock: granted at once (one owner on the server).
    let r = timeout(Duration::from_secs(2), cfg.read().acquire(Some(Duration::from_secs(10))))
        .await
        .expect("not waiting for itself")
        .expect("read");
    assert_eq!(r.owner(), w.owner(), "the two sides share the live chain's owner");
    w.release().await.expect("release the write: a downgrade");
    let mut expected =
        vec![("mode".to_owned(), "read".to_owned()), (r.owner().to_owned(), "1".to_owned())];
    expected.sort();
    assert_eq!(hash(&server, "cfg").await, expected);
    assert!(!r.is_lost());
    // Another reader may join now; a write asked while this side reads is an upgrade.
    let other = client.rw_lock("cfg");
    let r2 = other.read().acquire(Some(Duration::from_secs(10))).await.expect("join");
    let upgrade =
        timeout(Duration::from_secs(2), cfg.write().acquire(Some(Duration::from_secs(10))))
            .await
            .expect("refused at once, never a self-deadlock");
    match upgrade {
        Err(Error::UpgradeRefused) => {}
        other => panic!("{other:?}"),
    }
    r.release().await.expect("release");
    r2.release().await.expect("release");
    assert!(!cfg.read().is_locked().await.expect("is_locked"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rw_the_watchdog_keeps_read_and_write_holds_and_fencing_tokens_come_with_writes() {
    let server = Server::start();
    let options = Options::default().watchdog_timeout(Duration::from_millis(300)).fencing(true);
    let client = LockClient::with_options(server.client(), options).await.expect("client");
    let cfg = client.rw_lock("cfg");
    let r = cfg.read().acquire(None).await.expect("read");
    assert_eq!(r.token(), None, "a read hold takes no token");
    let started = Instant::now();
    while started.elapsed() < Duration::from_millis(1_200) {
        assert_eq!(
            cfg.read().hold_count().await.expect("count"),
            1,
            "after {:?}",
            started.elapsed()
        );
        sleep(Duration::from_millis(50)).await;
    }
    assert!(!r.is_lost());
    r.release().await.expect("release");
    let w = cfg.write().acquire(None).await.expect("write");
    assert!(w.token().is_some_and(|t| t > 0), "{:?}", w.token());
    let started = Instant::now();
    while started.elapsed() < Duration::from_millis(1_200) {
        assert_eq!(cfg.write().hold_count().await.expect("count"), 1);
        sleep(Duration::from_millis(50)).await;
    }
    drop(w);
    eventually("the dropped write guard's release", Duration::from_secs(5), || async {
        !cfg.write().is_locked().await.expect("is_locked")
    })
    .await;
}

// ---- semaphores -----------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn semaphore_permits_are_taken_waited_for_and_given_back() {
    let server = Server::start();
    let client = client(&server).await;
    let slots = client.semaphore("slots");
    assert!(slots.try_set_permits(2).await.expect("set"));
    assert!(!slots.try_set_permits(5).await.expect("set again"), "it exists");
    slots.acquire(2).await.expect("two");
    assert!(!slots.try_acquire(1, Duration::from_millis(50)).await.expect("try"), "none left");
    let waiter = {
        let s = slots.clone();
        tokio::spawn(async move { s.acquire(1).await })
    };
    eventually("the waiter to queue", Duration::from_secs(5), || async {
        blocked_clients(&server).await == 1
    })
    .await;
    assert_eq!(slots.release(2).await.expect("release"), 1, "one went to the waiter");
    timeout(Duration::from_secs(5), waiter).await.expect("served").expect("task").expect("ok");
    assert_eq!(slots.available().await.expect("available"), 1);
    assert_eq!(slots.add_permits(-1).await.expect("add"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_semaphore_acquire_takes_nothing() {
    let server = Server::start();
    let client = client(&server).await;
    let slots = client.semaphore("slots");
    slots.try_set_permits(0).await.expect("set");
    let cancelled = timeout(Duration::from_millis(100), slots.acquire(1)).await;
    assert!(cancelled.is_err(), "still waiting when dropped");
    eventually("the cancelled wait to leave the queue", Duration::from_secs(5), || async {
        blocked_clients(&server).await == 0
    })
    .await;
    assert_eq!(slots.release(1).await.expect("release"), 1, "nobody took the permit");
}

/// A master whose replica guard refuses grants (it may have been replaced) gives back no
/// counted permits: the client's `release` returns that refusal (nothing was given back, the
/// caller still holds the permits), and the same release goes on in the background until the
/// master grants again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_counted_release_refused_by_the_replica_guard_returns_the_refusal_and_gives_back_nothing()
{
    let server = Server::start();
    let client = client(&server).await;
    let slots = client.semaphore("slots");
    slots.try_set_permits(2).await.expect("set");
    slots.acquire(2).await.expect("two");
    let mut admin = server.client().get_multiplexed_async_connection().await.expect("con");
    let min_replicas =
        |n: &'static str| redis::cmd("CONFIG").arg("SET").arg("rlock.min-replicas").arg(n).clone();
    let _: () = min_replicas("1").query_async(&mut admin).await.expect("CONFIG SET");
    eventually("the guard to refuse", Duration::from_secs(10), || {
        let mut admin = admin.clone();
        async move {
            let probe = redis::cmd("RLOCK.ACQUIRE").arg("probe").arg("p").arg(60_000).clone();
            let reply: redis::RedisResult<redis::Value> = probe.query_async(&mut admin).await;
            reply.is_err_and(|e| e.code() == Some("NOREPLICAS"))
        }
    })
    .await;
    let refused = match slots.release(1).await {
        Err(Error::Redis(e)) if e.code() == Some("NOREPLICAS") => e.to_string(),
        other => panic!("not refused as the guard refuses: {other:?}"),
    };
    assert!(refused.contains("gives back no permits"), "{refused}");
    assert_eq!(slots.available().await.expect("available"), 0, "nothing given back");
    let _: () = min_replicas("0").query_async(&mut admin).await.expect("CONFIG SET");
    // The refused release goes on in the background (the caller must not release those
    // permits again): it gives its permit back once the master grants again, exactly once.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while slots.available().await.expect("available") != 1 {
        assert!(tokio::time::Instant::now() < deadline, "the refused release never went on");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(slots.release(1).await.expect("release"), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leased_permits_are_renewed_by_the_watchdog_released_by_id_and_on_drop() {
    let server = Server::start();
    let options = Options::default().watchdog_timeout(Duration::from_millis(300));
    let client = LockClient::with_options(server.client(), options).await.expect("client");
    let workers = client.leased_semaphore("workers");
    assert!(workers.try_set_permits(2).await.expect("set"));
    let permit = workers.acquire(1, None).await.expect("acquire");
    assert_eq!(permit.ids().len(), 1);
    assert_eq!(permit.ids()[0].len(), 16);
    let started = Instant::now();
    while started.elapsed() < Duration::from_millis(1_200) {
        assert_eq!(workers.available().await.expect("available"), 1, "still leased");
        sleep(Duration::from_millis(50)).await;
    }
    assert!(!permit.is_lost());
    permit.release().await.expect("release");
    assert_eq!(workers.available().await.expect("available"), 2);

    // Without a watchdog the lease ends it: the server takes the permit back.
    let short = workers.acquire(2, Some(Duration::from_millis(200))).await.expect("two");
    eventually("the leases to end", Duration::from_secs(5), || async {
        workers.available().await.expect("available") == 2
    })
    .await;
    assert!(matches!(short.release().await, Err(Error::NotHeld)));
    // A dropped guard gives its permits back.
    let dropped = workers.try_acquire(2, Duration::from_secs(1), None).await.expect("two");
    assert_eq!(workers.available().await.expect("available"), 0);
    drop(dropped);
    eventually("the dropped guard's release", Duration::from_secs(5), || async {
        workers.available().await.expect("available") == 2
    })
    .await;
}
