//! An [`Owner`]'s holds of one lock are one hold, on the client as on the server: no lease the
//! client sends (a nested acquire through another handle of the owner, a renewal) ends it
//! before what any live guard of it was promised (`valid_until`), and a MultiLock over an
//! owner's handle takes grants of its own (fresh owner ids), so its stale guard never acts on
//! the owner's later hold.

use std::time::Duration;

use tokio::time::timeout;

use rlock_client::{Error, LockClient, LockGuard, MultiLock, Options, Owner};
use rlock_tests_integration::lock_client::client;
use rlock_tests_integration::{exists, fuzz_seed, hgetall, lease_end, poll, Proxy, Rng, Server};

const LIMIT: Duration = Duration::from_secs(10);

/// The nested acquires' lease: far shorter than the outer guard's watchdog lease (30 s).
const SHORT: Duration = Duration::from_millis(200);

/// Fails unless the server's lease of `key` lasts at least until `guard`'s `valid_until` (a
/// guard already lost promises nothing).
fn assert_promise_kept(server: &Server, key: &str, guard: &LockGuard, what: &str) {
    let Some(promised) = guard.valid_until() else { return };
    let ends = lease_end(&mut server.conn(), key);
    // A promise that ran out by now (the guard lost at its deadline) is no longer owed.
    let owed = promised > tokio::time::Instant::now();
    assert!(
        !owed || ends.is_some_and(|ends| ends >= promised.into_std()),
        "{what}: the guard is valid for {:?} more, the server's lease of {key} ends in {:?}",
        promised.saturating_duration_since(tokio::time::Instant::now()),
        ends.map(|e| e.saturating_duration_since(std::time::Instant::now())),
    );
}

/// Past the nested acquire's lease, nobody else can take `key`: the owner still holds it.
async fn assert_still_held(other: &LockClient, key: &str, outer: &LockGuard, what: &str) {
    let taken = other.lock(key).try_acquire(SHORT * 3, Some(Duration::from_secs(5))).await;
    assert!(matches!(taken, Err(Error::TimedOut)), "{what}: another client got it: {taken:?}");
    assert!(!outer.is_lost(), "{what}: the outer guard is lost");
}

/// The outer guard (watchdog, 30 s) of an owner, then nested work of the same unit with a
/// short lease through another handle of the owner: released, kept, through a MultiLock over
/// the owner's handle, and the read side of a read-write lock whose first (shorter) guard is
/// released before the second. Each time the server's lease still covers every live guard's
/// `valid_until`, and another client cannot take the lock once the short lease passed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_s_nested_acquire_with_a_shorter_lease_never_shortens_its_hold() {
    let server = Server::start();
    let (client, other) = (client(&server).await, client(&server).await);

    let owner = client.owner();
    let outer = owner.lock("released").acquire(None).await.expect("outer");
    let inner = owner.lock("released").try_acquire(Duration::ZERO, Some(SHORT)).await;
    inner.expect("the owner's re-entry").release().await.expect("release the nested guard");
    assert_promise_kept(&server, "released", &outer, "nested guard released");
    assert_still_held(&other, "released", &outer, "nested guard released").await;
    outer.release().await.expect("release");

    let outer = owner.lock("kept").acquire(None).await.expect("outer");
    let inner = owner.lock("kept").try_acquire(Duration::ZERO, Some(SHORT)).await.expect("inner");
    assert_promise_kept(&server, "kept", &outer, "nested guard kept");
    assert_promise_kept(&server, "kept", &inner, "nested guard kept (its own promise)");
    assert_still_held(&other, "kept", &outer, "nested guard kept").await;
    assert!(!inner.is_lost(), "the nested guard shares the outer hold's deadline");
    inner.release().await.expect("release the nested guard");
    outer.release().await.expect("release");

    let outer = owner.lock("multi").acquire(None).await.expect("outer");
    let multi = MultiLock::new(vec![owner.lock("multi")]);
    let nested = multi.try_acquire(Duration::ZERO, Some(SHORT)).await;
    assert!(matches!(nested, Err(Error::TimedOut)), "a MultiLock never re-enters: {nested:?}");
    assert_promise_kept(&server, "multi", &outer, "a MultiLock over the owner's handle");
    assert_still_held(&other, "multi", &outer, "a MultiLock over the owner's handle").await;
    outer.release().await.expect("release");

    // Read holds: the server gives back an owner's newest read hold first, so a shorter first
    // guard released before a longer second one must not take the longer lease with it.
    let first = owner.rw_lock("rw").read().acquire(Some(SHORT)).await.expect("first read");
    let second = owner.rw_lock("rw").read().acquire(None).await.expect("second read (watchdog)");
    first.release().await.expect("release the first read");
    let writer = other.rw_lock("rw");
    let taken = writer.write().try_acquire(SHORT * 3, Some(Duration::from_secs(5))).await;
    assert!(matches!(taken, Err(Error::TimedOut)), "a writer got in: {taken:?}");
    assert!(!second.is_lost(), "the second read guard is lost");
    second.release().await.expect("release the second read");
    assert!(hgetall(&mut server.conn(), b"rw").is_empty(), "nothing left behind");
}

