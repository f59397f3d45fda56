//! Session holds (`SESSION [LOCKDELAY ms]`): a hold bound to the connection that
//! made it ends when that connection closes (a killed process, `CLIENT KILL`, `QUIT`), its
//! waiters served and its end replicated, with an optional lock-delay; on every kind of hold.
//!
//! Several tests need to know that the server has processed a close that should end nothing:
//! they close a "barrier" session afterwards and wait for the barrier's end (ends are applied
//! in the order the closes came, in one timer tick at the latest).

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use redis::{Connection, Value};

use rlock_tests_integration::{
    barrier, client_id, cmd, digest, exists, hgetall, info_field, int, kill_client, poll, run_str,
    session_ends, session_holds, wait_blocked, wait_link_up, Pending, Process, Server,
};

const LIMIT: Duration = Duration::from_secs(10);

/// A separate process that takes `args` on its own connection and then waits until the server
/// closes it (killed with SIGKILL by the test, as a crashed worker).
fn holder_process(server: &Server, args: &[&str]) -> Process {
    let words: Vec<String> = args.iter().map(|a| format!("{a:?}")).collect();
    let script = format!(
        "import socket, sys\n\
         s = socket.create_connection(('127.0.0.1', {port}))\n\
         args = [{words}]\n\
         req = '*%d\\r\\n' % len(args) + ''.join('$%d\\r\\n%s\\r\\n' % (len(a), a) for a in args)\n\
         s.sendall(req.encode())\n\
         reply = s.recv(4096).decode().split('\\r\\n')[0]\n\
         sys.stdout.write(reply + '\\n')\n\
         sys.stdout.flush()\n\
         while s.recv(4096):\n\
         \x20   pass\n",
        port = server.port(),
        words = words.join(", "),
    );
    let mut child = Command::new("python3")
        .arg("-c")
        .arg(script)
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3");
    let mut line = String::new();
    BufReader::new(child.stdout.as_mut().expect("stdout")).read_line(&mut line).expect("reply");
    let process = Process(child);
    assert_eq!(line.trim(), "$-1", "the holder process was granted");
    process
}

#[test]
fn a_killed_process_frees_its_hold_and_a_waiter_is_served_at_once() {
    let server = Server::start();
    let mut admin = server.conn();
    let mut holder = holder_process(&server, &["RLOCK.ACQUIRE", "l", "proc", "60000", "SESSION"]);
    assert_eq!(session_holds(&mut admin), 1);
    let waiter = Pending::start_str(&server, &["RLOCK.ACQUIRE", "l", "w", "60000", "WAIT", "0"]);
    wait_blocked(&mut admin, 1);
    let killed = Instant::now();
    holder.0.kill().expect("kill -9");
    holder.0.wait().expect("reaped");
    let (reply, at) = waiter.reply(LIMIT);
    assert_eq!(reply, Ok(Value::Nil));
    // Within one event-loop turn of the close (the lease had a minute left).
    assert!(at - killed < Duration::from_secs(2), "served after {:?}", at - killed);
    assert_eq!(hgetall(&mut admin, b"l"), vec![(b"w".to_vec(), b"1".to_vec())]);
    assert_eq!((session_holds(&mut admin), session_ends(&mut admin)), (0, 1));
}

#[test]
fn client_kill_and_quit_end_each_kind_of_hold() {
    let server = Server::start();
    let mut admin = server.conn();
    cmd(&mut admin, &["RSEM.SETPERMITS", "s", "2"]);
    let kinds: [(&[&str], &str); 4] = [
        (&["RLOCK.ACQUIRE", "l", "o", "60000", "SESSION"], "l"),
        (&["RWLOCK.ACQUIRE", "r", "o", "READ", "60000", "SESSION"], "r"),
        (&["RWLOCK.ACQUIRE", "w", "o", "WRITE", "60000", "SESSION"], "w"),
        (&["RSEM.ACQUIRE", "s", "2", "LEASE", "60000", "SESSION"], "{s}:timeout"),
    ];
    for (i, (acquire, key)) in kinds.iter().enumerate() {
        let mut con = server.conn();
        let id = client_id(&mut con);
        cmd(&mut con, acquire);
        // Re-entries on the same connection belong to the same hold.
        if !acquire[0].starts_with("RSEM") {
            cmd(&mut con, acquire);
        }
        assert!(exists(&mut admin, key), "{acquire:?}");
        let bound = if acquire[0].starts_with("RSEM") { 2 } else { 1 };
        assert_eq!(session_holds(&mut admin), bound, "{acquire:?}");
        if i % 2 == 0 {
            kill_client(&mut admin, id);
        } else {
            assert_eq!(cmd(&mut con, &["QUIT"]), Value::Okay);
        }
        poll("the hold's end", LIMIT, || (!exists(&mut admin, key)).then_some(()));
        assert_eq!(session_holds(&mut admin), 0);
    }
    assert_eq!(cmd(&mut admin, &["RSEM.AVAILABLE", "s"]), Value::Int(2), "both permits back");
    assert_eq!(cmd(&mut admin, &["KEYS", "r:*"]), Value::Array(vec![]), "read hold keys gone");
    assert_eq!(session_ends(&mut admin), 5);
}

