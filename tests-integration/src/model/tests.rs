//! The model's own rules, without a server.

use redis::Value;

use super::*;

const A: Conn = 1;
const B: Conn = 2;

fn at(ms: Ms) -> Window {
    Window { lo: ms, hi: ms + 1 }
}

fn acquire(name: &str, owner: &str, request: Option<&str>, session: Option<Ms>) -> Cmd {
    Cmd::Acquire {
        name: name.into(),
        owner: owner.into(),
        lease: 100_000,
        token: false,
        request: request.map(Into::into),
        session,
        gt: false,
    }
}

fn ok(m: &mut Model, c: Conn, t: Ms, cmd: &Cmd, v: Value) {
    m.exec(c, at(t), cmd, &Ok(v)).unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
}

fn lock_of(m: &Model, db: usize, name: &str) -> Option<(String, i64)> {
    match m.dbs[db].keys.get(name) {
        Some(Entity::Lock(l)) => Some((l.owner.clone(), l.count)),
        _ => None,
    }
}

#[test]
fn a_closed_sessions_hold_ends_before_the_next_command_reads_it() {
    let mut m = Model::default();
    ok(&mut m, A, 0, &acquire("L", "x", Some("r1"), Some(0)), Value::Nil);
    m.close(A, at(10));
    assert_eq!(lock_of(&m, 0, "L"), None);
    // The retry is a new acquire (granted again, unbound), not a replay of the ended grant.
    ok(&mut m, B, 11, &acquire("L", "x", Some("r1"), None), Value::Nil);
    assert_eq!(lock_of(&m, 0, "L"), Some(("x".into(), 1)));
    m.close(A, at(12));
    assert_eq!(lock_of(&m, 0, "L"), Some(("x".into(), 1)), "the old connection ends nothing");
}

#[test]
fn a_lock_delay_holds_the_lock_and_is_no_grant_to_replay() {
    let mut m = Model::default();
    ok(&mut m, A, 0, &acquire("L", "x", Some("r1"), Some(300)), Value::Nil);
    m.close(A, at(10));
    assert_eq!(lock_of(&m, 0, "L"), Some((LOCKDELAY_OWNER.into(), 1)));
    let retry = acquire("L", "x", Some("r1"), None);
    assert!(m.clone().exec(B, at(20), &retry, &Ok(Value::Nil)).is_err(), "a replay is wrong");
    ok(&mut m, B, 20, &retry, Value::Int(290));
    m.settle(at(400));
    assert_eq!(lock_of(&m, 0, "L"), None, "the delay ends");
}

#[test]
fn a_cancel_of_counted_permits_already_given_back_gives_nothing() {
    let mut m = Model::default();
    let sem = |c| Cmd::SemAcquire {
        name: "p".into(),
        n: 2,
        lease: None,
        request: Some("c1".into()),
        session: c,
        ownerless: false,
    };
    ok(&mut m, A, 0, &Cmd::SemSet { name: "p".into(), n: 2 }, Value::Int(1));
    ok(&mut m, A, 1, &sem(None), Value::Int(1));
    let release =
        Cmd::SemRelease { name: "p".into(), n: 2, request: Some("c1".into()), once: false };
    ok(&mut m, A, 2, &release, Value::Int(2));
    // A retried release gives nothing more; a cancel finds nothing to give back.
    ok(&mut m, A, 3, &release, Value::Int(2));
    let cancel = Cmd::Cancel { name: "p".into(), id: "c1".into() };
    assert!(m.clone().exec(A, at(4), &cancel, &Ok(Value::Int(2))).is_err());
    ok(&mut m, A, 4, &cancel, Value::Int(0));
}

#[test]
fn a_plain_release_of_counted_permits_ends_no_request() {
    let mut m = Model::default();
    let sem = Cmd::SemAcquire {
        name: "p".into(),
        n: 1,
        lease: None,
        request: Some("c1".into()),
        session: None,
        ownerless: false,
    };
    ok(&mut m, A, 0, &Cmd::SemSet { name: "p".into(), n: 1 }, Value::Int(1));
    ok(&mut m, A, 1, &sem, Value::Int(1));
    // Permits carry no owner: a plain release is anybody's, the request's grant stays.
    ok(
        &mut m,
        A,
        2,
        &Cmd::SemRelease { name: "p".into(), n: 1, request: None, once: false },
        Value::Int(1),
    );
    ok(&mut m, A, 3, &sem, Value::Int(1));
}

