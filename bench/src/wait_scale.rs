//! Section 10, scale of waiting (issue 28 §3): tens of thousands of clients waiting for
//! thousands of locks. The server memory per waiter, the enqueue and the hand-off at that
//! scale, and the server's CPU while they all wait and nothing else happens (what the module's
//! poll of the waited locks costs), read from `/proc/<pid>/stat` (utime + stime) over an idle
//! interval; against the same clients blocked in `BLPOP` on as many lists.
//!
//! Every waiter is a connection: one file descriptor here and one in the server, each process
//! under the open-files limit (raised as far as allowed). When the limit cannot hold the waiters
//! asked for, the section measures the most it can hold and its note says so.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;
use redis::Value;
use rlock_tests_integration::Server;

use crate::report::{num, ratio, Section, Target};
use crate::util;
use crate::Sizes;

/// The poll's target: server CPU, as a share of one core, that waiting adds while idle.
const POLL_TARGET_PERCENT: f64 = 3.0;

/// Waiters connected between two checks that they all wait (the server's listen backlog).
const BATCH: usize = 1_000;

/// Who waits.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Style {
    /// `RLOCK.ACQUIRE lock owner 600000 WAIT 0`, given back with `RLOCK.RELEASE`.
    Rlock,
    /// `BLPOP list 0`, given back with `RPUSH list token`.
    Blpop,
}

/// What one style costs with every waiter blocked.
struct Costs {
    bytes_per_waiter: f64,
    enqueue: f64,
    handoff: f64,
    /// Server CPU over an idle interval, % of one core, with no waiter (only the locks held).
    idle_before: f64,
    /// The same with every waiter blocked (rlock: the median of the rounds).
    idle_blocked: f64,
    /// rlock only: the same clients parked in `BLPOP` on lists of their own, per round.
    idle_parked: Vec<f64>,
    /// rlock only: with every client waiting for its lock, per round.
    idle_waiting: Vec<f64>,
}

/// The server's user + system CPU so far, in seconds (`/proc/<pid>/stat`, fields 14 and 15).
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The fields after the command name, which is in parentheses and may hold spaces.
    let rest = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<f64>().ok()).unwrap_or(f64::NAN);
    // SAFETY: sysconf reads a constant of the system; no pointer is involved.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name (field 2).
    (ticks(11) + ticks(12)) / per_second
}

/// The server's CPU over `idle`, in % of one core, while this process sends it nothing.
async fn idle_cpu(pid: u32, idle: Duration) -> f64 {
    let (cpu, started) = (cpu_seconds(pid), Instant::now());
    tokio::time::sleep(idle).await;
    (cpu_seconds(pid) - cpu) * 100.0 / started.elapsed().as_secs_f64()
}

fn key(i: usize, locks: usize) -> String {
    format!("wait:{}", i % locks)
}

fn cmd(args: &[&str]) -> redis::Cmd {
    rlock_tests_integration::command(args)
}

/// Sends one command per lock (or per waiter), pipelined in batches.
async fn each(con: &mut MultiplexedConnection, n: usize, make: impl Fn(usize) -> redis::Cmd) {
    for start in (0..n).step_by(BATCH) {
        let mut pipe = redis::pipe();
        for i in start..n.min(start + BATCH) {
            pipe.add_command(make(i));
        }
        let _: Vec<Value> = pipe.query_async(con).await.expect("a pipeline of set-up commands");
    }
}

/// One waiter. rlock: parked in `BLPOP park:<id>` until the bench pushes to it; then, in the
/// idle rounds, waits for its lock once and parks again, or, once `looping`, takes the lock and
/// gives it back in a loop (as section 4). BLPOP: that loop with `BLPOP` and `RPUSH`.
async fn waiter(
    mut c: MultiplexedConnection,
    id: usize,
    key: String,
    style: Style,
    looping: Arc<AtomicBool>,
    served: Arc<AtomicU64>,
) {
    let owner = format!("w{id}");
    let (wait, give_back) = match style {
        Style::Rlock => (
            cmd(&["RLOCK.ACQUIRE", &key, &owner, "600000", "WAIT", "0"]),
            cmd(&["RLOCK.RELEASE", &key, &owner]),
        ),
        Style::Blpop => (cmd(&["BLPOP", &key, "0"]), cmd(&["RPUSH", &key, "token"])),
    };
    let park = cmd(&["BLPOP", &format!("park:{id}"), "0"]);
    // Any error: the server is gone, the run is over.
    if style == Style::Rlock {
        loop {
            if park.query_async::<Value>(&mut c).await.is_err() {
                return;
            }
            if looping.load(Ordering::SeqCst) {
                break;
            }
            let waited = wait.query_async::<Value>(&mut c).await;
            if waited.is_err() || give_back.query_async::<Value>(&mut c).await.is_err() {
                return;
            }
        }
    }
    loop {
        if wait.query_async::<Value>(&mut c).await.is_err() {
            return;
        }
        served.fetch_add(1, Ordering::SeqCst);
        if give_back.query_async::<Value>(&mut c).await.is_err() {
            return;
        }
    }
}

