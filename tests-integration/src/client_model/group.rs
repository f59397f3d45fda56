//! A Sentinel group as one of the model's servers: a master, its replica and a Sentinel, and a
//! manual failover (`SENTINEL FAILOVER`) that the run waits out without blocking its runtime
//! (the client's watchdogs and waits keep running through it).

use std::sync::Arc;
use std::time::Duration;

use redis::Connection;
use tokio::time::{sleep, Instant};

use crate::{is_master, wait_link_up, Sentinel, Server, SENTINEL_MASTER};

/// How long one failover may take, from the first `SENTINEL FAILOVER` to a master the
/// Sentinel names and that answers as one.
pub const FAILOVER_LIMIT: Duration = Duration::from_secs(60);

/// A master and its replica watched by one Sentinel (which never fails over on its own:
/// `down-after-milliseconds` is far beyond any stall of the run).
pub struct Group {
    pub nodes: [Arc<Server>; 2],
    pub sentinel: Sentinel,
    /// Index in `nodes` of the master the Sentinel names now.
    pub master: usize,
    /// Failovers done.
    pub failovers: usize,
}

/// `RLOCK_CLIENT_MODEL_FAILOVERS`, else `default`.
#[must_use]
pub fn model_failovers(default: usize) -> usize {
    std::env::var("RLOCK_CLIENT_MODEL_FAILOVERS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

impl Group {
    /// Starts the master, its replica (in sync) and the Sentinel.
    ///
    /// # Panics
    /// When a server or the Sentinel does not start, or the replica never links up.
    #[must_use]
    pub fn start() -> Self {
        let master = Server::start();
        let replica = Server::builder().replica_of(&master).start();
        wait_link_up(&mut replica.conn());
        let sentinel = Sentinel::start(&master, 1, 60_000);
        Self { nodes: [Arc::new(master), Arc::new(replica)], sentinel, master: 0, failovers: 0 }
    }

    /// The master the Sentinel names now.
    #[must_use]
    pub fn master(&self) -> Arc<Server> {
        Arc::clone(&self.nodes[self.master])
    }

    /// The Sentinel's URL (for a client).
    #[must_use]
    pub fn sentinel_url(&self) -> String {
        self.sentinel.url()
    }

    /// Fails the master over to its replica: makes every write acknowledged so far reach the
    /// replica (a fence written on `master_con` and `WAIT`, so the run's own writes are not
    /// what a failover undoes), asks the Sentinel until it accepts (it refuses while it does
    /// not yet count the replica as a good one), and returns once the Sentinel names the
    /// replica and it answers as a master. The old master is demoted by the Sentinel on its
    /// own time (the run does not wait for it: clients still talking to it is part of what is
    /// tested).
    ///
    /// # Panics
    /// When the failover does not complete within [`FAILOVER_LIMIT`].
    pub async fn failover(&mut self, master_con: &mut Connection) -> Duration {
        let start = Instant::now();
        let next = 1 - self.master;
        let (old, new) = (Arc::clone(&self.nodes[self.master]), Arc::clone(&self.nodes[next]));
        while !tokio::task::block_in_place(|| self.replica_in_sync()) {
            assert!(start.elapsed() < FAILOVER_LIMIT, "the replica never came in sync");
            sleep(Duration::from_millis(50)).await;
        }
        let fenced = tokio::task::block_in_place(|| {
            let _: () = redis::cmd("SET")
                .arg("cm:fence")
                .arg(self.failovers)
                .query(master_con)
                .expect("SET fence");
            redis::cmd("WAIT").arg(1).arg(5000).query::<i64>(master_con).expect("WAIT")
        });
        assert_eq!(fenced, 1, "the replica acknowledged the writes before the failover");
        let url = self.sentinel.url();
        let new_port = new.port();
        loop {
            let accepted = tokio::task::block_in_place(|| {
                let mut s = redis::Client::open(url.as_str()).ok()?.get_connection().ok()?;
                redis::cmd("SENTINEL").arg("FAILOVER").arg(SENTINEL_MASTER).query::<()>(&mut s).ok()
            });
            if accepted.is_some() {
                break;
            }
            assert!(start.elapsed() < FAILOVER_LIMIT, "the Sentinel never accepted a failover");
            sleep(Duration::from_millis(100)).await;
        }
        loop {
            let done = tokio::task::block_in_place(|| {
                self.sentinel.master_port() == new_port && is_master(&new)
            });
            if done {
                break;
            }
            assert!(
                start.elapsed() < FAILOVER_LIMIT,
                "no failover to port {new_port} (old master {}) within {FAILOVER_LIMIT:?}",
                old.port()
            );
            sleep(Duration::from_millis(20)).await;
        }
        self.master = next;
        self.failovers += 1;
        start.elapsed()
    }

    /// Whether the old master (the node that is not the master now) has been demoted and
    /// its link to the new master is up (a next failover needs it).
    #[must_use]
    pub fn replica_in_sync(&self) -> bool {
        let replica = &self.nodes[1 - self.master];
        let Ok(mut con) = replica.client().get_connection_with_timeout(Duration::from_millis(500))
        else {
            return false;
        };
        let info: String =
            redis::cmd("INFO").arg("replication").query(&mut con).unwrap_or_default();
        info.contains("role:slave") && info.contains("master_link_status:up")
    }
}
