//! The docs cannot drift: README.md and docs/*.md checked against a real server with the module.
//!
//! - `docs/commands.md`'s generated blocks (`<!-- BEGIN generated: NAME -->` ...
//!   `<!-- END generated -->`) must equal what `COMMAND DOCS` and `COMMAND INFO` render now
//!   (`rlock_tests_integration::docs::render`), and every command of `COMMAND LIST FILTERBY
//!   MODULE rlock` must have exactly one block (and no block may name another command). With
//!   `RLOCK_UPDATE_DOCS=1` (`make docs`) the blocks are rewritten instead, and a missing one is
//!   appended at the end of the page; the hand-written text around them is kept.
//! - Every ```` ```redis-cli ```` transcript is replayed with redis-cli on a fresh database, in
//!   page order, and compared line by line (the rules for values that vary are in
//!   `rlock_tests_integration::transcript`).
//! - Every ```` ```rust ```` block is the exact text of a file of `client/examples/`, and every
//!   such file is shown somewhere; each example then runs against real servers (as many as it
//!   needs: one, a master with a replica and a Sentinel, three independent ones).
//! - The ```` ```toml ```` Cargo lines of `docs/clients.md`, pasted into a new package with an
//!   example as its `main.rs`, build it (`cargo check --offline`, in `target/docs-check`).
//! - The ```` ```lua ```` fencing script of `docs/safety.md` refuses a stale token.
//!
//! The Python blocks are run by `python/tests/test_readme.py` (`make test-python`).

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use redis::Value;
use rlock_tests_integration::docs::{
    self, blocks, diff, fenced, module_commands, pages, render, root,
};
use rlock_tests_integration::transcript::{parse, replay};
use rlock_tests_integration::{cmd, poll, wait_replica_online, Sentinel, Server};

#[test]
fn the_command_reference_matches_the_module() {
    let server = Server::start();
    // A command whose info Redis refused (a key spec it rejects) shows no syntax to document.
    assert!(!server.log().contains("refused the command info"), "{}", server.log());
    let mut con = server.conn_resp3();
    let path = root().join("docs/commands.md");
    let page = std::fs::read_to_string(&path).expect("docs/commands.md");
    let commands = module_commands(&mut con);
    let found = blocks(&page);
    let mut problems = Vec::new();
    let mut seen = BTreeSet::new();
    let (mut updated, mut from) = (String::new(), 0);
    for (name, start, end) in &found {
        if !seen.insert(name.clone()) {
            problems.push(format!("{name} has two generated blocks"));
        }
        updated.push_str(&page[from..*start]);
        if commands.contains(name) {
            let want = render(&mut con, name);
            if page[*start..*end] != want {
                problems.push(format!(
                    "{name}'s block differs (- page, + module):\n{}",
                    diff(&page[*start..*end], &want)
                ));
            }
            updated.push_str(&want);
        } else {
            problems.push(format!("a block names {name}, which the module does not have"));
            updated.push_str(&page[*start..*end]);
        }
        from = *end;
    }
    updated.push_str(&page[from..]);
    for name in commands.iter().filter(|n| !seen.contains(*n)) {
        problems.push(format!("{name} has no generated block"));
        let block = render(&mut con, name);
        updated.push_str(&format!(
            "\n### {name}\n\n{}{name} -->\n{block}{}\n",
            docs::BEGIN,
            docs::END
        ));
    }
    if std::env::var_os("RLOCK_UPDATE_DOCS").is_some() {
        if updated != page {
            std::fs::write(&path, &updated).expect("write docs/commands.md");
            eprintln!("rewrote docs/commands.md:\n{}", problems.join("\n"));
        }
        let unknown: Vec<&String> =
            problems.iter().filter(|p| p.contains("does not have")).collect();
        assert!(unknown.is_empty(), "remove these blocks by hand: {unknown:?}");
    } else {
        assert!(
            problems.is_empty(),
            "docs/commands.md has drifted; `make docs` rewrites it:\n\n{}",
            problems.join("\n\n")
        );
    }
}

