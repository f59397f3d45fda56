//! The store: a lock on Redis. Opens a lock's key, reads it as a [`View`], applies a [`Plan`]
//! (write, lease, keyspace notifications, replication), and owns the names a lock derives from
//! its own (unlock channel, token counter, release latch: [`derived`]) and the ACL checks on
//! them ([`access`]).
//!
//! The store never decides who gets a lock: applying a plan that frees the lock returns `true`,
//! and the caller (a command, or `waiting` itself) hands the lock to a waiter or publishes the
//! unlock message ([`publish_unlock`]).
//!
//! Replication: the effects are replicated, never the `RLOCK.*` command, so replicas and AOF
//! files need no module. A write that leaves one holder with a lease is one
//! `RESTORE key <unix-ms> <payload> REPLACE ABSTTL` (the whole hash and its absolute deadline:
//! a restart keeps the remaining lease; one command, so Redis adds no `MULTI`/`EXEC`); else
//! `HSET key owner <count>`, `DEL key`, `PEXPIREAT key <unix-ms>`; and `PUBLISH` (to replicas
//! only) for the unlock message.

pub mod access;
pub mod derived;
pub mod latch;
pub mod request;
pub mod rw;
pub mod sem;
pub mod settings;
pub mod waiters;
pub mod whole;

use std::cell::Cell;

use redis_module::{CallOptionsBuilder, CallReply, CallResult, Context, RedisString, RedisValue};

use crate::dump;
use crate::error::LockError;
use crate::latch_rules::LatchMessage;
use crate::names;
use crate::raw::{self, Key, KeyKind};
use crate::replicas;
use crate::rules::{self, Plan, Reply, View, Write};
use crate::rw_rules::Mode;

/// Redisson's unlock message.
const UNLOCK_MESSAGE: &[u8] = b"0";

thread_local! {
    /// Set while the module does its own work (a timer): no client command is being executed.
    static MODULE_WORK: Cell<bool> = const { Cell::new(false) };
}

/// Whether the module is doing its own work (a timer) rather than a client's command: nothing
/// is checked against a caller's ACL, and effects are always replicated.
pub fn outside_command() -> bool {
    MODULE_WORK.get()
}

/// Runs the module's own work (a timer's), marked as outside any command, a panic logged
/// instead of unwinding into Redis.
pub fn module_work(ctx: &Context, work: impl FnOnce()) {
    MODULE_WORK.set(true);
    raw::guard_callback(ctx, work);
    MODULE_WORK.set(false);
}

/// Whether writes are replicated as effects now: always from a timer (no client command to
/// count them against), else whenever Redis may propagate anything (`raw::propagation_possible`).
/// When not, a writer counts its write with `raw::count_unpropagated_write` instead.
pub fn replicating(ctx: &Context) -> bool {
    outside_command() || raw::propagation_possible(ctx)
}

/// Refuses a grant (or a renewal) on a master that lost the replicas it had (`replicas`).
///
/// # Errors
/// [`LockError::NoReplicas`].
pub fn may_grant(ctx: &Context) -> Result<(), LockError> {
    may_grant_at(ctx, raw::now_ms())
}

/// [`may_grant`] at `now` (Unix ms), the command's clock read once.
///
/// # Errors
/// [`LockError::NoReplicas`].
pub fn may_grant_at(ctx: &Context, now: i64) -> Result<(), LockError> {
    if raw::is_master(ctx) {
        replicas::may_grant(now)
    } else {
        Ok(())
    }
}

/// Refuses to take an id this master has no record of as new (a release's `REQUEST`/`ONCE`
/// id) right after a stall, when it may be a late resend whose first
/// send's record ended during the stall ([`replicas::resumed_from_stall`]); the client
/// retries.
///
/// # Errors
/// [`LockError::UnknownIdAfterStall`].
pub fn may_take_unknown_id(ctx: &Context) -> Result<(), LockError> {
    if raw::is_master(ctx) && replicas::resumed_from_stall(raw::now_ms()) {
        Err(LockError::UnknownIdAfterStall)
    } else {
        Ok(())
    }
}

