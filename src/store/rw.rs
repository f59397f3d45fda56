//! A read-write lock on Redis, on Redisson's layout (see `rw_rules`): the hash, and one lease key
//! per read hold. Reads the hash into an [`RwState`] and the read holds' deadlines into
//! [`Holds`], checks the hold keys a plan touches (ACL, cluster slot), and applies an
//! [`RwPlan`], each effect notified and replicated as the plain Redis command Redisson's scripts
//! run.

use redis_module::{Context, RedisString};

use super::access::check_key;
use super::replicating;
use crate::error::LockError;
use crate::names;
use crate::raw::{self, Key, KeyKind, KeyUse};
use crate::rules::Deadline;
use crate::rw_rules::{self, Effect, Holds, Mode, RwPlan, RwState};

/// A read-write lock's hash, open (closed on drop).
pub struct RwKey<'a> {
    ctx: &'a Context,
    name: &'a RedisString,
    key: Key,
}

impl<'a> RwKey<'a> {
    /// Opens the read-write lock `name` for reading, or for reading and writing.
    pub fn open(ctx: &'a Context, name: &'a RedisString, writable: bool) -> Self {
        Self { ctx, name, key: Key::open(ctx, name, writable) }
    }

    /// The hash as the rules see it.
    ///
    /// # Errors
    /// `WRONGTYPE` for a key that is not a hash, or a reentrant lock's hash; a corrupt count.
    pub fn state(&self) -> Result<RwState, LockError> {
        match self.key.kind() {
            KeyKind::Empty => Ok(RwState { pttl: -2, ..RwState::default() }),
            KeyKind::Hash => RwState::from_fields(self.key.hash_fields(), self.key.pttl()),
            KeyKind::String | KeyKind::Other => Err(LockError::WrongType),
        }
    }

    /// The deadlines of every read hold of `state`'s readers at `now` (each hold key read; the
    /// caller's ACL user must be allowed to read them).
    ///
    /// # Errors
    /// `NOPERM` or `CROSSSLOT`-like refusals for the hold keys.
    pub fn holds(&self, state: &RwState, now: i64) -> Result<Holds, LockError> {
        let mut holds = Holds::new();
        for (owner, &count) in &state.readers {
            let owned = holds.entry(owner.clone()).or_default();
            for index in 1..=count {
                let hold = hold_key(self.ctx, self.name, owner, index)?;
                check_key(self.ctx, &hold, KeyUse::Read, LockError::NoPermHold)?;
                let key = Key::open(self.ctx, &hold, false);
                if key.kind() == KeyKind::Empty {
                    continue;
                }
                let pttl = key.pttl();
                owned.insert(index, if pttl < 0 { i64::MAX } else { now.saturating_add(pttl) });
            }
        }
        Ok(holds)
    }

    /// Checks every hold key `plan` writes: in the lock's cluster slot, and writable by the
    /// caller's ACL user. Nothing is written on a refusal.
    ///
    /// # Errors
    /// [`LockError::CrossSlot`], [`LockError::NoPermHold`].
    pub fn check(&self, plan: &RwPlan) -> Result<(), LockError> {
        for (owner, index) in plan.hold_keys() {
            let hold = hold_key(self.ctx, self.name, owner, index)?;
            check_key(self.ctx, &hold, KeyUse::ReadWrite, LockError::NoPermHold)?;
        }
        Ok(())
    }

    /// Carries out `plan`'s effects in order, each notified and replicated (whenever Redis may
    /// propagate anything, see `store::replicating`). Returns the release that freed the lock,
    /// if it did.
    pub fn apply(&self, plan: &RwPlan) -> Option<Mode> {
        if plan.effects.is_empty() {
            return None;
        }
        let (ctx, name) = (self.ctx, self.name);
        let replicate = replicating(ctx);
        raw::signal_modified(ctx, name);
        for effect in &plan.effects {
            self.apply_one(effect, replicate);
        }
        if !replicate {
            raw::count_unpropagated_write(ctx);
        }
        plan.freed
    }

