//! Section 13, the stale-master guard's cost: what keeping a lock off a stale master costs each
//! acquire, with one replica. rlock's guard refuses before it writes, from the replica checks
//! the master makes on its cron: an acquire stays one round trip. Redisson (3.17+, by default:
//! `checkLockSyncedSlaves`, `slavesSyncTimeout` 1000 ms) writes the grant, then sends `WAIT`
//! for a replica and undoes the grant when none answers: two round trips. One client, one
//! acquire at a time (the latency each caller sees), fresh keys, in the same run; then the
//! replica is gone and each is asked on the stale master.

use std::time::Instant;

use redis::aio::MultiplexedConnection;
use redis::Value;
use rlock_tests_integration::{wait_replica_online, Server};

use crate::report::{num, ratio, Section, Target};
use crate::util::{self, percentile, Scripts};
use crate::Sizes;

const LEASE: &str = "30000";
/// Redisson's default `slavesSyncTimeout`.
const SYNC_TIMEOUT_MS: &str = "1000";
/// Rounds on the stale master (each Redisson-style one waits the whole timeout).
const STALE_ROUNDS: usize = 3;

/// How each acquire is made.
#[derive(Clone, Copy)]
enum Way {
    /// `RLOCK.ACQUIRE`, guarded by the module.
    Guarded,
    /// The Redisson acquire script, then `WAIT 1 1000` (undone when it answers 0).
    LuaThenWait,
    /// `RLOCK.ACQUIRE`, then `WAIT 1 1000` (the Rust client's `replica_ack(1, ...)`).
    GuardedThenWait,
}

/// One acquire of `key`; whether it was granted.
async fn acquire(con: &mut MultiplexedConnection, scripts: &Scripts, way: Way, key: &str) -> bool {
    let granted = match way {
        Way::Guarded | Way::GuardedThenWait => {
            let reply: redis::RedisResult<Value> =
                redis::cmd("RLOCK.ACQUIRE").arg(key).arg("o").arg(LEASE).query_async(con).await;
            matches!(reply, Ok(Value::Nil))
        }
        Way::LuaThenWait => {
            let pttl: Option<i64> = redis::cmd("EVALSHA")
                .arg(&scripts.acquire)
                .arg(1)
                .arg(key)
                .arg(LEASE)
                .arg("o")
                .query_async(con)
                .await
                .expect("lua acquire");
            pttl.is_none()
        }
    };
    if !granted || matches!(way, Way::Guarded) {
        return granted;
    }
    let acked: i64 =
        redis::cmd("WAIT").arg(1).arg(SYNC_TIMEOUT_MS).query_async(con).await.expect("WAIT");
    if acked >= 1 {
        return true;
    }
    // No replica answered: the grant is undone (Redisson runs its unlock).
    match way {
        Way::LuaThenWait => util::redisson_release(con, scripts, key, 30_000, "o").await,
        _ => util::rlock_release(con, key, "o").await,
    }
    false
}

/// Client-side latency of `n` acquires of fresh keys, in µs, sorted.
async fn latencies(
    con: &mut MultiplexedConnection,
    scripts: &Scripts,
    way: Way,
    tag: &str,
    n: u64,
) -> Vec<f64> {
    let mut out = Vec::with_capacity(usize::try_from(n).unwrap_or(0));
    for i in 0..n {
        let key = format!("guard:{tag}:{i}");
        let started = Instant::now();
        assert!(acquire(con, scripts, way, &key).await, "{tag}: not granted with the replica up");
        out.push(started.elapsed().as_secs_f64() * 1e6);
    }
    out.sort_by(f64::total_cmp);
    out
}

fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len().max(1) as f64
}

pub async fn run(sizes: &Sizes) -> (Section, Vec<Target>) {
    let master = util::server();
    let replica = Server::builder().without_module().replica_of(&master).start();
    wait_replica_online(&master);
    let mut con = util::conn(&master).await;
    let scripts = Scripts::load(&mut con).await;
    // The guard counts the replica once the cron has seen it.
    while util::info_num(&mut con, "rlock", "rlock_grants_allowed").await < 1.0
        || util::info_num(&mut con, "rlock", "rlock_replicas_in_sync").await < 1.0
    {
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let n = (sizes.ops / 20).max(50);
    let mut section = Section::new(
        "13. Stale-master guard: acquire cost with one replica",
        "One client, one acquire at a time on fresh keys (client-side latency, loopback), a \
         master with one module-less replica. rlock refuses on a stale master before it writes \
         (its cron checks the replicas): one round trip. Redisson-style is Redisson's default \
         since 3.17 (`checkLockSyncedSlaves`): the acquire script, then `WAIT 1 1000`, the grant \
         undone when no replica answers. rlock + WAIT is the Rust client's `replica_ack(1, ..)`, \
         which also confirms the grant itself reached a replica. Stale master: the replica is \
         stopped; time until the caller knows it has no lock.",
        &["acquire", "round trips", "mean µs", "p99 µs", "on a stale master"],
    );
    let ways = [
        (Way::Guarded, "rlock (guarded)", "1", "guarded"),
        (Way::LuaThenWait, "Redisson-style: script + WAIT 1", "2", "lua"),
        (Way::GuardedThenWait, "rlock + WAIT 1 (replica_ack)", "2", "ack"),
    ];
    let mut measured = Vec::new();
    for (way, _, _, tag) in ways {
        measured.push(latencies(&mut con, &scripts, way, tag, n).await);
    }

    // The replica is gone: a stale master (as seen by the guard, at the next cron).
    drop(replica);
    while util::info_num(&mut con, "rlock", "rlock_grants_allowed").await > 0.0 {
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let mut stale = Vec::new();
    for (way, _, _, tag) in ways {
        let mut times = Vec::new();
        for round in 0..STALE_ROUNDS {
            let key = format!("guard:stale:{tag}:{round}");
            let started = Instant::now();
            assert!(!acquire(&mut con, &scripts, way, &key).await, "{tag}: granted when stale");
            times.push(started.elapsed().as_secs_f64() * 1e3);
            let exists: i64 =
                redis::cmd("EXISTS").arg(&key).query_async(&mut con).await.expect("EXISTS");
            assert_eq!(exists, 0, "{tag}: the refused grant left its key");
        }
        times.sort_by(f64::total_cmp);
        stale.push(times[times.len() / 2]);
    }

    for (i, (_, label, trips, _)) in ways.iter().enumerate() {
        let v = &measured[i];
        section.row(vec![
            (*label).to_owned(),
            (*trips).to_owned(),
            num(mean(v)),
            num(percentile(v, 99.0)),
            format!("refused after {} ms", num(stale[i])),
        ]);
    }
    section.row(vec![
        "Redisson-style / rlock".to_owned(),
        String::new(),
        ratio(mean(&measured[1]), mean(&measured[0])),
        ratio(percentile(&measured[1], 99.0), percentile(&measured[0], 99.0)),
        ratio(stale[1], stale[0]),
    ]);
    let targets = vec![Target::at_most(
        "guarded acquire µs / Redisson-style acquire + WAIT µs, one replica",
        mean(&measured[0]) / mean(&measured[1]),
        1.0,
    )];
    (section, targets)
}
