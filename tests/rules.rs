//! The lock rules, without a server: single steps, and sequences run on a small in-memory
//! model of the key (a map owner -> count with an absolute deadline), as the module's key layer
//! applies plans.

mod common;

use common::{at, lease, Model};
use rlock::args::Lease;
use rlock::error::LockError;
use rlock::rules::{self, parse_count, Deadline, Extend, Plan, Reply, View, Write};

#[test]
fn acquire_takes_a_free_lock_reenters_and_reports_the_holders_pttl() {
    let d = at(1_000, 500);
    let plan = rules::acquire(View::Free, d, Extend::Set).expect("ok");
    assert_eq!(
        plan,
        Plan { write: Write::SetCount(1), expire_at: Some(d), publish: false, reply: Reply::Nil }
    );
    let plan = rules::acquire(View::Held { mine: Some(4), pttl: 10 }, d, Extend::Set).expect("ok");
    assert_eq!((plan.write, plan.reply), (Write::SetCount(5), Reply::Nil));
    let plan = rules::acquire(View::Held { mine: None, pttl: 77 }, d, Extend::Set).expect("ok");
    assert_eq!(
        plan,
        Plan { write: Write::Keep, expire_at: None, publish: false, reply: Reply::Int(77) }
    );
    assert!(!plan.writes());
    let plan = rules::acquire(View::Held { mine: None, pttl: -1 }, d, Extend::Set).expect("ok");
    assert_eq!(plan.reply, Reply::Int(-1));
}

#[test]
fn reentry_cannot_overflow_the_count() {
    let held = View::Held { mine: Some(i64::MAX as u64), pttl: 5 };
    assert_eq!(rules::acquire(held, at(0, 1), Extend::Set), Err(LockError::CountOverflow));
}

#[test]
fn release_counts_down_then_deletes_and_publishes() {
    let d = at(0, 100);
    assert_eq!(rules::release(View::Free, None).reply, Reply::Nil);
    assert_eq!(
        rules::release(View::Held { mine: None, pttl: 5 }, Some(d)),
        Plan { write: Write::Keep, expire_at: None, publish: false, reply: Reply::Nil }
    );
    assert_eq!(
        rules::release(View::Held { mine: Some(3), pttl: 5 }, Some(d)),
        Plan {
            write: Write::SetCount(2),
            expire_at: Some(d),
            publish: false,
            reply: Reply::Int(0),
        }
    );
    assert_eq!(rules::release(View::Held { mine: Some(3), pttl: 5 }, None).expire_at, None);
    assert_eq!(
        rules::release(View::Held { mine: Some(1), pttl: 5 }, Some(d)),
        Plan { write: Write::Delete, expire_at: None, publish: true, reply: Reply::Int(1) }
    );
}

#[test]
fn renew_only_for_a_holder() {
    let d = at(0, 100);
    assert_eq!(
        rules::renew(View::Held { mine: Some(2), pttl: 1 }, d, Extend::Set).expire_at,
        Some(d)
    );
    assert_eq!(
        rules::renew(View::Held { mine: Some(2), pttl: 1 }, d, Extend::Set).reply,
        Reply::Int(1)
    );
    for view in [View::Free, View::Held { mine: None, pttl: 1 }] {
        let plan = rules::renew(view, d, Extend::Set);
        assert!(!plan.writes(), "{view:?}");
        assert_eq!(plan.reply, Reply::Int(0));
    }
}

#[test]
fn force_release_and_pttl() {
    assert_eq!(rules::force_release(View::Free).reply, Reply::Int(0));
    assert!(!rules::force_release(View::Free).writes());
    let plan = rules::force_release(View::Held { mine: None, pttl: 9 });
    assert_eq!((plan.write, plan.publish, plan.reply), (Write::Delete, true, Reply::Int(1)));
    assert_eq!(rules::pttl(View::Free), -2);
    assert_eq!(rules::pttl(View::Held { mine: None, pttl: -1 }), -1);
    assert_eq!(rules::pttl(View::Held { mine: None, pttl: 42 }), 42);
}

