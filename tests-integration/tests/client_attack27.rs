//! Hostile tests of issue 27's client work (sessions and owners in the Rust client): what a
//! session promises when it closes with a command still on its connection (a blocked `WAIT`, a
//! keepalive `PING` a paused server never answers), and what an owner's read-write handles
//! answer to an upgrade.

use std::time::Duration;

use redis::{Connection, Value};
use rlock_client::{Error, LockClient, SessionOptions};
use rlock_tests_integration::{cmd, exists, poll, session_holds, wait_blocked, Server};
use tokio::time::{timeout, Instant};

const PROMPT: Duration = Duration::from_secs(2);
const LIMIT: Duration = Duration::from_secs(10);
const LEASE: Option<Duration> = Some(Duration::from_secs(60));

async fn client(server: &Server) -> LockClient {
    LockClient::open(server.url()).await.expect("client")
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
