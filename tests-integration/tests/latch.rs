//! `RLATCH.*`: Redisson's `RCountDownLatch` natively, with awaiting in the server.
//! Every awaiter is answered exactly once: all at once when the latch opens, each alone at its
//! timeout, disconnect or `CLIENT UNBLOCK`; MULTI and Lua never block. Data, channel and
//! messages as Redisson's scripts write them; replicas and the AOF without the module end the
//! same; ACL on the key and the channel; pauses, `SWAPDB`, `MOVE`, `FLUSHDB`, retyped keys.

use std::time::Duration;

use redis::{Connection, Value};

use rlock_tests_integration::{
    assert_replica_matches, blocked_clients, cmd, digest, info_field, poll, queue_str, run_str,
    wait_blocked, wait_replica_online, BlockedCall, Pending, Server,
};

const LIMIT: Duration = Duration::from_secs(10);

const CHANNEL: &str = "redisson_countdownlatch__channel__{l}";

fn int(v: &Value) -> i64 {
    match v {
        Value::Int(n) => *n,
        other => panic!("not an integer: {other:?}"),
    }
}

/// `RLATCH.AWAIT l <timeout>` on its own connection, once it is blocked.
fn awaiter(server: &Server, con: &mut Connection, timeout: &str) -> Pending {
    queue_str(server, con, &["RLATCH.AWAIT", "l", timeout])
}

#[test]
fn commands_follow_redissons_latch_and_answer_awaiters_when_it_opens() {
    let server = Server::start();
    let mut con = server.conn();
    assert_eq!(cmd(&mut con, &["RLATCH.AWAIT", "l", "0"]), Value::Int(1), "missing: open");
    assert_eq!(cmd(&mut con, &["RLATCH.COUNT", "l"]), Value::Int(0));
    assert_eq!(cmd(&mut con, &["RLATCH.COUNTDOWN", "l"]), Value::Int(0), "missing: no-op");
    assert_eq!(cmd(&mut con, &["EXISTS", "l"]), Value::Int(0), "nothing written");
    assert_eq!(cmd(&mut con, &["RLATCH.SETCOUNT", "l", "3"]), Value::Int(1));
    assert_eq!(cmd(&mut con, &["RLATCH.SETCOUNT", "l", "9"]), Value::Int(0), "trySetCount");
    assert_eq!(cmd(&mut con, &["GET", "l"]), Value::BulkString(b"3".to_vec()), "the layout");
    assert_eq!(cmd(&mut con, &["RLATCH.AWAIT", "l", "20"]), Value::Int(0), "timed out");
    let waiter = awaiter(&server, &mut con, "0");
    assert_eq!(cmd(&mut con, &["RLATCH.COUNTDOWN", "l"]), Value::Int(2));
    assert!(!waiter.replied(), "still closed");
    assert_eq!(cmd(&mut con, &["RLATCH.COUNTDOWN", "l", "5"]), Value::Int(0), "never below 0");
    assert_eq!(waiter.reply(LIMIT).0, Ok(Value::Int(1)));
    assert_eq!(cmd(&mut con, &["EXISTS", "l"]), Value::Int(0), "deleted at zero");
    assert_eq!(info_field(&mut con, "rlock", "rlock_latch_opens"), 1);
    assert_eq!(info_field(&mut con, "rlock", "rlock_latch_releases"), 1);

    // DELETE answers awaiters too (a missing latch is open), and says whether it deleted.
    cmd(&mut con, &["RLATCH.SETCOUNT", "l", "1"]);
    let waiter = awaiter(&server, &mut con, "0");
    assert_eq!(cmd(&mut con, &["RLATCH.DELETE", "l"]), Value::Int(1));
    assert_eq!(waiter.reply(LIMIT).0, Ok(Value::Int(1)));
    assert_eq!(cmd(&mut con, &["RLATCH.DELETE", "l"]), Value::Int(0));
    assert!(!server.log().contains("refused the command info"), "{}", server.log());
}

