//! `make bench`: rlock against its baselines, every comparison in one run, on redis-servers
//! this binary starts itself (with the module from `target/release`, as the tests do).
//!
//! `rlock-bench [--smoke] [--only N[,M...]] [--out FILE]`: prints the tables and writes them,
//! with the machine they ran on, to FILE (default `BENCHMARKS.md`); `--only` runs the sections
//! listed. `--smoke` uses tiny sizes, so CI can check that the harness still runs; its figures
//! mean nothing. `--help` (or any argument it does not know) prints the usage and runs nothing.
//! `RLOCK_BENCH_ROWS=deadlock` runs only section 4's deadlock rows (with `--only 4`), and
//! `RLOCK_BENCH_BASE_MODULE=path` compares them with another build (see `deadlock.rs`).
//!
//! `rlock-bench --per-server [--smoke] [--out FILE]`: runs sections 1 and 4 on each server of
//! `RLOCK_BENCH_SERVERS` (`label=path,label=path`, set by `make bench-servers`), one child run
//! per server, and writes their target ratios side by side into FILE's per-server block
//! (replacing it, or appended when absent).

mod contention;
mod cost;
mod deadlock;
mod expiry;
mod floor;
mod herd;
mod per_server;
mod report;
mod rwmix;
mod scale;
mod semaphore;
mod unrelated;
mod util;

use std::process::Command;
use std::time::Duration;

use report::Report;

/// How big each measurement is.
pub struct Sizes {
    ops: u64,
    contention: Duration,
    herd: usize,
    queues: (usize, usize),
    handoffs: u64,
    expiry_rounds: usize,
    scale: u64,
    scale_probe: u64,
    /// Keys deleted and expired in section 9.
    unrelated: usize,
    /// Rounds of section 4's deadlock rows (their median is reported).
    deadlock_rounds: usize,
}

const FULL: Sizes = Sizes {
    ops: 200_000,
    contention: Duration::from_secs(3),
    herd: 1_000,
    queues: (10, 10_000),
    handoffs: 20_000,
    expiry_rounds: 100,
    scale: 1_000_000,
    scale_probe: 20_000,
    unrelated: 300_000,
    deadlock_rounds: 7,
};

const SMOKE: Sizes = Sizes {
    ops: 2_000,
    contention: Duration::from_millis(200),
    herd: 20,
    queues: (5, 50),
    handoffs: 100,
    expiry_rounds: 5,
    scale: 5_000,
    scale_probe: 1_000,
    unrelated: 3_000,
    deadlock_rounds: 1,
};

fn output(cmd: &str, args: &[&str]) -> String {
    Command::new(cmd)
        .args(args)
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default()
}

