//! Dead readers a Redisson client wrote leave while an rlock writer waits, even behind a live
//! reader whose own hold end is the lock's next scheduled check: the waiters' poll looks for
//! them as soon as the spacing of the lock's checks allows (docs/waiting.md, "Dead readers
//! leave").

use std::time::{Duration, Instant};

use redis::{Connection, Value};
use rlock_tests_integration::redisson::RedissonRw;
use rlock_tests_integration::{blocked_clients, cmd, info_field, poll, queue_str, Pending, Server};

const LIMIT: Duration = Duration::from_secs(20);

fn has_field(con: &mut Connection, key: &str, field: &str) -> bool {
    cmd(con, &["HEXISTS", key, field]) == Value::Int(1)
}

#[test]
fn a_dead_redisson_reader_leaves_while_a_writer_waits_behind_a_live_rlock_reader() {
    let server = Server::start();
    let mut con = server.conn();
    // A live rlock reader for 15 s: the lock's own check is scheduled at its hold's end.
    assert_eq!(cmd(&mut con, &["RWLOCK.ACQUIRE", "L", "live:1", "READ", "15000"]), Value::Nil);
    // A Redisson reader (its own read-acquire script) for 300 ms, whose client then dies.
    let dead = RedissonRw::new("L", "dead-client:7");
    let reply: Value = dead.read(300).command(None).query(&mut con).expect("EVAL");
    assert_eq!(reply, Value::Nil, "the Redisson reader holds it");
    assert!(has_field(&mut con, "L", "dead-client:7"));
    let mut other = server.conn();
    let writer = queue_str(
        &server,
        &mut other,
        &["RWLOCK.ACQUIRE", "L", "w:1", "WRITE", "30000", "WAIT", "0"],
    );
    let started = Instant::now();
    poll("the dead Redisson reader to leave", LIMIT, || {
        (!has_field(&mut con, "L", "dead-client:7")).then_some(())
    });
    let took = started.elapsed();
    assert!(took < Duration::from_secs(3), "left after {took:?}, not at its hold's end (300 ms)");
    assert_eq!(info_field(&mut con, "rlock", "rlock_dead_reader_reaps"), 1);
    assert!(has_field(&mut con, "L", "live:1"), "the live reader stays");
    assert!(!writer.replied(), "the writer still waits for the live reader");
    cmd(&mut con, &["RWLOCK.RELEASE", "L", "live:1", "READ"]);
    assert_eq!(writer.reply(LIMIT).0, Ok(Value::Nil));
}

/// An owner whose every read hold ended (a Redisson reader whose client died, its field not yet
/// dropped) holds no read side: its `WRITE ... WAIT` waits as any writer does and is granted once
/// the other readers leave, instead of being refused as an upgrade of a read it does not hold.
#[test]
fn an_owner_whose_read_holds_all_ended_waits_to_write_instead_of_being_refused_an_upgrade() {
    let server = Server::start();
    let mut con = server.conn();
    assert_eq!(cmd(&mut con, &["RWLOCK.ACQUIRE", "L", "live:1", "READ", "15000"]), Value::Nil);
    let dead = RedissonRw::new("L", "dead-client:7");
    let reply: Value = dead.read(200).command(None).query(&mut con).expect("EVAL");
    assert_eq!(reply, Value::Nil, "the Redisson reader holds it");
    poll("the Redisson reader's hold to end", LIMIT, || {
        (cmd(&mut con, &["EXISTS", "{L}:dead-client:7:rwlock_timeout:1"]) == Value::Int(0))
            .then_some(())
    });
    let writer = Pending::start_str(
        &server,
        &["RWLOCK.ACQUIRE", "L", "dead-client:7", "WRITE", "30000", "WAIT", "0"],
    );
    let waits = poll("the owner's write to wait or be answered", LIMIT, || {
        if writer.replied() {
            return Some(false);
        }
        (blocked_clients(&mut con) == 1).then_some(true)
    });
    if !waits {
        panic!("answered at once, not waiting: {:?}", writer.reply(LIMIT).0);
    }
    poll("its field to be dropped", LIMIT, || {
        (!has_field(&mut con, "L", "dead-client:7")).then_some(())
    });
    assert!(!writer.replied(), "the owner waits for the live reader");
    cmd(&mut con, &["RWLOCK.RELEASE", "L", "live:1", "READ"]);
    assert_eq!(writer.reply(LIMIT).0, Ok(Value::Nil));
    assert!(has_field(&mut con, "L", "dead-client:7:write"));
}
