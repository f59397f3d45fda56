//! A real `redis-server` for each test, with the built rlock module loaded.
//!
//! Each [`Server`] owns its process: a free loopback port, a temporary directory (config, log,
//! AOF/RDB files), a bounded start-up wait, and a kill on drop. When the test fails (the thread
//! is panicking), the server's log is printed.
//!
//! Environment:
//! - `REDIS_SERVER`: the server binary (default `redis-server` on `PATH`);
//! - `RLOCK_MODULE`: the module to load (default `target/release/librlock.so` of this
//!   workspace; `make test` builds it first).

use std::fs;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use redis::{Connection, Value};

/// How long a server may take to accept commands (AOF replays included).
const START_TIMEOUT: Duration = Duration::from_secs(20);

/// The module under test.
#[must_use]
pub fn module_path() -> PathBuf {
    if let Some(path) = std::env::var_os("RLOCK_MODULE") {
        return PathBuf::from(path);
    }
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/release/librlock.so")
}

fn server_binary() -> String {
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
                let info: redis::RedisResult<String> =
                    redis::cmd("INFO").arg("persistence").query(&mut con);
                if matches!(info, Ok(ref s) if s.contains("loading:0")) {
                    return Ok(());
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

fn free_port() -> u16 {
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

/// Polls `check` every few ms until it returns `Some`, for at most `limit`.
///
/// # Panics
/// When `limit` passes first, naming `what`.
pub fn poll<T>(what: &str, limit: Duration, mut check: impl FnMut() -> Option<T>) -> T {
    let until = Instant::now() + limit;
    loop {
        if let Some(v) = check() {
            return v;
        }
        assert!(Instant::now() < until, "timed out after {limit:?} waiting for {what}");
        thread::sleep(Duration::from_millis(2));
    }
}

/// Sends one command given as text arguments and returns its reply.
///
/// # Panics
/// When the server answers with an error (named with the command).
pub fn cmd(con: &mut Connection, args: &[&str]) -> Value {
    run_str(con, args).unwrap_or_else(|e| panic!("{args:?} failed: {e}"))
}

/// The token of an `RLOCK.ACQUIRE ... TOKEN` grant, `[1, token]`.
///
/// # Panics
/// When the reply is anything else (not granted).
#[must_use]
pub fn granted_token(reply: &Value) -> i64 {
    match reply {
        Value::Array(parts) if parts.len() == 2 && parts[0] == Value::Int(1) => match parts[1] {
            Value::Int(token) => token,
            ref other => panic!("token: {other:?}"),
        },
        other => panic!("expected [1, token], got {other:?}"),
    }
}

/// Sends one command given as raw byte arguments; a server error comes back as its full text
/// (`"ERR syntax error"`, `"WRONGTYPE ..."`).
///
/// # Errors
/// The server's error reply, as text.
pub fn run(con: &mut Connection, args: &[&[u8]]) -> Result<Value, String> {
    let mut cmd = redis::cmd(&String::from_utf8_lossy(args[0]));
    for arg in &args[1..] {
        cmd.arg(*arg);
    }
    cmd.query::<Value>(con).map_err(|e| error_text(&e))
}

/// The error reply's full text, code first, as redis-cli shows it.
#[must_use]
pub fn error_text(e: &redis::RedisError) -> String {
    match (e.code(), e.detail()) {
        (Some(code), Some(detail)) => format!("{code} {detail}"),
        (Some(code), None) => code.to_owned(),
        _ => e.to_string(),
    }
}

/// Runs `args` between two `DEBUG DIGEST`s in one `MULTI`, so nothing else (timers, expiry,
/// other clients) can change the dataset in between: the command's reply (an error as its text),
/// and whether the dataset changed. A command refused while queueing (arity) ran not at all.
///
/// # Errors
/// The connection failed (the server is gone).
pub fn run_checked(
    con: &mut Connection,
    args: &[&[u8]],
) -> Result<(Result<Value, String>, bool), String> {
    run(con, &[b"MULTI"])?;
    run(con, &[b"DEBUG", b"DIGEST"])?;
    if let Err(e) = run(con, args) {
        run(con, &[b"DISCARD"])?;
        return Ok((Err(e), false));
    }
    run(con, &[b"DEBUG", b"DIGEST"])?;
    // The raw reply: `query` would turn the command's error inside EXEC into an error of EXEC.
    let exec =
        redis::ConnectionLike::req_command(con, &redis::cmd("EXEC")).map_err(|e| error_text(&e))?;
    let Value::Array(results) = exec else { return Err(format!("EXEC: {exec:?}")) };
    let reply = match &results[1] {
        Value::ServerError(e) => Err(format!("{} {}", e.code(), e.details().unwrap_or(""))),
        other => Ok(other.clone()),
    };
    Ok((reply, results[0] != results[2]))
}

/// The seed of a randomised test: `RLOCK_FUZZ_SEED` to replay one, else a new one per run (the
/// test prints it and names it in its failures).
#[must_use]
pub fn fuzz_seed() -> u64 {
    std::env::var("RLOCK_FUZZ_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64)
            | 1
    })
}

/// Like [`run`] with string arguments.
///
/// # Errors
/// The server's error reply, as text.
pub fn run_str(con: &mut Connection, args: &[&str]) -> Result<Value, String> {
    let args: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
    run(con, &args)
}

/// `PEXPIRETIME key` (absolute Unix ms; -1 no expiry, -2 no key).
#[must_use]
pub fn pexpiretime(con: &mut Connection, key: &[u8]) -> i64 {
    redis::cmd("PEXPIRETIME").arg(key).query(con).expect("PEXPIRETIME")
}

/// The whole dataset's digest (keys, values and expiries): equal before and after a command
/// means the command changed nothing.
#[must_use]
pub fn digest(con: &mut Connection) -> String {
    redis::cmd("DEBUG").arg("DIGEST").query(con).expect("DEBUG DIGEST")
}

/// `HGETALL` as sorted (field, value) byte pairs.
#[must_use]
pub fn hgetall(con: &mut Connection, key: &[u8]) -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut pairs: Vec<(Vec<u8>, Vec<u8>)> =
        redis::cmd("HGETALL").arg(key).query(con).expect("HGETALL");
    pairs.sort();
    pairs
}

/// A command running on its own connection and thread (a blocking `RLOCK.ACQUIRE ... WAIT`).
pub struct Pending {
    id: i64,
    thread: thread::JoinHandle<(Result<Value, String>, Instant)>,
}

impl Pending {
    /// Sends `args` on a new connection of `server` from a new thread.
    #[must_use]
    pub fn start(server: &Server, args: &[&[u8]]) -> Self {
        let mut con = server.conn();
        con.set_read_timeout(Some(Duration::from_secs(120))).expect("timeout");
        let id: i64 = redis::cmd("CLIENT").arg("ID").query(&mut con).expect("CLIENT ID");
        let args: Vec<Vec<u8>> = args.iter().map(|a| a.to_vec()).collect();
        let thread = thread::spawn(move || {
            let args: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
            let reply = run(&mut con, &args);
            (reply, Instant::now())
        });
        Self { id, thread }
    }

    /// Like [`Pending::start`] with string arguments.
    #[must_use]
    pub fn start_str(server: &Server, args: &[&str]) -> Self {
        let args: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
        Self::start(server, &args)
    }

    /// The connection's client id (for `CLIENT KILL ID`, `CLIENT UNBLOCK`).
    #[must_use]
    pub const fn client_id(&self) -> i64 {
        self.id
    }

    /// Whether the reply has arrived.
    #[must_use]
    pub fn replied(&self) -> bool {
        self.thread.is_finished()
    }

    /// The reply and when it arrived, waiting at most `limit` for it.
    ///
    /// # Panics
    /// When no reply comes within `limit`.
    pub fn reply(self, limit: Duration) -> (Result<Value, String>, Instant) {
        poll("the blocked command's reply", limit, || self.replied().then_some(()));
        self.thread.join().expect("command thread")
    }
}

/// `blocked_clients` from `INFO clients`.
#[must_use]
pub fn blocked_clients(con: &mut Connection) -> i64 {
    info_field(con, "clients", "blocked_clients")
}

/// One integer field of an `INFO` section.
///
/// # Panics
/// When the section has no such integer field (a renamed or vanished field must fail the test,
/// not read as 0).
#[must_use]
pub fn info_field(con: &mut Connection, section: &str, field: &str) -> i64 {
    let info: String = redis::cmd("INFO").arg(section).query(con).expect("INFO");
    info.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':')?.trim().parse().ok())
        .unwrap_or_else(|| panic!("INFO {section} has no integer field {field}:\n{info}"))
}

