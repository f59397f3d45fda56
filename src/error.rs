//! The one error type of the module and its one conversion to a Redis error reply.
//!
//! Every reply starts with a code (`ERR`, `WRONGTYPE`) as Redis's own errors do, and every
//! error is returned before anything is written: an error never leaves a half-applied change.

use std::fmt;

use redis_module::RedisError;

/// Everything an `RLOCK.*` command can refuse with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum LockError {
    /// Too few or too many arguments for a fixed-arity command; Redis's standard reply.
    WrongArity,
    /// An argument left over after the command's syntax was read.
    Syntax,
    /// `lease-ms` is not a positive integer.
    InvalidLease,
    /// `WAIT` without a value, or a timeout that is not a non-negative integer.
    InvalidTimeout,
    /// `REQUEST` without an id, or an empty one.
    InvalidRequest,
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
    /// The key is a hash but not a reentrant lock (`RLOCK.INFO` needs exactly one owner field).
    NotALock,
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
            Self::InvalidLease => "ERR lease-ms must be a positive integer of milliseconds",
            Self::InvalidTimeout => {
                "ERR timeout-ms (after WAIT) must be a non-negative integer of milliseconds"
            }
            Self::InvalidRequest => "ERR request id (after REQUEST) must not be empty",
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
                "ERR the fencing token counter (redisson_lock_token:{key}) is not a non-negative integer"
            }
            Self::NotALock => {
                "ERR the key is a hash but not a reentrant lock (it needs exactly one owner field)"
            }
            Self::Internal => "ERR internal error in the rlock module (see the server log)",
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
