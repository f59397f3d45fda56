//! Section 7, read-write mix: N clients loop acquire -> work -> release on one read-write lock,
//! 90 % of the cycles reads (GET a counter), 10 % writes (GET, SET counter+1: a lost update
//! would show a broken exclusion), with (a) `RWLOCK.ACQUIRE ... WAIT` and (b) a Redisson-style
//! client: its read/write Lua scripts, retried on each message of `redisson_rwlock:{name}` or
//! after the PTTL. Reported: cycles/s and how long writers wait for the lock (p99, max).

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use redis::aio::MultiplexedConnection;
use redis::Value;
use rlock_tests_integration::redisson::{Call, RedissonRw};
use rlock_tests_integration::{Rng, Server};

use crate::report::{num, ratio, Section, Target};
use crate::util::{self, percentile};
use crate::Sizes;

const LOCK: &str = "rw";
const COUNTER: &str = "rw-counter";
const LEASE_MS: u64 = 30_000;
/// One cycle in ten writes.
const WRITE_EVERY: usize = 10;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Style {
    Wait,
    Redisson,
}

impl Style {
    const fn name(self) -> &'static str {
        match self {
            Self::Wait => "rlock WAIT",
            Self::Redisson => "Redisson-style pub/sub",
        }
    }
}

struct Outcome {
    cycles_per_sec: f64,
    writes: usize,
    writer_p99_ms: f64,
    writer_max_ms: f64,
}

/// The SHA1s of Redisson's four scripts.
#[derive(Clone)]
struct Shas {
    read: String,
    read_unlock: String,
    write: String,
    write_unlock: String,
}

async fn run_call(con: &mut MultiplexedConnection, call: &Call, sha: &str) -> Value {
    call.command(Some(sha)).query_async(con).await.expect("Redisson script")
}

async fn client(
    server: Arc<Server>,
    style: Style,
    id: u64,
    stop_at: Instant,
    shas: Shas,
) -> Vec<(bool, f64)> {
    let mut rng = Rng(0x5EED_0000 + id);
    let owner = format!("8b9f3c1e-2a7d-4c55-9e0b-1f2d3c4b5a69:{id}");
    let redisson = RedissonRw::new(LOCK, &owner);
    let mut con = util::conn(&server).await;
    let mut messages = match style {
        Style::Redisson => {
            Some(util::subscription(&server, &redisson.channel()).await.into_on_message())
        }
        Style::Wait => None,
    };
    let mut cycles = Vec::new();
    while Instant::now() < stop_at {
        let write = rng.below(WRITE_EVERY) == 0;
        let started = Instant::now();
        match style {
            Style::Wait => {
                let reply: Value = redis::cmd("RWLOCK.ACQUIRE")
                    .arg(LOCK)
                    .arg(&owner)
                    .arg(if write { "WRITE" } else { "READ" })
                    .arg(LEASE_MS)
                    .arg("WAIT")
                    .arg(0)
                    .query_async(&mut con)
                    .await
                    .expect("acquire");
                assert_eq!(reply, Value::Nil);
            }
            Style::Redisson => {
                let stream = messages.as_mut().expect("subscribed");
                let (call, sha) = if write {
                    (redisson.write(LEASE_MS), &shas.write)
                } else {
                    (redisson.read(LEASE_MS), &shas.read)
                };
                loop {
                    let Value::Int(pttl) = run_call(&mut con, &call, sha).await else { break };
                    let wait =
                        Duration::from_millis(u64::try_from(pttl).unwrap_or(LEASE_MS).max(1));
                    tokio::select! {
                        _ = stream.next() => {}
                        () = tokio::time::sleep(wait) => {}
                    }
                }
            }
        }
        cycles.push((write, started.elapsed().as_secs_f64() * 1000.0));
        if write {
            util::increment(&mut con, COUNTER).await;
        } else {
            let _: Option<i64> =
                redis::cmd("GET").arg(COUNTER).query_async(&mut con).await.expect("GET");
        }
        match style {
            Style::Wait => {
                let _: Option<i64> = redis::cmd("RWLOCK.RELEASE")
                    .arg(LOCK)
                    .arg(&owner)
                    .arg(if write { "WRITE" } else { "READ" })
                    .query_async(&mut con)
                    .await
                    .expect("release");
            }
            Style::Redisson => {
                let (call, sha) = if write {
                    (redisson.write_unlock(), &shas.write_unlock)
                } else {
                    (redisson.read_unlock(), &shas.read_unlock)
                };
                run_call(&mut con, &call, sha).await;
            }
        }
    }
    cycles
}

