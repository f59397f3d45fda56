//! `FLOOR.HSET`, `FLOOR.HDEL`, `FLOOR.PUBLISH`: the key API and one replicated command per
//! write, as rlock writes and replicates a lock (`RESTORE ... REPLACE ABSTTL`, `DEL`).

use std::ffi::{c_int, CStr};
use std::ptr;

use redis_module::{raw, Context, RedisError, RedisResult, RedisString, RedisValue};

use crate::{api, flags, parse_ms, propagation_possible, REPLICATION_SEEN};

/// An open key, closed on drop.
struct Key(*mut raw::RedisModuleKey);

impl Key {
    fn open(ctx: &Context, name: &RedisString) -> Self {
        let open = api!(RedisModule_OpenKey);
        let mode = (raw::REDISMODULE_READ | raw::REDISMODULE_WRITE) as c_int;
        // SAFETY: a live command context and key name; the key is closed on drop.
        Self(unsafe { open(ctx.get_raw(), name.inner, mode) })
    }

    fn kind(&self) -> c_int {
        let kind = api!(RedisModule_KeyType);
        // SAFETY: an open key (KeyType accepts NULL too).
        unsafe { kind(self.0) }
    }

    fn is_missing(&self) -> bool {
        self.kind() == raw::REDISMODULE_KEYTYPE_EMPTY as c_int
    }

    fn is_hash(&self) -> bool {
        self.kind() == raw::REDISMODULE_KEYTYPE_HASH as c_int
    }

    /// Sets (`Some`) or deletes (`None`) one field; how many fields it changed.
    fn hash_set(&self, field: &RedisString, value: Option<&RedisString>) -> c_int {
        let set = api!(RedisModule_HashSet);
        let value = value.map_or(raw::REDISMODULE_HASH_DELETE, |v| v.inner.cast_const());
        let none = raw::REDISMODULE_HASH_NONE as c_int;
        // SAFETY: a key open for writing, empty or a hash (checked by the callers); one
        // field/value pair of live strings, then the NULL that ends the list.
        unsafe { set(self.0, none, field.inner, value, ptr::null_mut::<raw::RedisModuleString>()) }
    }

    /// Fields of a hash (0 for an empty key).
    fn fields(&self) -> usize {
        let len = api!(RedisModule_ValueLength);
        // SAFETY: an open key (ValueLength accepts an empty one).
        unsafe { len(self.0) }
    }

    fn set_expire_at(&self, at: i64) {
        let expire = api!(RedisModule_SetAbsExpire);
        // SAFETY: a key open for writing that holds a value.
        unsafe { expire(self.0, at) };
    }

    fn delete(&self) {
        let delete = api!(RedisModule_DeleteKey);
        // SAFETY: a key open for writing.
        unsafe { delete(self.0) };
    }
}

impl Drop for Key {
    fn drop(&mut self) {
        let close = api!(RedisModule_CloseKey);
        // SAFETY: opened by `Key::open`, closed once.
        unsafe { close(self.0) };
    }
}

const WRONGTYPE: RedisError =
    RedisError::Str("WRONGTYPE Operation against a key holding the wrong kind of value");

fn notify(ctx: &Context, class: c_int, event: &CStr, key: &RedisString) {
    let notify = api!(RedisModule_NotifyKeyspaceEvent);
    // SAFETY: a live command context, a NUL-terminated event name and a live key string.
    unsafe { notify(ctx.get_raw(), class, event.as_ptr(), key.inner) };
}

/// Propagates `command args...` (format "v", or "vA" for replicas only).
fn replicate(ctx: &Context, command: &CStr, format: &CStr, args: &[&RedisString]) {
    let replicate = api!(RedisModule_Replicate);
    let mut argv: Vec<*mut raw::RedisModuleString> = args.iter().map(|a| a.inner).collect();
    // SAFETY: the "v" format takes an array of RedisModuleString pointers and its length ("A"
    // only sets a flag); the strings are live for the call. Both C strings end with NUL.
    unsafe {
        replicate(ctx.get_raw(), command.as_ptr(), format.as_ptr(), argv.as_mut_ptr(), argv.len());
    }
}

/// A write that goes nowhere (no AOF, no replica): counted for save points, as rlock does.
fn count_write(ctx: &Context) {
    let verbatim = api!(RedisModule_ReplicateVerbatim);
    // SAFETY: a command context; with nothing to propagate to, Redis only bumps its dirty count.
    unsafe { verbatim(ctx.get_raw()) };
}

/// The longest field or value `FLOOR.HSET` takes: one listpack entry with a one-byte header.
const MAX_ENTRY: usize = 63;

