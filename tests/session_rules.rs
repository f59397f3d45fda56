//! Session holds without a server: the bindings (`sessions::Sessions`) and the lock-delay rule,
//! the `SESSION` / `LOCKDELAY` options of every acquire, and the read-write rule that ends a
//! whole side of an owner's hold (`rw_rules::end_side`).

use std::collections::BTreeMap;

use rlock::args::{Acquire, Mode, RwAcquire, SemAcquire, Session};
use rlock::error::LockError;
use rlock::queue::LockName;
use rlock::rules::Reply;
use rlock::rw_rules::{self, Effect, Holds, RwState};
use rlock::sessions::{
    delay_until, Bind, Binding, ClientId, Held, Hold, Lasts, Sessions, MAX_LOCK_DELAY_MS,
};

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

fn lock(key: &str) -> LockName {
    LockName { db: 0, key: key.as_bytes().to_vec() }
}

fn hold(key: &str, owner: &str) -> Hold {
    Hold { lock: lock(key), held: Held::Lock(owner.as_bytes().to_vec()) }
}

const fn bind(client: ClientId) -> Bind {
    Bind { client, delay_ms: 0 }
}

#[test]
fn a_closed_connection_ends_its_holds_only() {
    let mut s = Sessions::default();
    s.granted(hold("a", "o"), Some(bind(1)), 100, 0);
    s.granted(hold("b", "o"), Some(bind(1)), 100, 0);
    s.granted(hold("c", "o"), Some(bind(2)), 100, 0);
    assert_eq!(s.len(), 3);
    assert!(s.closed(1));
    assert_eq!(s.len(), 1);
    let ending: Vec<Hold> = s.take_ending(usize::MAX).into_iter().map(|(h, _)| h).collect();
    assert_eq!(ending, vec![hold("a", "o"), hold("b", "o")]);
    assert!(!s.closed(1), "nothing left for that client");
    assert_eq!(s.holds_of(2), vec![hold("c", "o")]);
}

#[test]
fn a_fresh_grant_resets_the_binding_and_cancels_a_pending_end() {
    let mut s = Sessions::default();
    s.granted(hold("a", "o"), Some(bind(1)), 100, 0);
    s.closed(1);
    assert!(s.ends_pending());
    // Released and granted again before the end was applied: that end is not for this hold.
    s.granted(hold("a", "o"), None, 200, 0);
    assert!(!s.ends_pending());
    assert_eq!(s.len(), 0);
    s.granted(hold("a", "o"), Some(bind(3)), 200, 0);
    s.granted(hold("a", "o"), Some(bind(4)), 200, 0);
    assert!(!s.closed(3), "the binding moved to client 4 by a fresh grant");
    assert_eq!(s.get(&hold("a", "o")).map(|b| b.bind.client), Some(4));
}

#[test]
fn a_touch_keeps_the_client_and_moves_the_lease_end() {
    let mut s = Sessions::default();
    s.granted(hold("a", "o"), Some(bind(1)), 100, 0);
    s.touch(&hold("a", "o"), 500, Lasts::Exactly, None, 50);
    assert_eq!(s.prune(300, 10), 0, "renewed: not stale at 300");
    assert_eq!(s.get(&hold("a", "o")).map(|b| b.until), Some(500));
    assert_eq!(s.prune(501, 10), 1);
    assert!(s.is_empty());
    s.touch(&hold("a", "o"), 900, Lasts::Exactly, Some(bind(2)), 600);
    assert!(s.is_empty(), "touching an unbound hold binds nothing");
}

#[test]
fn a_stale_binding_is_never_revived_by_a_re_entry_or_a_renewal() {
    let mut s = Sessions::default();
    s.granted(hold("a", "o"), Some(bind(1)), 100, 0);
    // The hold ended by its lease at 100; a re-entry at 150 (the owner's field lingered) is
    // a fresh hold: it is not bound to client 1, whose close must end nothing.
    s.touch(&hold("a", "o"), 900, Lasts::AtLeast, None, 150);
    assert!(s.get(&hold("a", "o")).is_none());
    assert!(!s.closed(1), "client 1 has no hold left");
    // With SESSION, the re-entry binds its own connection.
    s.granted(hold("b", "o"), Some(bind(1)), 100, 0);
    s.touch(&hold("b", "o"), 900, Lasts::AtLeast, Some(bind(2)), 150);
    assert_eq!(s.get(&hold("b", "o")).map(|b| (b.bind.client, b.until)), Some((2, 900)));
}

