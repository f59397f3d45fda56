//! MultiLock/RedLock guards tied to their grant, and the edges of a handle's calls (an ACL user
//! without `COMMAND`, `hold_count` on a key of another type, a zero lease): every kind answers
//! alike.

use std::time::Duration;

use redis::Value;
use rlock_client::{Error, LockClient, MultiGuard, MultiLock, RedLock};
use rlock_tests_integration::lock_client::{client, until_gone};
use rlock_tests_integration::{cmd, hgetall, poll, Server};

use super::{LIMIT, LONG};

async fn clients(servers: &[Server]) -> Vec<LockClient> {
    let mut clients = Vec::new();
    for s in servers {
        clients.push(client(s).await);
    }
    clients
}

/// The holders of `name` on each server.
fn holders(servers: &[Server], name: &str) -> Vec<Vec<(Vec<u8>, Vec<u8>)>> {
    servers.iter().map(|s| hgetall(&mut s.conn(), name.as_bytes())).collect()
}

/// Waits until no server holds `name`.
fn until_free_everywhere(servers: &[Server], name: &str, what: &str) {
    for s in servers {
        until_gone(s, name, what);
    }
}

/// Whether every server holds `name` (for one owner, once).
fn held_everywhere(held: &[Vec<(Vec<u8>, Vec<u8>)>]) -> bool {
    held.iter().all(|h| h.len() == 1 && h[0].1 == b"1")
}

