//! Where commands go: one server, or a Redis Cluster routed by hash slot.

use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, MultiplexedConnection};
use redis::cluster_async::ClusterConnection;
use redis::{
    AsyncConnectionConfig, Cmd, ConnectionAddr, ConnectionInfo, Pipeline, RedisFuture, Value,
};

use crate::{Error, Result};

/// The shared connection of a client.
#[derive(Clone)]
pub(crate) enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Self::Single(c) => c.req_packed_command(cmd),
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
            Self::Single(c) => c.req_packed_commands(pipeline, offset, count),
            Self::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Single(c) => c.get_db(),
            Self::Cluster(c) => c.get_db(),
        }
    }
}

/// How to reach the server that holds a given lock, for a dedicated connection.
pub(crate) enum Target {
    Single(redis::Client),
    /// The connection settings of a cluster node, whose address is replaced per node.
    Cluster(ConnectionInfo),
}

impl Target {
    pub(crate) const fn is_cluster(&self) -> bool {
        matches!(self, Self::Cluster(_))
    }

    /// A client for the server that serves `key`.
    pub(crate) async fn node_for(&self, key: &[u8], shared: &mut Conn) -> Result<redis::Client> {
        let Self::Cluster(_) = self else { return self.client_at(None) };
        let slot: u16 = redis::cmd("CLUSTER").arg("KEYSLOT").arg(key).query_async(shared).await?;
        let slots: Vec<Value> = redis::cmd("CLUSTER").arg("SLOTS").query_async(shared).await?;
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
            (Self::Cluster(template), Some((host, port))) => Ok(redis::Client::open(
                template.clone().set_addr(ConnectionAddr::Tcp(host.to_owned(), port)),
            )?),
            (Self::Cluster(template), None) => Ok(redis::Client::open(template.clone())?),
        }
    }
}

/// A dedicated connection without a response timeout, for a blocking command.
pub(crate) async fn dedicated(client: &redis::Client) -> Result<MultiplexedConnection> {
    let config = AsyncConnectionConfig::new()
        .set_response_timeout(None)
        .set_connection_timeout(Some(Duration::from_secs(10)));
    Ok(client.get_multiplexed_async_connection_with_config(&config).await?)
}
