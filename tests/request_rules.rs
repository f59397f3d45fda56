//! Exact cancellation's plain-Rust part, without a server: the request record's encoding (every
//! kind round-trips, binary-safe; anything else is refused without trusting its lengths) and
//! the decisions made from a record (a retry, a cancel).

use rlock::args::{Cancel, Mode, RwAcquire, SemAcquire};
use rlock::error::LockError;
use rlock::request_rules::{
    self, cancel, cancelled_until, check_retry, release_counted, replay, Asked, CountedRelease,
    Granted, Record, CANCELLED_MS,
};
use rlock::rules::Reply;

fn records() -> Vec<Record> {
    vec![
        Record::Cancelled,
        Record::Released,
        Record::Granted(Granted::Lock { owner: b"o".to_vec(), token: None }),
        Record::Granted(Granted::Lock { owner: b"a:1\0\xff\r\n5:x".to_vec(), token: Some(0) }),
        Record::Granted(Granted::Lock { owner: b"o".to_vec(), token: Some(i64::MAX as u64) }),
        Record::Granted(Granted::Rw { mode: Mode::Read, owner: b"r".to_vec(), token: None }),
        Record::Granted(Granted::Rw { mode: Mode::Write, owner: b"w".to_vec(), token: Some(7) }),
        Record::Granted(Granted::Permits(1)),
        Record::Granted(Granted::Permits(i64::MAX as u64)),
        Record::Granted(Granted::Leased(vec![vec![0; 16], b"1:x\x00".to_vec()])),
        Record::Granted(Granted::Leased(vec![vec![0xff; 16]; 10_000])),
    ]
}

#[test]
fn every_record_round_trips_binary_safe() {
    for record in records() {
        let stored = record.encode();
        assert_eq!(Record::decode(&stored), Ok(record.clone()), "{stored:?}");
    }
}

#[test]
fn anything_else_is_a_corrupt_record_whatever_its_lengths_claim() {
    let corrupt = Err(LockError::CorruptRequest);
    let good = Record::Granted(Granted::Lock { owner: b"o".to_vec(), token: None }).encode();
    let mut cases: Vec<Vec<u8>> = vec![
        b"".to_vec(),
        b"1".to_vec(),
        b"rlock-request:1:".to_vec(),
        b"rlock-request:1:Cx".to_vec(),
        b"rlock-request:1:X".to_vec(),
        b"rlock-request:1:G".to_vec(),
        b"rlock-request:1:GL".to_vec(),
        b"rlock-request:1:GL1:o".to_vec(),
        b"rlock-request:1:GL1:o0:1:x".to_vec(),
        b"rlock-request:1:GL0:0:".to_vec(),
        b"rlock-request:1:GL1:o2:x1".to_vec(),
        b"rlock-request:1:GL1:o1:-".to_vec(),
        b"rlock-request:1:GL99999999999999999999:o0:".to_vec(),
        b"rlock-request:1:GL18446744073709551615:o0:".to_vec(),
        b"rlock-request:1:GL01:o0:".to_vec(),
        b"rlock-request:1:GP1:0".to_vec(),
        b"rlock-request:1:GP2:-1".to_vec(),
        b"rlock-request:1:GP19:9223372036854775808".to_vec(),
        b"rlock-request:1:GS".to_vec(),
        b"rlock-request:1:GS0:".to_vec(),
        b"rlock-request:1:GQ1:o0:".to_vec(),
        b"rlock-request:2:C".to_vec(),
        b"redisson".to_vec(),
    ];
    cases.push([&good[..], b"1:x"].concat());
    cases.push(good[..good.len() - 1].to_vec());
    // Past the most ids a leased record may hold.
    let many = Record::Granted(Granted::Leased(vec![vec![1; 16]; 10_001])).encode();
    cases.push(many);
    for stored in cases {
        assert_eq!(Record::decode(&stored), corrupt, "{:?}", String::from_utf8_lossy(&stored));
    }
}

