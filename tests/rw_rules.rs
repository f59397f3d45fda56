//! The read-write lock rules, without a server: random operations applied to a simulated Redis
//! (the hash's fields and expiry, and the read holds' lease keys, each with lazy expiry), as the
//! store applies the rules' effects, and checked against a reference model written separately
//! (Redisson's RReadWriteLock with rlock's documented differences, stated directly), plus the
//! layout's invariants after every step.

use std::collections::BTreeMap;

use rlock::args::{Lease, Mode};
use rlock::rules::{Deadline, Reply};
use rlock::rw_rules::{self, Acquired, Effect, Holds, Reads, RwPlan, RwState};
use rlock_tests_integration::Rng;

/// Redis as the store sees it: the hash, its deadline, and the hold keys with theirs.
#[derive(Default, Debug)]
struct Redis {
    hash: BTreeMap<Vec<u8>, Vec<u8>>,
    deadline: Option<i64>,
    /// (owner, index) -> deadline.
    holds: BTreeMap<(Vec<u8>, u64), i64>,
    published: Vec<&'static [u8]>,
}

impl Redis {
    fn expire(&mut self, now: i64) {
        if self.deadline.is_some_and(|d| d <= now) {
            self.hash.clear();
            self.deadline = None;
        }
        self.holds.retain(|_, &mut d| d > now);
    }

    fn state(&mut self, now: i64) -> RwState {
        self.expire(now);
        let pttl = self.deadline.map_or(-1, |d| d - now);
        let fields = self.hash.iter().map(|(f, v)| (f.clone(), v.clone()));
        RwState::from_fields(fields, pttl).expect("a read-write lock")
    }

    /// What the store reads for one owner's acquire or renewal (`RwKey::state_of`).
    fn state_of(&mut self, owner: &[u8], now: i64) -> RwState {
        self.expire(now);
        let pttl = self.deadline.map_or(-1, |d| d - now);
        let write_field = [owner, b":write"].concat();
        RwState::of_owner(
            self.hash.get(b"mode".as_slice()).map(Vec::as_slice),
            owner,
            self.hash.get(owner).map(Vec::as_slice),
            self.hash.get(&write_field).map(Vec::as_slice),
            !self.hash.is_empty(),
            pttl,
        )
        .expect("a read-write lock")
    }

    fn holds(&self, state: &RwState) -> Holds {
        let mut holds = Holds::new();
        for (owner, &count) in &state.readers {
            let owned = holds.entry(owner.clone()).or_default();
            for index in 1..=count {
                if let Some(&d) = self.holds.get(&(owner.clone(), index)) {
                    owned.insert(index, d);
                }
            }
        }
        holds
    }

    fn apply(&mut self, plan: &RwPlan) {
        for effect in &plan.effects {
            match effect {
                Effect::SetMode(mode) => {
                    self.hash.insert(b"mode".to_vec(), mode.as_bytes().to_vec());
                }
                Effect::SetReads { owner, count } => {
                    self.hash.insert(owner.clone(), count.to_string().into_bytes());
                }
                Effect::DropReads { owner } => {
                    self.hash.remove(owner);
                }
                Effect::SetWrites { owner, count } => {
                    let field = [owner.as_slice(), b":write"].concat();
                    self.hash.insert(field, count.to_string().into_bytes());
                }
                Effect::DropWrites { owner } => {
                    self.hash.remove(&[owner.as_slice(), b":write"].concat());
                }
                Effect::AddHold { owner, index, deadline } => {
                    self.holds.insert((owner.clone(), *index), deadline.unix_ms());
                }
                Effect::DropHold { owner, index } => {
                    self.holds.remove(&(owner.clone(), *index));
                }
                Effect::RenewHold { owner, index, deadline } => {
                    if let Some(d) = self.holds.get_mut(&(owner.clone(), *index)) {
                        *d = deadline.unix_ms();
                    }
                }
                Effect::ExpireAt(deadline) => self.deadline = Some(deadline.unix_ms()),
                Effect::Delete => {
                    self.hash.clear();
                    self.deadline = None;
                }
            }
        }
        if let Some(mode) = plan.freed {
            self.published.push(mode.message());
        }
    }
}

