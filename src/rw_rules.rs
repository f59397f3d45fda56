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
use crate::rules::{parse_count, Deadline, Reply};

pub use crate::args::Mode;

impl Mode {
    /// The value of the `mode` field.
    #[must_use]
    pub const fn as_bytes(self) -> &'static [u8] {
        match self {
            Self::Read => b"read",
            Self::Write => b"write",
        }
    }

    /// The message published on `redisson_rwlock:{name}` when a release of this mode frees the
    /// lock: `0` (read), `1` (write).
    #[must_use]
    pub const fn message(self) -> &'static [u8] {
        match self {
            Self::Read => b"0",
            Self::Write => b"1",
        }
    }
}

/// The lock's hash, read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RwState {
    /// `None`: no key, the lock is free.
    pub mode: Option<Mode>,
    /// Reader owner -> read hold count.
    pub readers: BTreeMap<Vec<u8>, u64>,
    /// The writer's owner (without `:write`) and write hold count.
    pub writer: Option<(Vec<u8>, u64)>,
    /// The hash's remaining lease in ms (-1: no expiry).
    pub pttl: i64,
}

impl RwState {
    /// Reads the hash's fields (any order). No fields: free.
    ///
    /// # Errors
    /// [`LockError::NotAnRwLock`] for a hash without `mode` (a reentrant lock);
    /// [`LockError::CorruptCount`] for a count that is not a positive integer, or a mode that is
    /// neither `read` nor `write`, or two writers.
    pub fn from_fields(
        fields: impl IntoIterator<Item = (Vec<u8>, Vec<u8>)>,
        pttl: i64,
    ) -> Result<Self, LockError> {
        let mut state = Self { pttl, ..Self::default() };
        let mut any = false;
        for (field, value) in fields {
            any = true;
            if field == MODE_FIELD {
                state.mode = Some(match value.as_slice() {
                    b"read" => Mode::Read,
                    b"write" => Mode::Write,
                    _ => return Err(LockError::CorruptCount),
                });
            } else if let Some(owner) = field.strip_suffix(WRITE_SUFFIX) {
                if state.writer.is_some() {
                    return Err(LockError::CorruptCount);
                }
                state.writer = Some((owner.to_vec(), parse_count(&value)?));
            } else {
                state.readers.insert(field, parse_count(&value)?);
            }
        }
        if any && state.mode.is_none() {
            return Err(LockError::NotAnRwLock);
        }
        Ok(state)
    }

    /// `owner`'s read hold count.
    #[must_use]
    pub fn reads_of(&self, owner: &[u8]) -> u64 {
        self.readers.get(owner).copied().unwrap_or(0)
    }

    /// `owner`'s write hold count.
    #[must_use]
    pub fn writes_of(&self, owner: &[u8]) -> u64 {
        match &self.writer {
            Some((writer, count)) if writer == owner => *count,
            _ => 0,
        }
    }

    /// The hash's deadline (Unix ms) at `now`; `None` when it has no expiry or no key.
    #[must_use]
    pub const fn deadline(&self, now: i64) -> Option<i64> {
        if self.mode.is_some() && self.pttl >= 0 {
            Some(now.saturating_add(self.pttl))
        } else {
            None
        }
    }
}

/// The read holds' lease deadlines: reader owner -> hold index (1-based) -> Unix ms
/// (`i64::MAX`: no expiry). A hold whose key is gone has no entry.
pub type Holds = BTreeMap<Vec<u8>, BTreeMap<u64, i64>>;

/// One write, in the order a plan lists them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    /// `HSET name mode read|write`.
    SetMode(Mode),
    /// `HSET name <owner> <count>`.
    SetReads { owner: Vec<u8>, count: u64 },
    /// `HDEL name <owner>`.
    DropReads { owner: Vec<u8> },
    /// `HSET name <owner>:write <count>`.
    SetWrites { owner: Vec<u8>, count: u64 },
    /// `HDEL name <owner>:write`.
    DropWrites { owner: Vec<u8> },
    /// `SET <hold key> 1` with `PEXPIREAT` (a new read hold).
    AddHold { owner: Vec<u8>, index: u64, deadline: Deadline },
    /// `DEL <hold key>`.
    DropHold { owner: Vec<u8>, index: u64 },
    /// `PEXPIREAT <hold key>` if the key is there.
    RenewHold { owner: Vec<u8>, index: u64, deadline: Deadline },
    /// `PEXPIREAT name`.
    ExpireAt(Deadline),
    /// `DEL name`.
    Delete,
}

/// What an operation does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RwPlan {
    pub effects: Vec<Effect>,
    pub reply: Reply,
    /// The lock became free by a release of this mode: its waiters are served, or (nobody
    /// can be) `Mode::message` is published.
    pub freed: Option<Mode>,
    /// Waiters may be grantable now (freed, or downgraded to read): hand the lock on.
    pub settle: bool,
}

impl RwPlan {
    const fn reply(reply: Reply) -> Self {
        Self { effects: Vec::new(), reply, freed: None, settle: false }
    }

    /// The plan's new read holds, and the holds it renews (their keys are derived: ACL and
    /// slot checks).
    pub fn hold_keys(&self) -> impl Iterator<Item = (&[u8], u64)> {
        self.effects.iter().filter_map(|e| match e {
            Effect::AddHold { owner, index, .. }
            | Effect::DropHold { owner, index }
            | Effect::RenewHold { owner, index, .. } => Some((owner.as_slice(), *index)),
            _ => None,
        })
    }
}

/// An acquire's outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Acquired {
    Granted(RwPlan),
    /// Not granted: the hash's remaining lease (-1: no expiry).
    Busy(i64),
    /// A write requested by an owner that holds only read: granting it would wait for itself.
    Upgrade(i64),
}

fn next(count: u64) -> Result<u64, LockError> {
    count.checked_add(1).filter(|&c| c <= i64::MAX as u64).ok_or(LockError::CountOverflow)
}

/// The later of the hash's current deadline and `deadline` (a lock with no expiry gets one).
fn extended(state: &RwState, now: i64, deadline: Deadline) -> Deadline {
    match state.deadline(now) {
        Some(current) if current > deadline.unix_ms() => Deadline::at(current),
        _ => deadline,
    }
}

/// `ACQUIRE ... READ|WRITE` by `owner` at `now` with a lease ending at `deadline`. `queued`:
/// others wait for this lock (a newcomer reader then waits behind them; re-entries do not).
///
/// # Errors
/// [`LockError::CountOverflow`].
pub fn acquire(
    state: &RwState,
    want: Mode,
    owner: &[u8],
    now: i64,
    deadline: Deadline,
    queued: bool,
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
            let count = next(reads)?;
            grant(vec![
                Effect::SetReads { owner: owner.to_vec(), count },
                Effect::AddHold { owner: owner.to_vec(), index: count, deadline },
                Effect::ExpireAt(extended(state, now, deadline)),
            ])
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

/// `RENEW`: every hold of `owner` gets the lease ending at `deadline` (reply 1); an owner that
/// holds nothing gets 0 and nothing is created.
#[must_use]
pub fn renew(state: &RwState, owner: &[u8], now: i64, deadline: Deadline) -> RwPlan {
    let reads = state.reads_of(owner);
    if reads == 0 && state.writes_of(owner) == 0 {
        return RwPlan::reply(Reply::Int(0));
    }
    let mut effects: Vec<Effect> = (1..=reads)
        .map(|index| Effect::RenewHold { owner: owner.to_vec(), index, deadline })
        .collect();
    effects.push(Effect::ExpireAt(extended(state, now, deadline)));
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