/// A random walk of one owner over two locks and a read-write lock's read side: guards taken
/// through new handles or clones of old ones, with the watchdog (900 ms) or leases from 50 ms to 1.5 s, released, dropped, time
/// passing. After every step each live guard's `valid_until` is covered by the server's lease
/// (for a read guard, the lock's and every read hold's of the owner), and the lock is the
/// owner's. `RLOCK_OWNER_STEPS` sets the walk's length (default 40).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_s_guards_are_never_promised_more_than_the_server_holds() {
    let server = Server::start();
    let options = Options::default().watchdog_timeout(Duration::from_millis(900));
    let client = LockClient::with_options(server.client(), options).await.expect("client");
    let owner = client.owner();
    let seed = fuzz_seed();
    let mut rng = Rng(seed);
    let steps = std::env::var("RLOCK_OWNER_STEPS").ok().and_then(|s| s.parse().ok()).unwrap_or(40);
    let keys = ["a", "b", READ];
    let mut handles: Vec<(usize, rlock_client::Lock)> = Vec::new();
    let mut guards: Vec<(usize, LockGuard)> = Vec::new();
    for step in 0..steps {
        let what = format!("seed {seed}, step {step}");
        match rng.below(6) {
            0..=2 => {
                let k = rng.below(keys.len());
                let lock = match handles.iter().rfind(|(hk, _)| *hk == k) {
                    Some((_, lock)) if rng.below(2) == 0 => lock.clone(),
                    _ => fresh_handle(&owner, keys[k], &mut handles, k),
                };
                let lease = match rng.below(3) {
                    0 => None,
                    _ => Some(Duration::from_millis(50 + rng.below(1_450) as u64)),
                };
                let guard = lock.try_acquire(Duration::ZERO, lease).await;
                guards.push((k, guard.unwrap_or_else(|e| panic!("{what}: acquire: {e:?}"))));
            }
            3 if !guards.is_empty() => {
                let (_, guard) = guards.swap_remove(rng.below(guards.len()));
                let lost = guard.is_lost();
                match guard.release().await {
                    Ok(()) => {}
                    Err(Error::NotHeld) if lost => {}
                    other => panic!("{what}: release: {other:?}"),
                }
            }
            4 if !guards.is_empty() => drop(guards.swap_remove(rng.below(guards.len()))),
            _ => tokio::time::sleep(Duration::from_millis(rng.below(250) as u64)).await,
        }
        for (k, guard) in &guards {
            assert_promise_kept(&server, keys[*k], guard, &what);
            if keys[*k] == READ {
                for hold in read_holds(&server, owner.id()) {
                    assert_promise_kept(&server, &hold, guard, &format!("{what}, {hold}"));
                }
            }
            if guard.valid_until().is_some_and(|v| v > tokio::time::Instant::now()) {
                let holders = hgetall(&mut server.conn(), keys[*k].as_bytes());
                let owners: Vec<_> = holders.iter().filter(|(f, _)| f != b"mode").collect();
                assert!(
                    owners.len() == 1 && owners[0].0 == owner.id().as_bytes(),
                    "{what}: {} is held by {holders:?}",
                    keys[*k]
                );
            }
        }
    }
    drop(guards);
    for key in keys {
        poll("everything released", LIMIT, || {
            hgetall(&mut server.conn(), key.as_bytes()).is_empty().then_some(())
        });
    }
}

