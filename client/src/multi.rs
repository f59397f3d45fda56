//! Locks over several independent servers: [`MultiLock`] (all of them) and its guard,
//! [`MultiGuard`], also [`crate::RedLock`]'s. Every grant is a request of the hold engine
//! with an owner id of its own, so a guard acts only on its own grants.

use std::fmt;
use std::time::Duration;

use tokio::time::Instant;

use crate::engine::hold::{after, Hold, Member};
use crate::engine::kind::{Holder, Kind};
use crate::engine::request::Request;
use crate::engine::resume;
use crate::engine::{bound, checked_lease, millis, uncertain, SETTLE};
use crate::error::{Error, Result};
use crate::lock::Lock;

/// Whether `e` is a refusal by a server that is not (or not yet) the master: nothing ran.
fn not_master(e: &Error) -> bool {
    matches!(e, Error::Redis(e) if crate::conn::not_master(e))
}

/// How long a [`MultiLock`] guard's release waits for each server (in parallel).
const MULTI_RELEASE_TIMEOUT: Duration = Duration::from_secs(5);

/// The same named lock on N independent servers, held on all of them or none (Redisson's
/// MultiLock). Taking it never holds one lock while waiting for another: when one is busy, the
/// ones taken are given back and the client waits (server-side) for the busy one, then tries
/// the others again. Each acquire takes the locks under a fresh owner id per server
/// (`<handle owner>:<n>`): its guard is tied to that grant, and a second acquire while a guard
/// lives waits for it (a MultiLock does not re-enter).
#[derive(Debug, Clone)]
pub struct MultiLock {
    locks: Vec<Lock>,
}

impl MultiLock {
    /// `locks`: one handle per server, e.g. `clients.iter().map(|c| c.lock("name"))` (an
    /// [`crate::Owner`]'s handles too: the grants still take fresh owner ids, never the
    /// owner's). Never panics: an empty list, a read-write lock's side, or one lock of one
    /// client given twice (it would wait for itself) makes every acquire fail with
    /// [`Error::InvalidArgument`] before anything is sent.
    #[must_use]
    pub const fn new(locks: Vec<Lock>) -> Self {
        Self { locks }
    }

    /// The arguments' check (see [`MultiLock::new`]).
    fn check(&self) -> Result<()> {
        let invalid = |why: &str| Err(Error::InvalidArgument(format!("a MultiLock {why}")));
        if self.locks.is_empty() {
            return invalid("needs at least one lock");
        }
        if self.locks.iter().any(|l| l.chain().kind() != Kind::Lock) {
            return invalid("takes reentrant locks, not the sides of a read-write lock");
        }
        for (i, a) in self.locks.iter().enumerate() {
            let same = |b: &Lock| {
                std::sync::Arc::ptr_eq(a.chain().shared(), b.chain().shared())
                    && a.name() == b.name()
            };
            if self.locks[i + 1..].iter().any(same) {
                return invalid("was given one lock of one client twice: it would wait for itself");
            }
        }
        Ok(())
    }

    /// Takes every lock, waiting as long as it takes. `lease: None` uses the watchdog.
    ///
    /// # Errors
    /// [`Error::ZeroLease`] for a zero lease, [`Error::InvalidArgument`] for a lease beyond
    /// [`crate::MAX_DURATION`] or bad locks (see [`MultiLock::new`]; nothing sent);
    /// [`Error::Redis`] when a server fails (every lock taken is given back first).
    pub async fn acquire(&self, lease: Option<Duration>) -> Result<MultiGuard> {
        self.acquire_within(None, lease).await
    }

    /// Takes every lock, waiting at most `wait` (`Duration::ZERO`: one round of tries).
    ///
    /// # Errors
    /// [`Error::TimedOut`] when `wait` passes first, or a server did not answer in time;
    /// otherwise as [`MultiLock::acquire`].
    pub async fn try_acquire(&self, wait: Duration, lease: Option<Duration>) -> Result<MultiGuard> {
        self.acquire_within(crate::engine::deadline_after(wait), lease).await
    }

