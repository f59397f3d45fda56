//! redis-cli transcripts of the docs, replayed against a real server.
//!
//! A transcript is a fenced ```` ```redis-cli ```` block: each command on a line after a prompt
//! (`127.0.0.1:6390> `, or `127.0.0.1:6390[2]> ` for database 2), then the reply exactly as an
//! interactive redis-cli prints it (`--no-raw`: `(nil)`, `(integer) 1`, `1) "a"`, `(error) ...`).
//! Each command is run with redis-cli itself (the cli matching the server) and its output
//! compared line by line, strictly, except for three marked kinds of values that vary:
//!
//! - `…` (U+2026) in an expected line stands for any run of characters (a random permit id);
//! - `(integer) N` with N ≥ 1000 (a remaining lease in ms) matches an integer that is at most
//!   [`SLACK_MS`] above N and at most the time the replay has taken so far (plus that slack)
//!   below it, with the rest of the line (its `1) ` prefix) the same: a lease loses no more
//!   than the time that passed, so a wrong count or a wait that did not wait shows;
//! - a line `(2.00s)`, the time redis-cli shows after a slow command, checks that the command
//!   took that long (at most 0.02 s less: a server-side wait never ends early; at most 1 s
//!   more, for a loaded machine) and is not itself compared. A command without such a line
//!   must take less than 0.5 s (when redis-cli would show one) plus that 1 s.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::process::Command;
use std::time::Instant;

use crate::cli_binary;

/// One command of a transcript and the output it must give.
#[derive(Debug, Clone)]
pub struct Step {
    /// The line of the page the command is on (1-based).
    pub line: usize,
    /// The command as written after the prompt.
    pub text: String,
    /// Its arguments, split as redis-cli splits them (bytes: `\xHH` may name any byte).
    pub args: Vec<Vec<u8>>,
    /// The database the prompt names (`[2]`), if any.
    pub db: Option<u32>,
    /// The reply lines.
    pub expect: Vec<String>,
    /// The seconds redis-cli showed it took (`(2.00s)`), if any.
    pub took: Option<f64>,
}

/// The prompt's database (`Some(None)` for no `[n]`), and the command after it; `None` when
/// the line is not a prompt line.
fn prompt(line: &str) -> Option<(Option<u32>, &str)> {
    let (head, command) = line.split_once("> ")?;
    let (addr, db) = match head.split_once('[') {
        Some((addr, db)) => (addr, Some(db.strip_suffix(']')?.parse().ok()?)),
        None => (head, None),
    };
    let (host, port) = addr.rsplit_once(':')?;
    let ok = !host.is_empty()
        && host.chars().all(|c| c.is_ascii_digit() || c == '.')
        && port.parse::<u16>().is_ok();
    ok.then_some((db, command))
}

/// Splits a command line as redis-cli does (sdssplitargs): words, `"..."` with `\n`, `\t`,
/// `\\`, `\"` and `\xHH` escapes, `'...'` with `\'`.
///
/// # Errors
/// On an unbalanced quote, or a closing quote followed by something other than a space.
pub fn split_args(line: &str) -> Result<Vec<Vec<u8>>, String> {
    let mut args = Vec::new();
    let mut chars = line.chars().peekable();
    loop {
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        let Some(&first) = chars.peek() else { return Ok(args) };
        let mut word = Vec::new();
        let push = |word: &mut Vec<u8>, c: char| {
            word.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes())
        };
        if first == '"' || first == '\'' {
            chars.next();
            loop {
                match (chars.next(), first) {
                    (None, _) => return Err(format!("unbalanced quotes in {line:?}")),
                    (Some(c), q) if c == q => break,
                    (Some('\\'), '"') => match chars.next() {
                        Some('n') => word.push(b'\n'),
                        Some('t') => word.push(b'\t'),
                        Some('r') => word.push(b'\r'),
                        Some('x') => {
                            let hex: String = chars.by_ref().take(2).collect();
                            let byte = u8::from_str_radix(&hex, 16)
                                .map_err(|e| format!("\\x{hex}: {e}"))?;
                            word.push(byte);
                        }
                        Some(c) => push(&mut word, c),
                        None => return Err(format!("unbalanced quotes in {line:?}")),
                    },
                    (Some('\\'), '\'') if chars.next_if_eq(&'\'').is_some() => word.push(b'\''),
                    (Some(c), _) => push(&mut word, c),
                }
            }
            if chars.peek().is_some_and(|c| !c.is_whitespace()) {
                return Err(format!("a closing quote must be followed by a space in {line:?}"));
            }
        } else {
            while let Some(c) = chars.next_if(|c| !c.is_whitespace()) {
                push(&mut word, c);
            }
        }
        args.push(word);
    }
}

