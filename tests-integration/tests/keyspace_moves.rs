//! A lock moved under its holders and waiters (`SWAPDB`, `MOVE`, `RENAME`): waiters are served,
//! clients stay in their databases, grants undone where the lock went.

use std::time::Duration;

use redis::{Connection, Value};

use rlock_tests_integration::{cmd, hgetall, info_field, poll, wait_blocked, Pending, Server};

/// Runs `release` (which hands the lock to the one waiter, blocked with `wait`), kills that
/// waiter before its reply and swaps databases 0 and 1, all in one `MULTI`: the grant is undone
/// (its client left) after the swap moved it to database 1.
fn grant_undone_after_a_swap(
    server: &Server,
    con: &mut Connection,
    wait: &[&str],
    release: &[&str],
) {
    let waiter = Pending::start_str(server, wait);
    wait_blocked(con, 1);
    let id = waiter.client_id().to_string();
    let mut pipe = redis::pipe();
    pipe.atomic();
    pipe.cmd(release[0]).arg(&release[1..]).ignore();
    pipe.cmd("CLIENT").arg("KILL").arg("ID").arg(&id).ignore();
    pipe.cmd("SWAPDB").arg(0).arg(1).ignore();
    let () = pipe.query(con).expect("MULTI");
    drop(waiter);
    // The undo is counted when the client goes, and runs on the module's next timer tick.
    poll("the undo", Duration::from_secs(10), || {
        (info_field(con, "rlock_waits", "rlock_grants_rolled_back") > 0
            && info_field(con, "rlock_waits", "rlock_timers_armed") == 0)
            .then_some(())
    });
}

/// A grant whose client left before its reply is undone on a 0 ms timer; a `SWAPDB` in
/// between (same event-loop turn: one `MULTI` here) moved the grant to the other database, but
/// the undo still looked in the old one: a semaphore permit was given back to whatever
/// semaphore the swap brought in under that name (one made from nothing here) while the real
/// one lost it for good, and a reentrant hold was left to its lease. The undo now follows the
/// swap.
#[test]
fn a_grant_undone_after_a_swapdb_is_undone_in_the_database_it_moved_to() {
    let server = Server::start();
    let mut con = server.conn();
    // Counted permits: the permit goes back to the semaphore that was granted from.
    cmd(&mut con, &["RSEM.SETPERMITS", "s", "0"]);
    grant_undone_after_a_swap(
        &server,
        &mut con,
        &["RSEM.ACQUIRE", "s", "1", "WAIT", "10000"],
        &["RSEM.RELEASE", "s", "1"],
    );
    assert_eq!(cmd(&mut con, &["EXISTS", "s"]), Value::Int(0), "no semaphore made from nothing");
    cmd(&mut con, &["SELECT", "1"]);
    assert_eq!(cmd(&mut con, &["GET", "s"]), Value::BulkString(b"1".to_vec()), "permit back");
    cmd(&mut con, &["FLUSHALL"]);
    cmd(&mut con, &["SELECT", "0"]);

    // A reentrant lock: the hold of the client that left is released where it now is.
    cmd(&mut con, &["RLOCK.ACQUIRE", "k", "A", "60000"]);
    grant_undone_after_a_swap(
        &server,
        &mut con,
        &["RLOCK.ACQUIRE", "k", "W", "60000", "WAIT", "10000"],
        &["RLOCK.RELEASE", "k", "A"],
    );
    cmd(&mut con, &["SELECT", "1"]);
    assert_eq!(cmd(&mut con, &["EXISTS", "k"]), Value::Int(0), "the gone client's hold stays");
}

const LIMIT: Duration = Duration::from_secs(10);

/// A lock with no expiry (taken by hand), a waiter, then `change` takes the lock out of db 0:
/// the waiter is served promptly.
fn waiter_follows(change: &[&str]) {
    let server = Server::start();
    let mut con = server.conn();
    cmd(&mut con, &["HSET", "k", "h", "1"]);
    let waiter = Pending::start_str(&server, &["RLOCK.ACQUIRE", "k", "w", "30000", "WAIT", "0"]);
    wait_blocked(&mut con, 1);
    cmd(&mut con, change);
    assert_eq!(waiter.reply(LIMIT).0, Ok(Value::Nil), "{change:?}; log:\n{}", server.log());
    let db0 = hgetall(&mut con, b"k");
    cmd(&mut con, &["SELECT", "1"]);
    let db1 = hgetall(&mut con, b"k");
    assert_eq!(db0, vec![(b"w".to_vec(), b"1".to_vec())], "{change:?}; db 1: {db1:?}");
}

#[test]
fn a_waiter_is_served_when_swapdb_takes_the_lock_away() {
    waiter_follows(&["SWAPDB", "0", "1"]);
}

#[test]
fn a_waiter_is_served_when_the_lock_is_moved_or_renamed_away() {
    waiter_follows(&["MOVE", "k", "1"]);
    waiter_follows(&["RENAME", "k", "elsewhere"]);
}

#[test]
fn a_move_leaves_its_client_in_its_own_database() {
    // Valkey 8.1 left the client of a MOVE in the destination database whenever a module
    // listened to keyspace events (valkey PR #4024); rlock selects it back.
    let server = Server::start();
    let mut con = server.conn();
    cmd(&mut con, &["SET", "k", "v"]);
    assert_eq!(cmd(&mut con, &["MOVE", "k", "1"]), Value::Int(1));
    assert_eq!(cmd(&mut con, &["EXISTS", "k"]), Value::Int(0), "still in db 0, where k is gone");
    cmd(&mut con, &["SET", "j", "v"]);
    assert_eq!(cmd(&mut con, &["MOVE", "j", "1"]), Value::Int(1));
}

#[test]
fn a_waiter_sees_the_lock_swapdb_brings_in() {
    let server = Server::start();
    let mut con = server.conn();
    cmd(&mut con, &["RLOCK.ACQUIRE", "k", "h", "60000"]);
    let waiter = Pending::start_str(&server, &["RLOCK.ACQUIRE", "k", "w", "30000", "WAIT", "0"]);
    wait_blocked(&mut con, 1);
    // db 1 holds the same lock with a short lease: after the swap, db 0's waiter gets it when
    // that lease ends, not 60 s later.
    cmd(&mut con, &["SELECT", "1"]);
    cmd(&mut con, &["RLOCK.ACQUIRE", "k", "h1", "300"]);
    cmd(&mut con, &["SWAPDB", "0", "1"]);
    assert_eq!(waiter.reply(LIMIT).0, Ok(Value::Nil));
    cmd(&mut con, &["SELECT", "0"]);
    assert_eq!(hgetall(&mut con, b"k"), vec![(b"w".to_vec(), b"1".to_vec())]);
}