/// The read-write lock whose read side the random walk takes.
const READ: &str = "rw";

/// The read hold keys of `owner` on [`READ`] (`{rw}:<owner>:rwlock_timeout:<n>`).
fn read_holds(server: &Server, owner: &str) -> Vec<String> {
    let pattern = format!("{{{READ}}}:{owner}:rwlock_timeout:*");
    redis::cmd("KEYS").arg(pattern).query(&mut server.conn()).expect("KEYS")
}

/// A new handle of `owner` on `key` (index `k`; [`READ`]: its read side), remembered for later
/// clones.
fn fresh_handle(
    owner: &Owner,
    key: &str,
    handles: &mut Vec<(usize, rlock_client::Lock)>,
    k: usize,
) -> rlock_client::Lock {
    let lock = if key == READ { owner.rw_lock(key).read().clone() } else { owner.lock(key) };
    handles.push((k, lock.clone()));
    lock
}

/// A MultiLock over an owner's handle takes its grant under an owner id of its own: its guard,
/// stale (its lease ended), releases nothing of the owner's later hold of the same lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_multi_guard_over_an_owner_s_handle_never_releases_the_owner_s_later_hold() {
    let server = Server::start();
    let (client, other) = (client(&server).await, client(&server).await);
    let owner = client.owner();
    let multi = MultiLock::new(vec![owner.lock("k")]);
    let stale = multi.try_acquire(Duration::ZERO, Some(Duration::from_millis(300))).await;
    let stale = stale.expect("the MultiLock's grant");
    let holders = hgetall(&mut server.conn(), b"k");
    assert!(
        holders.len() == 1 && holders[0].0 != owner.id().as_bytes(),
        "the grant must not be under the owner's own id {}: {holders:?}",
        owner.id()
    );
    timeout(LIMIT, stale.lost()).await.expect("lost at its lease's end");
    poll("the lease to end", LIMIT, || hgetall(&mut server.conn(), b"k").is_empty().then_some(()));
    let later = owner.lock("k").acquire(None).await.expect("the owner's later hold");
    let released = stale.release().await;
    assert!(matches!(released, Err(Error::NotHeld)), "the stale guard released: {released:?}");
    let holders = hgetall(&mut server.conn(), b"k");
    assert_eq!(holders, vec![(owner.id().as_bytes().to_vec(), b"1".to_vec())]);
    let taken = other.lock("k").try_acquire(Duration::ZERO, Some(Duration::from_secs(5))).await;
    assert!(matches!(taken, Err(Error::TimedOut)), "another client got it: {taken:?}");
    assert!(!later.is_lost());
    later.release().await.expect("release");
}

/// The write field of `owner` on `key`, as the server counts it (`None`: not held).
fn write_count(server: &Server, key: &str, owner: &str) -> Option<String> {
    let field = format!("{owner}:write");
    redis::cmd("HGET").arg(key).arg(field).query(&mut server.conn()).expect("HGET")
}

/// An owner's write hold past its own lease is still on the server (a read hold of the same
/// owner, with a longer lease, keeps the key), and its guard knows it (it is not lost). The
/// owner's next write acquire must not stack a second count on it that nobody will ever
/// release: it re-enters it, and once every guard is gone, nothing stays held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_s_new_write_hold_over_a_stale_one_leaves_nothing_held_once_released() {
    let server = Server::start();
    let client = client(&server).await;
    let owner = client.owner();
    let rw = owner.rw_lock("k");
    let short = Duration::from_millis(300);
    let stale = rw.write().try_acquire(Duration::ZERO, Some(short)).await.expect("first write");
    let read = rw.read().acquire(Some(Duration::from_secs(20))).await.expect("read under write");
    tokio::time::sleep(short * 2).await; // past the first write's own lease
    assert!(!stale.is_lost(), "the read hold keeps the first write hold on the server");
    let again = rw.write().try_acquire(Duration::ZERO, Some(short)).await.expect("second write");
    assert!(!again.is_lost(), "the new write guard holds");
    let count = write_count(&server, "k", owner.id());
    assert_eq!(count.as_deref(), Some("1"), "one hold of the owner on the write side, one count");
    assert_promise_kept(&server, "k", &read, "the read hold under the new write hold");
    again.release().await.expect("release the new write hold");
    drop(stale);
    read.release().await.expect("release the read hold");
    poll("the owner's write field gone", Duration::from_secs(3), || {
        write_count(&server, "k", owner.id()).is_none().then_some(())
    });
}