fn timing(line: &str) -> Option<f64> {
    line.strip_prefix('(')?.strip_suffix("s)")?.parse().ok()
}

/// The steps of one transcript whose fence opens on line `fence` of its page.
///
/// # Errors
/// When a reply comes before any command, or a command cannot be split.
pub fn parse(block: &str, fence: usize) -> Result<Vec<Step>, String> {
    let mut steps: Vec<Step> = Vec::new();
    for (i, line) in block.lines().enumerate() {
        let at = fence + 1 + i;
        if let Some((db, text)) = prompt(line) {
            let args = split_args(text).map_err(|e| format!("line {at}: {e}"))?;
            steps.push(Step {
                line: at,
                text: text.to_owned(),
                args,
                db,
                expect: Vec::new(),
                took: None,
            });
        } else {
            let step =
                steps.last_mut().ok_or_else(|| format!("line {at}: a reply before any command"))?;
            match timing(line) {
                Some(t) => step.took = Some(t),
                None => step.expect.push(line.to_owned()),
            }
        }
    }
    Ok(steps)
}

/// How far a lease in a replay may differ from the page's beyond the time that passed: the
/// page's own session had some overhead of its own (process starts, typing).
pub const SLACK_MS: i64 = 50;

/// Whether `got` matches `want` under the rules of this module's header, `elapsed_ms` after
/// the transcript's first command started.
#[must_use]
pub fn matches(want: &str, got: &str, elapsed_ms: i64) -> bool {
    if want == got {
        return true;
    }
    if let Some((head, tail)) = want.split_once('…') {
        // Every `…` a run of anything: the pieces between them in order.
        let Some(mut rest) = got.strip_prefix(head) else { return false };
        let mut pieces = tail.split('…').peekable();
        while let Some(piece) = pieces.next() {
            if pieces.peek().is_none() {
                return rest.ends_with(piece);
            }
            match rest.find(piece) {
                Some(i) => rest = &rest[i + piece.len()..],
                None => return false,
            }
        }
        return true;
    }
    let integer = |line: &str| -> Option<(String, i64)> {
        let (head, n) = line.rsplit_once("(integer) ")?;
        Some((head.to_owned(), n.parse().ok()?))
    };
    match (integer(want), integer(got)) {
        (Some((wh, w)), Some((gh, g))) => {
            w >= 1000 && wh == gh && g <= w + SLACK_MS && g >= w - elapsed_ms - SLACK_MS
        }
        _ => false,
    }
}

/// Runs every step with redis-cli against the server on 127.0.0.1:`port` (one the harness
/// started, or `make run`'s), in order, and compares.
///
/// # Errors
/// The first step whose output differs: where, what was expected, what came.
pub fn replay(port: u16, page: &str, steps: &[Step]) -> Result<(), String> {
    let begun = Instant::now();
    for step in steps {
        let mut cli = Command::new(cli_binary());
        cli.args(["--no-raw", "-h", "127.0.0.1", "-p", &port.to_string()]);
        if let Some(db) = step.db {
            cli.args(["-n", &db.to_string()]);
        }
        let started = Instant::now();
        let args = step.args.iter().map(|a| OsStr::from_bytes(a));
        let out = cli.args(args).output().map_err(|e| format!("redis-cli: {e}"))?;
        let took = started.elapsed().as_secs_f64();
        let elapsed_ms = i64::try_from(begun.elapsed().as_millis()).unwrap_or(i64::MAX);
        let got: Vec<String> =
            String::from_utf8_lossy(&out.stdout).lines().map(str::to_owned).collect();
        let same = got.len() == step.expect.len()
            && step.expect.iter().zip(&got).all(|(w, g)| matches(w, g, elapsed_ms));
        if !same || !out.stderr.is_empty() {
            return Err(format!(
                "{page}:{}: `{}` printed (- the page, + redis-cli):\n{}{}",
                step.line,
                step.text,
                crate::docs::diff(&step.expect.join("\n"), &got.join("\n")),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        let (least, most) = step.took.map_or((0.0, 0.5 + 1.0), |t| (t - 0.02, t + 1.0));
        if took < least || took > most {
            let says = step.took.map_or_else(|| "no time".to_owned(), |t| format!("({t:.2}s)"));
            return Err(format!(
                "{page}:{}: `{}` took {took:.2}s, the page says {says}",
                step.line, step.text
            ));
        }
    }
    Ok(())
}
