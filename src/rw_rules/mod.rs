//! The read-write lock rules, as plain Rust, on Redisson's `RReadWriteLock` layout: a hash with
//! `mode` (`read` or `write`), one field per reader (`<owner>` = its read hold count), the
//! writer's field (`<owner>:write` = its write hold count), and one lease key per read hold
//! (`{name}:<owner>:rwlock_timeout:<i>`, see `names::read_hold`). The hash's own expiry covers
//! every hold.
//!
//! Given the hash ([`RwState`]) and, where a lease must be recomputed, the read holds' deadlines
//! ([`Holds`]), each operation returns an [`RwPlan`]: the effects to write in order, the reply,
//! and whether the lock was freed. Only the `store` touches Redis.
//!
//! Where this differs from Redisson's scripts, on purpose:
//! - a write re-entry sets the lease to the later of the current one and the new one (Redisson
//!   adds the new lease to what is left, so the lease grows with every re-entry);
//! - a read release never shortens the writer's lease (Redisson sets the hash's expiry to the
//!   longest read hold even when the same owner also holds the write lock);
//! - a reader whose every hold lease ended is removed (by a timer, `waiting`), so it does not
//!   block writers until some other reader unlocks;
//! - a newcomer reader waits behind a queued writer (fairness; Redisson has none), and asking
//!   for the write lock while holding only read (an upgrade, which would wait for itself) is
//!   refused rather than waited for.

use std::collections::BTreeMap;

use crate::error::LockError;
use crate::names::{MODE_FIELD, WRITE_SUFFIX};
use crate::rules::{Deadline, Reply};

mod state;

pub use state::{
    parse_reads, walkable, Acquired, Effect, Holds, Mode, RwPlan, RwState, MAX_LOCK_READ_HOLDS,
    MAX_READ_HOLDS,
};

fn next(count: u64) -> Result<u64, LockError> {
    count.checked_add(1).filter(|&c| c <= i64::MAX as u64).ok_or(LockError::CountOverflow)
}

/// The read count after one more read hold: at most [`MAX_READ_HOLDS`].
fn next_read(reads: u64) -> Result<u64, LockError> {
    if reads >= MAX_READ_HOLDS {
        Err(LockError::TooManyReadHolds)
    } else {
        Ok(reads + 1)
    }
}

/// The later of the hash's current deadline and `deadline` (a lock with no expiry gets one).
fn extended(state: &RwState, now: i64, deadline: Deadline) -> Deadline {
    match state.deadline(now) {
        Some(current) if current > deadline.unix_ms() => Deadline::at(current),
        _ => deadline,
    }
}

/// How a re-entry or a renewal sets the leases of the read holds the owner already has.
#[derive(Debug, Clone, Copy)]
pub enum Reads<'a> {
    /// The default: a renewal sets every read hold's lease to the new one; a re-entry adds its
    /// hold with the new lease, the others left as they are.
    Set,
    /// `GT`, with the owner's own read holds (index -> deadline, as [`Holds`] has them): every
    /// live read hold of the owner, and a re-entry's new one, ends at [`Reads::until`], the
    /// later of the new lease's end and the owner's latest read hold: no lease is shortened, and
    /// since a release drops the owner's last-numbered hold whichever of its guards releases,
    /// the holds left end no sooner than any of them was promised.
    Gt(&'a BTreeMap<u64, i64>),
}

