//! Running the Python package (`python/src/redis_rlock`) from a test: `python3` with
//! `PYTHONPATH` on this checkout's package, an inline script driven over stdin/stdout with every
//! read bounded ([`Py`]), and redis-cli's output for one command ([`redis_cli`]).

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use crate::{cli_binary, Server};

/// How long a script may take to say its next line, or to exit.
pub const STEP: Duration = Duration::from_secs(20);

/// What every script starts with: `r`, a redis-py client of the server (its port is
/// `sys.argv[1]`), `rl` (the package), `say(...)` (one flushed line) and `go()` (waits for the
/// test's `go`).
pub const PRELUDE: &str = r#"
import sys
import redis
import redis_rlock as rl
r = redis.Redis(port=int(sys.argv[1]))
def say(*a):
    print(*a, flush=True)
def go():
    line = sys.stdin.readline().strip()
    assert line == "go", repr(line)
"#;

/// This checkout's package sources (`python/src`).
#[must_use]
pub fn python_src() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../python/src")
}

/// `python3` (or `$PYTHON`) with `PYTHONPATH` on [`python_src`].
#[must_use]
pub fn python() -> Command {
    let mut c = Command::new(std::env::var("PYTHON").unwrap_or_else(|_| "python3".to_owned()));
    c.env("PYTHONPATH", python_src());
    c
}

/// Whether `python3` with redis-py is here; when not, prints why (or fails under
/// `RLOCK_REQUIRE_PYTHON`).
#[must_use]
pub fn python_ready() -> bool {
    let out = python().args(["-c", "import redis, redis_rlock"]).output();
    let why = match out {
        Ok(o) if o.status.success() => return true,
        Ok(o) => String::from_utf8_lossy(&o.stderr).into_owned(),
        Err(e) => format!("cannot run python3: {e}"),
    };
    assert!(
        std::env::var_os("RLOCK_REQUIRE_PYTHON").is_none(),
        "RLOCK_REQUIRE_PYTHON is set but python3 with redis-py is not usable: {why}"
    );
    eprintln!("SKIPPED: python3 with redis-py (pip install 'redis>=5') is needed: {why}");
    false
}

/// A running Python script: its stdout lines, its stdin, its stderr kept for failures.
pub struct Py {
    child: Child,
    stdin: ChildStdin,
    lines: Receiver<String>,
    stderr: Arc<Mutex<String>>,
}

impl Py {
    /// Runs [`PRELUDE`] then `script` against `server`.
    ///
    /// # Panics
    /// When `python3` cannot be started.
    #[must_use]
    pub fn start(server: &Server, script: &str) -> Self {
        let mut child = python()
            .arg("-c")
            .arg(format!("{PRELUDE}\n{script}"))
            .arg(server.port().to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("python3");
        let stdin = child.stdin.take().expect("stdin");
        let (tx, lines) = mpsc::channel();
        let stdout = child.stdout.take().expect("stdout");
        thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let stderr = Arc::new(Mutex::new(String::new()));
        let (sink, mut err) = (Arc::clone(&stderr), child.stderr.take().expect("stderr"));
        thread::spawn(move || {
            let mut text = String::new();
            let _ = std::io::Read::read_to_string(&mut err, &mut text);
            *sink.lock().expect("stderr") = text;
        });
        Self { child, stdin, lines, stderr }
    }

    /// The next line, which must start with `word`; returns the words after it.
    ///
    /// # Panics
    /// When no line comes within [`STEP`] (the script's stderr is shown) or it is another.
    pub fn line(&mut self, word: &str) -> Vec<String> {
        let line = self.lines.recv_timeout(STEP).unwrap_or_else(|_| {
            let _ = self.child.kill();
            thread::sleep(Duration::from_millis(100));
            panic!("python: no `{word}` line within {STEP:?}; stderr:\n{}", self.stderr())
        });
        let mut words = line.split(' ').map(str::to_owned);
        assert_eq!(words.next().as_deref(), Some(word), "python said {line:?}");
        words.collect()
    }

    /// Lets the script past its next `go()`.
    ///
    /// # Panics
    /// When the script's stdin is closed.
    pub fn go(&mut self) {
        self.stdin.write_all(b"go\n").and_then(|()| self.stdin.flush()).expect("python stdin");
    }

    /// Waits (bounded by [`STEP`]) for a clean exit.
    ///
    /// # Panics
    /// When the script fails or does not exit in time.
    pub fn finish(mut self) {
        let until = Instant::now() + STEP;
        loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                thread::sleep(Duration::from_millis(50)); // the stderr reader's last read
                assert!(status.success(), "python exited with {status}:\n{}", self.stderr());
                return;
            }
            assert!(Instant::now() < until, "python did not exit within {STEP:?}");
            thread::sleep(Duration::from_millis(10));
        }
    }

    /// What the script wrote on stderr so far (all of it once it exited).
    ///
    /// # Panics
    /// When the reader thread panicked.
    #[must_use]
    pub fn stderr(&self) -> String {
        self.stderr.lock().expect("stderr").clone()
    }
}

impl Drop for Py {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// redis-cli's output lines for one command.
///
/// # Panics
/// When the cli cannot run or fails.
#[must_use]
pub fn redis_cli(server: &Server, args: &[&str]) -> Vec<String> {
    let out = Command::new(cli_binary())
        .args(["-h", "127.0.0.1", "-p", &server.port().to_string()])
        .args(args)
        .output()
        .expect("redis-cli");
    assert!(out.status.success(), "redis-cli {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).lines().map(str::to_owned).collect()
}
