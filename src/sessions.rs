//! Session holds, the plain-Rust part: which client connection each session hold is bound to
//! (`SESSION` on an acquire), the holds whose connection closed and that wait to be ended, and
//! the lock-delay rule. No Redis here: `waiting::session` drives it, unit tests drive it
//! directly.
//!
//! A binding is one hold: a reentrant lock's whole hold by one owner (every re-entry), one side
//! of a read-write lock held by one owner (all its read holds, or its write hold), or one leased
//! permit (by id). It records the client it is bound to, its lock-delay and the latest lease end
//! rlock knows for the hold (`until`): past it the hold ended by its lease, and the binding is
//! stale (dropped, never applied to a later hold). Every binding is indexed by client (a closed
//! connection finds its holds in O(its holds)), by lock (a force-release or a flush drops a
//! lock's bindings) and by `until` (expired bindings are pruned, so a connection's bindings are
//! bounded by the holds it has).

use std::collections::{BTreeMap, HashMap, HashSet};

use crate::error::LockError;
use crate::queue::LockName;

/// A client connection's id (`CLIENT ID`): never reused while the server runs.
pub type ClientId = u64;

/// The longest `LOCKDELAY` (ms): Chubby's and Consul's bound (a minute). The delay is further
/// capped by the ended hold's own lease ([`delay_until`]).
pub const MAX_LOCK_DELAY_MS: u64 = 60_000;

/// The owner that holds a lock during its lock-delay (a reentrant lock's only holder, a
/// read-write lock's writer or reader): reserved, no client may acquire or renew as it.
pub const PLACEHOLDER: &[u8] = b"rlock:lockdelay";

/// The member that holds a leased permit during its lock-delay, in the lease zset in place of
/// the permit's id `id` (which leaves at once: that grant ended): [`PLACEHOLDER`], `:`, the id.
/// Reserved: `RSEM.RENEW` refuses it ([`check_permit`]).
#[must_use]
pub fn permit_placeholder(id: &[u8]) -> Vec<u8> {
    [PLACEHOLDER, b":", id].concat()
}

/// Refuses a lock-delay's placeholder permit ([`permit_placeholder`]) as the id of a renewal:
/// nobody holds it, and a delay must not be made longer.
///
/// # Errors
/// [`LockError::LockDelayPermit`].
pub fn check_permit(id: &[u8]) -> Result<(), LockError> {
    if id.len() > PLACEHOLDER.len() && id.starts_with(PLACEHOLDER) && id[PLACEHOLDER.len()] == b':'
    {
        Err(LockError::LockDelayPermit)
    } else {
        Ok(())
    }
}

/// Refuses [`PLACEHOLDER`] as the owner of an acquire or a renewal.
///
/// # Errors
/// [`LockError::LockDelayOwner`].
pub fn check_owner(owner: &[u8]) -> Result<(), LockError> {
    if owner == PLACEHOLDER {
        Err(LockError::LockDelayOwner)
    } else {
        Ok(())
    }
}

/// What a `SESSION` acquire asks: bind the hold to this client, with this lock-delay.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bind {
    pub client: ClientId,
    /// `LOCKDELAY ms` (0: none).
    pub delay_ms: u64,
}

/// Which hold of a lock a binding is.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Held {
    /// A reentrant lock held by this owner (every re-entry).
    Lock(Vec<u8>),
    /// A read-write lock's read holds of this owner (all of them).
    Read(Vec<u8>),
    /// A read-write lock's write hold of this owner (every re-entry).
    Write(Vec<u8>),
    /// A semaphore's leased permit with this id.
    Permit(Vec<u8>),
}

/// A hold on a lock.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Hold {
    pub lock: LockName,
    pub held: Held,
}

/// A hold's binding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Binding {
    pub bind: Bind,
    /// The latest lease end (Unix ms) rlock set or saw for the hold: past it, the binding is
    /// stale.
    pub until: i64,
}

impl Binding {
    /// Whether the hold's lease ended by `now` as far as rlock knows (Redis expires a key once
    /// now > deadline): its binding must not end anything.
    #[must_use]
    pub const fn stale(&self, now: i64) -> bool {
        now > self.until
    }
}

