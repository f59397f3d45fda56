//! Deadlock detection: a `WAIT` that would close a cycle of owners waiting for each other is
//! refused at once with `DEADLOCK ...` naming the cycle, and changes nothing.

use std::time::Duration;

use redis::{Connection, Value};

use rlock_tests_integration::{
    blocked_clients, cmd, deadlock_links, poll, queue, queue_str, run, run_str, wait_state, Link,
    Pending, Server,
};

const LIMIT: Duration = Duration::from_secs(10);

/// The waiters' fields that move while a test looks: every wait here is `WAIT 0` (`left_ms`
/// stays -1), so only `waited_ms`.
const MOVING: &[&str] = &["waited_ms"];

fn refused(con: &mut Connection, args: &[&[u8]]) -> String {
    match run(con, args) {
        Err(e) => e,
        Ok(v) => panic!("{args:?} was not refused: {v:?}"),
    }
}

#[test]
fn a_two_lock_cycle_of_a_reentrant_and_a_read_write_lock_is_refused_changing_nothing() {
    let server = Server::start();
    let mut con = server.conn();
    cmd(&mut con, &["RLOCK.ACQUIRE", "k1", "A", "60000"]);
    cmd(&mut con, &["RWLOCK.ACQUIRE", "k2", "B", "WRITE", "60000"]);
    let a =
        queue_str(&server, &mut con, &["RWLOCK.ACQUIRE", "k2", "A", "READ", "60000", "WAIT", "0"]);
    let keys: [(&str, &[u8]); 2] = [("RLOCK.WAITERS", b"k1"), ("RWLOCK.WAITERS", b"k2")];
    let before = wait_state(&mut con, &keys, MOVING);
    let started = std::time::Instant::now();
    for token in [false, true] {
        let mut args: Vec<&[u8]> = vec![b"RLOCK.ACQUIRE", b"k1", b"B", b"60000", b"WAIT", b"5000"];
        if token {
            args.extend([b"TOKEN".as_slice(), b"REQUEST", b"req-1"]);
        }
        let e = refused(&mut con, &args);
        assert_eq!(
            e,
            "DEADLOCK this wait would close a cycle: B waits for k1 held by A; A waits for k2 held by B"
        );
    }
    assert!(started.elapsed() < Duration::from_secs(2), "refused at once, not after the wait");
    assert_eq!(
        wait_state(&mut con, &keys, MOVING),
        before,
        "no queue entry, request record, counter"
    );
    // Without WAIT nothing waits: the busy reply, as always.
    assert!(matches!(run_str(&mut con, &["RLOCK.ACQUIRE", "k1", "B", "60000"]), Ok(Value::Int(_))));
    // The cycle breaks when a holder lets go: then B may wait.
    cmd(&mut con, &["RWLOCK.RELEASE", "k2", "B", "WRITE"]);
    assert_eq!(a.reply(LIMIT).0, Ok(Value::Nil));
}

#[test]
fn a_wait_for_a_read_write_lock_whose_writer_waits_elsewhere_is_refused() {
    // The search starts at the writer, whose field is `<owner>:write`, not the owner.
    let server = Server::start();
    let mut con = server.conn();
    cmd(&mut con, &["RWLOCK.ACQUIRE", "k1", "A", "WRITE", "60000"]);
    cmd(&mut con, &["RLOCK.ACQUIRE", "k2", "B", "60000"]);
    let a = queue_str(&server, &mut con, &["RLOCK.ACQUIRE", "k2", "A", "60000", "WAIT", "0"]);
    let keys: [(&str, &[u8]); 2] = [("RWLOCK.WAITERS", b"k1"), ("RLOCK.WAITERS", b"k2")];
    let before = wait_state(&mut con, &keys, MOVING);
    for mode in [b"READ".as_slice(), b"WRITE"] {
        let e = refused(&mut con, &[b"RWLOCK.ACQUIRE", b"k1", b"B", mode, b"60000", b"WAIT", b"0"]);
        assert_eq!(
            e,
            "DEADLOCK this wait would close a cycle: B waits for k1 held by A; A waits for k2 held by B"
        );
    }
    assert_eq!(
        wait_state(&mut con, &keys, MOVING),
        before,
        "no queue entry, request record, counter"
    );
    cmd(&mut con, &["RLOCK.RELEASE", "k2", "B"]);
    assert_eq!(a.reply(LIMIT).0, Ok(Value::Nil), "A is served once B lets go");
}

