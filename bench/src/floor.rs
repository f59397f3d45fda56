//! The floor module's rows (issue 28 §1): `bench/floor`, a module that does only the module-API
//! work each rlock path needs (block, unblock, write a one-field hash with an expiry and
//! replicate it as one command, publish) with no lock logic. Section 1 measures its write on
//! the same servers as rlock's (both modules loaded); section 4 runs its block/unblock loop in
//! both unblock styles. Every rlock row of both sections is also stated as a ratio to it.
//!
//! `RLOCK_BENCH_FLOOR_MODULE=path` loads another build of it (default
//! `target/release/librlock_floor.so`, which the Makefile's bench targets build first).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use rlock_tests_integration::server::Builder;
use rlock_tests_integration::Server;

use crate::queue_loop::{QueueCost, QueueLoop};
use crate::report::{num, Section, Target};
use crate::util;
use crate::Sizes;

/// The floor module's shared object.
pub fn module() -> String {
    let path = std::env::var_os("RLOCK_BENCH_FLOOR_MODULE").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/release/librlock_floor.so"),
        PathBuf::from,
    );
    assert!(
        path.exists(),
        "no floor module at {}: cargo build --release -p rlock-bench-floor",
        path.display()
    );
    path.to_string_lossy().into_owned()
}

/// `builder` with the floor module loaded too (beside rlock's, unless it has none).
pub fn with_floor(builder: Builder) -> Builder {
    builder.config("loadmodule", &module())
}

/// How the floor loop waits and wakes.
#[derive(Clone, Copy)]
enum Style {
    /// `FLOOR.BLOCK` / `FLOOR.UNBLOCK`: `RedisModule_BlockClient` + `RedisModule_UnblockClient`
    /// (a pipe write per wake-up), as rlock waits.
    Pipe,
    /// `FLOOR.BLOCKK` / `FLOOR.SIGNAL`: `RedisModule_BlockClientOnKeys` +
    /// `RedisModule_SignalKeyAsReady`.
    Keys,
}

impl Style {
    fn commands(self) -> (&'static str, &'static str) {
        match self {
            Self::Pipe => ("FLOOR.BLOCK", "FLOOR.UNBLOCK"),
            Self::Keys => ("FLOOR.BLOCKK", "FLOOR.SIGNAL"),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Self::Pipe => "floor module, BlockClient + UnblockClient",
            Self::Keys => "floor module, BlockClientOnKeys + SignalKeyAsReady",
        }
    }
}

const KEY: &str = "floor";

/// Section 4's loop on the floor module: `waiters` clients blocked at all times; each, once
/// served, wakes the next (FLOOR.UNBLOCK or FLOOR.SIGNAL) and blocks again. Server µs per call
/// over `handoffs` hand-offs (or what 20 s serve, at least 100), used_memory per waiting client.
async fn loop_cost(waiters: usize, handoffs: u64, style: Style) -> QueueCost {
    let builder = Server::builder().without_module().config("maxclients", "19000");
    let server = Arc::new(with_floor(builder.config("appendonly", "no")).start());
    let mut con = util::conn(&server).await;
    // Redis 7.0 offers a key to module clients blocked on it only while the key exists.
    util::call(&mut con, &["SET", KEY, "1"]).await;
    let (wait, wake) = style.commands();
    let queue = QueueLoop {
        name: style.name().to_owned(),
        waiters,
        handoffs,
        commands: Arc::new(move |_| {
            (redis::cmd(wait).arg(KEY).arg(0).clone(), redis::cmd(wake).arg(KEY).clone())
        }),
        start: vec![wake.to_owned(), KEY.to_owned()],
        stats: (wake.to_lowercase(), wait.to_lowercase()),
        also_blocked: 0,
        enough_after: Some(Duration::from_secs(20)),
    };
    queue.measure(&server, &mut con).await
}

