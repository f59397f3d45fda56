//! The crate's one error type.

use std::fmt;

use redis::RedisError;

/// Errors of lock operations.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// The lock was not held by this owner (released by someone else, or its lease ran out).
    NotHeld,
    /// The wait budget ran out before the lock (or permits) could be taken, or the server did
    /// not answer in time; the request was cancelled (nothing stays held).
    TimedOut,
    /// The lock (or permits) was taken, but fewer replicas than [`crate::Options::replica_ack`]
    /// asks for acknowledged it in time; it was given back (the request cancelled).
    NotReplicated {
        /// Replicas asked for.
        wanted: u32,
        /// Replicas that acknowledged.
        acknowledged: u32,
    },
    /// The lock (or permits) was taken, but its grant was not written to the AOF (fsynced) of
    /// the master and/or of as many replicas as [`crate::Options::aof_ack`] asks for in time;
    /// it was given back (the request cancelled).
    NotPersisted {
        /// Whether the master's own fsync was asked for, and whether it happened.
        local: (bool, bool),
        /// Replicas asked for, and replicas that fsynced the grant.
        replicas: (u32, u32),
    },
    /// The server does not have the rlock module loaded (checked when the client opens), or
    /// answers that it does not know an rlock command (a module from before `RLATCH.*`, for a
    /// [`crate::Latch`]).
    NoModule,
    /// A zero lease was asked for (`Some(Duration::ZERO)`, or a zero
    /// [`crate::Options::watchdog_timeout`]): it would end as it starts. Refused before
    /// anything is sent.
    ZeroLease,
    /// A latch count or count-down amount outside 1 to `i64::MAX` was given (as the server
    /// would refuse it: a latch counts from 1, and counting down by nothing counts nothing).
    /// Refused before anything is sent.
    InvalidCount {
        /// The count or amount given.
        value: u64,
    },
    /// An argument refused before anything is sent (the message names it and says why): a
    /// lease, wait or timeout too long for the clock arithmetic of the client or the server
    /// (beyond [`crate::MAX_DURATION`]), a zero where it means nothing (a keepalive, a
    /// RedLock's node timeout), a permit count outside what the server takes, a
    /// [`crate::MultiLock`] or [`crate::RedLock`] with no lock, a [`crate::MultiLock`] given a
    /// read-write lock's side or the same lock twice.
    InvalidArgument(String),
    /// The [`crate::Session`] this lock, read-write lock or semaphore was made from is closed
    /// (its connection closed or failed, or the session was dropped): its holds ended, and it
    /// takes no more. Open a new session ([`crate::LockClient::session`]).
    SessionClosed,
    /// Sessions are not available here: on a cluster client (a session is one connection to
    /// one server), or for an address the session cannot open itself (TLS).
    SessionUnsupported,
    /// The server refused the wait (`-DEADLOCK ...`): queueing it would have closed a cycle of
    /// owners each waiting for a lock another one holds, so it could never be granted before a
    /// lease ends. Nothing was taken or queued. Release a lock this owner holds (or take the
    /// locks in one order everywhere) and try again.
    Deadlock {
        /// The server's description of the cycle, e.g. `B waits for k1 held by A; A waits for
        /// k2 held by B` (keys and owners escaped as `\xNN` where not printable).
        cycle: String,
    },
    /// The server refused a read-write lock's write side for an owner that holds its read side
    /// (`ERR upgrade refused ...`): waiting would wait for itself. Nothing was taken or queued.
    /// Release the read holds first (or take the write lock first: write then read re-enters).
    UpgradeRefused,
    /// Redis (or the connection to it) failed.
    Redis(RedisError),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NotHeld => f.write_str("the lock is not held by this owner"),
            Self::TimedOut => f.write_str("timed out waiting for the lock"),
            Self::NotReplicated { wanted, acknowledged } => write!(
                f,
                "the lock reached {acknowledged} replica(s) of the {wanted} required; released"
            ),
            Self::NotPersisted { local, replicas } => write!(
                f,
                "the lock's grant was fsynced to the AOF of {} replica(s) of the {} required{}; released",
                replicas.1,
                replicas.0,
                match local {
                    (true, false) => " and not on the master",
                    _ => "",
                }
            ),
            Self::NoModule => f.write_str("the server does not have the rlock module loaded"),
            Self::ZeroLease => f.write_str("a lease must be longer than zero"),
            Self::InvalidCount { value } => write!(
                f,
                "a latch count or amount must be 1 to 9223372036854775807, not {value}"
            ),
            Self::InvalidArgument(why) => write!(f, "invalid argument: {why}"),
            Self::SessionClosed => {
                f.write_str("the session's connection is closed: its holds ended; open a new session")
            }
            Self::SessionUnsupported => f.write_str(
                "sessions need one connection to one server: not available on a cluster client or over TLS",
            ),
            Self::Deadlock { cycle } => write!(f, "deadlock: {cycle}"),
            Self::UpgradeRefused => f.write_str(
                "upgrade refused: this owner holds the read lock and asks for the write lock; release its read holds first",
            ),
            Self::Redis(e) => write!(f, "redis error: {e}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Redis(e) => Some(e),
            _ => None,
        }
    }
}

