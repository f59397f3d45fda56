//! Guards dropped without `release()`, and opening a client without `COMMAND INFO`: a drop
//! never blocks the dropping thread, and the release reaches the server that serves the lock now
//! (a Sentinel group's current master, any reachable cluster node), after a stall, outside any
//! runtime, or at the end of a `current_thread` `block_on`; a user without `COMMAND` opens a
//! client and locks, and an unknown rlock command is `NoModule`.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use tokio::time::{sleep, Instant};

use rlock_client::{Error, LockClient, LockGuard, MultiLock, Options};
use rlock_tests_integration::lock_client::{acl_user, available, has_key, sentinel_client};
use rlock_tests_integration::{
    blocked_clients, hgetall, is_master, poll, wait_link_up, Cluster, Proxy, Sentinel, Server,
    SENTINEL_MASTER,
};

/// How long a dropped guard's release may take to show (leases are 30 s or more).
const RELEASED: Duration = Duration::from_secs(10);

/// How long a drop may block the dropping thread.
const AT_ONCE: Duration = Duration::from_millis(50);

const FAILOVER_LIMIT: Duration = Duration::from_secs(40);

const LEASE: Option<Duration> = Some(Duration::from_secs(60));

/// Polls (blocking this thread: the releaser runs on its own) until `server` no longer holds
/// `name`.
fn until_released(server: &Server, name: &str, what: &str) {
    poll(what, RELEASED, || (!has_key(server, name)).then_some(()));
}

/// Drops `value`, returning how long the drop took.
fn timed_drop<T>(value: T) -> Duration {
    let started = std::time::Instant::now();
    drop(value);
    started.elapsed()
}

// ---- a Sentinel group: releases reach its current master ----------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_a_guard_dropped_after_a_connection_error_is_released() {
    let master = Server::start();
    let sentinel = Sentinel::start(&master, 1, 30_000);
    let client = sentinel_client(&sentinel).await;
    let guard = client.lock("l").acquire(LEASE).await.expect("acquire");
    // The client's connections are killed; its next command fails with a connection error.
    let killed: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("normal")
        .query(&mut master.conn())
        .expect("CLIENT KILL");
    assert!(killed >= 1, "the client's connection was killed");
    let failed = client.lock("other").is_locked().await;
    assert!(matches!(failed, Err(Error::Redis(_))), "a connection error: {failed:?}");
    let took = timed_drop(guard);
    assert!(took < AT_ONCE, "the drop took {took:?}");
    until_released(&master, "l", "the dropped guard's release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_a_guard_dropped_after_a_failover_is_released_on_the_new_master() {
    let (master, replica, sentinel, client) = sentinel_group().await;
    // One guard dropped before the failover: the releaser knows (and keeps a connection to)
    // the old master.
    releaser_knows(&client, &master).await;
    let guard = held_then_failed_over(&client, &sentinel, &replica).await;
    poll("the old master to be demoted", FAILOVER_LIMIT, || (!is_master(&master)).then_some(()));
    assert!(has_key(&replica, "l"), "the new master has the hold");
    let took = timed_drop(guard);
    assert!(took < AT_ONCE, "the drop took {took:?}");
    until_released(&replica, "l", "the release on the new master");
}

/// A master, its replica (link up), one Sentinel and a client that follows it.
async fn sentinel_group() -> (Server, Server, Sentinel, LockClient) {
    let master = Server::start();
    let replica = Server::builder().replica_of(&master).start();
    wait_link_up(&mut replica.conn());
    let sentinel = Sentinel::start(&master, 1, 30_000);
    let client = sentinel_client(&sentinel).await;
    (master, replica, sentinel, client)
}

/// A guard dropped and released on `master`: the client's releaser now knows (and keeps a
/// connection to) that master.
async fn releaser_knows(client: &LockClient, master: &Server) {
    let before = client.lock("before").acquire(LEASE).await.expect("acquire");
    drop(before);
    until_released(master, "before", "the first dropped guard's release");
}