impl Reads<'_> {
    /// When the owner's read holds end after a re-entry or renewal with a lease ending at
    /// `deadline` (holds without expiry do not count: they stay without).
    #[must_use]
    pub fn until(self, deadline: Deadline) -> Deadline {
        match self {
            Self::Set => deadline,
            Self::Gt(own) => own
                .values()
                .copied()
                .filter(|&at| at != i64::MAX && at > deadline.unix_ms())
                .max()
                .map_or(deadline, Deadline::at),
        }
    }

    /// The renewals of `owner`'s holds `1..=reads` to `until`: every hold (`Set`), or (`GT`)
    /// each live one ending sooner (a hold without expiry, or gone, is left alone).
    fn renewals(self, owner: &[u8], reads: u64, until: Deadline) -> Vec<Effect> {
        (1..=reads)
            .filter(|index| match self {
                Self::Set => true,
                Self::Gt(own) => own.get(index).is_some_and(|&at| at < until.unix_ms()),
            })
            .map(|index| Effect::RenewHold { owner: owner.to_vec(), index, deadline: until })
            .collect()
    }
}

/// `ACQUIRE ... READ|WRITE` by `owner` at `now` with a lease ending at `deadline`. `queued`:
/// others wait for this lock (a newcomer reader then waits behind them; re-entries do not).
/// `reads`: how a read re-entry sets the owner's read holds (a write re-entry always keeps the
/// later of the hash's lease and the new one).
///
/// `state` needs only the owner's own fields ([`RwState::of_owner`]).
///
/// # Errors
/// [`LockError::CountOverflow`] (write re-entry); [`LockError::TooManyReadHolds`] (a read
/// re-entry past [`MAX_READ_HOLDS`]).
pub fn acquire(
    state: &RwState,
    want: Mode,
    owner: &[u8],
    now: i64,
    deadline: Deadline,
    queued: bool,
    reads_rule: Reads<'_>,
) -> Result<Acquired, LockError> {
    let (reads, writes) = (state.reads_of(owner), state.writes_of(owner));
    let busy = Acquired::Busy(state.pttl);
    let grant = |effects| Ok(Acquired::Granted(RwPlan { effects, ..RwPlan::reply(Reply::Nil) }));
    match (want, state.mode) {
        (Mode::Read, None) => grant(vec![
            Effect::SetMode(Mode::Read),
            Effect::SetReads { owner: owner.to_vec(), count: 1 },
            Effect::AddHold { owner: owner.to_vec(), index: 1, deadline },
            Effect::ExpireAt(deadline),
        ]),
        (Mode::Read, Some(mode)) => {
            // Re-entry (a holder is never a newcomer), a read beside the own write hold, or a
            // reader joining readers nobody waits behind.
            let may = reads > 0 || writes > 0 || (mode == Mode::Read && !queued);
            if !may {
                return Ok(busy);
            }
            let count = next_read(reads)?;
            let until = reads_rule.until(deadline);
            let mut effects = vec![Effect::SetReads { owner: owner.to_vec(), count }];
            if let Reads::Gt(_) = reads_rule {
                effects.extend(reads_rule.renewals(owner, reads, until));
            }
            effects.push(Effect::AddHold { owner: owner.to_vec(), index: count, deadline: until });
            effects.push(Effect::ExpireAt(extended(state, now, until)));
            grant(effects)
        }
        (Mode::Write, None) => grant(vec![
            Effect::SetMode(Mode::Write),
            Effect::SetWrites { owner: owner.to_vec(), count: 1 },
            Effect::ExpireAt(deadline),
        ]),
        (Mode::Write, Some(_)) if writes > 0 => grant(vec![
            Effect::SetWrites { owner: owner.to_vec(), count: next(writes)? },
            Effect::ExpireAt(extended(state, now, deadline)),
        ]),
        (Mode::Write, Some(Mode::Read)) if reads > 0 => Ok(Acquired::Upgrade(state.pttl)),
        (Mode::Write, Some(_)) => Ok(busy),
    }
}

/// The latest live read hold deadline of the readers in `readers` (counts as after the
/// operation) at `now`; `None` when no read hold is live.
fn live_until(readers: &BTreeMap<Vec<u8>, u64>, holds: &Holds, now: i64) -> Option<i64> {
    readers
        .iter()
        .filter_map(|(owner, &count)| {
            let owned = holds.get(owner)?;
            owned.range(1..=count).map(|(_, &at)| at).filter(|&at| at > now).max()
        })
        .max()
}

