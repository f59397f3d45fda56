//! [`LockClient`]: a connection to one server, a Sentinel group or a cluster, handing out locks.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use redis::{IntoConnectionInfo, RedisError};

use crate::conn::{Conn, Target};
use crate::error::{Error, Result};
use crate::latch::Latch;
use crate::leased::LeasedSemaphore;
use crate::lock::Lock;
use crate::options::Options;
use crate::owner::Owner;
use crate::releaser::{Releaser, Route};
use crate::rwlock::RwLock;
use crate::semaphore::Semaphore;
use crate::session::{Session, SessionOptions};
use crate::shared::Shared;

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
    /// [`Error::ZeroLease`] for a zero [`Options::watchdog_timeout`], [`Error::InvalidArgument`]
    /// for a watchdog, replica or AOF timeout beyond [`crate::MAX_DURATION`] (both before
    /// connecting, as for [`LockClient::cluster`] and [`LockClient::sentinel`]); an error when
    /// the server cannot be reached.
    pub async fn with_options(client: redis::Client, options: Options) -> Result<Self> {
        options.check()?;
        // The shared connection also runs `WAIT` for replica acknowledgements: give it room.
        let timeout = options.response_timeout().unwrap_or(Duration::from_millis(500));
        let direct = crate::conn::Direct::open(client.clone(), timeout).await?;
        let mut conn = Conn::Single(Arc::new(direct));
        check_module(&mut conn).await?;
        let route = Route::Single(client.clone());
        Ok(Self::from_parts(Target::Single(client), conn, options, route))
    }

    /// Connects to a Redis Cluster (every node with the module) through `nodes` (one or more of
    /// its nodes), with the given options. Commands route by the lock's hash slot; a
    /// server-side wait runs on a connection to the node serving the lock, following MOVED and
    /// ASK when the slot moves.
    ///
    /// # Errors
    /// When the addresses are invalid or the cluster cannot be reached.
    pub async fn cluster<T: IntoConnectionInfo>(nodes: Vec<T>, options: Options) -> Result<Self> {
        options.check()?;
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
        let route = Route::Cluster(crate::releaser::cluster_client(infos.clone())?);
        let mut builder = redis::cluster::ClusterClient::builder(infos);
        if let Some(timeout) = options.response_timeout() {
            builder = builder.response_timeout(timeout);
        }
        let mut conn = Conn::Cluster(builder.build()?.get_async_connection().await?);
        check_module(&mut conn).await?;
        Ok(Self::from_parts(Target::Cluster(template), conn, options, route))
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
        options.check()?;
        let sentinels = sentinels
            .into_iter()
            .map(IntoConnectionInfo::into_connection_info)
            .collect::<redis::RedisResult<Vec<_>>>()?;
        let response_timeout = options.response_timeout().unwrap_or(Duration::from_millis(500));
        let template = master.into_connection_info()?;
        // The releaser asks the Sentinels on its own.
        let route = Route::Sentinel(crate::releaser::sentinel(
            sentinels.clone(),
            master_name.to_owned(),
            template.clone(),
        ));
        let sentinel = Arc::new(crate::conn::Sentinel::new(
            sentinels,
            master_name.to_owned(),
            template,
            response_timeout,
        ));
        let mut conn = Conn::Sentinel(Arc::clone(&sentinel));
        check_module(&mut conn).await?;
        Ok(Self::from_parts(Target::Sentinel(sentinel), conn, options, route))
    }

    fn from_parts(target: Target, conn: Conn, options: Options, route: Route) -> Self {
        Self {
            shared: Arc::new(Shared {
                target,
                conn,
                id: uuid::Uuid::new_v4().to_string(),
                next_handle: AtomicU64::new(1),
                options,
                releaser: Releaser::new(route),
            }),
        }
    }

    /// This client's process-unique id (a UUID v4), the prefix of its owner ids.
    #[must_use]
    pub fn id(&self) -> &str {
        &self.shared.id
    }

    /// A handle on the lock `name`, with a new owner id (each hold under an id of its own, so
    /// the server never sees its waits as part of a deadlock: see [`LockClient::owner`]).
    /// Re-entry is per handle.
    #[must_use]
    pub fn lock(&self, name: impl AsRef<[u8]>) -> Lock {
        let n = self.shared.next_handle.fetch_add(1, Ordering::Relaxed);
        self.lock_as(name, format!("{}:{n}", self.shared.id))
    }

    /// A read-write lock named `name` (Redisson's `RReadWriteLock`): [`RwLock::read`] and
    /// [`RwLock::write`] handles with the whole [`Lock`] API.
    pub fn rw_lock(&self, name: impl AsRef<[u8]>) -> RwLock {
        let n = self.shared.next_handle.fetch_add(1, Ordering::Relaxed);
        let owner = format!("{}:{n}", self.shared.id);
        let (read, write) =
            Lock::rw_pair(&self.shared, &name.as_ref().into(), (&owner, false), None);
        RwLock::new(read, write)
    }

    /// A new [`Owner`]: one owner id for one unit of work (a task, a request handler), under
    /// which every lock it takes is held, so the server refuses a wait that would close a
    /// cycle with [`Error::Deadlock`] (see [`Owner`] for what sharing one id means).
    #[must_use]
    pub fn owner(&self) -> Owner {
        Owner::new(&self.shared, None)
    }

    /// A counting semaphore named `name` (Redisson's `RSemaphore`).
    #[must_use]
    pub fn semaphore(&self, name: impl AsRef<[u8]>) -> Semaphore {
        Semaphore::new(Arc::clone(&self.shared), name.as_ref().into())
    }

    /// A semaphore named `name` whose permits are leased (Redisson's
    /// `RPermitExpirableSemaphore`): guards hold permit ids, renewed by the watchdog when no
    /// lease is given.
    #[must_use]
    pub fn leased_semaphore(&self, name: impl AsRef<[u8]>) -> LeasedSemaphore {
        LeasedSemaphore::new(self.semaphore(name), self.shared.options.watchdog_timeout, None)
    }

    /// A count-down latch named `name` (Redisson's `RCountDownLatch`). A latch has no holder,
    /// so it is made only here, not from an [`Owner`] or a [`Session`].
    #[must_use]
    pub fn latch(&self, name: impl AsRef<[u8]>) -> Latch {
        Latch::new(Arc::clone(&self.shared), name.as_ref().into())
    }

    /// Opens a [`Session`] with default [`SessionOptions`]: one connection of its own to the
    /// server (a Sentinel group's current master), whose locks are session holds.
    ///
    /// # Errors
    /// [`Error::SessionUnsupported`] on a cluster client; [`Error::Redis`] when the server
    /// cannot be reached.
    pub async fn session(&self) -> Result<Session> {
        self.session_with(SessionOptions::default()).await
    }

    /// Opens a [`Session`] with the given options.
    ///
    /// # Errors
    /// As [`LockClient::session`]; [`Error::InvalidArgument`] for a `lock_delay` above 60 s or a
    /// zero `keepalive` (nothing is opened).
    pub async fn session_with(&self, options: SessionOptions) -> Result<Session> {
        Session::open(&self.shared, &options).await
    }

    /// A handle with a given owner id (the same owner on several servers, for RedLock).
    pub(crate) fn lock_as(&self, name: impl AsRef<[u8]>, owner: String) -> Lock {
        Lock::new(&self.shared, &name.as_ref().into(), (owner.into(), false), None)
    }
}

