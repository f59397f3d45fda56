//! Re-entry for locks and the sides of a read-write lock: a handle's *chain* is its current
//! [`Hold`] (one server grant, count 1 on the server), which its re-entries join as guards.
//!
//! A re-entry joins only after the server confirmed that exact hold on that exact side
//! (`RLOCK.RENEW key owner ms`, `RWLOCK.RENEW key owner ms READ|WRITE`), renewed to at least
//! the re-entry's lease and never below what the hold's guards were promised; a hold the server
//! no longer has is marked lost and a new one is taken, under an owner id of its own
//! (`<handle owner>:<n>`), so a stale guard never acts on a later hold. The two sides of one
//! read-write lock share the owner of the other side's live hold (write → read re-entry and
//! downgrade, as Redisson's thread does; read → write is the upgrade the server refuses).
//!
//! A chain with a *fixed* owner (an [`crate::Owner`]'s handle) stores every hold, on either
//! side, under that owner id itself, as a Redisson thread does: the server sees all the
//! owner's holds and waits as one party (its wait-for graph). The owner makes one chain per
//! name and side for all its handles (while any handle or guard keeps it), so its holds of one
//! lock are one [`Hold`] on the client as on the server: a nested acquire through another
//! handle re-enters it, and no lease sent for it ends it before any live guard's deadline. A
//! MultiLock or RedLock grant over such a handle takes a fresh owner id
//! ([`Chain::fresh_owner`]). The server cannot tell a later hold of the owner from an earlier
//! one, so a hold of it known lost sends a release only while its count may still be on the
//! server ([`Hold::may_remain`]), and the owner's next hold on that side waits until that
//! release was answered ([`Hold::released`]); while its guards live (and so no release is
//! sent), the owner's next hold on that side takes over whatever count of it the server still
//! has ([`Chain::adopt`], [`Hold::claim`]), so that count never stays held by nobody.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use tokio::time::Instant;

use crate::engine::binding::Binding;
use crate::engine::hold::{after, Hold, Member};
use crate::engine::kind::{Holder, Kind};
use crate::engine::request::Request;
use crate::engine::{bound, checked_lease, connection_lost, millis, resume, within};
use crate::error::{Error, Result};
use crate::shared::Shared;

/// One handle's holds of one lock (or one side of a read-write lock), shared by its clones.
pub(crate) struct Chain {
    shared: Arc<Shared>,
    key: Arc<[u8]>,
    kind: Kind,
    /// The handle's owner id; each hold adds `:<n>`, unless `fixed`.
    owner: Arc<str>,
    /// Every hold is stored under `owner` itself (an [`crate::Owner`]'s handle).
    fixed: bool,
    current: Mutex<Option<Hold>>,
    /// Owner numbers drawn so far.
    drawn: AtomicU64,
    /// One acquire of the handle at a time: concurrent ones re-enter instead of racing.
    turn: tokio::sync::Mutex<()>,
    /// The other side of a read-write lock.
    sibling: Mutex<Weak<Chain>>,
    /// The session its holds are bound to (`SESSION`), if any.
    session: Option<Arc<Binding>>,
}

impl Chain {
    /// A handle's chain of `kind` (a lock, or one side) on `key` for `owner`, its holds bound
    /// to `session` if given; `fixed`: every hold under `owner` itself.
    pub(crate) fn new(
        shared: &Arc<Shared>,
        key: &Arc<[u8]>,
        kind: Kind,
        (owner, fixed): (Arc<str>, bool),
        session: Option<Arc<Binding>>,
    ) -> Arc<Self> {
        Arc::new(Self {
            shared: Arc::clone(shared),
            key: Arc::clone(key),
            kind,
            owner,
            fixed,
            current: Mutex::new(None),
            drawn: AtomicU64::new(0),
            turn: tokio::sync::Mutex::new(()),
            sibling: Mutex::new(Weak::new()),
            session,
        })
    }

    /// The two sides of a read-write lock (owners `<owner>:r` and `<owner>:w`, each sharing
    /// the other's live hold's owner; `fixed`: both `owner` itself).
    pub(crate) fn pair(
        shared: &Arc<Shared>,
        key: &Arc<[u8]>,
        (owner, fixed): (&str, bool),
        session: Option<&Arc<Binding>>,
    ) -> (Arc<Self>, Arc<Self>) {
        let side = |suffix: &str| -> (Arc<str>, bool) {
            (if fixed { Arc::from(owner) } else { Arc::from(format!("{owner}:{suffix}")) }, fixed)
        };
        let read = Self::new(shared, key, Kind::Read, side("r"), session.cloned());
        let write = Self::new(shared, key, Kind::Write, side("w"), session.cloned());
        Self::link(&read, &write);
        (read, write)
    }

