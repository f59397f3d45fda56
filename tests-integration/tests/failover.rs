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
use rlock_tests_integration::lock_client::sentinel_client;
use rlock_tests_integration::{
    is_master, poll, wait_link_up, wait_replica_online, Sentinel, Server, SENTINEL_MASTER,
};

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
    let paused = Instant::now();
    group.wait_failover(port);
    eprintln!("pause: a replica promoted after {:?}", paused.elapsed());
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
    let killed = Instant::now();
    group.wait_failover(port);
    eprintln!("kill: a replica promoted after {:?}", killed.elapsed());
    group.servers[old].restart_same_port();
}

/// The crash-restart nemesis: the master killed and restarted from its AOF on its port `delay` after,
/// just before `down-after-milliseconds`. Probes the restarted master with fresh acquires (one
/// lock name each, so every grant it would make shows) until Sentinel demotes it, watching the
/// replicas' roles; returns (the probes' answers, when a replica was first seen promoted, when
/// the old master last granted), times since the restart.
fn crash_restart_nemesis(
    group: &mut Group,
    delay: Duration,
) -> (Probes, Option<Duration>, Option<Duration>) {
    let old = group.master_index();
    group.servers[old].kill();
    thread::sleep(delay);
    group.servers[old].restart_same_port();
    let restarted = Instant::now();
    let (mut probes, mut promoted, mut last_grant) = (Probes::default(), None, None);
    let mut con = group.servers[old].conn();
    con.set_read_timeout(Some(Duration::from_secs(2))).expect("timeout");
    let mut n = 0;
    while restarted.elapsed() < FAILOVER_LIMIT && (is_master(&group.servers[old]) || n == 0) {
        for _ in 0..10 {
            n += 1;
            let reply = probe_acquire(&format!("crash-{n}"), &format!("crash-{n}")).query(&mut con);
            let before = probes.granted;
            probes.count(&reply);
            if probes.granted > before {
                last_grant = Some(restarted.elapsed());
            }
        }
        if promoted.is_none()
            && group.servers.iter().enumerate().any(|(i, s)| i != old && is_master(s))
        {
            promoted = Some(restarted.elapsed());
        }
        // Promoted, and the old master demoted or given 8 s; or no failover within 10 s.
        let watched = promoted.unwrap_or(Duration::from_secs(2)) + Duration::from_secs(8);
        if restarted.elapsed() > watched {
            break;
        }
    }
    (probes, promoted, last_grant)
}