#[test]
fn bad_input_gets_a_clear_error_and_changes_nothing() {
    let server = Server::start();
    let mut con = server.conn();
    cmd(&mut con, &["RLATCH.SETCOUNT", "l", "2"]);
    cmd(&mut con, &["SET", "s", "not a number"]);
    cmd(&mut con, &["HSET", "h", "f", "1"]);
    let before = digest(&mut con);
    for (args, error) in [
        (&["RLATCH.SETCOUNT", "x", "0"][..], "ERR count must be positive"),
        (&["RLATCH.SETCOUNT", "x", "-1"], "ERR count must be positive"),
        (&["RLATCH.SETCOUNT", "x", "1.5"], "ERR count is not an integer"),
        (&["RLATCH.SETCOUNT", "x", "99999999999999999999"], "ERR count is out of range"),
        (&["RLATCH.COUNTDOWN", "l", "0"], "ERR amount must be positive"),
        (&["RLATCH.COUNTDOWN", "l", "x"], "ERR amount is not an integer"),
        (&["RLATCH.AWAIT", "l", "-1"], "ERR timeout-ms must not be negative"),
        (&["RLATCH.SETCOUNT", "x"], "ERR wrong number of arguments"),
        (&["RLATCH.COUNTDOWN", "l", "1", "2"], "ERR wrong number of arguments"),
        (&["RLATCH.AWAIT", "l"], "ERR wrong number of arguments"),
        (&["RLATCH.COUNT", "l", "x"], "ERR wrong number of arguments"),
        (&["RLATCH.COUNTDOWN", "s"], "ERR the latch's count is not an integer"),
        (&["RLATCH.COUNT", "s"], "ERR the latch's count is not an integer"),
        (&["RLATCH.AWAIT", "h", "0"], "WRONGTYPE"),
        (&["RLATCH.DELETE", "h"], "WRONGTYPE"),
        (&["RLATCH.SETCOUNT", "h", "1"], "WRONGTYPE"),
    ] {
        let err = run_str(&mut con, args).unwrap_err();
        assert!(err.starts_with(error), "{args:?}: {err}");
    }
    assert_eq!(digest(&mut con), before, "nothing changed");
}

#[test]
fn one_count_down_answers_every_awaiter_exactly_once() {
    let server = Server::start();
    let mut con = server.conn();
    cmd(&mut con, &["RLATCH.SETCOUNT", "l", "1"]);
    let args: Vec<String> = ["RLATCH.AWAIT", "l", "0"].map(String::from).to_vec();
    let calls: Vec<BlockedCall> =
        (0..50).map(|_| BlockedCall::start(&server, args.clone(), LIMIT * 3)).collect();
    poll("50 awaiters", LIMIT, || (blocked_clients(&mut con) == 50).then_some(()));
    assert_eq!(cmd(&mut con, &["RLATCH.COUNTDOWN", "l"]), Value::Int(0));
    for call in calls {
        let (reply, ping) = call.join(LIMIT, "awaiter");
        assert_eq!(reply, Ok(Value::Int(1)));
        assert_eq!(ping, Ok(Value::SimpleString("PONG".into())), "answered once");
    }
    assert_eq!(info_field(&mut con, "rlock", "rlock_latch_releases"), 50);
    assert_eq!(info_field(&mut con, "rlock", "rlock_handoffs"), 0, "counted apart");
}

#[test]
fn each_awaiter_ends_alone_at_its_timeout_disconnect_or_unblock() {
    let server = Server::start();
    let mut con = server.conn();
    cmd(&mut con, &["RLATCH.SETCOUNT", "l", "1"]);
    let stays = awaiter(&server, &mut con, "0");
    let short = awaiter(&server, &mut con, "100");
    assert_eq!(short.reply(LIMIT).0, Ok(Value::Int(0)), "its own timeout");
    let killed = awaiter(&server, &mut con, "0");
    cmd(&mut con, &["CLIENT", "KILL", "ID", &killed.client_id().to_string()]);
    let unblocked = awaiter(&server, &mut con, "0");
    let id = unblocked.client_id().to_string();
    assert_eq!(cmd(&mut con, &["CLIENT", "UNBLOCK", &id]), Value::Int(1));
    assert_eq!(unblocked.reply(LIMIT).0, Ok(Value::Int(0)), "as a timeout");
    let errored = awaiter(&server, &mut con, "0");
    let id = errored.client_id().to_string();
    assert_eq!(cmd(&mut con, &["CLIENT", "UNBLOCK", &id, "ERROR"]), Value::Int(1));
    let (reply, _) = errored.reply(LIMIT);
    assert!(reply.is_err_and(|e| e.starts_with("UNBLOCKED")));
    assert!(killed.reply(LIMIT).0.is_err(), "its connection was closed");
    poll("one awaiter left", LIMIT, || (blocked_clients(&mut con) == 1).then_some(()));
    assert!(!stays.replied());
    cmd(&mut con, &["RLATCH.COUNTDOWN", "l"]);
    assert_eq!(stays.reply(LIMIT).0, Ok(Value::Int(1)));
}

