//! The Rust client against a model of what its caller may believe: a seeded random run over
//! every kind (locks, both sides of read-write locks, counted and leased permits, a latch,
//! session locks), owners (several handles of one owner, nested holds with different leases),
//! MultiLock and RedLock over three servers, acquires dropped at random awaits (timeouts) or
//! left waiting and aborted later, releases dropped half-way, `CLIENT KILL` of the client's
//! connections and of a session's, and the main server stalled (SIGSTOP, up to 800 ms).
//!
//! After every step, against the servers (`src/client_model/`):
//! - a guard that says held (not lost, deadline ahead) is held on the server for its owner (or
//!   its permit ids), with a lease ending no earlier than the guard's `valid_until`, and a
//!   `MultiGuard` that says held has its locks on enough servers;
//! - no two guards of different owners believe they hold one lock (MultiLock and RedLock guards
//!   count as owners of their own);
//! - counted permits are never more than the total less what the caller took; a latch never
//!   reports open (a wait returning `true`) while its count is above zero, and its count is
//!   what the caller's count-downs left;
//! - a release that says `NotHeld` comes only for a guard that no longer said held.
//!
//! Every few seconds and at the end, a settle: every guard released, every waiting acquire
//! given time to return (a wait must end once nobody holds), then, within a bound, nothing is
//! held that no guard knows of (a lost guard's hold may stay until its lease ends), permits are
//! conserved and nobody waits in the server.
//!
//! A session guard whose session's connection was closed is given a moment to learn of it
//! before a contradiction counts (the server ends the holds first).
//!
//! Across failovers (`what_a_caller_believes_holds_across_sentinel_failovers`: server 0 is a
//! Sentinel group, a master and its replica, failed over with `SENTINEL FAILOVER` while guards,
//! watchdogs, and timed and untimed waits are live; every check reads the master the Sentinel
//! names now). What the caller may believe there, with the group's client asking the replica to
//! acknowledge each grant (`Options::replica_ack(1, ..)`; without it replication is
//! asynchronous and a grant made just before a failover may be gone on the new master, as
//! docs/clients.md says):
//! - a guard that says held is held on the new master, for its owner, with a lease no shorter
//!   than its `valid_until` (or the guard says lost);
//! - a timed wait returns by its deadline (plus [`DEADLINE_SLACK`]), wherever it is served;
//!   an untimed one follows to the new master and is granted there once nobody holds;
//! - counted permits are conserved, and after a settle nothing is held that no guard knows of
//!   (a release or cancellation sent while the old master still answers, before the Sentinel
//!   demotes it, must reach the new master);
//! - the run's own writes (the checker gives counted permits back) are made to reach the
//!   replica before each failover (a fence and `WAIT`), so a failover never undoes them.
//!
//! Environment: `RLOCK_CLIENT_MODEL_SECS` (default 15), `RLOCK_CLIENT_MODEL_FAILOVERS` (the
//! failover run's failovers, evenly spread; default 2, or one per 30 s in longer runs), `RLOCK_CLIENT_MODEL_SEED` (replay: the
//! seed is printed and named in every failure; timing makes a replay close, not exact),
//! `RLOCK_CLIENT_MODEL_SKIP` (moves left out, comma-separated: see [`MOVES`]; `owners` also
//! leaves out every owner's handle),
//! `RLOCK_CLIENT_MODEL_KEEP_GOING=1` (report every violation at the end instead of stopping at
//! the first). A failure prints the steps on the keys involved (and the disturbances between
//! them) and writes every step to a file it names.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use redis::Connection;
use rlock_client::{
    Error, LeasedSemaphore, Lock, LockClient, MultiLock, Options, Owner, RedLock, Session,
};
use rlock_tests_integration::client_model::{
    check, model_failovers, model_secs, model_seed, view, Belief, Exempt, Group, Held, Journal,
    Target, Violation,
};
use rlock_tests_integration::{blocked_clients, Rng, Server, SENTINEL_MASTER};
use tokio::task::JoinHandle;
use tokio::time::{sleep, timeout, Instant};

const MAIN: usize = 0;
const L0: &str = "cm:l0";
const L1: &str = "cm:l1";
const RW: &str = "cm:rw";
const COUNTED: &str = "cm:cnt";
const LEASED: &str = "cm:lsd";
const LATCH: &str = "cm:latch";
const RED: &str = "cm:red";
const PERMITS: i64 = 4;
const WATCHDOG: Duration = Duration::from_secs(6);
const LEASES: [Option<Duration>; 5] = [
    None,
    Some(Duration::from_millis(800)),
    Some(Duration::from_millis(1500)),
    Some(Duration::from_secs(3)),
    Some(Duration::from_secs(12)),
];
/// The longest lease a hold of the run has (a lost guard's hold may stay that long).
const LONGEST_LEASE: Duration = Duration::from_secs(12);
/// How long releases and cancellations may take to reach the server after a settle began.
const SETTLE: Duration = Duration::from_secs(6);
/// How long a waiting acquire may take to return once every guard is released (a lost hold
/// may keep the lock until its lease ends).
const DRAIN: Duration = Duration::from_secs(25);
/// How long a session guard may take to learn that its session's connection closed.
const SESSION_GRACE: Duration = Duration::from_secs(3);
const MAX_PENDING: usize = 6;
/// How long past its deadline a timed wait may still be running (the replica acknowledgement
/// of a grant made at the deadline, a stall, a retry's pause, a failover's switch).
const DEADLINE_SLACK: Duration = Duration::from_secs(5);
/// The Sentinel group's client: a grant is reported only once the replica has it.
const REPLICA_ACK: (u32, Duration) = (1, Duration::from_secs(2));
/// Seconds between settles.
const SETTLE_EVERY: Duration = Duration::from_secs(7);

/// The moves and their weights.
const MOVES: [(&str, usize); 16] = [
    ("lock", 30),
    ("owner-nested", 6),
    ("owner-multi", 3),
    ("multi", 6),
    ("redlock", 3),
    ("leased", 8),
    ("counted", 6),
    ("counted-release", 3),
    ("latch", 6),
    ("release", 22),
    ("sleep", 5),
    ("kill", 3),
    ("stall", 3),
    ("session", 3),
    ("abort", 3),
    ("settle", 1),
];

/// What an acquire hands over.
enum Got {
    Guard(Held),
    Counted(u64),
}

type Acquire = Pin<Box<dyn Future<Output = Result<Got, Error>> + Send>>;

