//! The command handlers: parse the arguments, read the key into a [`View`], apply the lock
//! rules, write and replicate the resulting [`Plan`], reply. The only code that touches keys
//! (through `raw`).
//!
//! Replication: the effects are replicated, never the `RLOCK.*` command, so replicas and AOF
//! files need no module: `HSET key owner <count>`, `DEL key`, `PEXPIREAT key <unix-ms>` (an
//! absolute deadline: a restart keeps the remaining lease) and `PUBLISH` for the unlock message.

use std::panic::{catch_unwind, AssertUnwindSafe};

use redis_module::{
    CallOptionsBuilder, CallReply, CallResult, Context, RedisResult, RedisString, RedisValue,
};

use crate::args;
use crate::error::LockError;
use crate::names;
use crate::raw::{self, CommandDoc, Field, KeyKind, LockKey};
use crate::replicas;
use crate::rules::{self, Deadline, Plan, Reply, View, Write};
use crate::waiting;

/// Redisson's unlock message.
const UNLOCK_MESSAGE: &[u8] = b"0";

/// Runs a handler body; a panic becomes an error reply (and a log line) instead of a dead
/// server. Every handler goes through here.
fn guarded(ctx: &Context, body: impl FnOnce() -> Result<RedisValue, LockError>) -> RedisResult {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(result) => result.map_err(Into::into),
        Err(_) => {
            ctx.log_warning("rlock: a command handler panicked; the client got an error reply");
            Err(LockError::Internal.into())
        }
    }
}

/// `RLOCK.ACQUIRE key owner lease-ms [WAIT timeout-ms] [TOKEN]`
pub fn acquire(ctx: &Context, argv: Vec<RedisString>) -> RedisResult {
    guarded(ctx, || {
        let cmd = args::Acquire::parse(&argv)?;
        let deadline = Deadline::after(raw::now_ms(), cmd.lease)?;
        may_grant(ctx)?;
        // Everything that can refuse is checked before anything is written.
        let counter = cmd.token.then(|| TokenCounter::for_caller(ctx, cmd.key)).transpose()?;
        // Waiters first: a free lock they are owed goes to them (on its own key handle).
        waiting::settle(ctx, cmd.key);
        let key = LockKey::open(ctx, cmd.key, true);
        let plan = rules::acquire(view_as(&key, Some(cmd.owner))?, deadline)?;
        if let (Reply::Int(holder_pttl), Some(wait)) = (plan.reply, cmd.wait) {
            // Never block where no grant can happen (MULTI, Lua, a writable replica).
            if raw::may_block(ctx) && raw::is_master(ctx) {
                drop(key);
                let lock = waiting::lock_name(ctx, cmd.key);
                let request = waiting::WaitRequest {
                    owner: cmd.owner.as_slice(),
                    lease: cmd.lease,
                    wait,
                    token: cmd.token,
                };
                waiting::block(ctx, lock, &request, holder_pttl);
                return Ok(RedisValue::NoReply);
            }
        }
        let token = match (&counter, plan.reply) {
            (Some(counter), Reply::Nil) => Some(counter.next(ctx)?),
            _ => None,
        };
        let reply = execute(ctx, &key, cmd.key, Some(cmd.owner), &plan);
        drop(key);
        match (counter, token, plan.reply) {
            (Some(counter), Some(token), _) => {
                counter.store(ctx, token);
                Ok(token_reply(token))
            }
            (Some(_), _, Reply::Int(pttl)) => Ok(busy_reply(pttl)),
            _ => Ok(reply),
        }
    })
}

/// Refuses a grant (or a renewal) on a master that lost the replicas it had (`replicas`).
///
/// # Errors
/// [`LockError::NoReplicas`].
pub fn may_grant(ctx: &Context) -> Result<(), LockError> {
    if raw::is_master(ctx) {
        replicas::may_grant(raw::now_ms())
    } else {
        Ok(())
    }
}

