//! `rlock-bench`'s command line: clap's derive, so the usage `--help` prints, the parser and
//! its checks come from the one struct below and cannot drift apart. A bad argument prints the
//! error and the usage and exits with 2, `--help` prints the usage and exits with 0, both before
//! anything runs; BENCHMARKS.md is written only with `--write-benchmarks`.
//!
//! The environment variables the harness read before (`REDIS_SERVER`, `RLOCK_MODULE`,
//! `RLOCK_BENCH_BASE_MODULE`, `RLOCK_BENCH_SERVERS`, `RLOCK_BENCH_ROWS=deadlock`) still work, as
//! fallbacks of their options; [`Cli::export`] sets them from the options for the sections (and
//! the test harness) that read them.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use clap::error::ErrorKind;
use clap::{value_parser, Args, CommandFactory, Parser};

use crate::Sizes;

/// The sections, numbered 1 to this.
pub const SECTIONS: u8 = 13;

/// The file `make bench` rewrites, and no run without `--write-benchmarks` touches.
pub const BENCHMARKS: &str = "BENCHMARKS.md";

const AFTER_HELP: &str = "\
Without --out or --write-benchmarks the report is printed (stdout) and no file is written; \
progress goes to stderr.
Examples:
  rlock-bench --smoke --only 6                  tiny sizes, section 6, printed
  rlock-bench --only 4 --out /tmp/section4.md   section 4, written to /tmp/section4.md
  rlock-bench --write-benchmarks                what `make bench` runs
  rlock-bench --per-server --servers Redis=redis-server,Valkey=/opt/valkey-server";

/// rlock's benchmarks against Lua, SET NX and Redisson-style waiting, on servers this binary
/// starts itself (with the module of target/release, as the tests do).
#[derive(Parser, Debug)]
#[command(name = "rlock-bench", after_help = AFTER_HELP)]
pub struct Cli {
    /// Tiny sizes: proves the harness still runs (CI); its figures mean nothing.
    #[arg(long)]
    pub smoke: bool,

    /// Runs only these sections (1 to 13), e.g. `--only 1,4`.
    #[arg(long, value_name = "N[,M...]", value_delimiter = ',',
          value_parser = value_parser!(u8).range(1..=i64::from(SECTIONS)))]
    pub only: Vec<u8>,

    /// Also writes the report, as Markdown with the machine it ran on, to FILE (any name but
    /// BENCHMARKS.md; the blocks other runs wrote into FILE are kept).
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,

    /// Rewrites ./BENCHMARKS.md with this run (all sections at full size; the per-server,
    /// profiles and Python blocks are kept), or with --per-server its per-server table. Without
    /// this flag BENCHMARKS.md is never written.
    #[arg(long, conflicts_with_all = ["out", "smoke", "only"])]
    pub write_benchmarks: bool,

    /// Writes only the targets, tab-separated, to FILE (what --per-server's child runs write).
    #[arg(long, value_name = "FILE")]
    pub targets_tsv: Option<PathBuf>,

    /// The server binary to benchmark.
    #[arg(long, value_name = "PATH", env = "REDIS_SERVER", default_value = "redis-server")]
    pub server: String,

    /// The module to benchmark (default: this checkout's target/release/librlock.so).
    #[arg(long, value_name = "PATH", env = "RLOCK_MODULE")]
    pub module: Option<PathBuf>,

    /// Section 4's deadlock rows also run with the module at PATH (an older build), for the
    /// ratio against it.
    #[arg(long, value_name = "PATH", env = "RLOCK_BENCH_BASE_MODULE")]
    pub base_module: Option<PathBuf>,

    /// Section 4 runs only its deadlock rows (also RLOCK_BENCH_ROWS=deadlock).
    #[arg(long)]
    pub deadlock_only: bool,

    /// Runs sections 1 and 4 on each server of --servers, one child run each, and makes their
    /// target ratios a per-server table (printed; written with --out or --write-benchmarks).
    #[arg(long, conflicts_with_all = ["only", "targets_tsv"])]
    pub per_server: bool,

    /// --per-server's servers: `LABEL=PATH,LABEL=PATH`.
    #[arg(long, value_name = "LABEL=PATH,...", env = "RLOCK_BENCH_SERVERS")]
    pub servers: Option<String>,

    #[command(flatten)]
    pub sizes: SizeArgs,
}

