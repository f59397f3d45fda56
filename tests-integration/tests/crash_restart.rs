//! A master killed (`kill -9`) and restarted from its AOF before the group noticed: it may be
//! failed over meanwhile (Sentinel goes on with a failover it started), and a replica it had
//! re-syncs from it within a second. Granting then, with one replica of two back in sync while
//! the other is promoted, makes two holders. The restarted master starts in a quarantine as
//! after a stall, and grants only once as many replicas are in sync as were online before the
//! crash (`rlock-had-replicas` counts them), not as soon as one replica is back.

use std::path::Path;
use std::time::{Duration, Instant};

use redis::{Connection, Value};
use rlock_tests_integration::{cmd, info_field, info_text, poll, run_str, Server};

const LIMIT: Duration = Duration::from_secs(20);
const FILE: &str = "rlock-had-replicas";

fn in_sync(con: &mut Connection) -> i64 {
    info_field(con, "rlock_replicas", "rlock_replicas_in_sync")
}

/// An acquire: `None` if granted (and released again), else the refusal.
fn refusal(con: &mut Connection) -> Option<String> {
    match run_str(con, &["RLOCK.ACQUIRE", "l", "a", "60000"]) {
        Err(e) if e.starts_with("NOREPLICAS ") => Some(e),
        Err(e) => panic!("another error: {e}"),
        Ok(Value::Nil) => {
            cmd(con, &["RLOCK.RELEASE", "l", "a"]);
            None
        }
        Ok(other) => panic!("held by someone else: {other:?}"),
    }
}

/// A master (AOF `everysec`, as deployments run it) with `replicas` replicas in sync.
fn master_with(replicas: usize, max_lag: &str) -> (Server, Vec<Server>) {
    let master = Server::builder()
        .config("appendonly", "yes")
        .config("rlock.replica-max-lag", max_lag)
        .start();
    let started: Vec<Server> =
        (0..replicas).map(|_| Server::builder().replica_of(&master).start()).collect();
    let mut con = master.conn();
    poll("the master to count its replicas", LIMIT, || {
        (in_sync(&mut con) == i64::try_from(replicas).expect("count")).then_some(())
    });
    poll("the master to remember its replicas", LIMIT, || {
        master.dir().join(FILE).exists().then_some(())
    });
    (master, started)
}

/// The count the file records (`None`: the file has no count line).
fn recorded(dir: &Path) -> Option<String> {
    let text = std::fs::read_to_string(dir.join(FILE)).ok()?;
    text.lines().find_map(|l| l.strip_prefix("replicas ").map(str::to_owned))
}

#[test]
fn a_master_restarted_after_a_crash_grants_only_once_every_replica_it_had_is_back_in_sync() {
    let (mut master, mut replicas) = master_with(2, "1");
    // The file follows the count within a cron tick or so; the behaviour below is what counts
    // (a count must be written at all).
    let until = Instant::now() + Duration::from_secs(3);
    while recorded(master.dir()).as_deref() != Some("2") && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(20));
    }
    // The crash; one replica goes (promoted by Sentinel, say), the other re-syncs from the
    // master restarted on its old port.
    master.kill();
    replicas[0].kill();
    master.restart_same_port();
    let restarted = Instant::now();
    let mut con = master.conn();
    poll("the other replica back in sync", LIMIT, || (in_sync(&mut con) == 1).then_some(()));
    // Until well past the quarantine (rlock.replica-max-lag 1: 2.5 s) with one replica of two
    // in sync: every acquire refused.
    let last = loop {
        let Some(refused) = refusal(&mut con) else {
            panic!(
                "granted {:?} after the restart with {} of its 2 replicas in sync",
                restarted.elapsed(),
                in_sync(&mut con)
            )
        };
        if restarted.elapsed() >= Duration::from_millis(4_000) {
            break refused;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(last.contains("fewer of its replicas are in sync than were online before"), "{last}");
    assert_eq!(info_text(&mut con, "rlock", "rlock_guard_refuses"), "replicas_before_restart");
    assert_eq!(info_field(&mut con, "rlock_replicas", "rlock_replicas_required"), 2);
    assert_eq!(info_field(&mut con, "rlock_replicas", "rlock_replicas_before_restart"), 2);
    assert_eq!(recorded(master.dir()).as_deref(), Some("2"), "the file keeps the count");
    // Both back: grants.
    replicas[0].restart();
    poll("grants with both replicas back", LIMIT, || refusal(&mut con).is_none().then_some(()));
    assert_eq!(in_sync(&mut con), 2);
}

#[test]
fn a_master_restarted_after_a_crash_is_quarantined_even_with_its_replica_back() {
    // rlock.replica-max-lag 3: a quarantine of 4.5 s, well beyond a re-sync (about 1 s).
    let (mut master, _replicas) = master_with(1, "3");
    master.kill();
    master.restart_same_port();
    let restarted = Instant::now();
    let mut con = master.conn();
    poll("the replica back in sync", LIMIT, || (in_sync(&mut con) == 1).then_some(()));
    let refused = refusal(&mut con).unwrap_or_else(|| {
        panic!("granted {:?} after the restart, its replica just back", restarted.elapsed())
    });
    assert!(refused.contains("restarted") && refused.contains(FILE), "{refused}");
    assert_eq!(info_text(&mut con, "rlock", "rlock_guard_refuses"), "restart_quarantine");
    poll("grants after the quarantine", LIMIT, || refusal(&mut con).is_none().then_some(()));
    // 4.5 s from the first check after the load (which may come a little before `restarted`).
    assert!(restarted.elapsed() >= Duration::from_millis(4_000), "{:?}", restarted.elapsed());
    // The opt-out holds in the quarantine too.
    master.kill();
    master.restart_same_port();
    let mut con = master.conn();
    poll("the quarantine", LIMIT, || refusal(&mut con).map(|_| ()));
    assert_eq!(cmd(&mut con, &["CONFIG", "SET", "rlock.min-replicas", "0"]), Value::Okay);
    assert_eq!(refusal(&mut con), None, "rlock.min-replicas 0 turns the guard off");
}
