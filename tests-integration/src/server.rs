//! One server process owned by a test: a free loopback port, a temporary directory (config,
//! log, AOF/RDB files), a bounded start-up wait, a kill on drop, and its log printed when the
//! test fails.

use std::fs;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use redis::Connection;

use crate::poll;

/// How long a server may take to accept commands (AOF replays included).
pub(crate) const START_TIMEOUT: Duration = Duration::from_secs(20);

/// The module under test.
#[must_use]
pub fn module_path() -> PathBuf {
    if let Some(path) = std::env::var_os("RLOCK_MODULE") {
        return PathBuf::from(path);
    }
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/release/librlock.so")
}

pub(crate) fn server_binary() -> String {
    std::env::var("REDIS_SERVER").unwrap_or_else(|_| "redis-server".to_owned())
}

/// How to start a server.
#[derive(Debug, Clone)]
pub struct Builder {
    module: bool,
    args: Vec<String>,
}

impl Default for Builder {
    fn default() -> Self {
        Self { module: true, args: Vec::new() }
    }
}

impl Builder {
    /// Starts the server without the rlock module (a plain replica, say).
    #[must_use]
    pub fn without_module(mut self) -> Self {
        self.module = false;
        self
    }

    /// Adds a config directive, e.g. `.config("appendonly", "yes")`.
    #[must_use]
    pub fn config(mut self, name: &str, value: &str) -> Self {
        self.args.push(format!("--{name}"));
        self.args.push(value.to_owned());
        self
    }

    /// Makes the server a replica of `master`.
    #[must_use]
    pub fn replica_of(self, master: &Server) -> Self {
        self.config("replicaof", &format!("127.0.0.1 {}", master.port()))
    }

    /// Starts the server in a new temporary directory.
    ///
    /// # Panics
    /// When the server does not start within the bounded wait (its log is printed).
    #[must_use]
    pub fn start(self) -> Server {
        let dir = tempfile::Builder::new().prefix("rlock-test-").tempdir().expect("temp dir");
        let mut server = Server { child: None, port: 0, dir, builder: self };
        server.spawn();
        server
    }
}

/// A running redis-server owned by a test.
pub struct Server {
    child: Option<Child>,
    port: u16,
    dir: tempfile::TempDir,
    builder: Builder,
}

impl Server {
    /// A server with the module, default settings.
    #[must_use]
    pub fn start() -> Self {
        Builder::default().start()
    }

    /// How to start a server with other settings.
    #[must_use]
    pub fn builder() -> Builder {
        Builder::default()
    }

    #[must_use]
    pub const fn port(&self) -> u16 {
        self.port
    }

