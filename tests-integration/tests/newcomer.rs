//! What a newcomer trips over (issue 26 §3), and the version a loaded module reports (§2): the
//! version `MODULE LIST` shows, the version and commit in `INFO rlock` and the load log, a load
//! log without the redis-module crate's defrag warning, `COMMAND DOCS` that say what the parser
//! accepts and summaries that name what the replies hold, no timer left armed once the holds
//! are gone (so `MODULE UNLOAD` works), and number errors in Redis's terms that name only their
//! own argument.

use std::collections::BTreeSet;
use std::time::Duration;

use redis::{Connection, Value};
use rlock_tests_integration::{cmd, digest, info_field, poll, run_str, Server};

const LIMIT: Duration = Duration::from_secs(10);

/// Field/value pairs of a map reply (a flat array under RESP2, a map under RESP3).
fn pairs(value: &Value) -> Vec<(String, Value)> {
    match value {
        Value::Array(items) => items
            .chunks(2)
            .filter_map(|pair| match pair {
                [k, v] => Some((text(k), v.clone())),
                _ => None,
            })
            .collect(),
        Value::Map(items) => items.iter().map(|(k, v)| (text(k), v.clone())).collect(),
        other => panic!("not a map: {other:?}"),
    }
}

fn text(value: &Value) -> String {
    match value {
        Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        Value::SimpleString(s) => s.clone(),
        Value::Int(n) => n.to_string(),
        other => panic!("not text: {other:?}"),
    }
}

fn field(value: &Value, name: &str) -> Option<Value> {
    pairs(value).into_iter().find(|(k, _)| k == name).map(|(_, v)| v)
}

/// A text field of an `INFO` section.
fn info_text(con: &mut Connection, section: &str, name: &str) -> String {
    let info: String = redis::cmd("INFO").arg(section).query(con).expect("INFO");
    info.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':').map(str::to_owned))
        .unwrap_or_else(|| panic!("INFO {section} has no field {name}:\n{info}"))
}

// ---- 1, 2: version and commit --------------------------------------------------------------

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

// ---- 7: the load log ------------------------------------------------------------------------

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

// ---- 3: COMMAND DOCS against the parser -------------------------------------------------------

/// One argument as `COMMAND DOCS` describes it.
#[derive(Debug)]
struct Arg {
    name: String,
    kind: String,
    token: Option<String>,
    optional: bool,
    multiple: bool,
    subargs: Vec<Arg>,
}

fn parse_args(value: &Value) -> Vec<Arg> {
    let Value::Array(items) = value else { panic!("arguments: {value:?}") };
    items
        .iter()
        .map(|item| {
            let flags: Vec<String> = match field(item, "flags") {
                Some(Value::Array(f) | Value::Set(f)) => f.iter().map(text).collect(),
                _ => Vec::new(),
            };
            Arg {
                name: text(&field(item, "name").expect("name")),
                kind: text(&field(item, "type").expect("type")),
                token: field(item, "token").map(|t| text(&t)),
                optional: flags.iter().any(|f| f == "optional"),
                multiple: flags.iter().any(|f| f == "multiple"),
                subargs: field(item, "arguments").map(|a| parse_args(&a)).unwrap_or_default(),
            }
        })
        .collect()
}

/// The synopsis, as Redis's documentation renders arguments: `[...]` optional, `<a | b>` one of,
/// `id [id ...]` multiple.
fn render(arg: &Arg) -> String {
    let body = match arg.kind.as_str() {
        "oneof" => arg.subargs.iter().map(render).collect::<Vec<_>>().join(" | "),
        "block" => arg.subargs.iter().map(render).collect::<Vec<_>>().join(" "),
        "pure-token" => arg.token.clone().expect("a pure token has a token"),
        _ => arg.name.clone(),
    };
    let body = match (&arg.token, arg.kind.as_str()) {
        (Some(token), kind) if kind != "pure-token" => format!("{token} {body}"),
        _ => body,
    };
    let body = if arg.multiple { format!("{body} [{} ...]", arg.name) } else { body };
    match (arg.optional, arg.kind.as_str()) {
        (true, _) => format!("[{body}]"),
        (false, "oneof") => format!("<{body}>"),
        _ => body,
    }
}

