//! No timer outlives the holds: once the last read hold or leased permit is gone, nothing
//! stays armed or scheduled, and the module unloads.

use redis::{Connection, Value};
use rlock_tests_integration::idle::{assert_idle_and_unload, timers_armed, unloadable_server};
use rlock_tests_integration::{cmd, info_field};

// ---- no timer outlives the holds ----------------------------------------------------------------

#[test]
fn releasing_the_last_read_hold_disarms_its_timer() {
    let server = unloadable_server();
    let mut con = server.conn();
    cmd(&mut con, &["RWLOCK.ACQUIRE", "rw", "a", "READ", "60000"]);
    cmd(&mut con, &["RWLOCK.ACQUIRE", "rw", "b", "READ", "60000"]);
    assert_eq!(timers_armed(&mut con), 1, "a read hold is out: its end is looked at");
    assert_eq!(cmd(&mut con, &["RWLOCK.RELEASE", "rw", "a", "READ"]), Value::Int(0));
    assert_eq!(timers_armed(&mut con), 1, "b still holds");
    assert_eq!(cmd(&mut con, &["RWLOCK.RELEASE", "rw", "b", "READ"]), Value::Int(1));
    assert_idle_and_unload(&mut con);
}

#[test]
fn a_force_release_disarms_the_read_holds_timer() {
    let server = unloadable_server();
    let mut con = server.conn();
    cmd(&mut con, &["RWLOCK.ACQUIRE", "rw", "a", "READ", "60000"]);
    assert_eq!(cmd(&mut con, &["RWLOCK.FORCERELEASE", "rw"]), Value::Int(1));
    assert_idle_and_unload(&mut con);
}

#[test]
fn rlock_forcerelease_of_a_read_write_lock_disarms_its_timer() {
    let server = unloadable_server();
    let mut con = server.conn();
    cmd(&mut con, &["RWLOCK.ACQUIRE", "rw", "a", "READ", "60000"]);
    assert_eq!(cmd(&mut con, &["RLOCK.FORCERELEASE", "rw"]), Value::Int(1));
    assert_idle_and_unload(&mut con);
}

#[test]
fn releasing_the_last_leased_permit_disarms_its_timer() {
    let server = unloadable_server();
    let mut con = server.conn();
    cmd(&mut con, &["RSEM.SETPERMITS", "s", "2"]);
    let ids: Vec<Vec<u8>> = redis::cmd("RSEM.ACQUIRE")
        .arg("s")
        .arg(2)
        .arg("LEASE")
        .arg(60_000)
        .query(&mut con)
        .expect("leased");
    assert_eq!(timers_armed(&mut con), 1, "a lease is out: its end is looked at");
    let release = |con: &mut Connection, id: &[u8]| -> i64 {
        redis::cmd("RSEM.RELEASE").arg("s").arg("ID").arg(id).query(con).expect("release")
    };
    assert_eq!(release(&mut con, &ids[0]), 1);
    assert_eq!(timers_armed(&mut con), 1, "one lease is still out");
    assert_eq!(release(&mut con, &ids[1]), 1);
    assert_idle_and_unload(&mut con);
}

#[test]
fn a_flushall_disarms_the_timers_of_read_holds_and_leases() {
    let server = unloadable_server();
    let mut con = server.conn();
    cmd(&mut con, &["RWLOCK.ACQUIRE", "rw", "a", "READ", "60000"]);
    cmd(&mut con, &["RSEM.SETPERMITS", "s", "1"]);
    cmd(&mut con, &["RSEM.ACQUIRE", "s", "1", "LEASE", "60000"]);
    assert_eq!(info_field(&mut con, "rlock", "rlock_scheduled_checks"), 2);
    cmd(&mut con, &["FLUSHALL"]);
    assert_idle_and_unload(&mut con);
}

#[test]
fn a_flushdb_of_the_swapped_database_disarms_its_timer() {
    let server = unloadable_server();
    let mut con = server.conn();
    cmd(&mut con, &["RWLOCK.ACQUIRE", "rw", "a", "READ", "60000"]);
    cmd(&mut con, &["SWAPDB", "0", "1"]);
    cmd(&mut con, &["FLUSHDB"]);
    assert_eq!(timers_armed(&mut con), 1, "the hold lives on in database 1");
    cmd(&mut con, &["SELECT", "1"]);
    cmd(&mut con, &["FLUSHDB"]);
    assert_idle_and_unload(&mut con);
}
