//! [`Lock`] handles and their [`LockGuard`]s: a thin layer over the hold engine
//! ([`crate::engine`]) for reentrant locks and the sides of read-write locks.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::engine::binding::Binding;
use crate::engine::chain::Chain;
use crate::engine::hold::Member;
use crate::engine::kind::Kind;
use crate::error::Result;
use crate::options::Remaining;
use crate::shared::Shared;

/// A handle on one named lock (or one side of a read-write lock). Clones share its holds (and
/// so re-enter).
///
/// Each continuous hold of the lock by a handle (the first grant, then its re-entries until
/// the last guard is released) is one server grant with an owner id of its own,
/// `<handle owner>:<n>`: a guard acts only on its own hold, so a guard that outlived its grant
/// (its lease ran out, the lock was deleted) never releases or renews a later hold of the same
/// handle. A re-entry joins the hold only after the server confirmed it on this side.
#[derive(Clone)]
pub struct Lock {
    chain: Arc<Chain>,
}

impl fmt::Debug for Lock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lock")
            .field("name", &String::from_utf8_lossy(self.name()))
            .field("owner", &self.owner())
            .field("kind", &self.chain.kind())
            .finish_non_exhaustive()
    }
}

impl Lock {
    /// A reentrant lock's handle with the owner id `owner` (`fixed`: every hold under it
    /// itself, an [`crate::Owner`]'s handle), its holds bound to `session`.
    pub(crate) fn new(
        shared: &Arc<Shared>,
        name: &Arc<[u8]>,
        owner: (Arc<str>, bool),
        session: Option<Arc<Binding>>,
    ) -> Self {
        Self { chain: Chain::new(shared, name, Kind::Lock, owner, session) }
    }

    /// A handle on an existing chain (an [`crate::Owner`]'s handles of one name share one).
    pub(crate) const fn from_chain(chain: Arc<Chain>) -> Self {
        Self { chain }
    }

    /// The two sides of a read-write lock (see [`Chain::pair`]).
    pub(crate) fn rw_pair(
        shared: &Arc<Shared>,
        name: &Arc<[u8]>,
        owner: (&str, bool),
        session: Option<&Arc<Binding>>,
    ) -> (Self, Self) {
        let (read, write) = Chain::pair(shared, name, owner, session);
        (Self { chain: read }, Self { chain: write })
    }

    pub(crate) const fn chain(&self) -> &Arc<Chain> {
        &self.chain
    }

    /// The lock's name (its Redis key).
    #[must_use]
    pub fn name(&self) -> &[u8] {
        self.chain.key()
    }

    /// This handle's owner id. Its holds are stored under `<owner>:<n>` (see
    /// [`LockGuard::owner`]); an [`crate::Owner`]'s handle's, under this id itself.
    #[must_use]
    pub fn owner(&self) -> &str {
        self.chain.owner()
    }

    fn conn(&self) -> crate::conn::Conn {
        self.chain.shared().conn.clone()
    }

    /// Takes the lock, waiting as long as it takes. `lease: None` uses the watchdog.
    ///
    /// # Errors
    /// [`crate::Error::ZeroLease`] for `Some(Duration::ZERO)`, [`crate::Error::InvalidArgument`]
    /// for a lease beyond [`crate::MAX_DURATION`] (nothing sent); [`crate::Error::TimedOut`] when
    /// the server did not answer in time (the attempt is then cancelled: nothing stays held);
    /// [`crate::Error::UpgradeRefused`] for a read-write lock's write side asked while the
    /// owner reads; [`crate::Error::Redis`] when Redis fails or refuses (`WRONGTYPE`, ...).
    pub async fn acquire(&self, lease: Option<Duration>) -> Result<LockGuard> {
        self.acquire_within(None, lease).await
    }

    /// Takes the lock, waiting at most `wait` (`Duration::ZERO`: one try; a `wait` beyond
    /// [`crate::MAX_DURATION`] waits without limit). Returns by `wait` plus half a second whatever the
    /// server does. `lease: None` uses the watchdog.
    ///
    /// # Errors
    /// [`crate::Error::TimedOut`] when `wait` passes first, or the server did not answer in
    /// time (the attempt is then cancelled: nothing stays held); otherwise as
    /// [`Lock::acquire`].
    pub async fn try_acquire(&self, wait: Duration, lease: Option<Duration>) -> Result<LockGuard> {
        self.acquire_within(crate::engine::deadline_after(wait), lease).await
    }

    async fn acquire_within(
        &self,
        deadline: Option<Instant>,
        lease: Option<Duration>,
    ) -> Result<LockGuard> {
        let member = self.chain.acquire(deadline, lease).await?;
        Ok(LockGuard { lock: self.clone(), member })
    }

