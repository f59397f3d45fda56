//! [`LeasedSemaphore`]: Redisson's permit-expirable semaphore on one server (`RSEM.* LEASE`),
//! whose [`PermitGuard`]s hold leased permits by id.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use crate::error::{Error, Result};
use crate::guard::GuardCore;
use crate::options::millis;
use crate::semaphore::Semaphore;

/// A semaphore whose permits are leased (Redisson's `RPermitExpirableSemaphore`, on its data
/// layout): each grant's permits have ids and a lease, so permits of a holder that died come
/// back when their lease ends (the server puts them back within a few ms, waiters first).
///
/// ```no_run
/// # async fn example(client: rlock_client::LockClient) -> Result<(), rlock_client::Error> {
/// let workers = client.leased_semaphore("workers");
/// workers.try_set_permits(8).await?;
/// let permit = workers.acquire(1, None).await?; // renewed by the watchdog while held
/// // ... work ...
/// permit.release().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct LeasedSemaphore {
    sem: Semaphore,
    watchdog_timeout: Duration,
}

impl LeasedSemaphore {
    pub(crate) const fn new(sem: Semaphore, watchdog_timeout: Duration) -> Self {
        Self { sem, watchdog_timeout }
    }

    /// The semaphore's name (its Redis key).
    #[must_use]
    pub fn name(&self) -> &[u8] {
        self.sem.name()
    }

    /// Sets the permits if the semaphore does not exist yet; `true` when it was set.
    ///
    /// # Errors
    /// [`Error::Redis`] when Redis fails.
    pub async fn try_set_permits(&self, permits: u64) -> Result<bool> {
        self.sem.try_set_permits(permits).await
    }

    /// Adds permits (negative: takes them away); returns the new count of unleased permits.
    ///
    /// # Errors
    /// [`Error::Redis`] when Redis fails.
    pub async fn add_permits(&self, delta: i64) -> Result<i64> {
        self.sem.add_permits(delta).await
    }

    /// The permits not leased now.
    ///
    /// # Errors
    /// [`Error::Redis`] when Redis fails.
    pub async fn available(&self) -> Result<i64> {
        self.sem.available().await
    }

    /// Takes `permits`, waiting in the server as long as it takes. `lease: None` uses the
    /// watchdog: a lease of [`crate::Options::watchdog_timeout`], renewed every third of it
    /// while the guard lives.
    ///
    /// # Errors
    /// [`Error::Redis`] when Redis fails.
    pub async fn acquire(&self, permits: u64, lease: Option<Duration>) -> Result<PermitGuard> {
        self.take(permits, None, lease).await
    }

    /// As [`Self::acquire`], waiting at most `wait`.
    ///
    /// # Errors
    /// [`Error::TimedOut`] when `wait` passes first; [`Error::Redis`] when Redis fails.
    pub async fn try_acquire(
        &self,
        permits: u64,
        wait: Duration,
        lease: Option<Duration>,
    ) -> Result<PermitGuard> {
        let deadline = Instant::now().checked_add(wait);
        self.take(permits, deadline, lease).await
    }

    async fn take(
        &self,
        permits: u64,
        deadline: Option<Instant>,
        lease: Option<Duration>,
    ) -> Result<PermitGuard> {
        let lease_ms = millis(lease.unwrap_or(self.watchdog_timeout));
        let asked_at = Instant::now();
        let Some(redis::Value::Array(items)) =
            self.sem.take(permits, Some(lease_ms), deadline).await?
        else {
            return Err(Error::TimedOut);
        };
        let ids: Vec<Vec<u8>> = items
            .into_iter()
            .filter_map(|v| match v {
                redis::Value::BulkString(id) => Some(id),
                _ => None,
            })
            .collect();
        Ok(PermitGuard::new(self.clone(), ids, (lease_ms, asked_at), lease.is_none()))
    }

