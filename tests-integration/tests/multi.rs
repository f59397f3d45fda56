//! Beyond one server: replica acknowledgement, MultiLock and RedLock over independent servers.

use std::time::Duration;

use redis::AsyncCommands;
use rlock_client::{Error, LockClient, MultiLock, Options, RedLock, Remaining};
use rlock_tests_integration::{wait_replica_online, Server};
use tokio::time::{timeout, Instant};

async fn clients(servers: &[Server]) -> Vec<LockClient> {
    let mut clients = Vec::new();
    for s in servers {
        clients.push(LockClient::open(s.url()).await.expect("client"));
    }
    clients
}

fn servers(n: usize) -> Vec<Server> {
    (0..n).map(|_| Server::start()).collect()
}

async fn holder_of(server: &Server, name: &str) -> Vec<(String, i64)> {
    let mut con = server.client().get_multiplexed_async_connection().await.expect("con");
    let mut pairs: Vec<(String, i64)> = con.hgetall(name).await.expect("HGETALL");
    pairs.sort();
    pairs
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_replica_ack_an_acquired_lock_is_on_the_replica_and_survives_its_promotion() {
    let master = Server::start();
    let replica = Server::builder().without_module().replica_of(&master).start();
    wait_replica_online(&master);
    let options = Options::default().replica_ack(1, Duration::from_secs(5));
    let client = LockClient::with_options(master.client(), options.clone()).await.expect("client");
    let lock = client.lock("l");
    let guard =
        lock.acquire(Some(Duration::from_secs(60))).await.expect("acquired and acknowledged");
    // No polling: acknowledged means already on the replica.
    assert_eq!(holder_of(&replica, "l").await, vec![(guard.owner().to_owned(), 1)]);

    // The server-side wait path acknowledges too.
    let waiter_client = LockClient::with_options(master.client(), options).await.expect("client");
    let waiter = waiter_client.lock("l");
    let waiting = {
        let waiter = waiter.clone();
        tokio::spawn(async move { waiter.acquire(Some(Duration::from_secs(60))).await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await; // let it queue (either way it must pass)
    guard.release().await.expect("release");
    let granted = timeout(Duration::from_secs(10), waiting).await.expect("granted").expect("task");
    let granted = granted.expect("acknowledged grant");
    assert_eq!(holder_of(&replica, "l").await, vec![(granted.owner().to_owned(), 1)]);

    // Fail over to the replica: the lock is still held there, with its lease.
    let mut r = replica.conn();
    let () = redis::cmd("REPLICAOF").arg("NO").arg("ONE").query(&mut r).expect("promote");
    assert_eq!(holder_of(&replica, "l").await, vec![(granted.owner().to_owned(), 1)]);
    let pttl: i64 = redis::cmd("PTTL").arg("l").query(&mut r).expect("PTTL");
    assert!(pttl > 50_000, "the lease came along: {pttl}");
    std::mem::forget(granted); // the old master is gone for this client
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_enough_replicas_the_grant_is_released_and_reported() {
    let master = Server::start();
    let options = Options::default().replica_ack(1, Duration::from_millis(200));
    let client = LockClient::with_options(master.client(), options).await.expect("client");
    let lock = client.lock("l");
    let started = Instant::now();
    let result = lock.acquire(Some(Duration::from_secs(60))).await;
    assert!(
        matches!(result, Err(Error::NotReplicated { wanted: 1, acknowledged: 0 })),
        "{result:?}"
    );
    assert!(started.elapsed() >= Duration::from_millis(200));
    assert_eq!(lock.remaining_lease().await.expect("pttl"), Remaining::NotLocked, "released");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multilock_is_taken_on_all_servers_or_none() {
    let servers = servers(3);
    let clients = clients(&servers).await;
    let multi = MultiLock::new(clients.iter().map(|c| c.lock("m")).collect());
    let other = clients[1].lock("m");
    let blocker = other.acquire(Some(Duration::from_secs(60))).await.expect("blocker");

    let result = multi.try_acquire(Duration::from_millis(300), Some(Duration::from_secs(30))).await;
    assert!(matches!(result, Err(Error::TimedOut)), "{result:?}");
    for (i, s) in servers.iter().enumerate() {
        let expected = if i == 1 { vec![(blocker.owner().to_owned(), 1)] } else { vec![] };
        assert_eq!(holder_of(s, "m").await, expected, "server {i}: nothing left behind");
    }

    // Freed while the MultiLock waits: it takes all three.
    let waiting = {
        let multi = multi.clone();
        tokio::spawn(async move {
            multi.try_acquire(Duration::from_secs(10), Some(Duration::from_secs(30))).await
        })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    blocker.release().await.expect("release");
    let guard =
        timeout(Duration::from_secs(10), waiting).await.expect("done").expect("task").expect("all");
    for (i, s) in servers.iter().enumerate() {
        let held = holder_of(s, "m").await;
        assert_eq!(held.len(), 1, "server {i}: {held:?}");
        let pttl: i64 = redis::cmd("PTTL").arg("m").query(&mut s.conn()).expect("PTTL");
        assert!(pttl > 25_000 && pttl <= 30_000, "server {i}: the real lease is set: {pttl}");
    }
    guard.release().await.expect("release all");
    for s in &servers {
        assert!(holder_of(s, "m").await.is_empty());
    }
}

/// Takes `name` with another owner on the servers in `busy`.
async fn make_busy(clients: &[LockClient], busy: &[usize], name: &str) {
    for &i in busy {
        let blocker = clients[i].lock(name);
        let guard = blocker.acquire(Some(Duration::from_secs(60))).await.expect("blocker");
        std::mem::forget(guard);
    }
}

async fn clean(clients: &[LockClient], name: &str) {
    for c in clients {
        c.lock(name).force_release().await.expect("force release");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_answers_right_for_every_subset_of_busy_nodes() {
    for n in [3usize, 5] {
        let servers = servers(n);
        let clients = clients(&servers).await;
        let quorum = n / 2 + 1;
        for mask in 0u32..(1 << n) {
            let busy: Vec<usize> = (0..n).filter(|i| mask & (1 << i) != 0).collect();
            make_busy(&clients, &busy, "r").await;
            let redlock = RedLock::new(&clients, "r");
            let result = redlock.try_acquire(Duration::ZERO, Some(Duration::from_secs(10))).await;
            let free = n - busy.len();
            match result {
                Ok(guard) => {
                    assert!(
                        free >= quorum,
                        "{n} nodes, busy {busy:?}: acquired without a majority"
                    );
                    let validity = guard.validity().expect("validity");
                    assert!(
                        validity > Duration::from_secs(9) && validity < Duration::from_secs(10)
                    );
                    guard.release().await.expect("release");
                }
                Err(Error::TimedOut) => {
                    assert!(
                        free < quorum,
                        "{n} nodes, busy {busy:?}: refused with a majority free"
                    );
                    // A failed attempt leaves nothing behind on the free nodes.
                    for i in (0..n).filter(|i| !busy.contains(i)) {
                        assert!(holder_of(&servers[i], "r").await.is_empty(), "node {i}");
                    }
                }
                Err(e) => panic!("{e}"),
            }
            clean(&clients, "r").await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_survives_a_stopped_minority_and_fails_in_time_without_a_majority() {
    for n in [3usize, 5] {
        let servers = servers(n);
        let clients = clients(&servers).await;
        let minority = n / 2;
        for s in &servers[..minority] {
            s.pause();
        }
        let redlock = RedLock::new(&clients, "r");
        let guard = redlock
            .try_acquire(Duration::from_secs(2), Some(Duration::from_secs(10)))
            .await
            .unwrap_or_else(|e| panic!("{n} nodes, {minority} stopped: {e}"));
        guard.release().await.expect("release on the live majority");

        servers[minority].pause(); // now a majority is stopped
        let budget = Duration::from_millis(500);
        let started = Instant::now();
        let result = redlock.try_acquire(budget, Some(Duration::from_secs(10))).await;
        let took = started.elapsed();
        assert!(matches!(result, Err(Error::TimedOut)), "{n} nodes: {result:?}");
        // Gives up about when the budget ends (a loaded machine may add a second, not more).
        assert!(took < budget + Duration::from_millis(1500), "{n} nodes: gave up after {took:?}");
        for s in &servers[..=minority] {
            s.resume();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_tasks_incrementing_under_a_redlock_lose_nothing() {
    const TASKS: usize = 8;
    const INCREMENTS: usize = 25;
    let servers = servers(3);
    let clients = clients(&servers).await;
    let counter = servers[0].client();
    let mut tasks = Vec::new();
    for _ in 0..TASKS {
        let redlock =
            RedLock::new(&clients, "counter-lock").node_timeout(Duration::from_millis(200));
        let counter = counter.clone();
        tasks.push(tokio::spawn(async move {
            let mut con = counter.get_multiplexed_async_connection().await.expect("con");
            for _ in 0..INCREMENTS {
                let guard = redlock
                    .try_acquire(Duration::from_secs(60), Some(Duration::from_secs(10)))
                    .await
                    .expect("redlock");
                let v: Option<i64> = con.get("counter").await.expect("get");
                tokio::task::yield_now().await;
                let () = con.set("counter", v.unwrap_or(0) + 1).await.expect("set");
                guard.release().await.expect("release");
            }
        }));
    }
    for t in tasks {
        timeout(Duration::from_secs(120), t).await.expect("no deadlock").expect("task");
    }
    let mut con = counter.get_multiplexed_async_connection().await.expect("con");
    let total: i64 = con.get("counter").await.expect("get");
    assert_eq!(total, (TASKS * INCREMENTS) as i64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redlock_watchdog_keeps_the_quorum_and_reports_its_loss() {
    let servers = servers(3);
    let mut clients = Vec::new();
    for s in &servers {
        let options = Options::default().watchdog_timeout(Duration::from_millis(300));
        clients.push(LockClient::with_options(s.client(), options).await.expect("client"));
    }
    let redlock = RedLock::new(&clients, "w");
    let guard = redlock.try_acquire(Duration::from_secs(2), None).await.expect("acquire");
    tokio::time::sleep(Duration::from_millis(1_000)).await; // over three leases
    assert!(!guard.is_lost());
    for (i, s) in servers.iter().enumerate() {
        assert_eq!(holder_of(s, "w").await.len(), 1, "node {i} still held");
    }
    // Two of three deleted behind its back: the quorum is gone.
    for s in &servers[..2] {
        let mut con = s.client().get_multiplexed_async_connection().await.expect("con");
        let _: i64 = con.del("w").await.expect("del");
    }
    if timeout(Duration::from_secs(3), guard.lost()).await.is_err() {
        let mut held = Vec::new();
        for s in &servers {
            let mut con = s.client().get_multiplexed_async_connection().await.expect("con");
            let pttl: i64 = redis::cmd("PTTL").arg("w").query_async(&mut con).await.expect("PTTL");
            held.push((holder_of(s, "w").await, pttl));
        }
        panic!("no loss reported in 3 s: {guard:?}; each node's hash and PTTL: {held:?}");
    }
    assert!(matches!(guard.release().await, Err(Error::NotHeld)));
}

/// A RedLock whose quorum is lost by two servers at once (their watchdogs renew on the same
/// grid, so both losses land together) reports the loss every time: a loss that lands while the
/// guard is between two looks at its members is never missed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quorum_lost_on_two_servers_at_once_is_always_reported() {
    let servers = servers(3);
    let mut clients = Vec::new();
    for s in &servers {
        let options = Options::default().watchdog_timeout(Duration::from_millis(150));
        clients.push(LockClient::with_options(s.client(), options).await.expect("client"));
    }
    let mut cons = Vec::new();
    for s in &servers[..2] {
        cons.push(s.client().get_multiplexed_async_connection().await.expect("con"));
    }
    for round in 0..20 {
        let name = format!("both{round}");
        let redlock = RedLock::new(&clients, &name);
        let guard = redlock.try_acquire(Duration::from_secs(2), None).await.expect("acquire");
        let dels = cons.iter_mut().map(|con| {
            let name = name.clone();
            async move {
                let _: i64 = con.del(&name).await.expect("del");
            }
        });
        futures_util::future::join_all(dels).await;
        if timeout(Duration::from_secs(2), guard.lost()).await.is_err() {
            panic!("round {round}: no loss reported in 2 s: {guard:?}");
        }
    }
}
