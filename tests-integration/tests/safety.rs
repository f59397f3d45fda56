//! Safety under faults: idempotent release, random input against a live server, holders and
//! servers killed, paused writes, promotion.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use redis::Value;
use rlock_client::{Error, LockClient, Options, Remaining};
use rlock_tests_integration::{
    blocked_clients, cmd, hgetall, poll, run, run_checked, run_str, wait_replica_online, Pending,
    Server,
};

const LIMIT: Duration = Duration::from_secs(10);

#[test]
fn a_retried_release_replies_the_first_result_and_never_releases_twice() {
    let server = Server::start();
    let mut con = server.conn();
    cmd(&mut con, &["RLOCK.ACQUIRE", "l", "a", "30000"]);
    cmd(&mut con, &["RLOCK.ACQUIRE", "l", "a", "30000"]);
    assert_eq!(cmd(&mut con, &["RLOCK.RELEASE", "l", "a", "REQUEST", "r1"]), Value::Int(0));
    assert_eq!(
        cmd(&mut con, &["RLOCK.RELEASE", "l", "a", "REQUEST", "r1"]),
        Value::Int(0),
        "retry"
    );
    assert_eq!(hgetall(&mut con, b"l"), vec![(b"a".to_vec(), b"1".to_vec())], "released once");
    assert_eq!(cmd(&mut con, &["RLOCK.RELEASE", "l", "a", "5000", "REQUEST", "r2"]), Value::Int(1));
    assert_eq!(cmd(&mut con, &["EXISTS", "l"]), Value::Int(0));
    // The retry of the release that freed it still says 1, not "not held".
    assert_eq!(cmd(&mut con, &["RLOCK.RELEASE", "l", "a", "REQUEST", "r2"]), Value::Int(1));
    // Without a request id, or with another one, it is simply not held.
    assert_eq!(cmd(&mut con, &["RLOCK.RELEASE", "l", "a"]), Value::Nil);
    assert_eq!(cmd(&mut con, &["RLOCK.RELEASE", "l", "a", "REQUEST", "r3"]), Value::Nil);
    // The result is remembered where Redisson keeps it, for a short window.
    let latch = "redisson_unlock_latch:{l}:r2";
    assert_eq!(cmd(&mut con, &["GET", latch]), Value::BulkString(b"1".to_vec()));
    assert!(matches!(cmd(&mut con, &["PTTL", latch]), Value::Int(n) if n > 9_000 && n <= 10_000));
    cmd(&mut con, &["PEXPIRE", latch, "1"]); // the window ends
    poll("the latch to expire", LIMIT, || {
        (cmd(&mut con, &["EXISTS", latch]) == Value::Int(0)).then_some(())
    });
    assert_eq!(cmd(&mut con, &["RLOCK.RELEASE", "l", "a", "REQUEST", "r2"]), Value::Nil);

    for (args, err) in [
        (&["RLOCK.RELEASE", "l", "a", "REQUEST"][..], "ERR request id is missing after REQUEST"),
        (
            &["RLOCK.RELEASE", "l", "a", "REQUEST", ""],
            "ERR request id (after REQUEST) must not be empty",
        ),
        (&["RLOCK.RELEASE", "l", "a", "REQUEST", "x", "y"], "ERR syntax error"),
        (&["RLOCK.RELEASE", "l", "a", "x", "REQUEST", "y"], "ERR lease-ms is not an integer"),
    ] {
        assert_eq!(run_str(&mut con, args), Err(err.to_owned()), "{args:?}");
    }
}

use rlock_tests_integration::Rng;

