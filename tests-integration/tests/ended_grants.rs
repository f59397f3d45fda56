//! A grant whose end is decided is not in place, whoever asks: a `REQUEST` retry does not
//! replay it, a renewal does not revive it, a re-entry does not keep its binding, a cancel finds
//! nothing to give back. The ends decided but not yet applied (a closed session's holds, ended
//! by the next timer tick) are applied before any write command on the lock reads it.

use std::time::Duration;

use redis::{Connection, Value};

use rlock_tests_integration::{
    attach_replica, barrier, client_id, cmd, exists, hgetall, info_field, int, kill_client,
    permit_ids, poll, run, run_str, session_ends, wait_blocked, Pending, Server,
};

const LIMIT: Duration = Duration::from_secs(10);

#[test]
fn a_request_retry_after_a_session_close_in_the_same_transaction_is_not_replayed() {
    let server = Server::start();
    let mut admin = server.conn();
    let mut a = server.conn();
    let a_id = client_id(&mut a);
    assert_eq!(
        cmd(&mut a, &["RLOCK.ACQUIRE", "L", "x", "60000", "REQUEST", "r1", "SESSION"]),
        Value::Nil
    );
    // The retry of the same request, after the session's connection closed but before the
    // timer ended its hold: a fresh grant (the hold the record names has ended), not a replay
    // of a grant that the end then frees under the caller.
    let mut b = server.conn();
    let reply = redis::pipe()
        .atomic()
        .cmd("CLIENT")
        .arg("KILL")
        .arg("ID")
        .arg(a_id)
        .cmd("RLOCK.ACQUIRE")
        .arg("L")
        .arg("x")
        .arg("60000")
        .arg("REQUEST")
        .arg("r1")
        .query::<Vec<Value>>(&mut b)
        .expect("EXEC");
    assert_eq!(reply, vec![Value::Int(1), Value::Nil]);
    barrier(&server, &mut admin);
    assert_eq!(hgetall(&mut admin, b"L"), vec![(b"x".to_vec(), b"1".to_vec())], "x holds L");
    let pttl = int(&cmd(&mut admin, &["PTTL", "L"]));
    assert!(pttl > 50_000, "the retry's own lease: {pttl}");
    let busy = int(&cmd(&mut admin, &["RLOCK.ACQUIRE", "L", "other", "60000"]));
    assert!(busy > 0, "another owner is refused: {busy}");
}

#[test]
fn a_request_retry_held_by_a_write_pause_is_not_replayed_after_the_close() {
    let server = Server::start();
    let mut admin = server.conn();
    for round in 0..3 {
        let key = format!("P{round}");
        let mut a = server.conn();
        let a_id = client_id(&mut a);
        let acquire = ["RLOCK.ACQUIRE", key.as_str(), "x", "60000", "REQUEST", "r1"];
        assert_eq!(cmd(&mut a, &[&acquire[..], &["SESSION"]].concat()), Value::Nil);
        cmd(&mut admin, &["CLIENT", "PAUSE", "300", "WRITE"]);
        kill_client(&mut admin, a_id);
        // The client retries on a new connection: the retry waits for the pause's end, and
        // whichever comes first then, the timer's end or the retry, the caller ends up holding.
        let mut b = server.conn();
        assert_eq!(cmd(&mut b, &acquire), Value::Nil, "round {round}");
        barrier(&server, &mut admin);
        assert_eq!(
            hgetall(&mut admin, key.as_bytes()),
            vec![(b"x".to_vec(), b"1".to_vec())],
            "round {round}: the caller was told it holds {key}"
        );
    }
}

