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
//! - **Owners.** Each [`Lock`] handle has its own id, `<client-uuid>:<n>`: re-entry is per
//!   handle (clones share it), not per thread, since async tasks move between threads. Each
//!   continuous hold is stored under `<client-uuid>:<n>:<hold>` ([`LockGuard::owner`]).
//! - **Watchdog.** With no lease, the lock is taken with [`Options::watchdog_timeout`] (30 s) and
//!   renewed every third of it until released. A renewal that finds the lock gone marks the
//!   guard lost: see [`LockGuard::is_lost`] and [`LockGuard::lost`].
//! - **Waiting** is server-side: `RLOCK.ACQUIRE ... WAIT` on a dedicated connection; the server
//!   queues waiters FIFO and hands the lock to one of them when it is free. No pub/sub, no retry
//!   loop. Dropping an acquire future cancels the wait without leaking the lock: a grant that
//!   races the cancellation is released.
//! - **Replica acknowledgement** ([`Options::replica_ack`]): a lock is reported acquired only
//!   once that many replicas have its grant (Redis `WAIT`); otherwise it is released again.
//! - **Deadlines**: a guard's hold is valid until [`LockGuard::valid_until`] on this process's
//!   monotonic clock (grant asked + lease, pushed only by confirmed renewals); when it passes
//!   without a confirmation, the guard is lost ([`LockGuard::is_lost`], [`LockGuard::lost`]).
//! - **Sentinel** ([`LockClient::sentinel`]): the master is asked of the Sentinels and asked
//!   again after an error that suggests it changed, never retried at its old address.
//! - **Durable acknowledgement** ([`Options::aof_ack`]): `WAITAOF` after each grant.
//! - **Several servers**: [`MultiLock`] takes the same lock on every one of several independent
//!   servers, [`RedLock`] on a majority of them.
//! - **Holds are tied to their grant.** A handle's re-entries share one server hold (a
//!   *chain*) with an owner id of its own: a guard that outlived its grant never releases or
//!   renews a later hold, and an acquire that did not return a guard (cancelled, timed out,
//!   failed) leaves nothing held.
//! - **Dropping a guard** releases the lock at once, with a blocking round trip on a connection
//!   of its own (at most about a second), so it works at the end of `main`, outside any runtime
//!   and while a runtime shuts down.

mod conn;
mod guard;
mod lock;
mod multi;
mod wait;

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use redis::{IntoConnectionInfo, RedisError};

use conn::{Conn, Target};

pub use lock::{Lock, LockGuard};
pub use multi::{MultiGuard, MultiLock, RedLock};

/// Errors of lock operations.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// The lock was not held by this owner (released by someone else, or its lease ran out).
    NotHeld,
    /// The wait budget ran out before the lock could be taken.
    TimedOut,
    /// The lock was taken, but fewer replicas than [`Options::replica_ack`] asks for
    /// acknowledged it in time; it was released again.
    NotReplicated {
        /// Replicas asked for.
        wanted: u32,
        /// Replicas that acknowledged.
        acknowledged: u32,
    },
    /// The lock was taken, but its grant was not written to the AOF (fsynced) of the master
    /// and/or of as many replicas as [`Options::aof_ack`] asks for in time; it was released
    /// again.
    NotPersisted {
        /// Whether the master's own fsync was asked for, and whether it happened.
        local: (bool, bool),
        /// Replicas asked for, and replicas that fsynced the grant.
        replicas: (u32, u32),
    },
    /// The server does not have the rlock module loaded (checked when the client opens).
    NoModule,
    /// Redis (or the connection to it) failed.
    Redis(RedisError),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NotHeld => f.write_str("the lock is not held by this owner"),
            Self::TimedOut => f.write_str("timed out waiting for the lock"),
            Self::NotReplicated { wanted, acknowledged } => write!(
                f,
                "the lock reached {acknowledged} replica(s) of the {wanted} required; released"
            ),
            Self::NotPersisted { local, replicas } => write!(
                f,
                "the lock's grant was fsynced to the AOF of {} replica(s) of the {} required{}; released",
                replicas.1,
                replicas.0,
                match local {
                    (true, false) => " and not on the master",
                    _ => "",
                }
            ),
            Self::NoModule => f.write_str("the server does not have the rlock module loaded"),
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
    /// Replicas that must acknowledge a grant before it is reported acquired, and how long to
    /// wait for them. Default: none.
    pub replica_ack: Option<(u32, Duration)>,
    /// Ask for a fencing token with every grant ([`LockGuard::token`]). Default: off (each lock
    /// name then keeps a counter key, `redisson_lock_token:{name}`, for good).
    pub fencing: bool,
    /// AOF fsyncs that must cover a grant before it is reported acquired (`WAITAOF`, Redis
    /// 7.2+ and Valkey 8+). Default: none.
    pub aof_ack: Option<AofAck>,
}

