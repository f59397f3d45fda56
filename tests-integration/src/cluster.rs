//! A Redis Cluster of module-loaded masters on loopback ports, optionally with replicas.

use std::process::Command;
use std::time::Duration;

use redis::{Connection, Value};

use crate::{cli_binary, poll, Server};

/// A Redis Cluster of masters on loopback ports, each node with the module.
///
/// Nodes `0..masters` start as the masters; with replicas ([`Cluster::start_with_replicas`]),
/// replica `j` of master `i` is node `masters + i * replicas + j`. Roles change with failovers:
/// ask the live topology ([`Cluster::owner_via`], [`Cluster::replicas_via`]).
pub struct Cluster {
    pub nodes: Vec<Server>,
}

/// One row of `CLUSTER NODES`, as a node sees it.
#[derive(Debug, Clone)]
pub struct NodeRow {
    /// The node id.
    pub id: String,
    /// Its port.
    pub port: u16,
    /// Its flags (`myself`, `master`, `slave`, `fail?`, `fail`, ...).
    pub flags: Vec<String>,
    /// Its master's id, for a replica.
    pub master_id: Option<String>,
    /// Whether it serves any slot.
    pub has_slots: bool,
}

impl NodeRow {
    /// Whether it is flagged a master.
    #[must_use]
    pub fn is_master(&self) -> bool {
        self.flags.iter().any(|f| f == "master")
    }

    /// Whether it is flagged failing (`fail` or `fail?`).
    #[must_use]
    pub fn failing(&self) -> bool {
        self.flags.iter().any(|f| f == "fail" || f == "fail?")
    }
}

/// A connection with short timeouts (a paused or dead node answers `None`, not a hang).
fn quick_conn(server: &Server) -> Option<Connection> {
    let con = server.client().get_connection_with_timeout(Duration::from_millis(500)).ok()?;
    con.set_read_timeout(Some(Duration::from_secs(1))).ok()?;
    con.set_write_timeout(Some(Duration::from_secs(1))).ok()?;
    Some(con)
}

/// Parses `CLUSTER NODES`.
fn parse_nodes(text: &str) -> Vec<NodeRow> {
    text.lines()
        .filter_map(|line| {
            let parts: Vec<&str> = line.split(' ').collect();
            let addr = parts.get(1)?.split(['@', ',']).next()?;
            let port = addr.rsplit(':').next()?.parse().ok()?;
            let master_id = match *parts.get(3)? {
                "-" => None,
                id => Some(id.to_owned()),
            };
            Some(NodeRow {
                id: (*parts.first()?).to_owned(),
                port,
                flags: parts.get(2)?.split(',').map(str::to_owned).collect(),
                master_id,
                has_slots: parts.len() > 8,
            })
        })
        .collect()
}

impl Cluster {
    /// Starts `masters` nodes and joins them with `redis-cli --cluster create`.
    ///
    /// # Panics
    /// When the cluster does not come up within a bounded wait.
    #[must_use]
    pub fn start(masters: usize) -> Self {
        Self::start_with(masters, &[])
    }

    /// As [`Cluster::start`], each node with extra config directives.
    ///
    /// # Panics
    /// When the cluster does not come up within a bounded wait.
    #[must_use]
    pub fn start_with(masters: usize, config: &[(&str, &str)]) -> Self {
        Self::start_with_replicas(masters, 0, config)
    }

    /// As [`Cluster::start_with`], then `replicas` replicas of each master (module loaded,
    /// joined with `CLUSTER MEET` and `CLUSTER REPLICATE`), waiting until every master counts
    /// its replicas online and every node knows every other in its role.
    ///
    /// # Panics
    /// When the cluster does not come up within a bounded wait.
    #[must_use]
    pub fn start_with_replicas(masters: usize, replicas: usize, config: &[(&str, &str)]) -> Self {
        let start = || {
            let mut builder = Server::builder()
                .config("cluster-enabled", "yes")
                .config("cluster-config-file", "nodes.conf")
                .config("cluster-node-timeout", "2000");
            for (name, value) in config {
                builder = builder.config(name, value);
            }
            builder.start()
        };
        let nodes: Vec<Server> = (0..masters).map(|_| start()).collect();
        let mut create = Command::new(cli_binary());
        create.arg("--cluster").arg("create");
        for n in &nodes {
            create.arg(format!("127.0.0.1:{}", n.port()));
        }
        let out = create
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .output()
            .unwrap_or_else(|e| panic!("cannot run {} ({e})", cli_binary()));
        assert!(out.status.success(), "cluster create: {}", String::from_utf8_lossy(&out.stdout));
        let mut cluster = Self { nodes };
        cluster.wait_ok();
        if replicas == 0 {
            return cluster;
        }
        let master_ids: Vec<String> = (0..masters).map(|i| cluster.node_id(i)).collect();
        for id in &master_ids {
            for _ in 0..replicas {
                let replica = start();
                let mut con = replica.conn();
                let port = cluster.nodes[0].port();
                let _: () = redis::cmd("CLUSTER")
                    .arg("MEET")
                    .arg("127.0.0.1")
                    .arg(port)
                    .query(&mut con)
                    .expect("CLUSTER MEET");
                // Refused until the new node has learnt of the master through gossip.
                poll("the new node to replicate its master", Duration::from_secs(30), || {
                    redis::cmd("CLUSTER").arg("REPLICATE").arg(id).query::<()>(&mut con).ok()
                });
                cluster.nodes.push(replica);
            }
        }
        cluster.wait_healthy();
        cluster
    }

