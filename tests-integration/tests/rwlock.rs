//! `RWLOCK.*` on a real server: Redisson's read-write lock layout, replies, errors, fair waiting
//! (readers behind a queued writer, readers granted together), dead readers removed, and a
//! Redisson client's scripts sharing the same locks.

use std::thread;
use std::time::{Duration, Instant};

use redis::{Connection, Value};

use rlock_tests_integration::redisson::{Call, RedissonRw};
use rlock_tests_integration::{
    blocked_clients, cmd, digest, granted_token, hgetall, info_field, poll, run_str, wait_blocked,
    Pending, Server,
};

const LIMIT: Duration = Duration::from_secs(10);

fn pairs(items: &[(&str, &str)]) -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut v: Vec<_> =
        items.iter().map(|(f, v)| (f.as_bytes().to_vec(), v.as_bytes().to_vec())).collect();
    v.sort();
    v
}

fn pttl(con: &mut Connection, key: &str) -> i64 {
    redis::cmd("PTTL").arg(key).query(con).expect("PTTL")
}

fn exists(con: &mut Connection, key: &str) -> bool {
    cmd(con, &["EXISTS", key]) == Value::Int(1)
}

fn info_map(con: &mut Connection, key: &str) -> Vec<(String, Value)> {
    let Value::Array(items) = cmd(con, &["RWLOCK.INFO", key]) else { panic!("not a map") };
    items
        .chunks(2)
        .map(|kv| (redis::from_redis_value::<String>(kv[0].clone()).expect("name"), kv[1].clone()))
        .collect()
}

fn field(info: &[(String, Value)], name: &str) -> Value {
    info.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone()).expect(name)
}

#[test]
fn readers_share_on_redissons_layout_with_one_lease_key_per_hold() {
    let server = Server::start();
    let mut con = server.conn();
    assert_eq!(cmd(&mut con, &["RWLOCK.ACQUIRE", "L", "c1:1", "READ", "30000"]), Value::Nil);
    assert_eq!(cmd(&mut con, &["RWLOCK.ACQUIRE", "L", "c2:1", "read", "20000"]), Value::Nil);
    assert_eq!(cmd(&mut con, &["RWLOCK.ACQUIRE", "L", "c1:1", "READ", "10000"]), Value::Nil);
    assert_eq!(hgetall(&mut con, b"L"), pairs(&[("mode", "read"), ("c1:1", "2"), ("c2:1", "1")]));
    for (hold, upper) in [
        ("{L}:c1:1:rwlock_timeout:1", 30_000),
        ("{L}:c2:1:rwlock_timeout:1", 20_000),
        ("{L}:c1:1:rwlock_timeout:2", 10_000),
    ] {
        assert_eq!(cmd(&mut con, &["GET", hold]), Value::BulkString(b"1".to_vec()), "{hold}");
        let left = pttl(&mut con, hold);
        assert!(left > upper - 2_000 && left <= upper, "{hold}: {left}");
    }
    // The hash lives as long as its longest hold (a read acquire never shortens it).
    assert!(pttl(&mut con, "L") > 28_000);
    // A writer is kept out, with the remaining lease as the reply.
    let busy = cmd(&mut con, &["RWLOCK.ACQUIRE", "L", "w:1", "WRITE", "30000"]);
    assert!(matches!(busy, Value::Int(n) if n > 28_000), "{busy:?}");
    // Releases: 0 while holds remain, 1 when the lock is free, nil for a non-holder.
    assert_eq!(cmd(&mut con, &["RWLOCK.RELEASE", "L", "c1:1", "READ"]), Value::Int(0));
    assert!(!exists(&mut con, "{L}:c1:1:rwlock_timeout:2"), "the newest hold goes first");
    assert_eq!(cmd(&mut con, &["RWLOCK.RELEASE", "L", "nobody:1", "READ"]), Value::Nil);
    assert_eq!(cmd(&mut con, &["RWLOCK.RELEASE", "L", "c1:1", "READ"]), Value::Int(0));
    assert_eq!(hgetall(&mut con, b"L"), pairs(&[("mode", "read"), ("c2:1", "1")]));
    let left = pttl(&mut con, "L");
    assert!(left <= 20_000 && left > 18_000, "recomputed from the live holds: {left}");
    assert_eq!(cmd(&mut con, &["RWLOCK.RELEASE", "L", "c2:1", "READ"]), Value::Int(1));
    assert_eq!(cmd(&mut con, &["KEYS", "*"]), Value::Array(vec![]));
}

#[test]
fn a_writer_excludes_everyone_re_enters_reads_beside_itself_and_downgrades() {
    let server = Server::start();
    let mut con = server.conn();
    assert_eq!(cmd(&mut con, &["RWLOCK.ACQUIRE", "L", "w:1", "WRITE", "30000"]), Value::Nil);
    assert_eq!(cmd(&mut con, &["RWLOCK.ACQUIRE", "L", "w:1", "WRITE", "30000"]), Value::Nil);
    assert!(
        matches!(cmd(&mut con, &["RWLOCK.ACQUIRE", "L", "r:1", "READ", "1000"]), Value::Int(n) if n > 0)
    );
    assert!(
        matches!(cmd(&mut con, &["RWLOCK.ACQUIRE", "L", "x:1", "WRITE", "1000"]), Value::Int(n) if n > 0)
    );
    // Write -> read re-entry by the writer itself.
    assert_eq!(cmd(&mut con, &["RWLOCK.ACQUIRE", "L", "w:1", "READ", "30000"]), Value::Nil);
    assert_eq!(
        hgetall(&mut con, b"L"),
        pairs(&[("mode", "write"), ("w:1:write", "2"), ("w:1", "1")])
    );
    assert_eq!(cmd(&mut con, &["RWLOCK.RELEASE", "L", "w:1", "WRITE"]), Value::Int(0));
    assert_eq!(cmd(&mut con, &["RWLOCK.RELEASE", "L", "r:1", "WRITE"]), Value::Nil);
    // The last write hold ends while the owner still reads: a downgrade (reply 1), read mode.
    let mut sub = server.conn();
    sub.set_read_timeout(Some(Duration::from_millis(300))).expect("timeout");
    let mut pubsub = sub.as_pubsub();
    pubsub.subscribe("redisson_rwlock:{L}").expect("subscribe");
    assert_eq!(cmd(&mut con, &["RWLOCK.RELEASE", "L", "w:1", "WRITE"]), Value::Int(1));
    assert_eq!(hgetall(&mut con, b"L"), pairs(&[("mode", "read"), ("w:1", "1")]));
    assert!(pubsub.get_message().is_err(), "a downgrade publishes nothing");
    // Others may read now; the last read release frees it and publishes 0.
    assert_eq!(cmd(&mut con, &["RWLOCK.ACQUIRE", "L", "r:1", "READ", "30000"]), Value::Nil);
    assert_eq!(cmd(&mut con, &["RWLOCK.RELEASE", "L", "w:1", "READ"]), Value::Int(0));
    assert_eq!(cmd(&mut con, &["RWLOCK.RELEASE", "L", "r:1", "READ"]), Value::Int(1));
    let message = pubsub.get_message().expect("published");
    assert_eq!(message.get_payload::<String>().expect("payload"), "0");
    // A write release that frees the lock publishes 1.
    assert_eq!(cmd(&mut con, &["RWLOCK.ACQUIRE", "L", "w:1", "WRITE", "30000"]), Value::Nil);
    assert_eq!(cmd(&mut con, &["RWLOCK.RELEASE", "L", "w:1", "WRITE"]), Value::Int(1));
    let message = pubsub.get_message().expect("published");
    assert_eq!(message.get_payload::<String>().expect("payload"), "1");
    assert!(!exists(&mut con, "L"));
}

