//! 3. Herd: many waiters on one lock; server commands processed per hand-off, WAIT vs pub/sub.
//! 4. Hand-off cost against queue length: server time per hand-off with few and many waiters.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use redis::Value;

use crate::report::{num, ratio, Section, Target};
use crate::util::{self, channel, Scripts};
use crate::Sizes;

const LOCK: &str = "herd";

/// Commands the server processed per hand-off while `waiters` clients each took the lock once,
/// waiting with WAIT (`pubsub == false`) or Redisson-style (`pubsub == true`).
async fn commands_per_handoff(waiters: usize, pubsub: bool) -> f64 {
    let server = Arc::new(util::server());
    let mut con = util::conn(&server).await;
    let scripts = Scripts::load(&mut con).await;
    util::call(&mut con, &["RLOCK.ACQUIRE", LOCK, "holder", "60000"]).await;
    let ready = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for id in 0..waiters {
        let server = Arc::clone(&server);
        let scripts = scripts.clone();
        let ready = Arc::clone(&ready);
        tasks.push(tokio::spawn(async move {
            let owner = format!("waiter-{id}");
            let mut con = util::conn(&server).await;
            if pubsub {
                let mut ps = server.client().get_async_pubsub().await.expect("pubsub");
                ps.subscribe(channel(LOCK)).await.expect("subscribe");
                let mut messages = ps.into_on_message();
                ready.fetch_add(1, Ordering::SeqCst);
                loop {
                    let pttl: Option<i64> = redis::cmd("EVALSHA")
                        .arg(&scripts.acquire).arg(1).arg(LOCK).arg(60_000).arg(&owner)
                        .query_async(&mut con).await.expect("acquire");
                    let Some(pttl) = pttl else { break };
                    let wait = Duration::from_millis(u64::try_from(pttl).unwrap_or(60_000).max(1));
                    tokio::select! {
                        _ = messages.next() => {}
                        () = tokio::time::sleep(wait) => {}
                    }
                }
                let _: Option<i64> = redis::cmd("EVALSHA")
                    .arg(&scripts.release).arg(2).arg(LOCK).arg(channel(LOCK)).arg(0).arg(60_000).arg(&owner)
                    .query_async(&mut con).await.expect("release");
            } else {
                let mut acquire = redis::cmd("RLOCK.ACQUIRE");
                acquire.arg(LOCK).arg(&owner).arg(60_000).arg("WAIT").arg(0);
                let wait = acquire.query_async::<Value>(&mut con);
                ready.fetch_add(1, Ordering::SeqCst);
                assert_eq!(wait.await.expect("acquire"), Value::Nil);
                let _: i64 = redis::cmd("RLOCK.RELEASE").arg(LOCK).arg(&owner)
                    .query_async(&mut con).await.expect("release");
            }
        }));
    }
    // Every waiter has tried once and waits (blocked in the server, or on its subscription).
    while ready.load(Ordering::SeqCst) < waiters as u64 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    if pubsub {
        let until = Instant::now() + Duration::from_secs(60);
        while util::info_num(&mut con, "stats", "total_commands_processed").await < (waiters + 3) as f64 {
            assert!(Instant::now() < until, "waiters never tried");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    } else {
        util::until_blocked(&mut con, waiters).await;
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    let before = util::info_num(&mut con, "stats", "total_commands_processed").await;
    util::call(&mut con, &["RLOCK.RELEASE", LOCK, "holder"]).await;
    for t in tasks {
        t.await.expect("waiter");
    }
    let after = util::info_num(&mut con, "stats", "total_commands_processed").await;
    // The first INFO is counted in `after`; the holder's release is part of the hand-offs.
    (after - before - 1.0) / waiters as f64
}

pub async fn run_herd(sizes: &Sizes) -> (Section, Vec<Target>) {
    let n = sizes.herd;
    let wait = commands_per_handoff(n, false).await;
    let pubsub = commands_per_handoff(n, true).await;
    let mut section = Section::new(
        "3. Herd",
        &format!(
            "{n} clients wait for one lock; each takes it once and releases it. Server commands \
             processed (INFO total_commands_processed) per hand-off, from the first release to \
             the last waiter served."
        ),
        &["waiters", "style", "commands per hand-off", "vs WAIT"],
    );
    section.row(vec![n.to_string(), "rlock WAIT".into(), num(wait), ratio(wait, wait)]);
    section.row(vec![n.to_string(), "Redisson-style pub/sub".into(), num(pubsub), ratio(pubsub, wait)]);
    let targets = vec![Target::at_most(&format!("commands per hand-off, {n} waiters, WAIT"), wait, 1.5)];
    (section, targets)
}

/// Server µs per hand-off (RLOCK.RELEASE, which hands off inside) and per enqueue (the
/// blocking RLOCK.ACQUIRE) with `waiters` clients queued at all times.
async fn handoff_cost(waiters: usize, handoffs: u64) -> (f64, f64) {
    let server = Arc::new(util::server());
    let mut con = util::conn(&server).await;
    util::call(&mut con, &["RLOCK.ACQUIRE", LOCK, "holder", "600000"]).await;
    let served = Arc::new(AtomicU64::new(0));
    let mut conns = Vec::with_capacity(waiters);
    for _ in 0..waiters {
        conns.push(util::conn(&server).await);
    }
    let tasks: Vec<_> = conns
        .into_iter()
        .enumerate()
        .map(|(id, mut c)| {
            let served = Arc::clone(&served);
            tokio::spawn(async move {
                let owner = format!("w{id}");
                loop {
                    let r: redis::RedisResult<Value> = redis::cmd("RLOCK.ACQUIRE")
                        .arg(LOCK).arg(&owner).arg(600_000).arg("WAIT").arg(0)
                        .query_async(&mut c).await;
                    if r.is_err() {
                        return; // the server is gone: the run is over
                    }
                    served.fetch_add(1, Ordering::SeqCst);
                    let r: redis::RedisResult<i64> =
                        redis::cmd("RLOCK.RELEASE").arg(LOCK).arg(&owner).query_async(&mut c).await;
                    if r.is_err() {
                        return;
                    }
                }
            })
        })
        .collect();
    util::until_blocked(&mut con, waiters).await;
    util::reset_stats(&mut con).await;
    util::call(&mut con, &["RLOCK.RELEASE", LOCK, "holder"]).await;
    let until = Instant::now() + Duration::from_secs(300);
    while served.load(Ordering::SeqCst) < handoffs {
        assert!(Instant::now() < until, "hand-offs stalled");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let release = util::usec_per_call(&mut con, "rlock.release").await;
    let acquire = util::usec_per_call(&mut con, "rlock.acquire").await;
    drop(con);
    for t in &tasks {
        t.abort();
    }
    drop(server);
    (release, acquire)
}

pub async fn run_queue_length(sizes: &Sizes) -> (Section, Vec<Target>) {
    let (small, large) = sizes.queues;
    let (small_release, small_acquire) = handoff_cost(small, sizes.handoffs).await;
    let (large_release, large_acquire) = handoff_cost(large, sizes.handoffs).await;
    let mut section = Section::new(
        "4. Hand-off cost against queue length",
        &format!(
            "Clients wait for one lock; each, once served, releases (which hands the lock to the \
             head of the queue inside RLOCK.RELEASE) and queues again, so the queue keeps its \
             length. Server µs per call over {} hand-offs.",
            sizes.handoffs
        ),
        &["waiters", "µs per hand-off (RELEASE)", "µs per enqueue (ACQUIRE WAIT)", "hand-off vs smallest"],
    );
    section.row(vec![small.to_string(), num(small_release), num(small_acquire), ratio(small_release, small_release)]);
    section.row(vec![large.to_string(), num(large_release), num(large_acquire), ratio(large_release, small_release)]);
    let targets = vec![Target::at_most(
        &format!("hand-off µs with {large} waiters / with {small}"),
        large_release / small_release,
        1.5,
    )];
    (section, targets)
}