/// When a lock-delay that begins at `now` ends (Unix ms): `delay_ms` later, but never after the
/// ended hold's own lease end `lease_until` (`None`: no expiry), so a session never keeps a lock
/// from others longer than its lease would have. `None`: no delay.
#[must_use]
pub fn delay_until(now: i64, delay_ms: u64, lease_until: Option<i64>) -> Option<i64> {
    if delay_ms == 0 {
        return None;
    }
    let delay = i64::try_from(delay_ms.min(MAX_LOCK_DELAY_MS)).unwrap_or(0);
    let until = now.saturating_add(delay);
    let until = lease_until.map_or(until, |lease| lease.min(until));
    (until > now).then_some(until)
}

/// Every session binding of this server, and the holds waiting to be ended.
#[derive(Debug, Default)]
pub struct Sessions {
    bound: HashMap<Hold, (Binding, u64)>,
    by_client: HashMap<ClientId, HashSet<Hold>>,
    by_lock: HashMap<LockName, HashSet<Held>>,
    /// (until, sequence) -> hold: the pruning order.
    expiry: BTreeMap<(i64, u64), Hold>,
    /// Holds whose connection closed, to be ended (by the module's timer).
    ending: BTreeMap<Hold, Binding>,
    next_seq: u64,
}

/// How a touch sets a binding's end ([`Sessions::touch`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lasts {
    /// The hold now ends exactly then (a lock's or write side's lease, a renewal of every hold).
    Exactly,
    /// One more hold ending then, beside others (a read re-entry): the later of the two ends.
    AtLeast,
}

/// The bindings and pending ends a flush dropped ([`Sessions::flushed`]).
#[derive(Debug, Default)]
pub struct Dropped {
    pub bound: Vec<(Hold, Binding)>,
    pub ending: Vec<(Hold, Binding)>,
}

impl Dropped {
    /// Whether the flush dropped nothing.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.bound.is_empty() && self.ending.is_empty()
    }
}

/// How many expired bindings a new binding prunes on its way (the rest go at the next cron).
const PRUNE_ON_BIND: usize = 4;

impl Sessions {
    /// How many holds are bound now.
    #[must_use]
    pub fn len(&self) -> usize {
        self.bound.len()
    }