/// How an acquire is run.
#[derive(Debug, Clone, Copy)]
enum Mode {
    /// Awaited to its end.
    Inline,
    /// Dropped if it has not ended after this long.
    Cancel(Duration),
    /// Left to run in a task; collected (or aborted) at a later step.
    Pending,
}

/// A lock handle the run keeps (clones re-enter each other's holds).
#[derive(Clone)]
struct Handle {
    name: String,
    lock: Lock,
    target: Target,
    /// The session number it belongs to, if any.
    session: Option<usize>,
}

struct Pending {
    label: String,
    /// When a timed wait must have returned by (its deadline and [`DEADLINE_SLACK`]).
    due: Option<Instant>,
    target: Option<Target>,
    session: bool,
    /// Whether it waits without a deadline.
    untimed: bool,
    started: Instant,
    task: JoinHandle<Result<Got, Error>>,
}

struct OpenSession {
    n: usize,
    session: Session,
    leased: LeasedSemaphore,
}

/// Whether an untimed acquire may end with `e` (docs/clients.md): its session closed, the
/// server refused the wait itself (a deadlock, an upgrade), or a grant was not acknowledged
/// (given back). Never a transport error or a failover's refusal: a wait whose connection fails
/// (`CLIENT KILL`, a failover) is sent again until granted; and `TimedOut` only when a stall
/// overlapped it (the server did not answer in time, as `Error::TimedOut` says).
const fn untimed_may_end_with(e: &Error) -> bool {
    matches!(
        e,
        Error::SessionClosed
            | Error::Deadlock { .. }
            | Error::UpgradeRefused
            | Error::NotReplicated { .. }
            | Error::NotPersisted { .. }
    )
}

fn lease_text(lease: Option<Duration>) -> String {
    lease.map_or_else(|| "watchdog".to_owned(), |l| format!("{} ms", l.as_millis()))
}

fn key(server: usize, key: &str) -> String {
    format!("{server}/{key}")
}

fn lock_target(server: usize, name: &str) -> Target {
    Target::Lock { server, key: name.to_owned() }
}

struct Run {
    seed: u64,
    rng: Rng,
    step: usize,
    servers: Vec<Arc<Server>>,
    cons: Vec<Connection>,
    clients: Vec<LockClient>,
    owners: Vec<Owner>,
    handles: Vec<Handle>,
    sessions: Vec<OpenSession>,
    next_session: usize,
    beliefs: Vec<Belief>,
    next_id: usize,
    pending: Vec<Pending>,
    counted_held: u64,
    /// The latch's count as far as the caller knows: at least `.0`, at most `.1`.
    latch: (u64, u64),
    exempt: Exempt,
    journal: Journal,
    stall: Option<std::thread::JoinHandle<()>>,
    violations: Vec<(usize, Violation)>,
    keep_going: bool,
    moves: Vec<(&'static str, usize)>,
    /// Owners' handles among the handles (`RLOCK_CLIENT_MODEL_SKIP=owners`: none).
    with_owners: bool,
    stats: BTreeMap<String, usize>,
    /// The wait of the acquire [`Run::pick_mode`] chose last (a pending one's deadline).
    last_wait: Option<Duration>,
    /// Server [`MAIN`] as a Sentinel group, failed over `failovers` times in the run.
    group: Option<Group>,
    failovers: usize,
    /// When the last stall of server [`MAIN`] ends (an untimed acquire it overlapped may end
    /// with `TimedOut`: the server did not answer in time).
    stalled_until: Option<Instant>,
}

impl Run {
    fn note(&mut self, keys: &[String], text: String) {
        self.journal.note(self.step, keys, text);
    }

    fn count(&mut self, what: &str) {
        *self.stats.entry(what.to_owned()).or_default() += 1;
    }

    fn pick_move(&mut self) -> &'static str {
        let total: usize = self.moves.iter().map(|(_, w)| w).sum();
        let mut r = self.rng.below(total);
        for (name, w) in &self.moves {
            if r < *w {
                return name;
            }
            r -= w;
        }
        unreachable!()
    }

    fn pick_mode(&mut self, untimed_ok: bool) -> (Mode, Option<Duration>) {
        let (mode, wait) = self.pick_mode_wait(untimed_ok);
        self.last_wait = wait;
        (mode, wait)
    }

    fn pick_mode_wait(&mut self, untimed_ok: bool) -> (Mode, Option<Duration>) {
        match self.rng.below(10) {
            0..=3 => (Mode::Inline, Some(Duration::ZERO)),
            4..=5 => (Mode::Inline, Some(Duration::from_millis(self.rng.below(300) as u64))),
            6..=7 => {
                let after = if self.rng.below(2) == 0 {
                    Duration::from_micros(self.rng.below(5_000) as u64)
                } else {
                    Duration::from_millis(self.rng.below(400) as u64)
                };
                let wait = if self.rng.below(2) == 0 && untimed_ok {
                    None
                } else {
                    Some(Duration::from_millis(300))
                };
                (Mode::Cancel(after), wait)
            }
            _ if self.pending.len() >= MAX_PENDING => {
                (Mode::Cancel(Duration::from_millis(300)), Some(Duration::from_millis(200)))
            }
            _ => {
                let wait = if self.rng.below(2) == 0 && untimed_ok {
                    None
                } else {
                    Some(Duration::from_millis(self.rng.below(3000) as u64))
                };
                (Mode::Pending, wait)
            }
        }
    }

    async fn acquire(
        &mut self,
        label: String,
        target: Option<Target>,
        session: bool,
        fut: Acquire,
        mode: Mode,
    ) {
        // Inline acquires are tries or short timed waits (the moves' own tries, too).
        let untimed = !matches!(mode, Mode::Inline) && self.last_wait.is_none();
        let started = Instant::now();
        match mode {
            Mode::Inline => {
                let got = fut.await;
                self.got(&label, target, session, (untimed, started), got).await;
            }
            Mode::Cancel(after) => match timeout(after, fut).await {
                Ok(got) => self.got(&label, target, session, (untimed, started), got).await,
                Err(_) => {
                    self.count("dropped");
                    let keys = target.as_ref().map(Target::keys).unwrap_or_default();
                    self.note(&keys, format!("{label}: dropped after {after:?}"));
                }
            },
            Mode::Pending => {
                let keys = target.as_ref().map(Target::keys).unwrap_or_default();
                self.note(&keys, format!("{label}: started, left waiting"));
                let due = self.last_wait.map(|w| Instant::now() + w + DEADLINE_SLACK);
                let task = tokio::spawn(fut);
                let p = Pending { label, due, target, session, untimed, started, task };
                self.pending.push(p);
            }
        }
    }

