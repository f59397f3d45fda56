//! Property tests, without a server: a million random inputs to the argument parsers, and a
//! million random operations run through the lock rules and checked against a reference model
//! written separately (Redisson's semantics, stated as directly as possible).

mod common;

use common::Model;
use rlock::args::{Acquire, KeyOnly, Lease, Release, Renew, WaitFor};
use rlock::error::LockError;
use rlock::rules::{self, Deadline, Extend, Reply, View};
use rlock_tests_integration::Rng;

fn random_arg(rng: &mut Rng) -> Vec<u8> {
    const POOL: [&[u8]; 20] = [
        b"",
        b"k",
        b"o",
        b"0",
        b"1",
        b"-1",
        b"250",
        b"+5",
        b" 5",
        b"01",
        b"1.5",
        b"9223372036854775807",
        b"9223372036854775808",
        b"99999999999999999999",
        b"WAIT",
        b"wait",
        b"TOKEN",
        b"REQUEST",
        b"\0",
        b"\xff",
    ];
    if rng.below(4) == 0 {
        (0..rng.below(24)).map(|_| rng.next_u64() as u8).collect()
    } else {
        POOL[rng.below(POOL.len())].to_vec()
    }
}

/// The grammar, restated independently of `args.rs`: a canonical positive integer that fits
/// an `i64` (no sign, no leading zero, no spaces).
fn positive(b: &[u8]) -> Option<u64> {
    let s = std::str::from_utf8(b).ok()?;
    let canonical = !s.is_empty() && !s.starts_with('0') && s.bytes().all(|c| c.is_ascii_digit());
    canonical.then(|| s.parse::<i64>().ok()).flatten().map(|n| n as u64)
}

fn is_word(arg: &[u8], word: &str) -> bool {
    arg.eq_ignore_ascii_case(word.as_bytes())
}

/// What a valid acquire reads: `(lease, wait, token, request)`; wait `Some(0)` is `WAIT 0`.
type AcquireSpec = (u64, Option<u64>, bool, Option<Vec<u8>>);

/// `RLOCK.ACQUIRE key owner lease-ms [WAIT timeout-ms] [TOKEN] [REQUEST id]` (options in any
/// order, each at most once; a request id is not empty).
fn acquire_spec(args: &[Vec<u8>]) -> Option<AcquireSpec> {
    if args.len() < 4 || args[2].is_empty() {
        return None;
    }
    let lease = positive(&args[3])?;
    let timeout = |t: &[u8]| if t == b"0" { Some(0) } else { positive(t) };
    let (mut wait, mut token, mut request) = (None, false, None);
    let mut rest = &args[4..];
    while let Some((word, tail)) = rest.split_first() {
        rest = tail;
        if is_word(word, "WAIT") && wait.is_none() {
            let (t, tail) = rest.split_first()?;
            wait = Some(timeout(t)?);
            rest = tail;
        } else if is_word(word, "TOKEN") && !token {
            token = true;
        } else if is_word(word, "REQUEST") && request.is_none() {
            let (id, tail) = rest.split_first()?;
            request = Some(id.clone()).filter(|id| !id.is_empty());
            request.as_ref()?;
            rest = tail;
        } else {
            return None;
        }
    }
    Some((lease, wait, token, request))
}

/// `RLOCK.RELEASE key owner [lease-ms] [REQUEST id]`: `(lease, request)` if valid.
fn release_spec(args: &[Vec<u8>]) -> Option<(Option<u64>, Option<Vec<u8>>)> {
    if args.len() < 3 || args[2].is_empty() {
        return None;
    }
    let request =
        |r: &[u8], id: &[u8]| (is_word(r, "REQUEST") && !id.is_empty()).then(|| id.to_vec());
    match &args[3..] {
        [] => Some((None, None)),
        [r, id] if is_word(r, "REQUEST") => Some((None, Some(request(r, id)?))),
        [l] => Some((Some(positive(l)?), None)),
        [l, r, id] => Some((Some(positive(l)?), Some(request(r, id)?))),
        _ => None,
    }
}

/// `RLOCK.RENEW key owner lease-ms`.
fn renew_spec(args: &[Vec<u8>]) -> Option<u64> {
    (args.len() == 4 && !args[2].is_empty()).then(|| positive(&args[3])).flatten()
}

#[test]
fn a_million_random_argument_vectors_are_accepted_exactly_when_the_grammar_allows() {
    let mut rng = Rng(0xA11CE);
    let (mut ok, mut refused) = (0u32, 0u32);
    for i in 0..1_000_000 {
        let mut args = vec![b"CMD".to_vec()];
        for _ in 0..rng.below(8) {
            args.push(random_arg(&mut rng));
        }
        let acquire = Acquire::parse(&args).map(|a| {
            assert_eq!(a.key, &args[1]);
            let wait = a.wait.map(|w| match w {
                WaitFor::Ever => 0,
                WaitFor::Millis(ms) => ms,
            });
            (a.lease.as_millis(), wait, a.token, a.request.map(|id| id.to_vec()))
        });
        assert_eq!(acquire.as_ref().ok().cloned(), acquire_spec(&args), "{i}: acquire {args:?}");
        let release = Release::parse(&args)
            .map(|r| (r.lease.map(Lease::as_millis), r.request.map(|id| id.to_vec())));
        assert_eq!(release.as_ref().ok().cloned(), release_spec(&args), "{i}: release {args:?}");
        let renew = Renew::parse(&args).map(|r| r.lease.as_millis());
        assert_eq!(renew.as_ref().ok().copied(), renew_spec(&args), "{i}: renew {args:?}");
        let key_only = KeyOnly::parse(&args).map(|k| k.key.clone());
        assert_eq!(key_only.is_ok(), args.len() == 2, "{i}: key-only {args:?}");
        let errors = [acquire.err(), release.err(), renew.err(), key_only.err()];
        for e in errors {
            match e {
                None => ok += 1,
                Some(e) => {
                    assert!(e.message().starts_with("ERR "), "{e:?}");
                    refused += 1;
                }
            }
        }
    }
    assert!(ok > 10_000 && refused > 10_000, "{ok} parsed, {refused} refused");
}

