//! `FLOOR.BLOCK` / `FLOOR.UNBLOCK` (`RedisModule_BlockClient` + `RedisModule_UnblockClient`) and
//! `FLOOR.BLOCKK` / `FLOOR.SIGNAL` (`RedisModule_BlockClientOnKeys` +
//! `RedisModule_SignalKeyAsReady`): FIFO per key, one client served per unblock or signal.

use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::ffi::c_int;
use std::ptr;

use redis_module::{raw, Context, RedisError, RedisResult, RedisString, RedisValue};

use crate::{api, flags, guard_callback, parse_ms};

/// A blocked client, as an integer (a map key).
type Blocked = usize;

/// The module's waiting state (Redis's main thread only).
#[derive(Default)]
struct State {
    /// `FLOOR.BLOCK`'s queues, per key.
    queues: HashMap<Vec<u8>, VecDeque<Blocked>>,
    /// The key each queued client waits on: a client is queued exactly while it is here.
    queued: HashMap<Blocked, Vec<u8>>,
    /// Unblocks that found nobody waiting, per key: the next `FLOOR.BLOCK` takes one at once.
    pipe_tokens: HashMap<Vec<u8>, u64>,
    /// Signals not yet taken by a client blocked on the key, per key.
    key_tokens: HashMap<Vec<u8>, u64>,
}

thread_local! {
    static STATE: RefCell<State> = RefCell::default();
}

/// Runs `f` on the state; `None` if it is in use (never on one thread without re-entry).
fn with_state<R>(f: impl FnOnce(&mut State) -> R) -> Option<R> {
    STATE.with(|s| s.try_borrow_mut().ok().map(|mut s| f(&mut s)))
}

const BUSY: RedisError = RedisError::Str("ERR floor: state busy");

/// Takes one token of `key`, if there is one.
fn take(tokens: &mut HashMap<Vec<u8>, u64>, key: &[u8]) -> bool {
    match tokens.get_mut(key) {
        Some(n) if *n > 1 => {
            *n -= 1;
            true
        }
        Some(_) => {
            tokens.remove(key);
            true
        }
        None => false,
    }
}

fn give(tokens: &mut HashMap<Vec<u8>, u64>, key: &[u8]) {
    let n = tokens.entry(key.to_vec()).or_default();
    *n = n.saturating_add(1);
}

/// Whether the command may block its client: not inside MULTI/EXEC, a script, or another
/// context where Redis denies blocking (then the command answers at once, as rlock's does).
fn may_block(ctx: &Context) -> bool {
    flags(ctx)
        & (raw::REDISMODULE_CTX_FLAGS_MULTI
            | raw::REDISMODULE_CTX_FLAGS_LUA
            | raw::REDISMODULE_CTX_FLAGS_DENY_BLOCKING)
        == 0
}

/// The two arguments of both blocking commands: key and timeout (ms, 0 = none).
fn key_and_timeout(args: &[RedisString]) -> Result<(&RedisString, i64), RedisError> {
    let [_, key, timeout] = args else { return Err(RedisError::WrongArity) };
    Ok((key, parse_ms(timeout, "timeout", 0)?))
}

fn reply_long(ctx: *mut raw::RedisModuleCtx, v: i64) {
    let reply = api!(RedisModule_ReplyWithLongLong);
    // SAFETY: a live callback context with a client to reply to.
    unsafe { reply(ctx, v) };
}

fn reply_null(ctx: *mut raw::RedisModuleCtx) {
    let reply = api!(RedisModule_ReplyWithNull);
    // SAFETY: as in `reply_long`.
    unsafe { reply(ctx) };
}

fn unblock_client(bc: Blocked) {
    let unblock = api!(RedisModule_UnblockClient);
    // SAFETY: `bc` came from RedisModule_BlockClient and was queued; it is taken out of the
    // state before this call, so each client is unblocked exactly once. No private data.
    unsafe { unblock(bc as *mut raw::RedisModuleBlockedClient, ptr::null_mut()) };
}

/// `FLOOR.BLOCK key timeout-ms`: 1 at once if an unblock left a token, else blocks until
/// `FLOOR.UNBLOCK key` (1) or the timeout (nil); nil at once where it may not block.
pub fn block(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    let (key, timeout) = key_and_timeout(&args)?;
    if with_state(|s| take(&mut s.pipe_tokens, key.as_slice())).ok_or(BUSY)? {
        return Ok(RedisValue::Integer(1));
    }
    if !may_block(ctx) {
        return Ok(RedisValue::Null);
    }
    let (block, on_disconnect) =
        (api!(RedisModule_BlockClient), api!(RedisModule_SetDisconnectCallback));
    // SAFETY: a live command context that may block; the callbacks are this module's
    // `extern "C"` functions with the signatures Redis expects; no private data to free.
    let bc = unsafe {
        let bc = block(ctx.get_raw(), Some(pipe_reply), Some(pipe_timeout), None, timeout);
        on_disconnect(bc, Some(pipe_gone));
        bc
    } as Blocked;
    let name = key.as_slice().to_vec();
    let queued = with_state(|s| {
        s.queues.entry(name.clone()).or_default().push_back(bc);
        s.queued.insert(bc, name);
    });
    if queued.is_none() {
        unblock_client(bc); // never queued: served at once rather than left behind
    }
    Ok(RedisValue::NoReply)
}