#[test]
fn a_delayed_leased_permit_is_not_renewed() {
    let mut m = Model::default();
    ok(&mut m, A, 0, &Cmd::SemSet { name: "s".into(), n: 1 }, Value::Int(1));
    let id = b"0123456789abcdef".to_vec();
    let acq = Cmd::SemAcquire {
        name: "s".into(),
        n: 1,
        lease: Some(30_000),
        request: None,
        session: Some(1500),
        ownerless: false,
    };
    ok(&mut m, A, 1, &acq, Value::Array(vec![Value::BulkString(id.clone())]));
    m.close(A, at(5));
    let renew = Cmd::SemRenew { name: "s".into(), id, lease: 30_000 };
    assert!(m.clone().exec(B, at(6), &renew, &Ok(Value::Int(1))).is_err());
    ok(&mut m, B, 6, &renew, Value::Int(0));
}

#[test]
fn bindings_follow_their_holds_across_swapdb_and_stay_with_the_name_at_move() {
    let mut m = Model::default();
    ok(&mut m, A, 0, &acquire("L", "x", None, Some(0)), Value::Nil);
    ok(&mut m, 9, 1, &Cmd::SwapDb, Value::Okay);
    m.close(A, at(2));
    assert_eq!(lock_of(&m, 1, "L"), None, "the hold went to db 1 with its binding");

    let mut m = Model::default();
    ok(&mut m, A, 0, &acquire("L", "x", None, Some(0)), Value::Nil);
    ok(&mut m, 9, 1, &Cmd::Move { name: "L".into(), db: 1 }, Value::Int(1));
    m.close(A, at(2));
    assert_eq!(lock_of(&m, 1, "L"), Some(("x".into(), 1)), "a moved lock is no session hold");
}

#[test]
fn tokens_must_increase_per_name() {
    let mut m = Model::default();
    let t = |c| Cmd::Acquire {
        name: "L".into(),
        owner: c,
        lease: 1000,
        token: true,
        request: None,
        session: None,
        gt: false,
    };
    ok(&mut m, A, 0, &t("x".into()), token_array(true, 5));
    ok(&mut m, A, 1, &Cmd::ForceRelease { name: "L".into() }, Value::Int(1));
    assert!(m.exec(A, at(2), &t("y".into()), &Ok(token_array(true, 5))).is_err());
}

#[test]
fn a_read_release_drops_the_newest_index_even_when_its_lease_ended() {
    let mut m = Model::default();
    let read = |lease| Cmd::RwAcquire {
        name: "W".into(),
        owner: "x".into(),
        write: false,
        lease,
        token: false,
        request: None,
        session: None,
        gt: false,
    };
    ok(&mut m, A, 0, &read(100_000), Value::Nil);
    ok(&mut m, A, 1, &read(100), Value::Nil);
    m.settle(at(500));
    let rel = Cmd::RwRelease { name: "W".into(), owner: "x".into(), write: false };
    ok(&mut m, A, 501, &rel, Value::Int(0));
    let Some(Entity::Rw(rw)) = m.dbs[0].keys.get("W") else { panic!("the lock is gone") };
    assert_eq!(describe_rw(rw), "rw read readers [x=1]");
}

fn renew(owner: &str, lease: Ms, gt: bool) -> Cmd {
    Cmd::Renew { name: "L".into(), owner: owner.into(), lease, gt }
}

fn reentry(lease: Ms, request: Option<&str>, gt: bool) -> Cmd {
    Cmd::Acquire {
        name: "L".into(),
        owner: "x".into(),
        lease,
        token: false,
        request: request.map(Into::into),
        session: None,
        gt,
    }
}