/// Section 4: the floor loops' rows (both styles, few and many waiters), a column stating every
/// row against the floor module's BlockClient loop with as many waiters, and the targets.
pub async fn queue_rows(sizes: &Sizes, section: &mut Section) -> Vec<Target> {
    let (small, large) = sizes.queues;
    let mut pipe = Vec::new();
    let mut rows = Vec::new();
    for style in [Style::Pipe, Style::Keys] {
        for n in [small, large] {
            let c = loop_cost(n, sizes.handoffs, style).await;
            rows.push(vec![
                n.to_string(),
                style.name().to_owned(),
                num(c.handoff),
                num(c.enqueue),
                num(c.handoff + c.enqueue),
                num(c.bytes_per_waiter),
                "-".to_owned(),
            ]);
            if matches!(style, Style::Pipe) {
                pipe.push((n, c));
            }
        }
    }
    // The rlock rows already in the section, before the floor's own are added.
    let rlock_rows: Vec<usize> = (0..section.rows.len())
        .filter(|&i| section.rows[i].get(1).is_some_and(|s| s.starts_with("rlock")))
        .collect();
    let mut targets = Vec::new();
    for (n, floor) in &pipe {
        let Some(row) = rlock_rows
            .iter()
            .map(|&i| &section.rows[i])
            .find(|r| r[0] == n.to_string() && r[1] == "rlock WAIT")
        else {
            continue;
        };
        let cell = |name: &str| cell(section, row, name);
        targets.extend([
            Target::at_most(
                &format!("hand-off µs / floor module's (UnblockClient), {n} waiters"),
                cell("µs per hand-off") / floor.handoff,
                1.3,
            ),
            Target::at_most(
                &format!("enqueue µs / floor module's (BlockClient), {n} waiters"),
                cell("µs per enqueue") / floor.enqueue,
                1.3,
            ),
            Target::at_most(
                &format!("bytes per waiting client / floor module's, {n} waiters"),
                cell("bytes per waiting client") / floor.bytes_per_waiter,
                1.05,
            ),
        ]);
    }
    section.rows.extend(rows);
    section.header.push("vs floor module: hand-off / enqueue / cycle / bytes".to_owned());
    for i in 0..section.rows.len() {
        let row = &section.rows[i];
        let floor = pipe.iter().find(|(n, _)| row[0] == n.to_string()).map(|(_, c)| c);
        let text = match floor {
            Some(f) => {
                let cell = |name: &str| cell(section, row, name);
                let (h, e) = (cell("µs per hand-off"), cell("µs per enqueue"));
                [
                    h / f.handoff,
                    e / f.enqueue,
                    (h + e) / (f.handoff + f.enqueue),
                    cell("bytes per waiting client") / f.bytes_per_waiter,
                ]
                .map(|r| if r.is_nan() { "-".to_owned() } else { format!("{r:.2}x") })
                .join(" / ")
            }
            None => "-".to_owned(),
        };
        section.rows[i].push(text);
    }
    section.note.push_str(&format!(
        " Floor module rows: `bench/floor`, a module that does only the module-API work of \
         waiting (BlockClient with a disconnect callback, a VecDeque per key, UnblockClient; or \
         BlockClientOnKeys and SignalKeyAsReady) and none of rlock's (no hash, lease, owner, \
         ACL check, deadlock search, timers); each served client wakes the next and blocks \
         again, over {} hand-offs or what 20 s serve. Like BLPOP, a client blocked on keys is \
         served (and its reply counted) in FLOOR.BLOCKK's µs, after FLOOR.SIGNAL returns. The \
         last column states each row against the floor module's BlockClient loop with as many \
         waiters (the path rlock takes).",
        sizes.handoffs
    ));
    targets
}

/// The figure in `row`'s column `name` (NaN when absent or not a number).
fn cell(section: &Section, row: &[String], name: &str) -> f64 {
    section
        .header
        .iter()
        .position(|h| h == name)
        .and_then(|i| row.get(i)?.parse().ok())
        .unwrap_or(f64::NAN)
}
