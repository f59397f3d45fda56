//! # rlock-client
//!
//! An async client for the [rlock](../README.md) Redis module: reentrant distributed locks with
//! Redisson's semantics, on tokio and redis-rs.
//!
//! ```no_run
//! use std::time::Duration;
//! use rlock_client::LockClient;
//!
//! # async fn example() -> Result<(), rlock_client::Error> {
//! let client = LockClient::open("redis://127.0.0.1:6390/").await?;
//! let lock = client.lock("orders:42");
//!
//! // Wait as long as it takes; no lease given, so a watchdog renews it until release.
//! let guard = lock.acquire(None).await?;
//! // ... critical section ...
//! guard.release().await?;
//!
//! // Wait at most 2 s; a 10 s lease that is not renewed.
//! match lock.try_acquire(Duration::from_secs(2), Some(Duration::from_secs(10))).await {
//!     Ok(guard) => guard.release().await?,
//!     Err(rlock_client::Error::TimedOut) => println!("busy"),
//!     Err(e) => return Err(e),
//! }
//! # Ok(()) }
//! ```
//!
//! - **Owners.** Each [`Lock`] handle has its own owner id, `<client-uuid>:<n>`: re-entry is per
//!   handle (clones share it), not per thread, since async tasks move between threads.
//! - **Watchdog.** With no lease, the lock is taken with [`Options::watchdog_timeout`] (30 s) and
//!   renewed every third of it until released. A renewal that finds the lock gone marks the
//!   guard lost: see [`LockGuard::is_lost`] and [`LockGuard::lost`].
//! - **Waiting** is server-side: `RLOCK.ACQUIRE ... WAIT` on a dedicated connection; the server
//!   queues waiters FIFO and hands the lock to one of them when it is free. No pub/sub, no retry
//!   loop. Dropping an acquire future cancels the wait without leaking the lock: a grant that
//!   races the cancellation is released.
//! - **Dropping a guard** releases the lock in the background (on the current tokio runtime).

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use redis::aio::ConnectionManager;
use redis::{IntoConnectionInfo, RedisError};
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// How long a cancelled wait may take to learn whether it was granted meanwhile.
const CANCEL_GRACE: Duration = Duration::from_secs(5);

/// Errors of lock operations.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// The lock was not held by this owner (released by someone else, or its lease ran out).
    NotHeld,
    /// The wait budget ran out before the lock could be taken.
    TimedOut,
    /// Redis (or the connection to it) failed.
    Redis(RedisError),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NotHeld => f.write_str("the lock is not held by this owner"),
            Self::TimedOut => f.write_str("timed out waiting for the lock"),
            Self::Redis(e) => write!(f, "redis error: {e}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Redis(e) => Some(e),
            _ => None,
        }
    }
}

impl From<RedisError> for Error {
    fn from(e: RedisError) -> Self {
        Self::Redis(e)
    }
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Client settings.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Options {
    /// The lease used when none is given, renewed every third of it (Redisson's
    /// `lockWatchdogTimeout`). Default 30 s.
    pub watchdog_timeout: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Self { watchdog_timeout: Duration::from_secs(30) }
    }
}

impl Options {
    /// Sets [`Options::watchdog_timeout`].
    #[must_use]
    pub const fn watchdog_timeout(mut self, timeout: Duration) -> Self {
        self.watchdog_timeout = timeout;
        self
    }
}

/// What the server says of a lock's lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Remaining {
    /// No lock.
    NotLocked,
    /// Locked, with no expiry.
    NoExpiry,
    /// Locked, expiring after this long.
    Lease(Duration),
}

struct Shared {
    client: redis::Client,
    conn: ConnectionManager,
    id: String,
    next_handle: AtomicU64,
    options: Options,
}

/// A connection to a Redis server with the rlock module, from which [`Lock`] handles are made.
/// Cheap to clone.
#[derive(Clone)]
pub struct LockClient {
    shared: Arc<Shared>,
}

impl fmt::Debug for LockClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockClient").field("id", &self.shared.id).finish_non_exhaustive()
    }
}

