//! The Rust client's count-down latch (`LockClient::latch`): its commands, awaiting in
//! the server, and the hostile cases: a wait dropped at any point, a timed wait through a
//! server stall (`CLIENT PAUSE ALL`) and a killed connection, a latch opened by a plain `DEL`,
//! a Sentinel failover and a cluster with a braced name.
//!
//! The promises: every awaiter is answered `Ok(true)` once when the latch opens; a timed wait
//! returns `Ok(false)` by its timeout plus half a second whatever the server does; a dropped
//! wait leaves no awaiter in the server; a lost connection is not an answer (the wait is sent
//! again, to the server that serves the latch now); counts and amounts are checked before
//! anything is sent.

use std::time::Duration;

use redis::Connection;
use tokio::task::JoinHandle;
use tokio::time::{timeout, Instant};

use rlock_client::{Error, Latch, LockClient, Options};
use rlock_tests_integration::lock_client::{client, sentinel_client};
use rlock_tests_integration::{
    blocked_clients, cmd, exists, info_field, is_master, poll, wait_link_up, Cluster, Sentinel,
    Server, SENTINEL_MASTER,
};

/// How long anything that should happen "at once" may take here.
const PROMPT: Duration = Duration::from_secs(3);

/// How late past its timeout a timed wait may return: the client's half second, and slack for
/// a loaded machine.
const LATE: Duration = Duration::from_millis(900);

const LIMIT: Duration = Duration::from_secs(30);

const FAILOVER_LIMIT: Duration = Duration::from_secs(40);

/// A blocking poll from a test on the multi-thread runtime.
fn wait_for<T>(what: &str, limit: Duration, check: impl FnMut() -> Option<T>) -> T {
    tokio::task::block_in_place(|| poll(what, limit, check))
}

/// Waits until `server` has exactly `n` blocked clients.
fn blocked(server: &Server, n: i64, what: &str) {
    let mut con = server.conn();
    wait_for(what, LIMIT, || (blocked_clients(&mut con) == n).then_some(()));
}

/// The ids of the connections blocked in `RLATCH.AWAIT`.
fn awaiting_ids(con: &mut Connection) -> Vec<i64> {
    let list: String = redis::cmd("CLIENT").arg("LIST").query(con).expect("CLIENT LIST");
    list.lines()
        .filter(|line| line.contains("cmd=rlatch.await"))
        .filter_map(|line| line.split(' ').find_map(|f| f.strip_prefix("id="))?.parse().ok())
        .collect()
}

/// `CLIENT PAUSE ms ALL` from `admin`, a connection opened before the pause (one opened during
/// it would wait for the pause to end for its handshake).
fn pause_all(admin: &mut Connection, ms: u64) {
    let () = redis::cmd("CLIENT").arg("PAUSE").arg(ms).arg("ALL").query(admin).expect("PAUSE");
}

fn unpause(admin: &mut Connection) {
    let () = redis::cmd("CLIENT").arg("UNPAUSE").query(admin).expect("UNPAUSE");
}

/// A wait in a task of its own, with how long it took.
fn spawn_wait(
    latch: &Latch,
    limit: Option<Duration>,
) -> JoinHandle<(Result<bool, Error>, Duration)> {
    let latch = latch.clone();
    tokio::spawn(async move {
        let started = Instant::now();
        let open = latch.wait(limit).await;
        (open, started.elapsed())
    })
}

async fn joined(
    task: JoinHandle<(Result<bool, Error>, Duration)>,
) -> (Result<bool, Error>, Duration) {
    timeout(LIMIT, task).await.expect("the wait returned").expect("the task")
}

