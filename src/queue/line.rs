//! One lock's queue: its line and the waiters apart from it, two FIFO lists of ids merged by
//! id into the order of arrival, and the walk to a list's first live id.

use std::collections::VecDeque;

use super::id_hash::IdMap;
use super::stats::QueueStats;
use super::{Slot, Waiter, WaiterId};

/// One lock's waiters, in two FIFO lists of ids: its line, and those who wait apart from it
/// ([`Joining::apart`], a latch's awaiters). Ids grow with every enqueue, so the two lists
/// merged by id are the order of arrival; each head is found without walking the other list
/// (thousands of awaiters never slow down a look at the line, nor the reverse).
#[derive(Debug, Default)]
pub(super) struct Queue {
    /// The line's ids (and ids of waiters that left, skipped lazily).
    pub(super) line: VecDeque<WaiterId>,
    /// The ids of the waiters apart from the line (and of some that left).
    pub(super) aside: VecDeque<WaiterId>,
    pub(super) live: usize,
    /// How many of the live waiters wait apart from the line ([`Joining::apart`]).
    pub(super) apart: usize,
    pub(super) lease_check: Option<Slot>,
    pub(super) stats: QueueStats,
}

impl Queue {
    pub(super) fn list_mut(&mut self, apart: bool) -> &mut VecDeque<WaiterId> {
        if apart {
            &mut self.aside
        } else {
            &mut self.line
        }
    }

    /// Every id of the queue (live or not), in order of arrival: the two lists merged.
    pub(super) fn ids(&self) -> impl Iterator<Item = WaiterId> + '_ {
        let (mut line, mut aside) =
            (self.line.iter().copied().peekable(), self.aside.iter().copied().peekable());
        std::iter::from_fn(move || match (line.peek().copied(), aside.peek().copied()) {
            (Some(a), Some(b)) if b < a => aside.next(),
            (Some(_), _) => line.next(),
            (None, _) => aside.next(),
        })
    }
}

/// The first live id of `list`, the ids of waiters that left before it dropped; every id
/// looked at is counted in `walked`.
pub(super) fn live_front<H, R>(
    list: &mut VecDeque<WaiterId>,
    waiters: &IdMap<WaiterId, Waiter<H, R>>,
    walked: &mut u64,
) -> Option<WaiterId> {
    while let Some(&id) = list.front() {
        *walked += 1;
        if waiters.contains_key(&id) {
            return Some(id);
        }
        list.pop_front();
    }
    None
}
