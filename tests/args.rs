//! Argument parsing, without a server.

use rlock::args::{
    Acquire, KeyOnly, Lease, Release, Renew, SemAcquire, SemAdd, SemRelease, WaitFor,
};
use rlock::error::{IntArg, IntProblem, LockError};

const fn bad(arg: IntArg, problem: IntProblem) -> LockError {
    LockError::BadInteger(arg, problem)
}

const fn bad_lease(problem: IntProblem) -> LockError {
    bad(IntArg::LeaseMs, problem)
}

fn argv(args: &[&str]) -> Vec<Vec<u8>> {
    args.iter().map(|a| a.as_bytes().to_vec()).collect()
}

#[test]
fn acquire_reads_key_owner_and_lease() {
    let args = argv(&["RLOCK.ACQUIRE", "k", "o", "1500"]);
    let parsed = Acquire::parse(&args).expect("valid");
    assert_eq!(parsed.key.as_slice(), b"k");
    assert_eq!(parsed.owner.as_slice(), b"o");
    assert_eq!(parsed.lease.as_millis(), 1500);
}

#[test]
fn binary_keys_and_owners_pass_through_untouched() {
    let args: Vec<Vec<u8>> =
        vec![b"RLOCK.ACQUIRE".to_vec(), b"k\0\xff".to_vec(), b"\0".to_vec(), b"1".to_vec()];
    let parsed = Acquire::parse(&args).expect("valid");
    assert_eq!(parsed.key.as_slice(), b"k\0\xff");
    assert_eq!(parsed.owner.as_slice(), b"\0");
}

#[test]
fn leases_must_be_positive_integers_that_fit_an_i64() {
    for ok in ["1", "30000", "9223372036854775807"] {
        assert!(Lease::parse(ok.as_bytes()).is_ok(), "{ok}");
    }
    for bad in ["", "0", "-1", "+1", " 1", "1 ", "01", "1.0", "1e3", "abc", "\u{0}1"] {
        let expected = match bad {
            "0" | "-1" => bad_lease(IntProblem::TooSmall),
            _ => bad_lease(IntProblem::NotInteger),
        };
        assert_eq!(Lease::parse(bad.as_bytes()), Err(expected), "{bad:?}");
    }
    for big in ["9223372036854775808", "99999999999999999999"] {
        assert_eq!(Lease::parse(big.as_bytes()), Err(bad_lease(IntProblem::OutOfRange)), "{big}");
    }
}

#[test]
fn arity_syntax_and_owner_errors() {
    let cases: &[(&[&str], LockError)] = &[
        (&["RLOCK.ACQUIRE", "k", "o"], LockError::WrongArity),
        (&["RLOCK.ACQUIRE", "k", "o", "1", "WAIT"], bad(IntArg::TimeoutMs, IntProblem::Missing)),
        (
            &["RLOCK.ACQUIRE", "k", "o", "1", "WAIT", "-1"],
            bad(IntArg::TimeoutMs, IntProblem::TooSmall),
        ),
        (
            &["RLOCK.ACQUIRE", "k", "o", "1", "WAIT", "1.5"],
            bad(IntArg::TimeoutMs, IntProblem::NotInteger),
        ),
        (
            &["RLOCK.ACQUIRE", "k", "o", "1", "WAIT", "x"],
            bad(IntArg::TimeoutMs, IntProblem::NotInteger),
        ),
        (&["RLOCK.ACQUIRE", "k", "o", "1", "WAIT", "5", "WAIT", "5"], LockError::Syntax),
        (&["RLOCK.ACQUIRE", "k", "o", "1", "NOWAIT"], LockError::Syntax),
        (&["RLOCK.ACQUIRE", "k", "", "1"], LockError::EmptyOwner),
        (&["RLOCK.ACQUIRE", "k", "o", "0"], bad_lease(IntProblem::TooSmall)),
    ];
    for (args, expected) in cases {
        assert_eq!(Acquire::parse(&argv(args)).err(), Some(*expected), "{args:?}");
    }
    assert_eq!(Release::parse(&argv(&["RLOCK.RELEASE", "k"])).err(), Some(LockError::WrongArity));
    assert_eq!(
        Release::parse(&argv(&["RLOCK.RELEASE", "k", "o", "5", "x"])).err(),
        Some(LockError::Syntax)
    );
    assert_eq!(
        Release::parse(&argv(&["RLOCK.RELEASE", "k", "o", "x"])).err(),
        Some(bad_lease(IntProblem::NotInteger))
    );
    assert_eq!(
        Renew::parse(&argv(&["RLOCK.RENEW", "k", "", "5"])).err(),
        Some(LockError::EmptyOwner)
    );
    assert_eq!(KeyOnly::parse(&argv(&["RLOCK.PTTL"])).err(), Some(LockError::WrongArity));
    assert_eq!(KeyOnly::parse(&argv(&["RLOCK.PTTL", "a", "b"])).err(), Some(LockError::WrongArity));
}