    async fn acquire_within(
        &self,
        deadline: Option<Instant>,
        lease_given: Option<Duration>,
    ) -> Result<MultiGuard> {
        self.check()?;
        let watchdog_timeout = self.locks[0].chain().shared().options.watchdog_timeout;
        let lease = checked_lease("a lease", lease_given.unwrap_or(watchdog_timeout))?;
        let watchdog = lease_given.is_none().then_some(lease);
        // Each lock is first taken with a longer lease, so the first ones cannot lapse while
        // the last ones are taken; the real lease is set on all of them at the end.
        let taking = lease.saturating_mul(2);
        let mut waited_for: Option<(usize, Request)> = None;
        let mut pause = resume::RETRY_FIRST;
        'rounds: loop {
            // This round's requests: given back (cancelled) unless handed to a guard, whatever
            // ends the round, the future dropped included.
            let mut taken: Vec<(usize, Request)> = waited_for.take().into_iter().collect();
            let mut busy = None;
            for (i, lock) in self.locks.iter().enumerate() {
                if taken.iter().any(|(j, _)| *j == i) {
                    continue;
                }
                let mut request = request(lock, taking);
                match request.try_once(bound(deadline, Instant::now())).await {
                    Ok(Some(_)) => taken.push((i, request)),
                    Ok(None) => {
                        busy = Some(i);
                        break;
                    }
                    Err(e) => {
                        let lost = request.try_lost();
                        drop(request); // its outcome is unknown: cancelled in the background
                        cancel_all(&mut taken, settle_within(deadline)).await;
                        if deadline.is_none() && lost {
                            // An untimed acquire outlives a killed connection, as a single
                            // lock's does: everything given back, then a new round.
                            tokio::time::sleep(Duration::from_millis(20)).await;
                            continue 'rounds;
                        }
                        let now = Instant::now();
                        let left = deadline.map(|d| d.saturating_duration_since(now));
                        if not_master(&e) && left != Some(Duration::ZERO) {
                            // Refused by a server that is not (or not yet) the master to ask
                            // (the old master during a failover: nothing ran), with time left:
                            // a new round where the key is served now, as a single lock's
                            // acquire waits there.
                            tokio::time::sleep(left.map_or(pause, |l| l.min(pause))).await;
                            pause = pause.saturating_mul(2).min(resume::RETRY_MAX);
                            continue 'rounds;
                        }
                        return Err(if uncertain(&e) { Error::TimedOut } else { e });
                    }
                }
            }
            let Some(busy) = busy else {
                match self.set_lease(&mut taken, lease, watchdog, deadline).await? {
                    Some(guard) => return Ok(guard),
                    None => continue, // a lock was lost meanwhile: start over
                }
            };
            cancel_all(&mut taken, settle_within(deadline)).await;
            if deadline.is_some_and(|d| d <= Instant::now()) {
                return Err(Error::TimedOut);
            }
            let mut request = request(&self.locks[busy], taking);
            if request.wait(deadline).await?.is_none() {
                return Err(Error::TimedOut);
            }
            waited_for = Some((busy, request));
        }
    }

    /// Every lock taken: sets the real lease on all of them and hands them to a guard; `None`
    /// when one was lost meanwhile (all are given back).
    async fn set_lease(
        &self,
        taken: &mut [(usize, Request)],
        lease: Duration,
        watchdog: Option<Duration>,
        deadline: Option<Instant>,
    ) -> Result<Option<MultiGuard>> {
        let holds: Vec<Hold> = taken
            .iter()
            .map(|(i, request)| hold(&self.locks[*i], request, lease.saturating_mul(2)))
            .collect();
        let renewals = holds.iter().map(|h| h.reset_lease(lease));
        let (mut all, mut failed) = (true, None);
        for renewed in futures_util::future::join_all(renewals).await {
            match renewed {
                Ok(renewed) => all &= renewed,
                Err(e) => {
                    failed.get_or_insert(e);
                }
            }
        }
        if let Some(e) = failed {
            cancel_all(taken, settle_within(deadline)).await;
            return Err(if uncertain(&e) { Error::TimedOut } else { e });
        }
        if !all {
            cancel_all(taken, settle_within(deadline)).await;
            return Ok(None);
        }
        let members = guard_members(&holds, taken, watchdog);
        Ok(Some(MultiGuard::new(members, self.locks.len(), MULTI_RELEASE_TIMEOUT)))
    }
}

/// A request for `lock`'s name on its server under a fresh owner id of its handle (never an
/// [`crate::Owner`]'s own id: see [`crate::engine::chain::Chain::fresh_owner`]).
pub(crate) fn request(lock: &Lock, lease: Duration) -> Request {
    let chain = lock.chain();
    Request::new(chain.shared(), chain.key(), Kind::Lock, chain.fresh_owner(), millis(lease))
        .session(chain.session())
}