#[test]
fn an_upgrade_is_busy_without_wait_and_an_error_with_it_never_a_self_deadlock() {
    let server = Server::start();
    let mut con = server.conn();
    cmd(&mut con, &["RWLOCK.ACQUIRE", "L", "o:1", "READ", "30000"]);
    let busy = cmd(&mut con, &["RWLOCK.ACQUIRE", "L", "o:1", "WRITE", "30000"]);
    assert!(matches!(busy, Value::Int(n) if n > 28_000), "as Redisson: busy, {busy:?}");
    let before = digest(&mut con);
    let err = run_str(&mut con, &["RWLOCK.ACQUIRE", "L", "o:1", "WRITE", "30000", "WAIT", "0"])
        .unwrap_err();
    assert!(err.starts_with("ERR") && err.contains("upgrade"), "{err}");
    assert_eq!(digest(&mut con), before, "nothing changed");
    assert_eq!(blocked_clients(&mut con), 0, "nobody waits for itself");
}

#[test]
fn a_write_token_shares_the_plain_locks_counter_and_read_takes_none() {
    let server = Server::start();
    let mut con = server.conn();
    let acquire = ["RWLOCK.ACQUIRE", "L", "w:1", "WRITE", "30000", "TOKEN"];
    let first = granted_token(&cmd(&mut con, &acquire));
    assert_eq!(
        cmd(&mut con, &["GET", "redisson_lock_token:{L}"]),
        Value::BulkString(first.to_string().into_bytes())
    );
    cmd(&mut con, &["RWLOCK.RELEASE", "L", "w:1", "WRITE"]);
    let second = granted_token(&cmd(&mut con, &["RLOCK.ACQUIRE", "L", "p", "30000", "TOKEN"]));
    assert!(second > first, "one counter per name: {first} then {second}");
    cmd(&mut con, &["RLOCK.RELEASE", "L", "p"]);
    cmd(&mut con, &["RWLOCK.ACQUIRE", "L", "x:1", "WRITE", "30000"]);
    let busy = cmd(&mut con, &acquire);
    assert!(
        matches!(&busy, Value::Array(v) if v[0] == Value::Int(0) && matches!(v[1], Value::Int(n) if n > 0)),
        "{busy:?}"
    );
    let err = run_str(&mut con, &["RWLOCK.ACQUIRE", "M", "r:1", "READ", "30000", "TOKEN"]);
    assert!(err.unwrap_err().starts_with("ERR syntax error"));
}

#[test]
fn bad_input_gets_a_clear_error_and_changes_nothing() {
    let server = Server::start();
    let mut con = server.conn();
    cmd(&mut con, &["SET", "s", "x"]);
    cmd(&mut con, &["RLOCK.ACQUIRE", "plain", "p", "30000"]);
    // A reentrant lock whose owner is named `mode`: its hash's one field is `mode`, a count.
    cmd(&mut con, &["RLOCK.ACQUIRE", "moded", "mode", "30000"]);
    cmd(&mut con, &["RWLOCK.ACQUIRE", "rw", "o:1", "READ", "30000"]);
    let before = digest(&mut con);
    let cases: &[(&[&str], &str)] = &[
        (&["RWLOCK.ACQUIRE", "L", "o", "READ"], "ERR wrong number of arguments"),
        (&["RWLOCK.ACQUIRE", "L", "o", "BOTH", "10"], "ERR mode must be READ or WRITE"),
        (&["RWLOCK.ACQUIRE", "L", "o", "READ", "0"], "ERR lease-ms"),
        (&["RWLOCK.ACQUIRE", "L", "", "READ", "10"], "ERR owner must not be empty"),
        (&["RWLOCK.ACQUIRE", "L", "o:write", "READ", "10"], "ERR owner must not be 'mode'"),
        (&["RWLOCK.ACQUIRE", "L", "mode", "WRITE", "10"], "ERR owner must not be 'mode'"),
        (&["RWLOCK.ACQUIRE", "L", "o", "READ", "10", "EXTRA"], "ERR syntax error"),
        (&["RWLOCK.ACQUIRE", "s", "o", "READ", "10"], "WRONGTYPE"),
        (
            &["RWLOCK.ACQUIRE", "plain", "o", "READ", "10"],
            "WRONGTYPE the key holds a reentrant lock",
        ),
        (&["RWLOCK.RELEASE", "plain", "p", "WRITE"], "WRONGTYPE the key holds a reentrant lock"),
        (&["RWLOCK.RENEW", "plain", "p", "10"], "WRONGTYPE the key holds a reentrant lock"),
        (&["RWLOCK.INFO", "plain"], "WRONGTYPE the key holds a reentrant lock"),
        (&["RWLOCK.ACQUIRE", "moded", "o", "READ", "10"], "WRONGTYPE the key holds a reentrant"),
        (&["RWLOCK.RELEASE", "moded", "o", "READ"], "WRONGTYPE the key holds a reentrant lock"),
        (&["RWLOCK.INFO", "moded"], "WRONGTYPE the key holds a reentrant lock"),
        (&["RLOCK.ACQUIRE", "rw", "o:1", "10"], "WRONGTYPE the key holds a read-write lock"),
        (&["RLOCK.RELEASE", "rw", "o:1"], "WRONGTYPE the key holds a read-write lock"),
        (&["RLOCK.RENEW", "rw", "o:1", "10"], "WRONGTYPE the key holds a read-write lock"),
        (&["RWLOCK.RELEASE", "L", "o", "READ", "REQUEST"], "ERR request id"),
        (&["RWLOCK.FORCERELEASE", "L", "x"], "ERR wrong number of arguments"),
    ];
    for (args, expected) in cases {
        let err = run_str(&mut con, args).unwrap_err();
        assert!(err.starts_with(expected), "{args:?}: {err}");
    }
    assert_eq!(digest(&mut con), before, "no error changed anything");
    // Commands that act on any lock key still do.
    assert!(matches!(cmd(&mut con, &["RLOCK.PTTL", "rw"]), Value::Int(n) if n > 0));
}

