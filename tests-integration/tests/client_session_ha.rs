//! The Rust client's sessions when the server side changes under them: a
//! Sentinel failover (the master killed, or replaced by `SENTINEL FAILOVER` and demoted), a
//! cluster node stopped, and a program whose `current_thread` tokio `main` ends while a session
//! guard is still alive.
//!
//! The promises: a session is one connection to one master; when that connection goes, every
//! guard taken through it is lost at once, the session reports closed and refuses acquires with
//! `Error::SessionClosed` (it never reconnects, to the new master or anywhere else); the
//! binding lived only in the old master's memory, so on the promoted replica the replicated
//! hold is an ordinary one that ends with its lease (sessions shorten holds, never lengthen
//! them); a new session on the same client binds to the master the Sentinels name now.

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Command, Stdio};
use std::time::Duration;

use redis::{Connection, Value};
use rlock_client::{Error, LockClient, Options};
use rlock_tests_integration::{
    cmd, hgetall, info_field, is_master, poll, session_holds, wait_link_up, Cluster, Process,
    Sentinel, Server, SENTINEL_MASTER,
};
use tokio::time::{timeout, Instant};

/// How long anything that should happen "at once" may take here.
const PROMPT: Duration = Duration::from_secs(2);
/// The bound of a failover (a promotion, a demotion).
const FAILOVER_LIMIT: Duration = Duration::from_secs(30);
const LIMIT: Duration = Duration::from_secs(20);
const LONG: Option<Duration> = Some(Duration::from_secs(60));

fn pttl(con: &mut Connection, key: &str) -> Duration {
    match cmd(con, &["PTTL", key]) {
        Value::Int(ms) if ms > 0 => Duration::from_millis(ms.unsigned_abs()),
        other => panic!("{key} has no lease left: {other:?}"),
    }
}

/// A blocking poll from a test on the multi-thread runtime.
fn wait_for<T>(what: &str, limit: Duration, check: impl FnMut() -> Option<T>) -> T {
    tokio::task::block_in_place(|| poll(what, limit, check))
}

/// A master, one replica and one Sentinel (quorum 1) that knows the replica.
struct Group {
    master: Server,
    replica: Server,
    sentinel: Sentinel,
}

impl Group {
    fn start(down_after_ms: u64) -> Self {
        let master = Server::start();
        let replica = Server::builder().replica_of(&master).start();
        wait_link_up(&mut replica.conn());
        let sentinel = Sentinel::start(&master, 1, down_after_ms);
        poll("the sentinel to know the replica", FAILOVER_LIMIT, || {
            let mut con = redis::Client::open(sentinel.url()).ok()?.get_connection().ok()?;
            let info: String = redis::cmd("INFO").arg("sentinel").query(&mut con).ok()?;
            info.contains("slaves=1").then_some(())
        });
        Self { master, replica, sentinel }
    }

    async fn client(&self) -> LockClient {
        let url = self.sentinel.url();
        LockClient::sentinel(vec![url], SENTINEL_MASTER, "redis://127.0.0.1/", Options::default())
            .await
            .expect("a Sentinel client")
    }

    /// Waits until everything the master wrote so far reached the replica (a `WAIT` from a
    /// new connection would not: it waits only for that connection's own writes).
    fn replicated(&self) {
        let offset = info_field(&mut self.master.conn(), "replication", "master_repl_offset");
        let mut replica = self.replica.conn();
        poll("the replica to have the grants", LIMIT, || {
            (info_field(&mut replica, "replication", "slave_repl_offset") >= offset).then_some(())
        });
    }

    /// Waits until the Sentinel names the replica and the replica says it is the master.
    fn wait_promoted(&self) {
        wait_for("the promotion", FAILOVER_LIMIT, || {
            (self.sentinel.master_port() == self.replica.port() && is_master(&self.replica))
                .then_some(())
        });
    }
}