impl From<RedisError> for Error {
    /// [`Error::NoModule`] when the server does not know an rlock command (`ERR unknown command
    /// 'rlock.acquire' ...`); [`Error::Deadlock`] for a `DEADLOCK` refusal;
    /// [`Error::UpgradeRefused`] for `ERR upgrade refused ...`; [`Error::Redis`] otherwise.
    fn from(e: RedisError) -> Self {
        if unknown_rlock_command(&e) {
            Self::NoModule
        } else if e.code() == Some("DEADLOCK") {
            let detail = e.detail().unwrap_or_default();
            let cycle =
                detail.strip_prefix("this wait would close a cycle: ").unwrap_or(detail).to_owned();
            Self::Deadlock { cycle }
        } else if e.code() == Some("ERR")
            && e.detail().is_some_and(|d| d.starts_with("upgrade refused"))
        {
            Self::UpgradeRefused
        } else {
            Self::Redis(e)
        }
    }
}

/// Whether the server answered that it does not know an `RLOCK.*`, `RWLOCK.*`, `RSEM.*` or
/// `RLATCH.*` command (Redis 6 quotes the name with a backquote, later servers with a quote).
fn unknown_rlock_command(e: &RedisError) -> bool {
    let Some(detail) = e.detail().filter(|_| e.code() == Some("ERR")) else { return false };
    let Some(name) = detail
        .strip_prefix("unknown command '")
        .or_else(|| detail.strip_prefix("unknown command `"))
    else {
        return false;
    };
    let name = name.as_bytes();
    [&b"rlock."[..], b"rwlock.", b"rsem.", b"rlatch."]
        .iter()
        .any(|prefix| name.get(..prefix.len()).is_some_and(|n| n.eq_ignore_ascii_case(prefix)))
}

/// Whether `e` is a server's error reply (not a failure of the connection or of the client).
pub(crate) fn from_server(e: &RedisError) -> bool {
    matches!(e.kind(), redis::ErrorKind::Server(_) | redis::ErrorKind::Extension)
}

/// Whether `e` is `TRYAGAIN`: the server changed nothing and asks for the same command again
/// (the module's refusal of an id it has no record of right after a stall; a cluster's slot
/// being moved).
pub(crate) fn try_again(e: &RedisError) -> bool {
    e.code() == Some("TRYAGAIN")
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// [`Error::InvalidArgument`] for a duration beyond [`crate::MAX_DURATION`].
pub(crate) fn too_long(what: &str, value: std::time::Duration) -> Error {
    Error::InvalidArgument(format!(
        "{what} of {value:?} is longer than the longest the client takes ({:?})",
        crate::MAX_DURATION
    ))
}

/// Whether a redis error leaves the outcome of a command unknown (it may have run, or still
/// run): a timeout, an I/O error, a dropped or refused connection.
pub(crate) fn redis_uncertain(e: &redis::RedisError) -> bool {
    e.is_timeout() || e.is_io_error() || e.is_connection_dropped() || e.is_connection_refusal()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server_error(text: &str) -> RedisError {
        let reply = format!("-{text}\r\n");
        match redis::parse_redis_value(reply.as_bytes()) {
            Ok(redis::Value::ServerError(e)) => e.into(),
            other => panic!("not an error reply: {other:?}"),
        }
    }

    #[test]
    fn an_unknown_rlock_command_is_no_module() {
        for text in [
            "ERR unknown command 'RLOCK.ACQUIRE', with args beginning with: 'l' ",
            "ERR unknown command 'rwlock.release', with args beginning with: ",
            "ERR unknown command `RSEM.ACQUIRE`, with args beginning with: `s`, ",
            "ERR unknown command 'RLATCH.AWAIT', with args beginning with: 'l' '0' ",
        ] {
            assert!(matches!(Error::from(server_error(text)), Error::NoModule), "{text}");
        }
        for text in [
            "ERR unknown command 'GET', with args beginning with: ",
            "ERR unknown command 'rlockx', with args beginning with: ",
            "ERR wrong number of arguments for 'rlock.acquire' command",
            "NOPERM this user has no permissions to run the 'rlock.acquire' command",
        ] {
            assert!(matches!(Error::from(server_error(text)), Error::Redis(_)), "{text}");
        }
    }

    #[test]
    fn an_upgrade_refusal_is_typed() {
        let text = "ERR upgrade refused: this owner holds the read lock and asks for the write lock, which would wait for itself; release its read holds first";
        assert!(matches!(Error::from(server_error(text)), Error::UpgradeRefused));
        let other = "ERR upgrade: something else";
        assert!(matches!(Error::from(server_error(other)), Error::Redis(_)));
    }

    #[test]
    fn a_deadlock_refusal_carries_its_cycle() {
        let text = "DEADLOCK this wait would close a cycle: b waits for k1 held by a; a waits for k: 2 held by b";
        match Error::from(server_error(text)) {
            Error::Deadlock { cycle } => {
                assert_eq!(cycle, "b waits for k1 held by a; a waits for k: 2 held by b");
            }
            other => panic!("{other:?}"),
        }
    }
}