    async fn got(
        &mut self,
        label: &str,
        target: Option<Target>,
        session: bool,
        (untimed, started): (bool, Instant),
        got: Result<Got, Error>,
    ) {
        let keys = target.as_ref().map(Target::keys).unwrap_or_default();
        match got {
            Ok(Got::Guard(held)) => {
                self.count("granted");
                let id = self.next_id;
                self.next_id += 1;
                let target = target.expect("a guard's target");
                let until = held
                    .valid_until()
                    .map(|u| {
                        format!(
                            " valid {} ms",
                            u.saturating_duration_since(Instant::now()).as_millis()
                        )
                    })
                    .unwrap_or_default();
                let owner = held.owner();
                let ids = held.ids();
                self.note(&keys, format!("{label}: granted g{id} owner {owner:?}{until}"));
                self.beliefs.push(Belief {
                    id,
                    target,
                    held,
                    owner,
                    ids,
                    session,
                    lost_seen: None,
                    flagged: false,
                });
            }
            Ok(Got::Counted(n)) => {
                self.count("granted");
                self.counted_held += n;
                let held = self.counted_held;
                self.note(&[key(MAIN, COUNTED)], format!("{label}: granted ({held} held)"));
            }
            Err(e) => {
                let text = e.to_string();
                let kind: String = text.chars().take(40).collect();
                self.count(&format!("error: {kind}"));
                self.note(&keys, format!("{label}: {text}"));
                let stalled = self.stalled_until.is_some_and(|end| end > started);
                let timed_out = stalled && matches!(e, Error::TimedOut);
                if untimed && !untimed_may_end_with(&e) && !timed_out {
                    let text = format!("{label}: an untimed wait ended with {e:?}");
                    let v = Violation { beliefs: Vec::new(), keys, session, text };
                    self.violation(v).await;
                }
            }
        }
    }

    /// A lock, or a side of a read-write lock, through a kept handle or a fresh one.
    async fn lock_move(&mut self) {
        let mut handle = self.handles[self.rng.below(self.handles.len())].clone();
        if self.rng.below(6) == 0 && handle.session.is_none() {
            if let Target::Lock { server, key: name } = &handle.target {
                let fresh = if handle.name.starts_with('o') && *server == MAIN {
                    let o = self.rng.below(self.owners.len());
                    (format!("o{o}.fresh:{name}"), self.owners[o].lock(name))
                } else {
                    (format!("fresh:{server}/{name}"), self.clients[*server].lock(name))
                };
                (handle.name, handle.lock) = fresh;
            }
        }
        let lease = LEASES[self.rng.below(LEASES.len())];
        let (mode, wait) = self.pick_mode(true);
        let lock = handle.lock.clone();
        let label = format!(
            "{}.{}(wait {wait:?}, lease {}) [{mode:?}]",
            handle.name,
            if wait.is_some() { "try_acquire" } else { "acquire" },
            lease_text(lease)
        );
        let fut: Acquire = Box::pin(async move {
            let guard = match wait {
                Some(wait) => lock.try_acquire(wait, lease).await?,
                None => lock.acquire(lease).await?,
            };
            Ok(Got::Guard(Held::Lock(guard)))
        });
        self.acquire(label, Some(handle.target), handle.session.is_some(), fut, mode).await;
    }

    /// An owner's nested work: a hold through one handle, then another handle of the same
    /// owner taking the same lock with another lease (kept, released at once, or dropped).
    async fn owner_nested_move(&mut self) {
        let o = self.rng.below(self.owners.len());
        // A lock, or a read-write lock's read side (two read holds of one owner: one lease key
        // each, and a renewal of the owner's reads renews them all).
        let (name, read) = match self.rng.below(3) {
            0 => (L0, false),
            1 => (L1, false),
            _ => (RW, true),
        };
        let target = if read {
            Target::Read { server: MAIN, key: name.to_owned() }
        } else {
            lock_target(MAIN, name)
        };
        let handle = |owner: &Owner| {
            if read {
                owner.rw_lock(name).read().clone()
            } else {
                owner.lock(name)
            }
        };
        for part in ["outer", "inner"] {
            let lease = LEASES[self.rng.below(LEASES.len())];
            let lock = handle(&self.owners[o]);
            let label = format!("o{o}.nested-{part}:{name}.try_acquire(0, {})", lease_text(lease));
            let fut: Acquire = Box::pin(async move {
                Ok(Got::Guard(Held::Lock(lock.try_acquire(Duration::ZERO, lease).await?)))
            });
            self.acquire(label, Some(target.clone()), false, fut, Mode::Inline).await;
        }
        if self.rng.below(2) == 0 {
            if let Some(i) = self.beliefs.len().checked_sub(1) {
                let label = self.beliefs[i].id;
                if self.beliefs[i].owner == self.owners[o].id() {
                    self.release_at(i, &format!("nested inner g{label}")).await;
                }
            }
        }
    }

    /// An owner's MultiLock over its own handle with a short lease, the lease maybe let lapse,
    /// the owner taking the lock again through another handle, then the MultiLock's guard
    /// released or dropped.
    async fn owner_multi_move(&mut self) {
        let o = self.rng.below(self.owners.len());
        let name = if self.rng.below(2) == 0 { L0 } else { L1 };
        let target = lock_target(MAIN, name);
        let multi = MultiLock::new(vec![self.owners[o].lock(name)]);
        let lease = Some(Duration::from_millis(800));
        let label = format!("o{o}.multi[{name}].try_acquire(0, 800 ms)");
        let fut: Acquire = Box::pin(async move {
            Ok(Got::Guard(Held::Multi(multi.try_acquire(Duration::ZERO, lease).await?)))
        });
        let parts = vec![(MAIN, name.to_owned())];
        let multi_target = Target::Multi { parts, quorum: 1 };
        self.acquire(label, Some(multi_target.clone()), false, fut, Mode::Inline).await;
        let Some(multi_id) = self.beliefs.last().filter(|b| b.target == multi_target).map(|b| b.id)
        else {
            return;
        };
        if self.rng.below(2) == 0 {
            self.note(&target.keys(), "sleep 900 ms".to_owned());
            sleep(Duration::from_millis(900)).await;
        }
        let lock = self.owners[o].lock(name);
        let lease = LEASES[self.rng.below(LEASES.len())];
        let label = format!("o{o}.after-multi:{name}.try_acquire(0, {})", lease_text(lease));
        let fut: Acquire = Box::pin(async move {
            Ok(Got::Guard(Held::Lock(lock.try_acquire(Duration::ZERO, lease).await?)))
        });
        self.acquire(label, Some(target), false, fut, Mode::Inline).await;
        if let Some(i) = self.beliefs.iter().position(|b| b.id == multi_id) {
            self.release_at(i, "owner's multi").await;
        }
    }