    /// Waits until every live node reports the cluster ok with every slot assigned.
    fn wait_ok(&self) {
        for node in &self.nodes {
            let mut con = node.conn();
            poll("the cluster to be ok", Duration::from_secs(30), || {
                let info: String = redis::cmd("CLUSTER").arg("INFO").query(&mut con).ok()?;
                (info.contains("cluster_state:ok") && info.contains("cluster_slots_assigned:16384"))
                    .then_some(())
            });
        }
    }

    /// Waits (up to 60 s) until every node of the cluster is up and agrees with every other:
    /// the same masters (each serving slots), every replica known as the replica of the same
    /// master by all, nobody flagged failing, the cluster ok everywhere, and every master
    /// counting its replicas online. For a cluster whose nodes all run (none killed, none
    /// paused).
    ///
    /// # Panics
    /// When that does not happen in time.
    pub fn wait_healthy(&self) {
        poll("the cluster to settle with its replicas", Duration::from_secs(60), || {
            let mut views = Vec::new();
            for i in 0..self.nodes.len() {
                let mut con = quick_conn(&self.nodes[i])?;
                let info: String = redis::cmd("CLUSTER").arg("INFO").query(&mut con).ok()?;
                if !info.contains("cluster_state:ok") {
                    return None;
                }
                let mut rows = self.rows_via(i)?;
                if rows.len() != self.nodes.len() || rows.iter().any(NodeRow::failing) {
                    return None;
                }
                rows.sort_by_key(|r| r.port);
                let view: Vec<(u16, bool, Option<String>)> =
                    rows.into_iter().map(|r| (r.port, r.is_master(), r.master_id)).collect();
                views.push(view);
            }
            if views.windows(2).any(|w| w[0] != w[1]) {
                return None;
            }
            for (port, master, _) in &views[0] {
                if !*master {
                    continue;
                }
                let i = self.nodes.iter().position(|n| n.port() == *port)?;
                let expected = views[0].iter().filter(|(_, m, _)| !m).count()
                    / views[0].iter().filter(|(_, m, _)| *m).count();
                let mut con = quick_conn(&self.nodes[i])?;
                let info: String = redis::cmd("INFO").arg("replication").query(&mut con).ok()?;
                if info.matches("state=online").count() != expected {
                    return None;
                }
            }
            Some(())
        });
    }

    /// `CLUSTER NODES` as node `via` sees it (`None` if it cannot be asked).
    #[must_use]
    pub fn rows_via(&self, via: usize) -> Option<Vec<NodeRow>> {
        let mut con = quick_conn(&self.nodes[via])?;
        let text: String = redis::cmd("CLUSTER").arg("NODES").query(&mut con).ok()?;
        Some(parse_nodes(&text))
    }

    /// The index of the node serving `slot`, as node `via` sees it (`None`: it cannot be
    /// asked, or it knows no owner).
    #[must_use]
    pub fn owner_via(&self, slot: u16, via: usize) -> Option<usize> {
        let mut con = quick_conn(&self.nodes[via])?;
        let rows: Vec<Value> = redis::cmd("CLUSTER").arg("SLOTS").query(&mut con).ok()?;
        rows.into_iter().find_map(|row| {
            let Value::Array(parts) = row else { return None };
            let start: u16 = redis::from_redis_value(parts.first()?.clone()).ok()?;
            let end: u16 = redis::from_redis_value(parts.get(1)?.clone()).ok()?;
            let Value::Array(master) = parts.get(2)? else { return None };
            let port: u16 = redis::from_redis_value(master.get(1)?.clone()).ok()?;
            (start..=end)
                .contains(&slot)
                .then(|| self.nodes.iter().position(|n| n.port() == port))
                .flatten()
        })
    }

