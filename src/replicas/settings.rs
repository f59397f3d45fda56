//! The guard's settings (`rlock.min-replicas`, `rlock.replica-max-lag`, `rlock.stall-ms`) and
//! the server's timing they are read against: its cron period (`hz`), in a cluster its node
//! timeout, and the stall threshold in force ([`stall_ms`]).

use std::sync::atomic::{AtomicI64, Ordering};

/// `rlock.min-replicas`: -1 auto (1 once a replica has been online), 0 off, n: n replicas.
pub static MIN_REPLICAS: AtomicI64 = AtomicI64::new(-1);
/// `rlock.replica-max-lag`: the largest replication lag, in seconds, of a replica in sync.
pub static MAX_LAG: AtomicI64 = AtomicI64::new(2);

/// `rlock.stall-ms`: a gap between two checks this long means the server stalled (stopped,
/// paused, blocked) long enough for a failover detector (Sentinel's down-after, a cluster's node
/// timeout) to act.
pub static STALL: AtomicI64 = AtomicI64::new(STALL_MS);

/// `rlock.stall-ms`'s default.
pub const STALL_MS: i64 = 1_500;

/// In a cluster, half the server's `cluster-node-timeout` (ms; `i64::MAX` outside a cluster).
static NODE_TIMEOUT_HALF: AtomicI64 = AtomicI64::new(i64::MAX);

/// The server's `cluster-node-timeout` (ms), when it runs in cluster mode.
pub fn set_cluster_node_timeout(ms: Option<i64>) {
    let half = ms.filter(|&ms| ms > 0).map_or(i64::MAX, |ms| ms / 2);
    NODE_TIMEOUT_HALF.store(half, Ordering::Relaxed);
}

/// The server's cron period in ms (`1000 / hz`, the configured `hz`: `dynamic-hz` only ever
/// shortens it), as last read (`store::settings`).
pub(super) static CRON_PERIOD: AtomicI64 = AtomicI64::new(100);

/// The longest cron period in force since the last check (ms): a gap that spans a change of
/// `hz` ran partly at the old period, and is no stall for being longer than the new one.
pub(super) static SPAN_PERIOD: AtomicI64 = AtomicI64::new(100);

/// The server's configured `hz` (ticks of its cron per second, 1 to 500).
pub fn set_hz(hz: Option<i64>) {
    let period = hz.filter(|&hz| hz > 0).map_or(100, |hz| (1000 / hz).max(1));
    let old = CRON_PERIOD.swap(period, Ordering::Relaxed);
    SPAN_PERIOD.fetch_max(old.max(period), Ordering::Relaxed);
}

/// The longest cron period a gap between two checks may have run at.
pub(super) fn longest_period() -> i64 {
    CRON_PERIOD.load(Ordering::Relaxed).max(SPAN_PERIOD.load(Ordering::Relaxed))
}

/// The stall threshold in force: `rlock.stall-ms`, and in a cluster at most half the node
/// timeout; never below 100 ms, nor below two cron periods: the checks run on the cron, so a
/// gap of one period is how they always run, never a stall (with `stall-ms 100` at the default
/// `hz 10`, every gap would otherwise have counted as one, and a healthy master refused almost
/// every grant).
#[must_use]
pub fn stall_ms() -> i64 {
    let set = STALL.load(Ordering::Relaxed).min(NODE_TIMEOUT_HALF.load(Ordering::Relaxed));
    set.max(100).max(2 * longest_period())
}
