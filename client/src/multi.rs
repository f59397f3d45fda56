//! Locks over several independent servers: [`MultiLock`] (all of them) and [`RedLock`]
//! (a majority of them).

use std::fmt;
use std::time::Duration;

use tokio::time::Instant;

use crate::client::LockClient;
use crate::error::{Error, Result};
use crate::guard::GuardCore;
use crate::lock::Attempt;
use crate::lock::Lock;
use crate::options::{millis, wait_budget};

/// The same named lock on N independent servers, held on all of them or none (Redisson's
/// MultiLock). Taking it never holds one lock while waiting for another: when one is busy, the
/// ones taken are released and the client waits (server-side) for the busy one, then tries the
/// others again.
#[derive(Debug, Clone)]
pub struct MultiLock {
    locks: Vec<Lock>,
    watchdog_ms: u64,
}

impl MultiLock {
    /// `locks`: one handle per server, e.g. `clients.iter().map(|c| c.lock("name"))`.
    ///
    /// # Panics
    /// When `locks` is empty.
    #[must_use]
    pub fn new(locks: Vec<Lock>) -> Self {
        assert!(!locks.is_empty(), "a MultiLock needs at least one lock");
        let watchdog_ms = millis(locks[0].options().watchdog_timeout);
        Self { locks, watchdog_ms }
    }

    /// Takes every lock, waiting as long as it takes. `lease: None` uses the watchdog.
    ///
    /// # Errors
    /// [`Error::Redis`] when a server fails (every lock taken is released first).
    pub async fn acquire(&self, lease: Option<Duration>) -> Result<MultiGuard> {
        self.acquire_within(None, lease).await
    }

    /// Takes every lock, waiting at most `wait`.
    ///
    /// # Errors
    /// [`Error::TimedOut`] when `wait` passes first; [`Error::Redis`] when a server fails.
    pub async fn try_acquire(&self, wait: Duration, lease: Option<Duration>) -> Result<MultiGuard> {
        self.acquire_within(Instant::now().checked_add(wait), lease).await
    }

    async fn acquire_within(
        &self,
        deadline: Option<Instant>,
        lease: Option<Duration>,
    ) -> Result<MultiGuard> {
        let lease_ms = lease.map_or(self.watchdog_ms, millis);
        // Each lock is first taken with a longer lease, so the first ones cannot lapse while
        // the last ones are taken; the real lease is set on all of them at the end.
        let taking_ms = lease_ms.saturating_mul(2);
        let mut waited_for: Option<usize> = None;
        loop {
            // What this round took (or may have: a try in flight), released if the round ends
            // without a guard, the future dropped included.
            let mut taking = Taking {
                locks: &self.locks,
                held: waited_for.into_iter().collect(),
                lease: Duration::from_millis(taking_ms),
            };
            let mut busy = None;
            for (i, lock) in self.locks.iter().enumerate() {
                if taking.held.contains(&i) {
                    continue;
                }
                // A node that does not answer within the budget may still grant later: it is
                // released too (in the background, ordered after the acquire on its connection).
                taking.held.push(i);
                let attempt = match deadline {
                    None => lock.try_once(taking_ms, false).await,
                    Some(d) => tokio::time::timeout_at(d, lock.try_once(taking_ms, false))
                        .await
                        .unwrap_or(Err(Error::TimedOut)),
                };
                match attempt {
                    Ok(Attempt::Held { .. }) => {}
                    Ok(Attempt::Busy { .. }) => {
                        taking.held.pop();
                        busy = Some(i);
                        break;
                    }
                    Err(e) => {
                        // Its outcome is unknown: `taking` releases it with the others.
                        return Err(if uncertain(&e) { Error::TimedOut } else { e });
                    }
                }
            }
            let Some(busy) = busy else {
                // All taken: set the real lease everywhere. A lock lost meanwhile: start over.
                let mut all_renewed = true;
                let since = Instant::now();
                for lock in &self.locks {
                    if !lock.renew(lease_ms).await? {
                        all_renewed = false;
                    }
                }
                if all_renewed {
                    taking.held.clear(); // the guard owns them now
                    let guard = MultiGuard::new(
                        self.locks.clone(),
                        self.locks.len(),
                        (lease_ms, since),
                        lease.is_none(),
                        MULTI_RELEASE_TIMEOUT,
                    );
                    return Ok(guard);
                }
                waited_for = None;
                continue;
            };
            drop(taking);
            let wait_ms = wait_budget(deadline)?;
            if !self.locks[busy].wait_on_server(taking_ms, wait_ms, false).await?.is_held() {
                return Err(Error::TimedOut);
            }
            waited_for = Some(busy);
        }
    }
}

