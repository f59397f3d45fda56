//! The watchdog of a [`crate::engine::hold::Hold`], written once for every guard type. It knows
//! a hold only through [`Watched`] (what it renews) and [`Upgrade`] (a reference that does not
//! keep the hold alive), so it sits below the hold.

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

use crate::error::Result;

/// What a watchdog renews.
pub(crate) trait Watched {
    /// The one deadline the server confirmed; `None` once the hold ended or was lost.
    fn until(&self) -> Option<Instant>;
    /// Marks the hold lost.
    fn lose(&self);
    /// Renews for `lease`: `Ok(false)` when the server no longer has it (it is then marked
    /// lost).
    fn renew(&self, lease: Duration) -> impl Future<Output = Result<bool>> + Send;
}

/// A reference to a watched hold that does not keep it alive.
pub(crate) trait Upgrade {
    /// The hold it watches.
    type Hold: Watched;
    /// The hold, while a guard (or anything else) keeps it.
    fn upgrade(&self) -> Option<Self::Hold>;
}

/// The watchdog of a hold (while a watchdog guard lives): renews every third of `lease`,
/// retries failures promptly, and marks the hold lost when a renewal finds it gone or its one
/// deadline passes without a confirmation.
pub(crate) async fn run<W: Upgrade>(hold: W, lease: Duration) {
    let period = (lease / 3).max(Duration::from_millis(1));
    let first_retry = Duration::from_millis(50).min(period);
    let (mut next, mut retry) = (Instant::now() + period, first_retry);
    loop {
        let Some(until) = hold.upgrade().and_then(|h| h.until()) else { return };
        tokio::time::sleep_until(next.min(until)).await;
        let Some(held) = hold.upgrade() else { return };
        // Re-read: a re-entry or another renewal may have confirmed a later deadline.
        let Some(until) = held.until() else { return };
        let now = Instant::now();
        if until <= now {
            held.lose();
            return;
        }
        if now < next {
            continue;
        }
        match tokio::time::timeout_at(until, held.renew(lease)).await {
            Ok(Ok(true)) => (next, retry) = (Instant::now() + period, first_retry),
            Ok(Ok(false)) => return, // gone: `renew` marked it lost
            Ok(Err(_)) => {
                next = Instant::now() + retry;
                retry = (retry * 2).min(period);
            }
            Err(_) => {} // no answer before the deadline: the loop finds it passed
        }
    }
}
