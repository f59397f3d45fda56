//! A hostile look at issue 27's module work after the deadlock search's cost work (the `Small`
//! map, the caller's ACL user looked up once, `Queues::enqueue` with `Joining`): cycles larger
//! than the map's vector, dead-end branches, request tags and owners on every way a waiter
//! leaves, and ACL users (a key pattern, `AUTH` between two waits, a deleted user). Each test
//! named after a defect failed on the code it was written against; the others pin down
//! behaviour the attack found sound.

use std::time::Duration;

use redis::{Connection, Value};
use rlock_tests_integration::{
    blocked_clients, cmd, deadlock_links, kill_client, poll, queue_str, run_str, wait_blocked,
    Pending, Server,
};

const LIMIT: Duration = Duration::from_secs(20);

/// The `DEADLOCK` text the module gives for `links` (waiter, key, holder), cut as it cuts it:
/// at most 1,024 bytes of links, then `; ...`.
fn expected_text(links: &[(String, String, String)]) -> String {
    let mut text = String::from("DEADLOCK this wait would close a cycle: ");
    let base = text.len();
    for (i, (w, k, h)) in links.iter().enumerate() {
        let part = format!("{w} waits for {k} held by {h}");
        if text.len() - base + part.len() > 1024 {
            text.push_str("; ...");
            break;
        }
        if i > 0 {
            text.push_str("; ");
        }
        text.push_str(&part);
    }
    text
}

/// Lock `i` of the ring: every third one a read-write lock (its holder writes, its waiter asks
/// to write), the others reentrant locks.
fn ring_lock(i: usize) -> (String, bool) {
    (format!("ring{i}"), i.is_multiple_of(3))
}

fn hold(con: &mut Connection, (key, rw): &(String, bool), owner: &str) {
    if *rw {
        cmd(con, &["RWLOCK.ACQUIRE", key, owner, "WRITE", "60000"]);
    } else {
        cmd(con, &["RLOCK.ACQUIRE", key, owner, "60000"]);
    }
}

fn wait_args<'a>((key, rw): &'a (String, bool), owner: &'a str, wait: &'a str) -> Vec<&'a str> {
    if *rw {
        vec!["RWLOCK.ACQUIRE", key, owner, "WRITE", "60000", "WAIT", wait]
    } else {
        vec!["RLOCK.ACQUIRE", key, owner, "60000", "WAIT", wait]
    }
}

/// A ring of `n` owners (owner `o{i}` holds lock `i` and waits for lock `i + 1`), but for the
/// last wait (`o{n-1}` for lock 0), which is then asked with `WAIT 100` and its reply returned.
/// `branches`: each ring owner also waits (on other connections) for that many locks held by
/// owners who wait for a lock held by an owner who waits nowhere: dead ends the breadth-first
/// search walks before it reaches the end of the ring. `broken`: the ring owner that does not
/// wait for the next lock (no cycle then).
fn ring(n: usize, branches: usize, broken: Option<usize>) -> (Result<Value, String>, Vec<Pending>) {
    let server = Server::start();
    let mut con = server.conn();
    let mut waits = Vec::new();
    for i in 0..n {
        hold(&mut con, &ring_lock(i), &format!("o{i}"));
        for b in 0..branches {
            let (x, y) = (format!("x{i}.{b}"), format!("y{i}.{b}"));
            cmd(&mut con, &["RLOCK.ACQUIRE", &x, &format!("d{i}.{b}"), "60000"]);
            cmd(&mut con, &["RLOCK.ACQUIRE", &y, &format!("e{i}.{b}"), "60000"]);
            let owner = format!("o{i}");
            waits.push(queue_str(
                &server,
                &mut con,
                &["RLOCK.ACQUIRE", &x, &owner, "1", "WAIT", "0"],
            ));
            let d = format!("d{i}.{b}");
            waits.push(queue_str(&server, &mut con, &["RLOCK.ACQUIRE", &y, &d, "1", "WAIT", "0"]));
        }
    }
    for i in (0..n - 1).filter(|i| Some(*i) != broken) {
        let owner = format!("o{i}");
        waits.push(queue_str(&server, &mut con, &wait_args(&ring_lock(i + 1), &owner, "0")));
    }
    let last = format!("o{}", n - 1);
    let reply = run_str(&mut con, &wait_args(&ring_lock(0), &last, "100"));
    (reply, waits)
}

/// The links of the ring of `n` owners, from the closing wait on.
fn ring_links(n: usize) -> Vec<(String, String, String)> {
    let mut links = vec![(format!("o{}", n - 1), ring_lock(0).0, "o0".to_owned())];
    for i in 0..n - 1 {
        links.push((format!("o{i}"), ring_lock(i + 1).0, format!("o{}", i + 1)));
    }
    links
}

