//! A read-write lock on Redis, on Redisson's layout (see `rw_rules`): the hash, and one lease key
//! per read hold. Reads the hash into an [`RwState`] and the read holds' deadlines into
//! [`Holds`], checks the hold keys a plan touches (ACL, cluster slot), and applies an
//! [`RwPlan`], each effect notified and replicated as the plain Redis command Redisson's scripts
//! run.

use std::collections::BTreeMap;

use redis_module::{Context, RedisString};

use super::access::KeyChecker;
use super::replicating;
use super::whole::HashWrites;
use crate::error::LockError;
use crate::names;
use crate::raw::{self, Key, KeyKind, KeyUse};
use crate::rules::Deadline;
use crate::rw_rules::{self, Effect, Holds, Mode, RwPlan, RwState};

mod reap;

pub use reap::{live_read_holds_below, read_holds_end, reap, reap_allowed_at, Reaped};

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

    /// The whole hash as the rules see it: O(fields), for a release (which recomputes the lease
    /// from every reader), the check for dead readers and `RWLOCK.INFO`.
    ///
    /// # Errors
    /// `WRONGTYPE` for a key that is not a hash, or a reentrant lock's hash; a corrupt count.
    pub fn state(&self) -> Result<RwState, LockError> {
        match self.key.kind() {
            KeyKind::Empty => Ok(RwState { pttl: -2, ..RwState::default() }),
            KeyKind::Hash => RwState::from_fields(self.key.hash_fields(), self.key.pttl())
                .map(|state| RwState { expires: Some(self.key.expire_at()), ..state }),
            KeyKind::String | KeyKind::Other => Err(LockError::WrongType),
        }
    }

    /// The hash as one owner's acquire or renewal (or, with no owner, a force-release) sees it:
    /// a few field reads, whatever the number of readers ([`RwState::of_owner`]).
    ///
    /// # Errors
    /// As [`Self::state`], for this owner's fields only.
    pub fn state_of(&self, owner: Option<&[u8]>) -> Result<RwState, LockError> {
        match self.key.kind() {
            KeyKind::Empty => Ok(RwState { pttl: -2, ..RwState::default() }),
            KeyKind::String | KeyKind::Other => Err(LockError::WrongType),
            KeyKind::Hash => {
                let get = |field: &[u8]| {
                    self.key.hash_get(&RedisString::create_from_slice(self.ctx.get_raw(), field))
                };
                let mode = get(names::MODE_FIELD);
                let owner = owner.unwrap_or_default();
                let (reads, writes) = if owner.is_empty() {
                    (None, None)
                } else {
                    (get(owner), get(&names::write_field(owner)))
                };
                RwState::of_owner(
                    mode.as_ref().map(raw::OwnedString::as_bytes),
                    owner,
                    reads.as_ref().map(raw::OwnedString::as_bytes),
                    writes.as_ref().map(raw::OwnedString::as_bytes),
                    self.key.field_count() > 0,
                    self.key.pttl(),
                )
                .map(|state| RwState { expires: Some(self.key.expire_at()), ..state })
            }
        }
    }

    /// The hash as the end of `owners`' read sides sees it ([`RwState::of_readers`]: `mode`
    /// and these owners' read counts, one field read each, whatever the number of other
    /// readers), and how many fields the hash has.
    ///
    /// # Errors
    /// As [`Self::state_of`].
    pub fn state_of_readers(&self, owners: &[Vec<u8>]) -> Result<(RwState, usize), LockError> {
        match self.key.kind() {
            KeyKind::Empty => Ok((RwState { pttl: -2, ..RwState::default() }, 0)),
            KeyKind::String | KeyKind::Other => Err(LockError::WrongType),
            KeyKind::Hash => {
                let get = |field: &[u8]| {
                    self.key.hash_get(&RedisString::create_from_slice(self.ctx.get_raw(), field))
                };
                let mode = get(names::MODE_FIELD);
                let reads: Vec<Option<raw::OwnedString>> = owners.iter().map(|o| get(o)).collect();
                let fields = self.key.field_count();
                let state = RwState::of_readers(
                    mode.as_ref().map(raw::OwnedString::as_bytes),
                    owners
                        .iter()
                        .zip(&reads)
                        .map(|(o, r)| (o.as_slice(), r.as_ref().map(raw::OwnedString::as_bytes))),
                    fields > 0,
                    self.key.pttl(),
                )?;
                Ok((state, fields))
            }
        }
    }

    /// The deadlines of every read hold of `state`'s readers at `now` (each hold key read; the
    /// caller's ACL user must be allowed to read them).
    ///
    /// # Errors
    /// [`LockError::TooManyLockReadHolds`] (checked before any key is read: at most
    /// [`rw_rules::MAX_LOCK_READ_HOLDS`] are read); `NOPERM` or `CROSSSLOT`-like refusals for the
    /// hold keys.
    pub fn holds(&self, state: &RwState, now: i64) -> Result<Holds, LockError> {
        rw_rules::walkable(state)?;
        let mut holds = Holds::new();
        let checker = KeyChecker::new(self.ctx);
        for (owner, &count) in &state.readers {
            let owned = holds.entry(owner.clone()).or_default();
            for index in 1..=count {
                let hold = hold_key(self.ctx, self.name, owner, index)?;
                checker.check(self.ctx, &hold, KeyUse::Read, LockError::NoPermHold)?;
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

    /// `state` (read with [`Self::state_of`] for `owner`) with `owner`'s read side as it stands
    /// at `now`: when none of its read holds is live any more (every hold key's lease ended, the
    /// field not yet removed by a dead-reader check), the owner holds no read side. Reads the
    /// owner's hold keys only (at most `rw_rules::MAX_READ_HOLDS`).
    ///
    /// # Errors
    /// As [`Self::holds`].
    pub fn with_live_reads(
        &self,
        mut state: RwState,
        owner: &[u8],
        now: i64,
    ) -> Result<RwState, LockError> {
        if state.reads_of(owner) == 0 {
            return Ok(state);
        }
        let holds = self.holds(&state, now)?;
        if holds.get(owner).is_none_or(|h| h.values().all(|&at| at <= now)) {
            state.readers.remove(owner);
        }
        Ok(state)
    }

    /// The live read holds of `owner` (index -> deadline) a `GT` re-entry or renewal keeps its
    /// leases against (`None`: no `GT`, nothing read). Reads the owner's hold keys only (at most
    /// `rw_rules::MAX_READ_HOLDS`; `state` read with [`Self::state_of`] for `owner`).
    ///
    /// # Errors
    /// As [`Self::holds`].
    pub fn own_holds(
        &self,
        state: &RwState,
        owner: &[u8],
        gt: bool,
        now: i64,
    ) -> Result<Option<BTreeMap<u64, i64>>, LockError> {
        if !gt {
            return Ok(None);
        }
        if state.reads_of(owner) == 0 {
            return Ok(Some(BTreeMap::new()));
        }
        rw_rules::walkable(state)?;
        let checker = KeyChecker::new(self.ctx);
        let mut own = BTreeMap::new();
        for index in 1..=state.reads_of(owner) {
            let hold = hold_key(self.ctx, self.name, owner, index)?;
            checker.check(self.ctx, &hold, KeyUse::Read, LockError::NoPermHold)?;
            // The expiry exactly as stored (`now + pttl` may be a millisecond early).
            let key = Key::open(self.ctx, &hold, false);
            match key.expire_at() {
                -1 if key.kind() != KeyKind::Empty => {
                    own.insert(index, i64::MAX);
                }
                at if at > now => {
                    own.insert(index, at);
                }
                _ => {}
            }
        }
        Ok(Some(own))
    }

    /// Checks every hold key `plan` writes: in the lock's cluster slot, and writable by the
    /// caller's ACL user. Nothing is written on a refusal.
    ///
    /// # Errors
    /// [`LockError::CrossSlot`], [`LockError::NoPermHold`].
    pub fn check(&self, plan: &RwPlan) -> Result<(), LockError> {
        let checker = KeyChecker::new(self.ctx);
        for (owner, index) in plan.hold_keys() {
            let hold = hold_key(self.ctx, self.name, owner, index)?;
            checker.check(self.ctx, &hold, KeyUse::ReadWrite, LockError::NoPermHold)?;
        }
        Ok(())
    }

    /// Checks the hold key `index` of `owner` (one a grant would write) as [`Self::check`]
    /// does: before a read waiter blocks, so it never waits for a grant it may not have.
    ///
    /// # Errors
    /// [`LockError::CrossSlot`], [`LockError::NoPermHold`].
    pub fn check_hold(&self, owner: &[u8], index: u64) -> Result<(), LockError> {
        let hold = hold_key(self.ctx, self.name, owner, index)?;
        KeyChecker::new(self.ctx).check(self.ctx, &hold, KeyUse::ReadWrite, LockError::NoPermHold)
    }

    /// Carries out `plan`'s effects in order, each notified as the Redis command it stands for,
    /// and replicated (whenever Redis may propagate anything, see `store::replicating`) as one
    /// command per key written: the hash as its one command, or whole ([`HashWrites`]); each
    /// read hold key as `SET k 1 PXAT <unix-ms>`, `PEXPIREAT` or `DEL`. Returns the release
    /// that freed the lock, if it did.
    pub fn apply(&self, plan: &RwPlan) -> Option<Mode> {
        if plan.effects.is_empty() {
            return None;
        }
        let (ctx, name) = (self.ctx, self.name);
        let replicate = replicating(ctx);
        raw::signal_modified(ctx, name);
        let mut hash = HashWrites::new(self.key.kind() == KeyKind::Empty);
        for effect in &plan.effects {
            self.apply_one(effect, replicate, &mut hash);
        }
        if replicate {
            hash.replicate(ctx, &self.key, name);
        } else {
            raw::count_unpropagated_write(ctx);
        }
        plan.freed
    }

    /// One effect, written and notified; the hash's command noted in `hash`, a hold key's
    /// replicated (when `replicate`).
    fn apply_one(&self, effect: &Effect, replicate: bool, hash: &mut HashWrites) {
        let (ctx, name) = (self.ctx, self.name);
        let text = |bytes: &[u8]| RedisString::create_from_slice(ctx.get_raw(), bytes);
        let mut set_field = |field: RedisString, value: RedisString, event: &std::ffi::CStr| {
            self.key.hash_set(&field, &value);
            raw::notify(ctx, raw::Notify::Hash, event, name);
            hash.push(c"HSET", vec![field, value]);
        };
        let count = |n: u64| raw::int_string(ctx, n as i64);
        match effect {
            Effect::SetMode(mode) => {
                set_field(text(names::MODE_FIELD), text(mode.as_bytes()), c"hset");
            }
            Effect::SetReads { owner, count: n } => set_field(text(owner), count(*n), c"hincrby"),
            Effect::SetWrites { owner, count: n } => {
                set_field(text(&names::write_field(owner)), count(*n), c"hincrby");
            }
            Effect::DropReads { owner } => self.drop_field(text(owner), hash),
            Effect::DropWrites { owner } => {
                self.drop_field(text(&names::write_field(owner)), hash);
            }
            Effect::AddHold { owner, index, deadline } => {
                self.write_hold(owner, *index, Some(*deadline), replicate);
            }
            Effect::DropHold { owner, index } => self.write_hold(owner, *index, None, replicate),
            Effect::RenewHold { owner, index, deadline } => {
                let Ok(hold) = hold_key(ctx, name, owner, *index) else { return };
                let key = Key::open(ctx, &hold, true);
                if key.kind() != KeyKind::Empty {
                    expire_at(ctx, &key, &hold, *deadline);
                    if replicate {
                        let at = raw::int_string(ctx, deadline.unix_ms());
                        raw::replicate(ctx, c"PEXPIREAT", &[&hold, &at]);
                    }
                }
            }
            Effect::ExpireAt(deadline) => {
                expire_at(ctx, &self.key, name, *deadline);
                hash.push(c"PEXPIREAT", vec![raw::int_string(ctx, deadline.unix_ms())]);
            }
            Effect::Delete => {
                self.key.delete();
                raw::notify(ctx, raw::Notify::Generic, c"del", name);
                hash.push(c"DEL", Vec::new());
            }
        }
    }

    fn drop_field(&self, field: RedisString, hash: &mut HashWrites) {
        self.key.hash_delete(&field);
        raw::notify(self.ctx, raw::Notify::Hash, c"hdel", self.name);
        hash.push(c"HDEL", vec![field]);
    }

    /// Creates read hold `index` of `owner` with its lease (notified as `SET` and `PEXPIREAT`,
    /// replicated as one `SET k 1 PXAT <unix-ms>`), or deletes it.
    fn write_hold(&self, owner: &[u8], index: u64, deadline: Option<Deadline>, replicate: bool) {
        thread_local! {
            // Kept for the module's life (no context: not freed with a command's).
            static PXAT: RedisString = RedisString::create(None, "PXAT");
        }
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
                expire_at(ctx, &key, &hold, deadline);
                if replicate {
                    let at = raw::int_string(ctx, deadline.unix_ms());
                    PXAT.with(|pxat| raw::replicate(ctx, c"SET", &[&hold, &one, pxat, &at]));
                }
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

/// Sets an open key's deadline (the absolute one, as given), notified as `PEXPIREAT` is.
fn expire_at(ctx: &Context, key: &Key, name: &RedisString, deadline: Deadline) {
    key.set_expire_at(deadline.unix_ms());
    raw::notify(ctx, raw::Notify::Generic, c"expire", name);
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