#[test]
fn a_read_re_entry_keeps_the_latest_end_of_the_owners_holds() {
    let mut s = Sessions::default();
    s.granted(hold("a", "o"), Some(bind(1)), 1_000, 0);
    s.touch(&hold("a", "o"), 400, Lasts::AtLeast, None, 10);
    assert_eq!(s.get(&hold("a", "o")).map(|b| b.until), Some(1_000));
    s.touch(&hold("a", "o"), 2_000, Lasts::AtLeast, None, 20);
    assert_eq!(s.get(&hold("a", "o")).map(|b| b.until), Some(2_000));
    s.touch(&hold("a", "o"), 500, Lasts::Exactly, None, 30);
    assert_eq!(s.get(&hold("a", "o")).map(|b| b.until), Some(500), "a renewal sets it");
}

#[test]
fn the_pending_ends_of_one_lock_are_taken_apart_from_the_others() {
    let mut s = Sessions::default();
    s.granted(hold("a", "o"), Some(bind(1)), 1_000, 0);
    s.granted(hold("b", "o"), Some(bind(1)), 1_000, 0);
    s.granted(hold("b", "p"), Some(bind(1)), 1_000, 0);
    s.closed(1);
    assert!(s.ending(&lock("b")) && s.ending(&lock("a")) && !s.ending(&lock("c")));
    let taken = s.take_ending_of(&lock("b"), 10);
    assert_eq!(
        taken.iter().map(|(h, _)| h.clone()).collect::<Vec<_>>(),
        vec![hold("b", "o"), hold("b", "p")]
    );
    assert!(!s.ending(&lock("b")) && s.ending(&lock("a")));
    assert_eq!(s.take_ending(10).len(), 1);
}

#[test]
fn expired_bindings_are_pruned_so_a_connection_keeps_only_live_ones() {
    let mut s = Sessions::default();
    for i in 0..100 {
        s.granted(hold(&format!("k{i}"), "o"), Some(bind(1)), 10, 0);
    }
    s.granted(hold("live", "o"), Some(bind(1)), 1_000, 20);
    assert_eq!(s.len(), 101 - 4, "a new binding prunes a few expired ones on its way");
    s.prune(20, usize::MAX);
    assert_eq!(s.holds_of(1), vec![hold("live", "o")]);
    assert!(!s.concerns(&lock("k0")) && s.concerns(&lock("live")));
}

#[test]
fn unbinding_a_lock_drops_every_hold_on_it() {
    let mut s = Sessions::default();
    let read = Hold { lock: lock("rw"), held: Held::Read(b"r".to_vec()) };
    let write = Hold { lock: lock("rw"), held: Held::Write(b"w".to_vec()) };
    s.granted(read.clone(), Some(bind(1)), 100, 0);
    s.granted(write, Some(bind(2)), 100, 0);
    s.granted(hold("other", "o"), Some(bind(2)), 100, 0);
    assert!(s.concerns(&lock("rw")));
    s.unbind_lock(&lock("rw"));
    assert!(!s.concerns(&lock("rw")));
    assert_eq!(s.len(), 1);
    assert!(!s.closed(1));
    s.unbind(&read);
}

/// Ends are taken a bounded batch at a time, by lock (a lock's permits together); a lock's
/// pending ends go when its holds end otherwise, the other locks' stay.
#[test]
fn pending_ends_are_taken_a_batch_at_a_time_and_dropped_by_lock() {
    let mut s = Sessions::default();
    let permit = |key: &str, id: &str| Hold { lock: lock(key), held: Held::Permit(id.into()) };
    for key in ["a", "b", "c"] {
        s.granted(permit(key, "2"), Some(bind(1)), 100, 0);
        s.granted(hold(key, "o"), Some(bind(1)), 100, 0);
        s.granted(permit(key, "1"), Some(bind(1)), 100, 0);
    }
    s.closed(1);
    let first: Vec<Hold> = s.take_ending(2).into_iter().map(|(h, _)| h).collect();
    assert_eq!(first, vec![hold("a", "o"), permit("a", "1")]);
    s.unbind_lock(&lock("b"));
    assert!(s.concerns(&lock("c")) && !s.concerns(&lock("b")));
    let rest: Vec<Hold> = s.take_ending(usize::MAX).into_iter().map(|(h, _)| h).collect();
    assert_eq!(rest, vec![permit("a", "2"), hold("c", "o"), permit("c", "1"), permit("c", "2")]);
    assert!(!s.ends_pending());
}

