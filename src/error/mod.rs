//! The one error type of the module and its one conversion to a Redis error reply.
//!
//! Every reply starts with a code (`ERR`, `WRONGTYPE`) as Redis's own errors do, and every
//! error is returned before anything is written: an error never leaves a half-applied change.

mod int_arg;
mod refused;

use std::fmt;

use redis_module::RedisError;

pub use int_arg::{IntArg, IntProblem};
pub use refused::Refused;

/// Everything an `RLOCK.*` command can refuse with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum LockError {
    /// Too few or too many arguments for a fixed-arity command; Redis's standard reply.
    WrongArity,
    /// An argument left over after the command's syntax was read.
    Syntax,
    /// An integer argument that is missing, not an integer, or outside its range.
    BadInteger(IntArg, IntProblem),
    /// An empty id after `REQUEST`.
    InvalidRequest,
    /// `REQUEST` without an id.
    MissingRequest,
    /// `ONCE` (of `RSEM.RELEASE`) without an id.
    MissingOnce,
    /// An empty id after `ONCE`.
    InvalidOnce,
    /// An empty `id` argument (`RLOCK.CANCEL`, `RSEM.RENEW`).
    EmptyId,
    /// The server became a replica while the client waited.
    Demoted,
    /// `now + lease-ms` does not fit a Unix time in milliseconds.
    LeaseTooLarge,
    /// The owner id is empty.
    EmptyOwner,
    /// The key holds something other than a hash.
    WrongType,
    /// The owner's field in the lock hash is not a positive integer.
    CorruptCount,
    /// Re-entering would take the hold count past the largest integer Redis stores.
    CountOverflow,
    /// The fencing-token counter key holds something other than a non-negative integer.
    CorruptToken,
    /// The fencing-token counter is at the largest integer Redis stores.
    TokenExhausted,
    /// The unlock latch key holds something other than a release result.
    CorruptLatch,
    /// In cluster mode, a derived key (token counter, unlock latch, request record) would land in another hash
    /// slot than the lock (a name whose braces form no hash tag of their own).
    CrossSlot,
    /// The caller's ACL user may not write the lock's token counter.
    NoPermToken,
    /// The caller's ACL user may not write the lock's unlock latch.
    NoPermLatch,
    /// The caller's ACL user may not publish on the lock's unlock channel.
    NoPermChannel,
    /// The key is a hash but not a reentrant lock (`RLOCK.INFO` needs exactly one owner field).
    NotALock,
    /// `RLOCK.*` on a read-write lock's hash (it has a `mode` field).
    NotAReentrantLock,
    /// `RWLOCK.*` on a hash without `mode` (a reentrant lock).
    NotAnRwLock,
    /// A read-write lock owner that would read as another field of its hash.
    ReservedOwner,
    /// `RWLOCK.ACQUIRE ... WRITE ... WAIT` by an owner that holds only read: it would wait for
    /// itself.
    Upgrade,
    /// `READ|WRITE` missing or misspelled.
    InvalidMode,
    /// The caller's ACL user may not write the read-write lock's read hold keys.
    NoPermHold,
    /// A read re-entry past `rw_rules::MAX_READ_HOLDS` holds of one owner.
    TooManyReadHolds,
    /// A read-write lock with more read holds over all its readers than a release or a
    /// dead-reader check may read (`rw_rules::MAX_LOCK_READ_HOLDS`).
    TooManyLockReadHolds,
    /// The semaphore's key holds a string that is not an integer.
    CorruptPermits,
    /// A latch whose count is not an integer (`INCRBY`'s rules).
    CorruptLatchCount,
    /// The permit count would leave the range of integers Redis stores.
    PermitsOverflow,
    /// An empty id after `ID`.
    InvalidPermitId,
    /// `ID` without an id.
    MissingPermitId,
    /// The caller's ACL user may not use the semaphore's lease zset.
    NoPermLeases,
    /// `RSEM.ACQUIRE ... LEASE` asks for more permits than one call may lease.
    TooManyLeased,
    /// `RSEM.RELEASE ... ID` names more ids than one call may release.
    TooManyIds,
    /// This master had replicas and too few are in sync now (or it stalled, or has not checked
    /// them recently: the rule that refused): it may have been replaced by a promoted replica,
    /// so it grants nothing (retry on the current master).
    NoReplicas(Refused),
    /// The same guard refusing a give-back of counted permits (`RSEM.RELEASE key permits`,
    /// `RLOCK.CANCEL` of a counted grant): given back on a master that was replaced, they would
    /// be lost with its data, and counted permits have no lease to bring them back (retry on
    /// the current master).
    NoReplicasGiveBack(Refused),
    /// The same guard refusing a change of a semaphore's count (`RSEM.ADDPERMITS`,
    /// `RSEM.SETPERMITS`): lost with a replaced master's data, it would leave the count short
    /// or over its total (retry on the current master).
    NoReplicasCount(Refused),
    /// The caller's ACL user may not use the request record (`rlock_request:...`) of an
    /// acquire's or a cancel's `REQUEST id`.
    NoPermRequest,
    /// The request record key holds a string that is not a request record.
    CorruptRequest,
    /// An acquire whose request was cancelled (`RLOCK.CANCEL`, or the rollback of a grant whose
    /// client left): it gets nothing, and never waits.
    RequestCancelled,
    /// An acquire with `REQUEST id` whose owner is longer than `args::MAX_REQUEST_OWNER`.
    RequestOwnerTooLong,
    /// An acquire whose request id already waits in this lock's queue.
    RequestWaiting,
    /// A release with a `REQUEST`/`ONCE` id this server has no record of, run right after the
    /// server stalled: it may be a resend that waited in the server's buffers through the
    /// stall while the record of its first send ended (`replicas::resumed_from_stall`).
    UnknownIdAfterStall,
    /// An acquire whose request id's record holds the grant of another acquire (another owner,
    /// mode, permit count, or `TOKEN`).
    RequestMismatch,
    /// `LOCKDELAY` without a value, or one that is not an integer from 0 to
    /// `sessions::MAX_LOCK_DELAY_MS`.
    InvalidLockDelay,
    /// `LOCKDELAY` without `SESSION`.
    LockDelayNeedsSession,
    /// `RSEM.ACQUIRE ... SESSION` without `LEASE`: counted permits have nothing to bind.
    SessionNeedsLease,
    /// `RSEM.ACQUIRE ... OWNERLESS` without `REQUEST id`.
    OwnerlessNeedsRequest,
    /// `SESSION` where the caller's connection cannot be known (a script, another module's
    /// call): the hold could never end with it.
    SessionNoConnection,
    /// `SESSION` on a replica: bindings live only in a master's memory.
    SessionOnReplica,
    /// An acquire or renewal as `sessions::PLACEHOLDER`, the owner of a lock-delay.
    LockDelayOwner,
    /// `RSEM.RENEW` of a lock-delay's placeholder permit (`rlock:lockdelay:<id>`).
    LockDelayPermit,
    /// `COUNT` (of `*.WAITERS`) without a value, or not an integer from 1 to
    /// `args::waiters::MAX_WAITERS`.
    InvalidCount,
    /// A bug in the module, caught before it could take the server down.
    Internal,
}

