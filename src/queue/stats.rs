//! What the queues count: how each waiter left ([`End`]), each queue's own counters
//! ([`QueueStats`]) and how long waits lasted ([`WaitTimes`], `INFO rlock`'s histogram).

/// How a waiter left its queue, for the queue's own counters ([`QueueStats`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// It was granted what it asked for.
    Granted,
    /// Its wait budget ran out.
    TimedOut,
    /// Anything else (disconnected, unblocked, cancelled, refused, redirected).
    Left,
}

/// A queue's own counters, since the queue was created (its first waiter); they go with it
/// when its last waiter leaves.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QueueStats {
    /// Waits started.
    pub waits: u64,
    /// Waiters granted (hand-offs).
    pub handoffs: u64,
    /// Waits that ended with their timeout.
    pub timeouts: u64,
}

/// The upper bounds (ms, inclusive) of the wait-time buckets of [`WaitTimes`]; a last bucket,
/// `+inf`, counts every wait.
pub const WAIT_BUCKETS_MS: [u64; 9] = [1, 5, 10, 50, 100, 500, 1_000, 5_000, 10_000];

/// How long waits lasted, cumulative as a Prometheus histogram: `le[i]` counts the waits that
/// lasted at most `WAIT_BUCKETS_MS[i]` ms; `count` every wait, `sum_ms` their total length.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WaitTimes {
    pub le: [u64; WAIT_BUCKETS_MS.len()],
    pub count: u64,
    pub sum_ms: u64,
}

impl WaitTimes {
    /// Records a wait of `ms` milliseconds (a negative length, a clock step back, counts as 0).
    pub fn record(&mut self, ms: i64) {
        let ms = u64::try_from(ms).unwrap_or(0);
        for (le, &bound) in self.le.iter_mut().zip(WAIT_BUCKETS_MS.iter()) {
            if ms <= bound {
                *le = le.saturating_add(1);
            }
        }
        self.count = self.count.saturating_add(1);
        self.sum_ms = self.sum_ms.saturating_add(ms);
    }
}