/// Watches, for `window`, that every server keeps holding `name` (a drop may release in the
/// background: a wrong release can come a moment later); what was left when one stopped.
async fn kept_everywhere(servers: &[Server], name: &str, window: Duration) -> Result<(), String> {
    let until = tokio::time::Instant::now() + window;
    while tokio::time::Instant::now() < until {
        let held = holders(servers, name);
        if !held_everywhere(&held) {
            return Err(format!("{held:?}"));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

/// A MultiLock (and a RedLock) guard whose lease ended is stale: the next acquire of
/// the same MultiLock is a new grant, and the stale guard's `release()` (and its drop) must not
/// release that later hold on any server: `Err(NotHeld)`, touching nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_multi_guard_never_acts_on_a_later_hold() {
    let servers: Vec<Server> = (0..3).map(|_| Server::start()).collect();
    let clients = clients(&servers).await;
    let short = Some(Duration::from_millis(500));
    let mut problems = Vec::new();

    let multi = MultiLock::new(clients.iter().map(|c| c.lock("m")).collect());
    let stale = multi.acquire(short).await.expect("multi");
    until_free_everywhere(&servers, "m", "the MultiLock's lease to end");
    let fresh = multi.acquire(Some(LONG)).await.expect("multi again");
    let released = stale.release().await;
    let after = holders(&servers, "m");
    if !matches!(released, Err(Error::NotHeld)) || !held_everywhere(&after) {
        problems.push(format!(
            "MultiLock: the stale guard's release answered {released:?} and left {after:?}"
        ));
    }
    drop(fresh);
    until_free_everywhere(&servers, "m", "the fresh guard's drop");
    let stale: MultiGuard = multi.acquire(short).await.expect("multi");
    until_free_everywhere(&servers, "m", "the MultiLock's lease to end");
    let fresh = multi.acquire(Some(LONG)).await.expect("multi again");
    drop(stale);
    if let Err(left) = kept_everywhere(&servers, "m", Duration::from_secs(1)).await {
        problems.push(format!("MultiLock: the stale guard's drop left {left}"));
    }
    drop(fresh);

    let red = RedLock::new(&clients, "r");
    let stale = red.try_acquire(LIMIT, short).await.expect("redlock");
    until_free_everywhere(&servers, "r", "the RedLock's lease to end");
    let fresh = red.try_acquire(LIMIT, Some(LONG)).await.expect("redlock again");
    let released = stale.release().await;
    let after = holders(&servers, "r");
    if !matches!(released, Err(Error::NotHeld)) || !held_everywhere(&after) {
        problems.push(format!(
            "RedLock: the stale guard's release answered {released:?} and left {after:?}"
        ));
    }
    if let Err(e) = fresh.release().await {
        problems.push(format!("RedLock: the fresh guard's own release answered {e:?}"));
    }
    assert!(problems.is_empty(), "stale guards acted on later holds:\n{}", problems.join("\n"));
}

/// The module's commands the server knows (`COMMAND LIST FILTERBY PATTERN`), as ACL rules
/// `+<command>`.
fn module_commands(server: &Server) -> Vec<String> {
    let mut rules = Vec::new();
    for pattern in ["rlock.*", "rwlock.*", "rsem.*"] {
        let names: Vec<String> = redis::cmd("COMMAND")
            .arg("LIST")
            .arg("FILTERBY")
            .arg("PATTERN")
            .arg(pattern)
            .query(&mut server.conn())
            .expect("COMMAND LIST");
        rules.extend(names.into_iter().map(|n| format!("+{n}")));
    }
    assert!(rules.len() > 10, "the module's commands: {rules:?}");
    rules
}

/// An ACL user that may run the module's commands (every `RLOCK.*`,
/// `RWLOCK.*`, `RSEM.*` the server knows, and nothing else: no `COMMAND`) on its keys (and the
/// derived keys the README's ACL table names) opens a client and takes and releases a lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_allowed_only_the_lock_commands_on_its_keys_can_open_and_lock() {
    let server = Server::start();
    let keys = ["~app:*", "~redisson_unlock_latch:*", "~rlock_request:*", "&*"];
    let mut setuser = vec!["ACL", "SETUSER", "locker", "on", "nopass", "-@all"];
    setuser.extend(keys);
    let commands = module_commands(&server);
    setuser.extend(commands.iter().map(String::as_str));
    cmd(&mut server.conn(), &setuser);
    let url = format!("redis://locker:any@127.0.0.1:{}/", server.port());
    let client = LockClient::open(url).await;
    let client = client.expect("a user allowed only the module's commands on its keys opens");
    let guard = client.lock("app:l").acquire(Some(LONG)).await.expect("it locks its key");
    guard.release().await.expect("and releases it");
}

/// `hold_count()` on a key of another type is an error, as
/// `is_locked()` is (a string is no lock: `Ok(0)` would say "not held by this handle" of a key
/// that cannot be a lock at all).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hold_count_on_a_key_of_another_type_is_an_error_as_is_locked_is() {
    let server = Server::start();
    let client = client(&server).await;
    cmd(&mut server.conn(), &["SET", "str", "x"]);
    let lock = client.lock("str");
    let locked = lock.is_locked().await;
    assert!(matches!(locked, Err(Error::Redis(_))), "is_locked on a string: {locked:?}");
    let count = lock.hold_count().await;
    assert!(matches!(count, Err(Error::Redis(_))), "hold_count on a string: {count:?}");
    let rw = client.rw_lock("str");
    let count = rw.read().hold_count().await;
    assert!(matches!(count, Err(Error::Redis(_))), "a read side's hold_count: {count:?}");
}

/// `calls` of every acquire command so far (`INFO commandstats`).
fn acquires(server: &Server) -> i64 {
    let info: String =
        redis::cmd("INFO").arg("commandstats").query(&mut server.conn()).expect("INFO");
    info.lines()
        .filter(|l| l.contains(".acquire:"))
        .filter_map(|l| l.split("calls=").nth(1)?.split(',').next()?.parse::<i64>().ok())
        .sum()
}

