//! `COMMAND DOCS` against the parser: the syntax each command's parser accepts, and
//! summaries that name what the replies hold.

use std::collections::BTreeSet;

use redis::{Connection, Value};
use rlock_tests_integration::{cmd, run_str, Server};

use super::{field, pairs, text};

// ---- COMMAND DOCS against the parser ------------------------------------------------------------

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
    ("rlock.acquire", "key owner lease-ms [WAIT timeout-ms] [TOKEN] [REQUEST id] [SESSION [LOCKDELAY lockdelay-ms]] [GT]"),
    ("rlock.release", "key owner [lease-ms] [REQUEST id]"),
    ("rlock.renew", "key owner lease-ms [GT]"),
    ("rlock.forcerelease", "key"),
    ("rlock.cancel", "key id"),
    ("rlock.pttl", "key"),
    ("rlock.info", "key"),
    ("rwlock.acquire", "key owner <READ | WRITE> lease-ms [WAIT timeout-ms] [TOKEN] [REQUEST id] [SESSION [LOCKDELAY lockdelay-ms]] [GT]"),
    ("rwlock.release", "key owner <READ | WRITE> [REQUEST id]"),
    ("rwlock.renew", "key owner lease-ms [READ | WRITE] [GT]"),
    ("rwlock.forcerelease", "key"),
    ("rwlock.info", "key"),
    ("rsem.setpermits", "key permits"),
    ("rsem.addpermits", "key delta"),
    ("rsem.acquire", "key permits [LEASE lease-ms [SESSION [LOCKDELAY lockdelay-ms]]] [WAIT timeout-ms] [REQUEST id [OWNERLESS]]"),
    ("rsem.release", "key <permits [REQUEST id | ONCE release-id] | ID id [id ...]>"),
    ("rsem.renew", "key id lease-ms"),
    ("rsem.available", "key"),
    ("rsem.info", "key"),
    ("rlock.waiters", "key [COUNT count]"),
    ("rwlock.waiters", "key [COUNT count]"),
    ("rsem.waiters", "key [COUNT count]"),
    ("rlatch.setcount", "key count"),
    ("rlatch.countdown", "key [amount]"),
    ("rlatch.count", "key"),
    ("rlatch.delete", "key"),
    ("rlatch.await", "key timeout-ms"),
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
        ("integer", "permits" | "delta" | "count" | "amount") => "1".to_owned(),
        ("string", "owner") => "o".to_owned(),
        ("string", "id" | "release-id") => "i".to_owned(),
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
    let counted = forms.subargs.iter().find(|a| a.kind == "block").expect("the counted form");
    assert!(
        counted.subargs.iter().any(|a| a.name == "permits" && a.kind == "integer"),
        "{forms:?}"
    );
    let released_as = counted.subargs.iter().find(|a| a.kind == "oneof").expect("REQUEST | ONCE");
    assert!(released_as.optional, "{released_as:?}");
    for token in ["REQUEST", "ONCE"] {
        let arg = released_as.subargs.iter().find(|a| a.token.as_deref() == Some(token));
        assert!(arg.is_some_and(|a| a.kind == "string"), "{token}: {forms:?}");
    }
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
