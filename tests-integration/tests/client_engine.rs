//! The client's hold engine, one for every kind: a grant after a server-side wait longer than
//! its lease is not born lost, permits a replica did not acknowledge are given back and
//! reported, and a grant whose acknowledgement stalls still returns by the call's bound.

use std::time::Duration;

use rlock_client::{Error, LockClient, Options};
use rlock_tests_integration::{cmd, exists, int, poll, wait_blocked, Server};
use tokio::time::{sleep, timeout, Instant};

const LIMIT: Duration = Duration::from_secs(10);

/// A grant handed over after a server-side wait longer than the lease starts its lease at the
/// hand-off: the guard must not be born lost (its deadline counted from when the wait was
/// sent), neither with an explicit lease nor with the watchdog, for a lock, a read-write lock
/// side and leased permits alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_after_a_wait_longer_than_its_lease_is_not_born_lost() {
    let server = Server::start();
    let lease = Duration::from_millis(900);
    let options = Options::default().watchdog_timeout(lease);
    let client = LockClient::with_options(server.client(), options).await.expect("client");
    let mut con = server.conn();
    cmd(&mut con, &["RLOCK.ACQUIRE", "l", "holder", "60000"]);
    cmd(&mut con, &["RWLOCK.ACQUIRE", "rw", "holder", "WRITE", "60000"]);
    cmd(&mut con, &["RSEM.SETPERMITS", "s", "0"]);
    let mut problems = Vec::new();
    for watchdog in [false, true] {
        let lease = (!watchdog).then_some(lease);
        let (lock, rw, sem) =
            (client.lock("l"), client.rw_lock("rw"), client.leased_semaphore("s"));
        let waits = (
            tokio::spawn(async move { lock.acquire(lease).await }),
            tokio::spawn(async move { rw.write().acquire(lease).await }),
            tokio::spawn(async move { sem.acquire(1, lease).await }),
        );
        wait_blocked(&mut con, 3);
        sleep(Duration::from_millis(1_500)).await; // longer than the lease
        cmd(&mut con, &["RLOCK.RELEASE", "l", "holder"]);
        cmd(&mut con, &["RWLOCK.RELEASE", "rw", "holder", "WRITE"]);
        cmd(&mut con, &["RSEM.RELEASE", "s", "1"]);
        let handed = Instant::now();
        let lock = timeout(LIMIT, waits.0).await.expect("lock").expect("task").expect("lock");
        let write = timeout(LIMIT, waits.1).await.expect("rw").expect("task").expect("write");
        let permit = timeout(LIMIT, waits.2).await.expect("sem").expect("task").expect("permit");
        let margin = handed + Duration::from_millis(300);
        let states = [
            ("lock", lock.is_lost(), lock.valid_until()),
            ("write", write.is_lost(), write.valid_until()),
            ("permit", permit.is_lost(), permit.valid_until()),
        ];
        for (kind, lost, until) in states {
            if lost || until.is_none_or(|u| u < margin) {
                problems.push(format!(
                    "{kind} (watchdog: {watchdog}): lost {lost}, valid until {:?} after the \
                     hand-off",
                    until.map(|u| u.saturating_duration_since(handed))
                ));
            }
        }
        lock.release().await.expect("release the lock");
        write.release().await.expect("release the write");
        permit.release().await.expect("release the permit");
        cmd(&mut con, &["RLOCK.ACQUIRE", "l", "holder", "60000"]);
        cmd(&mut con, &["RWLOCK.ACQUIRE", "rw", "holder", "WRITE", "60000"]);
        cmd(&mut con, &["RSEM.ACQUIRE", "s", "1"]);
    }
    assert!(problems.is_empty(), "guards born lost after a long wait:\n{}", problems.join("\n"));
}

/// With `replica_ack`, a semaphore grant (counted or leased) is acknowledged like a lock's: when
/// too few replicas have it, the permits are given back and the acquire fails with
/// `NotReplicated`, instead of reporting permits only the master knows of.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permits_a_replica_did_not_acknowledge_are_given_back_and_reported() {
    let master = Server::start(); // no replica: nobody acknowledges
    let options = Options::default().replica_ack(1, Duration::from_millis(200));
    let client = LockClient::with_options(master.client(), options).await.expect("client");
    let counted = client.semaphore("c");
    assert!(counted.try_set_permits(2).await.expect("set"));
    let taken = counted.acquire(1).await;
    assert!(matches!(taken, Err(Error::NotReplicated { wanted: 1, acknowledged: 0 })), "{taken:?}");
    assert_eq!(counted.available().await.expect("available"), 2, "the counted permit came back");
    let leased = client.leased_semaphore("l");
    assert!(leased.try_set_permits(2).await.expect("set"));
    let taken = leased.acquire(1, Some(Duration::from_secs(60))).await;
    assert!(matches!(taken, Err(Error::NotReplicated { wanted: 1, acknowledged: 0 })), "{taken:?}");
    assert_eq!(leased.available().await.expect("available"), 2, "the leased permit came back");
}

/// A grant whose replica acknowledgement never comes back (the server stalls while its `WAIT`
/// blocks) ends the call by its bound: the try's 0.5 s plus the acknowledgement's time (its
/// timeout and 1 s), not that plus the 2 s the grant's cancellation may be waited for; the
/// grant is given back once the server answers again. For a lock, counted and leased permits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_whose_acknowledgement_stalls_still_returns_by_the_call_s_bound() {
    let server = Server::start(); // no replica: the acknowledgement's WAIT blocks
    let ack = Duration::from_millis(300);
    let options = Options::default().replica_ack(1, ack);
    let client = LockClient::with_options(server.client(), options).await.expect("client");
    let bound = Duration::from_millis(500) + ack + Duration::from_secs(1);
    let slack = Duration::from_millis(400);
    let mut con = server.conn();
    cmd(&mut con, &["RSEM.SETPERMITS", "counted", "5"]);
    cmd(&mut con, &["RSEM.SETPERMITS", "leased", "5"]);
    let mut problems = Vec::new();
    for kind in ["lock", "counted", "leased"] {
        let c = client.clone();
        let call = tokio::spawn(async move {
            let started = Instant::now();
            let taken = match kind {
                "lock" => c.lock("lock").try_acquire(Duration::ZERO, None).await.map(drop),
                "counted" => c.semaphore(kind).try_acquire(1, Duration::ZERO).await.map(drop),
                _ => c.leased_semaphore(kind).try_acquire(1, Duration::ZERO, None).await.map(drop),
            };
            (taken, started.elapsed())
        });
        wait_blocked(&mut con, 1);
        server.pause();
        let joined = timeout(LIMIT, call).await;
        server.resume();
        let (taken, took) = joined.expect("the call returns").expect("the task");
        if taken.is_ok() || took > bound + slack {
            problems.push(format!("{kind}: {taken:?} after {took:?} (bound {bound:?})"));
        }
        poll(&format!("{kind}: the grant given back"), LIMIT, || {
            let back = match kind {
                "lock" => !exists(&mut con, "lock"),
                _ => int(&cmd(&mut con, &["RSEM.AVAILABLE", kind])) == 5,
            };
            back.then_some(())
        });
    }
    assert!(problems.is_empty(), "calls past their bound:\n{}", problems.join("\n"));
}