// ---- the commands ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_commands_follow_redisson_and_bad_numbers_are_refused_before_sending() {
    let server = Server::start();
    let client = client(&server).await;
    let latch = client.latch("l");
    assert_eq!(latch.name(), b"l");
    for bad in [0, 1 << 63, u64::MAX] {
        let set = latch.try_set_count(bad).await;
        assert!(matches!(set, Err(Error::InvalidCount { value }) if value == bad), "{set:?}");
    }
    assert!(!exists(&mut server.conn(), "l"), "nothing was sent");
    assert_eq!(latch.count().await.expect("count"), 0, "missing: open");
    assert!(latch.wait(Some(Duration::ZERO)).await.expect("look"), "missing: open");
    assert_eq!(latch.count_down().await.expect("count down"), 0, "a missing latch stays so");
    assert!(!exists(&mut server.conn(), "l"));
    assert!(latch.try_set_count(5).await.expect("set"));
    assert!(!latch.try_set_count(9).await.expect("set again"), "it exists");
    assert_eq!(latch.count().await.expect("count"), 5);
    assert!(!latch.wait(Some(Duration::ZERO)).await.expect("look"), "closed");
    for bad in [0, 1 << 63] {
        let down = latch.count_down_by(bad).await;
        assert!(matches!(down, Err(Error::InvalidCount { value }) if value == bad), "{down:?}");
    }
    assert_eq!(latch.count().await.expect("count"), 5, "nothing was sent");
    assert_eq!(latch.count_down().await.expect("count down"), 4);
    assert_eq!(latch.count_down_by(3).await.expect("count down"), 1);
    assert_eq!(latch.count_down_by(7).await.expect("count down"), 0, "never below zero");
    assert!(!exists(&mut server.conn(), "l"), "open: deleted");
    assert!(latch.try_set_count(2).await.expect("set"));
    assert!(latch.delete().await.expect("delete"));
    assert!(!latch.delete().await.expect("delete again"));
    // A retyped key is refused at once, never waited on.
    cmd(&mut server.conn(), &["HSET", "h", "f", "v"]);
    let typed = timeout(PROMPT, client.latch("h").wait(None)).await.expect("prompt");
    assert!(matches!(&typed, Err(Error::Redis(e)) if e.code() == Some("WRONGTYPE")), "{typed:?}");
    cmd(&mut server.conn(), &["SET", "s", "not a number"]);
    let corrupt = timeout(PROMPT, client.latch("s").wait(None)).await.expect("prompt");
    assert!(matches!(&corrupt, Err(Error::Redis(e)) if e.code() == Some("ERR")), "{corrupt:?}");
    // A user that may not touch the key is refused at once, never waited on.
    cmd(&mut server.conn(), &["ACL", "SETUSER", "limited", "on", ">pw", "~mine:*", "+@all"]);
    let url = format!("redis://limited:pw@127.0.0.1:{}/", server.port());
    let limited = LockClient::open(url.as_str()).await.expect("limited client");
    latch.try_set_count(1).await.expect("set");
    let refused = timeout(PROMPT, limited.latch("l").wait(None)).await.expect("prompt");
    assert!(matches!(&refused, Err(Error::Redis(e)) if e.code() == Some("NOPERM")), "{refused:?}");
    assert!(limited.latch("mine:l").wait(Some(Duration::ZERO)).await.expect("its own"), "open");
    // Refused by the wait itself (after the first look passed), likewise.
    cmd(
        &mut server.conn(),
        &["ACL", "SETUSER", "nowait", "on", ">pw", "~*", "+@all", "-rlatch.await"],
    );
    let url = format!("redis://nowait:pw@127.0.0.1:{}/", server.port());
    let nowait = LockClient::open(url.as_str()).await.expect("nowait client");
    let refused = timeout(PROMPT, nowait.latch("l").wait(None)).await.expect("prompt");
    assert!(matches!(&refused, Err(Error::Redis(e)) if e.code() == Some("NOPERM")), "{refused:?}");
    // A count a foreign writer left at or below zero reads as open.
    cmd(&mut server.conn(), &["SET", "neg", "-3"]);
    assert_eq!(client.latch("neg").count().await.expect("count"), 0);
    assert!(client.latch("neg").wait(None).await.expect("open"));
}

