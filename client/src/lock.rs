//! One lock on one server: [`Lock`] handles, [`LockGuard`]s, the watchdog, server-side waits.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use redis::RedisError;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::conn::Conn;
use crate::{millis, Error, Remaining, Result, Shared};

/// How long a cancelled wait may take to learn whether it was granted meanwhile.
const CANCEL_GRACE: Duration = Duration::from_secs(5);

/// The answer to one `RLOCK.ACQUIRE`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Attempt {
    /// Held (taken or re-entered), with its fencing token when one was asked for.
    Held { token: Option<u64> },
    /// Held by another owner (or the wait timed out): the holder's remaining lease.
    Busy { pttl: i64 },
}

impl Attempt {
    /// Reads `nil` / `pttl`, or with `TOKEN` `[1, token]` / `[0, pttl]`.
    fn from_reply(reply: &redis::Value) -> Result<Self> {
        use redis::Value::{Array, Int, Nil};
        match reply {
            Nil => Ok(Self::Held { token: None }),
            Int(pttl) => Ok(Self::Busy { pttl: *pttl }),
            Array(parts) => match parts.as_slice() {
                [Int(1), Int(token)] => Ok(Self::Held { token: u64::try_from(*token).ok() }),
                [Int(1), Nil] => Ok(Self::Held { token: None }),
                [Int(0), Int(pttl)] => Ok(Self::Busy { pttl: *pttl }),
                _ => Err(unexpected(reply)),
            },
            _ => Err(unexpected(reply)),
        }
    }

    pub(crate) const fn is_held(self) -> bool {
        matches!(self, Self::Held { .. })
    }
}

fn unexpected(reply: &redis::Value) -> Error {
    Error::Redis(RedisError::from((
        redis::ErrorKind::UnexpectedReturnType,
        "unexpected RLOCK.ACQUIRE reply",
        format!("{reply:?}"),
    )))
}

/// How many times a release is retried (same request id) after a connection failure.
const RELEASE_RETRIES: u32 = 3;

/// How many MOVED/ASK redirections one wait follows.
const MAX_REDIRECTS: usize = 5;

/// The node a MOVED or ASK error points to, and whether it was ASK.
fn redirection(e: &RedisError) -> Option<((String, u16), bool)> {
    let (address, _slot) = e.redirect_node()?;
    let (host, port) = address.rsplit_once(':')?;
    let ask = matches!(e.kind(), redis::ErrorKind::Server(redis::ServerErrorKind::Ask));
    Some(((host.to_owned(), port.parse().ok()?), ask))
}

/// A handle on one named lock with one owner id. Clones share the owner id (and so re-enter).
#[derive(Clone)]
pub struct Lock {
    shared: Arc<Shared>,
    name: Arc<[u8]>,
    owner: Arc<str>,
}

impl fmt::Debug for Lock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lock")
            .field("name", &String::from_utf8_lossy(&self.name))
            .field("owner", &self.owner)
            .finish_non_exhaustive()
    }
}

impl Lock {
    pub(crate) fn new(shared: Arc<Shared>, name: Arc<[u8]>, owner: Arc<str>) -> Self {
        Self { shared, name, owner }
    }

    /// The lock's name (its Redis key).
    #[must_use]
    pub fn name(&self) -> &[u8] {
        &self.name
    }

    pub(crate) fn options(&self) -> &crate::Options {
        &self.shared.options
    }

    /// This handle's owner id.
    #[must_use]
    pub fn owner(&self) -> &str {
        &self.owner
    }

    fn conn(&self) -> Conn {
        self.shared.conn.clone()
    }

    /// Takes the lock, waiting as long as it takes. `lease: None` uses the watchdog.
    ///
    /// # Errors
    /// [`Error::Redis`] when Redis fails.
    pub async fn acquire(&self, lease: Option<Duration>) -> Result<LockGuard> {
        self.acquire_within(None, lease).await
    }

    /// Takes the lock, waiting at most `wait`. `lease: None` uses the watchdog.
    ///
    /// # Errors
    /// [`Error::TimedOut`] when `wait` passes first; [`Error::Redis`] when Redis fails.
    pub async fn try_acquire(&self, wait: Duration, lease: Option<Duration>) -> Result<LockGuard> {
        self.acquire_within(Some(Instant::now() + wait), lease).await
    }