/// A lock's fencing-token counter, named by Redisson's rule (`names::token`, where RFencedLock
/// keeps its own): a plain integer string, never expiring, incremented by every grant that asks
/// for a token, so each token is strictly greater than every one before it, across releases,
/// expiries, restarts and failovers (it is replicated as plain data).
///
/// No key handle is kept: the counter is read, then written, each on a key opened and closed at
/// once, so nothing (a hand-off granting a token in between) can leave a handle stale.
pub struct TokenCounter {
    name: RedisString,
}

impl TokenCounter {
    /// The counter of `lock`, for a grant made by the module itself (a hand-off).
    ///
    /// # Errors
    /// [`LockError::CrossSlot`] in cluster mode for a name whose counter lives in another slot;
    /// [`LockError::TokenEvictable`] under an `allkeys-*` eviction policy.
    pub fn for_grant(ctx: &Context, lock: &RedisString) -> Result<Self, LockError> {
        let name = names::token(lock.as_slice());
        if raw::in_cluster(ctx) && !names::same_slot(lock.as_slice(), &name) {
            return Err(LockError::CrossSlot);
        }
        if evicts_any_key(ctx) {
            return Err(LockError::TokenEvictable);
        }
        Ok(Self { name: RedisString::create_from_slice(ctx.get_raw(), &name) })
    }

    /// The counter of `lock` for the calling client, which must be allowed to write it.
    ///
    /// # Errors
    /// As [`Self::for_grant`], and `NOPERM` when the caller's ACL user may not use the key.
    pub fn for_caller(ctx: &Context, lock: &RedisString) -> Result<Self, LockError> {
        let counter = Self::for_grant(ctx, lock)?;
        check_key(ctx, &counter.name, raw::KeyUse::ReadWrite, LockError::NoPermToken)?;
        Ok(counter)
    }

    /// The last token granted (0: none yet).
    ///
    /// # Errors
    /// `WRONGTYPE` or [`LockError::CorruptToken`] when the counter key holds anything else.
    pub fn current(&self, ctx: &Context) -> Result<u64, LockError> {
        let key = LockKey::open(ctx, &self.name, false);
        match key.kind() {
            KeyKind::Empty => rules::parse_token(None),
            KeyKind::String => rules::parse_token(Some(&key.string_value())),
            KeyKind::Hash | KeyKind::Other => Err(LockError::WrongType),
        }
    }

    /// The token of the next grant ([`rules::next_token`] above the failover floor); nothing
    /// is written.
    ///
    /// # Errors
    /// As [`Self::current`], and [`LockError::TokenExhausted`].
    pub fn next(&self, ctx: &Context) -> Result<u64, LockError> {
        rules::next_token(self.current(ctx)?, replicas::token_floor())
    }

    /// Stores `token` (from [`Self::next`]) and replicates it
    /// (`SET`, an absolute value).
    pub fn store(self, ctx: &Context, token: u64) {
        let value = raw::int_string(ctx, token as i64);
        LockKey::open(ctx, &self.name, true).string_set(&value);
        raw::signal_modified(ctx, &self.name);
        raw::notify(ctx, raw::Notify::String, c"incrby", &self.name);
        if replicating(ctx) {
            raw::replicate(ctx, c"SET", &[&self.name, &value]);
        } else {
            raw::count_unpropagated_write(ctx);
        }
    }
}

/// Whether an `allkeys-*` eviction policy is in force: keys with no TTL (token counters) may be
/// evicted by ordinary traffic. Read whatever `maxmemory` is now: it can be set at any time.
fn evicts_any_key(ctx: &Context) -> bool {
    let reply: CallResult =
        ctx.call_ext("CONFIG", &CallOptionsBuilder::new().build(), &["GET", "maxmemory-policy"]);
    match reply {
        Ok(CallReply::Array(items)) => match items.get(1) {
            Some(Ok(CallReply::String(policy))) => policy.as_bytes().starts_with(b"allkeys-"),
            // Unreadable: assume the worst.
            _ => true,
        },
        _ => true,
    }
}

/// Refuses with `denied` (and an `ACL LOG` entry) when the calling client's ACL user may not use
/// `key` so. Timers and events (no calling client) are the module's own work: not checked.
fn check_key(
    ctx: &Context,
    key: &RedisString,
    how: raw::KeyUse,
    denied: LockError,
) -> Result<(), LockError> {
    if waiting::outside_command() {
        return Ok(());
    }
    match raw::User::current(ctx) {
        Some(user) if !user.may_use_key(key, how) => {
            user.log_denied(ctx, key, false);
            Err(denied)
        }
        _ => Ok(()),
    }
}

