//! The guard's rules as plain Rust: what a check of the replicas (`INFO replication`'s links)
//! makes of the state ([`Health::checked`]: replicas in sync, a stall, the quarantine after a
//! stall or a restart), and whether that state lets a master grant ([`Health::may_grant`]) and
//! which rule refuses.

use crate::error::{LockError, Refused};

use super::settings::longest_period;

/// One attached replica as `INFO replication` shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Link {
    /// `state=online`: synced and streaming.
    pub online: bool,
    /// Seconds since its last acknowledgement (`lag=`).
    pub lag: i64,
}

/// Parses a `slave<i>` line: `ip=127.0.0.1,port=6380,state=online,offset=123,lag=0`.
#[must_use]
pub fn parse_link(line: &[u8]) -> Option<Link> {
    let mut online = None;
    let mut lag = None;
    for part in line.split(|&b| b == b',') {
        if let Some(state) = part.strip_prefix(b"state=") {
            online = Some(state == b"online");
        } else if let Some(value) = part.strip_prefix(b"lag=") {
            lag = std::str::from_utf8(value).ok().and_then(|v| v.parse().ok());
        }
    }
    Some(Link { online: online?, lag: lag? })
}

/// What the last checks showed of this master's replicas.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Health {
    /// A replica has been online since this server last became master (or loaded the module).
    pub seen: bool,
    /// Replicas online within the lag bound at the last check.
    pub good: u32,
    /// Replicas online (whatever their lag) at the last check: what [`STATE_FILE`](super::STATE_FILE) records.
    pub online: u32,
    /// After a restart, the replicas that were online before it ([`STATE_FILE`](super::STATE_FILE)'s count): a
    /// grant needs at least that many in sync (0: not restarted, or the file was deleted).
    pub before_restart: u32,
    /// The quarantine (pending until the first check, or running) is the restart's, not a
    /// stall's.
    pub restart_quarantine: bool,
    /// When the last check ran (Unix ms); 0: never.
    pub checked_at: i64,
    /// No grant before this time (Unix ms): the quarantine after a stall.
    pub quarantine_until: i64,
    /// How long a check stays valid (ms): a few cron periods.
    pub valid_ms: i64,
    /// When the last check that found a stall (a gap over the threshold) ran (Unix ms); 0:
    /// never.
    pub stalled_at: i64,
}

impl Health {
    /// Before any check.
    pub const NEW: Self = Self {
        seen: false,
        good: 0,
        online: 0,
        before_restart: 0,
        restart_quarantine: false,
        checked_at: 0,
        quarantine_until: 0,
        valid_ms: 500,
        stalled_at: 0,
    };

    /// A master loaded with [`STATE_FILE`](super::STATE_FILE) present, whose count says `before` replicas were
    /// online before it stopped: it has had replicas, needs `before` of them in sync again, and
    /// (`quarantine`: a restart, not a load into a running server) starts in a quarantine at its
    /// first check.
    #[must_use]
    pub const fn restarted(before: u32, quarantine: bool) -> Self {
        Self { seen: true, before_restart: before, restart_quarantine: quarantine, ..Self::NEW }
    }

