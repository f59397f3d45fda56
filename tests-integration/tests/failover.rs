//! Failover: a master, two replicas and three Sentinels on loopback, all with rlock's default
//! settings (no `min-replicas-*`, no `rlock.min-replicas`), a workload of fencing clients in
//! Sentinel mode, and a nemesis that pauses the master past a failover (SIGSTOP, then SIGCONT
//! while Sentinel has already promoted a replica) or kills it (SIGKILL, then a restart).
//!
//! Checked, per run:
//! - **a stale master grants nothing**: acquires that sat in the old master's sockets during the
//!   pause, and fresh acquires sent to it after it resumed, until Sentinel demotes it: 0 grants;
//! - **tokens never repeat or go backwards**: per lock name, in the order the grants were
//!   received, tokens strictly increase (across both nemeses);
//! - **no acknowledged lock is lost**: a holder whose grant reached every replica (`WAIT 2`)
//!   and who releases before its lease ends (on its own monotonic clock) finds it still held;
//! - **no overlap**: per lock name, the hold of each lease-respecting client (from its grant's
//!   reply to its release or its lease end, whichever is first) ends before the next begins.
//!
//! CI runs one round of each nemesis; `make failover` runs `RLOCK_FAILOVER_ROUNDS` (default 3)
//! rounds of each.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use redis::Value;
use rlock_client::{Error, LockClient, Options};
use rlock_tests_integration::{is_master, poll, wait_link_up, Sentinel, Server, SENTINEL_MASTER};

const NAMES: [&str; 3] = ["L0", "L1", "L2"];
const WORKERS: usize = 6;
const LEASE: Duration = Duration::from_secs(4);
const DOWN_AFTER_MS: u64 = 1_000;
const FAILOVER_LIMIT: Duration = Duration::from_secs(40);

/// A grant the workload received, on its monotonic clock.
#[derive(Debug, Clone)]
struct Grant {
    name: &'static str,
    token: u64,
    /// When the reply arrived.
    start: Instant,
    /// The release's send time or the lease's end, whichever came first.
    end: Instant,
}

#[derive(Default)]
struct Record {
    grants: Mutex<Vec<Grant>>,
    /// Releases sent within the lease that found the lock not held.
    lost: AtomicU64,
    /// Failed attempts by kind (printed: how the failover looked to clients).
    errors: Mutex<std::collections::BTreeMap<String, u64>>,
}

impl Record {
    fn failed(&self, e: &Error) {
        let kind = match e {
            Error::Redis(e) => e.code().map_or_else(|| format!("{:?}", e.kind()), str::to_owned),
            other => format!("{other}").split(':').next().unwrap_or_default().to_owned(),
        };
        *self.errors.lock().expect("errors").entry(kind).or_default() += 1;
    }
}

struct Group {
    servers: Vec<Server>,
    sentinels: Vec<Sentinel>,
}

impl Group {
    fn start() -> Self {
        let aof = |b: rlock_tests_integration::Builder| {
            b.config("appendonly", "yes").config("appendfsync", "everysec")
        };
        let master = aof(Server::builder()).start();
        let replicas: Vec<Server> =
            (0..2).map(|_| aof(Server::builder().replica_of(&master)).start()).collect();
        for replica in &replicas {
            wait_link_up(&mut replica.conn());
        }
        let sentinels: Vec<Sentinel> =
            (0..3).map(|_| Sentinel::start(&master, 2, DOWN_AFTER_MS)).collect();
        let mut servers = vec![master];
        servers.extend(replicas);
        let group = Self { servers, sentinels };
        group.wait_settled();
        group
    }

