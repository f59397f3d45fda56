//! Which server the module runs in, and the optional capabilities it uses there, as plain Rust.
//!
//! Read once at load ([`detect`], from `INFO server` and the APIs present): the module is built against
//! one `redismodule.h` but runs on Redis 7.0 to 8.x and Valkey 8 to 9, whose optional APIs and
//! server events differ (the same event id 19 is Valkey 9's atomic slot migration and Redis
//! 8.4's slot trim). `INFO rlock_server` and a log line at load say what is active.

use std::sync::OnceLock;

/// The server family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flavor {
    Redis,
    Valkey,
}

/// The server's version, from `INFO server` (`valkey_version`, else `redis_version`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Version {
    pub major: u32,
    pub minor: u32,
    pub patch: u32,
}

impl Version {
    /// Parses `8.2.3` (missing parts are 0; anything else is `None`).
    #[must_use]
    pub fn parse(text: &str) -> Option<Self> {
        let mut parts = text.trim().split('.').map(str::parse::<u32>);
        let major = parts.next()?.ok()?;
        let minor = parts.next().transpose().ok()?.unwrap_or(0);
        let patch = parts.next().transpose().ok()?.unwrap_or(0);
        Some(Self { major, minor, patch })
    }

    const fn at_least(self, major: u32, minor: u32) -> bool {
        self.major > major || (self.major == major && self.minor >= minor)
    }
}

pub use crate::raw::events::SlotMigrationEvents;

/// What the module found at load.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Server {
    pub flavor: Flavor,
    pub version: Option<Version>,
    /// `RedisModule_SetAbsExpire` (6.2.2+): absolute deadlines stored as given.
    pub abs_expire: bool,
    /// `RedisModule_ClusterKeySlot` (7.4+, Valkey 8+): the server computes key slots.
    pub key_slot_api: bool,
}

impl Server {
    /// The slot migration events to subscribe to on this server.
    #[must_use]
    pub fn slot_migration_events(&self) -> Option<SlotMigrationEvents> {
        let version = self.version?;
        match self.flavor {
            Flavor::Valkey if version.at_least(9, 0) => Some(SlotMigrationEvents::Valkey),
            Flavor::Redis if version.at_least(8, 4) => Some(SlotMigrationEvents::Redis),
            _ => None,
        }
    }

    /// Whether the server has `WAITAOF` (Redis 7.2+, every Valkey).
    #[must_use]
    pub fn has_waitaof(&self) -> bool {
        match (self.flavor, self.version) {
            (Flavor::Valkey, _) => true,
            (Flavor::Redis, Some(v)) => v.at_least(7, 2),
            (Flavor::Redis, None) => false,
        }
    }

    /// The capabilities in use, comma-separated, for `INFO` and the load log line.
    #[must_use]
    pub fn capabilities(&self) -> String {
        let mut list = Vec::new();
        if self.abs_expire {
            list.push("abs_expire");
        }
        if self.key_slot_api {
            list.push("cluster_key_slot");
        }
        match self.slot_migration_events() {
            Some(SlotMigrationEvents::Valkey) => list.push("atomic_slot_migration_valkey"),
            Some(SlotMigrationEvents::Redis) => list.push("atomic_slot_migration_redis"),
            None => {}
        }
        if self.has_waitaof() {
            list.push("waitaof");
        }
        list.join(",")
    }

    /// `valkey 9.1.2`, `redis 7.0.15`.
    #[must_use]
    pub fn describe(&self) -> String {
        let name = match self.flavor {
            Flavor::Redis => "redis",
            Flavor::Valkey => "valkey",
        };
        match self.version {
            Some(v) => format!("{name} {}.{}.{}", v.major, v.minor, v.patch),
            None => format!("{name} (version unknown)"),
        }
    }
}

/// What this server is and which optional APIs it provides (at load).
pub fn detect(ctx: &redis_module::Context) -> Server {
    Server::from_text(&crate::raw::info::server_text(ctx))
}

impl Server {
    /// The server described by `INFO server` and the APIs present.
    #[must_use]
    pub fn from_text(text: &crate::raw::info::ServerText) -> Self {
        let (flavor, version) = match &text.valkey_version {
            Some(v) => (Flavor::Valkey, Some(v)),
            None => (Flavor::Redis, text.redis_version.as_ref()),
        };
        Self {
            flavor,
            version: version.and_then(|v| Version::parse(v)),
            abs_expire: text.abs_expire,
            key_slot_api: text.key_slot_api,
        }
    }
}

static SERVER: OnceLock<Server> = OnceLock::new();

/// Records what was found at load (the first load wins: a module is loaded once per process).
pub fn set(server: Server) {
    let _ = SERVER.set(server);
}

/// What was found at load, if it was recorded.
#[must_use]
pub fn get() -> Option<&'static Server> {
    SERVER.get()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server(flavor: Flavor, version: &str) -> Server {
        Server { flavor, version: Version::parse(version), abs_expire: true, key_slot_api: false }
    }

    #[test]
    fn versions_parse() {
        assert_eq!(Version::parse("9.1.2"), Some(Version { major: 9, minor: 1, patch: 2 }));
        assert_eq!(Version::parse("8"), Some(Version { major: 8, minor: 0, patch: 0 }));
        assert_eq!(Version::parse("x.1"), None);
        assert_eq!(Version::parse("7.x"), None);
    }

    #[test]
    fn slot_migration_events_by_server() {
        assert_eq!(
            server(Flavor::Valkey, "9.0.0").slot_migration_events(),
            Some(SlotMigrationEvents::Valkey)
        );
        assert_eq!(server(Flavor::Valkey, "8.1.8").slot_migration_events(), None);
        assert_eq!(
            server(Flavor::Redis, "8.4.0").slot_migration_events(),
            Some(SlotMigrationEvents::Redis)
        );
        assert_eq!(server(Flavor::Redis, "8.2.3").slot_migration_events(), None);
        assert_eq!(server(Flavor::Redis, "7.0.15").capabilities(), "abs_expire");
        assert_eq!(
            server(Flavor::Valkey, "9.1.2").capabilities(),
            "abs_expire,atomic_slot_migration_valkey,waitaof"
        );
    }
}