/// What each command's parser accepts (`src/args`), in Redis's synopsis notation.
const SYNTAX: &[(&str, &str)] = &[
    ("rlock.acquire", "key owner lease-ms [WAIT timeout-ms] [TOKEN] [REQUEST id] [SESSION [LOCKDELAY lockdelay-ms]]"),
    ("rlock.release", "key owner [lease-ms] [REQUEST id]"),
    ("rlock.renew", "key owner lease-ms"),
    ("rlock.forcerelease", "key"),
    ("rlock.cancel", "key id"),
    ("rlock.pttl", "key"),
    ("rlock.info", "key"),
    ("rwlock.acquire", "key owner <READ | WRITE> lease-ms [WAIT timeout-ms] [TOKEN] [REQUEST id] [SESSION [LOCKDELAY lockdelay-ms]]"),
    ("rwlock.release", "key owner <READ | WRITE> [REQUEST id]"),
    ("rwlock.renew", "key owner lease-ms [READ | WRITE]"),
    ("rwlock.forcerelease", "key"),
    ("rwlock.info", "key"),
    ("rsem.setpermits", "key permits"),
    ("rsem.addpermits", "key delta"),
    ("rsem.acquire", "key permits [LEASE lease-ms [SESSION [LOCKDELAY lockdelay-ms]]] [WAIT timeout-ms] [REQUEST id]"),
    ("rsem.release", "key <permits | ID id [id ...]>"),
    ("rsem.renew", "key id lease-ms"),
    ("rsem.available", "key"),
    ("rsem.info", "key"),
    ("rlock.waiters", "key [COUNT count]"),
    ("rwlock.waiters", "key [COUNT count]"),
    ("rsem.waiters", "key [COUNT count]"),
];

/// A command's documentation: summary and arguments.
fn docs(con: &mut Connection, name: &str) -> (String, Vec<Arg>) {
    let reply = cmd(con, &["COMMAND", "DOCS", name]);
    let entry = field(&reply, name).unwrap_or_else(|| panic!("no docs for {name}: {reply:?}"));
    let summary = text(&field(&entry, "summary").expect("summary"));
    let args = field(&entry, "arguments").map(|a| parse_args(&a)).unwrap_or_default();
    (summary, args)
}

/// Every argument list the documented syntax allows, with a value for each argument (a fresh
/// key is put in at `key` by the caller): every optional argument left out and put in, each
/// alternative of a one-of, one and two values of a multiple.
fn expand(args: &[Arg]) -> Vec<Vec<String>> {
    let Some((first, rest)) = args.split_first() else { return vec![Vec::new()] };
    let mut heads: Vec<Vec<String>> = Vec::new();
    if first.optional {
        heads.push(Vec::new());
    }
    heads.extend(expand_one(first));
    let tails = expand(rest);
    let mut all = Vec::new();
    for head in &heads {
        for tail in &tails {
            all.push(head.iter().chain(tail).cloned().collect());
        }
    }
    all
}

fn expand_one(arg: &Arg) -> Vec<Vec<String>> {
    let values: Vec<Vec<String>> = match arg.kind.as_str() {
        "oneof" => arg.subargs.iter().flat_map(expand_one).collect(),
        "block" => expand(&arg.subargs),
        "pure-token" => vec![Vec::new()],
        kind => {
            let one = sample(kind, &arg.name);
            if arg.multiple {
                vec![vec![one.clone()], vec![one.clone(), format!("{one}2")]]
            } else {
                vec![vec![one]]
            }
        }
    };
    values.into_iter().map(|v| arg.token.iter().cloned().chain(v).collect()).collect()
}

/// A valid value for an argument, by its documented name.
fn sample(kind: &str, name: &str) -> String {
    match (kind, name) {
        ("key", _) => "KEY".to_owned(),
        ("integer", "lease-ms") => "10000".to_owned(),
        ("integer", "lockdelay-ms") => "100".to_owned(),
        // On a fresh key: granted at once, or a 1 ms wait.
        ("integer", "timeout-ms") => "1".to_owned(),
        ("integer", "permits" | "delta" | "count") => "1".to_owned(),
        ("string", "owner") => "o".to_owned(),
        ("string", "id") => "i".to_owned(),
        other => panic!("no sample value for {other:?}: add one"),
    }
}