async fn measure(style: Style, waiters: usize, locks: usize, sizes: &Sizes) -> Costs {
    let server = Server::builder()
        .config("maxclients", &(waiters + 64).to_string())
        .config("appendonly", "no")
        .start();
    let mut con = util::conn(&server).await;
    let pid = util::info_num(&mut con, "server", "process_id").await as u32;
    let hold = |i: usize| cmd(&["RLOCK.ACQUIRE", &key(i, locks), "holder", "600000"]);
    if style == Style::Rlock {
        each(&mut con, locks, hold).await;
    }
    let idle_before = idle_cpu(pid, sizes.idle).await;
    let memory_before = util::info_num(&mut con, "memory", "used_memory").await;
    let (looping, served) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicU64::new(0)));
    let mut tasks = Vec::with_capacity(waiters);
    for id in 0..waiters {
        let c = util::conn(&server).await;
        let (looping, served) = (Arc::clone(&looping), Arc::clone(&served));
        tasks.push(tokio::spawn(waiter(c, id, key(id, locks), style, looping, served)));
        if (id + 1) % BATCH == 0 {
            util::until_blocked(&mut con, id + 1).await;
        }
    }
    util::until_blocked(&mut con, waiters).await;
    let push = |id: usize| cmd(&["RPUSH", &format!("park:{id}"), "go"]);
    let release = |i: usize| cmd(&["RLOCK.RELEASE", &key(i, locks), "holder"]);
    let (mut idle_parked, mut idle_waiting) = (Vec::new(), Vec::new());
    if style == Style::Rlock {
        // Rounds: the same clients idle parked in BLPOP, then idle waiting for their locks
        // (every BLPOP is served inside the RPUSH pipeline, so then all blocked = all waiting),
        // then the holders let the queues drain and every client parks again.
        for _ in 0..sizes.idle_rounds {
            idle_parked.push(idle_cpu(pid, sizes.idle).await);
            each(&mut con, waiters, push).await;
            util::until_blocked(&mut con, waiters).await;
            idle_waiting.push(idle_cpu(pid, sizes.idle).await);
            each(&mut con, locks, release).await;
            util::until_blocked(&mut con, waiters).await;
            each(&mut con, locks, hold).await;
        }
        looping.store(true, Ordering::SeqCst);
        each(&mut con, waiters, push).await;
        util::until_blocked(&mut con, waiters).await;
    }
    let idle_blocked = idle_cpu(pid, sizes.idle).await;
    // After an idle interval: the server's cron has shrunk the idle clients' buffers by now.
    let memory_blocked = util::info_num(&mut con, "memory", "used_memory").await;

    // The hand-offs: each lock's holder releases (each list gets its token), and every waiter,
    // once served, gives back and waits again, so the queues keep their lengths.
    util::reset_stats(&mut con).await;
    match style {
        Style::Rlock => each(&mut con, locks, release).await,
        Style::Blpop => each(&mut con, locks, |i| cmd(&["RPUSH", &key(i, locks), "token"])).await,
    }
    let handoffs = sizes.handoffs.max(locks as u64);
    let (started, mut last, mut last_progress) = (Instant::now(), 0, Instant::now());
    let stalled = loop {
        let now = served.load(Ordering::SeqCst);
        if now >= handoffs {
            break false;
        }
        if now > last + 100 {
            (last, last_progress) = (now, Instant::now());
        }
        if last_progress.elapsed() > Duration::from_secs(30)
            || started.elapsed() > Duration::from_secs(300)
        {
            eprintln!("hand-offs stalled at {now} of {handoffs}");
            break true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let (give_back, wait) = match style {
        Style::Rlock => ("rlock.release", "rlock.acquire"),
        Style::Blpop => ("rpush", "blpop"),
    };
    let (handoff, enqueue) = if stalled {
        (f64::NAN, f64::NAN)
    } else {
        (util::usec_per_call(&mut con, give_back).await, util::usec_per_call(&mut con, wait).await)
    };
    for t in &tasks {
        t.abort();
    }
    drop(server);
    Costs {
        bytes_per_waiter: (memory_blocked - memory_before) / waiters as f64,
        enqueue,
        handoff,
        idle_before,
        idle_blocked: if idle_waiting.is_empty() { idle_blocked } else { median(&idle_waiting) },
        idle_parked,
        idle_waiting,
    }
}

fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    util::percentile(&sorted, 50.0)
}

