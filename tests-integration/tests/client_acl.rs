//! The Rust client under ACL users limited to key patterns: typed errors, and nothing left
//! held (also without permission for `RLOCK.CANCEL`).

use std::time::Duration;

use tokio::time::Instant;

use rlock_client::{Error, LockClient, MultiLock};
use rlock_tests_integration::lock_client::{acl_user, available, client, keys};
use rlock_tests_integration::{blocked_clients, poll, Server};

/// How long anything the client does in the background may take to show.
const LIMIT: Duration = Duration::from_secs(10);

/// A lease long enough that a leaked hold is still there when the test looks.
const LONG: Option<Duration> = Some(Duration::from_secs(60));

// ---- ACL users limited to key patterns ------------------------------------------------------------

/// A user allowed every command but only keys `app:*` (no request records, no read-hold timeout
/// keys): every kind's acquire, a try and a wait on a held lock alike, gets a typed error at
/// once, and nothing is left held (no key at all beyond the admin's).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_limited_to_its_keys_gets_typed_errors_and_leaves_nothing_held() {
    let server = Server::start();
    let admin = client(&server).await;
    admin.semaphore("app:sem").try_set_permits(2).await.expect("permits");
    admin.leased_semaphore("app:leased").try_set_permits(2).await.expect("permits");
    let busy = admin.lock("app:busy").acquire(LONG).await.expect("admin holds");
    let before = keys(&server);
    let url = acl_user(&server, "app", &["~app:*", "&*", "+@all"]);
    let user = LockClient::open(url.as_str()).await.expect("open");
    let wait = Duration::from_secs(2);
    let mut results = Vec::new();
    let t = Instant::now();
    results.push(("lock", user.lock("app:l").try_acquire(wait, LONG).await.map(drop)));
    results.push(("busy lock", user.lock("app:busy").try_acquire(wait, LONG).await.map(drop)));
    let rw = user.rw_lock("app:rw");
    results.push(("read", rw.read().try_acquire(wait, LONG).await.map(drop)));
    results.push(("write", rw.write().try_acquire(wait, LONG).await.map(drop)));
    results.push(("counted", user.semaphore("app:sem").try_acquire(1, wait).await.map(drop)));
    let leased = user.leased_semaphore("app:leased");
    results.push(("leased", leased.try_acquire(1, wait, LONG).await.map(drop)));
    let multi = MultiLock::new(vec![user.lock("app:m1"), user.lock("app:m2")]);
    results.push(("multi", multi.try_acquire(wait, LONG).await.map(drop)));
    let took = t.elapsed();
    for (what, result) in &results {
        let typed = matches!(result, Err(Error::Redis(e)) if e.code() == Some("NOPERM"));
        assert!(typed, "{what}: {result:?}");
    }
    assert!(took < Duration::from_secs(3), "refusals took {took:?}: a refused wait must not wait");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(keys(&server), before, "nothing left behind");
    assert_eq!(available(&server, "app:sem"), 2);
    assert_eq!(available(&server, "app:leased"), 2);
    busy.release().await.expect("release");
}

/// A user allowed its keys and request records but not `RLOCK.CANCEL`: an acquire it cancels
/// (dropped while waiting) must still leave nothing held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_without_cancel_leaves_nothing_held_after_a_dropped_acquire() {
    let server = Server::start();
    let admin = client(&server).await;
    admin.semaphore("app:sem").try_set_permits(1).await.expect("permits");
    let url = acl_user(
        &server,
        "app",
        &["~app:*", "~rlock_request:*", "~redisson_unlock_latch:*", "&*", "+@all", "-rlock.cancel"],
    );
    let user = LockClient::open(url.as_str()).await.expect("open");
    let sem = user.semaphore("app:sem");
    let _ = redis::cmd("RSEM.ACQUIRE").arg("app:sem").arg(1).query::<i64>(&mut server.conn());
    let waiting = tokio::spawn(async move { sem.acquire(1).await });
    poll("the wait", LIMIT, || (blocked_clients(&mut server.conn()) == 1).then_some(()));
    waiting.abort();
    let _ = waiting.await;
    // Its cancel is refused (NOPERM): what ends the wait is its connection, closed by the
    // client; a release that came before the server saw it close would grant the leaving
    // waiter, whose reply the server counts as delivered.
    poll("the wait's end", LIMIT, || (blocked_clients(&mut server.conn()) == 0).then_some(()));
    let _: i64 =
        redis::cmd("RSEM.RELEASE").arg("app:sem").arg(1).query(&mut server.conn()).expect("rel");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(available(&server, "app:sem"), 1, "the permit given back reached nobody");
}
