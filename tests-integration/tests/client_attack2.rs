//! A second hostile round on the Rust client's hold engine (issue 24): server stalls (SIGSTOP)
//! during renewals and releases, `CLIENT PAUSE` + `CLIENT KILL` during a release and during the
//! `RLOCK.CANCEL` of a failed acknowledgement, ACL users limited to key patterns, failing
//! replica/AOF acknowledgements for every kind, a cluster seed node down and a slot moved while
//! waiting, Sentinel failover during a wait. Each test drives real servers with the built module.
//! A test here either reproduced a defect (named in its doc) or is an attack that held.

use std::time::Duration;

use rlock_client::{Error, LockClient, MultiLock, Options, RedLock};
use rlock_tests_integration::{blocked_clients, poll, Cluster, Server};
use tokio::time::Instant;

/// How long anything the client does in the background may take to show.
const LIMIT: Duration = Duration::from_secs(10);
/// A lease long enough that a leaked hold is still there when the test looks.
const LONG: Option<Duration> = Some(Duration::from_secs(60));

async fn client(server: &Server) -> LockClient {
    LockClient::open(server.url()).await.expect("client")
}

/// Whether `server` has the key `name` (false when it cannot be asked).
fn exists(server: &Server, name: &str) -> bool {
    let Ok(mut con) = server.client().get_connection_with_timeout(Duration::from_millis(500))
    else {
        return false;
    };
    let _ = con.set_read_timeout(Some(Duration::from_secs(1)));
    redis::cmd("EXISTS").arg(name).query::<i64>(&mut con).is_ok_and(|n| n == 1)
}

fn available(server: &Server, name: &str) -> i64 {
    redis::cmd("RSEM.AVAILABLE").arg(name).query(&mut server.conn()).expect("RSEM.AVAILABLE")
}

/// Every key of `server` (for "nothing left behind" checks).
fn keys(server: &Server) -> Vec<String> {
    let mut keys: Vec<String> =
        redis::cmd("KEYS").arg("*").query(&mut server.conn()).expect("KEYS");
    keys.sort();
    keys
}

/// One guard of any kind, as far as these attacks need.
enum Guard {
    Lock(rlock_client::LockGuard),
    Permit(rlock_client::PermitGuard),
}

impl Guard {
    fn is_lost(&self) -> bool {
        match self {
            Self::Lock(g) => g.is_lost(),
            Self::Permit(g) => g.is_lost(),
        }
    }
    fn valid_until(&self) -> Option<Instant> {
        match self {
            Self::Lock(g) => g.valid_until(),
            Self::Permit(g) => g.valid_until(),
        }
    }
    async fn release(self) -> rlock_client::Result<()> {
        match self {
            Self::Lock(g) => g.release().await,
            Self::Permit(g) => g.release().await,
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum Of {
    Lock,
    Read,
    Write,
    Leased,
}

const KINDS: [Of; 4] = [Of::Lock, Of::Read, Of::Write, Of::Leased];

/// Takes `name` as `of` (a leased semaphore gets 2 permits first) with `lease`.
async fn take(client: &LockClient, of: Of, name: &str, lease: Option<Duration>) -> Guard {
    match of {
        Of::Lock => Guard::Lock(client.lock(name).acquire(lease).await.expect("lock")),
        Of::Read => Guard::Lock(client.rw_lock(name).read().acquire(lease).await.expect("read")),
        Of::Write => Guard::Lock(client.rw_lock(name).write().acquire(lease).await.expect("write")),
        Of::Leased => {
            let sem = client.leased_semaphore(name);
            sem.try_set_permits(2).await.expect("permits");
            Guard::Permit(sem.acquire(1, lease).await.expect("leased"))
        }
    }
}

/// Whether `name` (of kind `of`) is free again on `server`.
fn free(server: &Server, of: Of, name: &str) -> bool {
    match of {
        Of::Leased => available(server, name) == 2,
        _ => !exists(server, name),
    }
}

// ---- SIGSTOP during releases and renewals -----------------------------------------------------

/// `guard.release()` while the server is stopped returns within a bound (no deadline of its own,
/// but it must not hang on a stalled server), and the release lands after SIGCONT: nothing stays
/// held, and a leased semaphore gets back exactly its one permit (not more: no double release).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_during_a_stall_is_bounded_and_lands_exactly_after_the_resume() {
    let server = Server::start();
    let client = client(&server).await;
    for of in KINDS {
        let name = format!("stall-release-{of:?}");
        let guard = take(&client, of, &name, LONG).await;
        server.pause();
        let started = Instant::now();
        let released = tokio::time::timeout(Duration::from_secs(30), guard.release()).await;
        let took = started.elapsed();
        server.resume();
        assert!(released.is_ok(), "{of:?}: release() still running after 30 s of stall");
        assert!(took < Duration::from_secs(6), "{of:?}: release() took {took:?} on a stall");
        poll("the release to land", LIMIT, || free(&server, of, &name).then_some(()));
        if let Of::Leased = of {
            tokio::time::sleep(Duration::from_millis(300)).await;
            assert_eq!(available(&server, &name), 2, "exactly the one permit came back");
        }
    }
}

/// A watchdog guard whose server stops past the guard's deadline reports lost by that
/// deadline, and stays lost after SIGCONT (the hold's lease ended during the stall: the server
/// does not hold it; the guard must never claim otherwise). Dropping it leaves nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guard_stalled_past_its_deadline_is_lost_by_it_and_stays_truthful_after_the_resume() {
    let server = Server::start();
    let options = Options::default().watchdog_timeout(Duration::from_millis(1500));
    let client = LockClient::with_options(server.client(), options).await.expect("client");
    for of in KINDS {
        let name = format!("stall-renew-{of:?}");
        let guard = take(&client, of, &name, None).await;
        tokio::time::sleep(Duration::from_millis(700)).await; // one renewal went through
        assert!(!guard.is_lost(), "{of:?}: held before the stall");
        server.pause();
        let until = guard.valid_until().expect("a deadline");
        tokio::time::sleep_until(until + Duration::from_millis(100)).await;
        let lost_in_time = guard.is_lost();
        tokio::time::sleep(Duration::from_secs(2)).await;
        server.resume();
        assert!(lost_in_time, "{of:?}: not lost 100 ms past its own deadline on a stall");
        tokio::time::sleep(Duration::from_millis(500)).await;
        let held = !free(&server, of, &name);
        assert!(
            guard.is_lost() && guard.valid_until().is_none(),
            "{of:?}: the guard claims the hold again after the resume (server holds: {held})"
        );
        drop(guard);
        poll("nothing held after the drop", LIMIT, || free(&server, of, &name).then_some(()));
    }
}

// ---- CLIENT PAUSE + CLIENT KILL during a release and during RLOCK.CANCEL -------------------------

fn pause_writes(server: &Server, ms: u64) {
    let () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(ms)
        .arg("WRITE")
        .query(&mut server.conn())
        .expect("CLIENT PAUSE");
}

fn kill_normal_clients(server: &Server) -> i64 {
    redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("normal")
        .query(&mut server.conn())
        .expect("KILL")
}

fn unpause(server: &Server) {
    let () = redis::cmd("CLIENT").arg("UNPAUSE").query(&mut server.conn()).expect("UNPAUSE");
}

/// A release held back by `CLIENT PAUSE WRITE` whose connection is then killed (before the
/// server ran it) is retried: the call answers, and nothing stays held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_whose_connection_is_killed_while_paused_is_retried_and_lands() {
    let server = Server::start();
    let client = client(&server).await;
    for of in KINDS {
        let name = format!("kill-release-{of:?}");
        let guard = take(&client, of, &name, LONG).await;
        pause_writes(&server, 20_000);
        let releasing = tokio::spawn(guard.release());
        poll("the release to be held back", LIMIT, || {
            (blocked_clients(&mut server.conn()) >= 1).then_some(())
        });
        assert!(kill_normal_clients(&server) >= 1);
        tokio::time::sleep(Duration::from_millis(100)).await;
        unpause(&server);
        let result = tokio::time::timeout(LIMIT, releasing).await.expect("bounded").expect("task");
        poll("nothing held", LIMIT, || free(&server, of, &name).then_some(()));
        assert!(result.is_ok(), "{of:?}: the retried release reported {result:?}");
    }
}

