//! The module on every node of a 3-master Redis Cluster.

use std::time::Duration;

use redis::{Connection, Value};
use rlock_tests_integration::{
    cmd, granted_token, hgetall, pexpiretime, poll, run_str, valkey_major, Cluster, Pending,
};

const LIMIT: Duration = Duration::from_secs(10);

#[test]
fn the_module_computes_key_slots_as_the_cluster_does() {
    let cluster = Cluster::start(3);
    let mut keys: Vec<Vec<u8>> = (0..300).map(|i| format!("lock:{i}").into_bytes()).collect();
    keys.extend([
        b"{user1000}.following".to_vec(),
        b"foo{}bar".to_vec(),
        b"foo{}{bar}".to_vec(),
        b"a{b".to_vec(),
        b"a}b".to_vec(),
        b"{}".to_vec(),
        b"a{b}c{d}".to_vec(),
        b"bin\0\xff{tag}".to_vec(),
        Vec::new(),
    ]);
    for key in keys {
        assert_eq!(rlock::cluster::key_slot(&key), cluster.slot(&key), "{key:?}");
    }
}

#[test]
fn the_command_contract_holds_on_every_node_and_keys_route_by_slot() {
    let cluster = Cluster::start(3);
    for (i, node) in cluster.nodes.iter().enumerate() {
        let key = cluster.key_on(i, "lock:");
        let mut con = node.conn();
        assert_eq!(cmd(&mut con, &["RLOCK.ACQUIRE", &key, "a", "30000"]), Value::Nil);
        assert_eq!(cmd(&mut con, &["RLOCK.ACQUIRE", &key, "a", "30000"]), Value::Nil);
        assert!(
            matches!(cmd(&mut con, &["RLOCK.ACQUIRE", &key, "b", "30000"]), Value::Int(n) if n > 0)
        );
        assert!(matches!(cmd(&mut con, &["RLOCK.PTTL", &key]), Value::Int(n) if n > 0));
        assert!(matches!(cmd(&mut con, &["RLOCK.INFO", &key]), Value::Array(_)));
        assert_eq!(cmd(&mut con, &["RLOCK.RENEW", &key, "a", "30000"]), Value::Int(1));
        assert_eq!(cmd(&mut con, &["RLOCK.RELEASE", &key, "a"]), Value::Int(0));
        assert_eq!(cmd(&mut con, &["RLOCK.RELEASE", &key, "a"]), Value::Int(1));
        assert_eq!(cmd(&mut con, &["RLOCK.ACQUIRE", &key, "a", "30000"]), Value::Nil);
        assert_eq!(cmd(&mut con, &["RLOCK.FORCERELEASE", &key]), Value::Int(1));
        // Any other node redirects, as for any key command.
        let other = &cluster.nodes[(i + 1) % 3];
        let err =
            run_str(&mut other.conn(), &["RLOCK.ACQUIRE", &key, "a", "30000"]).expect_err("moved");
        let slot = cluster.slot(key.as_bytes());
        assert_eq!(err, format!("MOVED {slot} 127.0.0.1:{}", node.port()));
    }
}

/// Reads one pushed message from a connection subscribed with SSUBSCRIBE.
fn next_push(con: &mut Connection) -> Vec<Vec<u8>> {
    let value = con.recv_response().expect("a pushed message");
    let Value::Array(parts) = value else { panic!("push: {value:?}") };
    parts.into_iter().map(|p| redis::from_redis_value(p).expect("bytes")).collect()
}

#[test]
fn a_release_reaches_sharded_subscribers_of_the_lock_slot() {
    let cluster = Cluster::start(3);
    for i in 0..3 {
        let key = cluster.key_on(i, "pub:");
        let channel = format!("redisson_lock__channel:{{{key}}}");
        let node = &cluster.nodes[i];
        let mut sub = node.conn();
        sub.set_read_timeout(Some(LIMIT)).expect("timeout");
        let _: Value = redis::cmd("SSUBSCRIBE").arg(&channel).query(&mut sub).expect("ssubscribe");
        let mut con = node.conn();
        cmd(&mut con, &["RLOCK.ACQUIRE", &key, "a", "30000"]);
        assert_eq!(cmd(&mut con, &["RLOCK.RELEASE", &key, "a"]), Value::Int(1));
        let msg = next_push(&mut sub);
        assert_eq!(msg, vec![b"smessage".to_vec(), channel.into_bytes(), b"0".to_vec()]);
    }
}