fn random_arg(rng: &mut Rng) -> Vec<u8> {
    let pool: [&[u8]; 29] = [
        b"",
        b"k",
        b"a",
        b"b",
        b"0",
        b"1",
        b"-1",
        b"100",
        b"30000",
        b"+5",
        b" 5",
        b"1.5",
        b"9223372036854775807",
        b"9223372036854775808",
        b"-9223372036854775808",
        b"99999999999999999999",
        b"WAIT",
        b"wait",
        b"TOKEN",
        b"REQUEST",
        b"NOWAIT",
        b"READ",
        b"write",
        b"mode",
        b"LEASE",
        b"ID",
        b"\0",
        b"k\0\xff",
        b"\xff\xfe",
    ];
    match rng.below(10) {
        0 => (0..rng.below(64)).map(|_| rng.next_u64() as u8).collect(),
        1 => vec![b'x'; rng.below(100_000)],
        _ => pool[rng.below(pool.len())].to_vec(),
    }
}

/// The parser under fire: random argument vectors (mostly malformed). Every reply is a reply or
/// a coded error, an error changes nothing (digests around it in one `MULTI`), and the server
/// survives. The model-checked run of mostly valid commands with faults is `tests/fuzz.rs`.
#[test]
fn random_argument_vectors_get_replies_or_errors_that_change_nothing() {
    let server = Server::start();
    let mut con = server.conn();
    con.set_read_timeout(Some(LIMIT)).expect("timeout");
    let commands: [&[u8]; 19] = [
        b"RLOCK.ACQUIRE",
        b"RLOCK.CANCEL",
        b"RLOCK.RELEASE",
        b"RLOCK.RENEW",
        b"RLOCK.PTTL",
        b"RLOCK.FORCERELEASE",
        b"RLOCK.INFO",
        b"RWLOCK.ACQUIRE",
        b"RWLOCK.RELEASE",
        b"RWLOCK.RENEW",
        b"RWLOCK.FORCERELEASE",
        b"RWLOCK.INFO",
        b"RSEM.SETPERMITS",
        b"RSEM.ADDPERMITS",
        b"RSEM.ACQUIRE",
        b"RSEM.RELEASE",
        b"RSEM.AVAILABLE",
        b"RSEM.INFO",
        b"RSEM.RENEW",
    ];
    let seed = rlock_tests_integration::fuzz_seed();
    eprintln!("seed {seed} (replay with RLOCK_FUZZ_SEED={seed})");
    let mut rng = Rng(seed);
    let (mut ok, mut errors) = (0, 0);
    for i in 0..20_000 {
        let mut args = vec![commands[rng.below(commands.len())].to_vec()];
        for _ in 0..rng.below(8) {
            args.push(random_arg(&mut rng));
        }
        let argv: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
        let at = || format!("seed {seed}, command {i}: {argv:?}");
        let (reply, changed) =
            run_checked(&mut con, &argv).unwrap_or_else(|e| panic!("{}: server gone: {e}", at()));
        match reply {
            Ok(_) => ok += 1,
            Err(e) => {
                assert!(
                    ["ERR ", "WRONGTYPE "].iter().any(|code| e.starts_with(code)),
                    "{}: unexpected error {e}",
                    at()
                );
                assert!(!changed, "{}: replied {e} yet changed the dataset", at());
                errors += 1;
            }
        }
    }
    eprintln!("20000 random commands: {ok} replies, {errors} errors");
    assert!(ok > 500 && errors > 1_000, "both paths exercised");
    assert_eq!(cmd(&mut con, &["PING"]), Value::SimpleString("PONG".into()));
    assert!(!server.log().contains("panicked"), "{}", server.log());
}

