//! Who waits, for `*.WAITERS` and the contention figures of `*.INFO` and `INFO rlock`: read-only
//! looks at the queues (nothing here blocks, grants or writes).

use super::state::QUEUES;
use crate::queue::{QueueStats, WaitTimes};
use crate::rules::Request;

/// One waiter as `*.WAITERS` shows it.
#[derive(Debug, Clone)]
pub struct Shown {
    /// What it asked for (kind, owner, request id).
    pub request: Request,
    /// How long it has waited (ms).
    pub waited_ms: i64,
    /// How long it may still wait (ms); -1: without limit (`WAIT 0`).
    pub left_ms: i64,
}

/// The first `count` waiters of the lock `key` of database `db` whose request is `matching`,
/// in queue order, as seen at `now` (Unix ms). O(count) in a queue of one kind of waiter.
pub fn waiters(
    db: i32,
    key: &[u8],
    count: usize,
    matching: impl Fn(&Request) -> bool,
    now: i64,
) -> Vec<Shown> {
    QUEUES.with(|q| {
        let Ok(q) = q.try_borrow() else { return Vec::new() };
        q.list(db, key, count, matching)
            .into_iter()
            .map(|w| Shown {
                request: w.request.clone(),
                waited_ms: now.saturating_sub(w.since).max(0),
                left_ms: w.timeout_at().map_or(-1, |at| at.saturating_sub(now).max(0)),
            })
            .collect()
    })
}

/// The counters of the lock `key`'s queue in database `db` (zero when nobody waits).
pub fn queue_stats(db: i32, key: &[u8]) -> QueueStats {
    QUEUES.with(|q| q.try_borrow().map_or_else(|_| QueueStats::default(), |q| q.stats(db, key)))
}

/// How long the waits that ended lasted (`INFO rlock`).
pub fn wait_times() -> WaitTimes {
    QUEUES.with(|q| q.try_borrow().map_or_else(|_| WaitTimes::default(), |q| q.wait_times()))
}
