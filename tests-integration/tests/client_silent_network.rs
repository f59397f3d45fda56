//! An untimed wait whose connection dies without a word (a proxy that stops forwarding: a host
//! gone, a cut link; no reset, and TCP keepalive is answered by the proxy's kernel) while the
//! server hands it the lock or permit: the client notices from another connection, within a
//! bound, once the network heals. A plain wait (every kind) gets its grant: the request is
//! asked again with its own id, which replays the grant; nothing is lost, nothing stays held.
//! A session's wait ends with `SessionClosed`: a session is its connection, and the server's
//! end of it is killed so nothing stays held by it.

use std::future::Future;
use std::time::Duration;

use redis::Value;
use rlock_client::{Error, LockClient, Options};
use rlock_tests_integration::{cmd, poll, Proxy, Server};

/// How long after the network heals the wait must have returned: the check's first run (5 s
/// into the wait), its period (5 s), a connection or two replaced, and room for a slow machine.
const NOTICED: Duration = Duration::from_secs(25);

/// A blocking poll from a test on the multi-thread runtime.
fn wait_for<T>(what: &str, limit: Duration, check: impl FnMut() -> Option<T>) -> T {
    tokio::task::block_in_place(|| poll(what, limit, check))
}

/// The server's waiters of `key` (`<family>.WAITERS`).
fn waiters(server: &Server, family: &str, key: &str) -> usize {
    match cmd(&mut server.conn(), &[&format!("{family}.WAITERS"), key]) {
        Value::Array(rows) => rows.len(),
        other => panic!("{family}.WAITERS replied {other:?}"),
    }
}

/// A client through `proxy` and one straight to `server` (the holder).
async fn clients(server: &Server, proxy: &Proxy) -> (LockClient, LockClient) {
    let through = LockClient::open(proxy.url()).await.expect("a client through the proxy");
    let direct = LockClient::open(server.url()).await.expect("a direct client");
    (through, direct)
}

/// Starts `wait` (an untimed acquire through the proxy), waits until the server queues it,
/// cuts the network, lets `hand_over` free what the wait waits for (so the server grants it
/// into the dead connection), heals, and returns what the wait returned, which must come within
/// [`NOTICED`].
async fn granted_into_a_dead_connection<T: Send + 'static>(
    server: &Server,
    proxy: &Proxy,
    waits_on: (&str, &str),
    wait: impl Future<Output = T> + Send + 'static,
    hand_over: impl Future<Output = ()>,
) -> T {
    dead_wait_granted(server, proxy, waits_on, wait, hand_over, false).await
}

