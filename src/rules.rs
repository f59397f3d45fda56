//! The lock rules, as plain Rust: given what the key holds now ([`View`]), each operation returns
//! a [`Plan`]: what to write, which lease deadline to set, whether the lock is freed (handed to
//! a waiter, or the unlock message published), and the reply. Only the `store` touches Redis;
//! unit tests drive these functions directly.
//!
//! The rules are Redisson's reentrant lock (see the README's "How it maps to Redisson"):
//! a lock is a hash `owner -> hold count` whose key expiry is the lease.

use crate::args::{Lease, Mode};
use crate::error::LockError;

/// An absolute lease deadline: Unix time in milliseconds, as `PEXPIREAT` takes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Deadline(i64);

impl Deadline {
    /// The latest deadline there is (a lease that cannot be added to now saturates here).
    pub const LAST: Self = Self(i64::MAX);

    /// The deadline `lease` after `now_ms`.
    ///
    /// # Errors
    /// [`LockError::LeaseTooLarge`] when the sum does not fit a Unix time in milliseconds.
    pub fn after(now_ms: i64, lease: Lease) -> Result<Self, LockError> {
        i64::try_from(lease.as_millis())
            .ok()
            .and_then(|ms| now_ms.checked_add(ms))
            .map(Self)
            .ok_or(LockError::LeaseTooLarge)
    }

    /// The deadline at Unix ms `unix_ms`.
    #[must_use]
    pub const fn at(unix_ms: i64) -> Self {
        Self(unix_ms)
    }

    /// The deadline as Unix milliseconds.
    #[must_use]
    pub const fn unix_ms(self) -> i64 {
        self.0
    }

    /// When a lease ending at this deadline is over: Redis expires a key once now > deadline.
    #[must_use]
    pub const fn over_at(self) -> i64 {
        self.0.saturating_add(1)
    }
}

/// When a lease with `pttl` ms left at `now` is over (see [`Deadline::over_at`]).
#[must_use]
pub const fn lease_over_at(now: i64, pttl: i64) -> i64 {
    Deadline(now.saturating_add(pttl)).over_at()
}

/// How a re-entry or a renewal sets the lease of a hold its owner already has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Extend {
    /// Redisson's rule (the default): the new lease, whatever was left.
    Set,
    /// `GT`, the key's lease ending at Unix ms `until` (its absolute expiry as stored; -1: no
    /// expiry): the later of that and the new lease's end, as `PEXPIRE ... GT` does (a key
    /// without expiry keeps none). A lease is never shortened, so a renewal applied late (after
    /// a longer one) sets the expiry it already had.
    Gt { until: i64 },
}

impl Extend {
    /// `GT` against the key's absolute expiry `until` (-1: none) when `gt`, else [`Self::Set`].
    #[must_use]
    pub const fn new(gt: bool, until: i64) -> Self {
        if gt {
            Self::Gt { until }
        } else {
            Self::Set
        }
    }

    /// The deadline to set on the held key for a new lease ending at `deadline` (with `GT`, the
    /// key's own when it is later: set again exactly, so what follows a grant, its request
    /// record, its session binding, sees the lease end it has); `None`: leave the key without
    /// expiry (`GT` on a key that has none).
    #[must_use]
    pub const fn expire_at(self, deadline: Deadline) -> Option<Deadline> {
        match self {
            Self::Set => Some(deadline),
            Self::Gt { until } if until > deadline.0 => Some(Deadline(until)),
            Self::Gt { until } if until >= 0 => Some(deadline),
            Self::Gt { .. } => None,
        }
    }
}

/// What the lock's key holds, seen by the calling owner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum View {
    /// No key: the lock is free.
    Free,
    /// The key is a lock hash. `mine` is the caller's hold count if it is a holder;
    /// `pttl` the remaining lease in ms (-1: no expiry).
    Held { mine: Option<u64>, pttl: i64 },
}

/// What an operation writes to the key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Write {
    /// Nothing.
    Keep,
    /// Set the caller's hold count (creating the hash if needed).
    SetCount(u64),
    /// Delete the key.
    Delete,
}

/// A command's reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reply {
    Nil,
    Int(i64),
    /// `[1, token]`: held, with this fencing token (an acquire with `TOKEN`).
    Token(u64),
    /// `[0, pttl]`: not held; the holder's remaining lease (an acquire with `TOKEN`).
    Busy(i64),
}

/// An acquire's reply when it is granted: nil, or `[1, token]` when a token was asked for.
#[must_use]
pub const fn granted(token: Option<u64>) -> Reply {
    match token {
        Some(token) => Reply::Token(token),
        None => Reply::Nil,
    }
}