/// Locks a [`MultiLock`] acquire took (or may have), released on drop unless handed to a guard:
/// in the background on their shared connections (so after any acquire still in flight there),
/// or, with no runtime to run that, by the clients' releasers.
struct Taking<'a> {
    locks: &'a [Lock],
    held: Vec<usize>,
    /// The lease they were taken with.
    lease: Duration,
}

impl Drop for Taking<'_> {
    fn drop(&mut self) {
        if self.held.is_empty() {
            return;
        }
        let locks: Vec<Lock> = self.held.iter().map(|&i| self.locks[i].clone()).collect();
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move {
                    let releases = locks.iter().map(Lock::release_once);
                    futures_util::future::join_all(releases).await;
                });
            }
            Err(_) => {
                let until = crate::releaser::until_after(self.lease);
                for lock in &locks {
                    lock.release_later(lock.owner(), until);
                }
            }
        }
    }
}

/// How long a [`MultiLock`] guard's release waits for each server (in parallel).
const MULTI_RELEASE_TIMEOUT: Duration = Duration::from_secs(5);

/// Whether an error leaves the outcome of a command unknown (it may have run).
fn uncertain(e: &Error) -> bool {
    match e {
        Error::TimedOut => true,
        Error::Redis(e) => e.is_timeout() || e.is_io_error() || e.is_connection_dropped(),
        _ => false,
    }
}