#[test]
fn renew_and_force_release() {
    let server = Server::start();
    let mut con = server.conn();
    cmd(&mut con, &["RWLOCK.ACQUIRE", "L", "o:1", "READ", "5000"]);
    cmd(&mut con, &["RWLOCK.ACQUIRE", "L", "o:1", "READ", "5000"]);
    assert_eq!(cmd(&mut con, &["RWLOCK.RENEW", "L", "o:1", "60000"]), Value::Int(1));
    for hold in ["{L}:o:1:rwlock_timeout:1", "{L}:o:1:rwlock_timeout:2", "L"] {
        assert!(pttl(&mut con, hold) > 58_000, "{hold} renewed");
    }
    let before = digest(&mut con);
    assert_eq!(cmd(&mut con, &["RWLOCK.RENEW", "L", "other:1", "60000"]), Value::Int(0));
    assert_eq!(cmd(&mut con, &["RWLOCK.RENEW", "free", "o:1", "60000"]), Value::Int(0));
    assert_eq!(digest(&mut con), before, "nothing created for a non-holder");
    assert_eq!(cmd(&mut con, &["RWLOCK.FORCERELEASE", "L"]), Value::Int(1));
    assert_eq!(cmd(&mut con, &["RWLOCK.FORCERELEASE", "L"]), Value::Int(0));
    assert!(!exists(&mut con, "L"));
}

#[test]
fn info_reports_mode_holders_and_waiters() {
    let server = Server::start();
    let mut con = server.conn();
    assert_eq!(cmd(&mut con, &["RWLOCK.INFO", "L"]), Value::Nil);
    cmd(&mut con, &["RWLOCK.ACQUIRE", "L", "a:1", "READ", "30000"]);
    cmd(&mut con, &["RWLOCK.ACQUIRE", "L", "a:1", "READ", "30000"]);
    cmd(&mut con, &["RWLOCK.ACQUIRE", "L", "b:1", "READ", "30000"]);
    let w =
        Pending::start_str(&server, &["RWLOCK.ACQUIRE", "L", "w:1", "WRITE", "30000", "WAIT", "0"]);
    wait_blocked(&mut con, 1);
    let r =
        Pending::start_str(&server, &["RWLOCK.ACQUIRE", "L", "c:1", "READ", "30000", "WAIT", "0"]);
    wait_blocked(&mut con, 2);
    let info = info_map(&mut con, "L");
    assert_eq!(field(&info, "mode"), Value::BulkString(b"read".to_vec()));
    assert_eq!(field(&info, "writer"), Value::Nil);
    assert_eq!(field(&info, "readers"), Value::Int(2));
    assert_eq!(field(&info, "read_holds"), Value::Int(3));
    assert_eq!(field(&info, "waiting_readers"), Value::Int(1));
    assert_eq!(field(&info, "waiting_writers"), Value::Int(1));
    cmd(&mut con, &["RWLOCK.FORCERELEASE", "L"]);
    assert_eq!(w.reply(LIMIT).0, Ok(Value::Nil));
    let info = info_map(&mut con, "L");
    assert_eq!(field(&info, "writer"), Value::BulkString(b"w:1".to_vec()));
    assert_eq!(field(&info, "write_count"), Value::Int(1));
    cmd(&mut con, &["RWLOCK.RELEASE", "L", "w:1", "WRITE"]);
    assert_eq!(r.reply(LIMIT).0, Ok(Value::Nil));
}

/// Phase-alternating FIFO: a reader arriving while a writer waits queues behind it; the
/// writer gets the lock when the readers leave; its release grants every reader at the head at
/// once, up to the next writer.
#[test]
fn waiting_is_fair_writers_are_never_starved_and_readers_enter_together() {
    let server = Server::start();
    let mut con = server.conn();
    cmd(&mut con, &["RWLOCK.ACQUIRE", "L", "r0:1", "READ", "30000"]);
    let w1 = Pending::start_str(
        &server,
        &["RWLOCK.ACQUIRE", "L", "w1:1", "WRITE", "30000", "WAIT", "0"],
    );
    wait_blocked(&mut con, 1);
    // A newcomer reader does not jump the queued writer, with or without WAIT.
    let busy = cmd(&mut con, &["RWLOCK.ACQUIRE", "L", "late:1", "READ", "30000"]);
    assert!(matches!(busy, Value::Int(n) if n > 0), "{busy:?}");
    let readers: Vec<Pending> = ["r1:1", "r2:1", "r3:1"]
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let p = Pending::start_str(
                &server,
                &["RWLOCK.ACQUIRE", "L", r, "READ", "30000", "WAIT", "0"],
            );
            wait_blocked(&mut con, 2 + i as i64);
            p
        })
        .collect();
    let w2 = Pending::start_str(
        &server,
        &["RWLOCK.ACQUIRE", "L", "w2:1", "WRITE", "30000", "WAIT", "0"],
    );
    wait_blocked(&mut con, 5);
    // The holder re-enters read even though a writer waits: it is not a newcomer.
    assert_eq!(cmd(&mut con, &["RWLOCK.ACQUIRE", "L", "r0:1", "READ", "30000"]), Value::Nil);
    cmd(&mut con, &["RWLOCK.RELEASE", "L", "r0:1", "READ"]);
    assert!(!w1.replied(), "a reader still holds");
    assert_eq!(cmd(&mut con, &["RWLOCK.RELEASE", "L", "r0:1", "READ"]), Value::Int(1));
    assert_eq!(w1.reply(LIMIT).0, Ok(Value::Nil));
    assert_eq!(hgetall(&mut con, b"L"), pairs(&[("mode", "write"), ("w1:1:write", "1")]));
    let handoffs = info_field(&mut con, "rlock", "rlock_handoffs");
    assert_eq!(cmd(&mut con, &["RWLOCK.RELEASE", "L", "w1:1", "WRITE"]), Value::Int(1));
    for r in readers {
        assert_eq!(r.reply(LIMIT).0, Ok(Value::Nil));
    }
    assert_eq!(
        info_field(&mut con, "rlock", "rlock_handoffs"),
        handoffs + 3,
        "one release, three grants"
    );
    assert_eq!(
        hgetall(&mut con, b"L"),
        pairs(&[("mode", "read"), ("r1:1", "1"), ("r2:1", "1"), ("r3:1", "1")])
    );
    assert!(!w2.replied(), "the next writer waits for the readers");
    for r in ["r1:1", "r2:1", "r3:1"] {
        cmd(&mut con, &["RWLOCK.RELEASE", "L", r, "READ"]);
    }
    assert_eq!(w2.reply(LIMIT).0, Ok(Value::Nil));
    assert_eq!(blocked_clients(&mut con), 0);
}

