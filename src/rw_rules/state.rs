//! What the read-write lock rules read (the hash as [`RwState`], the read holds' deadlines as
//! [`Holds`]) and what they return (an [`RwPlan`] of [`Effect`]s, or [`Acquired`]).

use std::collections::BTreeMap;

use crate::error::LockError;
use crate::names::{MODE_FIELD, WRITE_SUFFIX};
use crate::rules::{parse_count, Deadline, Reply};

/// The most read holds one owner may have on a read-write lock at once (its re-entries): every
/// loop over an owner's hold indexes (renewal, release, the check for dead readers) is bounded
/// by it. A re-entry past it is refused ([`LockError::TooManyReadHolds`]); a stored count above
/// it (a foreign writer's) reads as a corrupt count.
pub const MAX_READ_HOLDS: u64 = 1_000;

/// The most read holds, over all its readers, a read-write lock may have for a release or a
/// dead-reader check to read them: each reads every hold key (Redisson's unlock script walks
/// the same keys), a few hundred ns each with the server blocked. [`MAX_READ_HOLDS`] bounds one
/// owner's count, not the number of readers: a foreign hash of 20,000 readers at 1,000 holds
/// each made one release read 20 million keys (5.8 s). A lock past it is refused
/// ([`LockError::TooManyLockReadHolds`]) before any key is read; `RWLOCK.FORCERELEASE` clears it.
pub const MAX_LOCK_READ_HOLDS: u64 = 100_000;

/// Whether a release or a dead-reader check may read every read hold of `state`.
///
/// # Errors
/// [`LockError::TooManyLockReadHolds`] past [`MAX_LOCK_READ_HOLDS`].
pub fn walkable(state: &RwState) -> Result<(), LockError> {
    // Each count is at most MAX_READ_HOLDS: the sum cannot overflow a u64.
    let total: u64 = state.readers.values().sum();
    if total > MAX_LOCK_READ_HOLDS {
        Err(LockError::TooManyLockReadHolds)
    } else {
        Ok(())
    }
}

/// A reader's stored hold count: a positive integer up to [`MAX_READ_HOLDS`].
///
/// # Errors
/// [`LockError::CorruptCount`].
pub fn parse_reads(stored: &[u8]) -> Result<u64, LockError> {
    parse_count(stored).and_then(|n| {
        if n <= MAX_READ_HOLDS {
            Ok(n)
        } else {
            Err(LockError::CorruptCount)
        }
    })
}

/// The `mode` field's value. A hold count there is a reentrant lock's hold by an owner named
/// `mode` (`RLOCK.*` allows that name): not a read-write lock, rather than a corrupt one.
fn parse_mode(value: &[u8]) -> Result<Mode, LockError> {
    match value {
        b"read" => Ok(Mode::Read),
        b"write" => Ok(Mode::Write),
        _ if parse_count(value).is_ok() => Err(LockError::NotAnRwLock),
        _ => Err(LockError::CorruptCount),
    }
}

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

/// The lock's hash, read: every field ([`RwState::from_fields`]), or only what one owner's
/// acquire or renewal needs ([`RwState::of_owner`]: `readers` and `writer` then hold that
/// owner's entries only).
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
    /// The hash's expiry as stored (Unix ms; -1: none), when the store read it: the lease end
    /// exactly, where `now + pttl` may be a millisecond early (the clock read twice).
    pub expires: Option<i64>,
}

impl RwState {
    /// Reads the hash's fields (any order). No fields: free.
    ///
    /// # Errors
    /// [`LockError::NotAnRwLock`] for a hash without `mode` (a reentrant lock), or whose `mode`
    /// holds a count (a reentrant lock's owner named `mode`);
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
                state.mode = Some(parse_mode(&value)?);
            } else if let Some(owner) = field.strip_suffix(WRITE_SUFFIX) {
                if state.writer.is_some() {
                    return Err(LockError::CorruptCount);
                }
                state.writer = Some((owner.to_vec(), parse_count(&value)?));
            } else {
                state.readers.insert(field, parse_reads(&value)?);
            }
        }
        if any && state.mode.is_none() {
            return Err(LockError::NotAnRwLock);
        }
        Ok(state)
    }

    /// The hash as one owner's acquire, renewal or a force-release sees it, from O(1) reads:
    /// `mode`, the owner's read count and write count (`None`: no such field), whether the hash
    /// has any field, and its remaining lease. Other readers and another writer are not read.
    ///
    /// # Errors
    /// [`LockError::NotAnRwLock`] for a hash without `mode`; [`LockError::CorruptCount`] for a
    /// bad mode or a bad count of this owner.
    pub fn of_owner(
        mode: Option<&[u8]>,
        owner: &[u8],
        reads: Option<&[u8]>,
        writes: Option<&[u8]>,
        any_field: bool,
        pttl: i64,
    ) -> Result<Self, LockError> {
        let Some(mode) = mode else {
            return if any_field {
                Err(LockError::NotAnRwLock)
            } else {
                Ok(Self { pttl, ..Self::default() })
            };
        };
        let mut state = Self { mode: Some(parse_mode(mode)?), pttl, ..Self::default() };
        if let Some(reads) = reads {
            state.readers.insert(owner.to_vec(), parse_reads(reads)?);
        }
        if let Some(writes) = writes {
            state.writer = Some((owner.to_vec(), parse_count(writes)?));
        }
        Ok(state)
    }

    /// The hash as the end of some readers' read sides sees it, from O(readers) reads: `mode`,
    /// and each of these readers' read count (`None`: no such field); other readers and the
    /// writer are not read (`readers` holds these readers only).
    ///
    /// # Errors
    /// As [`Self::of_owner`].
    pub fn of_readers<'a>(
        mode: Option<&[u8]>,
        readers: impl IntoIterator<Item = (&'a [u8], Option<&'a [u8]>)>,
        any_field: bool,
        pttl: i64,
    ) -> Result<Self, LockError> {
        let mut state = Self::of_owner(mode, b"", None, None, any_field, pttl)?;
        if state.mode.is_none() {
            return Ok(state);
        }
        for (owner, reads) in readers {
            if let Some(reads) = reads {
                state.readers.insert(owner.to_vec(), parse_reads(reads)?);
            }
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
        match (self.mode, self.expires) {
            (None, _) => None,
            (Some(_), Some(at)) if at >= 0 => Some(at),
            (Some(_), Some(_)) => None,
            (Some(_), None) if self.pttl >= 0 => Some(now.saturating_add(self.pttl)),
            (Some(_), None) => None,
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
    pub(super) const fn reply(reply: Reply) -> Self {
        Self { effects: Vec::new(), reply, freed: None, settle: false }
    }

    /// When the hold an acquire's plan grants ends (Unix ms): a new read hold's own lease,
    /// else the hash's (a write hold's).
    #[must_use]
    pub fn grant_until(&self) -> Option<i64> {
        let hold = self.effects.iter().find_map(|e| match e {
            Effect::AddHold { deadline, .. } => Some(deadline.unix_ms()),
            _ => None,
        });
        hold.or_else(|| {
            self.effects.iter().find_map(|e| match e {
                Effect::ExpireAt(deadline) => Some(deadline.unix_ms()),
                _ => None,
            })
        })
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