/// Replays `pages`' transcripts against 127.0.0.1:`port`, each on a fresh database (FLUSHALL);
/// how many there were, and the failures.
fn replay_transcripts(port: u16, pages: &[(String, String)]) -> (usize, Vec<String>) {
    let mut count = 0;
    let mut failures = Vec::new();
    for (page, text) in pages {
        for (fence, block) in fenced(text, "redis-cli") {
            count += 1;
            let flush = Command::new(rlock_tests_integration::cli_binary())
                .args(["-h", "127.0.0.1", "-p", &port.to_string(), "FLUSHALL"])
                .output();
            if !flush.is_ok_and(|o| o.status.success() && o.stdout.starts_with(b"OK")) {
                failures.push(format!("{page}:{fence}: FLUSHALL before the transcript failed"));
                continue;
            }
            let steps = match parse(&block, fence) {
                Ok(steps) if !steps.is_empty() => steps,
                Ok(_) => {
                    failures.push(format!("{page}:{fence}: a transcript without a command"));
                    continue;
                }
                Err(e) => {
                    failures.push(format!("{page}:{e}"));
                    continue;
                }
            };
            if let Err(e) = replay(port, page, &steps) {
                failures.push(e);
            }
        }
    }
    (count, failures)
}

#[test]
fn every_redis_cli_transcript_replays() {
    let server = Server::start();
    let (count, failures) = replay_transcripts(server.port(), &pages());
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    assert!(count >= 4, "only {count} transcripts found");
}

/// README.md's tour against the server `make run` started, on 127.0.0.1:`RLOCK_TOUR_PORT`
/// (packaging/run-test.sh, `make run-test`; it FLUSHALLs that server).
#[test]
#[ignore = "needs `make run` going: make run-test"]
fn the_readme_tour_replays_on_make_run() {
    let port = std::env::var("RLOCK_TOUR_PORT").expect("RLOCK_TOUR_PORT");
    let port: u16 = port.parse().expect("RLOCK_TOUR_PORT is a port");
    let readme: Vec<_> = pages().into_iter().filter(|(page, _)| page == "README.md").collect();
    let (count, failures) = replay_transcripts(port, &readme);
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    assert!(count >= 3, "only {count} transcripts in README.md");
}

fn example_files() -> Vec<(String, String)> {
    let mut files: Vec<(String, String)> = std::fs::read_dir(root().join("client/examples"))
        .expect("client/examples")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "rs"))
        .map(|p| {
            let name = p.file_stem().expect("stem").to_string_lossy().into_owned();
            (name, std::fs::read_to_string(&p).expect("read example"))
        })
        .collect();
    files.sort();
    files
}