/// The reference: who holds what, stated directly.
#[derive(Default, Debug)]
struct Reference {
    /// Reader -> its holds' deadlines, oldest first.
    readers: BTreeMap<String, Vec<i64>>,
    writer: Option<(String, u64)>,
    deadline: Option<i64>,
}

impl Reference {
    fn expire(&mut self, now: i64) {
        if self.deadline.is_some_and(|d| d <= now) {
            *self = Self::default();
        }
    }

    fn held(&self) -> bool {
        !self.readers.is_empty() || self.writer.is_some()
    }

    fn pttl(&self, now: i64) -> i64 {
        self.deadline.map_or(-1, |d| d - now)
    }

    fn writes(&self, owner: &str) -> u64 {
        self.writer.as_ref().filter(|(w, _)| w == owner).map_or(0, |(_, n)| *n)
    }

    fn acquire(&mut self, want: Mode, owner: &str, now: i64, until: i64, queued: bool) -> Reply {
        self.expire(now);
        let reads = self.readers.get(owner).map_or(0, Vec::len);
        let writes = self.writes(owner);
        let free = !self.held();
        let granted = match want {
            Mode::Read => free || reads > 0 || writes > 0 || (self.writer.is_none() && !queued),
            Mode::Write => free || writes > 0,
        };
        if !granted {
            return Reply::Int(self.pttl(now));
        }
        match want {
            Mode::Read => self.readers.entry(owner.to_owned()).or_default().push(until),
            Mode::Write => self.writer = Some((owner.to_owned(), writes + 1)),
        }
        self.deadline = Some(self.deadline.filter(|_| !free).map_or(until, |d| d.max(until)));
        Reply::Nil
    }

    /// Readers none of whose holds is live leave; nobody live left: free.
    fn settle(&mut self, now: i64) -> bool {
        self.readers.retain(|_, holds| holds.iter().any(|&d| d > now));
        if !self.held() {
            *self = Self::default();
            return true;
        }
        let live = self.readers.values().flatten().copied().filter(|&d| d > now).max();
        self.deadline = if self.writer.is_some() { live.max(self.deadline) } else { live };
        false
    }

    fn release(&mut self, want: Mode, owner: &str, now: i64) -> Reply {
        self.expire(now);
        match want {
            Mode::Read => {
                let Some(holds) = self.readers.get_mut(owner) else { return Reply::Nil };
                holds.pop();
                if holds.is_empty() {
                    self.readers.remove(owner);
                }
                Reply::Int(i64::from(self.settle(now)))
            }
            Mode::Write => match self.writes(owner) {
                0 => Reply::Nil,
                1 => {
                    self.writer = None;
                    self.settle(now);
                    Reply::Int(1)
                }
                n => {
                    self.writer = Some((owner.to_owned(), n - 1));
                    Reply::Int(0)
                }
            },
        }
    }
}

const OWNERS: [&str; 4] = ["a:1", "b:1", "c:2", "d:7"];

/// Checks the simulated Redis against the reference, and the layout's invariants.
fn check(redis: &mut Redis, reference: &mut Reference, now: i64, step: usize) {
    reference.expire(now);
    let state = redis.state(now);
    let holds = redis.holds(&state);
    let live_readers: BTreeMap<String, usize> = state
        .readers
        .iter()
        .filter_map(|(o, &n)| {
            let live = holds.get(o).map_or(0, |h| h.range(1..=n).filter(|(_, &d)| d > now).count());
            (live > 0).then(|| (String::from_utf8(o.clone()).expect("utf8"), n as usize))
        })
        .collect();
    let expected: BTreeMap<String, usize> = reference
        .readers
        .iter()
        .filter(|(_, h)| h.iter().any(|&d| d > now))
        .map(|(o, h)| (o.clone(), h.len()))
        .collect();
    assert_eq!(live_readers, expected, "step {step}: readers");
    let writer =
        state.writer.as_ref().map(|(o, n)| (String::from_utf8(o.clone()).expect("utf8"), *n));
    assert_eq!(writer, reference.writer, "step {step}: writer");
    match (&state.mode, &state.writer) {
        (None, _) => assert!(state.readers.is_empty() && state.writer.is_none(), "step {step}"),
        (Some(Mode::Write), Some((w, _))) => {
            assert!(state.readers.keys().all(|r| r == w), "step {step}: only the writer reads");
        }
        (Some(Mode::Write), None) => panic!("step {step}: write mode without a writer"),
        (Some(Mode::Read), writer) => {
            assert!(writer.is_none(), "step {step}: a writer in read mode")
        }
    }
    // The hash outlives every live read hold.
    if let Some(deadline) = redis.deadline {
        for (owner, owned) in &holds {
            for (&i, &d) in owned.range(1..=state.readers.get(owner).copied().unwrap_or(0)) {
                assert!(d <= deadline, "step {step}: hold {i} of {owner:?} outlives the hash");
            }
        }
    }
}