async fn measure(style: Style, clients: usize, duration: Duration) -> Outcome {
    let server = Arc::new(util::server());
    let mut con = util::conn(&server).await;
    let mut load = async |src: &str| -> String {
        redis::cmd("SCRIPT").arg("LOAD").arg(src).query_async(&mut con).await.expect("SCRIPT LOAD")
    };
    let sample = RedissonRw::new(LOCK, "x:1");
    let shas = Shas {
        read: load(sample.read(1).script).await,
        read_unlock: load(sample.read_unlock().script).await,
        write: load(sample.write(1).script).await,
        write_unlock: load(sample.write_unlock().script).await,
    };
    let stop_at = Instant::now() + duration + Duration::from_millis(200 + 5 * clients as u64);
    let started = Instant::now();
    let tasks: Vec<_> = (0..clients as u64)
        .map(|id| tokio::spawn(client(Arc::clone(&server), style, id, stop_at, shas.clone())))
        .collect();
    let mut cycles = Vec::new();
    for t in tasks {
        cycles.extend(t.await.expect("client"));
    }
    let elapsed = started.elapsed().as_secs_f64();
    let mut writer_waits: Vec<f64> = cycles.iter().filter(|(w, _)| *w).map(|&(_, ms)| ms).collect();
    let counter: Option<i64> =
        redis::cmd("GET").arg(COUNTER).query_async(&mut con).await.expect("GET");
    assert_eq!(counter.unwrap_or(0) as usize, writer_waits.len(), "{style:?}: a lost update");
    writer_waits.sort_by(f64::total_cmp);
    Outcome {
        cycles_per_sec: cycles.len() as f64 / elapsed,
        writes: writer_waits.len(),
        writer_p99_ms: percentile(&writer_waits, 99.0),
        writer_max_ms: writer_waits.last().copied().unwrap_or(0.0),
    }
}

pub async fn run(sizes: &Sizes) -> (Section, Vec<Target>) {
    let clients = 16;
    let mut section = Section::new(
        "7. Read-write mix",
        "16 clients, each its own connection, loop acquire -> work -> release on one read-write \
         lock; 90 % of the cycles read (GET a counter), 10 % write (GET, SET counter+1; the \
         counter is checked: no update was lost). Redisson-style: its read/write Lua scripts, \
         retried on each message of redisson_rwlock:{name} or after the PTTL. Writer wait: from \
         the first attempt to holding the write lock.",
        &[
            "style",
            "cycles/s",
            "writes",
            "writer p99 wait ms",
            "writer max wait ms",
            "cycles/s vs WAIT",
        ],
    );
    let wait = measure(Style::Wait, clients, sizes.contention).await;
    let redisson = measure(Style::Redisson, clients, sizes.contention).await;
    for (style, o) in [(Style::Wait, &wait), (Style::Redisson, &redisson)] {
        section.row(vec![
            style.name().to_owned(),
            num(o.cycles_per_sec),
            o.writes.to_string(),
            num(o.writer_p99_ms),
            num(o.writer_max_ms),
            ratio(o.cycles_per_sec, wait.cycles_per_sec),
        ]);
    }
    let targets = vec![
        Target::at_least(
            "read-write mix cycles/s, WAIT / Redisson-style, 16 clients",
            wait.cycles_per_sec / redisson.cycles_per_sec.max(f64::MIN_POSITIVE),
            2.0,
        ),
        // Bounded writer waits: a writer queues once and readers that come after it wait
        // behind it; Redisson's writers retry against a stream of readers.
        Target::at_most(
            "writer p99 wait ms, WAIT / Redisson-style, 16 clients",
            wait.writer_p99_ms / redisson.writer_p99_ms.max(f64::MIN_POSITIVE),
            0.1,
        ),
    ];
    (section, targets)
}
