//! Counted permits have no lease: a give-back a master answered and then lost with its role
//! (cut off from its replica, and replaced by it, before the give-back replicated) would be a
//! permit held by nobody for good. The client makes every answered counted give-back durable:
//! it sends it again (idempotent by its request id) and `WAIT`s for every replica of the
//! master, again on the current master until they all acknowledged.

use std::time::Duration;

use rlock_client::LockClient;
use rlock_tests_integration::{poll, Proxy, Server};

const GIVEN_BACK: Duration = Duration::from_secs(15);

/// The permits of `key` on `server` (0 when it cannot be read).
fn permits(server: &Server, key: &str) -> i64 {
    let Ok(mut con) = server.client().get_connection_with_timeout(Duration::from_millis(500))
    else {
        return 0;
    };
    redis::cmd("GET").arg(key).query::<Option<i64>>(&mut con).ok().flatten().unwrap_or(0)
}

/// A blocking poll from a test on the multi-thread runtime.
fn wait_for(what: &str, limit: Duration, mut check: impl FnMut() -> bool) {
    tokio::task::block_in_place(|| poll(what, limit, || check().then_some(())));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_its_master_lost_with_its_role_is_given_back_by_the_promoted_replica() {
    let mut master = Server::start();
    let link = Proxy::start(master.port()); // the replication link, cut below
    let replica =
        Server::builder().config("replicaof", &format!("127.0.0.1 {}", link.port())).start();
    let front = Proxy::start(master.port()); // the client's way to whichever server is master
    let client = LockClient::open(front.url()).await.expect("client");
    let (key, sem) = ("cf:durable", client.semaphore("cf:durable"));
    assert!(sem.try_set_permits(3).await.expect("set"));
    sem.acquire(1).await.expect("acquire");
    wait_for("the replica in sync", GIVEN_BACK, || permits(&replica, key) == 2);
    link.cut(); // the master still counts its replica, which hears nothing more
    assert_eq!(sem.release(1).await.expect("release"), 3); // never replicated
    master.kill();
    redis::cmd("REPLICAOF").arg("NO").arg("ONE").exec(&mut replica.conn()).expect("promote");
    assert_eq!(permits(&replica, key), 2, "the replica was not cut off in time");
    front.retarget(replica.port());
    wait_for("the permit given back on the promoted replica", GIVEN_BACK, || {
        permits(&replica, key) == 3
    });
    // Sent again, it gives back nothing more.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(permits(&replica, key), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_refused_for_want_of_replicas_is_given_back_once_they_are_back() {
    // `NOREPLICAS` (here Redis's own `min-replicas-to-write`) refuses a counted release: nothing
    // was given back. The caller gets the refusal, and the release goes on in the background:
    // once the master may write again, the permit comes back, once.
    let server = Server::start();
    let client = LockClient::open(server.url()).await.expect("client");
    let (key, sem) = ("cf:noreplicas", client.semaphore("cf:noreplicas"));
    assert!(sem.try_set_permits(1).await.expect("set"));
    let config = |n: &str| {
        redis::cmd("CONFIG").arg("SET").arg("min-replicas-to-write").arg(n).exec(&mut server.conn())
    };
    config("1").expect("config");
    assert!(sem.release(1).await.is_err(), "a refused release reported as done");
    assert_eq!(permits(&server, key), 1); // refused so far
    config("0").expect("config");
    wait_for("the refused release given back", GIVEN_BACK, || permits(&server, key) == 2);
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(permits(&server, key), 2);
}