#[test]
fn random_operations_agree_with_the_reference_and_keep_the_layout_whole() {
    for seed in 1..=40_u64 {
        let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let (mut redis, mut reference) = (Redis::default(), Reference::default());
        let mut now = 1_000_000_i64;
        for step in 0..2_500 {
            now += rng.below(40) as i64;
            let owner = OWNERS[rng.below(OWNERS.len())];
            let want = if rng.below(2) == 0 { Mode::Read } else { Mode::Write };
            let lease = Lease::from_millis(1 + rng.below(300) as u64).expect("positive");
            let until = now + lease.as_millis() as i64;
            let queued = rng.below(5) == 0;
            let state = redis.state(now);
            match rng.below(8) {
                0..=3 => {
                    let deadline = Deadline::after(now, lease).expect("fits");
                    // The store reads only the owner's fields: the same outcome.
                    let partial = redis.state_of(owner.as_bytes(), now);
                    assert_eq!(
                        rw_rules::acquire(
                            &partial,
                            want,
                            owner.as_bytes(),
                            now,
                            deadline,
                            queued,
                            Reads::Set
                        ),
                        rw_rules::acquire(
                            &state,
                            want,
                            owner.as_bytes(),
                            now,
                            deadline,
                            queued,
                            Reads::Set
                        ),
                        "seed {seed} step {step}: acquire from the owner's fields"
                    );
                    assert_eq!(
                        rw_rules::renew(&partial, owner.as_bytes(), now, deadline, Reads::Set),
                        rw_rules::renew(&state, owner.as_bytes(), now, deadline, Reads::Set),
                        "seed {seed} step {step}: renew from the owner's fields"
                    );
                    let got = match rw_rules::acquire(
                        &state,
                        want,
                        owner.as_bytes(),
                        now,
                        deadline,
                        queued,
                        Reads::Set,
                    )
                    .expect("no overflow")
                    {
                        Acquired::Granted(plan) => {
                            redis.apply(&plan);
                            plan.reply
                        }
                        Acquired::Busy(pttl) => Reply::Int(pttl),
                        Acquired::Upgrade(pttl) => {
                            assert!(state.reads_of(owner.as_bytes()) > 0, "step {step}");
                            Reply::Int(pttl)
                        }
                    };
                    let expected = reference.acquire(want, owner, now, until, queued);
                    assert_eq!(
                        got == Reply::Nil,
                        expected == Reply::Nil,
                        "seed {seed} step {step}: acquire {want:?} {owner}"
                    );
                }
                4..=6 => {
                    let holds = redis.holds(&state);
                    let plan = rw_rules::release(&state, want, owner.as_bytes(), &holds, now);
                    redis.apply(&plan);
                    let expected = reference.release(want, owner, now);
                    assert_eq!(
                        plan.reply, expected,
                        "seed {seed} step {step}: release {want:?} {owner}"
                    );
                }
                _ => {
                    let holds = redis.holds(&state);
                    if let Some(plan) = rw_rules::reap(&state, &holds, now) {
                        redis.apply(&plan);
                    }
                    if reference.held() {
                        reference.settle(now);
                    }
                }
            }
            check(&mut redis, &mut reference, now, step);
        }
    }
}

