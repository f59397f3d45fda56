//! [`LeasedSemaphore`]: Redisson's permit-expirable semaphore on one server (`RSEM.* LEASE`),
//! whose [`PermitGuard`]s hold leased permits by id.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::engine::binding::Binding;
use crate::engine::chain::refresh_after_wait;
use crate::engine::hold::{after, Hold, Member};
use crate::engine::kind::{Holder, Kind};
use crate::engine::request::Request;
use crate::engine::{bound, checked_lease, millis};
use crate::error::{Error, Result};
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
#[derive(Clone)]
pub struct LeasedSemaphore {
    sem: Semaphore,
    watchdog_timeout: Duration,
    /// The session its permits are bound to (`SESSION`), if any.
    session: Option<Arc<Binding>>,
}

impl fmt::Debug for LeasedSemaphore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeasedSemaphore")
            .field("sem", &self.sem)
            .field("watchdog_timeout", &self.watchdog_timeout)
            .field("session", &self.session.is_some())
            .finish()
    }
}

/// The most leased permits one grant takes (the server's `MAX_LEASED`).
const MAX_LEASED: u64 = 10_000;

impl LeasedSemaphore {
    pub(crate) const fn new(
        sem: Semaphore,
        watchdog_timeout: Duration,
        session: Option<Arc<Binding>>,
    ) -> Self {
        Self { sem, watchdog_timeout, session }
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
    /// [`Error::ZeroLease`] for `Some(Duration::ZERO)`; [`Error::InvalidArgument`] for a lease
    /// beyond [`crate::MAX_DURATION`] or a count outside 1 to 10,000 (nothing sent);
    /// [`Error::TimedOut`] when the server did
    /// not answer in time (the request is cancelled: nothing stays leased); [`Error::Redis`]
    /// when Redis fails or refuses.
    pub async fn acquire(&self, permits: u64, lease: Option<Duration>) -> Result<PermitGuard> {
        self.take(permits, None, lease).await
    }

    /// As [`Self::acquire`], waiting at most `wait` (`Duration::ZERO`: one try; beyond
    /// [`crate::MAX_DURATION`]: without limit). Returns by
    /// `wait` plus half a second whatever the server does.
    ///
    /// # Errors
    /// [`Error::TimedOut`] when `wait` passes first (nothing stays leased); otherwise as
    /// [`Self::acquire`].
    pub async fn try_acquire(
        &self,
        permits: u64,
        wait: Duration,
        lease: Option<Duration>,
    ) -> Result<PermitGuard> {
        self.take(permits, crate::engine::deadline_after(wait), lease).await
    }

    async fn take(
        &self,
        permits: u64,
        deadline: Option<Instant>,
        lease: Option<Duration>,
    ) -> Result<PermitGuard> {
        crate::semaphore::checked_permits("the permits asked for", permits, 1, MAX_LEASED)?;
        let watchdog = lease.is_none().then_some(self.watchdog_timeout);
        let lease = checked_lease("a lease", lease.unwrap_or(self.watchdog_timeout))?;
        let watchdog = watchdog.map(|_| lease);
        let bound = bound(deadline, Instant::now());
        let (shared, key) = (self.sem.shared(), self.sem.key());
        let kind = Kind::Leased(permits);
        let mut request = Request::new(shared, key, kind, Arc::from(""), millis(lease))
            .session(self.session.clone());
        let Some(grant) = request.run(deadline, bound).await? else {
            return Err(Error::TimedOut);
        };
        let holder = Holder::Ids(Arc::from(grant.ids));
        let hold = Hold::new(shared, key, kind, holder, None, after(request.sent(), lease));
        request.bind(&hold)?;
        refresh_after_wait(&hold, &request, lease, bound).await;
        let Some(member) = hold.join(watchdog) else { return Err(Error::NotHeld) };
        request.taken();
        Ok(PermitGuard { sem: self.clone(), member })
    }
}

/// Leased permits held by id (one grant). Release them with [`PermitGuard::release`]; dropping
/// the guard releases them too, in the background (see `Drop`).
#[must_use = "dropping the guard releases the permits"]
pub struct PermitGuard {
    sem: LeasedSemaphore,
    member: Member,
}

impl fmt::Debug for PermitGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PermitGuard")
            .field("semaphore", &String::from_utf8_lossy(self.sem.name()))
            .field("permits", &self.ids().len())
            .field("lost", &self.is_lost())
            .finish()
    }
}

impl PermitGuard {
    /// The permits' ids (16 bytes each; Redisson shows them as 32 hex characters).
    #[must_use]
    pub fn ids(&self) -> &[Vec<u8>] {
        match self.member.hold().holder() {
            Holder::Ids(ids) => ids,
            _ => &[],
        }
    }

    /// Whether the permits are lost: their deadline ([`PermitGuard::valid_until`]) passed
    /// without a confirmation, or a renewal found a permit's lease gone.
    #[must_use]
    pub fn is_lost(&self) -> bool {
        self.member.hold().is_lost()
    }

    /// Until when every permit is known leased, on this process's monotonic clock (as
    /// [`crate::LockGuard::valid_until`]). `None` once they are known lost.
    #[must_use]
    pub fn valid_until(&self) -> Option<Instant> {
        self.member.hold().until()
    }

    /// Resolves when the permits are lost (see [`PermitGuard::is_lost`]).
    pub async fn lost(&self) {
        self.member.hold().lost().await;
    }

    /// Releases the permits (`RSEM.RELEASE key ID ..`), retried after a connection error.
    ///
    /// # Errors
    /// [`Error::NotHeld`] when they were not all still leased (their lease ended: nothing is
    /// released then, as in Redisson); [`Error::Redis`] when Redis fails (the release then
    /// goes on in the background).
    pub async fn release(self) -> Result<()> {
        self.member.release().await
    }
}

// Dropping a `PermitGuard` drops its `Member`, which hands the release to the client's
// background releaser: it never blocks, and needs no runtime.