#[test]
fn a_leased_permit_in_its_lock_delay_is_not_replayed_renewed_or_cancelled() {
    let server = Server::start();
    let mut admin = server.conn();
    cmd(&mut admin, &["RSEM.SETPERMITS", "s", "1"]);
    let mut a = server.conn();
    let a_id = client_id(&mut a);
    let acquire = ["RSEM.ACQUIRE", "s", "1", "LEASE", "30000", "REQUEST", "r1"];
    let first =
        permit_ids(&cmd(&mut a, &[&acquire[..], &["SESSION", "LOCKDELAY", "1500"]].concat()));
    let id = first[0].clone();
    let ends = session_ends(&mut admin);
    kill_client(&mut admin, a_id);
    poll("the permit's end", LIMIT, || (session_ends(&mut admin) > ends).then_some(()));
    let mut b = server.conn();
    // The retry of the request: its permit ended with the session; the delay holds the only
    // permit, so nothing is granted.
    assert_eq!(cmd(&mut b, &acquire), Value::Nil, "the ended permit is not replayed");
    let renew = |con: &mut Connection, id: &[u8]| run(con, &[b"RSEM.RENEW", b"s", id, b"30000"]);
    assert_eq!(renew(&mut b, &id), Ok(Value::Int(0)), "nor renewed");
    assert_eq!(cmd(&mut b, &["RLOCK.CANCEL", "s", "r1"]), Value::Int(0), "nor given back");
    assert_eq!(cmd(&mut admin, &["RSEM.AVAILABLE", "s"]), Value::Int(0), "the delay holds it");
    // The placeholder holds the permit; nobody may renew it.
    let members = permit_ids(&cmd(&mut admin, &["ZRANGE", "{s}:timeout", "0", "-1"]));
    assert_eq!(members, vec![[b"rlock:lockdelay:".as_slice(), &id].concat()]);
    let renewed = renew(&mut b, &members[0]);
    assert!(renewed.is_err_and(|e| e.contains("reserved")), "the placeholder is not renewable");
    // The delay ends: the permit comes back once, to one taker.
    let taken = poll("the permit's return", LIMIT, || {
        match cmd(&mut b, &["RSEM.ACQUIRE", "s", "1", "LEASE", "30000"]) {
            Value::Nil => None,
            reply => Some(permit_ids(&reply)),
        }
    });
    assert_eq!(taken.len(), 1);
    assert_eq!(cmd(&mut admin, &["RSEM.AVAILABLE", "s"]), Value::Int(0), "one permit, one holder");
    assert_eq!(cmd(&mut admin, &["ZCARD", "{s}:timeout"]), Value::Int(1));
}

/// Other readers keep the read-write lock `key` alive for a minute, with 20,000 read holds: its
/// dead-reader checks are spaced 2 s apart (each reads every hold), so an expired read hold's
/// field lingers between two checks.
fn keep_read(con: &mut Connection, key: &str) {
    let mut pipe = redis::pipe();
    for keeper in 0..20 {
        for _ in 0..1_000 {
            pipe.cmd("RWLOCK.ACQUIRE").arg(key).arg(format!("k{keeper}")).arg("READ").arg(60_000);
        }
    }
    pipe.query::<()>(con).expect("20,000 read holds");
}

/// The owner `o`'s read count in the read-write lock `key`.
fn reads_of_o(con: &mut Connection, key: &str) -> Option<Vec<u8>> {
    hgetall(con, key.as_bytes()).into_iter().find(|(f, _)| f == b"o").map(|(_, c)| c)
}

#[test]
fn a_read_whose_holds_all_expired_is_neither_renewed_nor_replayed() {
    let server = Server::start();
    let mut con = server.conn();
    keep_read(&mut con, "rw");
    let acquire = ["RWLOCK.ACQUIRE", "rw", "o", "READ", "150", "REQUEST", "q1"];
    let mut tries = 0;
    loop {
        tries += 1;
        assert!(tries <= 20, "the owner's expired read hold never lingered in the hash");
        cmd(&mut con, &["DEL", "{rlock_request:rw}:q1", "rlock_request:{rw}:q1"]);
        assert_eq!(cmd(&mut con, &acquire), Value::Nil);
        let hold = "{rw}:o:rwlock_timeout:1";
        poll("the read's expiry", LIMIT, || (!exists(&mut con, hold)).then_some(()));
        if reads_of_o(&mut con, "rw").is_none() {
            continue; // cleaned already: nothing to show
        }
        // Renewing a read side whose every hold ended: 0, nothing renewed.
        assert_eq!(cmd(&mut con, &["RWLOCK.RENEW", "rw", "o", "60000", "READ"]), Value::Int(0));
        assert_eq!(cmd(&mut con, &["RWLOCK.RENEW", "rw", "o", "60000"]), Value::Int(0));
        if reads_of_o(&mut con, "rw").is_none() {
            continue;
        }
        // Its request's retry: a new acquire (a new hold with its own lease: the second, or the
        // first again if a dead-reader check removed the field meanwhile), not a replay (which
        // writes nothing).
        assert_eq!(cmd(&mut con, &acquire), Value::Nil);
        let holds = cmd(&mut con, &["KEYS", "{rw}:o:rwlock_timeout:*"]);
        let Value::Array(holds) = holds else { panic!("KEYS: {holds:?}") };
        assert_eq!(holds.len(), 1, "the retry was granted a hold of its own: {holds:?}");
        break;
    }
}

