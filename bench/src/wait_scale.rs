//! Section 10, scale of waiting (issue 28 §3): tens of thousands of clients waiting for
//! thousands of locks. The server memory per waiter, the enqueue and the hand-off at that
//! scale, and the server's CPU while they all wait and nothing else happens (what the module's
//! poll of the waited locks costs), read from `/proc/<pid>/stat` (utime + stime) over an idle
//! interval; against the same clients blocked in `BLPOP` on as many lists.
//!
//! Every waiter is a connection: one file descriptor here and one in the server, each process
//! under the open-files limit (raised as far as allowed). When the limit cannot hold the waiters
//! asked for, the section measures the most it can hold and its note says so.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

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
    /// Server CPU over the idle interval, % of one core, with no waiter (only the locks held)
    /// and with every waiter blocked.
    idle_before: f64,
    idle_blocked: f64,
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

async fn measure(style: Style, waiters: usize, locks: usize, sizes: &Sizes) -> Costs {
    let server = Server::builder()
        .config("maxclients", &(waiters + 64).to_string())
        .config("appendonly", "no")
        .start();
    let mut con = util::conn(&server).await;
    let pid = util::info_num(&mut con, "server", "process_id").await as u32;
    if style == Style::Rlock {
        for chunk in (0..locks).collect::<Vec<_>>().chunks(BATCH) {
            let mut pipe = redis::pipe();
            for &i in chunk {
                pipe.cmd("RLOCK.ACQUIRE").arg(key(i, locks)).arg("holder").arg(600_000);
            }
            let _: Vec<Value> = pipe.query_async(&mut con).await.expect("the holders");
        }
    }
    let idle_before = idle_cpu(pid, sizes.idle).await;
    let memory_before = util::info_num(&mut con, "memory", "used_memory").await;
    let served = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::with_capacity(waiters);
    for id in 0..waiters {
        let mut c = util::conn(&server).await;
        let served = Arc::clone(&served);
        let key = key(id, locks);
        tasks.push(tokio::spawn(async move {
            let owner = format!("w{id}");
            let (wait, give_back) = match style {
                Style::Rlock => (
                    redis::cmd("RLOCK.ACQUIRE")
                        .arg(&key)
                        .arg(&owner)
                        .arg(600_000)
                        .arg("WAIT")
                        .arg(0)
                        .clone(),
                    redis::cmd("RLOCK.RELEASE").arg(&key).arg(&owner).clone(),
                ),
                Style::Blpop => (
                    redis::cmd("BLPOP").arg(&key).arg(0).clone(),
                    redis::cmd("RPUSH").arg(&key).arg("token").clone(),
                ),
            };
            loop {
                if wait.query_async::<Value>(&mut c).await.is_err() {
                    return; // the server is gone: the run is over
                }
                served.fetch_add(1, Ordering::SeqCst);
                if give_back.query_async::<Value>(&mut c).await.is_err() {
                    return;
                }
            }
        }));
        if (id + 1) % BATCH == 0 {
            util::until_blocked(&mut con, id + 1).await;
        }
    }
    util::until_blocked(&mut con, waiters).await;
    let memory_blocked = util::info_num(&mut con, "memory", "used_memory").await;
    let idle_blocked = idle_cpu(pid, sizes.idle).await;

    // The hand-offs: each lock's holder releases (each list gets its token), and every waiter,
    // once served, gives back and waits again, so the queues keep their lengths.
    util::reset_stats(&mut con).await;
    for chunk in (0..locks).collect::<Vec<_>>().chunks(BATCH) {
        let mut pipe = redis::pipe();
        for &i in chunk {
            match style {
                Style::Rlock => pipe.cmd("RLOCK.RELEASE").arg(key(i, locks)).arg("holder"),
                Style::Blpop => pipe.cmd("RPUSH").arg(key(i, locks)).arg("token"),
            };
        }
        let _: Vec<Value> = pipe.query_async(&mut con).await.expect("the first hand-offs");
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
        idle_blocked,
    }
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
    let mut section = Section::new(
        "10. Scale of waiting",
        &format!(
            "{waiters} clients, each its own connection, wait for {locks} locks (client i for lock \
             i mod {locks}, held by another owner), then loop as in section 4: once served, give \
             back and wait again, so every queue keeps its length. Bytes per waiter: used_memory \
             growth as they block (connections included). Enqueue and hand-off: server µs per \
             call over {} hand-offs, with every waiter queued. Idle CPU: the server's user + \
             system time (/proc/<pid>/stat) over {idle:.0} s in which no client sends anything, \
             in % of one core, before the waiters come (the locks held) and with all of them \
             blocked. The module looks at every waited lock at its poll (every 10 ms, or spread \
             to at most 5,000 looks a second); BLPOP waiters are never looked at, so the idle \
             CPU rlock's waiters add over BLPOP's is the poll's share.{limited}",
            sizes.handoffs.max(locks as u64)
        ),
        &[
            "style",
            "waiters",
            "locks",
            "bytes per waiter",
            "µs per enqueue",
            "µs per hand-off",
            "µs per cycle",
            "idle CPU %, no waiter",
            "idle CPU %, all waiting",
        ],
    );
    for (name, c) in [("rlock WAIT", &rlock), ("BLPOP / RPUSH", &blpop)] {
        section.row(vec![
            name.to_owned(),
            waiters.to_string(),
            locks.to_string(),
            num(c.bytes_per_waiter),
            num(c.enqueue),
            num(c.handoff),
            num(c.enqueue + c.handoff),
            num(c.idle_before),
            num(c.idle_blocked),
        ]);
    }
    let poll = rlock.idle_blocked - blpop.idle_blocked;
    section.note.push_str(&format!(
        " The poll's share: {} % of a core (rlock's idle CPU with every client waiting, less \
         BLPOP's); rlock over BLPOP: bytes per waiter {}, hand-off {}, enqueue {}.",
        num(poll),
        ratio(rlock.bytes_per_waiter, blpop.bytes_per_waiter),
        ratio(rlock.handoff, blpop.handoff),
        ratio(rlock.enqueue, blpop.enqueue),
    ));
    let targets = vec![Target::at_most(
        &format!("idle CPU % of a core the poll adds, {locks} waited locks, {waiters} waiters"),
        poll,
        POLL_TARGET_PERCENT,
    )];
    (section, targets)
}