impl LockClient {
    /// Connects to `url` (e.g. `redis://127.0.0.1:6390/`) with default [`Options`].
    ///
    /// # Errors
    /// When the URL is invalid or the server cannot be reached.
    pub async fn open<T: IntoConnectionInfo>(url: T) -> Result<Self> {
        Self::with_options(redis::Client::open(url)?, Options::default()).await
    }

    /// Uses an existing `redis::Client`, with default [`Options`].
    ///
    /// # Errors
    /// When the server cannot be reached.
    pub async fn new(client: redis::Client) -> Result<Self> {
        Self::with_options(client, Options::default()).await
    }

    /// Uses an existing `redis::Client` with the given options.
    ///
    /// # Errors
    /// When the server cannot be reached.
    pub async fn with_options(client: redis::Client, options: Options) -> Result<Self> {
        let conn = client.get_connection_manager().await?;
        Ok(Self {
            shared: Arc::new(Shared {
                client,
                conn,
                id: uuid::Uuid::new_v4().to_string(),
                next_handle: AtomicU64::new(1),
                options,
            }),
        })
    }

    /// This client's process-unique id (a UUID v4), the prefix of its owner ids.
    #[must_use]
    pub fn id(&self) -> &str {
        &self.shared.id
    }

    /// A handle on the lock `name`, with a new owner id. Re-entry is per handle.
    #[must_use]
    pub fn lock(&self, name: impl AsRef<[u8]>) -> Lock {
        let n = self.shared.next_handle.fetch_add(1, Ordering::Relaxed);
        Lock {
            shared: Arc::clone(&self.shared),
            name: name.as_ref().into(),
            owner: format!("{}:{n}", self.shared.id).into(),
        }
    }
}

/// A handle on one named lock with one owner id. Clones share the owner id (and so re-enter).
#[derive(Clone)]
pub struct Lock {
    shared: Arc<Shared>,
    name: Arc<[u8]>,
    owner: Arc<str>,
}

impl fmt::Debug for Lock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lock")
            .field("name", &String::from_utf8_lossy(&self.name))
            .field("owner", &self.owner)
            .finish_non_exhaustive()
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}

impl Lock {
    /// The lock's name (its Redis key).
    #[must_use]
    pub fn name(&self) -> &[u8] {
        &self.name
    }

    /// This handle's owner id.
    #[must_use]
    pub fn owner(&self) -> &str {
        &self.owner
    }

    fn conn(&self) -> ConnectionManager {
        self.shared.conn.clone()
    }

    /// Takes the lock, waiting as long as it takes. `lease: None` uses the watchdog.
    ///
    /// # Errors
    /// [`Error::Redis`] when Redis fails.
    pub async fn acquire(&self, lease: Option<Duration>) -> Result<LockGuard> {
        self.acquire_within(None, lease).await
    }

    /// Takes the lock, waiting at most `wait`. `lease: None` uses the watchdog.
    ///
    /// # Errors
    /// [`Error::TimedOut`] when `wait` passes first; [`Error::Redis`] when Redis fails.
    pub async fn try_acquire(&self, wait: Duration, lease: Option<Duration>) -> Result<LockGuard> {
        self.acquire_within(Some(Instant::now() + wait), lease).await
    }

    async fn acquire_within(
        &self,
        deadline: Option<Instant>,
        lease: Option<Duration>,
    ) -> Result<LockGuard> {
        let lease_ms = millis(lease.unwrap_or(self.shared.options.watchdog_timeout));
        let granted = || LockGuard::new(self.clone(), lease_ms, lease.is_none());
        // Uncontended: one try on the shared connection.
        if self.try_once(lease_ms).await?.is_none() {
            return Ok(granted());
        }
        // Contended: the server queues us and hands the lock over (FIFO) when it is free.
        let wait_ms = match deadline {
            None => 0, // WAIT 0: without limit
            Some(deadline) => match deadline.checked_duration_since(Instant::now()) {
                Some(left) if !left.is_zero() => millis(left),
                _ => return Err(Error::TimedOut),
            },
        };
        if self.wait_on_server(lease_ms, wait_ms).await? {
            Ok(granted())
        } else {
            Err(Error::TimedOut)
        }
    }

