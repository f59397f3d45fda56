//! The Rust client's read-write lock: what its guards hold through reads and writes of one
//! owner.

use std::time::Duration;

use rlock_client::LockClient;
use rlock_tests_integration::{hgetall, poll, Server};

/// How long anything the client does in the background (a give-back, a cancel) may take.
const LIMIT: Duration = Duration::from_secs(10);

/// A lease long enough that a hold it leaks is still there when the test looks.
const LONG: Duration = Duration::from_secs(60);

async fn client(server: &Server) -> LockClient {
    LockClient::open(server.url()).await.expect("client")
}

/// The hash `name` as text pairs.
fn fields(server: &Server, name: &str) -> Vec<(String, String)> {
    hgetall(&mut server.conn(), name.as_bytes())
        .into_iter()
        .map(|(f, v)| {
            (String::from_utf8_lossy(&f).into_owned(), String::from_utf8_lossy(&v).into_owned())
        })
        .collect()
}

/// A write guard (explicit short lease) outlives its lease on the client's clock while the
/// same handle's read hold (same owner: write -> read re-entry) keeps the hash, and so the
/// write field, alive on the server (Redisson's model: a write hold has no lease of its own,
/// it lives as long as the key). The handle's next `write()` acquire must not take a second
/// count on that still-present write field under the same owner and then disown the first:
/// after every guard is released or dropped, nothing may stay held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_taken_again_through_the_read_leaves_no_write_held_by_nobody() {
    let server = Server::start();
    let (mine, theirs) = (client(&server).await, client(&server).await);
    let rw = mine.rw_lock("ghost");
    let stale = rw.write().acquire(Some(Duration::from_millis(800))).await.expect("write");
    let reading = rw.read().acquire(Some(LONG)).await.expect("write -> read re-entry");
    poll("the write guard's 0.8 s to pass", LIMIT, || stale.is_lost().then_some(()));
    let again = rw.write().try_acquire(Duration::ZERO, Some(LONG)).await;
    let after_again = fields(&server, "ghost");
    if let Ok(w) = again {
        w.release().await.expect("release the new write guard");
    }
    drop(stale);
    reading.release().await.expect("release the read");
    // Every guard is gone: the lock must be free (within what background work may take).
    let their_rw = theirs.rw_lock("ghost");
    let foreign = their_rw.write().try_acquire(LIMIT, Some(LONG)).await;
    assert!(
        foreign.is_ok(),
        "every guard of ours is released or dropped, yet another client cannot take write for \
         {LIMIT:?}: {foreign:?}; the server holds {:?} (after the second write: {after_again:?})",
        fields(&server, "ghost")
    );
}