#[test]
fn multi_and_lua_never_block() {
    let server = Server::start();
    let mut con = server.conn();
    cmd(&mut con, &["RLATCH.SETCOUNT", "l", "1"]);
    cmd(&mut con, &["MULTI"]);
    cmd(&mut con, &["RLATCH.AWAIT", "l", "0"]);
    cmd(&mut con, &["RLATCH.AWAIT", "missing", "0"]);
    let exec = cmd(&mut con, &["EXEC"]);
    assert_eq!(exec, Value::Array(vec![Value::Int(0), Value::Int(1)]));
    let script = "return redis.call('RLATCH.AWAIT', KEYS[1], '0')";
    assert_eq!(cmd(&mut con, &["EVAL", script, "1", "l"]), Value::Int(0));
    assert_eq!(blocked_clients(&mut con), 0);
}

#[test]
fn a_latch_opened_deleted_or_retyped_outside_rlock_answers_its_awaiters() {
    let server = Server::start();
    let mut con = server.conn();
    // Redisson's countDown script: DECR, then DEL and publish 0 at zero.
    let count_down = "local v = redis.call('decr', KEYS[1]); if v <= 0 then \
                      redis.call('del', KEYS[1]) end; if v == 0 then \
                      redis.call('publish', KEYS[2], ARGV[1]) end";
    cmd(&mut con, &["RLATCH.SETCOUNT", "l", "1"]);
    let waiter = awaiter(&server, &mut con, "0");
    cmd(&mut con, &["EVAL", count_down, "2", "l", CHANNEL, "0"]);
    assert_eq!(waiter.reply(LIMIT).0, Ok(Value::Int(1)), "found by the poll");

    cmd(&mut con, &["RLATCH.SETCOUNT", "l", "5"]);
    let waiter = awaiter(&server, &mut con, "0");
    cmd(&mut con, &["DEL", "l"]);
    assert_eq!(waiter.reply(LIMIT).0, Ok(Value::Int(1)), "a plain DEL opens it");

    cmd(&mut con, &["RLATCH.SETCOUNT", "l", "5"]);
    let waiter = awaiter(&server, &mut con, "0");
    cmd(&mut con, &["SET", "l", "0"]);
    assert_eq!(waiter.reply(LIMIT).0, Ok(Value::Int(1)), "a count at zero is open");

    cmd(&mut con, &["SET", "l", "5"]);
    let waiter = awaiter(&server, &mut con, "0");
    cmd(&mut con, &["DEL", "l"]);
    cmd(&mut con, &["HSET", "l", "f", "1"]);
    let (reply, _) = waiter.reply(LIMIT);
    assert!(reply.is_err_and(|e| e.starts_with("WRONGTYPE")), "retyped");
    assert_eq!(blocked_clients(&mut con), 0);
}

#[test]
fn messages_on_redissons_channel_as_its_scripts_publish_them() {
    let server = Server::start();
    let mut con = server.conn();
    let mut listener = server.conn();
    let mut sub = listener.as_pubsub();
    sub.subscribe(CHANNEL).expect("SUBSCRIBE");
    sub.subscribe("redisson_countdownlatch__channel__{a{7}}").expect("SUBSCRIBE");
    sub.set_read_timeout(Some(LIMIT)).expect("timeout");
    let mut next = || {
        let msg = sub.get_message().expect("a message");
        (msg.get_channel_name().to_owned(), msg.get_payload::<String>().expect("text"))
    };
    cmd(&mut con, &["RLATCH.SETCOUNT", "l", "2"]);
    assert_eq!(next(), (CHANNEL.to_owned(), "1".to_owned()), "a new count");
    cmd(&mut con, &["RLATCH.COUNTDOWN", "l"]);
    cmd(&mut con, &["RLATCH.COUNTDOWN", "l"]);
    assert_eq!(next(), (CHANNEL.to_owned(), "0".to_owned()), "zero, and only then");
    cmd(&mut con, &["RLATCH.SETCOUNT", "l", "2"]);
    assert_eq!(next().1, "1");
    cmd(&mut con, &["RLATCH.DELETE", "l"]);
    assert_eq!(next(), (CHANNEL.to_owned(), "1".to_owned()), "delete publishes 1, as Redisson");
    // Braces written literally: a braced name nests them.
    cmd(&mut con, &["RLATCH.SETCOUNT", "a{7}", "1"]);
    assert_eq!(next(), ("redisson_countdownlatch__channel__{a{7}}".to_owned(), "1".to_owned()));
}