/// The cli matching the server under test (`REDIS_CLI`, else `valkey-cli` beside a
/// `valkey-server`, else `redis-cli`).
#[must_use]
pub fn cli_binary() -> String {
    if let Ok(cli) = std::env::var("REDIS_CLI") {
        return cli;
    }
    let server = server_binary();
    match server.strip_suffix("valkey-server") {
        Some(dir) => format!("{dir}valkey-cli"),
        None => "redis-cli".to_owned(),
    }
}

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
        let dir = tempfile::Builder::new().prefix("rlock-sentinel-").tempdir().expect("temp dir");
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
        let sentinel = Self { child: Some(child), port, dir };
        let client = redis::Client::open(sentinel.url()).expect("client");
        poll("the sentinel to answer", START_TIMEOUT, || {
            let mut con = client.get_connection_with_timeout(Duration::from_millis(200)).ok()?;
            redis::cmd("PING").query::<String>(&mut con).ok()
        });
        sentinel
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

/// Whether the server answers `ROLE` as a master (false when it cannot be asked).
#[must_use]
pub fn is_master(server: &Server) -> bool {
    let Ok(mut con) = server.client().get_connection_with_timeout(Duration::from_millis(500))
    else {
        return false;
    };
    let _ = con.set_read_timeout(Some(Duration::from_millis(500)));
    let role: redis::RedisResult<Vec<Value>> = redis::cmd("ROLE").query(&mut con);
    matches!(role.as_deref(), Ok([Value::BulkString(r), ..]) if r == b"master")
}

/// The Valkey major version of the server behind `con` (`None` for Redis).
#[must_use]
pub fn valkey_major(con: &mut Connection) -> Option<u32> {
    let info: String = redis::cmd("INFO").arg("server").query(con).ok()?;
    let version = info.lines().find_map(|l| l.strip_prefix("valkey_version:"))?;
    version.trim().split('.').next()?.parse().ok()
}
