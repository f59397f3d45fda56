//! Hostile tests of the Rust client's count-down latch (`LockClient::latch`): timeouts at the
//! edges of what a `Duration` holds, ACL refusals, RESP3, binary and braced names, and
//! connections left behind by many dropped waits.

use std::time::Duration;

use rlock_client::{Error, LockClient};
use rlock_tests_integration::{blocked_clients, cmd, info_field, poll, Server};
use tokio::time::{timeout, Instant};

const LIMIT: Duration = Duration::from_secs(30);
const LATE: Duration = Duration::from_millis(900);

fn wait_for<T>(what: &str, limit: Duration, check: impl FnMut() -> Option<T>) -> T {
    tokio::task::block_in_place(|| poll(what, limit, check))
}

fn blocked(server: &Server, n: i64, what: &str) {
    let mut con = server.conn();
    wait_for(what, LIMIT, || (blocked_clients(&mut con) == n).then_some(()));
}

/// A timeout far beyond anything the server takes in milliseconds, yet one an `Instant` can
/// still add: the wait is as good as unlimited, never refused by the server nor sized from it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_finite_timeout_waits_like_no_limit_and_is_never_refused() {
    let server = Server::start();
    let client = LockClient::open(server.url()).await.expect("client");
    let latch = client.latch("huge");
    latch.try_set_count(1).await.expect("set");
    for secs in [u64::MAX / 4, 1 << 62, 1 << 53, 1 << 44, u64::MAX] {
        let huge = Duration::from_secs(secs);
        let l = latch.clone();
        let task = tokio::spawn(async move { l.wait(Some(huge)).await });
        // Either it blocks (as a wait without limit does) or it fails: it must block.
        let mut con = server.conn();
        wait_for(&format!("the {secs} s wait to block or end"), LIMIT, || {
            (blocked_clients(&mut con) == 1 || task.is_finished()).then_some(())
        });
        assert!(!task.is_finished(), "{secs} s: ended at once: {:?}", task.await);
        task.abort();
        let _ = task.await;
        blocked(&server, 0, "the dropped wait's awaiter to go");
    }
    // Also with the latch open: a huge timeout answers true, never an error.
    latch.delete().await.expect("delete");
    for secs in [u64::MAX / 4, 1 << 62, u64::MAX] {
        let open = latch.wait(Some(Duration::from_secs(secs))).await;
        assert!(open.expect("no error"), "open");
    }
}

/// Zero, a nanosecond and a millisecond: each returns false promptly on a closed latch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tiny_timeouts_return_false_promptly() {
    let server = Server::start();
    let client = LockClient::open(server.url()).await.expect("client");
    let latch = client.latch("tiny");
    latch.try_set_count(1).await.expect("set");
    for t in [Duration::ZERO, Duration::from_nanos(1), Duration::from_millis(1)] {
        let started = Instant::now();
        let open = latch.wait(Some(t)).await.expect("no error");
        assert!(!open, "{t:?}: closed");
        assert!(started.elapsed() < t + LATE, "{t:?}: took {:?}", started.elapsed());
    }
    blocked(&server, 0, "no awaiter left");
}

/// A user whose ACL allows only other keys is refused at once (`NOPERM`), never retried.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acl_user_without_the_key_is_refused_at_once_and_not_retried() {
    let server = Server::start();
    let mut admin = server.conn();
    cmd(&mut admin, &["ACL", "SETUSER", "limited", "on", ">pw", "~allowed:*", "+@all"]);
    cmd(&mut admin, &["RLATCH.SETCOUNT", "denied", "1"]);
    let url = server.url().replacen("redis://", "redis://limited:pw@", 1);
    let client = LockClient::open(url.as_str()).await.expect("client");
    let latch = client.latch("denied");
    for t in [None, Some(Duration::from_secs(10)), Some(Duration::ZERO)] {
        let started = Instant::now();
        let r = timeout(Duration::from_secs(5), latch.wait(t)).await.expect("returned at once");
        assert!(matches!(&r, Err(Error::Redis(e)) if e.code() == Some("NOPERM")), "{t:?}: {r:?}");
        assert!(started.elapsed() < Duration::from_secs(2), "{t:?}: {:?}", started.elapsed());
    }
    // Allowed to read the count but not to wait: the wait's own NOPERM is not retried either.
    cmd(&mut admin, &["ACL", "SETUSER", "limited", "~denied", "-rlatch.await"]);
    let r = timeout(Duration::from_secs(5), latch.wait(None)).await.expect("returned at once");
    assert!(matches!(&r, Err(Error::Redis(e)) if e.code() == Some("NOPERM")), "{r:?}");
    blocked(&server, 0, "no awaiter");
}