#[test]
fn a_read_re_entry_after_the_bound_read_expired_is_not_ended_by_the_old_connection() {
    let server = Server::start();
    let mut admin = server.conn();
    keep_read(&mut admin, "rw");
    let mut tries = 0;
    loop {
        tries += 1;
        assert!(tries <= 20, "the owner's expired read hold never lingered in the hash");
        let mut a = server.conn();
        let a_id = client_id(&mut a);
        cmd(&mut a, &["RWLOCK.ACQUIRE", "rw", "o", "READ", "150", "SESSION"]);
        let hold = "{rw}:o:rwlock_timeout:1";
        poll("the bound read's expiry", LIMIT, || (!exists(&mut admin, hold)).then_some(()));
        // The owner reads again, without SESSION, from another connection.
        let mut b = server.conn();
        cmd(&mut b, &["RWLOCK.ACQUIRE", "rw", "o", "READ", "60000"]);
        let count = reads_of_o(&mut admin, "rw");
        if count.as_deref() != Some(b"2") {
            // The expired hold was cleaned first: a fresh grant, nothing to show. Again.
            cmd(&mut b, &["RWLOCK.RELEASE", "rw", "o", "READ"]);
            kill_client(&mut admin, a_id);
            barrier(&server, &mut admin);
            continue;
        }
        kill_client(&mut admin, a_id);
        barrier(&server, &mut admin);
        let holds = hgetall(&mut admin, b"rw");
        assert!(
            holds.iter().any(|(f, _)| f == b"o"),
            "the owner was told it reads for 60 s; its read side was ended: {holds:?}"
        );
        let writer = int(&cmd(&mut admin, &["RWLOCK.ACQUIRE", "rw", "w", "WRITE", "60000"]));
        assert!(writer > 0, "no writer while o reads");
        break;
    }
}

#[test]
fn counted_permits_released_as_their_request_are_not_given_back_again_by_a_cancel() {
    let server = Server::start();
    let mut con = server.conn();
    cmd(&mut con, &["RSEM.SETPERMITS", "p", "2"]);
    assert_eq!(cmd(&mut con, &["RSEM.ACQUIRE", "p", "2", "REQUEST", "c1"]), Value::Int(1));
    // Another count than the grant's: refused, nothing changes.
    let wrong = run(&mut con, &[b"RSEM.RELEASE", b"p", b"1", b"REQUEST", b"c1"]);
    assert!(wrong.is_err_and(|e| e.contains("belongs to another acquire")));
    assert_eq!(cmd(&mut con, &["RSEM.AVAILABLE", "p"]), Value::Int(0));
    assert_eq!(cmd(&mut con, &["RSEM.RELEASE", "p", "2", "REQUEST", "c1"]), Value::Int(2));
    // A retried release gives back nothing more; a late cancel finds nothing to undo.
    assert_eq!(cmd(&mut con, &["RSEM.RELEASE", "p", "2", "REQUEST", "c1"]), Value::Int(2));
    assert_eq!(cmd(&mut con, &["RLOCK.CANCEL", "p", "c1"]), Value::Int(0));
    assert_eq!(cmd(&mut con, &["RSEM.AVAILABLE", "p"]), Value::Int(2), "created with 2");
    // A release as a request this server never granted (the grant was made on a master that
    // failed over before replicating it) gives nothing back: the permit was never taken here.
    assert_eq!(cmd(&mut con, &["RSEM.ACQUIRE", "p", "1"]), Value::Int(1));
    assert_eq!(cmd(&mut con, &["RSEM.RELEASE", "p", "1", "REQUEST", "c2"]), Value::Int(1));
    assert_eq!(cmd(&mut con, &["RSEM.RELEASE", "p", "1", "REQUEST", "c2"]), Value::Int(1));
    assert_eq!(cmd(&mut con, &["RSEM.RELEASE", "p", "1"]), Value::Int(2));
    // A new acquire with a released request's id is a new acquire (a cancel's record, though,
    // stays cancelled).
    assert_eq!(cmd(&mut con, &["RSEM.ACQUIRE", "p", "2", "REQUEST", "c2"]), Value::Int(1));
    assert_eq!(cmd(&mut con, &["RLOCK.CANCEL", "p", "c2"]), Value::Int(2));
    assert_eq!(cmd(&mut con, &["RSEM.AVAILABLE", "p"]), Value::Int(2));
}

/// Runs `commands` in one `MULTI`/`EXEC` on `con`; the replies of the transaction.
fn transaction(con: &mut Connection, commands: &[&[&str]]) -> Vec<Value> {
    let mut pipe = redis::pipe();
    pipe.atomic();
    for args in commands {
        pipe.cmd(args[0]);
        for arg in &args[1..] {
            pipe.arg(*arg);
        }
    }
    pipe.query(con).expect("EXEC")
}

