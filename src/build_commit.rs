//! The commit a build names (`INFO rlock`'s `rlock_git_sha`, the load log line): the rules,
//! shared by `build.rs` (which asks git) and the unit tests. Plain Rust, no crate imports: the
//! build script compiles this file on its own.

/// What the commit reads as when nobody can tell (a build outside git: a release tarball).
pub const UNKNOWN: &str = "unknown";

/// How many hex digits of the commit id are shown.
pub const SHORT: usize = 12;

/// The longest `RLOCK_GIT_SHA` a packager may set.
pub const MAX_OVERRIDE: usize = 64;

/// A packager's `RLOCK_GIT_SHA`: 1 to [`MAX_OVERRIDE`] characters out of ASCII letters, digits
/// and `._+-` (it becomes an `INFO` value and a log word: no spaces, no `:`, no line breaks).
///
/// # Errors
/// A message naming the variable when the value has another form.
pub fn check_override(value: &str) -> Result<&str, String> {
    let allowed = |b: u8| b.is_ascii_alphanumeric() || b"._+-".contains(&b);
    if value.is_empty() || value.len() > MAX_OVERRIDE || !value.bytes().all(allowed) {
        return Err(format!(
            "RLOCK_GIT_SHA must be 1 to {MAX_OVERRIDE} characters out of ASCII letters, digits \
             and ._+- (got {value:?})"
        ));
    }
    Ok(value)
}

/// The commit from git's answers: `head`, the full id of `HEAD` (`None`: git could not say),
/// shortened to [`SHORT`] hex digits, with `-dirty` when the work tree had changes; [`UNKNOWN`]
/// when `head` is not a commit id.
#[must_use]
pub fn from_git(head: Option<&str>, dirty: bool) -> String {
    let Some(head) = head.map(str::trim) else { return UNKNOWN.to_owned() };
    let is_id = (40..=64).contains(&head.len()) && head.bytes().all(|b| b.is_ascii_hexdigit());
    if !is_id {
        return UNKNOWN.to_owned();
    }
    let short = head[..SHORT].to_ascii_lowercase();
    if dirty {
        format!("{short}-dirty")
    } else {
        short
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_commit_is_twelve_hex_digits_and_dirty_when_the_tree_had_changes() {
        let id = "8d654ec1a2b3c4d5e6f708192a3b4c5d6e7f8091";
        assert_eq!(from_git(Some(id), false), "8d654ec1a2b3");
        assert_eq!(from_git(Some(&format!("{id}\n")), true), "8d654ec1a2b3-dirty");
        assert_eq!(from_git(Some(&id.to_ascii_uppercase()), false), "8d654ec1a2b3");
    }

    #[test]
    fn no_git_or_a_strange_answer_is_unknown() {
        assert_eq!(from_git(None, false), UNKNOWN);
        assert_eq!(from_git(None, true), UNKNOWN);
        assert_eq!(from_git(Some(""), false), UNKNOWN);
        assert_eq!(from_git(Some("HEAD"), false), UNKNOWN);
        assert_eq!(from_git(Some("8d654ec"), false), UNKNOWN);
        assert_eq!(from_git(Some(&"g".repeat(40)), false), UNKNOWN);
    }

    #[test]
    fn an_override_is_a_short_word() {
        assert_eq!(check_override("1.2.3-debian1"), Ok("1.2.3-debian1"));
        assert_eq!(check_override("8d654ec1a2b3"), Ok("8d654ec1a2b3"));
        for bad in ["", "a b", "a:b", "a\nb", "a\r", "é", &"a".repeat(MAX_OVERRIDE + 1)] {
            let err = check_override(bad).unwrap_err();
            assert!(err.starts_with("RLOCK_GIT_SHA must be"), "{bad:?}: {err}");
        }
    }
}
