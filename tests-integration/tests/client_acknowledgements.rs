//! The Rust client's replica and AOF acknowledgements: a grant not acknowledged in time is
//! given back exactly, for every kind.

use std::time::Duration;

use rlock_client::{Error, LockClient, MultiLock, Options, RedLock};
use rlock_tests_integration::lock_client::{available, client, keys};
use rlock_tests_integration::Server;

/// A lease long enough that a leaked hold is still there when the test looks.
const LONG: Option<Duration> = Some(Duration::from_secs(60));

// ---- replica / AOF acknowledgement failing, every kind -------------------------------------------

/// On a server without replicas (and, for AOF, without an AOF), every kind's grant fails its
/// acknowledgement: the call reports it with a typed error and gives back exactly what it got.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_acknowledgement_gives_back_exactly_for_every_kind() {
    let server = Server::start();
    let admin = client(&server).await;
    for (ack, options) in [
        ("replica", Options::default().replica_ack(1, Duration::from_millis(100))),
        ("aof", Options::default().aof_ack(true, 0, Duration::from_millis(100))),
    ] {
        let user = LockClient::with_options(server.client(), options).await.expect("client");
        admin.semaphore("sem").try_set_permits(3).await.expect("permits");
        admin.leased_semaphore("leased").try_set_permits(3).await.expect("permits");
        let mut before = keys(&server);
        before.retain(|k| !k.starts_with("rlock_request:"));
        let wait = Duration::from_secs(1);
        let rw = user.rw_lock("rw");
        let multi = MultiLock::new(vec![user.lock("m1"), user.lock("m2")]);
        let red = RedLock::new(std::slice::from_ref(&user), "red");
        let results = vec![
            ("lock", user.lock("l").try_acquire(wait, LONG).await.map(drop)),
            ("lock watchdog", user.lock("lw").try_acquire(wait, None).await.map(drop)),
            ("read", rw.read().try_acquire(wait, LONG).await.map(drop)),
            ("write", rw.write().try_acquire(wait, LONG).await.map(drop)),
            ("counted", user.semaphore("sem").try_acquire(2, wait).await.map(drop)),
            ("counted wait", user.semaphore("sem").acquire(1).await.map(drop)),
            ("leased", user.leased_semaphore("leased").try_acquire(2, wait, LONG).await.map(drop)),
            ("multi", multi.try_acquire(wait, LONG).await.map(drop)),
            ("redlock", red.try_acquire(wait, LONG).await.map(drop)),
        ];
        for (what, result) in &results {
            // A RedLock counts a node whose acknowledgement failed as not granted, and retries
            // until its wait ends (documented: `TimedOut`).
            let typed = match ack {
                _ if *what == "redlock" => matches!(result, Err(Error::TimedOut)),
                "replica" => matches!(result, Err(Error::NotReplicated { .. })),
                _ => matches!(result, Err(Error::NotPersisted { .. } | Error::Redis(_))),
            };
            assert!(typed, "{ack} {what}: {result:?}");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        let mut after = keys(&server);
        after.retain(|k| !k.starts_with("rlock_request:"));
        assert_eq!(after, before, "{ack}: nothing left held");
        assert_eq!(available(&server, "sem"), 3, "{ack}: counted permits conserved");
        assert_eq!(available(&server, "leased"), 3, "{ack}: leased permits conserved");
    }
}