#[test]
fn deadlines_refuse_overflow() {
    assert_eq!(Deadline::after(10, lease(5)).map(Deadline::unix_ms), Ok(15));
    assert_eq!(Deadline::after(1, lease(i64::MAX as u64)), Err(LockError::LeaseTooLarge));
    assert_eq!(Deadline::after(0, lease(u64::MAX)), Err(LockError::LeaseTooLarge));
}

#[test]
fn counts_must_be_positive_integers() {
    assert_eq!(parse_count(b"1"), Ok(1));
    assert_eq!(parse_count(b"9223372036854775807"), Ok(i64::MAX as u64));
    for bad in [&b"0"[..], b"-1", b"", b"abc", b"1.5", b" 1", b"9223372036854775808"] {
        assert_eq!(parse_count(bad), Err(LockError::CorruptCount), "{bad:?}");
    }
}

#[test]
fn a_sequence_reenters_to_two_releases_to_zero_then_another_owner_takes_it() {
    let mut m = Model::default();
    assert_eq!(m.acquire("a", 0, 1_000), Reply::Nil);
    assert_eq!(m.acquire("a", 10, 1_000), Reply::Nil);
    assert_eq!(m.owners["a"], 2);
    assert_eq!(m.deadline, Some(1_010), "re-entry resets the lease");
    assert_eq!(m.acquire("b", 20, 1_000), Reply::Int(990));
    assert_eq!(m.release("b", 30), Reply::Nil);
    assert_eq!(m.release("a", 40), Reply::Int(0));
    assert_eq!(m.published, 0);
    assert_eq!(m.release("a", 50), Reply::Int(1));
    assert_eq!(m.published, 1);
    assert!(m.owners.is_empty());
    assert_eq!(m.acquire("b", 60, 1_000), Reply::Nil);
}

#[test]
fn an_expired_lease_frees_the_lock_without_a_message() {
    let mut m = Model::default();
    assert_eq!(m.acquire("a", 0, 100), Reply::Nil);
    assert_eq!(m.acquire("b", 99, 100), Reply::Int(1));
    assert_eq!(m.acquire("b", 100, 100), Reply::Nil, "lease over at its deadline");
    assert_eq!(m.release("a", 101), Reply::Nil, "the old owner no longer holds it");
    assert_eq!(m.published, 0);
}

#[test]
fn token_counters_start_at_zero_and_only_grow() {
    use rlock::rules::{next_token, parse_token};
    assert_eq!(parse_token(None), Ok(0));
    assert_eq!(parse_token(Some(b"0")), Ok(0));
    assert_eq!(parse_token(Some(b"41")), Ok(41));
    for bad in [&b"-1"[..], b"x", b"", b"1.0", b"01"] {
        assert_eq!(parse_token(Some(bad)), Err(LockError::CorruptToken), "{bad:?}");
    }
    assert_eq!(next_token(41, 0), Ok(42));
    assert_eq!(next_token(i64::MAX as u64, 0), Err(LockError::TokenExhausted));
    // The failover floor lifts the next token, never lowers it.
    assert_eq!(next_token(41, 1_000_000), Ok(1_000_000));
    assert_eq!(next_token(1_000_000, 1_000_000), Ok(1_000_001));
    assert_eq!(next_token(41, i64::MAX as u64 + 1), Err(LockError::TokenExhausted));
}

#[test]
fn acquire_replies_have_one_shape_with_and_without_token() {
    assert_eq!(rules::granted(None), Reply::Nil);
    assert_eq!(rules::granted(Some(7)), Reply::Token(7));
    assert_eq!(rules::busy(40, false), Reply::Int(40));
    assert_eq!(rules::busy(-1, true), Reply::Busy(-1));
}

#[test]
fn a_latch_remembers_a_release_result_but_not_a_non_holder() {
    assert_eq!(rules::remembered(Reply::Int(1)), Some(1));
    assert_eq!(rules::remembered(Reply::Int(0)), Some(0));
    assert_eq!(rules::remembered(Reply::Nil), None);
}

#[test]
fn a_lease_is_over_one_ms_after_its_deadline() {
    let d = Deadline::after(1_000, Lease::from_millis(500).expect("positive")).expect("fits");
    assert_eq!(d.over_at(), 1_501);
    assert_eq!(rules::lease_over_at(1_000, 500), 1_501);
    assert_eq!(rules::lease_over_at(i64::MAX, 5), i64::MAX);
}

