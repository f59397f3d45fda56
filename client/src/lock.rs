//! One lock on one server: [`Lock`] handles, [`LockGuard`]s, the watchdog, server-side waits.

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use redis::RedisError;
use tokio::sync::{oneshot, watch};
use tokio::time::Instant;

use crate::conn::{Conn, Shared};
use crate::error::{Error, Result};
use crate::guard::GuardCore;
use crate::options::Remaining;
use crate::options::{millis, wait_budget};

/// Which lock a handle takes: a reentrant lock, or one side of a read-write lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Reentrant,
    Read,
    Write,
}

impl Kind {
    /// `RLOCK.<verb>` or `RWLOCK.<verb>`.
    fn prefixed(self, verb: &str) -> String {
        match self {
            Self::Reentrant => format!("RLOCK.{verb}"),
            Self::Read | Self::Write => format!("RWLOCK.{verb}"),
        }
    }

    /// The command `<verb> name owner [READ|WRITE]` of this kind (`RENEW` takes no mode).
    fn command(self, verb: &str, name: &[u8], owner: &str) -> redis::Cmd {
        let mut cmd = redis::cmd(&self.prefixed(verb));
        cmd.arg(name).arg(owner);
        match (self, verb) {
            (Self::Reentrant, _) | (_, "RENEW") => {}
            (Self::Read, _) => {
                cmd.arg("READ");
            }
            (Self::Write, _) => {
                cmd.arg("WRITE");
            }
        }
        cmd
    }

