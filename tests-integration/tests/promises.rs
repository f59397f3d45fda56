//! README promises that had no test of their own: exactly one waiter woken per free event, a
//! waiter that just disconnects, leases and tokens across an RDB restart, the release retry with
//! the same request id after a lost reply, command flags and key specs.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use redis::{Connection, Value};
use rlock_tests_integration::{
    blocked_clients, cmd, hgetall, info_field, pexpiretime, poll, Pending, Server,
};

const LIMIT: Duration = Duration::from_secs(10);

fn wait(server: &Server, con: &mut Connection, owner: &str, lease: &str) -> Pending {
    let before = blocked_clients(con);
    let pending = Pending::start_str(server, &["RLOCK.ACQUIRE", "l", owner, lease, "WAIT", "0"]);
    poll("the waiter to block", LIMIT, || (blocked_clients(con) == before + 1).then_some(()));
    pending
}

#[test]
fn exactly_one_waiter_is_woken_per_del_unlink_flushdb_and_expiry() {
    let server = Server::start();
    let mut con = server.conn();
    cmd(&mut con, &["RLOCK.ACQUIRE", "l", "h", "60000"]);
    let w1 = wait(&server, &mut con, "w1", "60000");
    let w2 = wait(&server, &mut con, "w2", "60000");
    let w3 = wait(&server, &mut con, "w3", "300");
    let w4 = wait(&server, &mut con, "w4", "60000");
    let w5 = wait(&server, &mut con, "w5", "60000");
    let mut waiting = 5;
    for (event, served, owner) in [
        (Some(&["DEL", "l"][..]), w1, "w1"),
        (Some(&["UNLINK", "l"]), w2, "w2"),
        (Some(&["FLUSHDB"]), w3, "w3"),
        (None, w4, "w4"), // w3's 300 ms lease runs out
    ] {
        if let Some(event) = event {
            cmd(&mut con, event);
        }
        assert_eq!(served.reply(LIMIT).0, Ok(Value::Nil), "{owner} after {event:?}");
        waiting -= 1;
        // The hand-off is one step: had it woken more than one, they would be gone already.
        assert_eq!(blocked_clients(&mut con), waiting, "after {event:?}");
        assert_eq!(hgetall(&mut con, b"l"), vec![(owner.as_bytes().to_vec(), b"1".to_vec())]);
    }
    assert_eq!(info_field(&mut con, "rlock", "rlock_handoffs"), 4);
    cmd(&mut con, &["DEL", "l"]);
    assert_eq!(w5.reply(LIMIT).0, Ok(Value::Nil));
}

#[test]
fn a_waiter_that_just_disconnects_leaves_the_queue() {
    let server = Server::start();
    let mut con = server.conn();
    cmd(&mut con, &["RLOCK.ACQUIRE", "l", "h", "60000"]);
    // A bare socket: send the blocking command, then close the socket (no QUIT, no kill).
    let mut socket = TcpStream::connect(("127.0.0.1", server.port())).expect("connect");
    socket
        .write_all(b"*6\r\n$13\r\nRLOCK.ACQUIRE\r\n$1\r\nl\r\n$4\r\ngone\r\n$5\r\n60000\r\n$4\r\nWAIT\r\n$1\r\n0\r\n")
        .expect("send");
    poll("the waiter to block", LIMIT, || (blocked_clients(&mut con) == 1).then_some(()));
    let next = wait(&server, &mut con, "next", "60000");
    drop(socket);
    poll("the gone waiter to leave", LIMIT, || {
        (info_field(&mut con, "rlock", "rlock_left_while_waiting") == 1).then_some(())
    });
    assert_eq!(info_field(&mut con, "rlock", "rlock_waiting_clients"), 1);
    assert_eq!(cmd(&mut con, &["RLOCK.RELEASE", "l", "h"]), Value::Int(1));
    assert_eq!(next.reply(LIMIT).0, Ok(Value::Nil), "the next waiter, not the gone one");
    assert_eq!(hgetall(&mut con, b"l"), vec![(b"next".to_vec(), b"1".to_vec())]);
}

