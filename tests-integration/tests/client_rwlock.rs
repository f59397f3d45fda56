//! The Rust client's read-write lock: what its guards hold through reads and writes of one
//! owner. A guard stands for its own side's grant: one that outlived its grant (its lease
//! ended, its hold was released) is never re-entered, renewed or reported valid through the same
//! owner's hold on the other side, which would let a writer and a reader (or a foreign writer)
//! hold at once while the client says it excludes them.

use std::time::Duration;

use rlock_client::{Error, Options};
use rlock_tests_integration::lock_client::{client, client_with, field, fields, until_gone};
use rlock_tests_integration::{cmd, poll, Server};
use tokio::time::timeout;

/// How long anything the client does in the background (a give-back, a cancel) may take.
const LIMIT: Duration = Duration::from_secs(10);

/// A lease long enough that a hold it leaks is still there when the test looks.
const LONG: Duration = Duration::from_secs(60);

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

fn is_upgrade_refusal(e: &Error) -> bool {
    matches!(e, Error::UpgradeRefused)
}

/// A write guard with a 0.8 s lease outlives it; the same `RwLock` takes read (the
/// server grants it to the stale write chain's owner); then `write().try_acquire(..)` on that
/// handle must not hand out a write guard while the server holds only the read (there is no
/// upgrade in Redisson's model: the server would refuse it), and another client's reader must
/// not be granted while a write guard of ours says it holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_guard_past_its_lease_is_not_re_entered_through_the_same_owners_read() {
    let server = Server::start();
    let (mine, theirs) = (client(&server).await, client(&server).await);
    let rw = mine.rw_lock("rw");
    let stale = rw.write().acquire(Some(Duration::from_millis(800))).await.expect("write");
    until_gone(&server, "rw", "the write guard's 0.8 s lease to end");
    let reading = rw.read().acquire(Some(LONG)).await.expect("the same RwLock takes read");
    assert_eq!(field(&server, "rw", "mode").as_deref(), Some("read"));

    let write = rw.write().try_acquire(Duration::from_millis(500), Some(LONG)).await;
    let server_now = fields(&server, "rw");
    let their_rw = theirs.rw_lock("rw");
    let foreign = their_rw.read().try_acquire(Duration::from_millis(300), Some(LONG)).await;
    match &write {
        Ok(w) => {
            let held = field(&server, "rw", &format!("{}:write", w.owner())).is_some()
                && field(&server, "rw", "mode").as_deref() == Some("write");
            assert!(
                held,
                "write().try_acquire returned a write guard (owner {}, lost: {}) while the \
                 server holds {server_now:?}: no write hold",
                w.owner(),
                w.is_lost()
            );
            assert!(
                foreign.is_err() || w.is_lost(),
                "another client's reader was granted while our write guard says it holds"
            );
        }
        Err(e) => assert!(
            is_upgrade_refusal(e) || matches!(e, Error::TimedOut),
            "no write guard, for the right reason: {e:?}"
        ),
    }
    assert!(stale.is_lost(), "the guard whose lease ended knows it");
    drop((write, foreign, stale));
    reading.release().await.expect("release the read");
}

/// A watchdog write guard whose write hold is released by someone else (an operator's
/// `RWLOCK.RELEASE <its owner> WRITE`: the write hold ends, the same owner's read hold stays,
/// the lock downgrades to read) must report the loss within a lease, even though the same
/// owner still reads (its renewal must not succeed on the read hold) and another client reads
/// beside it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watchdog_write_guard_whose_write_hold_ended_is_lost_though_its_owner_reads() {
    let server = Server::start();
    let lease = Duration::from_millis(1_500);
    let mine = client_with(&server, Options::default().watchdog_timeout(lease)).await;
    let theirs = client(&server).await;
    let rw = mine.rw_lock("rw");
    let writing = rw.write().acquire(None).await.expect("write, with the watchdog");
    let reading = rw.read().acquire(Some(LONG)).await.expect("the writer also reads");
    let owner = writing.owner().to_owned();
    let released = cmd(&mut server.conn(), &["RWLOCK.RELEASE", "rw", &owner, "WRITE"]);
    assert_eq!(released, redis::Value::Int(1), "the write hold ended");
    assert_eq!(field(&server, "rw", "mode").as_deref(), Some("read"), "downgraded");
    let their_rw = theirs.rw_lock("rw");
    let foreign = their_rw.read().try_acquire(Duration::from_millis(300), Some(LONG)).await;
    let foreign = foreign.expect("nobody writes: another client reads");

    // One lease and a margin: renewals run every third of it.
    let bound = lease + Duration::from_millis(1_000);
    let reported = timeout(bound, writing.lost()).await;
    assert!(
        reported.is_ok() && writing.is_lost(),
        "{bound:?} after its write hold ended, the write guard still reports it holds, while \
         the server holds {:?} (another client reading)",
        fields(&server, "rw")
    );
    foreign.release().await.expect("release the foreign read");
    reading.release().await.expect("release the read");
}

/// The mirror of [`a_write_guard_past_its_lease_is_not_re_entered_through_the_same_owners_read`]:
/// a read guard outlives its 0.8 s lease; the write side takes write (as the stale read chain's
/// owner); `read().acquire()` must not join the stale read chain on the strength of the write
/// hold: after the write is released, a foreign writer must not hold while that read guard
/// reports valid.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_guard_past_its_lease_is_not_re_entered_through_the_same_owners_write() {
    let server = Server::start();
    let (mine, theirs) = (client(&server).await, client(&server).await);
    let rw = mine.rw_lock("rw");
    let stale = rw.read().acquire(Some(Duration::from_millis(800))).await.expect("read");
    until_gone(&server, "rw", "the read guard's 0.8 s lease to end");
    let writing = rw.write().acquire(Some(LONG)).await.expect("the write side takes write");
    let reading = rw.read().acquire(Some(LONG)).await;
    let server_then = fields(&server, "rw");
    writing.release().await.expect("release the write");
    let their_rw = theirs.rw_lock("rw");
    let foreign = their_rw.write().try_acquire(Duration::from_millis(300), Some(LONG)).await;

    if let Ok(r) = &reading {
        assert!(
            foreign.is_err() || r.is_lost(),
            "a foreign writer holds ({:?}) while our read guard (owner {}) reports valid",
            fields(&server, "rw"),
            r.owner()
        );
        assert!(
            server_then.iter().any(|(f, _)| f == r.owner()),
            "read().acquire returned a guard for owner {} while the server held {server_then:?}: \
             no read hold of that owner",
            r.owner()
        );
    }
    assert!(stale.is_lost(), "the guard whose lease ended knows it");
    drop((foreign, stale));
    if let Ok(r) = reading {
        r.release().await.expect("release the read");
    }
}