#[test]
fn flush_and_swapdb_follow_the_data() {
    let mut s = Sessions::default();
    let in_db = |db, key: &str| Hold {
        lock: LockName { db, key: key.as_bytes().to_vec() },
        held: Held::Permit(b"id".to_vec()),
    };
    s.granted(in_db(0, "a"), Some(bind(1)), 100, 0);
    s.granted(in_db(1, "b"), Some(bind(1)), 100, 0);
    s.granted(in_db(2, "c"), Some(bind(1)), 100, 0);
    s.swapped(0, 1);
    assert!(s.get(&in_db(1, "a")).is_some() && s.get(&in_db(0, "b")).is_some());
    s.flushed(Some(1));
    assert!(s.get(&in_db(1, "a")).is_none());
    assert_eq!(s.len(), 2);
    s.closed(1);
    s.swapped(0, 2);
    let ending: Vec<Hold> = s.take_ending(usize::MAX).into_iter().map(|(h, _)| h).collect();
    assert_eq!(ending, vec![in_db(0, "c"), in_db(2, "b")]);
    s.granted(in_db(5, "x"), Some(bind(1)), 100, 0);
    s.flushed(None);
    assert!(s.is_empty());
}

/// A close queued in database 0, then `SWAPDB 0 1` where database 1 has a bound hold of the
/// same name and owner: the pending end follows its hold to database 1, the other binding to
/// database 0, and neither cancels the other.
#[test]
fn a_pending_end_and_a_binding_of_the_same_hold_cross_in_a_swapdb() {
    let mut s = Sessions::default();
    let in_db =
        |db| Hold { lock: LockName { db, key: b"l".to_vec() }, held: Held::Lock(b"o".to_vec()) };
    s.granted(in_db(0), Some(bind(1)), 100, 0);
    s.granted(in_db(1), Some(bind(2)), 100, 0);
    assert!(s.closed(1));
    s.swapped(0, 1);
    assert_eq!(s.get(&in_db(0)).map(|b| b.bind.client), Some(2));
    let ending: Vec<Hold> = s.take_ending(usize::MAX).into_iter().map(|(h, _)| h).collect();
    assert_eq!(ending, vec![in_db(1)]);
}

/// What a flush drops comes back whole when the data does (a reload): bindings and pending
/// ends; what it did not drop stays.
#[test]
fn a_flush_returns_what_it_dropped_and_a_restore_puts_it_back() {
    let mut s = Sessions::default();
    let in_db = |db, key: &str| Hold {
        lock: LockName { db, key: key.as_bytes().to_vec() },
        held: Held::Lock(b"o".to_vec()),
    };
    s.granted(in_db(0, "a"), Some(bind(1)), 100, 0);
    s.granted(in_db(0, "b"), Some(bind(2)), 100, 0);
    s.granted(in_db(3, "c"), Some(bind(1)), 100, 0);
    s.closed(2);
    let dropped = s.flushed(Some(0));
    assert_eq!((dropped.bound.len(), dropped.ending.len()), (1, 1));
    assert!(!s.ends_pending() && s.len() == 1);
    s.restore(dropped);
    assert_eq!(s.len(), 2);
    assert_eq!(s.get(&in_db(0, "a")).map(|b| b.bind.client), Some(1));
    let ending: Vec<Hold> = s.take_ending(usize::MAX).into_iter().map(|(h, _)| h).collect();
    assert_eq!(ending, vec![in_db(0, "b")]);
    assert!(s.flushed(None).bound.len() == 2 && s.is_empty());
}

#[test]
fn the_delay_is_bounded_by_its_maximum_and_by_the_lease() {
    assert_eq!(delay_until(1_000, 0, None), None);
    assert_eq!(delay_until(1_000, 500, None), Some(1_500));
    assert_eq!(delay_until(1_000, 500, Some(1_200)), Some(1_200));
    assert_eq!(delay_until(1_000, 500, Some(1_000)), None, "the lease ends now");
    assert_eq!(delay_until(0, u64::MAX, None), Some(MAX_LOCK_DELAY_MS as i64));
    assert_eq!(delay_until(i64::MAX - 1, 10, None), Some(i64::MAX));
    let b = Binding { bind: bind(1), until: 10 };
    assert!(!b.stale(10) && b.stale(11));
}

