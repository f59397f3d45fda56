//! What the Rust client's tests share: a client of a test server, and what they read on that
//! server beside the client (a hash as text, a semaphore's free permits, every key), waits for
//! a key to go, and ACL users made for a test.

use std::time::Duration;

use rlock_client::{LockClient, Options};

use crate::helpers::{hgetall, poll};
use crate::sentinel::{Sentinel, SENTINEL_MASTER};
use crate::server::Server;

/// How long [`until_gone`] waits: what the client does in the background (a give-back, a
/// cancel, a dropped guard's release) shows within it.
pub const BACKGROUND_LIMIT: Duration = Duration::from_secs(10);

/// A client of `server` with the default options.
///
/// # Panics
/// When the client cannot open.
pub async fn client(server: &Server) -> LockClient {
    LockClient::open(server.url()).await.expect("client")
}

/// A client of `server` with `options`.
///
/// # Panics
/// When the client cannot open.
pub async fn client_with(server: &Server, options: Options) -> LockClient {
    LockClient::with_options(server.client(), options).await.expect("client")
}

/// A client of the Sentinel group `sentinel` watches, with the default options.
///
/// # Panics
/// When the client cannot open.
pub async fn sentinel_client(sentinel: &Sentinel) -> LockClient {
    LockClient::sentinel(
        vec![sentinel.url()],
        SENTINEL_MASTER,
        "redis://127.0.0.1/",
        Options::default(),
    )
    .await
    .expect("sentinel client")
}

/// The hash `name` (a lock or read-write lock) as text pairs, read on a connection of the test.
#[must_use]
pub fn fields(server: &Server, name: &str) -> Vec<(String, String)> {
    hgetall(&mut server.conn(), name.as_bytes())
        .into_iter()
        .map(|(f, v)| {
            (String::from_utf8_lossy(&f).into_owned(), String::from_utf8_lossy(&v).into_owned())
        })
        .collect()
}

/// The value of field `field` of the hash `name`.
#[must_use]
pub fn field(server: &Server, name: &str, field: &str) -> Option<String> {
    fields(server, name).into_iter().find(|(f, _)| f == field).map(|(_, v)| v)
}

/// Polls (blocking, at most [`BACKGROUND_LIMIT`]) until the key `name` is gone.
///
/// # Panics
/// When it is still there then, naming `what`.
pub fn until_gone(server: &Server, name: &str, what: &str) {
    let mut con = server.conn();
    poll(what, BACKGROUND_LIMIT, || {
        let n: i64 = redis::cmd("EXISTS").arg(name).query(&mut con).expect("EXISTS");
        (n == 0).then_some(())
    });
}

/// `RSEM.AVAILABLE name`, on a connection of the test's own.
///
/// # Panics
/// When the command fails.
#[must_use]
pub fn available(server: &Server, name: &str) -> i64 {
    redis::cmd("RSEM.AVAILABLE").arg(name).query(&mut server.conn()).expect("RSEM.AVAILABLE")
}

/// Every key of `server`, sorted (for "nothing left behind" checks).
///
/// # Panics
/// When `KEYS` fails.
#[must_use]
pub fn keys(server: &Server) -> Vec<String> {
    let mut keys: Vec<String> =
        redis::cmd("KEYS").arg("*").query(&mut server.conn()).expect("KEYS");
    keys.sort();
    keys
}

/// Creates the ACL user `name` (password `pw`) with only `rules`; the URL a client opens as it.
///
/// # Panics
/// When `ACL SETUSER` fails.
#[must_use]
pub fn acl_user(server: &Server, name: &str, rules: &[&str]) -> String {
    let mut setuser = redis::cmd("ACL");
    setuser.arg("SETUSER").arg(name).arg("reset").arg("on").arg(">pw");
    for rule in rules {
        setuser.arg(*rule);
    }
    let () = setuser.query(&mut server.conn()).expect("ACL SETUSER");
    format!("redis://{name}:pw@127.0.0.1:{}/", server.port())
}

/// Whether `server` has the key `name`, asked on a connection of its own with short timeouts
/// (false when it cannot be asked: a stopped or stalled server holds nothing a client can use).
#[must_use]
pub fn has_key(server: &Server, name: &str) -> bool {
    let Ok(mut con) = server.client().get_connection_with_timeout(Duration::from_millis(500))
    else {
        return false;
    };
    let _ = con.set_read_timeout(Some(Duration::from_secs(1)));
    redis::cmd("EXISTS").arg(name).query::<i64>(&mut con).is_ok_and(|n| n == 1)
}
