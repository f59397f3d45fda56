//! Deadlock detection, as plain Rust: the wait-for graph of the owners on one server, searched
//! from a wait about to be queued, within a fixed budget. The graph is read through [`Graph`]
//! (the queues and the lock keys, in `waiting`); unit tests drive it with a graph of their own.
//!
//! An edge `X -> H` means: owner X waits (in some queue) for a lock that owner H holds now, and
//! X cannot be granted before H's hold ends. Only such edges are followed:
//! - a reentrant lock's waiter -> the lock's holder;
//! - a read-write lock's `WRITE` waiter -> its writer and every live reader; a `READ` waiter ->
//!   its writer, when the mode is `write`. A `READ` waiter of a lock in `read` mode waits behind
//!   a queued writer (fairness), not for the readers: no edge (a deadlock through it is missed,
//!   never invented);
//! - a reader is live while one of its read holds is (its hold keys' leases; a reader whose every
//!   hold ended is not a holder any more, whatever the hash still says);
//! - semaphore waiters have no owner: they are not in the graph.
//!
//! A wait by owner A for lock L closes a cycle when a path leads from a blocker of A on L back
//! to A. The search is breadth-first (the shortest cycle is reported), follows only owners
//! that wait somewhere (one index lookup: most searches end at the lock's holders) and stops after
//! [`MAX_STEPS`] steps (an edge looked at, a queued wait looked up, a hash field or a hold key
//! read): past it, no deadlock is claimed. Every edge of a reported cycle was read from the
//! data as it is at that instant, so a reported cycle exists.

use std::collections::{HashMap, VecDeque};
use std::hash::Hash;

use crate::error::shown;
use crate::names::{MODE_FIELD, WRITE_SUFFIX};

/// The most steps one search takes (see the module's docs): a few µs of the server's time.
pub const MAX_STEPS: usize = 1_000;

/// The most bytes of lock hash fields and values one search copies: past it, no deadlock is
/// claimed (as past [`MAX_STEPS`]).
pub const MAX_BYTES: usize = 1 << 20;

/// The longest text of a reported cycle (bytes, before `; ...`): an error reply stays short.
pub const MAX_TEXT: usize = 1_024;

/// What a waiter asks of its lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wants {
    /// A reentrant lock.
    Lock,
    /// A read-write lock's read side.
    Read,
    /// A read-write lock's write side.
    Write,
}

/// A lock's holders as they are now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Holders {
    /// A reentrant lock's hash: its fields' owners (one, unless a foreign writer added some).
    Lock(Vec<Vec<u8>>),
    /// A read-write lock: whether its mode is `write`, its writer, its readers with their
    /// read hold counts.
    Rw { write: bool, writer: Option<Vec<u8>>, readers: Vec<(Vec<u8>, u64)> },
    /// Free, another type, or not readable by the caller: nobody to wait for.
    Nobody,
}

/// A holder that blocks a waiter: its owner and, for a reader, its read hold count (its
/// liveness is read before the edge is followed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Blocker<'a> {
    pub owner: &'a [u8],
    pub reads: Option<u64>,
}

/// The holders that keep `waiter` (asking `wants`) from being granted, itself left out.
#[must_use]
pub fn blockers<'a>(holders: &'a Holders, waiter: &[u8], wants: Wants) -> Vec<Blocker<'a>> {
    each_blocker(holders, wants).filter(|b| b.owner != waiter).collect()
}

/// A reader and its read hold count.
type Reader = (Vec<u8>, u64);

