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
