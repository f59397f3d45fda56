//! The Rust client's owners (deadlock refusal in the clients): `LockClient::owner()` gives one unit
//! of work (a task, a request handler) one owner id for every lock it takes, as a Redisson
//! thread's, so the server's wait-for graph sees its holds and its waits as one party and
//! refuses a wait that would close a cycle (`Error::Deadlock`). Plain handles
//! (`LockClient::lock`) keep an owner id per hold: never refused, they wait.

use std::time::Duration;

use redis::{Connection, Value};
use rlock_client::{Error, LockClient, Options, Owner};
use rlock_tests_integration::lock_client::client;
use rlock_tests_integration::{cmd, hgetall, poll, wait_blocked, wait_state, Server};
use tokio::time::{sleep, Instant};

const LIMIT: Duration = Duration::from_secs(10);
const LEASE: Option<Duration> = Some(Duration::from_secs(60));

/// The waiters' fields that move while a test looks (time passes).
const MOVING: &[&str] = &["waited_ms", "left_ms"];

fn fields(con: &mut Connection, key: &str) -> Vec<(String, String)> {
    hgetall(con, key.as_bytes())
        .into_iter()
        .map(|(f, v)| {
            (String::from_utf8_lossy(&f).into_owned(), String::from_utf8_lossy(&v).into())
        })
        .collect()
}

fn count(owner: &Owner, n: u32) -> Vec<(String, String)> {
    vec![(owner.id().to_owned(), n.to_string())]
}

/// Two owners, each holding one lock and asking for the other's: the wait that closes the
/// cycle is refused at once with `Error::Deadlock` naming both locks and both owner ids, and
/// nothing changes (hashes, queues, counters); the first waiter still gets its lock once the
/// cycle is broken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_two_owner_cycle_of_locks_is_refused_at_once_changing_nothing() {
    let server = Server::start();
    let mut con = server.conn();
    let client = client(&server).await;
    let (a, b) = (client.owner(), client.owner());
    assert_ne!(a.id(), b.id());
    let a_accounts = a.lock("accounts").acquire(LEASE).await.expect("a takes accounts");
    let _b_ledger = b.lock("ledger").acquire(LEASE).await.expect("b takes ledger");
    assert_eq!(fields(&mut con, "accounts"), count(&a, 1), "stored under the owner's id");
    let b_accounts = b.lock("accounts");
    let b_waits = tokio::spawn(async move { b_accounts.try_acquire(LIMIT, LEASE).await });
    wait_blocked(&mut con, 1);
    let keys = [("RLOCK.WAITERS", "accounts"), ("RLOCK.WAITERS", "ledger")];
    let before = wait_state(&mut con, &keys, MOVING);
    let started = Instant::now();
    let refused = a.lock("ledger").try_acquire(Duration::from_secs(5), LEASE).await;
    let elapsed = started.elapsed();
    match refused {
        Err(Error::Deadlock { cycle }) => assert_eq!(
            cycle,
            format!(
                "{a} waits for ledger held by {b}; {b} waits for accounts held by {a}",
                a = a.id(),
                b = b.id()
            )
        ),
        other => panic!("not refused as a deadlock: {other:?}"),
    }
    assert!(elapsed < Duration::from_secs(2), "refused at once, not after the wait: {elapsed:?}");
    assert_eq!(wait_state(&mut con, &keys, MOVING), before, "nothing changed");
    // The cycle breaks when a lets go: b's wait is served.
    a_accounts.release().await.expect("release");
    let granted = b_waits.await.expect("task").expect("b's wait is served");
    assert_eq!(fields(&mut con, "accounts"), count(&b, 1));
    granted.release().await.expect("release");
}

/// A cycle through a read-write lock: `a` reads `config`, `b` holds `jobs` and waits to write
/// `config` (for a's read hold); `a` asking for `jobs` is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cycle_through_a_read_hold_is_refused() {
    let server = Server::start();
    let mut con = server.conn();
    let client = client(&server).await;
    let (a, b) = (client.owner(), client.owner());
    let reading = a.rw_lock("config").read().acquire(LEASE).await.expect("a reads config");
    let _jobs = b.lock("jobs").acquire(LEASE).await.expect("b takes jobs");
    let config = b.rw_lock("config");
    let b_writes = tokio::spawn(async move { config.write().try_acquire(LIMIT, LEASE).await });
    wait_blocked(&mut con, 1);
    let keys = [("RWLOCK.WAITERS", "config"), ("RLOCK.WAITERS", "jobs")];
    let before = wait_state(&mut con, &keys, MOVING);
    match a.lock("jobs").try_acquire(Duration::from_secs(5), LEASE).await {
        Err(Error::Deadlock { cycle }) => assert_eq!(
            cycle,
            format!(
                "{a} waits for jobs held by {b}; {b} waits for config held by {a}",
                a = a.id(),
                b = b.id()
            )
        ),
        other => panic!("not refused as a deadlock: {other:?}"),
    }
    assert_eq!(wait_state(&mut con, &keys, MOVING), before, "nothing changed");
    reading.release().await.expect("release");
    let writing = b_writes.await.expect("task").expect("b's write is served");
    writing.release().await.expect("release");
}

