//! `make bench`: rlock against its baselines, every comparison in one run, on redis-servers
//! this binary starts itself (with the module from `target/release`, as the tests do).
//!
//! `rlock-bench --help` prints the command line (`cli.rs`): `--only N[,M...]` runs the sections
//! listed, `--smoke` uses tiny sizes (CI checks that the harness still runs; its figures mean
//! nothing) and `--ops`, `--queues`, `--waiters`... set sizes one by one, `--server PATH` picks
//! the server binary. The report is printed; `--out FILE` also writes it, with the machine it
//! ran on, as Markdown, and only `--write-benchmarks` rewrites BENCHMARKS.md (`make bench`).
//! `--deadlock-only` runs only section 4's deadlock rows (with `--only 4`), and
//! `--base-module PATH` compares them with another build (see `deadlock.rs`).
//!
//! `rlock-bench --per-server --servers label=path,label=path [--smoke] [--out FILE]`: runs
//! sections 1 and 4 on each server (`make bench-servers`), one child run per server, and makes
//! their target ratios a table side by side, written into FILE's per-server block (replacing
//! it, or appended when absent).

mod cli;
mod contention;
mod cost;
mod cost_kinds;
mod deadlock;
mod expiry;
mod floor;
mod guard;
mod herd;
mod latch;
mod per_server;
mod queue_loop;
mod report;
mod rwmix;
mod scale;
mod semaphore;
mod stall;
mod unrelated;
mod util;
mod wait_scale;

use std::process::Command;
use std::time::Duration;

use cli::Cli;
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
    /// Section 10: clients waiting, and the locks they wait for.
    waiting: (usize, usize),
    /// Section 10: the idle interval the server's CPU is measured over.
    idle: Duration,
    /// Section 10: rounds of the idle CPU with the waiters parked, then waiting.
    idle_rounds: usize,
    /// Section 11: rounds of the latch release (its awaiters: `herd`).
    latch_rounds: usize,
    /// Section 12: clients timing out together.
    stall_waiters: usize,
    /// Section 12: owners, and read holds of each, bound to the connection that closes.
    stall_reads: (usize, usize),
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
    waiting: (50_000, 5_000),
    idle: Duration::from_secs(10),
    idle_rounds: 3,
    latch_rounds: 5,
    stall_waiters: 12_000,
    stall_reads: (40, 1_000),
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
    waiting: (50, 5),
    idle: Duration::from_secs(1),
    idle_rounds: 1,
    latch_rounds: 1,
    stall_waiters: 50,
    stall_reads: (4, 10),
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

fn main() {
    // Before the checks of the sizes: how many connections fit depends on it.
    util::raise_fd_limit();
    let cli = Cli::parse_checked();
    // Before the runtime's threads start: the harness reads these variables.
    cli.export();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("the tokio runtime");
    runtime.block_on(run(&cli));
}

async fn run(cli: &Cli) {
    let smoke = cli.smoke;
    if cli.per_server {
        per_server::run(cli);
        return;
    }
    let sizes = &cli.sizes();

    let mut report = Report::default();
    macro_rules! section {
        ($name:expr, $run:expr) => {{
            let number: u8 = $name.split('.').next().and_then(|n| n.parse().ok()).unwrap_or(0);
            if !cli.runs(number) {
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
    section!("10. scale of waiting", wait_scale::run(sizes));
    section!("11. count-down latch release", latch::run(sizes));
    section!("12. stalls", stall::run(sizes));
    section!("13. stale-master guard", guard::run(sizes));

    print!("{}", report.text());
    if let Some(path) = &cli.targets_tsv {
        std::fs::write(path, report.targets_tsv()).expect("write the targets");
    }
    let Some(out) = cli.destination() else { return };
    let mut mode =
        if smoke { "smoke run: tiny sizes, figures meaningless" } else { "full run" }.to_owned();
    if !cli.only.is_empty() {
        let list: Vec<String> = cli.only.iter().map(u8::to_string).collect();
        mode = format!("{mode} of `--only {}`", list.join(","));
    }
    // Blocks other runs wrote (the per-server table, the profiles) stay, after this run's.
    let kept = kept_blocks(&std::fs::read_to_string(out).unwrap_or_default());
    let text = format!("{}{kept}", report.markdown(&machine(), &mode));
    std::fs::write(out, text).expect("write the report");
    eprintln!("\nwritten to {}", out.display());
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
    use super::kept_blocks;

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