impl LockError {
    /// The full reply text, error code first.
    #[must_use]
    pub const fn message(self) -> &'static str {
        match self {
            Self::WrongArity => "ERR wrong number of arguments",
            Self::Syntax => "ERR syntax error",
            Self::BadInteger(arg, problem) => arg.message(problem),
            Self::InvalidRequest => "ERR request id (after REQUEST) must not be empty",
            Self::MissingRequest => "ERR request id is missing after REQUEST",
            Self::MissingOnce => "ERR release id is missing after ONCE",
            Self::InvalidOnce => "ERR release id (after ONCE) must not be empty",
            Self::EmptyId => "ERR id must not be empty",
            Self::Demoted => {
                "READONLY the server became a replica while this client waited for the lock"
            }
            Self::LeaseTooLarge => "ERR lease-ms is too large: now + lease-ms overflows",
            Self::EmptyOwner => "ERR owner must not be empty",
            Self::WrongType => "WRONGTYPE Operation against a key holding the wrong kind of value",
            Self::CorruptCount => {
                "ERR the lock hash holds a hold count for this owner that is not a positive integer"
            }
            Self::CountOverflow => "ERR hold count overflow",
            Self::CorruptToken => {
                "ERR the fencing token counter (redisson_lock_token:...) is not a non-negative integer"
            }
            Self::TokenExhausted => {
                "ERR the fencing token counter cannot grow: it holds the largest integer Redis stores"
            }
            Self::CorruptLatch => {
                "ERR the unlock latch (redisson_unlock_latch:...) holds a value that is not a release result"
            }
            Self::CrossSlot => {
                "ERR the lock name's braces form no hash tag, so its token counter, unlock latch or request record would live in another cluster slot: use a name with a complete {tag} or no braces"
            }
            Self::NoPermToken => {
                "NOPERM this user has no permissions to access the lock's fencing token counter key (redisson_lock_token:...)"
            }
            Self::NoPermLatch => {
                "NOPERM this user has no permissions to access the lock's unlock latch key (redisson_unlock_latch:...)"
            }
            Self::NoPermChannel => {
                "NOPERM this user has no permissions to publish on the lock's unlock channel (redisson_lock__channel:..., redisson_rwlock:..., redisson_sc:... or redisson_countdownlatch__channel__...)"
            }
            Self::NotALock => {
                "ERR the key is a hash but not a reentrant lock (it needs exactly one owner field)"
            }
            Self::NotAReentrantLock => {
                "WRONGTYPE the key holds a read-write lock, not a reentrant lock: use RWLOCK.*"
            }
            Self::NotAnRwLock => {
                "WRONGTYPE the key holds a reentrant lock, not a read-write lock: use RLOCK.*"
            }
            Self::ReservedOwner => {
                "ERR owner must not be 'mode' or end in ':write' (they name other fields of the read-write lock)"
            }
            Self::Upgrade => {
                "ERR upgrade refused: this owner holds the read lock and asks for the write lock, which would wait for itself; release its read holds first"
            }
            Self::InvalidMode => "ERR mode must be READ or WRITE",
            Self::CorruptPermits => "ERR the semaphore's value is not an integer",
            Self::CorruptLatchCount => "ERR the latch's count is not an integer",
            Self::PermitsOverflow => "ERR permit count overflow",
            Self::InvalidPermitId => "ERR permit id (after ID) must not be empty",
            Self::MissingPermitId => "ERR permit id is missing after ID",
            Self::NoPermLeases => {
                "NOPERM this user has no permissions to access the semaphore's lease zset ({name}:timeout)"
            }
            Self::TooManyLeased => "ERR permits with LEASE must be at most 10000 per call",
            Self::TooManyIds => "ERR at most 10000 permit ids (after ID) per call",
            Self::NoPermHold => {
                "NOPERM this user has no permissions to access the read-write lock's read hold keys ({name}:<owner>:rwlock_timeout:<i>)"
            }
            Self::TooManyReadHolds => {
                "ERR read hold limit reached: one owner holds the read lock at most 1000 times at once; release some of its read holds first"
            }
            Self::TooManyLockReadHolds => {
                "ERR the lock holds more than 100000 read holds in all (its readers' counts): a release or a check would read every hold key; RWLOCK.FORCERELEASE clears it"
            }
            Self::NoReplicas(rule) => rule.message(),
            Self::NoReplicasGiveBack(rule) => rule.give_back_message(),
            Self::NoReplicasCount(rule) => rule.count_message(),
            Self::NoPermRequest => {
                "NOPERM this user has no permissions to access the request record key (rlock_request:...)"
            }
            Self::CorruptRequest => {
                "ERR the request record (rlock_request:...) holds a value that is not a request record"
            }
            Self::RequestOwnerTooLong => {
                "ERR owner must be at most 65536 bytes with REQUEST (the request record holds it)"
            }
            Self::RequestCancelled => "ERR request was cancelled",
            Self::RequestWaiting => "ERR request is already waiting",
            Self::UnknownIdAfterStall => {
                "TRYAGAIN this server did not run for longer than rlock.stall-ms just now; an id it has no record of may be a late resend of one whose record ended meanwhile, so it is not taken as new before the server's next check (within 100 ms): retry"
            }
            Self::RequestMismatch => {
                "ERR request belongs to another acquire (another owner, mode, permit count or TOKEN)"
            }
            Self::InvalidLockDelay => {
                "ERR lockdelay-ms (after LOCKDELAY) must be an integer of milliseconds from 0 to 60000"
            }
            Self::LockDelayNeedsSession => {
                "ERR LOCKDELAY needs SESSION (a lock-delay follows only a hold ended by its connection closing)"
            }
            Self::SessionNeedsLease => {
                "ERR SESSION needs LEASE: counted permits have no holder to bind to a connection"
            }
            Self::OwnerlessNeedsRequest => {
                "ERR OWNERLESS needs REQUEST id: it sets how long the request's record lasts"
            }
            Self::SessionNoConnection => {
                "ERR SESSION needs the caller's own connection: not inside a script (EVAL, FCALL) or another module's call"
            }
            Self::SessionOnReplica => {
                "ERR SESSION binds holds on a master only (this server is a replica)"
            }
            Self::LockDelayOwner => {
                "ERR owner 'rlock:lockdelay' is reserved: it holds a lock during its lock-delay"
            }
            Self::LockDelayPermit => {
                "ERR permit ids 'rlock:lockdelay:...' are reserved: they hold a permit during its \
                 lock-delay"
            }
            Self::InvalidCount => "ERR count (after COUNT) must be an integer from 1 to 1000",
            Self::Internal => "ERR internal error in the rlock module (see the server log)",
        }
    }

    /// The reply text naming request `id` (`ERR request <id> was cancelled`) for the errors
    /// about one request; [`Self::message`] for the others.
    #[must_use]
    pub fn naming(self, id: &[u8]) -> String {
        let id = shown(id);
        match self {
            Self::RequestCancelled => format!("ERR request {id} was cancelled"),
            Self::RequestWaiting => format!("ERR request {id} is already waiting"),
            Self::RequestMismatch => format!(
                "ERR request {id} belongs to another acquire (another owner, mode, permit count or TOKEN)"
            ),
            other => other.message().to_owned(),
        }
    }
}

