//! Section 1, server cost per command: `usec_per_call` from INFO commandstats and pipelined throughput
//! (50 clients, pipeline 16) for rlock, the same logic in Lua (EVALSHA), and the floor
//! (`SET NX PX` / `PEXPIRE` / `DEL`), and the floor module's same write (`floor.rs`: the
//! module-API work of the path, no lock logic).

use redis::Cmd;
use rlock_tests_integration::command as cmd;

use crate::report::{num, ratio, Section, Target};
use crate::util::{self, channel, Scripts};
use crate::Sizes;

const OWNER: &str = "8b9f3c1e-2a7d-4c55-9e0b-1f2d3c4b5a69:1";
const CLIENTS: usize = 50;
const PIPELINE: usize = 16;

struct Measure {
    usec: f64,
    ops_per_sec: f64,
}

/// Runs `make` over `n` commands after a stats reset; reads `stat`'s usec_per_call.
async fn measure<F>(
    server: &rlock_tests_integration::Server,
    n: u64,
    stat: &str,
    make: F,
) -> Measure
where
    F: Fn(u64) -> Cmd + Send + Sync + 'static,
{
    let mut con = util::conn(server).await;
    util::reset_stats(&mut con).await;
    let ops_per_sec = util::drive(server, CLIENTS, PIPELINE, n, make).await;
    Measure { usec: util::usec_per_call(&mut con, stat).await, ops_per_sec }
}

/// The columns of one operation: rlock, Lua, floor, and the floor module's same write (none
/// for renew).
struct Trio {
    rlock: Measure,
    lua: Measure,
    floor: Measure,
    module: Option<Measure>,
}

/// The fresh-key acquire of each contender: rlock, Lua, `SET NX PX`, the floor module's write.
fn fresh_acquire(which: usize, scripts: &Scripts) -> impl Fn(u64) -> Cmd + Send + Sync + 'static {
    let sha = scripts.acquire.clone();
    move |i| match which {
        0 => cmd(&["RLOCK.ACQUIRE", &format!("l:{i}"), OWNER, "60000"]),
        1 => cmd(&["EVALSHA", &sha, "1", &format!("e:{i}"), "60000", OWNER]),
        2 => cmd(&["SET", &format!("s:{i}"), OWNER, "NX", "PX", "60000"]),
        _ => cmd(&["FLOOR.HSET", &format!("f:{i}"), OWNER, "1", "60000"]),
    }
}

const FRESH_STATS: [&str; 4] = ["rlock.acquire", "evalsha", "set", "floor.hset"];
const ROUNDS: usize = 3;

/// Fresh-key acquires, fairly: after a warm-up fill (so no contender pays for memory the
/// server first takes from the OS), three rounds in rotating order, each on an emptied
/// keyspace; the median round of each contender.
async fn fresh_acquires(
    server: &rlock_tests_integration::Server,
    con: &mut redis::aio::MultiplexedConnection,
    scripts: &Scripts,
    n: u64,
) -> [Measure; 4] {
    util::call(con, &["FLUSHALL"]).await;
    util::drive(server, CLIENTS, PIPELINE, n, fresh_acquire(0, scripts)).await;
    let mut rounds: [Vec<Measure>; 4] = Default::default();
    for round in 0..ROUNDS {
        for k in 0..4 {
            let which = (round + k) % 4;
            util::call(con, &["FLUSHALL"]).await;
            rounds[which]
                .push(measure(server, n, FRESH_STATS[which], fresh_acquire(which, scripts)).await);
        }
    }
    rounds.map(|mut r| {
        r.sort_by(|a, b| a.usec.total_cmp(&b.usec));
        r.swap_remove(ROUNDS / 2)
    })
}

