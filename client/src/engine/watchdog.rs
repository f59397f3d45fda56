//! The watchdog of a [`crate::engine::hold::Hold`], written once for every guard type.

use std::time::Duration;

use tokio::time::Instant;

use crate::engine::hold::WeakHold;

/// The watchdog of a hold (while a watchdog guard lives): renews every third of `lease`,
/// retries failures promptly, and marks the hold lost when a renewal finds it gone or its one
/// deadline passes without a confirmation.
pub(crate) async fn run(hold: WeakHold, lease: Duration) {
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
