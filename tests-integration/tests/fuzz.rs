//! A live, model-checked fuzz run with faults: mostly valid `RLOCK.*` commands and blocking
//! waiters on braced and plain names, mixed with what real servers see: `CLIENT PAUSE WRITE|ALL`,
//! `SWAPDB`, `DEL`/`UNLINK`/`RENAME` of lock keys, `FLUSHDB`, expiry, `DEBUG RELOAD`, waiters
//! killed or unblocked, keys of the wrong type.
//!
//! Checked after every step: the server answers; no lock hash has two owners; a command that
//! replied an error left `DEBUG DIGEST` unchanged (command and digests in one `MULTI`); fencing
//! tokens never repeat for a name (and a grant's token exceeds every token seen before it);
//! every waiter is answered exactly once (its connection then answers `PING` with `PONG`). At
//! the end, a replica without the module and an AOF replay of the whole run have the master's
//! digest.
//!
//! `RLOCK_FUZZ_SEED` replays a run (the seed is printed, and named in every failure);
//! `RLOCK_FUZZ_STEPS` sets its length.

use std::collections::{BTreeMap, BTreeSet};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use redis::{Connection, Value};
use rlock_tests_integration::{
    blocked_clients, closes_a_cycle, digest, info_field, poll, run, run_checked, Server,
};

use rlock_tests_integration::Rng;

const NAMES: [&str; 5] = ["l0", "l1", "{t}:l2", "o{42}", "a}b"];
const OWNERS: [&str; 3] = ["A", "B", "C"];
const LEASES: [&str; 5] = ["30", "100", "300", "1000", "5000"];
const LIMIT: Duration = Duration::from_secs(20);

fn steps() -> usize {
    std::env::var("RLOCK_FUZZ_STEPS").ok().and_then(|s| s.parse().ok()).unwrap_or(1500)
}

fn pick<'a>(rng: &mut Rng, items: &[&'a str]) -> &'a str {
    items[rng.below(items.len())]
}

/// A blocking `RLOCK.ACQUIRE ... WAIT` on its own connection and thread: its one reply, then
/// the reply to a `PING` sent after it (`PONG` unless a second reply was queued).
struct Waiter {
    id: i64,
    name: &'static str,
    token: bool,
    thread: JoinHandle<(Result<Value, String>, Result<Value, String>)>,
}

impl Waiter {
    fn start(server: &Server, args: Vec<String>, name: &'static str) -> Self {
        let mut con = server.conn();
        con.set_read_timeout(Some(LIMIT)).expect("timeout");
        let id: i64 = redis::cmd("CLIENT").arg("ID").query(&mut con).expect("CLIENT ID");
        let token = args.iter().any(|a| a == "TOKEN");
        let thread = thread::spawn(move || {
            let argv: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
            let reply = run(&mut con, &argv);
            let ping = run(&mut con, &[b"PING"]);
            (reply, ping)
        });
        Self { id, name, token, thread }
    }
}

/// The run's state and its invariants.
struct Fuzz {
    seed: u64,
    step: usize,
    /// Every token granted, per (content lineage of db 0, lock name).
    tokens: BTreeMap<(u32, &'static str), BTreeSet<i64>>,
    /// The lineage of the data in db 0 and db 1 (swapped by SWAPDB, renewed by FLUSHDB).
    lineage: [u32; 2],
    next_lineage: u32,
    waiters: Vec<Waiter>,
    answered: usize,
    /// Waits refused as deadlocks.
    deadlocks: usize,
    killed: BTreeSet<i64>,
    /// Until when a client may still sit paused by `CLIENT PAUSE`: Redis 7.0 itself answers
    /// such a client twice on `CLIENT UNBLOCK ... ERROR` and aborts on `... TIMEOUT`.
    paused_until: Instant,
}

impl Fuzz {
    fn at(&self) -> String {
        format!("seed {} (RLOCK_FUZZ_SEED), step {}", self.seed, self.step)
    }

    fn record_token(&mut self, name: &'static str, token: i64, ordered: bool) {
        let at = self.at();
        let seen = self.tokens.entry((self.lineage[0], name)).or_default();
        if ordered {
            if let Some(max) = seen.last() {
                assert!(token > *max, "{at}: token {token} on {name} after {max}");
            }
        }
        assert!(seen.insert(token), "{at}: token {token} on {name} granted twice");
    }