/// A reader whose hold lease ends leaves by itself (a timer), so a queued writer gets the lock
/// then, not at some other reader's unlock; the same for a reader a Redisson client wrote.
#[test]
fn a_dead_reader_is_removed_when_its_lease_ends_and_the_writer_is_served() {
    let server = Server::start();
    let mut con = server.conn();
    cmd(&mut con, &["RWLOCK.ACQUIRE", "L", "short:1", "READ", "200"]);
    cmd(&mut con, &["RWLOCK.ACQUIRE", "L", "long:1", "READ", "60000"]);
    poll("the dead reader to leave", LIMIT, || {
        (hgetall(&mut con, b"L") == pairs(&[("mode", "read"), ("long:1", "1")])).then_some(())
    });
    assert_eq!(info_field(&mut con, "rlock", "rlock_dead_reader_reaps"), 1);
    cmd(&mut con, &["RWLOCK.RELEASE", "L", "long:1", "READ"]);

    // A Redisson reader (its read-acquire script's writes): a 300 ms hold on a 60 s hash.
    cmd(&mut con, &["HSET", "M", "mode", "read", "j:1", "1"]);
    cmd(&mut con, &["SET", "{M}:j:1:rwlock_timeout:1", "1", "PX", "300"]);
    cmd(&mut con, &["PEXPIRE", "{M}:j:1:rwlock_timeout:1", "300"]);
    cmd(&mut con, &["PEXPIRE", "M", "60000"]);
    let writer =
        Pending::start_str(&server, &["RWLOCK.ACQUIRE", "M", "w:1", "WRITE", "30000", "WAIT", "0"]);
    let (reply, _) = writer.reply(LIMIT);
    assert_eq!(reply, Ok(Value::Nil), "served when the dead reader left");
    assert_eq!(hgetall(&mut con, b"M"), pairs(&[("mode", "write"), ("w:1:write", "1")]));
}

#[test]
fn waits_never_block_in_multi_and_a_waiter_that_leaves_leaves_the_queue() {
    let server = Server::start();
    let mut con = server.conn();
    cmd(&mut con, &["RWLOCK.ACQUIRE", "L", "w:1", "WRITE", "30000"]);
    let replies: Vec<Value> = redis::pipe()
        .atomic()
        .cmd("RWLOCK.ACQUIRE")
        .arg("L")
        .arg("r:1")
        .arg("READ")
        .arg(1000)
        .arg("WAIT")
        .arg(0)
        .query(&mut con)
        .expect("MULTI");
    assert!(matches!(replies[0], Value::Int(n) if n > 0), "{replies:?}");
    let waiter = Pending::start_str(
        &server,
        &["RWLOCK.ACQUIRE", "L", "gone:1", "READ", "1000", "WAIT", "0"],
    );
    wait_blocked(&mut con, 1);
    let _: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("normal")
        .arg("SKIPME")
        .arg("yes")
        .query(&mut con)
        .expect("CLIENT KILL");
    assert!(waiter.reply(LIMIT).0.is_err(), "its connection was killed");
    poll("no waiter", LIMIT, || (blocked_clients(&mut con) == 0).then_some(()));
    assert_eq!(cmd(&mut con, &["RWLOCK.RELEASE", "L", "w:1", "WRITE"]), Value::Int(1));
    assert!(!exists(&mut con, "L"), "nobody was granted the lock after leaving");
}

// ---- a Redisson client beside rlock (its scripts: `rlock_tests_integration::redisson`) -------

/// A Redisson thread on the lock `name`.
struct Redisson<'a> {
    name: &'a str,
    me: &'a str,
}

impl Redisson<'_> {
    fn run(&self, con: &mut Connection, call: &Call) -> Value {
        call.command(None).query(con).expect("script")
    }

    fn thread(&self) -> RedissonRw {
        RedissonRw::new(self.name, self.me)
    }

    fn read(&self, con: &mut Connection, lease_ms: u64) -> Value {
        self.run(con, &self.thread().read(lease_ms))
    }

    fn read_unlock(&self, con: &mut Connection) -> Value {
        self.run(con, &self.thread().read_unlock())
    }

    fn write(&self, con: &mut Connection, lease_ms: u64) -> Value {
        self.run(con, &self.thread().write(lease_ms))
    }

    fn write_unlock(&self, con: &mut Connection) -> Value {
        self.run(con, &self.thread().write_unlock())
    }
}

#[test]
fn redisson_and_rlock_readers_share_and_writers_exclude_both() {
    let server = Server::start();
    let mut con = server.conn();
    let java = Redisson { name: "L", me: "9f1c-uuid:12" };
    assert_eq!(java.read(&mut con, 30_000), Value::Nil);
    assert_eq!(cmd(&mut con, &["RWLOCK.ACQUIRE", "L", "rs:1", "READ", "60000"]), Value::Nil);
    assert_eq!(java.read(&mut con, 30_000), Value::Nil, "re-entry beside an rlock reader");
    // Writers of both kinds are kept out.
    assert!(
        matches!(cmd(&mut con, &["RWLOCK.ACQUIRE", "L", "w:1", "WRITE", "1000"]), Value::Int(n) if n > 0)
    );
    let other = Redisson { name: "L", me: "77aa-uuid:3" };
    assert!(matches!(other.write(&mut con, 1000), Value::Int(n) if n > 0));
    // The Redisson reader's unlocks leave the rlock reader's hold in place: its lease key is live.
    assert_eq!(java.read_unlock(&mut con), Value::Int(0));
    assert_eq!(java.read_unlock(&mut con), Value::Int(0));
    assert_eq!(hgetall(&mut con, b"L"), pairs(&[("mode", "read"), ("rs:1", "1")]));
    assert!(pttl(&mut con, "L") > 58_000, "the hash lives as long as the rlock reader's hold");
    // And the reverse: an rlock release leaves a Redisson reader in place.
    assert_eq!(java.read(&mut con, 30_000), Value::Nil);
    assert_eq!(cmd(&mut con, &["RWLOCK.RELEASE", "L", "rs:1", "READ"]), Value::Int(0));
    assert_eq!(hgetall(&mut con, b"L"), pairs(&[("mode", "read"), ("9f1c-uuid:12", "1")]));
    assert_eq!(java.read_unlock(&mut con), Value::Int(1));
    assert!(!exists(&mut con, "L"));
    // A Redisson writer keeps rlock readers and writers out; rlock's writer keeps Redisson out.
    assert_eq!(other.write(&mut con, 30_000), Value::Nil);
    assert!(
        matches!(cmd(&mut con, &["RWLOCK.ACQUIRE", "L", "r:1", "READ", "1000"]), Value::Int(n) if n > 0)
    );
    assert_eq!(other.write_unlock(&mut con), Value::Int(1));
    assert_eq!(cmd(&mut con, &["RWLOCK.ACQUIRE", "L", "w:1", "WRITE", "30000"]), Value::Nil);
    assert!(matches!(java.read(&mut con, 1000), Value::Int(n) if n > 0));
    assert!(matches!(other.write(&mut con, 1000), Value::Int(n) if n > 0));
}