/// As [`granted_into_a_dead_connection`]; with `healed_first`, the network heals before the
/// hand-over (the dead wait stays queued in the server meanwhile, its connection open there).
async fn dead_wait_granted<T: Send + 'static>(
    server: &Server,
    proxy: &Proxy,
    (family, key): (&str, &str),
    wait: impl Future<Output = T> + Send + 'static,
    hand_over: impl Future<Output = ()>,
    healed_first: bool,
) -> T {
    let waiting = tokio::spawn(wait);
    wait_for("the wait to be queued", Duration::from_secs(10), || {
        (waiters(server, family, key) == 1).then_some(())
    });
    proxy.cut();
    if healed_first {
        proxy.heal();
    }
    hand_over.await;
    wait_for("the server to grant the dead wait", Duration::from_secs(5), || {
        (waiters(server, family, key) == 0).then_some(())
    });
    proxy.heal();
    tokio::time::timeout(NOTICED, waiting)
        .await
        .expect("the wait never returned after the network healed")
        .expect("the waiting task")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_granted_into_a_silently_dead_wait_reaches_the_waiter_once_the_network_heals() {
    let server = Server::start();
    let proxy = Proxy::start(server.port());
    let (through, direct) = clients(&server, &proxy).await;
    let holder = direct.lock("k").acquire(None).await.expect("the holder's grant");
    let lock = through.lock("k");
    let guard = granted_into_a_dead_connection(
        &server,
        &proxy,
        ("RLOCK", "k"),
        async move { lock.acquire(None).await },
        async { holder.release().await.expect("the holder's release") },
    )
    .await
    .expect("the waiter's grant");
    assert!(!guard.is_lost());
    assert!(
        direct.lock("k").try_acquire(Duration::ZERO, None).await.is_err(),
        "held by the waiter"
    );
    guard.release().await.expect("the waiter's release");
    let free = direct.lock("k").try_acquire(Duration::ZERO, None).await.expect("free after it");
    free.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_side_granted_into_a_silently_dead_wait_reaches_the_waiter_once_the_network_heals()
{
    let server = Server::start();
    let proxy = Proxy::start(server.port());
    let (through, direct) = clients(&server, &proxy).await;
    let reader = direct.rw_lock("rw").read().acquire(None).await.expect("the reader's grant");
    let write = through.rw_lock("rw").write().clone();
    let guard = granted_into_a_dead_connection(
        &server,
        &proxy,
        ("RWLOCK", "rw"),
        async move { write.acquire(None).await },
        async { reader.release().await.expect("the reader's release") },
    )
    .await
    .expect("the writer's grant");
    assert!(!guard.is_lost());
    guard.release().await.expect("the writer's release");
    let read = direct.rw_lock("rw").read().try_acquire(Duration::ZERO, None).await;
    read.expect("free after the writer").release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_counted_permit_granted_into_a_silently_dead_wait_reaches_the_waiter_and_is_conserved() {
    let server = Server::start();
    let proxy = Proxy::start(server.port());
    let (through, direct) = clients(&server, &proxy).await;
    let holder = direct.semaphore("s");
    assert!(holder.try_set_permits(1).await.expect("set permits"));
    holder.acquire(1).await.expect("the holder's permit");
    let sem = through.semaphore("s");
    granted_into_a_dead_connection(
        &server,
        &proxy,
        ("RSEM", "s"),
        async move { sem.acquire(1).await },
        async {
            holder.release(1).await.expect("the holder's release");
        },
    )
    .await
    .expect("the waiter's permit");
    assert_eq!(holder.available().await.expect("available"), 0, "the waiter has the permit");
    through.semaphore("s").release(1).await.expect("the waiter's release");
    assert_eq!(holder.available().await.expect("available"), 1, "permits conserved");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leased_permit_granted_into_a_silently_dead_wait_reaches_the_waiter_once_the_network_heals(
) {
    let server = Server::start();
    let proxy = Proxy::start(server.port());
    let (through, direct) = clients(&server, &proxy).await;
    let holder = direct.leased_semaphore("p");
    assert!(holder.try_set_permits(1).await.expect("set permits"));
    let held = holder.acquire(1, None).await.expect("the holder's permit");
    let sem = through.leased_semaphore("p");
    let guard = granted_into_a_dead_connection(
        &server,
        &proxy,
        ("RSEM", "p"),
        async move { sem.acquire(1, None).await },
        async { held.release().await.expect("the holder's release") },
    )
    .await
    .expect("the waiter's permit");
    assert!(!guard.is_lost());
    assert_eq!(holder.available().await.expect("available"), 0, "the waiter has the permit");
    guard.release().await.expect("the waiter's release");
    assert_eq!(holder.available().await.expect("available"), 1, "permits conserved");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_whose_wait_died_silently_ends_with_session_closed_and_leaves_nothing_held() {
    let server = Server::start();
    let proxy = Proxy::start(server.port());
    let (through, direct) = clients(&server, &proxy).await;
    let session = through.session().await.expect("a session");
    let session_id = session.client_id().expect("the session's client id");
    let holder = direct.lock("sk").acquire(None).await.expect("the holder's grant");
    let lock = session.lock("sk");
    let ended = granted_into_a_dead_connection(
        &server,
        &proxy,
        ("RLOCK", "sk"),
        async move { lock.acquire(None).await.map(drop) },
        async { holder.release().await.expect("the holder's release") },
    )
    .await;
    assert!(matches!(ended, Err(Error::SessionClosed)), "{ended:?}");
    tokio::time::timeout(Duration::from_secs(2), session.closed())
        .await
        .expect("the session is closed");
    wait_for("the dead session's server end to close", Duration::from_secs(5), || {
        let Value::BulkString(list) =
            cmd(&mut server.conn(), &["CLIENT", "LIST", "ID", &session_id.to_string()])
        else {
            return None;
        };
        list.is_empty().then_some(())
    });
    let free = direct.lock("sk").try_acquire(Duration::from_secs(2), None).await;
    free.expect("nothing left held by the dead session").release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_wait_still_queued_after_the_network_healed_gets_the_lock_when_it_is_granted() {
    let server = Server::start();
    let proxy = Proxy::start(server.port());
    let (through, direct) = clients(&server, &proxy).await;
    let holder = direct.lock("q").acquire(None).await.expect("the holder's grant");
    let lock = through.lock("q");
    let waiting = async move { lock.acquire(None).await };
    let released = async {
        // Past the first checks, which find the dead wait still queued and let it wait.
        tokio::time::sleep(Duration::from_secs(7)).await;
        holder.release().await.expect("the holder's release");
    };
    let guard = dead_wait_granted(&server, &proxy, ("RLOCK", "q"), waiting, released, true)
        .await
        .expect("the waiter's grant");
    assert!(!guard.is_lost());
    guard.release().await.expect("the waiter's release");
    let free = direct.lock("q").try_acquire(Duration::ZERO, None).await.expect("free after it");
    free.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_session_cut_silently_is_lost_and_its_holds_end_on_the_server_once_healed() {
    let server = Server::start();
    let proxy = Proxy::start(server.port());
    let (through, direct) = clients(&server, &proxy).await;
    let session = through.session().await.expect("a session");
    let guard = session.lock("idle").acquire(Some(Duration::from_secs(60))).await.expect("held");
    proxy.cut();
    tokio::time::timeout(Duration::from_secs(5), guard.lost())
        .await
        .expect("the keepalive's loss, within two periods");
    // A closing session marks its holds lost first, then itself closed.
    tokio::time::timeout(Duration::from_secs(2), session.closed())
        .await
        .expect("the session closed right after its holds were lost");
    proxy.heal();
    // The server kept the connection (the proxy holds it open) and so the hold: the client
    // ends it there, long before the 60 s lease.
    let free = direct.lock("idle").try_acquire(Duration::from_secs(10), None).await;
    free.expect("the dead session's hold ended on the server").release().await.expect("release");
}

/// The check of a timed wait (its acquire again without `WAIT`, same request id, on the shared
/// connection, 5 s in) is granted and answered while the wait's own answer is still on its way:
/// the server timed the wait out ("busy", held back on the wait's connection) and the holder let
/// go before the check. The check's grant arrives first, past the call's deadline; then the
/// wait's "busy". The caller is told "not acquired", so the client must give that grant back:
/// the lock must be free within a bound, not held by the request's owner for its whole lease.
/// The proxy holds every connection's bytes, so this interleaving happens on every run (it
/// once rode a 1 s lag and a timed window, which a loaded machine missed). The answer's
/// acknowledgement time (`aof_ack`, 3 s) widens the grace the client gives a late answer:
/// room for the steps.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_timed_out_while_its_check_was_granted_leaves_nothing_held() {
    let server = Server::builder().config("appendonly", "yes").start();
    let proxy = Proxy::start(server.port());
    let options = Options::default().aof_ack(true, 0, Duration::from_secs(3));
    let client = redis::Client::open(proxy.url()).expect("the proxy's url");
    let through = LockClient::with_options(client, options).await.expect("a client");
    let direct = LockClient::open(server.url()).await.expect("a direct client");
    let holder = direct.lock("slow").acquire(Some(Duration::from_secs(60))).await.expect("held");
    let lock = through.lock("slow");
    // Queued at once, timed out by the server 4 s in, checked 5 s in.
    let waiting = tokio::spawn(async move {
        lock.try_acquire(Duration::from_secs(4), Some(Duration::from_secs(60))).await
    });
    wait_for("the wait to be queued", Duration::from_secs(4), || {
        (waiters(&server, "RLOCK", "slow") == 1).then_some(())
    });
    let mut links = proxy.hold();
    let wait_link = links.pop().expect("the wait's connection, the newest");
    wait_for("the server to time the wait out", Duration::from_secs(8), || {
        (waiters(&server, "RLOCK", "slow") == 0).then_some(())
    });
    holder.release().await.expect("the holder's release");
    let checked = wait_for("the check to be sent", Duration::from_secs(8), || {
        links.iter().copied().find(|&id| proxy.held_from_client(id) > 0)
    });
    proxy.release(checked); // the check reaches the server, and its grant the client
    wait_for("the check to be granted", Duration::from_secs(5), || {
        (cmd(&mut server.conn(), &["EXISTS", "slow"]) == Value::Int(1)).then_some(())
    });
    proxy.release(wait_link); // then the wait's "busy"
    let got = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the acquire returned")
        .expect("the waiting task");
    assert!(matches!(got, Err(Error::TimedOut)), "not acquired: {got:?}");
    wait_for("the lock held by nobody to be given back", Duration::from_secs(5), || {
        let held = cmd(&mut server.conn(), &["EXISTS", "slow"]);
        (held == Value::Int(0)).then_some(())
    });
}

/// The check of a timed wait (its acquire again without `WAIT`, same request id, on the shared
/// connection) is sent while the wait's own answer is on its way: the server timed the wait out
/// ("busy", held back on the wait's connection) and the holder let go, so the check is granted
/// under the request's id, and its reply never comes (its connection closes under it). The
/// wait's "busy" then arrives: the caller is told "not acquired", so whatever the check got
/// must be given back, the lock free within a bound, not held by the request's owner for its
/// whole lease. The proxy holds every connection's bytes, so this interleaving happens on
/// every run. (The answer's acknowledgement time, 4 s with `aof_ack`, only widens the
/// call's bound: room for the steps.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_told_busy_after_its_unanswered_check_was_granted_leaves_nothing_held() {
    let server = Server::builder().config("appendonly", "yes").start();
    let proxy = Proxy::start(server.port());
    let options = Options::default().aof_ack(true, 0, Duration::from_secs(3));
    let client = redis::Client::open(proxy.url()).expect("the proxy's url");
    let through = LockClient::with_options(client, options).await.expect("a client");
    let direct = LockClient::open(server.url()).await.expect("a direct client");
    let holder = direct.lock("held").acquire(Some(Duration::from_secs(60))).await.expect("held");
    let lock = through.lock("held");
    // Queued at once, timed out by the server 4 s in, checked 5 s in.
    let waiting = tokio::spawn(async move {
        lock.try_acquire(Duration::from_secs(4), Some(Duration::from_secs(60))).await
    });
    wait_for("the wait to be queued", Duration::from_secs(4), || {
        (waiters(&server, "RLOCK", "held") == 1).then_some(())
    });
    let mut links = proxy.hold();
    let wait_link = links.pop().expect("the wait's connection, the newest");
    wait_for("the server to time the wait out", Duration::from_secs(8), || {
        (waiters(&server, "RLOCK", "held") == 0).then_some(())
    });
    holder.release().await.expect("the holder's release");
    let checked = wait_for("the check to be sent", Duration::from_secs(8), || {
        links.iter().copied().find(|&id| proxy.held_from_client(id) > 0)
    });
    proxy.release_to_server(checked);
    wait_for("the check to be granted", Duration::from_secs(5), || {
        (cmd(&mut server.conn(), &["EXISTS", "held"]) == Value::Int(1)).then_some(())
    });
    proxy.release(wait_link); // the wait's "busy"
    for id in links {
        proxy.sever(id); // the check's reply never comes
    }
    let got = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the acquire returned")
        .expect("the waiting task");
    assert!(matches!(got, Err(Error::TimedOut)), "not acquired: {got:?}");
    wait_for("the lock the check got to be given back", Duration::from_secs(5), || {
        (cmd(&mut server.conn(), &["EXISTS", "held"]) == Value::Int(0)).then_some(())
    });
}