/// An owner's write hold lives on the server as long as the key, and the same owner's read hold
/// (taken under the write with a longer lease, or renewed by its watchdog) keeps the key: past
/// the write's own lease its field is still there. So its guard still holds (its lease is the
/// key's, never promised past what the server has), and when it goes, released or dropped, the
/// field goes: nothing stays held by nobody while the read hold lives on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_s_write_hold_kept_by_its_read_hold_ends_when_its_guard_goes() {
    let server = Server::start();
    let options = Options::default().watchdog_timeout(Duration::from_millis(900));
    let redis = redis::Client::open(server.url()).expect("url");
    let client = LockClient::with_options(redis, options).await.expect("client");
    let other = self::client(&server).await;
    let owner = client.owner();
    let short = Duration::from_millis(300);
    for (key, read_lease, released) in [
        ("long-read", Some(Duration::from_secs(20)), true),
        ("long-read-dropped", Some(Duration::from_secs(20)), false),
        ("watchdog-read", None, true),
    ] {
        let rw = owner.rw_lock(key);
        let write = rw.write().try_acquire(Duration::ZERO, Some(short)).await.expect("write");
        let read = rw.read().acquire(read_lease).await.expect("read under the write");
        // Past the write's own lease (and two of the read watchdog's renewals).
        tokio::time::sleep(Duration::from_millis(1000)).await;
        assert_eq!(write_count(&server, key, owner.id()).as_deref(), Some("1"), "{key}");
        assert!(!write.is_lost(), "{key}: the write hold is still on the server");
        assert_promise_kept(&server, key, &write, key);
        if released {
            write.release().await.expect("the write guard's release");
        } else {
            drop(write);
        }
        poll("the owner's write field gone", Duration::from_secs(3), || {
            write_count(&server, key, owner.id()).is_none().then_some(())
        });
        let reader = other.rw_lock(key).read().try_acquire(Duration::ZERO, Some(short)).await;
        reader
            .expect("another reader joins the owner's read hold")
            .release()
            .await
            .expect("release");
        read.release().await.expect("the read guard's release");
    }
}

/// A client of `server` through a proxy whose answers lag 150 ms (so a command can reach the
/// server and its caller give up before the answer comes), the proxy, and an owner of it.
async fn slow_owner(server: &Server) -> (Proxy, LockClient, Owner) {
    let proxy = Proxy::start(server.port());
    proxy.delay(Duration::from_millis(150));
    let client = LockClient::open(proxy.url()).await.expect("client");
    let owner = client.owner();
    (proxy, client, owner)
}

/// Polls until the server no longer has `owner`'s write field on `key`, failing with what the
/// write guard saw (`lost`, its release's result) and the key's remaining lease.
fn assert_write_field_ends(server: &Server, key: &str, owner: &str, seen: &str) {
    let what = format!("the owner's write field gone (the write guard saw {seen})");
    poll(&what, Duration::from_secs(3), || write_count(server, key, owner).is_none().then_some(()));
    let pttl: i64 = redis::cmd("PTTL").arg(key).query(&mut server.conn()).expect("PTTL");
    assert!(pttl < 0, "{seen}: the key lives on without the write field (pttl {pttl})");
}

