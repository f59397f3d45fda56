//! Names the commit the module is built from, for `INFO rlock` and the load log line
//! (`RLOCK_BUILD_COMMIT`, read by `src/version.rs`): `RLOCK_GIT_SHA` when set (a packager's
//! choice), else git's `HEAD` (12 hex digits, `-dirty` when tracked files had uncommitted
//! changes), else `unknown` (no git, or a tree that is not its own git checkout: a release
//! tarball unpacked inside another repository). Never fails for want of git.

use std::path::{Path, PathBuf};
use std::process::Command;

#[path = "src/build_commit.rs"]
mod build_commit;

fn main() {
    println!("cargo:rerun-if-env-changed=RLOCK_GIT_SHA");
    // The dirty mark follows the sources this crate is built from.
    for input in ["build.rs", "Cargo.toml", "src"] {
        println!("cargo:rerun-if-changed={input}");
    }
    let commit = match std::env::var("RLOCK_GIT_SHA") {
        Ok(value) if !value.is_empty() => match build_commit::check_override(&value) {
            Ok(value) => value.to_owned(),
            Err(message) => panic!("{message}"),
        },
        _ => from_git(),
    };
    println!("cargo:rustc-env=RLOCK_BUILD_COMMIT={commit}");
}

/// Runs git in the crate's directory; its trimmed output when it succeeds.
fn git(dir: &Path, args: &[&str]) -> Option<String> {
    let output = Command::new("git")
        .arg("-C")
        .arg(dir)
        .arg("--no-optional-locks") // `status` must not rewrite the index (a rebuild each time)
        .args(args)
        .output()
        .ok()?;
    output.status.success().then(|| String::from_utf8_lossy(&output.stdout).trim().to_owned())
}

fn from_git() -> String {
    let Some(dir) = std::env::var_os("CARGO_MANIFEST_DIR").map(PathBuf::from) else {
        return build_commit::UNKNOWN.to_owned();
    };
    // Only this tree's own checkout: not a repository it was unpacked in.
    let own = git(&dir, &["rev-parse", "--show-toplevel"]).is_some_and(|top| {
        let canonical = |p: &Path| p.canonicalize().ok();
        canonical(Path::new(&top)).is_some_and(|top| Some(top) == canonical(&dir))
    });
    if !own {
        return build_commit::UNKNOWN.to_owned();
    }
    // Built again when HEAD moves (a commit, a checkout) or the index changes (a stage).
    let mut watched = vec!["HEAD".to_owned(), "index".to_owned(), "packed-refs".to_owned()];
    watched.extend(git(&dir, &["rev-parse", "--symbolic-full-name", "HEAD"]));
    for name in &watched {
        if let Some(path) = git(&dir, &["rev-parse", "--git-path", name]) {
            let path = dir.join(path);
            // A missing path would rerun this script on every build.
            if path.is_file() {
                println!("cargo:rerun-if-changed={}", path.display());
            }
        }
    }
    let head = git(&dir, &["rev-parse", "--verify", "HEAD"]);
    let dirty = git(&dir, &["status", "--porcelain", "--untracked-files=no"])
        .is_some_and(|changes| !changes.is_empty());
    build_commit::from_git(head.as_deref(), dirty)
}