#[test]
fn a_retry_replays_a_grant_still_in_place_and_is_refused_when_cancelled_or_foreign() {
    let lock = Record::Granted(Granted::Lock { owner: b"o".to_vec(), token: Some(9) });
    let asked = Asked::Lock { owner: b"o", token: true };
    let Ok(Some(granted)) = check_retry(Some(&lock), &asked) else { panic!("a retry") };
    assert_eq!(replay(granted, true), Some(Ok(Reply::Token(9))), "the first reply");
    assert_eq!(replay(granted, false), None, "gone: a new acquire");
    assert_eq!(check_retry(None, &asked), Ok(None), "never seen: a new acquire");
    assert_eq!(check_retry(Some(&Record::Cancelled), &asked), Err(LockError::RequestCancelled));
    for other in [
        Asked::Lock { owner: b"x", token: true },
        Asked::Lock { owner: b"o", token: false },
        Asked::Rw { mode: Mode::Write, owner: b"o", token: true },
        Asked::Permits(1),
    ] {
        assert_eq!(check_retry(Some(&lock), &other), Err(LockError::RequestMismatch), "{other:?}");
    }
    let read = Record::Granted(Granted::Rw { mode: Mode::Read, owner: b"o".to_vec(), token: None });
    let write = Asked::Rw { mode: Mode::Write, owner: b"o", token: false };
    assert_eq!(check_retry(Some(&read), &write), Err(LockError::RequestMismatch), "another side");
    let asked_read = Asked::Rw { mode: Mode::Read, owner: b"o", token: false };
    let Ok(Some(granted)) = check_retry(Some(&read), &asked_read) else { panic!("a retry") };
    assert_eq!(replay(granted, true), Some(Ok(Reply::Nil)));
    let permits = Record::Granted(Granted::Permits(3));
    assert_eq!(check_retry(Some(&permits), &Asked::Permits(2)), Err(LockError::RequestMismatch));
    let Ok(Some(granted)) = check_retry(Some(&permits), &Asked::Permits(3)) else { panic!() };
    assert_eq!(replay(granted, true), Some(Ok(Reply::Int(1))));
    let ids = vec![b"a".to_vec(), b"b".to_vec()];
    let leased = Record::Granted(Granted::Leased(ids.clone()));
    assert_eq!(check_retry(Some(&leased), &Asked::Permits(2)), Err(LockError::RequestMismatch));
    let Ok(Some(granted)) = check_retry(Some(&leased), &Asked::Leased(2)) else { panic!() };
    assert_eq!(replay(granted, true), Some(Err(ids)), "the same ids");
}

#[test]
fn counted_permits_released_as_their_request_are_given_back_once_only_where_granted() {
    let granted = Record::Granted(Granted::Permits(2));
    assert_eq!(release_counted(Some(&granted), 2, false), Ok(CountedRelease::GiveBack));
    // A counted grant's record has no end: with none, this server never granted the request
    // (a master that failed over before replicating the grant), and nothing comes back.
    assert_eq!(release_counted(None, 2, false), Ok(CountedRelease::Nothing), "never granted here");
    assert_eq!(release_counted(Some(&Record::Released), 2, false), Ok(CountedRelease::Nothing));
    assert_eq!(release_counted(Some(&Record::Cancelled), 2, false), Ok(CountedRelease::Nothing));
    assert_eq!(release_counted(Some(&granted), 1, false), Err(LockError::RequestMismatch));
    let lock = Record::Granted(Granted::Lock { owner: b"o".to_vec(), token: None });
    assert_eq!(release_counted(Some(&lock), 1, false), Err(LockError::RequestMismatch));
    // An ownerless release (`ONCE id`): given back on its first send, then never again.
    assert_eq!(release_counted(None, 2, true), Ok(CountedRelease::GiveBack));
    assert_eq!(release_counted(Some(&Record::Released), 2, true), Ok(CountedRelease::Nothing));
    assert_eq!(release_counted(Some(&granted), 2, true), Ok(CountedRelease::GiveBack));
    assert_eq!(release_counted(Some(&granted), 1, true), Err(LockError::RequestMismatch));
    // Released: a cancel finds nothing to undo, a retry of the acquire is a new acquire.
    assert_eq!(cancel(Some(&Record::Released), false), request_rules::Cancel::Nothing);
    assert_eq!(check_retry(Some(&Record::Released), &Asked::Permits(2)), Ok(None));
}

#[test]
fn a_cancel_dequeues_a_waiter_gives_a_grant_back_or_does_nothing() {
    let granted = Record::Granted(Granted::Permits(2));
    assert_eq!(cancel(None, true), request_rules::Cancel::Dequeue);
    assert_eq!(cancel(Some(&granted), true), request_rules::Cancel::Dequeue);
    assert_eq!(
        cancel(Some(&granted), false),
        request_rules::Cancel::GiveBack(&Granted::Permits(2))
    );
    assert_eq!(cancel(Some(&Record::Cancelled), false), request_rules::Cancel::Nothing);
    assert_eq!(cancel(None, false), request_rules::Cancel::Nothing);
    // Cancelled for at least CANCELLED_MS, longer when the grant's record lasted longer.
    assert_eq!(cancelled_until(1_000, None), 1_000 + CANCELLED_MS);
    assert_eq!(cancelled_until(1_000, Some(5)), 1_000 + CANCELLED_MS);
    assert_eq!(cancelled_until(1_000, Some(10_000_000)), 10_000_000);
    assert_eq!(cancelled_until(i64::MAX - 5, None), i64::MAX);
}

