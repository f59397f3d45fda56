//! A session's binding: the one dedicated connection whose acquires carry `SESSION [LOCKDELAY
//! ms]` (the server binds each grant to the connection that made it), and the holds granted
//! through it. A property of the acquire path, not a kind: any lock, read-write lock side or
//! leased permit request may carry one ([`crate::engine::request::Request::session`]).
//!
//! - **The connection** is a redis-rs `MultiplexedConnection` whose driver runs in a task of
//!   ours: the driver ends exactly when the socket does (the server closed it, `CLIENT KILL`,
//!   a restart, a reset), so the close is seen at once, without RESP3 push messages.
//! - **Keepalive**: while no session command is in flight, a `PING` every `keepalive`; one not
//!   answered within `keepalive` closes the session (a server that stopped answering, a cut
//!   network): noticed within two periods. The connection is then also ended on the server
//!   (`CLIENT KILL ID .. ADDR ..`, tried every second for a minute): one that died silently
//!   stays open there, with the session's holds, until their leases end. A command in flight (a blocked `WAIT`) would delay
//!   the `PONG`, so no ping runs then and a ping that overlapped one is not held against the
//!   connection.
//! - **Close** (any of the above, or the session dropped): the connection is closed (its driver
//!   aborted, so the server ends the holds too), every hold granted through it is marked lost
//!   at once, and every later acquire fails with [`Error::SessionClosed`]: a binding is never
//!   re-made silently (a new connection would be a new session).

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use futures_util::future::BoxFuture;
use futures_util::FutureExt as _;
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, ConnectionAddr, ConnectionInfo, Value};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::watch;
use tokio::task::AbortHandle;

use crate::engine::hold::{Hold, WeakHold};
use crate::error::{Error, Result};

/// How long opening the session's connection may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The most lock-delay the module accepts (`LOCKDELAY` 0 to 60000 ms).
pub(crate) const MAX_LOCK_DELAY: Duration = Duration::from_secs(60);

/// One session's connection and the holds granted through it.
pub(crate) struct Binding {
    conn: Mutex<Option<MultiplexedConnection>>,
    /// The server the session is bound to (its checks go there, whatever the client's shared
    /// connection names now).
    server: redis::Client,
    /// The connection's address as the server sees it (`CLIENT INFO`'s `addr`), if known.
    client_addr: Option<String>,
    /// `LOCKDELAY` in ms (0: none sent).
    lock_delay_ms: u64,
    /// The server's id of the connection (`CLIENT ID`), if the user may ask.
    client_id: Option<i64>,
    /// Set (under `holds`) as the close begins: no hold is adopted after it.
    closing: AtomicBool,
    /// Sent once the close is done, every hold marked lost ([`Binding::closed`]).
    closed: watch::Sender<bool>,
    holds: Mutex<Vec<WeakHold>>,
    /// Session commands whose reply has not come yet, and how many ever started.
    in_flight: AtomicUsize,
    started: AtomicU64,
    tasks: Mutex<Vec<AbortHandle>>,
}

