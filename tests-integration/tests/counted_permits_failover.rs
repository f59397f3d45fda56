//! Counted permits across a failover: a master whose replica guard refuses grants (it may have
//! been replaced) refuses every give-back of counted permits too (`RSEM.RELEASE key permits
//! [REQUEST id]`, `RLOCK.CANCEL` of a counted grant), with `NOREPLICAS` and nothing written.
//! Counted permits have no lease: a give-back answered there, and thrown away with the old
//! master's data when it is demoted, would be a permit held by nobody for good. The retry on
//! the current master gives them back, exactly once per request id. Lock releases, a waiter's
//! cancel and leased permits' releases still work on the old master (leases end on the new one).

use std::time::Duration;

use redis::{Connection, Value};
use rlock_tests_integration::{
    cmd, fuzz_seed, info_field, int, poll, queue_str, run_checked, run_str, wait_replica_online,
    Rng, Server,
};

const LIMIT: Duration = Duration::from_secs(20);

/// The refusal of a give-back of counted permits, at the start of the reply.
const GIVE_BACK_REFUSED: &str = "NOREPLICAS this master gives back no permits";

/// The refusal of a change of a semaphore's count (`RSEM.ADDPERMITS`, `RSEM.SETPERMITS`).
const COUNT_REFUSED: &str = "NOREPLICAS this master changes no permit count";

/// The guard's reply to a grant: `Some(error)` once it refuses.
fn grant_refused(con: &mut Connection) -> Option<String> {
    match run_str(con, &["RLOCK.ACQUIRE", "probe", "p", "60000"]) {
        Err(e) if e.starts_with("NOREPLICAS ") => Some(e),
        Err(e) => panic!("another error: {e}"),
        Ok(_) => {
            cmd(con, &["RLOCK.RELEASE", "probe", "p"]);
            None
        }
    }
}

/// A master with one replica in sync, granting (module defaults).
fn master_with_replica() -> (Server, Server, Connection) {
    let master = Server::start();
    let replica = Server::builder().replica_of(&master).start();
    wait_replica_online(&master);
    let mut con = master.conn();
    // Counted by the guard (until then the auto rule requires no replica).
    poll("the master to count its replica", LIMIT, || {
        (info_field(&mut con, "rlock_replicas", "rlock_replicas_in_sync") == 1).then_some(())
    });
    poll("grants to be allowed", LIMIT, || grant_refused(&mut con).is_none().then_some(()));
    (master, replica, con)
}

/// Waits until every write so far reached the replica.
fn replicated(con: &mut Connection) {
    assert_eq!(cmd(con, &["WAIT", "1", "5000"]), Value::Int(1), "the replica acknowledged");
}

fn available(con: &mut Connection, sem: &str) -> i64 {
    int(&cmd(con, &["RSEM.AVAILABLE", sem]))
}

/// One counted grant and the give-back its holder sends.
#[derive(Debug, Clone)]
struct Taken {
    permits: u64,
    /// The acquire's `REQUEST id` (`None`: a plain acquire, given back by a plain release).
    id: Option<String>,
    /// Given back by `RLOCK.CANCEL key id` (else by `RSEM.RELEASE`).
    by_cancel: bool,
}

impl Taken {
    fn give_back(&self, sem: &str) -> Vec<String> {
        let permits = self.permits.to_string();
        match (&self.id, self.by_cancel) {
            (Some(id), true) => vec!["RLOCK.CANCEL".into(), sem.into(), id.clone()],
            (Some(id), false) => {
                vec!["RSEM.RELEASE".into(), sem.into(), permits, "REQUEST".into(), id.clone()]
            }
            (None, _) => vec!["RSEM.RELEASE".into(), sem.into(), permits],
        }
    }
}

fn run_owned(con: &mut Connection, args: &[String]) -> Result<Value, String> {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    run_str(con, &args)
}

