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

use crate::args::{self, Arg};
use crate::error::LockError;
use crate::raw::{self, CommandDoc, Field, KeyKind, LockKey};
use crate::rules::{self, Deadline, Plan, Reply, View, Write};
use crate::waiting;

/// Redisson's unlock channel is `redisson_lock__channel:{<lock name>}`.
const CHANNEL_PREFIX: &[u8] = b"redisson_lock__channel:{";
const CHANNEL_SUFFIX: &[u8] = b"}";
/// Where Redisson's RFencedLock keeps a lock's token counter: `redisson_lock_token:{<name>}`.
const TOKEN_PREFIX: &[u8] = b"redisson_lock_token:{";
/// Where Redisson keeps a release request's result: `redisson_unlock_latch:{<name>}:<id>`.
const LATCH_PREFIX: &[u8] = b"redisson_unlock_latch:{";
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
        // The token counter is checked before anything is written.
        let fencing = cmd.token.then(|| Fencing::open(ctx, cmd.key)).transpose()?;
        let key = LockKey::open(ctx, cmd.key, true);
        waiting::settle(ctx, &key, cmd.key);
        let plan = rules::acquire(view_as(&key, Some(cmd.owner))?, deadline)?;
        match (plan.reply, cmd.wait) {
            (Reply::Int(holder_pttl), Some(wait)) if raw::may_block(ctx) => {
                drop((key, fencing));
                let lock = waiting::lock_name(ctx, cmd.key);
                let request = waiting::WaitRequest {
                    owner: cmd.owner.as_slice(),
                    lease: cmd.lease,
                    wait,
                    token: cmd.token,
                };
                waiting::block(ctx, lock, &request, holder_pttl);
                Ok(RedisValue::NoReply)
            }
            _ => {
                let reply = execute(ctx, &key, cmd.key, Some(cmd.owner), &plan);
                match (fencing, plan.reply) {
                    (None, _) => Ok(reply),
                    (Some(fencing), Reply::Nil) => Ok(token_reply(Some(fencing.next(ctx)?))),
                    (Some(_), Reply::Int(pttl)) => Ok(busy_reply(pttl)),
                }
            }
        }
    })
}

/// A lock's fencing-token counter, `redisson_lock_token:{<lock>}` (where Redisson's RFencedLock
/// keeps its own): a plain integer string, never expiring, incremented by every grant that asks
/// for a token, so each token is strictly greater than every one before it, across releases,
/// expiries, restarts and failovers (it is replicated as plain data).
pub struct Fencing {
    name: RedisString,
    key: LockKey,
    current: u64,
}

impl Fencing {
    /// Opens and reads the counter of the lock `lock`.
    ///
    /// # Errors
    /// `WRONGTYPE` or [`LockError::CorruptToken`] when the counter key holds anything else.
    pub fn open(ctx: &Context, lock: &RedisString) -> Result<Self, LockError> {
        let name = token_key_name(ctx, lock);
        let key = LockKey::open(ctx, &name, true);
        let current = match key.kind() {
            KeyKind::Empty => rules::parse_token(None)?,
            KeyKind::String => rules::parse_token(Some(&key.string_value()))?,
            KeyKind::Hash | KeyKind::Other => return Err(LockError::WrongType),
        };
        Ok(Self { name, key, current })
    }

    /// The last token granted (0: none yet).
    pub const fn current(&self) -> u64 {
        self.current
    }

    /// Takes the next token: stores and replicates it (`SET`, an absolute value).
    ///
    /// # Errors
    /// [`LockError::CorruptToken`] when the counter cannot grow.
    pub fn next(self, ctx: &Context) -> Result<u64, LockError> {
        let token = rules::next_token(self.current)?;
        let value = raw::int_string(ctx, token as i64);
        self.key.string_set(&value);
        if replicating(ctx) {
            raw::replicate(ctx, c"SET", &[&self.name, &value]);
        } else {
            raw::count_unpropagated_write(ctx);
        }
        Ok(token)
    }
}

/// `redisson_lock_token:{<key>}`, binary-safe (same slot as the lock in a cluster).
fn token_key_name(ctx: &Context, name: &RedisString) -> RedisString {
    RedisString::create_from_slice(
        ctx.get_raw(),
        &[TOKEN_PREFIX, name.bytes(), CHANNEL_SUFFIX].concat(),
    )
}

/// `[1, token]`: held, with this fencing token (`nil` if the counter could not be read).
pub fn token_reply(token: Option<u64>) -> RedisValue {
    let token = token.map_or(RedisValue::Null, |t| RedisValue::Integer(t as i64));
    RedisValue::Array(vec![RedisValue::Integer(1), token])
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
        let latch = cmd.request.map(|id| Latch::open(ctx, cmd.key, id)).transpose()?;
        if let Some(first) = latch.as_ref().and_then(|l| l.result) {
            return Ok(RedisValue::Integer(first));
        }
        let key = LockKey::open(ctx, cmd.key, true);
        let reply = release_hold(ctx, &key, cmd.key, cmd.owner, deadline)?;
        if let (Some(latch), RedisValue::Integer(result)) = (latch, &reply) {
            latch.remember(ctx, *result);
        }
        Ok(reply)
    })
}