/// Refuses with `NOPERM` (and an `ACL LOG` entry) when the plan publishes the unlock message
/// and the calling client's ACL user may not publish on the lock's channel.
fn check_publish(ctx: &Context, name: &RedisString, plan: &Plan) -> Result<(), LockError> {
    if !plan.publish || waiting::outside_command() {
        return Ok(());
    }
    let Some(user) = raw::User::current(ctx) else { return Ok(()) };
    let channel = unlock_channel(ctx, name);
    if user.may_publish(&channel) {
        Ok(())
    } else {
        user.log_denied(ctx, &channel, true);
        Err(LockError::NoPermChannel)
    }
}

/// `[1, token]`: held, with this fencing token.
pub fn token_reply(token: u64) -> RedisValue {
    RedisValue::Array(vec![RedisValue::Integer(1), RedisValue::Integer(token as i64)])
}

/// `[0, pttl]`: not held; the holder's remaining lease.
pub fn busy_reply(pttl: i64) -> RedisValue {
    RedisValue::Array(vec![RedisValue::Integer(0), RedisValue::Integer(pttl)])
}

/// `RLOCK.RELEASE key owner [lease-ms] [REQUEST id]`
pub fn release(ctx: &Context, argv: Vec<RedisString>) -> RedisResult {
    guarded(ctx, || {
        let cmd = args::Release::parse(&argv)?;
        let deadline = cmd.lease.map(|lease| Deadline::after(raw::now_ms(), lease)).transpose()?;
        // A retried request replies what the first one did, and changes nothing.
        let latch = cmd.request.map(|id| Latch::for_caller(ctx, cmd.key, id)).transpose()?;
        if let Some(latch) = &latch {
            if let Some(first) = latch.result(ctx)? {
                return Ok(RedisValue::Integer(first));
            }
        }
        let reply = release_hold(ctx, cmd.key, cmd.owner, deadline)?;
        if let (Some(latch), RedisValue::Integer(result)) = (latch, &reply) {
            latch.remember(ctx, *result);
        }
        Ok(reply)
    })
}

/// How long a release's result is remembered for retries with the same `REQUEST` id.
const RELEASE_LATCH_MS: i64 = 10_000;

/// A release request's latch (Redisson's unlock latch, named by `names::latch`): the result
/// (0 or 1) of the first release with that id, kept for [`RELEASE_LATCH_MS`]. "Not held" is not
/// remembered, as in Redisson. Like the token counter, no key handle is kept.
struct Latch {
    name: RedisString,
}

impl Latch {
    fn for_caller(ctx: &Context, lock: &RedisString, id: &RedisString) -> Result<Self, LockError> {
        let name = names::latch(lock.as_slice(), id.as_slice());
        if raw::in_cluster(ctx) && !names::same_slot(lock.as_slice(), &name) {
            return Err(LockError::CrossSlot);
        }
        let name = RedisString::create_from_slice(ctx.get_raw(), &name);
        check_key(ctx, &name, raw::KeyUse::ReadWrite, LockError::NoPermLatch)?;
        Ok(Self { name })
    }

    /// The first release's result, if this request was seen.
    fn result(&self, ctx: &Context) -> Result<Option<i64>, LockError> {
        let key = LockKey::open(ctx, &self.name, false);
        match key.kind() {
            KeyKind::Empty => Ok(None),
            KeyKind::String => match key.string_value().as_slice() {
                b"0" => Ok(Some(0)),
                b"1" => Ok(Some(1)),
                _ => Err(LockError::CorruptLatch),
            },
            KeyKind::Hash | KeyKind::Other => Err(LockError::WrongType),
        }
    }