#[test]
fn command_docs_show_the_syntax_the_parser_accepts() {
    let server = Server::start();
    let mut con = server.conn();
    let mut fresh = 0;
    for &(name, syntax) in SYNTAX {
        let (_, args) = docs(&mut con, name);
        let shown = args.iter().map(render).collect::<Vec<_>>().join(" ");
        assert_eq!(shown, syntax, "COMMAND DOCS {name}");
        // Every call the docs allow is accepted (not refused as syntax, arity or a bad value).
        let calls = expand(&args);
        assert!(!calls.is_empty(), "{name}");
        for call in calls {
            fresh += 1;
            let key = format!("docs:{fresh}");
            let argv: Vec<&str> = std::iter::once(name)
                .chain(call.iter().map(|a| if a == "KEY" { key.as_str() } else { a.as_str() }))
                .collect();
            let reply = run_str(&mut con, &argv);
            // The one rule the docs cannot show: TOKEN goes with WRITE only.
            if name == "rwlock.acquire" && argv.contains(&"READ") && argv.contains(&"TOKEN") {
                assert_eq!(reply, Err("ERR syntax error".to_owned()), "{argv:?}");
                continue;
            }
            assert!(reply.is_ok(), "{argv:?} (from COMMAND DOCS) refused: {reply:?}");
        }
    }
    // Every module command is in the table above.
    let listed: BTreeSet<String> =
        match cmd(&mut con, &["COMMAND", "LIST", "FILTERBY", "MODULE", "rlock"]) {
            Value::Array(names) => names.iter().map(text).collect(),
            other => panic!("COMMAND LIST: {other:?}"),
        };
    let table: BTreeSet<String> = SYNTAX.iter().map(|(n, _)| (*n).to_owned()).collect();
    assert_eq!(listed, table);
}

#[test]
fn rsem_release_documents_both_forms() {
    let server = Server::start();
    let mut con = server.conn();
    let (summary, args) = docs(&mut con, "rsem.release");
    let forms = args.iter().find(|a| a.kind == "oneof").expect("a one-of argument");
    let ids = forms.subargs.iter().find(|a| a.token.as_deref() == Some("ID")).expect("ID form");
    assert!(ids.multiple && ids.kind == "string", "{ids:?}");
    assert!(forms.subargs.iter().any(|a| a.name == "permits" && a.kind == "integer"), "{forms:?}");
    assert!(summary.contains("ID"), "{summary}");
}

/// The reply fields of the `*.INFO` commands, each named by its command's summary; and every
/// command that takes `TOKEN` says what its reply is then.
#[test]
fn command_summaries_name_what_the_replies_hold() {
    let server = Server::start();
    let mut con = server.conn();
    cmd(&mut con, &["RLOCK.ACQUIRE", "l", "o", "60000"]);
    cmd(&mut con, &["RWLOCK.ACQUIRE", "rw", "o", "READ", "60000"]);
    cmd(&mut con, &["RSEM.SETPERMITS", "s", "2"]);
    for (command, key) in [("rlock.info", "l"), ("rwlock.info", "rw"), ("rsem.info", "s")] {
        let reply = cmd(&mut con, &[command, key]);
        let (summary, _) = docs(&mut con, command);
        for (name, _) in pairs(&reply) {
            assert!(
                summary.split(|c: char| !c.is_ascii_alphanumeric() && c != '_').any(|w| w == name),
                "{command}: the summary does not name its reply field {name}: {summary}"
            );
        }
    }
    let (summary, _) = docs(&mut con, "rwlock.info");
    assert!(summary.contains("readers (how many"), "readers is a count: {summary}");
    for command in ["rlock.acquire", "rwlock.acquire"] {
        let (summary, _) = docs(&mut con, command);
        assert!(summary.contains("TOKEN"), "{command}: {summary}");
    }
}

// ---- 4: no timer outlives the holds ---------------------------------------------------------

fn unloadable_server() -> Server {
    Server::builder().config("enable-module-command", "yes").start()
}

fn timers(con: &mut Connection) -> i64 {
    info_field(con, "rlock", "rlock_timers_armed")
}

/// Idle: no timer armed (polled with a bound far below the 60 s leases), no check scheduled,
/// and the module unloads.
fn assert_idle_and_unload(con: &mut Connection) {
    poll("no module timer armed", LIMIT, || (timers(con) == 0).then_some(()));
    assert_eq!(info_field(con, "rlock", "rlock_scheduled_checks"), 0);
    assert_eq!(cmd(con, &["MODULE", "UNLOAD", "rlock"]), Value::Okay);
}

