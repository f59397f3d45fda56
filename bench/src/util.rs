//! Shared pieces: servers, connections, the pipelined load driver, INFO readers, the Lua
//! baselines.

use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Cmd, Value};
use rlock_tests_integration::Server;

/// The clients [`server`] admits.
const MAXCLIENTS: usize = 19_000;

/// File descriptors kept for other things than the waiters' connections (this process's own,
/// the server's reserved 32, the set-up connections).
const RESERVED_FDS: usize = 500;

/// A server with the module, room for many clients, and nothing persisted.
pub fn server() -> Server {
    server_with(None)
}

/// [`server`], loading the module at `module` instead of this checkout's (`None`).
pub fn server_with(module: Option<&str>) -> Server {
    let builder =
        Server::builder().config("maxclients", &MAXCLIENTS.to_string()).config("appendonly", "no");
    let builder = match module {
        Some(path) => builder.without_module().config("loadmodule", path),
        None => builder,
    };
    builder.start()
}

/// A dedicated async connection without a response timeout (blocking commands, big pipelines).
pub async fn conn(server: &Server) -> MultiplexedConnection {
    let config = AsyncConnectionConfig::new()
        .set_response_timeout(None)
        .set_connection_timeout(Some(Duration::from_secs(30)));
    server.client().get_multiplexed_async_connection_with_config(&config).await.expect("connect")
}

/// A subscription to `channel` on its own connection.
pub async fn subscription(server: &Server, channel: &str) -> redis::aio::PubSub {
    let mut pubsub = server.client().get_async_pubsub().await.expect("pubsub connection");
    pubsub.subscribe(channel).await.expect("subscribe");
    pubsub
}

/// Runs `make(i)` for i in 0..total over `clients` connections, `pipeline` commands in flight per
/// connection (as redis-benchmark -c clients -P pipeline). Returns commands per second.
pub async fn drive<F>(server: &Server, clients: usize, pipeline: usize, total: u64, make: F) -> f64
where
    F: Fn(u64) -> Cmd + Send + Sync + 'static,
{
    let make = Arc::new(make);
    let mut conns = Vec::with_capacity(clients);
    for _ in 0..clients {
        conns.push(conn(server).await);
    }
    let started = Instant::now();
    let mut tasks = Vec::with_capacity(clients);
    for (c, mut con) in conns.into_iter().enumerate() {
        let make = Arc::clone(&make);
        tasks.push(tokio::spawn(async move {
            let mut i = c as u64;
            let step = clients as u64;
            while i < total {
                let mut pipe = redis::pipe();
                for _ in 0..pipeline {
                    if i >= total {
                        break;
                    }
                    pipe.add_command(make(i));
                    i += step;
                }
                let _: Vec<Value> = pipe.query_async(&mut con).await.expect("pipeline");
            }
        }));
    }
    for task in tasks {
        task.await.expect("driver task");
    }
    total as f64 / started.elapsed().as_secs_f64()
}

/// One command, for set-up and probes.
pub async fn call(con: &mut MultiplexedConnection, args: &[&str]) -> Value {
    let mut cmd = redis::cmd(args[0]);
    for a in &args[1..] {
        cmd.arg(*a);
    }
    cmd.query_async(con).await.unwrap_or_else(|e| panic!("{args:?}: {e}"))
}

pub async fn info(con: &mut MultiplexedConnection, section: &str) -> String {
    redis::cmd("INFO").arg(section).query_async(con).await.expect("INFO")
}

/// A numeric field of an INFO section (0 when absent).
pub async fn info_num(con: &mut MultiplexedConnection, section: &str, field: &str) -> f64 {
    parse_field(&info(con, section).await, field).unwrap_or(0.0)
}

fn parse_field(info: &str, field: &str) -> Option<f64> {
    info.lines().find_map(|l| l.strip_prefix(field)?.strip_prefix(':')?.trim().parse().ok())
}

/// `usec_per_call` of a command in `INFO commandstats` (0 when it did not run).
pub async fn usec_per_call(con: &mut MultiplexedConnection, command: &str) -> f64 {
    let stats = info(con, "commandstats").await;
    let prefix = format!("cmdstat_{command}:");
    stats
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|rest| rest.split(',').find_map(|kv| kv.strip_prefix("usec_per_call=")))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

pub async fn reset_stats(con: &mut MultiplexedConnection) {
    call(con, &["CONFIG", "RESETSTAT"]).await;
}

pub async fn blocked_clients(con: &mut MultiplexedConnection) -> usize {
    info_num(con, "clients", "blocked_clients").await as usize
}