/// What [`Options::aof_ack`] requires of a grant: `WAITAOF numlocal numreplicas timeout`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct AofAck {
    /// The master's own AOF must have fsynced it (needs `appendonly yes` on the master).
    pub local: bool,
    /// How many replicas must have fsynced it to their AOF.
    pub replicas: u32,
    /// How long to wait for the fsyncs.
    pub timeout: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            watchdog_timeout: Duration::from_secs(30),
            replica_ack: None,
            fencing: false,
            aof_ack: None,
        }
    }
}

impl Options {
    /// Sets [`Options::watchdog_timeout`].
    #[must_use]
    pub const fn watchdog_timeout(mut self, timeout: Duration) -> Self {
        self.watchdog_timeout = timeout;
        self
    }

    /// Asks for a fencing token with every grant (see [`LockGuard::token`]).
    #[must_use]
    pub const fn fencing(mut self, on: bool) -> Self {
        self.fencing = on;
        self
    }

    /// Requires `replicas` replicas to acknowledge each grant within `timeout` (Redis
    /// `WAIT replicas timeout` after acquiring); when fewer do, the lock is released and the
    /// acquire fails with [`Error::NotReplicated`].
    #[must_use]
    pub const fn replica_ack(mut self, replicas: u32, timeout: Duration) -> Self {
        self.replica_ack = Some((replicas, timeout));
        self
    }

    /// Requires each grant to be fsynced to the master's AOF (`local`) and to the AOF of
    /// `replicas` replicas within `timeout` (Redis `WAITAOF`, after acquiring and after
    /// [`Options::replica_ack`] if set); when it is not, the lock is released and the acquire
    /// fails with [`Error::NotPersisted`]. On a server without `WAITAOF` (Redis before 7.2)
    /// every acquire fails with that server's error, and nothing stays held.
    #[must_use]
    pub const fn aof_ack(mut self, local: bool, replicas: u32, timeout: Duration) -> Self {
        self.aof_ack = Some(AofAck { local, replicas, timeout });
        self
    }

    /// How long a command on the shared connection may take: room for `WAIT` and `WAITAOF`.
    fn response_timeout(&self) -> Option<Duration> {
        let wait = self.replica_ack.map(|(_, t)| t);
        let fsync = self.aof_ack.map(|a| a.timeout);
        match (wait, fsync) {
            (None, None) => None,
            (w, f) => Some(w.unwrap_or_default() + f.unwrap_or_default() + Duration::from_secs(1)),
        }
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
    target: Target,
    conn: Conn,
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
    /// When the URL is invalid or the server cannot be reached; [`Error::NoModule`] when the
    /// server has no rlock module.
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
        // The shared connection also runs `WAIT` for replica acknowledgements: give it room.
        let mut config = redis::aio::ConnectionManagerConfig::new();
        if let Some(timeout) = options.response_timeout() {
            config = config.set_response_timeout(Some(timeout));
        }
        let mut conn = Conn::Single(client.get_connection_manager_with_config(config).await?);
        check_module(&mut conn).await?;
        Ok(Self::from_parts(Target::Single(client), conn, options))
    }

    /// Connects to a Redis Cluster (every node with the module) through `nodes` (one or more of
    /// its nodes), with the given options. Commands route by the lock's hash slot; a
    /// server-side wait runs on a connection to the node serving the lock, following MOVED and
    /// ASK when the slot moves.
    ///
    /// # Errors
    /// When the addresses are invalid or the cluster cannot be reached.
    pub async fn cluster<T: IntoConnectionInfo>(nodes: Vec<T>, options: Options) -> Result<Self> {
        let infos = nodes
            .into_iter()
            .map(IntoConnectionInfo::into_connection_info)
            .collect::<redis::RedisResult<Vec<_>>>()?;
        let Some(template) = infos.first().cloned() else {
            return Err(Error::Redis(RedisError::from((
                redis::ErrorKind::InvalidClientConfig,
                "a cluster needs at least one node address",
            ))));
        };
        let mut builder = redis::cluster::ClusterClient::builder(infos);
        if let Some(timeout) = options.response_timeout() {
            builder = builder.response_timeout(timeout);
        }
        let mut conn = Conn::Cluster(builder.build()?.get_async_connection().await?);
        check_module(&mut conn).await?;
        Ok(Self::from_parts(Target::Cluster(template), conn, options))
    }