#[test]
fn release_lease_is_optional() {
    let without = argv(&["RLOCK.RELEASE", "k", "o"]);
    assert_eq!(Release::parse(&without).expect("valid").lease, None);
    let with = argv(&["RLOCK.RELEASE", "k", "o", "250"]);
    assert_eq!(Release::parse(&with).expect("valid").lease, Lease::from_millis(250));
}

#[test]
fn error_replies_start_with_a_code_and_name_the_argument() {
    assert!(bad_lease(IntProblem::TooSmall).message().starts_with("ERR lease-ms"));
    assert!(LockError::LeaseTooLarge.message().starts_with("ERR lease-ms"));
    assert!(LockError::EmptyOwner.message().starts_with("ERR owner"));
    assert_eq!(LockError::Syntax.message(), "ERR syntax error");
    assert!(LockError::WrongType.message().starts_with("WRONGTYPE "));
}

#[test]
fn wait_takes_a_timeout_in_ms_zero_meaning_forever_in_any_case() {
    let parsed = |args: &[&str]| Acquire::parse(&argv(args)).map(|a| a.wait);
    assert_eq!(parsed(&["RLOCK.ACQUIRE", "k", "o", "1"]), Ok(None));
    assert_eq!(parsed(&["RLOCK.ACQUIRE", "k", "o", "1", "WAIT", "0"]), Ok(Some(WaitFor::Ever)));
    assert_eq!(
        parsed(&["RLOCK.ACQUIRE", "k", "o", "1", "wait", "250"]),
        Ok(Some(WaitFor::Millis(250)))
    );
    assert_eq!(
        parsed(&["RLOCK.ACQUIRE", "k", "o", "1", "WaIt", "9223372036854775807"]),
        Ok(Some(WaitFor::Millis(i64::MAX as u64)))
    );
    assert!(bad(IntArg::TimeoutMs, IntProblem::NotInteger).message().starts_with("ERR timeout-ms"));
}

#[test]
fn token_is_a_flag_in_any_order_with_wait_and_only_once() {
    let parsed = |args: &[&str]| Acquire::parse(&argv(args)).map(|a| (a.wait, a.token));
    assert_eq!(parsed(&["RLOCK.ACQUIRE", "k", "o", "1"]), Ok((None, false)));
    assert_eq!(parsed(&["RLOCK.ACQUIRE", "k", "o", "1", "token"]), Ok((None, true)));
    assert_eq!(
        parsed(&["RLOCK.ACQUIRE", "k", "o", "1", "TOKEN", "WAIT", "5"]),
        Ok((Some(WaitFor::Millis(5)), true))
    );
    assert_eq!(
        parsed(&["RLOCK.ACQUIRE", "k", "o", "1", "WAIT", "0", "Token"]),
        Ok((Some(WaitFor::Ever), true))
    );
    assert_eq!(parsed(&["RLOCK.ACQUIRE", "k", "o", "1", "TOKEN", "TOKEN"]), Err(LockError::Syntax));
    assert_eq!(parsed(&["RLOCK.ACQUIRE", "k", "o", "1", "TOKEN", "x"]), Err(LockError::Syntax));
}

