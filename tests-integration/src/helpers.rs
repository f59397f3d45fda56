//! Helpers the tests share: polling with a bound, commands as text or bytes, replies read, INFO
//! fields, `RSEM.INFO` read as a map, blocked commands on their own thread (and queued ones), a
//! command run on a thread of its own, clients by id.

use std::collections::HashMap;
use std::thread;
use std::time::{Duration, Instant};

use redis::{Connection, Value};

use crate::server::{server_binary, Server};

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

/// A command from text arguments (`["SET", "k", "v"]`), to send or pipeline.
///
/// # Panics
/// When `args` is empty.
#[must_use]
pub fn command(args: &[&str]) -> redis::Cmd {
    let (name, rest) = args.split_first().expect("a command name");
    let mut c = redis::cmd(name);
    for a in rest {
        c.arg(*a);
    }
    c
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
/// Keys whose expiry has passed but that Redis has not deleted yet are deleted first, in the
/// same `MULTI` (a `SCAN` over the whole database deletes the expired keys it meets; time stands
/// still inside `EXEC`): a command that reads such a key deletes it (lazy expiry), which is no
/// change of the data but would change the digest.
///
/// # Errors
/// The connection failed (the server is gone).
pub fn run_checked(
    con: &mut Connection,
    args: &[&[u8]],
) -> Result<(Result<Value, String>, bool), String> {
    run(con, &[b"MULTI"])?;
    run(con, &[b"SCAN", b"0", b"COUNT", b"1000000"])?;
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
    let reply = match &results[2] {
        Value::ServerError(e) => Err(format!("{} {}", e.code(), e.details().unwrap_or(""))),
        other => Ok(other.clone()),
    };
    Ok((reply, results[1] != results[3]))
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

/// The server's clock (`TIME`) in Unix ms.
#[must_use]
pub fn server_time_ms(con: &mut Connection) -> i64 {
    let time: Vec<i64> = redis::cmd("TIME").query(con).expect("TIME");
    time[0] * 1000 + time[1] / 1000
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

/// Starts `args` (a blocking acquire) on its own connection and waits until it is queued (one
/// more blocked client than before), so waiters started one after another queue in that order.
///
/// # Panics
/// When the command does not block within 10 s.
#[must_use]
pub fn queue(server: &Server, con: &mut Connection, args: &[&[u8]]) -> Pending {
    let before = blocked_clients(con);
    let pending = Pending::start(server, args);
    poll("the waiter to block", Duration::from_secs(10), || {
        (blocked_clients(con) == before + 1).then_some(())
    });
    pending
}

/// Like [`queue`] with string arguments.
///
/// # Panics
/// When the command does not block within 10 s.
#[must_use]
pub fn queue_str(server: &Server, con: &mut Connection, args: &[&str]) -> Pending {
    let args: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
    queue(server, con, &args)
}

/// Waits until `n` clients are blocked (waiters queued).
///
/// # Panics
/// When that does not happen within 10 s.
pub fn wait_blocked(con: &mut Connection, n: i64) {
    poll("the waiters to block", Duration::from_secs(10), || {
        (blocked_clients(con) == n).then_some(())
    });
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

/// One text field of an `INFO` section (its value, trimmed).
///
/// # Panics
/// When the section has no such field.
#[must_use]
pub fn info_text(con: &mut Connection, section: &str, field: &str) -> String {
    let info: String = redis::cmd("INFO").arg(section).query(con).expect("INFO");
    info.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':').map(|v| v.trim().to_owned()))
        .unwrap_or_else(|| panic!("INFO {section} has no field {field}:\n{info}"))
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

/// The connection's client id (`CLIENT ID`).
#[must_use]
pub fn client_id(con: &mut Connection) -> i64 {
    redis::cmd("CLIENT").arg("ID").query(con).expect("CLIENT ID")
}

/// `CLIENT KILL ID id` from `admin`.
///
/// # Panics
/// When no client was killed.
pub fn kill_client(admin: &mut Connection, id: i64) {
    assert_eq!(cmd(admin, &["CLIENT", "KILL", "ID", &id.to_string()]), Value::Int(1));
}

/// Whether `key` exists.
#[must_use]
pub fn exists(con: &mut Connection, key: &str) -> bool {
    cmd(con, &["EXISTS", key]) == Value::Int(1)
}

/// A connection to `server` authenticated as the ACL user `user` (password `any`, as the tests
/// create their users), with a 60 s read timeout (a blocking command's reply may take that
/// long).
///
/// # Panics
/// When the connection fails (the `AUTH` reply is the caller's to check).
#[must_use]
pub fn conn_as(server: &Server, user: &str) -> Connection {
    let mut con = server.conn();
    con.set_read_timeout(Some(Duration::from_secs(60))).expect("timeout");
    cmd(&mut con, &["AUTH", user, "any"]);
    con
}

/// Whether the request id `id` may wait on `key` again (nothing of an earlier waiter's tag is
/// left): a new `WAIT` under it queues, is listed, is cancelled by id and answered as a
/// timeout within `limit`.
///
/// # Panics
/// When any of that does not happen.
pub fn tag_is_free(server: &Server, con: &mut Connection, key: &str, id: &str, limit: Duration) {
    let args = ["RLOCK.ACQUIRE", key, "w", "60000", "WAIT", "0", "REQUEST", id];
    let again = queue_str(server, con, &args);
    let waiters = run_str(con, &["RLOCK.WAITERS", key]).expect("WAITERS");
    assert!(format!("{waiters:?}").contains(id), "{waiters:?}");
    assert_eq!(run_str(con, &["RLOCK.CANCEL", key, id]), Ok(Value::Int(1)), "cancel by id");
    assert!(matches!(again.reply(limit).0, Ok(Value::Int(_))), "answered as a timeout");
}

/// How many replicas the master's replica guard counts in sync (`INFO rlock`).
pub fn replicas_in_sync(con: &mut Connection) -> i64 {
    info_field(con, "rlock_replicas", "rlock_replicas_in_sync")
}

/// A replica of `master` (with the module) that the master's guard counts in sync within
/// `limit`.
///
/// # Panics
/// When it is not counted in time.
#[must_use]
pub fn attach_replica(master: &Server, con: &mut Connection, limit: Duration) -> Server {
    let replica = Server::builder().replica_of(master).start();
    crate::server::wait_replica_online(master);
    poll("the master to count its replica", limit, || (replicas_in_sync(con) == 1).then_some(()));
    replica
}

/// An integer reply.
///
/// # Panics
/// When `value` is anything else.
#[must_use]
pub fn int(value: &Value) -> i64 {
    match value {
        Value::Int(n) => *n,
        other => panic!("not an integer: {other:?}"),
    }
}

/// How many rlock commands (`RLOCK.*`, `RWLOCK.*`, `RSEM.*`, `RLATCH.*`) the server ran so far
/// (`INFO commandstats`): a call that must send nothing leaves it unchanged.
#[must_use]
pub fn module_calls(con: &mut Connection) -> i64 {
    let info: String = redis::cmd("INFO").arg("commandstats").query(con).expect("INFO");
    info.lines()
        .filter(|l| {
            ["cmdstat_rlock.", "cmdstat_rwlock.", "cmdstat_rsem.", "cmdstat_rlatch."]
                .iter()
                .any(|p| l.starts_with(p))
        })
        .filter_map(|l| l.split("calls=").nth(1)?.split(',').next()?.parse::<i64>().ok())
        .sum()
}

/// The remaining lease of `key` as the server reports it (`PTTL`), and when it ends at the
/// latest on this process's clock: the reply's lease added to the moment the reply arrived
/// (the server read its clock before that), plus the millisecond `PTTL` may have cut off.
/// `None` when the key has no lease (missing, or no expiry).
#[must_use]
pub fn lease_end(con: &mut Connection, key: &str) -> Option<Instant> {
    let pttl = int(&cmd(con, &["PTTL", key]));
    let replied = Instant::now();
    let ms = u64::try_from(pttl).ok()?;
    Some(replied + Duration::from_millis(ms + 1))
}

/// Runs `args` on a new connection to `server` in a thread of its own; the reply and how long
/// it took.
#[must_use]
pub fn in_thread(server: &Server, args: &[&str]) -> thread::JoinHandle<(Value, Duration)> {
    let mut con = server.conn();
    let args: Vec<String> = args.iter().map(|s| (*s).to_owned()).collect();
    thread::spawn(move || {
        let start = Instant::now();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        (cmd(&mut con, &args), start.elapsed())
    })
}

/// `RSEM.INFO key` as a map of its integer fields; `None` when the semaphore does not exist.
///
/// # Panics
/// When the reply is neither, or a field is not an integer.
#[must_use]
pub fn rsem_info(con: &mut Connection, key: &str) -> Option<HashMap<String, i64>> {
    let reply = cmd(con, &["RSEM.INFO", key]);
    let items = match reply {
        Value::Nil => return None,
        Value::Array(items) => items,
        other => panic!("RSEM.INFO {key}: {other:?}"),
    };
    let fields = items
        .chunks(2)
        .map(|kv| match kv {
            [Value::BulkString(k), Value::Int(v)] => (String::from_utf8_lossy(k).into_owned(), *v),
            other => panic!("RSEM.INFO {key} field: {other:?}"),
        })
        .collect();
    Some(fields)
}

/// The permit ids of a leased grant (`RSEM.ACQUIRE ... LEASE`'s array reply).
///
/// # Panics
/// When `reply` is no array of ids.
#[must_use]
pub fn permit_ids(reply: &Value) -> Vec<Vec<u8>> {
    match reply {
        Value::Array(items) => items
            .iter()
            .map(|v| match v {
                Value::BulkString(b) => b.clone(),
                other => panic!("not an id: {other:?}"),
            })
            .collect(),
        other => panic!("not ids: {other:?}"),
    }
}
