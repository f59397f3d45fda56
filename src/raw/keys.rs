//! An open key: what it holds, hash fields, a string value, the expiry, delete. Binary-safe
//! throughout (field names and values may hold NUL bytes).

use std::ffi::{c_int, c_void};
use std::ptr::{self, NonNull};

use redis_module::{raw, Context, RedisString};

use super::context::now_ms;

/// What a key holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyKind {
    Empty,
    Hash,
    String,
    Other,
}

/// An open key, closed on drop.
pub struct Key {
    ctx: *mut raw::RedisModuleCtx,
    /// NULL when a key opened read-only does not exist.
    key: *mut raw::RedisModuleKey,
}

impl Key {
    /// Opens `name` for reading, or for reading and writing.
    pub fn open(ctx: &Context, name: &RedisString, writable: bool) -> Self {
        let mode = if writable {
            raw::REDISMODULE_READ | raw::REDISMODULE_WRITE
        } else {
            raw::REDISMODULE_READ
        };
        let open = api!(RedisModule_OpenKey);
        super::work::add(1);
        // SAFETY: `ctx` is the context of the command being executed and `name` a live string
        // owned by the caller; both outlive the returned key, which is closed in Drop.
        let key = unsafe { open(ctx.get_raw(), name.inner, mode as c_int) };
        Self { ctx: ctx.get_raw(), key }
    }

    /// What the key holds. Expired keys read as empty (Redis expires them on open).
    pub fn kind(&self) -> KeyKind {
        if self.key.is_null() {
            return KeyKind::Empty;
        }
        let key_type = api!(RedisModule_KeyType);
        // SAFETY: `self.key` is a non-null key opened by `open` and not yet closed.
        match unsafe { key_type(self.key) } as isize {
            raw::REDISMODULE_KEYTYPE_EMPTY => KeyKind::Empty,
            raw::REDISMODULE_KEYTYPE_HASH => KeyKind::Hash,
            raw::REDISMODULE_KEYTYPE_STRING => KeyKind::String,
            _ => KeyKind::Other,
        }
    }

    /// Whether the key holds a sorted set (a semaphore's lease zset; [`Self::kind`] reads it as
    /// `Other`, with every other type it does not name).
    pub fn is_zset(&self) -> bool {
        if self.key.is_null() {
            return false;
        }
        let key_type = api!(RedisModule_KeyType);
        // SAFETY: `self.key` is a non-null key opened by `open` and not yet closed.
        unsafe { key_type(self.key) as isize == raw::REDISMODULE_KEYTYPE_ZSET }
    }

    /// The number of fields of a hash, the length of a string (`RedisModule_ValueLength`; 0 for
    /// an empty key).
    pub fn field_count(&self) -> usize {
        if self.key.is_null() {
            return 0;
        }
        let value_length = api!(RedisModule_ValueLength);
        // SAFETY: `self.key` is a non-null open key.
        unsafe { value_length(self.key) }
    }

    /// A hash field's value, binary-safe. `None` when the field (or the key) does not exist.
    /// Call only when `kind()` is `Hash` or `Empty`.
    pub fn hash_get(&self, field: &RedisString) -> Option<OwnedString> {
        if self.key.is_null() {
            return None;
        }
        let hash_get = api!(RedisModule_HashGet);
        super::work::add(1);
        let mut value: *mut raw::RedisModuleString = ptr::null_mut();
        // SAFETY: the key is open and is a hash or empty (the caller checked its kind). The
        // variadic arguments are one (field, out-pointer) pair ended by NULL, as HashGet expects
        // with REDISMODULE_HASH_NONE; `field` is a live string and `value` a local out-pointer
        // that receives a new string (ours to free) or NULL.
        unsafe {
            hash_get(
                self.key,
                raw::REDISMODULE_HASH_NONE as c_int,
                field.inner,
                &mut value as *mut *mut raw::RedisModuleString,
                ptr::null_mut::<c_void>(),
            );
        }
        NonNull::new(value).map(|ptr| OwnedString { ctx: self.ctx, ptr })
    }

    /// Sets a hash field, creating the hash when the key is empty. The key must be writable.
    pub fn hash_set(&self, field: &RedisString, value: &RedisString) {
        self.hash_write(field, value.inner);
    }