#[test]
fn a_transaction_that_pauses_writes_still_applies_the_ends_before_its_retries() {
    let server = Server::start();
    let mut admin = server.conn();
    cmd(&mut admin, &["RSEM.SETPERMITS", "s", "1"]);
    let mut a = server.conn();
    let a_id = client_id(&mut a).to_string();
    let first =
        cmd(&mut a, &["RLOCK.ACQUIRE", "k", "o1", "30000", "REQUEST", "r1", "SESSION", "TOKEN"]);
    assert_eq!(first, Value::Array(vec![Value::Int(1), Value::Int(1)]));
    let leased = permit_ids(&cmd(
        &mut a,
        &["RSEM.ACQUIRE", "s", "1", "LEASE", "30000", "REQUEST", "q", "SESSION"],
    ));
    let old_id = String::from_utf8_lossy(&leased[0]).into_owned();
    let mut b = server.conn();
    let replies = transaction(
        &mut b,
        &[
            &["CLIENT", "KILL", "ID", &a_id],
            &["CLIENT", "PAUSE", "300", "WRITE"],
            &["RLOCK.ACQUIRE", "k", "o1", "30000", "REQUEST", "r1", "TOKEN"],
            &["RSEM.ACQUIRE", "s", "1", "LEASE", "30000", "REQUEST", "q"],
        ],
    );
    assert_eq!(
        replies[2],
        Value::Array(vec![Value::Int(1), Value::Int(2)]),
        "a new grant, a new token"
    );
    let new = permit_ids(&replies[3]);
    assert_ne!(new, leased, "new ids, not the ended permit's");
    let renew_old = run(&mut b, &[b"RSEM.RENEW", b"s", &leased[0], b"30000"]);
    assert_eq!(renew_old, Ok(Value::Int(0)), "the ended permit {old_id:?} is not renewed");
    barrier(&server, &mut admin);
    assert_eq!(hgetall(&mut admin, b"k"), vec![(b"o1".to_vec(), b"1".to_vec())]);
    assert_eq!(
        cmd(&mut admin, &["ZRANGE", "{s}:timeout", "0", "-1"]),
        Value::Array(vec![Value::BulkString(new[0].clone())])
    );
    assert_eq!(cmd(&mut admin, &["RSEM.AVAILABLE", "s"]), Value::Int(0));
}

/// A write on a semaphore's count (`RSEM.ADDPERMITS`, and `RLATCH.COUNTDOWN` on the same
/// integer) in the same transaction as the close of a session holding one of its leased permits
/// counts that permit back first, as every other write on a lock does.
#[test]
fn a_count_change_after_a_session_close_in_the_same_transaction_counts_its_permits_back_first() {
    let server = Server::start();
    let mut admin = server.conn();
    let mut a = server.conn();
    let a_id = client_id(&mut a).to_string();
    for key in ["s", "t"] {
        cmd(&mut admin, &["RSEM.SETPERMITS", key, "2"]);
        let leased = cmd(&mut a, &["RSEM.ACQUIRE", key, "1", "LEASE", "60000", "SESSION"]);
        assert_eq!(permit_ids(&leased).len(), 1, "{key}: one leased permit, bound to a");
    }
    let mut b = server.conn();
    let replies = transaction(
        &mut b,
        &[
            &["CLIENT", "KILL", "ID", &a_id],
            &["RSEM.ADDPERMITS", "s", "1"],
            &["RLATCH.COUNTDOWN", "t"],
        ],
    );
    assert_eq!(replies[0], Value::Int(1), "a's connection closed");
    assert_eq!(replies[1], Value::Int(3), "1 left + the ended permit + the one added");
    assert_eq!(replies[2], Value::Int(1), "1 left + the ended permit - the one counted down");
    // Once: the tick finds nothing more to end (the barrier's own end is the third).
    barrier(&server, &mut admin);
    assert_eq!(session_ends(&mut admin), 3, "each permit ended once, then the barrier");
    assert_eq!(cmd(&mut admin, &["RSEM.AVAILABLE", "s"]), Value::Int(3));
    assert_eq!(cmd(&mut admin, &["RSEM.AVAILABLE", "t"]), Value::Int(1));
}