pub async fn run(sizes: &Sizes) -> (Section, Vec<Target>) {
    let (asked, locks) = sizes.waiting;
    // One connection per waiter here and one client per waiter in the server.
    let room = util::connections_room();
    let waiters = match asked {
        n if n <= room => n,
        _ if room >= 1_000 => room / 1_000 * 1_000,
        _ => room.max(1),
    };
    let locks = locks.min(waiters);
    let rlock = measure(Style::Rlock, waiters, locks, sizes).await;
    let blpop = measure(Style::Blpop, waiters, locks, sizes).await;
    let limited = if waiters < asked {
        format!(
            " **{waiters} waiters, not the {asked} asked for:** every waiter is a connection, a \
             file descriptor in this process and one in the server, and this machine's open-files \
             limit is {} per process (a hard limit this container cannot raise), so the server \
             cannot hold {asked} clients; these rows are the largest run that fits.",
            util::fd_limit()
        )
    } else {
        String::new()
    };
    let idle = sizes.idle.as_secs_f64();
    let rounds = rlock.idle_waiting.len();
    // Per round, the same server and clients: waiting for their locks, less parked in BLPOP.
    let shares: Vec<f64> =
        rlock.idle_waiting.iter().zip(&rlock.idle_parked).map(|(w, p)| w - p).collect();
    let poll = median(&shares);
    let list = |v: &[f64]| v.iter().map(|x| num(*x)).collect::<Vec<_>>().join(", ");
    let mut section = Section::new(
        "10. Scale of waiting",
        &format!(
            "{waiters} clients, each its own connection, wait for {locks} locks (client i for lock \
             i mod {locks}, held by another owner), then loop as in section 4: once served, give \
             back and wait again, so every queue keeps its length. BLPOP baseline: the same on \
             {locks} lists, on a server of its own. Bytes per waiter: used_memory growth from \
             before the clients connect to the end of an idle interval with all of them blocked \
             (connections included; by then the server's cron has shrunk idle clients' reply \
             and query buffers, which section 4 measures still at their first size; it does not \
             reach the two temporary clients of a module-blocked client). Enqueue and hand-off: \
             server µs per call over {} hand-offs, every waiter queued. Idle CPU: the server's \
             user + system time (/proc/<pid>/stat) over {idle:.0} s in which no client sends \
             anything, in % of one core. The module looks at every waited lock at its poll \
             (every 10 ms, or spread to at most 5,000 looks a second); a BLPOP waiter is never \
             looked at. The poll's share is measured on one server with the same {waiters} \
             clients, in {rounds} rounds: idle with every client parked in a BLPOP on a list of \
             its own (no lock waited for), then idle with every client waiting for its lock; \
             per round the difference, and its median is the Target row.{limited}",
            sizes.handoffs.max(locks as u64)
        ),
        &["measure", "rlock WAIT", "BLPOP / RPUSH", "rlock / BLPOP"],
    );
    let mut row = |what: &str, r: f64, b: f64| {
        section.row(vec![what.to_owned(), num(r), num(b), ratio(r, b)]);
    };
    row("bytes per waiter", rlock.bytes_per_waiter, blpop.bytes_per_waiter);
    row("µs per enqueue", rlock.enqueue, blpop.enqueue);
    row("µs per hand-off", rlock.handoff, blpop.handoff);
    row("µs per cycle", rlock.enqueue + rlock.handoff, blpop.enqueue + blpop.handoff);
    row("idle CPU %, no waiter (the locks held)", rlock.idle_before, blpop.idle_before);
    row(
        &format!("idle CPU %, all waiting (rlock: median of {rounds} rounds)"),
        rlock.idle_blocked,
        blpop.idle_blocked,
    );
    section.row(vec![
        format!("idle CPU %, the same clients parked in BLPOP, per round"),
        list(&rlock.idle_parked),
        String::new(),
        String::new(),
    ]);
    section.row(vec![
        format!("idle CPU %, the same clients waiting for {locks} locks, per round"),
        list(&rlock.idle_waiting),
        String::new(),
        String::new(),
    ]);
    section.row(vec![
        format!("the poll's share, % of a core (median of {rounds} rounds)"),
        num(poll),
        String::new(),
        String::new(),
    ]);
    let targets = vec![Target::at_most(
        &format!("idle CPU % of a core the poll adds, {locks} waited locks, {waiters} waiters"),
        poll,
        POLL_TARGET_PERCENT,
    )];
    (section, targets)
}
