//! Section 3, herd: many waiters on one lock; server commands processed per hand-off, WAIT vs pub/sub.
//! Section 4, hand-off cost against queue length: server time per hand-off with few and many waiters.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::Value;

use crate::queue_loop::{handoff_cost, Parked, QueueCost};
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
    // Connections (and subscriptions) one after the other: a thousand at once would overflow
    // the server's listen backlog.
    let mut conns = Vec::with_capacity(waiters);
    for _ in 0..waiters {
        let sub =
            if pubsub { Some(util::subscription(&server, &channel(LOCK)).await) } else { None };
        conns.push((util::conn(&server).await, sub));
    }
    let mut tasks = Vec::new();
    for (id, (mut con, sub)) in conns.into_iter().enumerate() {
        let scripts = scripts.clone();
        let ready = Arc::clone(&ready);
        tasks.push(tokio::spawn(async move {
            let owner = format!("waiter-{id}");
            if let Some(ps) = sub {
                let mut messages = ps.into_on_message();
                ready.fetch_add(1, Ordering::SeqCst);
                util::redisson_acquire(&mut con, &scripts, LOCK, 60_000, &owner, &mut messages)
                    .await;
                util::redisson_release(&mut con, &scripts, LOCK, 60_000, &owner).await;
            } else {
                let mut acquire = redis::cmd("RLOCK.ACQUIRE");
                acquire.arg(LOCK).arg(&owner).arg(60_000).arg("WAIT").arg(0);
                let wait = acquire.query_async::<Value>(&mut con);
                ready.fetch_add(1, Ordering::SeqCst);
                assert_eq!(wait.await.expect("acquire"), Value::Nil);
                util::rlock_release(&mut con, LOCK, &owner).await;
            }
        }));
    }
    // Every waiter has tried once and waits (blocked in the server, or on its subscription).
    while ready.load(Ordering::SeqCst) < waiters as u64 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    if pubsub {
        let until = Instant::now() + Duration::from_secs(60);
        while util::info_num(&mut con, "stats", "total_commands_processed").await
            < (waiters + 3) as f64
        {
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
    section.row(vec![
        n.to_string(),
        "Redisson-style pub/sub".into(),
        num(pubsub),
        ratio(pubsub, wait),
    ]);
    let targets =
        vec![Target::at_most(&format!("commands per hand-off, {n} waiters, WAIT"), wait, 1.5)];
    (section, targets)
}

pub async fn run_queue_length(sizes: &Sizes) -> (Section, Vec<Target>) {
    let mut section = Section::new(
        "4. Hand-off cost against queue length",
        &format!(
            "Clients wait for one lock; each, once served, releases (RLOCK.RELEASE hands the lock \
             to the head of the queue inside the command) and queues again, so the queue keeps its \
             length. Server µs per call over {} hand-offs, and used_memory per waiting client \
             (its connection included). Baseline: the same loop with BLPOP (wait) and RPUSH (give \
             back) on a list. The two are not counted alike: RLOCK.RELEASE's µs include the \
             whole grant (the holder's hash written and replicated, the waiter unblocked), while \
             Redis serves a BLPOP waiter after RPUSH returns and adds that to BLPOP's µs; the \
             cycle column (give back + wait) compares like with like. Every client blocked by a \
             module holds two internal temporary clients (RedisModule_BlockClient, on every \
             server of the matrix), which is what makes an rlock waiter heavier than a BLPOP one \
             and its enqueue slower with many waiters; the hand-off itself does not depend on the \
             queue length. A '-' row stalled: the server served fewer \
             than 100 in 30 s, or needed over 2 minutes (Valkey 9.1.2's BLPOP with 10,000 \
             blocked clients crawls, with or without the module). {}",
            sizes.handoffs,
            crate::deadlock::NOTE
        ),
        &[
            "waiters",
            "style",
            "µs per hand-off",
            "µs per enqueue",
            "µs per cycle",
            "bytes per waiting client",
            "hand-off vs smallest",
        ],
    );
    let mut targets = Vec::new();
    if !crate::deadlock::only() {
        targets = queue_length_rows(sizes, &mut section).await;
    }
    targets.extend(crate::deadlock::rows(sizes, &mut section).await);
    if !crate::deadlock::only() {
        targets.extend(crate::floor::queue_rows(sizes, &mut section).await);
    }
    (section, targets)
}

/// The rows and targets of section 4 but the deadlock rows.
async fn queue_length_rows(sizes: &Sizes, section: &mut Section) -> Vec<Target> {
    let (small, large) = sizes.queues;
    let mut measured = Vec::new();
    for (name, blpop) in [("rlock WAIT", false), ("BLPOP / RPUSH", true)] {
        let few = handoff_cost(small, sizes.handoffs, blpop, Parked::No, None).await;
        let many = handoff_cost(large, sizes.handoffs, blpop, Parked::No, None).await;
        for (n, c) in [(small, &few), (large, &many)] {
            section.row(vec![
                n.to_string(),
                name.to_owned(),
                num(c.handoff),
                num(c.enqueue),
                num(c.handoff + c.enqueue),
                num(c.bytes_per_waiter),
                ratio(c.handoff, few.handoff),
            ]);
        }
        measured.push([few, many]);
    }
    let [[rlock_few, rlock_many], [blpop_few, blpop_many]] =
        <[[QueueCost; 2]; 2]>::try_from(measured).unwrap_or_else(|_| unreachable!("two styles"));
    let mut targets = vec![Target::at_most(
        &format!("hand-off µs with {large} waiters / with {small}"),
        rlock_many.handoff / rlock_few.handoff,
        1.5,
    )];
    for (n, rlock, blpop) in [(small, &rlock_few, &blpop_few), (large, &rlock_many, &blpop_many)] {
        targets.push(Target::at_most(
            &format!("hand-off µs / BLPOP-RPUSH µs, {n} waiters"),
            rlock.handoff / blpop.handoff,
            2.0,
        ));
        targets.push(Target::at_most(
            &format!("enqueue µs / BLPOP enqueue µs, {n} waiters"),
            rlock.enqueue / blpop.enqueue,
            1.5,
        ));
    }
    for (n, rlock, blpop) in [(small, &rlock_few, &blpop_few), (large, &rlock_many, &blpop_many)] {
        targets.push(Target::at_most(
            &format!("bytes per waiting client / BLPOP waiter, {n} waiters"),
            rlock.bytes_per_waiter / blpop.bytes_per_waiter,
            1.25,
        ));
    }
    targets
}
