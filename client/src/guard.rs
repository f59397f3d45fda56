//! What every guard shares ([`GuardCore`]): the lease renewal (watchdog) and the loss it
//! reports, and a release that runs exactly once, by `release` or by `Drop`, after the renewal
//! stopped. `LockGuard` and `MultiGuard` add only what they hold.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::error::Result;

/// The core of a guard: its renewal and whether its hold was given back.
pub(crate) struct GuardCore {
    renewal: Renewal,
    released: bool,
}

impl GuardCore {
    /// A guard granted at `since` for `lease_ms`. With `watchdog`, `renew` renews the hold every
    /// third of the lease (`Ok(false)`: the lock is gone); `lost` reports a loss, whoever finds
    /// it.
    pub(crate) fn new<F, Fut>(
        watchdog: bool,
        (lease_ms, since): (u64, Instant),
        lost: &Arc<watch::Sender<bool>>,
        renew: F,
    ) -> Self
    where
        F: Fn() -> Fut + Send + 'static,
        Fut: Future<Output = Result<bool>> + Send,
    {
        let renewal = if watchdog {
            Renewal::start(lease_ms, since, Arc::clone(lost), renew)
        } else {
            Renewal::none(lost.subscribe())
        };
        Self { renewal, released: false }
    }

    /// Stops renewing and marks the hold given back; `true` the first time only: the caller
    /// then releases it on the server (from `release`, or from `Drop` when `release` was not
    /// called).
    pub(crate) fn give_back(&mut self) -> bool {
        self.renewal.stop();
        !std::mem::replace(&mut self.released, true)
    }

    /// Whether a loss was reported.
    pub(crate) fn is_lost(&self) -> bool {
        self.renewal.is_lost()
    }

    /// Resolves when a loss is reported; never if that never happens.
    pub(crate) async fn lost(&self) {
        self.renewal.lost().await;
    }

    /// Whether a watchdog renews the hold.
    pub(crate) const fn watchdog(&self) -> bool {
        self.renewal.task.is_some()
    }
}

/// A guard's lease renewal (its watchdog), and the loss it reports: renews every third of the
/// lease until the lock is found gone, or until stopped (on release or drop). A failed renewal
/// is retried promptly (50 ms, doubling up to the period) while the lease may still be alive;
/// a renewal that finds the lock gone reports the loss at once. Without a watchdog, the loss is
/// still reported when something else proves it (a re-entry or release of the same chain).
pub(crate) struct Renewal {
    task: Option<JoinHandle<()>>,
    lost: watch::Receiver<bool>,
}

impl Renewal {
    /// No watchdog (a guard with an explicit lease); `lost` reports a loss found elsewhere.
    fn none(lost: watch::Receiver<bool>) -> Self {
        Self { task: None, lost }
    }

    /// Starts renewing with `renew` (`Ok(false)`: the lock is gone), reporting on `lost`. The
    /// hold is known valid until `since` (when the grant was asked for) plus the lease, and
    /// then until each confirmed renewal's send time plus the lease: when that moment passes
    /// without a confirmation (renewals failing, or not answering), the loss is reported then,
    /// on this process's monotonic clock, whatever the server may still say later.
    fn start<F, Fut>(
        lease_ms: u64,
        since: Instant,
        lost: Arc<watch::Sender<bool>>,
        renew: F,
    ) -> Self
    where
        F: Fn() -> Fut + Send + 'static,
        Fut: Future<Output = Result<bool>> + Send,
    {
        let watching = lost.subscribe();
        let task = tokio::spawn(async move {
            let lease = Duration::from_millis(lease_ms);
            let period = (lease / 3).max(Duration::from_millis(1));
            let first_retry = Duration::from_millis(50).min(period);
            let (mut next, mut retry) = (period, first_retry);
            let mut valid_until = since + lease;
            loop {
                tokio::time::sleep_until((Instant::now() + next).min(valid_until)).await;
                let sent = Instant::now();
                if sent >= valid_until {
                    break;
                }
                match tokio::time::timeout_at(valid_until, renew()).await {
                    Ok(Ok(true)) => {
                        valid_until = sent + lease;
                        (next, retry) = (period, first_retry);
                    }
                    Ok(Err(_)) => {
                        next = retry;
                        retry = (retry * 2).min(period);
                    }
                    Ok(Ok(false)) | Err(_) => break,
                }
            }
            lost.send_replace(true);
        });
        Self { task: Some(task), lost: watching }
    }

    /// Stops renewing.
    fn stop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }

    /// Whether the lock was found gone.
    fn is_lost(&self) -> bool {
        *self.lost.borrow()
    }

    /// Resolves when the lock is found gone; never if that never happens.
    async fn lost(&self) {
        let mut lost = self.lost.clone();
        if lost.wait_for(|&lost| lost).await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

impl Drop for Renewal {
    fn drop(&mut self) {
        self.stop();
    }
}
