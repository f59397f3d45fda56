//! The counting semaphore rules, without a server: random operations against a reference count
//! and FIFO queue, and the value parser.

use std::collections::VecDeque;

use rlock::error::LockError;
use rlock::rules::Reply;
use rlock::sem_rules::{self, SemPlan, SemState, SemWrite};
use rlock_tests_integration::Rng;

fn apply(state: &mut SemState, plan: SemPlan) {
    match plan.write {
        SemWrite::Keep => {}
        SemWrite::Set(v) => state.available = Some(v),
        SemWrite::Add(d) => state.available = Some(state.available() + d),
    }
}

#[test]
fn values_parse_as_redis_stores_integers() {
    assert_eq!(sem_rules::parse_available(b"0"), Ok(0));
    assert_eq!(sem_rules::parse_available(b"-12"), Ok(-12));
    assert_eq!(sem_rules::parse_available(b"9223372036854775807"), Ok(i64::MAX));
    for bad in [&b""[..], b"x", b"1.5", b" 1", b"+1", b"9223372036854775808"] {
        assert_eq!(sem_rules::parse_available(bad), Err(LockError::CorruptPermits), "{bad:?}");
    }
}

/// Exactly what Redis's `string2ll` (so `INCRBY`/`DECRBY`) accepts: a value the module reads,
/// the replicated `INCRBY` reads too, and the other way round.
#[test]
fn values_parse_exactly_as_incrby_parses_them() {
    assert_eq!(sem_rules::parse_available(b"-9223372036854775808"), Ok(i64::MIN));
    assert_eq!(sem_rules::parse_available(b"-1"), Ok(-1));
    assert_eq!(sem_rules::parse_available(b"10"), Ok(10));
    let refused: [&[u8]; 16] = [
        b"05",
        b"-0",
        b"007",
        b"00",
        b"-05",
        b"-",
        b"1 ",
        b"\t1",
        b"1\n",
        b"0x1",
        b"1e3",
        b"--1",
        b"-9223372036854775809",
        b"99999999999999999999",
        b"\x001",
        b"\xd9\xa1",
    ];
    for bad in refused {
        assert_eq!(sem_rules::parse_available(bad), Err(LockError::CorruptPermits), "{bad:?}");
    }
    // Every i64 reads back as itself from its decimal text.
    let mut rng = Rng(7);
    for _ in 0..10_000 {
        let n = rng.next_u64() as i64 >> rng.below(64);
        assert_eq!(sem_rules::parse_available(n.to_string().as_bytes()), Ok(n));
    }
}

/// Releasing leased permits by id checks the count before anything is removed: the number of
/// distinct ids (one id twice is one permit) must fit.
#[test]
fn a_release_by_id_is_checked_against_the_count_before_anything_is_removed() {
    let at_max = SemState { available: Some(i64::MAX) };
    assert_eq!(sem_rules::release_ids(at_max, &[b"a"]), Err(LockError::PermitsOverflow));
    let near = SemState { available: Some(i64::MAX - 1) };
    let plan = sem_rules::release_ids(near, &[b"a", b"a"]).expect("one permit");
    assert_eq!(plan.write, SemWrite::Add(1));
    assert_eq!(sem_rules::release_ids(near, &[b"a", b"b"]), Err(LockError::PermitsOverflow));
}

/// The permits the waiters ask for, summed (saturating), reported as at most the largest count.
#[test]
fn waiting_permits_saturate() {
    assert_eq!(sem_rules::waiting_permits(2 * (i64::MAX as u64)), i64::MAX);
    assert_eq!(sem_rules::waiting_permits(u64::MAX), i64::MAX);
    assert_eq!(sem_rules::waiting_permits(5), 5);
    assert_eq!(sem_rules::waiting_permits(0), 0);
}

/// Waiters served by the hand-off rule (`grant_waiter` at the head, in order) never overtake
/// each other, a newcomer never takes permits while anyone waits, and the count is conserved.
#[test]
fn random_operations_conserve_permits_and_serve_waiters_in_order() {
    for seed in 1..=50_u64 {
        let mut rng = Rng(seed.wrapping_mul(0x2545_F491_4F6C_DD1D));
        let mut state = SemState { available: None };
        let (mut queue, mut held): (VecDeque<(usize, u64)>, Vec<u64>) =
            (VecDeque::new(), Vec::new());
        let (mut total, mut next_id, mut served) = (0_i64, 0_usize, Vec::new());
        for step in 0..2_000 {
            match rng.below(4) {
                0 => {
                    let n = 1 + rng.below(4) as u64;
                    let plan = sem_rules::acquire(state, n, !queue.is_empty());
                    if plan.reply == Reply::Int(1) {
                        assert!(queue.is_empty(), "seed {seed} step {step}: barged");
                        held.push(n);
                    } else {
                        queue.push_back((next_id, n));
                        next_id += 1;
                    }
                    apply(&mut state, plan);
                }
                1 if !held.is_empty() => {
                    let n = held.swap_remove(rng.below(held.len()));
                    let plan = sem_rules::release(state, n).expect("no overflow");
                    assert_eq!(plan.reply, Reply::Int(state.available() + n as i64));
                    apply(&mut state, plan);
                }
                2 => {
                    let d = rng.below(3) as i64;
                    let plan = sem_rules::add_permits(state, d).expect("no overflow");
                    total += d;
                    apply(&mut state, plan);
                }
                _ => {}
            }
            // The hand-off: the head while it can be granted.
            while let Some(&(id, n)) = queue.front() {
                let Some(plan) = sem_rules::grant_waiter(state, n) else { break };
                apply(&mut state, plan);
                queue.pop_front();
                held.push(n);
                served.push(id);
            }
            let out: u64 = held.iter().sum();
            assert_eq!(state.available() + out as i64, total, "seed {seed} step {step}: conserved");
        }
        assert!(served.windows(2).all(|w| w[0] < w[1]), "seed {seed}: served in arrival order");
    }
}

#[test]
fn set_permits_only_creates_and_release_overflow_is_refused() {
    let missing = SemState { available: None };
    assert_eq!(sem_rules::set_permits(missing, 0).reply, Reply::Int(1));
    assert_eq!(sem_rules::set_permits(SemState { available: Some(0) }, 5).reply, Reply::Int(0));
    let full = SemState { available: Some(i64::MAX) };
    assert_eq!(sem_rules::release(full, 1), Err(LockError::PermitsOverflow));
    assert_eq!(sem_rules::add_permits(full, 1), Err(LockError::PermitsOverflow));
    assert_eq!(sem_rules::acquire(SemState { available: Some(3) }, 3, true).reply, Reply::Int(0));
}

#[test]
fn leased_permits_release_all_or_nothing() {
    let now = 1_000;
    assert!(sem_rules::releasable(&[Some(1_500), Some(sem_rules::NO_LEASE)], now));
    assert!(!sem_rules::releasable(&[Some(1_500), None], now), "an unknown id");
    assert!(!sem_rules::releasable(&[Some(1_000)], now), "a lease that ended");
    assert!(!sem_rules::releasable(&[], now), "no id");
}