/// RESP3, binary and braced names: the same answers as RESP2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resp3_and_binary_braced_names() {
    let server = Server::start();
    for url in [server.url(), format!("{}?protocol=resp3", server.url())] {
        let client = LockClient::open(url.as_str()).await.expect("client");
        for name in [&b"{a}b"[..], b"}{", b"\x00\xff{\r\n}", b"x\x00y"] {
            let latch = client.latch(name);
            assert!(latch.try_set_count(2).await.expect("set"));
            assert_eq!(latch.count().await.expect("count"), 2);
            let l = latch.clone();
            let task = tokio::spawn(async move { l.wait(Some(Duration::from_secs(20))).await });
            blocked(&server, 1, "the awaiter to block");
            assert_eq!(latch.count_down_by(2).await.expect("down"), 0);
            let open = timeout(LIMIT, task).await.expect("returned").expect("task");
            assert!(open.expect("no error"), "{url} {name:?}: opened");
            assert!(!latch.delete().await.expect("delete"));
        }
    }
}

/// Many waits dropped at random points leave neither awaiters nor connections behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_dropped_waits_leave_no_connection_behind() {
    let server = Server::start();
    let client = LockClient::open(server.url()).await.expect("client");
    let latch = client.latch("drops");
    latch.try_set_count(1).await.expect("set");
    latch.count().await.expect("warm");
    let mut con = server.conn();
    let before = info_field(&mut con, "clients", "connected_clients");
    for i in 0..200u64 {
        let l = latch.clone();
        let limit = if i % 2 == 0 { None } else { Some(Duration::from_secs(30)) };
        let task = tokio::spawn(async move { l.wait(limit).await });
        tokio::time::sleep(Duration::from_micros(i * 37 % 3000)).await;
        task.abort();
        let _ = task.await;
    }
    wait_for("the dropped waits' connections to close", LIMIT, || {
        (info_field(&mut con, "clients", "connected_clients") == before).then_some(())
    });
    assert_eq!(blocked_clients(&mut con), 0);
}

/// A wait without a limit is never one server-side wait without a limit: each `RLATCH.AWAIT`
/// carries a slice of at most 30 s (sent again as it ends), so a connection that died without
/// a word is noticed by the slice's response timeout instead of never. Seen on the wire
/// (`MONITOR`), not in the client's code.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unlimited_wait_goes_to_the_server_in_bounded_slices() {
    use std::io::{BufRead, BufReader, Write};

    let server = Server::start();
    let client = LockClient::open(server.url()).await.expect("client");
    let latch = client.latch("sliced");
    latch.try_set_count(1).await.expect("set");
    let mut monitor = std::net::TcpStream::connect(("127.0.0.1", server.port())).expect("connect");
    monitor.set_read_timeout(Some(LIMIT)).expect("timeout");
    monitor.write_all(b"MONITOR\r\n").expect("MONITOR");
    let mut lines = BufReader::new(monitor);
    let l = latch.clone();
    let task = tokio::spawn(async move { l.wait(None).await });
    let budget = tokio::task::block_in_place(|| loop {
        let mut line = String::new();
        let n = lines.read_line(&mut line).expect("a MONITOR line in time");
        assert!(n > 0, "MONITOR closed");
        if let Some(at) = line.find("\"RLATCH.AWAIT\" \"sliced\" \"") {
            let rest = &line[at + "\"RLATCH.AWAIT\" \"sliced\" \"".len()..];
            let ms: u64 = rest.split('"').next().and_then(|v| v.parse().ok()).expect("its timeout");
            break ms;
        }
    });
    assert!((1..=30_000).contains(&budget), "an unlimited wait sent RLATCH.AWAIT ... {budget}");
    blocked(&server, 1, "the wait to block");
    latch.count_down().await.expect("count down");
    let open = timeout(LIMIT, task).await.expect("answered").expect("task");
    assert!(open.expect("no error"), "open");
}