#[test]
fn releasing_the_last_read_hold_disarms_its_timer() {
    let server = unloadable_server();
    let mut con = server.conn();
    cmd(&mut con, &["RWLOCK.ACQUIRE", "rw", "a", "READ", "60000"]);
    cmd(&mut con, &["RWLOCK.ACQUIRE", "rw", "b", "READ", "60000"]);
    assert_eq!(timers(&mut con), 1, "a read hold is out: its end is looked at");
    assert_eq!(cmd(&mut con, &["RWLOCK.RELEASE", "rw", "a", "READ"]), Value::Int(0));
    assert_eq!(timers(&mut con), 1, "b still holds");
    assert_eq!(cmd(&mut con, &["RWLOCK.RELEASE", "rw", "b", "READ"]), Value::Int(1));
    assert_idle_and_unload(&mut con);
}

#[test]
fn a_force_release_disarms_the_read_holds_timer() {
    let server = unloadable_server();
    let mut con = server.conn();
    cmd(&mut con, &["RWLOCK.ACQUIRE", "rw", "a", "READ", "60000"]);
    assert_eq!(cmd(&mut con, &["RWLOCK.FORCERELEASE", "rw"]), Value::Int(1));
    assert_idle_and_unload(&mut con);
}

#[test]
fn rlock_forcerelease_of_a_read_write_lock_disarms_its_timer() {
    let server = unloadable_server();
    let mut con = server.conn();
    cmd(&mut con, &["RWLOCK.ACQUIRE", "rw", "a", "READ", "60000"]);
    assert_eq!(cmd(&mut con, &["RLOCK.FORCERELEASE", "rw"]), Value::Int(1));
    assert_idle_and_unload(&mut con);
}

#[test]
fn releasing_the_last_leased_permit_disarms_its_timer() {
    let server = unloadable_server();
    let mut con = server.conn();
    cmd(&mut con, &["RSEM.SETPERMITS", "s", "2"]);
    let ids: Vec<Vec<u8>> = redis::cmd("RSEM.ACQUIRE")
        .arg("s")
        .arg(2)
        .arg("LEASE")
        .arg(60_000)
        .query(&mut con)
        .expect("leased");
    assert_eq!(timers(&mut con), 1, "a lease is out: its end is looked at");
    let release = |con: &mut Connection, id: &[u8]| -> i64 {
        redis::cmd("RSEM.RELEASE").arg("s").arg("ID").arg(id).query(con).expect("release")
    };
    assert_eq!(release(&mut con, &ids[0]), 1);
    assert_eq!(timers(&mut con), 1, "one lease is still out");
    assert_eq!(release(&mut con, &ids[1]), 1);
    assert_idle_and_unload(&mut con);
}

#[test]
fn a_flushall_disarms_the_timers_of_read_holds_and_leases() {
    let server = unloadable_server();
    let mut con = server.conn();
    cmd(&mut con, &["RWLOCK.ACQUIRE", "rw", "a", "READ", "60000"]);
    cmd(&mut con, &["RSEM.SETPERMITS", "s", "1"]);
    cmd(&mut con, &["RSEM.ACQUIRE", "s", "1", "LEASE", "60000"]);
    assert_eq!(info_field(&mut con, "rlock", "rlock_scheduled_checks"), 2);
    cmd(&mut con, &["FLUSHALL"]);
    assert_idle_and_unload(&mut con);
}

#[test]
fn a_flushdb_of_the_swapped_database_disarms_its_timer() {
    let server = unloadable_server();
    let mut con = server.conn();
    cmd(&mut con, &["RWLOCK.ACQUIRE", "rw", "a", "READ", "60000"]);
    cmd(&mut con, &["SWAPDB", "0", "1"]);
    cmd(&mut con, &["FLUSHDB"]);
    assert_eq!(timers(&mut con), 1, "the hold lives on in database 1");
    cmd(&mut con, &["SELECT", "1"]);
    cmd(&mut con, &["FLUSHDB"]);
    assert_idle_and_unload(&mut con);
}

// ---- 5: number errors -----------------------------------------------------------------------

const MAX: &str = "9223372036854775807";

