//! Issue 26 attacked as a hostile reviewer: a partial release keeps the checks the remaining
//! holds need, a lock moved by RENAME/MOVE/SWAPDB or dropped by FLUSHALL ASYNC leaves no timer
//! behind, MODULE UNLOAD is refused exactly while something is pending, the module unloads and
//! loads again in one server, and every odd spelling of every integer argument is an error in
//! Redis's terms that changes nothing.

use std::thread;
use std::time::{Duration, Instant};

use redis::{Connection, Value};
use rlock_tests_integration::{cmd, digest, info_field, module_path, poll, run_str, Server};

const LIMIT: Duration = Duration::from_secs(10);

fn unloadable_server() -> Server {
    Server::builder().config("enable-module-command", "yes").start()
}

fn timers(con: &mut Connection) -> i64 {
    info_field(con, "rlock", "rlock_timers_armed")
}

fn waiting(con: &mut Connection) -> i64 {
    info_field(con, "rlock", "rlock_waiting_clients")
}

/// Idle (no timer armed, no check scheduled, polled with a bound) and the module unloads.
fn assert_idle_and_unload(con: &mut Connection) {
    poll("no module timer armed", LIMIT, || (timers(con) == 0).then_some(()));
    assert_eq!(info_field(con, "rlock", "rlock_scheduled_checks"), 0);
    assert_eq!(cmd(con, &["MODULE", "UNLOAD", "rlock"]), Value::Okay);
}

/// Runs `args` on a new connection in a thread; the reply and how long it took.
fn in_thread(server: &Server, args: &[&str]) -> thread::JoinHandle<(Value, Duration)> {
    let mut con = server.conn();
    let args: Vec<String> = args.iter().map(|s| (*s).to_owned()).collect();
    thread::spawn(move || {
        let start = Instant::now();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        (cmd(&mut con, &args), start.elapsed())
    })
}

// ---- a partial release keeps the checks ------------------------------------------------------

/// A reader holding twice releases once: its remaining hold ends by its lease, and the writer
/// waiting behind it is served within a few hundred ms of that, not at its own timeout.
#[test]
fn a_partial_read_release_keeps_the_check_that_serves_the_writer() {
    let server = Server::start();
    let mut con = server.conn();
    assert_eq!(cmd(&mut con, &["RWLOCK.ACQUIRE", "rw", "r", "READ", "600"]), Value::Nil);
    assert_eq!(cmd(&mut con, &["RWLOCK.ACQUIRE", "rw", "r", "READ", "600"]), Value::Nil);
    let writer =
        in_thread(&server, &["RWLOCK.ACQUIRE", "rw", "w", "WRITE", "30000", "WAIT", "8000"]);
    poll("the writer waits", LIMIT, || (waiting(&mut con) == 1).then_some(()));
    assert_eq!(cmd(&mut con, &["RWLOCK.RELEASE", "rw", "r", "READ"]), Value::Int(0));
    let (reply, took) = writer.join().expect("writer");
    assert_eq!(reply, Value::Nil, "the writer holds it");
    assert!(took < Duration::from_millis(3000), "served {took:?} after asking (lease 600 ms)");
}

/// Two readers: one releases (a partial release of the lock), the other's lease ends while the
/// key lives on (RWLOCK.RENEW of the first made it longer before): the dead reader is removed
/// and the waiting writer served.
#[test]
fn a_release_by_one_reader_keeps_the_dead_reader_check_of_the_other() {
    let server = Server::start();
    let mut con = server.conn();
    assert_eq!(cmd(&mut con, &["RWLOCK.ACQUIRE", "rw", "a", "READ", "60000"]), Value::Nil);
    assert_eq!(cmd(&mut con, &["RWLOCK.ACQUIRE", "rw", "b", "READ", "500"]), Value::Nil);
    let writer =
        in_thread(&server, &["RWLOCK.ACQUIRE", "rw", "w", "WRITE", "30000", "WAIT", "8000"]);
    poll("the writer waits", LIMIT, || (waiting(&mut con) == 1).then_some(()));
    assert_eq!(cmd(&mut con, &["RWLOCK.RELEASE", "rw", "a", "READ"]), Value::Int(0));
    let (reply, took) = writer.join().expect("writer");
    assert_eq!(reply, Value::Nil, "the writer holds it");
    assert!(took < Duration::from_millis(3000), "served {took:?} after asking (b's lease 500 ms)");
}