/// Plain handles (`LockClient::lock`) give each hold an owner id of its own: the same two-lock
/// crossing has no common owner for the server to follow, so it is never refused: the second
/// wait waits (here until its budget ends).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_handles_are_never_refused_they_wait() {
    let server = Server::start();
    let mut con = server.conn();
    let client = client(&server).await;
    let _t1_accounts = client.lock("accounts").acquire(LEASE).await.expect("accounts");
    let _t2_ledger = client.lock("ledger").acquire(LEASE).await.expect("ledger");
    let t2_accounts = client.lock("accounts");
    let t2_waits = tokio::spawn(async move { t2_accounts.try_acquire(LIMIT, LEASE).await });
    wait_blocked(&mut con, 1);
    let started = Instant::now();
    let wait = Duration::from_millis(800);
    let t1_ledger = client.lock("ledger").try_acquire(wait, LEASE).await;
    assert!(matches!(t1_ledger, Err(Error::TimedOut)), "{t1_ledger:?}");
    // It waited (the server's timer may end the wait a few ms before the client's clock).
    assert!(started.elapsed() >= wait / 2, "it waited, not refused: {:?}", started.elapsed());
    t2_waits.abort();
}

/// Two handles of one owner share one hold (count 1 on the server under the owner's id, no
/// suffix), as the re-entries of one handle do: each guard gives back only itself, the last
/// one releases the hold (so no handle's lease can cut another's guard short). The sides of read-write locks of one owner: write then read re-enters
/// at once (also across handles), releasing the write downgrades, and read then write is the
/// upgrade the server refuses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_handles_of_one_owner_reenter_each_other_s_hold() {
    let server = Server::start();
    let mut con = server.conn();
    let client = client(&server).await;
    let owner = client.owner();
    let (first, second) = (owner.lock("x"), owner.lock("x"));
    assert_eq!(first.owner(), owner.id());
    let g1 = first.acquire(LEASE).await.expect("first");
    let g2 = second.try_acquire(Duration::ZERO, LEASE).await.expect("a re-entry, granted at once");
    assert_eq!((g1.owner(), g2.owner()), (owner.id(), owner.id()));
    assert_eq!(fields(&mut con, "x"), count(&owner, 1), "one hold");
    g2.release().await.expect("release the re-entry");
    assert_eq!(fields(&mut con, "x"), count(&owner, 1), "still held for the first guard");
    assert!(!g1.is_lost());
    g1.release().await.expect("release");
    assert_eq!(cmd(&mut con, &["EXISTS", "x"]), Value::Int(0));

    let (rw1, rw2) = (owner.rw_lock("cfg"), owner.rw_lock("cfg"));
    let writing = rw1.write().acquire(LEASE).await.expect("write");
    let reading = rw2.read().try_acquire(Duration::ZERO, LEASE).await.expect("write -> read");
    assert_eq!((writing.owner(), reading.owner()), (owner.id(), owner.id()));
    writing.release().await.expect("release write");
    assert_eq!(cmd(&mut con, &["HGET", "cfg", "mode"]), Value::BulkString(b"read".to_vec()));
    let upgrade = rw1.write().try_acquire(Duration::from_secs(2), LEASE).await;
    match upgrade {
        Err(Error::UpgradeRefused) => {}
        other => panic!("the upgrade was not refused: {other:?}"),
    }
    let again = rw1.read().try_acquire(Duration::ZERO, LEASE).await.expect("read re-entry");
    again.release().await.expect("release");
    reading.release().await.expect("release read");
    assert_eq!(cmd(&mut con, &["EXISTS", "cfg"]), Value::Int(0));
}

/// Exact cancellation of a re-entry grant: the owner holds `x` (count 1, taken outside this
/// client); an acquire of `x` by a handle of that owner is granted at once as a re-entry on the
/// server (count 2) but not reported
/// (the replica acknowledgement fails: no replica), so it is cancelled: `RLOCK.CANCEL` gives
/// back exactly that one count, and the first hold stays whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_a_reentry_grant_gives_back_one_count() {
    let server = Server::start();
    let mut con = server.conn();
    let options = Options::default().replica_ack(1, Duration::from_millis(100));
    let acked = LockClient::with_options(server.client(), options).await.expect("client");
    let owner = acked.owner();
    cmd(&mut con, &["RLOCK.ACQUIRE", "x", owner.id(), "60000"]);
    let refused = owner.lock("x").try_acquire(Duration::from_secs(2), LEASE).await;
    assert!(matches!(refused, Err(Error::NotReplicated { .. })), "{refused:?}");
    assert_eq!(fields(&mut con, "x"), count(&owner, 1), "exactly the re-entry's count given back");
    let Value::Int(pttl) = cmd(&mut con, &["PTTL", "x"]) else { panic!() };
    assert!(pttl > 50_000, "the first hold's lease is untouched: {pttl}");
    assert_eq!(cmd(&mut con, &["RLOCK.RELEASE", "x", owner.id()]), Value::Int(1));
    assert_eq!(cmd(&mut con, &["EXISTS", "x"]), Value::Int(0));

    // The same through a stalled server: the acquire is sent, the server stops, the call ends
    // (its request is cancelled in the background); whichever of acquire and cancel the server
    // runs first once it resumes, the owner's first hold is what remains.
    let client = client(&server).await;
    let owner = client.owner();
    cmd(&mut con, &["RLOCK.ACQUIRE", "y", owner.id(), "60000"]);
    server.pause();
    let stalled = owner.lock("y").try_acquire(Duration::from_millis(300), LEASE).await;
    server.resume();
    assert!(matches!(stalled, Err(Error::TimedOut)), "{stalled:?}");
    poll("the cancellation to be recorded", LIMIT, || {
        let Value::Array(keys) = cmd(&mut con, &["KEYS", "rlock_request:{y}:*"]) else { panic!() };
        keys.iter()
            .any(|k| {
                let Value::BulkString(k) = k else { return false };
                let k = String::from_utf8_lossy(k).into_owned();
                // `rlock-request:1:` + the lock's name as `1:y` + `C`: cancelled.
                cmd(&mut con, &["GET", &k]) == Value::BulkString(b"rlock-request:1:1:yC".to_vec())
            })
            .then_some(())
    });
    assert_eq!(fields(&mut con, "y"), count(&owner, 1));
    assert_eq!(cmd(&mut con, &["RLOCK.RELEASE", "y", owner.id()]), Value::Int(1));
    assert_eq!(cmd(&mut con, &["EXISTS", "y"]), Value::Int(0));
}