    /// Makes `read` and `write` the two sides of one read-write lock.
    pub(crate) fn link(read: &Arc<Self>, write: &Arc<Self>) {
        *read.sibling.lock().unwrap_or_else(PoisonError::into_inner) = Arc::downgrade(write);
        *write.sibling.lock().unwrap_or_else(PoisonError::into_inner) = Arc::downgrade(read);
    }

    /// The other side of a read-write lock, while something keeps it.
    fn sibling(&self) -> Option<Arc<Self>> {
        self.sibling.lock().unwrap_or_else(PoisonError::into_inner).upgrade()
    }

    /// The client's shared parts.
    pub(crate) const fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// The key.
    pub(crate) const fn key(&self) -> &Arc<[u8]> {
        &self.key
    }

    /// What it takes.
    pub(crate) const fn kind(&self) -> Kind {
        self.kind
    }

    /// The handle's owner id.
    pub(crate) const fn owner(&self) -> &Arc<str> {
        &self.owner
    }

    /// The session its holds are bound to, if any.
    pub(crate) fn session(&self) -> Option<Arc<Binding>> {
        self.session.clone()
    }

    /// A fresh owner id of this handle, `<owner>:<n>` (a new hold's, a MultiLock grant's); a
    /// fixed owner's chain: the owner itself.
    pub(crate) fn next_owner(&self) -> Arc<str> {
        if self.fixed {
            return Arc::clone(&self.owner);
        }
        let n = self.drawn.fetch_add(1, Ordering::Relaxed) + 1;
        Arc::from(format!("{}:{n}", self.owner))
    }

    /// An owner id no hold of this client had before, for a grant that must never join
    /// another (a MultiLock's or RedLock's): `<owner>:<n>`, an [`crate::Owner`]'s handle's
    /// included (its own id would re-enter the owner's hold on the server, and a stale guard of
    /// the grant would then release the owner's later hold).
    pub(crate) fn fresh_owner(&self) -> Arc<str> {
        if !self.fixed {
            return self.next_owner();
        }
        // The client's counter: unique even across chains of the owner made at other times.
        let n = self.shared.next_handle.fetch_add(1, Ordering::Relaxed);
        Arc::from(format!("{}:{n}", self.owner))
    }

    /// The current hold, if a re-entry may still join it.
    pub(crate) fn live(&self) -> Option<Hold> {
        let current = self.current.lock().unwrap_or_else(PoisonError::into_inner);
        current.clone().filter(Hold::is_live)
    }

    /// The owner of the other side's live hold.
    fn sibling_owner(&self) -> Option<Arc<str>> {
        self.sibling()?.live()?.owner().cloned()
    }