/// Two leased permits of two, a waiter for two: one released by id (a partial release), the
/// other's lease ends, and the reclaim serves the waiter.
#[test]
fn releasing_one_of_two_leased_permits_keeps_the_reclaim_of_the_other() {
    let server = Server::start();
    let mut con = server.conn();
    cmd(&mut con, &["RSEM.SETPERMITS", "s", "2"]);
    let a: Vec<Vec<u8>> = redis::cmd("RSEM.ACQUIRE")
        .arg("s")
        .arg(1)
        .arg("LEASE")
        .arg(60_000)
        .query(&mut con)
        .expect("a");
    let _b: Vec<Vec<u8>> = redis::cmd("RSEM.ACQUIRE")
        .arg("s")
        .arg(1)
        .arg("LEASE")
        .arg(500)
        .query(&mut con)
        .expect("b");
    let waiter = in_thread(&server, &["RSEM.ACQUIRE", "s", "2", "WAIT", "8000"]);
    poll("the waiter waits", LIMIT, || (waiting(&mut con) == 1).then_some(()));
    let released: i64 =
        redis::cmd("RSEM.RELEASE").arg("s").arg("ID").arg(&a[0]).query(&mut con).expect("release");
    assert_eq!(released, 1);
    let (reply, took) = waiter.join().expect("waiter");
    assert_eq!(reply, Value::Int(1), "the waiter got both permits");
    assert!(took < Duration::from_millis(3000), "served {took:?} after asking (lease 500 ms)");
}

// ---- keys moved or dropped behind the module's back -------------------------------------------

#[test]
fn a_renamed_read_hold_released_under_its_new_name_leaves_no_timer() {
    let server = unloadable_server();
    let mut con = server.conn();
    cmd(&mut con, &["RWLOCK.ACQUIRE", "rw", "a", "READ", "60000"]);
    cmd(&mut con, &["RENAME", "rw", "rw2"]);
    assert_eq!(cmd(&mut con, &["RWLOCK.RELEASE", "rw2", "a", "READ"]), Value::Int(1));
    assert_idle_and_unload(&mut con);
}

/// The look again after a RENAME keeps the check of another lock's live read hold.
#[test]
fn a_renamed_lock_released_keeps_the_checks_of_other_live_holds() {
    let server = unloadable_server();
    let mut con = server.conn();
    cmd(&mut con, &["RWLOCK.ACQUIRE", "live", "a", "READ", "60000"]);
    cmd(&mut con, &["RWLOCK.ACQUIRE", "rw", "a", "READ", "60000"]);
    cmd(&mut con, &["RENAME", "rw", "rw2"]);
    assert_eq!(cmd(&mut con, &["RWLOCK.RELEASE", "rw2", "a", "READ"]), Value::Int(1));
    poll("the stale check gone", LIMIT, || {
        (info_field(&mut con, "rlock", "rlock_scheduled_checks") == 1).then_some(())
    });
    assert_eq!(timers(&mut con), 1, "live's hold is still looked at");
    assert!(run_str(&mut con, &["MODULE", "UNLOAD", "rlock"]).is_err(), "live is held");
    assert_eq!(cmd(&mut con, &["RWLOCK.RELEASE", "live", "a", "READ"]), Value::Int(1));
    assert_idle_and_unload(&mut con);
}

#[test]
fn a_moved_read_hold_released_in_its_new_database_leaves_no_timer() {
    let server = unloadable_server();
    let mut con = server.conn();
    cmd(&mut con, &["RWLOCK.ACQUIRE", "rw", "a", "READ", "60000"]);
    cmd(&mut con, &["MOVE", "rw", "1"]);
    cmd(&mut con, &["SELECT", "1"]);
    assert_eq!(cmd(&mut con, &["RWLOCK.RELEASE", "rw", "a", "READ"]), Value::Int(1));
    assert_idle_and_unload(&mut con);
}