    /// Leased permits, through the client or a session.
    async fn leased_move(&mut self) {
        let (sem, session, who) = match self.sessions.len() {
            n if n > 0 && self.rng.below(3) == 0 => {
                let s = &self.sessions[self.rng.below(n)];
                (s.leased.clone(), true, format!("s{}", s.n))
            }
            _ => (self.clients[MAIN].leased_semaphore(LEASED), false, "client".to_owned()),
        };
        let n = 1 + self.rng.below(2) as u64;
        let lease = LEASES[self.rng.below(LEASES.len())];
        let (mode, wait) = self.pick_mode(true);
        let label =
            format!("{who}.leased({n}, wait {wait:?}, lease {}) [{mode:?}]", lease_text(lease));
        let fut: Acquire = Box::pin(async move {
            let guard = match wait {
                Some(wait) => sem.try_acquire(n, wait, lease).await?,
                None => sem.acquire(n, lease).await?,
            };
            Ok(Got::Guard(Held::Permit(guard)))
        });
        let target = Target::Permits { server: MAIN, key: LEASED.to_owned() };
        self.acquire(label, Some(target), session, fut, mode).await;
    }

    /// Counted permits (no guard: the caller gives them back with `counted-release`).
    async fn counted_move(&mut self) {
        let sem = self.clients[MAIN].semaphore(COUNTED);
        let n = 1 + self.rng.below(2) as u64;
        let (mode, wait) = self.pick_mode(true);
        let label = format!("counted({n}, wait {wait:?}) [{mode:?}]");
        let fut: Acquire = Box::pin(async move {
            match wait {
                Some(wait) if sem.try_acquire(n, wait).await? => Ok(Got::Counted(n)),
                Some(_) => Err(Error::TimedOut),
                None => sem.acquire(n).await.map(|()| Got::Counted(n)),
            }
        });
        let target = None;
        self.acquire(label, target, false, fut, mode).await;
    }

    /// Gives counted permits back on the checker's connection (never killed by the run, so a
    /// release is never left uncertain).
    fn counted_release(&mut self) {
        if self.counted_held == 0 {
            return;
        }
        let n = 1 + self.rng.below(self.counted_held as usize) as u64;
        let _: i64 = redis::cmd("RSEM.RELEASE")
            .arg(COUNTED)
            .arg(n)
            .query(&mut self.cons[MAIN])
            .expect("RSEM.RELEASE");
        self.counted_held -= n;
        let held = self.counted_held;
        self.note(&[key(MAIN, COUNTED)], format!("counted: {n} given back ({held} held)"));
    }

    /// MultiLock over one or two lock handles (plain or an owner's; this server's or the
    /// second's).
    async fn multi_move(&mut self) {
        let candidates: Vec<Handle> = self
            .handles
            .iter()
            .filter(|h| h.session.is_none() && matches!(h.target, Target::Lock { .. }))
            .cloned()
            .collect();
        let mut chosen: Vec<Handle> = Vec::new();
        for _ in 0..1 + self.rng.below(2) {
            let h = candidates[self.rng.below(candidates.len())].clone();
            if !chosen.iter().any(|c| c.target == h.target) {
                chosen.push(h);
            }
        }
        let parts: Vec<(usize, String)> = chosen
            .iter()
            .map(|h| match &h.target {
                Target::Lock { server, key } => (*server, key.clone()),
                _ => unreachable!(),
            })
            .collect();
        let names: Vec<&str> = chosen.iter().map(|h| h.name.as_str()).collect();
        let multi = MultiLock::new(chosen.iter().map(|h| h.lock.clone()).collect());
        let lease = LEASES[self.rng.below(LEASES.len())];
        let (mode, wait) = self.pick_mode(true);
        let label =
            format!("multi{names:?}(wait {wait:?}, lease {}) [{mode:?}]", lease_text(lease));
        let fut: Acquire = Box::pin(async move {
            let guard = match wait {
                Some(wait) => multi.try_acquire(wait, lease).await?,
                None => multi.acquire(lease).await?,
            };
            Ok(Got::Guard(Held::Multi(guard)))
        });
        let quorum = parts.len();
        self.acquire(label, Some(Target::Multi { parts, quorum }), false, fut, mode).await;
    }

    /// RedLock over the three servers.
    async fn redlock_move(&mut self) {
        let red = RedLock::new(&self.clients, RED);
        let lease = LEASES[self.rng.below(LEASES.len())];
        let (mode, wait) = self.pick_mode(false);
        let wait = wait.unwrap_or(Duration::ZERO);
        let label = format!("redlock(wait {wait:?}, lease {}) [{mode:?}]", lease_text(lease));
        let fut: Acquire =
            Box::pin(
                async move { Ok(Got::Guard(Held::Multi(red.try_acquire(wait, lease).await?))) },
            );
        let parts = (0..self.clients.len()).map(|s| (s, RED.to_owned())).collect();
        self.acquire(label, Some(Target::Multi { parts, quorum: 2 }), false, fut, mode).await;
    }