#[test]
fn an_upgrade_is_told_apart_and_write_reentry_keeps_the_later_lease() {
    let lease = |ms| Deadline::after(0, Lease::from_millis(ms).expect("positive")).expect("fits");
    let mut redis = Redis::default();
    let state = redis.state(0);
    let Ok(Acquired::Granted(plan)) =
        rw_rules::acquire(&state, Mode::Read, b"o", 0, lease(100), false, Reads::Set)
    else {
        panic!("free: granted");
    };
    redis.apply(&plan);
    let state = redis.state(0);
    assert_eq!(
        rw_rules::acquire(&state, Mode::Write, b"o", 0, lease(100), false, Reads::Set),
        Ok(Acquired::Upgrade(100))
    );
    assert_eq!(
        rw_rules::acquire(&state, Mode::Write, b"x", 0, lease(100), false, Reads::Set),
        Ok(Acquired::Busy(100))
    );
    let mut redis = Redis::default();
    let state = redis.state(0);
    let Ok(Acquired::Granted(plan)) =
        rw_rules::acquire(&state, Mode::Write, b"w", 0, lease(500), false, Reads::Set)
    else {
        panic!("free: granted");
    };
    redis.apply(&plan);
    let state = redis.state(10);
    let Ok(Acquired::Granted(plan)) =
        rw_rules::acquire(&state, Mode::Write, b"w", 10, lease(100), false, Reads::Set)
    else {
        panic!("re-entry");
    };
    redis.apply(&plan);
    assert_eq!(redis.deadline, Some(500), "a shorter re-entry keeps the later lease");
    assert!(rw_rules::check_owner(b"mode").is_err() && rw_rules::check_owner(b"x:write").is_err());
    assert!(rw_rules::check_owner(b"uuid:1").is_ok());
}

#[test]
fn read_re_entry_stops_at_the_maximum_and_a_stored_count_above_it_is_corrupt() {
    let deadline = Deadline::after(0, Lease::from_millis(100).expect("positive")).expect("fits");
    let max = rw_rules::MAX_READ_HOLDS;
    let hash = |count: &str| {
        vec![(b"mode".to_vec(), b"read".to_vec()), (b"o".to_vec(), count.as_bytes().to_vec())]
    };
    let below = RwState::from_fields(hash(&(max - 1).to_string()), 100).expect("valid");
    let Ok(Acquired::Granted(plan)) =
        rw_rules::acquire(&below, Mode::Read, b"o", 0, deadline, false, Reads::Set)
    else {
        panic!("the last re-entry allowed is granted");
    };
    assert!(plan.effects.contains(&Effect::SetReads { owner: b"o".to_vec(), count: max }));
    let at = RwState::from_fields(hash(&max.to_string()), 100).expect("valid");
    assert_eq!(
        rw_rules::acquire(&at, Mode::Read, b"o", 0, deadline, true, Reads::Set),
        Err(rlock::error::LockError::TooManyReadHolds)
    );
    // A renewal of the most holds allowed: one effect per hold and the hash's lease.
    assert_eq!(rw_rules::renew(&at, b"o", 0, deadline, Reads::Set).effects.len() as u64, max + 1);
    for stored in
        [(max + 1).to_string(), "10000000000".to_owned(), "9000000000000000000".to_owned()]
    {
        let corrupt = Err(rlock::error::LockError::CorruptCount);
        assert_eq!(RwState::from_fields(hash(&stored), 100), corrupt, "{stored}");
        let of_owner =
            RwState::of_owner(Some(b"read"), b"o", Some(stored.as_bytes()), None, true, 100);
        assert_eq!(of_owner, corrupt, "{stored}");
    }
    // A write count is any positive integer Redis stores (no loop is sized by it).
    let writer =
        RwState::of_owner(Some(b"write"), b"w", None, Some(b"9223372036854775807"), true, 5);
    assert_eq!(writer.expect("valid").writes_of(b"w"), i64::MAX as u64);
    // No mode: a reentrant lock's hash; no field at all: free.
    let err = RwState::of_owner(None, b"o", Some(b"1"), None, true, 5);
    assert_eq!(err, Err(rlock::error::LockError::NotAnRwLock));
    assert_eq!(RwState::of_owner(None, b"o", None, None, false, -2).expect("free").mode, None);
}