#[test]
fn a_gt_renewal_or_reentry_never_shortens_a_lock_lease_and_a_plain_one_does() {
    for (gt, held) in [(true, true), (false, false)] {
        for shorter in [renew("x", 400, gt), reentry(400, None, gt)] {
            let mut m = Model::default();
            ok(&mut m, A, 0, &acquire("L", "x", None, None), Value::Nil);
            let want =
                if matches!(shorter, Cmd::Renew { .. }) { Value::Int(1) } else { Value::Nil };
            ok(&mut m, A, 10, &shorter, want);
            m.settle(at(1000));
            assert_eq!(lock_of(&m, 0, "L").is_some(), held, "{shorter:?}");
        }
    }
}

#[test]
fn a_busy_reply_shows_the_holders_remaining_lease() {
    let mut m = Model::default();
    ok(&mut m, A, 0, &acquire("L", "x", None, None), Value::Nil);
    ok(&mut m, A, 10, &renew("x", 400, true), Value::Int(1));
    let other = acquire("L", "y", None, None);
    // Read at 1000-1001 of a lease that ends at 100000-100001: 98999..=99001 (and the slack).
    assert!(m.clone().exec(B, at(1000), &other, &Ok(Value::Int(99_000))).is_ok());
    for shortened in [0, 400, 98_000] {
        let e = m.clone().exec(B, at(1000), &other, &Ok(Value::Int(shortened)));
        assert!(e.is_err(), "a remaining lease of {shortened} ms passed");
    }
}

#[test]
fn a_gt_reentrys_request_record_lasts_until_the_lease_it_left() {
    // The record of a GT re-entry that kept a longer lease lasts as long: a retry after the
    // new lease's own end is a replay (the count stays), not another re-entry.
    for (gt, count) in [(true, 2), (false, 3)] {
        let mut m = Model::default();
        ok(&mut m, A, 0, &acquire("L", "x", None, None), Value::Nil);
        ok(&mut m, A, 10, &reentry(400, Some("r1"), gt), Value::Nil);
        if !gt {
            // Without GT the lease is 400 ms: keep the lock held past it.
            ok(&mut m, A, 300, &renew("x", 100_000, false), Value::Int(1));
        }
        m.settle(at(1000));
        ok(&mut m, A, 1000, &reentry(400, Some("r1"), gt), Value::Nil);
        assert_eq!(lock_of(&m, 0, "L"), Some(("x".into(), count)), "GT {gt}");
    }
}

#[test]
fn a_gt_read_reentry_or_renewal_raises_every_live_read_hold_of_the_owner() {
    let read = |lease, gt| Cmd::RwAcquire {
        name: "W".into(),
        owner: "x".into(),
        write: false,
        lease,
        token: false,
        request: None,
        session: None,
        gt,
    };
    let renew =
        |lease, gt| Cmd::RwRenew { name: "W".into(), owner: "x".into(), lease, side: None, gt };
    let readers = |m: &Model| match m.dbs[0].keys.get("W") {
        Some(Entity::Rw(rw)) => describe_rw(rw),
        _ => "none".into(),
    };
    // A GT re-entry's new hold, and the earlier one, end with the latest hold.
    for (gt, want) in [(true, "rw read readers [x=2]"), (false, "rw read readers [x=1]")] {
        let mut m = Model::default();
        ok(&mut m, A, 0, &read(100_000, false), Value::Nil);
        ok(&mut m, A, 10, &read(400, gt), Value::Nil);
        m.settle(at(1000));
        assert_eq!(readers(&m), want, "re-entry, GT {gt}");
    }
    // A plain re-entry leaves a short hold; a GT one then raises it (and the new one) to the
    // latest; a plain renewal sets them all, a GT renewal keeps them.
    for (gt, want) in [(true, "rw read readers [x=3]"), (false, "none")] {
        let mut m = Model::default();
        ok(&mut m, A, 0, &read(400, false), Value::Nil);
        ok(&mut m, A, 10, &read(100_000, false), Value::Nil);
        ok(&mut m, A, 20, &read(400, true), Value::Nil);
        ok(&mut m, A, 30, &renew(400, gt), Value::Int(1));
        m.settle(at(1000));
        assert_eq!(readers(&m), want, "renewal, GT {gt}");
    }
}