    /// A latch: closed with a count, counted down, deleted, read, waited on briefly. A wait
    /// that says open while the count is above zero, or a count other than what the
    /// count-downs left, is a violation.
    async fn latch_move(&mut self) {
        let latch = self.clients[MAIN].latch(LATCH);
        let keys = [key(MAIN, LATCH)];
        let (lo, hi) = self.latch;
        match self.rng.below(6) {
            0 => {
                let n = 1 + self.rng.below(3) as u64;
                let set = latch.try_set_count(n).await;
                match &set {
                    Ok(true) => self.latch = (n, n),
                    Ok(false) => {}
                    Err(_) => self.latch = (lo, hi.max(n)),
                }
                self.note(
                    &keys,
                    format!("latch.try_set_count({n}): {set:?} (count {:?})", self.latch),
                );
            }
            1 | 2 => {
                let left = latch.count_down().await;
                match &left {
                    Ok(left) => self.latch = (*left, *left),
                    Err(_) => self.latch = (lo.saturating_sub(1), hi),
                }
                self.note(&keys, format!("latch.count_down(): {left:?} (count {:?})", self.latch));
            }
            3 => {
                let count = latch.count().await;
                if let Ok(c) = count {
                    if c < lo || c > hi {
                        self.violation(Violation {
                            beliefs: Vec::new(),
                            keys: keys.to_vec(),
                            session: false,
                            text: format!(
                                "latch.count() says {c}, the count-downs left {lo}..={hi}"
                            ),
                        })
                        .await;
                    }
                    self.latch = (c, c);
                }
                self.note(&keys, format!("latch.count(): {count:?}"));
            }
            4 if self.rng.below(4) == 0 => {
                let deleted = latch.delete().await;
                self.latch = if deleted.is_ok() { (0, 0) } else { (0, hi) };
                self.note(&keys, format!("latch.delete(): {deleted:?}"));
            }
            _ => {
                let wait = Duration::from_millis(self.rng.below(250) as u64);
                let open = latch.wait(Some(wait)).await;
                self.note(&keys, format!("latch.wait({wait:?}): {open:?} (count {lo}..={hi})"));
                if matches!(open, Ok(true)) && lo > 0 {
                    self.violation(Violation {
                        beliefs: Vec::new(),
                        keys: keys.to_vec(),
                        session: false,
                        text: format!("latch.wait says open while its count is {lo}..={hi}"),
                    })
                    .await;
                }
            }
        }
    }

    /// Releases (or drops) belief `i`, possibly dropping the release half-way.
    async fn release_at(&mut self, i: usize, why: &str) {
        let belief = self.beliefs.swap_remove(i);
        let now = Instant::now();
        let until = belief.claim(now).and_then(|c| c.until);
        if belief.held.is_lost() {
            self.exempt_lost(&belief, now);
        }
        let keys = belief.target.keys();
        let id = belief.id;
        match self.rng.below(6) {
            0 | 1 => {
                drop(belief.held);
                self.note(&keys, format!("{why}: g{id} dropped"));
            }
            2 => {
                let after = Duration::from_micros(self.rng.below(3_000) as u64);
                let released = timeout(after, belief.held.release()).await;
                self.note(
                    &keys,
                    format!("{why}: g{id}.release() dropped after {after:?}: {released:?}"),
                );
            }
            _ => {
                let released = belief.held.release().await;
                self.note(&keys, format!("{why}: g{id}.release(): {released:?}"));
                // The release may reach the server at any moment until its answer: only a
                // lease the guard claimed past that moment was surely still running then (a
                // release slowed by a failover may come after the lease, as it should).
                let answered = Instant::now();
                let claimed = until.map(|u| u.saturating_duration_since(now));
                if matches!(released, Err(Error::NotHeld))
                    && until.is_some_and(|u| u > answered + Duration::from_millis(50))
                    && !belief.session
                {
                    self.violation(Violation {
                        beliefs: vec![id],
                        keys,
                        session: false,
                        text: format!(
                            "g{id}.release() says NotHeld while the guard said held, valid \
                             {claimed:?} more (the release took {:?})",
                            answered - now
                        ),
                    })
                    .await;
                }
            }
        }
    }

    async fn release_move(&mut self) {
        if self.beliefs.is_empty() {
            return;
        }
        let i = self.rng.below(self.beliefs.len());
        self.release_at(i, "release").await;
    }

    fn exempt_lost(&mut self, belief: &Belief, now: Instant) {
        self.exempt_target(&belief.target, &belief.owner, &belief.ids, now);
    }

    async fn kill_move(&mut self) {
        let server = if self.rng.below(4) == 0 { 1 } else { MAIN };
        let killed: i64 = redis::cmd("CLIENT")
            .arg("KILL")
            .arg("TYPE")
            .arg("normal")
            .arg("SKIPME")
            .arg("yes")
            .query(&mut self.cons[server])
            .expect("CLIENT KILL");
        self.count("kill");
        self.note(&[], format!("CLIENT KILL TYPE normal on server {server}: {killed} killed"));
    }

    fn stall_move(&mut self) {
        if self.stall.as_ref().is_some_and(|s| !s.is_finished()) {
            return;
        }
        let ms = 50 + self.rng.below(750) as u64;
        let server = Arc::clone(&self.servers[MAIN]);
        self.count("stall");
        self.stalled_until = Some(Instant::now() + Duration::from_millis(ms));
        self.note(&[], format!("server {MAIN} stalled (SIGSTOP) for {ms} ms"));
        self.stall = Some(std::thread::spawn(move || {
            server.pause();
            std::thread::sleep(Duration::from_millis(ms));
            server.resume();
        }));
    }

    async fn session_move(&mut self) {
        self.sessions.retain(|s| !s.session.is_closed());
        let live: Vec<usize> = self.sessions.iter().map(|s| s.n).collect();
        self.handles.retain(|h| h.session.is_none_or(|n| live.contains(&n)));
        if self.sessions.len() < 2 && (self.sessions.is_empty() || self.rng.below(2) == 0) {
            let n = self.next_session;
            self.next_session += 1;
            match self.clients[MAIN].session().await {
                Ok(session) => {
                    let owner = session.owner();
                    let rw = session.rw_lock(RW);
                    let rw_target = |read| {
                        let key = RW.to_owned();
                        if read {
                            Target::Read { server: MAIN, key }
                        } else {
                            Target::Write { server: MAIN, key }
                        }
                    };
                    let made = [
                        (format!("s{n}:{L1}"), session.lock(L1), lock_target(MAIN, L1)),
                        (format!("s{n}.owner:{L0}"), owner.lock(L0), lock_target(MAIN, L0)),
                        (format!("s{n}.rw.read"), rw.read().clone(), rw_target(true)),
                        (format!("s{n}.rw.write"), rw.write().clone(), rw_target(false)),
                    ];
                    let with_owners = self.with_owners;
                    for (name, lock, target) in
                        made.into_iter().filter(|(n, ..)| with_owners || !n.contains("owner"))
                    {
                        self.handles.push(Handle { name, lock, target, session: Some(n) });
                    }
                    let leased = session.leased_semaphore(LEASED);
                    self.note(
                        &[],
                        format!("session s{n} opened (client id {:?})", session.client_id()),
                    );
                    self.sessions.push(OpenSession { n, session, leased });
                }
                Err(e) => self.note(&[], format!("session s{n} not opened: {e}")),
            }
            return;
        }
        let i = self.rng.below(self.sessions.len());
        if self.rng.below(2) == 0 {
            let s = self.sessions.swap_remove(i);
            self.note(&[], format!("session s{} closed", s.n));
            s.session.close();
        } else if let Some(id) = self.sessions[i].session.client_id() {
            let killed: i64 = redis::cmd("CLIENT")
                .arg("KILL")
                .arg("ID")
                .arg(id)
                .query(&mut self.cons[MAIN])
                .expect("CLIENT KILL ID");
            let n = self.sessions[i].n;
            self.note(
                &[],
                format!("session s{n}'s connection killed (CLIENT KILL ID {id}: {killed})"),
            );
        }
    }

