//! What a server holds, read with plain commands on Redisson's layout (docs/commands.md): a
//! lock's hash (`owner -> count`) and its expiry; a read-write lock's hash (`mode`, `<owner>`
//! for reads, `<owner>:write`) and each read hold's lease key; leased permits' zset of ids
//! scored by the end of their lease; a semaphore's available count; a latch's count.

use std::collections::BTreeMap;

use redis::{Connection, Value};

/// A lease in ms as `PTTL` gives it: `None` for a missing key, `i64::MAX` for no expiry.
fn lease(pttl: i64) -> Option<i64> {
    match pttl {
        -2 => None,
        -1 => Some(i64::MAX),
        ms => Some(ms),
    }
}

/// A hash's fields and counts, and the key's remaining lease (`None`: no key).
#[derive(Debug, Clone, Default)]
pub struct HashState {
    pub fields: BTreeMap<String, i64>,
    pub lease_ms: Option<i64>,
}

impl HashState {
    /// The count of `field` (0 when absent).
    #[must_use]
    pub fn count(&self, field: &str) -> i64 {
        self.fields.get(field).copied().unwrap_or(0)
    }
}

/// The lock (or read-write lock) hash at `key`.
///
/// # Panics
/// When the server does not answer.
#[must_use]
pub fn hash(con: &mut Connection, key: &str) -> HashState {
    let (pairs, pttl): (Vec<(String, String)>, i64) =
        redis::pipe().hgetall(key).pttl(key).query(con).expect("HGETALL, PTTL");
    let fields = pairs.into_iter().map(|(f, v)| (f, v.parse().unwrap_or(-1))).collect();
    HashState { fields, lease_ms: lease(pttl) }
}

/// The remaining leases of `owner`'s read holds of the read-write lock `key` (its
/// `{key}:<owner>:rwlock_timeout:<i>` keys), longest first.
///
/// # Panics
/// When the server does not answer.
#[must_use]
pub fn read_leases(con: &mut Connection, key: &str, owner: &str) -> Vec<i64> {
    let pattern = format!("{{{key}}}:{owner}:rwlock_timeout:*");
    let keys: Vec<String> = redis::cmd("KEYS").arg(&pattern).query(con).expect("KEYS");
    let mut leases: Vec<i64> = keys
        .iter()
        .filter_map(|k| lease(redis::cmd("PTTL").arg(k).query(con).expect("PTTL")))
        .collect();
    leases.sort_unstable_by(|a, b| b.cmp(a));
    leases
}

/// The leased permits of the semaphore `key`: each id's remaining lease in ms (by the
/// server's clock), and the semaphore's `available` and `leased` counts (`RSEM.INFO`).
#[derive(Debug, Clone, Default)]
pub struct Permits {
    pub leases: BTreeMap<Vec<u8>, i64>,
    pub available: i64,
    pub leased: i64,
}

/// Reads [`Permits`] of `key` (its zset `{key}:timeout`).
///
/// # Panics
/// When the server does not answer.
#[must_use]
pub fn permits(con: &mut Connection, key: &str) -> Permits {
    let zset = format!("{{{key}}}:timeout");
    type Replies = (Vec<i64>, Vec<(Vec<u8>, f64)>, Value);
    let (time, scores, info): Replies = redis::pipe()
        .cmd("TIME")
        .zrange_withscores(&zset, 0, -1)
        .cmd("RSEM.INFO")
        .arg(key)
        .query(con)
        .expect("TIME, ZRANGE, RSEM.INFO");
    let now = time[0] * 1000 + time[1] / 1000;
    let fields: Vec<(String, i64)> = match info {
        Value::Nil => Vec::new(),
        info => redis::from_redis_value(info).expect("RSEM.INFO"),
    };
    let get = |f: &str| fields.iter().find(|(k, _)| k == f).map_or(0, |(_, v)| *v);
    Permits {
        leases: scores.into_iter().map(|(id, end)| (id, end as i64 - now)).collect(),
        available: get("available"),
        leased: get("leased"),
    }
}

/// `RSEM.AVAILABLE key`.
///
/// # Panics
/// When the server does not answer.
#[must_use]
pub fn available(con: &mut Connection, key: &str) -> i64 {
    redis::cmd("RSEM.AVAILABLE").arg(key).query(con).expect("RSEM.AVAILABLE")
}

/// Whether `key` exists.
///
/// # Panics
/// When the server does not answer.
#[must_use]
pub fn exists(con: &mut Connection, key: &str) -> bool {
    redis::cmd("EXISTS").arg(key).query::<i64>(con).expect("EXISTS") == 1
}