    /// `RLOCK.ACQUIRE ... WAIT wait_ms` on a dedicated connection, run by a task of its own so a
    /// caller that drops this future (a cancelled wait) cannot leak the lock: the task then
    /// makes the server answer at once (`CLIENT UNBLOCK ... TIMEOUT`), releases the lock if the
    /// answer was a grant, and discards the connection, so no late reply reaches a pooled one.
    /// `true`: acquired; `false`: the wait timed out.
    async fn wait_on_server(&self, lease_ms: u64, wait_ms: u64) -> Result<bool> {
        let (reply_tx, reply_rx) = oneshot::channel();
        tokio::spawn(self.clone().blocking_wait(lease_ms, wait_ms, reply_tx));
        reply_rx.await.unwrap_or_else(|_| {
            Err(Error::Redis(RedisError::from((
                redis::ErrorKind::Io,
                "the task waiting for the lock stopped",
            ))))
        })
    }

    async fn blocking_wait(
        self,
        lease_ms: u64,
        wait_ms: u64,
        mut reply: oneshot::Sender<Result<bool>>,
    ) {
        let config = redis::AsyncConnectionConfig::new().set_response_timeout(None);
        let mut con =
            match self.shared.client.get_multiplexed_async_connection_with_config(&config).await {
                Ok(con) => con,
                Err(e) => {
                    let _ = reply.send(Err(e.into()));
                    return;
                }
            };
        let id: i64 = match redis::cmd("CLIENT").arg("ID").query_async(&mut con).await {
            Ok(id) => id,
            Err(e) => {
                let _ = reply.send(Err(e.into()));
                return;
            }
        };
        let mut acquire = redis::cmd("RLOCK.ACQUIRE");
        acquire.arg(&*self.name).arg(&*self.owner).arg(lease_ms).arg("WAIT").arg(wait_ms);
        let wait = acquire.query_async::<Option<i64>>(&mut con);
        tokio::pin!(wait);
        let answer = tokio::select! {
            answer = &mut wait => answer,
            () = reply.closed() => {
                // Cancelled: have the server answer now, and settle what it answers.
                let _: redis::RedisResult<i64> = redis::cmd("CLIENT")
                    .arg("UNBLOCK")
                    .arg(id)
                    .arg("TIMEOUT")
                    .query_async(&mut self.conn())
                    .await;
                if let Ok(Ok(None)) = tokio::time::timeout(CANCEL_GRACE, wait).await {
                    let _ = self.release_once().await;
                }
                return; // dropping the connection: a wait still pending leaves the queue
            }
        };
        let granted = answer.map(|a| a.is_none()).map_err(Error::from);
        if let Err(Ok(true)) = reply.send(granted) {
            // The caller went away just as the grant arrived.
            let _ = self.release_once().await;
        }
    }

    /// One `RLOCK.ACQUIRE`: `None` when taken, else the holder's remaining lease.
    async fn try_once(&self, lease_ms: u64) -> Result<Option<i64>> {
        Ok(redis::cmd("RLOCK.ACQUIRE")
            .arg(&*self.name)
            .arg(&*self.owner)
            .arg(lease_ms)
            .query_async(&mut self.conn())
            .await?)
    }

    /// Releases one hold of this handle (the guard's `release` is the usual way).
    async fn release_once(&self) -> Result<()> {
        let reply: Option<i64> = redis::cmd("RLOCK.RELEASE")
            .arg(&*self.name)
            .arg(&*self.owner)
            .query_async(&mut self.conn())
            .await?;
        reply.map(|_| ()).ok_or(Error::NotHeld)
    }

    async fn renew(&self, lease_ms: u64) -> Result<bool> {
        let renewed: i64 = redis::cmd("RLOCK.RENEW")
            .arg(&*self.name)
            .arg(&*self.owner)
            .arg(lease_ms)
            .query_async(&mut self.conn())
            .await?;
        Ok(renewed == 1)
    }

    /// Whether anyone holds the lock.
    ///
    /// # Errors
    /// [`Error::Redis`] when Redis fails.
    pub async fn is_locked(&self) -> Result<bool> {
        Ok(self.remaining_lease().await? != Remaining::NotLocked)
    }

    /// How many times this handle holds the lock (0: not held by this handle).
    ///
    /// # Errors
    /// [`Error::Redis`] when Redis fails.
    pub async fn hold_count(&self) -> Result<u64> {
        let count: Option<u64> = redis::cmd("HGET")
            .arg(&*self.name)
            .arg(&*self.owner)
            .query_async(&mut self.conn())
            .await?;
        Ok(count.unwrap_or(0))
    }

