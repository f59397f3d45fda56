//! Section 12, stalls (issue 34 §12-13): how long the server stops answering while the module
//! does a large piece of its own work at once. A probe connection sends `PING` after `PING`, each
//! as soon as the previous `PONG` arrives, and the longest gap between two `PONG`s is the stall
//! its clients saw.
//! - Timeouts: many clients blocked with the same timeout, sent together (queued during a
//!   `CLIENT PAUSE`, so the server starts them all in one go), time out together: rlock's
//!   `RLATCH.AWAIT` against Redis's own `BLPOP` on an empty list, in the same run.
//! - A session's close: one connection binds 40 owners × 1,000 read holds of one read-write lock
//!   (`RWLOCK.ACQUIRE ... READ ... SESSION`) and closes; the module ends every hold.
//!
//! Each measurement is the longest gap over its window; the idle floor is the same probe with
//! nothing else happening (the machine's own noise).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use redis::{Commands, Connection};
use rlock_tests_integration::Server;

use crate::report::{num, ratio, Section, Target};
use crate::util;
use crate::Sizes;

const LATCH: &str = "stall-latch";
const LIST: &str = "stall-list";
const RW: &str = "stall-rw";

/// A command in RESP.
fn resp(args: &[&str]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        out.extend_from_slice(format!("${}\r\n{a}\r\n", a.len()).as_bytes());
    }
    out
}

/// The probe: `PING`s back to back on its own connection and thread until stopped.
struct Probe {
    stop: Arc<AtomicBool>,
    thread: thread::JoinHandle<Duration>,
}

impl Probe {
    fn start(server: &Server) -> Self {
        let mut con = TcpStream::connect(("127.0.0.1", server.port())).expect("probe connect");
        con.set_nodelay(true).expect("nodelay");
        con.set_read_timeout(Some(Duration::from_secs(120))).expect("timeout");
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = Arc::clone(&stop);
        let thread = thread::spawn(move || {
            let ping = resp(&["PING"]);
            let mut buf = [0u8; 64];
            let mut last = Instant::now();
            let mut longest = Duration::ZERO;
            while !stopped.load(Ordering::Relaxed) {
                con.write_all(&ping).expect("PING");
                let mut got = 0;
                while got < 7 {
                    got += con.read(&mut buf[got..]).expect("PONG");
                }
                assert_eq!(&buf[..7], b"+PONG\r\n");
                let now = Instant::now();
                longest = longest.max(now - last);
                last = now;
            }
            longest
        });
        Self { stop, thread }
    }

    /// Stops it: the longest gap between two replies, in ms.
    fn stop(self) -> f64 {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().expect("probe").as_secs_f64() * 1000.0
    }
}