    /// Deletes a hash field (nothing when it is not there). The key must be writable.
    pub fn hash_delete(&self, field: &RedisString) {
        // REDISMODULE_HASH_DELETE: the pointer value 1, as redismodule.h defines it, which
        // HashSet reads as "delete this field" and never dereferences.
        self.hash_write(field, ptr::without_provenance_mut::<raw::RedisModuleString>(1));
    }

    /// One `HashSet` of `field` to `value` (a live string, or REDISMODULE_HASH_DELETE).
    fn hash_write(&self, field: &RedisString, value: *mut raw::RedisModuleString) {
        if self.key.is_null() {
            return;
        }
        let hash_set = api!(RedisModule_HashSet);
        // SAFETY: the key is open for writing and is a hash or empty; the variadic arguments are
        // one (field, value) pair ended by NULL, `field` a live string and `value` a live string
        // (HashSet copies what it keeps) or REDISMODULE_HASH_DELETE, never dereferenced.
        unsafe {
            hash_set(
                self.key,
                raw::REDISMODULE_HASH_NONE as c_int,
                field.inner,
                value,
                ptr::null_mut::<c_void>(),
            );
        }
    }

    /// Every field of a hash with its value, binary-safe, sorted by field (`RedisModule_ScanKey`;
    /// a field a scan returns twice is kept once). Empty for an empty key.
    pub fn hash_fields(&self) -> Vec<(Vec<u8>, Vec<u8>)> {
        // No hash holds more than `usize::MAX` bytes: the whole of it fits.
        let mut unbounded = usize::MAX;
        self.hash_fields_within(&mut unbounded).unwrap_or_default()
    }

    /// [`Self::hash_fields`] while their bytes (fields and values) fit `budget`, taken off it;
    /// `None` when they do not (a foreign writer's huge fields are never copied whole).
    pub fn hash_fields_within(&self, budget: &mut usize) -> Option<Vec<(Vec<u8>, Vec<u8>)>> {
        let mut fields = Vec::new();
        let mut over = false;
        self.for_each_field(&mut |field, value| {
            let size = field.len().saturating_add(value.len());
            if over || size > *budget {
                over = true;
                return;
            }
            *budget -= size;
            fields.push((field.to_vec(), value.to_vec()));
        });
        if over {
            return None;
        }
        fields.sort();
        fields.dedup_by(|a, b| a.0 == b.0);
        Some(fields)
    }

    /// Calls `f` with each field of a hash and its value, as Redis lends them (nothing is
    /// copied; a field a scan returns twice is seen twice), in the hash's order. Nothing for an
    /// empty key. `f` must not touch the keyspace; a panic in it is caught and ends nothing
    /// else (the scan goes on).
    pub fn for_each_field(&self, f: &mut dyn FnMut(&[u8], &[u8])) {
        if self.key.is_null() {
            return;
        }
        let (create, scan, destroy) = (
            api!(RedisModule_ScanCursorCreate),
            api!(RedisModule_ScanKey),
            api!(RedisModule_ScanCursorDestroy),
        );
        let mut f = f;
        // SAFETY: the key is an open hash; the cursor is created, used and destroyed here;
        // `privdata` points at `f` (a `&mut dyn FnMut`), alive and not otherwise used during
        // the scan, and the callback only calls it with the strings it is lent for the call.
        unsafe {
            let cursor = create();
            let privdata = (&mut f as *mut &mut dyn FnMut(&[u8], &[u8])).cast::<c_void>();
            while scan(self.key, cursor, Some(lend_field), privdata) != 0 {}
            destroy(cursor);
        }
    }

