//! A program whose `current_thread` tokio `main` ends while a session guard is still alive,
//! for `tests/client_session_ha.rs`: `session_main <mode> <url> <lock>` takes `<lock>` through
//! a session (watchdog-renewed), prints "HELD", waits for a line on standard input, then lets
//! `main` end with the guard, the session and the client alive:
//!
//! - `local`: they are locals of the async `main`, dropped when it returns, inside the runtime;
//! - `task`: the guard lives in a spawned task that never ends, dropped while the runtime shuts
//!   down;
//! - `outlive`: they are returned from `block_on` and dropped after the runtime is gone.

use std::io::BufRead;

use rlock_client::{LockClient, LockGuard, Session};

/// Takes `lock` through a new session on `url`; prints "HELD".
async fn hold(url: &str, lock: &str) -> (LockClient, Session, LockGuard) {
    let client = LockClient::open(url).await.expect("client");
    let session = client.session().await.expect("session");
    let guard = session.lock(lock).acquire(None).await.expect("acquire");
    println!("HELD");
    (client, session, guard)
}

/// Waits for a line on standard input (off the runtime's thread).
async fn go() {
    tokio::task::spawn_blocking(|| std::io::stdin().lock().read_line(&mut String::new()))
        .await
        .expect("stdin task")
        .expect("stdin");
}

#[tokio::main(flavor = "current_thread")]
async fn local(url: &str, lock: &str) {
    let (_client, _session, _guard) = hold(url, lock).await;
    go().await;
}

#[tokio::main(flavor = "current_thread")]
async fn task(url: &str, lock: &str) {
    let (_client, _session, guard) = hold(url, lock).await;
    tokio::spawn(async move {
        let _guard = guard;
        std::future::pending::<()>().await;
    });
    go().await;
}

fn outlive(url: &str, lock: &str) {
    let runtime =
        tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let held = runtime.block_on(async {
        let held = hold(url, lock).await;
        go().await;
        held
    });
    drop(runtime);
    drop(held);
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, mode, url, lock] = args.as_slice() else {
        eprintln!("usage: session_main local|task|outlive <url> <lock>");
        std::process::exit(2);
    };
    match mode.as_str() {
        "local" => local(url, lock),
        "task" => task(url, lock),
        "outlive" => outlive(url, lock),
        other => panic!("unknown mode {other}"),
    }
}