#[test]
fn a_swapped_read_hold_released_in_its_new_database_leaves_no_timer() {
    let server = unloadable_server();
    let mut con = server.conn();
    cmd(&mut con, &["RWLOCK.ACQUIRE", "rw", "a", "READ", "60000"]);
    cmd(&mut con, &["SWAPDB", "0", "1"]);
    cmd(&mut con, &["SELECT", "1"]);
    assert_eq!(cmd(&mut con, &["RWLOCK.RELEASE", "rw", "a", "READ"]), Value::Int(1));
    assert_idle_and_unload(&mut con);
}

#[test]
fn a_flushall_async_leaves_no_timer() {
    let server = unloadable_server();
    let mut con = server.conn();
    cmd(&mut con, &["RWLOCK.ACQUIRE", "rw", "a", "READ", "60000"]);
    cmd(&mut con, &["RSEM.SETPERMITS", "s", "1"]);
    cmd(&mut con, &["RSEM.ACQUIRE", "s", "1", "LEASE", "60000"]);
    cmd(&mut con, &["FLUSHALL", "ASYNC"]);
    assert_idle_and_unload(&mut con);
}

// ---- MODULE UNLOAD and LOAD --------------------------------------------------------------------

#[test]
fn module_unload_is_refused_while_a_client_waits_and_a_hold_is_looked_at() {
    let server = unloadable_server();
    let mut con = server.conn();
    cmd(&mut con, &["RLOCK.ACQUIRE", "l", "a", "60000"]);
    let waiter = in_thread(&server, &["RLOCK.ACQUIRE", "l", "b", "60000", "WAIT", "20000"]);
    poll("the waiter waits", LIMIT, || (waiting(&mut con) == 1).then_some(()));
    assert!(run_str(&mut con, &["MODULE", "UNLOAD", "rlock"]).is_err(), "a client waits");
    assert_eq!(cmd(&mut con, &["RLOCK.RELEASE", "l", "a"]), Value::Int(1));
    assert_eq!(waiter.join().expect("waiter").0, Value::Nil);
    cmd(&mut con, &["RLOCK.RELEASE", "l", "b"]);
    cmd(&mut con, &["RWLOCK.ACQUIRE", "rw", "a", "READ", "60000"]);
    assert!(run_str(&mut con, &["MODULE", "UNLOAD", "rlock"]).is_err(), "a read hold is looked at");
    assert_eq!(cmd(&mut con, &["RWLOCK.RELEASE", "rw", "a", "READ"]), Value::Int(1));
    assert_idle_and_unload(&mut con);
}

/// Unloaded and loaded again in one server: the commands, settings, INFO and waiting work as
/// on a fresh load (no static left from the first load in the way); a second load is refused.
#[test]
fn the_module_loads_again_after_an_unload() {
    let server = unloadable_server();
    let mut con = server.conn();
    let path = module_path().display().to_string();
    cmd(&mut con, &["CONFIG", "SET", "rlock.stall-ms", "2000"]);
    cmd(&mut con, &["RLOCK.ACQUIRE", "l", "a", "60000"]);
    let waiter = in_thread(&server, &["RLOCK.ACQUIRE", "l", "b", "60000", "WAIT", "20000"]);
    poll("the waiter waits", LIMIT, || (waiting(&mut con) == 1).then_some(()));
    cmd(&mut con, &["RLOCK.RELEASE", "l", "a"]);
    assert_eq!(waiter.join().expect("waiter").0, Value::Nil);
    cmd(&mut con, &["RLOCK.RELEASE", "l", "b"]);
    assert_eq!(info_field(&mut con, "rlock", "rlock_waits"), 1);
    assert!(run_str(&mut con, &["MODULE", "LOAD", &path]).is_err(), "loaded twice");
    assert_idle_and_unload(&mut con);
    assert!(run_str(&mut con, &["RLOCK.ACQUIRE", "l", "a", "60000"]).is_err(), "unloaded");
    assert_eq!(cmd(&mut con, &["MODULE", "LOAD", &path]), Value::Okay);
    let stall: Vec<String> =
        redis::cmd("CONFIG").arg("GET").arg("rlock.stall-ms").query(&mut con).expect("CONFIG");
    assert_eq!(stall, ["rlock.stall-ms", "1500"], "a fresh load has the default");
    assert_eq!(info_field(&mut con, "rlock", "rlock_waits"), 0, "a fresh load counts afresh");
    assert_eq!(info_field(&mut con, "rlock", "rlock_handoffs"), 0, "a fresh load counts afresh");
    assert_eq!(server.log().matches("<rlock> rlock ").count(), 2, "a load line each time");
    cmd(&mut con, &["RLOCK.ACQUIRE", "l", "a", "60000"]);
    let waiter = in_thread(&server, &["RLOCK.ACQUIRE", "l", "b", "60000", "WAIT", "20000"]);
    poll("the waiter waits", LIMIT, || (waiting(&mut con) == 1).then_some(()));
    assert_eq!(cmd(&mut con, &["RLOCK.RELEASE", "l", "a"]), Value::Int(1));
    assert_eq!(waiter.join().expect("waiter").0, Value::Nil);
    cmd(&mut con, &["RLOCK.RELEASE", "l", "b"]);
    assert_eq!(cmd(&mut con, &["PING"]), Value::SimpleString("PONG".into()));
    assert!(!server.log().contains("Skip register defrag"), "{}", server.log());
    assert_idle_and_unload(&mut con);
}

