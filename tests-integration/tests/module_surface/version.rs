//! The version and commit a loaded module reports, and its load log.

use redis::{Connection, Value};
use rlock_tests_integration::{cmd, Server};

use super::{field, text};

/// A text field of an `INFO` section.
fn info_text(con: &mut Connection, section: &str, name: &str) -> String {
    let info: String = redis::cmd("INFO").arg(section).query(con).expect("INFO");
    info.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':').map(str::to_owned))
        .unwrap_or_else(|| panic!("INFO {section} has no field {name}:\n{info}"))
}

// ---- version and commit -------------------------------------------------------------------------

/// The version Cargo gives the workspace, encoded as `MODULE LIST` should show it.
fn encoded_cargo_version() -> i64 {
    let parts: Vec<i64> =
        env!("CARGO_PKG_VERSION").split(['.', '-']).take(3).map(|p| p.parse().unwrap()).collect();
    parts[0] * 10_000 + parts[1] * 100 + parts[2]
}

#[test]
fn module_list_shows_the_cargo_version() {
    let server = Server::start();
    let mut con = server.conn();
    let modules = cmd(&mut con, &["MODULE", "LIST"]);
    let Value::Array(modules) = modules else { panic!("MODULE LIST: {modules:?}") };
    let rlock = modules
        .iter()
        .find(|m| field(m, "name").is_some_and(|n| text(&n) == "rlock"))
        .expect("rlock in MODULE LIST");
    assert_eq!(field(rlock, "ver"), Some(Value::Int(encoded_cargo_version())), "{rlock:?}");
}

/// What a commit field may say: 12 hex digits (with `-dirty` when the tree had changes),
/// `unknown` outside git, or a packager's `RLOCK_GIT_SHA`.
fn plausible_commit(sha: &str) -> bool {
    let hex = sha.strip_suffix("-dirty").unwrap_or(sha);
    let from_git = hex.len() == 12 && hex.bytes().all(|b| b.is_ascii_hexdigit());
    from_git
        || sha == "unknown"
        || (!sha.is_empty()
            && sha.len() <= 64
            && sha.bytes().all(|b| b.is_ascii_alphanumeric() || b"._+-".contains(&b)))
}

#[test]
fn info_and_the_load_log_name_the_version_and_the_commit() {
    let server = Server::start();
    let mut con = server.conn();
    let version = info_text(&mut con, "rlock", "rlock_version");
    assert_eq!(version, env!("CARGO_PKG_VERSION"));
    let sha = info_text(&mut con, "rlock", "rlock_git_sha");
    assert!(plausible_commit(&sha), "rlock_git_sha: {sha:?}");
    // Built here, from this git checkout, without an override: the commit must be known.
    let in_git = std::process::Command::new("git")
        .args(["-C", env!("CARGO_MANIFEST_DIR"), "rev-parse", "HEAD"])
        .output()
        .is_ok_and(|o| o.status.success());
    if in_git && std::env::var_os("RLOCK_MODULE").is_none() {
        assert_ne!(sha, "unknown", "built in a git checkout");
    }
    // The section that names the server names the module too.
    assert_eq!(info_text(&mut con, "rlock_server", "rlock_version"), version);
    let log = server.log();
    let line = log
        .lines()
        .find(|l| l.contains("<rlock>") && l.contains("running on"))
        .unwrap_or_else(|| panic!("no load line:\n{log}"));
    assert!(line.contains(&format!("rlock {version} (commit {sha})")), "{line}");
}

// ---- the load log -------------------------------------------------------------------------------

#[test]
fn the_load_log_has_no_defrag_warning() {
    let server = Server::start();
    let mut con = server.conn();
    cmd(&mut con, &["PING"]);
    let log = server.log();
    assert!(log.contains("<rlock>"), "the module logged nothing:\n{log}");
    assert!(!log.contains("defrag"), "{log}");
    // And no other warning of the module's own at load (`#` marks a warning line).
    for line in log.lines().filter(|l| l.contains("<rlock>")) {
        assert!(!line.contains(" # "), "a warning at load: {line}");
    }
}
