//! Where commands go: one server, a master found through Sentinel, or a Redis Cluster routed
//! by hash slot.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route as SlotRoute, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::{
    AsyncConnectionConfig, Cmd, ConnectionAddr, ConnectionInfo, Pipeline, RedisFuture, Value,
};

use crate::error::{Error, Result};

/// The shared connection of a client.
#[derive(Clone)]
pub(crate) enum Conn {
    Single(Arc<Direct>),
    Sentinel(Arc<Sentinel>),
    Cluster(ClusterConnection),
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Self::Single(d) => Box::pin(async move {
                let (generation, mut con) = d.connection().await?;
                let reply = con.req_packed_command(cmd).await;
                if let Err(e) = &reply {
                    d.check(generation, e);
                }
                reply
            }),
            Self::Sentinel(s) => Box::pin(async move {
                let mut con = s.connection().await?;
                let reply = con.req_packed_command(cmd).await;
                s.check_reply(&reply);
                reply
            }),
            Self::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Self::Single(d) => Box::pin(async move {
                let (generation, mut con) = d.connection().await?;
                let reply = con.req_packed_commands(pipeline, offset, count).await;
                if let Err(e) = &reply {
                    d.check(generation, e);
                }
                reply
            }),
            Self::Sentinel(s) => Box::pin(async move {
                let mut con = s.connection().await?;
                let reply = con.req_packed_commands(pipeline, offset, count).await;
                match &reply {
                    Ok(values) => values.iter().for_each(|v| s.check_value(v)),
                    Err(e) => s.check(e),
                }
                reply
            }),
            Self::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Single(d) => d.client.get_connection_info().redis_settings().db(),
            Self::Sentinel(s) => s.template.redis_settings().db(),
            Self::Cluster(c) => c.get_db(),
        }
    }
}

/// The connection to one server, replaced after any error that leaves it in doubt: a broken
/// connection, and also a timeout. A connection that died without a word (a host gone, a cut
/// link: no reset, and a proxy's kernel answers TCP keepalive) only ever times out, and redis-rs's
/// `ConnectionManager` reconnects only after a reset or a close: it would stay dead for good.
pub(crate) struct Direct {
    client: redis::Client,
    config: AsyncConnectionConfig,
    /// The connection in use and its number (a failure forgets only the one it happened on).
    current: Mutex<Option<(u64, MultiplexedConnection)>>,
    made: AtomicU64,
    /// One connect at a time.
    connecting: tokio::sync::Mutex<()>,
}

impl Direct {
    /// Connects to the server of `client` (checked at once: a client that cannot reach its
    /// server fails to open), each command answered within `response_timeout`.
    pub(crate) async fn open(
        client: redis::Client,
        response_timeout: Duration,
    ) -> redis::RedisResult<Self> {
        // A reconnect is bounded like a command (a stalled server accepts the connection and
        // answers nothing): a command that follows a timeout takes at most twice as long.
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(response_timeout.min(Duration::from_secs(1))))
            .set_response_timeout(Some(response_timeout));
        let first = config.clone().set_connection_timeout(Some(Duration::from_secs(2)));
        let con = client.get_multiplexed_async_connection_with_config(&first).await?;
        Ok(Self {
            client,
            config,
            current: Mutex::new(Some((0, con))),
            made: AtomicU64::new(1),
            connecting: tokio::sync::Mutex::new(()),
        })
    }

    fn cached(&self) -> Option<(u64, MultiplexedConnection)> {
        self.current.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    async fn connection(&self) -> redis::RedisResult<(u64, MultiplexedConnection)> {
        if let Some(current) = self.cached() {
            return Ok(current);
        }
        let _turn = self.connecting.lock().await;
        if let Some(current) = self.cached() {
            return Ok(current);
        }
        let con = self.client.get_multiplexed_async_connection_with_config(&self.config).await?;
        let made = (self.made.fetch_add(1, Ordering::Relaxed), con);
        *self.current.lock().unwrap_or_else(PoisonError::into_inner) = Some(made.clone());
        Ok(made)
    }

    /// Forgets connection `generation` after an error that leaves it in doubt.
    fn check(&self, generation: u64, e: &redis::RedisError) {
        if crate::error::redis_uncertain(e) {
            let mut current = self.current.lock().unwrap_or_else(PoisonError::into_inner);
            if current.as_ref().is_some_and(|(g, _)| *g == generation) {
                *current = None;
            }
        }
    }
}

