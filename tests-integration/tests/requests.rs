//! Exact cancellation: `REQUEST id` on every acquire (a retry replies the
//! first grant and adds nothing), `RLOCK.CANCEL key id` (gives a grant back, dequeues a waiter,
//! and makes sure the request never gets anything later), and the side-checked
//! `RWLOCK.RENEW key owner lease-ms READ|WRITE`. Every test runs each kind: a reentrant lock, a
//! read-write lock's read and write sides, counted and leased semaphore permits.

use std::time::{Duration, Instant};

use redis::{Connection, Value};

use rlock_tests_integration::kinds::{run_strings, strings, Kind, KINDS};
use rlock_tests_integration::{
    assert_replica_matches, blocked_clients, cmd, conn_as, digest, exists, hgetall, info_field,
    kill_client, pexpiretime, poll, queue_str, run_str, tag_is_free, wait_blocked,
    wait_replica_online, Pending, Server,
};

const LIMIT: Duration = Duration::from_secs(10);

/// The request record of request `id` on the lock `key` (a name without braces).
fn record(key: &str, id: &str) -> String {
    format!("rlock_request:{{{key}}}:{id}")
}

/// What a record holds (`None`: no record).
fn stored(con: &mut Connection, key: &str, id: &str) -> Option<Vec<u8>> {
    redis::cmd("GET").arg(record(key, id)).query(con).expect("GET")
}

/// The start of every record of a request on the lock `key` (it names its lock).
fn header(key: &str) -> String {
    format!("rlock-request:1:{}:{key}", key.len())
}

fn cancelled(con: &mut Connection, key: &str, id: &str) -> bool {
    stored(con, key, id).is_some_and(|v| v == format!("{}C", header(key)).as_bytes())
}

// ---- a retried acquire --------------------------------------------------------------------------

/// A retry with the same request id replies what the first grant replied and changes nothing
/// (no second count, no lease change, no second permit); once the grant is gone it is a new
/// acquire.
#[test]
fn a_retried_acquire_replies_the_first_grant_and_adds_nothing() {
    let server = Server::start();
    let mut con = server.conn();
    for kind in KINDS {
        let key = kind.key("");
        kind.setup(&mut con, &key);
        let first =
            run_strings(&mut con, &kind.acquire(&key, "o", Some("r1"), &[])).expect("acquire");
        assert!(kind.granted(&first), "{kind:?}: {first:?}");
        let holders = kind.holders(&mut con, &key);
        let before = digest(&mut con);
        for _ in 0..3 {
            let retry =
                run_strings(&mut con, &kind.acquire(&key, "o", Some("r1"), &[])).expect("retry");
            assert_eq!(retry, first, "{kind:?}: the first reply");
            assert_eq!(digest(&mut con), before, "{kind:?}: the retry changed nothing");
        }
        assert_eq!(kind.holders(&mut con, &key), holders, "{kind:?}");
        // The record lasts as long as the grant's lease (counted permits: until released).
        let until = pexpiretime(&mut con, record(&key, "r1").as_bytes());
        let lease_end = match kind {
            Kind::Lock | Kind::Write => pexpiretime(&mut con, key.as_bytes()),
            Kind::Read => pexpiretime(&mut con, format!("{{{key}}}:o:rwlock_timeout:1").as_bytes()),
            Kind::Counted => {
                assert_eq!(until, -1, "a counted grant's record has no end");
                -1
            }
            Kind::Leased => {
                let score: f64 = redis::cmd("ZSCORE")
                    .arg(format!("{{{key}}}:timeout"))
                    .arg(match &first {
                        Value::Array(ids) => match &ids[0] {
                            Value::BulkString(id) => id.clone(),
                            other => panic!("{other:?}"),
                        },
                        other => panic!("{other:?}"),
                    })
                    .query(&mut con)
                    .expect("ZSCORE");
                score as i64
            }
        };
        assert_eq!(until, lease_end, "{kind:?}: the record ends with the grant's lease");
        let now = rlock_tests_integration::server_time_ms(&mut con);
        let counted = kind == Kind::Counted;
        assert!(
            counted || until > now + 25_000 && until <= now + 60_000,
            "{kind:?}: {until} vs {now}"
        );
        // Released: a retry is a new acquire (counted permits carry no owner: replayed).
        kind.release(&mut con, &key, "o", &first);
        let again =
            run_strings(&mut con, &kind.acquire(&key, "o", Some("r1"), &[])).expect("again");
        assert!(kind.granted(&again), "{kind:?}: {again:?}");
        let expected = if kind == Kind::Counted { 0 } else { 1 };
        assert_eq!(kind.holders(&mut con, &key).len(), expected, "{kind:?}");
    }
    // With TOKEN: the same token, not a new one.
    for args in [
        &["RLOCK.ACQUIRE", "t1", "o", "30000", "TOKEN", "REQUEST", "r"][..],
        &["RWLOCK.ACQUIRE", "t2", "o", "WRITE", "30000", "REQUEST", "r", "TOKEN"],
    ] {
        let first = cmd(&mut con, args);
        assert_eq!(first, Value::Array(vec![Value::Int(1), Value::Int(1)]), "{args:?}");
        assert_eq!(cmd(&mut con, args), first, "{args:?}: the same token");
        assert_eq!(
            cmd(&mut con, &["GET", &format!("redisson_lock_token:{{{}}}", args[1])]),
            Value::BulkString(b"1".to_vec())
        );
    }
    // The same id for another acquire (another owner, side, count, or TOKEN): refused.
    for args in [
        &["RLOCK.ACQUIRE", "lock", "x", "30000", "REQUEST", "r1"][..],
        &["RLOCK.ACQUIRE", "t1", "o", "30000", "REQUEST", "r"],
        &["RWLOCK.ACQUIRE", "read", "o", "WRITE", "30000", "REQUEST", "r1"],
        &["RSEM.ACQUIRE", "counted", "2", "REQUEST", "r1"],
    ] {
        let before = digest(&mut con);
        let err = run_str(&mut con, args).expect_err("another acquire");
        assert!(
            err.starts_with(&format!(
                "ERR request {} belongs to another acquire",
                args[args.len() - 1]
            )),
            "{args:?}: {err}"
        );
        assert_eq!(digest(&mut con), before, "{args:?}");
    }
}

