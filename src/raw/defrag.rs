//! Keeps the redis-module crate's `redis_module!` load from logging, at warning level on every
//! start, that this server has no defrag callbacks API (`RedisModule_RegisterDefragCallbacks`,
//! Redis 8's; Redis 7.0 and Valkey 8 lack it). rlock registers no defrag function nor callback
//! (it keeps no data type of its own), so the crate has nothing to register, only a warning to
//! log: the crate skips silently when the pointer is set, and logs when it is not.
//!
//! [`QUIET_DEFRAG`] sits in the `data_types` list of `redis_module!`, whose entries the crate
//! calls (`create_data_type`) right after `RedisModule_Init` filled the API pointers and before
//! it looks at the defrag ones. Where the server lacks an API, its pointer gets a stand-in that
//! registers nothing and reports success, which is what the crate does itself when it skips.
//! Nothing else reads these pointers: no capability is detected from them (`missing_apis` and
//! `server.rs` name other APIs), and the crate calls them only to register functions that its
//! defrag lists hold, which are empty.

use std::ffi::c_int;

use redis_module::raw;

/// The `data_types` entry of `redis_module!` that sets the stand-ins (see the module docs).
pub struct QuietDefrag;

/// The one [`QuietDefrag`], named in `lib.rs`'s `redis_module!` table.
pub const QUIET_DEFRAG: QuietDefrag = QuietDefrag;

impl QuietDefrag {
    /// Called by `redis_module!` after `RedisModule_Init`, as a data type's creation would be:
    /// sets a stand-in for each defrag registration API the server lacks. Never fails.
    ///
    /// # Errors
    /// None; the signature is the one the macro calls.
    pub fn create_data_type(&self, _ctx: *mut raw::RedisModuleCtx) -> Result<(), &'static str> {
        // SAFETY: RedisModule_Init (OnLoad, on Redis's main thread) has just written these
        // pointers and nothing runs concurrently with OnLoad; they are read by copy (no
        // reference to the mutable statics), and set only where the server left them null, to
        // stand-ins with exactly the pointers' C signatures.
        unsafe {
            let (func, callbacks) =
                (raw::RedisModule_RegisterDefragFunc, raw::RedisModule_RegisterDefragCallbacks);
            if func.is_none() {
                raw::RedisModule_RegisterDefragFunc = Some(register_nothing);
            }
            if callbacks.is_none() {
                raw::RedisModule_RegisterDefragCallbacks = Some(register_no_callbacks);
            }
        }
        Ok(())
    }
}

/// Stands in for `RedisModule_RegisterDefragFunc`: registers nothing (the server cannot
/// defragment module data), as the crate's own skip does.
extern "C" fn register_nothing(
    _ctx: *mut raw::RedisModuleCtx,
    _func: raw::RedisModuleDefragFunc,
) -> c_int {
    raw::REDISMODULE_OK as c_int
}

/// Stands in for `RedisModule_RegisterDefragCallbacks`, as [`register_nothing`].
extern "C" fn register_no_callbacks(
    _ctx: *mut raw::RedisModuleCtx,
    _start: raw::RedisModuleDefragFunc,
    _end: raw::RedisModuleDefragFunc,
) -> c_int {
    raw::REDISMODULE_OK as c_int
}