/// A release or a dead-reader check reads every read hold: a lock whose readers' counts add up
/// past `MAX_LOCK_READ_HOLDS` is refused before any is read (each count alone may be valid).
#[test]
fn the_read_holds_a_release_may_walk_are_bounded_over_all_readers() {
    let max = rw_rules::MAX_LOCK_READ_HOLDS;
    let per = rw_rules::MAX_READ_HOLDS;
    let lock = |readers: u64, last: u64| {
        let mut fields = vec![(b"mode".to_vec(), b"read".to_vec())];
        for i in 0..readers {
            let count = if i + 1 == readers { last } else { per };
            fields.push((format!("r{i}").into_bytes(), count.to_string().into_bytes()));
        }
        RwState::from_fields(fields, 100).expect("each count is valid")
    };
    let at_limit = lock(max / per, per);
    assert_eq!(rw_rules::walkable(&at_limit), Ok(()));
    let past = lock(max / per + 1, 1);
    assert_eq!(rw_rules::walkable(&past), Err(rlock::error::LockError::TooManyLockReadHolds));
}

/// `RENEW ... READ|WRITE` renews only the side asked for, and only when the owner holds it: a
/// write hold is never kept alive by the same owner's read hold, nor the reverse.
#[test]
fn a_side_renewal_renews_that_side_only_and_only_when_it_is_held() {
    let lease = Lease::from_millis(1000).expect("positive");
    let deadline = Deadline::after(100, lease).expect("fits");
    let state = |fields: &[(&str, &str)]| {
        let fields = fields.iter().map(|(f, v)| (f.as_bytes().to_vec(), v.as_bytes().to_vec()));
        RwState::from_fields(fields, 50).expect("valid")
    };
    let writer = state(&[("mode", "write"), ("o:write", "1")]);
    let reader = state(&[("mode", "read"), ("o", "2")]);
    let both = state(&[("mode", "write"), ("o:write", "1"), ("o", "1")]);
    let not = Reply::Int(0);
    for (state, side, renewed) in [
        (&writer, Mode::Write, true),
        (&writer, Mode::Read, false),
        (&reader, Mode::Read, true),
        (&reader, Mode::Write, false),
        (&both, Mode::Write, true),
        (&both, Mode::Read, true),
    ] {
        let plan = rw_rules::renew_side(state, b"o", side, 100, deadline, Reads::Set);
        if !renewed {
            assert_eq!(plan.reply, not, "{side:?} of {state:?}");
            assert!(plan.effects.is_empty(), "nothing changes: {plan:?}");
            continue;
        }
        assert_eq!(plan.reply, Reply::Int(1), "{side:?} of {state:?}");
        let renewed_holds = plan.hold_keys().count() as u64;
        let expected = if side == Mode::Read { state.reads_of(b"o") } else { 0 };
        assert_eq!(renewed_holds, expected, "only that side's hold keys: {plan:?}");
        assert_eq!(plan.effects.last(), Some(&Effect::ExpireAt(deadline)), "{plan:?}");
    }
    // Another owner's holds renew nothing; a free lock neither.
    let free = RwState { pttl: -2, ..RwState::default() };
    for side in [Mode::Read, Mode::Write] {
        assert_eq!(rw_rules::renew_side(&both, b"x", side, 100, deadline, Reads::Set).reply, not);
        assert_eq!(rw_rules::renew_side(&free, b"o", side, 100, deadline, Reads::Set).reply, not);
    }
}

/// The live read holds' deadlines of `owner` in `redis` at `now`.
fn own_holds(redis: &Redis, owner: &[u8], now: i64) -> BTreeMap<u64, i64> {
    redis
        .holds
        .iter()
        .filter(|((o, _), &at)| o == owner && at > now)
        .map(|((_, index), &at)| (*index, at))
        .collect()
}