// ---- RLOCK.CANCEL -------------------------------------------------------------------------------

/// The blocked-command form of an acquire (a thread of its own).
fn start(server: &Server, args: &[String]) -> Pending {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    Pending::start_str(server, &args)
}

/// `RLOCK.CANCEL` of a granted request gives the grant back (2): its waiters are served, the
/// layout shows it gone. A retried cancel replies 0 and changes nothing; the request is then
/// refused for good, at once even with `WAIT`.
#[test]
fn cancel_gives_a_granted_request_back_once_and_it_never_gets_anything_again() {
    let server = Server::start();
    let mut con = server.conn();
    for kind in KINDS {
        let key = kind.key("");
        kind.setup(&mut con, &key);
        let first =
            run_strings(&mut con, &kind.acquire(&key, "o", Some("r1"), &[])).expect("acquire");
        assert!(kind.granted(&first), "{kind:?}: {first:?}");
        let rival = start(&server, &kind.rival(&key, &["WAIT", "0"]));
        wait_blocked(&mut con, 1);
        assert_eq!(cmd(&mut con, &["RLOCK.CANCEL", &key, "r1"]), Value::Int(2), "{kind:?}");
        let rival_grant = rival.reply(LIMIT).0.expect("served");
        let rival_kind = if kind == Kind::Read { Kind::Write } else { kind };
        assert!(rival_kind.granted(&rival_grant), "{kind:?}: the waiter is served");
        let holders = kind.holders(&mut con, &key);
        let expected = match kind {
            Kind::Lock => vec!["rival".to_owned()],
            Kind::Read | Kind::Write => vec!["rival:write".to_owned()],
            Kind::Counted => vec!["taken".to_owned()],
            Kind::Leased => holders.clone(),
        };
        assert_eq!(holders, expected, "{kind:?}: only the waiter holds");
        assert_eq!(holders.len(), 1, "{kind:?}: {holders:?}");
        assert!(!exists(&mut con, &format!("{{{key}}}:o:rwlock_timeout:1")), "{kind:?}");
        assert!(cancelled(&mut con, &key, "r1"), "{kind:?}: the record says cancelled");
        let ttl: i64 = redis::cmd("PTTL").arg(record(&key, "r1")).query(&mut con).expect("PTTL");
        assert!(ttl > 50_000 && ttl <= 60_000, "{kind:?}: cancelled for 60 s: {ttl}");
        // A retried cancel: 0, and nothing changes (not even the record's expiry).
        let before = digest(&mut con);
        assert_eq!(cmd(&mut con, &["RLOCK.CANCEL", &key, "r1"]), Value::Int(0), "{kind:?}");
        assert_eq!(digest(&mut con), before, "{kind:?}: a retried cancel changes nothing");
        // The request gets nothing later: refused at once, even where it would wait.
        rival_kind.release(&mut con, &key, "rival", &rival_grant);
        let before = digest(&mut con);
        for extra in [&[][..], &["WAIT", "0"]] {
            let args = kind.acquire(&key, "o", Some("r1"), extra);
            let err = run_strings(&mut con, &args).expect_err("cancelled");
            assert_eq!(err, "ERR request r1 was cancelled", "{kind:?} {extra:?}");
        }
        assert_eq!(blocked_clients(&mut con), 0);
        assert_eq!(digest(&mut con), before, "{kind:?}: a cancelled acquire changes nothing");
    }
}

/// `RLOCK.CANCEL` of a waiting request takes it out of the queue (1): its blocked client is
/// answered at once with the not-granted reply, and nothing is granted to it later.
#[test]
fn cancel_dequeues_a_waiting_request_and_answers_its_client_at_once() {
    let server = Server::start();
    let mut con = server.conn();
    for kind in KINDS {
        let key = kind.key("");
        kind.setup(&mut con, &key);
        kind.occupy(&mut con, &key);
        let waiter = start(&server, &kind.acquire(&key, "o", Some("r1"), &["WAIT", "0"]));
        wait_blocked(&mut con, 1);
        // The same request again, while it waits: refused, nothing changes.
        let before = digest(&mut con);
        let err = run_strings(&mut con, &kind.acquire(&key, "o", Some("r1"), &["WAIT", "0"]))
            .expect_err("already waiting");
        assert_eq!(err, "ERR request r1 is already waiting", "{kind:?}");
        assert_eq!(digest(&mut con), before);
        let asked = Instant::now();
        assert_eq!(cmd(&mut con, &["RLOCK.CANCEL", &key, "r1"]), Value::Int(1), "{kind:?}");
        let (reply, at) = waiter.reply(LIMIT);
        assert!(kind.not_granted(&reply.expect("a reply")), "{kind:?}: the not-granted reply");
        assert!(at.duration_since(asked) < Duration::from_secs(2), "{kind:?}: at once");
        assert_eq!(blocked_clients(&mut con), 0, "{kind:?}: the queue is empty");
        assert!(cancelled(&mut con, &key, "r1"), "{kind:?}");
        kind.vacate(&mut con, &key);
        assert!(kind.holders(&mut con, &key).is_empty(), "{kind:?}: nothing granted to it");
        let err = run_strings(&mut con, &kind.acquire(&key, "o", Some("r1"), &[]))
            .expect_err("cancelled");
        assert_eq!(err, "ERR request r1 was cancelled", "{kind:?}");
    }
    // The waiters behind a cancelled head are served at once (it asked for more than is free).
    cmd(&mut con, &["RSEM.SETPERMITS", "s", "1"]);
    let head =
        Pending::start_str(&server, &["RSEM.ACQUIRE", "s", "2", "WAIT", "0", "REQUEST", "h"]);
    wait_blocked(&mut con, 1);
    let next = Pending::start_str(&server, &["RSEM.ACQUIRE", "s", "1", "WAIT", "0"]);
    wait_blocked(&mut con, 2);
    assert_eq!(cmd(&mut con, &["RLOCK.CANCEL", "s", "h"]), Value::Int(1));
    assert_eq!(head.reply(LIMIT).0, Ok(Value::Int(0)));
    assert_eq!(next.reply(LIMIT).0, Ok(Value::Int(1)), "served by the cancel");
    assert_eq!(cmd(&mut con, &["GET", "s"]), Value::BulkString(b"0".to_vec()));
}