/// Sends `args` on `con` without waiting for the reply (a blocked `WAIT` on a connection the
/// test keeps).
fn send(con: &mut Connection, args: &[&str]) {
    let packed = rlock_tests_integration::command(args).get_packed_command();
    con.send_packed_command(&packed).expect("send");
}

#[test]
fn a_session_waiter_is_bound_when_granted_and_a_read_end_serves_a_writer() {
    let server = Server::start();
    let mut admin = server.conn();
    cmd(&mut admin, &["RWLOCK.ACQUIRE", "rw", "first", "READ", "60000"]);
    let mut writer = server.conn();
    writer.set_read_timeout(Some(LIMIT)).expect("timeout");
    let writer_id = client_id(&mut writer);
    send(&mut writer, &["RWLOCK.ACQUIRE", "rw", "w", "WRITE", "60000", "WAIT", "0", "SESSION"]);
    wait_blocked(&mut admin, 1);
    let mut reader = server.conn();
    // A re-entry of the first reader's hold from a session connection: not a fresh grant, so
    // not bound.
    cmd(&mut reader, &["RWLOCK.ACQUIRE", "rw", "first", "READ", "60000", "SESSION"]);
    assert_eq!(session_holds(&mut admin), 0);
    cmd(&mut admin, &["RWLOCK.RELEASE", "rw", "first", "READ"]);
    cmd(&mut admin, &["RWLOCK.RELEASE", "rw", "first", "READ"]);
    assert_eq!(writer.recv_response().expect("the writer's grant"), Value::Nil);
    assert_eq!(session_holds(&mut admin), 1, "the waiter's grant is bound to its connection");
    // A read session waits behind it, and is served when the writer's connection closes.
    let mut next = server.conn();
    next.set_read_timeout(Some(LIMIT)).expect("timeout");
    send(&mut next, &["RWLOCK.ACQUIRE", "rw", "r2", "READ", "60000", "WAIT", "0", "SESSION"]);
    wait_blocked(&mut admin, 1);
    kill_client(&mut admin, writer_id);
    assert_eq!(next.recv_response().expect("the reader's grant"), Value::Nil);
    assert_eq!((session_holds(&mut admin), session_ends(&mut admin)), (1, 1));
    drop(next);
    poll("the reader's end", LIMIT, || (!exists(&mut admin, "rw")).then_some(()));
    drop(reader);
}

#[test]
fn a_re_entry_from_another_connection_keeps_the_binding() {
    let server = Server::start();
    let mut admin = server.conn();
    let (mut a, mut b) = (server.conn(), server.conn());
    let (a_id, b_id) = (client_id(&mut a), client_id(&mut b));
    cmd(&mut a, &["RLOCK.ACQUIRE", "l", "o", "60000", "SESSION"]);
    cmd(&mut b, &["RLOCK.ACQUIRE", "l", "o", "60000", "SESSION"]);
    kill_client(&mut admin, b_id);
    barrier(&server, &mut admin);
    assert_eq!(hgetall(&mut admin, b"l"), vec![(b"o".to_vec(), b"2".to_vec())], "B bound nothing");
    kill_client(&mut admin, a_id);
    poll("the whole hold's end", LIMIT, || (!exists(&mut admin, "l")).then_some(()));
}