/// `FLOOR.UNBLOCK key`: unblocks the head of the key's queue (1), or leaves a token (0).
pub fn unblock(_ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    let [_, key] = args.as_slice() else { return Err(RedisError::WrongArity) };
    let key = key.as_slice();
    let head = with_state(|s| {
        let queue = s.queues.get_mut(key)?;
        let head = queue.pop_front();
        if queue.is_empty() {
            s.queues.remove(key);
        }
        let head = head?;
        s.queued.remove(&head);
        Some(head)
    })
    .ok_or(BUSY)?;
    match head {
        Some(bc) => {
            unblock_client(bc);
            Ok(RedisValue::Integer(1))
        }
        None => {
            with_state(|s| give(&mut s.pipe_tokens, key)).ok_or(BUSY)?;
            Ok(RedisValue::Integer(0))
        }
    }
}

/// Takes `bc` out of its queue; whether it was queued (not yet unblocked).
fn dequeue(bc: Blocked) -> bool {
    with_state(|s| {
        let Some(key) = s.queued.remove(&bc) else { return false };
        if let Some(queue) = s.queues.get_mut(&key) {
            queue.retain(|&b| b != bc);
            if queue.is_empty() {
                s.queues.remove(&key);
            }
        }
        true
    })
    .unwrap_or(false)
}

extern "C" fn pipe_reply(
    ctx: *mut raw::RedisModuleCtx,
    _argv: *mut *mut raw::RedisModuleString,
    _argc: c_int,
) -> c_int {
    guard_callback(&Context::new(ctx), || reply_long(ctx, 1));
    raw::REDISMODULE_OK as c_int
}

/// The timeout, or `CLIENT UNBLOCK id [TIMEOUT]`: nil, out of the queue, and freed (a client
/// blocked with RedisModule_BlockClient is freed only by RedisModule_UnblockClient).
extern "C" fn pipe_timeout(
    ctx: *mut raw::RedisModuleCtx,
    _argv: *mut *mut raw::RedisModuleString,
    _argc: c_int,
) -> c_int {
    guard_callback(&Context::new(ctx), || {
        let handle = api!(RedisModule_GetBlockedClientHandle);
        // SAFETY: a timeout callback's context carries its blocked client.
        let bc = unsafe { handle(ctx) } as Blocked;
        if dequeue(bc) {
            unblock_client(bc);
        }
        reply_null(ctx);
    });
    raw::REDISMODULE_OK as c_int
}

/// Disconnected, killed, or `CLIENT UNBLOCK id ERROR`: out of the queue and freed, unless
/// `FLOOR.UNBLOCK` already unblocked it.
extern "C" fn pipe_gone(ctx: *mut raw::RedisModuleCtx, bc: *mut raw::RedisModuleBlockedClient) {
    guard_callback(&Context::new(ctx), || {
        if dequeue(bc as Blocked) {
            unblock_client(bc as Blocked);
        }
    });
}

/// `FLOOR.BLOCKK key timeout-ms`: 1 at once if a signal left a token, else blocks on the key
/// until `FLOOR.SIGNAL key` serves it (1) or the timeout (nil); nil at once where it may not
/// block. Redis frees these clients itself (timeout, disconnect): no state to keep.
pub fn block_on_key(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    let (key, timeout) = key_and_timeout(&args)?;
    if with_state(|s| take(&mut s.key_tokens, key.as_slice())).ok_or(BUSY)? {
        return Ok(RedisValue::Integer(1));
    }
    if !may_block(ctx) {
        return Ok(RedisValue::Null);
    }
    let block = api!(RedisModule_BlockClientOnKeys);
    let mut keys = [key.inner];
    // SAFETY: a live command context that may block; one live key string (Redis retains what
    // it keeps); the callbacks have the signatures Redis expects; no private data.
    unsafe {
        block(
            ctx.get_raw(),
            Some(key_reply),
            Some(key_timeout),
            None,
            timeout,
            keys.as_mut_ptr(),
            1,
            ptr::null_mut(),
        );
    }
    Ok(RedisValue::NoReply)
}

/// `FLOOR.SIGNAL key`: one token, and the key signalled ready (Redis then offers it to the
/// clients blocked on it, in order, after this command).
pub fn signal(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    let [_, key] = args.as_slice() else { return Err(RedisError::WrongArity) };
    with_state(|s| give(&mut s.key_tokens, key.as_slice())).ok_or(BUSY)?;
    let ready = api!(RedisModule_SignalKeyAsReady);
    // SAFETY: a live command context and key string.
    unsafe { ready(ctx.get_raw(), key.inner) };
    Ok(RedisValue::SimpleStringStatic("OK"))
}

/// A signalled key is offered: served (1) if a token is left, else stays blocked.
extern "C" fn key_reply(
    ctx: *mut raw::RedisModuleCtx,
    _argv: *mut *mut raw::RedisModuleString,
    _argc: c_int,
) -> c_int {
    let mut served = false;
    guard_callback(&Context::new(ctx), || {
        let ready = api!(RedisModule_GetBlockedClientReadyKey);
        // SAFETY: a reply callback of a client blocked on keys: the ready key, live for the call.
        let key = unsafe { ready(ctx) };
        if key.is_null() {
            return;
        }
        // The bytes of Redis's own string, read for the call (neither retained nor freed).
        let key = RedisString::string_as_slice(key);
        served = with_state(|s| take(&mut s.key_tokens, key)).unwrap_or(false);
        if served {
            reply_long(ctx, 1);
        }
    });
    if served {
        raw::REDISMODULE_OK as c_int
    } else {
        raw::REDISMODULE_ERR as c_int
    }
}

extern "C" fn key_timeout(
    ctx: *mut raw::RedisModuleCtx,
    _argv: *mut *mut raw::RedisModuleString,
    _argc: c_int,
) -> c_int {
    guard_callback(&Context::new(ctx), || reply_null(ctx));
    raw::REDISMODULE_OK as c_int
}