async fn run_on(server: &rlock_tests_integration::Server, n: u64) -> [Trio; 4] {
    let mut con = util::conn(server).await;
    let scripts = Scripts::load(&mut con).await;
    let [acquire, lua_acquire, set, floor_set] =
        fresh_acquires(server, &mut con, &scripts, n).await;

    // Renew and release-to-zero on n held locks of each kind, set up unmeasured.
    util::call(&mut con, &["FLUSHALL"]).await;
    util::drive(server, CLIENTS, PIPELINE, n, fresh_acquire(0, &scripts)).await;
    let renew = measure(server, n, "rlock.renew", |i| {
        cmd(&["RLOCK.RENEW", &format!("l:{i}"), OWNER, "60000"])
    })
    .await;
    let release =
        measure(server, n, "rlock.release", |i| cmd(&["RLOCK.RELEASE", &format!("l:{i}"), OWNER]))
            .await;
    util::call(&mut con, &["RLOCK.ACQUIRE", "held", OWNER, "60000"]).await;
    let reenter =
        measure(server, n, "rlock.acquire", |_| cmd(&["RLOCK.ACQUIRE", "held", OWNER, "60000"]))
            .await;

    util::call(&mut con, &["FLUSHALL"]).await;
    util::drive(server, CLIENTS, PIPELINE, n, fresh_acquire(1, &scripts)).await;
    let s = scripts.clone();
    let lua_renew = measure(server, n, "evalsha", move |i| {
        cmd(&["EVALSHA", &s.renew, "1", &format!("e:{i}"), "60000", OWNER])
    })
    .await;
    let s = scripts.clone();
    let lua_release = measure(server, n, "evalsha", move |i| {
        let key = format!("e:{i}");
        cmd(&["EVALSHA", &s.release, "2", &key, &channel(&key), "0", "60000", OWNER])
    })
    .await;
    util::call(&mut con, &["EVALSHA", &scripts.acquire, "1", "held", "60000", OWNER]).await;
    let s = scripts.clone();
    let lua_reenter = measure(server, n, "evalsha", move |_| {
        cmd(&["EVALSHA", &s.acquire, "1", "held", "60000", OWNER])
    })
    .await;

    util::call(&mut con, &["FLUSHALL"]).await;
    util::drive(server, CLIENTS, PIPELINE, n, fresh_acquire(2, &scripts)).await;
    let pexpire =
        measure(server, n, "pexpire", |i| cmd(&["PEXPIRE", &format!("s:{i}"), "60000"])).await;
    let del = measure(server, n, "del", |i| cmd(&["DEL", &format!("s:{i}")])).await;
    util::call(&mut con, &["SET", "held", OWNER]).await;
    let set_again =
        measure(server, n, "set", |_| cmd(&["SET", "held", OWNER, "XX", "PX", "60000"])).await;

    // The floor module: the held key rewritten (re-entry), then n deletes with the publish.
    util::call(&mut con, &["FLUSHALL"]).await;
    util::drive(server, CLIENTS, PIPELINE, n, fresh_acquire(3, &scripts)).await;
    let floor_del = measure(server, n, "floor.hdel", |i| {
        let key = format!("f:{i}");
        cmd(&["FLOOR.HDEL", &key, OWNER, &channel(&key), "0"])
    })
    .await;
    util::call(&mut con, &["FLOOR.HSET", "held", OWNER, "1", "60000"]).await;
    let floor_again =
        measure(server, n, "floor.hset", |_| cmd(&["FLOOR.HSET", "held", OWNER, "1", "60000"]))
            .await;

    [
        Trio { rlock: acquire, lua: lua_acquire, floor: set, module: Some(floor_set) },
        Trio { rlock: reenter, lua: lua_reenter, floor: set_again, module: Some(floor_again) },
        Trio { rlock: release, lua: lua_release, floor: del, module: Some(floor_del) },
        Trio { rlock: renew, lua: lua_renew, floor: pexpire, module: None },
    ]
}

const NAMES: [(&str, &str); 4] = [
    ("acquire, fresh key", "SET NX PX"),
    ("acquire, re-entrant (held key)", "SET XX PX"),
    ("release to zero (+ publish)", "DEL"),
    ("renew", "PEXPIRE"),
];

fn row(name: &str, floor: &str, t: &Trio) -> Vec<String> {
    let module = t.module.as_ref().map_or(f64::NAN, |m| m.usec);
    vec![
        name.to_owned(),
        num(t.rlock.usec),
        num(t.lua.usec),
        floor.to_owned(),
        num(t.floor.usec),
        ratio(t.rlock.usec, t.lua.usec),
        ratio(t.rlock.usec, t.floor.usec),
        num(module),
        ratio(t.rlock.usec, module),
        num(t.rlock.ops_per_sec),
        num(t.lua.ops_per_sec),
        num(t.floor.ops_per_sec),
    ]
}