#[test]
fn a_stale_binding_never_ends_a_later_hold() {
    let server = Server::start();
    let mut admin = server.conn();
    // Released to zero from another connection, then taken again without SESSION.
    let mut a = server.conn();
    let a_id = client_id(&mut a);
    cmd(&mut a, &["RLOCK.ACQUIRE", "l", "o", "60000", "SESSION"]);
    assert_eq!(cmd(&mut admin, &["RLOCK.RELEASE", "l", "o"]), Value::Int(1));
    cmd(&mut admin, &["RLOCK.ACQUIRE", "l", "o", "60000"]);
    // A permit given back, the semaphore's count then used by others.
    cmd(&mut admin, &["RSEM.SETPERMITS", "s", "1"]);
    let ids = cmd(&mut a, &["RSEM.ACQUIRE", "s", "1", "LEASE", "60000", "SESSION"]);
    let Value::Array(ids) = ids else { panic!("{ids:?}") };
    let Value::BulkString(id) = &ids[0] else { panic!("{ids:?}") };
    redis::cmd("RSEM.RELEASE").arg("s").arg("ID").arg(id).query::<i64>(&mut admin).expect("rel");
    cmd(&mut admin, &["RSEM.ACQUIRE", "s", "1"]);
    // Its lease ended, then taken again by the same owner through a foreign writer (as
    // Redisson's acquire script writes it), which rlock does not see.
    cmd(&mut a, &["RLOCK.ACQUIRE", "short", "o", "50", "SESSION"]);
    poll("the short lease's end", LIMIT, || (!exists(&mut admin, "short")).then_some(()));
    cmd(&mut admin, &["HSET", "short", "o", "1"]);
    cmd(&mut admin, &["PEXPIRE", "short", "60000"]);
    kill_client(&mut admin, a_id);
    barrier(&server, &mut admin);
    assert_eq!(hgetall(&mut admin, b"l"), vec![(b"o".to_vec(), b"1".to_vec())]);
    assert_eq!(hgetall(&mut admin, b"short"), vec![(b"o".to_vec(), b"1".to_vec())]);
    assert_eq!(cmd(&mut admin, &["GET", "s"]), Value::BulkString(b"0".to_vec()));
    assert_eq!(session_ends(&mut admin), 1, "only the barrier ended");
}

#[test]
fn lockdelay_holds_off_the_next_grant_for_its_length_and_not_after_a_release() {
    let server = Server::start();
    let mut admin = server.conn();
    let mut a = server.conn();
    let a_id = client_id(&mut a);
    cmd(&mut a, &["RLOCK.ACQUIRE", "l", "o", "60000", "SESSION", "LOCKDELAY", "600"]);
    let waiter = Pending::start_str(&server, &["RLOCK.ACQUIRE", "l", "w", "60000", "WAIT", "0"]);
    wait_blocked(&mut admin, 1);
    let closed = Instant::now();
    kill_client(&mut admin, a_id);
    poll("the placeholder", LIMIT, || {
        (hgetall(&mut admin, b"l") == vec![(b"rlock:lockdelay".to_vec(), b"1".to_vec())])
            .then_some(())
    });
    // Redisson's view: a holder with a lease of at most the delay.
    let Value::Int(pttl) = cmd(&mut admin, &["PTTL", "l"]) else { panic!("pttl") };
    assert!(pttl > 0 && pttl <= 600, "{pttl}");
    let info = cmd(&mut admin, &["RLOCK.INFO", "l"]);
    assert!(format!("{info:?}").contains("rlock:lockdelay"), "{info:?}");
    let (reply, at) = waiter.reply(LIMIT);
    assert_eq!(reply, Ok(Value::Nil));
    let waited = at - closed;
    assert!(waited >= Duration::from_millis(550), "granted {waited:?} after the close");
    assert!(waited < Duration::from_secs(3), "granted {waited:?} after the close");
    assert_eq!(info_field(&mut admin, "rlock", "rlock_lock_delays"), 1);

    // A normal release: no delay, the next waiter is served at once.
    let mut b = server.conn();
    cmd(&mut b, &["RLOCK.ACQUIRE", "m", "o", "60000", "SESSION", "LOCKDELAY", "60000"]);
    let waiter = Pending::start_str(&server, &["RLOCK.ACQUIRE", "m", "w", "60000", "WAIT", "0"]);
    wait_blocked(&mut admin, 1);
    let released = Instant::now();
    assert_eq!(cmd(&mut b, &["RLOCK.RELEASE", "m", "o"]), Value::Int(1));
    let (reply, at) = waiter.reply(LIMIT);
    assert_eq!(reply, Ok(Value::Nil));
    assert!(at - released < Duration::from_secs(2));
    drop(b);
    barrier(&server, &mut admin);
    assert_eq!(info_field(&mut admin, "rlock", "rlock_lock_delays"), 1);
    assert_eq!(hgetall(&mut admin, b"m"), vec![(b"w".to_vec(), b"1".to_vec())]);
}