/// The sizes a run can set one by one (each defaults to the full run's, or --smoke's).
#[derive(Args, Debug, Default)]
#[command(next_help_heading = "Sizes (default: the full run's, or --smoke's)")]
pub struct SizeArgs {
    /// Section 1: commands per measurement.
    #[arg(long, value_name = "N", value_parser = value_parser!(u64).range(1..=100_000_000))]
    pub ops: Option<u64>,

    /// Sections 3 and 11: clients waiting for one lock, awaiting one latch.
    #[arg(long, value_name = "N", value_parser = value_parser!(u64).range(1..=1_000_000))]
    pub herd: Option<u64>,

    /// Section 4: the short and the long queue, e.g. `10,10000`.
    #[arg(long, value_name = "SHORT,LONG", value_parser = pair)]
    pub queues: Option<(u64, u64)>,

    /// Sections 4 and 10: hand-offs measured per loop.
    #[arg(long, value_name = "N", value_parser = value_parser!(u64).range(1..=100_000_000))]
    pub handoffs: Option<u64>,

    /// Section 4: rounds of the deadlock rows (their median is reported).
    #[arg(long, value_name = "N", value_parser = value_parser!(u64).range(1..=1_000))]
    pub rounds: Option<u64>,

    /// Section 6: locks held.
    #[arg(long, value_name = "N", value_parser = value_parser!(u64).range(1_000..=100_000_000))]
    pub locks: Option<u64>,

    /// Section 10: clients waiting (as many as the open-files limit allows, when fewer).
    #[arg(long, value_name = "N", value_parser = value_parser!(u64).range(1..=1_000_000))]
    pub waiters: Option<u64>,

    /// Section 10: the locks they wait for (at most --waiters).
    #[arg(long, value_name = "N", value_parser = value_parser!(u64).range(1..=1_000_000))]
    pub waited_locks: Option<u64>,

    /// Section 10: the idle interval the server's CPU is measured over, in seconds.
    #[arg(long, value_name = "SECONDS", value_parser = value_parser!(u64).range(1..=3_600))]
    pub idle: Option<u64>,

    /// Section 12: clients timing out together (rlock's, then BLPOP's).
    #[arg(long, value_name = "N", value_parser = value_parser!(u64).range(1..=1_000_000))]
    pub stall_waiters: Option<u64>,
}

/// `SHORT,LONG`: two counts from 1 to 1,000,000.
fn pair(s: &str) -> Result<(u64, u64), String> {
    let count = |v: &str| match v.trim().parse::<u64>() {
        Ok(n) if (1..=1_000_000).contains(&n) => Ok(n),
        _ => Err(format!("`{v}` is not a count from 1 to 1000000")),
    };
    let (a, b) = s.split_once(',').ok_or("expected SHORT,LONG, e.g. 10,10000")?;
    Ok((count(a)?, count(b)?))
}

fn to_usize(n: u64) -> usize {
    usize::try_from(n).unwrap_or(usize::MAX)
}

impl Cli {
    /// The command line, checked; on `--help` this prints the usage (stdout) and exits with 0,
    /// on a bad argument the error and the usage (stderr) and exits with 2.
    pub fn parse_checked() -> Self {
        match Self::try_parse().and_then(|cli| cli.check().map(|()| cli)) {
            Ok(cli) => cli,
            Err(e) if !e.use_stderr() => e.exit(),
            Err(e) => {
                let text = e.render().to_string();
                eprint!("{text}");
                // Some of clap's errors (a missing value) leave the usage out.
                if !text.contains("Usage:") {
                    eprintln!("\n{}", Self::command().render_usage());
                }
                std::process::exit(2);
            }
        }
    }

