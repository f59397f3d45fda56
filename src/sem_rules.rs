//! The counting semaphore rules, as plain Rust, on Redisson's `RSemaphore` layout: the key is a
//! string holding the available permits, nothing records who holds what, and every change that
//! raises the count publishes the new count on `redisson_sc:{name}` (Redisson's waiters wake on
//! it). Each operation returns a [`SemPlan`]; only the `store` touches Redis.
//!
//! Fairness (server-side waiting): waiters are served in arrival order, a head asking for more
//! permits than are available is not overtaken, and a newcomer never takes permits while anyone
//! waits. Permits are not reserved piecemeal: they stay in the count until the head's whole
//! request can be granted.

use crate::error::LockError;
use crate::rules::Reply;

/// What the semaphore's key holds: `None` when it is missing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SemState {
    pub available: Option<i64>,
}

impl SemState {
    /// The available permits (a missing key has none).
    #[must_use]
    pub fn available(self) -> i64 {
        self.available.unwrap_or(0)
    }
}

/// What an operation writes to the key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SemWrite {
    /// Nothing.
    Keep,
    /// `SET key <value>` (drops a TTL, as Redisson's `trySetPermits`/`addPermits` do).
    Set(i64),
    /// `INCRBY key <delta>` / `DECRBY` (keeps a TTL).
    Add(i64),
}

/// What an operation does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SemPlan {
    pub write: SemWrite,
    /// Waiters may be served now (permits came back): hand the permits on, then publish the
    /// count that is left.
    pub raised: bool,
    pub reply: Reply,
}

impl SemPlan {
    const fn reply(reply: Reply) -> Self {
        Self { write: SemWrite::Keep, raised: false, reply }
    }
}

/// Parses an integer exactly as Redis's `string2ll` does (what `INCRBY`, `DECRBY` and
/// `GET`-then-`tonumber` scripts rely on): an optional `-`, then `0` alone or digits without a
/// leading zero; no `+`, no spaces, no `-0`; within the `i64` range.
#[must_use]
pub fn parse_integer(text: &[u8]) -> Option<i64> {
    let (negative, digits) = match text {
        [b'0'] => return Some(0),
        [b'-', digits @ ..] => (true, digits),
        digits => (false, digits),
    };
    match digits.first() {
        Some(b'1'..=b'9') => {}
        _ => return None,
    }
    // Accumulated as a negative number, whose range holds i64::MIN.
    let mut n: i64 = 0;
    for &b in digits {
        if !b.is_ascii_digit() {
            return None;
        }
        n = n.checked_mul(10)?.checked_sub(i64::from(b - b'0'))?;
    }
    if negative {
        Some(n)
    } else {
        n.checked_neg()
    }
}

/// Parses the key's value as Redis reads an integer ([`parse_integer`]): a value the module
/// accepts, the `INCRBY`/`DECRBY` it replicates accepts too.
///
/// # Errors
/// [`LockError::CorruptPermits`] for anything `INCRBY` would refuse.
pub fn parse_available(stored: &[u8]) -> Result<i64, LockError> {
    parse_integer(stored).ok_or(LockError::CorruptPermits)
}

/// `SETPERMITS`: set the count when the semaphore does not exist (reply 1), else reply 0.
#[must_use]
pub const fn set_permits(state: SemState, permits: u64) -> SemPlan {
    match state.available {
        Some(_) => SemPlan::reply(Reply::Int(0)),
        None => {
            SemPlan { write: SemWrite::Set(permits as i64), raised: true, reply: Reply::Int(1) }
        }
    }
}

/// `ADDPERMITS`: the count plus `delta` (negative takes permits away); reply the new count.
///
/// # Errors
/// [`LockError::PermitsOverflow`] when the count would leave the `i64` range.
pub fn add_permits(state: SemState, delta: i64) -> Result<SemPlan, LockError> {
    let count = state.available().checked_add(delta).ok_or(LockError::PermitsOverflow)?;
    Ok(SemPlan { write: SemWrite::Set(count), raised: delta > 0, reply: Reply::Int(count) })
}

/// `ACQUIRE`: take `permits` when that many are available and nobody waits (`queued`), reply 1;
/// else reply 0 and change nothing.
#[must_use]
pub fn acquire(state: SemState, permits: u64, queued: bool) -> SemPlan {
    match i64::try_from(permits) {
        Ok(n) if !queued && state.available() >= n => {
            SemPlan { write: SemWrite::Add(-n), raised: false, reply: Reply::Int(1) }
        }
        _ => SemPlan::reply(Reply::Int(0)),
    }
}

/// `RELEASE`: give back `permits` (creating the semaphore if it is missing, as Redisson's
/// `INCRBY`); reply the new count (the command replies the count after the grants this
/// release made to waiters).
///
/// # Errors
/// [`LockError::PermitsOverflow`] when the count would leave the `i64` range.
pub fn release(state: SemState, permits: u64) -> Result<SemPlan, LockError> {
    let n = i64::try_from(permits).map_err(|_| LockError::PermitsOverflow)?;
    let count = state.available().checked_add(n).ok_or(LockError::PermitsOverflow)?;
    Ok(SemPlan { write: SemWrite::Add(n), raised: true, reply: Reply::Int(count) })
}

/// `RELEASE ... ID`: give back the leased permits `ids` (all of them live leases, checked by the
/// caller): one permit per distinct id, as `ZREM` counts them. Checked against the count before
/// anything is removed.
///
/// # Errors
/// [`LockError::PermitsOverflow`] when the count would leave the `i64` range.
pub fn release_ids(state: SemState, ids: &[&[u8]]) -> Result<SemPlan, LockError> {
    let mut distinct = ids.to_vec();
    distinct.sort_unstable();
    distinct.dedup();
    release(state, distinct.len() as u64)
}

/// The permits the waiters ask for, as `RSEM.INFO` reports them: their sum (saturating, as
/// summed by the queue), at most the largest count a semaphore can hold. A sum above it means
/// the same as the largest count: no count can grant them all.
#[must_use]
pub fn waiting_permits(total: u64) -> i64 {
    i64::try_from(total).unwrap_or(i64::MAX)
}

/// The grant of `permits` to the waiter at the head of the queue, if that many are available.
#[must_use]
pub fn grant_waiter(state: SemState, permits: u64) -> Option<SemPlan> {
    let plan = acquire(state, permits, false);
    (plan.reply == Reply::Int(1)).then_some(plan)
}

/// The score of a leased permit with no lease (Redisson's `922337203685477`).
pub const NO_LEASE: i64 = 922_337_203_685_477;

/// Whether leased permits whose lease scores are `scores` (`None`: not a permit of this
/// semaphore) may be released at `now`: every one must be there and not expired. Releases are
/// all-or-nothing, as Redisson's.
#[must_use]
pub fn releasable(scores: &[Option<i64>], now: i64) -> bool {
    !scores.is_empty() && scores.iter().all(|s| s.is_some_and(|at| at > now))
}