    async fn abort_move(&mut self) {
        if self.pending.is_empty() {
            return;
        }
        let p = self.pending.swap_remove(self.rng.below(self.pending.len()));
        p.task.abort();
        match p.task.await {
            Ok(got) => {
                let label = format!("{} (aborted too late)", p.label);
                self.got(&label, p.target, p.session, (p.untimed, p.started), got).await;
            }
            Err(_) => {
                self.count("aborted");
                let keys = p.target.as_ref().map(Target::keys).unwrap_or_default();
                self.note(&keys, format!("{}: aborted", p.label));
            }
        }
    }

    /// Takes what finished waiting.
    async fn collect(&mut self) {
        let mut i = 0;
        while i < self.pending.len() {
            if self.pending[i].task.is_finished() {
                let p = self.pending.swap_remove(i);
                let got = p.task.await.expect("acquire task");
                self.got(&p.label, p.target, p.session, (p.untimed, p.started), got).await;
            } else if self.pending[i].due.is_some_and(|due| Instant::now() > due) {
                let p = self.pending.swap_remove(i);
                p.task.abort();
                let keys = p.target.as_ref().map(Target::keys).unwrap_or_default();
                let text = format!(
                    "{} still waits {DEADLINE_SLACK:?} past its deadline (aborted now: {:?})",
                    p.label,
                    p.task.await.map(|got| got.map(|_| "granted"))
                );
                self.violation(Violation { beliefs: Vec::new(), keys, session: p.session, text })
                    .await;
            } else {
                i += 1;
            }
        }
    }

    /// Fails server [`MAIN`] (a Sentinel group) over to its replica while guards, watchdogs
    /// and waits are live, then checks against the new master.
    async fn failover_move(&mut self) {
        let Some(mut group) = self.group.take() else { return };
        if let Some(stall) = self.stall.take() {
            tokio::task::block_in_place(|| stall.join().expect("stall"));
        }
        let old = group.master().port();
        self.note(&[], format!("failover of server {MAIN} (master port {old}) begins"));
        let took = group.failover(&mut self.cons[MAIN]).await;
        self.servers[MAIN] = group.master();
        let con = self.servers[MAIN].conn();
        con.set_read_timeout(Some(Duration::from_secs(30))).expect("timeout");
        self.cons[MAIN] = con;
        self.failovers += 1;
        self.count("failover");
        self.note(
            &[],
            format!(
                "failover of server {MAIN} done in {took:?}: master port {old} -> {}",
                self.servers[MAIN].port()
            ),
        );
        self.group = Some(group);
    }

    /// Every belief against the servers and against each other.
    async fn check(&mut self) {
        let now = Instant::now();
        for i in 0..self.beliefs.len() {
            let b = &self.beliefs[i];
            if b.lost_seen.is_none() && b.held.is_lost() {
                let (id, target, owner, ids) =
                    (b.id, b.target.clone(), b.owner.clone(), b.ids.clone());
                self.beliefs[i].lost_seen = Some(now);
                self.exempt_target(&target, &owner, &ids, now);
                self.note(&target.keys(), format!("g{id} says lost"));
            }
        }
        let claims: Vec<_> = self.beliefs.iter().filter_map(|b| b.claim(now)).collect();
        *self.stats.entry("claims checked".to_owned()).or_default() += claims.len();
        let mut found = check::exclusion(&claims);
        let cons = &mut self.cons;
        let held = self.counted_held;
        let (servers, available) = tokio::task::block_in_place(|| {
            (check::against_servers(cons, &claims), view::available(&mut cons[MAIN], COUNTED))
        });
        // A MultiGuard says no deadline: its claim holds only if it still says held after the
        // read (a stall may have held the read up past its members' deadlines).
        let lost_since = |v: &Violation| {
            self.beliefs.iter().any(|b| {
                v.beliefs.contains(&b.id)
                    && matches!(b.target, Target::Multi { .. })
                    && b.held.is_lost()
            })
        };
        found.extend(servers.into_iter().filter(|v| !lost_since(v)));
        if available + i64::try_from(held).expect("held") > PERMITS {
            found.push(Violation {
                beliefs: Vec::new(),
                keys: vec![key(MAIN, COUNTED)],
                session: false,
                text: format!(
                    "counted permits: {available} available while the caller holds {held} of \
                     {PERMITS}"
                ),
            });
        }
        for v in found {
            self.violation(v).await;
        }
    }

    fn exempt_target(&mut self, target: &Target, owner: &str, ids: &[Vec<u8>], now: Instant) {
        let until = now + LONGEST_LEASE + Duration::from_secs(1);
        match target {
            Target::Lock { server, key }
            | Target::Read { server, key }
            | Target::Write { server, key } => {
                self.exempt.holds.push((*server, key.clone(), Some(owner.to_owned()), until));
            }
            Target::Permits { .. } => {
                self.exempt.ids.extend(ids.iter().map(|id| (id.clone(), until)))
            }
            Target::Multi { parts, .. } => {
                for (server, key) in parts {
                    self.exempt.holds.push((*server, key.clone(), None, until));
                }
            }
        }
    }

