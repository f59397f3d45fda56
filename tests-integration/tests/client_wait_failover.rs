//! An untimed wait across a failover (a manual Sentinel failover, a cluster `CLUSTER
//! FAILOVER`): a failover is no answer. The old master ends the wait (`broken pipe` as the
//! Sentinel demotes it, `UNBLOCKED` in a cluster); the client sends the wait again, with the same
//! request id, where the lock is served now, and it is granted there when the (replicated)
//! holder releases. Counted permits stay conserved.

use std::time::Duration;

use redis::Value;
use rlock_client::{LockClient, Options};
use rlock_tests_integration::{
    cmd, exists, is_master, poll, wait_link_up, Cluster, Sentinel, Server, SENTINEL_MASTER,
};
use tokio::task::JoinHandle;

const FAILOVER_LIMIT: Duration = Duration::from_secs(40);
/// How long a re-sent wait may take to be granted once the holder released.
const GRANTED: Duration = Duration::from_secs(10);
const LEASE: Option<Duration> = Some(Duration::from_secs(60));

/// A blocking poll from a test on the multi-thread runtime.
fn wait_for<T>(what: &str, limit: Duration, check: impl FnMut() -> Option<T>) -> T {
    tokio::task::block_in_place(|| poll(what, limit, check))
}

/// The waiters `<family>.WAITERS key` lists on `server` (0 when it cannot be asked).
fn waiters(server: &Server, family: &str, key: &str) -> usize {
    let Ok(mut con) = server.client().get_connection_with_timeout(Duration::from_millis(500))
    else {
        return 0;
    };
    match redis::cmd(&format!("{family}.WAITERS")).arg(key).query::<Value>(&mut con) {
        Ok(Value::Array(rows)) => rows.len(),
        _ => 0,
    }
}

/// An untimed lock wait and an untimed counted-permit wait, spawned.
fn spawn_waits(
    client: &LockClient,
    (lock, sem): (&str, &str),
) -> (JoinHandle<rlock_client::Result<rlock_client::LockGuard>>, JoinHandle<rlock_client::Result<()>>)
{
    let (lock, sem) = (client.lock(lock), client.semaphore(sem));
    (
        tokio::spawn(async move { lock.acquire(None).await }),
        tokio::spawn(async move { sem.acquire(1).await }),
    )
}