#[test]
fn every_pending_end_of_a_lock_is_applied_before_a_command_reads_it() {
    let server = Server::start();
    let mut admin = server.conn();
    let mut a = server.conn();
    let a_id = client_id(&mut a).to_string();
    let mut pipe = redis::pipe();
    for i in 0..1_100 {
        pipe.cmd("RWLOCK.ACQUIRE")
            .arg("rw")
            .arg(format!("o{i}"))
            .arg("READ")
            .arg(30_000)
            .arg("REQUEST")
            .arg(format!("q{i}"))
            .arg("SESSION");
    }
    pipe.query::<()>(&mut a).expect("1,100 bound reads");
    let mut b = server.conn();
    let replies = transaction(
        &mut b,
        &[
            &["CLIENT", "KILL", "ID", &a_id],
            &["RWLOCK.ACQUIRE", "rw", "o999", "READ", "30000", "REQUEST", "q999"],
            &["RWLOCK.RENEW", "rw", "o999", "30000"],
        ],
    );
    assert_eq!(replies[1..], [Value::Nil, Value::Int(1)]);
    barrier(&server, &mut admin);
    let holds = hgetall(&mut admin, b"rw");
    assert_eq!(holds.len(), 2, "mode and o999, every bound read ended: {}", holds.len());
    assert!(holds.contains(&(b"o999".to_vec(), b"1".to_vec())), "the retry holds its read");
}

#[test]
fn counted_permits_released_as_a_request_being_rolled_back_come_back_once() {
    let server = Server::start();
    let mut admin = server.conn();
    cmd(&mut admin, &["RSEM.SETPERMITS", "s", "0"]);
    let waiter =
        Pending::start_str(&server, &["RSEM.ACQUIRE", "s", "2", "WAIT", "5000", "REQUEST", "c"]);
    wait_blocked(&mut admin, 1);
    // The request waits: releasing as it is refused (it holds nothing yet), nothing changes.
    let early = run(&mut admin, &[b"RSEM.RELEASE", b"s", b"2", b"REQUEST", b"c"]);
    assert!(early.is_err_and(|e| e.contains("already waiting")));
    assert_eq!(cmd(&mut admin, &["GET", "s"]), Value::BulkString(b"0".to_vec()));
    // Granted by a release, gone before its reply (its grant is rolled back), then released
    // as its request: the permits come back once.
    let w_id = waiter.client_id().to_string();
    let mut b = server.conn();
    transaction(&mut b, &[&["RSEM.RELEASE", "s", "2"], &["CLIENT", "KILL", "ID", &w_id]]);
    assert_eq!(cmd(&mut b, &["RSEM.RELEASE", "s", "2", "REQUEST", "c"]), Value::Int(2));
    barrier(&server, &mut admin);
    assert_eq!(cmd(&mut admin, &["RSEM.AVAILABLE", "s"]), Value::Int(2), "2 permits ever added");
    drop(waiter);
}

#[test]
fn a_write_side_whose_lease_the_read_side_moved_still_ends_with_its_connection() {
    let server = Server::start();
    let mut admin = server.conn();
    for (round, extend) in [
        &["RWLOCK.RENEW", "rw", "o1", "30000", "READ"][..],
        &["RWLOCK.ACQUIRE", "rw", "o1", "READ", "30000"][..],
    ]
    .into_iter()
    .enumerate()
    {
        let mut a = server.conn();
        let a_id = client_id(&mut a);
        cmd(&mut a, &["RWLOCK.ACQUIRE", "rw", "o1", "WRITE", "300", "SESSION"]);
        cmd(&mut a, &["RWLOCK.ACQUIRE", "rw", "o1", "READ", "300"]);
        let mut b = server.conn();
        assert!(matches!(cmd(&mut b, extend), Value::Int(1) | Value::Nil), "round {round}");
        // Past the first lease: the write hold lives on by the hash's new lease.
        std::thread::sleep(Duration::from_millis(500));
        assert!(int(&cmd(&mut admin, &["PTTL", "rw"])) > 20_000);
        kill_client(&mut admin, a_id);
        barrier(&server, &mut admin);
        let holds = hgetall(&mut admin, b"rw");
        assert!(
            !holds.iter().any(|(f, _)| f == b"o1:write"),
            "round {round}: the write side outlived its connection: {holds:?}"
        );
        cmd(&mut admin, &["DEL", "rw"]);
    }
}