/// `calls` of `command` in INFO commandstats.
fn calls(con: &mut Connection, command: &str) -> u64 {
    let stats: String = redis::cmd("INFO").arg("commandstats").query(con).expect("INFO");
    let prefix = format!("cmdstat_{command}:calls=");
    stats
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|rest| rest.split(',').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn blocked(con: &mut Connection) -> u64 {
    let info: String = redis::cmd("INFO").arg("clients").query(con).expect("INFO");
    info.lines()
        .find_map(|l| l.strip_prefix("blocked_clients:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// Polls `done` every 10 ms for at most 120 s.
fn until(what: &str, mut done: impl FnMut() -> bool) {
    let until = Instant::now() + Duration::from_secs(120);
    while !done() {
        assert!(Instant::now() < until, "{what}: not within 120 s");
        thread::sleep(Duration::from_millis(10));
    }
}

/// The longest gap with nothing else going on, over `window`.
fn idle_gap(server: &Server, window: Duration) -> f64 {
    let probe = Probe::start(server);
    thread::sleep(window);
    probe.stop()
}

/// Whether the waiters are rlock's latch awaiters or Redis's `BLPOP` clients.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Waiters {
    Latch,
    Blpop,
}

/// `n` clients blocked with `timeout_ms`, sent together, time out together: the longest gap,
/// and the idle floor on the same server before.
fn timeouts(n: usize, timeout_ms: u64, style: Waiters) -> (f64, f64) {
    let server = util::server();
    let mut admin = server.conn();
    let idle = idle_gap(&server, Duration::from_millis(500));
    let (command, args): (&str, Vec<String>) = match style {
        Waiters::Latch => {
            let () = admin.set(LATCH, 1).expect("SET");
            ("rlatch.await", vec!["RLATCH.AWAIT".into(), LATCH.into(), timeout_ms.to_string()])
        }
        Waiters::Blpop => {
            let seconds = format!("{}", timeout_ms as f64 / 1000.0);
            ("blpop", vec!["BLPOP".into(), LIST.into(), seconds])
        }
    };
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let request = resp(&args);
    let mut clients = Vec::with_capacity(n);
    for _ in 0..n {
        let c = TcpStream::connect(("127.0.0.1", server.port())).expect("connect");
        c.set_nodelay(true).expect("nodelay");
        clients.push(c);
    }
    // Queued during the pause, started in one go at its end.
    let pause = Duration::from_millis(300 + n as u64 / 20);
    let () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(pause.as_millis() as u64)
        .arg("ALL")
        .query(&mut admin)
        .expect("CLIENT PAUSE");
    let sent = Instant::now();
    for c in &mut clients {
        c.write_all(&request).expect("send");
    }
    assert!(sent.elapsed() < pause, "the commands took longer to send than the pause");
    until("every client blocked", || calls(&mut admin, command) >= n as u64);
    let probe = Probe::start(&server);
    until("every client timed out", || blocked(&mut admin) == 0);
    thread::sleep(Duration::from_millis(100));
    let gap = probe.stop();
    let expected: &[u8] = if style == Waiters::Latch { b":0\r\n" } else { b"*-1\r\n" };
    for c in &mut clients {
        c.set_read_timeout(Some(Duration::from_secs(30))).expect("timeout");
        let mut buf = vec![0u8; expected.len()];
        c.read_exact(&mut buf).expect("the timeout's reply");
        assert_eq!(buf, expected, "a timed-out client's reply");
    }
    (gap, idle)
}

/// One connection binds `owners` × `holds` read holds of one read-write lock with `SESSION`
/// and closes: the longest gap while the module ends them, the idle floor before, and the ends
/// counted.
fn session_close(owners: usize, holds: usize) -> (f64, f64) {
    let server = util::server();
    let mut admin = server.conn();
    let idle = idle_gap(&server, Duration::from_millis(500));
    let mut holder = server.conn();
    for o in 0..owners {
        let owner = format!("owner-{o}");
        let mut pipe = redis::pipe();
        for _ in 0..holds {
            pipe.cmd("RWLOCK.ACQUIRE").arg(RW).arg(&owner).arg("READ").arg(600_000).arg("SESSION");
        }
        let replies: Vec<redis::Value> = pipe.query(&mut holder).expect("acquire");
        assert!(replies.iter().all(|v| *v == redis::Value::Nil), "every read granted");
    }
    let ends_before = session_ends(&mut admin);
    let probe = Probe::start(&server);
    thread::sleep(Duration::from_millis(50));
    drop(holder);
    until("every read hold ended", || {
        let exists: bool = admin.exists(RW).expect("EXISTS");
        !exists
    });
    thread::sleep(Duration::from_millis(100));
    let gap = probe.stop();
    assert_eq!(session_ends(&mut admin) - ends_before, owners as u64, "every owner's side ended");
    (gap, idle)
}

fn session_ends(con: &mut Connection) -> u64 {
    let info: String = redis::cmd("INFO").arg("rlock").query(con).expect("INFO rlock");
    info.lines()
        .find_map(|l| l.strip_prefix("rlock_session_ends:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

pub async fn run(sizes: &Sizes) -> (Section, Vec<Target>) {
    let (n, (owners, holds)) = (sizes.stall_waiters, sizes.stall_reads);
    let timeout_ms = if n >= 1_000 { 3_000 } else { 1_000 };
    let measured = tokio::task::spawn_blocking(move || {
        let latch = timeouts(n, timeout_ms, Waiters::Latch);
        let blpop = timeouts(n, timeout_ms, Waiters::Blpop);
        let close = session_close(owners, holds);
        (latch, blpop, close)
    });
    let ((latch, latch_idle), (blpop, blpop_idle), (close, close_idle)) =
        measured.await.expect("section 12");
    let reads = owners * holds;
    let mut section = Section::new(
        "12. Stalls: the longest PING gap",
        &format!(
            "A probe connection sends PING after PING (each as soon as the previous PONG \
             arrives); the longest gap between two PONGs is the longest the server stopped \
             answering. Idle: the same probe for 500 ms on the same server before, nothing else \
             going on. Timeouts: {n} clients, each its own connection, send a blocking command \
             with the same timeout ({timeout_ms} ms) during a CLIENT PAUSE, so the server starts \
             them all in one go at its end; the probe runs from when all are blocked until the \
             last has timed out (every reply checked). rlock: `RLATCH.AWAIT` on a latch at \
             count 1; BLPOP: Redis's own on an empty list, on a server of its own. Session \
             close: one connection takes {owners} owners × {holds} read holds of one read-write \
             lock with `SESSION` ({reads} read holds), then closes; the probe runs from before \
             the close until the lock is gone (each owner's end counted in INFO rlock)."
        ),
        &["measure", "longest PING gap ms", "idle floor ms", "vs BLPOP"],
    );
    section.row(vec![
        format!("{n} RLATCH.AWAIT time out together"),
        num(latch),
        num(latch_idle),
        ratio(latch, blpop),
    ]);
    section.row(vec![
        format!("{n} BLPOP time out together"),
        num(blpop),
        num(blpop_idle),
        ratio(blpop, blpop),
    ]);
    section.row(vec![
        format!("a connection bound to {reads} read holds closes"),
        num(close),
        num(close_idle),
        String::new(),
    ]);
    let targets = vec![
        Target::at_most(
            &format!("longest PING gap, {n} RLATCH.AWAIT timing out / {n} BLPOP's"),
            latch / blpop,
            2.0,
        ),
        Target::at_most(
            &format!("longest PING gap ms, a connection bound to {reads} read holds closes"),
            close,
            50.0,
        ),
    ];
    (section, targets)
}
