//! The live, model-checked fuzz run of the other lock kinds: `RWLOCK.*` and `RSEM.*` (plain and
//! leased permits), with extreme numbers, blocking waiters on their own connections, foreign
//! writes to the layouts (as a buggy Redisson client would write them), `CLIENT PAUSE`,
//! replica-guard changes, waiters killed and unblocked, and commands inside `MULTI` and Lua.
//!
//! Checked after every step (the seed and the step are named in every failure): the server
//! answers; a command that replied an error left `DEBUG DIGEST` unchanged (command and digests in
//! one `MULTI`); a read-write lock hash has at most one writer, its `mode` says so, and no live
//! reader of another owner beside it; a semaphore only RSEM commands touched conserves permits
//! (available + leased + held by the run's clients <= every permit ever set or added). Every
//! waiter is answered exactly once; at each quiescence point (every lock freed) every waiter is
//! answered, and one with a long timeout is granted. At the end a module-less replica has the
//! master's digest and the same `DUMP` of every key.
//!
//! `RLOCK_FUZZ_SEED` replays a run (the seed is printed); `RLOCK_FUZZ_STEPS` sets its length.

#[path = "fuzz_kinds/faults.rs"]
mod faults;
#[path = "fuzz_kinds/model.rs"]
mod model;

use std::time::{Duration, Instant};

use redis::Value;
use rlock_tests_integration::{
    assert_replica_matches, fuzz_seed, fuzz_steps, info_field, run, run_checked, BlockedCall, Rng,
    Server,
};

use model::{Ask, Fuzz, Waiter, RW, SEM};

const OWNERS: [&str; 4] = ["A", "B", "C", "6f1e2a3b-uuid:7"];
const LEASES: [&str; 5] = ["30", "100", "300", "1000", "5000"];
const TIMEOUTS: [&str; 5] = ["20", "100", "400", "800", "30000"];
const PERMITS: [&str; 4] = ["1", "1", "2", "3"];
/// Numbers a client may send: the edges of `i64`, `2^32`, signs, zeros and padding.
const EXTREME: [&str; 15] = [
    "0",
    "1",
    "9223372036854775807",
    "9223372036854775806",
    "4294967296",
    "-1",
    "-9223372036854775808",
    "05",
    "-0",
    "+1",
    "99999999999999999999",
    "1000000000000",
    " 2",
    "x",
    "1.5",
];
/// Lua that runs its arguments as one command (`redis.call`), key first.
const CALL: &str = "return redis.call(ARGV[1], KEYS[1], unpack(ARGV, 2))";

fn pick<'a>(rng: &mut Rng, items: &[&'a str]) -> &'a str {
    items[rng.below(items.len())]
}

/// Mostly `normal`, one time in five an extreme number.
fn number(rng: &mut Rng, normal: &[&str]) -> String {
    let n = if rng.below(5) == 0 { pick(rng, &EXTREME) } else { pick(rng, normal) };
    n.to_owned()
}

fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| (*s).to_owned()).collect()
}

/// `REQUEST id` one time in three (an id of a small pool: retries and reuse happen).
fn maybe_request(rng: &mut Rng, fuzz: &Fuzz, args: &mut Vec<String>) {
    if rng.below(3) == 0 {
        args.extend(["REQUEST".into(), fuzz.pool_request(rng)]);
    }
}

/// A random `RWLOCK.*` command on lock `i` (or `RLOCK.CANCEL` of one of its requests).
fn rw_command(rng: &mut Rng, fuzz: &Fuzz, i: usize) -> Vec<String> {
    let (name, owner) = (RW[i], pick(rng, &OWNERS));
    let mode = if rng.below(2) == 0 { "READ" } else { "WRITE" };
    match rng.below(11) {
        0..=3 => {
            let mut a = strings(&["RWLOCK.ACQUIRE", name, owner, mode]);
            a.push(number(rng, &LEASES));
            if rng.below(4) == 0 {
                a.push("WAIT".into()); // inside MULTI or Lua: one try
                a.push(number(rng, &TIMEOUTS));
            }
            if rng.below(if mode == "WRITE" { 2 } else { 8 }) == 0 {
                a.push("TOKEN".into());
            }
            maybe_request(rng, fuzz, &mut a);
            a
        }
        4..=6 => {
            let mut a = strings(&["RWLOCK.RELEASE", name, owner, mode]);
            if rng.below(3) == 0 {
                a.extend(["REQUEST".into(), format!("r{}", rng.below(4))]);
            }
            a
        }
        7 => vec!["RWLOCK.RENEW".into(), name.into(), owner.into(), number(rng, &LEASES)],
        8 => strings(&["RWLOCK.FORCERELEASE", name]),
        9 => vec!["RLOCK.CANCEL".into(), name.into(), fuzz.some_request(rng, i)],
        _ => strings(&["RWLOCK.INFO", name]),
    }
}