#[test]
fn a_waiter_is_granted_a_free_lock_only() {
    let request = rules::Request {
        kind: rules::Kind::Reentrant,
        owner: b"w".to_vec(),
        lease: Lease::from_millis(100).expect("positive"),
        token: false,
        id: None,
        session: None,
        gt: false,
        ownerless: false,
    };
    let plan = request.grant(View::Free, 1_000, -1).expect("free: granted");
    assert_eq!((plan.write, plan.reply), (Write::SetCount(1), Reply::Nil));
    assert_eq!(plan.expire_at.map(Deadline::unix_ms), Some(1_100));
    assert_eq!(request.grant(View::Held { mine: None, pttl: 5 }, 1_000, 1_005), None);
    assert!(request.exclusive());
}

/// The lease end a plan leaves on a held key with `pttl` left at `now` (`None`: no expiry).
fn lease_end_after(plan: &Plan, now: i64, pttl: i64) -> Option<i64> {
    match plan.expire_at {
        Some(deadline) => Some(deadline.unix_ms()),
        None => (pttl >= 0).then(|| now + pttl),
    }
}

#[test]
fn with_gt_a_re_entry_or_renewal_ends_at_the_later_of_the_current_and_the_new_lease() {
    let mut rng = rlock_tests_integration::Rng(0x6774);
    for step in 0..5_000 {
        let now = 1_000_000 + rng.below(1_000) as i64;
        let pttl = rng.below(20_000) as i64 - 1; // -1: no expiry
        let ms = 1 + rng.below(20_000) as u64;
        let new_end = at(now, ms).unix_ms();
        let view = View::Held { mine: Some(1 + rng.below(3) as u64), pttl };
        let gt = Extend::Gt { until: if pttl < 0 { -1 } else { now + pttl } };
        let plans = [
            rules::acquire(view, at(now, ms), gt).expect("no overflow"),
            rules::renew(view, at(now, ms), gt),
        ];
        let expected = (pttl >= 0).then(|| (now + pttl).max(new_end));
        for plan in plans {
            assert_eq!(lease_end_after(&plan, now, pttl), expected, "step {step}: {view:?} {ms}");
            // A key without expiry keeps none.
            assert_eq!(plan.expire_at.is_none(), pttl < 0, "step {step}");
        }
        // Without GT, Redisson's rule: the new lease, whatever was left.
        let set = rules::acquire(view, at(now, ms), Extend::Set).expect("no overflow");
        assert_eq!(set.expire_at, Some(at(now, ms)), "step {step}");
        assert_eq!(rules::renew(view, at(now, ms), Extend::Set).expire_at, Some(at(now, ms)));
    }
}

#[test]
fn gt_changes_neither_a_fresh_grant_nor_what_another_owner_or_a_free_lock_gets() {
    let gt = Extend::Gt { until: 5_000 };
    let d = at(0, 100);
    assert_eq!(rules::acquire(View::Free, d, gt), rules::acquire(View::Free, d, Extend::Set));
    let other = View::Held { mine: None, pttl: 5_000 };
    assert_eq!(rules::acquire(other, d, gt), rules::acquire(other, d, Extend::Set));
    assert_eq!(rules::renew(other, d, gt).reply, Reply::Int(0));
    assert_eq!(rules::renew(View::Free, d, gt).reply, Reply::Int(0));
    // A renewal that changes nothing still tells the holder it holds (the key's own expiry set
    // again).
    let held = View::Held { mine: Some(1), pttl: 5_000 };
    let plan = rules::renew(held, d, gt);
    assert_eq!((plan.reply, plan.expire_at), (Reply::Int(1), Some(Deadline::at(5_000))));
    // A waiter's grant that comes as a re-entry keeps the owner's longer lease too.
    let request = rules::Request {
        kind: rules::Kind::Reentrant,
        owner: b"o".to_vec(),
        lease: lease(100),
        token: false,
        id: None,
        session: None,
        gt: true,
        ownerless: false,
    };
    let plan = request.grant(held, 0, 5_000).expect("a re-entry is granted");
    assert_eq!((plan.write, plan.expire_at), (Write::SetCount(2), Some(Deadline::at(5_000))));
}