/// An acquire's reply when another owner holds the lock with `pttl` ms left (-1: no expiry):
/// the integer, or `[0, pttl]` when a token was asked for.
#[must_use]
pub const fn busy(pttl: i64, token: bool) -> Reply {
    if token {
        Reply::Busy(pttl)
    } else {
        Reply::Int(pttl)
    }
}

/// What a release's latch remembers for retries with the same request id: its 0 or 1. "Not
/// held" (nil) is not remembered, as in Redisson: a retry after a grant may release then.
#[must_use]
pub const fn remembered(reply: Reply) -> Option<i64> {
    match reply {
        Reply::Int(n @ (0 | 1)) => Some(n),
        _ => None,
    }
}

/// Which kind of lock a waiter waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A reentrant lock (`RLOCK.*`).
    Reentrant,
    /// A read-write lock's read or write hold (`RWLOCK.*`).
    Rw(Mode),
    /// This many permits of a counting semaphore (`RSEM.*`); the request's owner and lease are
    /// not used.
    Permits(u64),
    /// This many leased permits (`RSEM.ACQUIRE ... LEASE`), each for the request's lease; the
    /// owner is not used.
    Leased(u64),
    /// A count-down latch's awaiter (`RLATCH.AWAIT`): answered 1 when the latch opens; holds
    /// nothing, so the owner and lease are not used.
    Latch,
}

/// What a waiter asks for, kept in its queue until it is granted: its lock kind, owner and
/// lease. Each kind has its own rules for granting it (`store::waiters` asks them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub kind: Kind,
    pub owner: Vec<u8>,
    /// The lease the waiter gets when granted.
    pub lease: Lease,
    /// Whether it asked for a fencing token.
    pub token: bool,
    /// Its `REQUEST id`, if it has one: its grant writes the request record.
    pub id: Option<Vec<u8>>,
    /// `SESSION`: its grant is bound to the waiting client's connection.
    pub session: Option<crate::sessions::Bind>,
    /// `GT`: should its grant come as a re-entry (the owner got the lock meanwhile through
    /// another waiter), it never shortens the owner's lease.
    pub gt: bool,
    /// `OWNERLESS` (counted permits): its request record lasts 60 s, not until released.
    pub ownerless: bool,
}

impl Request {
    /// The grant of this request on the lock as it is now: the plan to apply, or `None` while
    /// the lock cannot be granted to it (the hand-off stops at the first waiter it cannot
    /// grant, so the queue stays FIFO). `expire_at`: the lock key's absolute expiry (-1: none), which a grant with `GT` that comes
    /// as a re-entry keeps when it is later.
    #[must_use]
    pub fn grant(&self, view: View, now_ms: i64, expire_at: i64) -> Option<Plan> {
        let deadline = Deadline::after(now_ms, self.lease).unwrap_or(Deadline::LAST);
        let extend = Extend::new(self.gt, expire_at);
        acquire(view, deadline, extend).ok().filter(|plan| plan.reply == Reply::Nil)
    }

    /// The reply of a wait that ends without a grant, the lock's holder having `pttl` ms left
    /// (a semaphore's: 0, not taken).
    #[must_use]
    pub const fn not_granted(&self, pttl: i64) -> Reply {
        match self.kind {
            Kind::Permits(_) | Kind::Latch => Reply::Int(0),
            Kind::Leased(_) => Reply::Nil,
            Kind::Reentrant | Kind::Rw(_) => busy(pttl, self.token),
        }
    }

    /// Whether a grant of this request excludes every other waiter (a reentrant lock's and a
    /// write hold's do: the hand-off stops after it without reading the key again; a read hold
    /// may be followed by more readers).
    #[must_use]
    pub const fn exclusive(&self) -> bool {
        !matches!(
            self.kind,
            Kind::Rw(Mode::Read) | Kind::Permits(_) | Kind::Leased(_) | Kind::Latch
        )
    }
}

/// The outcome of an operation: everything the key layer must do, in this order:
/// write, set the lease, publish, reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Plan {
    pub write: Write,
    /// A new lease deadline for the key (`None`: leave the expiry as it is).
    pub expire_at: Option<Deadline>,
    /// The lock is freed: it goes to its longest-waiting client, or (nobody waiting) the unlock
    /// message is published (`0` on `redisson_lock__channel:{key}`).
    pub publish: bool,
    pub reply: Reply,
}

impl Plan {
    const fn reply(reply: Reply) -> Self {
        Self { write: Write::Keep, expire_at: None, publish: false, reply }
    }

    const fn freed(reply: Reply) -> Self {
        Self { write: Write::Delete, expire_at: None, publish: true, reply }
    }