#[test]
fn leases_and_tokens_survive_an_rdb_restart() {
    let mut server = Server::start();
    let mut con = server.conn();
    let token = cmd(&mut con, &["RLOCK.ACQUIRE", "l", "a", "60000", "TOKEN"]);
    assert_eq!(token, Value::Array(vec![Value::Int(1), Value::Int(1)]));
    cmd(&mut con, &["RLOCK.ACQUIRE", "l", "a", "60000", "TOKEN"]);
    let expiry = pexpiretime(&mut con, b"l");
    cmd(&mut con, &["SAVE"]);
    drop(con);
    server.restart(); // SIGKILL, then from dump.rdb (no AOF)
    let mut con = server.conn();
    assert_eq!(hgetall(&mut con, b"l"), vec![(b"a".to_vec(), b"2".to_vec())]);
    assert_eq!(pexpiretime(&mut con, b"l"), expiry, "the same absolute deadline");
    let busy = cmd(&mut con, &["RLOCK.ACQUIRE", "l", "b", "60000", "TOKEN"]);
    assert!(matches!(&busy, Value::Array(v) if v[0] == Value::Int(0)), "{busy:?}");
    cmd(&mut con, &["RLOCK.FORCERELEASE", "l"]);
    let next = cmd(&mut con, &["RLOCK.ACQUIRE", "l", "b", "60000", "TOKEN"]);
    // Tokens go on, above the floor the load from disk raised (grants after the last save
    // may be lost with it, and their tokens must not come back).
    let Value::Array(parts) = &next else { panic!("{next:?}") };
    assert_eq!(parts[0], Value::Int(1));
    let Value::Int(token) = parts[1] else { panic!("{next:?}") };
    assert!(token > 2, "tokens go on: {token}");
    assert_eq!(
        token,
        info_field(&mut con, "rlock", "rlock_token_floor"),
        "the first above the floor"
    );
}

/// A TCP proxy in front of `port` that, once armed, forwards the next `RLOCK.RELEASE` to the
/// server and then cuts that connection before the reply can come back (a lost reply).
struct LossyProxy {
    port: u16,
    armed: Arc<AtomicBool>,
}

impl LossyProxy {
    fn start(server_port: u16) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let armed = Arc::new(AtomicBool::new(false));
        let arm = Arc::clone(&armed);
        thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { return };
                let Ok(server) = TcpStream::connect(("127.0.0.1", server_port)) else { return };
                let cut = Arc::new(AtomicBool::new(false));
                let (c2, s2) =
                    (client.try_clone().expect("clone"), server.try_clone().expect("clone"));
                let (cut_up, cut_down, arm) =
                    (Arc::clone(&cut), Arc::clone(&cut), Arc::clone(&arm));
                thread::spawn(move || {
                    pump(client, server, |chunk| {
                        let release =
                            chunk.windows(13).any(|w| w.eq_ignore_ascii_case(b"RLOCK.RELEASE"));
                        if release && arm.swap(false, Ordering::SeqCst) {
                            cut_up.store(true, Ordering::SeqCst); // before the command reaches Redis
                        }
                        false
                    })
                });
                thread::spawn(move || pump(s2, c2, |_| cut_down.load(Ordering::SeqCst)));
            }
        });
        Self { port, armed }
    }
}