    /// Every Sentinel agrees on the master, which has both replicas online, and knows the
    /// other Sentinels.
    fn wait_settled(&self) {
        poll("the group to settle", FAILOVER_LIMIT, || {
            let port = self.sentinels[0].master_port();
            for sentinel in &self.sentinels {
                let mut con = redis::Client::open(sentinel.url()).ok()?.get_connection().ok()?;
                let info: String = redis::cmd("INFO").arg("sentinel").query(&mut con).ok()?;
                let expected = format!("address=127.0.0.1:{port},slaves=2,sentinels=3");
                if !info.contains(&expected) || !info.contains("status=ok") {
                    return None;
                }
            }
            let master = self.servers.iter().find(|s| s.port() == port)?;
            let mut con = master.conn();
            let info: String = redis::cmd("INFO").arg("replication").query(&mut con).ok()?;
            (info.matches("state=online").count() == 2).then_some(())
        });
    }

    fn master_index(&self) -> usize {
        let port = self.sentinels[0].master_port();
        self.servers.iter().position(|s| s.port() == port).expect("the master is one of ours")
    }

    /// Waits until the Sentinels name another master than `old`'s port.
    fn wait_failover(&self, old: u16) {
        poll("a replica to be promoted", FAILOVER_LIMIT, || {
            self.sentinels.iter().all(|s| s.master_port() != old).then_some(())
        });
    }

    fn sentinel_urls(&self) -> Vec<String> {
        self.sentinels.iter().map(Sentinel::url).collect()
    }
}

/// What the old master answered to acquires sent to it.
#[derive(Debug, Default)]
struct Probes {
    granted: u64,
    noreplicas: u64,
    other: u64,
}

impl Probes {
    fn count(&mut self, reply: &redis::RedisResult<Value>) {
        match reply {
            Ok(Value::Nil) => self.granted += 1,
            Ok(Value::Array(parts)) if parts.first() == Some(&Value::Int(1)) => self.granted += 1,
            Err(e) if e.code() == Some("NOREPLICAS") => self.noreplicas += 1,
            _ => self.other += 1,
        }
    }
}

fn probe_acquire(owner: &str, name: &str) -> redis::Cmd {
    let mut cmd = redis::cmd("RLOCK.ACQUIRE");
    cmd.arg(name).arg(owner).arg(30_000).arg("TOKEN");
    cmd
}

/// Pauses the master past a failover and probes it when it resumes; returns what it answered
/// (to acquires queued in its sockets while stopped, and to fresh ones until it is demoted).
fn pause_nemesis(group: &Group) -> (Probes, Probes) {
    let old = group.master_index();
    let port = group.servers[old].port();
    // Connections opened before the pause: their acquires sit in the socket while it is stopped.
    let queued: Vec<_> = (0..4).map(|_| group.servers[old].conn()).collect();
    group.servers[old].pause();
    let handles: Vec<_> = queued
        .into_iter()
        .enumerate()
        .map(|(i, mut con)| {
            thread::spawn(move || {
                con.set_read_timeout(Some(Duration::from_secs(60))).expect("timeout");
                probe_acquire(&format!("queued-{i}"), NAMES[i % NAMES.len()])
                    .query::<Value>(&mut con)
            })
        })
        .collect();
    group.wait_failover(port);
    group.servers[old].resume();
    let mut fresh = Probes::default();
    let until = Instant::now() + FAILOVER_LIMIT;
    let mut n = 0;
    while is_master(&group.servers[old]) && Instant::now() < until {
        if let Ok(mut con) =
            group.servers[old].client().get_connection_with_timeout(Duration::from_millis(500))
        {
            let _ = con.set_read_timeout(Some(Duration::from_secs(2)));
            for name in NAMES {
                n += 1;
                fresh.count(&probe_acquire(&format!("fresh-{n}"), name).query(&mut con));
            }
        }
        thread::sleep(Duration::from_millis(5));
    }
    let mut stale = Probes::default();
    for handle in handles {
        stale.count(&handle.join().expect("probe thread"));
    }
    (stale, fresh)
}

/// Kills the master, waits for the failover, and restarts it (from its AOF, on its port), as
/// an operator or a supervisor would; Sentinel then turns it into a replica.
fn kill_nemesis(group: &mut Group) {
    let old = group.master_index();
    let port = group.servers[old].port();
    group.servers[old].kill();
    group.wait_failover(port);
    group.servers[old].restart_same_port();
}