    /// Whether the plan changes the dataset (and so must be replicated).
    #[must_use]
    pub const fn writes(&self) -> bool {
        !matches!(self.write, Write::Keep) || self.expire_at.is_some()
    }
}

/// Parses an owner's hold count as stored in the hash.
///
/// # Errors
/// [`LockError::CorruptCount`] unless it is a positive integer that fits an `i64`.
pub fn parse_count(stored: &[u8]) -> Result<u64, LockError> {
    crate::args::parse_positive(stored).ok_or(LockError::CorruptCount)
}

/// The grant of a free lock: the caller's count 1, the lease set, reply nil.
#[must_use]
const fn grant(deadline: Deadline) -> Plan {
    Plan { write: Write::SetCount(1), expire_at: Some(deadline), publish: false, reply: Reply::Nil }
}

/// `ACQUIRE`: take a free lock (count 1, the lease set), or re-enter one we hold (count + 1,
/// the lease set as `extend` says). Held by another owner: reply its remaining lease, change
/// nothing.
///
/// # Errors
/// [`LockError::CountOverflow`] when re-entry would pass `i64::MAX` holds.
pub fn acquire(view: View, deadline: Deadline, extend: Extend) -> Result<Plan, LockError> {
    let count = match view {
        View::Free => return Ok(grant(deadline)),
        View::Held { mine: Some(held), .. } => next_count(held)?,
        View::Held { mine: None, pttl } => return Ok(Plan::reply(Reply::Int(pttl))),
    };
    Ok(Plan {
        write: Write::SetCount(count),
        expire_at: extend.expire_at(deadline),
        publish: false,
        reply: Reply::Nil,
    })
}

fn next_count(held: u64) -> Result<u64, LockError> {
    held.checked_add(1).filter(|&c| c <= i64::MAX as u64).ok_or(LockError::CountOverflow)
}

/// `RELEASE`: drop one hold. Not a holder: nil. Last hold: delete the key, publish, reply 1.
/// Otherwise: count - 1, the lease reset when one is given, reply 0.
#[must_use]
pub fn release(view: View, lease: Option<Deadline>) -> Plan {
    match view {
        View::Free | View::Held { mine: None, .. } => Plan::reply(Reply::Nil),
        View::Held { mine: Some(held), .. } if held <= 1 => Plan::freed(Reply::Int(1)),
        View::Held { mine: Some(held), .. } => Plan {
            write: Write::SetCount(held - 1),
            expire_at: lease,
            publish: false,
            reply: Reply::Int(0),
        },
    }
}

/// `RENEW`: a holder gets a new lease, set as `extend` says (reply 1); anyone else gets 0 and
/// nothing is created.
#[must_use]
pub fn renew(view: View, deadline: Deadline, extend: Extend) -> Plan {
    match view {
        View::Held { mine: Some(_), .. } => Plan {
            write: Write::Keep,
            expire_at: extend.expire_at(deadline),
            publish: false,
            reply: Reply::Int(1),
        },
        View::Free | View::Held { mine: None, .. } => Plan::reply(Reply::Int(0)),
    }
}

/// `FORCERELEASE`: delete any lock and publish (reply 1), or reply 0 when there is none.
#[must_use]
pub fn force_release(view: View) -> Plan {
    match view {
        View::Free => Plan::reply(Reply::Int(0)),
        View::Held { .. } => Plan::freed(Reply::Int(1)),
    }
}

/// `PTTL`'s reply: -2 when there is no lock, else the remaining lease (-1: no expiry).
#[must_use]
pub const fn pttl(view: View) -> i64 {
    match view {
        View::Free => -2,
        View::Held { pttl, .. } => pttl,
    }
}

/// Parses a fencing-token counter as stored (`None`: no counter yet, so 0).
///
/// # Errors
/// [`LockError::CorruptToken`] unless it is a non-negative integer that fits an `i64`.
pub fn parse_token(stored: Option<&[u8]>) -> Result<u64, LockError> {
    match stored {
        None | Some(b"0") => Ok(0),
        Some(bytes) => crate::args::parse_positive(bytes).ok_or(LockError::CorruptToken),
    }
}

/// The token of the next grant: strictly greater than every token granted before, and at least
/// `floor` (raised on promotion, see `replicas`, so a new master's tokens are above every token
/// its predecessor may have issued without replicating it).
///
/// # Errors
/// [`LockError::TokenExhausted`] when the counter is at the largest integer Redis stores.
pub fn next_token(current: u64, floor: u64) -> Result<u64, LockError> {
    current
        .checked_add(1)
        .map(|t| t.max(floor))
        .filter(|&t| t <= i64::MAX as u64)
        .ok_or(LockError::TokenExhausted)
}
