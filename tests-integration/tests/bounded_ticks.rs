//! The module's timer ticks are bounded by the work they do, not by the number of events or
//! holds: thousands of awaiters timing out at once, or a connection bound to
//! thousands of read holds closing, are served over several ticks, the server answering its
//! clients in between, and at a cost that grows with what is done, never with what waits
//! beside it. `INFO rlock` counts the timers' work (`rlock_timer_work`, about one key read a
//! unit) and the ticks that stopped at their budget with work left (`rlock_timer_ticks_split`):
//! these tests check the two without timing anything.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use redis::{Connection, Value};
use rlock_tests_integration::{
    client_id, cmd, exists, hgetall, info_field, kill_client, poll, queue_str, session_ends,
    wait_blocked, Server,
};

const LIMIT: Duration = Duration::from_secs(30);

fn timer_work(con: &mut Connection) -> i64 {
    info_field(con, "rlock", "rlock_timer_work")
}

fn ticks_split(con: &mut Connection) -> i64 {
    info_field(con, "rlock", "rlock_timer_ticks_split")
}

/// A command in RESP.
fn resp(args: &[&str]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        out.extend_from_slice(format!("${}\r\n{a}\r\n", a.len()).as_bytes());
    }
    out
}

/// 2,000 latch awaiters time out at once (their timeouts all come due during a `DEBUG SLEEP`,
/// so one timer tick finds every one of them due). Before, that one tick answered them all and
/// each timeout walked every awaiter still waiting (2 million queue entries here, 72 million
/// for 12,000: a stall of a second); now each costs a few units, and the tick stops at its
/// budget, the rest answered by the next ones.
#[test]
fn awaiters_timing_out_together_are_answered_over_several_ticks_at_a_cost_linear_in_them() {
    let server = Server::start();
    let mut admin = server.conn();
    let n: i64 = 2_000;
    cmd(&mut admin, &["SET", "gate", "1"]);
    let mut clients: Vec<TcpStream> = (0..n)
        .map(|_| TcpStream::connect(("127.0.0.1", server.port())).expect("connect"))
        .collect();
    let await_gate = resp(&["RLATCH.AWAIT", "gate", "200"]);
    for c in &mut clients {
        c.write_all(&await_gate).expect("send");
    }
    wait_blocked(&mut admin, n);
    let (work, split) = (timer_work(&mut admin), ticks_split(&mut admin));
    let timeouts = info_field(&mut admin, "rlock", "rlock_timeouts");
    // Every timeout comes due while the server sleeps.
    cmd(&mut admin, &["DEBUG", "SLEEP", "0.5"]);
    for c in &mut clients {
        c.set_read_timeout(Some(LIMIT)).expect("timeout");
        let mut reply = [0u8; 4];
        c.read_exact(&mut reply).expect("a reply");
        assert_eq!(&reply, b":0\r\n", "timed out, the latch still closed");
    }
    assert_eq!(info_field(&mut admin, "rlock", "rlock_timeouts") - timeouts, n);
    let work = timer_work(&mut admin) - work;
    assert!(work <= 20 * n, "{work} units of work for {n} timeouts");
    assert!(ticks_split(&mut admin) > split, "answered in one tick ({work} units)");
    assert_eq!(info_field(&mut admin, "rlock", "rlock_waiting_clients"), 0);
}

/// `RWLOCK.ACQUIRE ... READ ... SESSION` `count` times as `owner` on `con`.
fn read_holds(con: &mut Connection, lock: &str, owner: &str, count: usize, extra: &[&str]) {
    let mut pipe = redis::pipe();
    for _ in 0..count {
        pipe.cmd("RWLOCK.ACQUIRE").arg(lock).arg(owner).arg("READ").arg(600_000).arg("SESSION");
        for a in extra {
            pipe.arg(*a);
        }
    }
    let replies: Vec<Value> = pipe.query(con).expect("acquire");
    assert!(replies.iter().all(|v| *v == Value::Nil), "every read granted: {replies:?}");
}