    /// `RSEM.RENEW` of every id: `Ok(false)` when one of them is not leased any more.
    async fn renew(&self, ids: &[Vec<u8>], lease_ms: u64) -> Result<bool> {
        for id in ids {
            let mut command = redis::cmd("RSEM.RENEW");
            command.arg(self.sem.name()).arg(id).arg(lease_ms);
            let renewed: i64 = command.query_async(&mut self.sem.conn()).await?;
            if renewed != 1 {
                return Ok(false);
            }
        }
        Ok(true)
    }
}

/// Leased permits held by id. Release them with [`PermitGuard::release`]; dropping the guard
/// releases them too (in the background, see `Drop`).
#[must_use = "dropping the guard releases the permits"]
pub struct PermitGuard {
    sem: LeasedSemaphore,
    ids: Vec<Vec<u8>>,
    /// The permits' lease (renewed with the same lease by the watchdog).
    lease: Duration,
    core: GuardCore,
}

impl fmt::Debug for PermitGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PermitGuard")
            .field("semaphore", &String::from_utf8_lossy(self.sem.name()))
            .field("permits", &self.ids.len())
            .field("lost", &self.core.is_lost())
            .finish()
    }
}

impl PermitGuard {
    fn new(
        sem: LeasedSemaphore,
        ids: Vec<Vec<u8>>,
        granted: (u64, Instant),
        watchdog: bool,
    ) -> Self {
        let lost = Arc::new(watch::channel(false).0);
        let (renewing, renewing_ids, lease_ms) = (sem.clone(), ids.clone(), granted.0);
        let core = GuardCore::new(watchdog, granted, &lost, move || {
            let (sem, ids) = (renewing.clone(), renewing_ids.clone());
            async move { sem.renew(&ids, lease_ms).await }
        });
        Self { sem, ids, lease: Duration::from_millis(lease_ms), core }
    }

    /// The permits' ids (16 bytes each; Redisson shows them as 32 hex characters).
    #[must_use]
    pub fn ids(&self) -> &[Vec<u8>] {
        &self.ids
    }

    /// Whether the watchdog found a permit's lease gone (the permits went back to the pool).
    #[must_use]
    pub fn is_lost(&self) -> bool {
        self.core.is_lost()
    }

    /// Resolves when the watchdog finds a permit's lease gone; never without a watchdog.
    pub async fn lost(&self) {
        self.core.lost().await;
    }

    /// Releases the permits.
    ///
    /// # Errors
    /// [`Error::NotHeld`] when they were not all still leased (their lease ended: nothing is
    /// released then, as in Redisson); [`Error::Redis`] when Redis fails.
    pub async fn release(mut self) -> Result<()> {
        self.core.give_back();
        let ids = std::mem::take(&mut self.ids);
        let mut command = redis::cmd("RSEM.RELEASE");
        command.arg(self.sem.name()).arg("ID").arg(&ids);
        let released: i64 = command.query_async(&mut self.sem.sem.conn()).await?;
        if usize::try_from(released).is_ok_and(|n| n == ids.len()) {
            Ok(())
        } else {
            Err(Error::NotHeld)
        }
    }
}

impl Drop for PermitGuard {
    /// Gives the permits back without blocking: `RSEM.RELEASE name ID ..` goes to the client's
    /// background releaser (its own thread and connections: no runtime needed), tried until
    /// their lease would have ended anyway. Releasing by id is idempotent: a retry never gives
    /// back permits twice.
    fn drop(&mut self) {
        if !self.core.give_back() || self.ids.is_empty() {
            return;
        }
        let ids = std::mem::take(&mut self.ids);
        let name: Arc<[u8]> = self.sem.name().into();
        let mut command = redis::cmd("RSEM.RELEASE");
        command.arg(&*name).arg("ID").arg(ids);
        let until = crate::releaser::until_after(self.lease);
        self.sem.sem.releaser().submit(name, command, until, None);
    }
}
