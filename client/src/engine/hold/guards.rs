//! A [`Hold`]'s guards ([`Member`]s): joining the hold (and starting its watchdog), giving a
//! guard back, and the release of the hold on the server when the last one leaves (retried
//! with the same latch id, or handed to the client's releaser, never blocking on drop).

use std::sync::Arc;
use std::time::Duration;

use redis::Value;
use tokio::time::Instant;

use super::{Hold, WeakHold};
use crate::engine::kind::Holder;
use crate::engine::{watchdog, SETTLE};
use crate::error::redis_uncertain;
use crate::error::{Error, Result};

/// How many times a release is retried (same latch id) after a connection failure.
const RELEASE_RETRIES: u32 = 3;

impl Hold {
    /// Whether no release may be sent for it: superseded (a later hold of its owner on its
    /// side took its count over, or was granted after it), or an owner's hold known lost whose
    /// count cannot be on the server any more ([`Hold::may_remain`]: found gone, or every lease
    /// sent for it, or for its key under it, ended). A lost owner's hold that may still be
    /// there is released: the owner's next hold on its side waits for that release
    /// ([`Hold::released`]), so it never ends a later hold.
    fn mute(&self) -> bool {
        let (superseded, shared_owner) = {
            let state = self.state();
            (state.superseded, state.shared_owner)
        };
        superseded || (shared_owner && self.is_lost() && !self.may_remain())
    }

    /// Claims this hold's count for a later hold of its owner on its side, which takes it over
    /// ([`crate::engine::chain`]'s adopt): only while it is orphaned (an [`crate::Owner`]'s
    /// hold known lost, its guards told so, no release of it sent, while the server may still
    /// count it) and nothing else superseded it. Claimed, it sends no release (as superseded)
    /// until [`Self::unclaim`]. `false`: not orphaned (a release of it went out meanwhile).
    pub(crate) fn claim(&self) -> bool {
        let lost = self.is_lost();
        let mut state = self.state();
        let orphaned = state.shared_owner && lost && !state.superseded && !state.release_sent;
        state.superseded |= orphaned;
        orphaned
    }

    /// Gives a claim up (the later hold did not take the count over): the hold releases again,
    /// at once if its last guard left meanwhile.
    pub(crate) fn unclaim(&self) {
        let ended = {
            let mut state = self.state();
            state.superseded = false;
            state.ended && !state.release_sent
        };
        if ended {
            self.submit_release(None);
        }
    }

    /// Records that a release of the hold goes out: in flight until [`Settled`] drops.
    fn release_goes_out(&self) -> Settled {
        self.state().release_sent = true;
        self.0.releasing.send_replace(true);
        Settled(Arc::clone(&self.0.releasing))
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
        // A lost owner's hold whose count may still be on the server is released all the
        // same; its guard was told it is lost, and is answered so.
        let lost = self.state().shared_owner && self.is_lost();
        let latch = uuid::Uuid::new_v4().simple().to_string();
        let Some(cmd) = self.0.kind.release(&self.0.key, &self.0.holder, &latch) else {
            return Ok(());
        };
        let settled = self.release_goes_out();
        let mut pending =
            PendingRelease { hold: self, cmd: Some(cmd.clone()), settled: Some(settled) };
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
                        return if lost { Err(Error::NotHeld) } else { Ok(()) };
                    }
                    // Leased permits have no latch: a retry that finds them gone while their
                    // lease cannot have ended found the first release's work.
                    if retried && matches!(self.0.holder, Holder::Ids(_)) && !self.is_lost() {
                        return Ok(());
                    }
                    self.gone();
                    return Err(Error::NotHeld);
                }
                Err(e) if retries > 0 && redis_uncertain(&e) => {
                    retries -= 1;
                    retried = true;
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) if retries > 0 && crate::error::try_again(&e) => {
                    // Nothing ran (the server just resumed from a stall): the same release
                    // again, as a first one, once the server's next check ran (within 500 ms).
                    retries -= 1;
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(e) => {
                    if !redis_uncertain(&e) && !crate::error::try_again(&e) {
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
            self.gone();
            Err(Error::NotHeld)
        }
    }

    /// Hands the release of the hold to the client's releaser (never blocks). `cmd`: a release
    /// that already went out (retried with its latch), with what marks it in flight.
    fn submit_release(&self, cmd: Option<(redis::Cmd, Settled)>) {
        let (cmd, settled) = match cmd {
            Some(sent) => sent,
            None => {
                if self.mute() {
                    return;
                }
                let latch = uuid::Uuid::new_v4().simple().to_string();
                let Some(cmd) = self.0.kind.release(&self.0.key, &self.0.holder, &latch) else {
                    return;
                };
                (cmd, self.release_goes_out())
            }
        };
        // Worth trying as long as the hold's count may be on the server (the longest lease
        // sent for it or its key under it, answered or not), at least a few seconds. An owner's
        // later hold on its side waits until this job ends (`settled` drops with it), so a late
        // try never ends that later hold.
        let left = self.remains_until().saturating_duration_since(Instant::now());
        let until = crate::releaser::until_after(left.max(SETTLE));
        let then: crate::releaser::Then = Box::new(move |_| drop(settled));
        self.0.shared.releaser.submit_then(Arc::clone(&self.0.key), cmd, until, then);
    }
}

/// A release in flight; dropped when it was answered or given up (or never ran).
pub(super) struct Settled(Arc<tokio::sync::watch::Sender<bool>>);

impl Drop for Settled {
    fn drop(&mut self) {
        self.0.send_replace(false);
    }
}

/// A release under way; if it ends without the server's answer (dropped, connection lost), the
/// releaser takes it over, with the same latch.
struct PendingRelease<'a> {
    hold: &'a Hold,
    cmd: Option<redis::Cmd>,
    settled: Option<Settled>,
}

impl Drop for PendingRelease<'_> {
    fn drop(&mut self) {
        if let (Some(cmd), Some(settled)) = (self.cmd.take(), self.settled.take()) {
            self.hold.submit_release(Some((cmd, settled)));
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