    /// The state after a check at `now` that found `links`. Checks run on Redis's cron; the
    /// usual gap between them sets how long a check stays valid (a few gaps, at least 500 ms,
    /// at most the stall threshold). `stall_ms`: the stall threshold ([`stall_ms`](super::stall_ms), never
    /// below two cron periods).
    #[must_use]
    pub fn checked(self, now: i64, links: &[Link], max_lag: i64, stall_ms: i64) -> Self {
        let gap = now - self.checked_at;
        let stalled = self.checked_at > 0 && gap > stall_ms;
        // The first check after a restart: the restart is a stall the module did not see (the
        // group saw the server silent, and may be failing it over).
        let restarting = self.checked_at == 0 && self.restart_quarantine;
        let valid_ms = if self.checked_at > 0 && !stalled {
            (3 * gap).clamp(stall_ms.min(500), stall_ms)
        } else {
            self.valid_ms
        };
        let quarantine_until = if stalled || restarting {
            quarantine_end(now, max_lag)
        } else {
            self.quarantine_until
        };
        let good = links.iter().filter(|l| l.online && l.lag <= max_lag).count();
        let online = links.iter().filter(|l| l.online).count();
        Self {
            seen: self.seen || online > 0,
            good: u32::try_from(good).unwrap_or(u32::MAX),
            online: u32::try_from(online).unwrap_or(u32::MAX),
            before_restart: self.before_restart,
            restart_quarantine: if stalled { false } else { self.restart_quarantine },
            checked_at: now,
            quarantine_until,
            valid_ms,
            stalled_at: if stalled { now } else { self.stalled_at },
        }
    }

    /// How many replicas in sync the setting alone (`min_replicas`) requires.
    fn configured(&self, min_replicas: i64) -> u32 {
        if min_replicas < 0 {
            u32::from(self.seen)
        } else {
            u32::try_from(min_replicas).unwrap_or(u32::MAX)
        }
    }

    /// How many replicas in sync a grant needs under `min_replicas` (the setting): what the
    /// setting requires and, after a restart, never fewer than were online before it; 0 (off)
    /// when the setting is 0.
    #[must_use]
    pub fn required(&self, min_replicas: i64) -> u32 {
        if min_replicas == 0 {
            return 0;
        }
        self.configured(min_replicas).max(self.before_restart)
    }

    /// The count [`STATE_FILE`](super::STATE_FILE) should hold: the replicas online now, and never fewer than
    /// were online before a restart (until they are all back, a promoted one may be missing).
    #[must_use]
    pub fn to_record(&self) -> u32 {
        self.online.max(self.before_restart).max(1)
    }

    /// Whether a grant may happen at `now`.
    ///
    /// # Errors
    /// [`LockError::NoReplicas`] when replicas are required and the last check is stale, the
    /// server is in quarantine after a stall or a restart, or too few replicas were in sync
    /// ([`Refused`], in that order; too few for the count before a restart, the setting's
    /// rule met, is [`Refused::ReplicasBeforeRestart`]).
    pub fn may_grant(&self, now: i64, min_replicas: i64) -> Result<(), LockError> {
        let required = self.required(min_replicas);
        if required == 0 {
            return Ok(());
        }
        // Never shorter than two cron periods: after `hz` went down, the next check comes
        // one new period after the last.
        let valid_ms = self.valid_ms.max(2 * longest_period());
        let fresh = self.checked_at > 0 && now - self.checked_at <= valid_ms;
        if !fresh {
            Err(LockError::NoReplicas(Refused::NoRecentCheck))
        } else if now < self.quarantine_until {
            Err(LockError::NoReplicas(if self.restart_quarantine {
                Refused::RestartQuarantine
            } else {
                Refused::StallQuarantine
            }))
        } else if self.good < required {
            Err(LockError::NoReplicas(if self.good >= self.configured(min_replicas) {
                Refused::ReplicasBeforeRestart
            } else {
                Refused::TooFewReplicas
            }))
        } else {
            Ok(())
        }
    }
}