/// How long [`Sentinel::refresh_capped`] may ask the Sentinels (unreachable or silent ones
/// delay a release no longer than this; the cached master is kept then, and the next command
/// that asks asks again).
const REFRESH_MAX: Duration = Duration::from_millis(500);

/// Whether `code` is an error code from a server that is no longer (or not yet) the master to
/// use.
fn master_changed(code: &str) -> bool {
    matches!(code, "READONLY" | "NOREPLICAS" | "MASTERDOWN" | "LOADING")
}

/// Whether the server refused a command because it is not (or no longer, or not yet) the
/// master: nothing ran.
pub(crate) fn not_master(e: &redis::RedisError) -> bool {
    e.code().is_some_and(master_changed)
}

/// The master of a Sentinel-monitored group: found by asking the Sentinels, checked with
/// `ROLE`, and found again after any error that suggests it is no longer the master (a broken
/// connection, a timeout, `READONLY` from a demoted master, `NOREPLICAS` from one that lost its
/// replicas): commands never keep going to an old address.
pub(crate) struct Sentinel {
    sentinels: Vec<ConnectionInfo>,
    master: String,
    /// Settings for master connections (database, credentials); the address is replaced.
    template: ConnectionInfo,
    response_timeout: Duration,
    /// The current master and a connection to it.
    current: Mutex<Option<(redis::Client, MultiplexedConnection)>>,
    /// One resolution at a time.
    resolving: tokio::sync::Mutex<()>,
}

impl Sentinel {
    pub(crate) fn new(
        sentinels: Vec<ConnectionInfo>,
        master: String,
        template: ConnectionInfo,
        response_timeout: Duration,
    ) -> Self {
        Self {
            sentinels,
            master,
            template,
            response_timeout,
            current: Mutex::new(None),
            resolving: tokio::sync::Mutex::new(()),
        }
    }