#[test]
fn rlock_waiters_are_served_by_redisson_unlocks_and_redisson_hears_rlock_releases() {
    let server = Server::start();
    let mut con = server.conn();
    let java = Redisson { name: "L", me: "9f1c-uuid:12" };
    // An rlock writer waits for a Redisson reader; the reader's unlock (DEL) serves it.
    assert_eq!(java.read(&mut con, 60_000), Value::Nil);
    let writer =
        Pending::start_str(&server, &["RWLOCK.ACQUIRE", "L", "w:1", "WRITE", "30000", "WAIT", "0"]);
    wait_blocked(&mut con, 1);
    assert_eq!(java.read_unlock(&mut con), Value::Int(1));
    assert_eq!(writer.reply(LIMIT).0, Ok(Value::Nil));
    // Redisson's waiters subscribe to the channel: rlock's write release tells them (1).
    let mut sub = server.conn();
    sub.set_read_timeout(Some(LIMIT)).expect("timeout");
    let mut pubsub = sub.as_pubsub();
    pubsub.subscribe("redisson_rwlock:{L}").expect("subscribe");
    assert_eq!(cmd(&mut con, &["RWLOCK.RELEASE", "L", "w:1", "WRITE"]), Value::Int(1));
    let message = pubsub.get_message().expect("published");
    assert_eq!(message.get_payload::<String>().expect("payload"), "1");
    // An rlock reader waits for a Redisson writer; the writer's unlock serves it.
    let other = Redisson { name: "L", me: "77aa-uuid:3" };
    assert_eq!(other.write(&mut con, 60_000), Value::Nil);
    let reader =
        Pending::start_str(&server, &["RWLOCK.ACQUIRE", "L", "r:1", "READ", "30000", "WAIT", "0"]);
    wait_blocked(&mut con, 1);
    assert_eq!(other.write_unlock(&mut con), Value::Int(1));
    assert_eq!(reader.reply(LIMIT).0, Ok(Value::Nil));
    assert_eq!(hgetall(&mut con, b"L"), pairs(&[("mode", "read"), ("r:1", "1")]));
    let message = pubsub.get_message().expect("Redisson's own unlock message");
    assert_eq!(message.get_payload::<String>().expect("payload"), "1");
    // ...and its read release that frees the lock says 0.
    assert_eq!(cmd(&mut con, &["RWLOCK.RELEASE", "L", "r:1", "READ"]), Value::Int(1));
    let message = pubsub.get_message().expect("published");
    assert_eq!(message.get_payload::<String>().expect("payload"), "0");
}

#[test]
fn a_replica_without_the_module_holds_the_same_read_write_lock() {
    let master = Server::start();
    let replica = Server::builder().without_module().replica_of(&master).start();
    rlock_tests_integration::wait_replica_online(&master);
    let mut con = master.conn();
    cmd(&mut con, &["RWLOCK.ACQUIRE", "L", "a:1", "READ", "60000"]);
    cmd(&mut con, &["RWLOCK.ACQUIRE", "L", "a:1", "READ", "60000"]);
    cmd(&mut con, &["RWLOCK.ACQUIRE", "L", "b:1", "READ", "60000"]);
    cmd(&mut con, &["RWLOCK.RELEASE", "L", "a:1", "READ"]);
    cmd(&mut con, &["RWLOCK.ACQUIRE", "W", "w:1", "WRITE", "60000"]);
    let _: i64 = redis::cmd("WAIT").arg(1).arg(5000).query(&mut con).expect("WAIT");
    let mut r = replica.conn();
    for key in ["L", "W"] {
        assert_eq!(hgetall(&mut r, key.as_bytes()), hgetall(&mut con, key.as_bytes()), "{key}");
    }
    let keys = |c: &mut Connection| {
        let mut k: Vec<String> = redis::cmd("KEYS").arg("*").query(c).expect("KEYS");
        k.sort();
        k
    };
    assert_eq!(keys(&mut r), keys(&mut con));
    for key in ["L", "W", "{L}:a:1:rwlock_timeout:1", "{L}:b:1:rwlock_timeout:1"] {
        assert_eq!(
            rlock_tests_integration::pexpiretime(&mut r, key.as_bytes()),
            rlock_tests_integration::pexpiretime(&mut con, key.as_bytes()),
            "{key}: the same absolute deadline"
        );
    }
}