    /// Like [`Self::for_each_field`], but one step of the scan only: returns whether that step
    /// was the whole of it. It is for a listpack-encoded hash (Redis lends every field of a
    /// listpack in one step, in the listpack's order, each once); a hash table takes several
    /// steps (one bucket a step), and then `f` saw only some fields and the caller must ignore
    /// them. False for an empty key.
    pub fn fields_in_one_step(&self, f: &mut dyn FnMut(&[u8], &[u8])) -> bool {
        if self.key.is_null() {
            return false;
        }
        let (create, scan, destroy) = (
            api!(RedisModule_ScanCursorCreate),
            api!(RedisModule_ScanKey),
            api!(RedisModule_ScanCursorDestroy),
        );
        let mut f = f;
        // SAFETY: as in `for_each_field`: the cursor is created, used once and destroyed here;
        // `privdata` points at `f`, alive and not otherwise used during the call.
        unsafe {
            let cursor = create();
            let privdata = (&mut f as *mut &mut dyn FnMut(&[u8], &[u8])).cast::<c_void>();
            let more = scan(self.key, cursor, Some(lend_field), privdata) != 0;
            destroy(cursor);
            !more
        }
    }

    /// A string key's value (a copy). Call only when `kind()` is `String`.
    pub fn string_value(&self) -> Vec<u8> {
        if self.key.is_null() {
            return Vec::new();
        }
        let dma = api!(RedisModule_StringDMA);
        let mut len: usize = 0;
        // SAFETY: the key is open and holds a string (the caller checked its kind); READ access
        // returns a pointer to `len` bytes that stay valid until the key is modified or closed,
        // and they are copied out before either.
        unsafe {
            let data = dma(self.key, &mut len, raw::REDISMODULE_READ as c_int);
            if data.is_null() {
                return Vec::new();
            }
            std::slice::from_raw_parts(data.cast::<u8>(), len).to_vec()
        }
    }

    /// Sets a string value (replacing what the key held). The key must be writable.
    pub fn string_set(&self, value: &RedisString) {
        if self.key.is_null() {
            return;
        }
        let set = api!(RedisModule_StringSet);
        // SAFETY: the key is open for writing; StringSet copies the live string it is given.
        unsafe { set(self.key, value.inner) };
    }

    /// Deletes the key. The key must be writable.
    pub fn delete(&self) {
        if self.key.is_null() {
            return;
        }
        let delete = api!(RedisModule_DeleteKey);
        // SAFETY: `self.key` is a non-null key opened for writing.
        unsafe { delete(self.key) };
    }

    /// The remaining lease in ms; -1 when the key has no expiry (or does not exist).
    pub fn pttl(&self) -> i64 {
        if self.key.is_null() {
            return -1;
        }
        let get_expire = api!(RedisModule_GetExpire);
        // SAFETY: `self.key` is a non-null open key.
        unsafe { get_expire(self.key) }
    }

    /// The key's expiry as an absolute Unix ms deadline, exactly as stored; -1 when it has none
    /// (or does not exist). `RedisModule_GetAbsExpire` (6.2.2+) reads it as stored; without it,
    /// the remaining time plus one reading of the clock.
    pub fn expire_at(&self) -> i64 {
        // Redis 8.2's RedisModule_GetAbsExpire reads the value of an empty key (a crash): it is
        // asked only of a key that holds one.
        if self.kind() == KeyKind::Empty {
            return -1;
        }
        if let Some(get_abs) = optional_api!(RedisModule_GetAbsExpire) {
            // SAFETY: `self.key` is a non-null open key holding a value (checked above).
            return unsafe { get_abs(self.key) };
        }
        match self.pttl() {
            -1 => -1,
            pttl => now_ms().saturating_add(pttl),
        }
    }

    /// The length of a string value (0 for an empty key): read before copying a value whose
    /// size a foreign writer chose.
    pub fn string_len(&self) -> usize {
        self.field_count()
    }

    /// Sets the key to expire at `deadline_ms` (Unix ms), exactly: the value replicated as
    /// `PEXPIREAT` must be the one stored here. A deadline already past expires the key at once.
    ///
    /// `RedisModule_SetAbsExpire` (6.2.2+) stores it as given. Without it, `SetExpire` takes a
    /// relative time and adds its own reading of the clock, so the clock is read around the
    /// call: when it did not move, the stored deadline is exact.
    pub fn set_expire_at(&self, deadline_ms: i64) {
        if self.key.is_null() {
            return;
        }
        if let Some(set_abs) = optional_api!(RedisModule_SetAbsExpire) {
            // SAFETY: `self.key` is a non-null key opened for writing that holds a value; the
            // deadline is a non-negative Unix time (never REDISMODULE_NO_EXPIRE).
            unsafe { set_abs(self.key, deadline_ms.max(0)) };
            return;
        }
        let set_expire = api!(RedisModule_SetExpire);
        for _ in 0..4 {
            let before = now_ms();
            // Never -1 (REDISMODULE_NO_EXPIRE would remove the expiry).
            let relative = deadline_ms.saturating_sub(before).max(0);
            // SAFETY: `self.key` is a non-null key opened for writing that holds a value.
            unsafe { set_expire(self.key, relative) };
            if now_ms() == before {
                return;
            }
        }
    }
}

