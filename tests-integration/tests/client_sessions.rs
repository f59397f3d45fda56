//! The Rust client's sessions: `LockClient::session()` opens one dedicated
//! connection whose locks, read-write lock sides and leased permits are session holds
//! (`SESSION [LOCKDELAY ms]`). When that connection goes away (the session dropped, the process
//! killed, `CLIENT KILL`, a server that stops answering) the server ends the holds, and every
//! guard taken through the session is lost at once; the session never reconnects.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use redis::{Connection, Value};
use tokio::time::{timeout, Instant};

use rlock_client::{Error, LockClient, Options, SessionOptions};
use rlock_tests_integration::lock_client::client;
use rlock_tests_integration::{
    cmd, exists, hgetall, info_field, kill_client, poll, run_str, session_holds, wait_blocked,
    wait_replica_online, Cluster, Process, Server,
};

/// How long anything that should happen "at once" may take here.
const PROMPT: Duration = Duration::from_secs(2);

const LIMIT: Duration = Duration::from_secs(10);

const LEASE: Option<Duration> = Some(Duration::from_secs(60));

/// The child process's part (run when `RLOCK_SESSION_CHILD` names a server): takes the lock
/// `proc` through a session, says so on stdout, and waits to be killed.
#[tokio::test]
async fn session_child_process() {
    let Ok(url) = std::env::var("RLOCK_SESSION_CHILD") else { return };
    let client = LockClient::open(url).await.expect("client");
    let session = client.session().await.expect("session");
    let guard = session.lock("proc").acquire(LEASE).await.expect("acquire");
    println!("HELD {}", guard.owner());
    std::future::pending::<()>().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_process_frees_its_session_lock_and_a_waiter_is_served_promptly() {
    let server = Server::start();
    let mut admin = server.conn();
    let mut child = Process(
        Command::new(std::env::current_exe().expect("test binary"))
            .args(["--exact", "session_child_process", "--nocapture", "--test-threads=1"])
            .env("RLOCK_SESSION_CHILD", server.url())
            .stdout(Stdio::piped())
            .spawn()
            .expect("child"),
    );
    let mut line = String::new();
    let mut out = BufReader::new(child.0.stdout.take().expect("stdout"));
    while !line.contains("HELD ") {
        line.clear();
        assert!(out.read_line(&mut line).expect("child output") > 0, "the child ended");
    }
    assert!(exists(&mut admin, "proc"));
    assert_eq!(session_holds(&mut admin), 1, "a session hold");
    let other = client(&server).await;
    let waiting = tokio::spawn(async move {
        let guard = other.lock("proc").try_acquire(LIMIT, LEASE).await;
        (guard, Instant::now())
    });
    wait_blocked(&mut admin, 1);
    let killed = Instant::now();
    child.0.kill().expect("kill -9");
    let (guard, at) = waiting.await.expect("waiter");
    let guard = guard.expect("the waiter is served");
    assert!(at - killed < PROMPT, "served {:?} after the kill", at - killed);
    assert_eq!(session_holds(&mut admin), 0);
    guard.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_session_ends_its_holds_and_serves_a_waiter_promptly() {
    let server = Server::start();
    let mut admin = server.conn();
    let client = client(&server).await;
    let session = client.session().await.expect("session");
    let guard = session.lock("l").acquire(LEASE).await.expect("acquire");
    assert_eq!(session_holds(&mut admin), 1);
    let other = client.clone();
    let waiting = tokio::spawn(async move {
        let guard = other.lock("l").try_acquire(LIMIT, LEASE).await;
        (guard, Instant::now())
    });
    wait_blocked(&mut admin, 1);
    let dropped = Instant::now();
    drop(session);
    assert!(guard.is_lost(), "a dropped session's guards are lost at once");
    let (waiter, at) = waiting.await.expect("waiter");
    let waiter = waiter.expect("the waiter is served");
    assert!(at - dropped < PROMPT, "served {:?} after the drop", at - dropped);
    assert_eq!(
        guard.release().await.err().map(|e| e.to_string()),
        Some(Error::NotHeld.to_string())
    );
    assert!(!waiter.is_lost());
    waiter.release().await.expect("the waiter's release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_kill_marks_every_guard_lost_and_the_session_refuses_new_acquires() {
    let server = Server::start();
    let mut admin = server.conn();
    let client = client(&server).await;
    client.leased_semaphore("s").try_set_permits(3).await.expect("permits");
    let session = client.session().await.expect("session");
    let lock = session.lock("l");
    let rw = session.rw_lock("rw");
    let sem = session.leased_semaphore("s");
    let a = lock.acquire(None).await.expect("lock, watchdog");
    let b = rw.read().acquire(LEASE).await.expect("read");
    let c = sem.acquire(2, LEASE).await.expect("permits");
    assert_eq!(session_holds(&mut admin), 4, "a lock, a read side, two permits");
    let id = session.client_id().expect("the session's client id");
    kill_client(&mut admin, id);
    let all_lost = async {
        tokio::join!(a.lost(), b.lost(), c.lost(), session.closed());
    };
    timeout(PROMPT, all_lost).await.expect("every guard lost, the session closed, at once");
    assert!(a.is_lost() && b.is_lost() && c.is_lost() && session.is_closed());
    assert!(a.valid_until().is_none(), "a lost guard has no deadline");
    for result in [
        lock.try_acquire(Duration::ZERO, LEASE).await.map(drop),
        lock.acquire(LEASE).await.map(drop),
        rw.write().try_acquire(Duration::from_secs(1), LEASE).await.map(drop),
        sem.try_acquire(1, Duration::ZERO, LEASE).await.map(drop),
    ] {
        assert!(matches!(result, Err(Error::SessionClosed)), "{result:?}");
    }
    // The server ended the holds (its end runs on its next timer tick).
    poll("the holds' end", LIMIT, || {
        (!exists(&mut admin, "l") && session_holds(&mut admin) == 0).then_some(())
    });
    assert!(!exists(&mut admin, "rw"));
    let available: i64 =
        redis::cmd("RSEM.AVAILABLE").arg("s").query(&mut admin).expect("available");
    assert_eq!(available, 3, "the permits came back");
    // A new session works.
    let again = client.session().await.expect("a new session");
    let guard = again.lock("l").try_acquire(Duration::ZERO, LEASE).await.expect("acquire");
    guard.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_lock_reenters_and_its_release_ends_the_binding() {
    let server = Server::start();
    let mut admin = server.conn();
    let client = client(&server).await;
    let session = client.session().await.expect("session");
    let lock = session.lock("l");
    let first = lock.acquire(LEASE).await.expect("acquire");
    let second = lock.try_acquire(Duration::ZERO, LEASE).await.expect("re-entry");
    assert_eq!(first.owner(), second.owner(), "one hold");
    assert_eq!(hgetall(&mut admin, b"l"), vec![(first.owner().as_bytes().to_vec(), b"1".to_vec())]);
    assert_eq!(lock.hold_count().await.expect("count"), 2);
    assert_eq!(session_holds(&mut admin), 1);
    second.release().await.expect("release the re-entry");
    assert!(exists(&mut admin, "l"));
    first.release().await.expect("release");
    assert!(!exists(&mut admin, "l"));
    assert_eq!(session_holds(&mut admin), 0, "released: no binding left");
    assert!(!session.is_closed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_side_and_leased_permits_are_session_holds_too() {
    let server = Server::start();
    let mut admin = server.conn();
    let client = client(&server).await;
    client.leased_semaphore("s").try_set_permits(2).await.expect("permits");
    let session = client.session().await.expect("session");
    let rw = session.rw_lock("rw");
    let write = rw.write().acquire(LEASE).await.expect("write");
    let read = rw.read().try_acquire(Duration::ZERO, LEASE).await.expect("write -> read");
    let permit = session.leased_semaphore("s").acquire(1, None).await.expect("permit");
    assert_eq!(session_holds(&mut admin), 3, "the write side, the read side, one permit");
    let id = session.client_id().expect("id");
    kill_client(&mut admin, id);
    timeout(PROMPT, async { tokio::join!(write.lost(), read.lost(), permit.lost()) })
        .await
        .expect("lost at once");
    poll("the ends", LIMIT, || {
        (!exists(&mut admin, "rw") && session_holds(&mut admin) == 0).then_some(())
    });
    let other = client.rw_lock("rw");
    let w = other.write().try_acquire(Duration::ZERO, LEASE).await.expect("free for a writer");
    w.release().await.expect("release");
    let available: i64 =
        redis::cmd("RSEM.AVAILABLE").arg("s").query(&mut admin).expect("available");
    assert_eq!(available, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lock_delay_is_passed_through() {
    let server = Server::start();
    let mut admin = server.conn();
    let client = client(&server).await;
    let options = SessionOptions::default().lock_delay(Duration::from_secs(3));
    let session = client.session_with(options).await.expect("session");
    let guard = session.lock("l").acquire(LEASE).await.expect("acquire");
    kill_client(&mut admin, session.client_id().expect("id"));
    timeout(PROMPT, guard.lost()).await.expect("lost");
    poll("the lock-delay", LIMIT, || {
        (hgetall(&mut admin, b"l") == vec![(b"rlock:lockdelay".to_vec(), b"1".to_vec())])
            .then_some(())
    });
    assert_eq!(info_field(&mut admin, "rlock", "rlock_lock_delays"), 1);
    let busy = client.lock("l").try_acquire(Duration::ZERO, LEASE).await;
    assert!(matches!(busy, Err(Error::TimedOut)), "held off by the delay: {busy:?}");
    // A lock-delay above the module's 60 s is refused before anything is sent.
    let refused =
        client.session_with(SessionOptions::default().lock_delay(Duration::from_secs(61)));
    assert!(matches!(refused.await, Err(Error::InvalidArgument(_))));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_session_acquire_leaves_nothing_held_and_the_session_usable() {
    let server = Server::start();
    let mut admin = server.conn();
    let client = client(&server).await;
    let busy = client.lock("l").acquire(LEASE).await.expect("someone else holds it");
    let session = client.session().await.expect("session");
    let lock = session.lock("l");
    let waiting = lock.acquire(LEASE);
    let dropped = timeout(Duration::from_millis(300), async {
        tokio::join!(waiting, async { wait_blocked_async(&server, 1).await })
    })
    .await;
    assert!(dropped.is_err(), "the acquire was still waiting when dropped");
    // The cancellation dequeues the waiter: the session connection is free again.
    wait_blocked_async(&server, 0).await;
    busy.release().await.expect("release");
    assert!(!exists(&mut admin, "l"), "the cancelled request got nothing");
    assert_eq!(session_holds(&mut admin), 0);
    let guard = lock.try_acquire(Duration::from_secs(1), LEASE).await.expect("the session works");
    assert_eq!(session_holds(&mut admin), 1);
    guard.release().await.expect("release");
}

/// `wait_blocked` without blocking a runtime thread.
async fn wait_blocked_async(server: &Server, n: i64) {
    let url = server.url();
    tokio::task::spawn_blocking(move || {
        let server = redis::Client::open(url).expect("client");
        let mut con = server.get_connection().expect("connect");
        wait_blocked(&mut con, n);
    })
    .await
    .expect("blocked clients");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_session_guard_s_release_leaves_the_next_holder_alone() {
    let server = Server::start();
    let mut admin = server.conn();
    let client = client(&server).await;
    let session = client.session().await.expect("session");
    let guard = session.lock("l").acquire(LEASE).await.expect("acquire");
    kill_client(&mut admin, session.client_id().expect("id"));
    timeout(PROMPT, guard.lost()).await.expect("lost");
    let next = client.lock("l").try_acquire(LIMIT, LEASE).await.expect("the next holder");
    assert!(matches!(guard.release().await, Err(Error::NotHeld)));
    assert_eq!(hgetall(&mut admin, b"l"), vec![(next.owner().as_bytes().to_vec(), b"1".to_vec())]);
    next.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_stops_answering_closes_the_session_within_the_keepalive_bound() {
    let server = Server::start();
    let client = client(&server).await;
    let keepalive = Duration::from_millis(200);
    let session =
        client.session_with(SessionOptions::default().keepalive(keepalive)).await.expect("session");
    let guard = session.lock("l").acquire(LEASE).await.expect("acquire");
    server.pause();
    let started = Instant::now();
    let closed = timeout(PROMPT, async { tokio::join!(session.closed(), guard.lost()) }).await;
    server.resume();
    closed.expect("closed within two keepalive periods");
    assert!(
        started.elapsed() <= keepalive * 2 + Duration::from_millis(200),
        "{:?}",
        started.elapsed()
    );
    let again = session.lock("m").try_acquire(Duration::ZERO, LEASE).await;
    assert!(matches!(again, Err(Error::SessionClosed)), "no silent reconnection: {again:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_client_refuses_sessions_with_a_typed_error() {
    let cluster = Cluster::start(3);
    let urls: Vec<String> = cluster.nodes.iter().map(Server::url).collect();
    let client = LockClient::cluster(urls, Options::default()).await.expect("cluster");
    assert!(matches!(client.session().await, Err(Error::SessionUnsupported)));
}

/// A session over a Unix socket (`redis+unix://`): its connection is opened on the socket as
/// over TCP, its holds are session holds, and dropping it ends them on the server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_over_a_unix_socket_binds_its_holds_and_ends_them_when_dropped() {
    let dir = tempfile::tempdir().expect("temp dir");
    let socket = dir.path().join("redis.sock");
    let path = socket.to_str().expect("a UTF-8 path");
    let server = Server::builder().config("unixsocket", path).start();
    let mut admin = server.conn();
    let client = LockClient::open(format!("redis+unix://{path}")).await.expect("client");
    let session = client.session().await.expect("a session over the socket");
    let id = session.client_id().expect("the session's client id");
    let Value::BulkString(line) = cmd(&mut admin, &["CLIENT", "LIST", "ID", &id.to_string()])
    else {
        panic!("CLIENT LIST")
    };
    let line = String::from_utf8_lossy(&line).into_owned();
    // `addr=<path>:0` (Redis) or `addr=[<path>:0]:0` (Valkey 9).
    assert!(line.contains(path) && line.contains(" flags=U"), "not on the socket: {line}");
    let guard = session.lock("l").acquire(LEASE).await.expect("acquire");
    assert_eq!(session_holds(&mut admin), 1, "a session hold");
    drop(session);
    assert!(guard.is_lost(), "a dropped session's guards are lost at once");
    poll("the hold's end", LIMIT, || (!exists(&mut admin, "l")).then_some(()));
    assert_eq!(session_holds(&mut admin), 0);
}

/// A session's try with replica acknowledgement is given the acknowledgement's time beyond the
/// 0.5 s of a zero wait, as any other try: a replica that acknowledges after 0.8 s (within the
/// 2 s asked for) hands the lock over, through the session as through the client: the session's
/// try does not give up after 0.5 s (`TimedOut`) and cancel a grant on its way to being
/// acknowledged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_try_waits_for_a_slow_acknowledgement_as_any_try_does() {
    let master = Server::start();
    let replica = Server::builder().replica_of(&master).start();
    wait_replica_online(&master);
    let options = Options::default().replica_ack(1, Duration::from_secs(2));
    let client = LockClient::with_options(master.client(), options).await.expect("client");
    let session = client.session().await.expect("session");
    let mut problems = Vec::new();
    for through_session in [false, true] {
        let name = format!("slow-ack-{through_session}");
        replica.pause();
        let lock = if through_session { session.lock(&name) } else { client.lock(&name) };
        let taking = tokio::spawn(async move { lock.try_acquire(Duration::ZERO, LEASE).await });
        tokio::time::sleep(Duration::from_millis(800)).await;
        replica.resume();
        match timeout(LIMIT, taking).await.expect("the try returns").expect("the task") {
            Ok(guard) => guard.release().await.expect("release"),
            Err(e) => problems.push(format!("through the session {through_session}: {e:?}")),
        }
    }
    assert!(problems.is_empty(), "tries that gave up on a slow acknowledgement: {problems:?}");
}

fn connected(con: &mut Connection) -> i64 {
    rlock_tests_integration::info_field(con, "clients", "connected_clients")
}

/// `Session::closed()` resolves only once every guard of the session is marked lost, as its
/// docs say ("every guard taken through it is lost by then"): a task woken by `closed()` on
/// another worker never sees a guard of the closed session say held (as it would if the close
/// announced itself before dropping the connection, stopping its tasks and marking the guards).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_guard_of_a_session_is_lost_by_the_time_closed_resolves() {
    let server = Server::start();
    let mut admin = server.conn();
    let client = rlock_client::LockClient::open(server.url()).await.expect("client");
    let lease = Some(Duration::from_secs(60));
    for round in 0..40 {
        let session = client.session().await.expect("session");
        let guards = [
            session.lock(format!("a{round}")).acquire(lease).await.expect("a"),
            session.lock(format!("b{round}")).acquire(lease).await.expect("b"),
        ];
        let id = session.client_id().expect("the session's id");
        let closed = tokio::spawn(async move {
            session.closed().await;
            guards.iter().map(|g| g.is_lost()).collect::<Vec<_>>()
        });
        kill_client(&mut admin, id);
        let lost = tokio::time::timeout(LIMIT, closed).await.expect("closed").expect("task");
        assert_eq!(lost, [true, true], "round {round}: closed() resolved, a guard says held");
    }
}

/// A session opened over RESP3 (`?protocol=resp3`): its holds are bound and end with it, a
/// wait through it is served, and a killed connection marks its guards lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resp3_session_binds_waits_and_loses_its_guards_when_killed() {
    let server = Server::start();
    let mut admin = server.conn();
    let url = format!("{}/?protocol=resp3", server.url());
    let client = rlock_client::LockClient::open(url).await.expect("client");
    let session = client.session().await.expect("session");
    let lease = Some(Duration::from_secs(60));
    let held = session.lock("a").acquire(lease).await.expect("acquire");
    cmd(&mut admin, &["RLOCK.ACQUIRE", "b", "other", "60000"]);
    let waited = tokio::spawn({
        let lock = session.lock("b");
        async move { lock.try_acquire(Duration::from_secs(10), lease).await }
    });
    wait_blocked(&mut admin, 1);
    cmd(&mut admin, &["RLOCK.RELEASE", "b", "other"]);
    let waited = waited.await.expect("task").expect("granted");
    assert_eq!(rlock_tests_integration::info_field(&mut admin, "rlock", "rlock_session_holds"), 2);
    kill_client(&mut admin, session.client_id().expect("id"));
    tokio::time::timeout(LIMIT, session.closed()).await.expect("closed at once");
    assert!(held.is_lost() && waited.is_lost());
    poll("the holds end", LIMIT, || {
        (run_str(&mut admin, &["EXISTS", "a", "b"]) == Ok(Value::Int(0))).then_some(())
    });
}

/// A `client.session()` dropped at each of its await points (connect, the handshake, `CLIENT
/// ID`) leaves no connection open on the server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_open_dropped_at_any_await_point_leaves_no_connection() {
    let server = Server::start();
    let mut admin = server.conn();
    let client = rlock_client::LockClient::open(server.url()).await.expect("client");
    let warm = client.lock("warm").acquire(Some(Duration::from_secs(1))).await.expect("warm");
    warm.release().await.expect("release");
    let baseline = connected(&mut admin);
    for micros in (0..3_000).step_by(50) {
        let open = client.session();
        let _ = tokio::time::timeout(Duration::from_micros(micros), open).await;
    }
    poll("no session connection left", LIMIT, || (connected(&mut admin) == baseline).then_some(()));
}

/// The local port of the server's client `id` (`CLIENT LIST ID`: `addr=127.0.0.1:<port>`).
fn client_port(con: &mut Connection, id: i64) -> u16 {
    let Value::BulkString(line) = cmd(con, &["CLIENT", "LIST", "ID", &id.to_string()]) else {
        panic!("CLIENT LIST")
    };
    let line = String::from_utf8(line).expect("utf-8");
    let addr = line.split(' ').find_map(|f| f.strip_prefix("addr=")).expect("addr");
    addr.rsplit(':').next().and_then(|p| p.parse().ok()).expect("port")
}

/// Whether this machine has an established TCP connection from local port `port` to
/// `server_port` (`/proc/net/tcp`, state `01`): the client side of a socket still open.
fn established(port: u16, server_port: u16) -> bool {
    let table = std::fs::read_to_string("/proc/net/tcp").expect("/proc/net/tcp");
    table.lines().skip(1).any(|row| {
        let fields: Vec<&str> = row.split_whitespace().collect();
        let port_of = |a: &str| a.rsplit(':').next().and_then(|p| u16::from_str_radix(p, 16).ok());
        fields.len() > 3
            && port_of(fields[1]) == Some(port)
            && port_of(fields[2]) == Some(server_port)
            && fields[3] == "01"
    })
}

/// Dropping a session closes its connection, "so the server ends its holds" — also while one
/// of its acquires is still blocked in a server-side `WAIT` on that connection (another task
/// waiting for a busy lock). The session's other hold must end on the server at once, not at
/// the end of its lease, and the waiting acquire must end with `SessionClosed`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_a_session_with_a_wait_in_flight_closes_its_socket_and_ends_its_holds() {
    let server = Server::start();
    let mut admin = server.conn();
    let client = client(&server).await;
    let busy = client.lock("b").acquire(LEASE).await.expect("someone else holds b");
    let session = client.session().await.expect("session");
    let guard = session.lock("a").acquire(LEASE).await.expect("a session hold on a");
    let waiter = session.lock("b");
    let waiting = tokio::spawn(async move { waiter.acquire(LEASE).await.map(drop) });
    wait_blocked(&mut admin, 1);
    drop(session);
    assert!(guard.is_lost(), "lost at once");
    let ended = timeout(PROMPT, waiting).await.expect("the waiting acquire ends").expect("task");
    assert!(matches!(ended, Err(Error::SessionClosed)), "{ended:?}");
    poll("the session's hold ends on the server", PROMPT, || {
        (!exists(&mut admin, "a") && session_holds(&mut admin) == 0).then_some(())
    });
    busy.release().await.expect("release b");
    assert!(!exists(&mut admin, "b"), "the cancelled wait got nothing");
}

/// A server that stops answering (CLIENT PAUSE longer than the keepalive, a stopped process)
/// makes the keepalive close the session and mark its guards lost. The client must then really
/// close its socket, so that the server ends the holds as soon as it runs again; a socket left
/// open until the unanswered `PING` is answered keeps holds that every guard already calls lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_closed_by_its_keepalive_closes_its_socket_while_the_server_stalls() {
    let server = Server::start();
    let mut admin = server.conn();
    let client = client(&server).await;
    let keepalive = Duration::from_millis(200);
    let session =
        client.session_with(SessionOptions::default().keepalive(keepalive)).await.expect("session");
    let guard = session.lock("l").acquire(LEASE).await.expect("acquire");
    let port = client_port(&mut admin, session.client_id().expect("id"));
    assert!(established(port, server.port()), "the session's socket is open");
    server.pause();
    let closed = timeout(PROMPT, async { tokio::join!(session.closed(), guard.lost()) }).await;
    let started = Instant::now();
    let mut open = true;
    while closed.is_ok() && open && started.elapsed() < PROMPT {
        open = established(port, server.port());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    server.resume();
    closed.expect("closed by the keepalive");
    assert!(!open, "the session's socket stayed open while the guards said lost");
    poll("the holds' end", LIMIT, || {
        (!exists(&mut admin, "l") && session_holds(&mut admin) == 0).then_some(())
    });
}

/// A master whose replica guard grants nothing for a while (`NOREPLICAS`: nothing ran) is
/// still the session's master: the session's acquires, untimed and timed, of every kind, wait
/// on its connection (asked again after a pause) and are granted as soon as the guard allows,
/// as session holds; the session stays open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_acquire_outlives_a_master_that_refuses_grants_for_a_while() {
    let server = Server::start();
    let mut con = server.conn();
    cmd(&mut con, &["RSEM.SETPERMITS", "s", "1"]);
    let client = client(&server).await;
    let session = client.session().await.expect("session");
    cmd(&mut con, &["CONFIG", "SET", "rlock.min-replicas", "1"]);
    poll("the guard to refuse", LIMIT, || {
        let reply =
            redis::cmd("RLOCK.ACQUIRE").arg("g").arg("a").arg(1000).query::<Value>(&mut con);
        matches!(reply, Err(e) if e.code() == Some("NOREPLICAS")).then_some(())
    });
    let (lock, timed) = (session.lock("u"), session.lock("t"));
    let (rw, sem) = (session.rw_lock("rw"), session.leased_semaphore("s"));
    let lock = tokio::spawn(async move { lock.acquire(LEASE).await });
    let timed =
        tokio::spawn(async move { timed.try_acquire(Duration::from_secs(20), LEASE).await });
    let read = tokio::spawn(async move { rw.read().acquire(LEASE).await });
    let permit =
        tokio::spawn(async move { sem.try_acquire(1, Duration::from_secs(20), LEASE).await });
    tokio::time::sleep(Duration::from_millis(400)).await;
    let pending =
        [lock.is_finished(), timed.is_finished(), read.is_finished(), permit.is_finished()];
    assert_eq!(
        pending, [false; 4],
        "no acquire of the session gave up (lock, timed, read, permit)"
    );
    assert!(!session.is_closed());
    cmd(&mut con, &["CONFIG", "SET", "rlock.min-replicas", "0"]);
    let lock = timeout(LIMIT, lock).await.expect("lock in time").expect("task").expect("lock");
    let timed = timeout(LIMIT, timed).await.expect("timed in time").expect("task").expect("timed");
    let read = timeout(LIMIT, read).await.expect("read in time").expect("task").expect("read");
    let permit =
        timeout(LIMIT, permit).await.expect("permit in time").expect("task").expect("permit");
    assert_eq!(session_holds(&mut con), 4, "every grant is a session hold");
    assert!(!session.is_closed());
    drop((lock, timed, read, permit));
}