    fn remember(self, ctx: &Context, result: i64) {
        let value = raw::int_string(ctx, result);
        let until = raw::now_ms().saturating_add(RELEASE_LATCH_MS);
        {
            let key = LockKey::open(ctx, &self.name, true);
            key.string_set(&value);
            key.set_expire_at(until);
        }
        raw::signal_modified(ctx, &self.name);
        raw::notify(ctx, raw::Notify::String, c"set", &self.name);
        raw::notify(ctx, raw::Notify::Generic, c"expire", &self.name);
        if replicating(ctx) {
            raw::replicate(ctx, c"SET", &[&self.name, &value]);
            raw::replicate(ctx, c"PEXPIREAT", &[&self.name, &raw::int_string(ctx, until)]);
        } else {
            raw::count_unpropagated_write(ctx);
        }
    }
}

/// Releases one hold of `owner` on the lock `name`: the rules of `RLOCK.RELEASE`, with the
/// hand-off to a waiter when the lock is freed. Also used to undo a grant whose client left.
///
/// # Errors
/// `WRONGTYPE`, a corrupt hold count, or `NOPERM` for the unlock channel.
pub fn release_hold(
    ctx: &Context,
    name: &RedisString,
    owner: &RedisString,
    deadline: Option<Deadline>,
) -> Result<RedisValue, LockError> {
    waiting::settle(ctx, name);
    let key = LockKey::open(ctx, name, true);
    let plan = rules::release(view_as(&key, Some(owner))?, deadline);
    check_publish(ctx, name, &plan)?;
    Ok(execute(ctx, &key, name, Some(owner), &plan))
}

/// `RLOCK.RENEW key owner lease-ms`
pub fn renew(ctx: &Context, argv: Vec<RedisString>) -> RedisResult {
    guarded(ctx, || {
        let cmd = args::Renew::parse(&argv)?;
        let deadline = Deadline::after(raw::now_ms(), cmd.lease)?;
        may_grant(ctx)?;
        let key = LockKey::open(ctx, cmd.key, true);
        let plan = rules::renew(view_as(&key, Some(cmd.owner))?, deadline);
        Ok(execute(ctx, &key, cmd.key, Some(cmd.owner), &plan))
    })
}

/// `RLOCK.FORCERELEASE key`
pub fn force_release(ctx: &Context, argv: Vec<RedisString>) -> RedisResult {
    guarded(ctx, || {
        let cmd = args::KeyOnly::parse(&argv)?;
        waiting::settle(ctx, cmd.key);
        let key = LockKey::open(ctx, cmd.key, true);
        let plan = rules::force_release(view_as(&key, None)?);
        check_publish(ctx, cmd.key, &plan)?;
        Ok(execute(ctx, &key, cmd.key, None, &plan))
    })
}

/// `RLOCK.PTTL key`
pub fn pttl(ctx: &Context, argv: Vec<RedisString>) -> RedisResult {
    guarded(ctx, || {
        let cmd = args::KeyOnly::parse(&argv)?;
        let key = LockKey::open(ctx, cmd.key, false);
        Ok(RedisValue::Integer(rules::pttl(view_as(&key, None)?)))
    })
}

/// `RLOCK.INFO key`
pub fn info(ctx: &Context, argv: Vec<RedisString>) -> RedisResult {
    guarded(ctx, || {
        let cmd = args::KeyOnly::parse(&argv)?;
        let key = LockKey::open(ctx, cmd.key, false);
        let pttl = match view_as(&key, None)? {
            View::Free => return Ok(RedisValue::Null),
            View::Held { pttl, .. } => pttl,
        };
        if key.field_count() != 1 {
            return Err(LockError::NotALock);
        }
        drop(key);
        let (owner, count) = only_field(ctx, cmd.key)?;
        let count = rules::parse_count(&count)?;
        let waiters = waiting::waiting(raw::selected_db(ctx), cmd.key.as_slice());
        let token = last_token(ctx, cmd.key)?;
        raw::reply_map(
            ctx,
            &[
                ("owner", Field::Bytes(&owner)),
                ("count", Field::Int(count as i64)),
                ("pttl", Field::Int(pttl)),
                ("waiters", Field::Int(waiters as i64)),
                ("token", Field::Int(token as i64)),
            ],
        );
        Ok(RedisValue::NoReply)
    })
}