pub async fn run(sizes: &Sizes) -> (Section, Vec<Target>) {
    let mut section = Section::new(
        "1. Server cost per command",
        "Server time per call (`usec_per_call`, INFO commandstats) and pipelined throughput \
         (50 clients, pipeline 16) for rlock, the same logic as a Lua script via EVALSHA \
         (Redisson's acquire/release/renew, written from the lock model), and the floor. Fresh \
         keys are new for every command; the fresh-key acquires run after a warm-up fill, three \
         rounds in rotating order on an emptied keyspace, and the median round is shown. The second block repeats acquire with AOF on \
         (`appendfsync no`), where rlock replicates its effects (`HSET` + `PEXPIREAT`) and \
         Redis rewrites `SET ... PX` as `SET ... PXAT`. The floor module (`bench/floor`, \
         loaded beside rlock) does only the module-API work of each path: `FLOOR.HSET` opens \
         the key, sets one field and an absolute expiry, notifies and replicates one \
         `RESTORE ... REPLACE ABSTTL` (as rlock does when anything may be propagated); \
         `FLOOR.HDEL` deletes the field (and the key), replicates `DEL` and publishes the \
         unlock message; no owner check, no ACL check of the channel, no waiters. The last rows \
         (AOF on) are the read-write lock and the semaphore beside Redisson's scripts and the \
         plain command of a one-key write.",
        &[
            "operation",
            "rlock µs",
            "Lua µs",
            "floor",
            "floor µs",
            "rlock/Lua",
            "rlock/floor",
            "floor module µs",
            "rlock/floor module",
            "rlock ops/s",
            "Lua ops/s",
            "floor ops/s",
        ],
    );
    let n = sizes.ops;
    let server = crate::floor::with_floor(
        rlock_tests_integration::Server::builder().config("appendonly", "no"),
    )
    .start();
    let results = run_on(&server, n).await;
    drop(server);
    for ((name, floor), t) in NAMES.iter().zip(&results) {
        section.row(row(name, floor, t));
    }
    let [acquire, _, release, _] = &results;
    let mut targets = vec![
        Target::at_most("acquire µs / Lua acquire µs", acquire.rlock.usec / acquire.lua.usec, 0.5),
        Target::at_most("acquire µs / SET NX PX µs", acquire.rlock.usec / acquire.floor.usec, 1.5),
        Target::at_most(
            "release-to-zero µs / Lua release µs",
            release.rlock.usec / release.lua.usec,
            0.5,
        ),
    ];

    let aof = crate::floor::with_floor(
        rlock_tests_integration::Server::builder()
            .config("appendonly", "yes")
            .config("appendfsync", "no"),
    )
    .start();
    let with_aof = run_on(&aof, n / 2).await;
    for ((name, floor), t) in NAMES.iter().zip(&with_aof) {
        section.row(row(&format!("{name}, AOF on"), floor, t));
    }
    drop(aof);
    for row in crate::cost_kinds::rows(n / 2).await {
        section.row(row);
    }
    let [acquire, reenter, release, _] = &with_aof;
    targets.extend([
        Target::at_most(
            "acquire µs / Lua acquire µs, AOF on",
            acquire.rlock.usec / acquire.lua.usec,
            0.45,
        ),
        Target::at_most(
            "acquire µs / SET NX PX µs, AOF on",
            acquire.rlock.usec / acquire.floor.usec,
            1.5,
        ),
        Target::at_most(
            "re-entrant acquire µs / SET XX PX µs, AOF on",
            reenter.rlock.usec / reenter.floor.usec,
            2.0,
        ),
        Target::at_most(
            "release-to-zero µs / DEL µs, AOF on",
            release.rlock.usec / release.floor.usec,
            2.0,
        ),
    ]);
    for (what, t) in
        [("acquire", acquire), ("re-entrant acquire", reenter), ("release-to-zero", release)]
    {
        let module = t.module.as_ref().map_or(f64::NAN, |m| m.usec);
        targets.push(Target::at_most(
            &format!("{what} µs / floor module's write µs, AOF on"),
            t.rlock.usec / module,
            1.2,
        ));
    }
    (section, targets)
}