/// [`blockers`], one at a time (nothing collected), the waiter itself not left out.
fn each_blocker(holders: &Holders, wants: Wants) -> impl Iterator<Item = Blocker<'_>> {
    let (owners, writer, readers): (&[Vec<u8>], Option<&Vec<u8>>, &[Reader]) =
        match (holders, wants) {
            (Holders::Lock(owners), Wants::Lock) => (owners, None, &[]),
            (Holders::Rw { write, writer, readers }, Wants::Read | Wants::Write) => {
                let writer = writer.as_ref().filter(|_| *write || wants == Wants::Write);
                let readers: &[Reader] = if wants == Wants::Write { readers } else { &[] };
                (&[], writer, readers)
            }
            // A waiter of another kind than the lock (the key changed) waits for the key to
            // change, not for an owner.
            _ => (&[], None, &[]),
        };
    let all_writer = match holders {
        Holders::Rw { writer, .. } => writer.as_deref(),
        _ => None,
    };
    let owners = owners.iter().map(|o| Blocker { owner: o, reads: None });
    let writer = writer.into_iter().map(|w| Blocker { owner: w, reads: None });
    let readers = readers
        .iter()
        .filter(move |(r, _)| all_writer != Some(r.as_slice()))
        .map(|(r, n)| Blocker { owner: r, reads: Some(*n) });
    owners.chain(writer).chain(readers)
}

/// The owners a lock hash's field may name as a holder: none for `mode`; the field itself (a
/// reentrant lock's owner, a reader) and, without a `:write` suffix, a writer. Every holder
/// [`blockers`] can return is named so by a field of its lock: when no owner a field names
/// waits anywhere, a search from the lock follows no edge (checked before anything is copied).
pub fn field_owners(field: &[u8]) -> impl Iterator<Item = &[u8]> {
    let named = (field != MODE_FIELD).then_some(field);
    named.into_iter().chain(field.strip_suffix(WRITE_SUFFIX))
}

/// What the search reads: the queues and the locks, as they are now.
pub trait Graph {
    /// Whether `owner` waits in any queue (asked before [`Self::waits_of`] and before a
    /// reader's liveness is read: an owner that waits nowhere has no edge to follow).
    fn waits(&mut self, owner: &[u8]) -> bool;
    /// The locks `owner` waits for (the key, what it asks), oldest wait first.
    fn waits_of(&mut self, owner: &[u8]) -> Vec<(Vec<u8>, Wants)>;
    /// The holders of the lock `key`, taking the fields it reads off `steps` (not read,
    /// `Holders::Nobody`, when they would take more steps than are left).
    fn holders(&mut self, key: &[u8], steps: &mut usize) -> Holders;
    /// Whether reader `owner` of the read-write lock `key` still has a live read hold (of its
    /// `reads` holds), taking the hold keys it reads off `steps`.
    fn reader_live(&mut self, key: &[u8], owner: &[u8], reads: u64, steps: &mut usize) -> bool;
}

/// One edge of a cycle: `owner` waits for `key`, which `holder` holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Link {
    pub owner: Vec<u8>,
    pub key: Vec<u8>,
    pub holder: Vec<u8>,
}

/// What a search found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Found {
    /// The wait closes this cycle, from the new wait's owner back to it.
    Cycle(Vec<Link>),
    /// No cycle (every path was followed).
    NoCycle,
    /// The budget ran out first: no claim either way.
    OverBudget,
}

/// A map searched in place while it is small (most searches see an owner or two), hashed once
/// it grows: a search allocates no table for the common short walk.
struct Small<K, V> {
    few: Vec<(K, V)>,
    many: HashMap<K, V>,
}

/// Entries kept in the vector before the map takes over.
const FEW: usize = 16;

impl<K: Eq + Hash + std::borrow::Borrow<[u8]>, V> Small<K, V> {
    fn new() -> Self {
        Self { few: Vec::new(), many: HashMap::new() }
    }

    fn get(&self, key: &[u8]) -> Option<&V> {
        if self.many.is_empty() {
            self.few.iter().find(|(k, _)| k.borrow() == key).map(|(_, v)| v)
        } else {
            self.many.get(key)
        }
    }

    fn contains_key(&self, key: &[u8]) -> bool {
        self.get(key).is_some()
    }

    /// Inserts a key not in the map yet.
    fn insert(&mut self, key: K, value: V) {
        if self.many.is_empty() && self.few.len() < FEW {
            self.few.push((key, value));
        } else {
            self.many.extend(self.few.drain(..));
            self.many.insert(key, value);
        }
    }
}