#[test]
fn a_module_less_replica_and_the_aof_end_the_same() {
    let mut master =
        Server::builder().config("appendonly", "yes").config("appendfsync", "always").start();
    let replica = Server::builder().without_module().replica_of(&master).start();
    wait_replica_online(&master);
    let mut con = master.conn();
    cmd(&mut con, &["RLATCH.SETCOUNT", "l", "10"]);
    cmd(&mut con, &["PEXPIRE", "l", "600000"]);
    cmd(&mut con, &["RLATCH.COUNTDOWN", "l", "3"]);
    cmd(&mut con, &["RLATCH.SETCOUNT", "gone", "1"]);
    cmd(&mut con, &["RLATCH.COUNTDOWN", "gone"]);
    cmd(&mut con, &["RLATCH.SETCOUNT", "deleted", "4"]);
    cmd(&mut con, &["RLATCH.DELETE", "deleted"]);
    let expiry = int(&cmd(&mut con, &["PEXPIRETIME", "l"]));
    assert!(expiry > 0, "DECRBY keeps a TTL");
    let replica_con = &mut replica.conn();
    poll("the replica's count", LIMIT, || {
        (cmd(replica_con, &["GET", "l"]) == Value::BulkString(b"7".to_vec())).then_some(())
    });
    assert_eq!(int(&cmd(replica_con, &["PEXPIRETIME", "l"])), expiry, "the same deadline");
    assert!(!replica.log().contains("unknown command"), "{}", replica.log());
    let keys = cmd(&mut con, &["KEYS", "*"]);
    assert_replica_matches(&master, &replica, LIMIT, "latches");
    drop(con);
    master.restart_without_module();
    let mut con = master.conn();
    assert_eq!(cmd(&mut con, &["KEYS", "*"]), keys, "a plain Redis replays the same AOF");
    assert_eq!(cmd(&mut con, &["GET", "l"]), Value::BulkString(b"7".to_vec()));
}

#[test]
fn acl_covers_the_key_and_the_channel() {
    let server = Server::start();
    let mut admin = server.conn();
    cmd(
        &mut admin,
        &["ACL", "SETUSER", "lim", "on", "nopass", "~latch:*", "resetchannels", "+@all"],
    );
    let mut lim = server.conn();
    cmd(&mut lim, &["AUTH", "lim", "any"]);
    let err = run_str(&mut lim, &["RLATCH.SETCOUNT", "other", "1"]).unwrap_err();
    assert!(err.starts_with("NOPERM"), "{err}");
    let before = digest(&mut admin);
    let err = run_str(&mut lim, &["RLATCH.SETCOUNT", "latch:a", "2"]).unwrap_err();
    assert!(err.starts_with("NOPERM") && err.contains("channel"), "publishes 1: {err}");
    assert_eq!(digest(&mut admin), before, "nothing changes on NOPERM");
    cmd(&mut admin, &["RLATCH.SETCOUNT", "latch:a", "2"]);
    assert_eq!(cmd(&mut lim, &["RLATCH.COUNTDOWN", "latch:a"]), Value::Int(1), "no publish");
    let before = digest(&mut admin);
    let err = run_str(&mut lim, &["RLATCH.COUNTDOWN", "latch:a"]).unwrap_err();
    assert!(err.starts_with("NOPERM"), "would publish 0: {err}");
    let err = run_str(&mut lim, &["RLATCH.DELETE", "latch:a"]).unwrap_err();
    assert!(err.starts_with("NOPERM"), "would publish 1: {err}");
    assert_eq!(digest(&mut admin), before, "still 1");
    assert_eq!(cmd(&mut lim, &["RLATCH.COUNT", "latch:a"]), Value::Int(1));
    assert_eq!(cmd(&mut lim, &["RLATCH.AWAIT", "latch:a", "10"]), Value::Int(0));
    cmd(&mut admin, &["ACL", "SETUSER", "lim", "&redisson_countdownlatch__channel__*"]);
    assert_eq!(cmd(&mut lim, &["RLATCH.COUNTDOWN", "latch:a"]), Value::Int(0));
}

