//! A randomized cancellation run of the Rust client: tasks acquire every kind (a lock, a read-write
//! lock's read and write sides, counted and leased permits) through shared and fresh handles, and
//! drop their acquires at random points (`timeout`, `select!` against a timer, an aborted task),
//! against a busy server, while connections are killed (`CLIENT KILL TYPE normal`) and the server
//! stalls (SIGSTOP, up to 300 ms). A guard that is granted is held a moment, then released or
//! dropped.
//!
//! After each round (every task done, every guard released or dropped, the client given a
//! bounded time to finish what it does in the background) nothing may be left: the lock and the
//! read-write lock are gone, both semaphores have every permit back (available + held = total,
//! with nothing held), and nobody waits in the server.
//!
//! `RLOCK_FUZZ_SEED` replays a run (the seed is printed); `RLOCK_FUZZ_STEPS` sets the number of
//! rounds (default 25, well under a minute).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::Value;
use rlock_client::{Error, LockClient};
use rlock_tests_integration::{blocked_clients, fuzz_seed, fuzz_steps, Rng, Server};
use tokio::time::{sleep, timeout};

const TASKS: usize = 12;
const OPS: usize = 30;
/// Permits of each semaphore.
const PERMITS: i64 = 3;
/// Every hold a leak would leave outlasts the check by far (the watchdog's lease is 30 s).
const LEASE: Duration = Duration::from_secs(60);
/// How long the client may take to finish what it does in the background after a round.
const SETTLE: Duration = Duration::from_secs(15);

/// What a round did (printed, so a failure shows what led to it).
#[derive(Default)]
struct Stats {
    granted: AtomicUsize,
    cancelled: AtomicUsize,
    failed: AtomicUsize,
}

/// A connection the fuzz's `CLIENT KILL`s never kill (they skip the connection that sends them):
/// it sends them, and gives counted permits back (a counted release is not idempotent, so it
/// must not be left uncertain by a kill).
#[derive(Clone)]
struct Safe(Arc<Mutex<redis::Connection>>);

impl Safe {
    async fn run(&self, command: redis::Cmd) -> redis::RedisResult<Value> {
        let con = Arc::clone(&self.0);
        tokio::task::spawn_blocking(move || {
            let mut con = con.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            command.query::<Value>(&mut *con)
        })
        .await
        .expect("blocking task")
    }
}

/// The handles a round's tasks share (re-entry and shared owners included).
#[derive(Clone)]
struct Shared {
    client: LockClient,
    locks: Vec<rlock_client::Lock>,
    rws: Vec<rlock_client::RwLock>,
    safe: Safe,
    stats: Arc<Stats>,
}

/// Runs `acquire`, dropped at a random point: after a `timeout`, by `select!` against a timer
/// (either may win when both are ready), or by aborting the task running it. `None`: dropped
/// before it answered.
async fn cancellable<T: Send + 'static>(
    rng: &mut Rng,
    acquire: impl std::future::Future<Output = Result<T, Error>> + Send + 'static,
) -> Option<Result<T, Error>> {
    let longest = if rng.below(4) == 0 { 300_000 } else { 5_000 };
    let after = Duration::from_micros(rng.below(longest) as u64);
    match rng.below(3) {
        0 => timeout(after, acquire).await.ok(),
        1 => tokio::select! {
            got = acquire => Some(got),
            () = sleep(after) => None,
        },
        _ => {
            let mut task = tokio::spawn(acquire);
            tokio::select! {
                biased;
                got = &mut task => got.ok(),
                () = sleep(after) => {
                    task.abort();
                    // A task that finished anyway delivered its result: ours to settle.
                    task.await.ok()
                }
            }
        }
    }
}

/// A guard held a moment, then released (its answer does not matter: a kill or a stall may
/// fail it; what the server keeps is checked at the round's end) or dropped.
async fn hold<G, F: std::future::Future>(rng: &mut Rng, guard: G, release: impl FnOnce(G) -> F) {
    sleep(Duration::from_micros(rng.below(20_000) as u64)).await;
    if rng.below(2) == 0 {
        let _ = release(guard).await;
    } else {
        drop(guard);
    }
}

/// What one operation ended with: `None` when it was dropped before it answered.
type Outcome = Option<Result<(), Error>>;