    /// Reports a violation: a session guard involved is first given [`SESSION_GRACE`] to
    /// learn that its session closed (then it is no violation).
    async fn violation(&mut self, v: Violation) {
        if v.session {
            let start = Instant::now();
            let until = start + SESSION_GRACE;
            loop {
                let learned = self
                    .beliefs
                    .iter()
                    .any(|b| b.session && v.beliefs.contains(&b.id) && b.held.is_lost());
                if learned {
                    self.count("session guard learned late");
                    self.note(
                        &v.keys,
                        format!(
                            "(a session guard learned its loss {:?} late: {})",
                            start.elapsed(),
                            v.text
                        ),
                    );
                    return;
                }
                if Instant::now() >= until {
                    break;
                }
                sleep(Duration::from_millis(10)).await;
            }
        }
        self.note(&v.keys, format!("VIOLATION: {}", v.text));
        for b in &mut self.beliefs {
            if v.beliefs.contains(&b.id) {
                b.flagged = true;
            }
        }
        if !self.keep_going {
            self.fail(&[(self.step, v)]);
        }
        self.violations.push((self.step, v));
    }

    fn fail(&self, found: &[(usize, Violation)]) -> ! {
        let path = std::env::temp_dir().join(format!("client_model-{}.txt", self.seed));
        let _ = std::fs::write(&path, self.journal.all());
        let mut text = String::new();
        for (step, v) in found {
            text += &format!(
                "\n--- step {step}: {}\n  steps on {:?} (and disturbances):\n{}",
                v.text,
                v.keys,
                self.journal.excerpt(&v.keys, 60)
            );
        }
        panic!(
            "seed {} (replay with RLOCK_CLIENT_MODEL_SEED={}): {} violation(s), every step in {}:{text}",
            self.seed,
            self.seed,
            found.len(),
            path.display()
        );
    }

    /// Every guard released, every waiting acquire returned, then within [`SETTLE`] nothing
    /// held that no guard knows of, permits conserved, nobody waiting.
    async fn settle(&mut self) {
        if let Some(stall) = self.stall.take() {
            tokio::task::block_in_place(|| stall.join().expect("stall"));
        }
        self.note(&[], "settle: every guard released".to_owned());
        let drain_until = Instant::now() + DRAIN;
        loop {
            while !self.beliefs.is_empty() {
                self.release_at(0, "settle").await;
            }
            self.give_counted_back();
            self.collect().await;
            if self.beliefs.is_empty() && self.pending.is_empty() {
                break;
            }
            if Instant::now() >= drain_until {
                let labels: Vec<String> = self.pending.iter().map(|p| p.label.clone()).collect();
                let keys = self
                    .pending
                    .iter()
                    .flat_map(|p| p.target.as_ref().map(Target::keys).unwrap_or_default())
                    .collect();
                self.violation(Violation {
                    beliefs: Vec::new(),
                    keys,
                    session: false,
                    text: format!(
                        "{DRAIN:?} after every guard was released, acquires still wait: {labels:?}"
                    ),
                })
                .await;
                for p in self.pending.drain(..) {
                    p.task.abort();
                }
                break;
            }
            sleep(Duration::from_millis(20)).await;
        }
        self.give_counted_back();
        let until = Instant::now() + SETTLE;
        let left = loop {
            let left = tokio::task::block_in_place(|| self.leftovers());
            if left.is_empty() || Instant::now() >= until {
                break left;
            }
            sleep(Duration::from_millis(20)).await;
        };
        if !left.is_empty() {
            let keys = vec![
                key(MAIN, L0),
                key(MAIN, L1),
                key(MAIN, RW),
                key(MAIN, LEASED),
                key(MAIN, COUNTED),
                key(1, L0),
                key(MAIN, RED),
            ];
            self.violation(Violation {
                beliefs: Vec::new(),
                keys,
                session: false,
                text: format!("{SETTLE:?} into a settle, held by no guard: {left:?}"),
            })
            .await;
        }
        self.count("settles");
        self.note(&[], "settle: done".to_owned());
    }

    /// Every counted permit the caller holds, given back on the checker's connection.
    fn give_counted_back(&mut self) {
        if self.counted_held > 0 {
            let held = self.counted_held;
            let _: i64 = redis::cmd("RSEM.RELEASE")
                .arg(COUNTED)
                .arg(held)
                .query(&mut self.cons[MAIN])
                .expect("RSEM.RELEASE");
            self.counted_held = 0;
            self.note(&[key(MAIN, COUNTED)], format!("counted: {held} given back (settle)"));
        }
    }

    fn leftovers(&mut self) -> Vec<String> {
        let mut left = Vec::new();
        let exempt = &self.exempt;
        let hashes = [(MAIN, L0), (MAIN, L1), (MAIN, RW), (MAIN, RED), (1, L0), (1, RED), (2, RED)];
        for (server, name) in hashes {
            left.extend(check::leftover_hash(&mut self.cons[server], server, name, exempt));
        }
        let con = &mut self.cons[MAIN];
        left.extend(check::leftover_permits(con, MAIN, LEASED, PERMITS, exempt));
        let counted = view::available(con, COUNTED);
        if counted != PERMITS {
            left.push(format!("{COUNTED}: {counted} of {PERMITS} available, none taken"));
        }
        for (server, con) in self.cons.iter_mut().enumerate() {
            let blocked = blocked_clients(con);
            if blocked != 0 {
                left.push(format!("server {server}: {blocked} client(s) waiting"));
            }
        }
        left
    }
}

async fn client(server: &Server) -> LockClient {
    let options = Options::default().watchdog_timeout(WATCHDOG);
    LockClient::with_options(server.client(), options).await.expect("client")
}

async fn sentinel_client(group: &Group) -> LockClient {
    let (replicas, ack) = REPLICA_ACK;
    let options = Options::default().watchdog_timeout(WATCHDOG).replica_ack(replicas, ack);
    LockClient::sentinel(vec![group.sentinel_url()], SENTINEL_MASTER, "redis://127.0.0.1/", options)
        .await
        .expect("a Sentinel client")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_a_caller_believes_of_every_kind_the_servers_hold() {
    run_model(false).await;
}

/// The same run with server [`MAIN`] a Sentinel group (a master, its replica, a Sentinel)
/// failed over `RLOCK_CLIENT_MODEL_FAILOVERS` times (default 2, evenly spread) while guards,
/// watchdogs and (timed and untimed) waits are live. Its client asks for each grant to be
/// acknowledged by the replica (`Options::replica_ack`), so what a caller may believe is the
/// same as without failovers, checked against the master the Sentinel names now.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_a_caller_believes_holds_across_sentinel_failovers() {
    run_model(true).await;
}