// ---- many awaiters --------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_awaiters_are_each_answered_true_once_when_the_last_count_down_opens() {
    const N: u64 = 1_000;
    let server = Server::builder().config("maxclients", "4000").start();
    let client = client(&server).await;
    let latch = client.latch("crowd");
    assert!(latch.try_set_count(N).await.expect("set"));
    let waits: Vec<_> = (0..N).map(|_| spawn_wait(&latch, None)).collect();
    blocked(&server, i64::try_from(N).expect("n"), "every awaiter to block");
    // Every count-down but the last, concurrently: each answers a distinct count left.
    let downs: Vec<_> = (1..N)
        .map(|_| {
            let latch = latch.clone();
            tokio::spawn(async move { latch.count_down().await })
        })
        .collect();
    let mut left = Vec::new();
    for down in downs {
        left.push(down.await.expect("task").expect("count down"));
    }
    left.sort_unstable();
    assert_eq!(left, (1..N).collect::<Vec<_>>(), "each count-down took exactly one");
    assert!(waits.iter().all(|w| !w.is_finished()), "no awaiter answered while closed");
    assert_eq!(blocked_clients(&mut server.conn()), i64::try_from(N).expect("n"));
    assert_eq!(latch.count_down().await.expect("the last"), 0);
    let mut opened = 0;
    for wait in waits {
        let (open, _) = joined(wait).await;
        assert!(open.expect("the wait"), "answered open");
        opened += 1;
    }
    assert_eq!(opened, N);
    let mut con = server.conn();
    assert_eq!(info_field(&mut con, "rlock", "rlock_latch_releases"), 1_000, "each answered once");
    assert_eq!(blocked_clients(&mut con), 0);
}

