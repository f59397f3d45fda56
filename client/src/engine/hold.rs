//! A [`Hold`]: exactly one server grant (kind, key, side, owner or permit ids, token) and the
//! guards on it ([`Member`]s: a lock's re-entries share one hold). Written once for every
//! guard type:
//!
//! - **One deadline**: the longest (send time + lease) the server confirmed for the hold, by
//!   its grant, a re-entry or a renewal. Past it, unconfirmed, the hold counts as lost, on this
//!   process's monotonic clock; nothing else sets a shorter one.
//! - **The watchdog**: while a watchdog guard lives, the hold is renewed every third of the
//!   watchdog lease (never below what is confirmed), side-checked; a failed renewal is retried
//!   promptly (50 ms, doubling); a renewal that finds the hold gone, or the deadline passing,
//!   marks it lost.
//! - **The loss signal**: every guard of the hold sees it.
//! - **Release**: the last guard releases the hold on the server (retried with the same latch
//!   id after connection errors, bounded, then handed to the releaser); a dropped guard's
//!   release goes to the client's releaser and never blocks.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};

use crate::engine::watchdog;
use std::time::Duration;

use redis::Value;
use tokio::sync::watch;
use tokio::task::AbortHandle;
use tokio::time::Instant;

use crate::engine::kind::{Holder, Kind};
use crate::engine::{millis, redis_uncertain, SETTLE};
use crate::error::{Error, Result};
use crate::shared::Shared;

/// How many times a release is retried (same latch id) after a connection failure.
const RELEASE_RETRIES: u32 = 3;

/// `t + d`, or as far as the clock goes.
pub(crate) fn after(t: Instant, d: Duration) -> Instant {
    t.checked_add(d).or_else(|| t.checked_add(Duration::from_secs(100 * 365 * 86_400))).unwrap_or(t)
}

/// One server grant and its guards. Cheap to clone (shared).
#[derive(Clone)]
pub(crate) struct Hold(Arc<Inner>);

/// A [`Hold`] that does not keep it alive (its watchdog's).
pub(crate) struct WeakHold(Weak<Inner>);

impl WeakHold {
    /// The hold, while something keeps it and it neither ended nor was lost.
    pub(crate) fn upgrade_live(&self) -> Option<Hold> {
        let hold = Hold(self.0.upgrade()?);
        (!hold.state().ended && !*hold.0.lost.borrow()).then_some(hold)
    }
}

impl watchdog::Upgrade for WeakHold {
    type Hold = Hold;

    fn upgrade(&self) -> Option<Hold> {
        self.0.upgrade().map(Hold)
    }
}

impl watchdog::Watched for Hold {
    fn until(&self) -> Option<Instant> {
        Self::until(self)
    }

    fn lose(&self) {
        Self::lose(self);
    }

    fn renew(&self, lease: Duration) -> impl std::future::Future<Output = Result<bool>> + Send {
        Self::renew(self, lease)
    }
}

struct Inner {
    shared: Arc<Shared>,
    key: Arc<[u8]>,
    kind: Kind,
    holder: Holder,
    token: Option<u64>,
    state: Mutex<State>,
    /// Set once the hold is known lost; every guard watches it.
    lost: watch::Sender<bool>,
}

struct State {
    /// The hold's one deadline (see the module's doc).
    until: Instant,
    /// Live guards.
    guards: usize,
    /// Live guards that asked for the watchdog, and the watchdog's task while any does.
    watchdogs: usize,
    renewal: Option<AbortHandle>,
    /// The last guard left: the hold was released (or is being released).
    ended: bool,
    /// A later hold of this handle took the same owner on the same side: this one must not
    /// release (the server cannot tell the two apart); it ends with its lease.
    superseded: bool,
    /// Its owner id is shared with other holds (an [`crate::Owner`]'s): once known lost, it
    /// sends no release (the server could not tell it from a later hold of that owner).
    shared_owner: bool,
}

