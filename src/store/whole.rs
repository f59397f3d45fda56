//! A key's write replicated whole, as one command per key: a hash as one
//! `RESTORE key <unix-ms> <payload> REPLACE ABSTTL` ([`crate::dump`]) of its content and absolute
//! deadline as they now stand, or `DEL` when it ended deleted. One command per key, so Redis
//! wraps nothing in `MULTI`/`EXEC` (a single-key write) and a replica or an AOF replay runs one
//! command lookup, where the same write as `HSET` + `HSET` + `PEXPIREAT` costs three, and Redis
//! adds `MULTI`/`EXEC` around them.
//!
//! The reentrant lock sends its one-holder hash without reading it back (`LockKey::apply`); the
//! read-write lock collects the commands its plan's effects stand for in a [`HashWrites`] and
//! replicates them as one at the end ([`HashWrites::replicate`]).

use std::ffi::CStr;

use redis_module::{Context, RedisString};

use super::settings;
use crate::dump::HashPayload;
use crate::raw::{self, Key, KeyKind};

/// The largest listpack (its entries' bytes) replicated whole: past it, a write goes out as the
/// effects' own commands. A lock hash with many readers would otherwise send all of them, to
/// every replica and the AOF, on each reader's grant.
pub const RESTORE_MAX_BYTES: usize = 1024;

/// Replicates `RESTORE name at payload REPLACE ABSTTL` (`at`: Unix ms; 0 for no expiry).
pub fn restore(ctx: &Context, name: &RedisString, payload: &[u8], at: i64) {
    thread_local! {
        // Kept for the module's life (no context: not freed with a command's).
        static WORDS: [RedisString; 2] =
            [&b"REPLACE"[..], b"ABSTTL"].map(|w| RedisString::create(None, w));
    }
    let payload = RedisString::create_from_slice(ctx.get_raw(), payload);
    let at = raw::int_string(ctx, at.max(0));
    WORDS.with(|[replace, absttl]| {
        raw::replicate(ctx, c"RESTORE", &[name, &at, &payload, replace, absttl]);
    });
}

/// The commands a write of one hash stands for, in order, replicated as one at the end.
pub struct HashWrites {
    commands: Vec<(&'static CStr, Vec<RedisString>)>,
    /// The hash was missing before: what it holds now is what the noted `HSET`s wrote.
    fresh: bool,
}

impl HashWrites {
    /// For a write of a hash that is missing (`fresh`) or not.
    #[must_use]
    pub const fn new(fresh: bool) -> Self {
        Self { commands: Vec::new(), fresh }
    }

    /// Notes `command name args...` (the name is added at the end).
    pub fn push(&mut self, command: &'static CStr, args: Vec<RedisString>) {
        self.commands.push((command, args));
    }

    /// Replicates the hash `name` (open as `key`, its write done) with one command: none when
    /// nothing was written; the one command noted when there was one (an `HSET`, a
    /// `PEXPIREAT`: the cheapest exact form); `DEL` when the key ended deleted; else one
    /// `RESTORE` of what it holds now. Only a hash the server keeps as a listpack, of at most
    /// [`RESTORE_MAX_BYTES`], whose every field and value fits `hash-max-listpack-value`, goes
    /// out whole: a module-less replica then keeps the listpack it restores, in the master's
    /// order, so both hold the same bytes. Any other goes out as the commands noted.
    pub fn replicate(self, ctx: &Context, key: &Key, name: &RedisString) {
        match self.commands.len() {
            0 => return,
            1 => return self.replicate_each(ctx, name),
            _ => {}
        }
        match key.kind() {
            KeyKind::Empty => raw::replicate(ctx, c"DEL", &[name]),
            KeyKind::Hash => match self.fresh_payload().or_else(|| listpack_payload(key)) {
                Some(payload) => restore(ctx, name, &payload, key.expire_at()),
                None => self.replicate_each(ctx, name),
            },
            KeyKind::String | KeyKind::Other => self.replicate_each(ctx, name),
        }
    }

    /// For a hash that was missing, only set (`HSET`, `PEXPIREAT`): its payload from the noted
    /// fields, in the order they were first set (a listpack keeps a field where it was first
    /// set), without reading the hash back; `None` otherwise, or past the limits.
    fn fresh_payload(&self) -> Option<Vec<u8>> {
        if !self.fresh {
            return None;
        }
        let mut fields: Vec<(&[u8], &[u8])> = Vec::with_capacity(self.commands.len());
        for (command, args) in &self.commands {
            match (command.to_bytes(), args.as_slice()) {
                (b"HSET", [field, value]) => {
                    let (field, value) = (field.as_slice(), value.as_slice());
                    match fields.iter_mut().find(|(f, _)| *f == field) {
                        Some(set) => set.1 = value,
                        None => fields.push((field, value)),
                    }
                }
                (b"PEXPIREAT", _) => {}
                _ => return None,
            }
        }
        let max_len = settings::listpack_value_max();
        let mut payload = HashPayload::default();
        for (field, value) in fields {
            if field.len().max(value.len()) > max_len
                || payload.len() + field.len() + value.len() > RESTORE_MAX_BYTES
            {
                return None;
            }
            payload.push(field, value);
        }
        (!payload.is_empty()).then(|| payload.finish())
    }

    fn replicate_each(self, ctx: &Context, name: &RedisString) {
        for (command, args) in self.commands {
            let mut argv: Vec<&RedisString> = Vec::with_capacity(args.len() + 1);
            argv.push(name);
            argv.extend(args.iter());
            raw::replicate(ctx, command, &argv);
        }
    }
}

/// The `DUMP` payload of the hash `key` when it is a listpack within the limits
/// ([`HashWrites::replicate`]); `None` otherwise.
fn listpack_payload(key: &Key) -> Option<Vec<u8>> {
    // More fields than fit the budget (each takes at least 4 bytes) are never scanned: a
    // listpack made long by a raised `hash-max-listpack-entries` costs no walk of it all.
    if key.field_count() > RESTORE_MAX_BYTES / 4 {
        return None;
    }
    let max_len = settings::listpack_value_max();
    let mut payload = HashPayload::default();
    let mut fits = true;
    let whole = key.fields_in_one_step(&mut |field, value| {
        if !fits {
            return;
        }
        fits = field.len().max(value.len()) <= max_len
            && payload.len() + field.len() + value.len() <= RESTORE_MAX_BYTES;
        if fits {
            payload.push(field, value);
        }
    });
    (whole && fits && !payload.is_empty()).then(|| payload.finish())
}