/// Refuses a give-back of counted permits where [`may_grant`] refuses a grant: counted permits
/// have no lease, so a give-back written on a master that was replaced (and whose data is
/// thrown away when it is demoted) would lose them for good; the caller retries on the current
/// master.
///
/// # Errors
/// [`LockError::NoReplicasGiveBack`].
pub fn may_give_back(ctx: &Context) -> Result<(), LockError> {
    may_grant(ctx).map_err(|e| match e {
        LockError::NoReplicas(rule) => LockError::NoReplicasGiveBack(rule),
        e => e,
    })
}

/// Refuses a change of a semaphore's count (`RSEM.ADDPERMITS`, `RSEM.SETPERMITS`) where
/// [`may_grant`] refuses a grant: permits added on a master that was replaced would be lost
/// with its data, and permits taken away there would come back; the caller retries on the
/// current master.
///
/// # Errors
/// [`LockError::NoReplicasCount`].
pub fn may_change_count(ctx: &Context) -> Result<(), LockError> {
    may_grant(ctx).map_err(|e| match e {
        LockError::NoReplicas(rule) => LockError::NoReplicasCount(rule),
        e => e,
    })
}

/// A lock's key, open (closed on drop). Keep it no longer than one step: a hand-off writes the
/// same key through its own handle, so callers open, apply and drop before handing off.
pub struct LockKey<'a> {
    ctx: &'a Context,
    name: &'a RedisString,
    key: Key,
}

impl<'a> LockKey<'a> {
    /// Opens the lock `name` for reading, or for reading and writing.
    pub fn open(ctx: &'a Context, name: &'a RedisString, writable: bool) -> Self {
        Self { ctx, name, key: Key::open(ctx, name, writable) }
    }