/// An owner's read acquire under its own write hold, with a 20 s lease, given up after the
/// server granted it (its answer lags): giving the read back leaves the key's expiry at the
/// read's lease, and the write field with it. The cancellation's answer (`2`: it was granted)
/// tells the client so: the write guard stays valid past its own lease (1.5 s), as long as the
/// key, and its release ends the field: nothing stays held by nobody for 20 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_s_write_hold_under_a_cancelled_read_acquire_is_kept_and_released_by_its_guard() {
    let server = Server::start();
    let (_proxy, _client, owner) = slow_owner(&server).await;
    let rw = owner.rw_lock("k");
    let short = Some(Duration::from_millis(1_500));
    let write = rw.write().try_acquire(Duration::ZERO, short).await.expect("write");
    let own_until = write.valid_until().expect("a deadline");
    let long = Some(Duration::from_secs(20));
    let read = timeout(Duration::from_millis(40), rw.read().acquire(long)).await;
    assert!(read.is_err(), "the read acquire was given up before its answer: {read:?}");
    poll("the read given back", Duration::from_secs(3), || {
        let fields = hgetall(&mut server.conn(), b"k");
        (fields.len() == 2).then_some(()) // the write field and the mode
    });
    poll("the write guard kept by the cancellation", Duration::from_secs(1), || {
        write.valid_until().is_some_and(|until| until > own_until).then_some(())
    });
    tokio::time::sleep_until(own_until + Duration::from_millis(300)).await;
    assert!(!write.is_lost(), "the key, and so the write field, lasts the read's lease");
    assert_promise_kept(&server, "k", &write, "the write guard kept by the cancellation");
    let released = write.release().await;
    assert!(released.is_ok(), "{released:?}");
    assert_write_field_ends(&server, "k", owner.id(), &format!("{released:?}"));
}

/// An owner's read acquire under its own write hold, sent just before the write's deadline and
/// granted (the server extends the key to the read's 20 s), answered after that deadline: the
/// write guard was told lost meanwhile (the client cannot tell from the read's answer whether
/// the write field was still there), but its release still goes out and ends the field.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_s_write_hold_under_a_read_granted_after_its_deadline_is_released_by_its_guard() {
    let server = Server::start();
    let (_proxy, _client, owner) = slow_owner(&server).await;
    let rw = owner.rw_lock("k");
    let short = Some(Duration::from_millis(800));
    let write = rw.write().try_acquire(Duration::ZERO, short).await.expect("write");
    let until = write.valid_until().expect("a deadline");
    tokio::time::sleep_until(until - Duration::from_millis(50)).await;
    let long = Some(Duration::from_secs(20));
    let read = rw.read().try_acquire(Duration::ZERO, long).await.expect("read under the write");
    assert!(write.is_lost(), "the read's answer came after the write's deadline");
    read.release().await.expect("the read guard's release");
    let released = write.release().await;
    assert!(matches!(released, Err(Error::NotHeld)), "a lost guard: {released:?}");
    assert_write_field_ends(&server, "k", owner.id(), &format!("{released:?}"));
}

/// An owner's lock hold whose re-entry (a 20 s lease) reached the server but was given up
/// before its answer: the server keeps the lock 20 s, the guard only its own 1 s. Dropped just
/// before that deadline while the server cannot be reached (a cut link, healed 0.4 s later),
/// the release is not given up at the guard's deadline: it is retried while the server may
/// still count the hold, and ends it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_s_hold_dropped_at_its_deadline_is_released_while_the_server_may_count_it() {
    let server = Server::start();
    let (proxy, _client, owner) = slow_owner(&server).await;
    let lock = owner.lock("l");
    let guard = lock.try_acquire(Duration::ZERO, Some(Duration::from_secs(1))).await.expect("l");
    let nested = owner.lock("l"); // another handle of the owner: the same hold
    let reentry = nested.try_acquire(Duration::ZERO, Some(Duration::from_secs(20)));
    let reentry = timeout(Duration::from_millis(40), reentry).await;
    assert!(reentry.is_err(), "the re-entry was given up before its answer: {reentry:?}");
    let until = guard.valid_until().expect("a deadline");
    tokio::time::sleep_until(until - Duration::from_millis(20)).await;
    proxy.cut();
    drop(guard);
    tokio::time::sleep(Duration::from_millis(400)).await;
    proxy.heal();
    poll("the owner's hold released", Duration::from_secs(5), || {
        let held: i64 = redis::cmd("EXISTS").arg("l").query(&mut server.conn()).ok()?;
        (held == 0).then_some(())
    });
}