    /// The indexes of the replicas of node `master`, as node `via` sees them.
    #[must_use]
    pub fn replicas_via(&self, master: usize, via: usize) -> Vec<usize> {
        let Some(rows) = self.rows_via(via) else { return Vec::new() };
        let port = self.nodes[master].port();
        let Some(id) = rows.iter().find(|r| r.port == port).map(|r| r.id.clone()) else {
            return Vec::new();
        };
        rows.iter()
            .filter(|r| r.master_id.as_deref() == Some(id.as_str()))
            .filter_map(|r| self.nodes.iter().position(|n| n.port() == r.port))
            .collect()
    }

    /// The node id of node `i`.
    #[must_use]
    pub fn node_id(&self, i: usize) -> String {
        redis::cmd("CLUSTER").arg("MYID").query(&mut self.nodes[i].conn()).expect("CLUSTER MYID")
    }

    /// The hash slot of `key`, as the cluster computes it.
    #[must_use]
    pub fn slot(&self, key: &[u8]) -> u16 {
        redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(key)
            .query(&mut self.nodes[0].conn())
            .expect("KEYSLOT")
    }

    /// The index of the node serving `key`.
    #[must_use]
    pub fn node_of(&self, key: &[u8]) -> usize {
        let slot = self.slot(key);
        let slots: Vec<(u16, u16, (String, u16))> = {
            let raw: Vec<Value> =
                redis::cmd("CLUSTER").arg("SLOTS").query(&mut self.nodes[0].conn()).expect("SLOTS");
            raw.into_iter()
                .map(|r| {
                    let Value::Array(parts) = r else { panic!("CLUSTER SLOTS row") };
                    let start: u16 = redis::from_redis_value(parts[0].clone()).expect("start");
                    let end: u16 = redis::from_redis_value(parts[1].clone()).expect("end");
                    let Value::Array(master) = &parts[2] else { panic!("master") };
                    let host: String = redis::from_redis_value(master[0].clone()).expect("host");
                    let port: u16 = redis::from_redis_value(master[1].clone()).expect("port");
                    (start, end, (host, port))
                })
                .collect()
        };
        let (_, _, (_, port)) =
            slots.iter().find(|(s, e, _)| (*s..=*e).contains(&slot)).expect("slot served");
        self.nodes.iter().position(|n| n.port() == *port).expect("node")
    }

    /// A key named `<prefix><n>` served by node `i`.
    #[must_use]
    pub fn key_on(&self, i: usize, prefix: &str) -> String {
        (0..10_000)
            .map(|n| format!("{prefix}{n}"))
            .find(|k| self.node_of(k.as_bytes()) == i)
            .expect("a key on every node")
    }

    /// Moves `slot` from node `from` to node `to` with its keys (the resharding steps).
    pub fn move_slot(&self, slot: u16, from: usize, to: usize) {
        let (from_id, to_id) = (self.node_id(from), self.node_id(to));
        let mut src = self.nodes[from].conn();
        let mut dst = self.nodes[to].conn();
        let ok =
            |r: redis::RedisResult<()>, what: &str| r.unwrap_or_else(|e| panic!("{what}: {e}"));
        ok(
            redis::cmd("CLUSTER")
                .arg("SETSLOT")
                .arg(slot)
                .arg("IMPORTING")
                .arg(&from_id)
                .query(&mut dst),
            "importing",
        );
        ok(
            redis::cmd("CLUSTER")
                .arg("SETSLOT")
                .arg(slot)
                .arg("MIGRATING")
                .arg(&to_id)
                .query(&mut src),
            "migrating",
        );
        loop {
            let keys: Vec<Vec<u8>> = redis::cmd("CLUSTER")
                .arg("GETKEYSINSLOT")
                .arg(slot)
                .arg(100)
                .query(&mut src)
                .expect("GETKEYSINSLOT");
            if keys.is_empty() {
                break;
            }
            for key in keys {
                let _: Value = redis::cmd("MIGRATE")
                    .arg("127.0.0.1")
                    .arg(self.nodes[to].port())
                    .arg(&key)
                    .arg(0)
                    .arg(5000)
                    .query(&mut src)
                    .expect("MIGRATE");
            }
        }
        for node in &self.nodes {
            ok(
                redis::cmd("CLUSTER")
                    .arg("SETSLOT")
                    .arg(slot)
                    .arg("NODE")
                    .arg(&to_id)
                    .query(&mut node.conn()),
                "node",
            );
        }
    }
}
