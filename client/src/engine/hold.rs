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
//!
//! This file holds the hold itself (its deadline, renewal and loss); [`guards`] its guards
//! and its release.

mod guards;

use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};

use crate::engine::watchdog;
use std::time::Duration;

use redis::Value;
use tokio::sync::watch;
use tokio::task::AbortHandle;
use tokio::time::Instant;

use crate::engine::kind::{Holder, Kind};
use crate::engine::millis;
use crate::error::Result;
use crate::shared::Shared;

pub(crate) use guards::Member;

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
    /// The hold, while something keeps it (ended or lost included).
    pub(crate) fn upgrade_any(&self) -> Option<Hold> {
        self.0.upgrade().map(Hold)
    }

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
    /// When the client learnt of its grant: its count was on the server before any command
    /// sent after this.
    born: Instant,
    /// `true` while a release of it is in flight (sent, or with the releaser, and not
    /// answered): the owner's next hold on its side waits for it (see [`Self::released`]).
    /// An `Arc` of its own: a releaser job holds it, never the hold (nor the client).
    releasing: Arc<watch::Sender<bool>>,
}

struct State {
    /// The hold's one deadline (see the module's doc).
    until: Instant,
    /// The latest deadline any lease-setting command for the hold asked for (send time +
    /// lease): every later one asks at least as much, so none sent after it can shorten what
    /// it may have set (a renewal in flight while a re-entry computes its own).
    asked: Instant,
    /// Lease-setting commands in flight: ticket and the deadline each asked for. A command
    /// sent while others are in flight may be run before them: what it confirms is capped by
    /// the least of theirs.
    in_flight: Vec<(u64, Instant)>,
    tickets: u64,
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
    /// sends a release only while its count may still be on the server ([`Hold::may_remain`]);
    /// the server could not tell it from a later hold of that owner, which waits for it.
    shared_owner: bool,
    /// A release of it was sent (or handed to the releaser).
    release_sent: bool,
    /// A read hold of an [`crate::Owner`] that also holds the write side: that write hold,
    /// whose field the server keeps as long as the key, which this hold's lease keeps.
    covers: Option<WeakHold>,
    /// Until when a lease-setting command of its owner's other holds on its key (a read
    /// acquire, re-entry or renewal under this write hold) may keep the key, and so this hold's
    /// count, on the server ([`Self::kin_sent`]): the hold may outlast its own leases there.
    kept: Instant,
    /// The server said it does not have the hold (a renewal, a release or a check found it
    /// gone): nothing of it remains to release.
    gone: bool,
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
            asked: until,
            in_flight: Vec::new(),
            tickets: 0,
            guards: 0,
            watchdogs: 0,
            renewal: None,
            ended: false,
            superseded: false,
            shared_owner: false,
            release_sent: false,
            covers: None,
            kept: until,
            gone: false,
        };
        Self(Arc::new(Inner {
            shared: Arc::clone(shared),
            key: Arc::clone(key),
            kind,
            holder,
            token,
            state: Mutex::new(state),
            lost: watch::channel(false).0,
            born: Instant::now(),
            releasing: Arc::new(watch::channel(false).0),
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

    /// Marks the hold lost because the server said it does not have it: nothing of it remains
    /// to release.
    pub(crate) fn gone(&self) {
        self.state().gone = true;
        self.lose();
    }

    /// Whether its count may still be on the server, as far as the client can tell: not found
    /// gone, and a lease sent for it (its grant, a renewal or re-entry, answered or not) or a
    /// kin command under it ([`Self::kin_sent`]) may last until after now. A hold lost at its
    /// deadline while a renewal it sent is unanswered (or was given up) may still be there.
    pub(crate) fn may_remain(&self) -> bool {
        let state = self.state();
        !state.gone && Instant::now() < state.asked.max(state.kept).max(state.until)
    }

    /// Until when its count may be on the server (see [`Self::may_remain`]).
    fn remains_until(&self) -> Instant {
        let state = self.state();
        state.asked.max(state.kept).max(state.until)
    }

    /// A lease-setting command of this (write) hold's owner on its key (a read acquire,
    /// re-entry or renewal), sent at `sent`, may keep the key, and so this hold's write field,
    /// until `until` (the server keeps a write field as long as the key; a read grant, renewal
    /// or release never shortens a key a writer holds). Whatever the command's fate (answered,
    /// cancelled, given up, granted late), a count of this hold may be on the server until then:
    /// its release is still sent when its last guard goes, even once it is lost. Only a hold
    /// the client knew of before the command was sent: a later one of the owner had no field
    /// then.
    pub(crate) fn kin_sent(&self, sent: Instant, until: Instant) {
        if self.0.born > sent {
            return;
        }
        let mut state = self.state();
        state.kept = state.kept.max(until);
    }

    /// A read request of this (write) hold's owner on its key, first sent at `sent`, was granted
    /// and then given back by its cancellation (see `Request::kept_by_cancel`): the key, and so
    /// this hold's field, lasts until `until`. Its deadline moves there if the client knew of
    /// the hold before the request went out and it is still confirmed now ([`Self::outlast`]).
    pub(crate) fn kept_by_cancel(&self, sent: Instant, until: Instant) {
        if self.0.born <= sent {
            self.kin_sent(sent, until);
            self.outlast(until);
        }
    }

    /// Resolves once no release of the hold is in flight (none sent, or it was answered or
    /// given up): only then may a later hold of the same owner on the same side be asked for,
    /// or a release of this one reaching the server late could end that later hold instead.
    pub(crate) async fn released(&self) {
        let mut releasing = self.0.releasing.subscribe();
        let _ = releasing.wait_for(|r| !*r).await;
    }

    /// Marks the hold lost (every guard sees it) and stops its watchdog.
    pub(crate) fn lose(&self) {
        self.0.lost.send_replace(true);
        if let Some(renewal) = self.state().renewal.take() {
            renewal.abort();
        }
    }

    /// Its owner id is shared with other holds (an [`crate::Owner`]'s): a guard of it that is
    /// known lost (found gone, or its deadline passed unconfirmed) sends a release only while
    /// its count may still be on the server ([`Self::may_remain`]); a later hold of the same
    /// owner on its side is asked for only once that release was answered or given up
    /// ([`Self::released`]), so the release never ends it.
    pub(crate) fn share_owner(&self) {
        self.state().shared_owner = true;
    }

    /// This read hold's owner holds the write side too (`write`, live): the server keeps the
    /// write field as long as the key, and every lease this hold gets confirmed keeps the key
    /// (a read-write lock's expiry covers every hold on it, a read release never shortens it
    /// while a writer holds). So whatever this hold is confirmed until, from now on, the write
    /// hold is too: its guard is not told lost (and so not kept from releasing) while its field
    /// is still on the server.
    pub(crate) fn cover(&self, write: &Hold) {
        self.state().covers = Some(write.downgrade());
        if let Some(until) = self.until() {
            write.outlast(until);
        }
    }

    /// The write hold this (read) hold's leases keep, if any (live or not).
    fn covered(&self) -> Option<Hold> {
        let weak = self.state().covers.as_ref().map(|w| Weak::clone(&w.0))?;
        weak.upgrade().map(Hold)
    }

    /// Passes a confirmation of this (read) hold until `until` on to the write hold it covers.
    fn confirm_covered(&self, until: Instant) {
        if let Some(write) = self.covered().filter(|w| !w.is_lost()) {
            write.outlast(until);
        }
    }

    /// The server keeps this write hold at least until `until` (a read hold of its owner on its
    /// key was confirmed until then): its deadline moves there, if it is still confirmed now
    /// (then its field was on the server when that read hold's command ran).
    fn outlast(&self, until: Instant) {
        if *self.0.lost.borrow() {
            return;
        }
        let mut state = self.state();
        if state.until > Instant::now() {
            state.until = state.until.max(until);
        }
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
    /// confirmed it (every permit id, for leased permits) and, with [`Options::replica_ack`] /
    /// [`Options::aof_ack`], the replicas acknowledged it as they did the grant: a renewal a
    /// failover could undo (made on a master whose replica was just promoted) extends no
    /// deadline (an `Err`: nothing concluded, the watchdog tries again).
    ///
    /// [`Options::replica_ack`]: crate::Options::replica_ack
    /// [`Options::aof_ack`]: crate::Options::aof_ack
    async fn renew_on_server(&self, lease_ms: u64, gt: bool) -> Result<bool> {
        let mut pipe = redis::pipe();
        for mut cmd in self.0.kind.renew(&self.0.key, &self.0.holder, lease_ms) {
            if gt {
                cmd.arg("GT");
            }
            pipe.add_command(cmd);
        }
        let mut conn = self.0.shared.conn.clone();
        let replies: Vec<Value> = pipe.query_async(&mut conn).await?;
        let renewed = crate::engine::kind::Kind::renewed(&replies)?;
        if renewed {
            crate::engine::outcome::acknowledged(&self.0.shared.options, &mut conn).await?;
        }
        Ok(renewed)
    }

    /// Renews the hold for at least `lease`, never below what is confirmed already nor below
    /// what a renewal sent before asked for (so no guard's deadline is ever shortened on the
    /// server); pushes the deadline to the send time plus that when confirmed (capped by the
    /// renewals in flight meanwhile, which the server may run after it), marks the hold lost
    /// when the server says it is gone.
    ///
    /// # Errors
    /// When Redis fails (nothing is concluded then).
    pub(crate) async fn renew(&self, lease: Duration) -> Result<bool> {
        if self.until().is_none() {
            return Ok(false);
        }
        let sent = Instant::now();
        let (ticket, needed_ms, confirms) = {
            let mut state = self.state();
            let floor = state.until.max(state.asked);
            let needed_ms = millis(lease.max(floor.saturating_duration_since(sent)));
            let asked = after(sent, Duration::from_millis(needed_ms));
            let cap = state.in_flight.iter().map(|(_, at)| *at).min();
            state.asked = state.asked.max(asked);
            state.tickets += 1;
            let ticket = state.tickets;
            state.in_flight.push((ticket, asked));
            (ticket, needed_ms, cap.map_or(asked, |cap| cap.min(asked)))
        };
        let needed = Duration::from_millis(needed_ms);
        let covered = self.covered();
        if let Some(write) = &covered {
            write.kin_sent(sent, after(sent, needed));
        }
        let in_flight = InFlight { hold: self, ticket };
        // An owner's hold: `GT`, so a renewal or re-entry reaching the server late (after a
        // longer one sent later, on another connection or after a reconnect) never shortens the
        // lease a live guard relies on.
        let gt = self.0.kind.takes_gt() && self.state().shared_owner;
        let renewed = self.renew_on_server(needed_ms, gt).await;
        drop(in_flight);
        if let Some(write) = &covered {
            // It ran before its reply came: the key's lease ends by now plus the lease.
            write.kin_sent(sent, after(Instant::now(), needed));
        }
        if renewed? {
            let mut state = self.state();
            state.until = state.until.max(confirms);
            drop(state);
            self.confirm_covered(confirms);
            Ok(true)
        } else {
            self.gone();
            Ok(false)
        }
    }

    /// Sets the lease to exactly `lease` (it may shorten it: MultiLock's real lease after
    /// taking every lock with a longer one); the deadline becomes the send time plus `lease`.
    ///
    /// # Errors
    /// When Redis fails.
    pub(crate) async fn reset_lease(&self, lease: Duration) -> Result<bool> {
        let sent = Instant::now();
        let lease_ms = millis(lease);
        let renewed = self.renew_on_server(lease_ms, false).await?;
        if renewed {
            let mut state = self.state();
            state.until = after(sent, Duration::from_millis(lease_ms));
            state.asked = state.until;
        } else {
            self.gone();
        }
        Ok(renewed)
    }
}

/// A lease-setting command of a hold in flight: leaves the hold's list when it ends (or is
/// dropped).
struct InFlight<'a> {
    hold: &'a Hold,
    ticket: u64,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.hold.state().in_flight.retain(|(ticket, _)| *ticket != self.ticket);
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