    /// The lock's name.
    pub const fn name(&self) -> &'a RedisString {
        self.name
    }

    /// The open key itself (to read it again without opening it again).
    pub const fn raw(&self) -> &Key {
        &self.key
    }

    /// The key as the rules see it. `owner`: the caller whose hold count matters, if any.
    ///
    /// # Errors
    /// `WRONGTYPE` for a key that is not a hash; a corrupt hold count.
    pub fn view(&self, owner: Option<&RedisString>) -> Result<View, LockError> {
        match self.key.kind() {
            KeyKind::Empty => Ok(View::Free),
            KeyKind::Other | KeyKind::String => Err(LockError::WrongType),
            KeyKind::Hash => {
                if owner.is_some() && self.key.field_count() != 1 && self.is_rw_lock() {
                    return Err(LockError::NotAReentrantLock);
                }
                let mine = match owner.and_then(|o| self.key.hash_get(o)) {
                    Some(count) => Some(rules::parse_count(count.as_bytes())?),
                    None => None,
                };
                Ok(View::Held { mine, pttl: self.key.pttl() })
            }
        }
    }

    /// Whether the key may hold a reentrant lock: missing, or a hash that is not a read-write
    /// lock's.
    ///
    /// # Errors
    /// `WRONGTYPE` for another type or a read-write lock's hash.
    pub fn check_kind(&self) -> Result<(), LockError> {
        match self.key.kind() {
            KeyKind::Empty => Ok(()),
            KeyKind::Other | KeyKind::String => Err(LockError::WrongType),
            KeyKind::Hash if self.key.field_count() != 1 && self.is_rw_lock() => {
                Err(LockError::NotAReentrantLock)
            }
            KeyKind::Hash => Ok(()),
        }
    }

    /// Whether the hash is a read-write lock's (it has a `mode` field). A reentrant lock's hash
    /// has one field, so only a hash with another number of fields is asked.
    pub fn is_rw_lock(&self) -> bool {
        let mode = RedisString::create_from_slice(self.ctx.get_raw(), names::MODE_FIELD);
        self.key.hash_get(&mode).is_some()
    }

    /// The number of fields of the lock hash (holders).
    pub fn holders(&self) -> usize {
        self.key.field_count()
    }

    /// Carries out `plan` for `owner`: write, lease, notifications, replication. Returns whether
    /// the lock was freed (the caller hands it off or publishes the unlock message).
    ///
    /// Each effect is replicated as a plain Redis command (`HSET`, `DEL`, `PEXPIREAT` with the
    /// absolute deadline) whenever Redis may propagate anything ([`replicating`]). Otherwise
    /// nothing would be propagated anyway, and the write is only counted (one cheap call instead
    /// of one `RM_Replicate` per effect).
    pub fn apply(&self, owner: Option<&RedisString>, plan: &Plan) -> bool {
        if !plan.writes() {
            return false;
        }
        let (ctx, name) = (self.ctx, self.name);
        let replicate = replicating(ctx);
        // Set when the write went out whole (its lease included).
        let mut replicated_whole = false;
        // A hash this write creates is a listpack when its one field fits the limit below.
        let fresh = self.key.kind() == KeyKind::Empty;
        raw::signal_modified(ctx, name);
        match (plan.write, owner) {
            (Write::Keep, _) => {}
            (Write::SetCount(n), Some(owner)) => {
                let count = raw::count_string(ctx, n as i64);
                self.key.hash_set(owner, &count);
                raw::notify(ctx, raw::Notify::Hash, c"hincrby", name);
                if replicate {
                    match plan.expire_at {
                        // The whole lock in one command (no MULTI/EXEC): its only holder, in
                        // a hash the server keeps as a listpack (a RESTOREd listpack is not
                        // converted for a long owner, as HSET's is: the server's own limit,
                        // `hash-max-listpack-value`, decides). A hash that was there already
                        // may be a hash table whatever its field now (it became one under a
                        // lower limit, raised since): it goes whole only when its scan takes
                        // one step, as a listpack's does (`whole::listpack_payload`).
                        Some(deadline)
                            if owner.len().max(count.as_slice().len())
                                <= settings::listpack_value_max()
                                && self.key.field_count() == 1
                                && (fresh || self.key.fields_in_one_step(&mut |_, _| {})) =>
                        {
                            self.replicate_whole(owner, n, deadline.unix_ms());
                            replicated_whole = true;
                        }
                        _ => raw::replicate(ctx, c"HSET", &[name, owner, &count]),
                    }
                }
            }
            (Write::SetCount(_), None) => unreachable!("only owner commands set a hold count"),
            (Write::Delete, owner) => {
                self.key.delete();
                if owner.is_some() {
                    // Redisson's release decrements to 0 (HINCRBY), then deletes.
                    raw::notify(ctx, raw::Notify::Hash, c"hincrby", name);
                }
                raw::notify(ctx, raw::Notify::Generic, c"del", name);
                if replicate {
                    raw::replicate(ctx, c"DEL", &[name]);
                }
            }
        }
        if let Some(deadline) = plan.expire_at {
            self.key.set_expire_at(deadline.unix_ms());
            raw::notify(ctx, raw::Notify::Generic, c"expire", name);
            if replicate && !replicated_whole {
                let at = raw::int_string(ctx, deadline.unix_ms());
                raw::replicate(ctx, c"PEXPIREAT", &[name, &at]);
            }
        }
        if !replicate {
            raw::count_unpropagated_write(ctx);
        }
        plan.publish
    }

    /// Replicates the lock as it now stands, `owner` its only holder with `count` until Unix ms
    /// `at`, as one `RESTORE key at payload REPLACE ABSTTL` ([`crate::dump`]): a replica or an
    /// AOF without the module rebuilds the same hash with the same absolute deadline.
    fn replicate_whole(&self, owner: &RedisString, count: u64, at: i64) {
        whole::restore(self.ctx, self.name, &dump::lock_payload(owner.as_slice(), count), at);
    }
}

/// The key `name`'s deadline as an absolute Unix time in ms, as stored (exact where the
/// relative `PTTL` would depend on when it is read); `None` for a missing key or one with no
/// expiry.
pub fn expire_time(ctx: &Context, name: &RedisString) -> Option<i64> {
    Some(Key::open(ctx, name, false).expire_at()).filter(|&at| at >= 0)
}

/// Which channel a lock announces its release on, and with what message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unlocked {
    /// A reentrant lock: `0` on `redisson_lock__channel:{name}`.
    Lock,
    /// A read-write lock released by a hold of this mode: `0` (read) or `1` (write) on
    /// `redisson_rwlock:{name}`.
    Rw(Mode),
    /// A semaphore with this many permits available now, on `redisson_sc:{name}`.
    Permits(i64),
    /// A count-down latch opened (`0`) or closed again (`1`: a new count, a delete), on
    /// `redisson_countdownlatch__channel__{name}`.
    Latch(LatchMessage),
}