/// `FLOOR.HSET key field value ttl-ms`: the key becomes (or stays) a hash with `field` set to
/// `value`, expiring `ttl-ms` from now; replicated as one `RESTORE ... REPLACE ABSTTL`. Nil.
pub fn hset(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    let [_, name, field, value, ttl] = args.as_slice() else {
        return Err(RedisError::WrongArity);
    };
    let ttl = parse_ms(ttl, "ttl-ms", 1)?;
    if field.len() > MAX_ENTRY || value.len() > MAX_ENTRY {
        return Err(RedisError::Str("ERR field and value must be at most 63 bytes each"));
    }
    let key = Key::open(ctx, name);
    if !key.is_missing() && !key.is_hash() {
        return Err(WRONGTYPE);
    }
    let now = api!(RedisModule_Milliseconds);
    // SAFETY: takes no arguments.
    let at = unsafe { now() } + ttl;
    key.hash_set(field, Some(value));
    key.set_expire_at(at);
    let one_field = key.fields() == 1;
    drop(key);
    notify(ctx, raw::REDISMODULE_NOTIFY_HASH, c"hset", name);
    notify(ctx, raw::REDISMODULE_NOTIFY_GENERIC, c"expire", name);
    if propagation_possible(ctx) && !one_field {
        // Other fields too (not a path the bench takes): the hash as HSET + PEXPIREAT.
        let at = RedisString::create_from_slice(ctx.get_raw(), at.to_string().as_bytes());
        replicate(ctx, c"HSET", c"v", &[name, field, value]);
        replicate(ctx, c"PEXPIREAT", c"v", &[name, &at]);
    } else if propagation_possible(ctx) {
        thread_local! {
            // Kept for the module's life (no context: not freed with a command's).
            static WORDS: [RedisString; 2] =
                [&b"REPLACE"[..], b"ABSTTL"].map(|w| RedisString::create(None, w));
        }
        let payload = hash_payload(field.as_slice(), value.as_slice());
        let payload = RedisString::create_from_slice(ctx.get_raw(), &payload);
        let at = RedisString::create_from_slice(ctx.get_raw(), at.to_string().as_bytes());
        WORDS.with(|[replace, absttl]| {
            replicate(ctx, c"RESTORE", c"v", &[name, &at, &payload, replace, absttl]);
        });
    } else {
        count_write(ctx);
    }
    Ok(RedisValue::Null)
}

/// `FLOOR.HDEL key field [channel message]`: deletes the field (the key with its last one,
/// replicated as `DEL`, else as `HDEL`), then publishes `message` on `channel` if given.
/// 1, or 0 (nothing deleted, nothing published).
pub fn hdel(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    let (name, field, message) = match args.as_slice() {
        [_, name, field] => (name, field, None),
        [_, name, field, channel, message] => (name, field, Some((channel, message))),
        _ => return Err(RedisError::WrongArity),
    };
    let key = Key::open(ctx, name);
    if key.is_missing() {
        return Ok(RedisValue::Integer(0));
    }
    if !key.is_hash() {
        return Err(WRONGTYPE);
    }
    if key.hash_set(field, None) == 0 {
        return Ok(RedisValue::Integer(0));
    }
    let gone = key.is_missing() || key.fields() == 0;
    if gone && !key.is_missing() {
        key.delete();
    }
    drop(key);
    notify(ctx, raw::REDISMODULE_NOTIFY_HASH, c"hdel", name);
    if gone {
        notify(ctx, raw::REDISMODULE_NOTIFY_GENERIC, c"del", name);
    }
    if !propagation_possible(ctx) {
        count_write(ctx);
    } else if gone {
        replicate(ctx, c"DEL", c"v", &[name]);
    } else {
        replicate(ctx, c"HDEL", c"v", &[name, field]);
    }
    if let Some((channel, message)) = message {
        publish_message(ctx, channel, message);
    }
    Ok(RedisValue::Integer(1))
}

/// Publishes locally and, where a replica can be, to replicas only (as Redis does a client's
/// `PUBLISH`, and rlock its unlock message); the receivers on this server.
fn publish_message(ctx: &Context, channel: &RedisString, message: &RedisString) -> i64 {
    let publish = api!(RedisModule_PublishMessage);
    // SAFETY: a live command context and strings.
    let receivers = unsafe { publish(ctx.get_raw(), channel.inner, message.inner) };
    let replicas = flags(ctx) & raw::REDISMODULE_CTX_FLAGS_MASTER == 0
        || REPLICATION_SEEN.load(std::sync::atomic::Ordering::Relaxed);
    if replicas {
        replicate(ctx, c"PUBLISH", c"vA", &[channel, message]);
    }
    i64::from(receivers)
}

/// `FLOOR.PUBLISH channel message`: the receivers on this server.
pub fn publish(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    let [_, channel, message] = args.as_slice() else { return Err(RedisError::WrongArity) };
    Ok(RedisValue::Integer(publish_message(ctx, channel, message)))
}

/// `DUMP`'s payload of a hash holding one `field` -> `value` (each at most [`MAX_ENTRY`]
/// bytes): a listpack (RDB type 16) of two string entries, RDB version 10, CRC-64.
fn hash_payload(field: &[u8], value: &[u8]) -> Vec<u8> {
    let lp_len = 6 + (field.len() + 2) + (value.len() + 2) + 1;
    let mut p = Vec::with_capacity(lp_len + 16);
    p.push(16);
    if lp_len < 64 {
        p.push(lp_len as u8);
    } else {
        p.extend_from_slice(&[0x40 | (lp_len >> 8) as u8, lp_len as u8]);
    }
    p.extend_from_slice(&(lp_len as u32).to_le_bytes());
    p.extend_from_slice(&2u16.to_le_bytes());
    for entry in [field, value] {
        p.push(0x80 | entry.len() as u8);
        p.extend_from_slice(entry);
        p.push(entry.len() as u8 + 1); // the entry's length backwards (< 128: one byte)
    }
    p.push(0xFF);
    p.extend_from_slice(&10u16.to_le_bytes());
    let crc =
        p.iter().fold(0u64, |crc, &b| CRC[((crc ^ u64::from(b)) & 0xFF) as usize] ^ (crc >> 8));
    p.extend_from_slice(&crc.to_le_bytes());
    p
}

/// CRC-64/Jones as Redis computes it (reflected, polynomial 0xad93d23594c935a9).
const CRC: [u64; 256] = {
    let mut table = [0; 256];
    let mut i = 0;
    while i < 256 {
        let mut crc = i as u64;
        let mut bit = 0;
        while bit < 8 {
            crc = if crc & 1 == 1 { (crc >> 1) ^ 0x95AC_9329_AC4B_C9B5 } else { crc >> 1 };
            bit += 1;
        }
        table[i] = crc;
        i += 1;
    }
    table
};