    /// The current hold (live or not).
    fn current(&self) -> Option<Hold> {
        self.current.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// A fixed owner's read side: the owner's current write hold on the key (live or not),
    /// whose field any lease this side sends may keep on the server ([`Hold::kin_sent`]).
    pub(crate) fn kin_write(&self) -> Option<Hold> {
        if !self.fixed || self.kind != Kind::Read {
            return None;
        }
        self.sibling()?.current().filter(|w| w.owner() == Some(&self.owner))
    }

    /// A fixed owner's read hold taken (or re-entered), answered now, for `lease`, while the
    /// owner holds (or held) the write side: the read hold's leases keep the write field on
    /// the server ([`Hold::cover`]), until now plus `lease` at least ([`Hold::kin_sent`]: the
    /// command ran before its answer came, whatever the write hold's state).
    fn cover_write(&self, read: &Hold, sent: Instant, lease: Duration) {
        let Some(write) = self.kin_write() else { return };
        write.kin_sent(sent, after(Instant::now(), lease));
        read.cover(&write);
    }

    /// A fixed owner's next hold on this side waits until no release of its previous one is in
    /// flight (by `bound`): that release, reaching the server after the next hold's grant,
    /// would end the next hold instead (the server cannot tell the two apart).
    async fn after_release(&self, bound: Option<Instant>) -> Result<()> {
        let Some(previous) = self.current().filter(|_| self.fixed) else { return Ok(()) };
        within(bound, async {
            previous.released().await;
            Ok(())
        })
        .await
    }

    /// Takes the lock (or side) by `deadline` (`None`: as long as it takes): re-enters the live
    /// hold once the server confirms it, else takes a new one. `lease: None` uses the watchdog.
    ///
    /// # Errors
    /// [`Error::ZeroLease`] for a zero lease, [`Error::InvalidArgument`] for one beyond
    /// [`crate::MAX_DURATION`] (nothing sent); [`Error::TimedOut`] when the
    /// deadline passes first or the server did not answer in time (the request is cancelled:
    /// nothing stays held); [`Error::Redis`] when Redis fails or refuses.
    pub(crate) async fn acquire(
        &self,
        deadline: Option<Instant>,
        lease_given: Option<Duration>,
    ) -> Result<Member> {
        let options = &self.shared.options;
        let lease = checked_lease("a lease", lease_given.unwrap_or(options.watchdog_timeout))?;
        let watchdog = lease_given.is_none().then_some(lease);
        let bound = bound(deadline, Instant::now());
        let _turn = match bound {
            None => self.turn.lock().await,
            Some(bound) => tokio::time::timeout_at(bound, self.turn.lock())
                .await
                .map_err(|_| Error::TimedOut)?,
        };
        let sent = Instant::now();
        if let Some(member) = answered(bound, || self.reenter(lease, watchdog, bound)).await? {
            self.cover_write(member.hold(), sent, lease);
            return Ok(member);
        }
        self.after_release(bound).await?;
        let sent = Instant::now();
        if let Some(member) = answered(bound, || self.adopt(lease, watchdog, bound)).await? {
            self.cover_write(member.hold(), sent, lease);
            return Ok(member);
        }
        let owner = match self.sibling_owner().filter(|_| !self.fixed) {
            Some(owner) if answered(bound, || self.stale_write_held(&owner)).await? => {
                self.next_owner()
            }
            Some(owner) => owner,
            None => self.next_owner(),
        };
        let mut request =
            Request::new(&self.shared, &self.key, self.kind, Arc::clone(&owner), millis(lease))
                .session(self.session())
                .kin(self.kin_write())
                .gt(self.fixed);
        let Some(grant) = request.run(deadline, bound).await? else { return Err(Error::TimedOut) };
        let holder = Holder::Owner(Arc::clone(&owner));
        let until = after(request.sent(), lease);
        let hold = Hold::new(&self.shared, &self.key, self.kind, holder, grant.token, until);
        if self.fixed {
            hold.share_owner();
        }
        request.bind(&hold)?;
        // Still cancelled if dropped here: the refresh comes before the guard's watchdog.
        refresh_after_wait(&hold, &request, lease, bound).await;
        let Some(member) = hold.join(watchdog) else { return Err(Error::NotHeld) };
        request.taken();
        self.cover_write(&hold, request.sent(), lease);
        let previous =
            self.current.lock().unwrap_or_else(PoisonError::into_inner).replace(hold.clone());
        if let Some(previous) = previous.filter(|p| p.owner() == Some(&owner)) {
            previous.supersede(); // the server cannot tell it from the new hold any more
        }
        Ok(member)
    }

    /// Whether this write side's current hold, under `owner`, is no longer live for the client
    /// (its deadline passed, or it was found lost) but still has guards and its write field on
    /// the server (a write hold lives as long as the key, which the same owner's read hold keeps
    /// alive). A new write under that owner would re-enter that field (count 2) and disown the
    /// stale count: nobody would release it. The new hold takes an owner of its own instead
    /// (and waits until the stale hold ends).
    async fn stale_write_held(&self, owner: &Arc<str>) -> Result<bool> {
        if self.kind != Kind::Write {
            return Ok(false);
        }
        let current = self.current.lock().unwrap_or_else(PoisonError::into_inner).clone();
        let Some(stale) = current.filter(|h| h.owner() == Some(owner) && h.guards() > 0) else {
            return Ok(false);
        };
        let held: bool = redis::cmd("HEXISTS")
            .arg(&*self.key)
            .arg(self.kind.field(owner))
            .query_async(&mut self.shared.conn.clone())
            .await?;
        Ok(held && !stale.is_live())
    }

    /// Joins the live hold once the server confirmed it on this side, renewed for at least
    /// `lease`. `None`: no live hold (one the server no longer has is marked lost).
    async fn reenter(
        &self,
        lease: Duration,
        watchdog: Option<Duration>,
        bound: Option<Instant>,
    ) -> Result<Option<Member>> {
        let Some(hold) = self.live() else { return Ok(None) };
        if !within(bound, hold.renew(lease)).await? {
            return Ok(None);
        }
        Ok(hold.join(watchdog)) // `None`: its last guard left meanwhile: take a new hold
    }

    /// A fixed owner's new hold over its orphaned one ([`Hold::claim`]: known lost, no
    /// release sent, while the server may still count it, e.g. a write field whose key the
    /// owner's longer read hold keeps, or a hold whose lease outlasted a stalled client's
    /// deadline): when the server confirms the owner's hold on this side, the new hold takes
    /// that one count over with a renewal for `lease`, instead of a request the server would
    /// count a second time (the stale hold, claimed, sends no release then, so that count would
    /// stay held by nobody). `None`: nothing to take over (a new request follows).
    async fn adopt(
        &self,
        lease: Duration,
        watchdog: Option<Duration>,
        bound: Option<Instant>,
    ) -> Result<Option<Member>> {
        if !self.fixed || self.session.is_some() {
            return Ok(None);
        }
        let current = self.current.lock().unwrap_or_else(PoisonError::into_inner).clone();
        let Some(stale) = current.filter(|h| h.owner() == Some(&self.owner) && h.claim()) else {
            return Ok(None);
        };
        // Claimed: the stale hold sends no release while the new one takes its count over.
        // Dropped or failed before that, the claim is given up (the stale hold releases again).
        let claim = Claim(Some(stale.clone()));
        let holder = Holder::Owner(Arc::clone(&self.owner));
        let (key, kind, token) = (&self.key, self.kind, stale.token());
        let hold = Hold::new(&self.shared, key, kind, holder, token, Instant::now());
        hold.share_owner();
        let renewed = within(bound, hold.renew(lease)).await?;
        claim.keep();
        if !renewed {
            return Ok(None); // the count is gone: nothing to release
        }
        stale.supersede();
        let Some(member) = hold.join(watchdog) else { return Ok(None) };
        *self.current.lock().unwrap_or_else(PoisonError::into_inner) = Some(hold);
        Ok(Some(member))
    }

    /// This handle's live guards that the server confirms (0 when it holds nothing); errors as
    /// `is_locked` does on a key of another type.
    ///
    /// # Errors
    /// [`Error::Redis`] when Redis fails.
    pub(crate) async fn hold_count(&self) -> Result<u64> {
        let mut conn = self.shared.conn.clone();
        let mut pipe = redis::pipe();
        pipe.cmd("RLOCK.PTTL").arg(&*self.key);
        let hold = self.live();
        let Some((hold, owner)) = hold.as_ref().and_then(|h| Some((h, h.owner()?))) else {
            let _: (i64,) = pipe.query_async(&mut conn).await?;
            return Ok(0);
        };
        pipe.cmd("HEXISTS").arg(&*self.key).arg(self.kind.field(owner));
        let (_, held): (i64, bool) = pipe.query_async(&mut conn).await?;
        if held {
            Ok(hold.guards() as u64)
        } else {
            hold.lose();
            Ok(0)
        }
    }
}

/// A claim of a stale hold's count by adopt ([`Hold::claim`]): given up when dropped unkept.
struct Claim(Option<Hold>);

impl Claim {
    /// The claim stands: the stale hold never releases.
    fn keep(mut self) {
        self.0 = None;
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        if let Some(stale) = self.0.take() {
            stale.unclaim();
        }
    }
}

/// Runs `step` (a renewal or a read on the shared connection, which may be sent again) until it
/// is answered: after its connection was lost (killed, reset, refused; the shared connection is
/// replaced then) it is sent again, pausing as a wait's attempts do, until `bound` passes
/// ([`Error::TimedOut`]; without a bound, as long as it takes); so is a refusal only a server
/// that is not (or no longer, or not yet) the master gives (`READONLY`, `NOREPLICAS`,
/// `MASTERDOWN`, `LOADING`: nothing ran; a Sentinel client asks the Sentinels again then), as
/// the old master answers during a failover. An acquire's re-entry thus outlives what its wait
/// would (`CLIENT KILL`, a restart, a failover), instead of ending with a transport error or a
/// refusal. A response timeout (a stall) ends it as before.
async fn answered<T, F, Fut>(bound: Option<Instant>, mut step: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T>>,
{
    let mut pause = resume::RETRY_FIRST;
    loop {
        match within(bound, step()).await {
            Err(e) if connection_lost(&e) => {} // no answer: asked again
            Err(Error::Redis(e)) if crate::conn::not_master(&e) => {} // nothing ran: again
            answer => return answer,
        }
        let now = Instant::now();
        let left = match bound {
            Some(bound) if bound <= now => return Err(Error::TimedOut),
            Some(bound) => bound - now,
            None => pause,
        };
        tokio::time::sleep(pause.min(left)).await;
        pause = pause.saturating_mul(2).min(resume::RETRY_MAX);
    }
}

/// A grant handed over after a server-side wait started its lease at the hand-off, some time
/// after the wait was sent: when that was long ago against the lease, one renewal confirms a
/// deadline from now (so a long wait never yields a guard born lost). Runs before the hold's
/// first guard joins (its watchdog would find the deadline passed), while the request still
/// cancels the grant if the caller goes away. Errors are left to the guard's own loss signal.
pub(crate) async fn refresh_after_wait(
    hold: &Hold,
    request: &Request,
    lease: Duration,
    bound: Option<Instant>,
) {
    if request.waited() && request.sent().elapsed() > lease / 3 {
        let _ = within(bound, hold.renew(lease)).await;
    }
}