/// A counted grant whose replica acknowledgement fails is cancelled with `RLOCK.CANCEL`; that
/// cancellation is held back by `CLIENT PAUSE WRITE` and its connection killed: the releaser
/// sends it again, and the permit comes back (exactly: available = total).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_whose_connection_is_killed_while_paused_is_retried_and_gives_back_exactly() {
    let server = Server::start();
    let options = Options::default().replica_ack(1, Duration::from_millis(1500));
    let client = LockClient::with_options(server.client(), options).await.expect("client");
    let sem = client.semaphore("kill-cancel");
    sem.try_set_permits(3).await.expect("permits");
    let taking = tokio::spawn(async move { sem.try_acquire(2, Duration::ZERO).await });
    // The grant happened; its WAIT 1 1500 blocks: pause writes now, so the cancel waits.
    poll("the acknowledgement's WAIT", LIMIT, || {
        (blocked_clients(&mut server.conn()) == 1 && available(&server, "kill-cancel") == 1)
            .then_some(())
    });
    pause_writes(&server, 20_000);
    poll("the cancel to be held back", LIMIT, || {
        (blocked_clients(&mut server.conn()) == 1 && !taking.is_finished()).then_some(())
    });
    tokio::time::sleep(Duration::from_millis(1800)).await; // WAIT answered; cancel sent
    assert!(kill_normal_clients(&server) >= 1);
    unpause(&server);
    let result = tokio::time::timeout(LIMIT, taking).await.expect("bounded").expect("task");
    assert!(matches!(result, Err(Error::NotReplicated { .. })), "{result:?}");
    poll("the cancelled permits to come back", LIMIT, || {
        (available(&server, "kill-cancel") == 3).then_some(())
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(available(&server, "kill-cancel"), 3, "given back exactly once");
}

// ---- ACL users limited to key patterns ------------------------------------------------------------

fn acl_user(server: &Server, name: &str, rules: &[&str]) -> String {
    let mut setuser = redis::cmd("ACL");
    setuser.arg("SETUSER").arg(name).arg("reset").arg("on").arg(">pw");
    for rule in rules {
        setuser.arg(*rule);
    }
    let () = setuser.query(&mut server.conn()).expect("ACL SETUSER");
    format!("redis://{name}:pw@127.0.0.1:{}/", server.port())
}

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
    let _: i64 =
        redis::cmd("RSEM.RELEASE").arg("app:sem").arg(1).query(&mut server.conn()).expect("rel");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(available(&server, "app:sem"), 1, "the permit given back reached nobody");
}

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
        (!exists(&cluster.nodes[1], &key) && !exists(&cluster.nodes[0], &key)).then_some(())
    });
}