#[test]
fn pauses_swapdb_move_and_flushdb_answer_awaiters_as_the_keyspace_says() {
    let server = Server::start();
    let mut con = server.conn();
    // CLIENT PAUSE WRITE holds the count-down (a write): the awaiter is answered after it.
    cmd(&mut con, &["RLATCH.SETCOUNT", "l", "1"]);
    let waiter = awaiter(&server, &mut con, "0");
    cmd(&mut con, &["CLIENT", "PAUSE", "10000", "WRITE"]);
    let down = Pending::start_str(&server, &["RLATCH.COUNTDOWN", "l"]);
    poll("the count-down held by the pause", LIMIT, || {
        (info_field(&mut con, "clients", "blocked_clients") == 2).then_some(())
    });
    assert!(!waiter.replied() && !down.replied());
    cmd(&mut con, &["CLIENT", "UNPAUSE"]);
    assert_eq!(down.reply(LIMIT).0, Ok(Value::Int(0)));
    assert_eq!(waiter.reply(LIMIT).0, Ok(Value::Int(1)));

    for change in [&["SWAPDB", "0", "1"][..], &["MOVE", "l", "1"], &["FLUSHDB"]] {
        cmd(&mut con, &["SELECT", "0"]);
        cmd(&mut con, &["FLUSHALL"]);
        cmd(&mut con, &["RLATCH.SETCOUNT", "l", "1"]);
        let waiter = awaiter(&server, &mut con, "0");
        cmd(&mut con, change);
        assert_eq!(waiter.reply(LIMIT).0, Ok(Value::Int(1)), "{change:?}: gone from db 0");
    }
    assert_eq!(blocked_clients(&mut con), 0);
}

#[test]
fn in_a_cluster_a_latch_lives_in_its_slot_and_answers_its_awaiters() {
    let cluster = rlock_tests_integration::Cluster::start(3);
    for (i, node) in cluster.nodes.iter().enumerate() {
        let key = format!("{{{}}}:latch", cluster.key_on(i, "app"));
        let mut con = node.conn();
        assert_eq!(cmd(&mut con, &["RLATCH.SETCOUNT", &key, "1"]), Value::Int(1));
        let waiter = Pending::start_str(node, &["RLATCH.AWAIT", &key, "0"]);
        poll("the awaiter", LIMIT, || (blocked_clients(&mut con) == 1).then_some(()));
        assert_eq!(cmd(&mut con, &["RLATCH.COUNTDOWN", &key]), Value::Int(0));
        assert_eq!(waiter.reply(LIMIT).0, Ok(Value::Int(1)));
        let other = &cluster.nodes[(i + 1) % cluster.nodes.len()];
        let err = run_str(&mut other.conn(), &["RLATCH.COUNT", &key]).unwrap_err();
        assert!(err.starts_with("MOVED"), "{err}");
    }
}

/// Redisson's `RCountDownLatch` scripts (shared/reference, §5), as a Redisson client runs them.
const REDISSON_TRY_SET_COUNT: &str = "if redis.call('exists', KEYS[1]) == 0 then \
    redis.call('set', KEYS[1], ARGV[2]); redis.call('publish', KEYS[2], ARGV[1]); return 1 \
    else return 0 end";
const REDISSON_COUNT_DOWN: &str = "local v = redis.call('decr', KEYS[1]); \
    if v <= 0 then redis.call('del', KEYS[1]) end; \
    if v == 0 then redis.call('publish', KEYS[2], ARGV[1]) end";
const REDISSON_DELETE: &str = "if redis.call('del', KEYS[1]) == 1 then \
    redis.call('publish', KEYS[2], ARGV[1]); return 1 else return 0 end";

