//! `rlock-bench --per-server`: sections 1 (cost per command) and 4 (hand-off vs queue length)
//! on every server of the matrix, one child run each, and a compact table of their target
//! ratios in BENCHMARKS.md, so a user sees what to expect on their server.

use std::process::Command;

use crate::cli::Cli;
use crate::report::{num, Target};

const BEGIN: &str = "<!-- per-server: written by `make bench-servers` -->";
const END: &str = "<!-- /per-server -->";

/// Runs the child benchmarks and prints the table; writes it into the file of `--out` or
/// `--write-benchmarks`, if any.
pub fn run(cli: &Cli) {
    let smoke = cli.smoke;
    let servers = cli.servers.as_deref().unwrap_or_default();
    let servers: Vec<(&str, &str)> =
        servers.split(',').filter_map(|pair| pair.split_once('=')).collect();
    assert!(!servers.is_empty(), "--servers is empty: `label=path,label=path`");
    let exe = std::env::current_exe().expect("this binary");
    let mut columns: Vec<(String, Vec<Target>)> = Vec::new();
    for (label, path) in &servers {
        eprintln!("--- {label}: {path}");
        let tsv = std::env::temp_dir().join(format!("rlock-bench-{}.tsv", std::process::id()));
        let mut child = Command::new(&exe);
        child.args(["--server", path, "--only", "1,4", "--targets-tsv"]).arg(&tsv);
        child.args(cli.size_args());
        let status = child.status().expect("run a child benchmark");
        assert!(status.success(), "the benchmark on {label} failed");
        let text = std::fs::read_to_string(&tsv).expect("the child's targets");
        let _ = std::fs::remove_file(&tsv);
        let version = Command::new(path)
            .arg("--version")
            .output()
            .map(|o| {
                String::from_utf8_lossy(&o.stdout)
                    .split_whitespace()
                    .nth(2)
                    .unwrap_or("")
                    .to_owned()
            })
            .unwrap_or_default();
        columns.push((format!("{label} ({})", version.trim_start_matches("v=")), parse(&text)));
    }
    let table = table(&columns, smoke);
    println!("{table}");
    let Some(out) = cli.destination() else { return };
    let old = std::fs::read_to_string(out).unwrap_or_default();
    let new = match (old.find(BEGIN), old.find(END)) {
        (Some(b), Some(e)) if b < e => format!("{}{table}{}", &old[..b], &old[e + END.len()..]),
        _ => format!("{old}\n{table}\n"),
    };
    std::fs::write(out, new).expect("write the report");
    eprintln!("\nwritten to {}", out.display());
}

fn parse(tsv: &str) -> Vec<Target> {
    tsv.lines()
        .filter_map(|line| {
            let mut f = line.split('\t');
            let (what, value, limit, op) = (f.next()?, f.next()?, f.next()?, f.next()?);
            let (value, limit) = (value.parse().ok()?, limit.parse().ok()?);
            Some(if op == "<=" {
                Target::at_most(what, value, limit)
            } else {
                Target::at_least(what, value, limit)
            })
        })
        .collect()
}

fn table(columns: &[(String, Vec<Target>)], smoke: bool) -> String {
    let mut s = format!("{BEGIN}\n## Per server\n\n");
    s.push_str(
        "Sections 1 and 4 on each server of the test matrix, in one run of `make bench-servers` \
         on this machine (ratios against baselines measured on the same server in the same run; \
         ✓ = target met).",
    );
    if smoke {
        s.push_str(" **Smoke run: tiny sizes, figures meaningless.**");
    }
    s.push_str("\n\n| measure | target |");
    for (name, _) in columns {
        s.push_str(&format!(" {name} |"));
    }
    s.push_str("\n|---|---|");
    s.push_str(&"---|".repeat(columns.len()));
    s.push('\n');
    let names: Vec<&str> = columns
        .first()
        .map(|(_, t)| t.iter().map(|t| t.what.as_str()).collect())
        .unwrap_or_default();
    for what in names {
        let Some(first) = columns[0].1.iter().find(|t| t.what == what) else { continue };
        let op = if first.at_most { "≤" } else { "≥" };
        s.push_str(&format!("| {what} | {op} {} |", num(first.limit)));
        for (_, targets) in columns {
            match targets.iter().find(|t| t.what == what) {
                Some(t) => {
                    let mark = if t.met() { "✓" } else { "✗" };
                    s.push_str(&format!(" {} {mark} |", num(t.value)));
                }
                None => s.push_str(" – |"),
            }
        }
        s.push('\n');
    }
    s.push_str(END);
    s
}
