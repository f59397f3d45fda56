//! Section 11, count-down latch (issue 29): many awaiters released by one count-down. rlock:
//! each awaiter blocks in `RLATCH.AWAIT`, and the `RLATCH.COUNTDOWN` to zero answers them all.
//! Redisson-style baseline: each awaiter subscribes to the latch's channel and reads the count
//! (`GET`), waits for the `0` message, then reads the count again (Redisson's `await()`), and
//! the count-down is Redisson's script (`DECR`, `DEL`, `PUBLISH 0`). Floor: the same
//! awaiters only subscribed, and one `PUBLISH` reaches them all: the server's cheapest way to
//! send one message to every one of them, the bound of any broadcast's release time here.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::report::{num, ratio, Section, Target};
use crate::util;
use crate::Sizes;

const LATCH: &str = "batch";
const CHANNEL: &str = "redisson_countdownlatch__channel__{batch}";
const REDISSON_COUNT_DOWN: &str = "local v = redis.call('decr', KEYS[1]); \
    if v <= 0 then redis.call('del', KEYS[1]) end; \
    if v == 0 then redis.call('publish', KEYS[2], ARGV[1]) end";

/// One round's release: server commands from the count-down to the last awaiter answered, and
/// each awaiter's release time (ms from the count-down's send to its answer).
struct Release {
    commands: f64,
    ms: Vec<f64>,
}

/// A command in RESP.
fn resp(args: &[&str]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        out.extend_from_slice(format!("${}\r\n{a}\r\n", a.len()).as_bytes());
    }
    out
}

/// Reads from `stream` until what was read ends with `end` (a bounded wait).
async fn read_until(stream: &mut TcpStream, end: &[u8]) -> Vec<u8> {
    let mut got = Vec::new();
    let mut buf = [0u8; 512];
    while !got.ends_with(end) {
        let read = tokio::time::timeout(Duration::from_secs(60), stream.read(&mut buf));
        let n = read.await.expect("a reply within 60 s").expect("read");
        assert!(n > 0, "the server closed the connection");
        got.extend_from_slice(&buf[..n]);
    }
    got
}

/// How the awaiters wait and the count-down is sent.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Style {
    /// `RLATCH.AWAIT` blocked in the server, `RLATCH.COUNTDOWN`.
    Rlock,
    /// Subscribe + `GET`, Redisson's count-down script, `GET` again.
    Redisson,
    /// Subscribed only; the count-down is a bare `PUBLISH` (no latch at all).
    Publish,
}

/// One round with `awaiters` clients in `style`. Each awaiter is a plain socket (no client
/// library: its reply is read as soon as it arrives, so the release times are the server's and
/// the network's, not a client's).
async fn release_round(awaiters: usize, style: Style) -> Release {
    let server = Arc::new(util::server());
    let addr = format!("127.0.0.1:{}", server.port());
    let mut con = util::conn(&server).await;
    util::call(&mut con, &["SET", LATCH, "1"]).await;
    let (ready_tx, mut ready_rx) = tokio::sync::mpsc::unbounded_channel::<()>();
    let mut tasks = Vec::with_capacity(awaiters);
    // Connections one after the other: a thousand at once would overflow the listen backlog.
    for _ in 0..awaiters {
        let mut c = TcpStream::connect(&addr).await.expect("connect");
        c.set_nodelay(true).expect("nodelay");
        let ready = ready_tx.clone();
        if style == Style::Publish {
            c.write_all(&resp(&["SUBSCRIBE", CHANNEL])).await.expect("SUBSCRIBE");
            read_until(&mut c, b":1\r\n").await;
            tasks.push(tokio::spawn(async move {
                let _ = ready.send(());
                read_until(&mut c, b"$1\r\n0\r\n").await;
                Instant::now()
            }));
        } else if style == Style::Redisson {
            let mut sub = TcpStream::connect(&addr).await.expect("connect");
            sub.set_nodelay(true).expect("nodelay");
            sub.write_all(&resp(&["SUBSCRIBE", CHANNEL])).await.expect("SUBSCRIBE");
            read_until(&mut sub, b":1\r\n").await;
            c.write_all(&resp(&["GET", LATCH])).await.expect("GET");
            assert_eq!(read_until(&mut c, b"\r\n1\r\n").await, b"$1\r\n1\r\n", "closed");
            tasks.push(tokio::spawn(async move {
                let _ = ready.send(());
                read_until(&mut sub, b"$1\r\n0\r\n").await;
                c.write_all(&resp(&["GET", LATCH])).await.expect("GET");
                assert_eq!(read_until(&mut c, b"\r\n").await, b"$-1\r\n", "open");
                Instant::now()
            }));
        } else {
            c.write_all(&resp(&["RLATCH.AWAIT", LATCH, "0"])).await.expect("RLATCH.AWAIT");
            tasks.push(tokio::spawn(async move {
                let _ = ready.send(());
                assert_eq!(read_until(&mut c, b"\r\n").await, b":1\r\n");
                Instant::now()
            }));
        }
    }
    drop(ready_tx);
    for _ in 0..awaiters {
        ready_rx.recv().await.expect("an awaiter");
    }
    if style == Style::Rlock {
        util::until_blocked(&mut con, awaiters).await;
    }
    let before = util::info_num(&mut con, "stats", "total_commands_processed").await;
    let sent = Instant::now();
    match style {
        Style::Redisson => {
            util::call(&mut con, &["EVAL", REDISSON_COUNT_DOWN, "2", LATCH, CHANNEL, "0"]).await
        }
        Style::Rlock => util::call(&mut con, &["RLATCH.COUNTDOWN", LATCH]).await,
        Style::Publish => util::call(&mut con, &["PUBLISH", CHANNEL, "0"]).await,
    };
    let mut ms = Vec::with_capacity(awaiters);
    for t in tasks {
        let answered = t.await.expect("awaiter");
        ms.push(answered.saturating_duration_since(sent).as_secs_f64() * 1000.0);
    }
    let after = util::info_num(&mut con, "stats", "total_commands_processed").await;
    // The first INFO is counted in `after`.
    Release { commands: after - before - 1.0, ms }
}