/// A close ends the read sides of one lock together (issue 34 §12): one plan drops every
/// listed owner's field and hold keys, then settles the lock once from the readers that stay,
/// as ending them one after the other would leave it; a batch that leaves the settling to a
/// later one only frees a lock nothing else holds.
#[test]
fn read_sides_ending_together_leave_the_lock_as_ending_them_one_by_one() {
    let now = 100;
    let owners = [b"a".to_vec(), b"b".to_vec()];
    let shared = state(&[("mode", "read"), ("a", "2"), ("b", "1"), ("x", "1")]);
    let mut all = holds("a", &[900, 950]);
    all.extend(holds("b", &[990]));
    all.extend(holds("x", &[400]));
    let plan = rw_rules::end_reads(&shared, &owners, rw_rules::Rest::Holds(&all), now);
    assert_eq!(plan.freed, None);
    assert_eq!(plan.hold_keys().count(), 3, "{plan:?}");
    for owner in &owners {
        assert!(plan.effects.contains(&Effect::DropReads { owner: owner.clone() }));
    }
    let expiries: Vec<i64> = plan
        .effects
        .iter()
        .filter_map(|e| match e {
            Effect::ExpireAt(d) => Some(d.unix_ms()),
            _ => None,
        })
        .collect();
    assert_eq!(expiries, vec![400], "the lease of the reader that stays, set once");
    // One after the other: the same holds dropped, the same lease in the end.
    let first = rw_rules::end_side(&shared, Mode::Read, b"a", &all, now);
    let after = state(&[("mode", "read"), ("b", "1"), ("x", "1")]);
    let second = rw_rules::end_side(&after, Mode::Read, b"b", &all, now);
    let dropped = first.hold_keys().count() + second.hold_keys().count();
    assert_eq!(dropped, 3);
    assert!(second.effects.iter().any(|e| matches!(e, Effect::ExpireAt(d) if d.unix_ms() == 400)));

    // Only they held it: freed (one Delete).
    let alone = state(&[("mode", "read"), ("a", "2"), ("b", "1")]);
    let plan = rw_rules::end_reads(&alone, &owners, rw_rules::Rest::Holds(&all), now);
    assert_eq!((plan.freed, plan.effects.last()), (Some(Mode::Read), Some(&Effect::Delete)));

    // A batch that leaves the settling for later: the lock is freed only when nothing else
    // holds it, and its lease is left as it is.
    let mine = state(&[("mode", "read"), ("a", "2"), ("b", "1")]);
    let plan = rw_rules::end_reads(&mine, &owners, rw_rules::Rest::Others(true), now);
    assert_eq!(plan.freed, None);
    assert!(!plan.effects.iter().any(|e| matches!(e, Effect::ExpireAt(_) | Effect::Delete)));
    let plan = rw_rules::end_reads(&mine, &owners, rw_rules::Rest::Others(false), now);
    assert_eq!(plan.freed, Some(Mode::Read));

    // Owners that hold no read, a free lock: nothing.
    let plan =
        rw_rules::end_reads(&shared, &[b"nobody".to_vec()], rw_rules::Rest::Others(true), now);
    assert!(plan.effects.is_empty() && plan.reply == Reply::Nil);
    let free = RwState { pttl: -2, ..RwState::default() };
    let plan = rw_rules::end_reads(&free, &owners, rw_rules::Rest::Others(false), now);
    assert!(plan.effects.is_empty());
}

#[test]
fn the_ending_readers_fields_are_read_alone() {
    let readers: [(&[u8], Option<&[u8]>); 3] =
        [(b"a", Some(b"3")), (b"gone", None), (b"b", Some(b"1"))];
    let state = RwState::of_readers(Some(b"read"), readers, true, 5_000).expect("valid");
    assert_eq!(state.readers.len(), 2);
    assert_eq!((state.reads_of(b"a"), state.reads_of(b"b")), (3, 1));
    let bad: [(&[u8], Option<&[u8]>); 1] = [(b"a", Some(b"x"))];
    assert_eq!(RwState::of_readers(Some(b"read"), bad, true, 5_000), Err(LockError::CorruptCount));
    let none: [(&[u8], Option<&[u8]>); 0] = [];
    assert_eq!(
        RwState::of_readers(None, none, true, 5_000),
        Err(LockError::NotAnRwLock),
        "a hash without mode"
    );
}
