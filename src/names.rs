//! The keys and channels a lock derives from its name, built as Redisson builds them (plain Rust,
//! so unit tests drive it without a server).
//!
//! Redisson's rule (`prefixName`): `prefix + ":" + name` when the name contains `{` (it carries
//! its own hash tag, which must stay the first one), else `prefix + ":{" + name + "}"`. With that
//! rule every derived name hashes to the lock's own cluster slot, except for names whose braces
//! do not form a hash tag of their own (a `{` with no `}` after it, `{}`, a `}` with no `{`):
//! [`same_slot`] tells those apart, and in cluster mode the commands refuse to derive keys for
//! them rather than write into another slot.

use crate::cluster::key_slot;

/// Redisson's unlock channel: `redisson_lock__channel:{<name>}`.
pub const CHANNEL: &[u8] = b"redisson_lock__channel";
/// Redisson's RFencedLock token counter: `redisson_lock_token:{<name>}`.
pub const TOKEN: &[u8] = b"redisson_lock_token";
/// Redisson's unlock latch (idempotent release): `redisson_unlock_latch:{<name>}:<request id>`.
pub const LATCH: &[u8] = b"redisson_unlock_latch";
/// rlock's request record (exact cancellation): `rlock_request:{<name>}:<request id>`.
pub const REQUEST: &[u8] = b"rlock_request";
/// Redisson's read-write lock channel: `redisson_rwlock:{<name>}` (`0` read, `1` write unlock).
pub const RW_CHANNEL: &[u8] = b"redisson_rwlock";
/// Redisson's semaphore channel: `redisson_sc:{<name>}` (the available count after a change).
pub const SEM_CHANNEL: &[u8] = b"redisson_sc";
/// The channel prefix of a count-down latch (`RCountDownLatch`), braces written literally.
pub const LATCH_CHANNEL: &[u8] = b"redisson_countdownlatch__channel__";
/// The hash field of a read-write lock's mode (`read` or `write`).
pub const MODE_FIELD: &[u8] = b"mode";
/// What a write hold's field adds to its owner: `<owner>:write`.
pub const WRITE_SUFFIX: &[u8] = b":write";
/// What sits between an owner and a read hold's index in the hold's key name.
pub const HOLD_INFIX: &[u8] = b":rwlock_timeout:";

/// `prefix:{name}`, or `prefix:name` when `name` contains `{` (Redisson's `prefixName`).
#[must_use]
pub fn prefixed(prefix: &[u8], name: &[u8]) -> Vec<u8> {
    let braced = name.contains(&b'{');
    let mut out = Vec::with_capacity(prefix.len() + name.len() + 3);
    out.extend_from_slice(prefix);
    out.push(b':');
    if !braced {
        out.push(b'{');
    }
    out.extend_from_slice(name);
    if !braced {
        out.push(b'}');
    }
    out
}

/// The unlock channel of the lock `name`.
#[must_use]
pub fn channel(name: &[u8]) -> Vec<u8> {
    prefixed(CHANNEL, name)
}

/// The fencing-token counter of the lock `name`.
#[must_use]
pub fn token(name: &[u8]) -> Vec<u8> {
    prefixed(TOKEN, name)
}

/// The unlock latch of release request `id` on the lock `name`.
#[must_use]
pub fn latch(name: &[u8], id: &[u8]) -> Vec<u8> {
    let mut out = prefixed(LATCH, name);
    out.push(b':');
    out.extend_from_slice(id);
    out
}

/// The request record of acquire request `id` on the lock `name` (Redisson's prefix rule, as
/// the latch: the same slot as the lock).
#[must_use]
pub fn request(name: &[u8], id: &[u8]) -> Vec<u8> {
    let mut out = prefixed(REQUEST, name);
    out.push(b':');
    out.extend_from_slice(id);
    out
}

/// `{name}:suffix`, or `name:suffix` when `name` contains `{` (Redisson's `suffixName`).
#[must_use]
pub fn suffixed(name: &[u8], suffix: &[u8]) -> Vec<u8> {
    let braced = name.contains(&b'{');
    let mut out = Vec::with_capacity(name.len() + suffix.len() + 3);
    if !braced {
        out.push(b'{');
    }
    out.extend_from_slice(name);
    if !braced {
        out.push(b'}');
    }
    out.push(b':');
    out.extend_from_slice(suffix);
    out
}

/// The read-write lock channel of the lock `name`.
#[must_use]
pub fn rw_channel(name: &[u8]) -> Vec<u8> {
    prefixed(RW_CHANNEL, name)
}

/// The semaphore channel of the semaphore `name`.
#[must_use]
pub fn sem_channel(name: &[u8]) -> Vec<u8> {
    prefixed(SEM_CHANNEL, name)
}

/// The channel of the count-down latch `name`: `redisson_countdownlatch__channel__{name}`,
/// braces written literally whatever the name holds (Redisson's, not its prefixName rule: a
/// name with braces nests them, and the channel may then hash to another cluster slot).
#[must_use]
pub fn latch_channel(name: &[u8]) -> Vec<u8> {
    [LATCH_CHANNEL, b"{", name, b"}"].concat()
}