#[test]
fn lockdelay_on_a_write_hold_a_read_hold_and_a_leased_permit() {
    let server = Server::start();
    let mut admin = server.conn();
    cmd(&mut admin, &["RSEM.SETPERMITS", "s", "1"]);
    let mut a = server.conn();
    let a_id = client_id(&mut a);
    let delay = ["SESSION", "LOCKDELAY", "60000"];
    cmd(&mut a, &[&["RWLOCK.ACQUIRE", "w", "o", "WRITE", "60000"][..], &delay].concat());
    cmd(&mut a, &[&["RWLOCK.ACQUIRE", "r", "o", "READ", "60000"][..], &delay].concat());
    cmd(&mut a, &[&["RSEM.ACQUIRE", "s", "1", "LEASE", "60000"][..], &delay].concat());
    kill_client(&mut admin, a_id);
    poll("the three ends", LIMIT, || (session_ends(&mut admin) == 3).then_some(()));
    assert_eq!(info_field(&mut admin, "rlock", "rlock_lock_delays"), 3);
    let busy = |con: &mut Connection, args: &[&str]| match cmd(con, args) {
        Value::Int(pttl) => pttl > 0,
        other => panic!("{args:?}: {other:?}"),
    };
    assert!(busy(&mut admin, &["RWLOCK.ACQUIRE", "w", "x", "READ", "1000"]));
    assert!(busy(&mut admin, &["RWLOCK.ACQUIRE", "r", "x", "WRITE", "1000"]));
    assert_eq!(cmd(&mut admin, &["RWLOCK.ACQUIRE", "r", "x", "READ", "1000"]), Value::Nil);
    assert_eq!(cmd(&mut admin, &["RSEM.ACQUIRE", "s", "1"]), Value::Int(0), "the permit stays out");
    let writer = hgetall(&mut admin, b"w");
    assert!(writer.contains(&(b"rlock:lockdelay:write".to_vec(), b"1".to_vec())), "{writer:?}");
}

#[test]
fn a_module_less_replica_and_the_aof_see_the_end() {
    // A replica's acknowledgement may lag on a loaded machine: the replica guard is not what
    // this test is about, so a lag is no reason for NOREPLICAS here.
    // (Set at run time: the master restarts without the module below.)
    let mut master =
        Server::builder().config("appendonly", "yes").config("appendfsync", "always").start();
    let replica = Server::builder().without_module().replica_of(&master).start();
    let (mut m, mut r) = (master.conn(), replica.conn());
    cmd(&mut m, &["CONFIG", "SET", "rlock.replica-max-lag", "60"]);
    wait_link_up(&mut r);
    let mut a = master.conn();
    let a_id = client_id(&mut a);
    cmd(&mut a, &["RLOCK.ACQUIRE", "l", "o", "60000", "SESSION"]);
    cmd(&mut a, &["RLOCK.ACQUIRE", "d", "o", "60000", "SESSION", "LOCKDELAY", "60000"]);
    poll("the holds on the replica", LIMIT, || {
        (exists(&mut r, "l") && exists(&mut r, "d")).then_some(())
    });
    kill_client(&mut m, a_id);
    poll("the end on the replica", LIMIT, || {
        let placeholder = vec![(b"rlock:lockdelay".to_vec(), b"1".to_vec())];
        (!exists(&mut r, "l") && hgetall(&mut r, b"d") == placeholder).then_some(())
    });
    drop((m, a));
    master.restart_without_module();
    let mut m = master.conn();
    assert!(!exists(&mut m, "l"), "the AOF has the end");
    assert_eq!(hgetall(&mut m, b"d"), vec![(b"rlock:lockdelay".to_vec(), b"1".to_vec())]);
    assert!(!replica.log().contains("unknown command"), "{}", replica.log());
}