/// How long a release's result is remembered for retries with the same `REQUEST` id.
const RELEASE_LATCH_MS: i64 = 10_000;

/// A release request's latch, `redisson_unlock_latch:{<lock>}:<id>` (Redisson's unlock latch):
/// the result (0 or 1) of the first release with that id, kept for [`RELEASE_LATCH_MS`].
/// "Not held" is not remembered, as in Redisson.
struct Latch {
    name: RedisString,
    key: LockKey,
    result: Option<i64>,
}

impl Latch {
    fn open(ctx: &Context, lock: &RedisString, id: &RedisString) -> Result<Self, LockError> {
        let name = [LATCH_PREFIX, lock.bytes(), b"}:", id.bytes()].concat();
        let name = RedisString::create_from_slice(ctx.get_raw(), &name);
        let key = LockKey::open(ctx, &name, true);
        let result = match key.kind() {
            KeyKind::Empty => None,
            KeyKind::String => match key.string_value().as_slice() {
                b"0" => Some(0),
                b"1" => Some(1),
                _ => return Err(LockError::WrongType),
            },
            KeyKind::Hash | KeyKind::Other => return Err(LockError::WrongType),
        };
        Ok(Self { name, key, result })
    }

    fn remember(self, ctx: &Context, result: i64) {
        let value = raw::int_string(ctx, result);
        self.key.string_set(&value);
        let until = raw::now_ms().saturating_add(RELEASE_LATCH_MS);
        self.key.set_expire_at(until);
        if replicating(ctx) {
            raw::replicate(ctx, c"SET", &[&self.name, &value]);
            raw::replicate(ctx, c"PEXPIREAT", &[&self.name, &raw::int_string(ctx, until)]);
        } else {
            raw::count_unpropagated_write(ctx);
        }
    }
}

/// Releases one hold of `owner` on the open key: the rules of `RLOCK.RELEASE`, with the
/// hand-off to a waiter when the lock is freed. Also used to undo a grant whose client left.
///
/// # Errors
/// `WRONGTYPE`, or a corrupt hold count.
pub fn release_hold(
    ctx: &Context,
    key: &LockKey,
    name: &RedisString,
    owner: &RedisString,
    deadline: Option<Deadline>,
) -> Result<RedisValue, LockError> {
    waiting::settle(ctx, key, name);
    let plan = rules::release(view_as(key, Some(owner))?, deadline);
    Ok(execute(ctx, key, name, Some(owner), &plan))
}

/// `RLOCK.RENEW key owner lease-ms`
pub fn renew(ctx: &Context, argv: Vec<RedisString>) -> RedisResult {
    guarded(ctx, || {
        let cmd = args::Renew::parse(&argv)?;
        let deadline = Deadline::after(raw::now_ms(), cmd.lease)?;
        let key = LockKey::open(ctx, cmd.key, true);
        let plan = rules::renew(view_as(&key, Some(cmd.owner))?, deadline);
        Ok(execute(ctx, &key, cmd.key, Some(cmd.owner), &plan))
    })
}

/// `RLOCK.FORCERELEASE key`
pub fn force_release(ctx: &Context, argv: Vec<RedisString>) -> RedisResult {
    guarded(ctx, || {
        let cmd = args::KeyOnly::parse(&argv)?;
        let key = LockKey::open(ctx, cmd.key, true);
        waiting::settle(ctx, &key, cmd.key);
        let plan = rules::force_release(view_as(&key, None)?);
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

/// The last fencing token granted for a lock (0: none), read-only.
fn last_token(ctx: &Context, lock: &RedisString) -> Result<u64, LockError> {
    let key = LockKey::open(ctx, &token_key_name(ctx, lock), false);
    match key.kind() {
        KeyKind::Empty => Ok(0),
        KeyKind::String => rules::parse_token(Some(&key.string_value())),
        KeyKind::Hash | KeyKind::Other => Err(LockError::WrongType),
    }
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
    match (plan.write, owner) {
        (Write::Keep, _) => {}
        (Write::SetCount(count), Some(owner)) => {
            let count = raw::int_string(ctx, count as i64);
            key.hash_set(owner, &count);
            if replicate {
                raw::replicate(ctx, c"HSET", &[name, owner, &count]);
            }
        }
        (Write::SetCount(_), None) => unreachable!("only owner commands set a hold count"),
        (Write::Delete, _) => {
            key.delete();
            if replicate {
                raw::replicate(ctx, c"DEL", &[name]);
            }
        }
    }
    if let Some(deadline) = plan.expire_at {
        key.set_expire_at(deadline.unix_ms());
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

/// `redisson_lock__channel:{<key>}`, binary-safe.
fn unlock_channel(ctx: &Context, name: &RedisString) -> RedisString {
    let name = name.bytes();
    let mut channel = Vec::with_capacity(CHANNEL_PREFIX.len() + name.len() + CHANNEL_SUFFIX.len());
    channel.extend_from_slice(CHANNEL_PREFIX);
    channel.extend_from_slice(name);
    channel.extend_from_slice(CHANNEL_SUFFIX);
    RedisString::create_from_slice(ctx.get_raw(), &channel)
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
    if let Err(e) = raw::watch_replication(ctx) {
        ctx.log_warning(&format!("rlock: {e}"));
        return false;
    }
    true
}
