//! The replica guard's memory across restarts, the `rlock-had-replicas` file: written in the
//! working directory the server has now (after `CONFIG SET dir` too), named by the refusal it
//! causes, by `INFO rlock` and the log, and looked at again at run time (deleted: the server
//! runs standalone; planted: it counts), counting the replicas online for a restart to wait for.

use std::path::Path;
use std::time::Duration;

use redis::{Connection, Value};
use rlock_tests_integration::{cmd, info_field, poll, run_str, wait_replica_online, Server};

const LIMIT: Duration = Duration::from_secs(10);
const FILE: &str = "rlock-had-replicas";

/// A replica of `master` (with the module) that the master's guard counts in sync.
fn attach_replica(master: &Server, con: &mut Connection) -> Server {
    let replica = Server::builder().replica_of(master).start();
    wait_replica_online(master);
    poll("the master to count its replica", LIMIT, || {
        (info_field(con, "rlock_replicas", "rlock_replicas_in_sync") == 1).then_some(())
    });
    replica
}

/// `INFO rlock`'s `rlock_had_replicas_file` (empty: no file known).
fn info_file(con: &mut Connection) -> String {
    let info: String = redis::cmd("INFO").arg("rlock").query(con).expect("INFO");
    info.lines()
        .find_map(|l| l.strip_prefix("rlock_had_replicas_file:"))
        .expect("rlock_had_replicas_file in INFO rlock")
        .trim()
        .to_owned()
}

fn acquire(con: &mut Connection, key: &str) -> Result<Value, String> {
    run_str(con, &["RLOCK.ACQUIRE", key, "a", "60000"])
}

fn wait_file(dir: &Path) {
    poll("the file in the working directory", LIMIT, || dir.join(FILE).exists().then_some(()));
}

/// After `CONFIG SET dir`, the file was never written in the new directory: the master,
/// restarted there (as its config file now says) after its replica was promoted elsewhere,
/// granted as a standalone server. It is written there within a second.
#[test]
fn the_had_replicas_file_follows_config_set_dir_so_a_restart_there_refuses() {
    let mut master = Server::builder().config("enable-protected-configs", "yes").start();
    let mut con = master.conn();
    let mut replica = attach_replica(&master, &mut con);
    wait_file(master.dir());
    let moved = tempfile::Builder::new().prefix("rlock-test-dir-").tempdir().expect("temp dir");
    let moved_dir = moved.path().to_str().expect("dir").to_owned();
    cmd(&mut con, &["CONFIG", "SET", "dir", &moved_dir]);
    wait_file(moved.path());
    assert_eq!(info_file(&mut con), moved.path().join(FILE).display().to_string());
    // The replica goes (promoted elsewhere), and the master restarts in its new directory.
    replica.kill();
    master.keep_config("dir", &moved_dir);
    master.restart();
    let mut con = master.conn();
    let refused = acquire(&mut con, "l").expect_err("a restarted master that had replicas");
    assert!(refused.starts_with("NOREPLICAS"), "{refused}");
}

/// A planted (or stale) file made a standalone server refuse every acquire with a reply that
/// named neither the file nor the rule, `INFO rlock` and the log said nothing, and deleting the
/// file (as docs/safety.md says) changed nothing until a restart.
#[test]
fn a_planted_had_replicas_file_is_named_and_its_deletion_counts_at_run_time() {
    let mut server = Server::start();
    let file = server.dir().join(FILE);
    std::fs::write(&file, "planted").expect("plant the file");
    server.restart();
    let mut con = server.conn();
    let refused = acquire(&mut con, "l").expect_err("the file says it had replicas");
    assert!(refused.starts_with("NOREPLICAS") && refused.contains(FILE), "{refused}");
    assert_eq!(info_file(&mut con), file.display().to_string());
    assert!(server.log().contains(&format!("found {}", file.display())), "the load log names it");
    // Deleted at run time: grants within a second or so, with no restart.
    std::fs::remove_file(&file).expect("delete the file");
    poll("grants once the file is gone", LIMIT, || {
        (acquire(&mut con, "l") == Ok(Value::Nil)).then_some(())
    });
    assert_eq!(info_file(&mut con), "");
    // Planted again at run time: it counts again (the server never changed role).
    std::fs::write(&file, "planted").expect("plant the file");
    poll("refusals once the file is back", LIMIT, || {
        acquire(&mut con, "m").err().filter(|e| e.contains(FILE))
    });
}

/// The file's count line (`None`: none).
fn count_line(dir: &Path) -> Option<String> {
    let text = std::fs::read_to_string(dir.join(FILE)).ok()?;
    text.lines().find_map(|l| l.strip_prefix("replicas ").map(str::to_owned))
}

/// The file counts the replicas online, as a restart after a crash must wait for that many in
/// sync: it follows them up at once and down within a second or so.
#[test]
fn the_had_replicas_file_counts_the_replicas_online() {
    let master = Server::start();
    let mut con = master.conn();
    let _first = attach_replica(&master, &mut con);
    let mut second = Server::builder().replica_of(&master).start();
    poll("two replicas in sync", LIMIT, || {
        (info_field(&mut con, "rlock_replicas", "rlock_replicas_in_sync") == 2).then_some(())
    });
    poll("the file to count two", LIMIT, || {
        (count_line(master.dir()).as_deref() == Some("2")).then_some(())
    });
    second.kill();
    poll("the file to count one", LIMIT, || {
        (count_line(master.dir()).as_deref() == Some("1")).then_some(())
    });
    assert!(!master.dir().join(format!("{FILE}.tmp")).exists(), "written by a rename");
    assert_eq!(info_field(&mut con, "rlock_replicas", "rlock_replicas_before_restart"), 0);
}
