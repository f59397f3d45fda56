//! A line-driven client for tests of other clients against this crate (the Node.js package's
//! interop tests run it): reads one command a line on stdin, answers one line on stdout.
//! `cargo run -p rlock-client --example line_driver -- redis://127.0.0.1:6390/`
//!
//! Commands (`<kind>` is `lock`, `read` or `write`; `<secs>` a decimal number of seconds):
//! - `try <kind> <name>`: one try; `<token>` (or `-` for a read hold) when taken, `busy` if not
//! - `wait <kind> <name> <secs>`: waits in the server up to `<secs>`; as `try`, `timeout` if not
//! - `release <kind> <name>`: releases the guard taken last on that name and side; `ok`
//! - `countdown latch <name>`: counts the latch down; the count left
//! - `trysetcount latch <name> <n>`: sets the count if the latch is open; `1` or `0`
//! - `await latch <name> <secs>`: waits for the latch; `1` when it opened, `0` if not in time
//!
//! Every grant asks for a fencing token. An error answers `error <message>`; the process goes on.
//!
//! A test tool, not a user's example: it lives in a directory of its own (`examples/line_driver/`)
//! so that the docs check, which wants every `examples/*.rs` shown on a page, leaves it out.
use std::collections::HashMap;
use std::time::Duration;

use rlock_client::{Error, Lock, LockClient, LockGuard, Options, RwLock};

#[tokio::main]
async fn main() -> Result<(), Error> {
    let url = std::env::args().nth(1).unwrap_or_else(|| "redis://127.0.0.1:6390/".into());
    let client = LockClient::with_options(
        redis::Client::open(url.as_str())?,
        Options::default().fencing(true),
    )
    .await?;

    // stdin is read on a thread of its own: the runtime stays free for the watchdog.
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    std::thread::spawn(move || {
        for line in std::io::stdin().lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });

    let mut locks: HashMap<String, Lock> = HashMap::new();
    let mut rws: HashMap<String, RwLock> = HashMap::new();
    let mut guards: HashMap<(String, String), Vec<LockGuard>> = HashMap::new();
    while let Some(line) = rx.recv().await {
        let words: Vec<&str> = line.split_whitespace().collect();
        let answer = match words.as_slice() {
            [op @ ("try" | "wait" | "release"), kind, name, rest @ ..] => {
                let lock = match *kind {
                    "lock" => {
                        locks.entry((*name).to_owned()).or_insert_with(|| client.lock(name)).clone()
                    }
                    "read" | "write" => {
                        let rw =
                            rws.entry((*name).to_owned()).or_insert_with(|| client.rw_lock(name));
                        if *kind == "read" {
                            rw.read().clone()
                        } else {
                            rw.write().clone()
                        }
                    }
                    other => {
                        println!("error unknown kind {other}");
                        continue;
                    }
                };
                let slot = guards.entry(((*kind).to_owned(), (*name).to_owned())).or_default();
                if *op == "release" {
                    match slot.pop() {
                        None => "error nothing held".to_owned(),
                        Some(g) => match g.release().await {
                            Ok(()) => "ok".to_owned(),
                            Err(e) => format!("error {e}"),
                        },
                    }
                } else {
                    let wait = if *op == "try" { Duration::ZERO } else { secs(rest.first()) };
                    match lock.try_acquire(wait, Some(Duration::from_secs(30))).await {
                        Ok(g) => {
                            let token = g.token().map_or_else(|| "-".to_owned(), |t| t.to_string());
                            slot.push(g);
                            token
                        }
                        Err(Error::TimedOut) => {
                            (if *op == "try" { "busy" } else { "timeout" }).to_owned()
                        }
                        Err(e) => format!("error {e}"),
                    }
                }
            }
            ["countdown", "latch", name] => match client.latch(name).count_down().await {
                Ok(left) => left.to_string(),
                Err(e) => format!("error {e}"),
            },
            ["trysetcount", "latch", name, n] => {
                match client.latch(name).try_set_count(n.parse().unwrap_or(0)).await {
                    Ok(set) => u8::from(set).to_string(),
                    Err(e) => format!("error {e}"),
                }
            }
            ["await", "latch", name, s] => match client.latch(name).wait(Some(secs(Some(s)))).await
            {
                Ok(open) => u8::from(open).to_string(),
                Err(e) => format!("error {e}"),
            },
            _ => format!("error unknown command: {line}"),
        };
        println!("{answer}");
    }
    Ok(())
}

fn secs(word: Option<&&str>) -> Duration {
    Duration::from_secs_f64(word.and_then(|w| w.parse().ok()).unwrap_or(0.0))
}