// ---- timeouts and cancellation --------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timed_wait_returns_false_at_its_timeout_and_leaves_no_awaiter() {
    let server = Server::start();
    let client = client(&server).await;
    let latch = client.latch("l");
    latch.try_set_count(1).await.expect("set");
    let wait = Duration::from_millis(400);
    let started = Instant::now();
    assert!(!latch.wait(Some(wait)).await.expect("wait"), "closed all along");
    let took = started.elapsed();
    // The server counts whole milliseconds from when the wait arrived: up to 1 ms early.
    assert!(took + Duration::from_millis(2) >= wait && took < wait + LATE, "took {took:?}");
    blocked(&server, 0, "no awaiter left");
    assert_eq!(latch.count().await.expect("count"), 1, "a wait writes nothing");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_dropped_at_any_point_leaves_no_awaiter() {
    let server = Server::start();
    let client = client(&server).await;
    let latch = client.latch("l");
    latch.try_set_count(1).await.expect("set");
    let mut con = server.conn();
    // Dropped by a timeout at a spread of moments: in the first look, while connecting, in
    // flight, blocked.
    for ms in [0, 1, 2, 3, 5, 8, 13, 21, 34, 55, 89, 144] {
        for limit in [None, Some(Duration::from_secs(60))] {
            let dropped = timeout(Duration::from_millis(ms), latch.wait(limit)).await;
            assert!(dropped.is_err(), "closed: the wait was still waiting after {ms} ms");
            wait_for("the dropped awaiter to go", PROMPT, || {
                (blocked_clients(&mut con) == 0).then_some(())
            });
        }
    }
    // Dropped by `select!` once it is surely blocked in the server.
    let mut check = server.client().get_multiplexed_async_connection().await.expect("con");
    tokio::select! {
        open = latch.wait(None) => panic!("the latch is closed: {open:?}"),
        () = async {
            loop {
                let info: String = redis::cmd("INFO").arg("clients").query_async(&mut check).await.expect("INFO");
                if info.contains("blocked_clients:1") {
                    break;
                }
                tokio::task::yield_now().await;
            }
        } => {}
    }
    wait_for("the dropped awaiter to go", PROMPT, || {
        (blocked_clients(&mut con) == 0).then_some(())
    });
    // An aborted task, likewise.
    let task = spawn_wait(&latch, None);
    blocked(&server, 1, "the awaiter to block");
    task.abort();
    wait_for("the aborted awaiter to go", PROMPT, || {
        (blocked_clients(&mut con) == 0).then_some(())
    });
    // Dropped while the server stalls (CLIENT PAUSE ALL), blocked or with its wait held back
    // by the pause: once the pause ends, no awaiter and no connection of the wait is left.
    let mut admin = server.conn();
    let clients = info_field(&mut con, "clients", "connected_clients");
    let blocked_task = spawn_wait(&latch, None);
    blocked(&server, 1, "the awaiter to block");
    pause_all(&mut admin, 10_000);
    let held_back = spawn_wait(&latch, None);
    // The server answers nothing during the pause (INFO and CLIENT LIST included), so this
    // cannot be polled: give the held-back wait time to pass its first look (500 ms, the
    // shared connection's response timeout) and open its connection. The check below holds
    // whether or not it got that far.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    blocked_task.abort();
    held_back.abort();
    let _ = blocked_task.await;
    let _ = held_back.await;
    unpause(&mut admin);
    // The client's shared connection, which timed out during the pause, is replaced when next
    // used (a silently dead one would never answer again): used once, so it counts as before.
    assert_eq!(latch.count().await.expect("count"), 1);
    wait_for("the dropped waits' connections to close", PROMPT, || {
        (info_field(&mut con, "clients", "connected_clients") == clients).then_some(())
    });
    assert_eq!(blocked_clients(&mut con), 0, "no awaiter left");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timed_wait_through_client_pause_all_or_a_stopped_server_returns_false_by_its_bound() {
    let server = Server::start();
    let mut admin = server.conn();
    let client = client(&server).await;
    let latch = client.latch("l");
    latch.try_set_count(1).await.expect("set");
    // Paused while blocked in the server.
    let wait = Duration::from_millis(800);
    let task = spawn_wait(&latch, Some(wait));
    blocked(&server, 1, "the awaiter to block");
    pause_all(&mut admin, 5_000);
    let (open, took) = joined(task).await;
    assert!(!open.expect("a stall is no error"), "not seen open");
    assert!(took < wait + LATE, "bounded by its timeout through the stall: {took:?}");
    unpause(&mut admin);
    blocked(&server, 0, "no awaiter left after the stall");
    // Paused before the wait starts: the first look stalls too.
    pause_all(&mut admin, 5_000);
    let started = Instant::now();
    let open = latch.wait(Some(Duration::from_millis(300))).await;
    let took = started.elapsed();
    assert!(!open.expect("a stall is no error"));
    assert!(took < Duration::from_millis(300) + LATE, "took {took:?}");
    // And an untimed wait that starts in the stall is answered once it ends.
    let task = spawn_wait(&latch, None);
    unpause(&mut admin);
    blocked(&server, 1, "the untimed awaiter to block");
    latch.count_down().await.expect("count down");
    assert!(joined(task).await.0.expect("the wait"), "opened");
    blocked(&server, 0, "no awaiter left");
    // A stopped process (SIGSTOP) likewise, blocked in the server or before the first look.
    latch.try_set_count(1).await.expect("set");
    let task = spawn_wait(&latch, Some(wait));
    blocked(&server, 1, "the awaiter to block");
    server.pause();
    let (open, took) = joined(task).await;
    server.resume();
    assert!(!open.expect("a stall is no error"), "not seen open");
    assert!(took < wait + LATE, "bounded by its timeout through the stop: {took:?}");
    server.pause();
    let started = Instant::now();
    let open = latch.wait(Some(Duration::from_millis(300))).await;
    let took = started.elapsed();
    server.resume();
    assert!(!open.expect("a stall is no error"));
    assert!(took < Duration::from_millis(300) + LATE, "took {took:?}");
}

// ---- lost connections -----------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_awaiting_connection_is_replaced_and_the_wait_goes_on() {
    let server = Server::start();
    let client = client(&server).await;
    let latch = client.latch("l");
    latch.try_set_count(1).await.expect("set");
    let mut admin = server.conn();
    let untimed = spawn_wait(&latch, None);
    let timed = spawn_wait(&latch, Some(Duration::from_secs(20)));
    blocked(&server, 2, "both awaiters to block");
    let first = awaiting_ids(&mut admin);
    assert_eq!(first.len(), 2, "two awaiting connections");
    for id in &first {
        rlock_tests_integration::kill_client(&mut admin, *id);
    }
    // Sent again on new connections.
    let second = wait_for("both awaiters to block again", LIMIT, || {
        let ids = awaiting_ids(&mut admin);
        (ids.len() == 2).then_some(ids)
    });
    assert!(second.iter().all(|id| !first.contains(id)), "new connections");
    assert!(!untimed.is_finished() && !timed.is_finished(), "a lost connection is no answer");
    latch.count_down().await.expect("count down");
    assert!(joined(untimed).await.0.expect("untimed"), "opened");
    let (open, took) = joined(timed).await;
    assert!(open.expect("timed"), "opened");
    assert!(took < Duration::from_secs(20), "before its timeout: {took:?}");
    // Killed again and again, a timed wait still ends by its bound.
    latch.try_set_count(1).await.expect("set");
    let wait = Duration::from_millis(1_500);
    let task = spawn_wait(&latch, Some(wait));
    while !task.is_finished() {
        for id in awaiting_ids(&mut admin) {
            let _ = cmd(&mut admin, &["CLIENT", "KILL", "ID", &id.to_string()]);
        }
        tokio::task::yield_now().await;
    }
    let (open, took) = joined(task).await;
    assert!(!open.expect("no error"), "closed all along");
    // The server counts whole milliseconds from when the wait arrived: up to 1 ms early.
    assert!(took + Duration::from_millis(2) >= wait && took < wait + LATE, "took {took:?}");
    blocked(&server, 0, "no awaiter left");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_untimed_wait_outlives_a_server_restart() {
    let mut server = Server::builder().config("appendonly", "yes").start();
    let client = client(&server).await;
    let latch = client.latch("l");
    latch.try_set_count(1).await.expect("set");
    let task = spawn_wait(&latch, None);
    blocked(&server, 1, "the awaiter to block");
    server.restart_same_port();
    assert_eq!(cmd(&mut server.conn(), &["GET", "l"]), redis::Value::BulkString(b"1".to_vec()));
    blocked(&server, 1, "the awaiter to block on the restarted server");
    assert!(!task.is_finished(), "a restart is no answer");
    cmd(&mut server.conn(), &["RLATCH.COUNTDOWN", "l"]);
    assert!(joined(task).await.0.expect("the wait"), "opened");
}

// ---- opened outside rlock -------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_latch_deleted_by_a_plain_del_releases_every_awaiter() {
    let server = Server::start();
    let client = client(&server).await;
    let latch = client.latch("redisson-latch");
    latch.try_set_count(3).await.expect("set");
    let waits: Vec<_> = (0..5).map(|_| spawn_wait(&latch, None)).collect();
    blocked(&server, 5, "the awaiters to block");
    // Redisson's `delete()` (and any client's) is a plain DEL: the server's poll notices.
    assert_eq!(cmd(&mut server.conn(), &["DEL", "redisson-latch"]), redis::Value::Int(1));
    let started = Instant::now();
    for wait in waits {
        assert!(joined(wait).await.0.expect("the wait"), "opened");
    }
    assert!(started.elapsed() < PROMPT, "at the next poll: {:?}", started.elapsed());
    blocked(&server, 0, "no awaiter left");
}