/// A session command in flight (the keepalive stays quiet meanwhile).
pub(crate) struct InFlight(Arc<Binding>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Binding {
    /// Opens the session's connection to the server of `client` (its address, database and
    /// credentials), with `lock_delay` on every acquire and a ping every `keepalive`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when `lock_delay` is above 60 s or `keepalive` is zero or
    /// beyond [`crate::MAX_DURATION`] (nothing opened); [`Error::SessionUnsupported`] for an
    /// address kind the session cannot open (TLS); [`Error::Redis`] when the server cannot be
    /// reached.
    pub(crate) async fn open(
        client: &redis::Client,
        lock_delay: Duration,
        keepalive: Duration,
    ) -> Result<Arc<Self>> {
        if lock_delay > MAX_LOCK_DELAY {
            let why = format!("a session's lock_delay must be at most 60 s, not {lock_delay:?}");
            return Err(Error::InvalidArgument(why));
        }
        if keepalive.is_zero() {
            return Err(Error::InvalidArgument("a session's keepalive must be above zero".into()));
        }
        if keepalive > crate::MAX_DURATION {
            return Err(crate::error::too_long("a session's keepalive", keepalive));
        }
        let info = client.get_connection_info();
        let config = AsyncConnectionConfig::new().set_response_timeout(None);
        let (mut conn, driver) = tokio::time::timeout(CONNECT_TIMEOUT, async {
            match info.addr() {
                ConnectionAddr::Tcp(host, port) => {
                    let stream = tokio::net::TcpStream::connect((host.as_str(), *port))
                        .await
                        .map_err(redis::RedisError::from)?;
                    stream.set_nodelay(true).map_err(redis::RedisError::from)?;
                    multiplexed(info, stream, config).await
                }
                ConnectionAddr::Unix(path) => {
                    let stream = tokio::net::UnixStream::connect(path)
                        .await
                        .map_err(redis::RedisError::from)?;
                    multiplexed(info, stream, config).await
                }
                _ => Err(Error::SessionUnsupported),
            }
        })
        .await
        .map_err(|_| Error::TimedOut)??;
        // Started before any command: the connection's replies are read by the driver.
        let driver = tokio::spawn(driver);
        let client_id = match redis::cmd("CLIENT").arg("ID").query_async(&mut conn).await {
            Ok(id) => Some(id),
            Err(e) if crate::error::from_server(&e) => None, // not allowed (ACL): no id then
            Err(e) => {
                driver.abort();
                return Err(e.into());
            }
        };
        // Its address as the server sees it: with the id, it names this connection alone (ids
        // start again after a restart), for a check or a kill from another connection.
        let client_addr = match client_id {
            None => None,
            Some(_) => {
                match redis::cmd("CLIENT").arg("INFO").query_async::<String>(&mut conn).await {
                    Ok(info) => info_field(&info, "addr"),
                    Err(e) if crate::error::from_server(&e) => None, // Redis before 6.2, or ACL
                    Err(e) => {
                        driver.abort();
                        return Err(e.into());
                    }
                }
            }
        };
        let binding = Arc::new(Self {
            conn: Mutex::new(Some(conn)),
            server: client.clone(),
            client_addr,
            // Rounded up: never a shorter delay than asked (at most 60 s, checked above).
            lock_delay_ms: if lock_delay.is_zero() { 0 } else { crate::engine::millis(lock_delay) },
            client_id,
            closing: AtomicBool::new(false),
            closed: watch::channel(false).0,
            holds: Mutex::new(Vec::new()),
            in_flight: AtomicUsize::new(0),
            started: AtomicU64::new(0),
            tasks: Mutex::new(Vec::new()),
        });
        let driver_abort = driver.abort_handle();
        let watcher = {
            let weak = Arc::downgrade(&binding);
            tokio::spawn(async move {
                let _ = driver.await; // ends with the socket (or when aborted by `close`)
                if let Some(binding) = weak.upgrade() {
                    binding.close();
                }
            })
        };
        let pinger = tokio::spawn(keepalive_loop(Arc::downgrade(&binding), keepalive));
        // The driver's too: aborting it drops the socket at once, even with a command still in
        // flight on it (a blocked `WAIT`, an unanswered `PING`), which would otherwise keep the
        // driver, the socket and so the server's holds alive until the server answers.
        let tasks = [driver_abort, watcher.abort_handle(), pinger.abort_handle()];
        lock(&binding.tasks).extend(tasks);
        if binding.closing.load(Ordering::SeqCst) {
            // Closed before the tasks were recorded: stop them now.
            lock(&binding.tasks).drain(..).for_each(|t| t.abort());
        }
        Ok(binding)
    }

    /// The server's id of the session's connection, when the user may ask (`CLIENT ID`).
    pub(crate) const fn client_id(&self) -> Option<i64> {
        self.client_id
    }

    /// The server the session is bound to.
    pub(crate) const fn server(&self) -> &redis::Client {
        &self.server
    }

    /// Whether a `CLIENT LIST ID <id>` line names the session's connection (its id, and its
    /// address when known: after a restart, another client may have the id).
    pub(crate) fn listed_in(&self, line: &str) -> bool {
        let Some(id) = self.client_id else { return false };
        info_field(line, "id").is_some_and(|listed| listed == id.to_string())
            && self
                .client_addr
                .as_ref()
                .is_none_or(|a| info_field(line, "addr").as_ref() == Some(a))
    }

    /// `CLIENT KILL ID <id> [ADDR <addr>]`: ends the session's connection on the server, and
    /// no other (`None` without an id).
    pub(crate) fn kill_command(&self) -> Option<redis::Cmd> {
        let mut kill = redis::cmd("CLIENT");
        kill.arg("KILL").arg("ID").arg(self.client_id?);
        if let Some(addr) = &self.client_addr {
            kill.arg("ADDR").arg(addr);
        }
        Some(kill)
    }

    /// Adds `SESSION [LOCKDELAY ms]` to an acquire.
    pub(crate) fn mark(&self, cmd: &mut redis::Cmd) {
        cmd.arg("SESSION");
        if self.lock_delay_ms > 0 {
            cmd.arg("LOCKDELAY").arg(self.lock_delay_ms);
        }
    }

    /// The connection for one session command, counted in flight until the returned guard
    /// drops; `None` once the session closed.
    pub(crate) fn connection(self: &Arc<Self>) -> Option<(MultiplexedConnection, InFlight)> {
        let conn = lock(&self.conn).clone()?;
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        self.started.fetch_add(1, Ordering::SeqCst);
        Some((conn, InFlight(Arc::clone(self))))
    }

    /// Records a hold granted through the session, to be marked lost when it closes. `false`
    /// when it closed already (the caller then gives the grant back).
    pub(crate) fn adopt(&self, hold: &Hold) -> bool {
        let mut holds = lock(&self.holds);
        if self.closing.load(Ordering::SeqCst) {
            return false;
        }
        // Forget holds that ended: the list stays within twice the holds alive.
        if holds.len() >= 16 && holds.len().is_power_of_two() {
            holds.retain(|h| h.upgrade_live().is_some());
        }
        holds.push(hold.downgrade());
        true
    }

    /// Whether the session closed.
    pub(crate) fn is_closed(&self) -> bool {
        *self.closed.borrow()
    }

    /// Resolves once the session closed.
    pub(crate) async fn closed(&self) {
        let mut closed = self.closed.subscribe();
        let _ = closed.wait_for(|c| *c).await;
    }

    /// Closes the session (once): closes its connection, marks every hold granted through it
    /// lost, and refuses further acquires; only then is it [`Self::is_closed`] (whoever
    /// [`Self::closed`] wakes finds every hold lost). Needs no runtime.
    pub(crate) fn close(&self) {
        let holds = {
            let mut holds = lock(&self.holds);
            if self.closing.swap(true, Ordering::SeqCst) {
                return;
            }
            std::mem::take(&mut *holds)
        };
        drop(lock(&self.conn).take());
        lock(&self.tasks).drain(..).for_each(|t| t.abort());
        for hold in holds.iter().filter_map(WeakHold::upgrade_live) {
            hold.lose();
        }
        self.closed.send_replace(true);
    }
}

/// How long a session closed by its keepalive keeps trying to end its connection on the server.
const KILL_TRIES: u32 = 60;

/// Ends a session's connection on the server after its keepalive went unanswered: a connection
/// that died silently (a cut link, a proxy that stops forwarding) stays open on the server's
/// side, with the session's holds, until their leases end. Tried every second (the network may
/// still be cut) until the server answers, at most [`KILL_TRIES`] times.
async fn kill_on_server(server: redis::Client, kill: redis::Cmd) {
    for _ in 0..KILL_TRIES {
        let attempt = async {
            let mut con = crate::conn::dedicated(&server, Some(Duration::from_secs(1))).await?;
            Ok::<_, Error>(kill.query_async::<Value>(&mut con).await?)
        };
        match tokio::time::timeout(Duration::from_secs(2), attempt).await {
            Ok(Ok(_)) => return,
            Ok(Err(Error::Redis(e))) if crate::error::from_server(&e) => return,
            _ => tokio::time::sleep(Duration::from_secs(1)).await,
        }
    }
}

/// The value of `name=` in a `CLIENT INFO` / `CLIENT LIST` line.
fn info_field(line: &str, name: &str) -> Option<String> {
    line.split_ascii_whitespace()
        .find_map(|part| part.strip_prefix(name)?.strip_prefix('='))
        .map(str::to_owned)
}

/// A connection's driver: it runs until the socket closes (one type for every stream kind).
type Driver = BoxFuture<'static, ()>;

/// The session's multiplexed connection over `stream` (a TCP or Unix socket already
/// connected), with the client's settings (database, credentials, protocol), and its driver.
async fn multiplexed<S>(
    info: &ConnectionInfo,
    stream: S,
    config: AsyncConnectionConfig,
) -> Result<(MultiplexedConnection, Driver)>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (conn, driver) =
        MultiplexedConnection::new_with_config(info.redis_settings(), stream, config).await?;
    Ok((conn, driver.boxed()))
}