#[test]
fn client_pause_write_delays_the_end_until_unpause() {
    let server = Server::start();
    let mut admin = server.conn();
    let mut a = server.conn();
    let a_id = client_id(&mut a);
    cmd(&mut a, &["RLOCK.ACQUIRE", "l", "o", "60000", "SESSION"]);
    cmd(&mut admin, &["CLIENT", "PAUSE", "20000", "WRITE"]);
    kill_client(&mut admin, a_id);
    poll("the close", LIMIT, || (session_holds(&mut admin) == 0).then_some(()));
    // Not ended while writes are paused (checked for a while: nothing to poll for).
    let until = Instant::now() + Duration::from_millis(300);
    while Instant::now() < until {
        assert_eq!(hgetall(&mut admin, b"l"), vec![(b"o".to_vec(), b"1".to_vec())]);
    }
    cmd(&mut admin, &["CLIENT", "UNPAUSE"]);
    poll("the end after the pause", LIMIT, || (!exists(&mut admin, "l")).then_some(()));
    assert_eq!(session_ends(&mut admin), 1);
}

#[test]
fn session_in_multi_binds_the_multi_client_and_is_refused_in_lua() {
    let server = Server::start();
    let mut admin = server.conn();
    let mut a = server.conn();
    let a_id = client_id(&mut a);
    cmd(&mut a, &["MULTI"]);
    cmd(&mut a, &["RLOCK.ACQUIRE", "l", "o", "60000", "SESSION"]);
    assert_eq!(cmd(&mut a, &["EXEC"]), Value::Array(vec![Value::Nil]));
    assert_eq!(session_holds(&mut admin), 1);

    let before = digest(&mut admin);
    for script in [
        "return redis.call('RLOCK.ACQUIRE', KEYS[1], 'o', '60000', 'SESSION')",
        "return redis.call('RSEM.ACQUIRE', KEYS[1], '1', 'LEASE', '60000', 'SESSION')",
    ] {
        let err = run_str(&mut a, &["EVAL", script, "1", "k"]).unwrap_err();
        assert!(err.contains("SESSION needs the caller's own connection"), "{err}");
    }
    assert_eq!(digest(&mut admin), before, "nothing changed");
    kill_client(&mut admin, a_id);
    poll("the end", LIMIT, || (!exists(&mut admin, "l")).then_some(()));
}

#[test]
fn bad_session_options_are_refused_and_change_nothing() {
    let server = Server::start();
    let mut con = server.conn();
    cmd(&mut con, &["RSEM.SETPERMITS", "s", "1"]);
    let before = digest(&mut con);
    for (args, expected) in [
        (&["RLOCK.ACQUIRE", "l", "o", "1000", "LOCKDELAY", "10"][..], "LOCKDELAY needs SESSION"),
        (&["RLOCK.ACQUIRE", "l", "o", "1000", "SESSION", "LOCKDELAY", "60001"], "lockdelay-ms"),
        (&["RLOCK.ACQUIRE", "l", "o", "1000", "SESSION", "LOCKDELAY", "-1"], "lockdelay-ms"),
        (&["RLOCK.ACQUIRE", "l", "o", "1000", "SESSION", "LOCKDELAY"], "lockdelay-ms"),
        (&["RLOCK.ACQUIRE", "l", "o", "1000", "SESSION", "SESSION"], "syntax error"),
        (&["RWLOCK.ACQUIRE", "l", "o", "READ", "1000", "LOCKDELAY", "5"], "LOCKDELAY needs"),
        (&["RSEM.ACQUIRE", "s", "1", "SESSION"], "SESSION needs LEASE"),
        (&["RLOCK.ACQUIRE", "l", "rlock:lockdelay", "1000"], "reserved"),
        (&["RWLOCK.ACQUIRE", "l", "rlock:lockdelay", "WRITE", "1000"], "reserved"),
        (&["RLOCK.RENEW", "l", "rlock:lockdelay", "1000"], "reserved"),
    ] {
        let err = run_str(&mut con, args).unwrap_err();
        assert!(err.starts_with("ERR") && err.contains(expected), "{args:?}: {err}");
    }
    assert_eq!(digest(&mut con), before);
}