#[test]
fn waiting_hands_off_on_every_node() {
    let cluster = Cluster::start(3);
    for (i, node) in cluster.nodes.iter().enumerate() {
        let key = cluster.key_on(i, "wait:");
        let mut con = node.conn();
        cmd(&mut con, &["RLOCK.ACQUIRE", &key, "a", "30000"]);
        let waiter = Pending::start_str(node, &["RLOCK.ACQUIRE", &key, "b", "30000", "WAIT", "0"]);
        poll("the waiter", LIMIT, || {
            (rlock_tests_integration::blocked_clients(&mut con) == 1).then_some(())
        });
        assert_eq!(cmd(&mut con, &["RLOCK.RELEASE", &key, "a"]), Value::Int(1));
        assert_eq!(waiter.reply(LIMIT).0, Ok(Value::Nil));
        assert_eq!(hgetall(&mut con, key.as_bytes()), vec![(b"b".to_vec(), b"1".to_vec())]);
    }
}

#[test]
fn a_waiter_whose_slot_moves_away_is_redirected_not_left_hanging() {
    let cluster = Cluster::start(3);
    let key = cluster.key_on(0, "moving:");
    let slot = cluster.slot(key.as_bytes());
    let node = &cluster.nodes[0];
    let mut con = node.conn();
    cmd(&mut con, &["RLOCK.ACQUIRE", &key, "holder", "60000"]);
    let waiter = Pending::start_str(node, &["RLOCK.ACQUIRE", &key, "waiter", "30000", "WAIT", "0"]);
    poll("the waiter", LIMIT, || {
        (rlock_tests_integration::blocked_clients(&mut con) == 1).then_some(())
    });

    cluster.move_slot(slot, 0, 1);
    let (reply, _) = waiter.reply(LIMIT);
    let err = reply.expect_err("redirected");
    let target = format!("{slot} 127.0.0.1:{}", cluster.nodes[1].port());
    assert!(err == format!("MOVED {target}") || err == format!("ASK {target}"), "{err}");
    // The lock moved with its holder; nothing was granted on the old node.
    let mut new_owner = cluster.nodes[1].conn();
    assert_eq!(hgetall(&mut new_owner, key.as_bytes()), vec![(b"holder".to_vec(), b"1".to_vec())]);
    assert_eq!(rlock_tests_integration::blocked_clients(&mut con), 0);
}

#[test]
fn a_waiter_whose_node_dies_gets_an_error() {
    let mut cluster = Cluster::start(3);
    let key = cluster.key_on(2, "dying:");
    let mut con = cluster.nodes[2].conn();
    cmd(&mut con, &["RLOCK.ACQUIRE", &key, "holder", "60000"]);
    let waiter = Pending::start_str(
        &cluster.nodes[2],
        &["RLOCK.ACQUIRE", &key, "waiter", "30000", "WAIT", "0"],
    );
    poll("the waiter", LIMIT, || {
        (rlock_tests_integration::blocked_clients(&mut con) == 1).then_some(())
    });
    cluster.nodes[2].kill();
    let (reply, _) = waiter.reply(LIMIT);
    assert!(reply.is_err(), "{reply:?}");
}