/// A user limited to the lock key may not create read hold keys or publish on the channel:
/// `NOPERM`, an `ACL LOG` entry, nothing changed; granted them, the same commands work.
#[test]
fn a_user_limited_to_the_lock_key_cannot_touch_hold_keys_or_the_channel() {
    let server = Server::start();
    let mut admin = server.conn();
    cmd(&mut admin, &["ACL", "SETUSER", "lim", "on", "nopass", "~L", "resetchannels", "+@all"]);
    let mut lim = server.conn();
    cmd(&mut lim, &["AUTH", "lim", "any"]);
    let before = digest(&mut admin);
    let err = run_str(&mut lim, &["RWLOCK.ACQUIRE", "L", "o:1", "READ", "10000"]).unwrap_err();
    assert!(err.starts_with("NOPERM") && err.contains("rwlock_timeout"), "{err}");
    assert_eq!(digest(&mut admin), before, "nothing changes on NOPERM");
    // A write hold needs no hold key, but its release publishes.
    assert_eq!(cmd(&mut lim, &["RWLOCK.ACQUIRE", "L", "o:1", "WRITE", "10000"]), Value::Nil);
    let before = digest(&mut admin);
    let err = run_str(&mut lim, &["RWLOCK.RELEASE", "L", "o:1", "WRITE"]).unwrap_err();
    assert!(err.starts_with("NOPERM"), "the release would publish: {err}");
    assert_eq!(digest(&mut admin), before, "still held");
    let log: Vec<Value> = redis::cmd("ACL").arg("LOG").query(&mut admin).expect("ACL LOG");
    let log = format!("{log:?}");
    assert!(
        log.contains("{L}:o:1:rwlock_timeout:1") && log.contains("redisson_rwlock:{L}"),
        "{log}"
    );
    cmd(&mut admin, &["ACL", "SETUSER", "lim", "~{L}:*", "&redisson_rwlock:*"]);
    assert_eq!(cmd(&mut lim, &["RWLOCK.RELEASE", "L", "o:1", "WRITE"]), Value::Int(1));
    assert_eq!(cmd(&mut lim, &["RWLOCK.ACQUIRE", "L", "o:1", "READ", "10000"]), Value::Nil);
    assert_eq!(cmd(&mut lim, &["RWLOCK.RELEASE", "L", "o:1", "READ"]), Value::Int(1));
}

#[test]
fn info_is_a_map_under_resp3() {
    let server = Server::start();
    let mut con = server.conn_resp3();
    cmd(&mut con, &["RWLOCK.ACQUIRE", "L", "w:1", "WRITE", "10000"]);
    let Value::Map(fields) = cmd(&mut con, &["RWLOCK.INFO", "L"]) else { panic!("a map") };
    let writer = fields
        .iter()
        .find(|(k, _)| *k == Value::BulkString(b"writer".to_vec()))
        .map(|(_, v)| v.clone());
    assert_eq!(writer, Some(Value::BulkString(b"w:1".to_vec())));
    assert_eq!(fields.len(), 12, "the queue figures come last");
}

#[test]
fn in_a_cluster_hold_keys_live_in_the_locks_slot_and_odd_braces_are_refused() {
    let cluster = rlock_tests_integration::Cluster::start(3);
    for (i, node) in cluster.nodes.iter().enumerate() {
        let key = cluster.key_on(i, "rw:");
        let mut con = node.conn();
        assert_eq!(cmd(&mut con, &["RWLOCK.ACQUIRE", &key, "a:1", "READ", "30000"]), Value::Nil);
        assert_eq!(cmd(&mut con, &["RWLOCK.ACQUIRE", &key, "b:1", "READ", "30000"]), Value::Nil);
        let hold = format!("{{{key}}}:a:1:rwlock_timeout:1");
        assert_eq!(cmd(&mut con, &["EXISTS", &hold]), Value::Int(1), "on the lock's node");
        assert_eq!(cmd(&mut con, &["RWLOCK.RELEASE", &key, "a:1", "READ"]), Value::Int(0));
        assert_eq!(cmd(&mut con, &["RWLOCK.RELEASE", &key, "b:1", "READ"]), Value::Int(1));
    }
    // A name whose braces form no hash tag: its hold key would land in another slot.
    let odd = "a{b";
    let slot = cluster.slot(odd.as_bytes());
    let node = cluster.nodes.iter().find(|n| run_str(&mut n.conn(), &["RWLOCK.INFO", odd]).is_ok());
    let node = node.unwrap_or_else(|| panic!("no node serves slot {slot}"));
    let mut con = node.conn();
    let before = digest(&mut con);
    let err = run_str(&mut con, &["RWLOCK.ACQUIRE", odd, "a:1", "READ", "30000"]).unwrap_err();
    assert!(err.starts_with("ERR") && err.contains("slot"), "{err}");
    assert_eq!(digest(&mut con), before);
}

/// In one transaction, `args` frees the lock and the waiting client `gone` is killed before
/// Redis could send it its grant.
fn release_then_kill(con: &mut Connection, args: &[&str], gone: &Pending) {
    let mut tx = redis::pipe();
    tx.atomic();
    tx.add_command(rlock_tests_integration::command(args));
    tx.cmd("CLIENT").arg("KILL").arg("ID").arg(gone.client_id());
    let (released, killed): (i64, i64) = tx.query(con).expect("MULTI/EXEC");
    assert_eq!((released, killed), (1, 1));
}

#[test]
fn a_waiter_gone_between_its_grant_and_its_reply_never_keeps_its_hold() {
    let server = Server::start();
    let mut con = server.conn();
    // A writer granted to a client that is gone: released, the next writer served.
    cmd(&mut con, &["RWLOCK.ACQUIRE", "L", "r:1", "READ", "60000"]);
    let gone = Pending::start_str(
        &server,
        &["RWLOCK.ACQUIRE", "L", "gone:1", "WRITE", "60000", "WAIT", "0"],
    );
    wait_blocked(&mut con, 1);
    let next = Pending::start_str(
        &server,
        &["RWLOCK.ACQUIRE", "L", "next:1", "WRITE", "60000", "WAIT", "0"],
    );
    wait_blocked(&mut con, 2);
    release_then_kill(&mut con, &["RWLOCK.RELEASE", "L", "r:1", "READ"], &gone);
    assert!(gone.reply(LIMIT).0.is_err(), "the killed client got no grant");
    assert_eq!(next.reply(LIMIT).0, Ok(Value::Nil));
    assert_eq!(hgetall(&mut con, b"L"), pairs(&[("mode", "write"), ("next:1:write", "1")]));
    // Readers granted together, one of them gone: only its hold is released.
    let gone = Pending::start_str(
        &server,
        &["RWLOCK.ACQUIRE", "L", "gone:2", "READ", "60000", "WAIT", "0"],
    );
    wait_blocked(&mut con, 1);
    let stays = Pending::start_str(
        &server,
        &["RWLOCK.ACQUIRE", "L", "stays:1", "READ", "60000", "WAIT", "0"],
    );
    wait_blocked(&mut con, 2);
    release_then_kill(&mut con, &["RWLOCK.RELEASE", "L", "next:1", "WRITE"], &gone);
    assert_eq!(stays.reply(LIMIT).0, Ok(Value::Nil));
    poll("the gone reader's hold released", LIMIT, || {
        (hgetall(&mut con, b"L") == pairs(&[("mode", "read"), ("stays:1", "1")])).then_some(())
    });
    assert!(!exists(&mut con, "{L}:gone:2:rwlock_timeout:1"), "its hold key went too");
    assert_eq!(info_field(&mut con, "rlock", "rlock_grants_rolled_back"), 2);
}

