//! Cluster failover: 3 masters with a replica each (module on every node, rlock's default
//! settings), locks of every kind held and waited for on one shard while its master is
//! replaced, by three nemeses in turn:
//!
//! - **manual**: `CLUSTER FAILOVER` on the master's replica (a coordinated hand-over);
//! - **pause**: the master SIGSTOPped until the cluster has promoted its replica, then resumed
//!   (it rejoins as a replica of the new master);
//! - **kill**: the master SIGKILLed, its replica promoted, the old master restarted on its port
//!   (it rejoins as a replica).
//!
//! Checked, per nemesis:
//! - **no split-brain grant**: acquires (and releases, which would hand on) that sat in a
//!   paused master's sockets, a lease that ended during the pause, and fresh acquires sent to
//!   the old master until it is a replica: nothing granted (`NOREPLICAS`, `MOVED`); the
//!   waiters queued on the old master are answered (`UNBLOCKED`/`READONLY` when it turns
//!   replica, `MOVED`, a connection error when killed), none granted, none left hanging;
//! - **the state moved**: the holds and a hand-off (replicated before the nemesis, `WAIT 1`)
//!   are on the promoted node;
//! - **hand-offs resume** there: waiters queued on the new master are served when the holders
//!   release;
//! - **tokens are monotone**: per lock name strictly increasing over the whole run, and every
//!   token the new master grants is above every token the shard granted before the nemesis.
//!
//! CI runs one round of the three nemeses; `make failover` runs `RLOCK_FAILOVER_ROUNDS`.

use std::collections::BTreeMap;
use std::thread;
use std::time::{Duration, Instant};

use redis::{Connection, Value};
use rlock_tests_integration::{
    blocked_clients, granted_token, hgetall, info_field, is_master, poll, run_str, Cluster, Pending,
};

const MASTERS: usize = 3;
/// Short, so a failure is detected in a couple of seconds; the module's guard does not depend
/// on it for a stall (a stopped master starts a quarantine when it resumes).
const NODE_TIMEOUT_MS: &str = "1500";
/// The bound of every wait: a failover, a reply, a resync.
const LIMIT: Duration = Duration::from_secs(30);
const LEASE: &str = "60000";

/// What the run saw, across nemeses.
#[derive(Default)]
struct Ledger {
    /// The last token granted per lock name.
    last: BTreeMap<String, i64>,
    /// The largest token granted per shard (the shard's first master's index).
    shard_max: BTreeMap<usize, i64>,
    /// Grants by an old master after its replica's promotion.
    split_brain: u64,
    /// How the old master's waiters and probes were answered, by reply kind.
    answers: BTreeMap<String, u64>,
}

impl Ledger {
    /// A token granted on `name` (of `shard`): strictly above the name's previous one.
    fn token(&mut self, shard: usize, name: &str, token: i64) {
        if let Some(&before) = self.last.get(name) {
            assert!(token > before, "{name}: token {token} granted after {before}");
        }
        self.last.insert(name.to_owned(), token);
        let max = self.shard_max.entry(shard).or_default();
        *max = (*max).max(token);
    }

    /// A reply from the old master (a probe or a waiter): a grant counts as a split brain.
    fn old_master_reply(&mut self, what: &str, reply: &Result<Value, String>) {
        let kind = match reply {
            Ok(v) if granted(v) => {
                self.split_brain += 1;
                eprintln!("SPLIT BRAIN: {what} granted by the old master: {v:?}");
                "granted".to_owned()
            }
            Ok(v) => format!("not granted ({v:?})"),
            Err(e) => e.split([' ', ':']).next().unwrap_or_default().to_owned(),
        };
        *self.answers.entry(kind).or_default() += 1;
    }
}

/// Whether a reply to one of the acquires below is a grant.
fn granted(reply: &Value) -> bool {
    match reply {
        Value::Nil | Value::Okay => true,
        Value::Int(n) => *n == 1, // RSEM.ACQUIRE
        Value::Array(parts) => parts.first() == Some(&Value::Int(1)),
        _ => false,
    }
}

/// The lock names of one nemesis, all under one hash tag of a shard (one slot).
struct Names {
    shard: usize,
    slot: u16,
    rl: String,
    rw: String,
    sem: String,
}

impl Names {
    fn new(cluster: &Cluster, shard: usize, tag: &str, round: usize, nemesis: &str) -> Self {
        let prefix = format!("{{{tag}}}:{nemesis}{round}");
        let slot = rlock::cluster::key_slot(prefix.as_bytes());
        assert_eq!(slot, cluster.slot(prefix.as_bytes()));
        Self {
            shard,
            slot,
            rl: format!("{prefix}:rl"),
            rw: format!("{prefix}:rw"),
            sem: format!("{prefix}:sem"),
        }
    }