#[test]
fn a_three_lock_cycle_through_readers_is_refused_changing_nothing() {
    let server = Server::start();
    let mut con = server.conn();
    cmd(&mut con, &["RLOCK.ACQUIRE", "k1", "A", "60000"]);
    cmd(&mut con, &["RWLOCK.ACQUIRE", "k2", "B", "WRITE", "60000"]);
    cmd(&mut con, &["RWLOCK.ACQUIRE", "k3", "C", "READ", "60000"]);
    cmd(&mut con, &["RWLOCK.ACQUIRE", "k3", "D", "READ", "60000"]);
    let a =
        queue_str(&server, &mut con, &["RWLOCK.ACQUIRE", "k2", "A", "READ", "60000", "WAIT", "0"]);
    let b =
        queue_str(&server, &mut con, &["RWLOCK.ACQUIRE", "k3", "B", "WRITE", "60000", "WAIT", "0"]);
    let keys: [(&str, &[u8]); 3] =
        [("RLOCK.WAITERS", b"k1"), ("RWLOCK.WAITERS", b"k2"), ("RWLOCK.WAITERS", b"k3")];
    let before = wait_state(&mut con, &keys, MOVING);
    let e = refused(
        &mut con,
        &[b"RLOCK.ACQUIRE", b"k1", b"C", b"60000", b"WAIT", b"0", b"REQUEST", b"r"],
    );
    assert_eq!(
        e,
        "DEADLOCK this wait would close a cycle: C waits for k1 held by A; A waits for k2 held by B; B waits for k3 held by C"
    );
    assert_eq!(
        wait_state(&mut con, &keys, MOVING),
        before,
        "no queue entry, request record, counter"
    );
    // A read-write waiter closing a cycle: D (a reader of k3) asks to write a read-write lock
    // A reads.
    cmd(&mut con, &["RWLOCK.ACQUIRE", "k4", "A", "READ", "60000"]);
    let before4 = wait_state(&mut con, &[("RWLOCK.WAITERS", b"k4")], MOVING);
    let e = refused(&mut con, &[b"RWLOCK.ACQUIRE", b"k4", b"D", b"WRITE", b"60000", b"WAIT", b"0"]);
    assert!(
        e.starts_with("DEADLOCK this wait would close a cycle: D waits for k4 held by A;"),
        "{e}"
    );
    assert_eq!(wait_state(&mut con, &[("RWLOCK.WAITERS", b"k4")], MOVING), before4);
    // D (not on the cycle's path back) may read k4 alongside A.
    assert_eq!(
        cmd(&mut con, &["RWLOCK.ACQUIRE", "k4", "D", "READ", "60000", "WAIT", "0"]),
        Value::Nil
    );
    cmd(&mut con, &["RWLOCK.FORCERELEASE", "k2"]);
    a.reply(LIMIT).0.expect("a granted");
    cmd(&mut con, &["RWLOCK.FORCERELEASE", "k3"]);
    b.reply(LIMIT).0.expect("b granted");
}

#[test]
fn a_read_to_write_upgrade_is_a_cycle_of_one_refused_at_once() {
    let server = Server::start();
    let mut con = server.conn();
    cmd(&mut con, &["RWLOCK.ACQUIRE", "rw", "A", "READ", "60000"]);
    for others in [false, true] {
        if others {
            cmd(&mut con, &["RWLOCK.ACQUIRE", "rw", "B", "READ", "60000"]);
        }
        let before = wait_state(&mut con, &[("RWLOCK.WAITERS", b"rw")], MOVING);
        let e =
            refused(&mut con, &[b"RWLOCK.ACQUIRE", b"rw", b"A", b"WRITE", b"60000", b"WAIT", b"0"]);
        assert!(e.starts_with("ERR upgrade refused"), "{e}");
        assert_eq!(wait_state(&mut con, &[("RWLOCK.WAITERS", b"rw")], MOVING), before);
    }
}

