//! The hold engine: one implementation of acquiring, holding, renewing and releasing under
//! every kind of guard (locks, read-write lock sides, counted and leased permits, MultiLock and
//! RedLock).
//!
//! - [`kind`]: what differs per kind, as data (commands and replies).
//! - [`request`]: one acquire request (`REQUEST id`): a try, a server-side wait, and exact
//!   cancellation (`RLOCK.CANCEL`) of whatever it got when no caller takes it.
//! - [`waiting`]: the server-side wait on a dedicated connection, in a task.
//! - [`resume`]: a wait sent again after a failover or a lost connection, and the check from
//!   another connection that notices a wait whose connection died silently.
//! - [`hold`]: one server grant and its guards: one deadline, the watchdog, the loss signal,
//!   release and drop (the guards, their release and drop in `hold::guards`).
//! - [`watchdog`]: a hold's renewal while a watchdog guard lives.
//! - [`chain`]: re-entry for locks and read-write lock sides.
//! - [`binding`]: a session's connection, a property of the acquire path (`SESSION`): its
//!   requests run on it, its holds are lost when it closes.

pub(crate) mod binding;
pub(crate) mod chain;
pub(crate) mod hold;
pub(crate) mod kind;
pub(crate) mod outcome;
pub(crate) mod request;
pub(crate) mod resume;
pub(crate) mod waiting;
pub(crate) mod watchdog;

use std::time::Duration;

use tokio::time::Instant;

use crate::error::{redis_uncertain, too_long, Error};

/// How long past its deadline a call may take: room for the server's own timeout reply to a
/// wait, and the one response bound of a `Duration::ZERO` try (redis-rs's default response
/// timeout).
pub(crate) const GRACE: Duration = Duration::from_millis(500);

/// How long a cancellation or release asked for by a failed call is waited for before the call
/// returns (the releaser goes on with it after that).
pub(crate) const SETTLE: Duration = Duration::from_secs(2);

/// How long the server remembers a counted request (the releaser retries its cancellation this
/// long: spec24's `REQUEST_RECORD_MS`).
pub(crate) const COUNTED_RECORD: Duration = Duration::from_secs(60);

/// When a call with `deadline` must have returned: the deadline plus [`GRACE`] (never before
/// `now` + [`GRACE`], so a zero wait still gets one answer; as far as the clock goes for a
/// deadline near its end); `None` without a deadline.
pub(crate) fn bound(deadline: Option<Instant>, now: Instant) -> Option<Instant> {
    deadline.map(|d| hold::after(d.max(now), GRACE))
}

/// The `WAIT` budget of a server-side wait started at `now`: what is left until `deadline`, at
/// least 1 ms (`WAIT 0` would wait without limit); `0` (no limit) without a deadline.
pub(crate) fn wait_ms(deadline: Option<Instant>, now: Instant) -> u64 {
    deadline.map_or(0, |d| millis(d.saturating_duration_since(now)))
}

/// Milliseconds of a duration, rounded up (a lease sent is never shorter than the one the
/// client counts with), at least 1.
pub(crate) fn millis(d: Duration) -> u64 {
    let ms = d.as_millis() + u128::from(!d.subsec_nanos().is_multiple_of(1_000_000));
    u64::try_from(ms).unwrap_or(u64::MAX).max(1)
}

/// A lease as it is sent and counted with: refused when zero ([`Error::ZeroLease`]), below
/// [`crate::MIN_LEASE`] or beyond [`crate::MAX_DURATION`] ([`Error::InvalidArgument`]), else rounded up to whole milliseconds
/// (the server's unit), so the client's deadline (send time + lease) is the server's.
///
/// # Errors
/// As above; nothing is sent.
pub(crate) fn checked_lease(what: &str, lease: Duration) -> crate::error::Result<Duration> {
    if lease.is_zero() {
        return Err(Error::ZeroLease);
    }
    if lease < crate::MIN_LEASE {
        return Err(Error::InvalidArgument(format!(
            "{what} of {lease:?} is shorter than the shortest the server takes ({:?})",
            crate::MIN_LEASE
        )));
    }
    if lease > crate::MAX_DURATION {
        return Err(too_long(what, lease));
    }
    Ok(Duration::from_millis(millis(lease)))
}

/// The deadline of a wait of `wait` from now; `None` (no limit) for a wait beyond
/// [`crate::MAX_DURATION`] or too far to add to the clock.
pub(crate) fn deadline_after(wait: Duration) -> Option<Instant> {
    if wait > crate::MAX_DURATION {
        return None;
    }
    Instant::now().checked_add(wait)
}

