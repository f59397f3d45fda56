//! What keeps a long server-side wait (a request's, a latch's) going when its connection fails:
//! which errors mean "send it again where the key is served now" ([`resumable`]), the pause
//! between attempts, and the check from another connection that notices a wait whose
//! connection died without a word ([`CHECK_AFTER`], [`CHECK_EVERY`]).
//!
//! A connection that died silently (a host gone, a cut link, a NAT entry dropped) gives no
//! error: no reset comes, and TCP keepalive is answered by whatever sits in between (a proxy's
//! kernel). A blocked `WAIT` cannot be pinged either (the server reads nothing from a blocked
//! client). So a wait's own connection cannot tell; another connection can ask the server about
//! the request itself, by its id.

use std::time::Duration;

use crate::error::redis_uncertain;
use crate::error::Error;
use crate::shared::Shared;

/// The first pause before a wait is sent again (after a lost connection, a failover); it
/// doubles up to [`RETRY_MAX`].
pub(crate) const RETRY_FIRST: Duration = Duration::from_millis(50);
/// The longest pause between two attempts of one wait.
pub(crate) const RETRY_MAX: Duration = Duration::from_secs(1);

/// A wait is checked from another connection only once it has lasted this long (a short wait
/// costs nothing more)...
pub(crate) const CHECK_AFTER: Duration = Duration::from_secs(5);
/// ... and then every this long: one command per long wait per period.
pub(crate) const CHECK_EVERY: Duration = Duration::from_secs(5);
/// How long one check may take (on the shared connection, itself replaced after a timeout).
pub(crate) const CHECK_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a grant the check saw made may take to arrive on the wait's own connection before
/// that connection is taken as dead.
pub(crate) const REPLY_GRACE: Duration = Duration::from_secs(1);

/// Whether a failed attempt of a wait may be sent again: the connection failed or timed out
/// (killed, a restart, a stall, a Sentinel failover), or the server is not (yet) the one to
/// wait on (a master demoted by a failover: `READONLY`, a cluster failover's `UNBLOCKED`, a
/// cluster reconfiguring, a server loading its data, a master whose replica guard grants
/// nothing now: `NOREPLICAS`, as the old master answers during a failover).
pub(crate) fn resumable(e: &Error) -> bool {
    let Error::Redis(e) = e else { return false };
    redis_uncertain(e)
        || e.code().is_some_and(|code| {
            matches!(
                code,
                "READONLY"
                    | "UNBLOCKED"
                    | "MASTERDOWN"
                    | "LOADING"
                    | "CLUSTERDOWN"
                    | "TRYAGAIN"
                    | "NOREPLICAS"
            )
        })
}

/// Whether the server refused a request because the same id still waits (an earlier attempt's
/// wait the server has not seen closed yet).
pub(crate) fn already_waiting(e: &Error) -> bool {
    matches!(e, Error::Redis(e) if e.to_string().contains("is already waiting"))
}

/// After a failure that may mean the master changed, a Sentinel client asks the Sentinels
/// again on its next command.
pub(crate) fn forget_master(shared: &Shared) {
    if let crate::conn::Target::Sentinel(sentinel) = &shared.target {
        sentinel.forget();
    }
}

/// The pause before the next attempt: `pause`, reset to [`RETRY_FIRST`] after an attempt that
/// lasted (a working wait), and the one after it (doubled, at most [`RETRY_MAX`]).
pub(crate) fn next_pause(pause: Duration, lasted: Duration) -> (Duration, Duration) {
    let pause = if lasted > RETRY_MAX { RETRY_FIRST } else { pause };
    (pause, pause.saturating_mul(2).min(RETRY_MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Error {
        match redis::parse_redis_value(format!("-{text}\r\n").as_bytes()) {
            Ok(redis::Value::ServerError(e)) => Error::Redis(e.into()),
            other => panic!("not an error reply: {other:?}"),
        }
    }

    #[test]
    fn only_lost_connections_and_moving_servers_are_resumed() {
        let io = redis::RedisError::from(std::io::Error::from(std::io::ErrorKind::BrokenPipe));
        assert!(resumable(&Error::Redis(io)));
        assert!(resumable(&parse("READONLY the server became a replica")));
        assert!(resumable(&parse("UNBLOCKED force unblock from blocking operation")));
        assert!(resumable(&parse("LOADING loading the dataset")));
        assert!(resumable(&parse("NOREPLICAS this master grants no lock: too few replicas")));
        assert!(!resumable(&parse("WRONGTYPE Operation against a key")));
        assert!(!resumable(&parse("ERR request r1 was cancelled")));
        assert!(!resumable(&parse("NOPERM no permissions")));
        assert!(!resumable(&Error::NoModule));
        assert!(!resumable(&Error::TimedOut));
        assert!(already_waiting(&parse("ERR request r1 is already waiting")));
        assert!(!already_waiting(&parse("ERR request r1 was cancelled")));
    }

    #[test]
    fn pauses_double_up_to_the_most_and_restart_after_a_wait_that_lasted() {
        assert_eq!(next_pause(RETRY_FIRST, Duration::ZERO), (RETRY_FIRST, RETRY_FIRST * 2));
        assert_eq!(next_pause(RETRY_MAX, Duration::ZERO), (RETRY_MAX, RETRY_MAX));
        assert_eq!(next_pause(RETRY_MAX, RETRY_MAX * 2), (RETRY_FIRST, RETRY_FIRST * 2));
    }
}