#[test]
fn a_read_binding_shortened_by_a_partial_release_is_not_revived() {
    let server = Server::start();
    let mut admin = server.conn();
    keep_read(&mut admin, "rw");
    let mut tries = 0;
    loop {
        tries += 1;
        assert!(tries <= 20, "the owner's expired read hold never lingered in the hash");
        let mut a = server.conn();
        let a_id = client_id(&mut a);
        cmd(&mut a, &["RWLOCK.ACQUIRE", "rw", "o", "READ", "150", "SESSION"]);
        cmd(&mut a, &["RWLOCK.ACQUIRE", "rw", "o", "READ", "30000"]);
        // Its 30 s hold goes: its bound read side now lasts as long as the 150 ms one.
        cmd(&mut admin, &["RWLOCK.RELEASE", "rw", "o", "READ"]);
        let hold = "{rw}:o:rwlock_timeout:1";
        poll("the bound read's expiry", LIMIT, || (!exists(&mut admin, hold)).then_some(()));
        let mut c = server.conn();
        cmd(&mut c, &["RWLOCK.ACQUIRE", "rw", "o", "READ", "30000"]);
        if reads_of_o(&mut admin, "rw").as_deref() != Some(b"2") {
            cmd(&mut c, &["RWLOCK.RELEASE", "rw", "o", "READ"]);
            kill_client(&mut admin, a_id);
            barrier(&server, &mut admin);
            continue;
        }
        kill_client(&mut admin, a_id);
        barrier(&server, &mut admin);
        assert!(reads_of_o(&mut admin, "rw").is_some(), "c's read was ended by a's close");
        break;
    }
}

#[test]
fn a_session_waiter_gone_before_its_reply_is_rolled_back_not_delayed() {
    let server = Server::start();
    let mut admin = server.conn();
    for kind in ["lock", "permit"] {
        let (hold, wait): (&[&str], &[&str]) = if kind == "lock" {
            (
                &["RLOCK.ACQUIRE", "k", "h", "30000"],
                &[
                    "RLOCK.ACQUIRE",
                    "k",
                    "w",
                    "30000",
                    "WAIT",
                    "5000",
                    "SESSION",
                    "LOCKDELAY",
                    "500",
                    "REQUEST",
                    "q",
                ],
            )
        } else {
            cmd(&mut admin, &["RSEM.SETPERMITS", "s", "1"]);
            (
                &["RSEM.ACQUIRE", "s", "1"],
                &[
                    "RSEM.ACQUIRE",
                    "s",
                    "1",
                    "LEASE",
                    "30000",
                    "WAIT",
                    "5000",
                    "SESSION",
                    "LOCKDELAY",
                    "500",
                    "REQUEST",
                    "q",
                ],
            )
        };
        cmd(&mut admin, hold);
        let waiter = Pending::start_str(&server, wait);
        wait_blocked(&mut admin, 1);
        let w_id = waiter.client_id().to_string();
        let mut b = server.conn();
        let replies = if kind == "lock" {
            transaction(
                &mut b,
                &[
                    &["RLOCK.RELEASE", "k", "h"],
                    &["CLIENT", "KILL", "ID", &w_id],
                    &["RLOCK.ACQUIRE", "k", "o3", "1000"],
                ],
            )
        } else {
            transaction(
                &mut b,
                &[
                    &["RSEM.RELEASE", "s", "1"],
                    &["CLIENT", "KILL", "ID", &w_id],
                    &["RSEM.ACQUIRE", "s", "1", "LEASE", "1000"],
                ],
            )
        };
        // The rolled-back grant left it free, with no lock-delay: the newcomer takes it.
        let taken = match kind {
            "lock" => replies[2] == Value::Nil,
            _ => matches!(&replies[2], Value::Array(ids) if ids.len() == 1),
        };
        assert!(taken, "{kind}: {replies:?}");
        drop(waiter);
    }
    assert_eq!(info_field(&mut admin, "rlock", "rlock_lock_delays"), 0);
}