/// `l` held and replicated to `replica`, then a manual failover to it.
async fn held_then_failed_over(
    client: &LockClient,
    sentinel: &Sentinel,
    replica: &Server,
) -> LockGuard {
    let guard = client.lock("l").acquire(LEASE).await.expect("acquire");
    poll("the hold to reach the replica", FAILOVER_LIMIT, || has_key(replica, "l").then_some(()));
    fail_over(sentinel, replica);
    guard
}

/// A manual failover of the Sentinel's master to `replica`, returning once the Sentinel names
/// it and it answers as a master (the old master is demoted seconds later).
fn fail_over(sentinel: &Sentinel, replica: &Server) {
    sentinel.fail_over_to(replica, FAILOVER_LIMIT);
    poll("the replica to answer as master", FAILOVER_LIMIT, || is_master(replica).then_some(()));
}

/// The old master keeps answering as a master for seconds after `SENTINEL FAILOVER` (until the
/// Sentinel demotes it) and would release there; the releaser asks the Sentinels first, so a
/// guard dropped in that window is released on the new master.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_guard_dropped_before_the_old_master_is_demoted_is_released_on_the_new_one() {
    let (master, replica, sentinel, client) = sentinel_group().await;
    // The releaser's connection to the old master, made before the failover.
    releaser_knows(&client, &master).await;
    let guard = held_then_failed_over(&client, &sentinel, &replica).await;
    assert!(is_master(&master), "the old master still answers as a master (not demoted yet)");
    let took = timed_drop(guard);
    assert!(took < AT_ONCE, "the drop took {took:?}");
    until_released(&replica, "l", "the release on the new master");
}

/// The same window for an explicit `release()` (on the client's shared connection, which no
/// error has moved off the old master yet): it asks the Sentinels first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_guard_released_before_the_old_master_is_demoted_is_released_on_the_new_one() {
    let (master, replica, sentinel, client) = sentinel_group().await;
    let guard = held_then_failed_over(&client, &sentinel, &replica).await;
    assert!(is_master(&master), "the old master still answers as a master (not demoted yet)");
    guard.release().await.expect("release");
    assert!(!has_key(&replica, "l"), "the release reached the new master");
}

/// Right after `SENTINEL FAILOVER` (the old master still answers as a master until the Sentinel
/// demotes it, and no error has moved the client off it yet), a counted permit release, a
/// latch's count-down and a latch wait go to the new master, as lock releases do: the client
/// asks the Sentinels first. Before, they went to the cached old master: the permit and the
/// count-down were lost with it, and the wait blocked there while the latch opened elsewhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permit_releases_and_latch_commands_right_after_a_failover_reach_the_new_master() {
    let (master, replica, sentinel, client) = sentinel_group().await;
    let (permits, latch) = (client.semaphore("s"), client.latch("gate"));
    assert!(permits.try_set_permits(1).await.expect("set permits"));
    assert!(latch.try_set_count(2).await.expect("set count"));
    poll("the latch on the replica", FAILOVER_LIMIT, || {
        let count: Option<i64> = redis::cmd("GET").arg("gate").query(&mut replica.conn()).ok()?;
        (count == Some(2)).then_some(())
    });
    fail_over(&sentinel, &replica);
    assert!(is_master(&master), "the old master still answers as a master (not demoted yet)");
    let waiting = tokio::spawn({
        let latch = latch.clone();
        async move { latch.wait(Some(Duration::from_secs(5))).await }
    });
    poll("the wait to block", FAILOVER_LIMIT, || {
        (blocked_clients(&mut master.conn()) + blocked_clients(&mut replica.conn()) > 0)
            .then_some(())
    });
    permits.release(1).await.expect("release a permit");
    assert_eq!(available(&replica, "s"), 2, "the permit went back on the new master");
    latch.count_down().await.expect("count down");
    latch.count_down().await.expect("count down");
    let exists: i64 = redis::cmd("EXISTS").arg("gate").query(&mut replica.conn()).expect("EXISTS");
    assert_eq!(exists, 0, "the latch opened on the new master");
    let opened = tokio::time::timeout(Duration::from_secs(3), waiting).await;
    assert!(matches!(opened, Ok(Ok(Ok(true)))), "the wait saw it open: {opened:?}");
}

