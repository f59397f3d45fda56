//! The module's version and the commit it was built from, as `MODULE LIST`, `INFO rlock` and
//! the load log line show them.

/// The semantic version, Cargo's (`0.1.0`): `rlock_version` in `INFO rlock`.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The commit the module was built from (`build.rs`): 12 hex digits, `-dirty` when tracked
/// files had uncommitted changes, `unknown` outside git, or the packager's `RLOCK_GIT_SHA`.
pub const COMMIT: &str = env!("RLOCK_BUILD_COMMIT");

/// The version `MODULE LIST` shows: major × 10000 + minor × 100 + patch (RedisJSON's
/// convention), so 0.1.0 is 100 and 1.2.3 is 10203.
pub const MODULE_VERSION: i32 = encode(
    number(env!("CARGO_PKG_VERSION_MAJOR")),
    number(env!("CARGO_PKG_VERSION_MINOR")),
    number(env!("CARGO_PKG_VERSION_PATCH")),
);

/// A version part's decimal digits, at compile time (a part Cargo would not accept fails the
/// build, never the module).
const fn number(digits: &str) -> i32 {
    let bytes = digits.as_bytes();
    assert!(!bytes.is_empty() && bytes.len() <= 4, "a version part has 1 to 4 digits");
    let mut n = 0;
    let mut i = 0;
    while i < bytes.len() {
        assert!(bytes[i].is_ascii_digit(), "a version part is decimal digits");
        n = n * 10 + (bytes[i] - b'0') as i32;
        i += 1;
    }
    n
}

/// major × 10000 + minor × 100 + patch; minor and patch must stay below 100 for the number to
/// be read back.
#[must_use]
pub const fn encode(major: i32, minor: i32, patch: i32) -> i32 {
    assert!(minor < 100 && patch < 100, "minor and patch must be below 100");
    major * 10_000 + minor * 100 + patch
}

#[cfg(test)]
#[path = "build_commit.rs"]
mod build_commit;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_encode_as_redisjson_does() {
        assert_eq!(encode(0, 1, 0), 100);
        assert_eq!(encode(1, 2, 3), 10_203);
        assert_eq!(encode(2, 0, 99), 20_099);
        assert_eq!(number("0"), 0);
        assert_eq!(number("12"), 12);
    }

    #[test]
    fn the_module_version_is_cargos() {
        let parts: Vec<i32> =
            VERSION.split(['.', '-']).take(3).map(|p| p.parse().unwrap()).collect();
        assert_eq!(MODULE_VERSION, encode(parts[0], parts[1], parts[2]));
        assert!(!COMMIT.is_empty());
    }
}