    fn error(message: String) -> clap::Error {
        Self::command().error(ErrorKind::ValueValidation, message)
    }

    /// What clap's attributes cannot say: the file names, the binaries, the sizes that must fit.
    pub fn check(&self) -> Result<(), clap::Error> {
        if let Some(out) = &self.out {
            if out.file_name().is_some_and(|name| name == BENCHMARKS) {
                return Err(Self::error(format!(
                    "--out {}: {BENCHMARKS} is written only with --write-benchmarks",
                    out.display()
                )));
            }
        }
        // The servers this run starts: --per-server's, or the one of --server.
        let servers: Vec<(&str, &str)> = if self.per_server {
            let list = self.servers.as_deref().unwrap_or_default();
            list.split(',').filter_map(|pair| pair.split_once('=')).collect()
        } else {
            vec![("--server", self.server.as_str())]
        };
        if servers.is_empty() {
            return Err(Self::error(
                "--per-server needs --servers LABEL=PATH,... (or RLOCK_BENCH_SERVERS)".to_owned(),
            ));
        }
        for (label, server) in servers {
            let runs = Command::new(server).arg("--version").output();
            if !runs.as_ref().is_ok_and(|o| o.status.success()) {
                return Err(Self::error(format!(
                    "{label} {server}: cannot run it (`{server} --version` failed)"
                )));
            }
        }
        for (option, path) in [("--module", &self.module), ("--base-module", &self.base_module)] {
            if let Some(path) = path.as_deref().filter(|p| !p.is_file()) {
                return Err(Self::error(format!("{option} {}: no such file", path.display())));
            }
        }
        let sizes = self.sizes();
        if sizes.waiting.1 > sizes.waiting.0 {
            return Err(Self::error(format!(
                "--waited-locks {}: more locks than --waiters {} (each waited lock needs a waiter)",
                sizes.waiting.1, sizes.waiting.0
            )));
        }
        // Every waiter is a connection of this process and a client of the server.
        let room = crate::util::server_room();
        for (section, option, connections) in [
            (3, "--herd", sizes.herd.saturating_mul(2)),
            (4, "--queues", sizes.queues.1.max(sizes.queues.0.saturating_mul(2))),
            (11, "--herd", sizes.herd.saturating_mul(2)),
            (12, "--stall-waiters", sizes.stall_waiters),
        ] {
            if self.runs(section) && connections > room {
                return Err(Self::error(format!(
                    "{option}: section {section} would open {connections} connections, more \
                     than this machine's open-files limit leaves room for ({room})"
                )));
            }
        }
        Ok(())
    }

    /// Whether section `number` runs.
    pub fn runs(&self, number: u8) -> bool {
        self.only.is_empty() || self.only.contains(&number)
    }

    /// The sizes: the full run's or --smoke's, with those given one by one.
    pub fn sizes(&self) -> Sizes {
        let mut s = if self.smoke { crate::SMOKE } else { crate::FULL };
        let a = &self.sizes;
        if let Some(n) = a.ops {
            s.ops = n;
        }
        if let Some(n) = a.herd {
            s.herd = to_usize(n);
        }
        if let Some((short, long)) = a.queues {
            s.queues = (to_usize(short), to_usize(long));
        }
        if let Some(n) = a.handoffs {
            s.handoffs = n;
        }
        if let Some(n) = a.rounds {
            s.deadlock_rounds = to_usize(n);
        }
        if let Some(n) = a.locks {
            s.scale = n;
        }
        if let Some(n) = a.waiters {
            s.waiting.0 = to_usize(n);
        }
        if let Some(n) = a.waited_locks {
            s.waiting.1 = to_usize(n);
        }
        if let Some(n) = a.idle {
            s.idle = Duration::from_secs(n);
        }
        if let Some(n) = a.stall_waiters {
            s.stall_waiters = to_usize(n);
        }
        s
    }

