//! What the read-write lock rules read (the hash as [`RwState`], the read holds' deadlines as
//! [`Holds`]) and what they return (an [`RwPlan`] of [`Effect`]s, or [`Acquired`]).

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
    pub(super) const fn reply(reply: Reply) -> Self {
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