/// Waits until `n` clients are blocked (bounded).
pub async fn until_blocked(con: &mut MultiplexedConnection, n: usize) {
    let until = Instant::now() + Duration::from_secs(120);
    while blocked_clients(con).await < n {
        assert!(Instant::now() < until, "{n} clients never blocked");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Redisson's reentrant lock scripts, written from the lock model (not Redisson's source), and
/// the compare-and-delete release of the plain `SET NX` recipe.
pub const LUA_ACQUIRE: &str = "if redis.call('exists', KEYS[1]) == 0 or redis.call('hexists', KEYS[1], ARGV[2]) == 1 then \
    redis.call('hincrby', KEYS[1], ARGV[2], 1); redis.call('pexpire', KEYS[1], ARGV[1]); return nil end; \
    return redis.call('pttl', KEYS[1])";
pub const LUA_RELEASE: &str =
    "if redis.call('hexists', KEYS[1], ARGV[3]) == 0 then return nil end; \
    local c = redis.call('hincrby', KEYS[1], ARGV[3], -1); \
    if c > 0 then redis.call('pexpire', KEYS[1], ARGV[2]); return 0 end; \
    redis.call('del', KEYS[1]); redis.call('publish', KEYS[2], ARGV[1]); return 1";
pub const LUA_RENEW: &str = "if redis.call('hexists', KEYS[1], ARGV[2]) == 1 then \
    redis.call('pexpire', KEYS[1], ARGV[1]); return 1 end; return 0";
pub const LUA_CAD: &str =
    "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end; return 0";

/// The SHA1s of the scripts, loaded on `con`'s server.
#[derive(Clone)]
pub struct Scripts {
    pub acquire: String,
    pub release: String,
    pub renew: String,
    pub cad: String,
}

impl Scripts {
    pub async fn load(con: &mut MultiplexedConnection) -> Self {
        let mut load = async |src: &str| -> String {
            redis::cmd("SCRIPT").arg("LOAD").arg(src).query_async(con).await.expect("SCRIPT LOAD")
        };
        Self {
            acquire: load(LUA_ACQUIRE).await,
            release: load(LUA_RELEASE).await,
            renew: load(LUA_RENEW).await,
            cad: load(LUA_CAD).await,
        }
    }
}

/// A Redisson-style acquire: the Lua acquire; when busy, wait for an unlock message on the
/// client's subscription (`messages`) or for the holder's PTTL, whichever is first; retry.
pub async fn redisson_acquire<S>(
    con: &mut MultiplexedConnection,
    scripts: &Scripts,
    lock: &str,
    lease_ms: u64,
    owner: &str,
    messages: &mut S,
) where
    S: futures_util::Stream + Unpin,
{
    use futures_util::StreamExt;
    loop {
        let pttl: Option<i64> = redis::cmd("EVALSHA")
            .arg(&scripts.acquire)
            .arg(1)
            .arg(lock)
            .arg(lease_ms)
            .arg(owner)
            .query_async(con)
            .await
            .expect("lua acquire");
        let Some(pttl) = pttl else { return };
        let wait = Duration::from_millis(u64::try_from(pttl).unwrap_or(lease_ms).max(1));
        tokio::select! {
            _ = messages.next() => {}
            () = tokio::time::sleep(wait) => {}
        }
    }
}

/// Adds 1 to the integer at `key` non-atomically (`GET`, then `SET`): an update lost under a
/// broken exclusion shows in the final count.
pub async fn increment(con: &mut MultiplexedConnection, key: &str) {
    let v: Option<i64> = redis::cmd("GET").arg(key).query_async(con).await.expect("GET");
    let () =
        redis::cmd("SET").arg(key).arg(v.unwrap_or(0) + 1).query_async(con).await.expect("SET");
}

/// `RLOCK.RELEASE lock owner`, which must find `owner` holding it.
pub async fn rlock_release(con: &mut MultiplexedConnection, lock: &str, owner: &str) {
    let _: i64 =
        redis::cmd("RLOCK.RELEASE").arg(lock).arg(owner).query_async(con).await.expect("release");
}

/// The Redisson-style release (publishes the unlock message when freed).
pub async fn redisson_release(
    con: &mut MultiplexedConnection,
    scripts: &Scripts,
    lock: &str,
    lease_ms: u64,
    owner: &str,
) {
    let _: Option<i64> = redis::cmd("EVALSHA")
        .arg(&scripts.release)
        .arg(2)
        .arg(lock)
        .arg(channel(lock))
        .arg(0)
        .arg(lease_ms)
        .arg(owner)
        .query_async(con)
        .await
        .expect("lua release");
}

/// The unlock channel of lock `key`.
pub fn channel(key: &str) -> String {
    format!("redisson_lock__channel:{{{key}}}")
}

/// Percentile of sorted samples.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

/// Raises the open-files limit for thousands of connections: to 65,536 where allowed (root may
/// raise the hard limit), else to the hard limit. Servers started afterwards inherit it.
pub fn raise_fd_limit() {
    const WANTED: libc::rlim_t = 65_536;
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit/setrlimit with a valid, initialised struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            return;
        }
        let raised = libc::rlimit { rlim_cur: WANTED, rlim_max: WANTED.max(lim.rlim_max) };
        if lim.rlim_cur >= WANTED || libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
            return;
        }
        lim.rlim_cur = lim.rlim_max;
        libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
    }
}

/// The open-files limit of this process (after [`raise_fd_limit`]), which the servers it
/// starts inherit.
pub fn fd_limit() -> usize {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit with a valid, initialised struct.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return 1_024;
    }
    usize::try_from(lim.rlim_cur).unwrap_or(usize::MAX)
}

/// How many connections a section can open to one server: this process holds one file
/// descriptor per connection and the server one per client, each under [`fd_limit`].
pub fn connections_room() -> usize {
    fd_limit().saturating_sub(RESERVED_FDS)
}

/// How many connections a section can open to a [`server`] (its `maxclients` too).
pub fn server_room() -> usize {
    connections_room().min(MAXCLIENTS - RESERVED_FDS)
}