/// The readers (counts as after the operation) none of whose holds is live at `now`.
fn dead_readers(readers: &BTreeMap<Vec<u8>, u64>, holds: &Holds, now: i64) -> Vec<Vec<u8>> {
    readers
        .iter()
        .filter(|(owner, &count)| {
            holds.get(*owner).is_none_or(|h| h.range(1..=count).all(|(_, &at)| at <= now))
        })
        .map(|(owner, _)| owner.clone())
        .collect()
}

/// What follows when holders left (`readers`, `writer` as after the operation): dead readers
/// dropped, then the lock deleted (freed by `released`) when nobody live holds it, else its
/// lease recomputed from the live read holds (never shorter than a writer's lease).
fn settle_after(
    mut effects: Vec<Effect>,
    state: &RwState,
    mut readers: BTreeMap<Vec<u8>, u64>,
    writer: bool,
    holds: &Holds,
    now: i64,
    released: Mode,
) -> (Vec<Effect>, Option<Mode>) {
    for owner in dead_readers(&readers, holds, now) {
        readers.remove(&owner);
        effects.push(Effect::DropReads { owner });
    }
    if readers.is_empty() && !writer {
        effects.push(Effect::Delete);
        return (effects, Some(released));
    }
    let live = live_until(&readers, holds, now);
    let current = state.deadline(now);
    let until = if writer { live.max(current) } else { live };
    if let Some(until) = until.filter(|&at| at != i64::MAX) {
        if Some(until) != current {
            effects.push(Effect::ExpireAt(Deadline::at(until)));
        }
    }
    (effects, None)
}

/// `RELEASE ... READ|WRITE` by `owner` at `now`. READ: 1 = the lock became free, 0 = still held,
/// nil = no read hold. WRITE: 1 = the write hold ended (freed, or downgraded to read: the same
/// owner still holds reads), 0 = count decremented, nil = no write hold.
#[must_use]
pub fn release(state: &RwState, want: Mode, owner: &[u8], holds: &Holds, now: i64) -> RwPlan {
    let mut readers = state.readers.clone();
    match want {
        Mode::Read => {
            let reads = state.reads_of(owner);
            if state.mode.is_none() || reads == 0 {
                return RwPlan::reply(Reply::Nil);
            }
            let mut effects = Vec::new();
            if reads > 1 {
                readers.insert(owner.to_vec(), reads - 1);
                effects.push(Effect::SetReads { owner: owner.to_vec(), count: reads - 1 });
            } else {
                readers.remove(owner);
                effects.push(Effect::DropReads { owner: owner.to_vec() });
            }
            effects.push(Effect::DropHold { owner: owner.to_vec(), index: reads });
            let writer = state.writer.is_some();
            let (effects, freed) =
                settle_after(effects, state, readers, writer, holds, now, Mode::Read);
            let reply = Reply::Int(i64::from(freed.is_some()));
            RwPlan { effects, reply, freed, settle: freed.is_some() }
        }
        Mode::Write => {
            let writes = state.writes_of(owner);
            if state.mode != Some(Mode::Write) || writes == 0 {
                return RwPlan::reply(Reply::Nil);
            }
            if writes > 1 {
                let effects = vec![Effect::SetWrites { owner: owner.to_vec(), count: writes - 1 }];
                return RwPlan { effects, ..RwPlan::reply(Reply::Int(0)) };
            }
            let mut effects = vec![Effect::DropWrites { owner: owner.to_vec() }];
            if !readers.is_empty() {
                // A downgrade: the owner keeps its reads; queued readers may join it.
                effects.push(Effect::SetMode(Mode::Read));
            }
            let (effects, freed) =
                settle_after(effects, state, readers, false, holds, now, Mode::Write);
            RwPlan { effects, reply: Reply::Int(1), freed, settle: true }
        }
    }
}