/// A leased acquire takes at most `MAX_LEASED` permits, and a release by id names at most as
/// many ids: every size is refused by the parser, before anything is read or written (a waiter
/// too: it would never be granted).
#[test]
fn leased_acquires_and_releases_by_id_have_a_per_call_limit() {
    let max = rlock::args::sem::MAX_LEASED;
    assert_eq!(max, 10_000);
    let ok = argv(&["RSEM.ACQUIRE", "s", "10000", "LEASE", "1000", "WAIT", "0"]);
    assert_eq!(SemAcquire::parse(&ok).map(|c| c.permits), Ok(10_000));
    for n in ["10001", "4294967296", "9223372036854775807"] {
        for tail in [&["LEASE", "1000"][..], &["WAIT", "0", "LEASE", "1"]] {
            let mut args = vec!["RSEM.ACQUIRE", "s", n];
            args.extend_from_slice(tail);
            assert_eq!(
                SemAcquire::parse(&argv(&args)).map(|c| c.permits),
                Err(LockError::TooManyLeased),
                "{args:?}"
            );
        }
        // Unleased permits are a number only: any count.
        let plain = argv(&["RSEM.ACQUIRE", "s", n]);
        assert!(SemAcquire::parse(&plain).is_ok());
    }
    let mut ids = vec!["RSEM.RELEASE", "s", "ID"];
    ids.extend(std::iter::repeat_n("id", max));
    assert!(
        matches!(SemRelease::parse(&argv(&ids)), Ok(SemRelease::Ids { ids, .. }) if ids.len() == max)
    );
    ids.push("one-more");
    assert!(matches!(SemRelease::parse(&argv(&ids)), Err(LockError::TooManyIds)));
    assert!(LockError::TooManyLeased.message().starts_with("ERR permits with LEASE"));
    assert!(LockError::TooManyIds.message().starts_with("ERR at most 10000 permit ids (after ID)"));
}

/// `ADDPERMITS` reads its delta as `INCRBY` reads an integer: the whole `i64` range, no more.
#[test]
fn addpermits_delta_is_any_i64_as_incrby_reads_it() {
    let delta = |d: &str| SemAdd::parse(&argv(&["RSEM.ADDPERMITS", "s", d])).map(|c| c.delta);
    assert_eq!(delta("-9223372036854775808"), Ok(i64::MIN));
    assert_eq!(delta("9223372036854775807"), Ok(i64::MAX));
    assert_eq!(delta("0"), Ok(0));
    for text in ["-0", "05", "+1", " 1", ""] {
        assert_eq!(delta(text), Err(bad(IntArg::Delta, IntProblem::NotInteger)), "{text:?}");
    }
    for text in ["9223372036854775808", "-9223372036854775809"] {
        assert_eq!(delta(text), Err(bad(IntArg::Delta, IntProblem::OutOfRange)), "{text:?}");
    }
}

#[test]
fn rwlock_renew_takes_an_optional_side() {
    use rlock::args::{Mode, RwRenew};
    let parsed = |args: &[&str]| RwRenew::parse(&argv(args)).map(|c| (c.lease.as_millis(), c.mode));
    assert_eq!(parsed(&["RWLOCK.RENEW", "k", "o", "5"]), Ok((5, None)));
    assert_eq!(parsed(&["RWLOCK.RENEW", "k", "o", "5", "read"]), Ok((5, Some(Mode::Read))));
    assert_eq!(parsed(&["RWLOCK.RENEW", "k", "o", "5", "WRITE"]), Ok((5, Some(Mode::Write))));
    assert_eq!(parsed(&["RWLOCK.RENEW", "k", "o", "5", "BOTH"]), Err(LockError::InvalidMode));
    assert_eq!(parsed(&["RWLOCK.RENEW", "k", "o", "5", "READ", "x"]), Err(LockError::Syntax));
    assert_eq!(parsed(&["RWLOCK.RENEW", "k", "o"]), Err(LockError::WrongArity));
    assert_eq!(parsed(&["RWLOCK.RENEW", "k", "", "5"]), Err(LockError::EmptyOwner));
    assert_eq!(
        parsed(&["RWLOCK.RENEW", "k", "o", "0", "READ"]),
        Err(bad_lease(IntProblem::TooSmall))
    );
}