/// A lock, or a read-write lock's side, through a shared handle or a fresh one.
async fn lock_op(
    shared: &Shared,
    rng: &mut Rng,
    (wait, lease): (Duration, Option<Duration>),
) -> Outcome {
    let lock = match rng.below(3) {
        0 => shared.locks[rng.below(shared.locks.len())].clone(),
        1 => {
            let rw = &shared.rws[rng.below(shared.rws.len())];
            if rng.below(2) == 0 {
                rw.read().clone()
            } else {
                rw.write().clone()
            }
        }
        _ => shared.client.lock("fz:lock"),
    };
    let try_it = rng.below(2) == 0;
    let acquire = async move {
        if try_it {
            lock.try_acquire(wait, lease).await
        } else {
            lock.acquire(lease).await
        }
    };
    match cancellable(rng, acquire).await {
        Some(Ok(guard)) => {
            hold(rng, guard, |g| g.release()).await;
            Some(Ok(()))
        }
        other => other.map(|r| r.map(drop)),
    }
}

/// Counted permits, given back on the [`Safe`] connection when granted.
async fn counted_op(shared: &Shared, rng: &mut Rng, wait: Duration) -> Outcome {
    let sem = shared.client.semaphore("fz:counted");
    let n = 1 + rng.below(2) as u64;
    let try_it = rng.below(2) == 0;
    let acquire = async move {
        if try_it {
            match sem.try_acquire(n, wait).await {
                Ok(true) => Ok(()),
                Ok(false) => Err(Error::TimedOut),
                Err(e) => Err(e),
            }
        } else {
            sem.acquire(n).await
        }
    };
    let got = cancellable(rng, acquire).await;
    if let Some(Ok(())) = got {
        sleep(Duration::from_micros(rng.below(20_000) as u64)).await;
        let mut release = redis::cmd("RSEM.RELEASE");
        release.arg("fz:counted").arg(n);
        shared.safe.run(release).await.expect("give counted permits back");
    }
    got
}

/// Leased permits, held by a guard.
async fn leased_op(
    shared: &Shared,
    rng: &mut Rng,
    (wait, lease): (Duration, Option<Duration>),
) -> Outcome {
    let sem = shared.client.leased_semaphore("fz:leased");
    let n = 1 + rng.below(2) as u64;
    let try_it = rng.below(2) == 0;
    let acquire = async move {
        if try_it {
            sem.try_acquire(n, wait, lease).await
        } else {
            sem.acquire(n, lease).await
        }
    };
    match cancellable(rng, acquire).await {
        Some(Ok(guard)) => {
            hold(rng, guard, |g| g.release()).await;
            Some(Ok(()))
        }
        other => other.map(|r| r.map(drop)),
    }
}

/// One random operation of a task (locks three times in five: two kinds and two sides).
async fn op(shared: &Shared, rng: &mut Rng) {
    let lease = if rng.below(3) == 0 { None } else { Some(LEASE) };
    let wait = Duration::from_millis(rng.below(200) as u64);
    let outcome = match rng.below(5) {
        0..=2 => lock_op(shared, rng, (wait, lease)).await,
        3 => counted_op(shared, rng, wait).await,
        _ => leased_op(shared, rng, (wait, lease)).await,
    };
    let stats = &shared.stats;
    let counter = match outcome {
        Some(Ok(())) => &stats.granted,
        None => &stats.cancelled,
        Some(Err(_)) => &stats.failed,
    };
    counter.fetch_add(1, Ordering::Relaxed);
}

/// The round's disturbances until `done`: now and then every normal connection killed, or the
/// server stalled up to 300 ms. A stall is timed on a thread of its own, so it ends on time even
/// when the client blocks the runtime's threads.
async fn nemesis(server: &Arc<Server>, safe: &Safe, rng: &mut Rng, done: &AtomicUsize) {
    while done.load(Ordering::Relaxed) < TASKS {
        sleep(Duration::from_millis(20 + rng.below(130) as u64)).await;
        match rng.below(6) {
            0 => {
                let mut kill = redis::cmd("CLIENT");
                kill.arg("KILL").arg("TYPE").arg("normal");
                safe.run(kill).await.expect("CLIENT KILL");
            }
            1 => {
                let (server, stall) = (Arc::clone(server), 50 + rng.below(250) as u64);
                tokio::task::spawn_blocking(move || {
                    server.pause();
                    std::thread::sleep(Duration::from_millis(stall));
                    server.resume();
                })
                .await
                .expect("stall");
            }
            _ => {}
        }
    }
}