/// A zero lease is refused with a typed error, before anything is sent, by
/// every kind (it would be a 1 ms hold, gone before the caller could use it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zero_lease_is_refused_before_anything_is_sent_by_every_kind() {
    let server = Server::start();
    let client = client(&server).await;
    let zero = Some(Duration::ZERO);
    let wait = Duration::from_secs(1);
    let refused = |r: &Result<(), Error>| matches!(r, Err(e) if !matches!(e, Error::Redis(_) | Error::TimedOut | Error::NotHeld));
    let before = acquires(&server);
    let rw = client.rw_lock("rw");
    let leased = client.leased_semaphore("s");
    leased.try_set_permits(1).await.expect("set");
    let multi = MultiLock::new(vec![client.lock("m")]);
    let red = RedLock::new(std::slice::from_ref(&client), "r");
    let results = [
        ("lock acquire", client.lock("l").acquire(zero).await.map(drop)),
        ("lock try_acquire", client.lock("l").try_acquire(wait, zero).await.map(drop)),
        ("read", rw.read().acquire(zero).await.map(drop)),
        ("write", rw.write().acquire(zero).await.map(drop)),
        ("leased", leased.acquire(1, zero).await.map(drop)),
        ("multi", multi.acquire(zero).await.map(drop)),
        ("redlock", red.try_acquire(wait, zero).await.map(drop)),
    ];
    let sent = acquires(&server) - before;
    let wrong: Vec<String> = results
        .iter()
        .filter(|(_, r)| !refused(r))
        .map(|(kind, r)| format!("{kind}: {r:?}"))
        .collect();
    assert!(
        wrong.is_empty() && sent == 0,
        "a zero lease must be refused with a typed error before anything is sent; {sent} \
         acquire(s) reached the server; answers:\n{}",
        wrong.join("\n")
    );
    poll("nothing held", LIMIT, || {
        let mut con = server.conn();
        let n: i64 = redis::cmd("EXISTS").arg(&["l", "rw", "m", "r"]).query(&mut con).ok()?;
        (n == 0).then_some(())
    });
}

/// A MultiLock acquire outlives a server that refuses grants for a while (`NOREPLICAS`, as the
/// old master answers during a failover: nothing ran), as a single lock's acquire does:
/// untimed, or timed with time left, it tries again and takes the locks once grants resume.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multi_acquire_outlives_a_master_that_refuses_grants_for_a_while() {
    let server = Server::start();
    let mut con = server.conn();
    cmd(&mut con, &["CONFIG", "SET", "rlock.min-replicas", "1"]);
    poll("the guard to refuse", LIMIT, || {
        let reply =
            redis::cmd("RLOCK.ACQUIRE").arg("g").arg("a").arg(1000).query::<Value>(&mut con);
        matches!(reply, Err(e) if e.code() == Some("NOREPLICAS")).then_some(())
    });
    let client = client(&server).await;
    let (a, b) = (client.clone(), client.clone());
    let untimed = tokio::spawn(async move {
        MultiLock::new(vec![a.lock("u1"), a.lock("u2")]).acquire(Some(LONG)).await
    });
    let timed = tokio::spawn(async move {
        let multi = MultiLock::new(vec![b.lock("t1"), b.lock("t2")]);
        multi.try_acquire(Duration::from_secs(20), Some(LONG)).await
    });
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(!untimed.is_finished(), "the untimed acquire gave up: {:?}", untimed.await);
    assert!(!timed.is_finished(), "the timed acquire gave up: {:?}", timed.await);
    cmd(&mut con, &["CONFIG", "SET", "rlock.min-replicas", "0"]);
    let untimed = tokio::time::timeout(LIMIT, untimed).await.expect("untimed in time");
    let timed = tokio::time::timeout(LIMIT, timed).await.expect("timed in time");
    let (untimed, timed) =
        (untimed.expect("task").expect("untimed"), timed.expect("task").expect("timed"));
    for name in ["u1", "u2", "t1", "t2"] {
        let held = hgetall(&mut con, name.as_bytes());
        assert_eq!(held.len(), 1, "{name} held by one owner: {held:?}");
    }
    untimed.release().await.expect("release");
    timed.release().await.expect("release");
}