/// The reference: one lock as Redisson's scripts define it, with lazy expiry.
#[derive(Default)]
struct Reference {
    holder: Option<(String, u64)>,
    expires: Option<i64>,
    /// Tokens granted so far (the last one).
    token: u64,
}

impl Reference {
    fn expire(&mut self, now: i64) {
        if self.expires.is_some_and(|t| t <= now) {
            self.holder = None;
            self.expires = None;
        }
    }

    fn acquire(&mut self, owner: &str, now: i64, lease: i64) -> Reply {
        self.expire(now);
        match &mut self.holder {
            None => {
                self.holder = Some((owner.to_owned(), 1));
                self.expires = Some(now + lease);
                Reply::Nil
            }
            Some((o, n)) if o == owner => {
                *n += 1;
                self.expires = Some(now + lease);
                Reply::Nil
            }
            Some(_) => Reply::Int(self.expires.map_or(-1, |t| t - now)),
        }
    }

    fn release(&mut self, owner: &str, now: i64, lease: Option<i64>) -> Reply {
        self.expire(now);
        match &mut self.holder {
            Some((o, n)) if o == owner && *n > 1 => {
                *n -= 1;
                if let Some(l) = lease {
                    self.expires = Some(now + l);
                }
                Reply::Int(0)
            }
            Some((o, _)) if o == owner => {
                self.holder = None;
                self.expires = None;
                Reply::Int(1)
            }
            _ => Reply::Nil,
        }
    }

    fn renew(&mut self, owner: &str, now: i64, lease: i64) -> Reply {
        self.expire(now);
        match &self.holder {
            Some((o, _)) if o == owner => {
                self.expires = Some(now + lease);
                Reply::Int(1)
            }
            _ => Reply::Int(0),
        }
    }

    fn force(&mut self, now: i64) -> Reply {
        self.expire(now);
        Reply::Int(i64::from(self.holder.take().is_some()))
    }
}

fn deadline(now: i64, lease: i64) -> Deadline {
    Deadline::after(now, Lease::from_millis(lease as u64).expect("positive")).expect("fits")
}

#[test]
fn a_million_random_operations_agree_with_the_reference_model() {
    let mut rng = Rng(0xB0B);
    let owners = ["a", "b", "c"];
    let mut ops = 0u64;
    for _sequence in 0..10_000 {
        let (mut reference, mut stored) = (Reference::default(), Model::default());
        let mut stored_token = 0u64;
        let mut now: i64 = 1_000_000;
        let mut frees = 0;
        for _ in 0..100 {
            now += rng.below(40) as i64;
            let owner = owners[rng.below(3)];
            let lease = 1 + rng.below(100) as i64;
            let (want, got) = match rng.below(6) {
                0 | 1 => {
                    let view = stored.view(Some(owner), now);
                    let plan = rules::acquire(view, deadline(now, lease), Extend::Set)
                        .expect("no overflow");
                    let want = reference.acquire(owner, now, lease);
                    // With TOKEN, every grant takes the next token: strictly increasing.
                    if want == Reply::Nil && rng.below(2) == 0 {
                        reference.token += 1;
                        stored_token = rules::next_token(stored_token, 0).expect("grows");
                        assert_eq!(stored_token, reference.token, "operation {ops}: token");
                    }
                    (want, stored.apply(Some(owner), plan))
                }
                5 => {
                    // A lock planted with no expiry (HSET by hand): busy replies say -1.
                    reference.expire(now);
                    if stored.view(None, now) == View::Free {
                        reference.holder = Some((owner.to_owned(), 1));
                        reference.expires = None;
                        stored.owners.insert(owner.to_owned(), 1);
                        stored.deadline = None;
                    }
                    (Reply::Nil, Reply::Nil)
                }
                2 => {
                    let with_lease = rng.below(2) == 0;
                    let view = stored.view(Some(owner), now);
                    let plan = rules::release(view, with_lease.then(|| deadline(now, lease)));
                    let want = reference.release(owner, now, with_lease.then_some(lease));
                    frees += u64::from(want == Reply::Int(1));
                    (want, stored.apply(Some(owner), plan))
                }
                3 => {
                    let view = stored.view(Some(owner), now);
                    let plan = rules::renew(view, deadline(now, lease), Extend::Set);
                    (reference.renew(owner, now, lease), stored.apply(Some(owner), plan))
                }
                _ => {
                    let view = stored.view(None, now);
                    let want = reference.force(now);
                    frees += u64::from(want == Reply::Int(1));
                    (want, stored.apply(None, rules::force_release(view)))
                }
            };
            assert_eq!(got, want, "operation {ops}");
            let pttl = rules::pttl(stored.view(None, now));
            reference.expire(now);
            let want_pttl = match (&reference.holder, reference.expires) {
                (None, _) => -2,
                (Some(_), Some(t)) => t - now,
                (Some(_), None) => -1,
            };
            assert_eq!(pttl, want_pttl, "operation {ops}: pttl");
            ops += 1;
        }
        assert_eq!(stored.published as u64, frees, "one unlock message per freeing release");
    }
    assert_eq!(ops, 1_000_000);
    assert_eq!(
        rules::acquire(View::Held { mine: Some(u64::MAX), pttl: 1 }, deadline(0, 1), Extend::Set),
        Err(LockError::CountOverflow)
    );
}