    fn apply_one(&self, effect: &Effect, replicate: bool) {
        let (ctx, name) = (self.ctx, self.name);
        let text = |bytes: &[u8]| RedisString::create_from_slice(ctx.get_raw(), bytes);
        let set_field = |field: RedisString, value: RedisString, event: &std::ffi::CStr| {
            self.key.hash_set(&field, &value);
            raw::notify(ctx, raw::Notify::Hash, event, name);
            if replicate {
                raw::replicate(ctx, c"HSET", &[name, &field, &value]);
            }
        };
        let drop_field = |field: RedisString| {
            self.key.hash_delete(&field);
            raw::notify(ctx, raw::Notify::Hash, c"hdel", name);
            if replicate {
                raw::replicate(ctx, c"HDEL", &[name, &field]);
            }
        };
        let count = |n: u64| raw::int_string(ctx, n as i64);
        match effect {
            Effect::SetMode(mode) => {
                set_field(text(names::MODE_FIELD), text(mode.as_bytes()), c"hset");
            }
            Effect::SetReads { owner, count: n } => set_field(text(owner), count(*n), c"hincrby"),
            Effect::DropReads { owner } => drop_field(text(owner)),
            Effect::SetWrites { owner, count: n } => {
                set_field(text(&names::write_field(owner)), count(*n), c"hincrby");
            }
            Effect::DropWrites { owner } => drop_field(text(&names::write_field(owner))),
            Effect::AddHold { owner, index, deadline } => {
                self.write_hold(owner, *index, Some(*deadline), replicate);
            }
            Effect::DropHold { owner, index } => self.write_hold(owner, *index, None, replicate),
            Effect::RenewHold { owner, index, deadline } => {
                let Ok(hold) = hold_key(ctx, name, owner, *index) else { return };
                let key = Key::open(ctx, &hold, true);
                if key.kind() != KeyKind::Empty {
                    expire_at(ctx, &key, &hold, *deadline, replicate);
                }
            }
            Effect::ExpireAt(deadline) => expire_at(ctx, &self.key, name, *deadline, replicate),
            Effect::Delete => {
                self.key.delete();
                raw::notify(ctx, raw::Notify::Generic, c"del", name);
                if replicate {
                    raw::replicate(ctx, c"DEL", &[name]);
                }
            }
        }
    }

    /// Creates read hold `index` of `owner` with its lease (`SET 1`, `PEXPIREAT`), or deletes it.
    fn write_hold(&self, owner: &[u8], index: u64, deadline: Option<Deadline>, replicate: bool) {
        let ctx = self.ctx;
        // Checked before the plan was applied (`check`): the name is in the lock's slot.
        let Ok(hold) = hold_key(ctx, self.name, owner, index) else { return };
        let key = Key::open(ctx, &hold, true);
        raw::signal_modified(ctx, &hold);
        match deadline {
            Some(deadline) => {
                let one = raw::int_string(ctx, 1);
                key.string_set(&one);
                raw::notify(ctx, raw::Notify::String, c"set", &hold);
                if replicate {
                    raw::replicate(ctx, c"SET", &[&hold, &one]);
                }
                expire_at(ctx, &key, &hold, deadline, replicate);
            }
            None if key.kind() != KeyKind::Empty => {
                key.delete();
                raw::notify(ctx, raw::Notify::Generic, c"del", &hold);
                if replicate {
                    raw::replicate(ctx, c"DEL", &[&hold]);
                }
            }
            None => {}
        }
    }
}

/// Sets an open key's deadline, notified and replicated (`PEXPIREAT`, the absolute deadline).
fn expire_at(ctx: &Context, key: &Key, name: &RedisString, deadline: Deadline, replicate: bool) {
    key.set_expire_at(deadline.unix_ms());
    raw::notify(ctx, raw::Notify::Generic, c"expire", name);
    if replicate {
        raw::replicate(ctx, c"PEXPIREAT", &[name, &raw::int_string(ctx, deadline.unix_ms())]);
    }
}

/// The key of `owner`'s read hold `index` on the lock `name`; in cluster mode it must be in the
/// lock's slot.
///
/// # Errors
/// [`LockError::CrossSlot`].
fn hold_key(
    ctx: &Context,
    name: &RedisString,
    owner: &[u8],
    index: u64,
) -> Result<RedisString, LockError> {
    let hold = names::read_hold(name.as_slice(), owner, index);
    if raw::in_cluster(ctx) && !names::same_slot(name.as_slice(), &hold) {
        return Err(LockError::CrossSlot);
    }
    Ok(RedisString::create_from_slice(ctx.get_raw(), &hold))
}

/// What a reap did.
#[derive(Debug, Default)]
pub struct Reaped {
    /// Readers left (their every hold lease had ended).
    pub removed: bool,
    /// The release that freed the lock, if it did.
    pub freed: Option<Mode>,
    /// When to look again (the earliest live read hold's end).
    pub next: Option<i64>,
}

/// The reap of the read-write lock `name` at `now` (readers whose every hold lease ended leave),
/// applied.
///
/// # Errors
/// As [`RwKey::state`] and [`RwKey::holds`].
pub fn reap(ctx: &Context, name: &RedisString, now: i64) -> Result<Reaped, LockError> {
    let key = RwKey::open(ctx, name, true);
    let state = match key.state() {
        Ok(state) => state,
        // A reentrant lock, or something else, under this name now: nothing to reap.
        Err(LockError::NotAnRwLock | LockError::WrongType) => return Ok(Reaped::default()),
        Err(e) => return Err(e),
    };
    let holds = key.holds(&state, now)?;
    let Some(plan) = rw_rules::reap(&state, &holds, now) else {
        let next = rw_rules::next_reap(&state, &holds, now);
        return Ok(Reaped { next, ..Reaped::default() });
    };
    let freed = key.apply(&plan);
    drop(key);
    let key = RwKey::open(ctx, name, false);
    let state = key.state()?;
    let next = rw_rules::next_reap(&state, &key.holds(&state, now)?, now);
    Ok(Reaped { removed: true, freed, next })
}
