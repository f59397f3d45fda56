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
    /// The lock `name` on each of `clients` (one per independent master). Never panics: no
    /// client, or one client given twice (its one server would count as two of the majority),
    /// makes every acquire fail with [`Error::InvalidArgument`] before anything is sent.
    #[must_use]
    pub fn new(clients: &[LockClient], name: impl AsRef<[u8]>) -> Self {
        let first = clients.first().map_or("", LockClient::id);
        let owner = format!("{first}:redlock:{}", uuid::Uuid::new_v4().simple());
        let locks = clients.iter().map(|c| c.lock_as(name.as_ref(), owner.clone())).collect();
        Self {
            locks,
            node_timeout: Duration::from_millis(50),
            retry_delay: Duration::from_millis(50),
        }
    }

    /// How long one node may take to answer (default 50 ms); keep it small against the lease.
    /// Zero, or beyond [`crate::MAX_DURATION`], makes every acquire fail with
    /// [`Error::InvalidArgument`].
    #[must_use]
    pub const fn node_timeout(mut self, timeout: Duration) -> Self {
        self.node_timeout = timeout;
        self
    }

    /// The most a failed attempt waits before the next (a random part of it; default 50 ms).
    /// Beyond [`crate::MAX_DURATION`], every acquire fails with [`Error::InvalidArgument`].
    #[must_use]
    pub const fn retry_delay(mut self, delay: Duration) -> Self {
        self.retry_delay = delay;
        self
    }

    /// The arguments' check (see [`RedLock::new`], [`RedLock::node_timeout`],
    /// [`RedLock::retry_delay`]).
    fn check(&self) -> Result<()> {
        let invalid = |why: String| Err(Error::InvalidArgument(format!("a RedLock {why}")));
        if self.locks.is_empty() {
            return invalid("needs at least one server".to_owned());
        }
        for (i, a) in self.locks.iter().enumerate() {
            let same = |b: &Lock| std::sync::Arc::ptr_eq(a.chain().shared(), b.chain().shared());
            if self.locks[i + 1..].iter().any(same) {
                return invalid("was given one client twice: its server would count twice".into());
            }
        }
        if self.node_timeout.is_zero() {
            return invalid("node timeout must be above zero: no node could answer".to_owned());
        }
        for (what, value) in
            [("node timeout", self.node_timeout), ("retry delay", self.retry_delay)]
        {
            if value > crate::MAX_DURATION {
                return Err(crate::error::too_long(&format!("a RedLock's {what}"), value));
            }
        }
        Ok(())
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
    /// [`Error::ZeroLease`] for a zero lease; [`Error::InvalidArgument`] for a lease beyond
    /// [`crate::MAX_DURATION`] or bad arguments (see [`RedLock::new`]: nothing sent);
    /// [`Error::TimedOut`] when no attempt within `wait`
    /// reached a majority with time left (every grant of a failed attempt is given back).
    pub async fn try_acquire(&self, wait: Duration, lease: Option<Duration>) -> Result<MultiGuard> {
        self.check()?;
        let deadline = crate::engine::deadline_after(wait);
        let watchdog_timeout = self.locks[0].chain().shared().options.watchdog_timeout;
        let watchdog = lease.is_none().then_some(watchdog_timeout);
        let lease = crate::engine::checked_lease("a lease", lease.unwrap_or(watchdog_timeout))?;
        let watchdog = watchdog.map(|_| lease);
        let settle = self.node_timeout.max(Duration::from_millis(100));
        loop {
            let started = Instant::now();
            let owner = self.locks[0].chain().fresh_owner();
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