/// A master killed and restarted around Sentinel's down-after grants nothing while Sentinel
/// promotes another (the restart's quarantine and the count in `rlock-had-replicas` refuse),
/// not as soon as one replica re-synced from it. Timing-dependent (whether Sentinel fails over
/// at all depends on when it sees the master back), so not in `make test`; the deterministic
/// tests are in `crash_restart.rs`. Run it with
/// `cargo test -p rlock-tests-integration --test failover -- --ignored`
/// (`RLOCK_CRASH_DELAY_MS`, default 1100 with down-after 1000: Sentinel, which reconnects and
/// pings every few hundred ms, sees a restart at 900 to 1000 ms in time here, and fails over at
/// 1100; without the quarantine, one run granted 3,214 probes until 1.2 s after the restart,
/// beside the replica promoted 0.26 s after it).
#[test]
#[ignore = "a timing-dependent Sentinel run of a master's crash and restart"]
fn a_master_restarted_just_before_down_after_grants_nothing_beside_a_promoted_replica() {
    let delay = std::env::var("RLOCK_CRASH_DELAY_MS").ok().and_then(|d| d.parse().ok());
    let mut group = Group::start();
    let (probes, promoted, last_grant) =
        crash_restart_nemesis(&mut group, Duration::from_millis(delay.unwrap_or(1_100)));
    eprintln!(
        "crash-restart: {probes:?}, a replica promoted {promoted:?} and the old master's last \
         grant {last_grant:?} after the restart"
    );
    if promoted.is_some() {
        assert_eq!(probes.granted, 0, "the restarted old master granted beside a promoted replica");
    } else {
        eprintln!("crash-restart: Sentinel saw the master back in time: no failover to check");
    }
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
        let since = Instant::now();
        poll(what, FAILOVER_LIMIT, || (granted() >= before + 20).then_some(()));
        eprintln!("{what}: 20 grants within {:?}", since.elapsed());
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

// ---- the module's guard, one behaviour at a time ------------------------------------------------

fn run_str(con: &mut redis::Connection, args: &[&str]) -> Result<Value, String> {
    rlock_tests_integration::run_str(con, args)
}

fn refused(reply: &Result<Value, String>) -> bool {
    matches!(reply, Err(e) if e.starts_with("NOREPLICAS "))
}

fn info(con: &mut redis::Connection, field: &str) -> i64 {
    rlock_tests_integration::info_field(con, "rlock_replicas", field)
}

/// Starts a replica of `master` and waits until the master's module counts it in sync.
fn attach_replica(master: &Server, con: &mut redis::Connection) -> Server {
    let replica = Server::builder().replica_of(master).start();
    rlock_tests_integration::wait_replica_online(master);
    poll("the master to count its replica", FAILOVER_LIMIT, || {
        (info(con, "rlock_replicas_in_sync") == 1).then_some(())
    });
    replica
}

#[test]
fn a_master_that_lost_its_replica_grants_nothing_until_it_is_back_and_can_opt_out() {
    let master = Server::start();
    let mut con = master.conn();
    assert_eq!(info(&mut con, "rlock_replicas_required"), 0, "standalone: no replica needed");
    run_str(&mut con, &["RLOCK.ACQUIRE", "held", "a", "60000"]).expect("standalone grants");

    let mut replica = attach_replica(&master, &mut con);
    assert_eq!(info(&mut con, "rlock_replicas_required"), 1, "auto: one, once one was online");
    // A waiter queued while all is well.
    let waiter = rlock_tests_integration::Pending::start_str(
        &master,
        &["RLOCK.ACQUIRE", "held", "w", "60000", "WAIT", "60000"],
    );
    poll("the waiter to block", FAILOVER_LIMIT, || {
        (rlock_tests_integration::blocked_clients(&mut con) == 1).then_some(())
    });

    replica.kill();
    poll("the master to refuse grants", FAILOVER_LIMIT, || {
        refused(&run_str(&mut con, &["RLOCK.ACQUIRE", "other", "b", "60000"])).then_some(())
    });
    assert!(refused(&run_str(&mut con, &["RLOCK.RENEW", "held", "a", "60000"])), "no renewal");
    assert!(refused(&run_str(&mut con, &["RLOCK.ACQUIRE", "held", "a", "60000"])), "no re-entry");
    assert_eq!(info(&mut con, "rlock_grants_allowed"), 0);
    // Releasing still works, but the lock is not handed to the waiter while the master is stale.
    assert_eq!(run_str(&mut con, &["RLOCK.RELEASE", "held", "a"]), Ok(Value::Int(1)));
    thread::sleep(Duration::from_millis(300)); // a hand-off, were it wrongly allowed, is immediate
    assert!(!waiter.replied(), "no hand-off from a master that lost its replicas");
    assert_eq!(rlock_tests_integration::hgetall(&mut con, b"held"), vec![]);

    // The replica comes back: the held-back waiter is served.
    replica.restart_same_port();
    let (reply, _) = waiter.reply(FAILOVER_LIMIT);
    assert_eq!(reply, Ok(Value::Nil), "the waiter got the lock once the replica was back");

    // The explicit opt-out.
    replica.kill();
    poll("the master to refuse grants again", FAILOVER_LIMIT, || {
        refused(&run_str(&mut con, &["RLOCK.ACQUIRE", "other", "b", "60000"])).then_some(())
    });
    run_str(&mut con, &["CONFIG", "SET", "rlock.min-replicas", "0"]).expect("CONFIG SET");
    assert_eq!(run_str(&mut con, &["RLOCK.ACQUIRE", "other", "b", "60000"]), Ok(Value::Nil));
    assert!(info(&mut con, "rlock_grants_refused") >= 4);
    let err = run_str(&mut con, &["CONFIG", "SET", "rlock.min-replicas", "-2"]).expect_err("-2");
    assert!(err.starts_with("ERR"), "{err}");
}

#[test]
fn a_master_cut_off_from_its_replica_stops_granting_within_the_lag_bound() {
    let master = Server::start();
    let mut con = master.conn();
    let replica = attach_replica(&master, &mut con);
    // The replica stops acknowledging but keeps its connection (a partition that drops
    // packets): its lag grows past rlock.replica-max-lag (2 s).
    replica.pause();
    let cut = Instant::now();
    let refused_after = poll("the master to refuse grants", FAILOVER_LIMIT, || {
        refused(&run_str(&mut con, &["RLOCK.ACQUIRE", "l", "a", "60000"])).then(|| cut.elapsed())
    });
    replica.resume();
    // Sentinel's down-after must be longer than this (README recommends 5 s or more).
    assert!(refused_after <= Duration::from_millis(5_000), "refused only after {refused_after:?}");
    poll("grants once the replica acknowledges again", FAILOVER_LIMIT, || {
        (run_str(&mut con, &["RLOCK.ACQUIRE", "l", "a", "60000"]) == Ok(Value::Nil)).then_some(())
    });
}

#[test]
fn an_explicit_minimum_in_the_config_file_covers_a_restarted_master() {
    // `rlock.min-replicas 1` next to `loadmodule`: a master restarted before its replicas
    // reconnect (or one that never had any) grants nothing.
    let server = Server::builder().config("rlock.min-replicas", "1").start();
    let mut con = server.conn();
    assert!(refused(&run_str(&mut con, &["RLOCK.ACQUIRE", "l", "a", "60000"])));
    assert_eq!(info(&mut con, "rlock_replicas_required"), 1);
    let replica = Server::builder().replica_of(&server).start();
    rlock_tests_integration::wait_replica_online(&server);
    poll("grants once the replica is in sync", FAILOVER_LIMIT, || {
        (run_str(&mut con, &["RLOCK.ACQUIRE", "l", "a", "60000"]) == Ok(Value::Nil)).then_some(())
    });
    drop(replica);
}

#[test]
fn a_master_that_stalled_refuses_what_it_read_meanwhile_and_waits_out_a_quarantine() {
    let master = Server::start();
    let mut con = master.conn();
    let _replica = attach_replica(&master, &mut con);
    // An acquire that sits in the socket while the master is stopped (its replica stays
    // connected: only the master stalled).
    let mut queued = master.conn();
    master.pause();
    let sender = thread::spawn(move || {
        let reply = run_str(&mut queued, &["RLOCK.ACQUIRE", "l", "q", "60000"]);
        (reply, Instant::now())
    });
    thread::sleep(Duration::from_millis(2_000));
    let resumed = Instant::now();
    master.resume();
    let (reply, _) = sender.join().expect("sender");
    assert!(refused(&reply), "the queued acquire is refused: {reply:?}");
    // Refused for the quarantine (longer than the lag bound), then granted again.
    let granted_at = poll("grants after the quarantine", FAILOVER_LIMIT, || {
        (run_str(&mut con, &["RLOCK.ACQUIRE", "l", "a", "60000"]) == Ok(Value::Nil))
            .then(Instant::now)
    });
    let quarantine = granted_at - resumed;
    assert!(quarantine >= Duration::from_millis(3_000), "quarantine too short: {quarantine:?}");
}

// ---- the client ---------------------------------------------------------------------------------

/// With `replica_ack`, a renewal the replica did not acknowledge (a failover could undo it:
/// the new master would have the older lease) pushes no deadline; acknowledged ones do again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_replica_ack_a_renewal_the_replica_did_not_acknowledge_pushes_no_deadline() {
    let master = Server::start();
    let replica = Server::builder().replica_of(&master).start();
    wait_link_up(&mut replica.conn());
    wait_replica_online(&master);
    // A 3 s lease renewed every second; the master counts a replica in sync for 2 s after its
    // last acknowledgement, so it accepts renewals for a while after the replica stops.
    let options = Options::default()
        .watchdog_timeout(Duration::from_secs(3))
        .replica_ack(1, Duration::from_secs(1));
    let client = LockClient::with_options(master.client(), options).await.expect("client");
    let guard = client.lock("l").acquire(None).await.expect("acquire");
    let first = guard.valid_until().expect("valid");
    tokio::time::sleep(Duration::from_millis(1_300)).await;
    let pushed = guard.valid_until().expect("valid");
    assert!(pushed > first, "acknowledged renewals push the deadline");
    replica.pause();
    let frozen = guard.valid_until().expect("valid");
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    let unacknowledged = guard.valid_until();
    replica.resume();
    assert_eq!(
        unacknowledged,
        Some(frozen),
        "a renewal while the replica was stopped (accepted by the master, not acknowledged) \
         pushed the deadline"
    );
    tokio::task::block_in_place(|| {
        poll("an acknowledged renewal to push the deadline again", Duration::from_secs(10), || {
            guard.valid_until().filter(|u| *u > frozen)
        })
    });
    guard.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guard_counts_its_hold_lost_at_its_lease_end_on_its_own_clock() {
    let server = Server::start();
    let client = LockClient::open(server.url()).await.expect("client");
    let asked = tokio::time::Instant::now();
    let guard = client.lock("l").acquire(Some(Duration::from_millis(400))).await.expect("acquire");
    let until = guard.valid_until().expect("valid");
    assert!(
        until >= asked + Duration::from_millis(400) && until <= asked + Duration::from_millis(450)
    );
    assert!(!guard.is_lost());
    // Nobody can be asked (the server is stopped): the lease end alone makes it lost.
    server.pause();
    tokio::time::timeout(Duration::from_secs(2), guard.lost()).await.expect("lost reported");
    let at = tokio::time::Instant::now();
    server.resume();
    assert!(at >= until, "not before the lease end");
    assert!(guard.is_lost());
    assert!(guard.valid_until().is_none() || guard.valid_until() <= Some(at));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watchdog_guard_that_cannot_renew_is_lost_when_its_last_confirmed_lease_ends() {
    let server = Server::start();
    // A 3 s lease: renewed every second.
    let options = Options::default().watchdog_timeout(Duration::from_secs(3));
    let client = LockClient::with_options(server.client(), options).await.expect("client");
    let guard = client.lock("l").acquire(None).await.expect("acquire");
    // Renewals confirmed for a while: the deadline moves on.
    let first = guard.valid_until().expect("valid");
    tokio::time::sleep(Duration::from_millis(1_300)).await;
    assert!(!guard.is_lost());
    let pushed = guard.valid_until().expect("valid");
    assert!(pushed > first, "confirmed renewals push the deadline");
    // The server stalls: no renewal is confirmed; lost at the last confirmed deadline, not a
    // renewal period (1 s) later. The bound is half a period: what a loaded 2-core machine
    // guarantees (CI once measured 302 ms with a 300 ms bound and a 300 ms period).
    server.pause();
    let deadline = guard.valid_until().expect("valid");
    tokio::time::timeout(Duration::from_secs(6), guard.lost()).await.expect("lost reported");
    let at = tokio::time::Instant::now();
    server.resume();
    assert!(at >= deadline, "not before the deadline");
    assert!(at <= deadline + Duration::from_millis(500), "promptly: {:?} late", at - deadline);
    drop(guard);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_client_follows_a_manual_failover() {
    let master = Server::start();
    let replica = Server::builder().replica_of(&master).start();
    wait_link_up(&mut replica.conn());
    let sentinel = Sentinel::start(&master, 1, 5_000);
    let client = sentinel_client(&sentinel).await;
    let guard =
        client.lock("before").acquire(Some(Duration::from_secs(30))).await.expect("acquire");
    guard.release().await.expect("release");
    sentinel.fail_over_to(&replica, FAILOVER_LIMIT);
    poll("the old master to be demoted", FAILOVER_LIMIT, || (!is_master(&master)).then_some(()));
    // The next acquire reaches the new master (the old one answers READONLY, then is left).
    let guard = poll_async_acquire(&client, "after").await;
    let held = rlock_tests_integration::hgetall(&mut replica.conn(), b"after");
    assert_eq!(held.len(), 1, "the hold is on the promoted replica");
    guard.release().await.expect("release");
}

async fn poll_async_acquire(client: &LockClient, name: &str) -> rlock_client::LockGuard {
    let until = tokio::time::Instant::now() + FAILOVER_LIMIT;
    loop {
        match client
            .lock(name)
            .try_acquire(Duration::from_secs(1), Some(Duration::from_secs(30)))
            .await
        {
            Ok(guard) => return guard,
            Err(e) => {
                assert!(tokio::time::Instant::now() < until, "no acquire after failover: {e}")
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_aof_acknowledgement_is_required_where_the_server_offers_waitaof() {
    let server = Server::builder().config("appendonly", "yes").start();
    let mut con = server.conn();
    let has_waitaof = matches!(
        redis::cmd("COMMAND").arg("INFO").arg("WAITAOF").query::<Vec<Value>>(&mut con).as_deref(),
        Ok([Value::Array(_)])
    );
    let options = Options::default().aof_ack(true, 0, Duration::from_secs(3));
    let client = LockClient::with_options(server.client(), options).await.expect("client");
    let result = client.lock("l").acquire(Some(Duration::from_secs(30))).await;
    if has_waitaof {
        result.expect("fsynced on the master").release().await.expect("release");
        // Replicas that do not exist cannot fsync it: refused, and nothing stays held.
        let options = Options::default().aof_ack(true, 1, Duration::from_millis(200));
        let client = LockClient::with_options(server.client(), options).await.expect("client");
        let result = client.lock("l").acquire(Some(Duration::from_secs(30))).await;
        assert!(
            matches!(result, Err(Error::NotPersisted { local: (true, _), replicas: (1, 0) })),
            "{result:?}"
        );
    } else {
        // Redis 7.0: no WAITAOF; the acquire fails with the server's error.
        assert!(matches!(result, Err(Error::Redis(_))), "{result:?}");
    }
    assert_eq!(rlock_tests_integration::hgetall(&mut con, b"l"), vec![], "nothing stays held");
}

#[test]
fn module_arguments_set_the_settings_and_an_unknown_one_refuses_the_load() {
    let server = Server::builder().without_module().config("enable-module-command", "yes").start();
    let mut con = server.conn();
    let module = rlock_tests_integration::module_path();
    let module = module.to_string_lossy();
    // The prefixed name (a config-file spelling) is not an argument: refused, not ignored.
    let err = run_str(&mut con, &["MODULE", "LOAD", &module, "rlock.min-replicas", "1"])
        .expect_err("refused");
    assert!(err.starts_with("ERR"), "{err}");
    let err =
        run_str(&mut con, &["MODULE", "LOAD", &module, "min-replicas"]).expect_err("no value");
    assert!(err.starts_with("ERR"), "{err}");
    assert!(server.log().contains("unknown module argument"), "the log says why");
    run_str(&mut con, &["MODULE", "LOAD", &module, "min-replicas", "1", "replica-max-lag", "5"])
        .expect("loaded");
    let got: Vec<String> =
        redis::cmd("CONFIG").arg("GET").arg("rlock.*").query(&mut con).expect("CONFIG GET");
    let pairs: Vec<(&str, &str)> = got.chunks(2).map(|p| (p[0].as_str(), p[1].as_str())).collect();
    assert!(pairs.contains(&("rlock.min-replicas", "1")), "{pairs:?}");
    assert!(pairs.contains(&("rlock.replica-max-lag", "5")), "{pairs:?}");
    assert!(refused(&run_str(&mut con, &["RLOCK.ACQUIRE", "l", "a", "60000"])));
}
