//! The Rust client on a cluster: waits keep working while a seed node is stopped, and a wait
//! whose slot moves is served on the new node.

use std::time::Duration;

use tokio::time::Instant;

use rlock_client::{LockClient, Options};
use rlock_tests_integration::lock_client::has_key;
use rlock_tests_integration::{blocked_clients, poll, Cluster, Server};

/// How long anything the client does in the background may take to show.
const LIMIT: Duration = Duration::from_secs(10);

/// A lease long enough that a leaked hold is still there when the test looks.
const LONG: Option<Duration> = Some(Duration::from_secs(60));

// ---- cluster: a seed node down, a slot moved while waiting ----------------------------------------

/// With the first seed node stopped, waits on locks of healthy nodes work: a waiter gets the
/// lock when its holder releases it (every time, not when the routing happens to avoid the
/// stopped node).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_waits_on_healthy_nodes_work_while_the_first_seed_node_is_stopped() {
    let cluster = Cluster::start_with(3, &[("cluster-require-full-coverage", "no")]);
    let urls: Vec<String> = cluster.nodes.iter().map(Server::url).collect();
    let (a, b) = (
        LockClient::cluster(urls.clone(), Options::default()).await.expect("a"),
        LockClient::cluster(urls, Options::default()).await.expect("b"),
    );
    // The harness asks node 0 for slots: the keys are found before it stops.
    let keys: Vec<String> =
        (0..6).map(|r| cluster.key_on(1 + r % 2, &format!("seed{r}:"))).collect();
    cluster.nodes[0].pause();
    let mut failures = Vec::new();
    for (round, key) in keys.iter().enumerate() {
        let held = b.lock(key).acquire(LONG).await.expect("b holds");
        let lock = a.lock(key);
        let waiting =
            tokio::spawn(async move { lock.try_acquire(Duration::from_secs(5), LONG).await });
        tokio::time::sleep(Duration::from_millis(700)).await;
        held.release().await.expect("b releases");
        match waiting.await.expect("task") {
            Ok(guard) => guard.release().await.expect("release"),
            Err(e) => failures.push(format!("round {round}: {e:?}")),
        }
    }
    cluster.nodes[0].resume();
    assert!(failures.is_empty(), "waits failed while node 0 was stopped: {failures:?}");
}

/// A waiter whose lock's slot moves to another node while it waits is still served when the
/// holder releases it there (or at worst returns by its deadline), and leaves nothing held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_a_wait_whose_slot_moves_is_served_on_the_new_node() {
    let cluster = Cluster::start(3);
    let urls: Vec<String> = cluster.nodes.iter().map(Server::url).collect();
    let (a, b) = (
        LockClient::cluster(urls.clone(), Options::default()).await.expect("a"),
        LockClient::cluster(urls, Options::default()).await.expect("b"),
    );
    let key = cluster.key_on(0, "moving:");
    let held = b.lock(&key).acquire(LONG).await.expect("b holds");
    let lock = a.lock(&key);
    let started = Instant::now();
    let waiting = tokio::spawn(async move { lock.try_acquire(Duration::from_secs(8), LONG).await });
    poll("the wait", LIMIT, || (blocked_clients(&mut cluster.nodes[0].conn()) == 1).then_some(()));
    cluster.move_slot(cluster.slot(key.as_bytes()), 0, 1);
    held.release().await.expect("b releases on the new node");
    let result = waiting.await.expect("task");
    let took = started.elapsed();
    assert!(took < Duration::from_secs(9), "bounded by the wait: {took:?}");
    match result {
        Ok(guard) => guard.release().await.expect("release"),
        Err(e) => panic!(
            "the lock was free on the new node, yet the wait ended with {e:?} after {took:?}"
        ),
    }
    poll("nothing held", LIMIT, || {
        (!has_key(&cluster.nodes[1], &key) && !has_key(&cluster.nodes[0], &key)).then_some(())
    });
}