    /// Where the Markdown report goes: ./BENCHMARKS.md with --write-benchmarks, FILE with
    /// --out, nowhere otherwise.
    pub fn destination(&self) -> Option<&Path> {
        if self.write_benchmarks {
            Some(Path::new(BENCHMARKS))
        } else {
            self.out.as_deref()
        }
    }

    /// The size options to pass on to --per-server's child runs.
    pub fn size_args(&self) -> Vec<String> {
        let a = &self.sizes;
        let mut args = Vec::new();
        let mut push = |name: &str, value: Option<String>| {
            if let Some(v) = value {
                args.extend([name.to_owned(), v]);
            }
        };
        push("--ops", a.ops.map(|n| n.to_string()));
        push("--queues", a.queues.map(|(s, l)| format!("{s},{l}")));
        push("--handoffs", a.handoffs.map(|n| n.to_string()));
        push("--rounds", a.rounds.map(|n| n.to_string()));
        if self.smoke {
            args.push("--smoke".to_owned());
        }
        args
    }

    /// Sets the environment variables the test harness (`REDIS_SERVER`, `RLOCK_MODULE`) and
    /// section 4's deadlock rows (`RLOCK_BENCH_BASE_MODULE`, `RLOCK_BENCH_ROWS`) read. Called
    /// before the runtime starts its threads.
    pub fn export(&self) {
        std::env::set_var("REDIS_SERVER", &self.server);
        if let Some(path) = &self.module {
            std::env::set_var("RLOCK_MODULE", path);
        }
        if let Some(path) = &self.base_module {
            std::env::set_var("RLOCK_BENCH_BASE_MODULE", path);
        }
        if self.deadlock_only {
            std::env::set_var("RLOCK_BENCH_ROWS", "deadlock");
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::Cli;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("rlock-bench").chain(args.iter().copied()))
    }

    #[test]
    fn help_and_bad_arguments_are_errors_with_their_exit_codes() {
        assert_eq!(parse(&["--help"]).err().map(|e| e.exit_code()), Some(0));
        for bad in [
            &["--bogus"][..],
            &["4"],
            &["--only"],
            &["--only", "0"],
            &["--only", "14"],
            &["--only", "1,x"],
            &["--queues", "10"],
            &["--queues", "10,0"],
            &["--locks", "5"],
            &["--write-benchmarks", "--smoke"],
            &["--write-benchmarks", "--only", "1"],
            &["--write-benchmarks", "--out", "x.md"],
            &["--per-server", "--only", "1"],
        ] {
            let code = parse(bad).err().map(|e| e.exit_code());
            assert_eq!(code, Some(2), "{bad:?}");
        }
    }

    #[test]
    fn options_set_the_sizes_and_the_destination() {
        let cli = parse(&["--smoke", "--only", "4,10", "--queues", "3,30", "--waiters", "70"])
            .expect("parse");
        assert!(cli.runs(4) && cli.runs(10) && !cli.runs(1));
        let sizes = cli.sizes();
        assert_eq!((sizes.queues, sizes.waiting.0), ((3, 30), 70));
        assert_eq!(sizes.ops, crate::SMOKE.ops);
        assert!(cli.destination().is_none(), "no file without --out");
        assert_eq!(cli.size_args(), ["--queues", "3,30", "--smoke"]);
        let cli = parse(&["--write-benchmarks"]).expect("parse");
        assert_eq!(cli.destination().and_then(|p| p.to_str()), Some("BENCHMARKS.md"));
        assert!(cli.runs(1) && cli.runs(10));
    }

    #[test]
    fn out_never_names_benchmarks_md() {
        for out in ["BENCHMARKS.md", "./BENCHMARKS.md", "/tmp/x/../BENCHMARKS.md"] {
            let cli = parse(&["--out", out]).expect("parse");
            assert!(cli.check().is_err_and(|e| e.to_string().contains("--write-benchmarks")));
        }
    }
}
