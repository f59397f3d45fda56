//! Section 4's deadlock rows: what deadlock detection adds to an enqueue (issue 27 §2's target).
//!
//! Two loops of `sizes.queues.0` waiters (section 4's loop) that differ only in the work the
//! enqueue's deadlock search has: both have as many extra blocked clients (one parked waiter per
//! loop waiter, each on a lock of its own held by `keeper`) and as many locks and queues. In
//! the "nowhere" loop the parked clients wait as owners of their own, so the lock's holder (a
//! loop owner) waits nowhere and the search stops at it; in the "elsewhere" loop they wait as
//! the loop's owners, so the search follows the holder to the lock it waits for and that lock's
//! holder (two hops, three keys' worth of reads). The loops run in alternation, several rounds,
//! and the median of the per-round ratios is the figure.
//!
//! `RLOCK_BENCH_BASE_MODULE=path`: the "elsewhere" loop also runs, in the same rounds, with
//! the module at `path` (a build from before deadlock detection), for the ratio against it.
//! `RLOCK_BENCH_ROWS=deadlock`: section 4 runs only these rows.

use crate::queue_loop::{handoff_cost, Parked, QueueCost};
use crate::report::{num, ratio, Section, Target};
use crate::Sizes;

/// What section 4's note says of these rows.
pub const NOTE: &str = "The deadlock rows measure what deadlock detection adds to an \
    enqueue: the same loop with one more blocked client per loop waiter (each waiting for a \
    lock of its own held by another owner), as owners that wait for nothing else \
    (\"nowhere\": the enqueue's deadlock search stops at the lock's holder) or as the loop's \
    owners (\"elsewhere\": whichever owner holds the lock also waits for another lock, so the \
    search follows it two hops); the same clients, locks and queues on both sides. Medians \
    over rounds that alternate the loops; the per-round ratios' range is given below.";

/// Whether section 4 runs only these rows (`RLOCK_BENCH_ROWS=deadlock`).
pub fn only() -> bool {
    std::env::var_os("RLOCK_BENCH_ROWS").is_some_and(|v| v == "deadlock")
}

fn median(mut values: Vec<f64>) -> f64 {
    values.retain(|v| !v.is_nan());
    if values.is_empty() {
        return f64::NAN;
    }
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    if values.len() % 2 == 1 {
        values[mid]
    } else {
        (values[mid - 1] + values[mid]) / 2.0
    }
}

/// The median of each figure over the rounds.
fn medians(runs: &[QueueCost]) -> QueueCost {
    QueueCost {
        handoff: median(runs.iter().map(|c| c.handoff).collect()),
        enqueue: median(runs.iter().map(|c| c.enqueue).collect()),
        bytes_per_waiter: median(runs.iter().map(|c| c.bytes_per_waiter).collect()),
    }
}

/// `median [min–max]` of per-round ratios.
fn spread(ratios: &[f64]) -> (f64, String) {
    let m = median(ratios.to_vec());
    let lo = ratios.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = ratios.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    (m, format!("{} (rounds {}–{})", num(m), num(lo), num(hi)))
}

/// Runs the rounds, adds the rows to section 4 (and the ratios to its note); the targets.
pub async fn rows(sizes: &Sizes, section: &mut Section) -> Vec<Target> {
    let n = sizes.queues.0;
    let base = std::env::var("RLOCK_BENCH_BASE_MODULE").ok();
    let mut loops: Vec<(&str, Parked, Option<&str>)> =
        vec![("nowhere", Parked::Idle, None), ("elsewhere", Parked::Waiting, None)];
    if let Some(path) = base.as_deref() {
        loops.push(("elsewhere, base module", Parked::Waiting, Some(path)));
    }
    let mut runs: Vec<Vec<QueueCost>> = loops.iter().map(|_| Vec::new()).collect();
    for round in 0..sizes.deadlock_rounds {
        // Each round starts with another loop: none always runs first (or last).
        for i in 0..loops.len() {
            let which = (i + round) % loops.len();
            let (name, parked, module) = loops[which];
            let cost = handoff_cost(n, sizes.handoffs, false, parked, module).await;
            eprintln!("  round {round}, {name}: {} µs per enqueue", num(cost.enqueue));
            runs[which].push(cost);
        }
    }
    let per_round = |a: usize, b: usize| -> Vec<f64> {
        runs[a].iter().zip(&runs[b]).map(|(x, y)| x.enqueue / y.enqueue).collect()
    };
    let nowhere = medians(&runs[0]);
    let rounds = sizes.deadlock_rounds;
    for (i, (name, _, _)) in loops.iter().enumerate() {
        let c = medians(&runs[i]);
        section.row(vec![
            n.to_string(),
            format!("rlock WAIT + {n} parked, holder waits {name} (median of {rounds})"),
            num(c.handoff),
            num(c.enqueue),
            num(c.handoff + c.enqueue),
            num(c.bytes_per_waiter),
            ratio(c.handoff, nowhere.handoff),
        ]);
    }
    let (elsewhere, text) = spread(&per_round(1, 0));
    section.note.push_str(&format!(
        " Enqueue µs, elsewhere / nowhere, per round: median {text}; their last column is \
         hand-off µs against the \"nowhere\" row."
    ));
    let mut targets = vec![Target::at_most(
        &format!("enqueue µs, holder waiting elsewhere / nowhere, {n} waiters"),
        elsewhere,
        1.1,
    )];
    if base.is_some() {
        let (before, text) = spread(&per_round(1, 2));
        let (plain, nowhere) = spread(&per_round(0, 2));
        section.note.push_str(&format!(
            " Enqueue µs against the \"elsewhere\" loop with the module before deadlock \
             detection (the base module, RLOCK_BENCH_BASE_MODULE), per round: elsewhere, \
             median {text}; nowhere, median {nowhere}."
        ));
        targets.push(Target::at_most(
            &format!(
                "enqueue µs, holder waiting elsewhere / before deadlock detection, {n} waiters"
            ),
            before,
            1.1,
        ));
        targets.push(Target::at_most(
            &format!("enqueue µs, holder waiting nowhere / before deadlock detection, {n} waiters"),
            plain,
            1.1,
        ));
    }
    targets
}