/// `RLOCK.CANCEL` of a request never seen: 0, and the request is refused from then on (an
/// acquire still in flight cannot get anything after its cancel).
#[test]
fn cancel_of_an_unknown_request_is_0_and_refuses_it_for_good() {
    let server = Server::start();
    let mut con = server.conn();
    for kind in KINDS {
        let key = kind.key("");
        kind.setup(&mut con, &key);
        assert_eq!(cmd(&mut con, &["RLOCK.CANCEL", &key, "r9"]), Value::Int(0), "{kind:?}");
        assert!(cancelled(&mut con, &key, "r9"));
        let err = run_strings(&mut con, &kind.acquire(&key, "o", Some("r9"), &[]))
            .expect_err("cancelled");
        assert_eq!(err, "ERR request r9 was cancelled", "{kind:?}");
        kind.occupy(&mut con, &key);
        let err = run_strings(&mut con, &kind.acquire(&key, "o", Some("r9"), &["WAIT", "0"]))
            .expect_err("cancelled, not waiting");
        assert_eq!(err, "ERR request r9 was cancelled", "{kind:?}");
        assert_eq!(blocked_clients(&mut con), 0, "{kind:?}: never blocks");
        // A request that was refused as busy wrote nothing: nothing to undo either.
        let busy = run_strings(&mut con, &kind.acquire(&key, "o", Some("r8"), &[])).expect("busy");
        assert!(kind.not_granted(&busy), "{kind:?}: {busy:?}");
        assert_eq!(stored(&mut con, &key, "r8"), None, "{kind:?}: no record");
        assert_eq!(cmd(&mut con, &["RLOCK.CANCEL", &key, "r8"]), Value::Int(0), "{kind:?}");
        kind.vacate(&mut con, &key);
        assert!(kind.holders(&mut con, &key).is_empty(), "{kind:?}");
    }
}

/// A request granted by a hand-off (it waited) has its record written by the hand-off: a retry
/// replays it, and `RLOCK.CANCEL` gives it back.
#[test]
fn a_hand_off_grant_is_recorded_and_cancel_gives_it_back() {
    let server = Server::start();
    let mut con = server.conn();
    for kind in KINDS {
        let key = kind.key("");
        kind.setup(&mut con, &key);
        kind.occupy(&mut con, &key);
        let waiter = start(&server, &kind.acquire(&key, "o", Some("r1"), &["WAIT", "0"]));
        wait_blocked(&mut con, 1);
        kind.vacate(&mut con, &key);
        let granted = waiter.reply(LIMIT).0.expect("granted");
        assert!(kind.granted(&granted), "{kind:?}: {granted:?}");
        assert!(stored(&mut con, &key, "r1")
            .is_some_and(|r| r.starts_with(format!("{}G", header(&key)).as_bytes())));
        let retry = run_strings(&mut con, &kind.acquire(&key, "o", Some("r1"), &["WAIT", "0"]));
        assert_eq!(retry, Ok(granted), "{kind:?}: the hand-off's grant, replayed");
        assert_eq!(kind.holders(&mut con, &key).len(), 1, "{kind:?}");
        assert_eq!(cmd(&mut con, &["RLOCK.CANCEL", &key, "r1"]), Value::Int(2), "{kind:?}");
        assert!(kind.holders(&mut con, &key).is_empty(), "{kind:?}: given back");
    }
}

/// A grant to a waiter that left before its reply is rolled back on a timer; the rollback makes
/// the request cancelled, so a later cancel gives nothing back twice (a counted semaphore's
/// count would grow). And a cancel (or a retry) that comes before the rollback: the grant is
/// given back once, by whichever comes first.
#[test]
fn a_rolled_back_grant_is_cancelled_and_never_given_back_twice() {
    let server = Server::start();
    let mut con = server.conn();
    for (round, kind) in KINDS.iter().flat_map(|k| [(0, *k), (1, *k)]) {
        let key = kind.key(&format!("{round}"));
        kind.setup(&mut con, &key);
        kind.occupy(&mut con, &key);
        let waiter = start(&server, &kind.acquire(&key, "o", Some("r1"), &["WAIT", "0"]));
        wait_blocked(&mut con, 1);
        let rolled = info_field(&mut con, "rlock", "rlock_grants_rolled_back");
        let id = waiter.client_id().to_string();
        cmd(&mut con, &["MULTI"]);
        kind.vacate(&mut con, &key);
        cmd(&mut con, &["CLIENT", "KILL", "ID", &id]);
        if round == 1 {
            // Before the rollback's timer: the retry's command undoes the grant first (as the
            // timer would) and is refused; the cancel then finds nothing left to give back.
            run_strings(&mut con, &kind.acquire(&key, "o", Some("r1"), &[])).expect("queued");
            cmd(&mut con, &["RLOCK.CANCEL", &key, "r1"]);
        }
        let exec = redis::ConnectionLike::req_command(&mut con, &redis::cmd("EXEC"));
        let Ok(Value::Array(replies)) = exec else { panic!("EXEC: {exec:?}") };
        if round == 1 {
            let refused = format!("{:?}", replies[2]);
            assert!(refused.contains("request r1 was cancelled"), "{kind:?}: {refused}");
            assert_eq!(replies[3], Value::Int(0), "{kind:?}: given back once, by the rollback");
        }
        let _ = waiter.reply(LIMIT);
        poll("the rollback", LIMIT, || {
            (info_field(&mut con, "rlock", "rlock_grants_rolled_back") == rolled + 1).then_some(())
        });
        poll("the record cancelled", LIMIT, || cancelled(&mut con, &key, "r1").then_some(()));
        poll("nothing held", LIMIT, || kind.holders(&mut con, &key).is_empty().then_some(()));
        let before = digest(&mut con);
        assert_eq!(cmd(&mut con, &["RLOCK.CANCEL", &key, "r1"]), Value::Int(0), "{kind:?}");
        assert_eq!(digest(&mut con), before, "{kind:?} {round}: nothing released twice");
        if matches!(kind, Kind::Counted | Kind::Leased) {
            assert_eq!(cmd(&mut con, &["GET", &key]), Value::BulkString(b"1".to_vec()), "{kind:?}");
        }
    }
}