#[test]
fn with_gt_no_read_hold_of_the_owner_ends_before_the_latest_it_had_or_the_new_lease() {
    let mut rng = Rng(0x6774_7277);
    for seed in 0..200 {
        let mut redis = Redis::default();
        let mut now = 0_i64;
        for step in 0..40 {
            now += rng.below(300) as i64;
            let ms = 1 + rng.below(1_000) as u64;
            let deadline =
                Deadline::after(now, Lease::from_millis(ms).expect("positive")).expect("fits");
            // Another reader now and then, to keep the lock alive beside the owner's holds.
            let owner: &[u8] = if rng.below(5) == 0 { b"other" } else { b"o" };
            let before = own_holds(&redis, owner, now);
            let latest = before.values().copied().max();
            let state = redis.state_of(owner, now);
            let own = redis.holds(&state).remove(owner).unwrap_or_default();
            let own: BTreeMap<u64, i64> = own.into_iter().filter(|&(_, at)| at > now).collect();
            let renewing = rng.below(3) == 0;
            let plan = if renewing {
                let side = [None, Some(Mode::Read)][rng.below(2)];
                match side {
                    None => rw_rules::renew(&state, owner, now, deadline, Reads::Gt(&own)),
                    Some(side) => {
                        rw_rules::renew_side(&state, owner, side, now, deadline, Reads::Gt(&own))
                    }
                }
            } else if rng.below(4) == 0 && state.reads_of(owner) > 0 {
                let whole = redis.state(now);
                let all = redis.holds(&whole);
                rw_rules::release(&whole, Mode::Read, owner, &all, now)
            } else {
                match rw_rules::acquire(
                    &state,
                    Mode::Read,
                    owner,
                    now,
                    deadline,
                    false,
                    Reads::Gt(&own),
                ) {
                    Ok(Acquired::Granted(plan)) => plan,
                    other => panic!("seed {seed} step {step}: a read is granted: {other:?}"),
                }
            };
            let released = plan.effects.iter().any(|e| matches!(e, Effect::DropHold { .. }));
            redis.apply(&plan);
            let after = own_holds(&redis, owner, now);
            if released || after.is_empty() {
                // A release leaves holds that each end no sooner than any did before.
                if let (Some(first), Some(latest)) = (after.values().min(), latest) {
                    assert!(*first >= latest, "seed {seed} step {step}: {after:?} < {latest}");
                }
                continue;
            }
            // Every hold of the owner ends together, at the later of its latest and the new lease.
            let until = latest.map_or(deadline.unix_ms(), |l| l.max(deadline.unix_ms()));
            assert!(
                after.values().all(|&at| at == until),
                "seed {seed} step {step}: {before:?} then lease to {} gave {after:?}",
                deadline.unix_ms()
            );
            assert!(redis.deadline.is_some_and(|d| d >= until), "seed {seed} step {step}: hash");
        }
    }
}

#[test]
fn without_gt_a_read_re_entry_adds_its_hold_with_the_new_lease_only() {
    let lease =
        |now, ms| Deadline::after(now, Lease::from_millis(ms).expect("positive")).expect("fits");
    let mut redis = Redis::default();
    let state = redis.state_of(b"o", 0);
    let Ok(Acquired::Granted(plan)) =
        rw_rules::acquire(&state, Mode::Read, b"o", 0, lease(0, 1_000), false, Reads::Set)
    else {
        panic!("free: granted");
    };
    redis.apply(&plan);
    let state = redis.state_of(b"o", 10);
    let Ok(Acquired::Granted(plan)) =
        rw_rules::acquire(&state, Mode::Read, b"o", 10, lease(10, 100), false, Reads::Set)
    else {
        panic!("re-entry");
    };
    redis.apply(&plan);
    assert_eq!(own_holds(&redis, b"o", 10), BTreeMap::from([(1, 1_000), (2, 110)]));
    // The same re-entry with GT: both holds end at the later lease.
    let own = own_holds(&redis, b"o", 10);
    let state = redis.state_of(b"o", 10);
    let Ok(Acquired::Granted(plan)) =
        rw_rules::acquire(&state, Mode::Read, b"o", 10, lease(10, 100), false, Reads::Gt(&own))
    else {
        panic!("re-entry");
    };
    redis.apply(&plan);
    let all_at = BTreeMap::from([(1, 1_000), (2, 1_000), (3, 1_000)]);
    assert_eq!(own_holds(&redis, b"o", 10), all_at);
}