#[test]
fn resp3_a_braced_name_and_an_acl_user_limited_to_a_key_pattern() {
    let server = Server::start();
    let mut admin = server.conn();
    cmd(&mut admin, &["ACL", "SETUSER", "lim", "on", ">pw", "~locks:*", "resetchannels", "+@all"]);
    let mut lim = server.conn_resp3();
    cmd(&mut lim, &["AUTH", "lim", "pw"]);
    let lim_id = client_id(&mut lim);
    // The end publishes the release: a user who may not publish on the channel gets no
    // SESSION (it could not release its own hold either), and nothing changes.
    let before = digest(&mut admin);
    let err = run_str(&mut lim, &["RLOCK.ACQUIRE", "locks:{a}b", "o", "60000", "SESSION"]);
    assert!(err.unwrap_err().starts_with("NOPERM"));
    let err = run_str(&mut lim, &["RLOCK.ACQUIRE", "other", "o", "60000", "SESSION"]);
    assert!(err.unwrap_err().starts_with("NOPERM"), "outside its key pattern");
    assert_eq!(digest(&mut admin), before);
    cmd(&mut admin, &["ACL", "SETUSER", "lim", "&redisson_lock__channel:*"]);
    assert_eq!(
        cmd(&mut lim, &["RLOCK.ACQUIRE", "locks:{a}b", "o", "60000", "SESSION"]),
        Value::Nil
    );
    let mut sub = server.conn();
    sub.set_read_timeout(Some(LIMIT)).expect("timeout");
    let mut sub = sub.as_pubsub();
    // Redisson's prefixName: a braced name keeps its own tag.
    sub.subscribe("redisson_lock__channel:locks:{a}b").expect("subscribe");
    kill_client(&mut admin, lim_id);
    let msg = sub.get_message().expect("the unlock message");
    assert_eq!(msg.get_payload_bytes(), b"0");
    assert!(!exists(&mut admin, "locks:{a}b"));
}

#[test]
fn flushall_drops_bindings_and_swapdb_takes_them_along() {
    let server = Server::start();
    let mut admin = server.conn();
    let mut a = server.conn();
    let a_id = client_id(&mut a);
    cmd(&mut a, &["RLOCK.ACQUIRE", "gone", "o", "60000", "SESSION"]);
    cmd(&mut admin, &["FLUSHALL"]);
    assert_eq!(session_holds(&mut admin), 0);
    cmd(&mut a, &["RLOCK.ACQUIRE", "l", "o", "60000", "SESSION"]);
    cmd(&mut admin, &["SWAPDB", "0", "1"]);
    cmd(&mut admin, &["SELECT", "1"]);
    cmd(&mut admin, &["RLOCK.ACQUIRE", "gone", "o", "60000"]);
    kill_client(&mut admin, a_id);
    poll("the end in database 1", LIMIT, || (!exists(&mut admin, "l")).then_some(()));
    assert!(exists(&mut admin, "gone"), "the flushed binding ended nothing");
    assert_eq!(session_ends(&mut admin), 1);
}

#[test]
fn session_combines_with_token_and_request_and_a_retry_after_the_end_is_a_new_grant() {
    let server = Server::start();
    let mut admin = server.conn();
    let mut a = server.conn();
    let a_id = client_id(&mut a);
    let acquire = ["RLOCK.ACQUIRE", "l", "o", "60000", "TOKEN", "REQUEST", "r1", "SESSION"];
    let first = rlock_tests_integration::granted_token(&cmd(&mut a, &acquire));
    // A retry on the same connection replays the grant, still bound.
    assert_eq!(rlock_tests_integration::granted_token(&cmd(&mut a, &acquire)), first);
    assert_eq!(session_holds(&mut admin), 1);
    kill_client(&mut admin, a_id);
    poll("the end", LIMIT, || (!exists(&mut admin, "l")).then_some(()));
    // The grant is no longer in place: a retry (a new connection) is granted anew.
    let mut b = server.conn();
    let again = rlock_tests_integration::granted_token(&cmd(&mut b, &acquire));
    assert!(again > first, "{again} after {first}");
    assert_eq!(session_holds(&mut admin), 1);
}