// ---- Sentinel and cluster -------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn awaiters_follow_a_sentinel_failover_to_the_new_master() {
    let master = Server::start();
    let replica = Server::builder().replica_of(&master).start();
    wait_link_up(&mut replica.conn());
    let sentinel = Sentinel::start(&master, 1, 30_000);
    let client = sentinel_client(&sentinel).await;
    let latch = client.latch("{jobs}:done");
    latch.try_set_count(1).await.expect("set");
    let waits = [spawn_wait(&latch, None), spawn_wait(&latch, Some(Duration::from_secs(60)))];
    blocked(&master, 2, "the awaiters to block on the master");
    wait_for("the latch to reach the replica", FAILOVER_LIMIT, || {
        exists(&mut replica.conn(), "{jobs}:done").then_some(())
    });
    wait_for("the sentinel to know the replica", FAILOVER_LIMIT, || {
        let mut con = redis::Client::open(sentinel.url()).ok()?.get_connection().ok()?;
        let info: String = redis::cmd("INFO").arg("sentinel").query(&mut con).ok()?;
        info.contains("slaves=1").then_some(())
    });
    let mut s = redis::Client::open(sentinel.url()).expect("client").get_connection().expect("con");
    wait_for("the sentinel to accept a failover", FAILOVER_LIMIT, || {
        redis::cmd("SENTINEL").arg("FAILOVER").arg(SENTINEL_MASTER).query::<()>(&mut s).ok()
    });
    wait_for("the promotion", FAILOVER_LIMIT, || {
        (sentinel.master_port() == replica.port() && is_master(&replica)).then_some(())
    });
    wait_for("the old master's demotion", FAILOVER_LIMIT, || (!is_master(&master)).then_some(()));
    blocked(&replica, 2, "the awaiters to block on the new master");
    assert!(waits.iter().all(|w| !w.is_finished()), "a failover is no answer");
    assert_eq!(blocked_clients(&mut master.conn()), 0, "nothing left on the old master");
    wait_for("the count-down to reach the new master", FAILOVER_LIMIT, || {
        tokio::task::block_in_place(|| {
            tokio::runtime::Handle::current().block_on(latch.count_down()).ok()
        })
    });
    for wait in waits {
        assert!(joined(wait).await.0.expect("the wait"), "opened on the new master");
    }
    blocked(&replica, 0, "no awaiter left");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_a_cluster_a_braced_latch_lives_and_waits_in_its_slot() {
    let cluster = Cluster::start(3);
    let urls: Vec<String> = cluster.nodes.iter().map(Server::url).collect();
    let (a, b) = (
        LockClient::cluster(urls.clone(), Options::default()).await.expect("a"),
        LockClient::cluster(urls, Options::default()).await.expect("b"),
    );
    let name = "{batch:7}:latch";
    let node = cluster.node_of(b"batch:7");
    assert_eq!(cluster.node_of(name.as_bytes()), node, "the braced part picks the slot");
    let latch = a.latch(name);
    assert!(latch.try_set_count(2).await.expect("set"));
    assert!(exists(&mut cluster.nodes[node].conn(), name), "the key is on its slot's node");
    let waits: Vec<_> = (0..20).map(|_| spawn_wait(&latch, None)).collect();
    let timed = spawn_wait(&latch, Some(Duration::from_millis(300)));
    assert!(!joined(timed).await.0.expect("timed"), "closed: false at its timeout");
    blocked(&cluster.nodes[node], 20, "the awaiters to block on the latch's node");
    for (i, other) in cluster.nodes.iter().enumerate().filter(|(i, _)| *i != node) {
        assert_eq!(blocked_clients(&mut other.conn()), 0, "nothing waits on node {i}");
    }
    let other = b.latch(name);
    assert_eq!(other.count().await.expect("count"), 2);
    assert_eq!(other.count_down().await.expect("count down"), 1);
    assert!(waits.iter().all(|w| !w.is_finished()));
    assert_eq!(other.count_down().await.expect("count down"), 0);
    for wait in waits {
        assert!(joined(wait).await.0.expect("the wait"), "opened");
    }
    blocked(&cluster.nodes[node], 0, "no awaiter left");
    assert!(b.latch(name).wait(Some(Duration::ZERO)).await.expect("look"), "open");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_a_cluster_an_awaiter_whose_slot_moves_waits_on_the_new_node() {
    let cluster = Cluster::start(3);
    let urls: Vec<String> = cluster.nodes.iter().map(Server::url).collect();
    let client = LockClient::cluster(urls, Options::default()).await.expect("client");
    let name = format!("{{{}}}:latch", cluster.key_on(0, "moving:"));
    let latch = client.latch(&name);
    assert!(latch.try_set_count(1).await.expect("set"));
    let waits = [spawn_wait(&latch, None), spawn_wait(&latch, Some(Duration::from_secs(60)))];
    blocked(&cluster.nodes[0], 2, "the awaiters to block on node 0");
    cluster.move_slot(cluster.slot(name.as_bytes()), 0, 1);
    blocked(&cluster.nodes[1], 2, "the awaiters to block on node 1");
    assert!(waits.iter().all(|w| !w.is_finished()), "a move is no opening");
    assert_eq!(latch.count_down().await.expect("count down"), 0);
    for wait in waits {
        assert!(joined(wait).await.0.expect("the wait"), "opened");
    }
    blocked(&cluster.nodes[1], 0, "no awaiter left");
}

/// A timeout far beyond anything the server takes in milliseconds, yet one an `Instant` can
/// still add: the wait is as good as unlimited, never refused by the server nor sized from it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_finite_timeout_waits_like_no_limit_and_is_never_refused() {
    let server = Server::start();
    let client = LockClient::open(server.url()).await.expect("client");
    let latch = client.latch("huge");
    latch.try_set_count(1).await.expect("set");
    for secs in [u64::MAX / 4, 1 << 62, 1 << 53, 1 << 44, u64::MAX] {
        let huge = Duration::from_secs(secs);
        let l = latch.clone();
        let task = tokio::spawn(async move { l.wait(Some(huge)).await });
        // Either it blocks (as a wait without limit does) or it fails: it must block.
        let mut con = server.conn();
        wait_for(&format!("the {secs} s wait to block or end"), LIMIT, || {
            (blocked_clients(&mut con) == 1 || task.is_finished()).then_some(())
        });
        assert!(!task.is_finished(), "{secs} s: ended at once: {:?}", task.await);
        task.abort();
        let _ = task.await;
        blocked(&server, 0, "the dropped wait's awaiter to go");
    }
    // Also with the latch open: a huge timeout answers true, never an error.
    latch.delete().await.expect("delete");
    for secs in [u64::MAX / 4, 1 << 62, u64::MAX] {
        let open = latch.wait(Some(Duration::from_secs(secs))).await;
        assert!(open.expect("no error"), "open");
    }
}

