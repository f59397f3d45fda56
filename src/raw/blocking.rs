//! Blocked clients: block, unblock once with an outcome, and the callbacks Redis makes for them,
//! which reach the caller's [`BlockHandler`] (raw knows no caller).

use std::ffi::{c_int, c_void};
use std::ptr;

use redis_module::{raw, Context};

use super::context::flags;
use super::guard_callback;

/// A blocked client, as an integer so it can key maps. Valid from [`block_client`] until the one
/// [`unblock_client`] call for it.
pub type Blocked = usize;

/// What the layer above does when Redis calls back about a client it blocked.
pub trait BlockHandler: 'static {
    /// What a client is unblocked with (given to [`unblock_client`]).
    type Outcome: 'static;

    /// The client was unblocked: reply to it (`outcome` is what [`unblock_client`] was given).
    fn reply(ctx: &Context, outcome: Option<&Self::Outcome>);

    /// `CLIENT UNBLOCK <id> [TIMEOUT]` (Redis's own timeout is off): reply to it now. Redis
    /// unblocks the client itself afterwards; call [`unblock_client`] with `None` to free it.
    fn unblocked_by_command(ctx: &Context, bc: Blocked);

    /// The client left: disconnected, killed, or `CLIENT UNBLOCK ... ERROR`; `outcome` is what it
    /// was unblocked with, if it was.
    fn client_gone(ctx: &Context, bc: Blocked, outcome: Option<&Self::Outcome>);
}

/// Blocks the calling client until [`unblock_client`]. Redis's own timeout is off (0): the
/// caller times waits out itself, so a timeout can never race a grant.
pub fn block_client<H: BlockHandler>(ctx: &Context) -> Blocked {
    let block = api!(RedisModule_BlockClient);
    let on_disconnect = api!(RedisModule_SetDisconnectCallback);
    // SAFETY: live command context; the callbacks are `extern "C"` functions of this module
    // with the signatures Redis expects, and `free_outcome::<H>` frees exactly what
    // `unblock_client::<H>` allocates.
    let bc = unsafe {
        let bc = block(
            ctx.get_raw(),
            Some(reply_trampoline::<H>),
            Some(timeout_trampoline::<H>),
            Some(free_outcome::<H>),
            0,
        );
        on_disconnect(bc, Some(disconnect_trampoline::<H>));
        bc
    };
    bc as Blocked
}

/// Unblocks a client blocked by [`block_client`] with the same handler, once; its reply
/// callback then gets `outcome`.
pub fn unblock_client<H: BlockHandler>(bc: Blocked, outcome: Option<H::Outcome>) {
    let unblock = api!(RedisModule_UnblockClient);
    super::work::add(super::work::UNBLOCK);
    let data = outcome.map_or(ptr::null_mut(), |o| Box::into_raw(Box::new(o)).cast::<c_void>());
    // SAFETY: `bc` came from `block_client::<H>` and the caller unblocks each client exactly
    // once. Ownership of `data` passes to Redis, which hands it back to `free_outcome::<H>`.
    unsafe { unblock(bc as *mut raw::RedisModuleBlockedClient, data) };
}

/// Whether the command may block its client: not inside MULTI/EXEC, a Lua script, or another
/// context where Redis denies blocking.
pub fn may_block(ctx: &Context) -> bool {
    flags(ctx)
        & (raw::REDISMODULE_CTX_FLAGS_MULTI
            | raw::REDISMODULE_CTX_FLAGS_LUA
            | raw::REDISMODULE_CTX_FLAGS_DENY_BLOCKING)
        == 0
}

/// The outcome given to `unblock_client`, seen from a blocked client's callback context.
fn outcome_of<'a, H: BlockHandler>(ctx: *mut raw::RedisModuleCtx) -> Option<&'a H::Outcome> {
    let get = api!(RedisModule_GetBlockedClientPrivateData);
    // SAFETY: the private data of a client blocked with handler H is NULL or a
    // `Box<H::Outcome>` made by `unblock_client::<H>`; Redis frees it (through `free_outcome`)
    // only after the callbacks that can see it have returned, so the reference does not
    // outlive it.
    unsafe { get(ctx).cast::<H::Outcome>().as_ref() }
}

extern "C" fn reply_trampoline<H: BlockHandler>(
    ctx: *mut raw::RedisModuleCtx,
    _argv: *mut *mut raw::RedisModuleString,
    _argc: c_int,
) -> c_int {
    let context = Context::new(ctx);
    guard_callback(&context, || H::reply(&context, outcome_of::<H>(ctx)));
    raw::REDISMODULE_OK as c_int
}

/// Called only for `CLIENT UNBLOCK <id> [TIMEOUT]` (Redis's own timeout is off).
extern "C" fn timeout_trampoline<H: BlockHandler>(
    ctx: *mut raw::RedisModuleCtx,
    _argv: *mut *mut raw::RedisModuleString,
    _argc: c_int,
) -> c_int {
    let context = Context::new(ctx);
    let handle = api!(RedisModule_GetBlockedClientHandle);
    // SAFETY: a timeout callback's context carries its blocked client.
    let bc = unsafe { handle(ctx) } as Blocked;
    guard_callback(&context, || H::unblocked_by_command(&context, bc));
    raw::REDISMODULE_OK as c_int
}

extern "C" fn disconnect_trampoline<H: BlockHandler>(
    ctx: *mut raw::RedisModuleCtx,
    bc: *mut raw::RedisModuleBlockedClient,
) {
    let context = Context::new(ctx);
    guard_callback(&context, || H::client_gone(&context, bc as Blocked, outcome_of::<H>(ctx)));
}

extern "C" fn free_outcome<H: BlockHandler>(_ctx: *mut raw::RedisModuleCtx, data: *mut c_void) {
    if !data.is_null() {
        // SAFETY: non-NULL private data is always a `Box<H::Outcome>` from
        // `unblock_client::<H>`, and Redis calls this once per blocked client.
        drop(unsafe { Box::from_raw(data.cast::<H::Outcome>()) });
    }
}