/// An owner's hold renewed by the watchdog: two handles' guards share the one server hold
/// (count 1), renewed well past the watchdog lease; releasing one leaves the other renewed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_s_holds_are_renewed_by_the_watchdog() {
    let server = Server::start();
    let mut con = server.conn();
    let lease = Duration::from_millis(900);
    let options = Options::default().watchdog_timeout(lease);
    let client = LockClient::with_options(server.client(), options).await.expect("client");
    let owner = client.owner();
    let g1 = owner.lock("w").acquire(None).await.expect("first");
    let g2 = owner.lock("w").acquire(None).await.expect("re-entry");
    assert_eq!(fields(&mut con, "w"), count(&owner, 1));
    sleep(lease * 3).await; // three leases: only renewals keep it
    assert!(!g1.is_lost() && !g2.is_lost());
    assert_eq!(fields(&mut con, "w"), count(&owner, 1), "renewed, not expired");
    g1.release().await.expect("release");
    sleep(lease * 3).await;
    assert!(!g2.is_lost(), "the other handle's watchdog goes on");
    assert_eq!(fields(&mut con, "w"), count(&owner, 1));
    g2.release().await.expect("release");
    assert_eq!(cmd(&mut con, &["EXISTS", "w"]), Value::Int(0));
}

/// A guard of an owner whose hold is known lost (its lease ended) sends nothing when released
/// or dropped: the server cannot tell its hold from a later hold of the same owner on the same
/// lock, which it would otherwise release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_guard_of_an_owner_never_releases_the_owner_s_later_hold() {
    let server = Server::start();
    let mut con = server.conn();
    let client = client(&server).await;
    let owner = client.owner();
    for dropped in [false, true] {
        let stale = owner.lock("z").acquire(Some(Duration::from_millis(300))).await.expect("1st");
        tokio::time::timeout(LIMIT, stale.lost()).await.expect("lost at its deadline");
        poll("the lease to end", LIMIT, || {
            (cmd(&mut con, &["EXISTS", "z"]) == Value::Int(0)).then_some(())
        });
        let later = owner.lock("z").acquire(LEASE).await.expect("a later hold");
        if dropped {
            // The releaser sends its jobs in the order given, on one connection: once the
            // probe's release is done, the stale guard's would have been sent before it.
            let probe = client.lock("probe").acquire(LEASE).await.expect("probe");
            drop(stale);
            drop(probe);
            poll("the probe's release", LIMIT, || {
                (cmd(&mut con, &["EXISTS", "probe"]) == Value::Int(0)).then_some(())
            });
        } else {
            assert!(matches!(stale.release().await, Err(Error::NotHeld)));
        }
        assert_eq!(fields(&mut con, "z"), count(&owner, 1), "the later hold is whole");
        later.release().await.expect("release");
    }
}

/// A session's owner: its locks are session holds under the owner's one id; closing the
/// session ends them on the server and marks their guards lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_s_owner_holds_session_locks_under_its_one_id() {
    let server = Server::start();
    let mut con = server.conn();
    let client = client(&server).await;
    let session = client.session().await.expect("session");
    let owner = session.owner();
    let g1 = owner.lock("s").acquire(LEASE).await.expect("first");
    let g2 = owner.lock("s").acquire(LEASE).await.expect("re-entry");
    assert_eq!(fields(&mut con, "s"), count(&owner, 1), "one hold");
    session.close();
    poll("the session's holds to end", LIMIT, || {
        (cmd(&mut con, &["EXISTS", "s"]) == Value::Int(0)).then_some(())
    });
    tokio::time::timeout(LIMIT, g1.lost()).await.expect("lost");
    assert!(g2.is_lost());
}