/// Whether owner `owner`'s wait for the lock `key` (asking `wants`) closes a cycle, `graph`
/// answering each of the [`Search`]'s questions (the reference driver: the unit tests drive
/// the search through it; `waiting` drives it with the live queues and keys the same way).
pub fn find_cycle(graph: &mut impl Graph, owner: &[u8], key: &[u8], wants: Wants) -> Found {
    let mut search = Search::new(owner, key, wants);
    loop {
        let mut steps = search.steps_left();
        let answer = match search.ask() {
            Ask::Holders(key) => Answer::Holders(graph.holders(key, &mut steps)),
            Ask::Waits(owner) => Answer::Waits(graph.waits(owner)),
            Ask::WaitsOf(owner) => Answer::WaitsOf(graph.waits_of(owner)),
            Ask::ReaderLive { key, owner, reads } => {
                Answer::ReaderLive(graph.reader_live(key, owner, reads, &mut steps))
            }
            Ask::Done(found) => return found.clone(),
        };
        search.answer(answer, steps);
    }
}

/// What the search needs to know next (see [`Graph`] for each question), or its result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ask<'s> {
    /// The holders of the lock `0` ([`Graph::holders`]).
    Holders(&'s [u8]),
    /// Whether owner `0` waits anywhere ([`Graph::waits`]).
    Waits(&'s [u8]),
    /// The locks owner `0` waits for ([`Graph::waits_of`]).
    WaitsOf(&'s [u8]),
    /// Whether reader `owner` of `key` still has a live read hold ([`Graph::reader_live`]).
    ReaderLive { key: &'s [u8], owner: &'s [u8], reads: u64 },
    /// The search is over.
    Done(&'s Found),
}

/// The answer to the last [`Ask`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    Holders(Holders),
    Waits(bool),
    WaitsOf(Vec<(Vec<u8>, Wants)>),
    ReaderLive(bool),
}

/// The edges from `from`, waiting for `lock`, to the lock's blockers (owned: the lock's
/// holders may be replaced meanwhile), followed one at a time from `at`.
struct Visit {
    from: Vec<u8>,
    lock: Vec<u8>,
    blockers: Vec<(Vec<u8>, Option<u64>)>,
    at: usize,
}

/// Where the search stands: the question it waits on.
enum Waiting {
    /// The holders of `lock`, to visit for `from` asking `wants`.
    Holders { from: Vec<u8>, lock: Vec<u8>, wants: Wants },
    /// Whether the current visit's blocker waits anywhere.
    Waits,
    /// Whether the current visit's blocker (a reader) is live.
    ReaderLive,
    /// The waits of the owner being followed.
    WaitsOf,
    Done(Found),
}

/// A breadth-first search for a cycle, sans I/O: it asks ([`Search::ask`]) for what it needs
/// to know of the queues and the locks, one question at a time, and is told
/// ([`Search::answer`]); every decision (which edge, the budget, when a cycle closes) is its
/// own. Only owners that wait somewhere are followed (one [`Ask::Waits`] each): when no
/// holder of `key` waits anywhere, the search ends after reading `key` alone.
pub struct Search {
    owner: Vec<u8>,
    steps: usize,
    /// Each owner reached, with the edge it was reached by (waiter, key).
    parent: Small<Vec<u8>, (Vec<u8>, Vec<u8>)>,
    /// The owners still to visit.
    next: VecDeque<Vec<u8>>,
    /// The holders of each lock read so far.
    held: Small<Vec<u8>, Holders>,
    /// The owner whose waits are followed, and those of its waits still to follow.
    following: Vec<u8>,
    waits: VecDeque<(Vec<u8>, Wants)>,
    visit: Option<Visit>,
    waiting: Waiting,
}

impl Search {
    /// A search from owner `owner`'s wait for the lock `key` (asking `wants`).
    #[must_use]
    pub fn new(owner: &[u8], key: &[u8], wants: Wants) -> Self {
        Self {
            owner: owner.to_vec(),
            steps: MAX_STEPS,
            parent: Small::new(),
            next: VecDeque::new(),
            held: Small::new(),
            following: Vec::new(),
            waits: VecDeque::new(),
            visit: None,
            waiting: Waiting::Holders { from: owner.to_vec(), lock: key.to_vec(), wants },
        }
    }

    /// The budget left: the reads a [`Graph::holders`] or [`Graph::reader_live`] answer makes
    /// are taken off it, and the result handed back with the answer.
    #[must_use]
    pub const fn steps_left(&self) -> usize {
        self.steps
    }

    /// What the search needs next, or its result.
    #[must_use]
    pub fn ask(&self) -> Ask<'_> {
        let blocker = || self.visit.as_ref().and_then(|v| Some((v, v.blockers.get(v.at)?)));
        match &self.waiting {
            Waiting::Holders { lock, .. } => Ask::Holders(lock),
            Waiting::Waits => blocker().map_or(Ask::Done(&Found::NoCycle), |(_, (b, _))| {
                Ask::Waits(b)
            }),
            Waiting::ReaderLive => match blocker() {
                Some((v, (owner, Some(reads)))) => {
                    Ask::ReaderLive { key: &v.lock, owner, reads: *reads }
                }
                _ => Ask::Done(&Found::NoCycle),
            },
            Waiting::WaitsOf => Ask::WaitsOf(&self.following),
            Waiting::Done(found) => Ask::Done(found),
        }
    }

    /// The answer to the last [`Self::ask`], with the budget left after it
    /// ([`Self::steps_left`], less what the answer's reads took); the search goes on to its
    /// next question. An answer of the wrong kind ends the search with no claim.
    pub fn answer(&mut self, answer: Answer, steps_left: usize) {
        self.steps = steps_left.min(self.steps);
        match (std::mem::replace(&mut self.waiting, Waiting::WaitsOf), answer) {
            (Waiting::Holders { from, lock, wants }, Answer::Holders(holders)) => {
                let blockers = each_blocker(&holders, wants)
                    .filter(|b| b.owner != from.as_slice())
                    .map(|b| (b.owner.to_vec(), b.reads))
                    .collect();
                self.held.insert(lock.clone(), holders);
                self.visit = Some(Visit { from, lock, blockers, at: 0 });
                self.run(Next::Blocker);
            }
            (Waiting::Waits, Answer::Waits(waits)) => {
                self.run(if waits { Next::Reads } else { Next::Skip });
            }
            (Waiting::ReaderLive, Answer::ReaderLive(live)) => {
                self.run(if live { Next::Reach } else { Next::Skip });
            }
            (Waiting::WaitsOf, Answer::WaitsOf(waits)) => {
                if waits.len() > self.steps {
                    self.waiting = Waiting::Done(Found::OverBudget);
                    return;
                }
                self.steps -= waits.len();
                self.waits = waits.into();
                self.run(Next::Follow);
            }
            _ => self.waiting = Waiting::Done(Found::OverBudget),
        }
    }

    /// Goes on from `next` until a question must be asked or the search is over.
    fn run(&mut self, mut next: Next) {
        loop {
            next = match next {
                Next::Blocker => self.blocker(),
                Next::Reads => self.reads(),
                Next::Reach => self.reach(),
                Next::Skip => {
                    if let Some(visit) = &mut self.visit {
                        visit.at += 1;
                    }
                    Next::Blocker
                }
                Next::Follow => self.follow(),
                Next::Ask(waiting) => {
                    self.waiting = waiting;
                    return;
                }
            };
        }
    }

    /// The current visit's next blocker: charged one step; one that closes the cycle or is
    /// reached for the first time goes on (one not reached before must wait somewhere).
    fn blocker(&mut self) -> Next {
        let Some(visit) = &self.visit else { return Next::Follow };
        let Some((blocker, _)) = visit.blockers.get(visit.at) else {
            self.visit = None;
            return Next::Follow;
        };
        if self.steps == 0 {
            return Next::Ask(Waiting::Done(Found::OverBudget));
        }
        self.steps -= 1;
        if *blocker == self.owner {
            return Next::Reads;
        }
        if self.parent.contains_key(blocker) {
            return Next::Skip;
        }
        Next::Ask(Waiting::Waits)
    }

    /// A reader blocks only while one of its read holds is live: asked before its edge counts.
    fn reads(&self) -> Next {
        match self.visit.as_ref().and_then(|v| v.blockers.get(v.at)) {
            Some((_, Some(_))) => Next::Ask(Waiting::ReaderLive),
            _ => Next::Reach,
        }
    }

    /// The current blocker is reached: a cycle when it is the searching owner, else an owner
    /// to visit later.
    fn reach(&mut self) -> Next {
        let Some(visit) = &self.visit else { return Next::Follow };
        let Some((blocker, _)) = visit.blockers.get(visit.at) else { return Next::Follow };
        if *blocker == self.owner {
            let cycle = path(&self.parent, &self.owner, &visit.from, &visit.lock);
            return Next::Ask(Waiting::Done(Found::Cycle(cycle)));
        }
        let edge = (visit.from.clone(), visit.lock.clone());
        self.parent.insert(blocker.clone(), edge);
        self.next.push_back(blocker.clone());
        Next::Skip
    }

    /// The next wait of the owner followed (its lock's holders read once per search), or the
    /// next owner to follow.
    fn follow(&mut self) -> Next {
        if let Some((lock, wants)) = self.waits.pop_front() {
            let from = self.following.clone();
            let Some(holders) = self.held.get(&lock) else {
                return Next::Ask(Waiting::Holders { from, lock, wants });
            };
            let blockers = each_blocker(holders, wants)
                .filter(|b| b.owner != from.as_slice())
                .map(|b| (b.owner.to_vec(), b.reads))
                .collect();
            self.visit = Some(Visit { from, lock, blockers, at: 0 });
            return Next::Blocker;
        }
        match self.next.pop_front() {
            Some(owner) => {
                self.following = owner;
                Next::Ask(Waiting::WaitsOf)
            }
            None => Next::Ask(Waiting::Done(Found::NoCycle)),
        }
    }
}

/// The search's next move (internal to [`Search::run`]).
enum Next {
    Blocker,
    Reads,
    Reach,
    Skip,
    Follow,
    Ask(Waiting),
}

/// The cycle that ends with `last` waiting for `key` held by `start`, walked back to `start`.
fn path(
    parent: &Small<Vec<u8>, (Vec<u8>, Vec<u8>)>,
    start: &[u8],
    last: &[u8],
    key: &[u8],
) -> Vec<Link> {
    let mut links = vec![Link { owner: last.to_vec(), key: key.to_vec(), holder: start.to_vec() }];
    let mut at = last.to_vec();
    while at != start {
        let Some((waiter, key)) = parent.get(&at) else { break };
        links.push(Link { owner: waiter.clone(), key: key.clone(), holder: at.clone() });
        at = waiter.clone();
    }
    links.reverse();
    links
}

/// The error reply naming `cycle`: `DEADLOCK this wait would close a cycle: A waits for K1 held
/// by B; B waits for K2 held by A`, each owner and key escaped as `error::shown` does (no space,
/// CR or LF in them), at most [`MAX_TEXT`] bytes of links (then `; ...`).
#[must_use]
pub fn describe(cycle: &[Link]) -> String {
    let mut text = String::from("DEADLOCK this wait would close a cycle: ");
    let base = text.len();
    for (i, link) in cycle.iter().enumerate() {
        let part = format!(
            "{} waits for {} held by {}",
            shown(&link.owner),
            shown(&link.key),
            shown(&link.holder)
        );
        if text.len() - base + part.len() > MAX_TEXT {
            text.push_str("; ...");
            break;
        }
        if i > 0 {
            text.push_str("; ");
        }
        text.push_str(&part);
    }
    text
}
