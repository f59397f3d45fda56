//! The search for a cycle, sans I/O: a [`Search`] asks for what it needs to know of the queues
//! and the locks, one question at a time ([`Ask`]), and is told ([`Answer`]); every decision
//! (which edge, the budget, when a cycle closes) is its own.

use std::collections::{HashMap, VecDeque};
use std::hash::Hash;

use super::{each_blocker, Found, Holders, Link, Wants, MAX_STEPS};

/// What the search needs to know next (see [`Graph`](super::Graph) for each question), or its result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ask<'s> {
    /// The holders of the lock `0` ([`Graph::holders`](super::Graph::holders)).
    Holders(&'s [u8]),
    /// Whether owner `0` waits anywhere ([`Graph::waits`](super::Graph::waits)).
    Waits(&'s [u8]),
    /// The locks owner `0` waits for ([`Graph::waits_of`](super::Graph::waits_of)).
    WaitsOf(&'s [u8]),
    /// Whether reader `owner` of `key` still has a live read hold ([`Graph::reader_live`](super::Graph::reader_live)).
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
    Holders {
        from: Vec<u8>,
        lock: Vec<u8>,
        wants: Wants,
    },
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

    /// The budget left: the reads a [`Graph::holders`](super::Graph::holders) or [`Graph::reader_live`](super::Graph::reader_live) answer makes
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
            Waiting::Waits => {
                blocker().map_or(Ask::Done(&Found::NoCycle), |(_, (b, _))| Ask::Waits(b))
            }
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
