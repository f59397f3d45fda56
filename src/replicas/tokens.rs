//! The token floor: fencing tokens that never repeat across a promotion or a restart
//! ([`raise_token_floor`]), nor after an evicted token counter ([`counters_evictable`],
//! [`token_granted`]); [`token_floor`] is the least token the next grant may take.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// The token floor (see the module docs); 0 until the first promotion or load from disk.
static TOKEN_FLOOR: AtomicU64 = AtomicU64::new(0);

/// Tokens per millisecond of the floor.
pub const TOKENS_PER_MS: u64 = 1_000_000;

/// This server just became a master (promotion) or loaded its data from disk (a restart):
/// tokens from now on are above any its predecessor could have issued.
pub fn raise_token_floor(now: i64) {
    let floor = u64::try_from(now).unwrap_or(0).saturating_mul(TOKENS_PER_MS);
    TOKEN_FLOOR.fetch_max(floor.min(i64::MAX as u64), Ordering::Relaxed);
}

/// The largest token this server granted since load.
static TOKEN_HIGH: AtomicU64 = AtomicU64::new(0);

/// Set (for good) once an `allkeys-*` eviction policy has been in force since load: a token
/// counter may have been evicted (it has no TTL), and restarting from a missing counter would
/// repeat tokens.
static COUNTERS_EVICTABLE: AtomicBool = AtomicBool::new(false);

/// An `allkeys-*` policy is (or was) in force: from now on every token also exceeds every token
/// this server granted ([`token_floor`]).
pub fn counters_evictable() {
    COUNTERS_EVICTABLE.store(true, Ordering::Relaxed);
}

/// A token was granted: the high-water mark that tokens exceed once counters are evictable.
pub fn token_granted(token: u64) {
    TOKEN_HIGH.fetch_max(token, Ordering::Relaxed);
}

/// The least token the next grant may take, for [`crate::rules::next_token`]: the failover floor
/// and, once counters may have been evicted, one more than the largest token this server granted
/// (so an evicted counter never restarts below a token already given; tokens then grow across
/// every lock of the server, still strictly increasing per lock).
#[must_use]
pub fn token_floor() -> u64 {
    let floor = TOKEN_FLOOR.load(Ordering::Relaxed);
    if COUNTERS_EVICTABLE.load(Ordering::Relaxed) {
        floor.max(TOKEN_HIGH.load(Ordering::Relaxed).saturating_add(1))
    } else {
        floor
    }
}

/// The failover floor alone, for `INFO rlock`.
#[must_use]
pub fn failover_floor() -> u64 {
    TOKEN_FLOOR.load(Ordering::Relaxed)
}

/// At load: a reloaded module may find its old statics.
pub(super) fn reset() {
    TOKEN_FLOOR.store(0, Ordering::Relaxed);
    TOKEN_HIGH.store(0, Ordering::Relaxed);
    COUNTERS_EVICTABLE.store(false, Ordering::Relaxed);
}