/// After the failover: neither wait answered; the holders release (on the new master), and
/// each wait is granted there; the permit is conserved.
async fn granted_after_release(
    holder: rlock_client::LockGuard,
    holder_sem: &rlock_client::Semaphore,
    (lock_wait, sem_wait): (
        JoinHandle<rlock_client::Result<rlock_client::LockGuard>>,
        JoinHandle<rlock_client::Result<()>>,
    ),
) {
    assert!(!lock_wait.is_finished(), "a failover is no answer: {:?}", lock_wait.await);
    assert!(!sem_wait.is_finished(), "a failover is no answer: {:?}", sem_wait.await);
    holder.release().await.expect("the holder's release, on the new master");
    holder_sem.release(1).await.expect("the permit's release, on the new master");
    let guard = tokio::time::timeout(GRANTED, lock_wait)
        .await
        .expect("the lock wait, granted on the new master")
        .expect("task")
        .expect("the lock");
    assert!(!guard.is_lost());
    tokio::time::timeout(GRANTED, sem_wait)
        .await
        .expect("the permit wait, granted on the new master")
        .expect("task")
        .expect("the permit");
    assert_eq!(holder_sem.available().await.expect("available"), 0, "the waiter has it");
    holder_sem.release(1).await.expect("the waiter's permit back");
    assert_eq!(holder_sem.available().await.expect("available"), 1, "permits conserved");
    guard.release().await.expect("the waiter's release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn untimed_waits_follow_a_sentinel_failover_and_are_granted_on_the_new_master() {
    let master = Server::start();
    let replica = Server::builder().replica_of(&master).start();
    wait_link_up(&mut replica.conn());
    let sentinel = Sentinel::start(&master, 1, 30_000);
    let open = || {
        let url = sentinel.url();
        async move {
            LockClient::sentinel(
                vec![url],
                SENTINEL_MASTER,
                "redis://127.0.0.1/",
                Options::default(),
            )
            .await
            .expect("a Sentinel client")
        }
    };
    let (holders, waiting) = (open().await, open().await);
    let holder = holders.lock("k").acquire(LEASE).await.expect("the holder's lock");
    let holder_sem = holders.semaphore("s");
    assert!(holder_sem.try_set_permits(1).await.expect("permits"));
    holder_sem.acquire(1).await.expect("the holder's permit");
    let waits = spawn_waits(&waiting, ("k", "s"));
    wait_for("both waits to be queued", FAILOVER_LIMIT, || {
        (waiters(&master, "RLOCK", "k") == 1 && waiters(&master, "RSEM", "s") == 1).then_some(())
    });
    wait_for("the holds to reach the replica", FAILOVER_LIMIT, || {
        let mut con = replica.conn();
        (exists(&mut con, "k") && cmd(&mut con, &["GET", "s"]) == Value::BulkString(b"0".to_vec()))
            .then_some(())
    });
    wait_for("the sentinel to know the replica", FAILOVER_LIMIT, || {
        let mut con = redis::Client::open(sentinel.url()).ok()?.get_connection().ok()?;
        let info: String = redis::cmd("INFO").arg("sentinel").query(&mut con).ok()?;
        info.contains("slaves=1").then_some(())
    });
    let mut s = redis::Client::open(sentinel.url()).expect("url").get_connection().expect("con");
    wait_for("the sentinel to accept a failover", FAILOVER_LIMIT, || {
        redis::cmd("SENTINEL").arg("FAILOVER").arg(SENTINEL_MASTER).query::<()>(&mut s).ok()
    });
    wait_for("the promotion", FAILOVER_LIMIT, || {
        (sentinel.master_port() == replica.port() && is_master(&replica)).then_some(())
    });
    wait_for("the old master's demotion", FAILOVER_LIMIT, || (!is_master(&master)).then_some(()));
    wait_for("both waits to be queued on the new master", FAILOVER_LIMIT, || {
        assert!(!waits.0.is_finished() && !waits.1.is_finished(), "a failover is no answer");
        (waiters(&replica, "RLOCK", "k") == 1 && waiters(&replica, "RSEM", "s") == 1).then_some(())
    });
    granted_after_release(holder, &holder_sem, waits).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn untimed_waits_follow_a_cluster_failover_and_are_granted_on_the_new_master() {
    let cluster = Cluster::start_with_replicas(3, 1, &[]);
    let urls: Vec<String> = cluster.nodes.iter().map(Server::url).collect();
    let key = cluster.key_on(0, "k");
    let sem = format!("{{{key}}}:s");
    let open = || LockClient::cluster(urls.clone(), Options::default());
    let (holders, waiting) = (open().await.expect("client"), open().await.expect("client"));
    let holder = holders.lock(&key).acquire(LEASE).await.expect("the holder's lock");
    let holder_sem = holders.semaphore(&sem);
    assert!(holder_sem.try_set_permits(1).await.expect("permits"));
    holder_sem.acquire(1).await.expect("the holder's permit");
    let waits = spawn_waits(&waiting, (&key, &sem));
    let old = &cluster.nodes[0];
    wait_for("both waits to be queued", FAILOVER_LIMIT, || {
        (waiters(old, "RLOCK", &key) == 1 && waiters(old, "RSEM", &sem) == 1).then_some(())
    });
    let replicas = cluster.replicas_via(0, 0);
    assert_eq!(replicas.len(), 1, "one replica of node 0");
    let new = &cluster.nodes[replicas[0]];
    wait_for("the holds to reach the replica", FAILOVER_LIMIT, || {
        let mut con = new.conn();
        cmd(&mut con, &["READONLY"]);
        (exists(&mut con, &key)
            && cmd(&mut con, &["GET", &sem]) == Value::BulkString(b"0".to_vec()))
        .then_some(())
    });
    cmd(&mut new.conn(), &["CLUSTER", "FAILOVER"]);
    let slot = cluster.slot(key.as_bytes());
    wait_for("the replica to own the slot", FAILOVER_LIMIT, || {
        (cluster.owner_via(slot, replicas[0]) == Some(replicas[0])).then_some(())
    });
    wait_for("both waits to be queued on the new master", FAILOVER_LIMIT, || {
        assert!(!waits.0.is_finished() && !waits.1.is_finished(), "a failover is no answer");
        (waiters(new, "RLOCK", &key) == 1 && waiters(new, "RSEM", &sem) == 1).then_some(())
    });
    granted_after_release(holder, &holder_sem, waits).await;
}

/// An untimed acquire sent right after `CLIENT KILL` of the client's connections: its try meets
/// the killed shared connection (no answer, as a wait's connection killed), so it waits, on a
/// connection of its own with the same request id, and is granted once the holder lets go. It
/// never ends with an error that a wait without a deadline cannot have (`TimedOut`, a broken
/// pipe).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_untimed_acquire_after_its_client_s_connection_was_killed_waits_and_is_granted() {
    let server = Server::start();
    let client = LockClient::open(server.url()).await.expect("a client");
    let direct = LockClient::open(server.url()).await.expect("the holder's client");
    let holder = direct.lock("killed").acquire(LEASE).await.expect("held");
    let killed = cmd(&mut server.conn(), &["CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"]);
    assert!(
        matches!(killed, Value::Int(n) if n >= 2),
        "both clients' connections killed: {killed:?}"
    );
    let lock = client.lock("killed");
    let waiting = tokio::spawn(async move { lock.acquire(LEASE).await });
    wait_for("the wait to be queued", Duration::from_secs(10), || {
        assert!(!waiting.is_finished(), "the untimed acquire ended while the lock was held");
        (waiters(&server, "RLOCK", "killed") == 1).then_some(())
    });
    holder.release().await.expect("the holder's release");
    let guard = tokio::time::timeout(GRANTED, waiting)
        .await
        .expect("the wait returned once the holder let go")
        .expect("the waiting task")
        .expect("granted");
    guard.release().await.expect("released");
    assert!(!exists(&mut server.conn(), "killed"), "nothing left held");
}

/// An untimed re-entry (a handle taking the lock it holds again) sent right after `CLIENT KILL`
/// of the client's connections: the renewal that confirms the hold meets the killed shared
/// connection, and is sent again on a new one, so the re-entry joins the hold instead of ending
/// with a broken pipe.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_untimed_re_entry_after_its_client_s_connection_was_killed_joins_the_hold() {
    let server = Server::start();
    let client = LockClient::open(server.url()).await.expect("a client");
    let lock = client.lock("re-entered");
    let outer = lock.acquire(LEASE).await.expect("held");
    let killed = cmd(&mut server.conn(), &["CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"]);
    assert_eq!(killed, Value::Int(1), "the client's connection killed");
    let inner = tokio::time::timeout(GRANTED, lock.acquire(LEASE))
        .await
        .expect("the re-entry returned")
        .expect("the re-entry joined the hold");
    inner.release().await.expect("the inner guard's release");
    assert!(exists(&mut server.conn(), "re-entered"), "the outer guard still holds");
    outer.release().await.expect("the outer guard's release");
    assert!(!exists(&mut server.conn(), "re-entered"), "nothing left held");
}
