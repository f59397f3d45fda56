//! A count-down latch on Redis, on Redisson's `RCountDownLatch` layout: a string holding the
//! remaining count, a missing key meaning open. Reads it for the rules (`latch_rules`) and
//! applies a [`LatchPlan`], notified and replicated as the plain command Redisson's scripts run
//! (`SET`, `DECRBY`, `DEL`), so a replica or an AOF without the module ends the same.

use redis_module::{Context, RedisString};

use super::replicating;
use super::sem::SemKey;
use crate::error::LockError;
use crate::latch_rules::{LatchPlan, LatchWrite};
use crate::raw;
use crate::sem_rules::{SemPlan, SemState, SemWrite};

/// A latch's key, open (closed on drop): a semaphore's layout (an integer string), read and
/// counted down through it.
pub struct LatchKey<'a> {
    ctx: &'a Context,
    name: &'a RedisString,
    key: SemKey<'a>,
}

impl<'a> LatchKey<'a> {
    /// Opens the latch `name` for reading, or for reading and writing.
    pub fn open(ctx: &'a Context, name: &'a RedisString, writable: bool) -> Self {
        Self { ctx, name, key: SemKey::open(ctx, name, writable) }
    }

    /// The remaining count (`None`: the key is missing).
    ///
    /// # Errors
    /// `WRONGTYPE` for a key that is not a string; [`LockError::CorruptLatchCount`] for a
    /// string that is not an integer.
    pub fn count(&self) -> Result<Option<i64>, LockError> {
        match self.key.state() {
            Ok(state) => Ok(state.available),
            Err(LockError::CorruptPermits) => Err(LockError::CorruptLatchCount),
            Err(e) => Err(e),
        }
    }

    /// Carries out `plan`'s write (`current`: what [`Self::count`] read), notified and
    /// replicated.
    pub fn apply(&self, current: Option<i64>, plan: &LatchPlan) {
        let state = SemState { available: current };
        let as_sem = |write| SemPlan { write, raised: false, reply: plan.reply };
        match plan.write {
            LatchWrite::Keep => {}
            LatchWrite::Set(count) => self.key.apply(state, &as_sem(SemWrite::Set(count))),
            LatchWrite::Decrement(amount) => {
                self.key.apply(state, &as_sem(SemWrite::Add(amount.saturating_neg())));
            }
            LatchWrite::Delete => {
                let (ctx, name) = (self.ctx, self.name);
                self.key.delete();
                raw::signal_modified(ctx, name);
                raw::notify(ctx, raw::Notify::Generic, c"del", name);
                if replicating(ctx) {
                    raw::replicate(ctx, c"DEL", &[name]);
                } else {
                    raw::count_unpropagated_write(ctx);
                }
            }
        }
    }
}