/// The hash field of `owner`'s write hold: `<owner>:write`.
#[must_use]
pub fn write_field(owner: &[u8]) -> Vec<u8> {
    [owner, WRITE_SUFFIX].concat()
}

/// The names whose `suffix` key (by [`suffixed`]) is `key`, Redisson's plain form first: at most
/// two (`{a}:s` is both `a`'s and `{a}`'s), none when `key` is no such key.
#[must_use]
pub fn unsuffixed(key: &[u8], suffix: &[u8]) -> Vec<Vec<u8>> {
    let Some(stem) = key.strip_suffix(suffix).and_then(|k| k.strip_suffix(b":")) else {
        return Vec::new();
    };
    let inner = stem.strip_prefix(b"{").and_then(|s| s.strip_suffix(b"}"));
    [inner, Some(stem)]
        .into_iter()
        .flatten()
        .filter(|name| suffixed(name, suffix) == key)
        .map(<[u8]>::to_vec)
        .collect()
}

/// The key of `owner`'s read hold number `index` (1-based) on the read-write lock `name`:
/// `{name}:<owner>:rwlock_timeout:<index>` (Redisson's per-hold lease key).
#[must_use]
pub fn read_hold(name: &[u8], owner: &[u8], index: u64) -> Vec<u8> {
    let index = index.to_string();
    suffixed(name, &[owner, HOLD_INFIX, index.as_bytes()].concat())
}

/// Whether `derived` lives in the same cluster hash slot as the lock `name`.
#[must_use]
pub fn same_slot(name: &[u8], derived: &[u8]) -> bool {
    key_slot(name) == key_slot(derived)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_names_are_wrapped_in_a_hash_tag() {
        assert_eq!(token(b"job"), b"redisson_lock_token:{job}");
        assert_eq!(channel(b"job"), b"redisson_lock__channel:{job}");
        assert_eq!(latch(b"job", b"r1"), b"redisson_unlock_latch:{job}:r1");
        assert_eq!(request(b"job", b"r1"), b"rlock_request:{job}:r1");
        assert_eq!(request(b"a{7}b", b"r1"), b"rlock_request:a{7}b:r1");
    }

    #[test]
    fn braced_names_keep_their_own_tag() {
        assert_eq!(token(b"{user1}:lock"), b"redisson_lock_token:{user1}:lock");
        assert_eq!(channel(b"orders{42}"), b"redisson_lock__channel:orders{42}");
        for name in [&b"{user1}:lock"[..], b"orders{42}", b"x", b"{a}{b}"] {
            assert!(same_slot(name, &token(name)), "{name:?}");
            assert!(same_slot(name, &latch(name, b"{id}")), "{name:?}");
            assert!(same_slot(name, &request(name, b"{id}")), "{name:?}");
        }
    }

    #[test]
    fn read_write_names_follow_redissons_rules() {
        assert_eq!(rw_channel(b"orders"), b"redisson_rwlock:{orders}");
        assert_eq!(rw_channel(b"app{7}:orders"), b"redisson_rwlock:app{7}:orders");
        assert_eq!(suffixed(b"orders", b"timeout"), b"{orders}:timeout");
        assert_eq!(suffixed(b"app{7}:orders", b"timeout"), b"app{7}:orders:timeout");
        let back = |key: &[u8]| unsuffixed(key, b"timeout");
        // `{orders}` is a name too (with braces, only `:timeout` is added).
        assert_eq!(back(b"{orders}:timeout"), vec![b"orders".to_vec(), b"{orders}".to_vec()]);
        assert_eq!(back(b"app{7}:orders:timeout"), vec![b"app{7}:orders".to_vec()]);
        assert_eq!(back(b"{a}:timeout"), vec![b"a".to_vec(), b"{a}".to_vec()]);
        for other in [&b"orders:timeout"[..], b"{orders}:timeouts", b"timeout", b"{a{b}:timeout"] {
            let names = back(other);
            assert!(names.iter().all(|n| suffixed(n, b"timeout") == other), "{other:?}");
        }
        assert!(back(b"orders:timeout").is_empty() && back(b"{orders}:timeouts").is_empty());
        assert_eq!(read_hold(b"orders", b"c1:7", 2), b"{orders}:c1:7:rwlock_timeout:2");
        assert_eq!(read_hold(b"a{7}", b"c1:7", 1), b"a{7}:c1:7:rwlock_timeout:1");
        assert_eq!(write_field(b"c1:7"), b"c1:7:write");
        for name in [&b"orders"[..], b"app{7}:orders", b"{x}"] {
            assert!(same_slot(name, &read_hold(name, b"o:{1}", 3)), "{name:?}");
        }
    }

    #[test]
    fn names_whose_braces_form_no_tag_are_told_apart() {
        for name in [&b"a}b"[..], b"a{b", b"a{}b", b"}{"] {
            assert!(!same_slot(name, &token(name)), "{name:?}");
            assert!(!same_slot(name, &request(name, b"r")), "{name:?}");
        }
    }
}