#[test]
fn rings_of_20_and_40_owners_are_refused_naming_exactly_the_ring() {
    for n in [20, 40] {
        let (reply, _waits) = ring(n, 0, None);
        let e = reply.expect_err("the closing wait is refused");
        assert_eq!(e, expected_text(&ring_links(n)), "{n} owners");
        if n == 20 {
            assert_eq!(deadlock_links(&e).map(|l| l.len()), Some(20), "{e}");
        }
    }
}

#[test]
fn a_ring_with_many_dead_end_branches_is_refused_exactly_and_a_broken_one_waits() {
    // 20 ring owners each waiting in 3 queues, 40 branch owners waiting, 40 dead ends: more
    // than 16 owners and locks reached before the ring closes (the search's map is hashed).
    let (reply, _waits) = ring(20, 2, None);
    assert_eq!(reply.expect_err("refused"), expected_text(&ring_links(20)));
    for broken in [0, 9, 18] {
        let (reply, _waits) = ring(20, 2, Some(broken));
        assert!(matches!(reply, Ok(Value::Int(_))), "no cycle without o{broken}'s wait: {reply:?}");
    }
}

fn strs(a: &[String; 8]) -> Vec<&str> {
    a.iter().map(String::as_str).collect()
}

/// The request id `id` may wait on `key` again: nothing of an earlier waiter's tag is left.
fn tag_is_free(server: &Server, con: &mut Connection, key: &str, id: &str) {
    let args = ["RLOCK.ACQUIRE", key, "w", "60000", "WAIT", "0", "REQUEST", id];
    let again = queue_str(server, con, &args);
    let waiters = run_str(con, &["RLOCK.WAITERS", key]).expect("WAITERS");
    assert!(format!("{waiters:?}").contains(id), "{waiters:?}");
    assert_eq!(run_str(con, &["RLOCK.CANCEL", key, id]), Ok(Value::Int(1)), "cancel by id");
    assert!(matches!(again.reply(LIMIT).0, Ok(Value::Int(_))), "answered as a timeout");
}

#[test]
fn a_request_tag_is_freed_on_every_way_its_waiter_leaves() {
    let server = Server::start();
    let mut con = server.conn();
    let acquire = |key: &str, id: &str, wait: &str| {
        ["RLOCK.ACQUIRE", key, "w", "60000", "WAIT", wait, "REQUEST", id].map(str::to_owned)
    };
    // Timeout, CLIENT UNBLOCK, CLIENT KILL, a duplicate refused: the tag goes with the waiter.
    for (n, how) in ["timeout", "unblock", "kill"].into_iter().enumerate() {
        let (key, id) = (format!("t{n}"), format!("id-{how}"));
        cmd(&mut con, &["RLOCK.ACQUIRE", &key, "h", "60000"]);
        let wait = if how == "timeout" { "200" } else { "0" };
        let w = queue_str(&server, &mut con, &strs(&acquire(&key, &id, wait)));
        let dup = run_str(&mut con, &strs(&acquire(&key, &id, "0"))).expect_err("duplicate");
        assert!(dup.contains("already waiting"), "{dup}");
        match how {
            "unblock" => cmd(&mut con, &["CLIENT", "UNBLOCK", &w.client_id().to_string()]),
            "kill" => {
                kill_client(&mut con, w.client_id());
                Value::Nil
            }
            _ => Value::Nil,
        };
        drop(w.reply(LIMIT));
        poll("the waiter left", LIMIT, || (blocked_clients(&mut con) == 0).then_some(()));
        tag_is_free(&server, &mut con, &key, &id);
    }
    // A grant (the holder's release, a FLUSHDB, a SWAPDB that frees the lock): the tag goes.
    for (n, how) in ["release", "flushdb", "swapdb"].into_iter().enumerate() {
        let (key, id) = (format!("g{n}"), format!("id-{how}"));
        cmd(&mut con, &["RLOCK.ACQUIRE", &key, "h", "60000"]);
        let w = queue_str(&server, &mut con, &strs(&acquire(&key, &id, "0")));
        match how {
            "release" => cmd(&mut con, &["RLOCK.RELEASE", &key, "h"]),
            "flushdb" => cmd(&mut con, &["FLUSHDB"]),
            _ => cmd(&mut con, &["SWAPDB", "0", "1"]),
        };
        assert_eq!(w.reply(LIMIT).0, Ok(Value::Nil), "{how}: granted");
        // Its grant taken away: the same request may wait again (its tag left with it).
        cmd(&mut con, &["RLOCK.FORCERELEASE", &key]);
        cmd(&mut con, &["RLOCK.ACQUIRE", &key, "h", "60000"]);
        tag_is_free(&server, &mut con, &key, &id);
    }
    wait_blocked(&mut con, 0);
}