impl Unlocked {
    fn channel(self, name: &[u8]) -> Vec<u8> {
        match self {
            Self::Lock => names::channel(name),
            Self::Rw(_) => names::rw_channel(name),
            Self::Permits(_) => names::sem_channel(name),
            Self::Latch(_) => names::latch_channel(name),
        }
    }

    fn message(self) -> Vec<u8> {
        match self {
            Self::Lock => UNLOCK_MESSAGE.to_vec(),
            Self::Rw(mode) => mode.message().to_vec(),
            Self::Permits(count) => count.to_string().into_bytes(),
            Self::Latch(LatchMessage::Opened) => b"0".to_vec(),
            Self::Latch(LatchMessage::Closed) => b"1".to_vec(),
        }
    }
}

/// Publishes Redisson's unlock message for a freed lock on its channel.
pub fn publish_unlock(ctx: &Context, name: &RedisString, unlocked: Unlocked) {
    let channel = unlock_channel(ctx, name, unlocked);
    let message = RedisString::create_from_slice(ctx.get_raw(), &unlocked.message());
    if raw::in_cluster(ctx) {
        // Sharded pub/sub, as Redisson uses on Redis 7 clusters (the channel's hash tag is the
        // lock name, so the channel lives in the lock's slot). Redis forwards it to the shard's
        // replicas itself: no replicated SPUBLISH, which would deliver twice.
        raw::publish_shard(ctx, &channel, &message);
    } else {
        raw::publish(ctx, &channel, &message);
        if raw::replicas_possible(ctx) {
            // RedisModule_PublishMessage is not propagated: replicate the PUBLISH, as Redis
            // does a client's (and a Lua script's redis.call('publish')), so subscribers on
            // replicas hear it too; to replicas only, as Redis does: never into the AOF (and
            // not at all where no replica can be, which would cost a command lookup for naught).
            raw::replicate_to_replicas(ctx, c"PUBLISH", &[&channel, &message]);
        }
    }
}

/// The lock's unlock channel (`names::channel` or `names::rw_channel`), binary-safe.
pub fn unlock_channel(ctx: &Context, name: &RedisString, unlocked: Unlocked) -> RedisString {
    RedisString::create_from_slice(ctx.get_raw(), &unlocked.channel(name.as_slice()))
}

/// Leased permit ids as a reply: an array of binary strings.
#[must_use]
pub fn ids_value(ids: &[Vec<u8>]) -> RedisValue {
    RedisValue::Array(ids.iter().map(|id| RedisValue::StringBuffer(id.clone())).collect())
}

/// The one conversion of a rules [`Reply`] to a Redis reply.
#[must_use]
pub fn to_value(reply: Reply) -> RedisValue {
    let pair =
        |a: i64, b: i64| RedisValue::Array(vec![RedisValue::Integer(a), RedisValue::Integer(b)]);
    match reply {
        Reply::Nil => RedisValue::Null,
        Reply::Int(n) => RedisValue::Integer(n),
        Reply::Token(token) => pair(1, token as i64),
        Reply::Busy(pttl) => pair(0, pttl),
    }
}

/// The one field and value of a one-field hash. The low-level API has no field iteration on
/// Redis 7.0, so this reads `HGETALL` (only `RLOCK.INFO`, off the hot path, uses it).
///
/// # Errors
/// [`LockError::NotALock`] unless the hash has exactly one field.
pub fn only_field(ctx: &Context, key: &RedisString) -> Result<(Vec<u8>, Vec<u8>), LockError> {
    let reply: CallResult = ctx.call_ext("HGETALL", &CallOptionsBuilder::new().build(), &[key]);
    let Ok(CallReply::Array(items)) = reply else {
        return Err(LockError::Internal);
    };
    let bytes = |i: usize| match items.get(i) {
        Some(Ok(CallReply::String(s))) => Some(s.as_bytes().to_vec()),
        _ => None,
    };
    match (items.len(), bytes(0), bytes(1)) {
        (2, Some(field), Some(value)) => Ok((field, value)),
        _ => Err(LockError::NotALock),
    }
}