#[test]
fn an_error_reply_names_the_request_without_breaking_the_protocol() {
    assert_eq!(LockError::RequestCancelled.naming(b"r-1"), "ERR request r-1 was cancelled");
    assert_eq!(LockError::RequestWaiting.naming(b"r-1"), "ERR request r-1 is already waiting");
    let shown = LockError::RequestCancelled.naming(b"a b\r\n\0\xff\\");
    assert_eq!(shown, "ERR request a\\x20b\\x0d\\x0a\\x00\\xff\\x5c was cancelled");
    let long = LockError::RequestCancelled.naming(&[b'x'; 1000]);
    assert!(long.len() < 200 && long.contains("..."), "{long}");
    assert_eq!(LockError::InvalidRequest.naming(b"x"), LockError::InvalidRequest.message());
}

fn argv(args: &[&str]) -> Vec<Vec<u8>> {
    args.iter().map(|a| a.as_bytes().to_vec()).collect()
}

#[test]
fn every_acquire_takes_request_in_any_order_and_cancel_takes_a_key_and_an_id() {
    let rw =
        argv(&["RWLOCK.ACQUIRE", "k", "o", "WRITE", "1", "REQUEST", "r", "TOKEN", "WAIT", "0"]);
    let parsed = RwAcquire::parse(&rw).expect("valid");
    assert_eq!((parsed.request.map(Vec::as_slice), parsed.token), (Some(&b"r"[..]), true));
    let sem = argv(&["RSEM.ACQUIRE", "s", "2", "REQUEST", "r", "LEASE", "5"]);
    let parsed = SemAcquire::parse(&sem).expect("valid");
    assert_eq!(parsed.request.map(Vec::as_slice), Some(&b"r"[..]));
    for (bad, expected) in [
        (&["RSEM.ACQUIRE", "s", "1", "REQUEST"][..], LockError::MissingRequest),
        (&["RSEM.ACQUIRE", "s", "1", "REQUEST", ""], LockError::InvalidRequest),
        (&["RWLOCK.ACQUIRE", "k", "o", "READ", "1", "REQUEST", ""], LockError::InvalidRequest),
    ] {
        let args = argv(bad);
        let err = if bad[0] == "RSEM.ACQUIRE" {
            SemAcquire::parse(&args).err()
        } else {
            RwAcquire::parse(&args).err()
        };
        assert_eq!(err, Some(expected), "{bad:?}");
    }
    let twice = argv(&["RSEM.ACQUIRE", "s", "1", "REQUEST", "a", "REQUEST", "b"]);
    assert_eq!(SemAcquire::parse(&twice).err(), Some(LockError::Syntax));
    // The request record holds the owner: a bounded one.
    let long = "o".repeat(rlock::args::MAX_REQUEST_OWNER + 1);
    let args = argv(&["RWLOCK.ACQUIRE", "k", &long, "READ", "1", "REQUEST", "r"]);
    assert_eq!(RwAcquire::parse(&args).err(), Some(LockError::RequestOwnerTooLong));
    let args = argv(&["RWLOCK.ACQUIRE", "k", &long, "READ", "1"]);
    assert!(RwAcquire::parse(&args).is_ok(), "without REQUEST, no record: any owner");
    let cancel = argv(&["RLOCK.CANCEL", "k", "r"]);
    assert_eq!(Cancel::parse(&cancel).map(|c| c.request.clone()), Ok(b"r".to_vec()));
    assert_eq!(Cancel::parse(&argv(&["RLOCK.CANCEL", "k", ""])).err(), Some(LockError::EmptyId));
    for arity in [&["RLOCK.CANCEL", "k"][..], &["RLOCK.CANCEL", "k", "r", "x"]] {
        assert_eq!(Cancel::parse(&argv(arity)).err(), Some(LockError::WrongArity), "{arity:?}");
    }
}

#[test]
fn a_stored_record_names_its_lock_and_another_lock_s_is_a_mismatch() {
    for record in records() {
        for lock in [&b"a"[..], b"{a}", b"{a}:b", b"x\x00}:{", b""] {
            let stored = record.stored_for(lock);
            assert_eq!(Record::load_for(&stored, lock), Ok(record.clone()), "{stored:?}");
            // The same record key, another lock (Redisson's prefix rule is not one-to-one).
            for other in [&b"a}"[..], b"{a}:", b"A"] {
                assert_eq!(Record::load_for(&stored, other), Err(LockError::RequestMismatch));
            }
            // The body alone (no lock) is corrupt, as is a lock field that claims too much.
            assert_eq!(Record::load_for(&record.encode(), lock), Err(LockError::CorruptRequest));
        }
    }
    for bad in [&b"rlock-request:1:9:aC"[..], b"rlock-request:1:1:aX", b"rlock-request:1:1:a"] {
        assert_eq!(Record::load_for(bad, b"a"), Err(LockError::CorruptRequest), "{bad:?}");
    }
}
