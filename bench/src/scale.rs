//! Section 6, scale: memory per held lock against Redisson's layout and a SET NX string, and acquire
//! cost with many locks held against few.

use rlock_tests_integration::command as cmd;

use crate::report::{num, ratio, Section, Target};
use crate::util::{self, Scripts};
use crate::Sizes;

const OWNER: &str = "8b9f3c1e-2a7d-4c55-9e0b-1f2d3c4b5a69:1";

pub async fn run(sizes: &Sizes) -> (Section, Vec<Target>) {
    let n = sizes.scale;
    let server = util::server();
    let mut con = util::conn(&server).await;
    let scripts = Scripts::load(&mut con).await;

    let mut per_lock = Vec::new();
    for layout in ["rlock (RLOCK.ACQUIRE)", "Redisson (Lua)", "SET NX PX string"] {
        util::call(&mut con, &["FLUSHALL"]).await;
        let before = util::info_num(&mut con, "memory", "used_memory").await;
        let sha = scripts.acquire.clone();
        match layout {
            "rlock (RLOCK.ACQUIRE)" => {
                util::drive(&server, 50, 16, n, |i| {
                    cmd(&["RLOCK.ACQUIRE", &format!("lock:{i}"), OWNER, "600000"])
                })
                .await
            }
            "Redisson (Lua)" => {
                util::drive(&server, 50, 16, n, move |i| {
                    cmd(&["EVALSHA", &sha, "1", &format!("lock:{i}"), "600000", OWNER])
                })
                .await
            }
            _ => {
                util::drive(&server, 50, 16, n, |i| {
                    cmd(&["SET", &format!("lock:{i}"), OWNER, "NX", "PX", "600000"])
                })
                .await
            }
        };
        let after = util::info_num(&mut con, "memory", "used_memory").await;
        per_lock.push((layout, (after - before) / n as f64));
    }

    let probe = sizes.scale_probe;
    let mut cost = Vec::new();
    for held in [1_000u64, n] {
        util::call(&mut con, &["FLUSHALL"]).await;
        util::drive(&server, 50, 16, held, |i| {
            cmd(&["RLOCK.ACQUIRE", &format!("lock:{i}"), OWNER, "600000"])
        })
        .await;
        util::reset_stats(&mut con).await;
        util::drive(&server, 50, 16, probe, |i| {
            cmd(&["RLOCK.ACQUIRE", &format!("probe:{i}"), OWNER, "600000"])
        })
        .await;
        cost.push((held, util::usec_per_call(&mut con, "rlock.acquire").await));
    }

    let mut section = Section::new(
        "6. Scale",
        &format!(
            "Memory per held lock: used_memory growth over {n} locks (owner id `<uuid>:1`, key \
             `lock:<i>`, lease set). Acquire cost: server µs per RLOCK.ACQUIRE on {probe} new keys \
             with 1,000 and with {n} locks already held."
        ),
        &["measure", "value", "vs rlock"],
    );
    let rlock_bytes = per_lock[0].1;
    for (layout, bytes) in &per_lock {
        section.row(vec![
            format!("bytes per lock, {layout}"),
            num(*bytes),
            ratio(*bytes, rlock_bytes),
        ]);
    }
    for (held, usec) in &cost {
        section.row(vec![
            format!("acquire µs with {held} locks held"),
            num(*usec),
            ratio(*usec, cost[0].1),
        ]);
    }
    (section, Vec::<Target>::new())
}