    /// The lock's remaining lease, whoever holds it.
    ///
    /// # Errors
    /// [`Error::Redis`] when Redis fails.
    pub async fn remaining_lease(&self) -> Result<Remaining> {
        let pttl: i64 =
            redis::cmd("RLOCK.PTTL").arg(&*self.name).query_async(&mut self.conn()).await?;
        Ok(match u64::try_from(pttl) {
            Ok(ms) => Remaining::Lease(Duration::from_millis(ms)),
            Err(_) if pttl == -1 => Remaining::NoExpiry,
            Err(_) => Remaining::NotLocked,
        })
    }

    /// Deletes the lock whoever holds it; `true` when there was one.
    ///
    /// # Errors
    /// [`Error::Redis`] when Redis fails.
    pub async fn force_release(&self) -> Result<bool> {
        let deleted: i64 =
            redis::cmd("RLOCK.FORCERELEASE").arg(&*self.name).query_async(&mut self.conn()).await?;
        Ok(deleted == 1)
    }
}

/// The renewal task of a guard taken without a lease.
struct Watchdog {
    task: JoinHandle<()>,
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// One hold of a lock. Release it with [`LockGuard::release`]; dropping it releases in the
/// background.
#[must_use = "dropping the guard releases the lock"]
pub struct LockGuard {
    lock: Lock,
    watchdog: Option<Watchdog>,
    lost: watch::Receiver<bool>,
    released: bool,
}

impl fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockGuard")
            .field("lock", &self.lock)
            .field("watchdog", &self.watchdog.is_some())
            .field("lost", &*self.lost.borrow())
            .finish()
    }
}

impl LockGuard {
    fn new(lock: Lock, lease_ms: u64, watchdog: bool) -> Self {
        let (lost_tx, lost) = watch::channel(false);
        let watchdog = watchdog.then(|| Watchdog {
            task: tokio::spawn(renew_until_lost(lock.clone(), lease_ms, lost_tx)),
        });
        Self { lock, watchdog, lost, released: false }
    }

    /// The lock this guard holds.
    #[must_use]
    pub const fn lock(&self) -> &Lock {
        &self.lock
    }

    /// Whether the watchdog found the lock gone (deleted, or taken over after its lease ran
    /// out). Always `false` for a guard with an explicit lease, which has no watchdog.
    #[must_use]
    pub fn is_lost(&self) -> bool {
        *self.lost.borrow()
    }

    /// Resolves when the watchdog finds the lock gone; never, for a guard with an explicit
    /// lease (which has no watchdog).
    pub async fn lost(&self) {
        let mut lost = self.lost.clone();
        if lost.wait_for(|&lost| lost).await.is_err() {
            // The watchdog stopped without finding a loss: nothing will ever be reported.
            std::future::pending::<()>().await;
        }
    }

    /// Releases this hold.
    ///
    /// # Errors
    /// [`Error::NotHeld`] when the lock was no longer held by this owner (its lease ran out, or
    /// it was force-released); [`Error::Redis`] when Redis fails.
    pub async fn release(mut self) -> Result<()> {
        self.released = true;
        self.watchdog = None; // stops renewing first
        self.lock.release_once().await
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        self.watchdog = None;
        let lock = self.lock.clone();
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let _ = lock.release_once().await;
            });
        }
    }
}

/// The watchdog: renews every third of the lease until the lock is found gone (or the guard
/// stops the task). Errors are retried while the lease may still be alive.
async fn renew_until_lost(lock: Lock, lease_ms: u64, lost: watch::Sender<bool>) {
    let lease = Duration::from_millis(lease_ms);
    let period = (lease / 3).max(Duration::from_millis(1));
    let mut renewed_at = Instant::now();
    loop {
        tokio::time::sleep(period).await;
        match lock.renew(lease_ms).await {
            Ok(true) => renewed_at = Instant::now(),
            Ok(false) => break,
            Err(_) if renewed_at.elapsed() < lease => {}
            Err(_) => break,
        }
    }
    let _ = lost.send(true);
}
