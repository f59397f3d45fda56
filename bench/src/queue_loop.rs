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

/// The lock (or list) section 4's loops queue on.
const QUEUE_LOCK: &str = "herd";

/// Extra blocked clients beside the loop's waiters (section 4's deadlock rows, `deadlock.rs`).
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Parked {
    /// None.
    No,
    /// One per waiter: a client waiting for a lock `other:<i>` of its own (held by `keeper`), as
    /// owner `p<i>`, who holds nothing: an enqueue's deadlock search finds that the lock's
    /// holder waits nowhere.
    Idle,
    /// The same clients, each waiting as the owner `w<i>` of a loop waiter: whichever loop
    /// owner holds the lock also waits elsewhere, so every enqueue's deadlock search follows
    /// the holder to `other:<i>` and its holder `keeper` (two hops).
    Waiting,
}

/// Section 4's loop ([`QueueLoop`]) on rlock (RLOCK.ACQUIRE ... WAIT, and RLOCK.RELEASE, which
/// hands off inside) or, when `blpop`, on a list (BLPOP, and RPUSH, which serves the head),
/// with `waiters` clients queued at all times.
/// `parked`: the extra blocked clients (see [`Parked`]).
/// `module`: the module to load instead of this checkout's.
pub async fn handoff_cost(
    waiters: usize,
    handoffs: u64,
    blpop: bool,
    parked: Parked,
    module: Option<&str>,
) -> QueueCost {
    let server = Arc::new(util::server_with(module));
    let mut con = util::conn(&server).await;
    if !blpop {
        util::call(&mut con, &["RLOCK.ACQUIRE", QUEUE_LOCK, "holder", "600000"]).await;
    }
    let mode = parked;
    let mut parked = Vec::new();
    if mode != Parked::No {
        for id in 0..waiters {
            let owner = if mode == Parked::Waiting { format!("w{id}") } else { format!("p{id}") };
            let other = format!("other:{id}");
            util::call(&mut con, &["RLOCK.ACQUIRE", &other, "keeper", "600000"]).await;
            let mut c = util::conn(&server).await;
            parked.push(tokio::spawn(async move {
                let wait = ["RLOCK.ACQUIRE", &other, &owner, "600000", "WAIT", "0"];
                let _: Result<Value, _> =
                    redis::cmd(wait[0]).arg(&wait[1..]).query_async(&mut c).await;
            }));
        }
        util::until_blocked(&mut con, waiters).await;
    }
    let commands: Arc<dyn Fn(usize) -> (Cmd, Cmd) + Send + Sync> = if blpop {
        Arc::new(|_| {
            let wait = redis::cmd("BLPOP").arg(QUEUE_LOCK).arg(0).clone();
            (wait, redis::cmd("RPUSH").arg(QUEUE_LOCK).arg("token").clone())
        })
    } else {
        Arc::new(|id| {
            let owner = format!("w{id}");
            let wait = ["RLOCK.ACQUIRE", QUEUE_LOCK, &owner, "600000", "WAIT", "0"];
            let release = redis::cmd("RLOCK.RELEASE").arg(QUEUE_LOCK).arg(&owner).clone();
            (redis::cmd(wait[0]).arg(&wait[1..]).clone(), release)
        })
    };
    let (start, stats) = if blpop {
        (vec!["RPUSH", QUEUE_LOCK, "token"], ("rpush", "blpop"))
    } else {
        (vec!["RLOCK.RELEASE", QUEUE_LOCK, "holder"], ("rlock.release", "rlock.acquire"))
    };
    let queue = QueueLoop {
        name: if blpop { "BLPOP" } else { "rlock WAIT" }.to_owned(),
        waiters,
        handoffs,
        commands,
        start: start.into_iter().map(str::to_owned).collect(),
        stats: (stats.0.to_owned(), stats.1.to_owned()),
        also_blocked: parked.len(),
        enough_after: None,
    };
    let cost = queue.measure(&server, &mut con).await;
    drop(con);
    for t in &parked {
        t.abort();
    }
    drop(server);
    cost
}