/// Zero, a nanosecond and a millisecond: each returns false promptly on a closed latch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tiny_timeouts_return_false_promptly() {
    let server = Server::start();
    let client = LockClient::open(server.url()).await.expect("client");
    let latch = client.latch("tiny");
    latch.try_set_count(1).await.expect("set");
    for t in [Duration::ZERO, Duration::from_nanos(1), Duration::from_millis(1)] {
        let started = Instant::now();
        let open = latch.wait(Some(t)).await.expect("no error");
        assert!(!open, "{t:?}: closed");
        assert!(started.elapsed() < t + LATE, "{t:?}: took {:?}", started.elapsed());
    }
    blocked(&server, 0, "no awaiter left");
}

/// A user whose ACL allows only other keys is refused at once (`NOPERM`), never retried.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acl_user_without_the_key_is_refused_at_once_and_not_retried() {
    let server = Server::start();
    let mut admin = server.conn();
    cmd(&mut admin, &["ACL", "SETUSER", "limited", "on", ">pw", "~allowed:*", "+@all"]);
    cmd(&mut admin, &["RLATCH.SETCOUNT", "denied", "1"]);
    let url = server.url().replacen("redis://", "redis://limited:pw@", 1);
    let client = LockClient::open(url.as_str()).await.expect("client");
    let latch = client.latch("denied");
    for t in [None, Some(Duration::from_secs(10)), Some(Duration::ZERO)] {
        let started = Instant::now();
        let r = timeout(Duration::from_secs(5), latch.wait(t)).await.expect("returned at once");
        assert!(matches!(&r, Err(Error::Redis(e)) if e.code() == Some("NOPERM")), "{t:?}: {r:?}");
        assert!(started.elapsed() < Duration::from_secs(2), "{t:?}: {:?}", started.elapsed());
    }
    // Allowed to read the count but not to wait: the wait's own NOPERM is not retried either.
    cmd(&mut admin, &["ACL", "SETUSER", "limited", "~denied", "-rlatch.await"]);
    let r = timeout(Duration::from_secs(5), latch.wait(None)).await.expect("returned at once");
    assert!(matches!(&r, Err(Error::Redis(e)) if e.code() == Some("NOPERM")), "{r:?}");
    blocked(&server, 0, "no awaiter");
}