/// A key a caller has open already (lent) or one opened for the occasion (closed when this is
/// dropped).
pub enum KeyRef<'a> {
    Lent(&'a Key),
    Opened(Key),
}

impl KeyRef<'_> {
    /// `lent` when there is one, else the key `name` opened (`writable`).
    pub fn lent_or_open<'a>(
        lent: Option<&'a Key>,
        ctx: &Context,
        name: &RedisString,
        writable: bool,
    ) -> KeyRef<'a> {
        lent.map_or_else(|| KeyRef::Opened(Key::open(ctx, name, writable)), KeyRef::Lent)
    }
}

impl std::ops::Deref for KeyRef<'_> {
    type Target = Key;

    fn deref(&self) -> &Key {
        match self {
            Self::Lent(key) => key,
            Self::Opened(key) => key,
        }
    }
}

impl Drop for Key {
    fn drop(&mut self) {
        if self.key.is_null() {
            return;
        }
        let close = api!(RedisModule_CloseKey);
        // SAFETY: `self.key` was opened by `open` and is closed exactly once, here.
        unsafe { close(self.key) };
    }
}

/// A string returned by Redis that we own (from `HashGet`); freed on drop.
pub struct OwnedString {
    ctx: *mut raw::RedisModuleCtx,
    ptr: NonNull<raw::RedisModuleString>,
}

impl OwnedString {
    /// The string's bytes.
    pub fn as_bytes(&self) -> &[u8] {
        let ptr_len = api!(RedisModule_StringPtrLen);
        let mut len: usize = 0;
        // SAFETY: `self.ptr` is a live string we own; the returned buffer lives as long as it,
        // which the borrow of `self` enforces.
        unsafe {
            let data = ptr_len(self.ptr.as_ptr(), &mut len);
            std::slice::from_raw_parts(data.cast::<u8>(), len)
        }
    }
}

impl Drop for OwnedString {
    fn drop(&mut self) {
        let free = api!(RedisModule_FreeString);
        // SAFETY: HashGet gave us one reference to this string (automatic memory is not enabled
        // on our contexts), released exactly once, here, with the context it was made with.
        unsafe { free(self.ctx, self.ptr.as_ptr()) };
    }
}

/// `ScanKey`'s callback for [`Key::for_each_field`].
unsafe extern "C" fn lend_field(
    _key: *mut raw::RedisModuleKey,
    field: *mut raw::RedisModuleString,
    value: *mut raw::RedisModuleString,
    privdata: *mut c_void,
) {
    // SAFETY: `privdata` is the `&mut dyn FnMut` `for_each_field` passed, alive and not
    // otherwise borrowed during the scan.
    let f = unsafe { &mut *privdata.cast::<&mut dyn FnMut(&[u8], &[u8])>() };
    super::work::add(1);
    // SAFETY: both are NULL or strings lent for this call, which the slices do not outlive.
    let (field, value) = unsafe { (lent_slice(field), lent_slice(value)) };
    // No unwinding across the FFI boundary.
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(field, value)));
}

/// The bytes of a string Redis lends for the duration of a call, borrowed.
///
/// # Safety
/// `s` is NULL or a live `RedisModuleString`, alive for `'a`.
pub(super) unsafe fn lent_slice<'a>(s: *mut raw::RedisModuleString) -> &'a [u8] {
    if s.is_null() {
        return &[];
    }
    let ptr_len = api!(RedisModule_StringPtrLen);
    let mut len: usize = 0;
    // SAFETY: `s` is live for `'a` (the caller's contract); StringPtrLen returns its `len` bytes.
    unsafe { std::slice::from_raw_parts(ptr_len(s, &mut len).cast::<u8>(), len) }
}