#[test]
fn keys_and_owners_with_cr_lf_nul_and_spaces_are_escaped_in_the_error() {
    let server = Server::start();
    let mut con = server.conn();
    let (k1, k2): (&[u8], &[u8]) = (b"k\r\n1\0", b"k 2\\");
    let (a, b): (&[u8], &[u8]) = (b"own\r\ner A", b"B\0\xff");
    run(&mut con, &[b"RLOCK.ACQUIRE", k1, a, b"60000"]).expect("a takes k1");
    run(&mut con, &[b"RLOCK.ACQUIRE", k2, b, b"60000"]).expect("b takes k2");
    let waiting = queue(&server, &mut con, &[b"RLOCK.ACQUIRE", k2, a, b"60000", b"WAIT", b"0"]);
    let e = refused(&mut con, &[b"RLOCK.ACQUIRE", k1, b, b"60000", b"WAIT", b"0"]);
    assert_eq!(
        e,
        "DEADLOCK this wait would close a cycle: B\\x00\\xff waits for k\\x0d\\x0a1\\x00 held by \
         own\\x0d\\x0aer\\x20A; own\\x0d\\x0aer\\x20A waits for k\\x202\\x5c held by B\\x00\\xff"
    );
    run(&mut con, &[b"RLOCK.FORCERELEASE", k2]).expect("free k2");
    waiting.reply(LIMIT).0.expect("granted");
}

#[test]
fn a_chain_that_is_not_a_cycle_waits() {
    let server = Server::start();
    let mut con = server.conn();
    cmd(&mut con, &["RLOCK.ACQUIRE", "k1", "A", "60000"]);
    cmd(&mut con, &["RWLOCK.ACQUIRE", "k2", "B", "WRITE", "60000"]);
    let a =
        queue_str(&server, &mut con, &["RWLOCK.ACQUIRE", "k2", "A", "WRITE", "60000", "WAIT", "0"]);
    // C -> A -> B: a chain; and B waiting for a lock nobody on the chain holds.
    let c = queue_str(&server, &mut con, &["RLOCK.ACQUIRE", "k1", "C", "60000", "WAIT", "0"]);
    cmd(&mut con, &["RLOCK.ACQUIRE", "k3", "D", "60000"]);
    let b = queue_str(&server, &mut con, &["RLOCK.ACQUIRE", "k3", "B", "60000", "WAIT", "0"]);
    assert_eq!(blocked_clients(&mut con), 3);
    cmd(&mut con, &["RLOCK.FORCERELEASE", "k3"]);
    b.reply(LIMIT).0.expect("b granted");
    cmd(&mut con, &["RWLOCK.FORCERELEASE", "k2"]);
    a.reply(LIMIT).0.expect("a granted");
    cmd(&mut con, &["RLOCK.FORCERELEASE", "k1"]);
    c.reply(LIMIT).0.expect("c granted");
}

/// A cycle whose search would read more than the budget (1,000 steps: here a read-write lock of
/// `readers` readers, each a field to read) is not claimed: the wait is queued.
fn cycle_through_readers(readers: usize) -> Result<(), String> {
    let server = Server::start();
    let mut con = server.conn();
    cmd(&mut con, &["RLOCK.ACQUIRE", "k1", "A", "60000"]);
    let mut pipe = redis::pipe();
    pipe.cmd("RWLOCK.ACQUIRE").arg("k2").arg("B").arg("READ").arg("60000").ignore();
    for i in 0..readers {
        pipe.cmd("RWLOCK.ACQUIRE").arg("k2").arg(format!("r{i}")).arg("READ").arg("60000").ignore();
    }
    let () = pipe.query(&mut con).expect("readers");
    let _a =
        queue_str(&server, &mut con, &["RWLOCK.ACQUIRE", "k2", "A", "WRITE", "60000", "WAIT", "0"]);
    match run_str(&mut con, &["RLOCK.ACQUIRE", "k1", "B", "60000", "WAIT", "100"]) {
        Err(e) => Err(e),
        // Not claimed: B waited its 100 ms and got the busy reply.
        Ok(Value::Int(_)) => {
            let waits: String =
                redis::cmd("INFO").arg("rlock_waits").query(&mut con).expect("INFO");
            assert!(waits.contains("rlock_waits:2"), "{waits}");
            Ok(())
        }
        Ok(other) => panic!("{other:?}"),
    }
}

#[test]
fn a_cycle_past_the_search_budget_is_not_claimed() {
    let e = cycle_through_readers(10).expect_err("a small cycle is refused");
    assert!(e.starts_with("DEADLOCK"), "{e}");
    assert!(cycle_through_readers(1_100).is_ok(), "past the budget: no claim, the wait is queued");
}