#[test]
fn integer_arguments_say_what_is_wrong_and_name_only_themselves() {
    let server = Server::start();
    let mut con = server.conn();
    let big = "99999999999999999999";
    let lease_range = format!("ERR lease-ms is out of range (1 to {MAX})");
    let timeout_range = format!("ERR timeout-ms is out of range (0 to {MAX})");
    let permits_range = format!("ERR permits is out of range (1 to {MAX})");
    let set_range = format!("ERR permits is out of range (0 to {MAX})");
    let delta_range = format!("ERR delta is out of range (-9223372036854775808 to {MAX})");
    let lease_positive = "ERR lease-ms must be positive";
    let lease_not_int = "ERR lease-ms is not an integer";
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["RLOCK.ACQUIRE", "L", "a", big], &lease_range),
        (vec!["RLOCK.ACQUIRE", "L", "a", "9223372036854775808"], &lease_range),
        (vec!["RLOCK.ACQUIRE", "L", "a", "0"], lease_positive),
        (vec!["RLOCK.ACQUIRE", "L", "a", "-5"], lease_positive),
        (vec!["RLOCK.ACQUIRE", "L", "a", "-99999999999999999999"], lease_positive),
        (vec!["RLOCK.ACQUIRE", "L", "a", "abc"], lease_not_int),
        (vec!["RLOCK.ACQUIRE", "L", "a", "1.5"], lease_not_int),
        (vec!["RLOCK.ACQUIRE", "L", "a", "010"], lease_not_int),
        (vec!["RLOCK.ACQUIRE", "L", "a", "+1"], lease_not_int),
        (vec!["RLOCK.ACQUIRE", "L", "a", "-0"], lease_not_int),
        (vec!["RLOCK.ACQUIRE", "L", "a", ""], lease_not_int),
        (vec!["RLOCK.RELEASE", "L", "a", "0"], lease_positive),
        (vec!["RLOCK.RENEW", "L", "a", big], &lease_range),
        (vec!["RWLOCK.ACQUIRE", "R", "a", "READ", "0"], lease_positive),
        (vec!["RWLOCK.RENEW", "R", "a", "x"], lease_not_int),
        (vec!["RSEM.ACQUIRE", "S", "1", "LEASE", "0"], lease_positive),
        (vec!["RSEM.ACQUIRE", "S", "1", "LEASE"], "ERR lease-ms is missing after LEASE"),
        (vec!["RSEM.RENEW", "S", "id", big], &lease_range),
        (
            vec!["RLOCK.ACQUIRE", "L", "a", "10", "WAIT", "-1"],
            "ERR timeout-ms must not be negative",
        ),
        (vec!["RLOCK.ACQUIRE", "L", "a", "10", "WAIT", "x"], "ERR timeout-ms is not an integer"),
        (vec!["RLOCK.ACQUIRE", "L", "a", "10", "WAIT", big], &timeout_range),
        (vec!["RLOCK.ACQUIRE", "L", "a", "10", "WAIT"], "ERR timeout-ms is missing after WAIT"),
        (
            vec!["RWLOCK.ACQUIRE", "R", "a", "WRITE", "10", "WAIT", "-1"],
            "ERR timeout-ms must not be negative",
        ),
        (vec!["RSEM.ACQUIRE", "S", "1", "WAIT", big], &timeout_range),
        (vec!["RSEM.ACQUIRE", "S", "0"], "ERR permits must be positive"),
        (vec!["RSEM.ACQUIRE", "S", "-1"], "ERR permits must be positive"),
        (vec!["RSEM.ACQUIRE", "S", "x"], "ERR permits is not an integer"),
        (vec!["RSEM.ACQUIRE", "S", big], &permits_range),
        (vec!["RSEM.RELEASE", "S", "0"], "ERR permits must be positive"),
        (vec!["RSEM.RELEASE", "S", big], &permits_range),
        (vec!["RSEM.SETPERMITS", "S", "-1"], "ERR permits must not be negative"),
        (vec!["RSEM.SETPERMITS", "S", big], &set_range),
        (vec!["RSEM.SETPERMITS", "S", "1.5"], "ERR permits is not an integer"),
        (vec!["RSEM.ADDPERMITS", "S", "1.5"], "ERR delta is not an integer"),
        (vec!["RSEM.ADDPERMITS", "S", big], &delta_range),
        (vec!["RSEM.ADDPERMITS", "S", "-99999999999999999999"], &delta_range),
        // Ids: each names the argument as the command's syntax does.
        (vec!["RLOCK.CANCEL", "L", ""], "ERR id must not be empty"),
        (vec!["RSEM.RENEW", "S", "", "10"], "ERR id must not be empty"),
        (vec!["RSEM.RELEASE", "S", "ID"], "ERR permit id is missing after ID"),
        (vec!["RSEM.RELEASE", "S", "ID", ""], "ERR permit id (after ID) must not be empty"),
        (
            vec!["RLOCK.ACQUIRE", "L", "a", "10", "REQUEST"],
            "ERR request id is missing after REQUEST",
        ),
        (
            vec!["RLOCK.ACQUIRE", "L", "a", "10", "REQUEST", ""],
            "ERR request id (after REQUEST) must not be empty",
        ),
    ];
    cmd(&mut con, &["SET", "unrelated", "1"]);
    let before = digest(&mut con);
    for (args, expected) in &cases {
        assert_eq!(run_str(&mut con, args), Err((*expected).to_owned()), "{args:?}");
    }
    assert_eq!(digest(&mut con), before, "an error changed something");
    // No error names another command (RSEM.ACQUIRE S 0 named RSEM.SETPERMITS).
    for (args, expected) in &cases {
        for other in ["RLOCK.", "RWLOCK.", "RSEM."] {
            assert!(!expected.contains(other), "{args:?}: {expected}");
        }
    }
}