    /// Whether anyone holds the lock.
    ///
    /// # Errors
    /// [`crate::Error::Redis`] when Redis fails (`WRONGTYPE` on a key of another type).
    pub async fn is_locked(&self) -> Result<bool> {
        Ok(self.remaining_lease().await? != Remaining::NotLocked)
    }

    /// How many live guards of this handle hold the lock (0: not held by this handle, or its
    /// hold was lost); for an [`crate::Owner`]'s handle, of all the owner's handles of this
    /// name and side (they share one hold).
    ///
    /// # Errors
    /// [`crate::Error::Redis`] when Redis fails (`WRONGTYPE` on a key of another type, as
    /// [`Lock::is_locked`]).
    pub async fn hold_count(&self) -> Result<u64> {
        self.chain.hold_count().await
    }

    /// The lock's remaining lease, whoever holds it.
    ///
    /// # Errors
    /// [`crate::Error::Redis`] when Redis fails.
    pub async fn remaining_lease(&self) -> Result<Remaining> {
        let pttl: i64 =
            redis::cmd("RLOCK.PTTL").arg(self.name()).query_async(&mut self.conn()).await?;
        Ok(match u64::try_from(pttl) {
            Ok(ms) => Remaining::Lease(Duration::from_millis(ms)),
            Err(_) if pttl == -1 => Remaining::NoExpiry,
            Err(_) => Remaining::NotLocked,
        })
    }

    /// Deletes the lock whoever holds it; `true` when there was one.
    ///
    /// # Errors
    /// [`crate::Error::Redis`] when Redis fails.
    pub async fn force_release(&self) -> Result<bool> {
        let cmd = self.chain.kind().force_release(self.name());
        let deleted: i64 = cmd.query_async(&mut self.conn()).await?;
        Ok(deleted == 1)
    }
}

/// One guard on a lock's hold (its first grant, or a re-entry of it). Release it with
/// [`LockGuard::release`]; dropping it releases it too, in the background (see `Drop`).
#[must_use = "dropping the guard releases the lock"]
pub struct LockGuard {
    lock: Lock,
    member: Member,
}

impl fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockGuard")
            .field("lock", &self.lock)
            .field("owner", &self.owner())
            .field("watchdog", &self.member.watchdog())
            .field("lost", &self.is_lost())
            .finish()
    }
}

impl LockGuard {
    /// The lock this guard holds.
    #[must_use]
    pub const fn lock(&self) -> &Lock {
        &self.lock
    }

    /// The owner id the server stores for this guard's hold (`<handle owner>:<n>`; every
    /// re-entry of one hold shares it; the two sides of one read-write lock share it while
    /// both hold; an [`crate::Owner`]'s id for every hold of its handles).
    #[must_use]
    pub fn owner(&self) -> &str {
        self.member.hold().owner().map_or("", |o| o)
    }

    /// This grant's fencing token, with [`crate::Options::fencing`]: strictly greater than the
    /// token of every earlier grant of the same lock name (re-entries of one hold share the
    /// hold's token). Send it with every write to the protected resource, which must refuse a
    /// write carrying a smaller token than one it has seen. `None` without the option, and for
    /// read holds.
    #[must_use]
    pub fn token(&self) -> Option<u64> {
        self.member.hold().token()
    }

    /// Whether the hold is lost: its deadline ([`LockGuard::valid_until`]) passed without a
    /// confirmation, or the server was found not to hold it (a renewal, re-entry or release
    /// of the same hold said so).
    #[must_use]
    pub fn is_lost(&self) -> bool {
        self.member.hold().is_lost()
    }

    /// Until when the hold is known valid, on this process's monotonic clock: the longest
    /// (send time + lease) the server confirmed for it, by its grant, a re-entry or a renewal.
    /// The server's lease cannot end before this moment; after it the hold counts as lost
    /// even if the server could not be asked. `None` once the hold is known lost.
    #[must_use]
    pub fn valid_until(&self) -> Option<Instant> {
        self.member.hold().until()
    }

    /// Resolves when the hold is lost (see [`LockGuard::is_lost`]): at the latest when
    /// [`LockGuard::valid_until`] passes without a confirmation.
    pub async fn lost(&self) {
        self.member.hold().lost().await;
    }

    /// Releases this guard: the last guard of a hold releases it on the server (retried with
    /// the same request id after a connection error); another one checks it is still held.
    ///
    /// # Errors
    /// [`crate::Error::NotHeld`] when this guard's hold was no longer held (its lease ran out,
    /// it was force-released; nothing is touched then); [`crate::Error::Redis`] when Redis
    /// fails (the release then goes on in the background).
    pub async fn release(self) -> Result<()> {
        self.member.release().await
    }
}

// Dropping a `LockGuard` drops its `Member`: the last guard of a hold hands its release to the
// client's background releaser, which never blocks the dropping thread and needs no runtime.
