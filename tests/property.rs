//! Property tests, without a server: a million random inputs to the argument parsers, and a
//! million random operations run through the lock rules and checked against a reference model
//! written separately (Redisson's semantics, stated as directly as possible).

mod common;

use common::rng::Rng;
use common::Model;
use rlock::args::{Acquire, KeyOnly, Lease, Release, Renew};
use rlock::error::LockError;
use rlock::rules::{self, Deadline, Reply, View};

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
        (0..rng.below(24)).map(|_| rng.next() as u8).collect()
    } else {
        POOL[rng.below(POOL.len())].to_vec()
    }
}

#[test]
fn a_million_random_argument_vectors_parse_or_fail_cleanly() {
    let mut rng = Rng(0xA11CE);
    let (mut ok, mut refused) = (0u32, 0u32);
    for _ in 0..1_000_000 {
        let mut args = vec![b"CMD".to_vec()];
        for _ in 0..rng.below(8) {
            args.push(random_arg(&mut rng));
        }
        let results = [
            Acquire::parse(&args).map(|a| {
                assert_eq!(a.key, &args[1]);
                assert!(!a.owner.is_empty());
                assert!(a.lease.as_millis() > 0 && a.lease.as_millis() <= i64::MAX as u64);
            }),
            Release::parse(&args).map(|r| assert!(r.request.is_none_or(|id| !id.is_empty()))),
            Renew::parse(&args).map(|r| assert!(!r.owner.is_empty())),
            KeyOnly::parse(&args).map(|k| assert_eq!(args.len(), 2, "{:?}", k.key)),
        ];
        for r in results {
            match r {
                Ok(()) => ok += 1,
                Err(e) => {
                    assert!(
                        e.message().starts_with("ERR ") || e.message().starts_with("WRONGTYPE ")
                    );
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
        let mut now: i64 = 1_000_000;
        let mut frees = 0;
        for _ in 0..100 {
            now += rng.below(40) as i64;
            let owner = owners[rng.below(3)];
            let lease = 1 + rng.below(100) as i64;
            let (want, got) = match rng.below(5) {
                0 | 1 => {
                    let view = stored.view(Some(owner), now);
                    let plan = rules::acquire(view, deadline(now, lease)).expect("no overflow");
                    (reference.acquire(owner, now, lease), stored.apply(Some(owner), plan))
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
                    let plan = rules::renew(view, deadline(now, lease));
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
        rules::acquire(View::Held { mine: Some(u64::MAX), pttl: 1 }, deadline(0, 1)),
        Err(LockError::CountOverflow)
    );
}