impl std::fmt::Debug for Hold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hold")
            .field("kind", &self.0.kind)
            .field("holder", &self.0.holder)
            .field("lost", &self.is_lost())
            .finish_non_exhaustive()
    }
}

impl Hold {
    /// A hold the server granted, confirmed until `until`, with no guard yet.
    pub(crate) fn new(
        shared: &Arc<Shared>,
        key: &Arc<[u8]>,
        kind: Kind,
        holder: Holder,
        token: Option<u64>,
        until: Instant,
    ) -> Self {
        let state = State {
            until,
            guards: 0,
            watchdogs: 0,
            renewal: None,
            ended: false,
            superseded: false,
            shared_owner: false,
        };
        Self(Arc::new(Inner {
            shared: Arc::clone(shared),
            key: Arc::clone(key),
            kind,
            holder,
            token,
            state: Mutex::new(state),
            lost: watch::channel(false).0,
        }))
    }

    /// A reference that does not keep the hold alive.
    pub(crate) fn downgrade(&self) -> WeakHold {
        WeakHold(Arc::downgrade(&self.0))
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.0.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Who holds it on the server.
    pub(crate) fn holder(&self) -> &Holder {
        &self.0.holder
    }

    /// The owner id of a lock hold.
    pub(crate) fn owner(&self) -> Option<&Arc<str>> {
        match &self.0.holder {
            Holder::Owner(owner) => Some(owner),
            _ => None,
        }
    }

    /// The fencing token of its grant.
    pub(crate) fn token(&self) -> Option<u64> {
        self.0.token
    }

    /// Live guards.
    pub(crate) fn guards(&self) -> usize {
        self.state().guards
    }

    /// Until when the hold is confirmed; `None` once it is known lost.
    pub(crate) fn until(&self) -> Option<Instant> {
        if *self.0.lost.borrow() {
            return None;
        }
        Some(self.state().until)
    }

    /// Whether the hold is lost: found gone, or its deadline passed unconfirmed.
    pub(crate) fn is_lost(&self) -> bool {
        self.until().is_none_or(|until| until <= Instant::now())
    }

    /// Whether a re-entry may join it: not lost, and its guards not all gone.
    pub(crate) fn is_live(&self) -> bool {
        !self.state().ended && !self.is_lost()
    }

    /// Marks the hold lost (every guard sees it) and stops its watchdog.
    pub(crate) fn lose(&self) {
        self.0.lost.send_replace(true);
        if let Some(renewal) = self.state().renewal.take() {
            renewal.abort();
        }
    }

    /// Its owner id is shared with other holds (an [`crate::Owner`]'s): a guard of it that is
    /// known lost (found gone, or its deadline passed unconfirmed) sends no release, which
    /// could only end a later hold of the same owner; a hold still on the server then ends
    /// with its lease.
    pub(crate) fn share_owner(&self) {
        self.state().shared_owner = true;
    }

    /// Whether no release may be sent for it: superseded, or an owner's hold known lost.
    fn mute(&self) -> bool {
        let (superseded, shared_owner) = {
            let state = self.state();
            (state.superseded, state.shared_owner)
        };
        superseded || (shared_owner && self.is_lost())
    }

    /// A later hold took this one's owner on the same side: this one must never release.
    pub(crate) fn supersede(&self) {
        self.state().superseded = true;
        self.lose();
    }

    /// Resolves when the hold is lost: found gone, or at its deadline if no confirmation came.
    pub(crate) async fn lost(&self) {
        let mut lost = self.0.lost.subscribe();
        loop {
            if *lost.borrow_and_update() {
                return;
            }
            let until = self.state().until;
            if until <= Instant::now() {
                return;
            }
            tokio::select! {
                changed = lost.changed() => {
                    if changed.is_err() {
                        std::future::pending::<()>().await;
                    }
                }
                () = tokio::time::sleep_until(until) => {}
            }
        }
    }

    /// The side-checked renewal of exactly this hold to `lease_ms`: `Ok(true)` when the server
    /// confirmed it (every permit id, for leased permits).
    async fn renew_on_server(&self, lease_ms: u64) -> Result<bool> {
        let mut pipe = redis::pipe();
        for cmd in self.0.kind.renew(&self.0.key, &self.0.holder, lease_ms) {
            pipe.add_command(cmd);
        }
        let replies: Vec<Value> = pipe.query_async(&mut self.0.shared.conn.clone()).await?;
        crate::engine::kind::Kind::renewed(&replies)
    }

    /// Renews the hold for at least `lease`, never below what is confirmed already; pushes the
    /// deadline to the send time plus that when confirmed, marks the hold lost when the server
    /// says it is gone.
    ///
    /// # Errors
    /// When Redis fails (nothing is concluded then).
    pub(crate) async fn renew(&self, lease: Duration) -> Result<bool> {
        let Some(until) = self.until() else { return Ok(false) };
        let sent = Instant::now();
        let needed = lease.max(until.saturating_duration_since(sent));
        let renewed = self.renew_on_server(millis(needed)).await?;
        if renewed {
            let mut state = self.state();
            state.until = state.until.max(after(sent, needed));
        } else {
            self.lose();
        }
        Ok(renewed)
    }

    /// Sets the lease to exactly `lease` (it may shorten it: MultiLock's real lease after
    /// taking every lock with a longer one); the deadline becomes the send time plus `lease`.
    ///
    /// # Errors
    /// When Redis fails.
    pub(crate) async fn reset_lease(&self, lease: Duration) -> Result<bool> {
        let sent = Instant::now();
        let renewed = self.renew_on_server(millis(lease)).await?;
        if renewed {
            self.state().until = after(sent, lease);
        } else {
            self.lose();
        }
        Ok(renewed)
    }

    /// A new guard on the hold; `watchdog`: its lease, renewed while the guard lives. `None`
    /// when the hold's guards are all gone (it was released).
    pub(crate) fn join(&self, watchdog: Option<Duration>) -> Option<Member> {
        let mut state = self.state();
        if state.ended {
            return None;
        }
        state.guards += 1;
        if let Some(lease) = watchdog {
            state.watchdogs += 1;
            if state.renewal.is_none() && !*self.0.lost.borrow() {
                let renewing = WeakHold(Arc::downgrade(&self.0));
                state.renewal = Some(tokio::spawn(watchdog::run(renewing, lease)).abort_handle());
            }
        }
        Some(Member { hold: self.clone(), watchdog: watchdog.is_some(), left: false })
    }

    /// Releases the hold on the server (its last guard left). A release whose reply was lost is
    /// retried with the same latch id (the server answers a retry with the first result); if
    /// none answers, or this future is dropped, the releaser goes on with it.
    async fn release_on_server(&self) -> Result<()> {
        if self.mute() {
            return Err(Error::NotHeld);
        }
        let latch = uuid::Uuid::new_v4().simple().to_string();
        let Some(cmd) = self.0.kind.release(&self.0.key, &self.0.holder, &latch) else {
            return Ok(());
        };
        let mut pending = PendingRelease { hold: self, cmd: Some(cmd.clone()) };
        let mut retried = false;
        let mut retries = RELEASE_RETRIES;
        loop {
            match cmd.query_async::<Value>(&mut self.0.shared.conn.clone()).await {
                Ok(reply) => {
                    pending.cmd = None;
                    if self.0.kind.released(&reply, &self.0.holder)? {
                        return Ok(());
                    }
                    // Leased permits have no latch: a retry that finds them gone while their
                    // lease cannot have ended found the first release's work.
                    if retried && matches!(self.0.holder, Holder::Ids(_)) && !self.is_lost() {
                        return Ok(());
                    }
                    self.lose();
                    return Err(Error::NotHeld);
                }
                Err(e) if retries > 0 && redis_uncertain(&e) => {
                    retries -= 1;
                    retried = true;
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => {
                    if !redis_uncertain(&e) {
                        pending.cmd = None; // refused: the server changed nothing
                    }
                    return Err(e.into());
                }
            }
        }
    }

    /// A guard that is not the last one gives itself back: checks the hold is still there.
    async fn check_held(&self) -> Result<()> {
        if self.is_lost() {
            return Err(Error::NotHeld);
        }
        let Holder::Owner(owner) = &self.0.holder else { return Ok(()) };
        let held: bool = redis::cmd("HEXISTS")
            .arg(&*self.0.key)
            .arg(self.0.kind.field(owner))
            .query_async(&mut self.0.shared.conn.clone())
            .await?;
        if held {
            Ok(())
        } else {
            self.lose();
            Err(Error::NotHeld)
        }
    }

    /// Hands the release of the hold to the client's releaser (never blocks).
    fn submit_release(&self, cmd: Option<redis::Cmd>) {
        if self.mute() {
            return;
        }
        let latch = uuid::Uuid::new_v4().simple().to_string();
        let cmd = cmd.or_else(|| self.0.kind.release(&self.0.key, &self.0.holder, &latch));
        let Some(cmd) = cmd else { return };
        // Worth trying as long as the hold may last; at least a few seconds, but never past
        // the deadline of an owner's hold (a later hold of that owner would be released).
        let (until, shared_owner) = {
            let state = self.state();
            (state.until, state.shared_owner)
        };
        let left = until.saturating_duration_since(Instant::now());
        let keep = if shared_owner { left } else { left.max(SETTLE) };
        let until = crate::releaser::until_after(keep);
        self.0.shared.releaser.submit(Arc::clone(&self.0.key), cmd, until, None);
    }
}

/// A release under way; if it ends without the server's answer (dropped, connection lost), the
/// releaser takes it over, with the same latch.
struct PendingRelease<'a> {
    hold: &'a Hold,
    cmd: Option<redis::Cmd>,
}

impl Drop for PendingRelease<'_> {
    fn drop(&mut self) {
        if let Some(cmd) = self.cmd.take() {
            self.hold.submit_release(Some(cmd));
        }
    }
}

