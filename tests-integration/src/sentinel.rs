//! Sentinels monitoring a master, for failover tests.

use std::fs;
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::Duration;

use crate::server::{free_port, process_id, server_binary, START_TIMEOUT};
use crate::{poll, Server};

/// A Sentinel on a loopback port, monitoring one master as `mymaster` (the server binary in
/// `--sentinel` mode, from a config file in its own temporary directory). Killed on drop; its
/// log printed when the test fails.
pub struct Sentinel {
    child: Option<Child>,
    port: u16,
    dir: tempfile::TempDir,
}

/// The name the Sentinels of [`Sentinel::start`] monitor their master under.
pub const SENTINEL_MASTER: &str = "mymaster";

impl Sentinel {
    /// Starts a Sentinel watching `master` with `quorum`, declaring it down after
    /// `down_after_ms`.
    ///
    /// # Panics
    /// When it does not answer `PING` within the bounded start-up wait.
    #[must_use]
    pub fn start(master: &Server, quorum: u32, down_after_ms: u64) -> Self {
        // A port found free may be taken before the Sentinel binds it (it then exits): try a
        // few, and count as started only a Sentinel whose own process answers on its port.
        for _ in 0..5 {
            let dir =
                tempfile::Builder::new().prefix("rlock-sentinel-").tempdir().expect("temp dir");
            let port = free_port();
            let config = format!(
                "port {port}\nbind 127.0.0.1\ndaemonize no\ndir {dir}\nlogfile {dir}/sentinel.log\n\
                 sentinel monitor {SENTINEL_MASTER} 127.0.0.1 {master} {quorum}\n\
                 sentinel down-after-milliseconds {SENTINEL_MASTER} {down_after_ms}\n\
                 sentinel failover-timeout {SENTINEL_MASTER} 10000\n\
                 sentinel parallel-syncs {SENTINEL_MASTER} 2\n",
                dir = dir.path().display(),
                master = master.port(),
            );
            let path = dir.path().join("sentinel.conf");
            fs::write(&path, config).expect("sentinel.conf");
            let child = Command::new(server_binary())
                .arg(&path)
                .arg("--sentinel")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .spawn()
                .expect("start a sentinel");
            let own = child.id();
            let mut sentinel = Self { child: Some(child), port, dir };
            let client = redis::Client::open(sentinel.url()).expect("client");
            let started = poll("the sentinel to answer", START_TIMEOUT, || {
                if let Some(child) = sentinel.child.as_mut() {
                    if let Ok(Some(_)) = child.try_wait() {
                        return Some(false); // exited: its port was taken
                    }
                }
                let mut con =
                    client.get_connection_with_timeout(Duration::from_millis(200)).ok()?;
                (process_id(&mut con) == Some(own)).then_some(true)
            });
            if started {
                return sentinel;
            }
            eprintln!("sentinel port {port} taken, trying another");
        }
        panic!("no free port for a sentinel");
    }

    /// The Sentinel's port (for a [`crate::Proxy`] in front of it).
    #[must_use]
    pub const fn port(&self) -> u16 {
        self.port
    }

    #[must_use]
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// The port of the master this Sentinel names now.
    ///
    /// # Panics
    /// When it cannot be asked.
    #[must_use]
    pub fn master_port(&self) -> u16 {
        let mut con =
            redis::Client::open(self.url()).expect("client").get_connection().expect("con");
        let (_, port): (String, u16) = redis::cmd("SENTINEL")
            .arg("GET-MASTER-ADDR-BY-NAME")
            .arg(SENTINEL_MASTER)
            .query(&mut con)
            .expect("SENTINEL GET-MASTER-ADDR-BY-NAME");
        port
    }

    /// A manual failover (`SENTINEL FAILOVER`) to `replica`, the group's one replica: waits, at
    /// most `limit` each, until this Sentinel knows the replica, accepts the failover (it refuses
    /// with NOGOODSLAVE until it has had a reply to INFO from the replica) and names the replica
    /// master. The old master is demoted seconds later.
    ///
    /// # Panics
    /// When any of that takes longer than `limit`.
    pub fn fail_over_to(&self, replica: &Server, limit: Duration) {
        poll("the sentinel to know the replica", limit, || {
            let mut con = redis::Client::open(self.url()).ok()?.get_connection().ok()?;
            let info: String = redis::cmd("INFO").arg("sentinel").query(&mut con).ok()?;
            info.contains("slaves=1").then_some(())
        });
        let mut s = redis::Client::open(self.url()).expect("client").get_connection().expect("con");
        poll("the sentinel to accept a failover", limit, || {
            redis::cmd("SENTINEL").arg("FAILOVER").arg(SENTINEL_MASTER).query::<()>(&mut s).ok()
        });
        poll("the promotion", limit, || (self.master_port() == replica.port()).then_some(()));
    }

    /// The Sentinel's log so far.
    #[must_use]
    pub fn log(&self) -> String {
        fs::read_to_string(self.dir.path().join("sentinel.log")).unwrap_or_default()
    }
}

impl Drop for Sentinel {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        if thread::panicking() {
            eprintln!("----- sentinel log (port {}) -----\n{}", self.port, self.log());
        }
    }
}