// ---- the stalled server -----------------------------------------------------------------------

/// Sends `args` without waiting for the reply (it is in the server's socket once this returns).
fn send(con: &mut Connection, args: &[String]) {
    let mut c = redis::cmd(&args[0]);
    for a in &args[1..] {
        c.arg(a.as_str());
    }
    con.send_packed_command(&c.get_packed_command()).expect("send");
}

/// The reply to a command sent with [`send`]; an error reply as its text.
fn receive(con: &mut Connection) -> Result<Value, String> {
    match con.recv_response() {
        Ok(Value::ServerError(e)) => Err(format!("{} {}", e.code(), e.details().unwrap_or(""))),
        Ok(v) => Ok(v),
        Err(e) => Err(rlock_tests_integration::error_text(&e)),
    }
}

/// An acquire with a request id is sent, then (the client gave up on it) `RLOCK.CANCEL` on
/// another connection, both while the server is stopped (SIGSTOP), in either order; whichever
/// the server processes first, nothing is held at the end (permits conserved), and the replies
/// agree: granted then given back (2), or cancelled first and the acquire refused (0).
#[test]
fn a_cancel_sent_while_the_server_is_stalled_leaves_nothing_held_in_either_order() {
    let server = Server::start();
    let mut con = server.conn();
    let mut seen = Vec::new();
    for kind in KINDS {
        for cancel_first in [false, true] {
            let key = kind.key(if cancel_first { "c" } else { "a" });
            kind.setup(&mut con, &key);
            let (mut a, mut b) = (server.conn(), server.conn());
            let acquire = kind.acquire(&key, "o", Some("r"), &["WAIT", "0"]);
            let cancel = strings(&["RLOCK.CANCEL", &key, "r"]);
            server.pause();
            if cancel_first {
                send(&mut b, &cancel);
                send(&mut a, &acquire);
            } else {
                send(&mut a, &acquire);
                send(&mut b, &cancel);
            }
            server.resume();
            let (acquired, cancelled) = (receive(&mut a), receive(&mut b));
            match (&acquired, &cancelled) {
                (Ok(reply), Ok(Value::Int(2))) if kind.granted(reply) => seen.push("granted, 2"),
                (Err(e), Ok(Value::Int(0))) if e == "ERR request r was cancelled" => {
                    seen.push("cancelled, 0");
                }
                other => panic!("{kind:?} (cancel first: {cancel_first}): {other:?}"),
            }
            assert!(kind.holders(&mut con, &key).is_empty(), "{kind:?}: nothing held");
            assert!(cancelled_record(&mut con, &key), "{kind:?}");
        }
    }
    eprintln!("orders seen: {seen:?}");
    assert!(seen.contains(&"granted, 2") && seen.contains(&"cancelled, 0"), "both orders ran");
}

fn cancelled_record(con: &mut Connection, key: &str) -> bool {
    cancelled(con, key, "r")
}

/// A request waits; the holder's lease ends while the server is stopped, so the server may
/// grant it as it resumes; `RLOCK.CANCEL` sent during the stall: dequeued (1) or granted and
/// given back (2), and nothing is held at the end either way.
#[test]
fn a_waiting_request_cancelled_during_a_stall_that_ends_its_holder_s_lease_holds_nothing() {
    let server = Server::start();
    let mut con = server.conn();
    for kind in KINDS {
        let key = kind.key("");
        kind.setup(&mut con, &key);
        let short = match kind {
            Kind::Lock => strings(&["RLOCK.ACQUIRE", &key, "holder", "300"]),
            Kind::Read => strings(&["RWLOCK.ACQUIRE", &key, "holder", "WRITE", "300"]),
            Kind::Write => strings(&["RWLOCK.ACQUIRE", &key, "holder", "READ", "300"]),
            Kind::Counted | Kind::Leased => strings(&["RSEM.ACQUIRE", &key, "1", "LEASE", "300"]),
        };
        run_strings(&mut con, &short).expect("holder");
        let waiter = start(&server, &kind.acquire(&key, "o", Some("r"), &["WAIT", "0"]));
        wait_blocked(&mut con, 1);
        let mut b = server.conn();
        server.pause();
        // The stall outlasts the holder's lease (this is the stall, not a wait for a condition).
        std::thread::sleep(Duration::from_millis(500));
        send(&mut b, &strings(&["RLOCK.CANCEL", &key, "r"]));
        server.resume();
        let cancelled = receive(&mut b);
        let reply = waiter.reply(LIMIT).0.expect("answered");
        eprintln!("{kind:?}: the cancel replied {cancelled:?}, the waiter {reply:?}");
        match cancelled {
            Ok(Value::Int(1)) => assert!(kind.not_granted(&reply), "{kind:?}: {reply:?}"),
            Ok(Value::Int(2)) => assert!(kind.granted(&reply), "{kind:?}: {reply:?}"),
            other => panic!("{kind:?}: {other:?}"),
        }
        poll("nothing held", LIMIT, || kind.holders(&mut con, &key).is_empty().then_some(()));
        if matches!(kind, Kind::Counted | Kind::Leased) {
            assert_eq!(cmd(&mut con, &["RSEM.AVAILABLE", &key]), Value::Int(1), "{kind:?}");
        }
        assert_eq!(
            run_strings(&mut con, &kind.acquire(&key, "o", Some("r"), &[])),
            Err("ERR request r was cancelled".to_owned())
        );
    }
}

