//! A hostile look at issue 29's count-down latch (`RLATCH.*`, the broadcast hand-off) and issue
//! 28's replicated writes. Each test named after a defect failed on the code it was written
//! against; the defect is named in its doc comment.

use std::time::Duration;

use redis::Value;
use rlock_tests_integration::{
    blocked_clients, cmd, info_field, poll, queue_str, wait_blocked, Server,
};

const LIMIT: Duration = Duration::from_secs(10);

/// Defect: a latch and a semaphore share Redisson's layout (an integer string), and their
/// waiters shared one FIFO queue per key. A closed latch's awaiter at the head held up every
/// semaphore waiter behind it, and even a newcomer's plain `RSEM.ACQUIRE` with permits free
/// was refused (replied 0: "others wait"); an `RLATCH.AWAIT key 0` starved the semaphore for
/// ever. The other way round, a semaphore waiter at the head kept the awaiters behind it
/// blocked after the latch opened (answered only at the waiter's own timeout), breaking
/// "every awaiter is answered at once when the latch opens". An awaiter holds nothing and is
/// in nobody's way: it is answered when the latch opens, wherever it stands in the queue.
#[test]
fn latch_awaiters_and_semaphore_waiters_on_one_key_hold_each_other_up_nowhere() {
    let server = Server::start();
    let mut con = server.conn();
    assert_eq!(cmd(&mut con, &["RLATCH.SETCOUNT", "l", "5"]), Value::Int(1));
    let first = queue_str(&server, &mut con, &["RLATCH.AWAIT", "l", "0"]);
    // Five permits are free: a newcomer takes one at once, whatever awaits the latch.
    assert_eq!(cmd(&mut con, &["RSEM.ACQUIRE", "l", "1"]), Value::Int(1), "not held up");
    let sem = queue_str(&server, &mut con, &["RSEM.ACQUIRE", "l", "10", "WAIT", "20000"]);
    // Permits that come back without an RSEM command are found at the waiters' poll, whoever
    // awaits the latch ahead of the semaphore's waiter (the latch stays closed at 1).
    assert_eq!(cmd(&mut con, &["SET", "l", "11"]), Value::Okay);
    assert_eq!(sem.reply(LIMIT).0, Ok(Value::Int(1)), "granted while the latch is closed");
    assert_eq!(cmd(&mut con, &["GET", "l"]), Value::BulkString(b"1".to_vec()));
    assert!(!first.replied(), "the latch is still closed");

    let sem = queue_str(&server, &mut con, &["RSEM.ACQUIRE", "l", "5", "WAIT", "20000"]);
    let second = queue_str(&server, &mut con, &["RLATCH.AWAIT", "l", "0"]);
    assert_eq!(cmd(&mut con, &["RLATCH.COUNTDOWN", "l"]), Value::Int(0));
    assert_eq!(first.reply(LIMIT).0, Ok(Value::Int(1)));
    assert_eq!(second.reply(LIMIT).0, Ok(Value::Int(1)), "answered when the latch opened");
    assert_eq!(info_field(&mut con, "rlock", "rlock_latch_releases"), 2);
    assert!(!sem.replied(), "the semaphore waiter still waits");
    wait_blocked(&mut con, 1);
    assert_eq!(cmd(&mut con, &["RSEM.RELEASE", "l", "5"]), Value::Int(0));
    assert_eq!(sem.reply(LIMIT).0, Ok(Value::Int(1)));
    poll("nobody blocked", LIMIT, || (blocked_clients(&mut con) == 0).then_some(()));
    assert!(!server.log().contains("Guru Meditation"), "{}", server.log());
}