/// A refusal of a command that carries a request id: its reply names the id
/// ([`LockError::naming`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// Any refusal, as [`LockError`] replies it.
    Plain(LockError),
    /// A refusal about request `id`.
    Request(LockError, Vec<u8>),
    /// A wait refused because it would close a cycle of owners waiting for each other: the
    /// reply's full text (`DEADLOCK ...`, `deadlock_rules::describe`).
    Deadlock(String),
}

impl From<LockError> for Refusal {
    fn from(e: LockError) -> Self {
        Self::Plain(e)
    }
}

impl From<Refusal> for RedisError {
    fn from(refusal: Refusal) -> Self {
        match refusal {
            Refusal::Plain(e) => e.into(),
            Refusal::Request(e, id) => Self::String(e.naming(&id)),
            Refusal::Deadlock(text) => Self::String(text),
        }
    }
}

impl fmt::Display for LockError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.message())
    }
}

impl From<LockError> for RedisError {
    fn from(e: LockError) -> Self {
        match e {
            // Redis's own reply, which names the command: "ERR wrong number of arguments for
            // 'rlock.acquire' command".
            LockError::WrongArity => Self::WrongArity,
            other => Self::Str(other.message()),
        }
    }
}

/// A request id as an error reply shows it: printable ASCII as is, any other byte (and `\`) as
/// `\xNN`, at most 128 bytes of it (then `...`), so an id never breaks the reply's protocol.
#[must_use]
pub fn shown(id: &[u8]) -> String {
    const MAX: usize = 128;
    let mut out = String::new();
    for &b in id.iter().take(MAX) {
        if b.is_ascii_graphic() && b != b'\\' {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("\\x{b:02x}"));
        }
    }
    if id.len() > MAX {
        out.push_str("...");
    }
    out
}