#[test]
fn a_killed_holder_process_frees_the_lock_within_its_lease_and_the_waiter_is_served() {
    let server = Server::start();
    let mut holder = Command::new(env!("CARGO_BIN_EXE_lock_worker"))
        .args(["hold", &server.url(), "l", "500"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("holder process");
    let mut line = String::new();
    BufReader::new(holder.stdout.take().expect("stdout")).read_line(&mut line).expect("held");
    assert_eq!(line.trim(), "held");
    let mut con = server.conn();
    // Only the module's timer can free the lock (Redis's active expiry is off).
    cmd(&mut con, &["DEBUG", "SET-ACTIVE-EXPIRE", "0"]);
    let deadline = redis::cmd("PEXPIRETIME").arg("l").query::<i64>(&mut con).expect("expiry");
    let waiter = Pending::start_str(&server, &["RLOCK.ACQUIRE", "l", "next", "30000", "WAIT", "0"]);
    poll("the waiter", LIMIT, || (blocked_clients(&mut con) == 1).then_some(()));
    holder.kill().expect("kill -9 the holder");
    let _ = holder.wait();
    assert_eq!(waiter.reply(LIMIT).0, Ok(Value::Nil));
    let granted_at =
        redis::cmd("PEXPIRETIME").arg("l").query::<i64>(&mut con).expect("expiry") - 30_000;
    assert!(
        (0..=1_000).contains(&(granted_at - deadline)),
        "served {} ms after the lease",
        granted_at - deadline
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_killed_and_restarted_from_aof_keeps_locks_leases_and_tokens() {
    let mut server =
        Server::builder().config("appendonly", "yes").config("appendfsync", "always").start();
    let options = Options::default().fencing(true);
    let client = LockClient::with_options(server.client(), options).await.expect("client");
    let a = client.lock("l").acquire(Some(Duration::from_secs(60))).await.expect("A");
    let token_a = a.token().expect("token");
    let waiter = client.lock("l");
    let waiting =
        tokio::spawn(async move { waiter.try_acquire(Duration::from_secs(30), None).await });
    let mut con = server.conn();
    poll("the waiter", LIMIT, || (blocked_clients(&mut con) == 1).then_some(()));
    let expiry = redis::cmd("PEXPIRETIME").arg("l").query::<i64>(&mut con).expect("expiry");
    drop(con);

    server.restart_same_port(); // SIGKILL, then from the AOF
    let mut con = server.conn();
    assert_eq!(
        redis::cmd("PEXPIRETIME").arg("l").query::<i64>(&mut con).expect("expiry"),
        expiry,
        "the lease came back"
    );
    assert_eq!(hgetall(&mut con, b"l"), vec![(a.owner().as_bytes().to_vec(), b"1".to_vec())]);
    // The waiter's connection died with the server: a lost connection is no answer, its wait
    // is sent again (same request id) to the restarted server, and queued there.
    poll("the waiter to wait again", LIMIT, || (blocked_clients(&mut con) == 1).then_some(()));
    assert!(!waiting.is_finished(), "{:?}", waiting.await);
    // The clients reconnect: the holder releases, the waiter is served with a larger token.
    a.release().await.expect("release after the restart");
    let waited = tokio::time::timeout(LIMIT, waiting).await.expect("answered").expect("task");
    let w = waited.expect("the waiter, served after the release");
    assert!(w.token().expect("token") > token_a);
    w.release().await.expect("release");
    let b = client.lock("l").acquire(Some(Duration::from_secs(60))).await.expect("B");
    assert!(b.token().expect("token") > token_a);
    b.release().await.expect("release");
}

#[test]
fn client_pause_write_delays_releases_and_hand_offs_without_losing_them() {
    let server = Server::start();
    let mut con = server.conn();
    cmd(&mut con, &["RLOCK.ACQUIRE", "l", "a", "30000"]);
    let waiter = Pending::start_str(&server, &["RLOCK.ACQUIRE", "l", "b", "30000", "WAIT", "0"]);
    poll("the waiter", LIMIT, || (blocked_clients(&mut con) == 1).then_some(()));
    cmd(&mut con, &["CLIENT", "PAUSE", "300", "WRITE"]);
    let paused_at = Instant::now();
    let release = Pending::start_str(&server, &["RLOCK.RELEASE", "l", "a"]);
    let (released, at) = release.reply(LIMIT);
    assert_eq!(released, Ok(Value::Int(1)));
    assert!(at - paused_at >= Duration::from_millis(250), "the release waited for the pause");
    assert_eq!(waiter.reply(LIMIT).0, Ok(Value::Nil));
    assert_eq!(hgetall(&mut con, b"l"), vec![(b"b".to_vec(), b"1".to_vec())]);
    // Read-only commands run during a write pause.
    cmd(&mut con, &["CLIENT", "PAUSE", "3000", "WRITE"]);
    let started = Instant::now();
    assert!(matches!(cmd(&mut con, &["RLOCK.PTTL", "l"]), Value::Int(n) if n > 0));
    assert!(started.elapsed() < Duration::from_millis(2000), "PTTL waited for the pause");
    cmd(&mut con, &["CLIENT", "UNPAUSE"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_promoted_while_locks_are_held_keeps_them_and_grants_after_them() {
    let master = Server::start();
    let replica = Server::builder().replica_of(&master).start();
    let mut r = replica.conn();
    wait_replica_online(&master);
    // Acknowledged by the replica before it is reported held (Redis WAIT on the writer's
    // connection): so the promotion cannot race replication.
    let options = Options::default().replica_ack(1, Duration::from_secs(5));
    let client = LockClient::with_options(master.client(), options).await.expect("client");
    let held = client.lock("l").acquire(Some(Duration::from_secs(60))).await.expect("held");
    let mut m = master.conn();
    cmd(&mut r, &["REPLICAOF", "NO", "ONE"]);
    cmd(&mut m, &["REPLICAOF", "127.0.0.1", &replica.port().to_string()]);
    // On the promoted replica the lock is still held, with its lease.
    assert_eq!(hgetall(&mut r, b"l"), vec![(held.owner().as_bytes().to_vec(), b"1".to_vec())]);
    let other = LockClient::new(replica.client()).await.expect("client on the new master");
    let refused = other.lock("l").try_acquire(Duration::from_millis(100), None).await;
    assert!(matches!(refused, Err(Error::TimedOut)), "{refused:?}");
    assert!(matches!(other.lock("l").remaining_lease().await.expect("pttl"), Remaining::Lease(_)));
    std::mem::forget(held);
}

/// The live module against a reference model of one lock (Redisson's semantics; leases long
/// enough not to expire during the run), over random operation sequences on a few keys: with
/// fencing tokens, release request ids (and their retries) and locks planted with no expiry.
#[test]
fn random_operations_on_the_live_module_agree_with_a_reference_model() {
    use std::collections::HashMap;
    let server = Server::start();
    let mut con = server.conn();
    // key -> (owner, count, has an expiry)
    let mut model: HashMap<&str, (String, i64, bool)> = HashMap::new();
    let mut tokens: HashMap<&str, i64> = HashMap::new();
    let mut latches: HashMap<(&str, String), i64> = HashMap::new();
    let mut last_request: HashMap<&str, String> = HashMap::new();
    let seed = rlock_tests_integration::fuzz_seed();
    eprintln!("seed {seed} (replay with RLOCK_FUZZ_SEED={seed})");
    let mut rng = Rng(seed);
    let keys = ["k1", "k2", "k\0"];
    let owners = ["a", "b", "c\0"];
    for i in 0..20_000 {
        let key = keys[rng.below(keys.len())];
        let owner = owners[rng.below(owners.len())];
        let op = rng.below(7);
        let token = rng.below(2) == 0;
        let request = match rng.below(3) {
            0 => None,
            1 => last_request.get(key).cloned(), // a retry of the last release with an id
            _ => Some(format!("r{i}")),
        };
        let (args, want): (Vec<Vec<u8>>, Value) = match op {
            0 | 1 => {
                let granted = match model.get_mut(key) {
                    None => {
                        model.insert(key, (owner.to_owned(), 1, true));
                        true
                    }
                    Some((o, n, expiring)) if o == owner => {
                        *n += 1;
                        *expiring = true;
                        true
                    }
                    Some(_) => false,
                };
                let busy_pttl = match model.get(key) {
                    Some((_, _, false)) => -1,
                    _ => -99, // any positive pttl
                };
                let want = match (granted, token) {
                    (true, false) => Value::Nil,
                    (true, true) => {
                        let t = tokens.entry(key).or_insert(0);
                        *t += 1;
                        Value::Array(vec![Value::Int(1), Value::Int(*t)])
                    }
                    (false, false) => Value::Int(busy_pttl),
                    (false, true) => Value::Array(vec![Value::Int(0), Value::Int(busy_pttl)]),
                };
                let mut args =
                    vec![b"RLOCK.ACQUIRE".to_vec(), key.into(), owner.into(), b"600000".to_vec()];
                if token {
                    args.push(b"TOKEN".to_vec());
                }
                (args, want)
            }
            2 | 3 => {
                let remembered = request.as_ref().and_then(|r| latches.get(&(key, r.clone())));
                let want = match remembered {
                    Some(&first) => Value::Int(first),
                    None => match model.get_mut(key) {
                        Some((o, n, _)) if o == owner && *n > 1 => {
                            *n -= 1;
                            Value::Int(0)
                        }
                        Some((o, _, _)) if o == owner => {
                            model.remove(key);
                            Value::Int(1)
                        }
                        _ => Value::Nil,
                    },
                };
                let mut args = vec![b"RLOCK.RELEASE".to_vec(), key.into(), owner.into()];
                if let Some(r) = &request {
                    if let Value::Int(result) = want {
                        latches.insert((key, r.clone()), result);
                    }
                    last_request.insert(key, r.clone());
                    args.extend([b"REQUEST".to_vec(), r.as_bytes().to_vec()]);
                }
                (args, want)
            }
            4 => {
                let held = match model.get_mut(key) {
                    Some((o, _, expiring)) if o == owner => {
                        *expiring = true;
                        true
                    }
                    _ => false,
                };
                (
                    vec![b"RLOCK.RENEW".to_vec(), key.into(), owner.into(), b"600000".to_vec()],
                    Value::Int(i64::from(held)),
                )
            }
            5 if !model.contains_key(key) => {
                // A lock planted by hand, with no expiry (as a lock whose PEXPIRE was lost).
                model.insert(key, (owner.to_owned(), 1, false));
                (vec![b"HSET".to_vec(), key.into(), owner.into(), b"1".to_vec()], Value::Int(1))
            }
            _ => {
                let existed = model.remove(key).is_some();
                (vec![b"RLOCK.FORCERELEASE".to_vec(), key.into()], Value::Int(i64::from(existed)))
            }
        };
        let argv: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
        let got = run(&mut con, &argv).unwrap_or_else(|e| panic!("seed {seed} op {i}: {e}"));
        let positive = |v: &Value| matches!(v, Value::Int(n) if *n > 0);
        match (&want, &got) {
            (Value::Int(-99), got) => {
                assert!(positive(got), "seed {seed} op {i} {argv:?}: {got:?}")
            }
            (Value::Array(w), Value::Array(g)) if w.get(1) == Some(&Value::Int(-99)) => {
                assert!(g[0] == Value::Int(0) && positive(&g[1]), "seed {seed} op {i}: {got:?}");
            }
            (want, got) => assert_eq!(got, want, "seed {seed} op {i} {argv:?}"),
        }
        if i % 1_000 == 0 {
            for key in keys {
                let stored = hgetall(&mut con, key.as_bytes());
                let modelled: Vec<(Vec<u8>, Vec<u8>)> = model
                    .get(key)
                    .map(|(o, n, _)| vec![(o.as_bytes().to_vec(), n.to_string().into_bytes())])
                    .unwrap_or_default();
                assert_eq!(stored, modelled, "seed {seed}: after op {i}, {key:?}");
            }
        }
    }
}
