//! The model-based test of the Rust client (`tests/client_model.rs`): what a caller may believe
//! ([`belief`]: its live guards and where their holds are), what the servers hold ([`view`]),
//! the checks of the one against the other ([`check`]), and the run's transcript
//! ([`journal`]), and the Sentinel group that one run fails over ([`group`]).
//!
//! Environment: `RLOCK_CLIENT_MODEL_SECS` (the run's length), `RLOCK_CLIENT_MODEL_SEED` (replay
//! a run: the seed is printed and named in every failure), `RLOCK_CLIENT_MODEL_FAILOVERS` (the
//! failovers of the Sentinel [`group`] run).

pub mod belief;
pub mod check;
pub mod group;
pub mod journal;
pub mod view;

pub use belief::{Belief, Claim, Held, Target};
pub use check::{exclusion, Exempt, Violation, TOLERANCE_MS};
pub use group::{model_failovers, Group};
pub use journal::Journal;

/// `RLOCK_CLIENT_MODEL_SECS`, else `default`.
#[must_use]
pub fn model_secs(default: u64) -> u64 {
    std::env::var("RLOCK_CLIENT_MODEL_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(default)
}

/// `RLOCK_CLIENT_MODEL_SEED` to replay a run, else a new seed.
#[must_use]
pub fn model_seed() -> u64 {
    std::env::var("RLOCK_CLIENT_MODEL_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(
        || {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
                | 1
        },
    )
}