    async fn acquire_within(
        &self,
        deadline: Option<Instant>,
        lease: Option<Duration>,
    ) -> Result<LockGuard> {
        let lease_ms = millis(lease.unwrap_or(self.shared.options.watchdog_timeout));
        let fencing = self.shared.options.fencing;
        let granted = |token| LockGuard::new(self.clone(), lease_ms, lease.is_none(), token);
        // Uncontended: one try on the shared connection (which then also waits for replicas).
        // In a cluster, replica acknowledgement must run on the node's own connection: the
        // server-side path does that, and returns at once when the lock is free.
        let ack_in_cluster =
            self.shared.options.replica_ack.is_some() && self.shared.target.is_cluster();
        if !ack_in_cluster {
            if let Attempt::Held { token } = self.try_once(lease_ms, fencing).await? {
                self.replicated(&mut self.conn()).await?;
                return Ok(granted(token));
            }
        }
        // Contended: the server queues us and hands the lock over (FIFO) when it is free.
        let wait_ms = match deadline {
            None => 0, // WAIT 0: without limit
            Some(deadline) => match deadline.checked_duration_since(Instant::now()) {
                Some(left) if !left.is_zero() => millis(left),
                _ => return Err(Error::TimedOut),
            },
        };
        match self.wait_on_server(lease_ms, wait_ms, fencing).await? {
            Attempt::Held { token } => Ok(granted(token)),
            Attempt::Busy { .. } => Err(Error::TimedOut),
        }
    }

    /// `RLOCK.ACQUIRE ... WAIT wait_ms` on a dedicated connection, run by a task of its own so a
    /// caller that drops this future (a cancelled wait) cannot leak the lock: the task then
    /// makes the server answer at once (`CLIENT UNBLOCK ... TIMEOUT`), releases the lock if the
    /// answer was a grant, and discards the connection, so no late reply reaches a pooled one.
    /// `Busy`: the wait timed out.
    pub(crate) async fn wait_on_server(
        &self,
        lease_ms: u64,
        wait_ms: u64,
        token: bool,
    ) -> Result<Attempt> {
        let (reply_tx, reply_rx) = oneshot::channel();
        tokio::spawn(self.clone().blocking_wait(lease_ms, wait_ms, token, reply_tx));
        let mut pending = PendingGrant { reply: Some(reply_rx), lock: self.clone() };
        let Some(reply) = pending.reply.as_mut() else {
            unreachable!("set just above");
        };
        let answer = reply.await;
        pending.reply = None; // consumed: nothing left for Drop to settle
        answer.unwrap_or_else(|_| {
            Err(Error::Redis(RedisError::from((
                redis::ErrorKind::Io,
                "the task waiting for the lock stopped",
            ))))
        })
    }