/// One guard on a [`Hold`]. Its release (or drop) gives it back; the last one releases the
/// hold on the server.
pub(crate) struct Member {
    hold: Hold,
    watchdog: bool,
    left: bool,
}

impl Member {
    /// The hold this guard is on.
    pub(crate) const fn hold(&self) -> &Hold {
        &self.hold
    }

    /// Whether this guard asked for the watchdog.
    pub(crate) const fn watchdog(&self) -> bool {
        self.watchdog
    }

    /// Leaves the hold (once): `Some(true)` when this was its last guard.
    fn leave(&mut self) -> Option<bool> {
        if std::mem::replace(&mut self.left, true) {
            return None;
        }
        let mut state = self.hold.state();
        state.guards = state.guards.saturating_sub(1);
        if self.watchdog {
            state.watchdogs = state.watchdogs.saturating_sub(1);
        }
        let last = state.guards == 0;
        state.ended |= last;
        if state.watchdogs == 0 || last {
            if let Some(renewal) = state.renewal.take() {
                renewal.abort();
            }
        }
        Some(last)
    }

    /// Gives this guard back: the last guard releases the hold on the server; another one
    /// checks the hold is still there.
    ///
    /// # Errors
    /// [`Error::NotHeld`] when the hold was gone (nothing is released then);
    /// [`Error::Redis`] when Redis fails.
    pub(crate) async fn release(mut self) -> Result<()> {
        match self.leave() {
            Some(true) => self.hold.release_on_server().await,
            Some(false) => self.hold.check_held().await,
            None => Err(Error::NotHeld),
        }
    }
}

impl Drop for Member {
    /// The last guard dropped hands the release to the releaser: never blocks, needs no runtime.
    fn drop(&mut self) {
        if self.leave() == Some(true) {
            self.hold.submit_release(None);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deadline_never_overflows_the_clock() {
        let now = Instant::now();
        assert_eq!(after(now, Duration::from_secs(3)), now + Duration::from_secs(3));
        assert!(after(now, Duration::MAX) > now + Duration::from_secs(86_400), "far, not a panic");
    }
}