    fn cached(&self) -> Option<(redis::Client, MultiplexedConnection)> {
        self.current.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Forgets the master after an error that suggests it changed: a failed connection, or a
    /// refusal only a master that is no longer the master gives.
    fn check(&self, e: &redis::RedisError) {
        let moved_on = e.is_io_error()
            || e.is_timeout()
            || e.is_connection_dropped()
            || e.is_connection_refusal()
            || e.code().is_some_and(master_changed);
        if moved_on {
            self.forget();
        }
    }

    /// As [`Self::check`], for a reply (redis-rs returns server errors as values).
    pub(crate) fn check_reply(&self, reply: &redis::RedisResult<Value>) {
        match reply {
            Ok(value) => self.check_value(value),
            Err(e) => self.check(e),
        }
    }

    fn check_value(&self, value: &Value) {
        if let Value::ServerError(e) = value {
            if master_changed(e.code()) {
                self.forget();
            }
        }
    }

    pub(crate) fn forget(&self) {
        *self.current.lock().unwrap_or_else(PoisonError::into_inner) = None;
    }

    /// The client of the current master, if known.
    pub(crate) fn current_client(&self) -> Option<redis::Client> {
        self.cached().map(|(client, _)| client)
    }

    /// The master the Sentinels name now, asked afresh rather than taken from the cache (which
    /// is only forgotten after an error on the shared connection, so it may still name a master
    /// that was killed or replaced): for a session, which binds to one master for its life.
    /// A different answer replaces the cached master. When no Sentinel answers, the cached
    /// master (if any) is used, as every other command does then: the Sentinels being
    /// unreachable stops no session while the master they last named serves.
    pub(crate) async fn fresh_master(&self) -> redis::RedisResult<redis::Client> {
        let _turn = self.resolving.lock().await;
        let (client, con) = match self.resolve().await {
            Ok(found) => found,
            Err(e) => return self.current_client().ok_or(e),
        };
        let mut current = self.current.lock().unwrap_or_else(PoisonError::into_inner);
        let same = current.as_ref().is_some_and(|(cached, _)| {
            cached.get_connection_info().addr() == client.get_connection_info().addr()
        });
        if !same {
            *current = Some((client.clone(), con));
        }
        Ok(client)
    }

    /// Asks the Sentinels which master they name now and forgets the cached one if it is
    /// another (the next command then connects to the new one). An old master keeps answering
    /// as a master until the Sentinels demote it (seconds after a failover), so a command that
    /// must reach the current master, and gets no error to tell it otherwise (a release, a
    /// cancellation), asks first. When no Sentinel answers the cache is kept.
    pub(crate) async fn refresh(&self) {
        let Some(cached) = self.current_client() else { return };
        for sentinel in &self.sentinels {
            if let Ok(addr) = self.ask_address(sentinel).await {
                if *cached.get_connection_info().addr() != addr {
                    self.forget();
                }
                return;
            }
        }
    }

    /// [`Self::refresh`], given at most [`REFRESH_MAX`]: a Sentinel that accepts connections
    /// and answers nothing (a stalled process, a silent network) costs a command this long, not
    /// its connection's timeouts per Sentinel. `false` when it was cut short (the cached master
    /// is kept; the next command that must reach the current master asks again).
    pub(crate) async fn refresh_capped(&self) -> bool {
        tokio::time::timeout(REFRESH_MAX, self.refresh()).await.is_ok()
    }

    /// A connection to the current master, asking the Sentinels when none is known.
    pub(crate) async fn connection(&self) -> redis::RedisResult<MultiplexedConnection> {
        Ok(self.master().await?.1)
    }

    /// The current master's client and a connection to it.
    pub(crate) async fn master(
        &self,
    ) -> redis::RedisResult<(redis::Client, MultiplexedConnection)> {
        if let Some(current) = self.cached() {
            return Ok(current);
        }
        let _turn = self.resolving.lock().await;
        if let Some(current) = self.cached() {
            return Ok(current);
        }
        let found = self.resolve().await?;
        *self.current.lock().unwrap_or_else(PoisonError::into_inner) = Some(found.clone());
        Ok(found)
    }

    /// Asks the Sentinels in turn for the master (the caller holds `resolving`).
    async fn resolve(&self) -> redis::RedisResult<(redis::Client, MultiplexedConnection)> {
        let mut last_error = None;
        for sentinel in &self.sentinels {
            match self.ask(sentinel).await {
                Ok(found) => return Ok(found),
                Err(e) => last_error = Some(e),
            }
        }
        Err(last_error.unwrap_or_else(|| {
            redis::RedisError::from((redis::ErrorKind::InvalidClientConfig, "no Sentinel given"))
        }))
    }

    /// Asks one Sentinel for the master's address.
    async fn ask_address(&self, sentinel: &ConnectionInfo) -> redis::RedisResult<ConnectionAddr> {
        let quick = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(Duration::from_secs(1)))
            .set_response_timeout(Some(Duration::from_secs(1)));
        let mut asking = redis::Client::open(sentinel.clone())?
            .get_multiplexed_async_connection_with_config(&quick)
            .await?;
        let (host, port): (String, u16) = redis::cmd("SENTINEL")
            .arg("GET-MASTER-ADDR-BY-NAME")
            .arg(&self.master)
            .query_async(&mut asking)
            .await?;
        Ok(ConnectionAddr::Tcp(host, port))
    }

    /// Asks one Sentinel for the master, connects, and checks that it says it is the master.
    async fn ask(
        &self,
        sentinel: &ConnectionInfo,
    ) -> redis::RedisResult<(redis::Client, MultiplexedConnection)> {
        let addr = self.ask_address(sentinel).await?;
        let at = addr.to_string();
        let client = redis::Client::open(self.template.clone().set_addr(addr))?;
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(Duration::from_secs(1)))
            .set_response_timeout(Some(self.response_timeout));
        let mut con = client.get_multiplexed_async_connection_with_config(&config).await?;
        let role: Vec<Value> = redis::cmd("ROLE").query_async(&mut con).await?;
        match role.first() {
            Some(Value::BulkString(r)) if r.as_slice() == b"master" => Ok((client, con)),
            _ => Err(redis::RedisError::from((
                redis::ErrorKind::Server(redis::ServerErrorKind::ReadOnly),
                "the address Sentinel gave is not a master (yet)",
                at,
            ))),
        }
    }
}