#[test]
fn session_is_refused_on_a_writable_replica() {
    let master = Server::start();
    let replica = Server::builder().replica_of(&master).config("replica-read-only", "no").start();
    let mut r = replica.conn();
    wait_link_up(&mut r);
    let before = digest(&mut r);
    let err = run_str(&mut r, &["RLOCK.ACQUIRE", "l", "o", "60000", "SESSION"]).unwrap_err();
    assert!(err.contains("master only"), "{err}");
    assert_eq!(digest(&mut r), before);
}

fn rlock_info(con: &mut Connection, field: &str) -> i64 {
    info_field(con, "rlock", field)
}

/// Polls `look` as fast as the server answers until it returns `done`; returns every value seen
/// and the longest time one look took (the server blocked meanwhile).
fn watch(
    con: &mut Connection,
    done: i64,
    mut look: impl FnMut(&mut Connection) -> i64,
) -> (Vec<i64>, Duration) {
    let start = Instant::now();
    let (mut seen, mut longest) = (Vec::new(), Duration::ZERO);
    loop {
        let asked = Instant::now();
        let value = look(con);
        longest = longest.max(asked.elapsed());
        seen.push(value);
        if value == done {
            return (seen, longest);
        }
        assert!(start.elapsed() < LIMIT, "not done after {LIMIT:?}: {:?}", seen.last());
    }
}

/// A connection closing with many session holds never stalls the server: its ends are applied
/// a bounded batch per timer tick (other clients are served between two), and the permits of
/// one semaphore are given back together. Ended one by one in a single tick (a lease lookup, a
/// `ZREM`, an `INCRBY`, a publish and a hand-off per permit: about 28 µs each here), a client
/// that took 100,000 leased permits with `SESSION` (ten acquires) and then disconnected would
/// stall the server for about 3 s.
#[test]
fn a_close_with_many_session_holds_never_stalls_the_server() {
    let server = Server::start();
    let mut admin = server.conn();
    admin.set_read_timeout(Some(LIMIT)).expect("timeout");
    let total: i64 = 100_000;
    cmd(&mut admin, &["RSEM.SETPERMITS", "s", &total.to_string()]);
    let mut holder = server.conn();
    holder.set_read_timeout(Some(LIMIT)).expect("timeout");
    let holder_id = client_id(&mut holder);
    for _ in 0..10 {
        let ids = cmd(&mut holder, &["RSEM.ACQUIRE", "s", "10000", "LEASE", "600000", "SESSION"]);
        assert!(matches!(ids, Value::Array(ref ids) if ids.len() == 10_000), "granted");
    }
    assert_eq!(rlock_info(&mut admin, "rlock_session_holds"), total);
    kill_client(&mut admin, holder_id);
    let (seen, longest) = watch(&mut admin, total, |con| int(&cmd(con, &["RSEM.AVAILABLE", "s"])));
    assert!(
        seen.iter().any(|&n| n > 0 && n < total),
        "the server answered while the ends were being applied: saw only {seen:?}"
    );
    assert!(longest < Duration::from_secs(1), "a look waited {longest:?}");
    assert_eq!(rlock_info(&mut admin, "rlock_session_ends"), total);
    assert_eq!(rlock_info(&mut admin, "rlock_session_holds"), 0);
    assert_eq!(cmd(&mut admin, &["EXISTS", "{s}:timeout"]), Value::Int(0));

    // Many reentrant locks on one connection: the same.
    let locks: i64 = 20_000;
    let mut holder = server.conn();
    holder.set_read_timeout(Some(LIMIT)).expect("timeout");
    let holder_id = client_id(&mut holder);
    let mut pipe = redis::pipe();
    for i in 0..locks {
        pipe.cmd("RLOCK.ACQUIRE").arg(format!("l{i}")).arg("o").arg(600_000).arg("SESSION");
    }
    pipe.query::<Vec<Value>>(&mut holder).expect("acquires");
    let keys = |con: &mut Connection| int(&cmd(con, &["DBSIZE"]));
    assert_eq!(keys(&mut admin), locks + 1);
    kill_client(&mut admin, holder_id);
    let (seen, longest) = watch(&mut admin, 1, keys);
    assert!(
        seen.iter().any(|&n| n > 1 && n < locks + 1),
        "the server answered while the ends were being applied: saw only {seen:?}"
    );
    assert!(longest < Duration::from_secs(1), "a look waited {longest:?}");
    assert_eq!(rlock_info(&mut admin, "rlock_session_ends"), total + locks);
    assert_eq!(rlock_info(&mut admin, "rlock_session_holds"), 0);
}

