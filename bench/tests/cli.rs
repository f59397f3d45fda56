//! `rlock-bench`'s command line, run as a new user would: the binary itself, in an empty
//! temporary directory (so a write shows), against a real server for the one run that measures.

use std::path::Path;
use std::process::{Command, Output};

/// Runs `rlock-bench args` in `dir`.
fn bench(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_rlock-bench"))
        .current_dir(dir)
        .args(args)
        .output()
        .expect("run rlock-bench")
}

/// The names of the files in `dir`.
fn files(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("read the temp dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn help_prints_the_usage_and_runs_nothing() {
    let dir = tempfile::tempdir().expect("temp dir");
    for flag in ["--help", "-h"] {
        let out = bench(dir.path(), &[flag]);
        assert_eq!(out.status.code(), Some(0), "{flag}: {}", text(&out.stderr));
        let stdout = text(&out.stdout);
        assert!(stdout.contains("Usage: rlock-bench"), "{flag}: {stdout}");
        for option in ["--only", "--out", "--write-benchmarks", "--server", "--smoke", "--waiters"]
        {
            assert!(stdout.contains(option), "{flag} does not document {option}: {stdout}");
        }
        assert!(!text(&out.stderr).contains("running"), "{flag} ran a section");
        assert!(files(dir.path()).is_empty(), "{flag} wrote {:?}", files(dir.path()));
    }
}

#[test]
fn a_bad_argument_prints_the_usage_exits_2_and_writes_nothing() {
    let dir = tempfile::tempdir().expect("temp dir");
    let cases: &[&[&str]] = &[
        &["--bogus"],
        &["4"],
        &["--only"],
        &["--only", "x"],
        &["--only", "0"],
        &["--only", "1,99"],
        &["--handoffs", "-5"],
        &["--waiters", "many"],
        &["--out"],
        // BENCHMARKS.md only with --write-benchmarks, a full run's file only from a full run.
        &["--out", "BENCHMARKS.md"],
        &["--out", "./sub/../BENCHMARKS.md"],
        &["--write-benchmarks", "--smoke"],
        &["--write-benchmarks", "--only", "6"],
        &["--write-benchmarks", "--out", "x.md"],
        &["--per-server", "--only", "1"],
        &["--per-server", "--servers", "Redis=/nonexistent/redis-server"],
        &["--server", "/nonexistent/redis-server"],
        &["--base-module", "/nonexistent/librlock.so"],
    ];
    for args in cases {
        let out = bench(dir.path(), args);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.to_lowercase().contains("usage"), "{args:?}: no usage in {stderr}");
        assert!(!stderr.contains("running"), "{args:?} ran a section: {stderr}");
        assert!(files(dir.path()).is_empty(), "{args:?} wrote {:?}", files(dir.path()));
    }
}

/// A real (tiny) run: its report goes to stdout, and BENCHMARKS.md is left alone; `--out`
/// writes the file it names and nothing else.
#[test]
fn a_run_never_writes_benchmarks_md_without_the_flag() {
    let dir = tempfile::tempdir().expect("temp dir");
    let benchmarks = dir.path().join("BENCHMARKS.md");
    std::fs::write(&benchmarks, "kept\n").expect("write");
    let out = bench(dir.path(), &["--smoke", "--only", "6", "--locks", "1000"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("== 6. Scale"), "{}", text(&out.stdout));
    assert_eq!(std::fs::read_to_string(&benchmarks).expect("read"), "kept\n");
    assert_eq!(files(dir.path()), ["BENCHMARKS.md"]);

    let out = bench(dir.path(), &["--smoke", "--only", "6", "--locks", "1000", "--out", "r.md"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let report = std::fs::read_to_string(dir.path().join("r.md")).expect("the --out file");
    assert!(report.contains("## 6. Scale") && report.contains("1000 locks"), "{report}");
    assert_eq!(std::fs::read_to_string(&benchmarks).expect("read"), "kept\n");
    assert_eq!(files(dir.path()), ["BENCHMARKS.md", "r.md"]);
}