/// Fails with [`Error::NoModule`] unless the server knows `RLOCK.ACQUIRE`: asked with
/// `COMMAND INFO`, or, for a user that may not run it (`NOPERM`), by sending `RLOCK.ACQUIRE`
/// without arguments. The server checks a command's arity before the user's permissions, so a
/// server with the module refuses it for its arity (changing nothing), and one without it as an
/// unknown command.
async fn check_module(conn: &mut Conn) -> Result<()> {
    let info: redis::RedisResult<Vec<redis::Value>> =
        redis::cmd("COMMAND").arg("INFO").arg("rlock.acquire").query_async(conn).await;
    match info {
        Ok(info) => match info.first() {
            Some(redis::Value::Array(_)) => Ok(()),
            _ => Err(Error::NoModule),
        },
        Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoPerm) => {
            let probe: redis::RedisResult<redis::Value> =
                redis::cmd("RLOCK.ACQUIRE").query_async(conn).await;
            match probe.map_err(Error::from) {
                Err(Error::Redis(e)) if !crate::error::from_server(&e) => Err(Error::Redis(e)),
                Err(Error::NoModule) => Err(Error::NoModule),
                // The arity refusal (or a NOPERM): the command exists.
                Ok(_) | Err(_) => Ok(()),
            }
        }
        Err(e) => Err(e.into()),
    }
}