/// Sentinels that stop answering (a silent network: connections accepted, nothing answered)
/// hold no release: the releaser asks them at most half a second before a try, then sends it to
/// the master it knows (and asks again at its next try). Two silent Sentinels cost a release
/// without that cap their connection timeouts, one after the other (about 2 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guard_dropped_while_the_sentinels_are_silent_is_released_within_the_refresh_cap() {
    let master = Server::start();
    let sentinel = Sentinel::start(&master, 1, 30_000);
    let proxies = [Proxy::start(sentinel.port()), Proxy::start(sentinel.port())];
    let urls: Vec<String> = proxies.iter().map(Proxy::url).collect();
    let options = Options::default();
    let client = LockClient::sentinel(
        urls.iter().map(String::as_str).collect(),
        SENTINEL_MASTER,
        "redis://127.0.0.1/",
        options,
    )
    .await
    .expect("sentinel client");
    releaser_knows(&client, &master).await;
    let guard = client.lock("l").acquire(LEASE).await.expect("acquire");
    proxies.iter().for_each(Proxy::cut);
    let dropped = std::time::Instant::now();
    let took = timed_drop(guard);
    assert!(took < AT_ONCE, "the drop took {took:?}");
    until_released(&master, "l", "the release while the Sentinels are silent");
    let released = dropped.elapsed();
    assert!(released < Duration::from_millis(1_300), "released {released:?} after the drop");
}

// ---- a cluster whose first seed node is down ----------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_guards_dropped_while_the_first_seed_node_is_down_are_released() {
    // Without full coverage, the other nodes keep serving their slots while node 0 is down.
    let cluster = Cluster::start_with(3, &[("cluster-require-full-coverage", "no")]);
    let urls: Vec<String> = cluster.nodes.iter().map(Server::url).collect();
    let client = LockClient::cluster(urls, Options::default()).await.expect("cluster client");
    let keys = [cluster.key_on(1, "drop:"), cluster.key_on(2, "drop:")];
    let mut guards = Vec::new();
    for key in &keys {
        guards.push(client.lock(key).acquire(LEASE).await.expect("acquire"));
    }
    cluster.nodes[0].pause();
    for (i, (key, guard)) in keys.iter().zip(guards).enumerate() {
        let took = timed_drop(guard);
        let node = &cluster.nodes[i + 1];
        poll("the release on a healthy node", RELEASED, || {
            hgetall(&mut node.conn(), key.as_bytes()).is_empty().then_some(())
        });
        assert!(took < AT_ONCE, "the drop took {took:?}");
    }
    cluster.nodes[0].resume();
}

// ---- drops never block --------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guard_dropped_while_its_server_stalls_returns_at_once_and_is_released_after() {
    let server = Server::start();
    let client = LockClient::open(server.url()).await.expect("client");
    let guard = client.lock("l").acquire(LEASE).await.expect("acquire");
    server.pause();
    let took = timed_drop(guard);
    sleep(Duration::from_millis(1_500)).await; // the stall goes on past the drop
    server.resume();
    assert!(took < AT_ONCE, "the drop took {took:?}");
    until_released(&server, "l", "the release after the stall");
}

