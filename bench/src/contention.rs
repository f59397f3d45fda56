//! Section 2, contention: N clients each loop acquire -> non-atomic increment -> release on one lock,
//! with (a) server-side WAIT, (b) a Redisson-style client (subscribe to the unlock channel,
//! retry the Lua acquire on each message or after the PTTL), (c) SET NX with 1 ms polling.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::Value;
use rlock_tests_integration::Server;

use crate::report::{num, ratio, Section, Target};
use crate::util::{self, channel, percentile, Scripts};
use crate::Sizes;

const LOCK: &str = "contended";
const COUNTER: &str = "counter";
const POLL: Duration = Duration::from_millis(1);

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Style {
    Wait,
    Redisson,
    SetNxPoll,
}

impl Style {
    const fn name(self) -> &'static str {
        match self {
            Self::Wait => "rlock WAIT",
            Self::Redisson => "Redisson-style pub/sub",
            Self::SetNxPoll => "SET NX + 1 ms polling",
        }
    }
}

pub struct Outcome {
    pub handoffs_per_sec: f64,
    pub cycles_per_sec: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
}

/// Shared across the clients of one run.
struct Shared {
    stop_at: Instant,
    last_holder: AtomicU64,
    handoffs: AtomicU64,
}

async fn client(
    server: Arc<Server>,
    style: Style,
    id: u64,
    shared: Arc<Shared>,
    scripts: Scripts,
) -> Vec<f64> {
    let owner = format!("client-{id}");
    let mut con = util::conn(&server).await;
    let mut messages = match style {
        Style::Redisson => {
            Some(util::subscription(&server, &channel(LOCK)).await.into_on_message())
        }
        _ => None,
    };
    let mut latencies = Vec::new();
    while Instant::now() < shared.stop_at {
        let started = Instant::now();
        match style {
            Style::Wait => {
                let reply: Value = redis::cmd("RLOCK.ACQUIRE")
                    .arg(LOCK)
                    .arg(&owner)
                    .arg(30_000)
                    .arg("WAIT")
                    .arg(0)
                    .query_async(&mut con)
                    .await
                    .expect("acquire");
                assert_eq!(reply, Value::Nil);
            }
            Style::Redisson => {
                let stream = messages.as_mut().expect("subscribed");
                util::redisson_acquire(&mut con, &scripts, LOCK, 30_000, &owner, stream).await;
            }
            Style::SetNxPoll => loop {
                let ok: Option<String> = redis::cmd("SET")
                    .arg(LOCK)
                    .arg(&owner)
                    .arg("NX")
                    .arg("PX")
                    .arg(30_000)
                    .query_async(&mut con)
                    .await
                    .expect("set nx");
                if ok.is_some() {
                    break;
                }
                tokio::time::sleep(POLL).await;
            },
        }
        latencies.push(started.elapsed().as_secs_f64() * 1000.0);
        if shared.last_holder.swap(id, Ordering::Relaxed) != id {
            shared.handoffs.fetch_add(1, Ordering::Relaxed);
        }
        util::increment(&mut con, COUNTER).await;
        match style {
            Style::Wait => {
                util::rlock_release(&mut con, LOCK, &owner).await;
            }
            Style::Redisson => {
                util::redisson_release(&mut con, &scripts, LOCK, 30_000, &owner).await;
            }
            Style::SetNxPoll => {
                let _: i64 = redis::cmd("EVALSHA")
                    .arg(&scripts.cad)
                    .arg(1)
                    .arg(LOCK)
                    .arg(&owner)
                    .query_async(&mut con)
                    .await
                    .expect("compare and delete");
            }
        }
    }
    latencies
}

pub async fn measure(style: Style, clients: usize, duration: Duration) -> Outcome {
    let server = Arc::new(util::server());
    let mut con = util::conn(&server).await;
    let scripts = Scripts::load(&mut con).await;
    // Connections and subscriptions first, then the clock starts.
    let shared = Arc::new(Shared {
        stop_at: Instant::now() + duration + Duration::from_millis(200 + 5 * clients as u64),
        last_holder: AtomicU64::new(u64::MAX),
        handoffs: AtomicU64::new(0),
    });
    let started = Instant::now();
    let tasks: Vec<_> = (0..clients as u64)
        .map(|id| {
            tokio::spawn(client(
                Arc::clone(&server),
                style,
                id,
                Arc::clone(&shared),
                scripts.clone(),
            ))
        })
        .collect();
    let mut latencies = Vec::new();
    for t in tasks {
        latencies.extend(t.await.expect("client"));
    }
    let elapsed = started.elapsed().as_secs_f64();
    let counter: i64 = redis::cmd("GET").arg(COUNTER).query_async(&mut con).await.expect("GET");
    let cycles = latencies.len() as u64;
    assert_eq!(counter as u64, cycles, "{style:?}: lost updates under the lock");
    latencies.sort_by(f64::total_cmp);
    Outcome {
        handoffs_per_sec: shared.handoffs.load(Ordering::Relaxed) as f64 / elapsed,
        cycles_per_sec: cycles as f64 / elapsed,
        p50_ms: percentile(&latencies, 50.0),
        p99_ms: percentile(&latencies, 99.0),
    }
}

pub async fn run(sizes: &Sizes) -> (Section, Vec<Target>) {
    let mut section = Section::new(
        "2. Contention",
        "N clients, each its own connection, loop acquire -> GET counter, SET counter+1 -> \
         release on one lock. A hand-off is an acquisition by a different client than the \
         previous holder (a client re-taking the lock it just released is not one). Acquire \
         latency runs from the first attempt to holding the lock. The counter is checked: \
         no update was lost in any run.",
        &[
            "clients",
            "style",
            "hand-offs/s",
            "acquisitions/s",
            "p50 acquire ms",
            "p99 acquire ms",
            "hand-offs/s vs WAIT",
        ],
    );
    let mut targets = Vec::new();
    for clients in [8usize, 64] {
        let mut results = Vec::new();
        for style in [Style::Wait, Style::Redisson, Style::SetNxPoll] {
            results.push((style, measure(style, clients, sizes.contention).await));
        }
        let wait = results[0].1.handoffs_per_sec;
        for (style, o) in &results {
            section.row(vec![
                clients.to_string(),
                style.name().to_owned(),
                num(o.handoffs_per_sec),
                num(o.cycles_per_sec),
                num(o.p50_ms),
                num(o.p99_ms),
                ratio(o.handoffs_per_sec, wait),
            ]);
        }
        let redisson = results[1].1.handoffs_per_sec;
        targets.push(Target::at_least(
            &format!("hand-offs/s, WAIT / Redisson-style, {clients} clients"),
            wait / redisson,
            2.0,
        ));
    }
    (section, targets)
}