#[test]
fn waiters_count_defaults_to_10_and_must_be_1_to_1000() {
    use rlock::args::Waiters;
    use rlock::error::LockError;
    let parse = |args: &[&str]| Waiters::parse(args).map(|w| w.count);
    assert_eq!(parse(&["RLOCK.WAITERS", "k"]), Ok(10));
    assert_eq!(parse(&["RLOCK.WAITERS", "k", "count", "1000"]), Ok(1000));
    assert_eq!(parse(&["RLOCK.WAITERS", "k", "COUNT", "1"]), Ok(1));
    for bad in ["0", "1001", "-1", "+5", "05", "x", ""] {
        assert_eq!(parse(&["RLOCK.WAITERS", "k", "COUNT", bad]), Err(LockError::InvalidCount));
    }
    assert_eq!(parse(&["RLOCK.WAITERS", "k", "COUNT"]), Err(LockError::InvalidCount));
    assert_eq!(parse(&["RLOCK.WAITERS", "k", "COUNT", "2", "x"]), Err(LockError::Syntax));
    assert_eq!(parse(&["RLOCK.WAITERS"]), Err(LockError::WrongArity));
}

#[test]
fn gt_is_an_option_of_the_lock_acquires_and_renewals_taken_once_in_any_order() {
    use rlock::args::{Mode, RwAcquire, RwRenew};
    let acquire = |args: &[&str]| Acquire::parse(&argv(args)).map(|c| (c.gt, c.wait, c.token));
    assert_eq!(acquire(&["RLOCK.ACQUIRE", "k", "o", "5"]), Ok((false, None, false)));
    assert_eq!(acquire(&["RLOCK.ACQUIRE", "k", "o", "5", "gt"]), Ok((true, None, false)));
    assert_eq!(
        acquire(&["RLOCK.ACQUIRE", "k", "o", "5", "GT", "WAIT", "7", "TOKEN"]),
        Ok((true, Some(WaitFor::Millis(7)), true))
    );
    assert_eq!(
        acquire(&["RLOCK.ACQUIRE", "k", "o", "5", "TOKEN", "SESSION", "GT"]),
        Ok((true, None, true))
    );
    assert_eq!(acquire(&["RLOCK.ACQUIRE", "k", "o", "5", "GT", "GT"]), Err(LockError::Syntax));
    let rw = |args: &[&str]| RwAcquire::parse(&argv(args)).map(|c| (c.mode, c.gt));
    assert_eq!(rw(&["RWLOCK.ACQUIRE", "k", "o", "READ", "5", "GT"]), Ok((Mode::Read, true)));
    assert_eq!(
        rw(&["RWLOCK.ACQUIRE", "k", "o", "WRITE", "5", "GT", "REQUEST", "r"]),
        Ok((Mode::Write, true))
    );
    assert_eq!(rw(&["RWLOCK.ACQUIRE", "k", "o", "READ", "5", "GT", "gt"]), Err(LockError::Syntax));
    let renew = |args: &[&str]| Renew::parse(&argv(args)).map(|c| (c.lease.as_millis(), c.gt));
    assert_eq!(renew(&["RLOCK.RENEW", "k", "o", "5"]), Ok((5, false)));
    assert_eq!(renew(&["RLOCK.RENEW", "k", "o", "5", "Gt"]), Ok((5, true)));
    assert_eq!(renew(&["RLOCK.RENEW", "k", "o", "5", "GT", "GT"]), Err(LockError::Syntax));
    assert_eq!(renew(&["RLOCK.RENEW", "k", "o", "5", "LT"]), Err(LockError::Syntax));
    let rw_renew = |args: &[&str]| RwRenew::parse(&argv(args)).map(|c| (c.mode, c.gt));
    assert_eq!(rw_renew(&["RWLOCK.RENEW", "k", "o", "5", "GT"]), Ok((None, true)));
    assert_eq!(
        rw_renew(&["RWLOCK.RENEW", "k", "o", "5", "READ", "GT"]),
        Ok((Some(Mode::Read), true))
    );
    assert_eq!(
        rw_renew(&["RWLOCK.RENEW", "k", "o", "5", "gt", "write"]),
        Ok((Some(Mode::Write), true))
    );
    assert_eq!(rw_renew(&["RWLOCK.RENEW", "k", "o", "5", "GT", "GT"]), Err(LockError::Syntax));
    assert_eq!(
        rw_renew(&["RWLOCK.RENEW", "k", "o", "5", "GT", "BOTH"]),
        Err(LockError::InvalidMode)
    );
    assert_eq!(rw_renew(&["RWLOCK.RENEW", "k", "o", "5", "READ", "WRITE"]), Err(LockError::Syntax));
}

