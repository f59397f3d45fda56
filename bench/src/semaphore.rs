//! Section 8, semaphore contention: 32 clients compete for 4 permits of one semaphore, each
//! looping acquire 1 -> GET a counter -> release 1, with (a) `RSEM.ACQUIRE ... WAIT` and (b) a
//! Redisson-style client: its `tryAcquire` script, retried on each `redisson_sc:{name}` message
//! (its release publishes the new count). Reported: acquisitions/s and the acquire wait.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use redis::Value;
use rlock_tests_integration::Server;

use crate::report::{num, ratio, Section, Target};
use crate::util::{self, percentile};
use crate::Sizes;

const NAME: &str = "permits";
const PERMITS: u64 = 4;
const CLIENTS: usize = 32;
/// The longest a Redisson-style waiter sleeps without a message before it tries again.
const RETRY: Duration = Duration::from_millis(100);

/// Redisson's `tryAcquire(p)` (the model's §3).
pub const TRY_ACQUIRE: &str = "local v = redis.call('get', KEYS[1]); \
     if v ~= false and tonumber(v) >= tonumber(ARGV[1]) then \
     redis.call('decrby', KEYS[1], ARGV[1]); return 1 end; return 0";
/// Redisson's `release(p)`: INCRBY, then publish the new count.
pub const RELEASE: &str = "local v = redis.call('incrby', KEYS[1], ARGV[1]); \
     redis.call('publish', KEYS[2], v); return v";

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Style {
    Wait,
    Redisson,
}

struct Outcome {
    per_sec: f64,
    p50_ms: f64,
    p99_ms: f64,
}

async fn client(
    server: Arc<Server>,
    style: Style,
    stop_at: Instant,
    shas: (String, String),
) -> Vec<f64> {
    let mut con = util::conn(&server).await;
    let channel = format!("redisson_sc:{{{NAME}}}");
    let mut messages = match style {
        Style::Redisson => Some(util::subscription(&server, &channel).await.into_on_message()),
        Style::Wait => None,
    };
    let mut waits = Vec::new();
    while Instant::now() < stop_at {
        let started = Instant::now();
        match style {
            Style::Wait => {
                let reply: Value = redis::cmd("RSEM.ACQUIRE")
                    .arg(NAME)
                    .arg(1)
                    .arg("WAIT")
                    .arg(0)
                    .query_async(&mut con)
                    .await
                    .expect("acquire");
                assert_eq!(reply, Value::Int(1));
            }
            Style::Redisson => loop {
                let taken: i64 = redis::cmd("EVALSHA")
                    .arg(&shas.0)
                    .arg(1)
                    .arg(NAME)
                    .arg(1)
                    .query_async(&mut con)
                    .await
                    .expect("tryAcquire");
                if taken == 1 {
                    break;
                }
                let stream = messages.as_mut().expect("subscribed");
                tokio::select! {
                    _ = stream.next() => {}
                    () = tokio::time::sleep(RETRY) => {}
                }
            },
        }
        waits.push(started.elapsed().as_secs_f64() * 1000.0);
        let _: Option<i64> =
            redis::cmd("GET").arg("work").query_async(&mut con).await.expect("GET");
        match style {
            Style::Wait => {
                let _: i64 = redis::cmd("RSEM.RELEASE")
                    .arg(NAME)
                    .arg(1)
                    .query_async(&mut con)
                    .await
                    .expect("release");
            }
            Style::Redisson => {
                let _: i64 = redis::cmd("EVALSHA")
                    .arg(&shas.1)
                    .arg(2)
                    .arg(NAME)
                    .arg(&channel)
                    .arg(1)
                    .query_async(&mut con)
                    .await
                    .expect("release");
            }
        }
    }
    waits
}

async fn measure(style: Style, duration: Duration) -> Outcome {
    let server = Arc::new(util::server());
    let mut con = util::conn(&server).await;
    let mut load = async |src: &str| -> String {
        redis::cmd("SCRIPT").arg("LOAD").arg(src).query_async(&mut con).await.expect("SCRIPT LOAD")
    };
    let shas = (load(TRY_ACQUIRE).await, load(RELEASE).await);
    let _: i64 = redis::cmd("RSEM.SETPERMITS")
        .arg(NAME)
        .arg(PERMITS)
        .query_async(&mut con)
        .await
        .expect("set");
    let stop_at = Instant::now() + duration + Duration::from_millis(200 + 5 * CLIENTS as u64);
    let started = Instant::now();
    let tasks: Vec<_> = (0..CLIENTS)
        .map(|_| tokio::spawn(client(Arc::clone(&server), style, stop_at, shas.clone())))
        .collect();
    let mut waits = Vec::new();
    for t in tasks {
        waits.extend(t.await.expect("client"));
    }
    let elapsed = started.elapsed().as_secs_f64();
    let left: i64 =
        redis::cmd("RSEM.AVAILABLE").arg(NAME).query_async(&mut con).await.expect("available");
    assert_eq!(left, PERMITS as i64, "{style:?}: every permit came back");
    waits.sort_by(f64::total_cmp);
    Outcome {
        per_sec: waits.len() as f64 / elapsed,
        p50_ms: percentile(&waits, 50.0),
        p99_ms: percentile(&waits, 99.0),
    }
}