/// A session's end: every hold of `owner` on the `side` it had bound goes at once (all its read
/// holds and their keys, or its whole write hold), then as a release that ends the side:
/// dead readers leave, the lock is freed (or downgraded) or its lease recomputed. An owner that
/// does not hold that side gets an empty plan. At most [`MAX_READ_HOLDS`] hold keys are dropped
/// (the count was parsed with that bound).
#[must_use]
pub fn end_side(state: &RwState, side: Mode, owner: &[u8], holds: &Holds, now: i64) -> RwPlan {
    match side {
        Mode::Write => {
            if state.mode != Some(Mode::Write) || state.writes_of(owner) == 0 {
                return RwPlan::reply(Reply::Nil);
            }
            // The last write hold's release is the end of the whole write side.
            let last = RwState { writer: Some((owner.to_vec(), 1)), ..state.clone() };
            release(&last, Mode::Write, owner, holds, now)
        }
        Mode::Read => end_reads(state, &[owner.to_vec()], Rest::Holds(holds), now),
    }
}

/// What the end of some readers' read sides knows of the rest of the lock ([`end_reads`]).
#[derive(Debug, Clone, Copy)]
pub enum Rest<'a> {
    /// The whole hash (`state` has every field) and the read holds of the readers that stay:
    /// the end settles the lock as a release does (dead readers leave, the lease is recomputed).
    Holds(&'a Holds),
    /// Only whether anything else holds the lock (a reader that stays, a writer): `state` has
    /// the ending readers' fields only, and the settling is left to the last of the batches that
    /// end one lock's readers (a session's close ends many at once over several timer ticks,
    /// without reading every hold of the lock at each).
    Others(bool),
}

/// A session's end of the read sides of `owners` (every hold of each: its field and every
/// hold key), in one plan however many end: then, with [`Rest::Holds`], settled as
/// [`end_side`]'s read end is (the same plan for one owner); with [`Rest::Others`], the lock
/// is deleted (freed) when nothing else holds it, and otherwise left as it is. Owners without
/// read holds are passed over; none at all: an empty plan (nil).
#[must_use]
pub fn end_reads(state: &RwState, owners: &[Vec<u8>], rest: Rest<'_>, now: i64) -> RwPlan {
    if state.mode.is_none() {
        return RwPlan::reply(Reply::Nil);
    }
    let mut readers = state.readers.clone();
    let mut effects = Vec::new();
    for owner in owners {
        let Some(reads) = readers.remove(owner) else { continue };
        effects.push(Effect::DropReads { owner: owner.clone() });
        effects.extend((1..=reads).map(|index| Effect::DropHold { owner: owner.clone(), index }));
    }
    if effects.is_empty() {
        return RwPlan::reply(Reply::Nil);
    }
    let (effects, freed) = match rest {
        Rest::Holds(holds) => {
            let writer = state.writer.is_some();
            settle_after(effects, state, readers, writer, holds, now, Mode::Read)
        }
        Rest::Others(true) => (effects, None),
        Rest::Others(false) => {
            effects.push(Effect::Delete);
            (effects, Some(Mode::Read))
        }
    };
    let reply = Reply::Int(i64::from(freed.is_some()));
    RwPlan { effects, reply, freed, settle: true }
}

/// `RENEW`: every hold of `owner` gets the lease ending at `deadline`, its read holds as
/// `reads` says (reply 1); an owner that holds nothing gets 0 and nothing is created. At most
/// [`MAX_READ_HOLDS`] + 1 effects (the count was parsed with that bound); `state` needs only the
/// owner's own fields.
#[must_use]
pub fn renew(
    state: &RwState,
    owner: &[u8],
    now: i64,
    deadline: Deadline,
    reads_rule: Reads<'_>,
) -> RwPlan {
    let reads = state.reads_of(owner);
    if reads == 0 && state.writes_of(owner) == 0 {
        return RwPlan::reply(Reply::Int(0));
    }
    let until = if reads > 0 { reads_rule.until(deadline) } else { deadline };
    let mut effects = reads_rule.renewals(owner, reads, until);
    effects.push(Effect::ExpireAt(extended(state, now, until)));
    RwPlan { effects, ..RwPlan::reply(Reply::Int(1)) }
}