#[test]
fn a_semaphore_takes_no_gt() {
    let args = argv(&["RSEM.RENEW", "s", "id", "5", "GT"]);
    assert_eq!(rlock::args::sem::parse_renew(&args).map(|_| ()), Err(LockError::Syntax));
    let args = argv(&["RSEM.ACQUIRE", "s", "1", "LEASE", "5", "GT"]);
    assert_eq!(SemAcquire::parse(&args).map(|_| ()), Err(LockError::Syntax));
}

#[test]
fn a_counted_release_names_its_acquire_with_request_or_itself_with_once() {
    let parse = |words: &[&str]| match SemRelease::parse(&argv(words)) {
        Ok(SemRelease::Count { permits, request, once, .. }) => {
            Ok((permits, request.cloned(), once))
        }
        Ok(SemRelease::Ids { .. }) => panic!("{words:?}: not counted"),
        Err(e) => Err(e),
    };
    assert_eq!(parse(&["RSEM.RELEASE", "s", "2"]), Ok((2, None, false)));
    assert_eq!(
        parse(&["RSEM.RELEASE", "s", "2", "REQUEST", "r"]),
        Ok((2, Some(b"r".to_vec()), false))
    );
    assert_eq!(parse(&["RSEM.RELEASE", "s", "2", "once", "r"]), Ok((2, Some(b"r".to_vec()), true)));
    assert_eq!(parse(&["RSEM.RELEASE", "s", "2", "ONCE"]), Err(LockError::MissingOnce));
    assert_eq!(parse(&["RSEM.RELEASE", "s", "2", "ONCE", ""]), Err(LockError::InvalidOnce));
    assert_eq!(parse(&["RSEM.RELEASE", "s", "2", "REQUEST"]), Err(LockError::MissingRequest));
    assert_eq!(parse(&["RSEM.RELEASE", "s", "2", "REQUEST", ""]), Err(LockError::InvalidRequest));
    assert_eq!(parse(&["RSEM.RELEASE", "s", "2", "OWNERLESS"]), Err(LockError::Syntax));
    assert_eq!(parse(&["RSEM.RELEASE", "s", "2", "OWNERLESS", "r"]), Err(LockError::Syntax));
    assert_eq!(parse(&["RSEM.RELEASE", "s", "2", "ONCE", "r", "x"]), Err(LockError::Syntax));
    assert!(parse(&["RSEM.RELEASE", "s", "0", "ONCE", "r"]).is_err());
}

#[test]
fn ownerless_comes_with_a_request_id() {
    let parse = |words: &[&str]| SemAcquire::parse(&argv(words)).map(|c| c.ownerless);
    assert_eq!(parse(&["RSEM.ACQUIRE", "s", "1", "REQUEST", "r", "OWNERLESS"]), Ok(true));
    assert_eq!(
        parse(&["RSEM.ACQUIRE", "s", "1", "ownerless", "WAIT", "5", "REQUEST", "r"]),
        Ok(true)
    );
    assert_eq!(parse(&["RSEM.ACQUIRE", "s", "1", "REQUEST", "r"]), Ok(false));
    // With LEASE it changes nothing (a leased grant's record ends with its lease).
    assert_eq!(
        parse(&["RSEM.ACQUIRE", "s", "1", "LEASE", "9", "REQUEST", "r", "OWNERLESS"]),
        Ok(true)
    );
    assert_eq!(
        parse(&["RSEM.ACQUIRE", "s", "1", "OWNERLESS"]),
        Err(LockError::OwnerlessNeedsRequest)
    );
    let twice = ["RSEM.ACQUIRE", "s", "1", "REQUEST", "r", "OWNERLESS", "OWNERLESS"];
    assert!(parse(&twice).is_err());
    assert!(LockError::OwnerlessNeedsRequest
        .message()
        .starts_with("ERR OWNERLESS needs REQUEST id"));
}