/// The last fencing token granted for a lock (0: none), read-only: the caller's ACL user must
/// be allowed to read the counter key.
fn last_token(ctx: &Context, lock: &RedisString) -> Result<u64, LockError> {
    let name = RedisString::create_from_slice(ctx.get_raw(), &names::token(lock.as_slice()));
    check_key(ctx, &name, raw::KeyUse::Read, LockError::NoPermToken)?;
    TokenCounter { name }.current(ctx)
}

/// The one field and value of a one-field hash. The low-level API has no field iteration on
/// Redis 7.0, so this reads `HGETALL` (only `RLOCK.INFO`, off the hot path, uses it).
fn only_field(ctx: &Context, key: &RedisString) -> Result<(Vec<u8>, Vec<u8>), LockError> {
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

/// Reads the key as the rules see it. `owner`: the caller whose hold count matters, if any.
fn view_as(key: &LockKey, owner: Option<&RedisString>) -> Result<View, LockError> {
    match key.kind() {
        KeyKind::Empty => Ok(View::Free),
        KeyKind::Other | KeyKind::String => Err(LockError::WrongType),
        KeyKind::Hash => {
            let mine = match owner.and_then(|o| key.hash_get(o)) {
                Some(count) => Some(rules::parse_count(count.as_bytes())?),
                None => None,
            };
            Ok(View::Held { mine, pttl: key.pttl() })
        }
    }
}

/// Carries out a plan on the open key: write, lease, then, when the lock was freed, the hand-off
/// to its longest-waiting client or (nobody waiting) the unlock message. Returns the reply.
///
/// Each effect is replicated as a plain Redis command (`HSET`, `DEL`, `PEXPIREAT` with the
/// absolute deadline, `PUBLISH`) whenever Redis may propagate anything (AOF, replicas or a
/// backlog, see `raw::propagation_possible`). Otherwise nothing would be propagated anyway, and
/// the write is only counted (one cheap call instead of one `RM_Replicate` per effect).
pub fn execute(
    ctx: &Context,
    key: &LockKey,
    name: &RedisString,
    owner: Option<&RedisString>,
    plan: &Plan,
) -> RedisValue {
    let replicate = (plan.writes() || plan.publish) && replicating(ctx);
    if plan.writes() {
        raw::signal_modified(ctx, name);
    }
    match (plan.write, owner) {
        (Write::Keep, _) => {}
        (Write::SetCount(count), Some(owner)) => {
            let count = raw::int_string(ctx, count as i64);
            key.hash_set(owner, &count);
            raw::notify(ctx, raw::Notify::Hash, c"hincrby", name);
            if replicate {
                raw::replicate(ctx, c"HSET", &[name, owner, &count]);
            }
        }
        (Write::SetCount(_), None) => unreachable!("only owner commands set a hold count"),
        (Write::Delete, owner) => {
            key.delete();
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
        key.set_expire_at(deadline.unix_ms());
        raw::notify(ctx, raw::Notify::Generic, c"expire", name);
        if replicate {
            raw::replicate(ctx, c"PEXPIREAT", &[name, &raw::int_string(ctx, deadline.unix_ms())]);
        }
    }
    if plan.writes() && !replicate {
        raw::count_unpropagated_write(ctx);
    }
    if plan.publish && !waiting::hand_off(ctx, key, name) {
        let channel = unlock_channel(ctx, name);
        let message = RedisString::create_from_slice(ctx.get_raw(), UNLOCK_MESSAGE);
        if raw::in_cluster(ctx) {
            // Sharded pub/sub, as Redisson uses on Redis 7 clusters (the channel's hash tag is
            // the lock name, so the channel lives in the lock's slot). Redis forwards it to
            // the shard's replicas itself: no replicated SPUBLISH, which would deliver twice.
            raw::publish_shard(ctx, &channel, &message);
        } else {
            raw::publish(ctx, &channel, &message);
            if replicate {
                // RedisModule_PublishMessage is not propagated: replicate the PUBLISH, as a Lua
                // script's redis.call('publish') is, so subscribers on replicas hear it too.
                raw::replicate(ctx, c"PUBLISH", &[&channel, &message]);
            }
        }
    }
    match plan.reply {
        Reply::Nil => RedisValue::Null,
        Reply::Int(n) => RedisValue::Integer(n),
    }
}

/// Whether writes are replicated as effects now: always from a timer (no client command to
/// count them against), else whenever Redis may propagate anything (`raw::propagation_possible`).
/// When not, a writer counts its write with `raw::count_unpropagated_write` instead.
fn replicating(ctx: &Context) -> bool {
    waiting::outside_command() || raw::propagation_possible(ctx)
}

/// The lock's unlock channel (`names::channel`), binary-safe.
fn unlock_channel(ctx: &Context, name: &RedisString) -> RedisString {
    RedisString::create_from_slice(ctx.get_raw(), &names::channel(name.as_slice()))
}

/// Arity, docs and key specs of every command, set at load time (`lib.rs`'s `init`).
pub const DOCS: &[CommandDoc] = &[
    CommandDoc {
        name: c"rlock.acquire",
        summary: c"Acquires or re-enters a reentrant lock; replies nil, or the holder's remaining lease in ms",
        complexity: c"O(1)",
        arity: -4,
        key_flags: raw::KEY_RW | raw::KEY_ACCESS | raw::KEY_UPDATE, // as HINCRBY
    },
    CommandDoc {
        name: c"rlock.release",
        summary: c"Releases one hold; 1: freed (and published), 0: still held, nil: not the holder",
        complexity: c"O(1)",
        arity: -3,
        key_flags: raw::KEY_RW | raw::KEY_ACCESS | raw::KEY_DELETE, // as LPOP: may delete
    },
    CommandDoc {
        name: c"rlock.renew",
        summary: c"Resets the lease of a lock the owner holds; 1: renewed, 0: not held",
        complexity: c"O(1)",
        arity: -4,
        key_flags: raw::KEY_RW | raw::KEY_UPDATE,
    },
    CommandDoc {
        name: c"rlock.forcerelease",
        summary: c"Deletes a lock whoever holds it and publishes the unlock message",
        complexity: c"O(1)",
        arity: 2,
        key_flags: raw::KEY_RW | raw::KEY_DELETE,
    },
    CommandDoc {
        name: c"rlock.pttl",
        summary: c"Remaining lease in ms; -2: no lock, -1: no expiry",
        complexity: c"O(1)",
        arity: 2,
        key_flags: raw::KEY_RO | raw::KEY_ACCESS,
    },
    CommandDoc {
        name: c"rlock.info",
        summary: c"The lock's owner, hold count, remaining lease and number of waiters; nil if free",
        complexity: c"O(1)",
        arity: 2,
        key_flags: raw::KEY_RO | raw::KEY_ACCESS,
    },
];

/// Applies [`DOCS`]; a refusal is logged, not fatal (the commands work without it, but a
/// read-only ACL key permission will not be enough for `RLOCK.PTTL` / `RLOCK.INFO`).
pub fn set_docs(ctx: &Context) {
    for doc in DOCS {
        if let Err(e) = raw::set_command_info(ctx, doc) {
            ctx.log_warning(&format!("rlock: {e}"));
        }
    }
}

/// Whether the server provides every API the commands use, and watches for replication.
pub fn check_server(ctx: &Context) -> bool {
    let missing = raw::missing_apis();
    if !missing.is_empty() {
        ctx.log_warning(&format!("rlock: this server lacks {}", missing.join(", ")));
        return false;
    }
    if let Err(e) = raw::watch_replication(ctx).and_then(|()| raw::watch_swapdb(ctx)) {
        ctx.log_warning(&format!("rlock: {e}"));
        return false;
    }
    let server = raw::server_info(ctx);
    if let Some(events) = server.slot_migration_events() {
        if let Err(e) = raw::watch_slot_migrations(ctx, events) {
            ctx.log_warning(&format!("rlock: {e}"));
            return false;
        }
    }
    ctx.log_notice(&format!(
        "rlock: running on {}; optional capabilities in use: {}",
        server.describe(),
        server.capabilities()
    ));
    crate::server::set(server);
    raw::set_module_options(ctx);
    waiting::reset_stats();
    true
}
