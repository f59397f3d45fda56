//! A Redis Cluster of module-loaded masters on loopback ports.

use std::process::Command;
use std::time::Duration;

use redis::Value;

use crate::{cli_binary, poll, Server};

/// A Redis Cluster of masters on loopback ports, each node with the module.
pub struct Cluster {
    pub nodes: Vec<Server>,
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
        let nodes: Vec<Server> = (0..masters)
            .map(|_| {
                let mut builder = Server::builder()
                    .config("cluster-enabled", "yes")
                    .config("cluster-config-file", "nodes.conf")
                    .config("cluster-node-timeout", "2000");
                for (name, value) in config {
                    builder = builder.config(name, value);
                }
                builder.start()
            })
            .collect();
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
        let cluster = Self { nodes };
        for node in &cluster.nodes {
            let mut con = node.conn();
            poll("the cluster to be ok", Duration::from_secs(30), || {
                let info: String = redis::cmd("CLUSTER").arg("INFO").query(&mut con).ok()?;
                (info.contains("cluster_state:ok") && info.contains("cluster_slots_assigned:16384"))
                    .then_some(())
            });
        }
        cluster
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
