//! Reading the server's `INFO` sections (`RedisModule_GetServerInfo`), and which optional APIs
//! this server provides.

use std::ffi::{c_int, CStr};
use std::ptr::NonNull;

use redis_module::{raw, Context};

/// One section of the server's `INFO`, read once and freed on drop.
pub(crate) struct ServerInfo<'a> {
    ctx: &'a Context,
    data: NonNull<raw::RedisModuleServerInfoData>,
}

impl<'a> ServerInfo<'a> {
    /// `section` of `INFO`; `None` if the server cannot give it.
    pub(crate) fn read(ctx: &'a Context, section: &CStr) -> Option<Self> {
        let get = optional_api!(RedisModule_GetServerInfo)?;
        // SAFETY: live context and a NUL-terminated section name; the data is freed once, in
        // Drop, with the same context.
        let data = unsafe { get(ctx.get_raw(), section.as_ptr()) };
        Some(Self { ctx, data: NonNull::new(data)? })
    }

    /// An integer field; `None` if missing or not an integer.
    pub(crate) fn signed(&self, field: &CStr) -> Option<i64> {
        let get = optional_api!(RedisModule_ServerInfoGetFieldSigned)?;
        let mut err: c_int = 0;
        // SAFETY: the info data is alive (owned by self); the name is NUL-terminated.
        let value = unsafe { get(self.data.as_ptr(), field.as_ptr(), &mut err) };
        (err == 0).then_some(value)
    }

    /// A field's text, copied; `None` if missing.
    pub(crate) fn text(&self, field: &CStr) -> Option<Vec<u8>> {
        let get = optional_api!(RedisModule_ServerInfoGetFieldC)?;
        // SAFETY: the info data is alive (owned by self); the name is NUL-terminated; the
        // returned C string lives as long as the data and is copied before it is freed.
        unsafe {
            let value = get(self.data.as_ptr(), field.as_ptr());
            (!value.is_null()).then(|| CStr::from_ptr(value).to_bytes().to_vec())
        }
    }
}

impl Drop for ServerInfo<'_> {
    fn drop(&mut self) {
        if let Some(free) = optional_api!(RedisModule_FreeServerInfo) {
            // SAFETY: data from GetServerInfo with this context, freed exactly once.
            unsafe { free(self.ctx.get_raw(), self.data.as_ptr()) };
        }
    }
}

/// The `slave<i>` lines of `INFO replication` (`ip=...,port=...,state=online,offset=...,lag=0`),
/// one per attached replica, whatever its state; `None` if the section cannot be read.
pub fn replica_lines(ctx: &Context) -> Option<Vec<Vec<u8>>> {
    let info = ServerInfo::read(ctx, c"replication")?;
    let count = info.signed(c"connected_slaves")?;
    let lines = (0..count.max(0))
        .filter_map(|i| info.text(&std::ffi::CString::new(format!("slave{i}")).ok()?))
        .collect();
    Some(lines)
}

/// Whether this server has accepted a client connection since it started (`INFO stats`'s
/// `total_connections_received`): a module loaded at start-up runs before any, one loaded by
/// `MODULE LOAD` after; `None` if the section cannot be read.
pub fn has_served_clients(ctx: &Context) -> Option<bool> {
    let info = ServerInfo::read(ctx, c"stats")?;
    Some(info.signed(c"total_connections_received")? > 0)
}

/// What `INFO server` says this server is (read at load).
#[derive(Debug, Clone, Default)]
pub struct ServerText {
    /// `valkey_version`, on Valkey.
    pub valkey_version: Option<String>,
    /// `redis_version` (Valkey reports a Redis version too, for compatibility).
    pub redis_version: Option<String>,
    /// Whether the server offers `RedisModule_SetAbsExpire`.
    pub abs_expire: bool,
    /// Whether the server offers `RedisModule_ClusterKeySlot`.
    pub key_slot_api: bool,
}

/// Reads [`ServerText`].
pub fn server_text(ctx: &Context) -> ServerText {
    let info = ServerInfo::read(ctx, c"server");
    let text = |field: &CStr| {
        let value = info.as_ref()?.text(field)?;
        Some(String::from_utf8_lossy(&value).into_owned())
    };
    ServerText {
        valkey_version: text(c"valkey_version"),
        redis_version: text(c"redis_version"),
        abs_expire: optional_api!(RedisModule_SetAbsExpire).is_some(),
        key_slot_api: optional_api!(RedisModule_ClusterKeySlot).is_some(),
    }
}
