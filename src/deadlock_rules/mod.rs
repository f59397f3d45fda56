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

use crate::error::shown;
use crate::names::{MODE_FIELD, WRITE_SUFFIX};

mod search;

pub use search::{Answer, Ask, Search};

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

/// Whether owner `owner`'s wait for the lock `key` (asking `wants`) closes a cycle, `graph`
/// answering each of the [`Search`]'s questions (the reference driver: the unit tests drive
/// the search through it, with graphs of their own; `waiting` with the live queues and keys).
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