/// A random `RSEM.*` command on semaphore `i` (or `RLOCK.CANCEL` of one of its requests).
fn sem_command(rng: &mut Rng, fuzz: &Fuzz, i: usize) -> Vec<String> {
    let name = SEM[i];
    match rng.below(15) {
        0..=1 => vec!["RSEM.SETPERMITS".into(), name.into(), number(rng, &["0", "1", "3", "10"])],
        2..=3 => vec!["RSEM.ADDPERMITS".into(), name.into(), number(rng, &["1", "2", "-1", "4"])],
        4..=7 => {
            let mut a = vec!["RSEM.ACQUIRE".into(), name.into(), number(rng, &PERMITS)];
            if rng.below(2) == 0 {
                a.push("LEASE".into());
                a.push(number(rng, &LEASES));
            }
            if rng.below(4) == 0 {
                a.push("WAIT".into());
                a.push(number(rng, &TIMEOUTS));
            }
            maybe_request(rng, fuzz, &mut a);
            a
        }
        8..=9 => {
            let held = fuzz.sem[i].held;
            let n = if held > 0 && rng.below(3) > 0 {
                (1 + rng.below(held.min(3) as usize)).to_string()
            } else {
                number(rng, &PERMITS)
            };
            vec!["RSEM.RELEASE".into(), name.into(), n]
        }
        10..=11 => {
            let mut a = strings(&["RSEM.RELEASE", name, "ID"]);
            for _ in 0..=rng.below(3) {
                a.push(fuzz.some_id(rng, i));
            }
            a
        }
        12 => vec!["RSEM.RENEW".into(), name.into(), fuzz.some_id(rng, i), number(rng, &LEASES)],
        13 => vec!["RLOCK.CANCEL".into(), name.into(), fuzz.some_request(rng, RW.len() + i)],
        _ => strings(&[if rng.below(2) == 0 { "RSEM.AVAILABLE" } else { "RSEM.INFO" }, name]),
    }
}

/// A blocking waiter's command, and what it asks; one in two with a request id of its own.
fn waiter_command(rng: &mut Rng, fuzz: &mut Fuzz) -> (Vec<String>, Ask) {
    let timeout = match rng.below(10) {
        0 => "0".to_owned(),
        1 => "9223372036854775807".to_owned(),
        _ => pick(rng, &TIMEOUTS).to_owned(),
    };
    let i = rng.below(RW.len());
    if rng.below(2) == 0 {
        let write = rng.below(2) == 0;
        let mode = if write { "WRITE" } else { "READ" };
        let mut a = strings(&["RWLOCK.ACQUIRE", RW[i], pick(rng, &OWNERS), mode]);
        a.extend([pick(rng, &LEASES).to_owned(), "WAIT".into(), timeout]);
        let token = write && rng.below(2) == 0;
        if token {
            a.push("TOKEN".into());
        }
        if rng.below(2) == 0 {
            a.extend(["REQUEST".into(), fuzz.waiter_request(i, 0, false)]);
        }
        (a, Ask::Rw { name: i, token })
    } else {
        let permits = if rng.below(8) == 0 { "4294967296" } else { pick(rng, &PERMITS) };
        let mut a = strings(&["RSEM.ACQUIRE", SEM[i], permits]);
        let leased = rng.below(2) == 0;
        if leased {
            a.extend(["LEASE".into(), pick(rng, &LEASES).to_owned()]);
        }
        a.extend(["WAIT".into(), timeout]);
        let n = a[2].parse().expect("permits");
        if rng.below(2) == 0 {
            a.extend(["REQUEST".into(), fuzz.waiter_request(RW.len() + i, n, leased)]);
        }
        (a, Ask::Sem { name: i, permits: n, leased, gen: fuzz.sem[i].gen })
    }
}