    /// Connects to the master that the Sentinels at `sentinels` name for `master_name` (as
    /// configured with `sentinel monitor <master_name> ...`), with the given options.
    /// `master` holds the settings of master connections (database, user, password); its
    /// address is ignored.
    ///
    /// The master's address is asked of the Sentinels (in the order given) and checked with
    /// `ROLE`. After a connection error, a timeout, or a `READONLY` / `NOREPLICAS` reply (a
    /// demoted master, or one that lost its replicas and grants nothing), the next command asks
    /// the Sentinels again instead of retrying the old address. Waits, releases and renewals
    /// all go to the master known at the time.
    ///
    /// ```no_run
    /// # async fn example() -> Result<(), rlock_client::Error> {
    /// use rlock_client::{LockClient, Options};
    /// let client = LockClient::sentinel(
    ///     vec!["redis://127.0.0.1:26379/", "redis://127.0.0.1:26380/"],
    ///     "mymaster",
    ///     "redis://127.0.0.1/",
    ///     Options::default(),
    /// )
    /// .await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// When the addresses are invalid or no Sentinel names a reachable master;
    /// [`Error::NoModule`] when the master has no rlock module.
    pub async fn sentinel<T: IntoConnectionInfo, M: IntoConnectionInfo>(
        sentinels: Vec<T>,
        master_name: &str,
        master: M,
        options: Options,
    ) -> Result<Self> {
        let sentinels = sentinels
            .into_iter()
            .map(IntoConnectionInfo::into_connection_info)
            .collect::<redis::RedisResult<Vec<_>>>()?;
        let response_timeout = options.response_timeout().unwrap_or(Duration::from_millis(500));
        let sentinel = Arc::new(conn::Sentinel::new(
            sentinels,
            master_name.to_owned(),
            master.into_connection_info()?,
            response_timeout,
        ));
        let mut conn = Conn::Sentinel(Arc::clone(&sentinel));
        check_module(&mut conn).await?;
        Ok(Self::from_parts(Target::Sentinel(sentinel), conn, options))
    }

    fn from_parts(target: Target, conn: Conn, options: Options) -> Self {
        Self {
            shared: Arc::new(Shared {
                target,
                conn,
                id: uuid::Uuid::new_v4().to_string(),
                next_handle: AtomicU64::new(1),
                options,
            }),
        }
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
        self.lock_as(name, format!("{}:{n}", self.shared.id))
    }

    /// A handle with a given owner id (the same owner on several servers, for RedLock).
    pub(crate) fn lock_as(&self, name: impl AsRef<[u8]>, owner: String) -> Lock {
        Lock::new(Arc::clone(&self.shared), name.as_ref().into(), owner.into())
    }
}

/// Fails with [`Error::NoModule`] unless the server knows `RLOCK.ACQUIRE`.
async fn check_module(conn: &mut Conn) -> Result<()> {
    let info: Vec<redis::Value> =
        redis::cmd("COMMAND").arg("INFO").arg("rlock.acquire").query_async(conn).await?;
    match info.first() {
        Some(redis::Value::Array(_)) => Ok(()),
        _ => Err(Error::NoModule),
    }
}

/// A server-side wait's `WAIT` budget: what is left until `deadline` (0: no deadline, wait
/// without limit).
///
/// # Errors
/// [`Error::TimedOut`] when the deadline has passed.
fn wait_budget(deadline: Option<tokio::time::Instant>) -> Result<u64> {
    match deadline {
        None => Ok(0),
        Some(deadline) => match deadline.checked_duration_since(tokio::time::Instant::now()) {
            Some(left) if !left.is_zero() => Ok(millis(left)),
            _ => Err(Error::TimedOut),
        },
    }
}

/// Milliseconds of a duration, at least 1.
fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}
