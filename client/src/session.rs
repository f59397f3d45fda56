//! [`Session`]: one dedicated connection whose locks are session holds (`SESSION`): the server
//! ends them as soon as that connection closes, and the client marks their guards lost.

use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use crate::conn::Target;
use crate::engine::binding::Binding;
use crate::error::{Error, Result};
use crate::leased::LeasedSemaphore;
use crate::lock::Lock;
use crate::owner::Owner;
use crate::rwlock::RwLock;
use crate::semaphore::Semaphore;
use crate::shared::Shared;

/// Settings of a [`Session`] ([`crate::LockClient::session_with`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct SessionOptions {
    /// `LOCKDELAY`: after a hold ends because the session's connection closed (never after a
    /// release), nobody is granted the lock for this long (at most 60 s, and never beyond the
    /// hold's own lease). Default: zero (none).
    pub lock_delay: Duration,
    /// While no acquire is in flight on the session's connection, a `PING` every `keepalive`;
    /// one not answered within `keepalive` closes the session. Default 1 s: a server that
    /// stops answering (or a cut network) closes an idle session within two periods.
    pub keepalive: Duration,
}

impl Default for SessionOptions {
    fn default() -> Self {
        Self { lock_delay: Duration::ZERO, keepalive: Duration::from_secs(1) }
    }
}

impl SessionOptions {
    /// Sets [`SessionOptions::lock_delay`].
    #[must_use]
    pub const fn lock_delay(mut self, delay: Duration) -> Self {
        self.lock_delay = delay;
        self
    }

    /// Sets [`SessionOptions::keepalive`].
    #[must_use]
    pub const fn keepalive(mut self, period: Duration) -> Self {
        self.keepalive = period;
        self
    }
}

/// A session: one connection of its own to the master, whose [`Lock`]s, [`RwLock`] sides and
/// [`LeasedSemaphore`] permits are *session holds*: the server ends them as soon as the
/// connection closes (the process died, the session was dropped, `CLIENT KILL`, a restart),
/// serving their waiters at once, instead of at the end of their lease. The lease stays the
/// upper bound.
///
/// - Acquires (tries and server-side waits) run on the session's connection, so every grant
///   binds to it; a `WAIT` blocks that connection, so the session's acquires are served one
///   after the other while one waits (use one session per concurrent waiter if that matters).
///   Renewals (the watchdog, re-entries) and releases use the client's shared connections, as
///   for any lock: they keep the binding, and never wait behind a blocked `WAIT`.
/// - When the connection closes or fails, or stops answering the keepalive
///   ([`SessionOptions::keepalive`]; the connection is then also killed on the server, where a
///   connection that died silently stays open with its holds), or a wait on it is found dead
///   (its grant made and no answer: see the crate docs), every guard taken through the session
///   is lost at once
///   (`is_lost`, `lost()`), [`Session::closed`] resolves, and every later acquire through it
///   fails with [`Error::SessionClosed`]. A session never reconnects: a new connection would be
///   a new binding. Open a new session.
/// - Dropping the session closes its connection: its holds end on the server, its guards are
///   lost. Handles made from it outlive it, and refuse to acquire.
///
/// Cancellation stays exact: an acquire dropped while it waits is cancelled with
/// `RLOCK.CANCEL` (which also frees the session's connection). Sessions are not available on a
/// cluster client ([`Error::SessionUnsupported`]).
///
/// ```no_run
/// # async fn example(client: rlock_client::LockClient) -> Result<(), rlock_client::Error> {
/// let session = client.session().await?;
/// let guard = session.lock("orders:42").acquire(None).await?;
/// tokio::select! {
///     () = session.closed() => println!("the connection closed: the lock is gone"),
///     () = tokio::time::sleep(std::time::Duration::from_secs(1)) => guard.release().await?,
/// }
/// # Ok(()) }
/// ```
pub struct Session {
    shared: Arc<Shared>,
    binding: Arc<Binding>,
}

impl fmt::Debug for Session {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Session")
            .field("client_id", &self.binding.client_id())
            .field("closed", &self.is_closed())
            .finish_non_exhaustive()
    }
}

impl Session {
    /// Opens a session on the server of `shared` (the master a Sentinel group names now, asked
    /// afresh: the client's cached one may have been replaced without its shared connection
    /// seeing an error yet).
    pub(crate) async fn open(shared: &Arc<Shared>, options: &SessionOptions) -> Result<Self> {
        let client = match &shared.target {
            Target::Single(client) => client.clone(),
            Target::Sentinel(sentinel) => sentinel.fresh_master().await?,
            Target::Cluster(_) => return Err(Error::SessionUnsupported),
        };
        let binding = Binding::open(&client, options.lock_delay, options.keepalive).await?;
        Ok(Self { shared: Arc::clone(shared), binding })
    }

    fn next_owner(&self) -> String {
        let n = self.shared.next_handle.fetch_add(1, Ordering::Relaxed);
        format!("{}:{n}", self.shared.id)
    }

    /// A handle on the lock `name` whose holds are bound to this session, with a new owner id.
    #[must_use]
    pub fn lock(&self, name: impl AsRef<[u8]>) -> Lock {
        let owner = self.next_owner();
        Lock::new(
            &self.shared,
            &name.as_ref().into(),
            (owner.into(), false),
            Some(Arc::clone(&self.binding)),
        )
    }

    /// A read-write lock named `name` whose read and write holds are bound to this session.
    #[must_use]
    pub fn rw_lock(&self, name: impl AsRef<[u8]>) -> RwLock {
        let owner = self.next_owner();
        let (read, write) = Lock::rw_pair(
            &self.shared,
            &name.as_ref().into(),
            (&owner, false),
            Some(&self.binding),
        );
        RwLock::new(read, write)
    }

    /// A new [`Owner`] whose locks are bound to this session (see [`crate::LockClient::owner`]).
    #[must_use]
    pub fn owner(&self) -> Owner {
        Owner::new(&self.shared, Some(Arc::clone(&self.binding)))
    }

    /// A semaphore named `name` whose leased permits are bound to this session.
    #[must_use]
    pub fn leased_semaphore(&self, name: impl AsRef<[u8]>) -> LeasedSemaphore {
        let sem = Semaphore::new(Arc::clone(&self.shared), name.as_ref().into());
        let watchdog = self.shared.options.watchdog_timeout;
        LeasedSemaphore::new(sem, watchdog, Some(Arc::clone(&self.binding)))
    }

    /// The server's id of the session's connection (`CLIENT ID`; `None` when the user may not
    /// ask): `CLIENT KILL ID <id>` ends the session's holds.
    #[must_use]
    pub fn client_id(&self) -> Option<i64> {
        self.binding.client_id()
    }

    /// Whether the session is closed (its connection closed, failed or stopped answering).
    #[must_use]
    pub fn is_closed(&self) -> bool {
        self.binding.is_closed()
    }

    /// Resolves once the session is closed; every guard taken through it is lost by then.
    pub async fn closed(&self) {
        self.binding.closed().await;
    }

    /// Closes the session now, as dropping it does: its connection closes (the server ends
    /// its holds), its guards are lost.
    pub fn close(self) {
        drop(self);
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        self.binding.close();
    }
}
