//! The dead-reader check of a read-write lock ([`reap`]): readers whose every hold lease ended
//! leave, as Redisson's scripts would have them leave at their next touch; spaced by its cost
//! per lock, whatever the number of readers.

use std::cell::RefCell;
use std::collections::HashMap;

use redis_module::{Context, RedisString};

use super::RwKey;
use crate::error::LockError;
use crate::raw;
use crate::rw_rules::{self, Mode};

/// What a reap did.
#[derive(Debug, Default)]
pub struct Reaped {
    /// Readers left (their every hold lease had ended).
    pub removed: bool,
    /// The release that freed the lock, if it did.
    pub freed: Option<Mode>,
    /// When to look again (the earliest live read hold's end, not before the lock's next
    /// allowed check).
    pub next: Option<i64>,
}

/// When `owner`'s last live read hold on the read-write lock `name` ends (Unix ms), read from
/// its hold keys; `None`: it has none.
///
/// # Errors
/// As [`RwKey::state_of`] and [`RwKey::holds`].
pub fn read_holds_end(
    ctx: &Context,
    name: &RedisString,
    owner: &[u8],
    now: i64,
) -> Result<Option<i64>, LockError> {
    let key = RwKey::open(ctx, name, false);
    let state = key.state_of(Some(owner))?;
    let holds = key.holds(&state, now)?;
    Ok(holds.get(owner).and_then(|h| h.values().copied().filter(|&at| at > now).max()))
}

/// How many of `owner`'s read holds with an index below `below` on the read-write lock `name`
/// are live (their hold key is there): [`RwKey::holds`] over those indexes.
///
/// # Errors
/// As [`RwKey::state_of`] and [`RwKey::holds`] (each hold key's slot and ACL).
pub fn live_read_holds_below(
    ctx: &Context,
    name: &RedisString,
    owner: &[u8],
    below: u64,
) -> Result<u64, LockError> {
    let key = RwKey::open(ctx, name, false);
    let mut state = key.state_of(Some(owner))?;
    state.readers.insert(owner.to_vec(), below.saturating_sub(1));
    let holds = key.holds(&state, raw::now_ms())?;
    Ok(holds.get(owner).map_or(0, |h| h.len() as u64))
}

/// Spacing between two dead-reader checks of one lock, in µs per field and hold key the first
/// one read (each costs a few µs): a lock's checks take a few % of a core at most, whatever its
/// number of readers (20,000 readers with a hold each: one check every 4 s at most).
const REAP_SPACING_US_PER_READ: u64 = 100;

/// Above this many locks remembered, those whose next check is already allowed are forgotten.
const REMEMBERED_LOCKS: usize = 4_096;

thread_local! {
    /// Per lock (database, name): the earliest time (Unix ms) of its next dead-reader check.
    static NEXT_REAP: RefCell<HashMap<(i32, Vec<u8>), i64>> = RefCell::new(HashMap::new());
}

/// Remembers that the lock's next check may come `reads` × [`REAP_SPACING_US_PER_READ`] µs
/// after `now`; returns that time.
fn remember(lock: &(i32, Vec<u8>), now: i64, reads: u64) -> i64 {
    let spacing = reads.saturating_mul(REAP_SPACING_US_PER_READ) / 1000;
    let allowed = now.saturating_add(i64::try_from(spacing).unwrap_or(i64::MAX));
    NEXT_REAP.with(|m| {
        let mut m = m.borrow_mut();
        if m.len() >= REMEMBERED_LOCKS {
            m.retain(|_, at| *at > now);
        }
        m.insert(lock.clone(), allowed);
    });
    allowed
}

/// The earliest time (Unix ms) the next dead-reader check of the lock `key` of database `db`
/// may run ([`reap`] spaces them by their cost); `None`: at any time.
#[must_use]
pub fn reap_allowed_at(db: i32, key: &[u8]) -> Option<i64> {
    NEXT_REAP.with(|m| m.borrow().get(&(db, key.to_vec())).copied())
}

/// The reap of the read-write lock `name` at `now` (readers whose every hold lease ended leave),
/// applied. It reads every field and hold key (O(read holds)), so one lock is reaped at most
/// once per [`REAP_SPACING_US_PER_READ`] µs per read of its previous reap: a call before then
/// does nothing and returns that time as `next`.
///
/// # Errors
/// As [`RwKey::state`] and [`RwKey::holds`].
pub fn reap(ctx: &Context, name: &RedisString, now: i64) -> Result<Reaped, LockError> {
    let lock = (raw::selected_db(ctx), name.as_slice().to_vec());
    let not_before = NEXT_REAP.with(|m| m.borrow().get(&lock).copied());
    if let Some(at) = not_before.filter(|&at| at > now) {
        return Ok(Reaped { next: Some(at), ..Reaped::default() });
    }
    let key = RwKey::open(ctx, name, true);
    // Spaced by what it reads even when that fails (a corrupt count is read again only then).
    let fields = key.key.field_count() as u64;
    remember(&lock, now, fields);
    let state = match key.state() {
        Ok(state) => state,
        // A reentrant lock, or something else, under this name now: nothing to reap.
        Err(LockError::NotAnRwLock | LockError::WrongType) => return Ok(Reaped::default()),
        Err(e) => return Err(e),
    };
    let holds = key.holds(&state, now)?;
    // Counts are at most MAX_READ_HOLDS each: no overflow.
    let allowed = remember(&lock, now, fields + state.readers.values().sum::<u64>());
    // Dead readers have no live hold: the earliest live one is the same before and after.
    let next = rw_rules::next_reap(&state, &holds, now).map(|at| at.max(allowed));
    let Some(plan) = rw_rules::reap(&state, &holds, now) else {
        return Ok(Reaped { next, ..Reaped::default() });
    };
    let freed = key.apply(&plan);
    Ok(Reaped { removed: true, freed, next: next.filter(|_| freed.is_none()) })
}