    async fn blocking_wait(
        self,
        lease_ms: u64,
        wait_ms: u64,
        token: bool,
        mut reply: oneshot::Sender<Result<Attempt>>,
    ) {
        let mut node = match self.shared.target.node_for(&self.name, &mut self.conn()).await {
            Ok(node) => node,
            Err(e) => {
                let _ = reply.send(Err(e));
                return;
            }
        };
        let mut asking = false;
        for _ in 0..MAX_REDIRECTS {
            let (mut con, id) = match self.wait_connection(&node, asking).await {
                Ok(c) => c,
                Err(e) => {
                    let _ = reply.send(Err(e));
                    return;
                }
            };
            let acquire = self.acquire_cmd(lease_ms, Some(wait_ms), token);
            // A clone of the same connection: Redis attributes the grant to this client.
            let mut waiting = con.clone();
            let wait = acquire.query_async::<redis::Value>(&mut waiting);
            tokio::pin!(wait);
            let answer = tokio::select! {
                answer = &mut wait => answer,
                () = reply.closed() => {
                    // Cancelled: have the server answer now, and settle what it answers.
                    if let Ok(mut unblocker) = node.get_multiplexed_async_connection().await {
                        let _: redis::RedisResult<i64> = redis::cmd("CLIENT")
                            .arg("UNBLOCK")
                            .arg(id)
                            .arg("TIMEOUT")
                            .query_async(&mut unblocker)
                            .await;
                    }
                    if let Ok(Ok(answer)) = tokio::time::timeout(CANCEL_GRACE, wait).await {
                        if Attempt::from_reply(&answer).is_ok_and(Attempt::is_held) {
                            let _ = self.release_once().await;
                        }
                    }
                    return; // dropping the connection: a wait still pending leaves the queue
                }
            };
            // The lock's slot moved (cluster): wait on the node that has it now.
            if let Some((address, ask)) = answer.as_ref().err().and_then(redirection) {
                match self.shared.target.client_at(Some((&address.0, address.1))) {
                    Ok(next) => {
                        node = next;
                        asking = ask;
                        continue;
                    }
                    Err(e) => {
                        let _ = reply.send(Err(e));
                        return;
                    }
                }
            }
            let mut granted = answer.map_err(Error::from).and_then(|a| Attempt::from_reply(&a));
            if granted.as_ref().is_ok_and(|a| a.is_held()) {
                // Redis's WAIT counts the writes of the connection that asked: this one, to
                // which the server attributes the grant.
                if let Err(e) = self.replicated(&mut con).await {
                    granted = Err(e);
                }
            }
            if let Err(Ok(Attempt::Held { .. })) = reply.send(granted) {
                // The caller went away just as the grant arrived.
                let _ = self.release_once().await;
            }
            return;
        }
        let _ = reply.send(Err(Error::Redis(RedisError::from((
            redis::ErrorKind::Server(redis::ServerErrorKind::Moved),
            "the lock's slot kept moving",
        )))));
    }

    /// A dedicated connection to `node` and its client id (for `CLIENT UNBLOCK`); `asking`
    /// sends `ASKING` first (after an ASK redirection).
    async fn wait_connection(
        &self,
        node: &redis::Client,
        asking: bool,
    ) -> Result<(redis::aio::MultiplexedConnection, i64)> {
        let mut con = crate::conn::dedicated(node).await?;
        let id: i64 = redis::cmd("CLIENT").arg("ID").query_async(&mut con).await?;
        if asking {
            let () = redis::cmd("ASKING").query_async(&mut con).await?;
        }
        Ok((con, id))
    }

    /// With [`crate::Options::replica_ack`]: waits for the replicas to acknowledge the writes of
    /// `con` (the grant just made); too few: releases the hold and fails.
    async fn replicated<C: redis::aio::ConnectionLike + Send>(&self, con: &mut C) -> Result<()> {
        let Some((wanted, timeout)) = self.shared.options.replica_ack else {
            return Ok(());
        };
        let acknowledged: u32 =
            match redis::cmd("WAIT").arg(wanted).arg(millis(timeout)).query_async(con).await {
                Ok(n) => n,
                Err(e) => {
                    let _ = self.release_once().await;
                    return Err(e.into());
                }
            };
        if acknowledged >= wanted {
            return Ok(());
        }
        let _ = self.release_once().await;
        Err(Error::NotReplicated { wanted, acknowledged })
    }

    /// `RLOCK.ACQUIRE key owner lease [WAIT ms] [TOKEN]`.
    fn acquire_cmd(&self, lease_ms: u64, wait_ms: Option<u64>, token: bool) -> redis::Cmd {
        let mut cmd = redis::cmd("RLOCK.ACQUIRE");
        cmd.arg(&*self.name).arg(&*self.owner).arg(lease_ms);
        if let Some(wait_ms) = wait_ms {
            cmd.arg("WAIT").arg(wait_ms);
        }
        if token {
            cmd.arg("TOKEN");
        }
        cmd
    }

    /// One non-blocking `RLOCK.ACQUIRE` on the shared connection.
    pub(crate) async fn try_once(&self, lease_ms: u64, token: bool) -> Result<Attempt> {
        let reply: redis::Value =
            self.acquire_cmd(lease_ms, None, token).query_async(&mut self.conn()).await?;
        Attempt::from_reply(&reply)
    }

