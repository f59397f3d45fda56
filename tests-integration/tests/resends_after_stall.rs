//! Resends that waited in a stalled server: a release sent again with its `REQUEST`/`ONCE` id
//! may sit in the server's buffers while the server is
//! stopped (SIGSTOP, a VM pause, a long command) and run when it resumes, after the record of
//! the first send ended (a release's latch: 10 s; `ONCE`: 60 s). Taken as new, such a resend
//! would end the owner's later hold, or give permits back twice. Right after
//! a stall (no cron check for longer than `rlock.stall-ms`), an id the server has no record of
//! is refused with `TRYAGAIN` and nothing changes; known ids replay as always, and the retry
//! after the server's next check is taken as new.

use std::thread;
use std::time::Duration;

use redis::Value;
use rlock_tests_integration::{cmd, int, poll, run_str, Server};

const LIMIT: Duration = Duration::from_secs(10);

/// Sends each command on a connection of its own while `server` is stopped for `stall`, then
/// resumes it; returns each command's reply (or error text).
fn through_a_stall(
    server: &Server,
    stall: Duration,
    commands: &[Vec<String>],
) -> Vec<Result<Value, String>> {
    let mut cons: Vec<_> = commands.iter().map(|_| server.conn()).collect();
    for con in &cons {
        con.set_read_timeout(Some(stall + LIMIT)).expect("timeout");
    }
    server.pause();
    let sent: Vec<_> = cons
        .drain(..)
        .zip(commands.iter().cloned())
        .map(|(mut con, args)| {
            thread::spawn(move || {
                let args: Vec<&str> = args.iter().map(String::as_str).collect();
                run_str(&mut con, &args)
            })
        })
        .collect();
    thread::sleep(stall);
    server.resume();
    sent.into_iter().map(|t| t.join().expect("sender")).collect()
}

fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|a| (*a).to_string()).collect()
}

fn refused_as_stalled(reply: &Result<Value, String>) -> bool {
    matches!(reply, Err(e) if e.starts_with("TRYAGAIN this server did not run"))
}

#[test]
fn a_release_resent_through_a_stall_past_its_latch_leaves_the_owners_later_hold() {
    let server = Server::start();
    let mut con = server.conn();
    cmd(&mut con, &["RLOCK.ACQUIRE", "stalled:lock", "owner:1", "60000"]);
    // The first send ran (its latch remembers it for 10 s); the owner takes the lock again.
    assert_eq!(
        int(&cmd(&mut con, &["RLOCK.RELEASE", "stalled:lock", "owner:1", "REQUEST", "r1"])),
        1
    );
    cmd(&mut con, &["RLOCK.ACQUIRE", "stalled:lock", "owner:1", "60000"]);
    // A resend of that release waits in the stopped server past the latch's end.
    let release = strings(&["RLOCK.RELEASE", "stalled:lock", "owner:1", "REQUEST", "r1"]);
    let replies = through_a_stall(&server, Duration::from_millis(10_500), &[release]);
    assert!(refused_as_stalled(&replies[0]), "the late resend ran: {:?}", replies[0]);
    let info = cmd(&mut con, &["RLOCK.INFO", "stalled:lock"]);
    assert_ne!(info, Value::Nil, "the owner's later hold was ended by a late resend");
}

#[test]
fn ids_unknown_right_after_a_stall_are_refused_until_the_next_check() {
    let server = Server::start();
    let mut con = server.conn();
    cmd(&mut con, &["RSEM.SETPERMITS", "stalled:sem", "3"]);
    cmd(&mut con, &["RSEM.ACQUIRE", "stalled:sem", "1"]);
    cmd(&mut con, &["RLOCK.ACQUIRE", "stalled:lock", "owner:1", "60000"]);
    cmd(&mut con, &["RWLOCK.ACQUIRE", "stalled:rw", "owner:1", "WRITE", "60000"]);
    // A known id: its latch replays what it did, stall or not.
    cmd(&mut con, &["RLOCK.ACQUIRE", "stalled:known", "owner:1", "60000"]);
    assert_eq!(
        int(&cmd(&mut con, &["RLOCK.RELEASE", "stalled:known", "owner:1", "REQUEST", "k"])),
        1
    );
    let unknown = [
        strings(&["RSEM.RELEASE", "stalled:sem", "1", "ONCE", "once-1"]),
        strings(&["RLOCK.RELEASE", "stalled:lock", "owner:1", "REQUEST", "r1"]),
        strings(&["RWLOCK.RELEASE", "stalled:rw", "owner:1", "WRITE", "REQUEST", "r2"]),
    ];
    let known = strings(&["RLOCK.RELEASE", "stalled:known", "owner:1", "REQUEST", "k"]);
    let mut all = unknown.to_vec();
    all.push(known);
    let replies = through_a_stall(&server, Duration::from_millis(2_500), &all);
    for (args, reply) in unknown.iter().zip(&replies) {
        assert!(refused_as_stalled(reply), "{args:?} right after the stall: {reply:?}");
    }
    assert_eq!(replies[3], Ok(Value::Int(1)), "a known id replays its first reply");
    // Nothing changed.
    assert_eq!(int(&cmd(&mut con, &["RSEM.AVAILABLE", "stalled:sem"])), 2);
    assert_ne!(cmd(&mut con, &["RLOCK.INFO", "stalled:lock"]), Value::Nil);
    assert_ne!(cmd(&mut con, &["RWLOCK.INFO", "stalled:rw"]), Value::Nil);
    // After the next check, the same commands are new ones.
    let retried = poll("the ONCE release taken after the next check", LIMIT, || {
        run_str(&mut con, &["RSEM.RELEASE", "stalled:sem", "1", "ONCE", "once-1"]).ok()
    });
    assert_eq!(int(&retried), 3);
    assert_eq!(
        int(&cmd(&mut con, &["RLOCK.RELEASE", "stalled:lock", "owner:1", "REQUEST", "r1"])),
        1
    );
    let rw = ["RWLOCK.RELEASE", "stalled:rw", "owner:1", "WRITE", "REQUEST", "r2"];
    assert_eq!(int(&cmd(&mut con, &rw)), 1);
}