// ---- 6: RWLOCK.INFO's readers ---------------------------------------------------------------

#[test]
fn rwlock_info_readers_counts_the_reader_owners() {
    let server = Server::start();
    let mut con = server.conn();
    for owner in ["a", "b", "b"] {
        cmd(&mut con, &["RWLOCK.ACQUIRE", "rw", owner, "READ", "60000"]);
    }
    let info = cmd(&mut con, &["RWLOCK.INFO", "rw"]);
    assert_eq!(field(&info, "readers"), Some(Value::Int(2)), "{info:?}");
    assert_eq!(field(&info, "read_holds"), Some(Value::Int(3)), "{info:?}");
}

// ---- 8: a newcomer's tour ---------------------------------------------------------------------

/// `RLOCK.INFO` on a read-write lock says what every other `RLOCK.*` command says there (it
/// said "not a reentrant lock (it needs exactly one owner field)", as for a foreign hash).
#[test]
fn rlock_info_on_a_read_write_lock_says_wrongtype_as_the_other_rlock_commands() {
    let server = Server::start();
    let mut con = server.conn();
    cmd(&mut con, &["RWLOCK.ACQUIRE", "rw", "a", "READ", "60000"]);
    let wrongtype = "WRONGTYPE the key holds a read-write lock, not a reentrant lock: use RWLOCK.*";
    for args in [&["RLOCK.RELEASE", "rw", "a"][..], &["RLOCK.INFO", "rw"]] {
        assert_eq!(run_str(&mut con, args), Err(wrongtype.to_owned()), "{args:?}");
    }
    // A hash that is no lock at all is still named as such.
    cmd(&mut con, &["HSET", "h", "a", "1", "b", "1"]);
    let err = run_str(&mut con, &["RLOCK.INFO", "h"]).unwrap_err();
    assert!(err.starts_with("ERR the key is a hash but not a reentrant lock"), "{err}");
}

/// `COMMAND DOCS` gives each command's cost (it said O(1) for all, where a read release and
/// `RWLOCK.INFO` read every read hold and leased permits cost a zset operation each).
#[test]
fn command_docs_give_the_cost_of_the_commands_that_loop() {
    let server = Server::start();
    let mut con = server.conn();
    let complexity = |con: &mut Connection, name: &str| {
        let reply = cmd(con, &["COMMAND", "DOCS", name]);
        text(&field(&field(&reply, name).expect("docs"), "complexity").expect("complexity"))
    };
    for name in ["rwlock.release", "rwlock.info", "rsem.acquire", "rsem.release", "rsem.info"] {
        let cost = complexity(&mut con, name);
        assert!(cost.contains("O(N)") || cost.contains("log N"), "{name}: {cost}");
    }
    assert_eq!(complexity(&mut con, "rlock.acquire"), "O(1)");
}