/// RESP3, binary and braced names: the same answers as RESP2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resp3_and_binary_braced_names() {
    let server = Server::start();
    for url in [server.url(), format!("{}?protocol=resp3", server.url())] {
        let client = LockClient::open(url.as_str()).await.expect("client");
        for name in [&b"{a}b"[..], b"}{", b"\x00\xff{\r\n}", b"x\x00y"] {
            let latch = client.latch(name);
            assert!(latch.try_set_count(2).await.expect("set"));
            assert_eq!(latch.count().await.expect("count"), 2);
            let l = latch.clone();
            let task = tokio::spawn(async move { l.wait(Some(Duration::from_secs(20))).await });
            blocked(&server, 1, "the awaiter to block");
            assert_eq!(latch.count_down_by(2).await.expect("down"), 0);
            let open = timeout(LIMIT, task).await.expect("returned").expect("task");
            assert!(open.expect("no error"), "{url} {name:?}: opened");
            assert!(!latch.delete().await.expect("delete"));
        }
    }
}

/// Many waits dropped at random points leave neither awaiters nor connections behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_dropped_waits_leave_no_connection_behind() {
    let server = Server::start();
    let client = LockClient::open(server.url()).await.expect("client");
    let latch = client.latch("drops");
    latch.try_set_count(1).await.expect("set");
    latch.count().await.expect("warm");
    let mut con = server.conn();
    let before = info_field(&mut con, "clients", "connected_clients");
    for i in 0..200u64 {
        let l = latch.clone();
        let limit = if i % 2 == 0 { None } else { Some(Duration::from_secs(30)) };
        let task = tokio::spawn(async move { l.wait(limit).await });
        tokio::time::sleep(Duration::from_micros(i * 37 % 3000)).await;
        task.abort();
        let _ = task.await;
    }
    wait_for("the dropped waits' connections to close", LIMIT, || {
        (info_field(&mut con, "clients", "connected_clients") == before).then_some(())
    });
    assert_eq!(blocked_clients(&mut con), 0);
}