/// The end of a quarantine that starts at `now` (a stall, a restart): longer than the lag
/// bound, so a replica counts again only on an acknowledgement it sent after it began.
#[must_use]
pub fn quarantine_end(now: i64, max_lag: i64) -> i64 {
    now.saturating_add(max_lag.saturating_add(1).saturating_mul(1000)).saturating_add(500)
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;

    use super::*;
    use crate::replicas::settings::{set_hz, stall_ms, SPAN_PERIOD, STALL, STALL_MS};

    const UP: Link = Link { online: true, lag: 0 };

    #[test]
    fn parses_info_lines() {
        assert_eq!(
            parse_link(b"ip=127.0.0.1,port=6380,state=online,offset=123,lag=1"),
            Some(Link { online: true, lag: 1 })
        );
        assert_eq!(
            parse_link(b"ip=::1,port=1,state=wait_bgsave,offset=0,lag=0"),
            Some(Link { online: false, lag: 0 })
        );
        assert_eq!(parse_link(b"ip=::1,port=1"), None);
    }

    #[test]
    fn a_check_after_a_gap_over_the_threshold_records_when_it_found_the_stall() {
        let h = Health::NEW.checked(1_000, &[], 2, STALL_MS).checked(1_100, &[], 2, STALL_MS);
        assert_eq!(h.stalled_at, 0, "a cron period is no stall");
        let h = h.checked(1_100 + STALL_MS + 1, &[], 2, STALL_MS);
        assert_eq!(h.stalled_at, 1_100 + STALL_MS + 1);
        let h = h.checked(1_200 + STALL_MS + 1, &[], 2, STALL_MS);
        assert_eq!(h.stalled_at, 1_100 + STALL_MS + 1, "kept until the next stall");
    }

    #[test]
    fn a_master_without_replicas_grants_and_one_that_had_them_needs_them() {
        let h = Health::NEW.checked(1_000, &[], 2, STALL_MS);
        assert_eq!(h.may_grant(1_050, -1), Ok(()));
        let h = h.checked(1_100, &[UP], 2, STALL_MS);
        assert_eq!(h.may_grant(1_150, -1), Ok(()));
        let lagging = Link { online: true, lag: 3 };
        let h = h.checked(1_200, &[lagging], 2, STALL_MS);
        assert_eq!(h.may_grant(1_250, -1), Err(LockError::NoReplicas(Refused::TooFewReplicas)));
        let h = h.checked(1_300, &[], 2, STALL_MS);
        assert_eq!(h.may_grant(1_350, -1), Err(LockError::NoReplicas(Refused::TooFewReplicas)));
        assert_eq!(h.may_grant(1_350, 0), Ok(()), "0 turns the check off");
        assert_eq!(
            Health::NEW.may_grant(5, 1),
            Err(LockError::NoReplicas(Refused::NoRecentCheck)),
            "explicit minimum"
        );
    }

    #[test]
    fn a_stale_check_or_a_stall_refuses_until_fresh_acknowledgements() {
        let h = Health::NEW.checked(1_000, &[UP], 2, STALL_MS).checked(1_100, &[UP], 2, STALL_MS);
        assert_eq!(h.may_grant(1_500, -1), Ok(()));
        assert_eq!(
            h.may_grant(1_700, -1),
            Err(LockError::NoReplicas(Refused::NoRecentCheck)),
            "check too old"
        );
        // Stopped for 5 s: the first check after it still sees the replica (buffered acks).
        let h = h.checked(6_000, &[UP], 2, STALL_MS);
        assert_eq!(h.may_grant(6_050, -1), Err(LockError::NoReplicas(Refused::StallQuarantine)));
        let mut h = h;
        for now in (6_100..=9_400).step_by(100) {
            h = h.checked(now, &[UP], 2, STALL_MS);
            assert_eq!(
                h.may_grant(now + 50, -1),
                Err(LockError::NoReplicas(Refused::StallQuarantine)),
                "in quarantine"
            );
        }
        let h = h.checked(9_500, &[UP], 2, STALL_MS);
        assert_eq!(h.may_grant(9_550, -1), Ok(()));
    }

    #[test]
    fn the_stall_threshold_is_the_setting() {
        let h = Health::NEW.checked(1_000, &[UP], 2, 1_000).checked(1_100, &[UP], 2, 1_000);
        let h = h.checked(2_300, &[UP], 2, 1_000);
        assert!(h.quarantine_until > 2_300, "a 1.2 s stall over a 1 s threshold");
        assert_eq!(h.may_grant(2_350, -1), Err(LockError::NoReplicas(Refused::StallQuarantine)));
        let h = Health::NEW.checked(1_000, &[UP], 2, 1_500).checked(2_200, &[UP], 2, 1_500);
        assert_eq!(h.quarantine_until, 0, "not over the default");
    }

    #[test]
    fn a_slow_cron_widens_the_validity() {
        let h = Health::NEW.checked(1_000, &[UP], 2, STALL_MS).checked(2_000, &[UP], 2, STALL_MS);
        assert_eq!(h.quarantine_until, 0, "a 1 s cron period is no stall");
        assert_eq!(h.may_grant(3_400, -1), Ok(()));
        let h = h.checked(3_010, &[UP], 2, STALL_MS);
        assert_eq!(h.quarantine_until, 0);
    }

    /// The cron's own gap at the configured `hz` is never a stall, whatever `rlock.stall-ms`
    /// accepts: with its minimum (100) at the default `hz` (10), a healthy master's checks every
    /// ~100 ms (a little more when the server is busy) grant throughout.
    #[test]
    fn the_smallest_stall_setting_never_refuses_a_master_whose_cron_runs_on_time() {
        for hz in [1, 10, 100, 500] {
            set_hz(Some(hz));
            STALL.store(100, Ordering::Relaxed);
            let period = 1000 / hz;
            let threshold = stall_ms();
            assert!(threshold >= 2 * period, "hz {hz}: {threshold}");
            let mut h = Health::NEW.checked(1_000, &[UP], 2, threshold);
            let mut now = 1_000;
            for i in 0..200 {
                // On time, or late by up to half a period.
                now += period + (i % 3) * period / 4;
                h = h.checked(now, &[UP], 2, threshold);
                assert_eq!(h.quarantine_until, 0, "hz {hz}: gap {} is no stall", period);
                assert_eq!(h.may_grant(now + period - 1, -1), Ok(()), "hz {hz} at {i}");
            }
            // A real stall still counts.
            let h = h.checked(now + threshold + 1, &[UP], 2, threshold);
            assert!(h.quarantine_until > 0, "hz {hz}");
        }
        // A gap that spans a change of hz ran partly at the old period: no stall, and a check
        // made at the short period stays valid until the first check at the long one.
        set_hz(Some(1));
        SPAN_PERIOD.store(1000, Ordering::Relaxed);
        let h = Health::NEW.checked(1_000, &[UP], 2, stall_ms());
        set_hz(Some(500));
        let h = h.checked(2_000, &[UP], 2, stall_ms());
        assert_eq!(h.quarantine_until, 0, "hz 1 -> 500: the 1 s gap is the old period's");
        SPAN_PERIOD.store(2, Ordering::Relaxed);
        let h = h.checked(2_002, &[UP], 2, stall_ms());
        set_hz(Some(1));
        assert_eq!(h.may_grant(2_002 + 999, -1), Ok(()), "hz 500 -> 1: the next check is 1 s away");
        set_hz(Some(10));
        SPAN_PERIOD.store(100, Ordering::Relaxed);
        STALL.store(STALL_MS, Ordering::Relaxed);
    }

    /// Checks every 100 ms from `from` to `to` (inclusive) finding `links`; whether a grant
    /// was allowed after each.
    fn run(mut h: Health, from: i64, to: i64, links: &[Link], min: i64) -> (Health, Vec<bool>) {
        let mut allowed = Vec::new();
        for now in (from..=to).step_by(100) {
            h = h.checked(now, links, 2, STALL_MS);
            allowed.push(h.may_grant(now + 50, min).is_ok());
        }
        (h, allowed)
    }

    #[test]
    fn a_restarted_master_is_quarantined_from_its_first_check_as_after_a_stall() {
        // Loaded at 1_000, first check at 5_000 (a long AOF load): the quarantine runs from
        // the check, for rlock.replica-max-lag (2) + 1.5 s, replica in sync or not.
        let h = Health::restarted(1, true);
        assert_eq!(h.may_grant(1_000, -1), Err(LockError::NoReplicas(Refused::NoRecentCheck)));
        let h = h.checked(5_000, &[UP], 2, STALL_MS);
        assert_eq!(h.quarantine_until, quarantine_end(5_000, 2));
        assert_eq!(h.quarantine_until, 8_500);
        let (h, allowed) = run(h, 5_100, 8_300, &[UP], -1);
        assert!(allowed.iter().all(|a| !a), "in quarantine: {allowed:?}");
        assert_eq!(h.may_grant(8_400, -1), Err(LockError::NoReplicas(Refused::RestartQuarantine)));
        let h = h.checked(8_500, &[UP], 2, STALL_MS);
        assert_eq!(h.may_grant(8_550, -1), Ok(()));
        // Only the first check starts it: later ones on time never do again.
        let (_, allowed) = run(h, 8_600, 20_000, &[UP], -1);
        assert!(allowed.iter().all(|a| *a));
        // A MODULE LOAD into a running server: no quarantine, the count still holds.
        let h = Health::restarted(2, false).checked(5_000, &[UP, UP], 2, STALL_MS);
        assert_eq!(h.quarantine_until, 0);
        assert_eq!(h.may_grant(5_050, -1), Ok(()));
    }

    #[test]
    fn a_restarted_master_needs_as_many_replicas_in_sync_as_were_online_before() {
        let lagging = Link { online: true, lag: 5 };
        let down = Link { online: false, lag: 0 };
        for before in 1..=4_u32 {
            for min in [-1_i64, 1, 2, 3] {
                // Every mix of links, long after the quarantine.
                for mask in 0..81_u32 {
                    let links: Vec<Link> = (0..4)
                        .map(|i| [UP, lagging, down][(mask / 3_u32.pow(i) % 3) as usize])
                        .collect();
                    let h = Health::restarted(before, true).checked(1_000, &links, 2, STALL_MS);
                    let (h, _) = run(h, 1_100, 6_000, &links, min);
                    let good = links.iter().filter(|l| **l == UP).count() as u32;
                    let setting = if min < 0 { 1 } else { min as u32 };
                    let verdict = h.may_grant(6_050, min);
                    let case = format!("before {before}, min {min}, links {links:?}");
                    assert_eq!(h.required(min), setting.max(before), "{case}");
                    assert_eq!(verdict.is_ok(), good >= setting.max(before), "{case}");
                    if verdict.is_err() {
                        let rule = if good >= setting {
                            Refused::ReplicasBeforeRestart
                        } else {
                            Refused::TooFewReplicas
                        };
                        assert_eq!(verdict, Err(LockError::NoReplicas(rule)), "{case}");
                    }
                    // rlock.min-replicas 0 turns it all off, the quarantine included.
                    assert_eq!(h.may_grant(6_050, 0), Ok(()), "{case}");
                    assert_eq!(Health::restarted(before, true).may_grant(0, 0), Ok(()));
                    // The file never records fewer than the count before the restart.
                    assert_eq!(h.to_record(), before.max(good + lagging_online(&links)));
                }
            }
        }
    }

    fn lagging_online(links: &[Link]) -> u32 {
        links.iter().filter(|l| l.online && l.lag > 2).count() as u32
    }

    #[test]
    fn a_stall_after_a_restart_is_named_as_a_stall() {
        let h = Health::restarted(1, true).checked(1_000, &[UP], 2, STALL_MS);
        let (h, _) = run(h, 1_100, 5_000, &[UP], -1);
        let h = h.checked(7_000, &[UP], 2, STALL_MS);
        assert_eq!(h.may_grant(7_050, -1), Err(LockError::NoReplicas(Refused::StallQuarantine)));
    }
}