/// The hold a granted request of `lock` got, confirmed for `lease` from its send time.
pub(crate) fn hold(lock: &Lock, request: &Request, lease: Duration) -> Hold {
    let chain = lock.chain();
    let holder = Holder::Owner(std::sync::Arc::clone(request.owner()));
    let until = after(request.sent(), lease);
    let hold = Hold::new(chain.shared(), chain.key(), Kind::Lock, holder, None, until);
    // A session lock's hold: lost at once if its session closed meanwhile.
    let _ = request.bind(&hold);
    hold
}

/// Guards on `holds`, taking them from their requests (which then cancel nothing).
pub(crate) fn guard_members<T>(
    holds: &[Hold],
    taken: &mut [(T, Request)],
    watchdog: Option<Duration>,
) -> Vec<Member> {
    holds
        .iter()
        .zip(taken.iter_mut())
        .filter_map(|(hold, (_, request))| {
            let member = hold.join(watchdog)?;
            request.taken();
            Some(member)
        })
        .collect()
}

/// Cancels every request and waits (in parallel) at most `max` for the servers to confirm;
/// the releaser finishes what is left.
pub(crate) async fn cancel_all<T>(taken: &mut [(T, Request)], max: Duration) {
    futures_util::future::join_all(taken.iter_mut().map(|(_, r)| r.cancel(max))).await;
}

/// How long a call with `deadline` may wait for cancellations: [`SETTLE`], within its bound.
fn settle_within(deadline: Option<Instant>) -> Duration {
    let now = Instant::now();
    bound(deadline, now).map_or(SETTLE, |b| b.saturating_duration_since(now).min(SETTLE))
}

/// A lock held on several servers ([`MultiLock`]: all; [`crate::RedLock`]: a majority), one
/// hold per server that granted it. Release it with [`MultiGuard::release`]; dropping it hands
/// every release to the clients' background releasers (it never blocks).
#[must_use = "dropping the guard releases the lock"]
pub struct MultiGuard {
    members: Vec<Member>,
    quorum: usize,
    /// How long a release waits for each server (in parallel).
    node_timeout: Duration,
    pub(crate) validity: Option<Duration>,
}

impl fmt::Debug for MultiGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MultiGuard")
            .field("servers", &self.members.len())
            .field("lost", &self.members.iter().map(|m| m.hold().is_lost()).collect::<Vec<_>>())
            .field("quorum", &self.quorum)
            .field("validity", &self.validity)
            .finish_non_exhaustive()
    }
}

impl MultiGuard {
    pub(crate) const fn new(members: Vec<Member>, quorum: usize, node_timeout: Duration) -> Self {
        Self { members, quorum, node_timeout, validity: None }
    }

    /// For a [`crate::RedLock`]: how long the lock was valid for when it was granted (the lease
    /// minus the time taking it took minus the drift allowance). `None` for a [`MultiLock`].
    #[must_use]
    pub const fn validity(&self) -> Option<Duration> {
        self.validity
    }

    fn live(&self) -> usize {
        self.members.iter().filter(|m| !m.hold().is_lost()).count()
    }

    /// Whether too few servers still hold it (a server's hold is lost as a [`crate::LockGuard`]
    /// is: found gone, or its deadline passed unconfirmed).
    #[must_use]
    pub fn is_lost(&self) -> bool {
        self.live() < self.quorum
    }

    /// Resolves when the lock is lost (see [`MultiGuard::is_lost`]).
    pub async fn lost(&self) {
        loop {
            // The members still live are taken first, then the count: a member lost in between
            // is counted (never waited for), and every later loss is one of these waking.
            let watching: Vec<_> = self
                .members
                .iter()
                .filter(|m| !m.hold().is_lost())
                .map(|m| Box::pin(m.hold().lost()))
                .collect();
            if self.is_lost() || watching.is_empty() {
                return;
            }
            futures_util::future::select_all(watching).await;
        }
    }

    /// Releases the lock on every server (in parallel, each bounded by the node timeout; a
    /// release that does not answer in time goes on in the background).
    ///
    /// # Errors
    /// [`Error::NotHeld`] when fewer servers than required (all, or a majority) still held it.
    pub async fn release(self) -> Result<()> {
        let Self { members, quorum, node_timeout, .. } = self;
        let releases = members.into_iter().map(|m| tokio::time::timeout(node_timeout, m.release()));
        let released = futures_util::future::join_all(releases).await;
        if released.iter().filter(|r| matches!(r, Ok(Ok(())))).count() >= quorum {
            Ok(())
        } else {
            Err(Error::NotHeld)
        }
    }
}
