//! The integers rlock stores as strings (semaphore counts, latch counts, fencing-token
//! counters) have the encoding Redis's own commands give them (`int`), on the master as on a
//! module-less replica and after an AOF replay: the master writes them through the very
//! command it replicates (`SET`, `INCRBY`, `DECRBY`).

use std::time::Duration;

use redis::{Connection, Value};
use rlock_tests_integration::{cmd, poll, wait_replica_online, Server};

const LIMIT: Duration = Duration::from_secs(20);

/// Every string key and its `OBJECT ENCODING`, sorted by name.
fn string_encodings(con: &mut Connection) -> Vec<(String, String)> {
    let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(con).expect("KEYS");
    let mut out = Vec::new();
    for k in keys {
        let kind: String = redis::cmd("TYPE").arg(&k).query(con).expect("TYPE");
        if kind == "string" {
            let encoding: String =
                redis::cmd("OBJECT").arg("ENCODING").arg(&k).query(con).expect("OBJECT");
            out.push((k, encoding));
        }
    }
    out.sort();
    out
}

fn writes(con: &mut Connection) {
    // Counted permits: SETPERMITS (SET), ACQUIRE (DECRBY), RELEASE (INCRBY), ADDPERMITS, beyond
    // Redis's shared integers (10,000) and near the top of the range.
    let steps: [&[&str]; 13] = [
        &["RSEM.SETPERMITS", "s", "5"],
        &["RSEM.ACQUIRE", "s", "2"],
        &["RSEM.RELEASE", "s", "1"],
        &["RSEM.SETPERMITS", "big", "20000"],
        &["RSEM.ACQUIRE", "big", "1"],
        &["RSEM.ADDPERMITS", "huge", "9000000000000000000"],
        &["RSEM.SETPERMITS", "leased", "50000"],
        &["RSEM.ACQUIRE", "leased", "2", "LEASE", "60000"],
        &["RLATCH.SETCOUNT", "latch", "30000"],
        &["RLATCH.COUNTDOWN", "latch", "2"],
        &["RLOCK.ACQUIRE", "lock", "o", "60000", "TOKEN"],
        &["RWLOCK.ACQUIRE", "rw", "o", "WRITE", "60000", "TOKEN"],
        &["RSEM.ACQUIRE", "s", "1", "WAIT", "100"],
    ];
    for step in steps {
        let reply = cmd(con, step);
        assert!(!matches!(reply, Value::ServerError(_)), "{step:?}: {reply:?}");
    }
    // A token counter Redisson's RFencedLock started (INCR), then rlock's next token.
    cmd(con, &["INCR", "redisson_lock_token:{fenced}"]);
    cmd(con, &["RLOCK.ACQUIRE", "fenced", "o", "60000", "TOKEN"]);
    // Reads leave the stored values as they are.
    for read in [
        &["RSEM.AVAILABLE", "s"][..],
        &["RSEM.AVAILABLE", "huge"],
        &["RLATCH.COUNT", "latch"],
        &["RLOCK.INFO", "lock"],
        &["RLATCH.AWAIT", "latch", "1"],
    ] {
        let reply = cmd(con, read);
        assert!(!matches!(reply, Value::ServerError(_)), "{read:?}: {reply:?}");
    }
}

#[test]
fn counts_and_token_counters_are_int_encoded_on_the_master_a_module_less_replica_and_after_an_aof_replay(
) {
    let mut master =
        Server::builder().config("appendonly", "yes").config("appendfsync", "always").start();
    let mut con = master.conn();
    let replica = Server::builder().without_module().replica_of(&master).start();
    wait_replica_online(&master);
    writes(&mut con);
    let on_master = string_encodings(&mut con);
    assert!(on_master.len() >= 8, "{on_master:?}");
    for (key, encoding) in &on_master {
        assert_eq!(encoding, "int", "{key} on the master: {on_master:?}");
    }
    let mut rcon = replica.conn();
    let offset: i64 = {
        let info: String = redis::cmd("INFO").arg("replication").query(&mut con).expect("INFO");
        info.lines()
            .find_map(|l| l.strip_prefix("master_repl_offset:")?.trim().parse().ok())
            .expect("offset")
    };
    cmd(&mut con, &["WAIT", "1", "5000"]);
    poll("the replica to catch up", LIMIT, || {
        let info: String = redis::cmd("INFO").arg("replication").query(&mut rcon).expect("INFO");
        let at: i64 = info
            .lines()
            .find_map(|l| l.strip_prefix("slave_repl_offset:")?.trim().parse().ok())
            .unwrap_or(0);
        (at >= offset).then_some(())
    });
    assert_eq!(string_encodings(&mut rcon), on_master, "module-less replica");

    master.restart();
    let mut con = master.conn();
    assert_eq!(string_encodings(&mut con), on_master, "after an AOF replay");
}
