//! Section 11, count-down latch (issue 29): many awaiters released by one count-down. rlock:
//! each awaiter blocks in `RLATCH.AWAIT`, and the `RLATCH.COUNTDOWN` to zero answers them all.
//! Redisson-style baseline: each awaiter subscribes to the latch's channel and reads the count
//! (`GET`), waits for the `0` message, then reads the count again (Redisson's `await()`), and
//! the count-down is Redisson's script (`DECR`, `DEL`, `PUBLISH 0`).

use std::sync::Arc;
use std::time::Instant;

use futures_util::StreamExt;
use redis::Value;

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

/// One round with `awaiters` clients, rlock's (`redisson == false`) or Redisson-style.
async fn release_round(awaiters: usize, redisson: bool) -> Release {
    let server = Arc::new(util::server());
    let mut con = util::conn(&server).await;
    util::call(&mut con, &["SET", LATCH, "1"]).await;
    let (ready_tx, mut ready_rx) = tokio::sync::mpsc::unbounded_channel::<()>();
    let mut tasks = Vec::with_capacity(awaiters);
    // Connections one after the other: a thousand at once would overflow the listen backlog.
    for _ in 0..awaiters {
        let mut c = util::conn(&server).await;
        let ready = ready_tx.clone();
        if redisson {
            let ps = util::subscription(&server, CHANNEL).await;
            tasks.push(tokio::spawn(async move {
                let mut messages = ps.into_on_message();
                let count: Option<i64> =
                    redis::cmd("GET").arg(LATCH).query_async(&mut c).await.expect("GET");
                assert_eq!(count, Some(1), "closed");
                let _ = ready.send(());
                loop {
                    let msg = messages.next().await.expect("a message");
                    if msg.get_payload_bytes() == b"0" {
                        break;
                    }
                }
                let count: Option<i64> =
                    redis::cmd("GET").arg(LATCH).query_async(&mut c).await.expect("GET");
                assert!(count.unwrap_or(0) <= 0, "open");
                Instant::now()
            }));
        } else {
            tasks.push(tokio::spawn(async move {
                let mut command = redis::cmd("RLATCH.AWAIT");
                let wait = command.arg(LATCH).arg(0).query_async::<Value>(&mut c);
                let _ = ready.send(());
                assert_eq!(wait.await.expect("RLATCH.AWAIT"), Value::Int(1));
                Instant::now()
            }));
        }
    }
    drop(ready_tx);
    for _ in 0..awaiters {
        ready_rx.recv().await.expect("an awaiter");
    }
    if !redisson {
        util::until_blocked(&mut con, awaiters).await;
    }
    let before = util::info_num(&mut con, "stats", "total_commands_processed").await;
    let sent = Instant::now();
    if redisson {
        util::call(&mut con, &["EVAL", REDISSON_COUNT_DOWN, "2", LATCH, CHANNEL, "0"]).await;
    } else {
        util::call(&mut con, &["RLATCH.COUNTDOWN", LATCH]).await;
    }
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
async fn releases(awaiters: usize, redisson: bool, rounds: usize) -> (f64, Vec<f64>) {
    let mut commands = Vec::with_capacity(rounds);
    let mut ms = Vec::new();
    for _ in 0..rounds {
        let r = release_round(awaiters, redisson).await;
        commands.push(r.commands);
        ms.extend(r.ms);
    }
    commands.sort_by(f64::total_cmp);
    ms.sort_by(f64::total_cmp);
    (commands[commands.len() / 2], ms)
}

pub async fn run(sizes: &Sizes) -> (Section, Vec<Target>) {
    let (n, rounds) = (sizes.herd, sizes.latch_rounds);
    let (rlock_cmds, rlock_ms) = releases(n, false, rounds).await;
    let (redisson_cmds, redisson_ms) = releases(n, true, rounds).await;
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
             Redisson's script (`EVAL`: `DECR`, `DEL`, `PUBLISH`). The awaiting clients run in \
             this process (tokio, 2 worker threads), on the server's 2 cores."
        ),
        &["style", "commands per release", "p50 ms", "p99 ms", "max ms", "commands vs rlock"],
    );
    let p = |ms: &[f64], q: f64| util::percentile(ms, q);
    for (name, cmds, ms) in [
        ("rlock RLATCH.AWAIT", rlock_cmds, &rlock_ms),
        ("Redisson-style", redisson_cmds, &redisson_ms),
    ] {
        section.row(vec![
            name.to_owned(),
            num(cmds),
            num(p(ms, 50.0)),
            num(p(ms, 99.0)),
            num(p(ms, 100.0)),
            ratio(cmds, rlock_cmds),
        ]);
    }
    let targets = vec![
        Target::at_least(
            &format!("server commands per release, Redisson-style / rlock, {n} awaiters"),
            redisson_cmds / rlock_cmds,
            10.0,
        ),
        Target::at_most(&format!("p99 release ms, rlock, {n} awaiters"), p(&rlock_ms, 99.0), 10.0),
    ];
    (section, targets)
}