/// The holds a session made on the new master after a failover: none of them is a session
/// hold there, and the session's closed: its acquires are refused without reaching any server.
async fn assert_closed_for_good(session: &rlock_client::Session, new_master: &mut Connection) {
    assert!(session.is_closed());
    for result in [
        session.lock("a").try_acquire(Duration::ZERO, LONG).await.map(drop),
        session.lock("fresh").acquire(LONG).await.map(drop),
        session.rw_lock("rw").read().try_acquire(Duration::from_secs(1), LONG).await.map(drop),
        session.leased_semaphore("s").try_acquire(1, Duration::ZERO, LONG).await.map(drop),
    ] {
        assert!(matches!(result, Err(Error::SessionClosed)), "{result:?}");
    }
    assert_eq!(cmd(new_master, &["EXISTS", "fresh"]), Value::Int(0), "never reconnected");
    assert_eq!(session_holds(new_master), 0, "the bindings stayed in the old master's memory");
}

/// A new session on `client` binds to the new master: it takes `key` once the old hold's
/// lease (replicated, unbound) ends there, not before and promptly then; its hold is a session
/// hold of the new master, which ends when the new session is dropped.
async fn new_session_takes_over(client: &LockClient, new_master: &Server, key: &str) {
    let mut con = new_master.conn();
    let again = client.session().await.expect("a new session, on the new master");
    let left = pttl(&mut con, key);
    let ends = Instant::now() + left;
    let guard = again.lock(key).try_acquire(LIMIT, LONG).await.expect("granted at the lease end");
    let at = Instant::now();
    assert!(at + Duration::from_millis(50) >= ends, "granted {:?} early", ends - at);
    assert!(at <= ends + PROMPT, "granted {:?} after the old lease ended", at - ends);
    assert_eq!(
        hgetall(&mut con, key.as_bytes()),
        vec![(guard.owner().as_bytes().to_vec(), b"1".to_vec())]
    );
    assert_eq!(session_holds(&mut con), 1, "a session hold of the new master");
    drop(again);
    timeout(PROMPT, guard.lost()).await.expect("the dropped session's guard is lost");
    poll("the new session's hold to end", LIMIT, || {
        (cmd(&mut con, &["EXISTS", key]) == Value::Int(0) && session_holds(&mut con) == 0)
            .then_some(())
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_sentinel_master_loses_the_session_at_once_and_a_new_session_binds_to_the_promoted_replica(
) {
    let mut group = Group::start(1_000);
    let client = group.client().await;
    client.leased_semaphore("s").try_set_permits(1).await.expect("permits");
    let session = client.session().await.expect("session");
    let lease = Some(Duration::from_secs(8));
    let a = session.lock("a").acquire(lease).await.expect("a lock");
    let w = session.rw_lock("rw").write().acquire(None).await.expect("a write side, watchdog");
    let p = session.leased_semaphore("s").acquire(1, lease).await.expect("a permit");
    assert_eq!(session_holds(&mut group.master.conn()), 3);
    group.replicated();
    let killed = Instant::now();
    group.master.kill();
    let all = async { tokio::join!(a.lost(), w.lost(), p.lost(), session.closed()) };
    timeout(PROMPT, all).await.expect("every guard lost, the session closed, at once");
    assert!(killed.elapsed() < PROMPT);
    assert!(a.is_lost() && w.is_lost() && p.is_lost());
    group.wait_promoted();
    let mut new = group.replica.conn();
    let old = vec![(a.owner().as_bytes().to_vec(), b"1".to_vec())];
    assert_eq!(hgetall(&mut new, b"a"), old, "the replicated hold, an ordinary one there");
    assert_closed_for_good(&session, &mut new).await;
    new_session_takes_over(&client, &group.replica, "a").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manual_sentinel_failover_closes_the_session_and_a_new_session_binds_to_the_new_master() {
    let group = Group::start(5_000);
    let client = group.client().await;
    let session = client.session().await.expect("session");
    let a = session.lock("a").acquire(Some(Duration::from_secs(6))).await.expect("a lock");
    let w = session.lock("w").acquire(None).await.expect("a watchdog lock");
    group.replicated();
    let mut s =
        redis::Client::open(group.sentinel.url()).expect("url").get_connection().expect("con");
    // Refused (NOGOODSLAVE) until the Sentinel has had a reply to INFO from the replica.
    wait_for("the sentinel to accept a failover", FAILOVER_LIMIT, || {
        redis::cmd("SENTINEL").arg("FAILOVER").arg(SENTINEL_MASTER).query::<()>(&mut s).ok()
    });
    group.wait_promoted();
    // A new session now binds to the new master, even while the old one still runs (and
    // still calls itself a master until the Sentinel demotes it).
    new_session_takes_over(&client, &group.replica, "a").await;
    // The old master is demoted (the Sentinel kills its clients): the session closes then.
    wait_for("the old master to be demoted", FAILOVER_LIMIT, || {
        (!is_master(&group.master)).then_some(())
    });
    let demoted = Instant::now();
    let all = async { tokio::join!(a.lost(), w.lost(), session.closed()) };
    timeout(PROMPT, all).await.expect("every guard lost, the session closed");
    assert!(demoted.elapsed() < PROMPT);
    assert_closed_for_good(&session, &mut group.replica.conn()).await;
    assert_eq!(session_holds(&mut group.master.conn()), 0, "a replica binds nothing");
}

/// After a Sentinel failover and before the Sentinels demote the old master, that master
/// refuses grants (`NOREPLICAS`: its replica left it): a session bound to it never grants
/// again, so its acquire (untimed) closes it at once, `Error::SessionClosed`, every guard lost,
/// instead of waiting on a master that is no longer the one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_acquire_on_the_replaced_master_closes_the_session() {
    let group = Group::start(5_000);
    let client = group.client().await;
    let session = client.session().await.expect("session");
    let a = session.lock("a").acquire(Some(Duration::from_secs(6))).await.expect("a lock");
    group.replicated();
    let mut s =
        redis::Client::open(group.sentinel.url()).expect("url").get_connection().expect("con");
    wait_for("the sentinel to accept a failover", FAILOVER_LIMIT, || {
        redis::cmd("SENTINEL").arg("FAILOVER").arg(SENTINEL_MASTER).query::<()>(&mut s).ok()
    });
    group.wait_promoted();
    assert!(is_master(&group.master), "the old master is not demoted yet");
    let started = Instant::now();
    let result = timeout(LIMIT, session.lock("late").acquire(LONG)).await.expect("in time");
    assert!(matches!(result, Err(Error::SessionClosed)), "{:?}", result.map(drop));
    assert!(started.elapsed() < PROMPT, "{:?}", started.elapsed());
    timeout(PROMPT, a.lost()).await.expect("the session's guard lost");
    assert!(session.is_closed());
    assert_closed_for_good(&session, &mut group.replica.conn()).await;
    assert_eq!(cmd(&mut group.master.conn(), &["EXISTS", "late"]), Value::Int(0));
}

/// In a cluster, a session is one connection to one node: a cluster client refuses sessions
/// (`Error::SessionUnsupported`, a node down or not), and a client opened on one node has
/// sessions there, for the locks that node serves. Node 0 stopped (SIGKILL): its session's
/// guards are lost at once, node 1's session and guard are untouched; node 0's replica is
/// promoted, where the replicated hold is an ordinary one; no session acquire binds there or on
/// the old node when it comes back as a replica (`MOVED`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_a_cluster_a_session_is_per_node_and_a_stopped_node_loses_only_its_own_sessions() {
    let mut cluster = Cluster::start_with_replicas(3, 1, &[]);
    let urls: Vec<String> = cluster.nodes.iter().map(Server::url).collect();
    let (k0, k1) = (cluster.key_on(0, "k"), cluster.key_on(1, "k"));
    let slot = cluster.slot(k0.as_bytes());
    let replica = cluster.replicas_via(0, 0);
    let &[r0] = replica.as_slice() else { panic!("one replica of node 0: {replica:?}") };
    let c0 = LockClient::open(cluster.nodes[0].url()).await.expect("a client of node 0");
    let c1 = LockClient::open(cluster.nodes[1].url()).await.expect("a client of node 1");
    let (s0, s1) = (c0.session().await.expect("session 0"), c1.session().await.expect("session 1"));
    let g0 = s0.lock(&k0).acquire(LONG).await.expect("node 0's lock");
    let g1 = s1.lock(&k1).acquire(LONG).await.expect("node 1's lock");
    // Per node: a lock another node serves is refused (MOVED), nothing bound.
    let elsewhere = s0.lock(&k1).try_acquire(Duration::ZERO, LONG).await;
    assert!(
        matches!(&elsewhere, Err(Error::Redis(e)) if e.code() == Some("MOVED")),
        "{elsewhere:?}"
    );
    assert!(!s0.is_closed(), "a refusal does not close the session");
    assert_eq!(session_holds(&mut cluster.nodes[0].conn()), 1);
    assert_eq!(session_holds(&mut cluster.nodes[1].conn()), 1);
    let offset = info_field(&mut cluster.nodes[0].conn(), "replication", "master_repl_offset");
    let mut replica = cluster.nodes[r0].conn();
    poll("node 0's replica to have the grant", LIMIT, || {
        (info_field(&mut replica, "replication", "slave_repl_offset") >= offset).then_some(())
    });
    let cluster_client = LockClient::cluster(urls, Options::default()).await.expect("cluster");

    cluster.nodes[0].kill();
    timeout(PROMPT, async { tokio::join!(g0.lost(), s0.closed()) })
        .await
        .expect("node 0's guard lost, its session closed, at once");
    let refused = timeout(PROMPT, cluster_client.session()).await.expect("refused at once");
    assert!(matches!(refused, Err(Error::SessionUnsupported)), "{refused:?}");
    assert!(!g1.is_lost() && !s1.is_closed(), "node 1's session is untouched");
    let other = s1.lock(format!("{{{k1}}}:other")).try_acquire(Duration::ZERO, LONG).await;
    other.expect("node 1's session still takes locks").release().await.expect("release");
    wait_for("node 0's replica to be promoted", LIMIT, || {
        (cluster.owner_via(slot, r0) == Some(r0) && is_master(&cluster.nodes[r0])).then_some(())
    });
    let mut promoted = cluster.nodes[r0].conn();
    let old = vec![(g0.owner().as_bytes().to_vec(), b"1".to_vec())];
    assert_eq!(hgetall(&mut promoted, k0.as_bytes()), old, "an ordinary hold there");
    let again = s0.lock(&k0).try_acquire(Duration::ZERO, LONG).await;
    assert!(matches!(again, Err(Error::SessionClosed)), "{again:?}");
    assert!(c0.session().await.is_err(), "node 0 is down: no session, and none elsewhere");
    assert_eq!(session_holds(&mut promoted), 0, "nothing bound on the promoted replica");

    // Node 0 back, as a replica of the promoted one: a session opens there, binds nothing.
    cluster.nodes[0].restart_same_port();
    wait_for("node 0 to rejoin as a replica", LIMIT, || {
        cluster.replicas_via(r0, r0).contains(&0).then_some(())
    });
    let back = c0.session().await.expect("a session on the old node, now a replica");
    let refused = back.lock(&k0).try_acquire(Duration::ZERO, LONG).await;
    assert!(matches!(&refused, Err(Error::Redis(e)) if e.code() == Some("MOVED")), "{refused:?}");
    assert_eq!(session_holds(&mut cluster.nodes[0].conn()), 0, "a replica binds nothing");
    assert_eq!(session_holds(&mut promoted), 0);
    assert_eq!(hgetall(&mut promoted, k0.as_bytes()), old, "the old hold ends with its lease");
    assert_eq!(session_holds(&mut cluster.nodes[1].conn()), 1, "node 1's session hold");
    drop(s1);
    timeout(PROMPT, g1.lost()).await.expect("lost with its own session");
}

/// A program whose `current_thread` tokio `main` ends while a session guard (watchdog-renewed)
/// is alive: dropped as `main`'s local, in a task dropped by the runtime's shutdown, or after
/// the runtime is gone (`src/bin/session_main.rs`). Each time the process exits at once and
/// cleanly (no panic, no hang), and the waiter of another client is served promptly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_program_whose_main_ends_with_a_session_guard_alive_exits_cleanly_and_frees_it() {
    let server = Server::start();
    let mut admin = server.conn();
    let other = LockClient::open(server.url()).await.expect("client");
    for mode in ["local", "task", "outlive"] {
        let lock = format!("main-{mode}");
        let mut child = Process(
            Command::new(env!("CARGO_BIN_EXE_session_main"))
                .args([mode, &server.url(), &lock])
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("child"),
        );
        let mut out = BufReader::new(child.0.stdout.take().expect("stdout"));
        let mut line = String::new();
        out.read_line(&mut line).expect("the child's output");
        assert_eq!(line.trim(), "HELD", "{mode}: the child took the lock");
        assert_eq!(session_holds(&mut admin), 1, "{mode}: a session hold");
        let waiter = other.lock(&lock);
        let waiting = tokio::spawn(async move {
            let guard = waiter.try_acquire(LIMIT, LONG).await;
            (guard, Instant::now())
        });
        wait_for("the waiter to block", LIMIT, || {
            (info_field(&mut admin, "clients", "blocked_clients") == 1).then_some(())
        });
        let ended = Instant::now();
        child.0.stdin.take().expect("stdin").write_all(b"go\n").expect("go");
        let (guard, at) = waiting.await.expect("waiter");
        let guard = guard.unwrap_or_else(|e| panic!("{mode}: the waiter is served: {e}"));
        assert!(at - ended < PROMPT, "{mode}: served {:?} after main ended", at - ended);
        let status = wait_for("the child to exit", PROMPT, || child.0.try_wait().expect("wait"));
        let mut stderr = String::new();
        child.0.stderr.take().expect("stderr").read_to_string(&mut stderr).expect("stderr");
        assert!(status.success(), "{mode}: {status}: {stderr}");
        assert!(!stderr.contains("panicked"), "{mode}: {stderr}");
        assert!(
            ended.elapsed() < PROMPT * 2,
            "{mode}: exited {:?} after main ended",
            ended.elapsed()
        );
        assert_eq!(session_holds(&mut admin), 0, "{mode}");
        guard.release().await.expect("release");
    }
}

/// A session asks the Sentinels for the master when it opens; when none answers, it opens on
/// the master the client knows (as every other command goes on there), and the client's shared
/// connection is left alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_no_sentinel_answering_a_session_opens_on_the_known_master() {
    let mut group = Group::start(5_000);
    let client = group.client().await;
    let before = client.lock("before").try_acquire(Duration::ZERO, LONG).await.expect("acquire");
    drop(group.sentinel);
    let session = client.session().await.expect("a session on the master the client knows");
    let guard = session.lock("s").try_acquire(Duration::ZERO, LONG).await.expect("session lock");
    assert_eq!(session_holds(&mut group.master.conn()), 1);
    let after = client.lock("after").try_acquire(Duration::ZERO, LONG).await;
    after.expect("the shared connection still serves").release().await.expect("release");
    guard.release().await.expect("release");
    before.release().await.expect("release");
    group.master.kill();
}