/// A two-lock cycle whose second lock's hash also carries a foreign writer's field of `extra`
/// bytes: `Err` with the refusal, `Ok` when B's wait was queued (and timed out) instead.
fn cycle_through_a_big_field(extra: usize) -> Result<(), String> {
    let server = Server::start();
    let mut con = server.conn();
    cmd(&mut con, &["RLOCK.ACQUIRE", "k1", "A", "60000"]);
    cmd(&mut con, &["RLOCK.ACQUIRE", "k2", "B", "60000"]);
    let () =
        redis::cmd("HSET").arg("k2").arg(vec![b'f'; extra]).arg(1).query(&mut con).expect("HSET");
    let _a = queue_str(&server, &mut con, &["RLOCK.ACQUIRE", "k2", "A", "60000", "WAIT", "0"]);
    match run_str(&mut con, &["RLOCK.ACQUIRE", "k1", "B", "60000", "WAIT", "100"]) {
        Err(e) => Err(e),
        Ok(Value::Int(_)) => Ok(()),
        Ok(other) => panic!("{other:?}"),
    }
}

/// The search copies at most 1 MiB of lock hash fields: a foreign writer's huge field does not
/// make every enqueue that reaches its lock copy it (past the budget: no claim, as past the
/// step budget).
#[test]
fn a_cycle_through_a_hash_past_the_byte_budget_is_not_claimed() {
    let e = cycle_through_a_big_field(1_000).expect_err("a small field: refused");
    assert!(e.starts_with("DEADLOCK"), "{e}");
    assert!(cycle_through_a_big_field(2 << 20).is_ok(), "past the byte budget: no claim");
}

#[test]
fn a_cycle_through_a_key_the_user_may_not_read_is_not_named() {
    let server = Server::start();
    let mut admin = server.conn();
    cmd(&mut admin, &["ACL", "SETUSER", "u", "on", "nopass", "+@all", "~lock:*", "&*"]);
    cmd(&mut admin, &["RLOCK.ACQUIRE", "lock:1", "A", "60000"]);
    cmd(&mut admin, &["RLOCK.ACQUIRE", "secret:2", "B", "60000"]);
    let a =
        queue_str(&server, &mut admin, &["RLOCK.ACQUIRE", "secret:2", "A", "60000", "WAIT", "0"]);
    let mut con = server.conn();
    cmd(&mut con, &["AUTH", "u", "x"]);
    // The cycle B -> lock:1 -> A -> secret:2 -> B goes through a key u may not read: u's wait
    // is not refused (and secret:2 is never named to u); the admin's is.
    assert!(matches!(
        run_str(&mut con, &["RLOCK.ACQUIRE", "lock:1", "B", "60000", "WAIT", "50"]),
        Ok(Value::Int(_))
    ));
    let e =
        run_str(&mut admin, &["RLOCK.ACQUIRE", "lock:1", "B", "60000", "WAIT", "50"]).unwrap_err();
    assert!(e.contains("secret:2"), "{e}");
    cmd(&mut admin, &["RLOCK.FORCERELEASE", "secret:2"]);
    a.reply(LIMIT).0.expect("granted");
}

const OWNERS: [&str; 4] = ["A", "B", "C", "D"];

const LOCKS: [&str; 5] = ["r0", "r1", "r2", "w0", "w1"];

/// Checks a `DEADLOCK` reply to `owner`'s wait for `key` against the data as it is (nothing
/// changes meanwhile: leases and waits are long, and only this thread sends commands): every
/// link's holder holds its key, every link's waiter (but the new wait's) is queued for it in a
/// mode the holder blocks, and the links close a cycle starting with the new wait.
fn check_cycle(con: &mut Connection, owner: &str, key: &str, text: &str, at: &str) {
    let links = deadlock_links(text).unwrap_or_else(|| panic!("{at}: {text}"));
    assert_eq!((links[0].waiter, links[0].key), (owner, key), "{at}: {text}");
    for (i, &Link { waiter: x, key: k, holder: y }) in links.iter().enumerate() {
        let next = links[(i + 1) % links.len()].waiter;
        assert_eq!(y, next, "{at}: the links do not close: {text}");
        let fields: Vec<String> = redis::cmd("HKEYS").arg(k).query(con).expect("HKEYS");
        let rw = fields.iter().any(|f| f == "mode");
        let write_mode = rw && {
            let mode: String = redis::cmd("HGET").arg(k).arg("mode").query(con).expect("HGET");
            mode == "write"
        };
        let holds = fields.iter().any(|f| *f == *y || *f == format!("{y}:write"));
        assert!(holds, "{at}: {y} does not hold {k} ({fields:?}): {text}");
        if i == 0 {
            continue;
        }
        let command = if rw { "RWLOCK.WAITERS" } else { "RLOCK.WAITERS" };
        let Ok(Value::Array(rows)) = run_str(con, &[command, k, "COUNT", "1000"]) else { panic!() };
        let modes: Vec<Vec<u8>> = rows
            .iter()
            .filter_map(|row| {
                let Value::Array(f) = row else { return None };
                (f[1] == Value::BulkString(x.as_bytes().to_vec())).then(|| match &f[3] {
                    Value::BulkString(mode) if rw => mode.clone(),
                    _ => b"lock".to_vec(),
                })
            })
            .collect();
        let blocked = modes.iter().any(|m| m != b"read" || write_mode);
        assert!(blocked, "{at}: {x} does not wait for {k} blocked by {y} ({modes:?}): {text}");
    }
}