/// A wait without a limit is never one server-side wait without a limit: each `RLATCH.AWAIT`
/// carries a slice of at most 30 s (sent again as it ends), so a connection that died without
/// a word is noticed by the slice's response timeout instead of never. Seen on the wire
/// (`MONITOR`), not in the client's code.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unlimited_wait_goes_to_the_server_in_bounded_slices() {
    use std::io::{BufRead, BufReader, Write};

    let server = Server::start();
    let client = LockClient::open(server.url()).await.expect("client");
    let latch = client.latch("sliced");
    latch.try_set_count(1).await.expect("set");
    let mut monitor = std::net::TcpStream::connect(("127.0.0.1", server.port())).expect("connect");
    monitor.set_read_timeout(Some(LIMIT)).expect("timeout");
    monitor.write_all(b"MONITOR\r\n").expect("MONITOR");
    let mut lines = BufReader::new(monitor);
    let l = latch.clone();
    let task = tokio::spawn(async move { l.wait(None).await });
    let budget = tokio::task::block_in_place(|| loop {
        let mut line = String::new();
        let n = lines.read_line(&mut line).expect("a MONITOR line in time");
        assert!(n > 0, "MONITOR closed");
        if let Some(at) = line.find("\"RLATCH.AWAIT\" \"sliced\" \"") {
            let rest = &line[at + "\"RLATCH.AWAIT\" \"sliced\" \"".len()..];
            let ms: u64 = rest.split('"').next().and_then(|v| v.parse().ok()).expect("its timeout");
            break ms;
        }
    });
    assert!((1..=30_000).contains(&budget), "an unlimited wait sent RLATCH.AWAIT ... {budget}");
    blocked(&server, 1, "the wait to block");
    latch.count_down().await.expect("count down");
    let open = timeout(LIMIT, task).await.expect("answered").expect("task");
    assert!(open.expect("no error"), "open");
}