    /// Checks one reply of a command that may grant a token.
    fn check_grant(&mut self, name: &'static str, reply: &Value, ordered: bool) {
        if let Value::Array(items) = reply {
            if let [Value::Int(1), Value::Int(token)] = items.as_slice() {
                self.record_token(name, *token, ordered);
            } else {
                let ok = matches!(items.as_slice(), [Value::Int(0), Value::Int(_)]);
                assert!(ok, "{}: odd reply {reply:?}", self.at());
            }
        }
    }

    /// Collects the waiters that have replied (all of them when `all`).
    fn reap(&mut self, all: bool) {
        let waiters = std::mem::take(&mut self.waiters);
        for w in waiters {
            if !all && !w.thread.is_finished() {
                self.waiters.push(w);
                continue;
            }
            let until = Instant::now() + LIMIT;
            while !w.thread.is_finished() {
                assert!(Instant::now() < until, "{}: waiter {} never answered", self.at(), w.id);
                thread::sleep(Duration::from_millis(2));
            }
            let (reply, ping) = w.thread.join().expect("waiter thread");
            self.answered += 1;
            if self.killed.contains(&w.id) {
                continue; // its connection was killed: any outcome, or none
            }
            let ok = match &reply {
                Ok(Value::Nil | Value::Int(_)) => true,
                Ok(v @ Value::Array(_)) => {
                    assert!(w.token, "{}: token reply without TOKEN", self.at());
                    self.check_grant(w.name, v, false);
                    true
                }
                // Owners wait for many locks at once (up to 6 waiters of 3 owners): a wait that
                // closes a cycle is refused; its links name this run's owners and names (that
                // the cycle existed is checked against the data in tests/deadlock.rs, where
                // nothing moves while it is checked).
                Err(e) if e.starts_with("DEADLOCK ") => {
                    self.deadlocks += 1;
                    closes_a_cycle(e, &OWNERS, &NAMES)
                }
                Err(e) => ["UNBLOCKED", "WRONGTYPE", "ERR the fencing token counter"]
                    .iter()
                    .any(|p| e.starts_with(p)),
                Ok(_) => false,
            };
            assert!(ok, "{}: waiter {} replied {reply:?}", self.at(), w.id);
            assert_eq!(
                ping,
                Ok(Value::SimpleString("PONG".into())),
                "{}: waiter {} answered more than once",
                self.at(),
                w.id
            );
        }
    }
}

/// The most owner fields of any lock hash in `db` (a lock has one).
const MOST_OWNERS: &str = "local m = 0 \
    for _, k in ipairs(KEYS) do \
        if redis.call('TYPE', k).ok == 'hash' then m = math.max(m, redis.call('HLEN', k)) end \
    end \
    return m";

fn one_owner_at_most(fuzz: &Fuzz, con: &mut Connection, db: &str) {
    run(con, &[b"SELECT", db.as_bytes()]).expect("SELECT");
    let most: i64 = redis::cmd("EVAL_RO")
        .arg(MOST_OWNERS)
        .arg(NAMES.len())
        .arg(&NAMES[..])
        .query(con)
        .expect("EVAL_RO");
    run(con, &[b"SELECT", b"0"]).expect("SELECT");
    assert!(most <= 1, "{}: db {db}: a lock has {most} owners", fuzz.at());
}

#[test]
fn a_fuzz_run_with_faults_keeps_every_invariant_and_replicas_and_aof_agree() {
    let seed = rlock_tests_integration::fuzz_seed();
    eprintln!("fuzz seed {seed} (replay with RLOCK_FUZZ_SEED={seed})");
    let mut master =
        Server::builder().config("appendonly", "yes").config("appendfsync", "always").start();
    let replica = Server::builder().without_module().replica_of(&master).start();
    let mut con = master.conn();
    let mut check = master.conn();
    let mut rng = Rng(seed);
    let mut fuzz = Fuzz {
        seed,
        step: 0,
        tokens: BTreeMap::new(),
        lineage: [0, 1],
        next_lineage: 2,
        waiters: Vec::new(),
        answered: 0,
        deadlocks: 0,
        killed: BTreeSet::new(),
        paused_until: Instant::now(),
    };
    let (mut replies, mut errors) = (0, 0);

    for step in 0..steps() {
        fuzz.step = step;
        let name = NAMES[rng.below(NAMES.len())];
        let owner = pick(&mut rng, &OWNERS);
        let lease = pick(&mut rng, &LEASES);
        let roll = rng.below(100);
        let mut args: Vec<String> = match roll {
            0..=29 => vec!["RLOCK.ACQUIRE".into(), name.into(), owner.into(), lease.into()],
            30..=49 => vec!["RLOCK.RELEASE".into(), name.into(), owner.into()],
            50..=57 => vec!["RLOCK.RENEW".into(), name.into(), owner.into(), lease.into()],
            58..=60 => vec!["RLOCK.FORCERELEASE".into(), name.into()],
            61..=63 => vec!["RLOCK.PTTL".into(), name.into()],
            64..=66 => vec!["RLOCK.INFO".into(), name.into()],
            67..=76 => {
                if fuzz.waiters.len() < 6 {
                    let wait = ["20", "100", "400", "800"][rng.below(4)];
                    let mut args: Vec<String> = ["RLOCK.ACQUIRE", name, owner, lease, "WAIT", wait]
                        .iter()
                        .map(|s| (*s).to_owned())
                        .collect();
                    if rng.below(2) == 0 {
                        args.push("TOKEN".into());
                    }
                    fuzz.waiters.push(Waiter::start(&master, args, name));
                }
                Vec::new()
            }
            77..=79 => {
                // Invalid: a bad lease, an option without its value, a leftover argument.
                let bad = [
                    &["RLOCK.ACQUIRE", name, owner, "0"][..],
                    &["RLOCK.ACQUIRE", name, owner, lease, "WAIT"],
                    &["RLOCK.RELEASE", name, owner, lease, "REQUEST"],
                    &["RLOCK.RENEW", name, owner, "-5"],
                    &["RLOCK.PTTL", name, "extra"],
                    &["RLOCK.ACQUIRE", name, "", lease],
                ];
                bad[rng.below(bad.len())].iter().map(|s| (*s).to_owned()).collect()
            }
            80..=81 => {
                let mode = if rng.below(2) == 0 { "WRITE" } else { "ALL" };
                run(&mut check, &[b"CLIENT", b"PAUSE", b"40", mode.as_bytes()]).expect("PAUSE");
                fuzz.paused_until = Instant::now() + Duration::from_millis(300);
                Vec::new()
            }
            82..=84 => {
                let del = ["DEL", "UNLINK"][rng.below(2)];
                run(&mut check, &[del.as_bytes(), name.as_bytes()]).expect("DEL");
                Vec::new()
            }
            85 => {
                let to = NAMES[rng.below(NAMES.len())];
                let _ = run(&mut check, &[b"RENAME", name.as_bytes(), to.as_bytes()]);
                Vec::new()
            }
            86 => {
                // Whole-dataset faults move or drop token counters: settle the waiters first so
                // each token is attributed to the data it came from.
                fuzz.reap(true);
                run(&mut check, &[b"SWAPDB", b"0", b"1"]).expect("SWAPDB");
                fuzz.lineage.swap(0, 1);
                Vec::new()
            }
            87 if rng.below(4) == 0 => {
                fuzz.reap(true);
                run(&mut check, &[b"FLUSHDB"]).expect("FLUSHDB");
                fuzz.lineage[0] = fuzz.next_lineage;
                fuzz.next_lineage += 1;
                Vec::new()
            }
            88 if rng.below(4) == 0 => {
                run(&mut check, &[b"DEBUG", b"RELOAD"]).expect("DEBUG RELOAD");
                Vec::new()
            }
            89..=90 => {
                if let Some(w) = fuzz.waiters.get(rng.below(fuzz.waiters.len().max(1))) {
                    let id = w.id.to_string();
                    if rng.below(2) == 0 || Instant::now() < fuzz.paused_until {
                        fuzz.killed.insert(w.id);
                        let _ = run(&mut check, &[b"CLIENT", b"KILL", b"ID", id.as_bytes()]);
                    } else {
                        let how: &[u8] = if rng.below(2) == 0 { b"TIMEOUT" } else { b"ERROR" };
                        let _ = run(&mut check, &[b"CLIENT", b"UNBLOCK", id.as_bytes(), how]);
                    }
                }
                Vec::new()
            }
            91 => {
                // A key of the wrong type where a lock was; gone again a few steps later.
                let _ = run(&mut check, &[b"SET", name.as_bytes(), b"not a lock", b"PX", b"50"]);
                Vec::new()
            }
            _ => vec!["RLOCK.ACQUIRE".into(), name.into(), owner.into(), lease.into()],
        };
        if args.first().is_some_and(|c| c == "RLOCK.ACQUIRE") && rng.below(2) == 0 {
            args.push("TOKEN".into());
        }
        if args.first().is_some_and(|c| c == "RLOCK.RELEASE") && rng.below(3) == 0 {
            args.push("REQUEST".into());
            args.push(format!("r{}", rng.below(4)));
        }
        if !args.is_empty() {
            let argv: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
            let (reply, changed) = run_checked(&mut con, &argv)
                .unwrap_or_else(|e| panic!("{}: {args:?}: the server is gone: {e}", fuzz.at()));
            match &reply {
                Ok(v) => {
                    replies += 1;
                    if args[0] == "RLOCK.ACQUIRE" {
                        fuzz.check_grant(name, v, true);
                    }
                }
                Err(e) => {
                    errors += 1;
                    assert!(
                        e.starts_with("ERR ") || e.starts_with("WRONGTYPE "),
                        "{}: {args:?}: {e}",
                        fuzz.at()
                    );
                    assert!(
                        !changed,
                        "{}: {args:?} replied {e} yet changed the dataset",
                        fuzz.at()
                    );
                }
            }
        }
        let pong = run(&mut check, &[b"PING"]);
        assert_eq!(pong, Ok(Value::SimpleString("PONG".into())), "{}: alive", fuzz.at());
        one_owner_at_most(&fuzz, &mut check, "0");
        one_owner_at_most(&fuzz, &mut check, "1");
        fuzz.reap(false);
    }
    fuzz.reap(true);
    eprintln!(
        "{} steps: {replies} replies, {errors} errors, {} waiters answered ({} refused as \
         deadlocks), {} tokens",
        steps(),
        fuzz.answered,
        fuzz.deadlocks,
        fuzz.tokens.values().map(BTreeSet::len).sum::<usize>()
    );
    assert!(master.log().lines().all(|l| !l.contains("panicked")), "{}", master.log());

    // Quiescence: no waiter, no module timer.
    poll("no blocked client", LIMIT, || (blocked_clients(&mut check) == 0).then_some(()));
    poll("no module timer", LIMIT, || {
        (info_field(&mut check, "rlock", "rlock_timers_armed") == 0).then_some(())
    });
    // Make every key permanent (expiry would move the digests), then compare.
    for db in ["0", "1"] {
        run(&mut check, &[b"SELECT", db.as_bytes()]).expect("SELECT");
        let _: Value =
            redis::cmd("SCAN").arg(0).arg("COUNT").arg(100_000).query(&mut check).expect("SCAN");
        let keys: Vec<Vec<u8>> = redis::cmd("KEYS").arg("*").query(&mut check).expect("KEYS");
        for key in keys {
            let _: Value = redis::cmd("PERSIST").arg(key).query(&mut check).expect("PERSIST");
        }
    }
    run(&mut check, &[b"SELECT", b"0"]).expect("SELECT");
    let acked: i64 = redis::cmd("WAIT").arg(1).arg(10_000).query(&mut check).expect("WAIT");
    assert_eq!(acked, 1, "the replica acknowledged");
    let master_digest = digest(&mut check);
    let mut r = replica.conn();
    poll("the replica's digest", LIMIT, || (digest(&mut r) == master_digest).then_some(()));
    drop((con, check));
    master.restart();
    let mut con = master.conn();
    assert_eq!(digest(&mut con), master_digest, "seed {seed}: the AOF replay differs");
}
