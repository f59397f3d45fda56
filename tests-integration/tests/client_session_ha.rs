//! The Rust client's sessions (issue 27 §1) when the server side changes under them: a
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

use std::time::Duration;

use redis::{Connection, Value};
use rlock_client::{Error, LockClient, Options};
use rlock_tests_integration::{
    cmd, hgetall, info_field, is_master, poll, wait_link_up, Sentinel, Server, SENTINEL_MASTER,
};
use tokio::time::{timeout, Instant};

/// How long anything that should happen "at once" may take here.
const PROMPT: Duration = Duration::from_secs(2);
/// The bound of a failover (a promotion, a demotion).
const FAILOVER_LIMIT: Duration = Duration::from_secs(30);
const LIMIT: Duration = Duration::from_secs(20);
const LONG: Option<Duration> = Some(Duration::from_secs(60));

fn holds(con: &mut Connection) -> i64 {
    info_field(con, "rlock", "rlock_session_holds")
}

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
    assert_eq!(holds(new_master), 0, "the bindings stayed in the old master's memory");
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
    assert_eq!(hgetall(&mut con, key.as_bytes()), vec![(guard.owner().as_bytes().to_vec(), b"1".to_vec())]);
    assert_eq!(holds(&mut con), 1, "a session hold of the new master");
    drop(again);
    timeout(PROMPT, guard.lost()).await.expect("the dropped session's guard is lost");
    poll("the new session's hold to end", LIMIT, || {
        (cmd(&mut con, &["EXISTS", key]) == Value::Int(0) && holds(&mut con) == 0).then_some(())
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
    assert_eq!(holds(&mut group.master.conn()), 3);
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
async fn a_manual_sentinel_failover_closes_the_session_and_a_new_session_binds_to_the_new_master()
{
    let group = Group::start(5_000);
    let client = group.client().await;
    let session = client.session().await.expect("session");
    let a = session.lock("a").acquire(Some(Duration::from_secs(6))).await.expect("a lock");
    let w = session.lock("w").acquire(None).await.expect("a watchdog lock");
    group.replicated();
    let mut s = redis::Client::open(group.sentinel.url()).expect("url").get_connection().expect("con");
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
    assert_eq!(holds(&mut group.master.conn()), 0, "a replica binds nothing");
}