#[test]
fn a_retried_release_replies_what_the_first_did_and_lua_never_blocks() {
    let server = Server::start();
    let mut con = server.conn();
    cmd(&mut con, &["RWLOCK.ACQUIRE", "L", "w:1", "WRITE", "30000"]);
    let release = ["RWLOCK.RELEASE", "L", "w:1", "WRITE", "REQUEST", "req-1"];
    assert_eq!(cmd(&mut con, &release), Value::Int(1));
    cmd(&mut con, &["RWLOCK.ACQUIRE", "L", "x:1", "WRITE", "30000"]);
    let before = digest(&mut con);
    assert_eq!(cmd(&mut con, &release), Value::Int(1), "the first result, from the latch");
    assert_eq!(digest(&mut con), before, "and nothing released again");
    assert!(exists(&mut con, "redisson_unlock_latch:{L}:req-1"));
    // Inside a script a WAIT is one non-blocking try.
    let lua = "return redis.call('RWLOCK.ACQUIRE', KEYS[1], 'r:1', 'READ', 1000, 'WAIT', 0)";
    assert!(matches!(cmd(&mut con, &["EVAL", lua, "1", "L"]), Value::Int(n) if n > 0));
    // CLIENT UNBLOCK ends a wait with the busy reply.
    let waiter =
        Pending::start_str(&server, &["RWLOCK.ACQUIRE", "L", "r:1", "READ", "1000", "WAIT", "0"]);
    wait_blocked(&mut con, 1);
    let id = waiter.client_id().to_string();
    assert_eq!(cmd(&mut con, &["CLIENT", "UNBLOCK", &id]), Value::Int(1));
    assert!(matches!(waiter.reply(LIMIT).0, Ok(Value::Int(n)) if n > 0));
    assert_eq!(blocked_clients(&mut con), 0);
}

/// A read-write lock hash with `fields` readers holding `count` read holds each (a foreign
/// writer's: no hold key exists), written in one pipeline.
fn foreign_readers(con: &mut Connection, name: &str, fields: usize, count: u64) {
    let mut pipe = redis::pipe();
    pipe.cmd("HSET").arg(name).arg("mode").arg("read").ignore();
    for i in 0..fields {
        pipe.cmd("HSET").arg(name).arg(format!("r{i}")).arg(count).ignore();
    }
    let () = pipe.query(con).expect("HSET pipeline");
}

/// The 1,000-read-holds-per-owner limit bounds one owner's count, not a lock's: a foreign hash
/// of 20,000 readers at 1,000 holds each would make one `RWLOCK.RELEASE` read 20 million hold
/// keys (5.8 s with the server blocked, every other client waiting), and so would every
/// dead-reader check and every later release. A release, and a waiter's dead-reader check,
/// refuse a lock with more read holds in all than a release may walk (nothing changes), at once.
#[test]
fn a_lock_with_more_read_holds_in_all_than_a_release_may_walk_is_refused_at_once() {
    let server = Server::start();
    let mut con = server.conn();
    con.set_read_timeout(Some(Duration::from_secs(60))).expect("timeout");
    // Just past the limit: refused, nothing changes.
    foreign_readers(&mut con, "K", 101, 1000);
    let before = digest(&mut con);
    for mode in ["READ", "WRITE"] {
        let err = run_str(&mut con, &["RWLOCK.RELEASE", "K", "r1", mode]).unwrap_err();
        assert!(err.starts_with("ERR the lock holds more than 100000 read holds"), "{err}");
    }
    assert_eq!(digest(&mut con), before, "nothing changes on the refusal");
    // RWLOCK.INFO reads only the hash: it still reports the lock.
    let Value::Array(info) = cmd(&mut con, &["RWLOCK.INFO", "K"]) else { panic!("INFO") };
    assert!(info.contains(&Value::Int(101_000)), "{info:?}");
    // RWLOCK.FORCERELEASE clears it.
    assert_eq!(cmd(&mut con, &["RWLOCK.FORCERELEASE", "K"]), Value::Int(1));

    // 20 million holds: the refusal comes at once, not after a walk of every hold key.
    foreign_readers(&mut con, "K", 20_000, 1000);
    let before = digest(&mut con);
    let started = Instant::now();
    let err = run_str(&mut con, &["RWLOCK.RELEASE", "K", "r1", "READ"]).unwrap_err();
    let took = started.elapsed();
    assert!(err.starts_with("ERR the lock holds more than"), "{err}");
    assert!(took < Duration::from_millis(500), "the release blocked the server for {took:?}");
    assert_eq!(digest(&mut con), before);

    // A writer waiting for it: its dead-reader check must not block the server either.
    let mut waiter = server.conn();
    waiter.set_read_timeout(Some(Duration::from_secs(60))).expect("timeout");
    let started = Instant::now();
    let reply = run_str(&mut waiter, &["RWLOCK.ACQUIRE", "K", "w", "WRITE", "1000", "WAIT", "300"]);
    assert_eq!(reply, Ok(Value::Int(-1)), "timed out: the lock is still held");
    let took = started.elapsed();
    assert!(took < Duration::from_millis(1500), "the wait's checks blocked for {took:?}");
    assert_eq!(digest(&mut con), before);
}

// ---- Cost independent of the number of readers ---------------------------------------------

/// `n` readers on Redisson's layout, as its scripts write them: one field and one hold key each.
fn readers(con: &mut Connection, name: &str, n: usize) {
    let script = "for i = 1, tonumber(ARGV[1]) do \
                    redis.call('HSET', KEYS[1], 'r' .. i, 1) \
                    redis.call('SET', '{' .. KEYS[1] .. '}:r' .. i .. ':rwlock_timeout:1', 1, 'PX', 600000) \
                  end \
                  redis.call('HSET', KEYS[1], 'mode', 'read') \
                  return redis.call('PEXPIRE', KEYS[1], 600000)";
    cmd(con, &["EVAL", script, "1", name, &n.to_string()]);
}

fn usec_per_call(con: &mut Connection, command: &str) -> f64 {
    let info: String = redis::cmd("INFO").arg("commandstats").query(con).expect("INFO");
    let line = info
        .lines()
        .find(|l| l.starts_with(&format!("cmdstat_{command}:")))
        .unwrap_or_else(|| panic!("no stats for {command}: {info}"));
    let value = line.split(',').find_map(|kv| kv.strip_prefix("usec_per_call=")).expect("usec");
    value.parse().expect("a number")
}