async fn run_model(with_group: bool) {
    let seed = model_seed();
    let secs = model_secs(15);
    let skip = std::env::var("RLOCK_CLIENT_MODEL_SKIP").unwrap_or_default();
    let moves: Vec<(&str, usize)> =
        MOVES.iter().copied().filter(|(m, _)| !skip.split(',').any(|s| s.trim() == *m)).collect();
    eprintln!(
        "seed {seed} (replay with RLOCK_CLIENT_MODEL_SEED={seed}), {secs} s, moves {:?}",
        moves.iter().map(|(m, _)| *m).collect::<Vec<_>>()
    );
    let group = with_group.then(Group::start);
    let failovers = if with_group { model_failovers(2.max(secs as usize / 30)) } else { 0 };
    let servers: Vec<Arc<Server>> = (0..3)
        .map(|i| match &group {
            Some(group) if i == MAIN => group.master(),
            _ => Arc::new(Server::start()),
        })
        .collect();
    let mut cons: Vec<Connection> = servers.iter().map(|s| s.conn()).collect();
    for con in &mut cons {
        con.set_read_timeout(Some(Duration::from_secs(30))).expect("timeout");
    }
    for name in [COUNTED, LEASED] {
        let set: i64 = redis::cmd("RSEM.SETPERMITS")
            .arg(name)
            .arg(PERMITS)
            .query(&mut cons[MAIN])
            .expect("set");
        assert_eq!(set, 1);
    }
    let mut clients = Vec::new();
    for (i, server) in servers.iter().enumerate() {
        clients.push(match &group {
            Some(group) if i == MAIN => sentinel_client(group).await,
            _ => client(server).await,
        });
    }
    let owners: Vec<Owner> = (0..2).map(|_| clients[MAIN].owner()).collect();
    let mut handles = Vec::new();
    let mut keep = |name: String, lock: Lock, target: Target| {
        handles.push(Handle { name, lock, target, session: None });
    };
    let c = &clients[MAIN];
    keep(format!("p0:{L0}"), c.lock(L0), lock_target(MAIN, L0));
    keep(format!("p1:{L0}"), c.lock(L0), lock_target(MAIN, L0));
    keep(format!("p2:{L1}"), c.lock(L1), lock_target(MAIN, L1));
    let with_owners = !skip.split(',').any(|s| s.trim() == "owners");
    for (o, owner) in owners.iter().enumerate().filter(|_| with_owners) {
        keep(format!("o{o}a:{L0}"), owner.lock(L0), lock_target(MAIN, L0));
        keep(format!("o{o}b:{L0}"), owner.lock(L0), lock_target(MAIN, L0));
        keep(format!("o{o}:{L1}"), owner.lock(L1), lock_target(MAIN, L1));
    }
    let rws = [
        ("rw0", c.rw_lock(RW)),
        ("rw1", c.rw_lock(RW)),
        ("o0.rwA", owners[0].rw_lock(RW)),
        ("o0.rwB", owners[0].rw_lock(RW)),
    ];
    for (name, rw) in rws.into_iter().filter(|(n, _)| with_owners || !n.starts_with('o')) {
        let key = RW.to_owned();
        keep(
            format!("{name}.read"),
            rw.read().clone(),
            Target::Read { server: MAIN, key: key.clone() },
        );
        keep(format!("{name}.write"), rw.write().clone(), Target::Write { server: MAIN, key });
    }
    let remote = clients[1].owner();
    keep(format!("p:1/{L0}"), clients[1].lock(L0), lock_target(1, L0));
    if with_owners {
        keep(format!("o:1/{L0}"), remote.lock(L0), lock_target(1, L0));
    }
    let mut run = Run {
        seed,
        rng: Rng(seed),
        step: 0,
        servers,
        cons,
        clients,
        owners,
        handles,
        sessions: Vec::new(),
        next_session: 0,
        beliefs: Vec::new(),
        next_id: 0,
        pending: Vec::new(),
        counted_held: 0,
        latch: (0, 0),
        exempt: Exempt::default(),
        journal: Journal::default(),
        stall: None,
        violations: Vec::new(),
        keep_going: std::env::var("RLOCK_CLIENT_MODEL_KEEP_GOING").is_ok_and(|v| v == "1"),
        moves,
        with_owners,
        stats: BTreeMap::new(),
        last_wait: None,
        group,
        failovers: 0,
        stalled_until: None,
    };
    let start = Instant::now();
    let end = start + Duration::from_secs(secs);
    // The k-th failover is due at k/(n+1) of the run.
    let failover_due = |done: usize| {
        start
            + Duration::from_secs(secs) * u32::try_from(done + 1).expect("failovers")
                / u32::try_from(failovers + 1).expect("failovers")
    };
    let mut last_settle = Instant::now();
    while Instant::now() < end || run.failovers < failovers {
        run.step += 1;
        if run.failovers < failovers && Instant::now() >= failover_due(run.failovers) {
            run.failover_move().await;
            run.collect().await;
            run.check().await;
            continue;
        }
        match run.pick_move() {
            "lock" => run.lock_move().await,
            "owner-nested" => run.owner_nested_move().await,
            "owner-multi" => run.owner_multi_move().await,
            "multi" => run.multi_move().await,
            "redlock" => run.redlock_move().await,
            "leased" => run.leased_move().await,
            "counted" => run.counted_move().await,
            "counted-release" => run.counted_release(),
            "latch" => run.latch_move().await,
            "release" => run.release_move().await,
            "sleep" => {
                let ms = run.rng.below(1500) as u64;
                run.note(&[], format!("sleep {ms} ms"));
                sleep(Duration::from_millis(ms)).await;
            }
            "kill" => run.kill_move().await,
            "stall" => run.stall_move(),
            "session" => run.session_move().await,
            "abort" => run.abort_move().await,
            _ => last_settle = Instant::now() - SETTLE_EVERY,
        }
        run.collect().await;
        run.check().await;
        if last_settle.elapsed() >= SETTLE_EVERY {
            run.settle().await;
            last_settle = Instant::now();
        }
    }
    run.settle().await;
    let path = std::env::temp_dir().join(format!("client_model-{seed}.txt"));
    let _ = std::fs::write(&path, run.journal.all());
    eprintln!("seed {seed}: {} steps (every one in {}), {:?}", run.step, path.display(), run.stats);
    assert_eq!(run.failovers, failovers, "every failover of the run was done");
    if !run.violations.is_empty() {
        let found = std::mem::take(&mut run.violations);
        run.fail(&found);
    }
}