/// A net over give-backs: random counted grants (with and without `REQUEST id`), taken on a
/// master that its replica then replaces (`REPLICAOF NO ONE`, as Sentinel does); on the old
/// master every give-back is refused and changes nothing, while a lock's release, a waiter's
/// cancel and a leased release still work; on the new master the same give-backs, each sent
/// once or twice, bring every permit back exactly once.
#[test]
fn a_replaced_master_gives_back_no_counted_permits_and_the_new_master_gives_them_back_once() {
    let seed = fuzz_seed();
    eprintln!("seed {seed} (RLOCK_FUZZ_SEED to replay)");
    let mut rng = Rng(seed);
    let (master, replica, mut old) = master_with_replica();
    let total = 40;
    assert_eq!(cmd(&mut old, &["RSEM.SETPERMITS", "sem", &total.to_string()]), Value::Int(1));
    let mut taken = Vec::new();
    for i in 0..(3 + rng.below(6)) {
        let permits = 1 + rng.below(3) as u64;
        let id = (rng.below(4) > 0).then(|| format!("r{i}"));
        let mut acquire = vec!["RSEM.ACQUIRE".to_owned(), "sem".into(), permits.to_string()];
        if let Some(id) = &id {
            acquire.extend(["REQUEST".into(), id.clone()]);
        }
        assert_eq!(run_owned(&mut old, &acquire), Ok(Value::Int(1)), "seed {seed}: {acquire:?}");
        taken.push(Taken { permits, id, by_cancel: rng.below(2) == 0 });
    }
    let held: u64 = taken.iter().map(|t| t.permits).sum();
    let left = total - i64::try_from(held).expect("small");
    // A lock held, a waiter queued on it, leased permits: what must still work.
    assert_eq!(cmd(&mut old, &["RLOCK.ACQUIRE", "lk", "a", "60000"]), Value::Nil);
    let waiter = queue_str(
        &master,
        &mut old,
        &["RLOCK.ACQUIRE", "lk", "b", "60000", "WAIT", "30000", "REQUEST", "w"],
    );
    assert_eq!(cmd(&mut old, &["RSEM.SETPERMITS", "leased", "1"]), Value::Int(1));
    let Value::Array(ids) = cmd(&mut old, &["RSEM.ACQUIRE", "leased", "1", "LEASE", "60000"])
    else {
        panic!("leased permits not granted")
    };
    let Value::BulkString(leased_id) = &ids[0] else { panic!("a permit id: {ids:?}") };
    replicated(&mut old);

    // The failover: the replica is promoted; the old master, its replica gone, refuses grants.
    let mut new = replica.conn();
    assert_eq!(cmd(&mut new, &["REPLICAOF", "NO", "ONE"]), Value::Okay);
    poll("the old master to refuse grants", LIMIT, || grant_refused(&mut old));

    let mut order: Vec<usize> = (0..taken.len()).collect();
    for i in (1..order.len()).rev() {
        order.swap(i, rng.below(i + 1));
    }
    for &i in &order {
        let args = taken[i].give_back("sem");
        let raw: Vec<&[u8]> = args.iter().map(String::as_bytes).collect();
        let (reply, changed) = run_checked(&mut old, &raw).expect("connection");
        let refused = reply.as_ref().err().is_some_and(|e| e.starts_with(GIVE_BACK_REFUSED));
        assert!(refused, "seed {seed}: {args:?} on the old master: {reply:?}");
        assert!(!changed, "seed {seed}: {args:?} refused, yet the dataset changed");
    }
    assert_eq!(available(&mut old, "sem"), left, "seed {seed}: nothing given back");
    // The count's own commands are refused too, changing nothing: permits added or taken away
    // on a replaced master would be lost with it, as a give-back would (a permit lost, or
    // more permits than the semaphore's total once the removal is lost).
    let count_changes = [
        vec!["RSEM.ADDPERMITS", "sem", "2"],
        vec!["RSEM.ADDPERMITS", "sem", "-1"],
        vec!["RSEM.SETPERMITS", "fresh", "5"],
    ];
    for args in count_changes {
        let raw: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
        let (reply, changed) = run_checked(&mut old, &raw).expect("connection");
        let refused = reply.as_ref().err().is_some_and(|e| e.starts_with(COUNT_REFUSED));
        assert!(refused, "seed {seed}: {args:?} on the old master: {reply:?}");
        assert!(!changed, "seed {seed}: {args:?} refused, yet the dataset changed");
    }
    assert_eq!(available(&mut old, "sem"), left, "seed {seed}: the count unchanged");
    // Setting a semaphore already set changes nothing: answered 0 as anywhere (Redisson's
    // `trySetPermits` at start-up), the dataset untouched.
    let (reply, changed) = run_checked(&mut old, &[b"RSEM.SETPERMITS", b"sem", b"5"]).expect("con");
    assert_eq!(reply, Ok(Value::Int(0)), "seed {seed}: SETPERMITS of a set semaphore");
    assert!(!changed, "seed {seed}: SETPERMITS of a set semaphore changed the dataset");
    // What the guard does not touch: the waiter leaves the queue, the lock is released, leased
    // permits are given back by id.
    assert_eq!(cmd(&mut old, &["RLOCK.CANCEL", "lk", "w"]), Value::Int(1));
    assert_eq!(waiter.reply(LIMIT).0.map(|v| int(&v) > 0), Ok(true), "answered as timed out");
    assert_eq!(cmd(&mut old, &["RLOCK.RELEASE", "lk", "a"]), Value::Int(1));
    let mut release_id = redis::cmd("RSEM.RELEASE");
    release_id.arg("leased").arg("ID").arg(leased_id.as_slice());
    assert_eq!(release_id.query::<i64>(&mut old).expect("leased release"), 1);

    // The holders retry on the new master: each give-back once or twice, in another order.
    assert_eq!(available(&mut new, "sem"), left, "seed {seed}: the grants were replicated");
    for i in (1..order.len()).rev() {
        order.swap(i, rng.below(i + 1));
    }
    let mut expected = left;
    for &i in &order {
        let args = taken[i].give_back("sem");
        let reply = run_owned(&mut new, &args);
        expected += i64::try_from(taken[i].permits).expect("small");
        let want = if taken[i].by_cancel && taken[i].id.is_some() { 2 } else { expected };
        assert_eq!(reply, Ok(Value::Int(want)), "seed {seed}: {args:?} on the new master");
        if taken[i].id.is_some() && rng.below(2) == 0 {
            // A retry (the reply was lost): nothing more is given back.
            let again = if taken[i].by_cancel { 0 } else { expected };
            let reply = run_owned(&mut new, &args);
            assert_eq!(reply, Ok(Value::Int(again)), "seed {seed}: {args:?} retried");
        }
        assert_eq!(available(&mut new, "sem"), expected, "seed {seed}: after {args:?}");
    }
    assert_eq!(expected, total);
}