/// How to reach the server that holds a given lock, for a dedicated connection.
pub(crate) enum Target {
    Single(redis::Client),
    /// Whichever server the Sentinels name as the master now.
    Sentinel(Arc<Sentinel>),
    /// The connection settings of a cluster node, whose address is replaced per node.
    Cluster(ConnectionInfo),
}

impl Target {
    /// For a Sentinel group, asks the Sentinels (at most [`REFRESH_MAX`]) whether the cached
    /// master is still theirs, and forgets it if not ([`Sentinel::refresh`]); nothing for
    /// other targets. Before a command that must reach the current master and that an old
    /// master would answer without an error (a release).
    pub(crate) async fn refresh(&self) {
        if let Self::Sentinel(sentinel) = self {
            sentinel.refresh_capped().await;
        }
    }

    pub(crate) const fn is_sentinel(&self) -> bool {
        matches!(self, Self::Sentinel(_))
    }

    pub(crate) const fn is_cluster(&self) -> bool {
        matches!(self, Self::Cluster(_))
    }

    /// A client for the server that serves `key`.
    pub(crate) async fn node_for(&self, key: &[u8], shared: &mut Conn) -> Result<redis::Client> {
        if let Self::Sentinel(sentinel) = self {
            return Ok(sentinel.master().await?.0);
        }
        let Self::Cluster(_) = self else { return self.client_at(None) };
        // Both asked of the key's own node (routed by its slot, computed here): a keyless
        // command would go to any node, a stopped one included, and fail the wait.
        let Conn::Cluster(cluster) = shared else { return self.client_at(None) };
        let ask = |args: &[&[u8]]| {
            let mut cluster = cluster.clone();
            let node = SlotRoute::with_key(key, SlotAddr::Master);
            let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(node));
            let mut cmd = redis::cmd("CLUSTER");
            cmd.arg(args);
            async move { cluster.route_command(cmd, routing).await }
        };
        let parse = |e: redis::ParsingError| Error::Redis(e.into());
        let slot: u16 = redis::from_redis_value(ask(&[b"KEYSLOT", key]).await?).map_err(parse)?;
        let slots: Vec<Value> = redis::from_redis_value(ask(&[b"SLOTS"]).await?).map_err(parse)?;
        fn get<T: redis::FromRedisValue>(v: Option<&Value>) -> Option<T> {
            redis::from_redis_value(v?.clone()).ok()
        }
        for row in slots {
            let Value::Array(parts) = row else { continue };
            let (Some(start), Some(end), Some(Value::Array(master))) =
                (get::<u16>(parts.first()), get::<u16>(parts.get(1)), parts.get(2))
            else {
                continue;
            };
            if (start..=end).contains(&slot) {
                if let (Some(host), Some(port)) =
                    (get::<String>(master.first()), get::<u16>(master.get(1)))
                {
                    return self.client_at(Some((&host, port)));
                }
            }
        }
        Err(Error::Redis(redis::RedisError::from((
            redis::ErrorKind::Server(redis::ServerErrorKind::ClusterDown),
            "no node serves the lock's slot",
        ))))
    }

    /// A client for the node at `host:port` (cluster), or the server (single).
    pub(crate) fn client_at(&self, address: Option<(&str, u16)>) -> Result<redis::Client> {
        match (self, address) {
            (Self::Single(client), _) => Ok(client.clone()),
            (Self::Sentinel(sentinel), _) => sentinel.current_client().ok_or_else(|| {
                Error::Redis(redis::RedisError::from((
                    redis::ErrorKind::Io,
                    "no master known: the Sentinels have not been asked yet",
                )))
            }),
            (Self::Cluster(template), Some((host, port))) => Ok(redis::Client::open(
                template.clone().set_addr(ConnectionAddr::Tcp(host.to_owned(), port)),
            )?),
            (Self::Cluster(template), None) => Ok(redis::Client::open(template.clone())?),
        }
    }
}

/// A dedicated connection for a blocking command, with the given response timeout (`None`:
/// none, for a wait without limit).
pub(crate) async fn dedicated(
    client: &redis::Client,
    response_timeout: Option<Duration>,
) -> Result<MultiplexedConnection> {
    let config = AsyncConnectionConfig::new()
        .set_response_timeout(response_timeout)
        .set_connection_timeout(Some(Duration::from_secs(10)));
    Ok(client.get_multiplexed_async_connection_with_config(&config).await?)
}