/// A connection of `server` authenticated as `user` (made `nopass`).
fn conn_as(server: &Server, user: &str) -> Connection {
    let mut con = server.conn();
    con.set_read_timeout(Some(Duration::from_secs(60))).expect("timeout");
    cmd(&mut con, &["AUTH", user, "any"]);
    con
}

#[test]
fn a_wait_after_auth_to_another_user_is_granted_as_that_user() {
    let server = Server::start();
    let mut admin = server.conn();
    for user in ["u1", "u2"] {
        cmd(&mut admin, &["ACL", "SETUSER", user, "on", "nopass", "+@all", "~*", "&*"]);
    }
    cmd(&mut admin, &["RWLOCK.ACQUIRE", "rw", "W", "WRITE", "60000"]);
    // One connection: a wait as u1 (it times out), AUTH u2, a wait as u2 (it stays queued).
    let mut con = conn_as(&server, "u1");
    let (tx, rx) = std::sync::mpsc::channel();
    let waiter = std::thread::spawn(move || {
        let read = ["RWLOCK.ACQUIRE", "rw", "A", "READ", "60000", "WAIT"];
        let first = run_str(&mut con, &[&read[..], &["30"]].concat());
        tx.send(first).expect("send");
        cmd(&mut con, &["AUTH", "u2", "any"]);
        run_str(&mut con, &[&read[..], &["0"]].concat())
    });
    assert!(matches!(rx.recv_timeout(LIMIT).expect("first"), Ok(Value::Int(_))));
    wait_blocked(&mut admin, 1);
    // u2 may no longer write the read hold key its grant writes; u1 still may.
    cmd(&mut admin, &["ACL", "SETUSER", "u2", "resetkeys", "~rw"]);
    cmd(&mut admin, &["RWLOCK.RELEASE", "rw", "W", "WRITE"]);
    let reply = waiter.join().expect("waiter");
    let e = reply.expect_err("checked as u2, the user it waited as");
    assert!(e.starts_with("NOPERM"), "{e}");
    let fields: Vec<String> = redis::cmd("HKEYS").arg("rw").query(&mut admin).expect("HKEYS");
    assert!(fields.is_empty(), "nothing granted to A: {fields:?}");
}

#[test]
fn a_waiter_whose_user_is_deleted_leaves_and_the_next_one_is_served() {
    let server = Server::start();
    let mut admin = server.conn();
    cmd(&mut admin, &["ACL", "SETUSER", "u", "on", "nopass", "+@all", "~*", "&*"]);
    cmd(&mut admin, &["RLOCK.ACQUIRE", "k", "H", "60000"]);
    let mut u = conn_as(&server, "u");
    let u_id: i64 = redis::cmd("CLIENT").arg("ID").query(&mut u).expect("id");
    let u_wait = std::thread::spawn(move || {
        run_str(&mut u, &["RLOCK.ACQUIRE", "k", "U", "60000", "WAIT", "0", "REQUEST", "ru"])
    });
    wait_blocked(&mut admin, 1);
    let next = queue_str(&server, &mut admin, &["RLOCK.ACQUIRE", "k", "V", "60000", "WAIT", "0"]);
    cmd(&mut admin, &["ACL", "DELUSER", "u"]);
    assert!(u_wait.join().expect("u").is_err(), "u's connection is closed");
    poll("u's waiter left", LIMIT, || (blocked_clients(&mut admin) == 1).then_some(()));
    let list = format!("{:?}", run_str(&mut admin, &["RLOCK.WAITERS", "k"]));
    assert!(!list.contains("\"U\"") && !list.contains("ru"), "{list}");
    let clients: String = redis::cmd("CLIENT").arg("LIST").query(&mut admin).expect("LIST");
    assert!(!clients.contains(&format!("id={u_id} ")), "{clients}");
    cmd(&mut admin, &["RLOCK.RELEASE", "k", "H"]);
    assert_eq!(next.reply(LIMIT).0, Ok(Value::Nil), "the next waiter is served");
    let fields: Vec<String> = redis::cmd("HKEYS").arg("k").query(&mut admin).expect("HKEYS");
    assert_eq!(fields, ["V"]);
    // The same request id may wait again (its tag left with the deleted user's waiter).
    cmd(&mut admin, &["RLOCK.FORCERELEASE", "k"]);
    cmd(&mut admin, &["RLOCK.ACQUIRE", "k", "H", "60000"]);
    tag_is_free(&server, &mut admin, "k", "ru");
}

fn connected(con: &mut Connection) -> i64 {
    rlock_tests_integration::info_field(con, "clients", "connected_clients")
}

/// Defect: `Session::closed()` resolved before the session's guards were marked lost (the
/// close announced itself first, then dropped the connection, stopped its tasks and marked the
/// guards), so a task woken by `closed()` on another worker could still see a guard of the
/// closed session say held, against its docs ("every guard taken through it is lost by then").
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