/// The commands that sat in a stalled master's sockets (SIGSTOP for longer than
/// `rlock.stall-ms`): answered as it resumes, the give-backs of counted permits among them are
/// refused (the group may have replaced it meanwhile), and given back once, by the same
/// request, when the master grants again.
#[test]
fn give_backs_sent_to_a_stalled_master_are_refused_as_it_resumes_and_done_once_later() {
    let (master, _replica, mut con) = master_with_replica();
    assert_eq!(cmd(&mut con, &["RSEM.SETPERMITS", "sem", "3"]), Value::Int(1));
    for id in ["r1", "r2"] {
        assert_eq!(cmd(&mut con, &["RSEM.ACQUIRE", "sem", "1", "REQUEST", id]), Value::Int(1));
    }
    replicated(&mut con);
    let mut sent = master.conn();
    sent.set_read_timeout(Some(LIMIT)).expect("timeout");
    let give_backs = [
        (
            "RSEM.RELEASE sem 1 REQUEST r1",
            redis::cmd("RSEM.RELEASE").arg("sem").arg(1).arg("REQUEST").arg("r1").clone(),
        ),
        ("RLOCK.CANCEL sem r2", redis::cmd("RLOCK.CANCEL").arg("sem").arg("r2").clone()),
    ];
    master.pause();
    for (_, give_back) in &give_backs {
        sent.send_packed_command(&give_back.get_packed_command()).expect("sent");
    }
    // The stall itself (longer than rlock.stall-ms, 1.5 s), not a wait for a condition.
    std::thread::sleep(Duration::from_millis(2_000));
    master.resume();
    for (name, _) in &give_backs {
        let reply = match sent.recv_response().expect("a reply") {
            Value::ServerError(e) => Err(format!("{} {}", e.code(), e.details().unwrap_or(""))),
            other => Ok(other),
        };
        let refused = reply.as_ref().is_err_and(|e| e.starts_with(GIVE_BACK_REFUSED));
        assert!(refused, "{name}: {reply:?}");
    }
    assert_eq!(available(&mut con, "sem"), 1, "nothing given back");
    poll("grants to be allowed again", LIMIT, || grant_refused(&mut con).is_none().then_some(()));
    for _ in 0..2 {
        assert_eq!(cmd(&mut con, &["RSEM.RELEASE", "sem", "1", "REQUEST", "r1"]), Value::Int(2));
    }
    assert_eq!(cmd(&mut con, &["RLOCK.CANCEL", "sem", "r2"]), Value::Int(2));
    assert_eq!(cmd(&mut con, &["RLOCK.CANCEL", "sem", "r2"]), Value::Int(0));
    assert_eq!(available(&mut con, "sem"), 3);
}