/// What is left in the server when nothing should be: `None` when nothing is.
fn leftovers(con: &mut redis::Connection) -> Option<String> {
    let keys: Vec<i64> = ["fz:lock", "fz:rw"]
        .iter()
        .map(|k| redis::cmd("EXISTS").arg(k).query(con).expect("EXISTS"))
        .collect();
    let counted: i64 = redis::cmd("RSEM.AVAILABLE").arg("fz:counted").query(con).expect("AVAIL");
    let info: Value = redis::cmd("RSEM.INFO").arg("fz:leased").query(con).expect("INFO");
    let leased: Vec<(String, i64)> = redis::from_redis_value(info).expect("RSEM.INFO");
    let get = |f: &str| leased.iter().find(|(k, _)| k == f).map_or(-1, |(_, v)| *v);
    let blocked = blocked_clients(con);
    let clean = keys == [0, 0]
        && counted == PERMITS
        && (get("available"), get("leased")) == (PERMITS, 0)
        && blocked == 0;
    (!clean).then(|| {
        let mut hash = |k: &str| {
            let pairs = rlock_tests_integration::hgetall(con, k.as_bytes());
            let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
            pairs.iter().map(|(f, v)| (text(f), text(v))).collect::<Vec<_>>()
        };
        let (lock, rw) = (hash("fz:lock"), hash("fz:rw"));
        format!(
            "lock {lock:?}, rw lock {rw:?}, counted {counted} of {PERMITS} available, leased {} \
             available and {} leased of {PERMITS}, {blocked} client(s) waiting",
            get("available"),
            get("leased")
        )
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_cancellations_of_every_kind_leave_no_hold_and_lose_no_permit() {
    let server = Arc::new(Server::start());
    let rounds = fuzz_steps(25);
    let seed = fuzz_seed();
    eprintln!("seed {seed} (replay with RLOCK_FUZZ_SEED={seed}), {rounds} rounds");
    let mut rng = Rng(seed);
    let mut safe = server.conn();
    safe.set_read_timeout(Some(Duration::from_secs(30))).expect("timeout");
    for name in ["fz:counted", "fz:leased"] {
        let set: i64 =
            redis::cmd("RSEM.SETPERMITS").arg(name).arg(PERMITS).query(&mut safe).expect("set");
        assert_eq!(set, 1);
    }
    let safe = Safe(Arc::new(Mutex::new(safe)));
    let client = LockClient::open(server.url()).await.expect("client");
    for round in 0..rounds {
        let shared = Shared {
            client: client.clone(),
            locks: (0..2).map(|_| client.lock("fz:lock")).collect(),
            rws: (0..2).map(|_| client.rw_lock("fz:rw")).collect(),
            safe: safe.clone(),
            stats: Arc::default(),
        };
        let done = Arc::new(AtomicUsize::new(0));
        let tasks: Vec<_> = (0..TASKS)
            .map(|_| {
                let (shared, done, mut rng) =
                    (shared.clone(), Arc::clone(&done), Rng(rng.next_u64() | 1));
                tokio::spawn(async move {
                    for _ in 0..OPS {
                        op(&shared, &mut rng).await;
                    }
                    done.fetch_add(1, Ordering::Relaxed);
                })
            })
            .collect();
        nemesis(&server, &safe, &mut rng, &done).await;
        for task in tasks {
            task.await.expect("task");
        }
        let stats = &shared.stats;
        let what = format!(
            "seed {seed}, round {round} ({} granted, {} cancelled, {} failed)",
            stats.granted.load(Ordering::Relaxed),
            stats.cancelled.load(Ordering::Relaxed),
            stats.failed.load(Ordering::Relaxed)
        );
        eprintln!("{what}");
        drop(shared);
        let until = std::time::Instant::now() + SETTLE;
        // A connection of its own each time: the round's kills closed the earlier ones.
        while let Some(left) = leftovers(&mut server.conn()) {
            assert!(
                std::time::Instant::now() < until,
                "{what}: {SETTLE:?} after the round, something is still held: {left}"
            );
            sleep(Duration::from_millis(20)).await;
        }
    }
}