#[test]
fn waits_for_many_locks_at_random_never_report_a_false_deadlock() {
    let seed = rlock_tests_integration::fuzz_seed();
    let steps = std::env::var("RLOCK_FUZZ_STEPS").ok().and_then(|s| s.parse().ok()).unwrap_or(400);
    eprintln!("deadlock fuzz seed {seed} (replay with RLOCK_FUZZ_SEED={seed})");
    let mut rng = rlock_tests_integration::Rng(seed);
    let server = Server::start();
    let mut con = server.conn();
    let mut waiting: Vec<Pending> = Vec::new();
    let (mut refused_count, mut queued) = (0, 0);
    for step in 0..steps {
        let at = format!("seed {seed}, step {step}");
        let owner = OWNERS[rng.below(OWNERS.len())];
        let key = LOCKS[rng.below(LOCKS.len())];
        let mode = if rng.below(2) == 0 { "READ" } else { "WRITE" };
        let mut args = if key.starts_with('r') {
            vec!["RLOCK.ACQUIRE", key, owner, "600000"]
        } else {
            vec!["RWLOCK.ACQUIRE", key, owner, mode, "600000"]
        };
        match rng.below(10) {
            0..=4 if waiting.len() < 12 => {
                args.extend(["WAIT", "0"]);
                let pending = Pending::start_str(&server, &args);
                let id = pending.client_id().to_string();
                let what = format!("{at}: {args:?} to block or reply");
                let blocked = poll(&what, LIMIT, || {
                    if pending.replied() {
                        Some(false)
                    } else {
                        // Blocked (flag b), whatever else a settle before it served.
                        let list: String = redis::cmd("CLIENT")
                            .arg("LIST")
                            .arg("ID")
                            .arg(&id)
                            .query(&mut con)
                            .expect("CLIENT LIST");
                        list.contains("flags=b ").then_some(true)
                    }
                });
                if blocked {
                    queued += 1;
                    waiting.push(pending);
                    continue;
                }
                match pending.reply(LIMIT).0 {
                    Ok(_) => {}
                    Err(e) if e.starts_with("DEADLOCK") => {
                        refused_count += 1;
                        check_cycle(&mut con, owner, key, &e, &at);
                    }
                    Err(e) => assert!(e.starts_with("ERR upgrade refused"), "{at}: {e}"),
                }
            }
            0..=6 => {
                let _ = run_str(&mut con, &args);
            }
            _ => {
                let force =
                    if key.starts_with('r') { "RLOCK.FORCERELEASE" } else { "RWLOCK.FORCERELEASE" };
                cmd(&mut con, &[force, key]);
            }
        }
        // Waiters granted by a release reply; the others stay queued.
        waiting.retain(|p| !p.replied());
    }
    // Each flush hands every lock to the heads of its queue: flush until nobody waits.
    poll("every waiter served", LIMIT, || {
        cmd(&mut con, &["FLUSHALL"]);
        (blocked_clients(&mut con) == 0).then_some(())
    });
    eprintln!("{steps} steps: {queued} waits queued, {refused_count} refused as deadlocks");
    assert!(refused_count > 0 || steps < 100, "the run never closed a cycle: seed {seed}");
}

/// The `DEADLOCK` text the module gives for `links` (waiter, key, holder), cut as it cuts it:
/// at most 1,024 bytes of links, then `; ...`.
fn expected_text(links: &[(String, String, String)]) -> String {
    let mut text = String::from("DEADLOCK this wait would close a cycle: ");
    let base = text.len();
    for (i, (w, k, h)) in links.iter().enumerate() {
        let part = format!("{w} waits for {k} held by {h}");
        if text.len() - base + part.len() > 1024 {
            text.push_str("; ...");
            break;
        }
        if i > 0 {
            text.push_str("; ");
        }
        text.push_str(&part);
    }
    text
}

