//! Section 9, the module's cost to unrelated workloads: the same server with and without the
//! module loaded, nobody using a lock. `DEL` of existing keys (server µs per call) and the
//! active expiry of many keys (server CPU per expired key): both would go through a keyspace
//! subscription, so this guards against one coming back.

use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;
use rlock_tests_integration::Server;

use crate::report::{num, ratio, Section, Target};
use crate::util;
use crate::Sizes;

/// Keys written per pipeline.
const BATCH: usize = 1_000;

struct Costs {
    del_usec: f64,
    expiry_cpu_usec: f64,
}

async fn write_keys(con: &mut MultiplexedConnection, keys: usize, px: Option<u64>) {
    for start in (0..keys).step_by(BATCH) {
        let mut pipe = redis::pipe();
        for i in start..(start + BATCH).min(keys) {
            let c = pipe.cmd("SET").arg(format!("k:{i}")).arg("v");
            if let Some(px) = px {
                c.arg("PX").arg(px);
            }
            c.ignore();
        }
        let () = pipe.query_async(con).await.expect("SET");
    }
}

async fn cpu_seconds(con: &mut MultiplexedConnection) -> f64 {
    util::info_num(con, "cpu", "used_cpu_user").await
        + util::info_num(con, "cpu", "used_cpu_sys").await
}

async fn measure(module: bool, keys: usize) -> Costs {
    let builder = Server::builder().config("appendonly", "no");
    let server = if module { builder.start() } else { builder.without_module().start() };
    let mut con = util::conn(&server).await;
    // DEL of existing keys.
    write_keys(&mut con, keys, None).await;
    util::reset_stats(&mut con).await;
    for start in (0..keys).step_by(BATCH) {
        let mut pipe = redis::pipe();
        for i in start..(start + BATCH).min(keys) {
            pipe.cmd("DEL").arg(format!("k:{i}")).ignore();
        }
        let () = pipe.query_async(&mut con).await.expect("DEL");
    }
    let del_usec = util::usec_per_call(&mut con, "del").await;
    // Active expiry: the keys expire 100 ms after they were written; the server's CPU while
    // its expiry cycle deletes them (idle cron time included, the same in both runs).
    write_keys(&mut con, keys, Some(100)).await;
    let before = cpu_seconds(&mut con).await;
    let until = Instant::now() + Duration::from_secs(120);
    loop {
        let left: i64 = redis::cmd("DBSIZE").query_async(&mut con).await.expect("DBSIZE");
        if left == 0 {
            break;
        }
        assert!(Instant::now() < until, "the keys did not expire");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let expiry_cpu_usec = (cpu_seconds(&mut con).await - before) * 1e6 / keys as f64;
    Costs { del_usec, expiry_cpu_usec }
}

/// Rounds per configuration, alternating without and with the module; the median counts (on a
/// shared 2-core machine one run of either measure moves by half its value).
const ROUNDS: usize = 3;

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

pub async fn run(sizes: &Sizes) -> (Section, Vec<Target>) {
    let keys = sizes.unrelated;
    let mut rounds = (Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        rounds.0.push(measure(false, keys).await);
        rounds.1.push(measure(true, keys).await);
    }
    let summary = |costs: &[Costs]| Costs {
        del_usec: median(costs.iter().map(|c| c.del_usec).collect()),
        expiry_cpu_usec: median(costs.iter().map(|c| c.expiry_cpu_usec).collect()),
    };
    let (without, with) = (summary(&rounds.0), summary(&rounds.1));
    let mut section = Section::new(
        "9. Cost to unrelated workloads",
        &format!(
            "The same server with and without the module, no lock in use: DEL of {keys} existing \
             keys (server µs per call, INFO commandstats), and the active expiry of {keys} keys \
             written with PX 100 (server CPU, user + sys, per expired key, until DBSIZE is 0; \
             idle cron time included in both). Each is the median of {ROUNDS} rounds, a fresh \
             server each, alternating without and with the module. The module subscribes to no \
             keyspace event; all it adds when unused is its cron tick's replica check."
        ),
        &["measure", "without the module", "with the module", "with / without"],
    );
    section.row(vec![
        "DEL µs per call".to_owned(),
        num(without.del_usec),
        num(with.del_usec),
        ratio(with.del_usec, without.del_usec),
    ]);
    section.row(vec![
        "active expiry, CPU µs per key".to_owned(),
        num(without.expiry_cpu_usec),
        num(with.expiry_cpu_usec),
        ratio(with.expiry_cpu_usec, without.expiry_cpu_usec),
    ]);
    let targets = vec![
        Target::at_most(
            "DEL µs with the module / without",
            with.del_usec / without.del_usec.max(f64::MIN_POSITIVE),
            1.03,
        ),
        Target::at_most(
            "active expiry CPU per key with the module / without",
            with.expiry_cpu_usec / without.expiry_cpu_usec.max(f64::MIN_POSITIVE),
            1.03,
        ),
    ];
    (section, targets)
}
