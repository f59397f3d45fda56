//! `RWLOCK.INFO`'s readers, `RLOCK.INFO` on a read-write lock (WRONGTYPE, as every other
//! `RLOCK.*` command), and the cost `COMMAND DOCS` gives the commands that loop.

use redis::{Connection, Value};
use rlock_tests_integration::{cmd, run_str, Server};

use super::{field, text};

// ---- RWLOCK.INFO's readers ----------------------------------------------------------------------

#[test]
fn rwlock_info_readers_counts_the_reader_owners() {
    let server = Server::start();
    let mut con = server.conn();
    for owner in ["a", "b", "b"] {
        cmd(&mut con, &["RWLOCK.ACQUIRE", "rw", owner, "READ", "60000"]);
    }
    let info = cmd(&mut con, &["RWLOCK.INFO", "rw"]);
    assert_eq!(field(&info, "readers"), Some(Value::Int(2)), "{info:?}");
    assert_eq!(field(&info, "read_holds"), Some(Value::Int(3)), "{info:?}");
}

// ---- RLOCK.INFO on a read-write lock; the cost in COMMAND DOCS ----------------------------------

/// `RLOCK.INFO` on a read-write lock says what every other `RLOCK.*` command says there
/// (WRONGTYPE), not "not a reentrant lock (it needs exactly one owner field)" as for a foreign
/// hash.
#[test]
fn rlock_info_on_a_read_write_lock_says_wrongtype_as_the_other_rlock_commands() {
    let server = Server::start();
    let mut con = server.conn();
    cmd(&mut con, &["RWLOCK.ACQUIRE", "rw", "a", "READ", "60000"]);
    let wrongtype = "WRONGTYPE the key holds a read-write lock, not a reentrant lock: use RWLOCK.*";
    for args in [&["RLOCK.RELEASE", "rw", "a"][..], &["RLOCK.INFO", "rw"]] {
        assert_eq!(run_str(&mut con, args), Err(wrongtype.to_owned()), "{args:?}");
    }
    // A hash that is no lock at all is still named as such.
    cmd(&mut con, &["HSET", "h", "a", "1", "b", "1"]);
    let err = run_str(&mut con, &["RLOCK.INFO", "h"]).unwrap_err();
    assert!(err.starts_with("ERR the key is a hash but not a reentrant lock"), "{err}");
}

/// `COMMAND DOCS` gives each command's cost, not O(1) for all: a read release and
/// `RWLOCK.INFO` read every read hold, and leased permits cost a zset operation each.
#[test]
fn command_docs_give_the_cost_of_the_commands_that_loop() {
    let server = Server::start();
    let mut con = server.conn();
    let complexity = |con: &mut Connection, name: &str| {
        let reply = cmd(con, &["COMMAND", "DOCS", name]);
        text(&field(&field(&reply, name).expect("docs"), "complexity").expect("complexity"))
    };
    for name in ["rwlock.release", "rwlock.info", "rsem.acquire", "rsem.release", "rsem.info"] {
        let cost = complexity(&mut con, name);
        assert!(cost.contains("O(N)") || cost.contains("log N"), "{name}: {cost}");
    }
    assert_eq!(complexity(&mut con, "rlock.acquire"), "O(1)");
}