async fn worker(client: LockClient, record: Arc<Record>, stop: Arc<AtomicBool>, seed: usize) {
    let mut i = seed;
    while !stop.load(Ordering::Relaxed) {
        i += 1;
        let name = NAMES[i % NAMES.len()];
        let lock = client.lock(name);
        let guard = match lock.try_acquire(Duration::from_secs(2), Some(LEASE)).await {
            Ok(guard) => guard,
            Err(e) => {
                record.failed(&e);
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
        };
        let start = Instant::now();
        let token = guard.token().expect("fencing is on");
        let valid_until = guard.valid_until().expect("just granted").into_std();
        tokio::time::sleep(Duration::from_millis(15)).await;
        let sent = Instant::now();
        let released = guard.release().await;
        if sent < valid_until && matches!(released, Err(Error::NotHeld)) {
            record.lost.fetch_add(1, Ordering::Relaxed);
        }
        let end = sent.min(valid_until);
        record.grants.lock().expect("grants").push(Grant { name, token, start, end });
    }
}

/// The checks on the grants: per name, by arrival, tokens strictly increase and holds do not
/// overlap.
fn check_grants(grants: &[Grant]) {
    for name in NAMES {
        let mut of_name: Vec<&Grant> = grants.iter().filter(|g| g.name == name).collect();
        of_name.sort_by_key(|g| g.start);
        for pair in of_name.windows(2) {
            let (a, b) = (pair[0], pair[1]);
            assert!(
                b.token > a.token,
                "{name}: token {} received after token {} (repeated or backwards)",
                b.token,
                a.token
            );
            assert!(a.end <= b.start, "{name}: the hold with token {} overlaps the next", a.token);
        }
    }
}

fn run_rounds(rounds: usize) {
    let mut group = Group::start();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let options = Options::default().fencing(true).replica_ack(2, Duration::from_millis(500));
    let client = runtime
        .block_on(LockClient::sentinel(
            group.sentinel_urls(),
            SENTINEL_MASTER,
            "redis://127.0.0.1/",
            options,
        ))
        .expect("a Sentinel client");
    let record = Arc::new(Record::default());
    let stop = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = (0..WORKERS)
        .map(|seed| {
            runtime.spawn(worker(client.clone(), Arc::clone(&record), Arc::clone(&stop), seed))
        })
        .collect();
    let granted = || record.grants.lock().expect("grants").len();
    let progress = |what: &str| {
        let before = granted();
        poll(what, FAILOVER_LIMIT, || (granted() >= before + 20).then_some(()));
    };
    progress("grants before any nemesis");
    for round in 0..rounds {
        let (stale, fresh) = pause_nemesis(&group);
        eprintln!("round {round}, pause: queued acquires {stale:?}, fresh acquires {fresh:?}");
        assert_eq!(stale.granted + fresh.granted, 0, "the paused old master granted");
        assert!(stale.noreplicas > 0, "queued acquires reached the old master: {stale:?}");
        group.wait_settled();
        progress("grants on the new master after the pause");

        kill_nemesis(&mut group);
        group.wait_settled();
        progress("grants on the new master after the kill");
    }
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        runtime.block_on(w).expect("worker");
    }
    let grants = record.grants.lock().expect("grants").clone();
    eprintln!(
        "{} grants, failed attempts {:?}, {} lost",
        grants.len(),
        record.errors.lock().expect("errors"),
        record.lost.load(Ordering::Relaxed)
    );
    assert_eq!(record.lost.load(Ordering::Relaxed), 0, "acknowledged locks were lost");
    check_grants(&grants);
}

#[test]
fn a_paused_or_killed_master_is_replaced_without_split_brain_grants_or_repeated_tokens() {
    let rounds = std::env::var("RLOCK_FAILOVER_ROUNDS").ok().and_then(|r| r.parse().ok());
    run_rounds(rounds.unwrap_or(1));
}
