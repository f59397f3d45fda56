//! The command reference rendered from a running server: each command's block of
//! `docs/commands.md` (between `<!-- BEGIN generated: NAME -->` and `<!-- END generated -->`)
//! is built from its `COMMAND DOCS` and `COMMAND INFO`, so the page cannot drift from the
//! module's command table. Also what the docs tests share: the fenced blocks of a page, and a
//! line diff to print.
//!
//! Only what all four servers of the matrix report alike is rendered: Valkey adds a
//! `display_text` to every argument (not used), and `since` (the module's version) and
//! `complexity` are left out, so a version bump does not rewrite the page.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use redis::{Connection, Value};

/// The opening marker of a generated block; the command's name (upper case) and ` -->` follow.
pub const BEGIN: &str = "<!-- BEGIN generated: ";
/// The closing marker of a generated block.
pub const END: &str = "<!-- END generated -->";

/// The repository's root (the workspace).
#[must_use]
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// README.md and every page of docs/, as (path relative to the root, text).
///
/// # Panics
/// When a page cannot be read.
#[must_use]
pub fn pages() -> Vec<(String, String)> {
    let mut paths = vec![root().join("README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root().join("docs"))
        .expect("docs/")
        .map(|e| e.expect("docs/ entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    paths.extend(docs);
    paths
        .into_iter()
        .map(|p| {
            let text = std::fs::read_to_string(&p).expect("read page");
            let rel = p.strip_prefix(root()).unwrap_or(&p).display().to_string();
            (rel.trim_start_matches("../").to_owned(), text)
        })
        .collect()
}

/// The fenced blocks of `text` whose info string is `lang` (```` ```lang ````), each with the
/// line its fence opens on (1-based).
#[must_use]
pub fn fenced(text: &str, lang: &str) -> Vec<(usize, String)> {
    let mut blocks = Vec::new();
    let mut open: Option<(usize, String)> = None;
    for (i, line) in text.lines().enumerate() {
        match &mut open {
            None => {
                if line.strip_prefix("```").is_some_and(|info| info.trim() == lang) {
                    open = Some((i + 1, String::new()));
                }
            }
            Some((_, body)) if line.trim_end() == "```" => {
                let body = std::mem::take(body);
                blocks.push((open.take().map_or(0, |(at, _)| at), body));
            }
            Some((_, body)) => {
                body.push_str(line);
                body.push('\n');
            }
        }
    }
    blocks
}

/// A reply of `COMMAND DOCS`/`COMMAND INFO` (RESP3) as plain data.
#[derive(Debug, Clone)]
enum Doc {
    Text(String),
    Int(i64),
    List(Vec<Doc>),
    Map(BTreeMap<String, Doc>),
}

impl Doc {
    fn from(value: &Value) -> Self {
        match value {
            Value::BulkString(b) => Self::Text(String::from_utf8_lossy(b).into_owned()),
            Value::SimpleString(s) | Value::VerbatimString { text: s, .. } => Self::Text(s.clone()),
            Value::Int(i) => Self::Int(*i),
            Value::Array(items) | Value::Set(items) => {
                Self::List(items.iter().map(Self::from).collect())
            }
            Value::Map(pairs) => Self::Map(
                pairs
                    .iter()
                    .map(|(k, v)| (Self::from(k).text().to_owned(), Self::from(v)))
                    .collect(),
            ),
            Value::Nil => Self::List(Vec::new()),
            other => Self::Text(format!("{other:?}")),
        }
    }

    fn text(&self) -> &str {
        match self {
            Self::Text(s) => s,
            _ => "",
        }
    }

    fn get(&self, key: &str) -> Option<&Self> {
        match self {
            Self::Map(m) => m.get(key),
            _ => None,
        }
    }

    fn list(&self) -> &[Self] {
        match self {
            Self::List(items) => items,
            _ => &[],
        }
    }

    fn words(&self) -> Vec<String> {
        self.list().iter().map(|d| d.text().to_owned()).collect()
    }
}

/// One argument of the syntax line, as redis.io writes them: `TOKEN name`, `[optional]`,
/// `<one | of>` (`[one | of]` when optional), `name [name ...]` for several.
fn syntax(arg: &Doc) -> String {
    let kind = arg.get("type").map_or("", Doc::text);
    let name = arg.get("name").map_or("", Doc::text);
    let token = arg.get("token").map(Doc::text);
    let flags = arg.get("flags").map(Doc::words).unwrap_or_default();
    let children = || arg.get("arguments").map(Doc::list).unwrap_or_default().iter().map(syntax);
    let body = match kind {
        "pure-token" => token.unwrap_or(name).to_owned(),
        "oneof" => children().collect::<Vec<_>>().join(" | "),
        "block" => children().collect::<Vec<_>>().join(" "),
        _ => name.to_owned(),
    };
    let mut text = match token {
        Some(t) if kind != "pure-token" => format!("{t} {body}"),
        _ => body.clone(),
    };
    if flags.iter().any(|f| f == "multiple") {
        let again = if flags.iter().any(|f| f == "multiple_token") { text.clone() } else { body };
        text = format!("{text} [{again} ...]");
    }
    if flags.iter().any(|f| f == "optional") {
        format!("[{text}]")
    } else if kind == "oneof" {
        format!("<{text}>")
    } else {
        text
    }
}

fn words(items: &[String]) -> String {
    if items.is_empty() {
        return "none".to_owned();
    }
    items.iter().map(|w| format!("`{w}`")).collect::<Vec<_>>().join(" ")
}

/// Where a key spec begins, in words.
fn begin_search(spec: &Doc) -> String {
    let Some(begin) = spec.get("begin_search") else { return "?".to_owned() };
    match (begin.get("type").map(Doc::text), begin.get("spec").and_then(|s| s.get("index"))) {
        (Some("index"), Some(Doc::Int(i))) => format!("argument {i}"),
        _ => format!("{begin:?}"),
    }
}

/// The syntax of an `arguments` array of `COMMAND DOCS` (RESP3), as the generated blocks show it.
#[must_use]
pub fn syntax_of(arguments: &Value) -> String {
    Doc::from(arguments).list().iter().map(syntax).collect::<Vec<_>>().join(" ")
}

/// The commands the module registers (`COMMAND LIST FILTERBY MODULE rlock`), upper case,
/// sorted.
///
/// # Panics
/// When the server does not answer.
#[must_use]
pub fn module_commands(con: &mut Connection) -> Vec<String> {
    let names: Vec<String> = redis::cmd("COMMAND")
        .arg("LIST")
        .arg("FILTERBY")
        .arg("MODULE")
        .arg("rlock")
        .query(con)
        .expect("COMMAND LIST");
    let mut names: Vec<String> = names.iter().map(|n| n.to_uppercase()).collect();
    names.sort();
    names
}

/// The generated block of one command (without its markers): the syntax line, the summary, and
/// a table of arity, flags, key spec and ACL categories. `con` must speak RESP3.
///
/// # Panics
/// When the server does not know the command.
#[must_use]
pub fn render(con: &mut Connection, name: &str) -> String {
    let docs: Value = redis::cmd("COMMAND").arg("DOCS").arg(name).query(con).expect("COMMAND DOCS");
    let docs = Doc::from(&docs);
    let Doc::Map(docs) = docs else { panic!("COMMAND DOCS {name}: {docs:?}") };
    let doc = docs.values().next().unwrap_or_else(|| panic!("COMMAND DOCS {name}: nothing"));
    let info: Value = redis::cmd("COMMAND").arg("INFO").arg(name).query(con).expect("COMMAND INFO");
    let info = Doc::from(&info);
    let info = info.list().first().map(Doc::list).unwrap_or_default();
    assert!(info.len() >= 9, "COMMAND INFO {name}: {info:?}");

    let args: Vec<String> =
        doc.get("arguments").map(Doc::list).unwrap_or_default().iter().map(syntax).collect();
    let mut out = String::new();
    let _ = writeln!(out, "```\n{name} {}\n```\n", args.join(" "));
    let _ = writeln!(out, "{}\n", doc.get("summary").map_or("", Doc::text));
    let arity = match info[1] {
        Doc::Int(n) if n < 0 => format!("{n}: at least {} words, the name included", -n),
        Doc::Int(n) => format!("{n}: exactly {n} words, the name included"),
        _ => "?".to_owned(),
    };
    let specs: Vec<String> = info[8]
        .list()
        .iter()
        .map(|s| {
            format!(
                "{}: {}",
                begin_search(s),
                words(&s.get("flags").map(Doc::words).unwrap_or_default())
            )
        })
        .collect();
    out.push_str("| arity | flags | key | ACL categories |\n|---|---|---|---|\n");
    let _ = writeln!(
        out,
        "| {arity} | {} | {} | {} |",
        words(&info[2].words()),
        specs.join("; "),
        words(&info[6].words())
    );
    out
}

/// The generated blocks of `page`: (command name, start of its body, end of its body), byte
/// offsets of the text between the markers.
///
/// # Panics
/// When a block has no end marker.
#[must_use]
pub fn blocks(page: &str) -> Vec<(String, usize, usize)> {
    let mut found = Vec::new();
    let mut at = 0;
    while let Some(start) = page[at..].find(BEGIN).map(|i| at + i) {
        let name_end = page[start..].find(" -->").map(|i| start + i).expect("BEGIN marker ends");
        let name = page[start + BEGIN.len()..name_end].to_owned();
        let body = page[name_end..].find('\n').map_or(page.len(), |i| name_end + i + 1);
        let end =
            page[body..].find(END).map(|i| body + i).unwrap_or_else(|| panic!("{name}: no {END}"));
        found.push((name, body, end));
        at = end;
    }
    found
}

/// Pages another branch writes: a link to one is not checked while it does not exist.
pub const WRITTEN_ELSEWHERE: &[&str] = &["docs/install.md"];

/// GitHub's anchor of a heading: lower case, punctuation dropped, spaces to `-`.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The relative links of `pages` (path, text) to a file that does not exist, or to an anchor no
/// heading of the target page has (outside code blocks; web links are not followed).
#[must_use]
pub fn broken_links(pages: &[(String, String)]) -> Vec<String> {
    let mut broken = Vec::new();
    for (page, text) in pages {
        let dir = std::path::Path::new(page).parent().expect("dir").to_path_buf();
        let mut in_code = false;
        for line in text.lines() {
            in_code ^= line.starts_with("```");
            if in_code {
                continue;
            }
            for (i, _) in line.match_indices("](") {
                let rest = &line[i + 2..];
                let Some(end) = rest.find(')') else { continue };
                let target = &rest[..end];
                if target.contains("://") || target.starts_with("mailto:") {
                    continue;
                }
                let (path, frag) = target.split_once('#').unwrap_or((target, ""));
                let file = if path.is_empty() { PathBuf::from(page) } else { dir.join(path) };
                let full = root().join(&file);
                let normal = full.canonicalize().ok();
                let rel = normal.as_ref().and_then(|p| {
                    p.strip_prefix(root().canonicalize().ok()?)
                        .ok()
                        .map(|p| p.display().to_string())
                });
                let Some(rel) = rel else {
                    let named = file.display().to_string().replace("docs/../", "");
                    if !WRITTEN_ELSEWHERE.iter().any(|w| named.ends_with(w)) {
                        broken.push(format!("{page}: {target} (no such file)"));
                    }
                    continue;
                };
                if frag.is_empty() || !rel.ends_with(".md") {
                    continue;
                }
                let target_text = std::fs::read_to_string(root().join(&rel)).unwrap_or_default();
                let found = target_text
                    .lines()
                    .filter_map(|l| {
                        l.trim_start_matches('#').strip_prefix(' ').filter(|_| l.starts_with('#'))
                    })
                    .any(|h| anchor(h) == frag);
                if !found {
                    broken.push(format!("{page}: {target} (no heading with that anchor in {rel})"));
                }
            }
        }
    }
    broken
}

/// Whether a page (its path from the root) is one a fence's test reads.
type OnPage = fn(&str) -> bool;

/// The info strings a fence may have, and the pages where a test runs such a block: `rust`,
/// `toml` and `redis-cli` on README.md and docs/ (tests/docs.rs), `lua` on docs/safety.md only,
/// `python` everywhere (python/tests/test_readme.py); `sh` and no info string are shown, not run.
const FENCES: [(&str, OnPage); 7] = [
    ("", |_| true),
    ("sh", |_| true),
    ("python", |_| true),
    ("rust", |page| page == "README.md" || page.starts_with("docs/")),
    ("toml", |page| page == "README.md" || page.starts_with("docs/")),
    ("redis-cli", |page| page == "README.md" || page.starts_with("docs/")),
    ("lua", |page| page == "docs/safety.md"),
];

/// The fences of `pages` (path, text) whose block no docs test would see: an info string
/// outside [`FENCES`] (```` ```rs ````, ```` ```rust,no_run ````, ```` ```py ````, a trailing
/// space), a known one on a page its test does not read, or a fence the tests do not find at
/// all (indented, as in a list item, or `~~~`). One line each, `page:line: why`.
#[must_use]
pub fn unchecked_fences(pages: &[(String, String)]) -> Vec<String> {
    let mut odd = Vec::new();
    for (page, text) in pages {
        let mut open = false;
        for (i, line) in text.lines().enumerate() {
            let trimmed = line.trim_start();
            let fence = ["```", "~~~"].into_iter().find(|f| trimmed.starts_with(f));
            let Some(fence) = fence else { continue };
            if fence == "```" && trimmed.trim_start_matches('`').contains('`') {
                continue; // inline code at a line's start (CommonMark: no fence)
            }
            let at = format!("{page}:{}", i + 1);
            if fence == "~~~" || trimmed.len() != line.len() {
                odd.push(format!("{at}: an indented or ~~~ fence (write ``` at the line start)"));
            }
            if open {
                open = false;
                continue;
            }
            open = true;
            let info = trimmed.trim_start_matches(fence);
            match FENCES.iter().find(|(lang, _)| *lang == info) {
                Some((_, allowed)) if allowed(page) => {}
                Some(_) => odd.push(format!("{at}: no test runs a {info:?} block on this page")),
                None => odd.push(format!("{at}: info string {info:?} is none of {:?}", {
                    FENCES.iter().map(|(lang, _)| *lang).collect::<Vec<_>>()
                })),
            }
        }
    }
    odd
}

/// A line diff of `want` (the checked-in text) against `got` (what it should be), `-`/`+`
/// lines around the first difference, for a failing test's message.
#[must_use]
pub fn diff(want: &str, got: &str) -> String {
    let (a, b): (Vec<&str>, Vec<&str>) = (want.lines().collect(), got.lines().collect());
    // The longest common subsequence, by dynamic programming (the texts are small).
    let mut lcs = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for i in (0..a.len()).rev() {
        for j in (0..b.len()).rev() {
            lcs[i][j] =
                if a[i] == b[j] { lcs[i + 1][j + 1] + 1 } else { lcs[i + 1][j].max(lcs[i][j + 1]) };
        }
    }
    let (mut i, mut j, mut out) = (0, 0, String::new());
    while i < a.len() || j < b.len() {
        if i < a.len() && j < b.len() && a[i] == b[j] {
            let _ = writeln!(out, "  {}", a[i]);
            (i, j) = (i + 1, j + 1);
        } else if i < a.len() && (j == b.len() || lcs[i + 1][j] >= lcs[i][j + 1]) {
            let _ = writeln!(out, "- {}", a[i]);
            i += 1;
        } else {
            let _ = writeln!(out, "+ {}", b[j]);
            j += 1;
        }
    }
    out
}
