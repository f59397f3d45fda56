//! Exact cancellation: `REQUEST id` on the acquires and `RLOCK.CANCEL`. A waiter whose request
//! is cancelled between its hand-off and its reply gets the not-granted reply, and a request
//! record never undoes a grant of another lock whose name and id spell the same key. Every test
//! runs each kind: a reentrant lock, a read-write lock's read and write sides, counted and
//! leased semaphore permits.

use std::time::Duration;

use redis::{Connection, Value};

use rlock_tests_integration::kinds::{run_strings, KINDS};
use rlock_tests_integration::{cmd, digest, run_str, wait_blocked, Pending, Server};

const LIMIT: Duration = Duration::from_secs(10);

fn exec(con: &mut Connection) -> Vec<Value> {
    match redis::ConnectionLike::req_command(con, &redis::cmd("EXEC")) {
        Ok(Value::Array(replies)) => replies,
        other => panic!("EXEC: {other:?}"),
    }
}

/// A waiter granted by a hand-off whose request is cancelled before its reply went out
/// (`RLOCK.CANCEL` in the same event-loop turn as the release that handed it the lock: another
/// client's command, a `MULTI`, a script) is not answered *granted* (nil, `[1, token]`, its
/// permit ids), since the cancel gave its grant back (reply 2) and nobody holds the lock: it gets
/// its command's not-granted reply, as a waiter the cancel dequeued does.
#[test]
fn a_waiter_cancelled_between_its_hand_off_and_its_reply_is_not_told_it_holds() {
    let server = Server::start();
    let mut con = server.conn();
    for kind in KINDS {
        let key = kind.key("h");
        kind.setup(&mut con, &key);
        kind.occupy(&mut con, &key);
        let args = kind.acquire(&key, "o", Some("r"), &["WAIT", "0"]);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let waiter = Pending::start_str(&server, &args);
        wait_blocked(&mut con, 1);
        cmd(&mut con, &["MULTI"]);
        let vacate = kind.vacate_args(&key);
        run_strings(&mut con, &vacate).expect("queued");
        cmd(&mut con, &["RLOCK.CANCEL", &key, "r"]);
        let replies = exec(&mut con);
        assert_eq!(replies[1], Value::Int(2), "{kind:?}: granted by the release, given back");
        assert!(kind.holders_as_seen(&mut con, &key).is_empty(), "{kind:?}: nobody holds");
        let reply = waiter.reply(LIMIT).0.expect("a reply");
        assert!(kind.not_granted(&reply), "{kind:?}: the waiter was told {reply:?}");
        assert!(!kind.granted(&reply), "{kind:?}");
    }
}

/// The record key `rlock_request:` + prefixed name + `:` + id is shared by two locks whose name
/// and id split it differently (lock `a` with id `b:c` and lock `{a}:b` with id `c`; `a` with
/// `y}:c` and `a}:y` with `c`; `a` and `{a}` with one id). The record names its lock, so
/// `RLOCK.CANCEL a b:c` never reads the grant of `{a}:b`'s request `c` (owner `X`): it neither
/// releases `X`'s plain hold on `a` nor marks `{a}:b`'s request cancelled while its grant stays
/// held. A record of another lock is that: the id is taken (`ERR request <id> belongs to
/// another acquire`), nothing changes, nothing is undone on the wrong lock.
#[test]
fn a_record_key_shared_by_two_locks_never_undoes_a_grant_on_the_other_lock() {
    let server = Server::start();
    let mut con = server.conn();
    for kind in KINDS {
        let m = kind.key("");
        for (mine, other, mine_id, other_id) in [
            (m.clone(), format!("{{{m}}}:b"), "b:c", "c"),
            (m.clone(), format!("{m}}}:y"), "y}:c", "c"),
            (m.clone(), format!("{{{m}}}"), "c", "c"),
        ] {
            // The two names and ids spell the same record key.
            let key_of = |name: &str, id: &str| {
                if name.contains('{') {
                    format!("rlock_request:{name}:{id}")
                } else {
                    format!("rlock_request:{{{name}}}:{id}")
                }
            };
            assert_eq!(key_of(&mine, mine_id), key_of(&other, other_id), "{kind:?}");
            kind.setup(&mut con, &mine);
            kind.setup(&mut con, &other);
            // The other lock's request is granted; the same owner holds `mine` by a plain
            // acquire (no request).
            let theirs = run_strings(&mut con, &kind.acquire(&other, "X", Some(other_id), &[]));
            assert!(kind.granted(&theirs.clone().expect("granted")), "{kind:?}: {theirs:?}");
            let plain = run_strings(&mut con, &kind.acquire(&mine, "X", None, &[])).expect("plain");
            assert!(kind.granted(&plain), "{kind:?}: {plain:?}");
            let (mine_before, other_before) =
                (kind.holders_as_seen(&mut con, &mine), kind.holders_as_seen(&mut con, &other));
            let before = digest(&mut con);
            let taken = format!("ERR request {mine_id} belongs to another acquire");
            let cancel = run_str(&mut con, &["RLOCK.CANCEL", &mine, mine_id]);
            assert_eq!(
                kind.holders_as_seen(&mut con, &mine),
                mine_before,
                "{kind:?}: `{mine}` kept"
            );
            assert_eq!(kind.holders_as_seen(&mut con, &other), other_before, "{kind:?}");
            assert!(cancel.as_ref().is_err_and(|e| e.starts_with(&taken)), "{kind:?}: {cancel:?}");
            let acquire = run_strings(&mut con, &kind.acquire(&mine, "X", Some(mine_id), &[]));
            assert!(
                acquire.as_ref().is_err_and(|e| e.starts_with(&taken)),
                "{kind:?}: {acquire:?}"
            );
            assert_eq!(digest(&mut con), before, "{kind:?}: nothing changes on an error");
            // The other lock's request is still its own: a retry replays it, its cancel
            // gives it back.
            let retry = run_strings(&mut con, &kind.acquire(&other, "X", Some(other_id), &[]));
            assert_eq!(retry, theirs, "{kind:?}: `{other}`'s request replayed");
            let back = run_str(&mut con, &["RLOCK.CANCEL", &other, other_id]);
            assert_eq!(back, Ok(Value::Int(2)), "{kind:?}: `{other}`'s grant given back");
            assert!(kind.holders_as_seen(&mut con, &other).is_empty(), "{kind:?}");
            cmd(&mut con, &["FLUSHALL"]);
        }
    }
}