/// `RENEW ... READ|WRITE`: only the holds of `side` get the lease ending at `deadline` (reply 1),
/// and only when `owner` holds that side: `WRITE`, its write hold (the lock in write mode, its
/// `<owner>:write` field), whose lease is the hash's; `READ`, its read holds' lease keys, the
/// hash's lease extended to cover them. An owner that does not hold that side gets 0 and nothing
/// changes, whatever else it holds: a write hold is never kept alive by a read hold of the same
/// owner, nor the reverse.
#[must_use]
pub fn renew_side(
    state: &RwState,
    owner: &[u8],
    side: Mode,
    now: i64,
    deadline: Deadline,
    reads_rule: Reads<'_>,
) -> RwPlan {
    let reads = state.reads_of(owner);
    let holds = match side {
        Mode::Write => state.mode == Some(Mode::Write) && state.writes_of(owner) > 0,
        Mode::Read => state.mode.is_some() && reads > 0,
    };
    if !holds {
        return RwPlan::reply(Reply::Int(0));
    }
    let (mut effects, until) = match side {
        Mode::Write => (Vec::new(), deadline),
        Mode::Read => {
            let until = reads_rule.until(deadline);
            (reads_rule.renewals(owner, reads, until), until)
        }
    };
    effects.push(Effect::ExpireAt(extended(state, now, until)));
    RwPlan { effects, ..RwPlan::reply(Reply::Int(1)) }
}

/// `FORCERELEASE`: delete any read-write lock (reply 1; freed as its mode), or 0 when free.
#[must_use]
pub fn force_release(state: &RwState) -> RwPlan {
    match state.mode {
        None => RwPlan::reply(Reply::Int(0)),
        Some(mode) => RwPlan {
            effects: vec![Effect::Delete],
            reply: Reply::Int(1),
            freed: Some(mode),
            settle: true,
        },
    }
}

/// The readers whose every hold lease ended by `now` leave (their fields are dropped, the lease
/// recomputed, the lock freed if nobody live holds it); `None` when every reader is live.
#[must_use]
pub fn reap(state: &RwState, holds: &Holds, now: i64) -> Option<RwPlan> {
    if state.mode.is_none() || dead_readers(&state.readers, holds, now).is_empty() {
        return None;
    }
    let writer = state.writer.is_some();
    let (effects, freed) =
        settle_after(Vec::new(), state, state.readers.clone(), writer, holds, now, Mode::Read);
    Some(RwPlan { effects, reply: Reply::Nil, freed, settle: true })
}

/// When to look at the lock again for readers whose leases end: just after the earliest live
/// read hold deadline (Unix ms), if any.
#[must_use]
pub fn next_reap(state: &RwState, holds: &Holds, now: i64) -> Option<i64> {
    state
        .readers
        .iter()
        .filter_map(|(owner, &count)| {
            let owned = holds.get(owner)?;
            owned.range(1..=count).map(|(_, &at)| at).filter(|&at| at > now && at != i64::MAX).min()
        })
        .min()
        .map(|at| Deadline::at(at).over_at())
}

/// Checks an owner id for a read-write lock: not `mode`, not ending in `:write` (either would
/// read as another field of the hash).
///
/// # Errors
/// [`LockError::ReservedOwner`].
pub fn check_owner(owner: &[u8]) -> Result<(), LockError> {
    if owner == MODE_FIELD || owner.ends_with(WRITE_SUFFIX) {
        Err(LockError::ReservedOwner)
    } else {
        Ok(())
    }
}