/// The same named lock on N (odd) independent masters, held when a majority grant it within
/// its validity (antirez's RedLock). Every node gets the same owner id.
///
/// Caveats (see the README): RedLock assumes bounded clock drift and process pauses; a holder
/// paused past its validity can still act. It protects efficiency, not correctness, unless the
/// protected resource checks fencing tokens.
#[derive(Clone)]
pub struct RedLock {
    locks: Vec<Lock>,
    node_timeout: Duration,
    retry_delay: Duration,
    watchdog_ms: u64,
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

impl RedLock {
    /// The lock `name` on each of `clients` (one per independent master), with one owner id.
    ///
    /// # Panics
    /// When `clients` is empty.
    #[must_use]
    pub fn new(clients: &[LockClient], name: impl AsRef<[u8]>) -> Self {
        assert!(!clients.is_empty(), "a RedLock needs at least one server");
        let owner = format!("{}:redlock:{}", clients[0].id(), uuid::Uuid::new_v4().simple());
        let locks: Vec<Lock> =
            clients.iter().map(|c| c.lock_as(name.as_ref(), owner.clone())).collect();
        let watchdog_ms = millis(locks[0].options().watchdog_timeout);
        Self {
            locks,
            node_timeout: Duration::from_millis(50),
            retry_delay: Duration::from_millis(50),
            watchdog_ms,
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

    /// Takes the lock on a majority of nodes, trying again within `wait`. `lease: None` uses the
    /// watchdog, which keeps renewing on every node and reports a loss when fewer than a
    /// majority still hold it.
    ///
    /// # Errors
    /// [`Error::TimedOut`] when no attempt within `wait` reached a majority with time left.
    pub async fn try_acquire(&self, wait: Duration, lease: Option<Duration>) -> Result<MultiGuard> {
        let deadline = Instant::now().checked_add(wait);
        let lease_ms = lease.map_or(self.watchdog_ms, millis);
        let lease_d = Duration::from_millis(lease_ms);
        loop {
            let started = Instant::now();
            let attempts = self.locks.iter().map(|lock| async move {
                matches!(
                    tokio::time::timeout(self.node_timeout, lock.try_once(lease_ms, false)).await,
                    Ok(Ok(Attempt::Held { .. }))
                )
            });
            let granted = futures_util::future::join_all(attempts).await;
            let count = granted.iter().filter(|&&g| g).count();
            let validity = lease_d.checked_sub(started.elapsed() + drift(lease_d));
            if count >= self.quorum() {
                if let Some(validity) = validity.filter(|v| !v.is_zero()) {
                    let mut guard = MultiGuard::new(
                        self.locks.clone(),
                        self.quorum(),
                        (lease_ms, started),
                        lease.is_none(),
                        self.node_timeout.max(Duration::from_millis(100)),
                    );
                    guard.validity = Some(validity);
                    return Ok(guard);
                }
            }
            // Failed: release on every node, the silent ones included.
            release_everywhere(&self.locks, self.node_timeout.max(Duration::from_millis(100)))
                .await;
            let left =
                deadline.map_or(Duration::MAX, |d| d.saturating_duration_since(Instant::now()));
            if left.is_zero() {
                return Err(Error::TimedOut);
            }
            tokio::time::sleep(jitter(self.retry_delay).min(left)).await;
        }
    }
}

/// A random part of `max`.
fn jitter(max: Duration) -> Duration {
    let r = (uuid::Uuid::new_v4().as_u128() % 1_000) as u32;
    max * r / 1_000
}

async fn release_everywhere(locks: &[Lock], node_timeout: Duration) -> usize {
    let releases = locks.iter().map(|lock| async move {
        matches!(tokio::time::timeout(node_timeout, lock.release_once()).await, Ok(Ok(())))
    });
    futures_util::future::join_all(releases).await.into_iter().filter(|&r| r).count()
}

/// A lock held on several servers ([`MultiLock`]: all; [`RedLock`]: a majority). Release it
/// with [`MultiGuard::release`]; dropping it releases in the background.
#[must_use = "dropping the guard releases the lock"]
pub struct MultiGuard {
    locks: Vec<Lock>,
    quorum: usize,
    /// How long a release waits for each server (in parallel).
    node_timeout: Duration,
    validity: Option<Duration>,
    /// The lease each server's lock is taken (and renewed) with.
    lease: Duration,
    core: GuardCore,
}

impl fmt::Debug for MultiGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MultiGuard")
            .field("servers", &self.locks.len())
            .field("quorum", &self.quorum)
            .field("validity", &self.validity)
            .finish_non_exhaustive()
    }
}

impl MultiGuard {
    fn new(
        locks: Vec<Lock>,
        quorum: usize,
        (lease_ms, since): (u64, Instant),
        watchdog: bool,
        node_timeout: Duration,
    ) -> Self {
        let lost = std::sync::Arc::new(tokio::sync::watch::channel(false).0);
        let renewing = locks.clone();
        let core = GuardCore::new(watchdog, (lease_ms, since), &lost, move || {
            let locks = renewing.clone();
            async move {
                // Lost only when too many servers really lost it (renew said 0); a server that
                // failed to answer is retried (the renewal retries while the lease may still be
                // alive).
                let renewals = locks.iter().map(|l| l.renew(lease_ms));
                let results = futures_util::future::join_all(renewals).await;
                let gone = results.iter().filter(|r| matches!(r, Ok(false))).count();
                if gone > locks.len() - quorum {
                    return Ok(false);
                }
                match results.into_iter().find_map(Result::err) {
                    Some(e) => Err(e),
                    None => Ok(true),
                }
            }
        });
        let lease = Duration::from_millis(lease_ms);
        Self { locks, quorum, node_timeout, validity: None, lease, core }
    }

    /// For a [`RedLock`]: how long the lock was valid for when it was granted (the lease minus
    /// the time taking it took minus the drift allowance). `None` for a [`MultiLock`].
    #[must_use]
    pub const fn validity(&self) -> Option<Duration> {
        self.validity
    }

    /// Whether the watchdog found too few servers still holding the lock.
    #[must_use]
    pub fn is_lost(&self) -> bool {
        self.core.is_lost()
    }

    /// Resolves when the watchdog finds the lock lost; never without a watchdog.
    pub async fn lost(&self) {
        self.core.lost().await;
    }

    /// Releases the lock on every server.
    ///
    /// # Errors
    /// [`Error::NotHeld`] when fewer servers than required (all, or a majority) still held it.
    pub async fn release(mut self) -> Result<()> {
        self.core.give_back();
        let released = release_everywhere(&self.locks, self.node_timeout).await;
        if released >= self.quorum {
            Ok(())
        } else {
            Err(Error::NotHeld)
        }
    }
}

impl Drop for MultiGuard {
    fn drop(&mut self) {
        if !self.core.give_back() {
            return;
        }
        // As a single guard: each server's release goes to its client's background releaser
        // (no blocking, no runtime needed), tried until the lease would have ended anyway.
        let until = crate::releaser::until_after(self.lease);
        for lock in &self.locks {
            lock.release_later(lock.owner(), until);
        }
    }
}