/// The `RLOCK.RENEW` / `RWLOCK.RENEW` commands the server ran since `SLOWLOG RESET`, as sent.
fn renewals_run(server: &Server) -> Vec<Vec<Vec<u8>>> {
    let log: Vec<redis::Value> =
        redis::cmd("SLOWLOG").arg("GET").arg(1000).query(&mut server.conn()).expect("SLOWLOG");
    let mut renewals = Vec::new();
    for entry in log {
        let redis::Value::Array(parts) = entry else { continue };
        let Some(redis::Value::Array(args)) = parts.get(3) else { continue };
        let args: Vec<Vec<u8>> = args
            .iter()
            .filter_map(|a| match a {
                redis::Value::BulkString(b) => Some(b.clone()),
                _ => None,
            })
            .collect();
        if args.first().is_some_and(|c| c.eq_ignore_ascii_case(b"RLOCK.RENEW"))
            || args.first().is_some_and(|c| c.eq_ignore_ascii_case(b"RWLOCK.RENEW"))
        {
            renewals.push(args);
        }
    }
    renewals.reverse(); // oldest first
    renewals
}

/// An owner's re-entries reach the server as renewals; one of them reaching it late (after a
/// later, longer one: sent on a connection that stalled, then ran after a reconnect) must not
/// shorten the lease a live guard relies on. Each renewal the client sent for the owner's
/// holds (a lock, a read side) is run again, as that late copy, after the longest (the
/// earliest last): the server's
/// lease still covers every live guard's `valid_until` (the client sends `GT`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_s_renewal_reaching_the_server_late_never_shortens_a_later_lease() {
    let server = Server::start();
    let client = client(&server).await;
    let owner = client.owner();
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("slowlog-log-slower-than")
        .arg(0)
        .query(&mut server.conn())
        .expect("CONFIG SET");
    let _: () = redis::cmd("SLOWLOG").arg("RESET").query(&mut server.conn()).expect("RESET");
    let leases = [1, 2, 20].map(Duration::from_secs);
    let mut guards = Vec::new();
    for lease in leases {
        let lock = owner.lock("l"); // a new handle of the owner each time: the same hold
        guards.push(lock.try_acquire(Duration::ZERO, Some(lease)).await.expect("lock"));
    }
    let rw = owner.rw_lock(READ);
    for lease in leases {
        guards.push(rw.read().try_acquire(Duration::ZERO, Some(lease)).await.expect("read"));
    }
    let renewals = renewals_run(&server);
    assert!(renewals.len() >= 4, "the re-entries were renewals: {renewals:?}");
    // Newest first: the earliest (shortest) of each hold's renewals runs last.
    for renewal in renewals.iter().rev() {
        let mut late = redis::cmd(&String::from_utf8_lossy(&renewal[0]));
        late.arg(&renewal[1..]);
        let _: redis::Value = late.query(&mut server.conn()).expect("the late renewal");
    }
    for (key, guard) in ["l", "l", "l"].iter().chain(&[READ, READ, READ]).zip(&guards) {
        assert_promise_kept(&server, key, guard, &format!("{key} after late renewals"));
        if *key == READ {
            for hold in read_holds(&server, owner.id()) {
                assert_promise_kept(&server, &hold, guard, &format!("{hold} after late renewals"));
            }
        }
    }
    for guard in guards {
        guard.release().await.expect("release");
    }
}

const LEASE: Option<Duration> = Some(Duration::from_secs(60));

/// One owner's read-write lock: write then read re-enters, releasing the write downgrades, and
/// asking to write while reading is the upgrade the server refuses: the caller gets a typed
/// error to match on (as Python's `UpgradeRefused`), not a `Redis` error to parse, and nothing
/// changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_s_upgrade_is_refused_with_a_typed_error_and_changes_nothing() {
    let server = Server::start();
    let mut admin = server.conn();
    let client = client(&server).await;
    let owner = client.owner();
    let (rw1, rw2) = (owner.rw_lock("rw"), owner.rw_lock("rw"));
    let write = rw1.write().acquire(LEASE).await.expect("write");
    let read = rw2.read().try_acquire(Duration::ZERO, LEASE).await.expect("write -> read");
    write.release().await.expect("downgrade");
    let before = rlock_tests_integration::hgetall(&mut admin, b"rw");
    let upgrade = rw1.write().try_acquire(Duration::from_secs(2), LEASE).await;
    assert!(matches!(upgrade, Err(Error::UpgradeRefused)), "{upgrade:?}");
    assert_eq!(rlock_tests_integration::hgetall(&mut admin, b"rw"), before, "nothing changed");
    read.release().await.expect("release the read");
    assert!(!exists(&mut admin, "rw"));
}