fn cpu_seconds(con: &mut Connection) -> f64 {
    let info: String = redis::cmd("INFO").arg("cpu").query(con).expect("INFO cpu");
    ["used_cpu_sys:", "used_cpu_user:"]
        .iter()
        .map(|f| {
            let line = info.lines().find_map(|l| l.strip_prefix(f)).expect("cpu field");
            line.trim().parse::<f64>().expect("a number")
        })
        .sum()
}

/// The acquire's server cost (µs per call) on a lock with `n` readers and a waiting writer.
fn acquire_cost(server: &Server, con: &mut Connection, name: &str) -> f64 {
    cmd(con, &["CONFIG", "RESETSTAT"]);
    for i in 0..200 {
        // A re-entry (granted) and a newcomer (queued behind the writer: busy).
        cmd(con, &["RWLOCK.ACQUIRE", name, "r1", "READ", "60000"]);
        cmd(con, &["RWLOCK.ACQUIRE", name, &format!("new{i}"), "READ", "60000"]);
    }
    let _ = server;
    usec_per_call(con, "rwlock.acquire")
}

#[test]
fn a_lock_with_20000_readers_costs_what_one_with_10_costs() {
    let server = Server::start();
    let mut con = server.conn();
    readers(&mut con, "small", 10);
    readers(&mut con, "big", 20_000);
    let _small = Pending::start_str(
        &server,
        &["RWLOCK.ACQUIRE", "small", "w", "WRITE", "60000", "WAIT", "100000"],
    );
    let _big = Pending::start_str(
        &server,
        &["RWLOCK.ACQUIRE", "big", "w", "WRITE", "60000", "WAIT", "100000"],
    );
    wait_blocked(&mut con, 2);

    // The waiters' poll looks at both locks every 10 ms: over 2 s the server stays nearly idle
    // (it spent ~90 % of a core opening every hold key of `big` at each look).
    let (cpu, started) = (cpu_seconds(&mut con), Instant::now());
    thread::sleep(Duration::from_secs(2));
    let share = (cpu_seconds(&mut con) - cpu) / started.elapsed().as_secs_f64();
    eprintln!("waiting: {:.1} % of a core", share * 100.0);
    assert!(share < 0.25, "the server used {:.0} % of a core waiting", share * 100.0);

    let small = acquire_cost(&server, &mut con, "small");
    let big = acquire_cost(&server, &mut con, "big");
    eprintln!("acquire: {big:.2} µs with 20,000 readers, {small:.2} µs with 10");
    assert!(
        big < small * 5.0 + 20.0,
        "acquire: {big:.1} µs with 20,000 readers, {small:.1} µs with 10"
    );
}

// ---- Counts in the hash bound nothing ---------------------------------------------------------

/// A read count written by a foreign `HSET` (9e18) hung the server in a release: now it is a
/// corrupt count, and nothing changes.
#[test]
fn a_huge_foreign_read_count_is_refused_by_a_release_not_looped_over() {
    let server = Server::start();
    let mut con = server.conn();
    con.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
    cmd(&mut con, &["HSET", "K", "mode", "read", "x", "9000000000000000000"]);
    let before = digest(&mut con);
    let err = run_str(&mut con, &["RWLOCK.RELEASE", "K", "x", "READ"]).unwrap_err();
    assert!(err.starts_with("ERR the lock hash holds a hold count"), "{err}");
    assert_eq!(digest(&mut con), before);
    // Another reader's release, and the INFO, see the same corrupt count.
    cmd(&mut con, &["HSET", "K", "y", "1"]);
    let err = run_str(&mut con, &["RWLOCK.RELEASE", "K", "y", "READ"]).unwrap_err();
    assert!(err.starts_with("ERR the lock hash holds a hold count"), "{err}");
    let err = run_str(&mut con, &["RWLOCK.INFO", "K"]).unwrap_err();
    assert!(err.starts_with("ERR the lock hash holds a hold count"), "{err}");
}

/// A read count above the documented maximum (1,000) is corrupt for a renewal (10^10 made
/// `RENEW` allocate one effect per hold until the OOM killer came).
#[test]
fn a_read_count_above_the_maximum_is_refused_by_a_renewal() {
    let server = Server::start();
    let mut con = server.conn();
    con.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
    for count in ["1001", "10000000000"] {
        cmd(&mut con, &["HSET", "K", "mode", "read", "x", count]);
        let before = digest(&mut con);
        let err = run_str(&mut con, &["RWLOCK.RENEW", "K", "x", "1000"]).unwrap_err();
        assert!(err.starts_with("ERR the lock hash holds a hold count"), "{count}: {err}");
        let err = run_str(&mut con, &["RWLOCK.ACQUIRE", "K", "x", "READ", "1000"]).unwrap_err();
        assert!(err.starts_with("ERR the lock hash holds a hold count"), "{count}: {err}");
        assert_eq!(digest(&mut con), before, "{count}");
    }
}

/// An owner re-enters the read lock at most 1,000 times; the next re-entry is refused with a
/// clear error and nothing changes.
#[test]
fn read_re_entry_stops_at_the_documented_maximum() {
    let server = Server::start();
    let mut con = server.conn();
    let mut pipe = redis::pipe();
    for _ in 0..1000 {
        pipe.cmd("RWLOCK.ACQUIRE").arg("K").arg("o").arg("READ").arg("60000");
    }
    let replies: Vec<Value> = pipe.query(&mut con).expect("pipeline");
    assert!(replies.iter().all(|r| *r == Value::Nil), "every re-entry up to 1,000 is granted");
    let before = digest(&mut con);
    let err = run_str(&mut con, &["RWLOCK.ACQUIRE", "K", "o", "READ", "60000"]).unwrap_err();
    assert!(err.starts_with("ERR read hold limit"), "{err}");
    let err = run_str(&mut con, &["RWLOCK.ACQUIRE", "K", "o", "READ", "60000", "WAIT", "100"]);
    assert!(err.unwrap_err().starts_with("ERR read hold limit"));
    assert_eq!(digest(&mut con), before);
    // Renewing and releasing all 1,000 holds works.
    assert_eq!(cmd(&mut con, &["RWLOCK.RENEW", "K", "o", "30000"]), Value::Int(1));
    for _ in 0..999 {
        assert_eq!(cmd(&mut con, &["RWLOCK.RELEASE", "K", "o", "READ"]), Value::Int(0));
    }
    assert_eq!(cmd(&mut con, &["RWLOCK.RELEASE", "K", "o", "READ"]), Value::Int(1));
    assert_eq!(cmd(&mut con, &["DBSIZE"]), Value::Int(0));
}