    #[must_use]
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// The server's working directory (AOF and RDB files).
    #[must_use]
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("redis.log")
    }

    /// The server's log so far.
    #[must_use]
    pub fn log(&self) -> String {
        fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    #[must_use]
    pub fn client(&self) -> redis::Client {
        redis::Client::open(self.url()).expect("client")
    }

    /// A new synchronous connection (RESP2) with a 10 s read timeout, so a test that expects
    /// a reply it never gets fails instead of hanging.
    #[must_use]
    pub fn conn(&self) -> Connection {
        let con = self.client().get_connection().expect("connect");
        con.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
        con
    }

    /// A new synchronous RESP3 connection.
    #[must_use]
    pub fn conn_resp3(&self) -> Connection {
        let url = format!("{}?protocol=resp3", self.url());
        let con = redis::Client::open(url).expect("client").get_connection().expect("connect");
        con.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
        con
    }

    /// Kills the server with SIGKILL (no shutdown save), as a crash would.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Stops the server process (SIGSTOP): it keeps its connections but answers nothing, as a
    /// node in a long pause or behind a partition.
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    /// Resumes a paused server (SIGCONT).
    pub fn resume(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, signal: &str) {
        let pid = self.child.as_ref().expect("running").id();
        let status = Command::new("kill").arg(signal).arg(pid.to_string()).status().expect("kill");
        assert!(status.success(), "kill {signal} {pid}");
    }

    /// Kills the server and starts it again in the same directory (so from its AOF/RDB files).
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// Kills the server and starts it again in the same directory on the same port, so
    /// clients can reconnect to it.
    pub fn restart_same_port(&mut self) {
        self.kill();
        let port = self.port;
        self.spawn_on(Some(port));
    }

    /// Adds a config directive for the next restarts (as `CONFIG SET` at run time would not be
    /// remembered by a restarted server).
    pub fn keep_config(&mut self, name: &str, value: &str) {
        self.builder = self.builder.clone().config(name, value);
    }

    /// Kills the server and starts it again in the same directory, without the module.
    pub fn restart_without_module(&mut self) {
        self.kill();
        self.builder.module = false;
        self.spawn();
    }

    fn spawn(&mut self) {
        self.spawn_on(None);
    }

    fn spawn_on(&mut self, fixed_port: Option<u16>) {
        let module = module_path();
        if self.builder.module {
            assert!(
                module.exists(),
                "{} is missing: build the module first (`make test` does, or \
                 `cargo build --release -p rlock`)",
                module.display()
            );
        }
        // A port found free may be taken before the server binds it: try a few.
        for _ in 0..5 {
            self.port = fixed_port.unwrap_or_else(free_port);
            let mut cmd = Command::new(server_binary());
            cmd.arg("--port")
                .arg(self.port.to_string())
                .args(["--bind", "127.0.0.1", "--save", "", "--daemonize", "no"])
                .args(["--enable-debug-command", "yes", "--repl-diskless-sync-delay", "0"])
                .arg("--dir")
                .arg(self.dir.path())
                .arg("--logfile")
                .arg(self.log_path());
            if self.builder.module {
                cmd.arg("--loadmodule").arg(&module);
            }
            cmd.args(&self.builder.args).stdin(Stdio::null()).stdout(Stdio::null());
            let child = cmd.spawn().unwrap_or_else(|e| {
                panic!("cannot run {} ({e}): install redis-server", server_binary())
            });
            self.child = Some(child);
            match self.wait_ready() {
                Ok(()) => return,
                Err(e) if self.log().contains("Address already in use") => {
                    eprintln!("port {} taken ({e}), trying another", self.port);
                    self.kill();
                }
                Err(e) => panic!("redis-server did not start: {e}\n{}", self.log_banner()),
            }
        }
        panic!("no free port found\n{}", self.log_banner());
    }

    fn wait_ready(&mut self) -> Result<(), String> {
        let until = Instant::now() + START_TIMEOUT;
        let client = self.client();
        loop {
            if let Some(child) = self.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    return Err(format!("it exited with {status}"));
                }
            }
            if let Ok(mut con) = client.get_connection_with_timeout(Duration::from_millis(500)) {
                // Another test's server may hold the port this one failed to bind (it then
                // exits): only this child's own process counts as ready.
                let own = self.child.as_ref().map(std::process::Child::id);
                if own.is_none() || process_id(&mut con) == own {
                    let info: redis::RedisResult<String> =
                        redis::cmd("INFO").arg("persistence").query(&mut con);
                    // The line itself: `async_loading:0` is there while `loading:1` too.
                    if matches!(info, Ok(ref s) if s.lines().any(|l| l.trim() == "loading:0")) {
                        return Ok(());
                    }
                }
            }
            if Instant::now() > until {
                return Err(format!("not ready after {START_TIMEOUT:?}"));
            }
            thread::sleep(Duration::from_millis(20));
        }
    }

    fn log_banner(&self) -> String {
        format!(
            "----- {} log (port {}, {}) -----\n{}----- end of log -----",
            server_binary(),
            self.port,
            self.dir.path().display(),
            self.log()
        )
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
        if thread::panicking() {
            eprintln!("{}", self.log_banner());
        }
    }
}

/// The process id of the server on `con` (`INFO server`), if it answers: a server or
/// Sentinel that failed to bind its port may find another test's process answering there.
pub(crate) fn process_id(con: &mut redis::Connection) -> Option<u32> {
    let info: String = redis::cmd("INFO").arg("server").query(con).ok()?;
    info.lines().find_map(|l| l.trim().strip_prefix("process_id:")?.parse().ok())
}

pub(crate) fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("free port").port()
}

/// Waits until `replica` reports its link to the master up.
pub fn wait_link_up(replica: &mut Connection) {
    poll("the replica link", Duration::from_secs(20), || {
        let info: String = redis::cmd("INFO").arg("replication").query(replica).ok()?;
        info.contains("master_link_status:up").then_some(())
    });
}

/// Waits until `master` counts a replica as online (what `WAIT` counts).
pub fn wait_replica_online(master: &Server) {
    let mut m = master.conn();
    poll("the replica online", Duration::from_secs(20), || {
        let info: String = redis::cmd("INFO").arg("replication").query(&mut m).ok()?;
        info.contains("state=online").then_some(())
    });
}