// ---- number errors ---------------------------------------------------------------------------

/// Every integer argument of every command, each odd spelling Redis itself refuses (`""`,
/// `-0`, `+1`, `0x10`, ` 1`, `1 `, over and under i64): an `ERR` naming that argument, nothing
/// changed. i64::MAX is a number (a valid one, or out of the argument's own range).
#[test]
fn every_integer_argument_refuses_every_odd_spelling_and_changes_nothing() {
    let server = Server::start();
    let mut con = server.conn();
    cmd(&mut con, &["SET", "unrelated", "1"]);
    cmd(&mut con, &["RSEM.SETPERMITS", "S", "3"]);
    cmd(&mut con, &["RLOCK.ACQUIRE", "L", "a", "60000"]);
    cmd(&mut con, &["RWLOCK.ACQUIRE", "R", "a", "READ", "60000"]);
    let before = digest(&mut con);
    let odd = ["", "-0", "+1", "0x10", " 1", "1 ", "9223372036854775808", "-9223372036854775809"];
    // (the command with X where the number goes, the argument's name)
    let forms: [(&[&str], &str); 14] = [
        (&["RLOCK.ACQUIRE", "L", "b", "X"], "lease-ms"),
        (&["RLOCK.ACQUIRE", "L", "b", "10", "WAIT", "X"], "timeout-ms"),
        (&["RLOCK.RENEW", "L", "a", "X"], "lease-ms"),
        (&["RWLOCK.ACQUIRE", "R", "b", "READ", "X"], "lease-ms"),
        (&["RWLOCK.ACQUIRE", "R", "b", "WRITE", "10", "WAIT", "X"], "timeout-ms"),
        (&["RWLOCK.RENEW", "R", "a", "X"], "lease-ms"),
        (&["RSEM.ACQUIRE", "S", "X"], "permits"),
        (&["RSEM.ACQUIRE", "S", "1", "LEASE", "X"], "lease-ms"),
        (&["RSEM.ACQUIRE", "S", "1", "WAIT", "X"], "timeout-ms"),
        (&["RSEM.RELEASE", "S", "X"], "permits"),
        (&["RSEM.SETPERMITS", "S", "X"], "permits"),
        (&["RSEM.ADDPERMITS", "S", "X"], "delta"),
        (&["RSEM.RENEW", "S", "someid", "X"], "lease-ms"),
        (&["RLOCK.RELEASE", "L", "a", "X"], "lease-ms"),
    ];
    let mut wrong = Vec::new();
    for (form, name) in forms {
        for value in odd {
            let args: Vec<&str> = form.iter().map(|a| if *a == "X" { value } else { a }).collect();
            match run_str(&mut con, &args) {
                Err(e) if e.starts_with(&format!("ERR {name} ")) => {}
                other => wrong.push(format!("{args:?}: {other:?}")),
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    assert_eq!(digest(&mut con), before, "an error changed something");
}