/// Lock `i` of the ring: every third one a read-write lock (its holder writes, its waiter asks
/// to write), the others reentrant locks.
fn ring_lock(i: usize) -> (String, bool) {
    (format!("ring{i}"), i.is_multiple_of(3))
}

fn hold(con: &mut Connection, (key, rw): &(String, bool), owner: &str) {
    if *rw {
        cmd(con, &["RWLOCK.ACQUIRE", key, owner, "WRITE", "60000"]);
    } else {
        cmd(con, &["RLOCK.ACQUIRE", key, owner, "60000"]);
    }
}

fn wait_args<'a>((key, rw): &'a (String, bool), owner: &'a str, wait: &'a str) -> Vec<&'a str> {
    if *rw {
        vec!["RWLOCK.ACQUIRE", key, owner, "WRITE", "60000", "WAIT", wait]
    } else {
        vec!["RLOCK.ACQUIRE", key, owner, "60000", "WAIT", wait]
    }
}

/// A ring of `n` owners (owner `o{i}` holds lock `i` and waits for lock `i + 1`), but for the
/// last wait (`o{n-1}` for lock 0), which is then asked with `WAIT 100` and its reply returned.
/// `branches`: each ring owner also waits (on other connections) for that many locks held by
/// owners who wait for a lock held by an owner who waits nowhere: dead ends the breadth-first
/// search walks before it reaches the end of the ring. `broken`: the ring owner that does not
/// wait for the next lock (no cycle then).
fn ring(n: usize, branches: usize, broken: Option<usize>) -> (Result<Value, String>, Vec<Pending>) {
    let server = Server::start();
    let mut con = server.conn();
    let mut waits = Vec::new();
    for i in 0..n {
        hold(&mut con, &ring_lock(i), &format!("o{i}"));
        for b in 0..branches {
            let (x, y) = (format!("x{i}.{b}"), format!("y{i}.{b}"));
            cmd(&mut con, &["RLOCK.ACQUIRE", &x, &format!("d{i}.{b}"), "60000"]);
            cmd(&mut con, &["RLOCK.ACQUIRE", &y, &format!("e{i}.{b}"), "60000"]);
            let owner = format!("o{i}");
            waits.push(queue_str(
                &server,
                &mut con,
                &["RLOCK.ACQUIRE", &x, &owner, "1", "WAIT", "0"],
            ));
            let d = format!("d{i}.{b}");
            waits.push(queue_str(&server, &mut con, &["RLOCK.ACQUIRE", &y, &d, "1", "WAIT", "0"]));
        }
    }
    for i in (0..n - 1).filter(|i| Some(*i) != broken) {
        let owner = format!("o{i}");
        waits.push(queue_str(&server, &mut con, &wait_args(&ring_lock(i + 1), &owner, "0")));
    }
    let last = format!("o{}", n - 1);
    let reply = run_str(&mut con, &wait_args(&ring_lock(0), &last, "100"));
    (reply, waits)
}

/// The links of the ring of `n` owners, from the closing wait on.
fn ring_links(n: usize) -> Vec<(String, String, String)> {
    let mut links = vec![(format!("o{}", n - 1), ring_lock(0).0, "o0".to_owned())];
    for i in 0..n - 1 {
        links.push((format!("o{i}"), ring_lock(i + 1).0, format!("o{}", i + 1)));
    }
    links
}

#[test]
fn rings_of_20_and_40_owners_are_refused_naming_exactly_the_ring() {
    for n in [20, 40] {
        let (reply, _waits) = ring(n, 0, None);
        let e = reply.expect_err("the closing wait is refused");
        assert_eq!(e, expected_text(&ring_links(n)), "{n} owners");
        if n == 20 {
            assert_eq!(deadlock_links(&e).map(|l| l.len()), Some(20), "{e}");
        }
    }
}

#[test]
fn a_ring_with_many_dead_end_branches_is_refused_exactly_and_a_broken_one_waits() {
    // 20 ring owners each waiting in 3 queues, 40 branch owners waiting, 40 dead ends: more
    // than 16 owners and locks reached before the ring closes (the search's map is hashed).
    let (reply, _waits) = ring(20, 2, None);
    assert_eq!(reply.expect_err("refused"), expected_text(&ring_links(20)));
    for broken in [0, 9, 18] {
        let (reply, _waits) = ring(20, 2, Some(broken));
        assert!(matches!(reply, Ok(Value::Int(_))), "no cycle without o{broken}'s wait: {reply:?}");
    }
}