/// A counted grant's record has no end (`PTTL` -1, on the master and on a module-less
/// replica): a holder may keep counted permits as long as it likes and still release them as
/// its request, and a release that finds no record gives nothing back.
#[test]
fn a_counted_grants_request_record_lasts_until_it_is_released() {
    let server = Server::start();
    let replica = Server::builder().without_module().replica_of(&server).start();
    let (mut con, mut r) = (server.conn(), replica.conn());
    rlock_tests_integration::wait_link_up(&mut r);
    cmd(&mut con, &["RSEM.SETPERMITS", "p", "3"]);
    assert_eq!(cmd(&mut con, &["RSEM.ACQUIRE", "p", "2", "REQUEST", "c"]), Value::Int(1));
    let record = "rlock_request:{p}:c";
    assert_eq!(cmd(&mut con, &["PTTL", record]), Value::Int(-1), "no end on the master");
    assert_eq!(cmd(&mut con, &["WAIT", "1", "10000"]), Value::Int(1));
    assert_eq!(cmd(&mut r, &["PTTL", record]), Value::Int(-1), "no end on the replica");
    // A lock grant's record still ends with its lease.
    cmd(&mut con, &["RLOCK.ACQUIRE", "l", "o", "30000", "REQUEST", "c"]);
    let pttl = int(&cmd(&mut con, &["PTTL", "rlock_request:{l}:c"]));
    assert!((1..=30_000).contains(&pttl), "a lock grant's record ends with its lease: {pttl}");
    // Released: the record then lasts 60 s, and a retried release gives nothing more.
    assert_eq!(cmd(&mut con, &["RSEM.RELEASE", "p", "2", "REQUEST", "c"]), Value::Int(3));
    let pttl = int(&cmd(&mut con, &["PTTL", record]));
    assert!((50_000..=60_000).contains(&pttl), "a released record lasts 60 s: {pttl}");
    assert_eq!(cmd(&mut con, &["RSEM.RELEASE", "p", "2", "REQUEST", "c"]), Value::Int(3));
    // A grant cancelled: the cancelled record lasts 60 s too.
    assert_eq!(cmd(&mut con, &["RSEM.ACQUIRE", "p", "1", "REQUEST", "d"]), Value::Int(1));
    assert_eq!(cmd(&mut con, &["RLOCK.CANCEL", "p", "d"]), Value::Int(2));
    let pttl = int(&cmd(&mut con, &["PTTL", "rlock_request:{p}:d"]));
    assert!((50_000..=60_000).contains(&pttl), "a cancelled record lasts 60 s: {pttl}");
    assert_eq!(cmd(&mut con, &["RSEM.AVAILABLE", "p"]), Value::Int(3));
}

/// Counted permits acquired `OWNERLESS` (to be given back by a plain or `ONCE` release, as the
/// clients' `Semaphore.acquire(n)` / `release(n)`): the request's record lasts 60 s, granted at
/// once or by a hand-off, so records of grants no release names never pile up.
#[test]
fn an_ownerless_counted_grants_record_lasts_60_s() {
    let server = Server::start();
    let mut con = server.conn();
    cmd(&mut con, &["RSEM.SETPERMITS", "p", "1"]);
    let now = ["RSEM.ACQUIRE", "p", "1", "REQUEST", "a", "OWNERLESS"];
    assert_eq!(cmd(&mut con, &now), Value::Int(1));
    let pttl = int(&cmd(&mut con, &["PTTL", "rlock_request:{p}:a"]));
    assert!((50_000..=60_000).contains(&pttl), "granted at once: {pttl}");
    // A retry within the record's life replays the grant.
    assert_eq!(cmd(&mut con, &now), Value::Int(1));
    assert_eq!(cmd(&mut con, &["RSEM.AVAILABLE", "p"]), Value::Int(0));
    let wait = &["RSEM.ACQUIRE", "p", "1", "WAIT", "10000", "OWNERLESS", "REQUEST", "b"];
    let waiting = Pending::start_str(&server, wait);
    wait_blocked(&mut con, 1);
    assert_eq!(cmd(&mut con, &["RSEM.RELEASE", "p", "1", "ONCE", "x"]), Value::Int(0));
    let (reply, _) = waiting.reply(Duration::from_secs(10));
    assert_eq!(reply, Ok(Value::Int(1)), "handed over");
    let pttl = int(&cmd(&mut con, &["PTTL", "rlock_request:{p}:b"]));
    assert!((50_000..=60_000).contains(&pttl), "by a hand-off: {pttl}");
    assert_eq!(cmd(&mut con, &["RSEM.RELEASE", "p", "1"]), Value::Int(1));
    let refused = run(&mut con, &[b"RSEM.ACQUIRE", b"p", b"1", b"OWNERLESS"]);
    assert!(refused.is_err_and(|e| e.starts_with("ERR OWNERLESS needs REQUEST id")));
}

/// `MULTI; RLOCK.RELEASE l a` (a hand-off to `b`)`; CLIENT KILL ID <b>; <then>; EXEC`.
fn hand_off_then_kill(con: &mut Connection, waiter: &Pending, then: &[&str]) {
    let mut pipe = redis::pipe();
    pipe.atomic();
    pipe.cmd("RLOCK.RELEASE").arg("l").arg("a");
    pipe.cmd("CLIENT").arg("KILL").arg("ID").arg(waiter.client_id());
    let mut next = redis::cmd(then[0]);
    for arg in &then[1..] {
        next.arg(*arg);
    }
    pipe.add_command(next);
    let replies: Vec<Value> = pipe.query(con).expect("MULTI/EXEC");
    assert_eq!(replies[0], Value::Int(1), "the release freed the lock: {replies:?}");
}