// ---- ACL, MULTI and Lua, RESP3 ------------------------------------------------------------------

/// The request record is checked against the caller's ACL user before anything changes, and
/// before a `WAIT` blocks; `RLOCK.CANCEL` too. A hand-off writes it as the waiter's user: a
/// waiter whose user lost the record key meanwhile gets `NOPERM`, and nothing is granted to it.
#[test]
fn a_user_without_the_request_record_is_refused_request_and_cancel_before_anything_changes() {
    let server = Server::start();
    let mut admin = server.conn();
    let user = ["ACL", "SETUSER", "lim", "on", "nopass", "+@all", "~locks:*", "~{locks:*", "&*"];
    cmd(&mut admin, &user);
    let mut lim = conn_as(&server, "lim");
    for kind in KINDS {
        let key = kind.key("locks:");
        kind.setup(&mut admin, &key);
        let before = digest(&mut admin);
        let err =
            run_strings(&mut lim, &kind.acquire(&key, "o", Some("r"), &[])).expect_err("NOPERM");
        assert!(err.starts_with("NOPERM") && err.contains("rlock_request"), "{kind:?}: {err}");
        assert_eq!(digest(&mut admin), before, "{kind:?}: nothing changes on NOPERM");
        kind.occupy(&mut admin, &key);
        let before = digest(&mut admin);
        let err = run_strings(&mut lim, &kind.acquire(&key, "o", Some("r"), &["WAIT", "0"]))
            .expect_err("refused before it blocks");
        assert!(err.starts_with("NOPERM"), "{kind:?}: {err}");
        assert_eq!(blocked_clients(&mut admin), 0, "{kind:?}: it never waited");
        let err = run_str(&mut lim, &["RLOCK.CANCEL", &key, "r"]).expect_err("NOPERM");
        assert!(err.starts_with("NOPERM"), "{kind:?}: {err}");
        assert_eq!(digest(&mut admin), before, "{kind:?}");
        kind.vacate(&mut admin, &key);
    }
    let log: Vec<Value> = redis::cmd("ACL").arg("LOG").query(&mut admin).expect("ACL LOG");
    assert!(format!("{log:?}").contains("rlock_request:{locks:lock}:r"), "{log:?}");
    // Allowed, the same user waits; then it loses the record key while it waits.
    cmd(&mut admin, &["ACL", "SETUSER", "lim", "~rlock_request:*"]);
    for kind in KINDS {
        let key = kind.key("locks:");
        kind.occupy(&mut admin, &key);
        let args = kind.acquire(&key, "o", Some("w"), &["WAIT", "0"]);
        let mut waiter_con = conn_as(&server, "lim");
        waiter_con.set_read_timeout(Some(LIMIT)).expect("timeout");
        send(&mut waiter_con, &args);
        wait_blocked(&mut admin, 1);
        cmd(&mut admin, &["ACL", "SETUSER", "lim", "resetkeys", "~locks:*", "~{locks:*"]);
        kind.vacate(&mut admin, &key);
        let err = receive(&mut waiter_con).expect_err("NOPERM at its grant");
        assert!(err.starts_with("NOPERM") && err.contains("rlock_request"), "{kind:?}: {err}");
        assert!(kind.holders(&mut admin, &key).is_empty(), "{kind:?}: nothing granted to it");
        assert!(!exists(&mut admin, &record(&key, "w")), "{kind:?}: no record");
        cmd(&mut admin, &["ACL", "SETUSER", "lim", "~rlock_request:*"]);
        // With it, a request is granted and cancelled as any other.
        let granted =
            run_strings(&mut lim, &kind.acquire(&key, "o", Some("ok"), &[])).expect("granted");
        assert!(kind.granted(&granted), "{kind:?}: {granted:?}");
        assert_eq!(cmd(&mut lim, &["RLOCK.CANCEL", &key, "ok"]), Value::Int(2), "{kind:?}");
    }
}

/// Lua that runs its arguments as one command (`redis.call`), key first.
const CALL: &str = "return redis.call(ARGV[1], KEYS[1], unpack(ARGV, 2))";

fn eval(con: &mut Connection, args: &[String]) -> Result<Value, String> {
    let mut all = strings(&["EVAL", CALL, "1", &args[1], &args[0]]);
    all.extend(args[2..].iter().cloned());
    run_strings(con, &all)
}