async fn cluster_client(cluster: &Cluster) -> rlock_client::LockClient {
    let urls: Vec<String> =
        cluster.nodes.iter().map(rlock_tests_integration::Server::url).collect();
    rlock_client::LockClient::cluster(urls, rlock_client::Options::default())
        .await
        .expect("cluster client")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_locks_and_waits_on_keys_of_every_node() {
    let cluster = Cluster::start(3);
    let client = cluster_client(&cluster).await;
    for i in 0..3 {
        let key = cluster.key_on(i, "client:");
        let lock = client.lock(&key);
        let guard = lock.acquire(Some(Duration::from_secs(30))).await.expect("acquire");
        assert_eq!(lock.hold_count().await.expect("count"), 1);
        assert!(matches!(
            lock.remaining_lease().await.expect("pttl"),
            rlock_client::Remaining::Lease(_)
        ));
        let holder = hgetall(&mut cluster.nodes[i].conn(), key.as_bytes());
        assert_eq!(holder, vec![(guard.owner().as_bytes().to_vec(), b"1".to_vec())], "on node {i}");

        let waiter = client.lock(&key);
        let waiting = tokio::spawn(async move {
            waiter.try_acquire(Duration::from_secs(20), Some(Duration::from_secs(30))).await
        });
        let mut con = cluster.nodes[i].conn();
        poll("the waiter blocked on its node", LIMIT, || {
            (rlock_tests_integration::blocked_clients(&mut con) == 1).then_some(())
        });
        guard.release().await.expect("release");
        let granted = tokio::time::timeout(LIMIT, waiting).await.expect("granted").expect("task");
        granted.expect("acquired").release().await.expect("release");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_incrementing_under_cluster_locks_lose_nothing() {
    const TASKS: usize = 4;
    const INCREMENTS: usize = 25;
    let cluster = Cluster::start(3);
    let client = cluster_client(&cluster).await;
    let keys: Vec<String> = (0..3).map(|i| cluster.key_on(i, "counted:")).collect();
    let mut tasks = Vec::new();
    for _ in 0..TASKS {
        for key in &keys {
            let lock = client.lock(key);
            let node = cluster.nodes[cluster.node_of(key.as_bytes())].client();
            let counter = format!("{{{key}}}:counter");
            tasks.push(tokio::spawn(async move {
                let mut con = node.get_multiplexed_async_connection().await.expect("con");
                for _ in 0..INCREMENTS {
                    let guard = lock.acquire(Some(Duration::from_secs(10))).await.expect("acquire");
                    let v: Option<i64> =
                        redis::cmd("GET").arg(&counter).query_async(&mut con).await.expect("get");
                    tokio::task::yield_now().await;
                    let () = redis::cmd("SET")
                        .arg(&counter)
                        .arg(v.unwrap_or(0) + 1)
                        .query_async(&mut con)
                        .await
                        .expect("set");
                    guard.release().await.expect("release");
                }
            }));
        }
    }
    for t in tasks {
        tokio::time::timeout(Duration::from_secs(120), t)
            .await
            .expect("no deadlock")
            .expect("task");
    }
    for key in &keys {
        let node = &cluster.nodes[cluster.node_of(key.as_bytes())];
        let total: i64 = redis::cmd("GET")
            .arg(format!("{{{key}}}:counter"))
            .query(&mut node.conn())
            .expect("get");
        assert_eq!(total, (TASKS * INCREMENTS) as i64, "{key}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_wait_follows_its_lock_when_the_slot_moves() {
    let cluster = Cluster::start(3);
    let client = cluster_client(&cluster).await;
    let key = cluster.key_on(0, "follow:");
    let slot = cluster.slot(key.as_bytes());
    let holder = client.lock(&key);
    let guard = holder.acquire(Some(Duration::from_secs(60))).await.expect("holder");
    let waiter = client.lock(&key);
    let waiting = tokio::spawn(async move {
        waiter.try_acquire(Duration::from_secs(30), Some(Duration::from_secs(30))).await
    });
    let mut old = cluster.nodes[0].conn();
    poll("the waiter on the old node", LIMIT, || {
        (rlock_tests_integration::blocked_clients(&mut old) == 1).then_some(())
    });
    cluster.move_slot(slot, 0, 1);
    let mut new = cluster.nodes[1].conn();
    poll("the waiter on the new node", LIMIT, || {
        (rlock_tests_integration::blocked_clients(&mut new) == 1).then_some(())
    });
    guard.release().await.expect("the holder releases on the new node");
    let granted = tokio::time::timeout(LIMIT, waiting).await.expect("granted").expect("task");
    let granted = granted.expect("acquired after the move");
    assert_eq!(
        hgetall(&mut new, key.as_bytes()),
        vec![(granted.owner().as_bytes().to_vec(), b"1".to_vec())]
    );
    granted.release().await.expect("release");
}

/// Every key of every node hashes to a slot that node serves.
fn assert_no_foreign_keys(cluster: &Cluster) {
    for (i, node) in cluster.nodes.iter().enumerate() {
        let keys: Vec<Vec<u8>> = redis::cmd("KEYS").arg("*").query(&mut node.conn()).expect("KEYS");
        for key in keys {
            assert_eq!(
                cluster.node_of(&key),
                i,
                "node {i} holds {:?}",
                String::from_utf8_lossy(&key)
            );
        }
    }
}

#[test]
fn braced_names_keep_every_derived_key_and_channel_in_the_lock_slot() {
    let cluster = Cluster::start(3);
    for i in 0..3 {
        let tag = cluster.key_on(i, "t");
        let node = &cluster.nodes[i];
        let mut con = node.conn();
        for name in [format!("{{{tag}}}:lock"), format!("orders{{{tag}}}"), format!("{{{tag}}}")] {
            let channel = format!("redisson_lock__channel:{name}");
            let mut sub = node.conn();
            sub.set_read_timeout(Some(LIMIT)).expect("timeout");
            let _: Value =
                redis::cmd("SSUBSCRIBE").arg(&channel).query(&mut sub).expect("ssubscribe");
            let token = cmd(&mut con, &["RLOCK.ACQUIRE", &name, "a", "30000", "TOKEN"]);
            assert_eq!(token, Value::Array(vec![Value::Int(1), Value::Int(1)]), "{name}");
            let waiter = Pending::start_str(
                node,
                &["RLOCK.ACQUIRE", &name, "b", "30000", "WAIT", "0", "TOKEN"],
            );
            poll("the waiter", LIMIT, || {
                (rlock_tests_integration::blocked_clients(&mut con) == 1).then_some(())
            });
            assert_eq!(
                cmd(&mut con, &["RLOCK.RELEASE", &name, "a", "REQUEST", "r1"]),
                Value::Int(1)
            );
            assert_eq!(waiter.reply(LIMIT).0, Ok(Value::Array(vec![Value::Int(1), Value::Int(2)])));
            assert_eq!(
                cmd(&mut con, &["RLOCK.RELEASE", &name, "b", "REQUEST", "r2"]),
                Value::Int(1)
            );
            let msg = next_push(&mut sub);
            assert_eq!(msg, vec![b"smessage".to_vec(), channel.into_bytes(), b"0".to_vec()]);
        }
    }
    assert_no_foreign_keys(&cluster);
    let check = std::process::Command::new(rlock_tests_integration::cli_binary())
        .args(["--cluster", "check", &format!("127.0.0.1:{}", cluster.nodes[0].port())])
        .output()
        .expect("redis-cli --cluster check");
    let out = String::from_utf8_lossy(&check.stdout);
    assert!(check.status.success() && out.contains("[OK] All 16384 slots covered"), "{out}");
    assert!(!out.contains("[WARNING]") && !out.contains("[ERR]"), "{out}");
}

#[test]
fn names_whose_braces_form_no_tag_refuse_derived_keys_rather_than_cross_slots() {
    let cluster = Cluster::start(3);
    for name in ["a{b", "a}b", "x{}y"] {
        let node = &cluster.nodes[cluster.node_of(name.as_bytes())];
        let mut con = node.conn();
        for args in [
            &["RLOCK.ACQUIRE", name, "a", "30000", "TOKEN"][..],
            &["RLOCK.RELEASE", name, "a", "REQUEST", "r"],
            &["RLOCK.ACQUIRE", name, "a", "30000", "REQUEST", "r"],
            &["RWLOCK.ACQUIRE", name, "a", "READ", "30000", "WAIT", "0", "REQUEST", "r"],
            &["RSEM.ACQUIRE", name, "1", "REQUEST", "r"],
            &["RLOCK.CANCEL", name, "r"],
        ] {
            let err = run_str(&mut con, args).expect_err("cross-slot");
            assert!(err.starts_with("ERR") && err.contains("slot"), "{args:?}: {err}");
        }
        // The lock itself works.
        assert_eq!(cmd(&mut con, &["RLOCK.ACQUIRE", name, "a", "30000"]), Value::Nil);
        assert_eq!(cmd(&mut con, &["RLOCK.RELEASE", name, "a"]), Value::Int(1));
    }
    assert_no_foreign_keys(&cluster);
}

/// An acquire's request record lives in its lock's slot (Redisson's prefix rule, braced names
/// included), for every kind, on every node; a retry and a cancel find it there.
#[test]
fn request_records_live_in_their_lock_slot_on_every_node() {
    let cluster = Cluster::start(3);
    for i in 0..3 {
        let tag = cluster.key_on(i, "q");
        let mut con = cluster.nodes[i].conn();
        // Plain names (the record wraps them in braces) and braced ones (kept as they are).
        let plain = |prefix: &str| cluster.key_on(i, prefix);
        for (name, sem, rw) in [
            (plain("l"), plain("s"), plain("w")),
            (format!("{{{tag}}}:l"), format!("{{{tag}}}:s"), format!("{{{tag}}}:w")),
            (format!("l{{{tag}}}"), format!("s{{{tag}}}"), format!("w{{{tag}}}")),
        ] {
            for key in [&name, &sem, &rw] {
                assert_eq!(cluster.node_of(key.as_bytes()), i, "{key}");
            }
            cmd(&mut con, &["RSEM.SETPERMITS", &sem, "2"]);
            for args in [
                &["RLOCK.ACQUIRE", &name, "o", "30000", "TOKEN", "REQUEST", "r"][..],
                &["RLOCK.ACQUIRE", &name, "o", "30000", "TOKEN", "REQUEST", "r"],
                &["RSEM.ACQUIRE", &sem, "1", "REQUEST", "r"],
                &["RSEM.ACQUIRE", &sem, "1", "LEASE", "30000", "REQUEST", "l"],
                &["RWLOCK.ACQUIRE", &rw, "o", "READ", "30000", "REQUEST", "r"],
            ] {
                let reply = cmd(&mut con, args);
                assert!(!matches!(reply, Value::Int(0)), "{args:?}: {reply:?}");
            }
            for (key, id) in [(&name, "r"), (&sem, "r"), (&sem, "l"), (&rw, "r")] {
                assert_eq!(cmd(&mut con, &["RLOCK.CANCEL", key, id]), Value::Int(2), "{key} {id}");
            }
            assert_eq!(cmd(&mut con, &["EXISTS", &name]), Value::Int(0));
            assert_eq!(cmd(&mut con, &["EXISTS", &rw]), Value::Int(0));
            assert_eq!(cmd(&mut con, &["GET", &sem]), Value::BulkString(b"2".to_vec()));
            // Any other node redirects a cancel, as any key command.
            let other = &cluster.nodes[(i + 1) % 3];
            let err = run_str(&mut other.conn(), &["RLOCK.CANCEL", &name, "r"]).expect_err("moved");
            assert!(err.starts_with("MOVED"), "{err}");
        }
        let records: Vec<Vec<u8>> =
            redis::cmd("KEYS").arg("rlock_request:*").query(&mut con).expect("KEYS");
        assert_eq!(records.len(), 12, "three names of each kind, four records each");
    }
    assert_no_foreign_keys(&cluster);
}

#[test]
fn a_waiter_whose_slot_is_served_by_nobody_gets_clusterdown_from_the_sweep() {
    let cluster = Cluster::start(3);
    let key = cluster.key_on(0, "down:");
    let slot = cluster.slot(key.as_bytes()).to_string();
    let node = &cluster.nodes[0];
    let mut con = node.conn();
    cmd(&mut con, &["RLOCK.ACQUIRE", &key, "holder", "60000"]);
    let waiter = Pending::start_str(node, &["RLOCK.ACQUIRE", &key, "w", "30000", "WAIT", "0"]);
    poll("the waiter", LIMIT, || {
        (rlock_tests_integration::blocked_clients(&mut con) == 1).then_some(())
    });
    // Nothing happens to the lock itself: only the periodic sweep can notice.
    cmd(&mut con, &["CLUSTER", "DELSLOTS", &slot]);
    let (reply, _) = waiter.reply(LIMIT);
    assert!(reply.as_ref().is_err_and(|e| e.starts_with("CLUSTERDOWN")), "{reply:?}");
}

#[test]
fn a_random_run_on_braced_and_odd_names_leaves_no_key_in_a_foreign_slot() {
    let cluster = Cluster::start(3);
    let seed = rlock_tests_integration::fuzz_seed();
    eprintln!("seed {seed} (replay with RLOCK_FUZZ_SEED={seed})");
    let mut rng = rlock_tests_integration::Rng(seed);
    let mut names: Vec<String> = Vec::new();
    for i in 0..3 {
        let tag = cluster.key_on(i, "t");
        names.extend([format!("{{{tag}}}:lock"), format!("orders{{{tag}}}"), format!("{{{tag}}}")]);
        names.push(cluster.key_on(i, "plain:"));
    }
    let odd = ["a{b", "a}b", "x{}y"];
    names.extend(odd.iter().map(|s| (*s).to_owned()));
    let mut cons: Vec<Connection> = cluster.nodes.iter().map(|n| n.conn()).collect();
    let mut waiters = Vec::new();
    for step in 0..600 {
        let name = names[rng.below(names.len())].clone();
        let node = cluster.node_of(name.as_bytes());
        let owner = ["a", "b", "c"][rng.below(3)];
        let lease = ["50", "300", "5000"][rng.below(3)];
        let request = format!("r{}", rng.below(5));
        let mut args: Vec<&str> = match rng.below(6) {
            0 | 1 => vec!["RLOCK.ACQUIRE", &name, owner, lease],
            2 | 3 => vec!["RLOCK.RELEASE", &name, owner],
            4 => vec!["RLOCK.RENEW", &name, owner, lease],
            _ => vec!["RLOCK.FORCERELEASE", &name],
        };
        let token = rng.below(2) == 0;
        match args[0] {
            "RLOCK.ACQUIRE" if token => args.push("TOKEN"),
            "RLOCK.RELEASE" if token => args.extend(["REQUEST", &request]),
            _ => {}
        }
        if args[0] == "RLOCK.ACQUIRE" && rng.below(4) == 0 && waiters.len() < 4 {
            args.extend(["WAIT", "200"]);
            waiters.push(Pending::start_str(&cluster.nodes[node], &args));
            continue;
        }
        match run_str(&mut cons[node], &args) {
            Ok(_) => {}
            Err(e) if odd.contains(&name.as_str()) && e.contains("slot") => {}
            Err(e) => panic!("seed {seed}, step {step}: {args:?}: {e}"),
        }
        waiters.retain(|w| !w.replied());
    }
    for w in waiters {
        let (reply, _) = w.reply(LIMIT);
        assert!(reply.is_ok() || reply.as_ref().is_err_and(|e| e.contains("slot")), "{reply:?}");
    }
    assert_no_foreign_keys(&cluster);
}

#[test]
fn tokens_and_latches_move_with_their_lock_when_its_slot_migrates() {
    let cluster = Cluster::start(3);
    let tag = cluster.key_on(0, "t");
    for name in [format!("{{{tag}}}:lock"), tag.clone()] {
        let slot = cluster.slot(name.as_bytes());
        let from = cluster.node_of(name.as_bytes());
        let to = (from + 1) % 3;
        let mut con = cluster.nodes[from].conn();
        let token = cmd(&mut con, &["RLOCK.ACQUIRE", &name, "a", "60000", "TOKEN"]);
        let Value::Array(first) = token else { panic!("{token:?}") };
        cmd(&mut con, &["RLOCK.ACQUIRE", &name, "a", "60000"]);
        assert_eq!(cmd(&mut con, &["RLOCK.RELEASE", &name, "a", "REQUEST", "r1"]), Value::Int(0));
        cluster.move_slot(slot, from, to);
        let mut con = cluster.nodes[to].conn();
        // The retry of the release finds its latch on the new node: not released twice.
        assert_eq!(cmd(&mut con, &["RLOCK.RELEASE", &name, "a", "REQUEST", "r1"]), Value::Int(0));
        assert_eq!(hgetall(&mut con, name.as_bytes()), vec![(b"a".to_vec(), b"1".to_vec())]);
        // Tokens go on from the counter that moved with the lock.
        let next = cmd(&mut con, &["RLOCK.ACQUIRE", &name, "a", "60000", "TOKEN"]);
        let Value::Array(next) = next else { panic!("{next:?}") };
        assert_eq!(first[1], Value::Int(1), "{name}");
        assert_eq!(next[1], Value::Int(2), "{name}: tokens go on after the move");
    }
}

// ---- Valkey 9 ------------------------------------------------------------------------------------

/// Whether the server under test is Valkey 9 or later (asked of a plain server, as some
/// cluster settings make other servers refuse to start); if not, says the test is skipped.
fn valkey_9(needs: &str) -> bool {
    let ok = valkey_major(&mut rlock_tests_integration::Server::start().conn())
        .is_some_and(|major| major >= 9);
    if !ok {
        eprintln!("skipped: {needs} needs Valkey 9");
    }
    ok
}

#[test]
fn an_atomic_slot_migration_moves_a_lock_with_its_token_and_latch_and_redirects_its_waiters() {
    if !valkey_9("CLUSTER MIGRATESLOTS") {
        return;
    }
    // The target is stopped below while the migration is under way: a node timeout longer than
    // any stall of a loaded machine keeps the cluster from marking it failed (the cluster would
    // go down, and the hand-off on the source with it).
    let cluster = Cluster::start_with(3, &[("cluster-node-timeout", "30000")]);
    let mut src = cluster.nodes[0].conn();
    let key = cluster.key_on(0, "asm:");
    let slot = cluster.slot(key.as_bytes());
    let t1 = granted_token(&cmd(&mut src, &["RLOCK.ACQUIRE", &key, "a", "60000", "TOKEN"]));
    assert_eq!(cmd(&mut src, &["RLOCK.RELEASE", &key, "a", "REQUEST", "r1"]), Value::Int(1));
    let t2 = granted_token(&cmd(&mut src, &["RLOCK.ACQUIRE", &key, "b", "60000", "TOKEN"]));
    assert!(t2 > t1);
    let expiry = pexpiretime(&mut src, key.as_bytes());
    // Queued one after the other, so w1 is the head of the line.
    let waiters: Vec<Pending> = ["w1", "w2"]
        .iter()
        .zip(1..)
        .map(|(w, queued)| {
            let waiter = Pending::start_str(
                &cluster.nodes[0],
                &["RLOCK.ACQUIRE", &key, w, "60000", "WAIT", "60000", "TOKEN"],
            );
            poll("the waiter to block", LIMIT, || {
                (rlock_tests_integration::blocked_clients(&mut src) == queued).then_some(())
            });
            waiter
        })
        .collect();

    // The module opted in: Valkey accepts the migration (it refuses while any module has not).
    // The target is stopped for a moment, so the migration is still under way when the lock is
    // released on the source: the hand-off to the first waiter happens there, mid-migration,
    // and must reach the target with the slot.
    let target = cluster.node_id(1);
    let slot_text = slot.to_string();
    cluster.nodes[1].pause();
    cmd(
        &mut src,
        &["CLUSTER", "MIGRATESLOTS", "SLOTSRANGE", &slot_text, &slot_text, "NODE", &target],
    );
    let migrating: Vec<Value> =
        redis::cmd("CLUSTER").arg("GETSLOTMIGRATIONS").query(&mut src).expect("migrations");
    assert!(!migrating.is_empty(), "a migration is under way");
    eprintln!("the migration when the lock is released: {migrating:?}");
    assert_eq!(cmd(&mut src, &["RLOCK.RELEASE", &key, "b"]), Value::Int(1));
    // The release handed the lock to w1 on the source, in the command itself. Its reply is
    // written in the source's next event loop, which may first wait on the stopped target (the
    // migration's connection): the target resumes before the reply is awaited.
    cluster.nodes[1].resume();
    let mut waiters = waiters.into_iter();
    let first = waiters.next().expect("w1");
    let (reply, _) = first.reply(LIMIT);
    let t_w1 = granted_token(&reply.expect("w1 granted on the source during the migration"));
    assert!(t_w1 > t2);
    poll("the target to own the slot", LIMIT, || {
        (cluster.node_of(key.as_bytes()) == 1).then_some(())
    });
    let moved_at = std::time::Instant::now();

    // The other waiter is sent to the new owner, promptly, never granted on the source.
    for waiter in waiters {
        let (reply, at) = waiter.reply(LIMIT);
        let err = reply.expect_err("redirected, not granted");
        assert!(
            err.starts_with(&format!("MOVED {slot} 127.0.0.1:{}", cluster.nodes[1].port())),
            "{err}"
        );
        assert!(at.saturating_duration_since(moved_at) < Duration::from_secs(1), "promptly");
    }
    // Lock, counter and latch arrived together on the target.
    let mut dst = cluster.nodes[1].conn();
    assert_eq!(hgetall(&mut dst, key.as_bytes()), vec![(b"w1".to_vec(), b"1".to_vec())]);
    assert!(pexpiretime(&mut dst, key.as_bytes()) > expiry, "w1's own lease came along");
    let counter = format!("redisson_lock_token:{{{key}}}");
    assert_eq!(cmd(&mut dst, &["GET", &counter]), Value::BulkString(t_w1.to_string().into_bytes()));
    assert_eq!(
        cmd(&mut dst, &["RLOCK.RELEASE", &key, "a", "REQUEST", "r1"]),
        Value::Int(1),
        "a retried release gets the first reply"
    );
    assert_eq!(cmd(&mut dst, &["RLOCK.FORCERELEASE", &key]), Value::Int(1));
    let t3 = granted_token(&cmd(&mut dst, &["RLOCK.ACQUIRE", &key, "c", "60000", "TOKEN"]));
    assert!(t3 > t_w1, "tokens keep increasing on the target: {t3} > {t_w1}");
    // The source trimmed the slot and grants nothing for it.
    poll("the source to trim the slot", LIMIT, || {
        let n: i64 = redis::cmd("CLUSTER").arg("COUNTKEYSINSLOT").arg(slot).query(&mut src).ok()?;
        (n == 0).then_some(())
    });
    let err = run_str(&mut src, &["RLOCK.ACQUIRE", &key, "x", "60000"]).expect_err("moved");
    assert!(err.starts_with("MOVED"), "{err}");
}

#[test]
fn numbered_databases_in_cluster_mode_keep_their_waiters_apart() {
    // Other servers refuse to start with `cluster-databases`.
    if !valkey_9("numbered databases in cluster mode") {
        return;
    }
    let cluster = Cluster::start_with(3, &[("cluster-databases", "4")]);
    let mut con = cluster.nodes[0].conn();
    let key = cluster.key_on(0, "db:");
    for db in ["0", "1"] {
        cmd(&mut con, &["SELECT", db]);
        cmd(&mut con, &["RLOCK.ACQUIRE", &key, &format!("holder{db}"), "60000"]);
    }
    // A waiter per database, each on a connection of its own (a blocking command cannot
    // SELECT first inside MULTI).
    let mut w0 = cluster.nodes[0].conn();
    let mut w1 = cluster.nodes[0].conn();
    cmd(&mut w1, &["SELECT", "1"]);
    let acquire = |w: &str| {
        let mut c = redis::cmd("RLOCK.ACQUIRE");
        c.arg(&key).arg(w).arg(60_000).arg("WAIT").arg(60_000);
        c
    };
    let (tx, rx) = std::sync::mpsc::channel();
    let (tx0, tx1) = (tx.clone(), tx);
    let a0 = acquire("waiter0");
    let a1 = acquire("waiter1");
    let h0 = std::thread::spawn(move || tx0.send(("db0", a0.query::<Value>(&mut w0))).ok());
    let h1 = std::thread::spawn(move || tx1.send(("db1", a1.query::<Value>(&mut w1))).ok());
    poll("both waiters to block", LIMIT, || {
        (rlock_tests_integration::blocked_clients(&mut con) == 2).then_some(())
    });
    // Releasing db 1's lock hands it to db 1's waiter only.
    cmd(&mut con, &["SELECT", "1"]);
    assert_eq!(cmd(&mut con, &["RLOCK.RELEASE", &key, "holder1"]), Value::Int(1));
    let (db, reply) = rx.recv_timeout(LIMIT).expect("a waiter answered");
    assert_eq!((db, reply.expect("granted")), ("db1", Value::Nil));
    assert_eq!(hgetall(&mut con, key.as_bytes()), vec![(b"waiter1".to_vec(), b"1".to_vec())]);
    assert!(rx.recv_timeout(Duration::from_millis(300)).is_err(), "db 0's waiter still waits");
    cmd(&mut con, &["SELECT", "0"]);
    assert_eq!(hgetall(&mut con, key.as_bytes()), vec![(b"holder0".to_vec(), b"1".to_vec())]);
    assert_eq!(cmd(&mut con, &["RLOCK.RELEASE", &key, "holder0"]), Value::Int(1));
    let (db, reply) = rx.recv_timeout(LIMIT).expect("db 0's waiter answered");
    assert_eq!((db, reply.expect("granted")), ("db0", Value::Nil));
    h0.join().expect("db0");
    h1.join().expect("db1");
}

#[test]
fn a_hand_off_while_an_atomic_migration_streams_reaches_the_target() {
    if !valkey_9("CLUSTER MIGRATESLOTS") {
        return;
    }
    let cluster = Cluster::start(3);
    let mut src = cluster.nodes[0].conn();
    let key = cluster.key_on(0, "stream:");
    let slot = cluster.slot(key.as_bytes());
    // Enough data in the slot (under the lock's hash tag) that the snapshot takes a while.
    let chunk = vec![b'x'; 4 << 20];
    for i in 0..60 {
        let filler = format!("{{{key}}}:filler:{i}");
        let () = redis::cmd("SET").arg(&filler).arg(&chunk).query(&mut src).expect("SET");
    }
    cmd(&mut src, &["RLOCK.ACQUIRE", &key, "holder", "60000", "TOKEN"]);
    let waiter = Pending::start_str(
        &cluster.nodes[0],
        &["RLOCK.ACQUIRE", &key, "w", "60000", "WAIT", "60000", "TOKEN"],
    );
    poll("the waiter to block", LIMIT, || {
        (rlock_tests_integration::blocked_clients(&mut src) == 1).then_some(())
    });
    let target = cluster.node_id(1);
    let slot_text = slot.to_string();
    cmd(
        &mut src,
        &["CLUSTER", "MIGRATESLOTS", "SLOTSRANGE", &slot_text, &slot_text, "NODE", &target],
    );
    // Release once the source is past connecting: the snapshot is being sent, or the stream of
    // later writes has begun.
    let state = poll("the migration to snapshot or stream", LIMIT, || {
        let jobs: Vec<std::collections::HashMap<String, Value>> =
            redis::cmd("CLUSTER").arg("GETSLOTMIGRATIONS").query(&mut src).ok()?;
        let state = match jobs.first()?.get("state")? {
            Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
            _ => return None,
        };
        // The fork sends the snapshot; writes made meanwhile are streamed after it.
        matches!(state.as_str(), "snapshotting" | "streaming" | "replicating" | "waiting-to-pause")
            .then_some(state)
    });
    assert_eq!(cmd(&mut src, &["RLOCK.RELEASE", &key, "holder"]), Value::Int(1));
    let (reply, _) = waiter.reply(LIMIT);
    let token = granted_token(&reply.expect("granted on the source while migrating"));
    eprintln!("handed off while the migration was {state:?}");
    assert_ne!(state, "success", "still migrating when released");
    poll("the target to own the slot", Duration::from_secs(60), || {
        (cluster.node_of(key.as_bytes()) == 1).then_some(())
    });
    let mut dst = cluster.nodes[1].conn();
    assert_eq!(hgetall(&mut dst, key.as_bytes()), vec![(b"w".to_vec(), b"1".to_vec())]);
    let counter = format!("redisson_lock_token:{{{key}}}");
    assert_eq!(
        cmd(&mut dst, &["GET", &counter]),
        Value::BulkString(token.to_string().into_bytes())
    );
}