    /// The hash field of `owner`'s hold of this kind.
    fn field(self, owner: &str) -> String {
        match self {
            Self::Write => format!("{owner}:write"),
            Self::Reentrant | Self::Read => owner.to_owned(),
        }
    }
}

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
    pub(crate) fn from_reply(reply: &redis::Value) -> Result<Self> {
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
pub(crate) const MAX_REDIRECTS: usize = 5;

/// The node a MOVED or ASK error points to, and whether it was ASK.
pub(crate) fn redirection(e: &RedisError) -> Option<((String, u16), bool)> {
    let (address, _slot) = e.redirect_node()?;
    let (host, port) = address.rsplit_once(':')?;
    let ask = matches!(e.kind(), redis::ErrorKind::Server(redis::ServerErrorKind::Ask));
    Some(((host.to_owned(), port.parse().ok()?), ask))
}

/// A handle on one named lock. Clones share its holds (and so re-enter).
///
/// Each continuous hold of the lock by a handle (a *chain*: the first grant, then re-entries
/// until the last guard is released) has an owner id of its own, `<handle owner>:<chain>`.
/// Re-entries are counted here, one server hold per chain: a guard acts only on its own
/// chain's hold, so a guard that outlived its grant (its lease ran out, the lock was deleted)
/// can never release or renew a later hold of the same handle; and an acquire that did not
/// hand out a guard (cancelled, timed out) can be undone exactly, by releasing its own owner.
#[derive(Clone)]
pub struct Lock {
    pub(crate) shared: Arc<Shared>,
    pub(crate) name: Arc<[u8]>,
    pub(crate) owner: Arc<str>,
    /// A reentrant lock, or one side of a read-write lock.
    kind: Kind,
    /// The other side of a read-write lock (its holds), whose live chain's owner this handle's
    /// new chains take: the server then sees one owner, so a write holder may take read (and
    /// downgrade), and a read holder asking for write gets the upgrade refusal instead of
    /// waiting for itself.
    sibling: Option<std::sync::Weak<Mutex<Holds>>>,
    holds: Arc<Mutex<Holds>>,
    /// One acquire of the handle at a time: concurrent ones re-enter instead of racing.
    acquiring: Arc<tokio::sync::Mutex<()>>,
}

/// The holds of one handle (and its clones).
#[derive(Default)]
struct Holds {
    chain: Option<Chain>,
    /// Chains started so far (the last chain's number).
    started: u64,
}

/// One continuous hold of the lock by a handle.
struct Chain {
    id: u64,
    owner: Arc<str>,
    /// Live guards of this chain (the server counts one hold).
    guards: usize,
    token: Option<u64>,
    /// The latest moment a guard of the chain was promised the lock until (local clock):
    /// re-entries and renewals never set a shorter lease than this.
    until: Instant,
    /// Set when the chain is found lost; every guard of the chain watches it.
    lost: Arc<watch::Sender<bool>>,
}

impl Chain {
    fn remaining_ms(&self) -> u64 {
        millis(self.until.saturating_duration_since(Instant::now()))
    }
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
        Self {
            shared,
            name,
            owner,
            kind: Kind::Reentrant,
            sibling: None,
            holds: Arc::default(),
            acquiring: Arc::default(),
        }
    }

    /// The two sides of a read-write lock, with owner ids `<owner>:r` and `<owner>:w` (each
    /// chain adds `:<chain>`; a side whose other side holds takes that chain's owner).
    pub(crate) fn rw_pair(shared: &Arc<Shared>, name: Arc<[u8]>, owner: &str) -> (Self, Self) {
        let side = |kind, tag: &str| Self {
            kind,
            ..Self::new(Arc::clone(shared), Arc::clone(&name), Arc::from(format!("{owner}:{tag}")))
        };
        let (mut read, mut write) = (side(Kind::Read, "r"), side(Kind::Write, "w"));
        read.sibling = Some(Arc::downgrade(&write.holds));
        write.sibling = Some(Arc::downgrade(&read.holds));
        (read, write)
    }

    /// The owner of a new chain: the other side's live chain's, else a new one.
    fn chain_owner(&self, started: u64) -> Arc<str> {
        let sibling = self.sibling.as_ref().and_then(std::sync::Weak::upgrade);
        let shared = sibling.and_then(|holds| {
            let holds = holds.lock().unwrap_or_else(PoisonError::into_inner);
            holds.chain.as_ref().map(|c| Arc::clone(&c.owner))
        });
        shared.unwrap_or_else(|| Arc::from(format!("{}:{started}", self.owner)))
    }

    fn with_holds<R>(&self, f: impl FnOnce(&mut Holds) -> R) -> R {
        f(&mut self.holds.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// Until when chain `id` is known valid (`None`: it is no longer this handle's chain).
    fn chain_until(&self, id: u64) -> Option<Instant> {
        self.with_holds(|h| h.chain.as_ref().filter(|c| c.id == id).map(|c| c.until))
    }

    /// Marks chain `id` lost (its guards see it) and forgets it.
    fn lose_chain(&self, id: u64) {
        self.with_holds(|h| {
            if h.chain.as_ref().is_some_and(|c| c.id == id) {
                if let Some(chain) = h.chain.take() {
                    chain.lost.send_replace(true);
                }
            }
        });
    }

    /// The lock's name (its Redis key).
    #[must_use]
    pub fn name(&self) -> &[u8] {
        &self.name
    }

    pub(crate) fn options(&self) -> &crate::options::Options {
        &self.shared.options
    }

    /// This handle's owner id. Its holds are stored under `<owner>:<chain>` (see
    /// [`LockGuard::owner`]); MultiLock and RedLock use it as it is.
    #[must_use]
    pub fn owner(&self) -> &str {
        &self.owner
    }

    pub(crate) fn conn(&self) -> Conn {
        self.shared.conn.clone()
    }

    /// Takes the lock, waiting as long as it takes. `lease: None` uses the watchdog.
    ///
    /// # Errors
    /// [`Error::TimedOut`] when the server did not answer in time (the attempt is then undone:
    /// nothing stays held); [`Error::Redis`] when Redis fails.
    pub async fn acquire(&self, lease: Option<Duration>) -> Result<LockGuard> {
        self.acquire_within(None, lease).await
    }

    /// Takes the lock, waiting at most `wait` (a `wait` too large to add to now waits without
    /// limit). `lease: None` uses the watchdog.
    ///
    /// # Errors
    /// [`Error::TimedOut`] when `wait` passes first, or the server did not answer in time (the
    /// attempt is then undone: nothing stays held); [`Error::Redis`] when Redis fails.
    pub async fn try_acquire(&self, wait: Duration, lease: Option<Duration>) -> Result<LockGuard> {
        self.acquire_within(Instant::now().checked_add(wait), lease).await
    }

    async fn acquire_within(
        &self,
        deadline: Option<Instant>,
        lease: Option<Duration>,
    ) -> Result<LockGuard> {
        let watchdog = lease.is_none();
        let lease = lease.unwrap_or(self.shared.options.watchdog_timeout);
        let lease_ms = millis(lease);
        let _turn = match deadline {
            None => self.acquiring.lock().await,
            Some(deadline) => tokio::time::timeout_at(deadline, self.acquiring.lock())
                .await
                .map_err(|_| Error::TimedOut)?,
        };
        if let Some(guard) = self.reenter(lease_ms, watchdog).await? {
            return Ok(guard);
        }
        let id = self.with_holds(|h| {
            h.started += 1;
            h.started
        });
        let owner = self.chain_owner(id);
        let asked_at = Instant::now();
        let token = self.grant(&owner, lease_ms, deadline).await?;
        let lost = Arc::new(watch::channel(false).0);
        self.with_holds(|h| {
            h.chain = Some(Chain {
                id,
                owner: Arc::clone(&owner),
                guards: 1,
                token,
                until: asked_at + lease,
                lost: Arc::clone(&lost),
            });
        });
        Ok(LockGuard::new(self.clone(), id, owner, token, (lease_ms, asked_at), watchdog, &lost))
    }

    /// Re-enters the handle's current chain, if any, once the server confirms the chain still
    /// holds the lock (`RLOCK.RENEW`, with a lease no shorter than any guard of the chain was
    /// promised). A chain the server no longer holds is marked lost (its guards see it).
    /// Cancel-safe: the renewal only extends a hold the chain's guards own.
    async fn reenter(&self, lease_ms: u64, watchdog: bool) -> Result<Option<LockGuard>> {
        let Some((id, owner, needed_ms)) = self.with_holds(|h| {
            h.chain.as_ref().map(|c| (c.id, Arc::clone(&c.owner), lease_ms.max(c.remaining_ms())))
        }) else {
            return Ok(None);
        };
        let sent = Instant::now();
        let held = self.renew_as(&owner, needed_ms).await?;
        if !held {
            self.lose_chain(id);
            return Ok(None);
        }
        let joined = self.with_holds(|h| match &mut h.chain {
            Some(c) if c.id == id => {
                c.guards += 1;
                c.until = c.until.max(sent + Duration::from_millis(needed_ms));
                Some((c.token, Arc::clone(&c.lost)))
            }
            _ => None, // the chain ended meanwhile: start a new one
        });
        Ok(joined.map(|(token, lost)| {
            LockGuard::new(self.clone(), id, owner, token, (lease_ms, sent), watchdog, &lost)
        }))
    }

    /// Takes the lock for a new chain's `owner` (nobody else's): one try on the shared
    /// connection, then a server-side wait. Whatever ends it without a grant for the caller (a
    /// dropped future, a lost reply, a failed replica acknowledgement) leaves nothing held.
    async fn grant(
        &self,
        owner: &Arc<str>,
        lease_ms: u64,
        deadline: Option<Instant>,
    ) -> Result<Option<u64>> {
        let fencing = self.shared.options.fencing;
        // Uncontended: one try on the shared connection (which then also waits for replicas).
        // In a cluster, replica acknowledgement must run on the node's own connection: the
        // server-side path does that, and returns at once when the lock is free.
        let options = &self.shared.options;
        let ack_in_cluster = (options.replica_ack.is_some() || options.aof_ack.is_some())
            && self.shared.target.is_cluster();
        if !ack_in_cluster {
            let attempt = self.try_settled(owner, lease_ms, fencing);
            let attempt = match deadline {
                None => attempt.await?,
                // Dropping the attempt at the deadline leaves the task to undo any grant.
                Some(d) => {
                    tokio::time::timeout_at(d, attempt).await.map_err(|_| Error::TimedOut)??
                }
            };
            if let Attempt::Held { token } = attempt {
                return Ok(token);
            }
        }
        // Contended: the server queues us and hands the lock over (FIFO) when it is free.
        let wait_ms = wait_budget(deadline)?;
        match self.wait_on_server_as(owner, lease_ms, wait_ms, fencing).await? {
            Attempt::Held { token } => Ok(token),
            Attempt::Busy { .. } => Err(Error::TimedOut),
        }
    }

    /// One non-blocking try (and the replica acknowledgement after a grant) for `owner`, run by
    /// a task of its own: if the caller drops this future, or the reply is lost (a response
    /// timeout, a broken connection), the task releases `owner`'s hold. The owner is this
    /// attempt's alone, so that undoes exactly this attempt, and touches nothing if it was not
    /// granted; on the same connection, the release is ordered after the acquire.
    async fn try_settled(&self, owner: &Arc<str>, lease_ms: u64, fencing: bool) -> Result<Attempt> {
        let (reply_tx, reply_rx) = oneshot::channel();
        let lock = self.clone();
        let attempt_owner = Arc::clone(owner);
        tokio::spawn(async move {
            let owner = attempt_owner;
            let mut result = lock.try_once_as(&owner, lease_ms, fencing).await;
            if result.as_ref().is_ok_and(|a| a.is_held()) {
                if let Err(e) = lock.replicated_as(&owner, &mut lock.conn()).await {
                    result = Err(e); // released by `replicated_as`
                }
            }
            let unanswered = matches!(&result, Err(Error::Redis(e))
                if e.is_timeout() || e.is_io_error() || e.is_connection_dropped());
            if unanswered {
                // The reply was lost, not the command: it may still run. Answer now, then undo.
                let _ = reply_tx.send(Err(Error::TimedOut));
                lock.undo(&owner).await;
            } else if let Err(Ok(Attempt::Held { .. })) = reply_tx.send(result) {
                let _ = lock.release_as(&owner).await; // the caller went away
            }
        });
        self.settle(reply_rx, owner).await
    }

    /// Undoes an attempt of `owner` (this attempt's alone) whose reply was lost: the command may
    /// have run, or may still run (a stalled server runs what it had read; after a reconnect the
    /// release may even be read first). Releasing `owner` touches nothing when it holds nothing,
    /// so it is released again a few times over the next seconds, until one release finds it.
    pub(crate) async fn undo(&self, owner: &str) {
        for delay_ms in [0, 50, 250, 1_000, 3_000] {
            tokio::time::sleep(Duration::from_millis(delay_ms)).await;
            if self.release_as(owner).await.is_ok() {
                return;
            }
        }
    }

    /// Reads a grant from a task, releasing it if this future is dropped before it is read.
    pub(crate) async fn settle(
        &self,
        reply: oneshot::Receiver<Result<Attempt>>,
        owner: &Arc<str>,
    ) -> Result<Attempt> {
        let mut pending =
            PendingGrant { reply: Some(reply), lock: self.clone(), owner: Arc::clone(owner) };
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

    /// With [`crate::Options::replica_ack`]: waits for the replicas to acknowledge the writes of
    /// `con` (the grant just made); too few: releases the hold and fails.
    pub(crate) async fn replicated_as<C: redis::aio::ConnectionLike + Send>(
        &self,
        owner: &str,
        con: &mut C,
    ) -> Result<()> {
        let checked = self.acknowledged(con).await;
        if checked.is_err() {
            let _ = self.release_as(owner).await;
        }
        checked
    }

    /// `WAIT` ([`crate::Options::replica_ack`]), then `WAITAOF` ([`crate::Options::aof_ack`]).
    async fn acknowledged<C: redis::aio::ConnectionLike + Send>(&self, con: &mut C) -> Result<()> {
        if let Some((wanted, timeout)) = self.shared.options.replica_ack {
            let acknowledged: u32 =
                redis::cmd("WAIT").arg(wanted).arg(millis(timeout)).query_async(con).await?;
            if acknowledged < wanted {
                return Err(Error::NotReplicated { wanted, acknowledged });
            }
        }
        if let Some(aof) = self.shared.options.aof_ack {
            let (local, replicas): (u32, u32) = redis::cmd("WAITAOF")
                .arg(u32::from(aof.local))
                .arg(aof.replicas)
                .arg(millis(aof.timeout))
                .query_async(con)
                .await?;
            if (aof.local && local == 0) || replicas < aof.replicas {
                return Err(Error::NotPersisted {
                    local: (aof.local, local > 0),
                    replicas: (aof.replicas, replicas),
                });
            }
        }
        Ok(())
    }

    /// `RLOCK.ACQUIRE key owner lease [WAIT ms] [TOKEN]`.
    pub(crate) fn acquire_cmd(
        &self,
        owner: &str,
        lease_ms: u64,
        wait_ms: Option<u64>,
        token: bool,
    ) -> redis::Cmd {
        let mut cmd = self.kind.command("ACQUIRE", &self.name, owner);
        cmd.arg(lease_ms);
        if let Some(wait_ms) = wait_ms {
            cmd.arg("WAIT").arg(wait_ms);
        }
        // A read hold takes no token (the server refuses TOKEN with READ).
        if token && self.kind != Kind::Read {
            cmd.arg("TOKEN");
        }
        cmd
    }

    /// One non-blocking `RLOCK.ACQUIRE` for the handle's own owner id (MultiLock, RedLock).
    pub(crate) async fn try_once(&self, lease_ms: u64, token: bool) -> Result<Attempt> {
        self.try_once_as(&self.owner, lease_ms, token).await
    }

    /// One non-blocking `RLOCK.ACQUIRE` for `owner` on the shared connection.
    async fn try_once_as(&self, owner: &str, lease_ms: u64, token: bool) -> Result<Attempt> {
        let reply: redis::Value =
            self.acquire_cmd(owner, lease_ms, None, token).query_async(&mut self.conn()).await?;
        Attempt::from_reply(&reply)
    }

    /// Releases one hold of this handle (the guard's `release` is the usual way).
    ///
    /// The release carries a request id, and is retried with the same id when the connection
    /// fails (the reply may have been lost after the server released): the server answers a
    /// retry with the first result, so a hold is never released twice and a successful release
    /// is never reported as "not held".
    pub(crate) async fn release_once(&self) -> Result<()> {
        self.release_as(&self.owner).await
    }

    /// Releases one hold of `owner`, as [`Self::release_once`].
    pub(crate) async fn release_as(&self, owner: &str) -> Result<()> {
        let request = uuid::Uuid::new_v4().simple().to_string();
        let mut retries = RELEASE_RETRIES;
        loop {
            let reply: redis::RedisResult<Option<i64>> = self
                .kind
                .command("RELEASE", &self.name, owner)
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
        self.renew_as(&self.owner, lease_ms).await
    }

    async fn renew_as(&self, owner: &str, lease_ms: u64) -> Result<bool> {
        let mut renew = self.kind.command("RENEW", &self.name, owner);
        let renewed: i64 = renew.arg(lease_ms).query_async(&mut self.conn()).await?;
        Ok(renewed == 1)
    }

    /// Whether `owner` holds the lock on the server.
    async fn holds_as(&self, owner: &str) -> Result<bool> {
        let field = self.kind.field(owner);
        let held: bool =
            redis::cmd("HEXISTS").arg(&*self.name).arg(field).query_async(&mut self.conn()).await?;
        Ok(held)
    }

    /// Renews chain `id` for a watchdog: never shorter than the chain was promised; a chain that
    /// is no longer this handle's, or that the server no longer holds, is lost.
    async fn renew_chain(&self, id: u64, owner: &str, lease_ms: u64) -> Result<bool> {
        let Some(needed_ms) = self.with_holds(|h| match &h.chain {
            Some(c) if c.id == id => Some(lease_ms.max(c.remaining_ms())),
            _ => None,
        }) else {
            return Ok(false);
        };
        let sent = Instant::now();
        let renewed = self.renew_as(owner, needed_ms).await?;
        if renewed {
            self.with_holds(|h| {
                if let Some(c) = h.chain.as_mut().filter(|c| c.id == id) {
                    c.until = c.until.max(sent + Duration::from_millis(needed_ms));
                }
            });
        } else {
            self.lose_chain(id);
        }
        Ok(renewed)
    }

    /// Gives back one guard of chain `id`: the last one releases the chain's hold on the
    /// server (in a task of its own, so a dropped future cannot leave it held); the others
    /// only check that the hold is still there. A stale guard touches nothing.
    async fn release_guard(&self, id: u64, owner: &Arc<str>) -> Result<()> {
        enum Step {
            Stale,
            Others,
            Last,
        }
        let step = self.with_holds(|h| match &mut h.chain {
            Some(c) if c.id == id && c.guards > 1 => {
                c.guards -= 1;
                Step::Others
            }
            Some(c) if c.id == id => {
                h.chain = None;
                Step::Last
            }
            _ => Step::Stale,
        });
        match step {
            Step::Stale => Err(Error::NotHeld),
            Step::Others => {
                if self.holds_as(owner).await? {
                    Ok(())
                } else {
                    self.lose_chain(id);
                    Err(Error::NotHeld)
                }
            }
            Step::Last => {
                let (lock, owner) = (self.clone(), Arc::clone(owner));
                let release = tokio::spawn(async move { lock.release_as(&owner).await });
                release.await.unwrap_or_else(|e| {
                    Err(Error::Redis(RedisError::from((
                        redis::ErrorKind::Io,
                        "the release task failed",
                        e.to_string(),
                    ))))
                })
            }
        }
    }

    /// Whether anyone holds the lock.
    ///
    /// # Errors
    /// [`Error::Redis`] when Redis fails.
    pub async fn is_locked(&self) -> Result<bool> {
        Ok(self.remaining_lease().await? != Remaining::NotLocked)
    }

    /// How many live guards of this handle hold the lock (0: not held by this handle, or its
    /// hold was lost).
    ///
    /// # Errors
    /// [`Error::Redis`] when Redis fails.
    pub async fn hold_count(&self) -> Result<u64> {
        let Some((id, owner, guards)) =
            self.with_holds(|h| h.chain.as_ref().map(|c| (c.id, Arc::clone(&c.owner), c.guards)))
        else {
            return Ok(0);
        };
        if self.holds_as(&owner).await? {
            Ok(guards as u64)
        } else {
            self.lose_chain(id);
            Ok(0)
        }
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
        let deleted: i64 = redis::cmd(&self.kind.prefixed("FORCERELEASE"))
            .arg(&*self.name)
            .query_async(&mut self.conn())
            .await?;
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
    owner: Arc<str>,
}

impl Drop for PendingGrant {
    fn drop(&mut self) {
        let Some(mut reply) = self.reply.take() else { return };
        reply.close();
        if let Ok(Ok(Attempt::Held { .. })) = reply.try_recv() {
            let until = crate::releaser::until_after(self.lock.options().watchdog_timeout);
            self.lock.release_later(&self.owner, until);
        }
    }
}

/// One hold of a lock (one grant of its chain, see [`Lock`]). Release it with
/// [`LockGuard::release`]; dropping it releases it too, in the background (see `Drop`).
#[must_use = "dropping the guard releases the lock"]
pub struct LockGuard {
    lock: Lock,
    chain: u64,
    owner: Arc<str>,
    token: Option<u64>,
    core: GuardCore,
}

impl fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockGuard")
            .field("lock", &self.lock)
            .field("owner", &self.owner)
            .field("watchdog", &self.core.watchdog())
            .field("lost", &self.core.is_lost())
            .finish()
    }
}

impl LockGuard {
    fn new(
        lock: Lock,
        chain: u64,
        owner: Arc<str>,
        token: Option<u64>,
        (lease_ms, since): (u64, Instant),
        watchdog: bool,
        lost: &Arc<watch::Sender<bool>>,
    ) -> Self {
        let (renewing, renewing_owner) = (lock.clone(), Arc::clone(&owner));
        let core = GuardCore::new(watchdog, (lease_ms, since), lost, move || {
            let (lock, owner) = (renewing.clone(), Arc::clone(&renewing_owner));
            async move { lock.renew_chain(chain, &owner, lease_ms).await }
        });
        Self { lock, chain, owner, token, core }
    }

    /// The lock this guard holds.
    #[must_use]
    pub const fn lock(&self) -> &Lock {
        &self.lock
    }

    /// The owner id the server stores for this guard's hold (`<handle owner>:<chain>`; every
    /// re-entry of one chain shares it).
    #[must_use]
    pub fn owner(&self) -> &str {
        &self.owner
    }

    /// This grant's fencing token, with [`crate::Options::fencing`]: strictly greater than the
    /// token of every earlier grant of the same lock name (re-entries of one hold share the
    /// hold's token). Send it with every write to the protected resource, which must refuse a
    /// write carrying a smaller token than one it has seen. `None` without the option.
    #[must_use]
    pub const fn token(&self) -> Option<u64> {
        self.token
    }

    /// Whether the hold is lost: its lease ran out on this process's clock (see
    /// [`LockGuard::valid_until`]), or the lock was found gone (deleted, or taken over) by this
    /// guard's watchdog, or by another guard, re-entry or release of the same hold.
    #[must_use]
    pub fn is_lost(&self) -> bool {
        self.core.is_lost() || self.valid_until().is_none_or(|until| until <= Instant::now())
    }

    /// Until when the hold is known valid, on this process's monotonic clock: the moment its
    /// grant was asked for plus the lease, pushed later only by renewals (and re-entries) the
    /// server confirmed, each from the moment it was sent. The server's lease cannot end
    /// before this moment, so work done before it is covered; after it the hold counts as lost
    /// even if the server (or a server that took over after a failover) could not be asked.
    /// `None` once the hold is known lost.
    #[must_use]
    pub fn valid_until(&self) -> Option<Instant> {
        if self.core.is_lost() {
            return None;
        }
        self.lock.chain_until(self.chain)
    }

    /// Resolves when the hold is lost (see [`LockGuard::is_lost`]): at the latest when
    /// [`LockGuard::valid_until`] passes without a confirmed renewal.
    pub async fn lost(&self) {
        loop {
            let Some(until) = self.valid_until() else { return };
            if until <= Instant::now() {
                return;
            }
            tokio::select! {
                () = self.core.lost() => return,
                () = tokio::time::sleep_until(until) => {}
            }
        }
    }

    /// Releases this hold.
    ///
    /// # Errors
    /// [`Error::NotHeld`] when this guard's hold was no longer held (its lease ran out, it was
    /// force-released, or the handle's later hold replaced it; nothing is touched then);
    /// [`Error::Redis`] when Redis fails.
    pub async fn release(mut self) -> Result<()> {
        self.core.give_back(); // stops renewing first
        self.lock.release_guard(self.chain, &self.owner).await
    }
}

impl Drop for LockGuard {
    /// Gives the hold back without blocking: the last guard of a hold hands its release to the
    /// client's background releaser (its own thread and connections, routed to the server that
    /// serves the lock now, retried until the hold's lease would have ended anyway), so a guard
    /// dropped outside any runtime, at the end of `main` or while a runtime shuts down is
    /// released all the same.
    fn drop(&mut self) {
        if self.core.give_back() {
            self.lock.drop_guard(self.chain, &self.owner);
        }
    }
}

impl Lock {
    /// A guard dropped without `release`: as [`Lock::release_guard`], the release sent by the
    /// background releaser.
    fn drop_guard(&self, id: u64, owner: &str) {
        let last = self.with_holds(|h| match &mut h.chain {
            Some(c) if c.id == id && c.guards > 1 => {
                c.guards -= 1;
                None
            }
            Some(c) if c.id == id => h.chain.take().map(|c| c.until),
            _ => None,
        });
        if let Some(until) = last {
            self.release_later(owner, until.into_std());
        }
    }

    /// Releases one hold of `owner` in the background (the client's releaser), with a request
    /// id of its own so that its retries release at most once; tried until `until` (the hold's
    /// lease end, on this process's clock) or a reply.
    pub(crate) fn release_later(&self, owner: &str, until: std::time::Instant) {
        let mut release = self.kind.command("RELEASE", &self.name, owner);
        release.arg("REQUEST").arg(uuid::Uuid::new_v4().simple().to_string());
        self.shared.releaser.submit(Arc::clone(&self.name), release, until, None);
    }
}