/// Inside `MULTI` and Lua: a request is recorded, replayed and cancelled as outside; a `WAIT`
/// there is one try (never blocks) and a request not granted leaves no record. Under RESP3 the
/// replies are the same.
#[test]
fn requests_work_inside_multi_lua_and_resp3() {
    let server = Server::start();
    let mut con = server.conn();
    let mut resp3 = server.conn_resp3();
    for kind in KINDS {
        let key = kind.key("");
        kind.setup(&mut con, &key);
        cmd(&mut con, &["MULTI"]);
        for args in [
            kind.acquire(&key, "o", Some("m"), &[]),
            kind.acquire(&key, "o", Some("m"), &[]),
            strings(&["RLOCK.CANCEL", &key, "m"]),
            kind.acquire(&key, "o", Some("m"), &[]),
        ] {
            assert_eq!(run_strings(&mut con, &args), Ok(Value::SimpleString("QUEUED".into())));
        }
        let exec = redis::ConnectionLike::req_command(&mut con, &redis::cmd("EXEC"));
        let Ok(Value::Array(r)) = exec else { panic!("{exec:?}") };
        assert!(kind.granted(&r[0]) && r[1] == r[0], "{kind:?}: {r:?}");
        assert_eq!(r[2], Value::Int(2), "{kind:?}: {r:?}");
        assert!(format!("{:?}", r[3]).contains("request m was cancelled"), "{kind:?}: {r:?}");
        assert!(kind.holders(&mut con, &key).is_empty(), "{kind:?}");
        // A WAIT inside MULTI is one try: not granted, no record, no blocked client.
        kind.occupy(&mut con, &key);
        cmd(&mut con, &["MULTI"]);
        run_strings(&mut con, &kind.acquire(&key, "o", Some("mw"), &["WAIT", "0"]))
            .expect("queued");
        let Value::Array(r) = cmd(&mut con, &["EXEC"]) else { panic!("EXEC") };
        assert!(kind.not_granted(&r[0]), "{kind:?}: {r:?}");
        assert_eq!(stored(&mut con, &key, "mw"), None, "{kind:?}");
        kind.vacate(&mut con, &key);
        // Lua.
        let args = kind.acquire(&key, "o", Some("l"), &["WAIT", "0"]);
        let first = eval(&mut con, &args).expect("Lua acquire");
        assert!(kind.granted(&first), "{kind:?}: {first:?}");
        assert_eq!(eval(&mut con, &args), Ok(first), "{kind:?}: replayed in Lua");
        assert_eq!(eval(&mut con, &strings(&["RLOCK.CANCEL", &key, "l"])), Ok(Value::Int(2)));
        assert!(kind.holders(&mut con, &key).is_empty(), "{kind:?}");
        // RESP3.
        let args = kind.acquire(&key, "o", Some("3"), &[]);
        let first = run_strings(&mut resp3, &args).expect("RESP3 acquire");
        assert!(kind.granted(&first), "{kind:?}: {first:?}");
        assert_eq!(run_strings(&mut resp3, &args), Ok(first), "{kind:?}");
        let cancel = strings(&["RLOCK.CANCEL", &key, "3"]);
        assert_eq!(run_strings(&mut resp3, &cancel), Ok(Value::Int(2)));
        assert_eq!(run_strings(&mut resp3, &cancel), Ok(Value::Int(0)));
        let err = run_strings(&mut resp3, &args).expect_err("cancelled");
        assert_eq!(err, "ERR request 3 was cancelled");
    }
}

// ---- replication, bad input ---------------------------------------------------------------------

/// Everything a request writes (records of grants made by commands, by hand-offs inside a
/// command and from the lease timer, cancelled records, the gives-back) reaches a replica
/// without the module and the AOF as plain commands: the replica ends byte-identical, and a
/// server without the module replays the AOF to the same dataset.
#[test]
fn a_module_less_replica_and_an_aof_replay_hold_the_same_records() {
    let mut master =
        Server::builder().config("appendonly", "yes").config("appendfsync", "always").start();
    let replica = Server::builder().without_module().replica_of(&master).start();
    wait_replica_online(&master);
    let mut con = master.conn();
    for kind in KINDS {
        let key = kind.key("");
        kind.setup(&mut con, &key);
        let first =
            run_strings(&mut con, &kind.acquire(&key, "o", Some("r1"), &[])).expect("acquire");
        assert_eq!(run_strings(&mut con, &kind.acquire(&key, "o", Some("r1"), &[])), Ok(first));
        assert_eq!(cmd(&mut con, &["RLOCK.CANCEL", &key, "r1"]), Value::Int(2));
        // A hand-off inside a command, then its cancel.
        kind.occupy(&mut con, &key);
        let waiter = start(&master, &kind.acquire(&key, "o", Some("r2"), &["WAIT", "0"]));
        wait_blocked(&mut con, 1);
        kind.vacate(&mut con, &key);
        assert!(kind.granted(&waiter.reply(LIMIT).0.expect("granted")));
        assert_eq!(cmd(&mut con, &["RLOCK.CANCEL", &key, "r2"]), Value::Int(2));
        // A dequeue, an unknown request.
        kind.occupy(&mut con, &key);
        let waiter = start(&master, &kind.acquire(&key, "o", Some("r3"), &["WAIT", "0"]));
        wait_blocked(&mut con, 1);
        assert_eq!(cmd(&mut con, &["RLOCK.CANCEL", &key, "r3"]), Value::Int(1));
        let _ = waiter.reply(LIMIT);
        kind.vacate(&mut con, &key);
        assert_eq!(cmd(&mut con, &["RLOCK.CANCEL", &key, "r4"]), Value::Int(0));
        // A hand-off from the timer at a lease's end: the record is written by module work.
        let short = match kind {
            Kind::Lock => strings(&["RLOCK.ACQUIRE", &key, "holder", "100"]),
            Kind::Read => strings(&["RWLOCK.ACQUIRE", &key, "holder", "WRITE", "100"]),
            Kind::Write => strings(&["RWLOCK.ACQUIRE", &key, "holder", "READ", "100"]),
            Kind::Counted | Kind::Leased => strings(&["RSEM.ACQUIRE", &key, "1", "LEASE", "100"]),
        };
        run_strings(&mut con, &short).expect("holder");
        let waiter = start(&master, &kind.acquire(&key, "o", Some("r5"), &["WAIT", "0"]));
        let granted = waiter.reply(LIMIT).0.expect("granted at the lease end");
        assert!(kind.granted(&granted), "{kind:?}: {granted:?}");
        assert!(stored(&mut con, &key, "r5").is_some(), "{kind:?}");
    }
    assert_replica_matches(&master, &replica, Duration::from_secs(20), "requests");
    assert!(!replica.log().contains("unknown command"), "{}", replica.log());
    let before = (digest(&mut con), rlock_tests_integration::all_keys(&mut con));
    drop(con);
    master.restart_without_module();
    let mut con = master.conn();
    let after = (digest(&mut con), rlock_tests_integration::all_keys(&mut con));
    assert_eq!(after, before, "a server without the module replays the AOF to the same data");
}