/// Pings the session's connection every `period` while it is idle; closes the session when a
/// ping is not answered within `period` and no other command overlapped it.
async fn keepalive_loop(binding: Weak<Binding>, period: Duration) {
    loop {
        tokio::time::sleep(period).await;
        let Some(live) = binding.upgrade() else { return };
        if live.in_flight.load(Ordering::SeqCst) > 0 {
            continue;
        }
        let before = live.started.load(Ordering::SeqCst);
        let Some(mut conn) = lock(&live.conn).clone() else { return };
        drop(live);
        let ping = redis::cmd("PING");
        let answered =
            match tokio::time::timeout(period, ping.query_async::<Value>(&mut conn)).await {
                Ok(Ok(_)) => true,
                Ok(Err(e)) => crate::error::from_server(&e), // an answer all the same
                Err(_) => false,
            };
        drop(conn);
        let Some(live) = binding.upgrade() else { return };
        let overlapped = live.started.load(Ordering::SeqCst) != before
            || live.in_flight.load(Ordering::SeqCst) > 0;
        if !answered && !overlapped {
            let kill = live.kill_command().map(|kill| (live.server.clone(), kill));
            live.close();
            if let Some((server, kill)) = kill {
                tokio::spawn(kill_on_server(server, kill));
            }
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::info_field;

    #[test]
    fn client_info_fields_are_read_by_exact_name() {
        let line = "id=7 addr=127.0.0.1:5000 laddr=127.0.0.1:6379 fd=8 name= db=0\n";
        assert_eq!(info_field(line, "id").as_deref(), Some("7"));
        assert_eq!(info_field(line, "addr").as_deref(), Some("127.0.0.1:5000"));
        assert_eq!(info_field(line, "laddr").as_deref(), Some("127.0.0.1:6379"));
        assert_eq!(info_field(line, "name").as_deref(), Some(""));
        assert_eq!(info_field(line, "user"), None);
    }
}
