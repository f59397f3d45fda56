//! The guard's live state on this server: the last checks' [`Health`], folded in by
//! [`record_check`] (Redis's cron), asked by every grant ([`may_grant`], [`grants_allowed`])
//! and by releases of ids with no record ([`resumed_from_stall`]); a role change
//! ([`not_master`]); its summary for `INFO rlock`.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crate::error::{LockError, Refused};

use super::health::{Health, Link};
use super::settings::{longest_period, stall_ms, CRON_PERIOD, MAX_LAG, MIN_REPLICAS, SPAN_PERIOD};

thread_local! {
    /// What the last checks showed (see [`Health`]).
    pub(super) static HEALTH: Cell<Health> = const { Cell::new(Health::NEW) };
}

/// A replica has been online since the module loaded, this server became master, or the file
/// was deleted (else, `seen` came from the file alone).
pub(super) static SEEN_LIVE: AtomicBool = AtomicBool::new(false);

/// The file counts for this server: it has not changed role since the module loaded (a promoted
/// replica starts afresh, whatever its directory holds).
pub(super) static FILE_COUNTS: AtomicBool = AtomicBool::new(true);

/// The rule a refusal names: [`Refused::HadReplicasFile`] when the replica is required only
/// because [`STATE_FILE`](super::STATE_FILE) was found (no replica has been online since, `seen_live` false, under
/// the auto rule), unless the restart's own rules refused.
fn named(rule: Refused, health: &Health, min: i64, seen_live: bool) -> Refused {
    let restart_rule = matches!(rule, Refused::RestartQuarantine | Refused::ReplicasBeforeRestart);
    if min < 0 && health.seen && !seen_live && !restart_rule {
        Refused::HadReplicasFile
    } else {
        rule
    }
}

/// Whether this master may grant now (always, for a server that needs no replicas).
///
/// # Errors
/// [`LockError::NoReplicas`], see [`Health::may_grant`]; its rule is
/// [`Refused::HadReplicasFile`] when the replica is required only because [`STATE_FILE`](super::STATE_FILE) was
/// found (no replica has been online since).
pub fn may_grant(now: i64) -> Result<(), LockError> {
    let min = MIN_REPLICAS.load(Ordering::Relaxed);
    let health = HEALTH.get();
    match health.may_grant(now, min) {
        Err(LockError::NoReplicas(rule)) => {
            REFUSED.fetch_add(1, Ordering::Relaxed);
            let seen_live = SEEN_LIVE.load(Ordering::Relaxed);
            Err(LockError::NoReplicas(named(rule, &health, min, seen_live)))
        }
        verdict => verdict,
    }
}

/// Whether this master may grant now, without counting a refusal: the waiters' hand-off asks
/// on every look at a lock with waiters (the poll), which would swamp the count of refused
/// commands.
#[must_use]
pub fn grants_allowed(now: i64) -> bool {
    HEALTH.get().may_grant(now, MIN_REPLICAS.load(Ordering::Relaxed)).is_ok()
}

/// How long after the check that found a stall an id the server has no record of is not
/// taken as new ([`resumed_from_stall`]), at least: the commands buffered through the stall
/// run right after that check.
pub const AFTER_STALL_MS: i64 = 500;

/// Whether the server stalled (stopped, or busy: no check for longer than [`stall_ms`]) just
/// now: its last check (Redis's cron, on a master) is that old at `now`, or found such a gap
/// less than [`AFTER_STALL_MS`] (and two cron periods) ago. A command run now may have waited
/// in the server's buffers through the stall, sent before the record of an id it carries
/// ended meanwhile. (After a SIGSTOP, or a long command, Redis runs its cron before it reads
/// the commands that arrived meanwhile: the first check sees the gap, then they run.)
#[must_use]
pub fn resumed_from_stall(now: i64) -> bool {
    let health = HEALTH.get();
    let unchecked = health.checked_at > 0 && now - health.checked_at > stall_ms();
    let after = AFTER_STALL_MS.max(2 * longest_period());
    unchecked || (health.stalled_at > 0 && now - health.stalled_at <= after)
}

/// Commands refused by [`may_grant`] since load.
static REFUSED: AtomicU64 = AtomicU64::new(0);

/// Folds a check into the state; returns whether grants became allowed by it (waiters that
/// were held back can be served now).
pub fn record_check(now: i64, links: &[Link]) -> bool {
    if links.iter().any(|l| l.online) {
        SEEN_LIVE.store(true, Ordering::Relaxed);
    }
    let min = MIN_REPLICAS.load(Ordering::Relaxed);
    let before = HEALTH.get();
    let after = before.checked(now, links, MAX_LAG.load(Ordering::Relaxed), stall_ms());
    HEALTH.set(after);
    // The next gap runs at the period in force now.
    SPAN_PERIOD.store(CRON_PERIOD.load(Ordering::Relaxed), Ordering::Relaxed);
    before.may_grant(now, min).is_err() && after.may_grant(now, min).is_ok()
}

/// This server is not a master: it grants nothing, and forgets its replicas. When it is
/// promoted it starts afresh: a new master grants like a standalone server until a replica
/// has come online.
pub fn not_master() {
    HEALTH.set(Health::NEW);
    SEEN_LIVE.store(false, Ordering::Relaxed);
    FILE_COUNTS.store(false, Ordering::Relaxed);
}

/// The guard's state for `INFO rlock`.
#[derive(Debug, Clone, Copy)]
pub struct Summary {
    /// Replicas in sync a grant needs now.
    pub required: u32,
    /// Replicas in sync at the last check.
    pub in_sync: u32,
    /// The replicas online before a restart that a grant needs back (0: none).
    pub before_restart: u32,
    /// The rule that refuses grants now (`None`: grants allowed).
    pub refusing: Option<Refused>,
    /// Grants refused since load.
    pub refused: u64,
}

/// For `INFO rlock`.
#[must_use]
pub fn summary(now: i64) -> Summary {
    let health = HEALTH.get();
    let min = MIN_REPLICAS.load(Ordering::Relaxed);
    let refusing = match health.may_grant(now, min) {
        Err(LockError::NoReplicas(rule)) => {
            Some(named(rule, &health, min, SEEN_LIVE.load(Ordering::Relaxed)))
        }
        _ => None,
    };
    Summary {
        required: health.required(min),
        in_sync: health.good,
        before_restart: health.before_restart,
        refusing,
        refused: REFUSED.load(Ordering::Relaxed),
    }
}

/// At load: a reloaded module may find its old statics.
pub(super) fn reset() {
    HEALTH.set(Health::NEW);
    SEEN_LIVE.store(false, Ordering::Relaxed);
    FILE_COUNTS.store(true, Ordering::Relaxed);
    REFUSED.store(0, Ordering::Relaxed);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_restarts_own_rules_are_not_renamed_for_the_file() {
        let h = Health::restarted(2, true);
        for rule in [Refused::TooFewReplicas, Refused::NoRecentCheck, Refused::StallQuarantine] {
            assert_eq!(named(rule, &h, -1, false), Refused::HadReplicasFile);
            assert_eq!(named(rule, &h, -1, true), rule, "a replica has been online since");
            assert_eq!(named(rule, &h, 1, false), rule, "an explicit setting");
        }
        for rule in [Refused::RestartQuarantine, Refused::ReplicasBeforeRestart] {
            assert_eq!(named(rule, &h, -1, false), rule);
        }
    }
}