/// `rounds` rounds: the commands per release (their median) and every awaiter's release time.
async fn releases(awaiters: usize, style: Style, rounds: usize) -> (f64, Vec<f64>) {
    let mut commands = Vec::with_capacity(rounds);
    let mut ms = Vec::new();
    for _ in 0..rounds {
        let r = release_round(awaiters, style).await;
        commands.push(r.commands);
        ms.extend(r.ms);
    }
    commands.sort_by(f64::total_cmp);
    ms.sort_by(f64::total_cmp);
    (commands[commands.len() / 2], ms)
}

pub async fn run(sizes: &Sizes) -> (Section, Vec<Target>) {
    let (n, rounds) = (sizes.herd, sizes.latch_rounds);
    let (rlock_cmds, rlock_ms) = releases(n, Style::Rlock, rounds).await;
    let (redisson_cmds, redisson_ms) = releases(n, Style::Redisson, rounds).await;
    let (floor_cmds, floor_ms) = releases(n, Style::Publish, rounds).await;
    let mut section = Section::new(
        "11. Count-down latch release",
        &format!(
            "{n} clients await one count-down latch at count 1 (each its own connection); one \
             count-down opens it. Server commands processed (INFO total_commands_processed) from \
             the count-down to the last awaiter answered, the count-down included (median of \
             {rounds} rounds), and each awaiter's release time: from sending the count-down to \
             its answer, over all rounds. rlock: `RLATCH.AWAIT` blocked in the server, \
             `RLATCH.COUNTDOWN`. Redisson-style: each awaiter subscribed to \
             redisson_countdownlatch__channel__{{batch}} and read the count (`GET`) before; on \
             the `0` message it reads the count again (Redisson's `await()`); the count-down is \
             Redisson's script (`EVAL`: `DECR`, `DEL`, `PUBLISH`). PUBLISH floor: the same \
             awaiters only subscribed, and one `PUBLISH` sends each the message (no latch: the \
             server's cheapest broadcast to {n} connections, and so the bound of any \
             broadcast's release time on this machine). Each awaiter is a plain socket read as \
             soon as its reply arrives, all in this process (tokio, 2 worker threads), on the \
             same 2 cores as the server."
        ),
        &[
            "style",
            "commands per release",
            "p50 ms",
            "p99 ms",
            "max ms",
            "commands vs rlock",
            "p99 vs PUBLISH floor",
        ],
    );
    let p = |ms: &[f64], q: f64| util::percentile(ms, q);
    let floor_p99 = p(&floor_ms, 99.0);
    for (name, cmds, ms) in [
        ("rlock RLATCH.AWAIT", rlock_cmds, &rlock_ms),
        ("Redisson-style", redisson_cmds, &redisson_ms),
        ("PUBLISH floor", floor_cmds, &floor_ms),
    ] {
        section.row(vec![
            name.to_owned(),
            num(cmds),
            num(p(ms, 50.0)),
            num(p(ms, 99.0)),
            num(p(ms, 100.0)),
            ratio(cmds, rlock_cmds),
            ratio(p(ms, 99.0), floor_p99),
        ]);
    }
    let targets = vec![
        Target::at_least(
            &format!("server commands per release, Redisson-style / rlock, {n} awaiters"),
            redisson_cmds / rlock_cmds,
            10.0,
        ),
        Target::at_most(&format!("p99 release ms, rlock, {n} awaiters"), p(&rlock_ms, 99.0), 10.0),
        Target::at_most(
            &format!("p99 release ms, rlock / one PUBLISH to as many subscribers, {n} awaiters"),
            p(&rlock_ms, 99.0) / floor_p99,
            1.5,
        ),
    ];
    (section, targets)
}