    /// Whether no hold is bound and none waits to be ended (the fast path of every grant).
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.bound.is_empty() && self.ending.is_empty()
    }

    /// Whether any hold of `lock` is bound or waits to be ended.
    #[must_use]
    pub fn concerns(&self, lock: &LockName) -> bool {
        self.by_lock.contains_key(lock) || self.ending_of(lock).next().is_some()
    }

    /// The holds of `lock` waiting to be ended: one range of [`Self::ending`]'s order (a
    /// hold sorts by its lock first), so finding them costs O(log n), not a scan.
    fn ending_of<'a>(&'a self, lock: &'a LockName) -> impl Iterator<Item = &'a Hold> + 'a {
        let first = Hold { lock: lock.clone(), held: Held::Lock(Vec::new()) };
        self.ending.range(first..).map(|(hold, _)| hold).take_while(move |h| h.lock == *lock)
    }

    /// The binding of `hold`, if it is bound.
    #[must_use]
    pub fn get(&self, hold: &Hold) -> Option<Binding> {
        self.bound.get(hold).map(|(b, _)| *b)
    }

    /// The holds bound to `client`.
    #[must_use]
    pub fn holds_of(&self, client: ClientId) -> Vec<Hold> {
        self.by_client.get(&client).map(|h| h.iter().cloned().collect()).unwrap_or_default()
    }

    /// A fresh grant of `hold` (nobody held it as this owner, or a new permit): its old binding
    /// (and any end waiting for it) goes, and with `bind` it is bound until `until` at `now`.
    pub fn granted(&mut self, hold: Hold, bind: Option<Bind>, until: i64, now: i64) {
        self.unbind(&hold);
        let Some(bind) = bind else { return };
        self.prune(now, PRUNE_ON_BIND);
        let seq = self.next_seq;
        self.next_seq += 1;
        self.expiry.insert((until, seq), hold.clone());
        self.by_client.entry(bind.client).or_default().insert(hold.clone());
        self.by_lock.entry(hold.lock.clone()).or_default().insert(hold.held.clone());
        self.bound.insert(hold, (Binding { bind, until }, seq));
    }

    /// The bound `hold` (a re-entry, a renewal) now lasts until `until` (with `Lasts::AtLeast`,
    /// until the later of `until` and its binding's end: a read re-entry adds one hold beside
    /// the owner's others); the binding stays where it is. Nothing for a hold that is not bound.
    ///
    /// A binding already stale at `now` is never revived: the hold it was made for ended by its
    /// lease (a read hold's own key expired, say, while the owner's field lingered), so this
    /// grant is a fresh hold, bound to `bind`'s connection or to none.
    pub fn touch(&mut self, hold: &Hold, until: i64, lasts: Lasts, bind: Option<Bind>, now: i64) {
        let Some((binding, seq)) = self.bound.get_mut(hold) else { return };
        if binding.stale(now) {
            self.granted(hold.clone(), bind, until, now);
            return;
        }
        let until = match lasts {
            Lasts::Exactly => until,
            Lasts::AtLeast => until.max(binding.until),
        };
        if binding.until == until {
            return;
        }
        self.expiry.remove(&(binding.until, *seq));
        binding.until = until;
        self.expiry.insert((until, *seq), hold.clone());
    }

    /// Whether a hold of `lock` waits to be ended (its connection closed): every command on the
    /// lock applies those ends before it reads it.
    #[must_use]
    pub fn ending(&self, lock: &LockName) -> bool {
        !self.ending.is_empty() && self.ending_of(lock).next().is_some()
    }

    /// Takes the holds of `lock` waiting to be ended (at most `limit`), in [`Self::take_ending`]'s
    /// order.
    pub fn take_ending_of(&mut self, lock: &LockName, limit: usize) -> Vec<(Hold, Binding)> {
        let holds: Vec<Hold> = self.ending_of(lock).take(limit).cloned().collect();
        holds.into_iter().filter_map(|h| self.ending.remove(&h).map(|b| (h, b))).collect()
    }

    /// `hold` ended (released, given back): its binding goes, and any end waiting for it.
    pub fn unbind(&mut self, hold: &Hold) {
        self.ending.remove(hold);
        let Some((binding, seq)) = self.bound.remove(hold) else { return };
        self.expiry.remove(&(binding.until, seq));
        if let Some(holds) = self.by_client.get_mut(&binding.bind.client) {
            holds.remove(hold);
            if holds.is_empty() {
                self.by_client.remove(&binding.bind.client);
            }
        }
        if let Some(held) = self.by_lock.get_mut(&hold.lock) {
            held.remove(&hold.held);
            if held.is_empty() {
                self.by_lock.remove(&hold.lock);
            }
        }
    }

    /// Every hold of `lock` ended (a force-release, the lock freed): their bindings go.
    pub fn unbind_lock(&mut self, lock: &LockName) {
        if !self.ending.is_empty() {
            let ended: Vec<Hold> = self.ending_of(lock).cloned().collect();
            for hold in &ended {
                self.ending.remove(hold);
            }
        }
        let Some(held) = self.by_lock.get(lock) else { return };
        let holds: Vec<Hold> =
            held.iter().map(|held| Hold { lock: lock.clone(), held: held.clone() }).collect();
        for hold in &holds {
            self.unbind(hold);
        }
    }

    /// `client`'s connection closed: its holds leave their bindings and wait to be ended.
    /// Returns whether there is any.
    pub fn closed(&mut self, client: ClientId) -> bool {
        let Some(holds) = self.by_client.get(&client) else { return false };
        let holds: Vec<Hold> = holds.iter().cloned().collect();
        for hold in holds {
            if let Some(binding) = self.get(&hold) {
                self.unbind(&hold);
                self.ending.insert(hold, binding);
            }
        }
        true
    }

    /// Whether holds wait to be ended.
    #[must_use]
    pub fn ends_pending(&self) -> bool {
        !self.ending.is_empty()
    }

    /// Takes at most `limit` of the holds waiting to be ended, in a stable order (by lock, so
    /// the holds of one lock come together); the rest stay for the next call.
    pub fn take_ending(&mut self, limit: usize) -> Vec<(Hold, Binding)> {
        let mut taken = Vec::with_capacity(limit.min(self.ending.len()));
        while taken.len() < limit {
            let Some(end) = self.ending.pop_first() else { break };
            taken.push(end);
        }
        taken
    }

    /// Takes the holds of `lock` waiting to be ended that are `like` what they hold (the read
    /// sides of one lock, its permits: each kind comes together in [`Self::take_ending`]'s
    /// order), at most `limit` of them, in that order.
    pub fn take_ending_like(
        &mut self,
        lock: &LockName,
        like: impl Fn(&Held) -> bool,
        limit: usize,
    ) -> Vec<(Hold, Binding)> {
        if self.ending.is_empty() {
            return Vec::new();
        }
        let holds: Vec<Hold> =
            self.ending_of(lock).filter(|h| like(&h.held)).take(limit).cloned().collect();
        holds.into_iter().filter_map(|h| self.ending.remove(&h).map(|b| (h, b))).collect()
    }

    /// Holds taken to be ended and not ended yet (the work budget of the timer tick ran out):
    /// they wait again, for the next tick.
    pub fn put_back(&mut self, ends: impl IntoIterator<Item = (Hold, Binding)>) {
        self.ending.extend(ends);
    }

    /// Drops up to `limit` bindings whose lease ended by `now` (they are stale); returns how
    /// many went.
    pub fn prune(&mut self, now: i64, limit: usize) -> usize {
        let mut pruned = 0;
        while pruned < limit {
            let Some((&(until, _), hold)) = self.expiry.iter().next() else { break };
            if until >= now {
                break;
            }
            let hold = hold.clone();
            self.unbind(&hold);
            pruned += 1;
        }
        pruned
    }

    /// Database `db` (`None`: every database) was flushed: its holds are gone, and so are their
    /// bindings and ends. Returns what went, for [`Self::restore`] should the flush be a
    /// reload's (`DEBUG RELOAD` empties the databases, then loads the same data back).
    pub fn flushed(&mut self, db: Option<i32>) -> Dropped {
        let flushed = |lock: &LockName| db.is_none_or(|db| lock.db == db);
        let bound: Vec<(Hold, Binding)> = self
            .bound
            .iter()
            .filter(|(h, _)| flushed(&h.lock))
            .map(|(h, (b, _))| (h.clone(), *b))
            .collect();
        for (hold, _) in &bound {
            self.unbind(hold);
        }
        let (ending, kept): (BTreeMap<_, _>, BTreeMap<_, _>) =
            std::mem::take(&mut self.ending).into_iter().partition(|(hold, _)| flushed(&hold.lock));
        self.ending = kept;
        Dropped { bound, ending: ending.into_iter().collect() }
    }

    /// Puts back what a flush dropped ([`Self::flushed`]): the data came back (a reload).
    pub fn restore(&mut self, dropped: Dropped) {
        for (hold, binding) in dropped.bound {
            self.granted(hold, Some(binding.bind), binding.until, i64::MIN);
        }
        for (hold, binding) in dropped.ending {
            if !self.bound.contains_key(&hold) {
                self.ending.insert(hold, binding);
            }
        }
    }

    /// `SWAPDB first second`: the bindings, and the ends waiting to be applied, follow their
    /// holds to the other database. The pending ends are set aside first: moving a binding
    /// re-grants its hold under the other database's number, which must not cancel the end
    /// waiting there for the hold of the same owner that moves the other way.
    pub fn swapped(&mut self, first: i32, second: i32) {
        let ending = std::mem::take(&mut self.ending);
        let swap = |lock: &LockName| {
            let db = match lock.db {
                db if db == first => second,
                db if db == second => first,
                db => db,
            };
            LockName { db, key: lock.key.clone() }
        };
        let moved: Vec<(Hold, Binding)> = self
            .bound
            .iter()
            .filter(|(h, _)| h.lock.db == first || h.lock.db == second)
            .map(|(h, (b, _))| (h.clone(), *b))
            .collect();
        for (hold, _) in &moved {
            self.unbind(hold);
        }
        for (hold, binding) in moved {
            let hold = Hold { lock: swap(&hold.lock), held: hold.held };
            self.granted(hold, Some(binding.bind), binding.until, i64::MIN);
        }
        self.ending = ending
            .into_iter()
            .map(|(hold, b)| (Hold { lock: swap(&hold.lock), held: hold.held }, b))
            .collect();
    }

    /// Forgets everything (the server is no longer a master: its holds end with their leases).
    pub fn clear(&mut self) {
        *self = Self { next_seq: self.next_seq, ..Self::default() };
    }
}