/// A connection bound to 40 owners × 100 read holds of one lock closes, beside a reader of
/// another connection. Before, each owner's end read every read hold left on the lock (40
/// ends: about 90,000 units of work here; 40 × 1,000 read holds took 1.5 s) and all
/// ended in one tick; now the ends read and write only their own fields and hold keys, over
/// several ticks, and the lock is settled once: the reader that stays holds it, with its own
/// lease.
#[test]
fn a_closed_connections_read_sides_of_one_lock_end_together_over_bounded_ticks() {
    let server = Server::start();
    let mut admin = server.conn();
    cmd(&mut admin, &["RWLOCK.ACQUIRE", "rw", "stays", "READ", "60000"]);
    let mut holder = server.conn();
    let (owners, holds): (i64, i64) = (40, 100);
    for o in 0..owners {
        read_holds(&mut holder, "rw", &format!("owner-{o}"), holds as usize, &[]);
    }
    let id = client_id(&mut holder);
    let ends = session_ends(&mut admin);
    let (work, split) = (timer_work(&mut admin), ticks_split(&mut admin));
    kill_client(&mut admin, id);
    poll("every side ended", LIMIT, || (session_ends(&mut admin) - ends == owners).then_some(()));
    let work = timer_work(&mut admin) - work;
    let total = owners * holds;
    assert!(work <= 10 * total, "{work} units of work to end {total} read holds");
    assert!(ticks_split(&mut admin) > split, "ended in one tick ({work} units)");
    let fields: Vec<(Vec<u8>, Vec<u8>)> = hgetall(&mut admin, b"rw");
    assert_eq!(
        fields,
        vec![(b"mode".to_vec(), b"read".to_vec()), (b"stays".to_vec(), b"1".to_vec())]
    );
    let pttl: i64 = redis::cmd("PTTL").arg("rw").query(&mut admin).expect("PTTL");
    assert!((0..=60_000).contains(&pttl), "the lease is the reader's that stays: {pttl}");
    for o in 0..owners {
        for i in 1..=holds {
            let hold = format!("{{rw}}:owner-{o}:rwlock_timeout:{i}");
            assert!(!exists(&mut admin, &hold), "{hold} left behind");
        }
    }
}

/// The read sides of one close end together, each delayed one with its own lock-delay: the
/// placeholder takes a read hold for each before the lock could be freed, so a waiting writer
/// is not served in between, and gets the lock when the delays end (with the holds' leases).
#[test]
fn delayed_read_sides_ending_together_keep_the_lock_until_their_delays_end() {
    let server = Server::start();
    let mut admin = server.conn();
    let mut holder = server.conn();
    for owner in ["a", "b"] {
        let mut pipe = redis::pipe();
        pipe.cmd("RWLOCK.ACQUIRE").arg("rw").arg(owner).arg("READ").arg(1_500).arg("SESSION");
        pipe.arg("LOCKDELAY").arg(60_000);
        let _: Vec<Value> = pipe.query(&mut holder).expect("acquire");
    }
    read_holds(&mut holder, "rw", "c", 3, &[]);
    let writer = queue_str(
        &server,
        &mut admin,
        &["RWLOCK.ACQUIRE", "rw", "w", "WRITE", "60000", "WAIT", "20000"],
    );
    let delays = info_field(&mut admin, "rlock", "rlock_lock_delays");
    let ends = session_ends(&mut admin);
    let id = client_id(&mut holder);
    kill_client(&mut admin, id);
    poll("every side ended", LIMIT, || (session_ends(&mut admin) - ends == 3).then_some(()));
    assert_eq!(info_field(&mut admin, "rlock", "rlock_lock_delays") - delays, 2);
    let fields = hgetall(&mut admin, b"rw");
    assert_eq!(
        fields,
        vec![(b"mode".to_vec(), b"read".to_vec()), (b"rlock:lockdelay".to_vec(), b"2".to_vec())]
    );
    assert!(!writer.replied(), "the writer waits for the delays");
    let (reply, _) = writer.reply(LIMIT);
    assert_eq!(reply, Ok(Value::Nil), "granted when the delays ended");
}