/// How late, after a dead holder's lease ended, a waiter holds the permit (server clock): the
/// dead lease's score against the waiter's own score minus its lease.
async fn dead_holder_round(server: Arc<Server>, name: String) -> f64 {
    const DEAD_LEASE: u64 = 200;
    const LEASE: i64 = 30_000;
    let mut con = util::conn(&server).await;
    let _: i64 =
        redis::cmd("RSEM.SETPERMITS").arg(&name).arg(1).query_async(&mut con).await.expect("set");
    let Value::Array(dead) = redis::cmd("RSEM.ACQUIRE")
        .arg(&name)
        .arg(1)
        .arg("LEASE")
        .arg(DEAD_LEASE)
        .query_async(&mut con)
        .await
        .expect("dead holder")
    else {
        panic!("not granted")
    };
    let zset = format!("{{{name}}}:timeout");
    let deadline = zscore(&mut con, &zset, &dead[0]).await;
    let mut waiter = util::conn(&server).await;
    let Value::Array(mine) = redis::cmd("RSEM.ACQUIRE")
        .arg(&name)
        .arg(1)
        .arg("LEASE")
        .arg(LEASE)
        .arg("WAIT")
        .arg(0)
        .query_async(&mut waiter)
        .await
        .expect("waiter")
    else {
        panic!("not granted")
    };
    let granted = zscore(&mut con, &zset, &mine[0]).await - LEASE;
    (granted - deadline) as f64
}

/// A leased permit's lease end.
async fn zscore(con: &mut redis::aio::MultiplexedConnection, zset: &str, id: &Value) -> i64 {
    let Value::BulkString(id) = id else { panic!("an id: {id:?}") };
    let score: f64 = redis::cmd("ZSCORE").arg(zset).arg(id).query_async(con).await.expect("ZSCORE");
    score as i64
}

async fn dead_holder(rounds: usize) -> Vec<f64> {
    let server = Arc::new(util::server());
    let mut all = Vec::new();
    for chunk in (0..rounds).collect::<Vec<_>>().chunks(10) {
        let tasks: Vec<_> = chunk
            .iter()
            .map(|i| tokio::spawn(dead_holder_round(Arc::clone(&server), format!("lease:{i}"))))
            .collect();
        for t in tasks {
            all.push(t.await.expect("round"));
        }
    }
    all.sort_by(f64::total_cmp);
    all
}

pub async fn run(sizes: &Sizes) -> (Section, Vec<Target>) {
    let mut section = Section::new(
        "8. Semaphore contention",
        &format!(
            "{CLIENTS} clients, each its own connection, compete for {PERMITS} permits: loop \
             acquire 1 -> GET -> release 1. Redisson-style: its tryAcquire script, retried on each \
             redisson_sc:{{name}} message (its release publishes the new count) or after {} ms. \
             Wait: from the first attempt to holding the permit. Every permit is checked back at \
             the end. Last row: a holder of a 200 ms leased permit dies; from its lease end to a \
             waiting client holding the permit (server clock), over the expiry rounds of section \
             5 (Redisson has no timer: the permit comes back when some client's next script \
             reclaims it).",
            RETRY.as_millis()
        ),
        &["style", "acquisitions/s", "p50 wait ms", "p99 wait ms", "acquisitions/s vs WAIT"],
    );
    let wait = measure(Style::Wait, sizes.contention).await;
    let redisson = measure(Style::Redisson, sizes.contention).await;
    for (name, o) in [("rlock WAIT", &wait), ("Redisson-style pub/sub", &redisson)] {
        section.row(vec![
            name.to_owned(),
            num(o.per_sec),
            num(o.p50_ms),
            num(o.p99_ms),
            ratio(o.per_sec, wait.per_sec),
        ]);
    }
    let back = dead_holder(sizes.expiry_rounds).await;
    section.row(vec![
        "leased permit of a dead holder -> waiter holds it".to_owned(),
        String::new(),
        num(percentile(&back, 50.0)),
        num(percentile(&back, 99.0)),
        String::new(),
    ]);
    let targets = vec![
        Target::at_least(
            "semaphore acquisitions/s, WAIT / Redisson-style, 32 clients, 4 permits",
            wait.per_sec / redisson.per_sec.max(f64::MIN_POSITIVE),
            2.0,
        ),
        // Redisson: the permit comes back only when some client's next script reclaims it.
        Target::at_most(
            "dead holder's leased permit -> waiter, p99 ms",
            percentile(&back, 99.0),
            10.0,
        ),
    ];
    (section, targets)
}
