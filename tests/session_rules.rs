//! Session holds without a server: the `SESSION` / `LOCKDELAY` options of every acquire, and the
//! read-write rule that ends a whole side of an owner's hold (`rw_rules::end_side`).

use std::collections::BTreeMap;

use rlock::args::{Acquire, Mode, RwAcquire, SemAcquire, Session};
use rlock::error::LockError;
use rlock::rules::Reply;
use rlock::rw_rules::{self, Effect, Holds, RwState};

fn argv(args: &[&str]) -> Vec<Vec<u8>> {
    args.iter().map(|a| a.as_bytes().to_vec()).collect()
}

#[test]
fn session_and_lockdelay_are_read_in_any_order_among_the_options() {
    let args =
        argv(&["RLOCK.ACQUIRE", "k", "o", "1000", "LOCKDELAY", "250", "WAIT", "0", "SESSION"]);
    let parsed = Acquire::parse(&args).expect("valid");
    assert_eq!(parsed.session, Some(Session { delay_ms: 250 }));
    assert!(parsed.wait.is_some());
    let args = argv(&["RLOCK.ACQUIRE", "k", "o", "1000", "session", "TOKEN"]);
    assert_eq!(Acquire::parse(&args).expect("valid").session, Some(Session { delay_ms: 0 }));
    let args = argv(&["RLOCK.ACQUIRE", "k", "o", "1000"]);
    assert_eq!(Acquire::parse(&args).expect("valid").session, None);
    let args =
        argv(&["RWLOCK.ACQUIRE", "k", "o", "WRITE", "1000", "SESSION", "LOCKDELAY", "60000"]);
    let parsed = RwAcquire::parse(&args).expect("valid");
    assert_eq!((parsed.mode, parsed.session), (Mode::Write, Some(Session { delay_ms: 60_000 })));
    let args = argv(&["RSEM.ACQUIRE", "k", "2", "SESSION", "LEASE", "1000"]);
    assert_eq!(SemAcquire::parse(&args).expect("valid").session, Some(Session { delay_ms: 0 }));
}

#[test]
fn bad_session_options_are_refused() {
    for (args, expected) in [
        (&["RLOCK.ACQUIRE", "k", "o", "1", "LOCKDELAY", "5"][..], LockError::LockDelayNeedsSession),
        (&["RLOCK.ACQUIRE", "k", "o", "1", "SESSION", "LOCKDELAY"], LockError::InvalidLockDelay),
        (
            &["RLOCK.ACQUIRE", "k", "o", "1", "SESSION", "LOCKDELAY", "60001"],
            LockError::InvalidLockDelay,
        ),
        (
            &["RLOCK.ACQUIRE", "k", "o", "1", "SESSION", "LOCKDELAY", "007"],
            LockError::InvalidLockDelay,
        ),
        (
            &["RLOCK.ACQUIRE", "k", "o", "1", "SESSION", "LOCKDELAY", "+5"],
            LockError::InvalidLockDelay,
        ),
        (&["RLOCK.ACQUIRE", "k", "o", "1", "SESSION", "SESSION"], LockError::Syntax),
        (
            &["RLOCK.ACQUIRE", "k", "o", "1", "SESSION", "LOCKDELAY", "1", "LOCKDELAY", "2"],
            LockError::Syntax,
        ),
    ] {
        assert_eq!(Acquire::parse(&argv(args)).unwrap_err(), expected, "{args:?}");
    }
    let rw = argv(&["RWLOCK.ACQUIRE", "k", "o", "READ", "1", "LOCKDELAY", "0"]);
    assert_eq!(RwAcquire::parse(&rw).unwrap_err(), LockError::LockDelayNeedsSession);
    let counted = argv(&["RSEM.ACQUIRE", "k", "1", "WAIT", "0", "SESSION"]);
    assert_eq!(SemAcquire::parse(&counted).unwrap_err(), LockError::SessionNeedsLease);
    for e in [LockError::LockDelayNeedsSession, LockError::SessionNeedsLease] {
        assert!(e.message().starts_with("ERR ") && e.message().contains("SESSION"), "{e}");
    }
}

fn state(fields: &[(&str, &str)]) -> RwState {
    let fields = fields.iter().map(|(f, v)| (f.as_bytes().to_vec(), v.as_bytes().to_vec()));
    RwState::from_fields(fields, 5_000).expect("valid")
}

fn holds(owner: &str, deadlines: &[i64]) -> Holds {
    let owned: BTreeMap<u64, i64> = (1..).zip(deadlines.iter().copied()).collect();
    BTreeMap::from([(owner.as_bytes().to_vec(), owned)])
}

#[test]
fn ending_a_read_side_drops_every_read_hold_of_the_owner_at_once() {
    let now = 100;
    let alone = state(&[("mode", "read"), ("o", "3")]);
    let plan = rw_rules::end_side(&alone, Mode::Read, b"o", &holds("o", &[900, 950, 990]), now);
    assert_eq!(plan.freed, Some(Mode::Read));
    assert_eq!(plan.hold_keys().count(), 3, "{plan:?}");
    assert_eq!(plan.effects.last(), Some(&Effect::Delete));

    // Another reader keeps the lock, whose lease becomes that reader's.
    let shared = state(&[("mode", "read"), ("o", "2"), ("x", "1")]);
    let mut all = holds("o", &[900, 950]);
    all.extend(holds("x", &[400]));
    let plan = rw_rules::end_side(&shared, Mode::Read, b"o", &all, now);
    assert_eq!(plan.freed, None);
    assert!(plan.effects.contains(&Effect::DropReads { owner: b"o".to_vec() }));
    assert!(plan.effects.iter().any(|e| matches!(e, Effect::ExpireAt(d) if d.unix_ms() == 400)));

    // The owner's write hold stays: only the read side ends.
    let both = state(&[("mode", "write"), ("o:write", "2"), ("o", "1")]);
    let plan = rw_rules::end_side(&both, Mode::Read, b"o", &holds("o", &[900]), now);
    assert_eq!(plan.freed, None);
    assert!(!plan.effects.iter().any(|e| matches!(e, Effect::DropWrites { .. })), "{plan:?}");
}

#[test]
fn ending_a_write_side_drops_every_re_entry_and_keeps_the_owners_reads() {
    let now = 100;
    let writer = state(&[("mode", "write"), ("o:write", "7")]);
    let plan = rw_rules::end_side(&writer, Mode::Write, b"o", &Holds::new(), now);
    assert_eq!(plan.freed, Some(Mode::Write));
    assert_eq!(plan.effects, vec![Effect::DropWrites { owner: b"o".to_vec() }, Effect::Delete]);

    let both = state(&[("mode", "write"), ("o:write", "3"), ("o", "1")]);
    let plan = rw_rules::end_side(&both, Mode::Write, b"o", &holds("o", &[900]), now);
    assert_eq!(plan.freed, None, "downgraded to the owner's read hold");
    assert!(plan.effects.contains(&Effect::SetMode(Mode::Read)), "{plan:?}");

    // Nothing to end: another owner's lock, a side not held, a free lock.
    let free = RwState { pttl: -2, ..RwState::default() };
    for (state, side, owner) in [
        (&writer, Mode::Write, "x"),
        (&writer, Mode::Read, "o"),
        (&free, Mode::Write, "o"),
        (&free, Mode::Read, "o"),
    ] {
        let plan = rw_rules::end_side(state, side, owner.as_bytes(), &Holds::new(), now);
        assert!(plan.effects.is_empty() && plan.reply == Reply::Nil, "{side:?} {owner}");
    }
}
