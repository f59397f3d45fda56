//! The entry of every command: Redis calls [`run`] (through a small `extern "C"` function per
//! command that `lib.rs`'s table generates) with the client's arguments, which the handler
//! borrows for the call instead of taking a reference of its own on each (the redis-module
//! crate's entry retains every argument and frees it again: two server calls per argument, a
//! few percent of a plain acquire), and [`create_command`] registers it.
//!
//! While a command runs, the context's flags are read from the server once and remembered for
//! that context (`context::flags`): several floors ask whether this is a master, whether
//! it may block, whether writes propagate.

use std::cell::Cell;
use std::ffi::{c_int, CStr};
use std::mem::{ManuallyDrop, MaybeUninit};
use std::ptr;

use redis_module::{raw, Context, RedisResult, RedisString};

/// A command handler: the context and the command's arguments (its name first), borrowed.
pub type Handler = fn(&Context, &[RedisString]) -> RedisResult;

/// What Redis calls for a command.
pub type Entry =
    extern "C" fn(*mut raw::RedisModuleCtx, *mut *mut raw::RedisModuleString, c_int) -> c_int;

/// Arguments kept on the stack (more go to the heap: `RSEM.RELEASE ... ID id [id ...]`).
const ON_STACK: usize = 16;

thread_local! {
    // Redis calls commands on its main thread only. The context whose command runs now, and its
    // flags once read (0: not yet).
    static RUNNING: Cell<(*mut raw::RedisModuleCtx, u32)> =
        const { Cell::new((ptr::null_mut(), 0)) };
}

/// Runs `handler` for the command Redis called with `argv`, and writes its reply.
///
/// # Safety
/// `ctx`, `argv` and `argc` are what Redis passed to a command's entry: a live command context
/// and `argc` valid argument strings (or a null `argv`), alive for the whole call.
pub unsafe fn run(
    ctx: *mut raw::RedisModuleCtx,
    argv: *mut *mut raw::RedisModuleString,
    argc: c_int,
    handler: Handler,
) -> c_int {
    let context = Context::new(ctx);
    let count = usize::try_from(argc).unwrap_or(0);
    let strings: &[*mut raw::RedisModuleString] = if argv.is_null() || count == 0 {
        &[]
    } else {
        // SAFETY: the caller's promise: `argc` valid argument strings, alive for the whole call.
        unsafe { std::slice::from_raw_parts(argv, count) }
    };
    // Borrowed: not retained, and never freed here (ManuallyDrop), they are the client's.
    let borrow = |s: *mut raw::RedisModuleString| {
        ManuallyDrop::new(RedisString::from_redis_module_string(ctx, s))
    };
    let outer = RUNNING.replace((ctx, 0));
    let response = if strings.len() <= ON_STACK {
        let mut args = [const { MaybeUninit::<ManuallyDrop<RedisString>>::uninit() }; ON_STACK];
        for (slot, &s) in args.iter_mut().zip(strings) {
            slot.write(borrow(s));
        }
        // SAFETY: the first `strings.len()` slots were written just above (`zip` stops at the
        // shorter side, and `strings.len() <= ON_STACK`); `MaybeUninit<T>` has `T`'s layout.
        let written = unsafe {
            &*(ptr::from_ref(&args[..strings.len()]) as *const [ManuallyDrop<RedisString>])
        };
        handler(&context, as_strings(written))
    } else {
        let args: Vec<ManuallyDrop<RedisString>> = strings.iter().map(|&s| borrow(s)).collect();
        handler(&context, as_strings(&args))
    };
    RUNNING.set(outer);
    context.reply(response) as c_int
}

/// The borrowed arguments as plain strings.
fn as_strings(args: &[ManuallyDrop<RedisString>]) -> &[RedisString] {
    // SAFETY: `ManuallyDrop<T>` is `repr(transparent)` over `T`: the same layout, element by
    // element; the strings are only read through the shared slice (a handler that keeps one
    // clones it), and never dropped, as the `ManuallyDrop` they live in says.
    unsafe { &*(ptr::from_ref(args) as *const [RedisString]) }
}

/// The flags of `ctx` as remembered for the command running in it, or `read` them (and remember
/// them, when `ctx` is that command's).
pub(crate) fn remembered_flags(ctx: *mut raw::RedisModuleCtx, read: impl FnOnce() -> u32) -> u32 {
    let (running, known) = RUNNING.get();
    if running != ctx || running.is_null() {
        return read();
    }
    if known != 0 {
        return known;
    }
    let flags = read();
    RUNNING.set((ctx, flags));
    flags
}

/// Registers the command `name` (`flags` as Redis spells them; one key, at position 1).
///
/// # Errors
/// When Redis refuses it (a name taken, flags it does not know).
pub fn create_command(
    ctx: &Context,
    name: &CStr,
    entry: Entry,
    flags: &CStr,
) -> Result<(), String> {
    let create = api!(RedisModule_CreateCommand);
    // SAFETY: called from OnLoad with its live context; `name` and `flags` are NUL-terminated
    // and Redis copies them; `entry` is a plain function that lives as long as the module.
    let status =
        unsafe { create(ctx.get_raw(), name.as_ptr(), Some(entry), flags.as_ptr(), 1, 1, 1) };
    if status == raw::REDISMODULE_OK as c_int {
        Ok(())
    } else {
        Err(format!("could not create the command {}", name.to_string_lossy()))
    }
}