    /// The waiters' acquires: the reentrant lock (with a token), a reader of the read-write
    /// lock behind the writer, one permit.
    fn waits(&self, who: &str) -> [Vec<String>; 3] {
        [
            owned(&["RLOCK.ACQUIRE", &self.rl, who, LEASE, "WAIT", "60000", "TOKEN"]),
            owned(&["RWLOCK.ACQUIRE", &self.rw, who, "READ", LEASE, "WAIT", "60000"]),
            owned(&["RSEM.ACQUIRE", &self.sem, "1", "WAIT", "60000"]),
        ]
    }
}

fn owned(v: &[&str]) -> Vec<String> {
    v.iter().map(|a| (*a).to_owned()).collect()
}

fn args(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

/// A command that must succeed.
fn ok(con: &mut Connection, a: &[&str]) -> Value {
    run_str(con, a).unwrap_or_else(|e| panic!("{a:?}: {e}"))
}

/// Holds the three locks on `master` (tokens into the ledger), queues a waiter on each, and
/// waits until the holds reached `master`'s replica.
fn hold_and_wait(cluster: &Cluster, master: usize, n: &Names, ledger: &mut Ledger) -> Vec<Pending> {
    let node = &cluster.nodes[master];
    let mut con = node.conn();
    let t = granted_token(&ok(&mut con, &["RLOCK.ACQUIRE", &n.rl, "holder", LEASE, "TOKEN"]));
    ledger.token(n.shard, &n.rl, t);
    let w = ok(&mut con, &["RWLOCK.ACQUIRE", &n.rw, "holder", "WRITE", LEASE, "TOKEN"]);
    ledger.token(n.shard, &n.rw, granted_token(&w));
    assert_eq!(ok(&mut con, &["RSEM.SETPERMITS", &n.sem, "1"]), Value::Int(1));
    assert_eq!(ok(&mut con, &["RSEM.ACQUIRE", &n.sem, "1"]), Value::Int(1));
    // The probes' semaphore: permits a stale master must not give.
    ok(&mut con, &["RSEM.SETPERMITS", &format!("{}:probes", n.sem), "1000"]);
    let waiters: Vec<Pending> =
        n.waits("old-waiter").iter().map(|w| Pending::start_str(node, &args(w))).collect();
    poll("the waiters on the master", LIMIT, || (blocked_clients(&mut con) == 3).then_some(()));
    let acked: i64 = redis::cmd("WAIT").arg(1).arg(10_000).query(&mut con).expect("WAIT");
    assert_eq!(acked, 1, "the holds reached the replica");
    waiters
}

/// The old master's waiters: each answered, none granted.
fn check_old_waiters(waiters: Vec<Pending>, ledger: &mut Ledger) {
    for w in waiters {
        let (reply, _) = w.reply(LIMIT);
        ledger.old_master_reply("a waiter", &reply);
    }
}

/// The demoted node's module queues nobody (no waiter left behind by the server's own unblock).
fn no_waiter_left(cluster: &Cluster, old: usize) {
    let mut con = cluster.nodes[old].conn();
    poll("the old master's queues to empty", LIMIT, || {
        let waiting = info_field(&mut con, "rlock", "rlock_waiting_clients");
        (waiting == 0 && blocked_clients(&mut con) == 0).then_some(())
    });
}

/// On the new master: the holds are there; waiters queued there are served, in turn, when the
/// holders release, with tokens above `before`, every token of the shard before the nemesis.
fn check_new_master(cluster: &Cluster, new: usize, n: &Names, before: i64, ledger: &mut Ledger) {
    let node = &cluster.nodes[new];
    let mut con = node.conn();
    let holder = vec![(b"holder".to_vec(), b"1".to_vec())];
    assert_eq!(hgetall(&mut con, n.rl.as_bytes()), holder, "the hold moved to the new master");
    let rw = hgetall(&mut con, n.rw.as_bytes());
    assert!(rw.contains(&(b"mode".to_vec(), b"write".to_vec())), "{rw:?}");
    assert_eq!(ok(&mut con, &["RSEM.AVAILABLE", &n.sem]), Value::Int(0));

    let waiters: Vec<Pending> =
        n.waits("new-waiter").iter().map(|w| Pending::start_str(node, &args(w))).collect();
    poll("the waiters on the new master", LIMIT, || (blocked_clients(&mut con) == 3).then_some(()));
    let mut waiters = waiters.into_iter();
    assert_eq!(ok(&mut con, &["RLOCK.RELEASE", &n.rl, "holder"]), Value::Int(1));
    let (reply, _) = waiters.next().expect("rl").reply(LIMIT);
    let token = granted_token(&reply.expect("the lock handed off on the new master"));
    assert!(token > before, "{}: token {token} not above the shard's {before}", n.rl);
    ledger.token(n.shard, &n.rl, token);
    assert_eq!(ok(&mut con, &["RWLOCK.RELEASE", &n.rw, "holder", "WRITE"]), Value::Int(1));
    let (reply, _) = waiters.next().expect("rw").reply(LIMIT);
    assert_eq!(reply, Ok(Value::Nil), "the reader served on the new master");
    ok(&mut con, &["RSEM.RELEASE", &n.sem, "1"]);
    let (reply, _) = waiters.next().expect("sem").reply(LIMIT);
    assert_eq!(reply, Ok(Value::Int(1)), "the permit handed off on the new master");
    // A fresh writer after the reader leaves: tokens go on above.
    assert_eq!(ok(&mut con, &["RWLOCK.RELEASE", &n.rw, "new-waiter", "READ"]), Value::Int(1));
    let w = ok(&mut con, &["RWLOCK.ACQUIRE", &n.rw, "writer", "WRITE", LEASE, "TOKEN"]);
    let token = granted_token(&w);
    assert!(token > before, "{}: token {token} not above the shard's {before}", n.rw);
    ledger.token(n.shard, &n.rw, token);
}

/// Fresh acquires on free locks of the slot (`k` names them), to probe an old master with.
fn probes(n: &Names, k: usize) -> [Vec<String>; 3] {
    let (rl, rw) = (format!("{}:probe{k}", n.rl), format!("{}:probe{k}", n.rw));
    [
        owned(&["RLOCK.ACQUIRE", &rl, "probe", LEASE, "TOKEN"]),
        owned(&["RWLOCK.ACQUIRE", &rw, "probe", "WRITE", LEASE, "TOKEN"]),
        owned(&["RSEM.ACQUIRE", &format!("{}:probes", n.sem), "1"]),
    ]
}

/// Sends probes to node `old` while it still says it is a master (a new connection each
/// time, short timeouts), then once more; every reply goes to the ledger. Returns how many
/// were sent.
fn probe_until_demoted(cluster: &Cluster, old: usize, n: &Names, ledger: &mut Ledger) -> usize {
    let until = Instant::now() + LIMIT;
    let mut sent = 0;
    loop {
        let demoted = !is_master(&cluster.nodes[old]);
        if let Ok(mut con) =
            cluster.nodes[old].client().get_connection_with_timeout(Duration::from_millis(500))
        {
            let _ = con.set_read_timeout(Some(Duration::from_secs(2)));
            for p in probes(n, sent) {
                sent += 1;
                ledger.old_master_reply("a probe", &run_str(&mut con, &args(&p)));
            }
        }
        if demoted {
            return sent;
        }
        assert!(Instant::now() < until, "the old master was not demoted within {LIMIT:?}");
        thread::sleep(Duration::from_millis(5));
    }
}

/// The replica of `master`, as `master` sees it.
fn replica_of(cluster: &Cluster, master: usize) -> usize {
    let replicas = cluster.replicas_via(master, master);
    assert_eq!(replicas.len(), 1, "one replica of node {master}: {replicas:?}");
    replicas[0]
}

/// Waits until the old master `old` is a replica of the new one, `new`, as `new` sees it.
fn wait_rejoined(cluster: &Cluster, old: usize, new: usize) {
    poll("the old master to replicate the new one", LIMIT, || {
        cluster.replicas_via(new, new).contains(&old).then_some(())
    });
}

/// Waits until node `via` names `expected` the owner of `slot`.
fn wait_owner(cluster: &Cluster, slot: u16, via: usize, expected: usize) {
    poll("the promoted replica to own the slot", LIMIT, || {
        (cluster.owner_via(slot, via) == Some(expected)).then_some(())
    });
}

/// The coordinated hand-over.
fn manual(cluster: &Cluster, n: &Names, ledger: &mut Ledger) {
    let old = cluster.owner_via(n.slot, 0).expect("an owner");
    let new = replica_of(cluster, old);
    let waiters = hold_and_wait(cluster, old, n, ledger);
    let before = ledger.shard_max[&n.shard];
    let started = Instant::now();
    ok(&mut cluster.nodes[new].conn(), &["CLUSTER", "FAILOVER"]);
    wait_owner(cluster, n.slot, new, new);
    eprintln!("manual: node {new} promoted after {:?}", started.elapsed());
    check_old_waiters(waiters, ledger);
    probe_until_demoted(cluster, old, n, ledger);
    no_waiter_left(cluster, old);
    wait_rejoined(cluster, old, new);
    check_new_master(cluster, new, n, before, ledger);
}

/// The master stopped past its replica's promotion, then resumed.
fn pause(cluster: &Cluster, n: &Names, ledger: &mut Ledger) {
    let old = cluster.owner_via(n.slot, 0).expect("an owner");
    let new = replica_of(cluster, old);
    let waiters = hold_and_wait(cluster, old, n, ledger);
    // The holders' releases and acquires of free locks: they sit in the stopped master's
    // sockets and are read when it resumes. A release there may go through (it is lost with
    // the old master's data), but a hand-off to its waiters would be a split-brain grant.
    let releases = [
        owned(&["RLOCK.RELEASE", &n.rl, "holder"]),
        owned(&["RWLOCK.RELEASE", &n.rw, "holder", "WRITE"]),
        owned(&["RSEM.RELEASE", &n.sem, "1"]),
    ];
    let releases: Vec<_> = releases.into_iter().map(|r| (r, cluster.nodes[old].conn())).collect();
    let acquires: Vec<_> =
        probes(n, 1_000).into_iter().map(|p| (p, cluster.nodes[old].conn())).collect();
    // A lock whose lease ends during the pause, with a waiter: the resumed master's timer
    // would hand it on, a grant as split as any.
    let mut con = cluster.nodes[old].conn();
    let expiring = format!("{}:expiring", n.rl);
    ok(&mut con, &["RLOCK.ACQUIRE", &expiring, "holder", "1500"]);
    let acquired = Instant::now();
    let expiring_waiter = Pending::start_str(
        &cluster.nodes[old],
        &["RLOCK.ACQUIRE", &expiring, "old-waiter", LEASE, "WAIT", "60000"],
    );
    poll("the waiter of the expiring lock", LIMIT, || {
        (blocked_clients(&mut con) == 4).then_some(())
    });
    let before = ledger.shard_max[&n.shard];
    cluster.nodes[old].pause();
    let started = Instant::now();
    // On a slow machine the lease may have ended before the pause: then the grant was fair.
    let expired_in_pause = started.duration_since(acquired) < Duration::from_millis(1_200);
    let send = |(cmd, mut con): (Vec<String>, Connection)| {
        thread::spawn(move || {
            con.set_read_timeout(Some(LIMIT * 2)).expect("timeout");
            run_str(&mut con, &args(&cmd))
        })
    };
    // In whatever order the server reads its sockets: each is checked on its own.
    let releases: Vec<_> = releases.into_iter().map(send).collect();
    let queued: Vec<_> = acquires.into_iter().map(send).collect();
    wait_owner(cluster, n.slot, new, new);
    eprintln!("pause: node {new} promoted after {:?}", started.elapsed());
    cluster.nodes[old].resume();
    let sent = probe_until_demoted(cluster, old, n, ledger);
    eprintln!("pause: {sent} fresh probes until the old master turned replica");
    for q in queued {
        ledger.old_master_reply("a queued acquire", &q.join().expect("queued acquire"));
    }
    for r in releases {
        let reply = r.join().expect("queued release");
        eprintln!("pause: a queued release on the old master: {reply:?}");
    }
    check_old_waiters(waiters, ledger);
    let (reply, _) = expiring_waiter.reply(LIMIT);
    if expired_in_pause {
        ledger.old_master_reply("the expiring lock's waiter", &reply);
    } else {
        eprintln!("pause: the expiring lock's lease ended before the pause: {reply:?}");
    }
    no_waiter_left(cluster, old);
    wait_rejoined(cluster, old, new);
    check_new_master(cluster, new, n, before, ledger);
}

/// The master killed, its replica promoted, the old master restarted on its port.
fn kill(cluster: &mut Cluster, n: &Names, ledger: &mut Ledger) {
    let old = cluster.owner_via(n.slot, 0).expect("an owner");
    let new = replica_of(cluster, old);
    let waiters = hold_and_wait(cluster, old, n, ledger);
    // A hand-off on the old master just before it dies: replicated like any grant.
    let handed = format!("{}:handed", n.rl);
    let mut con = cluster.nodes[old].conn();
    let t = granted_token(&ok(&mut con, &["RLOCK.ACQUIRE", &handed, "first", LEASE, "TOKEN"]));
    ledger.token(n.shard, &handed, t);
    let second = Pending::start_str(
        &cluster.nodes[old],
        &["RLOCK.ACQUIRE", &handed, "second", LEASE, "WAIT", "60000", "TOKEN"],
    );
    poll("the second owner to wait", LIMIT, || (blocked_clients(&mut con) == 4).then_some(()));
    assert_eq!(ok(&mut con, &["RLOCK.RELEASE", &handed, "first"]), Value::Int(1));
    let (reply, _) = second.reply(LIMIT);
    ledger.token(n.shard, &handed, granted_token(&reply.expect("handed off")));
    let acked: i64 = redis::cmd("WAIT").arg(1).arg(10_000).query(&mut con).expect("WAIT");
    assert_eq!(acked, 1, "the hand-off reached the replica");

    let before = ledger.shard_max[&n.shard];
    cluster.nodes[old].kill();
    let started = Instant::now();
    for w in waiters {
        let (reply, _) = w.reply(LIMIT);
        assert!(reply.is_err(), "a waiter on the killed master: {reply:?}");
    }
    wait_owner(cluster, n.slot, new, new);
    eprintln!("kill: node {new} promoted after {:?}", started.elapsed());
    let mut con = cluster.nodes[new].conn();
    let held = hgetall(&mut con, handed.as_bytes());
    assert_eq!(held, vec![(b"second".to_vec(), b"1".to_vec())], "the hand-off survived");
    assert_eq!(ok(&mut con, &["RLOCK.RELEASE", &handed, "second"]), Value::Int(1));
    let after = granted_token(&ok(&mut con, &["RLOCK.ACQUIRE", &handed, "third", LEASE, "TOKEN"]));
    assert!(after > before, "{handed}: token {after} not above the shard's {before}");
    ledger.token(n.shard, &handed, after);
    check_new_master(cluster, new, n, before, ledger);
    cluster.nodes[old].restart_same_port();
    let sent = probe_until_demoted(cluster, old, n, ledger);
    eprintln!("kill: {sent} probes on the restarted old master until it turned replica");
    wait_rejoined(cluster, old, new);
}

fn run_rounds(rounds: usize) {
    // AOF, so the killed master restarts with the holds it had (and raises its token floor).
    let cluster_config = [
        ("cluster-node-timeout", NODE_TIMEOUT_MS),
        ("appendonly", "yes"),
        ("appendfsync", "everysec"),
    ];
    let mut cluster = Cluster::start_with_replicas(MASTERS, 1, &cluster_config);
    let tags: Vec<String> = (0..MASTERS).map(|i| cluster.key_on(i, "shard")).collect();
    let mut ledger = Ledger::default();
    for round in 0..rounds {
        // Each nemesis on another shard; over three rounds every shard meets every nemesis.
        let shard = |k: usize| (round + k) % MASTERS;
        let names = Names::new(&cluster, shard(0), &tags[shard(0)], round, "manual");
        manual(&cluster, &names, &mut ledger);
        cluster.wait_healthy();
        let names = Names::new(&cluster, shard(1), &tags[shard(1)], round, "pause");
        pause(&cluster, &names, &mut ledger);
        cluster.wait_healthy();
        let names = Names::new(&cluster, shard(2), &tags[shard(2)], round, "kill");
        kill(&mut cluster, &names, &mut ledger);
        cluster.wait_healthy();
        eprintln!("round {round}: answers from old masters so far {:?}", ledger.answers);
    }
    assert_eq!(ledger.split_brain, 0, "grants by old masters: {:?}", ledger.answers);
    // The stopped master read the queued acquires before it learnt of the promotion (its
    // cluster links to the others timed out during the pause, so their news comes after): the
    // guard was exercised, not bypassed by a redirect.
    let guarded = ledger.answers.get("NOREPLICAS").copied().unwrap_or_default();
    assert!(guarded >= rounds as u64, "the guard refused too little: {:?}", ledger.answers);
    // Every refusal came from the server as an error reply it means (not a timeout): the old
    // masters answered.
    for kind in ledger.answers.keys() {
        assert!(ANSWERS.contains(&kind.as_str()), "an old master answered {kind}");
    }
}

/// What an old master may answer a waiter or a probe: the module's guard, a redirect, its
/// demotion (the module's `READONLY`, or the server's own `UNBLOCKED` of blocked clients).
const ANSWERS: [&str; 8] =
    ["NOREPLICAS", "MOVED", "ASK", "CLUSTERDOWN", "TRYAGAIN", "READONLY", "UNBLOCKED", "LOADING"];

#[test]
fn a_cluster_master_replaced_by_its_replica_grants_nothing_after_and_tokens_go_on() {
    let rounds = std::env::var("RLOCK_FAILOVER_ROUNDS").ok().and_then(|r| r.parse().ok());
    run_rounds(rounds.unwrap_or(1));
}