#[test]
fn undoing_a_grant_never_releases_a_later_hold_of_the_same_owner() {
    let server = Server::start();
    let mut con = server.conn();
    assert_eq!(cmd(&mut con, &["RLOCK.ACQUIRE", "l", "a", "60000"]), Value::Nil);
    let waiter = Pending::start_str(&server, &["RLOCK.ACQUIRE", "l", "b", "100", "WAIT", "0"]);
    wait_blocked(&mut con, 1);
    hand_off_then_kill(&mut con, &waiter, &["CLIENT", "PAUSE", "20000", "WRITE"]);
    let rollbacks = info_field(&mut con, "rlock_waits", "rlock_grants_rolled_back");
    assert_eq!(rollbacks, 1, "the grant to the killed waiter is to be undone");
    // b's granted lease ends while writes are paused (the undo waits for the pause's end) ...
    poll("the granted lease to end", LIMIT, || {
        (cmd(&mut con, &["RLOCK.PTTL", "l"]) == Value::Int(-2)).then_some(())
    });
    // ... and b (Redisson reuses `<uuid>:<thread>` across reconnects) asks again: its command
    // waits for the pause and runs as soon as it ends, before the module's timers.
    let again = Pending::start_str(&server, &["RLOCK.ACQUIRE", "l", "b", "10000"]);
    poll("the new acquire to be paused", LIMIT, || {
        let paused = info_field(&mut con, "clients", "blocked_clients") >= 1;
        paused.then_some(())
    });
    cmd(&mut con, &["CLIENT", "UNPAUSE"]);
    let (reply, _) = again.reply(LIMIT);
    assert_eq!(reply, Ok(Value::Nil), "b holds the lock again");
    // The undo has run (no timer left armed for it) and left b's new hold alone.
    poll("the deferred undo to run", LIMIT, || {
        (info_field(&mut con, "rlock_waits", "rlock_timers_armed") == 0).then_some(())
    });
    assert_eq!(hgetall(&mut con, b"l"), vec![(b"b".to_vec(), b"1".to_vec())]);
    let other = run_str(&mut con, &["RLOCK.ACQUIRE", "l", "c", "10000"]).expect("acquire");
    assert!(matches!(other, Value::Int(pttl) if pttl > 5_000), "c is refused: {other:?}");
}

#[test]
fn a_grant_is_never_undone_on_a_server_that_became_a_replica() {
    let master = Server::start();
    let mut con = master.conn();
    let replica = attach_replica(&master, &mut con, LIMIT);
    // Every write so far is on the replica.
    cmd(&mut con, &["WAIT", "1", "5000"]);
    assert_eq!(cmd(&mut con, &["RLOCK.ACQUIRE", "l", "a", "60000"]), Value::Nil);
    let waiter = Pending::start_str(&master, &["RLOCK.ACQUIRE", "l", "b", "60000", "WAIT", "0"]);
    wait_blocked(&mut con, 1);
    hand_off_then_kill(&mut con, &waiter, &["FAILOVER"]);
    let mut promoted = replica.conn();
    poll("the replica to be promoted", LIMIT, || {
        let role = cmd(&mut promoted, &["ROLE"]);
        matches!(role, Value::Array(ref r) if r.first() == Some(&Value::BulkString(b"master".to_vec())))
            .then_some(())
    });
    poll("the old master to follow the new one", LIMIT, || {
        let info = cmd(&mut con, &["INFO", "replication"]);
        let text = match info {
            Value::BulkString(b) => String::from_utf8_lossy(&b).into_owned(),
            Value::VerbatimString { text, .. } => text,
            _ => String::new(),
        };
        text.contains("master_link_status:up").then_some(())
    });
    // Writes on the new master reach the old one: the two must agree.
    cmd(&mut promoted, &["SET", "marker", "1"]);
    cmd(&mut promoted, &["WAIT", "1", "5000"]);
    poll("the marker to reach the old master", LIMIT, || {
        (cmd(&mut con, &["GET", "marker"]) == Value::BulkString(b"1".to_vec())).then_some(())
    });
    // The grant to b was replicated before the failover; the old master must not have undone it
    // on its own (it was a replica by then).
    assert_eq!(hgetall(&mut promoted, b"l"), vec![(b"b".to_vec(), b"1".to_vec())]);
    assert_eq!(hgetall(&mut con, b"l"), hgetall(&mut promoted, b"l"), "the two nodes diverged");
}