#[test]
fn a_redisson_client_and_rlatch_share_a_latch_both_ways() {
    let server = Server::start();
    let mut con = server.conn();
    let eval = |con: &mut Connection, script: &str, arg: &str| {
        cmd(con, &["EVAL", script, "2", "l", CHANNEL, arg, "2"])
    };
    // Redisson sets, rlock reads and counts down; an RLATCH awaiter is answered.
    assert_eq!(eval(&mut con, REDISSON_TRY_SET_COUNT, "1"), Value::Int(1));
    assert_eq!(cmd(&mut con, &["RLATCH.SETCOUNT", "l", "5"]), Value::Int(0), "it exists");
    assert_eq!(cmd(&mut con, &["RLATCH.COUNT", "l"]), Value::Int(2));
    let waiter = awaiter(&server, &mut con, "0");
    assert_eq!(cmd(&mut con, &["RLATCH.COUNTDOWN", "l"]), Value::Int(1));
    eval(&mut con, REDISSON_COUNT_DOWN, "0");
    assert_eq!(waiter.reply(LIMIT).0, Ok(Value::Int(1)));

    // rlock sets; a Redisson awaiter (subscribe, then GET until 0) hears the 0 and finds it open.
    let mut listener = server.conn();
    let mut sub = listener.as_pubsub();
    sub.subscribe(CHANNEL).expect("SUBSCRIBE");
    sub.set_read_timeout(Some(LIMIT)).expect("timeout");
    assert_eq!(cmd(&mut con, &["RLATCH.SETCOUNT", "l", "2"]), Value::Int(1));
    assert_eq!(sub.get_message().expect("1").get_payload::<String>().ok(), Some("1".into()));
    assert_eq!(eval(&mut con, REDISSON_COUNT_DOWN, "0"), Value::Nil);
    assert_eq!(cmd(&mut con, &["GET", "l"]), Value::BulkString(b"1".to_vec()), "Redisson's count");
    assert_eq!(cmd(&mut con, &["RLATCH.COUNTDOWN", "l"]), Value::Int(0));
    assert_eq!(sub.get_message().expect("0").get_payload::<String>().ok(), Some("0".into()));
    assert_eq!(cmd(&mut con, &["GET", "l"]), Value::Nil, "open for Redisson's getCount");

    // A Redisson delete answers RLATCH awaiters; RLATCH.DELETE publishes what Redisson's does.
    assert_eq!(eval(&mut con, REDISSON_TRY_SET_COUNT, "1"), Value::Int(1));
    assert_eq!(sub.get_message().expect("1").get_payload::<String>().ok(), Some("1".into()));
    let waiter = awaiter(&server, &mut con, "0");
    assert_eq!(eval(&mut con, REDISSON_DELETE, "1"), Value::Int(1));
    assert_eq!(waiter.reply(LIMIT).0, Ok(Value::Int(1)));
    assert_eq!(sub.get_message().expect("1").get_payload::<String>().ok(), Some("1".into()));
    cmd(&mut con, &["RLATCH.SETCOUNT", "l", "1"]);
    assert_eq!(sub.get_message().expect("1").get_payload::<String>().ok(), Some("1".into()));
    assert_eq!(cmd(&mut con, &["RLATCH.DELETE", "l"]), Value::Int(1));
    assert_eq!(sub.get_message().expect("1").get_payload::<String>().ok(), Some("1".into()));
    assert_eq!(eval(&mut con, REDISSON_DELETE, "1"), Value::Int(0), "gone for Redisson too");
}

/// A latch and a semaphore share Redisson's layout (an integer string) and their waiters one
/// FIFO queue per key, yet neither holds up the other. A closed latch's awaiter at the head
/// must not hold up the semaphore waiters behind it, nor get a newcomer's plain `RSEM.ACQUIRE`
/// with permits free refused (replied 0: "others wait"), which would let an
/// `RLATCH.AWAIT key 0` starve the semaphore for ever. The other way round, a semaphore waiter
/// at the head must not keep the awaiters behind it blocked after the latch opens ("every
/// awaiter is answered at once when the latch opens"). An awaiter holds nothing and is in
/// nobody's way: it is answered when the latch opens, wherever it stands in the queue.
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

#[test]
fn a_latch_holding_a_foreign_string_is_named_not_called_wrongtype() {
    let server = Server::start();
    let mut con = server.conn();
    cmd(&mut con, &["RLOCK.ACQUIRE", "k", "h", "60000"]);
    cmd(&mut con, &["SET", "redisson_unlock_latch:{k}:r", "x"]);
    let err = run_str(&mut con, &["RLOCK.RELEASE", "k", "h", "REQUEST", "r"]).unwrap_err();
    assert!(err.starts_with("ERR the unlock latch"), "{err}");
    cmd(&mut con, &["HSET", "redisson_unlock_latch:{k}:h", "f", "v"]);
    let err = run_str(&mut con, &["RLOCK.RELEASE", "k", "h", "REQUEST", "h"]).unwrap_err();
    assert!(err.starts_with("WRONGTYPE"), "{err}");
}