/// Copies `from` to `to` until either closes, or `cut(chunk)` says to drop the chunk and close
/// both.
fn pump(mut from: TcpStream, mut to: TcpStream, cut: impl Fn(&[u8]) -> bool) {
    let mut buf = [0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if cut(&buf[..n]) || to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_retries_a_release_whose_reply_was_lost_with_the_same_request_id() {
    let server = Server::start();
    let proxy = LossyProxy::start(server.port());
    let url = format!("redis://127.0.0.1:{}/", proxy.port);
    let client = rlock_client::LockClient::new(redis::Client::open(url).expect("url"))
        .await
        .expect("client");
    let lock = client.lock("l");
    let guard = lock.acquire(Some(Duration::from_secs(60))).await.expect("acquired");
    let mut con = server.conn();
    proxy.armed.store(true, Ordering::SeqCst);
    // Reported released, not "not held": the retry, with the same request id, gets the first
    // release's result (a fresh release would find nothing and say nil).
    guard.release().await.expect("released once, reported once");
    assert!(!proxy.armed.load(Ordering::SeqCst), "the proxy cut a release");
    // The server saw the release twice (the lost one and the retry) and released once.
    let calls: String = redis::cmd("INFO").arg("commandstats").query(&mut con).expect("INFO");
    let releases = calls
        .lines()
        .find_map(|l| {
            l.strip_prefix("cmdstat_rlock.release:calls=")?.split(',').next()?.parse().ok()
        })
        .unwrap_or(0);
    assert_eq!(releases, 2, "{calls}");
    assert!(hgetall(&mut con, b"l").is_empty(), "released");
}

#[test]
fn command_info_shows_the_flags_and_key_specs() {
    let server = Server::start();
    let mut con = server.conn();
    let expected = [
        ("rlock.acquire", -4, &["write", "denyoom"][..], &["RW", "access", "update"][..]),
        ("rlock.release", -3, &["write"], &["RW", "access", "delete"]),
        ("rlock.renew", -4, &["write", "denyoom"], &["RW", "update"]),
        ("rlock.forcerelease", 2, &["write"], &["RW", "delete"]),
        ("rlock.pttl", 2, &["readonly", "fast"], &["RO", "access"]),
        ("rlock.info", 2, &["readonly", "fast"], &["RO", "access"]),
        ("rlock.cancel", 3, &["write"], &["RW", "access", "delete"]),
        ("rwlock.acquire", -5, &["write", "denyoom"], &["RW", "access", "update"]),
        ("rwlock.renew", -4, &["write", "denyoom"], &["RW", "update"]),
        ("rsem.acquire", -3, &["write", "denyoom"], &["RW", "access", "update"]),
    ];
    for (name, arity, flags, key_flags) in expected {
        let info: Value =
            redis::cmd("COMMAND").arg("INFO").arg(name).query(&mut con).expect("INFO");
        let Value::Array(mut entries) = info else { panic!("{info:?}") };
        let Value::Array(entry) = entries.remove(0) else { panic!("{name}: no info") };
        assert_eq!(entry[1], Value::Int(arity), "{name}: arity");
        let strings = |v: &Value| -> Vec<String> {
            match v {
                Value::Array(items) | Value::Set(items) => items
                    .iter()
                    .filter_map(|i| redis::from_redis_value::<String>(i.clone()).ok())
                    .collect(),
                _ => Vec::new(),
            }
        };
        let got = strings(&entry[2]);
        for flag in flags {
            assert!(got.iter().any(|f| f == flag), "{name}: flags {got:?} lack {flag}");
        }
        // Key specs: [... "flags", [..] ...] in entry 8.
        let specs = format!("{:?}", entry[8]);
        for flag in key_flags {
            assert!(
                specs.contains(&format!("\"{flag}\"")),
                "{name}: key spec {specs} lacks {flag}"
            );
        }
        let docs: Value =
            redis::cmd("COMMAND").arg("DOCS").arg(name).query(&mut con).expect("DOCS");
        let docs = format!("{docs:?}");
        assert!(docs.contains("summary") && docs.contains("since"), "{name}: {docs}");
        // The arguments (redis-cli's hints read them): names, option words, optional flags.
        let arguments: &[&str] = match name {
            "rlock.acquire" => {
                &["key", "owner", "lease-ms", "timeout-ms", "WAIT", "TOKEN", "REQUEST", "optional"]
            }
            "rlock.cancel" => &["key", "id"],
            "rwlock.acquire" => &["key", "owner", "READ", "WRITE", "lease-ms", "REQUEST"],
            "rwlock.renew" => &["key", "owner", "lease-ms", "READ", "WRITE", "optional"],
            "rsem.acquire" => &["key", "permits", "LEASE", "timeout-ms", "REQUEST"],
            "rlock.release" => &["key", "owner", "lease-ms", "REQUEST", "optional"],
            "rlock.renew" => &["key", "owner", "lease-ms"],
            _ => &["key"],
        };
        assert!(docs.contains("arguments"), "{name}: no arguments in {docs}");
        for word in arguments {
            assert!(docs.contains(&format!("\"{word}\"")), "{name}: {word} missing in {docs}");
        }
    }
}
