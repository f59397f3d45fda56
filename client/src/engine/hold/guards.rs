//! A [`Hold`]'s guards ([`Member`]s): joining the hold (and starting its watchdog), giving a
//! guard back, and the release of the hold on the server when the last one leaves (retried
//! with the same latch id, or handed to the client's releaser, never blocking on drop).

use std::sync::Arc;
use std::time::Duration;

use redis::Value;
use tokio::time::Instant;

use super::{Hold, WeakHold};
use crate::engine::kind::Holder;
use crate::engine::{redis_uncertain, watchdog, SETTLE};
use crate::error::{Error, Result};

/// How many times a release is retried (same latch id) after a connection failure.
const RELEASE_RETRIES: u32 = 3;

impl Hold {
    /// Whether no release may be sent for it: superseded, or an owner's hold known lost.
    fn mute(&self) -> bool {
        let (superseded, shared_owner) = {
            let state = self.state();
            (state.superseded, state.shared_owner)
        };
        superseded || (shared_owner && self.is_lost())
    }

    /// Whether this hold of a shared owner id (an [`crate::Owner`]'s) is known lost and no
    /// release of it was or ever will be sent: whatever count of its owner the server may still
    /// have on its side is this hold's, and no live guard relies on it (its guards were told it
    /// is lost). A later hold of the owner takes that count over instead of stacking another
    /// one on it that nobody would release.
    pub(crate) fn orphaned(&self) -> bool {
        let lost = self.is_lost();
        let state = self.state();
        state.shared_owner && (lost || state.superseded) && !state.release_sent
    }

    /// Records that a release of the hold goes out.
    fn release_goes_out(&self) {
        self.state().release_sent = true;
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
        self.release_goes_out();
        let mut pending = PendingRelease { hold: self, cmd: Some(cmd.clone()) };
        // An old master answers a release (as a master) until the Sentinels demote it, seconds
        // after a failover: a Sentinel client asks them first where its master is.
        self.0.shared.target.refresh().await;
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
        self.release_goes_out();
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