/// Bad input is refused with a clear error and changes nothing: arity, an empty id, a record
/// key of another type or holding a foreign string, an owner too long for a record. Binary ids
/// work, and an error names them escaped.
#[test]
fn bad_input_is_refused_and_changes_nothing() {
    let server = Server::start();
    let mut con = server.conn();
    let checked = |con: &mut Connection, args: &[&[u8]]| {
        let (reply, changed) = rlock_tests_integration::run_checked(con, args).expect("server");
        assert!(!changed || reply.is_ok(), "{args:?}: {reply:?} changed the dataset");
        reply
    };
    for (args, err) in [
        (&["RLOCK.CANCEL", "k"][..], "ERR wrong number of arguments for 'rlock.cancel' command"),
        (
            &["RLOCK.CANCEL", "k", "r", "x"],
            "ERR wrong number of arguments for 'rlock.cancel' command",
        ),
        (&["RLOCK.CANCEL", "k", ""], "ERR id must not be empty"),
        (
            &["RLOCK.ACQUIRE", "k", "o", "1000", "REQUEST"],
            "ERR request id is missing after REQUEST",
        ),
        (
            &["RWLOCK.ACQUIRE", "k", "o", "READ", "1000", "REQUEST", ""],
            "ERR request id (after REQUEST) must not be empty",
        ),
        (&["RSEM.ACQUIRE", "k", "1", "REQUEST", "a", "REQUEST", "b"], "ERR syntax error"),
    ] {
        let bytes: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
        assert_eq!(checked(&mut con, &bytes), Err(err.to_owned()), "{args:?}");
    }
    let long = "o".repeat(65_537);
    let args: [&[u8]; 6] = [b"RLOCK.ACQUIRE", b"k", long.as_bytes(), b"1000", b"REQUEST", b"r"];
    let err = checked(&mut con, &args).expect_err("too long");
    assert!(err.starts_with("ERR owner must be at most 65536 bytes with REQUEST"), "{err}");
    for kind in KINDS {
        let key = kind.key("");
        kind.setup(&mut con, &key);
        for (foreign, err) in [
            (&["HSET", "f", "v"][..], "WRONGTYPE"),
            (&["SET", "garbage"], "ERR the request record (rlock_request:...) holds a value"),
            (&["SET", "rlock-request:1:GL99:o0:"], "ERR the request record"),
        ] {
            cmd(&mut con, &["DEL", &record(&key, "r")]);
            let name = record(&key, "r");
            let mut write = vec![foreign[0], name.as_str()];
            write.extend_from_slice(&foreign[1..]);
            let write: Vec<String> = write.iter().map(|s| (*s).to_owned()).collect();
            run_strings(&mut con, &write).expect("foreign write");
            for args in
                [kind.acquire(&key, "o", Some("r"), &[]), strings(&["RLOCK.CANCEL", &key, "r"])]
            {
                let bytes: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
                let e = checked(&mut con, &bytes).expect_err("refused");
                assert!(e.starts_with(err), "{kind:?} {args:?}: {e}");
            }
        }
        cmd(&mut con, &["DEL", &record(&key, "r")]);
        assert!(kind.holders(&mut con, &key).is_empty(), "{kind:?}");
    }
    // A binary id: its record key holds it as is; an error shows it escaped.
    let id: &[u8] = b"\0\xff\r\n id";
    let args: [&[u8]; 6] = [b"RLOCK.ACQUIRE", b"k", b"o", b"1000", b"REQUEST", id];
    assert_eq!(rlock_tests_integration::run(&mut con, &args), Ok(Value::Nil));
    let key = [&b"rlock_request:{k}:"[..], id].concat();
    let exists: i64 = redis::cmd("EXISTS").arg(&key).query(&mut con).expect("EXISTS");
    assert_eq!(exists, 1);
    let cancel: [&[u8]; 3] = [b"RLOCK.CANCEL", b"k", id];
    assert_eq!(rlock_tests_integration::run(&mut con, &cancel), Ok(Value::Int(2)));
    let err = rlock_tests_integration::run(&mut con, &args).expect_err("cancelled");
    assert_eq!(err, "ERR request \\x00\\xff\\x0d\\x0a\\x20id was cancelled");
}

// ---- RWLOCK.RENEW ... READ|WRITE ----------------------------------------------------------------