fn machine() -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let cpu = cpuinfo
        .lines()
        .find_map(|l| {
            l.strip_prefix("model name")?.split_once(':').map(|(_, v)| v.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown".to_owned());
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let mem = meminfo.lines().find(|l| l.starts_with("MemTotal")).unwrap_or("").to_owned();
    let server = std::env::var("REDIS_SERVER").unwrap_or_else(|_| "redis-server".to_owned());
    [
        format!("- CPU: {cpu}, {} cores", output("nproc", &[])),
        format!("- Memory: {}", mem.trim_start_matches("MemTotal:").trim()),
        format!("- Kernel: {}", output("uname", &["-sr"])),
        format!("- Server: {}", output(&server, &["--version"])),
        format!("- rlock commit: {}", output("git", &["describe", "--always", "--dirty"])),
        format!("- Date: {}", output("date", &["-u", "+%Y-%m-%d %H:%M UTC"])),
        "- Load generator: this binary (tokio, redis-rs), on the same machine as the server"
            .to_owned(),
    ]
    .join("\n")
}

/// The usage, printed by `--help` and for an argument this binary does not know.
const USAGE: &str = "usage: rlock-bench [--smoke] [--only N[,M...]] [--out FILE] \
    [--targets-tsv FILE]\n       rlock-bench --per-server [--smoke] [--out FILE]\n\
    Runs the benchmark sections (all, or those of --only) and writes them to FILE \
    (default BENCHMARKS.md; with --targets-tsv, only the targets to that file).\n\
    RLOCK_BENCH_ROWS=deadlock: section 4 runs only its deadlock rows; \
    RLOCK_BENCH_BASE_MODULE=PATH: they also run with the module at PATH.";

/// Whether every argument is one this binary knows (a flag, or a known option and its value).
fn known_args(args: &[String]) -> bool {
    let mut rest = args.iter();
    while let Some(arg) = rest.next() {
        match arg.as_str() {
            "--smoke" | "--per-server" => {}
            "--only" | "--out" | "--targets-tsv" => {
                if rest.next().is_none() {
                    return false;
                }
            }
            _ => return false,
        }
    }
    true
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    if !known_args(&args[1..]) {
        eprintln!("{USAGE}");
        let help = args.iter().any(|a| a == "--help" || a == "-h");
        std::process::exit(if help { 0 } else { 2 });
    }
    let smoke = args.iter().any(|a| a == "--smoke");
    let out = args
        .iter()
        .position(|a| a == "--out")
        .and_then(|i| args.get(i + 1).cloned())
        .unwrap_or_else(|| "BENCHMARKS.md".to_owned());
    let only: Option<Vec<usize>> = args
        .iter()
        .position(|a| a == "--only")
        .and_then(|i| args.get(i + 1)?.split(',').map(|n| n.trim().parse().ok()).collect());
    if args.iter().any(|a| a == "--per-server") {
        per_server::run(smoke, &out);
        return;
    }
    let targets_tsv = args.iter().position(|a| a == "--targets-tsv").and_then(|i| args.get(i + 1));
    let sizes = if smoke { &SMOKE } else { &FULL };
    util::raise_fd_limit();

    let mut report = Report::default();
    macro_rules! section {
        ($name:expr, $run:expr) => {{
            let number: usize = $name[..1].parse().unwrap_or(0);
            if only.as_ref().is_some_and(|list| !list.contains(&number)) {
                eprintln!("skipping {}", $name);
            } else {
                eprintln!("running {}...", $name);
                let (section, targets) = $run.await;
                report.sections.push(section);
                report.targets.extend(targets);
            }
        }};
    }
    section!("1. server cost per command", cost::run(sizes));
    section!("2. contention", contention::run(sizes));
    section!("3. herd", herd::run_herd(sizes));
    section!("4. hand-off cost vs queue length", herd::run_queue_length(sizes));
    section!("5. expiry -> grant", expiry::run(sizes));
    section!("6. scale", scale::run(sizes));
    section!("7. read-write mix", rwmix::run(sizes));
    section!("8. semaphore contention", semaphore::run(sizes));
    section!("9. cost to unrelated workloads", unrelated::run(sizes));

    print!("{}", report.text());
    if let Some(path) = targets_tsv {
        std::fs::write(path, report.targets_tsv()).expect("write the targets");
        return;
    }
    let mode = if smoke { "smoke run: tiny sizes, figures meaningless" } else { "full run" };
    // Blocks other runs wrote (the per-server table, the profiles) stay, after this run's.
    let kept = kept_blocks(&std::fs::read_to_string(&out).unwrap_or_default());
    let text = format!("{}{kept}", report.markdown(&machine(), mode));
    std::fs::write(&out, text).expect("write the report");
    eprintln!("\nwritten to {out}");
}

/// The blocks of a report that other runs write and a full run keeps: each from a line
/// `<!-- NAME: ... -->` to `<!-- /NAME -->` (the per-server table, the profiles, the Python
/// package's rows from `make bench-python`).
fn kept_blocks(old: &str) -> String {
    let mut kept = String::new();
    for name in ["per-server", "profiles", "python"] {
        let (begin, end) = (format!("<!-- {name}:"), format!("<!-- /{name} -->"));
        if let (Some(b), Some(e)) = (old.find(&begin), old.find(&end)) {
            if b < e {
                kept.push('\n');
                kept.push_str(&old[b..e + end.len()]);
                kept.push('\n');
            }
        }
    }
    kept
}

#[cfg(test)]
mod tests {
    use super::{kept_blocks, known_args};

    #[test]
    fn help_and_unknown_arguments_run_nothing() {
        let args = |list: &[&str]| list.iter().map(|a| (*a).to_owned()).collect::<Vec<_>>();
        assert!(!known_args(&args(&["--help"])));
        assert!(!known_args(&args(&["-h"])));
        assert!(!known_args(&args(&["--smoke", "4"])));
        assert!(!known_args(&args(&["--only"])));
        assert!(known_args(&args(&[])));
        assert!(known_args(&args(&["--smoke", "--only", "4", "--out", "/tmp/x.md"])));
        assert!(known_args(&args(&["--only", "1,4", "--targets-tsv", "t", "--out", "/dev/null"])));
    }

    #[test]
    fn a_full_run_keeps_the_python_block() {
        let old = "# rlock benchmarks\n\n## 1. old rows\n\n\
                   <!-- profiles: by hand -->\n## Profiles\n<!-- /profiles -->\n\n\
                   <!-- python: written by `make bench-python` -->\n## Python\nrows\n\
                   <!-- /python -->\n";
        let kept = kept_blocks(old);
        assert!(!kept.contains("old rows"));
        assert!(kept.contains("## Profiles"));
        assert!(kept.contains("<!-- python: written by `make bench-python` -->\n## Python\nrows"));
        assert!(kept.trim_end().ends_with("<!-- /python -->"));
    }
}