#[test]
fn a_fuzz_run_of_read_write_locks_and_semaphores_keeps_every_invariant() {
    let seed = fuzz_seed();
    eprintln!("fuzz_kinds seed {seed} (replay with RLOCK_FUZZ_SEED={seed})");
    let master = Server::start();
    let replica = Server::builder().without_module().replica_of(&master).start();
    rlock_tests_integration::wait_replica_online(&master);
    let mut con = master.conn();
    let mut check = master.conn();
    let mut rng = Rng(seed);
    let mut fuzz = Fuzz::new(seed);
    let steps = fuzz_steps(2000);

    for step in 0..steps {
        fuzz.step = step;
        let roll = rng.below(100);
        let args = match roll {
            0..=29 => {
                let i = rng.below(RW.len());
                rw_command(&mut rng, &fuzz, i)
            }
            30..=59 => {
                let i = rng.below(SEM.len());
                sem_command(&mut rng, &fuzz, i)
            }
            60..=69 => {
                if fuzz.waiters.len() < 8 {
                    let (args, ask) = waiter_command(&mut rng, &mut fuzz);
                    let patient = matches!(args.last().map(String::as_str), Some("0" | "30000"))
                        || args.iter().any(|a| a == "9223372036854775807");
                    let call = BlockedCall::start(&master, args, Duration::from_secs(120));
                    fuzz.waiters.push(Waiter { call, ask, patient });
                }
                Vec::new()
            }
            70..=79 => {
                fuzz.foreign_write(&mut rng, &mut check);
                Vec::new()
            }
            80..=81 => {
                let mode = if rng.below(2) == 0 { "WRITE" } else { "ALL" };
                run(&mut check, &[b"CLIENT", b"PAUSE", b"30", mode.as_bytes()]).expect("PAUSE");
                fuzz.paused_until = Instant::now() + Duration::from_millis(300);
                Vec::new()
            }
            82..=83 => {
                let n = pick(&mut rng, &["0", "-1", "1", "1", "-1", "2"]);
                let set = [&b"CONFIG"[..], b"SET", b"rlock.min-replicas", n.as_bytes()];
                run(&mut check, &set).expect("CONFIG SET");
                Vec::new()
            }
            84..=87 => {
                fuzz.kill_or_unblock(&mut rng, &mut check);
                Vec::new()
            }
            88..=89 => {
                fuzz.reset(&mut check, rng.below(RW.len() + SEM.len()));
                Vec::new()
            }
            _ => {
                let i = rng.below(SEM.len());
                vec!["RSEM.RELEASE".into(), SEM[i].into(), "1".into()]
            }
        };
        if !args.is_empty() {
            execute(&mut fuzz, &mut rng, &mut con, &args);
        }
        let pong = run(&mut check, &[b"PING"]);
        assert_eq!(pong, Ok(Value::SimpleString("PONG".into())), "{}: alive", fuzz.at());
        fuzz.check_invariants(&mut check);
        fuzz.reap(false);
        if step % 250 == 249 {
            fuzz.quiesce(&mut check);
        }
    }
    fuzz.quiesce(&mut check);
    eprintln!("{steps} steps: {}", fuzz.summary());
    assert!(!master.log().contains("panicked"), "{}: {}", fuzz.at(), master.log());
    // Leases of a few seconds end, and their timers with them (a huge lease keeps its timer).
    let (mut m, until) = (master.conn(), Instant::now() + Duration::from_secs(8));
    while info_field(&mut m, "rlock", "rlock_timers_armed") > 0 && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_replica_matches(&master, &replica, Duration::from_secs(20), &fuzz.at());
}

/// Runs one command: in `MULTI` between two digests (most often), the same inside `EVAL`, or
/// plain; checks its reply and applies it to the model.
fn execute(fuzz: &mut Fuzz, rng: &mut Rng, con: &mut redis::Connection, args: &[String]) {
    let how = rng.below(20);
    let mut argv: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
    let lua: Vec<&[u8]> = [CALL.as_bytes(), b"1", argv[1], argv[0]]
        .into_iter()
        .chain(argv[2..].iter().copied())
        .collect();
    if (13..17).contains(&how) {
        argv = [&b"EVAL"[..]].into_iter().chain(lua).collect();
    }
    // Plain (outside MULTI and Lua) only without WAIT, which would block this connection.
    let (reply, changed) = if how < 17 || args.iter().any(|a| a == "WAIT") {
        run_checked(con, &argv)
    } else {
        run(con, &argv).map(|r| (Ok(r), false)).or_else(|e| {
            if e.contains(' ')
                && e.split(' ').next().is_some_and(|c| c.chars().all(|c| c.is_ascii_uppercase()))
            {
                Ok((Err(e), false))
            } else {
                Err(e)
            }
        })
    }
    .unwrap_or_else(|e| panic!("{}: {args:?}: the server is gone: {e}", fuzz.at()));
    match reply {
        Ok(v) => fuzz.apply(args, &v),
        Err(e) => {
            fuzz.errors += 1;
            assert!(
                ["ERR ", "WRONGTYPE ", "NOREPLICAS "].iter().any(|p| e.starts_with(p)),
                "{}: {args:?} (mode {how}): {e}",
                fuzz.at()
            );
            assert!(
                !changed || fuzz.served_queue_of(&args[1]),
                "{}: {args:?} replied {e} yet changed the dataset (and served no waiter)",
                fuzz.at()
            );
        }
    }
}