    /// Releases one hold of this handle (the guard's `release` is the usual way).
    ///
    /// The release carries a request id, and is retried with the same id when the connection
    /// fails (the reply may have been lost after the server released): the server answers a
    /// retry with the first result, so a hold is never released twice and a successful release
    /// is never reported as "not held".
    pub(crate) async fn release_once(&self) -> Result<()> {
        let request = uuid::Uuid::new_v4().simple().to_string();
        let mut retries = RELEASE_RETRIES;
        loop {
            let reply: redis::RedisResult<Option<i64>> = redis::cmd("RLOCK.RELEASE")
                .arg(&*self.name)
                .arg(&*self.owner)
                .arg("REQUEST")
                .arg(&request)
                .query_async(&mut self.conn())
                .await;
            match reply {
                Ok(held) => return held.map(|_| ()).ok_or(Error::NotHeld),
                Err(e)
                    if retries > 0
                        && (e.is_io_error() || e.is_timeout() || e.is_connection_dropped()) =>
                {
                    retries -= 1;
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    pub(crate) async fn renew(&self, lease_ms: u64) -> Result<bool> {
        let renewed: i64 = redis::cmd("RLOCK.RENEW")
            .arg(&*self.name)
            .arg(&*self.owner)
            .arg(lease_ms)
            .query_async(&mut self.conn())
            .await?;
        Ok(renewed == 1)
    }

    /// Whether anyone holds the lock.
    ///
    /// # Errors
    /// [`Error::Redis`] when Redis fails.
    pub async fn is_locked(&self) -> Result<bool> {
        Ok(self.remaining_lease().await? != Remaining::NotLocked)
    }

    /// How many times this handle holds the lock (0: not held by this handle).
    ///
    /// # Errors
    /// [`Error::Redis`] when Redis fails.
    pub async fn hold_count(&self) -> Result<u64> {
        let count: Option<u64> = redis::cmd("HGET")
            .arg(&*self.name)
            .arg(&*self.owner)
            .query_async(&mut self.conn())
            .await?;
        Ok(count.unwrap_or(0))
    }

    /// The lock's remaining lease, whoever holds it.
    ///
    /// # Errors
    /// [`Error::Redis`] when Redis fails.
    pub async fn remaining_lease(&self) -> Result<Remaining> {
        let pttl: i64 =
            redis::cmd("RLOCK.PTTL").arg(&*self.name).query_async(&mut self.conn()).await?;
        Ok(match u64::try_from(pttl) {
            Ok(ms) => Remaining::Lease(Duration::from_millis(ms)),
            Err(_) if pttl == -1 => Remaining::NoExpiry,
            Err(_) => Remaining::NotLocked,
        })
    }

    /// Deletes the lock whoever holds it; `true` when there was one.
    ///
    /// # Errors
    /// [`Error::Redis`] when Redis fails.
    pub async fn force_release(&self) -> Result<bool> {
        let deleted: i64 =
            redis::cmd("RLOCK.FORCERELEASE").arg(&*self.name).query_async(&mut self.conn()).await?;
        Ok(deleted == 1)
    }
}

/// The receiving end of a server-side wait. If the caller drops the acquire future after the
/// waiting task sent a grant but before it was read, the grant would be lost with the channel:
/// on drop, the channel is closed (so a later send fails, and the sender releases) and a grant
/// already sent is released here. Exactly one side releases.
struct PendingGrant {
    reply: Option<oneshot::Receiver<Result<Attempt>>>,
    lock: Lock,
}

impl Drop for PendingGrant {
    fn drop(&mut self) {
        let Some(mut reply) = self.reply.take() else { return };
        reply.close();
        if let Ok(Ok(Attempt::Held { .. })) = reply.try_recv() {
            let lock = self.lock.clone();
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn(async move {
                    let _ = lock.release_once().await;
                });
            }
        }
    }
}

/// A guard's lease renewal (its watchdog), and the loss it reports: renews every third of the
/// lease until the lock is found gone, or until stopped (on release or drop). Errors are retried
/// while the lease may still be alive. Without a watchdog, no loss is ever reported.
pub(crate) struct Renewal {
    task: Option<JoinHandle<()>>,
    lost: watch::Receiver<bool>,
}

impl Renewal {
    /// No watchdog (a guard with an explicit lease).
    pub(crate) fn none() -> Self {
        Self { task: None, lost: watch::channel(false).1 }
    }

    /// Starts renewing with `renew` (`Ok(false)`: the lock is gone).
    pub(crate) fn start<F, Fut>(lease_ms: u64, renew: F) -> Self
    where
        F: Fn() -> Fut + Send + 'static,
        Fut: Future<Output = Result<bool>> + Send,
    {
        let (lost_tx, lost) = watch::channel(false);
        let task = tokio::spawn(async move {
            let lease = Duration::from_millis(lease_ms);
            let period = (lease / 3).max(Duration::from_millis(1));
            let mut renewed_at = Instant::now();
            loop {
                tokio::time::sleep(period).await;
                match renew().await {
                    Ok(true) => renewed_at = Instant::now(),
                    Ok(false) => break,
                    Err(_) if renewed_at.elapsed() < lease => {}
                    Err(_) => break,
                }
            }
            let _ = lost_tx.send(true);
        });
        Self { task: Some(task), lost }
    }

    /// Stops renewing.
    pub(crate) fn stop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }

    /// Whether the watchdog found the lock gone.
    pub(crate) fn is_lost(&self) -> bool {
        *self.lost.borrow()
    }

    /// Resolves when the watchdog finds the lock gone; never if it stops without a loss.
    pub(crate) async fn lost(&self) {
        let mut lost = self.lost.clone();
        if lost.wait_for(|&lost| lost).await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

impl Drop for Renewal {
    fn drop(&mut self) {
        self.stop();
    }
}

/// One hold of a lock. Release it with [`LockGuard::release`]; dropping it releases in the
/// background.
#[must_use = "dropping the guard releases the lock"]
pub struct LockGuard {
    lock: Lock,
    token: Option<u64>,
    renewal: Renewal,
    released: bool,
}

impl fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockGuard")
            .field("lock", &self.lock)
            .field("watchdog", &self.renewal.task.is_some())
            .field("lost", &self.renewal.is_lost())
            .finish()
    }
}

impl LockGuard {
    fn new(lock: Lock, lease_ms: u64, watchdog: bool, token: Option<u64>) -> Self {
        let renewal = if watchdog {
            let renewing = lock.clone();
            Renewal::start(lease_ms, move || {
                let lock = renewing.clone();
                async move { lock.renew(lease_ms).await }
            })
        } else {
            Renewal::none()
        };
        Self { lock, token, renewal, released: false }
    }

    /// The lock this guard holds.
    #[must_use]
    pub const fn lock(&self) -> &Lock {
        &self.lock
    }

    /// This grant's fencing token, with [`crate::Options::fencing`]: strictly greater than the
    /// token of every earlier grant of the same lock name. Send it with every write to the
    /// protected resource, which must refuse a write carrying a smaller token than one it has
    /// seen. `None` without the option.
    #[must_use]
    pub const fn token(&self) -> Option<u64> {
        self.token
    }

    /// Whether the watchdog found the lock gone (deleted, or taken over after its lease ran
    /// out). Always `false` for a guard with an explicit lease, which has no watchdog.
    #[must_use]
    pub fn is_lost(&self) -> bool {
        self.renewal.is_lost()
    }

    /// Resolves when the watchdog finds the lock gone; never, for a guard with an explicit
    /// lease (which has no watchdog).
    pub async fn lost(&self) {
        self.renewal.lost().await;
    }

    /// Releases this hold.
    ///
    /// # Errors
    /// [`Error::NotHeld`] when the lock was no longer held by this owner (its lease ran out, or
    /// it was force-released); [`Error::Redis`] when Redis fails.
    pub async fn release(mut self) -> Result<()> {
        self.released = true;
        self.renewal.stop(); // stops renewing first
        self.lock.release_once().await
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        self.renewal.stop();
        let lock = self.lock.clone();
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let _ = lock.release_once().await;
            });
        }
    }
}