/// A net over counted grants lost in a failover: random grants with `REQUEST id`, some
/// replicated and some made on the old master after its replica was promoted and no longer
/// hears it. (A cut-off master grants so until it notices, within `rlock.replica-max-lag` +
/// 2 s; here its guard is turned off to make that window deterministic.) Every holder then gives back on the new master
/// (`RSEM.RELEASE` as its request, some twice, in random order): the replicated grants come
/// back once each and the lost ones give nothing, so the semaphore never counts more permits
/// than it has.
#[test]
fn counted_grants_lost_in_a_failover_give_nothing_back_on_the_new_master() {
    let seed = fuzz_seed();
    eprintln!("seed {seed} (RLOCK_FUZZ_SEED to replay)");
    let mut rng = Rng(seed);
    let (mut master, replica, mut old) = master_with_replica();
    let total: i64 = 30;
    assert_eq!(cmd(&mut old, &["RSEM.SETPERMITS", "sem", &total.to_string()]), Value::Int(1));
    let mut taken: Vec<(String, i64)> = Vec::new();
    let acquire = |con: &mut Connection, taken: &mut Vec<(String, i64)>, rng: &mut Rng| {
        let (id, permits) = (format!("r{}", taken.len()), 1 + rng.below(3) as i64);
        let args = ["RSEM.ACQUIRE", "sem", &permits.to_string(), "REQUEST", &id];
        assert_eq!(run_str(con, &args), Ok(Value::Int(1)), "seed {seed}: {args:?}");
        taken.push((id, permits));
    };
    for _ in 0..(1 + rng.below(4)) {
        acquire(&mut old, &mut taken, &mut rng);
    }
    replicated(&mut old);
    let kept: i64 = taken.iter().map(|t| t.1).sum();
    let replicated_grants = taken.len();
    // The replica is promoted (as Sentinel does); the old master, cut off, still grants.
    let mut new = replica.conn();
    assert_eq!(cmd(&mut new, &["REPLICAOF", "NO", "ONE"]), Value::Okay);
    assert_eq!(cmd(&mut old, &["CONFIG", "SET", "rlock.min-replicas", "0"]), Value::Okay);
    for _ in 0..(1 + rng.below(4)) {
        acquire(&mut old, &mut taken, &mut rng);
    }
    master.kill();
    assert_eq!(available(&mut new, "sem"), total - kept, "seed {seed}: the replicated grants");

    let mut order: Vec<usize> = (0..taken.len()).collect();
    for i in (1..order.len()).rev() {
        order.swap(i, rng.below(i + 1));
    }
    let mut expected = total - kept;
    for &i in &order {
        let (id, permits) = &taken[i];
        let args = ["RSEM.RELEASE", "sem", &permits.to_string(), "REQUEST", id];
        if i < replicated_grants {
            expected += permits;
        }
        for _ in 0..(1 + rng.below(2)) {
            let reply = run_str(&mut new, &args);
            assert_eq!(reply, Ok(Value::Int(expected)), "seed {seed}: {args:?} on the new master");
        }
    }
    assert_eq!(expected, total);
    assert_eq!(available(&mut new, "sem"), total, "seed {seed}: every permit back, none added");
}