/// A lock, how to occupy it, how to wait for it (as `OWNER`), how to free it.
type Case<'a> = (&'a str, &'a [&'a str], &'a [&'a str], &'a [&'a str]);

/// A session waiter (with a lock-delay) whose connection closes after the hand-off granted it
/// but before its reply: the grant is rolled back (the next waiter is served at once, no
/// lock-delay: the hold never reached its client) and its binding goes with it; on each kind of
/// hold.
#[test]
fn a_session_waiter_gone_between_its_grant_and_its_reply_is_rolled_back_and_unbound() {
    let server = Server::start();
    let mut admin = server.conn();
    cmd(&mut admin, &["RSEM.SETPERMITS", "s", "1"]);
    let kinds: [Case; 4] = [
        (
            "l",
            &["RLOCK.ACQUIRE", "l", "h", "60000"],
            &["RLOCK.ACQUIRE", "l", "OWNER", "60000"],
            &["RLOCK.RELEASE", "l", "h"],
        ),
        (
            "r",
            &["RWLOCK.ACQUIRE", "r", "h", "WRITE", "60000"],
            &["RWLOCK.ACQUIRE", "r", "OWNER", "READ", "60000"],
            &["RWLOCK.RELEASE", "r", "h", "WRITE"],
        ),
        (
            "w",
            &["RWLOCK.ACQUIRE", "w", "h", "READ", "60000"],
            &["RWLOCK.ACQUIRE", "w", "OWNER", "WRITE", "60000"],
            &["RWLOCK.RELEASE", "w", "h", "READ"],
        ),
        (
            "s",
            &["RSEM.ACQUIRE", "s", "1"],
            &["RSEM.ACQUIRE", "s", "1", "LEASE", "60000"],
            &["RSEM.RELEASE", "s", "1"],
        ),
    ];
    for (i, (key, occupy, acquire, vacate)) in kinds.iter().enumerate() {
        cmd(&mut admin, occupy);
        let with = |owner: &str, session: bool| -> Vec<String> {
            let mut args: Vec<String> = acquire.iter().map(|a| a.replace("OWNER", owner)).collect();
            args.extend(["WAIT", "0"].map(String::from));
            if session {
                args.extend(["SESSION", "LOCKDELAY", "60000"].map(String::from));
            }
            args
        };
        let first = with("first", true);
        let first: Vec<&str> = first.iter().map(String::as_str).collect();
        let first = Pending::start_str(&server, &first);
        wait_blocked(&mut admin, 1);
        let second = with("second", false);
        let second: Vec<&str> = second.iter().map(String::as_str).collect();
        let second = Pending::start_str(&server, &second);
        wait_blocked(&mut admin, 2);
        // The release hands the lock to the first waiter, which is gone before its reply.
        cmd(&mut admin, &["MULTI"]);
        cmd(&mut admin, vacate);
        cmd(&mut admin, &["CLIENT", "KILL", "ID", &first.client_id().to_string()]);
        assert!(matches!(cmd(&mut admin, &["EXEC"]), Value::Array(_)));
        let (reply, _) = second.reply(LIMIT);
        assert!(reply.is_ok(), "{key}: the second waiter is served: {reply:?}");
        let _ = first.reply(LIMIT);
        assert_eq!(rlock_info(&mut admin, "rlock_grants_rolled_back"), i as i64 + 1, "{key}");
        assert_eq!(rlock_info(&mut admin, "rlock_session_holds"), 0, "{key}: binding gone");
        assert_eq!(rlock_info(&mut admin, "rlock_session_ends"), 0, "{key}: nothing ended");
        assert_eq!(rlock_info(&mut admin, "rlock_lock_delays"), 0, "{key}: no lock-delay");
        if *key != "s" {
            let holders: Vec<Vec<u8>> =
                hgetall(&mut admin, key.as_bytes()).into_iter().map(|(f, _)| f).collect();
            assert!(holders.iter().any(|f| f.starts_with(b"second")), "{key}: {holders:?}");
            assert!(!holders.iter().any(|f| f.starts_with(b"first")), "{key}: {holders:?}");
        }
    }
}
