//! A walk over the selected database's key names, a step at a time (`RedisModule_Scan`, as
//! `SCAN` walks: a step is one bucket of the keyspace's table, a few keys; a key there for the
//! whole walk is seen at least once).

use std::ffi::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};

use redis_module::{raw, Context};

/// A keyspace scan cursor (destroyed on drop).
pub struct KeyScan(*mut raw::RedisModuleScanCursor);

impl KeyScan {
    /// A walk from the start.
    #[must_use]
    pub fn new() -> Self {
        let create = api!(RedisModule_ScanCursorCreate);
        // SAFETY: takes nothing; the cursor is owned here until `drop`.
        Self(unsafe { create() })
    }

    /// One step over the context's selected database: `f` gets each key name it lends, and
    /// whether that key holds a hash (read from the key the scan opened: no key is opened
    /// again); it must not touch the keyspace. Returns whether the walk goes on.
    pub fn step(&mut self, ctx: &Context, f: &mut dyn FnMut(&[u8], bool)) -> bool {
        let scan = api!(RedisModule_Scan);
        let mut f = f;
        // SAFETY: live context and cursor; `privdata` points at `f` (a `&mut dyn FnMut`), alive
        // and not otherwise used during the call, and the callback only calls it with the name
        // it is lent for the call.
        unsafe {
            let privdata = (&mut f as *mut &mut dyn FnMut(&[u8], bool)).cast::<c_void>();
            scan(ctx.get_raw(), self.0, Some(lend_name), privdata) != 0
        }
    }
}

impl Default for KeyScan {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for KeyScan {
    fn drop(&mut self) {
        let destroy = api!(RedisModule_ScanCursorDestroy);
        // SAFETY: the cursor was created by `new` and is destroyed once.
        unsafe { destroy(self.0) }
    }
}

/// `Scan`'s callback for [`KeyScan::step`].
unsafe extern "C" fn lend_name(
    _ctx: *mut raw::RedisModuleCtx,
    name: *mut raw::RedisModuleString,
    key: *mut raw::RedisModuleKey,
    privdata: *mut c_void,
) {
    // SAFETY: `privdata` is the `&mut dyn FnMut` `step` passed, alive and not otherwise
    // borrowed during the call.
    let f = unsafe { &mut *privdata.cast::<&mut dyn FnMut(&[u8], bool)>() };
    super::work::add(1);
    // SAFETY: NULL or a string lent for this call, which the slice does not outlive.
    let name = unsafe { super::keys::lent_slice(name) };
    let is_hash = !key.is_null() && {
        let key_type = api!(RedisModule_KeyType);
        // SAFETY: a non-null key the scan opened for reading, valid during this call.
        unsafe { key_type(key) as isize == raw::REDISMODULE_KEYTYPE_HASH }
    };
    // No unwinding across the FFI boundary.
    let _ = catch_unwind(AssertUnwindSafe(|| f(name, is_hash)));
}