#[tokio::test]
async fn a_stalled_drop_in_a_current_thread_runtime_does_not_freeze_other_watchdogs() {
    let (stalled, healthy) = (Server::start(), Server::start());
    let options = Options::default().watchdog_timeout(Duration::from_millis(600));
    let one = LockClient::open(stalled.url()).await.expect("client");
    let two = LockClient::with_options(healthy.client(), options).await.expect("client");
    let dropped = one.lock("l").acquire(LEASE).await.expect("acquire");
    let kept = two.lock("w").acquire(None).await.expect("watchdog guard (600 ms)");
    stalled.pause();
    let took = timed_drop(dropped);
    // Two leases of the watchdog guard later, on this (only) runtime thread: still held.
    sleep(Duration::from_millis(1_200)).await;
    stalled.resume();
    assert!(took < AT_ONCE, "the drop took {took:?}");
    assert!(!kept.is_lost(), "the watchdog kept renewing");
    let holders = hgetall(&mut healthy.conn(), b"w");
    assert_eq!(holders, vec![(kept.owner().as_bytes().to_vec(), b"1".to_vec())]);
    until_released(&stalled, "l", "the release after the stall");
    kept.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multiguard_dropped_while_a_server_stalls_returns_at_once() {
    let servers: Vec<Server> = (0..3).map(|_| Server::start()).collect();
    let mut clients = Vec::new();
    for s in &servers {
        clients.push(LockClient::open(s.url()).await.expect("client"));
    }
    let multi = MultiLock::new(clients.iter().map(|c| c.lock("m")).collect());
    let guard = multi.acquire(LEASE).await.expect("multi");
    servers[1].pause();
    let took = timed_drop(guard);
    sleep(Duration::from_millis(500)).await;
    servers[1].resume();
    assert!(took < AT_ONCE, "the drop took {took:?}");
    for (i, s) in servers.iter().enumerate() {
        until_released(s, "m", &format!("the release on server {i}"));
    }
}

// ---- dropping the last handle never freezes the caller's runtime ------------------------------

/// How long a task of the runtime may go without running while the client's last handle drops
/// (a frozen runtime, waiting for a stalled server's releases, stops it for seconds).
const NO_FREEZE: Duration = Duration::from_millis(400);

/// Runs a task ticking every 10 ms on the current runtime for `window`, and returns the longest
/// time it went without running.
async fn longest_pause_within(window: Duration) -> Duration {
    let longest = std::sync::Arc::new(std::sync::Mutex::new(Duration::ZERO));
    let ticker = {
        let longest = std::sync::Arc::clone(&longest);
        tokio::spawn(async move {
            let mut last = Instant::now();
            loop {
                sleep(Duration::from_millis(10)).await;
                let gap = last.elapsed();
                last = Instant::now();
                let mut longest = longest.lock().expect("lock");
                *longest = (*longest).max(gap);
            }
        })
    };
    sleep(window).await;
    sleep(Duration::from_millis(30)).await; // the ticker runs once more after a freeze
    ticker.abort();
    let longest = *longest.lock().expect("lock");
    longest
}

/// The last handle of a client with a release pending on a stalled server, dropped in a
/// `current_thread` runtime: the drop returns at once, the runtime runs on (another client's
/// watchdog keeps its lock), and the release is done once the server resumes.
#[tokio::test]
async fn dropping_the_last_handle_with_a_release_pending_never_freezes_the_runtime() {
    let (stalled, healthy) = (Server::start(), Server::start());
    let options = Options::default().watchdog_timeout(Duration::from_millis(600));
    let one = LockClient::open(stalled.url()).await.expect("client");
    let two = LockClient::with_options(healthy.client(), options).await.expect("client");
    let dropped = one.lock("l").acquire(LEASE).await.expect("acquire");
    let kept = two.lock("w").acquire(None).await.expect("watchdog guard (600 ms)");
    stalled.pause();
    drop(dropped); // its release waits for the server
    let took = timed_drop(one); // the last handle
    let longest = longest_pause_within(Duration::from_millis(1_200)).await;
    stalled.resume();
    assert!(took < AT_ONCE, "dropping the last handle took {took:?}");
    assert!(longest < NO_FREEZE, "the runtime stood still for {longest:?}");
    assert!(!kept.is_lost(), "the other client's watchdog kept renewing");
    until_released(&stalled, "l", "the release after the stall");
    kept.release().await.expect("release");
}

/// Nothing dropped by the caller while anything is pending: an acquire waiting in the server,
/// the server stalled, the client's handles given up; the acquire times out and its own tasks
/// (the caller's future, the library's waiting task) end with the last handle of the client,
/// its cancellation pending. The runtime never stands still, and the cancellation is done once
/// the server resumes.
#[tokio::test]
async fn a_timed_out_acquire_ending_with_the_last_handle_never_freezes_the_runtime() {
    let server = Server::start();
    let mut con = server.conn();
    redis::cmd("RLOCK.ACQUIRE").arg("l").arg("someone").arg(60_000).exec(&mut con).expect("hold");
    let client = LockClient::open(server.url()).await.expect("client");
    let lock = client.lock("l");
    let waiter =
        tokio::spawn(async move { lock.try_acquire(Duration::from_millis(800), LEASE).await });
    let started = Instant::now();
    while blocked_clients(&mut con) == 0 {
        assert!(started.elapsed() < RELEASED, "the acquire never waited in the server");
        sleep(Duration::from_millis(10)).await;
    }
    server.pause();
    drop(client); // the waiting acquire's task and future hold the last handles
    let longest = longest_pause_within(Duration::from_millis(2_500)).await;
    server.resume();
    let outcome = waiter.await.expect("the acquire's task");
    assert!(matches!(outcome, Err(Error::TimedOut)), "{outcome:?}");
    assert!(longest < NO_FREEZE, "the runtime stood still for {longest:?}");
    poll("the acquire's cancellation", RELEASED, || {
        let holders = hgetall(&mut server.conn(), b"l");
        (holders == vec![(b"someone".to_vec(), b"1".to_vec())] && blocked_clients(&mut con) == 0)
            .then_some(())
    });
}

// ---- guards dropped where no runtime runs again -------------------------------------------------

#[test]
fn a_permit_guard_dropped_at_the_end_of_a_current_thread_block_on_is_released() {
    let server = Server::start();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("rt");
    runtime.block_on(async {
        let client = LockClient::open(server.url()).await.expect("client");
        let sem = client.leased_semaphore("s");
        assert!(sem.try_set_permits(1).await.expect("set"));
        let _permit = sem.acquire(1, LEASE).await.expect("acquire");
        // `main` ends here: the guard drops, and the runtime never runs again.
    });
    drop(runtime);
    assert_eq!(available(&server, "s"), 1, "the permit is back");
}

#[test]
fn a_permit_guard_dropped_outside_any_runtime_is_released() {
    let server = Server::start();
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("rt");
    let permit = runtime.block_on(async {
        let client = LockClient::open(server.url()).await.expect("client");
        let sem = client.leased_semaphore("s");
        assert!(sem.try_set_permits(1).await.expect("set"));
        sem.acquire(1, LEASE).await.expect("acquire")
    });
    drop(runtime);
    assert_eq!(available(&server, "s"), 0);
    drop(permit); // on a plain thread, the runtime gone
    assert_eq!(available(&server, "s"), 1, "the permit is back");
}

#[test]
fn a_lock_guard_dropped_while_its_client_lives_on_is_released() {
    let server = Server::start();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("rt");
    let client = runtime.block_on(async {
        let client = LockClient::open(server.url()).await.expect("client");
        let _guard = client.lock("l").acquire(LEASE).await.expect("acquire");
        client
    });
    // The client lives on (nothing flushes it); the runtime does not run: released anyway.
    until_released(&server, "l", "the dropped guard's release");
    drop(client);
}

// ---- no COMMAND INFO needed; an unknown rlock command is NoModule -------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_without_command_info_opens_and_locks() {
    let server = Server::start();
    let everything_but_command = acl_user(&server, "app", &["~*", "&*", "+@all", "-command"]);
    let only_locks = acl_user(
        &server,
        "locks",
        &[
            "~app:*",
            "~redisson_unlock_latch:*",
            // Every acquire carries a request id: its record, and its cancellation.
            "~rlock_request:*",
            "&redisson_lock__channel:*",
            "+rlock.acquire",
            "+rlock.release",
            "+rlock.renew",
            "+rlock.pttl",
            "+rlock.cancel",
        ],
    );
    for url in [everything_but_command, only_locks] {
        let client = LockClient::open(url.as_str()).await.unwrap_or_else(|e| panic!("{url}: {e}"));
        let lock = client.lock("app:l");
        let guard = lock.acquire(LEASE).await.expect("acquire");
        assert!(lock.is_locked().await.expect("is_locked"));
        guard.release().await.expect("release");
        assert!(!has_key(&server, "app:l"));
        // A dropped guard is released with the same user's rights.
        let guard = lock.acquire(LEASE).await.expect("acquire");
        drop(guard);
        until_released(&server, "app:l", "the dropped guard's release");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_without_the_module_is_no_module_for_a_user_without_command_info() {
    let server = Server::builder().without_module().start();
    let url = acl_user(&server, "app", &["~*", "&*", "+@all", "-command"]);
    let result = LockClient::open(url.as_str()).await;
    assert!(matches!(result, Err(Error::NoModule)), "{result:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_rlock_command_is_no_module_anywhere() {
    let server = Server::builder().config("enable-module-command", "yes").start();
    let client = LockClient::open(server.url()).await.expect("client");
    let () = redis::cmd("MODULE")
        .arg("UNLOAD")
        .arg("rlock")
        .query(&mut server.conn())
        .expect("MODULE UNLOAD");
    let acquired = client.lock("l").try_acquire(Duration::from_secs(5), LEASE).await;
    assert!(matches!(acquired, Err(Error::NoModule)), "{acquired:?}");
    let locked = client.lock("l").is_locked().await;
    assert!(matches!(locked, Err(Error::NoModule)), "{locked:?}");
    let available = client.semaphore("s").available().await;
    assert!(matches!(available, Err(Error::NoModule)), "{available:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drops_stay_prompt_under_many_guards() {
    // Many guards dropped at once, on a live server: every one released, none blocking.
    let server = Server::start();
    let client = LockClient::open(server.url()).await.expect("client");
    let mut guards = Vec::new();
    for i in 0..200 {
        guards.push(client.lock(format!("many:{i}")).acquire(LEASE).await.expect("acquire"));
    }
    let started = Instant::now();
    drop(guards);
    assert!(started.elapsed() < Duration::from_millis(200), "{:?}", started.elapsed());
    let mut con = server.conn();
    poll("every dropped guard's release", RELEASED, || {
        let keys: Vec<String> = redis::cmd("KEYS").arg("many:*").query(&mut con).ok()?;
        keys.is_empty().then_some(())
    });
}

// ---- the end of a runtime: guards dropped as it shuts down -------------------------------------

/// How long a runtime's shutdown may take once its last guards were dropped (the releaser's
/// flush waits up to 5 s for releases that are not answered; these are answered in ms).
const SHUTDOWN: Duration = Duration::from_secs(1);

/// Guards of every kind dropped as the body of `block_on` ends (the end of an async `main` or
/// a `#[tokio::test]`), on both runtime flavours: the runtime's shutdown returns as soon as the
/// releases are answered, not after the flush's bound, and every lock and permit is free.
#[test]
fn guards_dropped_at_the_end_of_a_runtime_let_it_shut_down_as_soon_as_released() {
    let server = Server::start();
    for multi_thread in [false, true] {
        let mut builder = if multi_thread {
            tokio::runtime::Builder::new_multi_thread()
        } else {
            tokio::runtime::Builder::new_current_thread()
        };
        let runtime = builder.enable_all().build().expect("runtime");
        runtime.block_on(async {
            let client = LockClient::open(server.url()).await.expect("client");
            let sem = client.leased_semaphore("s");
            sem.try_set_permits(1).await.expect("set permits");
            let _lease = client.lock("l").acquire(LEASE).await.expect("lock with a lease");
            let _watched = client.lock("w").acquire(None).await.expect("lock with a watchdog");
            let _permit = sem.acquire(1, LEASE).await.expect("permit");
            let _read = client.rw_lock("r").read().acquire(LEASE).await.expect("read");
            let _write = client.rw_lock("x").write().acquire(LEASE).await.expect("write");
            // The body ends here: the guards drop, then the last handle, in the runtime.
        });
        let took = timed_drop(runtime);
        assert!(took < SHUTDOWN, "multi_thread {multi_thread}: the shutdown took {took:?}");
        for name in ["l", "w", "r", "x"] {
            assert!(!has_key(&server, name), "multi_thread {multi_thread}: {name} still held");
        }
        assert_eq!(available(&server, "s"), 1, "multi_thread {multi_thread}: the permit is back");
    }
}

/// A TCP proxy in front of `port` that, once armed, forwards the next `RLOCK.RELEASE` to the
/// server and then cuts that connection before the reply can come back (a lost reply).
struct LossyProxy {
    port: u16,
    armed: Arc<AtomicBool>,
}

impl LossyProxy {
    fn start(server_port: u16) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let armed = Arc::new(AtomicBool::new(false));
        let arm = Arc::clone(&armed);
        thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { return };
                let Ok(server) = TcpStream::connect(("127.0.0.1", server_port)) else { return };
                let cut = Arc::new(AtomicBool::new(false));
                let (c2, s2) =
                    (client.try_clone().expect("clone"), server.try_clone().expect("clone"));
                let (cut_up, cut_down, arm) =
                    (Arc::clone(&cut), Arc::clone(&cut), Arc::clone(&arm));
                thread::spawn(move || {
                    pump(client, server, |chunk| {
                        let release =
                            chunk.windows(13).any(|w| w.eq_ignore_ascii_case(b"RLOCK.RELEASE"));
                        if release && arm.swap(false, Ordering::SeqCst) {
                            cut_up.store(true, Ordering::SeqCst); // before the command reaches Redis
                        }
                        false
                    })
                });
                thread::spawn(move || pump(s2, c2, |_| cut_down.load(Ordering::SeqCst)));
            }
        });
        Self { port, armed }
    }
}