/// Whether an error leaves the outcome of a command unknown (it may have run, or still run).
pub(crate) fn uncertain(e: &Error) -> bool {
    match e {
        Error::TimedOut => true,
        Error::Redis(e) => redis_uncertain(e),
        _ => false,
    }
}

/// Whether an error is a lost connection (killed, reset, refused), not a timeout: the command
/// may have run, and sending it again on a new connection is answered at once.
pub(crate) fn connection_lost(e: &Error) -> bool {
    matches!(e, Error::Redis(e) if redis_uncertain(e) && !e.is_timeout())
}

/// `tokio::time::timeout_at` when there is a bound; [`Error::TimedOut`] when it passes.
pub(crate) async fn within<T>(
    bound: Option<Instant>,
    work: impl std::future::Future<Output = crate::error::Result<T>>,
) -> crate::error::Result<T> {
    match bound {
        None => work.await,
        Some(bound) => tokio::time::timeout_at(bound, work).await.unwrap_or(Err(Error::TimedOut)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_is_bounded_by_its_deadline_plus_the_grace_and_a_zero_wait_gets_one_answer() {
        let now = Instant::now();
        assert_eq!(bound(None, now), None);
        let d = now + Duration::from_secs(3);
        assert_eq!(bound(Some(d), now), Some(d + GRACE));
        let past = now.checked_sub(Duration::from_secs(1)).unwrap_or(now);
        assert_eq!(bound(Some(past), now), Some(now + GRACE), "one response bound");
        let far = (1..64).rev().find_map(|s| now.checked_add(Duration::from_secs(1 << s)));
        if let Some(far) = far {
            assert!(bound(Some(far), now) >= Some(far), "a far deadline: no overflow, no panic");
        }
    }

    #[test]
    fn wait_budgets_never_read_as_unlimited_when_there_is_a_deadline() {
        let now = Instant::now();
        assert_eq!(wait_ms(None, now), 0, "no deadline: WAIT 0, no limit");
        assert_eq!(wait_ms(Some(now), now), 1, "a deadline that passed: one ms");
        assert_eq!(wait_ms(Some(now + Duration::from_micros(10)), now), 1);
        assert_eq!(wait_ms(Some(now + Duration::from_millis(1_500)), now), 1_500);
        assert_eq!(millis(Duration::MAX), u64::MAX);
        assert_eq!(millis(Duration::from_micros(1_999)), 2, "rounded up, never down");
        assert_eq!(millis(Duration::from_millis(7)), 7);
    }

    #[test]
    fn leases_are_refused_when_zero_too_short_or_too_long_and_rounded_up_to_milliseconds() {
        assert!(matches!(checked_lease("lease", Duration::ZERO), Err(Error::ZeroLease)));
        let over = crate::MAX_DURATION + Duration::from_millis(1);
        assert!(matches!(checked_lease("lease", over), Err(Error::InvalidArgument(_))));
        assert!(matches!(checked_lease("lease", Duration::MAX), Err(Error::InvalidArgument(_))));
        for short in [Duration::from_nanos(1), Duration::from_micros(999)] {
            let refused = checked_lease("lease", short);
            assert!(matches!(refused, Err(Error::InvalidArgument(_))), "{short:?}");
        }
        assert_eq!(checked_lease("lease", crate::MIN_LEASE).ok(), Some(crate::MIN_LEASE));
        let ok = checked_lease("lease", Duration::from_micros(1_500)).ok();
        assert_eq!(ok, Some(Duration::from_millis(2)));
        assert!(checked_lease("lease", crate::MAX_DURATION).is_ok());
        assert_eq!(deadline_after(Duration::MAX), None);
        assert!(deadline_after(crate::MAX_DURATION).is_some());
    }

    #[test]
    fn only_errors_that_leave_the_command_s_fate_open_are_uncertain() {
        assert!(uncertain(&Error::TimedOut));
        assert!(!uncertain(&Error::NotHeld));
        let io = redis::RedisError::from(std::io::Error::from(std::io::ErrorKind::BrokenPipe));
        assert!(uncertain(&Error::Redis(io)));
        let refused = redis::RedisError::from((
            redis::ErrorKind::Server(redis::ServerErrorKind::ResponseError),
            "ERR nope",
        ));
        assert!(!uncertain(&Error::Redis(refused)));
    }
}
