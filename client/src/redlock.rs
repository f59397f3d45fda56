//! [`RedLock`]: the same lock on a majority of N independent masters, on the hold engine.

use std::fmt;
use std::time::Duration;

use tokio::time::Instant;

use crate::client::LockClient;
use crate::engine::kind::Kind;
use crate::engine::millis;
use crate::engine::request::Request;
use crate::error::{Error, Result};
use crate::lock::Lock;
use crate::multi::{cancel_all, guard_members, hold, MultiGuard};

/// The same named lock on N (odd) independent masters, held when a majority grant it within
/// its validity (antirez's RedLock). Each attempt uses one fresh owner id on every node
/// (`<redlock owner>:<n>`), so its guard is tied to that attempt's grants.
///
/// Caveats (see the README): RedLock assumes bounded clock drift and process pauses; a holder
/// paused past its validity can still act. It protects efficiency, not correctness, unless the
/// protected resource checks fencing tokens.
#[derive(Clone)]
pub struct RedLock {
    locks: Vec<Lock>,
    node_timeout: Duration,
    retry_delay: Duration,
}

impl fmt::Debug for RedLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedLock")
            .field("nodes", &self.locks.len())
            .field("node_timeout", &self.node_timeout)
            .finish_non_exhaustive()
    }
}

/// Clock drift allowance: 1 % of the lease plus 2 ms (antirez's figures).
fn drift(lease: Duration) -> Duration {
    lease / 100 + Duration::from_millis(2)
}

/// A random part of `max`.
fn jitter(max: Duration) -> Duration {
    let r = (uuid::Uuid::new_v4().as_u128() % 1_000) as u32;
    max * r / 1_000
}

impl RedLock {
    /// The lock `name` on each of `clients` (one per independent master).
    ///
    /// # Panics
    /// When `clients` is empty.
    #[must_use]
    pub fn new(clients: &[LockClient], name: impl AsRef<[u8]>) -> Self {
        assert!(!clients.is_empty(), "a RedLock needs at least one server");
        let owner = format!("{}:redlock:{}", clients[0].id(), uuid::Uuid::new_v4().simple());
        let locks = clients.iter().map(|c| c.lock_as(name.as_ref(), owner.clone())).collect();
        Self {
            locks,
            node_timeout: Duration::from_millis(50),
            retry_delay: Duration::from_millis(50),
        }
    }

    /// How long one node may take to answer (default 50 ms); keep it small against the lease.
    #[must_use]
    pub const fn node_timeout(mut self, timeout: Duration) -> Self {
        self.node_timeout = timeout;
        self
    }

    /// The most a failed attempt waits before the next (a random part of it; default 50 ms).
    #[must_use]
    pub const fn retry_delay(mut self, delay: Duration) -> Self {
        self.retry_delay = delay;
        self
    }

    /// A majority of nodes.
    #[must_use]
    pub fn quorum(&self) -> usize {
        self.locks.len() / 2 + 1
    }

    /// Takes the lock on a majority of nodes, trying again within `wait` (`Duration::ZERO`: one
    /// attempt). `lease: None` uses the watchdog, which keeps renewing on every node that
    /// granted it and reports a loss when fewer than a majority still hold it.
    ///
    /// # Errors
    /// [`Error::ZeroLease`] for a zero lease; [`Error::TimedOut`] when no attempt within `wait`
    /// reached a majority with time left (every grant of a failed attempt is given back).
    pub async fn try_acquire(&self, wait: Duration, lease: Option<Duration>) -> Result<MultiGuard> {
        let deadline = Instant::now().checked_add(wait);
        let watchdog_timeout = self.locks[0].chain().shared().options.watchdog_timeout;
        let watchdog = lease.is_none().then_some(watchdog_timeout);
        let lease = lease.unwrap_or(watchdog_timeout);
        if lease.is_zero() {
            return Err(Error::ZeroLease);
        }
        let settle = self.node_timeout.max(Duration::from_millis(100));
        loop {
            let started = Instant::now();
            let owner = self.locks[0].chain().next_owner();
            let mut requests: Vec<(usize, Request)> = self
                .locks
                .iter()
                .enumerate()
                .map(|(i, lock)| {
                    let chain = lock.chain();
                    let owner = std::sync::Arc::clone(&owner);
                    let request =
                        Request::new(chain.shared(), chain.key(), Kind::Lock, owner, millis(lease));
                    (i, request.session(chain.session()))
                })
                .collect();
            let node_bound = Some(started + self.node_timeout);
            let attempts = requests
                .iter_mut()
                .map(|(_, r)| async move { matches!(r.try_once(node_bound).await, Ok(Some(_))) });
            let granted = futures_util::future::join_all(attempts).await;
            let validity = lease.checked_sub(started.elapsed() + drift(lease));
            let count = granted.iter().filter(|&&g| g).count();
            if let Some(validity) = validity.filter(|v| count >= self.quorum() && !v.is_zero()) {
                let mut won: Vec<(usize, Request)> = requests
                    .into_iter()
                    .zip(granted)
                    .filter_map(|(taken, granted)| granted.then_some(taken))
                    .collect(); // the others are dropped: cancelled in the background
                let holds: Vec<_> =
                    won.iter().map(|(i, r)| hold(&self.locks[*i], r, lease)).collect();
                let members = guard_members(&holds, &mut won, watchdog);
                let mut guard = MultiGuard::new(members, self.quorum(), settle);
                guard.validity = Some(validity);
                return Ok(guard);
            }
            // Failed: give back every grant, the silent nodes' included.
            cancel_all(&mut requests, settle).await;
            let left =
                deadline.map_or(Duration::MAX, |d| d.saturating_duration_since(Instant::now()));
            if left.is_zero() {
                return Err(Error::TimedOut);
            }
            tokio::time::sleep(jitter(self.retry_delay).min(left)).await;
        }
    }
}
