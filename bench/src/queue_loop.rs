//! The loop sections 4 (rlock, BLPOP) and the floor module's rows measure a queue with: clients
//! wait at all times; each, once served, gives back (releases, pushes, wakes the next) and waits
//! again, so the queue keeps its length.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;
use redis::{Cmd, Value};
use rlock_tests_integration::Server;

use crate::util;

/// Per hand-off and per enqueue server µs, and used_memory per waiting client.
pub struct QueueCost {
    pub handoff: f64,
    pub enqueue: f64,
    pub bytes_per_waiter: f64,
}

impl QueueCost {
    /// What a loop that did not run to its end reports.
    const STALLED: Self = Self { handoff: f64::NAN, enqueue: f64::NAN, bytes_per_waiter: f64::NAN };
}

/// One loop: `waiters` clients; waiter `id` waits with `commands(id).0` and gives back with
/// `commands(id).1`; `start` (on the measuring connection) serves the first.
pub struct QueueLoop {
    /// What the loop is, for its messages.
    pub name: String,
    pub waiters: usize,
    /// Hand-offs to measure over.
    pub handoffs: u64,
    pub commands: Arc<dyn Fn(usize) -> (Cmd, Cmd) + Send + Sync>,
    pub start: Vec<String>,
    /// The give back's and the wait's names in `INFO commandstats`.
    pub stats: (String, String),
    /// Clients blocked besides the loop's (already blocked when it starts).
    pub also_blocked: usize,
    /// Measure what was served by then, once at least 100 were (else every hand-off).
    pub enough_after: Option<Duration>,
}

impl QueueLoop {
    /// Runs the loop on `server` (`con`: a connection of it) and measures it. A server that
    /// serves fewer than 100 in 30 s, or needs more than 2 minutes in all, is reported as stalled
    /// (NaN figures; Valkey 9.1.2 serves BLPOP with thousands of blocked clients at a few dozen
    /// per second).
    pub async fn measure(&self, server: &Server, con: &mut MultiplexedConnection) -> QueueCost {
        let served = Arc::new(AtomicU64::new(0));
        let memory_before = util::info_num(con, "memory", "used_memory").await;
        let mut conns = Vec::with_capacity(self.waiters);
        for _ in 0..self.waiters {
            conns.push(util::conn(server).await);
        }
        let tasks: Vec<_> = conns
            .into_iter()
            .enumerate()
            .map(|(id, mut c)| {
                let served = Arc::clone(&served);
                let (wait, give_back) = (self.commands)(id);
                tokio::spawn(async move {
                    loop {
                        if wait.query_async::<Value>(&mut c).await.is_err() {
                            return; // the server is gone: the run is over
                        }
                        served.fetch_add(1, Ordering::SeqCst);
                        if give_back.query_async::<Value>(&mut c).await.is_err() {
                            return;
                        }
                    }
                })
            })
            .collect();
        util::until_blocked(con, self.waiters + self.also_blocked).await;
        let memory_blocked = util::info_num(con, "memory", "used_memory").await;
        util::reset_stats(con).await;
        let start: Vec<&str> = self.start.iter().map(String::as_str).collect();
        util::call(con, &start).await;
        let stalled = self.run_until_served(&served).await;
        let cost = if stalled {
            QueueCost::STALLED
        } else {
            QueueCost {
                handoff: util::usec_per_call(con, &self.stats.0).await,
                enqueue: util::usec_per_call(con, &self.stats.1).await,
                bytes_per_waiter: (memory_blocked - memory_before) / self.waiters as f64,
            }
        };
        for t in &tasks {
            t.abort();
        }
        cost
    }

    /// Waits until `served` reached the loop's hand-offs (or its `enough_after`); whether it
    /// stalled instead.
    async fn run_until_served(&self, served: &AtomicU64) -> bool {
        let started = Instant::now();
        let (mut last, mut last_progress) = (0, Instant::now());
        while served.load(Ordering::SeqCst) < self.handoffs {
            let now = served.load(Ordering::SeqCst);
            if self.enough_after.is_some_and(|d| started.elapsed() > d) && now >= 100 {
                eprintln!(
                    "  {}: {now} of {} hand-offs in the time allowed",
                    self.name, self.handoffs
                );
                return false;
            }
            if now > last + 100 {
                (last, last_progress) = (now, Instant::now());
            }
            if last_progress.elapsed() > Duration::from_secs(30)
                || started.elapsed() > Duration::from_secs(120)
            {
                eprintln!("  {}: hand-offs stalled at {now} of {}", self.name, self.handoffs);
                return true;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        false
    }
}