/// A write hold is not renewed by a `READ` renewal of the same owner (its read hold would keep
/// the write guard alive), nor a read hold by a `WRITE` renewal; without a side, every hold of
/// the owner is renewed, as before.
#[test]
fn a_side_renewal_renews_only_the_side_the_owner_holds() {
    let server = Server::start();
    let mut con = server.conn();
    // A write hold only.
    cmd(&mut con, &["RWLOCK.ACQUIRE", "w", "o", "WRITE", "1000"]);
    let before = pexpiretime(&mut con, b"w");
    assert_eq!(cmd(&mut con, &["RWLOCK.RENEW", "w", "o", "60000", "READ"]), Value::Int(0));
    assert_eq!(pexpiretime(&mut con, b"w"), before, "a READ renewal leaves the write hold");
    assert_eq!(cmd(&mut con, &["RWLOCK.RENEW", "w", "o", "60000", "WRITE"]), Value::Int(1));
    assert!(pexpiretime(&mut con, b"w") > before + 50_000, "the write hold renewed");
    // A read hold only.
    cmd(&mut con, &["RWLOCK.ACQUIRE", "r", "o", "READ", "1000"]);
    let hold = b"{r}:o:rwlock_timeout:1";
    let (hash, key) = (pexpiretime(&mut con, b"r"), pexpiretime(&mut con, hold));
    assert_eq!(cmd(&mut con, &["RWLOCK.RENEW", "r", "o", "60000", "write"]), Value::Int(0));
    assert_eq!((pexpiretime(&mut con, b"r"), pexpiretime(&mut con, hold)), (hash, key));
    assert_eq!(cmd(&mut con, &["RWLOCK.RENEW", "r", "o", "60000", "read"]), Value::Int(1));
    assert!(pexpiretime(&mut con, hold) > key + 50_000, "the read hold renewed");
    assert!(pexpiretime(&mut con, b"r") > hash + 50_000, "and the hash covers it");
    // Both sides (a write hold, then a read re-entry): each side renews alone.
    cmd(&mut con, &["RWLOCK.ACQUIRE", "b", "o", "WRITE", "1000"]);
    cmd(&mut con, &["RWLOCK.ACQUIRE", "b", "o", "READ", "1000"]);
    let hold = b"{b}:o:rwlock_timeout:1";
    let key = pexpiretime(&mut con, hold);
    assert_eq!(cmd(&mut con, &["RWLOCK.RENEW", "b", "o", "60000", "WRITE"]), Value::Int(1));
    assert_eq!(pexpiretime(&mut con, hold), key, "WRITE leaves the read hold's lease");
    assert_eq!(cmd(&mut con, &["RWLOCK.RENEW", "b", "o", "60000", "READ"]), Value::Int(1));
    assert!(pexpiretime(&mut con, hold) > key + 50_000);
    // Without a side: as before, every hold.
    cmd(&mut con, &["RWLOCK.ACQUIRE", "n", "o", "WRITE", "1000"]);
    cmd(&mut con, &["RWLOCK.ACQUIRE", "n", "o", "READ", "1000"]);
    let (hash, key) =
        (pexpiretime(&mut con, b"n"), pexpiretime(&mut con, b"{n}:o:rwlock_timeout:1"));
    assert_eq!(cmd(&mut con, &["RWLOCK.RENEW", "n", "o", "60000"]), Value::Int(1));
    assert!(pexpiretime(&mut con, b"n") > hash + 50_000);
    assert!(pexpiretime(&mut con, b"{n}:o:rwlock_timeout:1") > key + 50_000);
    // Another owner, or a free lock: 0 with or without a side.
    for args in [
        &["RWLOCK.RENEW", "w", "x", "1000", "WRITE"][..],
        &["RWLOCK.RENEW", "free", "o", "1000", "READ"],
        &["RWLOCK.RENEW", "free", "o", "1000"],
    ] {
        assert_eq!(cmd(&mut con, args), Value::Int(0), "{args:?}");
    }
    assert!(!exists(&mut con, "free"), "nothing created");
    // Bad input.
    for (args, err) in [
        (&["RWLOCK.RENEW", "w", "o", "1000", "BOTH"][..], "ERR mode must be READ or WRITE"),
        (&["RWLOCK.RENEW", "w", "o", "1000", "READ", "x"], "ERR syntax error"),
        (&["RWLOCK.RENEW", "w", "o"], "ERR wrong number of arguments"),
    ] {
        let e = run_str(&mut con, args).expect_err("refused");
        assert!(e.starts_with(err), "{args:?}: {e}");
    }
    assert_eq!(
        hgetall(&mut con, b"w"),
        vec![(b"mode".to_vec(), b"write".to_vec()), (b"o:write".to_vec(), b"1".to_vec()),]
    );
    let _ = LIMIT;
}

fn strs(a: &[String; 8]) -> Vec<&str> {
    a.iter().map(String::as_str).collect()
}

#[test]
fn a_request_tag_is_freed_on_every_way_its_waiter_leaves() {
    let server = Server::start();
    let mut con = server.conn();
    let acquire = |key: &str, id: &str, wait: &str| {
        ["RLOCK.ACQUIRE", key, "w", "60000", "WAIT", wait, "REQUEST", id].map(str::to_owned)
    };
    // Timeout, CLIENT UNBLOCK, CLIENT KILL, a duplicate refused: the tag goes with the waiter.
    for (n, how) in ["timeout", "unblock", "kill"].into_iter().enumerate() {
        let (key, id) = (format!("t{n}"), format!("id-{how}"));
        cmd(&mut con, &["RLOCK.ACQUIRE", &key, "h", "60000"]);
        let wait = if how == "timeout" { "200" } else { "0" };
        let w = queue_str(&server, &mut con, &strs(&acquire(&key, &id, wait)));
        let dup = run_str(&mut con, &strs(&acquire(&key, &id, "0"))).expect_err("duplicate");
        assert!(dup.contains("already waiting"), "{dup}");
        match how {
            "unblock" => cmd(&mut con, &["CLIENT", "UNBLOCK", &w.client_id().to_string()]),
            "kill" => {
                kill_client(&mut con, w.client_id());
                Value::Nil
            }
            _ => Value::Nil,
        };
        drop(w.reply(LIMIT));
        poll("the waiter left", LIMIT, || (blocked_clients(&mut con) == 0).then_some(()));
        tag_is_free(&server, &mut con, &key, &id, LIMIT);
    }
    // A grant (the holder's release, a FLUSHDB, a SWAPDB that frees the lock): the tag goes.
    for (n, how) in ["release", "flushdb", "swapdb"].into_iter().enumerate() {
        let (key, id) = (format!("g{n}"), format!("id-{how}"));
        cmd(&mut con, &["RLOCK.ACQUIRE", &key, "h", "60000"]);
        let w = queue_str(&server, &mut con, &strs(&acquire(&key, &id, "0")));
        match how {
            "release" => cmd(&mut con, &["RLOCK.RELEASE", &key, "h"]),
            "flushdb" => cmd(&mut con, &["FLUSHDB"]),
            _ => cmd(&mut con, &["SWAPDB", "0", "1"]),
        };
        assert_eq!(w.reply(LIMIT).0, Ok(Value::Nil), "{how}: granted");
        // Its grant taken away: the same request may wait again (its tag left with it).
        cmd(&mut con, &["RLOCK.FORCERELEASE", &key]);
        cmd(&mut con, &["RLOCK.ACQUIRE", &key, "h", "60000"]);
        tag_is_free(&server, &mut con, &key, &id, LIMIT);
    }
    wait_blocked(&mut con, 0);
}