#[test]
fn every_rust_block_is_an_example_file_and_every_example_is_shown() {
    let examples = example_files();
    let mut shown = BTreeSet::new();
    let mut failures = Vec::new();
    for (page, text) in pages() {
        for (fence, block) in fenced(&text, "rust") {
            match examples.iter().find(|(_, code)| *code == block) {
                Some((name, _)) => {
                    shown.insert(name.clone());
                }
                None => failures.push(format!(
                    "{page}:{fence}: a rust block that is no file of client/examples/"
                )),
            }
        }
    }
    for (name, _) in &examples {
        if !shown.contains(name) {
            failures.push(format!("client/examples/{name}.rs is shown on no page"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Builds the client's examples (cargo, as `cargo test` of the client would) and returns the
/// path of `name`'s binary.
fn example(name: &str) -> PathBuf {
    let out = Command::new(env!("CARGO"))
        .current_dir(root())
        .args(["build", "-p", "rlock-client", "--examples", "--message-format=json"])
        .output()
        .expect("cargo build --examples");
    assert!(
        out.status.success(),
        "cargo build --examples:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let tail = format!("/examples/{name}\"");
    let line =
        stdout.lines().find(|l| l.contains(&tail)).unwrap_or_else(|| panic!("no example {name}"));
    let start = line.find("\"executable\":\"").expect("executable") + "\"executable\":\"".len();
    PathBuf::from(&line[start..line[start..].find('"').expect("end") + start])
}

/// Runs an example with `env`; it must succeed within 60 s.
fn run_example(name: &str, env: &[(&str, String)]) -> String {
    let path = example(name);
    let mut child = Command::new(&path);
    child.envs(env.iter().map(|(k, v)| (k, v)));
    let out = child.output().expect("run the example");
    assert!(
        out.status.success(),
        "example {name} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Nothing held and no permit taken once an example is done (a lock or read-write lock hash,
/// a leased-permit zset).
fn assert_nothing_held(server: &Server) {
    let mut con = server.conn();
    let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut con).expect("KEYS");
    for key in keys {
        let kind: String = redis::cmd("TYPE").arg(&key).query(&mut con).expect("TYPE");
        let empty = match kind.as_str() {
            "hash" => false,
            "zset" => cmd(&mut con, &["ZCARD", &key]) == Value::Int(0),
            _ => true,
        };
        assert!(empty, "{key} ({kind}) is still held");
    }
}

#[test]
fn the_single_server_examples_run() {
    let server = Server::start();
    for name in ["quickstart", "rw_lock", "semaphores", "session", "latch"] {
        run_example(name, &[("REDIS_URL", server.url())]);
        assert_nothing_held(&server);
    }
    let mut con = server.conn();
    assert_eq!(cmd(&mut con, &["GET", "db-connections"]), Value::BulkString(b"10".to_vec()));
    assert_eq!(cmd(&mut con, &["EXISTS", "workers-ready"]), Value::Int(0), "the latch opened");
}

#[test]
fn the_replica_examples_run() {
    let master = Server::start();
    let replica = Server::builder().replica_of(&master).start();
    wait_replica_online(&master);
    let mut con = master.conn();
    poll("the replica to acknowledge a write", Duration::from_secs(20), || {
        let _ = cmd(&mut con, &["INCR", "probe"]);
        (cmd(&mut con, &["WAIT", "1", "100"]) == Value::Int(1)).then_some(())
    });
    run_example("replica_ack", &[("REDIS_URL", master.url())]);
    let sentinel = Sentinel::start(&master, 1, 5000);
    poll("the sentinel to see the replica", Duration::from_secs(20), || {
        let mut con = redis::Client::open(sentinel.url()).ok()?.get_connection().ok()?;
        let replicas: Vec<Value> =
            redis::cmd("SENTINEL").arg("REPLICAS").arg("mymaster").query(&mut con).ok()?;
        (!replicas.is_empty()).then_some(())
    });
    let out = run_example("sentinel", &[("SENTINEL_URLS", sentinel.url())]);
    assert!(out.starts_with("token Some("), "{out}");
    assert_nothing_held(&master);
    drop(replica);
}

#[test]
fn the_multilock_and_redlock_example_runs() {
    let servers = [Server::start(), Server::start(), Server::start()];
    let urls: Vec<String> = servers.iter().map(Server::url).collect();
    run_example("multi_redlock", &[("REDIS_URLS", urls.join(","))]);
    for server in &servers {
        assert_nothing_held(server);
    }
}

/// A new package with the ```` ```toml ```` lines of a page as its dependencies (the path made
/// absolute) and every example as its own example: `cargo check --offline --examples`.
#[test]
fn the_cargo_lines_of_the_docs_build_the_examples() {
    let client = root().join("client").canonicalize().expect("client/");
    let mut checked = 0;
    for (page, text) in pages() {
        for (fence, block) in fenced(&text, "toml") {
            assert!(
                block.contains("rlock-client = { path = \"../rlock/client\" }"),
                "{page}:{fence}: {block}"
            );
            let deps = block
                .replace("\"../rlock/client\"", &format!("{:?}", client.display().to_string()));
            let dir = tempfile::tempdir().expect("temp dir");
            let manifest = format!(
                "[package]\nname = \"docs-check\"\nversion = \"0.0.0\"\nedition = \"2021\"\npublish = false\n\n[workspace]\n\n{deps}"
            );
            std::fs::write(dir.path().join("Cargo.toml"), manifest).expect("Cargo.toml");
            std::fs::copy(root().join("Cargo.lock"), dir.path().join("Cargo.lock"))
                .expect("Cargo.lock");
            std::fs::create_dir_all(dir.path().join("src")).expect("src/");
            std::fs::write(dir.path().join("src/lib.rs"), "").expect("lib.rs");
            let examples = dir.path().join("examples");
            std::fs::create_dir_all(&examples).expect("examples/");
            for (name, code) in example_files() {
                std::fs::write(examples.join(format!("{name}.rs")), code).expect("example");
            }
            let out = Command::new(env!("CARGO"))
                .current_dir(dir.path())
                .env("CARGO_TARGET_DIR", root().join("target/docs-check"))
                .args(["check", "--offline", "--examples", "--quiet"])
                .output()
                .expect("cargo check");
            assert!(
                out.status.success(),
                "{page}:{fence}: the examples do not build with these Cargo lines:\n{block}\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
            checked += 1;
        }
    }
    assert!(checked >= 2, "only {checked} Cargo blocks");
}

#[test]
fn the_fencing_script_of_safety_md_refuses_a_stale_token() {
    let page = std::fs::read_to_string(root().join("docs/safety.md")).expect("docs/safety.md");
    let scripts = fenced(&page, "lua");
    assert_eq!(scripts.len(), 1, "one Lua block in docs/safety.md");
    let server = Server::start();
    let mut con = server.conn();
    let mut write = |token: &str, value: &str| -> i64 {
        redis::cmd("EVAL")
            .arg(&scripts[0].1)
            .arg(1)
            .arg("resource")
            .arg(token)
            .arg(value)
            .query(&mut con)
            .expect("EVAL")
    };
    assert_eq!(write("5", "a"), 1);
    assert_eq!(write("7", "b"), 1);
    assert_eq!(write("6", "stale"), 0, "an older token is refused");
    assert_eq!(write("7", "c"), 1, "the same token may write again");
    let mut con = server.conn();
    assert_eq!(cmd(&mut con, &["HGET", "resource", "value"]), Value::BulkString(b"c".to_vec()));
}

#[test]
fn every_info_field_and_setting_is_documented() {
    let page =
        std::fs::read_to_string(root().join("docs/configuration.md")).expect("configuration.md");
    let server = Server::start();
    let mut con = server.conn();
    let info: String = redis::cmd("INFO").arg("rlock").query(&mut con).expect("INFO rlock");
    let mut missing: Vec<String> = info
        .lines()
        .filter_map(|l| l.split_once(':').map(|(field, _)| field.to_owned()))
        .filter(|field| !page.contains(&format!("| `{field}` |")))
        .collect();
    let settings: Vec<String> =
        redis::cmd("CONFIG").arg("GET").arg("rlock.*").query(&mut con).expect("CONFIG GET");
    assert!(settings.len() >= 6, "{settings:?}");
    for pair in settings.chunks(2) {
        let row = format!("| `{}` | `{}`", pair[0], pair[1]);
        if !page.contains(&row) {
            missing.push(format!("{} (default {})", pair[0], pair[1]));
        }
    }
    assert!(missing.is_empty(), "docs/configuration.md does not document: {missing:?}");
}

#[test]
fn every_relative_link_and_anchor_resolves() {
    let mut pages = pages();
    let python =
        std::fs::read_to_string(root().join("python/README.md")).expect("python/README.md");
    pages.push(("python/README.md".to_owned(), python));
    let broken = docs::broken_links(&pages);
    assert!(broken.is_empty(), "{}", broken.join("\n"));
}

#[test]
fn the_syntax_line_renders_one_of_and_repeated_arguments() {
    // RSEM.RELEASE's two forms as one argument: `permits`, or `ID id [id ...]`.
    let map = |pairs: Vec<(&str, Value)>| {
        Value::Map(pairs.into_iter().map(|(k, v)| (Value::BulkString(k.into()), v)).collect())
    };
    let text = |s: &str| Value::BulkString(s.into());
    let args = Value::Array(vec![
        map(vec![("name", text("key")), ("type", text("key"))]),
        map(vec![
            ("name", text("release")),
            ("type", text("oneof")),
            (
                "arguments",
                Value::Array(vec![
                    map(vec![("name", text("permits")), ("type", text("integer"))]),
                    map(vec![
                        ("name", text("id")),
                        ("type", text("string")),
                        ("token", text("ID")),
                        ("flags", Value::Array(vec![text("multiple")])),
                    ]),
                ]),
            ),
        ]),
        map(vec![
            ("name", text("x")),
            ("type", text("string")),
            ("flags", Value::Array(vec![text("optional")])),
        ]),
    ]);
    assert_eq!(docs::syntax_of(&args), "key <permits | ID id [id ...]> [x]");
}

/// A lease shown on a page may differ from the replay's by the time that passed, not by any
/// amount: a reply of 1999 where the page says 1000 (a count, a wait that did not wait) is an
/// error, as is an integer far above the page's.
#[test]
fn a_transcript_number_matches_only_within_the_time_that_passed() {
    use rlock_tests_integration::transcript::matches;
    assert!(matches("(integer) 29995", "(integer) 29995", 0));
    assert!(matches("(integer) 29995", "(integer) 29990", 5), "5 ms later");
    assert!(matches("(integer) 29995", "(integer) 29999", 5), "a faster replay");
    assert!(matches("12) (integer) 29996", "12) (integer) 29960", 40));
    assert!(matches("(integer) 28990", "(integer) 28700", 1300), "a slow machine");
    assert!(!matches("(integer) 1000", "(integer) 1999", 100), "a wrong count");
    assert!(!matches("(integer) 1999", "(integer) 1000", 100), "a wrong count");
    assert!(!matches("(integer) 29497", "(integer) 29997", 600), "a WAIT 500 that did not wait");
    assert!(!matches("(integer) 28990", "(integer) 28100", 100), "a lease far shorter");
    assert!(!matches("12) (integer) 29996", "11) (integer) 29996", 0));
    assert!(!matches("(integer) 999", "(integer) 998", 100), "below 1000: exact");
}

/// Every fenced block of every page (README.md, docs/*.md, python/README.md) opens at the
/// start of its line with an info string the tests run or know to be prose: a ```` ```rs ````,
/// ```` ```rust,no_run ````, ```` ```py ```` or an indented fence would escape every check.
#[test]
fn no_example_escapes_the_checks_by_its_fence() {
    let mut pages = pages();
    let python =
        std::fs::read_to_string(root().join("python/README.md")).expect("python/README.md");
    pages.push(("python/README.md".to_owned(), python));
    let odd = docs::unchecked_fences(&pages);
    assert!(odd.is_empty(), "fences no test runs or knows:\n{}", odd.join("\n"));
    let mut scratch = "text\n```rs\nfn main() {}\n```\n  ```rust\nx\n  ```\n".to_owned();
    scratch.push_str("```python3\nprint()\n```\n~~~rust\nx\n~~~\n```rust,no_run\nx\n```\n");
    let found = docs::unchecked_fences(&[("docs/scratch.md".to_owned(), scratch)]);
    for line in [2, 5, 8, 11, 14] {
        let at = format!("docs/scratch.md:{line}: ");
        assert!(found.iter().any(|f| f.starts_with(&at)), "line {line} not found: {found:?}");
    }
    let inline = "```` ```rs ```` is inline code, no fence\n".to_owned();
    assert!(docs::unchecked_fences(&[("docs/x.md".to_owned(), inline)]).is_empty());
    let elsewhere = docs::unchecked_fences(&[(
        "python/README.md".to_owned(),
        "```rust
```
"
        .to_owned(),
    )]);
    assert_eq!(elsewhere.len(), 1, "a rust block on a page tests/docs.rs does not read");
}