/// Copies `from` to `to` until either closes, or `cut(chunk)` says to drop the chunk and close
/// both.
fn pump(mut from: TcpStream, mut to: TcpStream, cut: impl Fn(&[u8]) -> bool) {
    let mut buf = [0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if cut(&buf[..n]) || to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_retries_a_release_whose_reply_was_lost_with_the_same_request_id() {
    let server = Server::start();
    let proxy = LossyProxy::start(server.port());
    let url = format!("redis://127.0.0.1:{}/", proxy.port);
    let client = rlock_client::LockClient::new(redis::Client::open(url).expect("url"))
        .await
        .expect("client");
    let lock = client.lock("l");
    let guard = lock.acquire(Some(Duration::from_secs(60))).await.expect("acquired");
    let mut con = server.conn();
    proxy.armed.store(true, Ordering::SeqCst);
    // Reported released, not "not held": the retry, with the same request id, gets the first
    // release's result (a fresh release would find nothing and say nil).
    guard.release().await.expect("released once, reported once");
    assert!(!proxy.armed.load(Ordering::SeqCst), "the proxy cut a release");
    // The server saw the release twice (the lost one and the retry) and released once.
    let calls: String = redis::cmd("INFO").arg("commandstats").query(&mut con).expect("INFO");
    let releases = calls
        .lines()
        .find_map(|l| {
            l.strip_prefix("cmdstat_rlock.release:calls=")?.split(',').next()?.parse().ok()
        })
        .unwrap_or(0);
    assert_eq!(releases, 2, "{calls}");
    assert!(hgetall(&mut con, b"l").is_empty(), "released");
}
