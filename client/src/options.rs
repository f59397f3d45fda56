//! Client settings, and the durations they turn into.

use std::time::Duration;

/// Client settings.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Options {
    /// The lease used when none is given, renewed every third of it (Redisson's
    /// `lockWatchdogTimeout`). Default 30 s. Zero, or beyond [`crate::MAX_DURATION`], is
    /// refused when the client is made.
    pub watchdog_timeout: Duration,
    /// Replicas that must acknowledge a grant before it is reported acquired, and how long to
    /// wait for them. Default: none.
    pub replica_ack: Option<(u32, Duration)>,
    /// Ask for a fencing token with every grant ([`LockGuard::token`]). Default: off (each lock
    /// name then keeps a counter key, `redisson_lock_token:{name}`, for good).
    pub fencing: bool,
    /// AOF fsyncs that must cover a grant before it is reported acquired (`WAITAOF`, Redis
    /// 7.2+ and Valkey 8+). Default: none.
    pub aof_ack: Option<AofAck>,
}

/// What [`Options::aof_ack`] requires of a grant: `WAITAOF numlocal numreplicas timeout`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct AofAck {
    /// The master's own AOF must have fsynced it (needs `appendonly yes` on the master).
    pub local: bool,
    /// How many replicas must have fsynced it to their AOF.
    pub replicas: u32,
    /// How long to wait for the fsyncs.
    pub timeout: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            watchdog_timeout: Duration::from_secs(30),
            replica_ack: None,
            fencing: false,
            aof_ack: None,
        }
    }
}

impl Options {
    /// Sets [`Options::watchdog_timeout`].
    #[must_use]
    pub const fn watchdog_timeout(mut self, timeout: Duration) -> Self {
        self.watchdog_timeout = timeout;
        self
    }

    /// Asks for a fencing token with every grant (see [`LockGuard::token`]).
    #[must_use]
    pub const fn fencing(mut self, on: bool) -> Self {
        self.fencing = on;
        self
    }

    /// Requires `replicas` replicas to acknowledge each grant within `timeout` (Redis
    /// `WAIT replicas timeout` after acquiring); when fewer do, the lock is released and the
    /// acquire fails with [`Error::NotReplicated`].
    #[must_use]
    pub const fn replica_ack(mut self, replicas: u32, timeout: Duration) -> Self {
        self.replica_ack = Some((replicas, timeout));
        self
    }

    /// Requires each grant to be fsynced to the master's AOF (`local`) and to the AOF of
    /// `replicas` replicas within `timeout` (Redis `WAITAOF`, after acquiring and after
    /// [`Options::replica_ack`] if set); when it is not, the lock is released and the acquire
    /// fails with [`Error::NotPersisted`]. On a server without `WAITAOF` (Redis before 7.2)
    /// every acquire fails with that server's error, and nothing stays held.
    #[must_use]
    pub const fn aof_ack(mut self, local: bool, replicas: u32, timeout: Duration) -> Self {
        self.aof_ack = Some(AofAck { local, replicas, timeout });
        self
    }

    /// Refuses settings that mean nothing or overflow: a zero watchdog timeout
    /// ([`crate::Error::ZeroLease`]: every lease it gives would end as it starts), one below
    /// [`crate::MIN_WATCHDOG_TIMEOUT`], a watchdog, replica or AOF timeout beyond
    /// [`crate::MAX_DURATION`] ([`crate::Error::InvalidArgument`]).
    pub(crate) fn check(&self) -> crate::error::Result<()> {
        if self.watchdog_timeout.is_zero() {
            return Err(crate::error::Error::ZeroLease);
        }
        if self.watchdog_timeout < crate::MIN_WATCHDOG_TIMEOUT {
            return Err(crate::error::Error::InvalidArgument(format!(
                "the watchdog timeout of {:?} is shorter than the shortest the client takes \
                 ({:?}): it is renewed every third of it; take a lease for a shorter hold",
                self.watchdog_timeout,
                crate::MIN_WATCHDOG_TIMEOUT
            )));
        }
        let timeouts = [
            ("the watchdog timeout", Some(self.watchdog_timeout)),
            ("the replica acknowledgement's timeout", self.replica_ack.map(|(_, t)| t)),
            ("the AOF acknowledgement's timeout", self.aof_ack.map(|a| a.timeout)),
        ];
        for (what, value) in timeouts {
            if let Some(value) = value.filter(|v| *v > crate::MAX_DURATION) {
                return Err(crate::error::too_long(what, value));
            }
        }
        Ok(())
    }

    /// How long a command on the shared connection may take: room for `WAIT` and `WAITAOF`.
    pub(crate) fn response_timeout(&self) -> Option<Duration> {
        let wait = self.replica_ack.map(|(_, t)| t);
        let fsync = self.aof_ack.map(|a| a.timeout);
        match (wait, fsync) {
            (None, None) => None,
            (w, f) => Some(
                w.unwrap_or_default()
                    .saturating_add(f.unwrap_or_default())
                    .saturating_add(Duration::from_secs(1)),
            ),
        }
    }
}

/// What the server says of a lock's lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Remaining {
    /// No lock.
    NotLocked,
    /// Locked, with no expiry.
    NoExpiry,
    /// Locked, expiring after this long.
    Lease(Duration),
}
