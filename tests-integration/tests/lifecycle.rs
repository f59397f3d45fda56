//! The module's memory across server events: session bindings, the ends waiting to be applied
//! and the locks' scheduled checks at `SWAPDB`, `FLUSHALL`, `DEBUG RELOAD` / `DEBUG LOADAOF`
//! and `MODULE UNLOAD`; the token high-water mark across `MODULE UNLOAD` / `MODULE LOAD`.

use std::time::Duration;

use redis::{Connection, Value};

use rlock_tests_integration::idle::{
    assert_idle_and_unload, timers_armed, unloadable_server, waiting_clients,
};
use rlock_tests_integration::sessions::{session_ends, session_holds};
use rlock_tests_integration::{
    client_id, cmd, exists, granted_token, hgetall, in_thread, info_field, kill_client,
    module_path, pexpiretime, poll, run_str, Pending, Server,
};

const LIMIT: Duration = Duration::from_secs(20);

fn scheduled_checks(con: &mut Connection) -> i64 {
    info_field(con, "rlock", "rlock_scheduled_checks")
}

fn acquire_session(con: &mut Connection, key: &str, owner: &str) {
    assert_eq!(cmd(con, &["RLOCK.ACQUIRE", key, owner, "60000", "SESSION"]), Value::Nil);
}

/// A connection killed inside a `MULTI` that then swaps its database with one holding a
/// session hold of the same name and owner (another connection's): the killed connection's
/// pending end follows its hold to the other database and ends it; the other hold stays bound
/// to its own, live, connection. (The swap re-bound the other hold under the first database's
/// number, which cancelled the pending end queued there: the killed connection's hold lasted
/// its whole lease.)
#[test]
fn a_close_then_a_swapdb_in_one_transaction_still_ends_the_closed_connections_hold() {
    let server = Server::start();
    let mut first = server.conn();
    let first_id = client_id(&mut first);
    acquire_session(&mut first, "l", "o");
    let mut second = server.conn();
    cmd(&mut second, &["SELECT", "1"]);
    let second_id = client_id(&mut second);
    acquire_session(&mut second, "l", "o");
    let mut admin = server.conn();
    assert_eq!(session_holds(&mut admin), 2);
    let mut pipe = redis::pipe();
    pipe.atomic().cmd("CLIENT").arg("KILL").arg("ID").arg(first_id).cmd("SWAPDB").arg(0).arg(1);
    let _: Value = pipe.query(&mut admin).expect("MULTI");
    // The first connection's hold is in database 1 now, and ends.
    let mut db1 = server.conn();
    cmd(&mut db1, &["SELECT", "1"]);
    poll("the closed connection's hold to end", LIMIT, || (!exists(&mut db1, "l")).then_some(()));
    assert_eq!(session_ends(&mut admin), 1);
    // The second connection's hold, now in database 0, is still held and still bound.
    assert!(exists(&mut admin, "l"));
    assert_eq!(session_holds(&mut admin), 1);
    kill_client(&mut admin, second_id);
    poll("the second hold to end with its connection", LIMIT, || {
        (!exists(&mut admin, "l")).then_some(())
    });
}

/// Session holds, a pending end and the scheduled checks before a reload, and what is left of
/// them after it: a reload (`DEBUG RELOAD`, or `DEBUG LOADAOF` with `aof`) fires the flush
/// event, then loads the same data back. The bindings and checks came back with the data (they
/// were dropped for good: the holds then ended only with their leases, a leased permit went back
/// only when a command looked at its semaphore).
fn the_module_memory_survives(reload: &[&str], aof: bool) {
    let server = if aof {
        Server::builder().config("appendonly", "yes").config("appendfsync", "always").start()
    } else {
        Server::start()
    };
    let mut admin = server.conn();
    let mut holder = server.conn();
    let holder_id = client_id(&mut holder);
    acquire_session(&mut holder, "l", "o");
    acquire_session(&mut holder, "m", "o");
    cmd(&mut admin, &["RSEM.SETPERMITS", "s", "1"]);
    let ids = cmd(&mut admin, &["RSEM.ACQUIRE", "s", "1", "LEASE", "1500"]);
    assert!(matches!(ids, Value::Array(ref a) if a.len() == 1), "{ids:?}");
    let checks = scheduled_checks(&mut admin);
    assert!(checks >= 1, "the permit's reclaim is scheduled");
    assert_eq!(session_holds(&mut admin), 2);
    // A pending end too: the close and the reload in one transaction.
    let mut gone = server.conn();
    let gone_id = client_id(&mut gone);
    acquire_session(&mut gone, "g", "o");
    let mut pipe = redis::pipe();
    pipe.atomic().cmd("CLIENT").arg("KILL").arg("ID").arg(gone_id).cmd(reload[0]).arg(reload[1]);
    let _: Value = pipe.query(&mut admin).expect("MULTI with the reload");
    assert_eq!(session_holds(&mut admin), 2, "the bindings came back with the data");
    assert_eq!(scheduled_checks(&mut admin), checks, "the checks came back with the data");
    poll("the pending end to be applied", LIMIT, || (!exists(&mut admin, "g")).then_some(()));
    // The bound connection closes: its holds end at once, not with their leases.
    kill_client(&mut admin, holder_id);
    poll("the holds to end with their connection", LIMIT, || {
        (!exists(&mut admin, "l") && !exists(&mut admin, "m")).then_some(())
    });
    assert_eq!(session_ends(&mut admin), 3);
    // The permit's reclaim runs at its lease end, with no command looking at the semaphore.
    poll("the leased permit to come back", LIMIT, || {
        (cmd(&mut admin, &["GET", "s"]) == Value::BulkString(b"1".to_vec())).then_some(())
    });
    // A real flush still drops them for good.
    let mut holder = server.conn();
    let holder_id = client_id(&mut holder);
    acquire_session(&mut holder, "l", "o");
    cmd(&mut admin, &["FLUSHALL"]);
    assert_eq!(session_holds(&mut admin), 0);
    assert_eq!(cmd(&mut admin, &["RLOCK.ACQUIRE", "l", "o", "60000"]), Value::Nil);
    kill_client(&mut admin, holder_id);
    let mut barrier = server.conn();
    let barrier_id = client_id(&mut barrier);
    acquire_session(&mut barrier, "barrier", "b");
    kill_client(&mut admin, barrier_id);
    poll("the barrier's end", LIMIT, || (!exists(&mut admin, "barrier")).then_some(()));
    assert!(exists(&mut admin, "l"), "a hold taken after a FLUSHALL is not the flushed binding's");
}

/// A master restarted from its AOF (a crash, then `kill -9`'s restart) has none of the checks
/// the old process had scheduled: it looks for them in its data, as a promoted replica does. A
/// reader whose only hold ended leaves the read-write lock (another reader's 30 s hold keeps
/// the hash), and a leased permit whose lease ended comes back, with no command touching
/// either. (Both stayed until some command or waiter touched them: the reader's field until the
/// live reader's release or the hash's end, 30 s later.)
#[test]
fn a_master_restarted_from_its_aof_drops_ended_readers_and_leases_untouched() {
    let mut server =
        Server::builder().config("appendonly", "yes").config("appendfsync", "always").start();
    let mut con = server.conn();
    assert_eq!(cmd(&mut con, &["RWLOCK.ACQUIRE", "rw", "dead:1", "READ", "1000"]), Value::Nil);
    assert_eq!(cmd(&mut con, &["RWLOCK.ACQUIRE", "rw", "live:1", "READ", "30000"]), Value::Nil);
    cmd(&mut con, &["RSEM.SETPERMITS", "s", "2"]);
    let ids = cmd(&mut con, &["RSEM.ACQUIRE", "s", "1", "LEASE", "1000"]);
    assert!(matches!(ids, Value::Array(ref a) if a.len() == 1), "{ids:?}");
    let granted = std::time::Instant::now();
    server.restart();
    let mut con = server.conn();
    poll("the dead reader to leave the restarted master", LIMIT, || {
        (cmd(&mut con, &["HEXISTS", "rw", "dead:1"]) == Value::Int(0)).then_some(())
    });
    poll("the leased permit to come back", LIMIT, || {
        (cmd(&mut con, &["GET", "s"]) == Value::BulkString(b"2".to_vec())).then_some(())
    });
    let took = granted.elapsed();
    assert!(took < Duration::from_millis(1_000 + 3_000), "at the leases' end: {took:?}");
    assert_eq!(cmd(&mut con, &["HEXISTS", "rw", "live:1"]), Value::Int(1), "the live one stays");
    assert_eq!(info_field(&mut con, "rlock", "rlock_dead_reader_reaps"), 1);
}

#[test]
fn session_bindings_pending_ends_and_checks_survive_a_debug_reload() {
    the_module_memory_survives(&["DEBUG", "RELOAD"], false);
}

#[test]
fn session_bindings_pending_ends_and_checks_survive_a_debug_loadaof() {
    the_module_memory_survives(&["DEBUG", "LOADAOF"], true);
}

/// Unloads the module once nothing else keeps it (no timer armed), polled with a bound.
fn unload(con: &mut Connection) {
    poll("the module to unload", LIMIT, || {
        run_str(con, &["MODULE", "UNLOAD", "rlock"]).is_ok().then_some(())
    });
}

fn load(con: &mut Connection) {
    let path = rlock_tests_integration::module_path();
    assert_eq!(cmd(con, &["MODULE", "LOAD", path.to_str().expect("path")]), Value::Okay);
}

/// A session hold outlived `MODULE UNLOAD` / `MODULE LOAD` and its connection's close then ended
/// nothing: the binding lived in the unloaded module's memory. The unload is refused while a
/// hold is bound (the log says why), and goes through once the hold has ended.
#[test]
fn module_unload_is_refused_while_a_session_hold_is_bound() {
    let server = unloadable_server();
    let mut admin = server.conn();
    let mut holder = server.conn();
    let holder_id = client_id(&mut holder);
    acquire_session(&mut holder, "l", "o");
    poll("no module timer armed", LIMIT, || (timers_armed(&mut admin) == 0).then_some(()));
    let refused = run_str(&mut admin, &["MODULE", "UNLOAD", "rlock"]);
    assert!(refused.is_err(), "unloaded with a session hold bound: {refused:?}");
    assert!(server.log().contains("MODULE UNLOAD refused: 1 session hold(s)"), "the log says why");
    // Still loaded, still bound: the close ends the hold.
    kill_client(&mut admin, holder_id);
    poll("the hold to end with its connection", LIMIT, || (!exists(&mut admin, "l")).then_some(()));
    unload(&mut admin);
    load(&mut admin);
    assert_eq!(session_holds(&mut admin), 0);
}

/// Under `allkeys-lru`, tokens 1, 2, 3 on a lock, its counter evicted, the module unloaded and
/// loaded again (the documented upgrade path): the next token was 1 again, as the token
/// high-water mark that covers an evicted counter lived in the unloaded module's memory. A load
/// into a running server now raises the token floor, as a restart does.
#[test]
fn fencing_tokens_never_repeat_across_a_module_reload_after_their_counter_was_evicted() {
    let server = Server::builder()
        .config("enable-module-command", "yes")
        .config("maxmemory-policy", "allkeys-lru")
        .start();
    let mut con = server.conn();
    let mut tokens = Vec::new();
    for _ in 0..3 {
        tokens.push(granted_token(&cmd(&mut con, &["RLOCK.ACQUIRE", "x", "a", "60000", "TOKEN"])));
        assert_eq!(cmd(&mut con, &["RLOCK.RELEASE", "x", "a"]), Value::Int(1));
    }
    assert_eq!(tokens, vec![1, 2, 3]);
    // Evicted for real: a memory limit below what the server uses, one write, the limit lifted.
    cmd(&mut con, &["CONFIG", "SET", "maxmemory", "1"]);
    let _ = run_str(&mut con, &["SET", "junk", "x"]);
    cmd(&mut con, &["CONFIG", "SET", "maxmemory", "0"]);
    assert!(!exists(&mut con, "redisson_lock_token:{x}"), "the counter was evicted");
    unload(&mut con);
    load(&mut con);
    let next = granted_token(&cmd(&mut con, &["RLOCK.ACQUIRE", "x", "a", "60000", "TOKEN"]));
    assert!(next > 3, "token {next} after 1, 2, 3");
    assert_eq!(next, info_field(&mut con, "rlock", "rlock_token_floor"));
}

/// Two loads within one millisecond: the second's token floor must still be above every token
/// the first instance granted (the floor is the load's millisecond × 1,000,000, and the high-water
/// mark went with the unloaded instance). Each acquire + counter eviction + unload + load goes in
/// one pipeline, so it runs within one millisecond as often as the machine allows. (No rlock
/// command follows the unload within a pipeline: Valkey 9.1 and Redis 8.2 look up pipelined
/// commands ahead and crash on an unloaded module's.)
#[test]
fn fencing_tokens_never_repeat_across_reloads_within_one_millisecond() {
    let server = Server::builder()
        .config("enable-module-command", "yes")
        .config("maxmemory-policy", "allkeys-lru")
        .start();
    let mut con = server.conn();
    let path = rlock_tests_integration::module_path();
    let path = path.to_str().expect("path");
    let mut last = 0;
    for round in 0..30 {
        let replies: Vec<Value> = redis::pipe()
            .cmd("RLOCK.ACQUIRE")
            .arg("t")
            .arg("o")
            .arg(60_000)
            .arg("TOKEN")
            .cmd("RLOCK.RELEASE")
            .arg("t")
            .arg("o")
            .cmd("DEL")
            .arg("redisson_lock_token:{t}")
            .cmd("MODULE")
            .arg("UNLOAD")
            .arg("rlock")
            .cmd("MODULE")
            .arg("LOAD")
            .arg(path)
            .query(&mut con)
            .expect("pipeline");
        assert_eq!(replies[3..], [Value::Okay, Value::Okay], "round {round}");
        let token = granted_token(&replies[0]);
        assert!(token > last, "round {round}: token {token} after {last}");
        last = token;
    }
}

// ---- MODULE UNLOAD and LOAD --------------------------------------------------------------------

#[test]
fn module_unload_is_refused_while_a_client_waits_and_a_hold_is_looked_at() {
    let server = unloadable_server();
    let mut con = server.conn();
    cmd(&mut con, &["RLOCK.ACQUIRE", "l", "a", "60000"]);
    let waiter = in_thread(&server, &["RLOCK.ACQUIRE", "l", "b", "60000", "WAIT", "20000"]);
    poll("the waiter waits", LIMIT, || (waiting_clients(&mut con) == 1).then_some(()));
    assert!(run_str(&mut con, &["MODULE", "UNLOAD", "rlock"]).is_err(), "a client waits");
    assert_eq!(cmd(&mut con, &["RLOCK.RELEASE", "l", "a"]), Value::Int(1));
    assert_eq!(waiter.join().expect("waiter").0, Value::Nil);
    cmd(&mut con, &["RLOCK.RELEASE", "l", "b"]);
    cmd(&mut con, &["RWLOCK.ACQUIRE", "rw", "a", "READ", "60000"]);
    assert!(run_str(&mut con, &["MODULE", "UNLOAD", "rlock"]).is_err(), "a read hold is looked at");
    assert_eq!(cmd(&mut con, &["RWLOCK.RELEASE", "rw", "a", "READ"]), Value::Int(1));
    assert_idle_and_unload(&mut con);
}

/// Unloaded and loaded again in one server: the commands, settings, INFO and waiting work as
/// on a fresh load (no static left from the first load in the way); a second load is refused.
#[test]
fn the_module_loads_again_after_an_unload() {
    let server = unloadable_server();
    let mut con = server.conn();
    let path = module_path().display().to_string();
    cmd(&mut con, &["CONFIG", "SET", "rlock.stall-ms", "2000"]);
    cmd(&mut con, &["RLOCK.ACQUIRE", "l", "a", "60000"]);
    let waiter = in_thread(&server, &["RLOCK.ACQUIRE", "l", "b", "60000", "WAIT", "20000"]);
    poll("the waiter waits", LIMIT, || (waiting_clients(&mut con) == 1).then_some(()));
    cmd(&mut con, &["RLOCK.RELEASE", "l", "a"]);
    assert_eq!(waiter.join().expect("waiter").0, Value::Nil);
    cmd(&mut con, &["RLOCK.RELEASE", "l", "b"]);
    assert_eq!(info_field(&mut con, "rlock", "rlock_waits"), 1);
    assert!(run_str(&mut con, &["MODULE", "LOAD", &path]).is_err(), "loaded twice");
    assert_idle_and_unload(&mut con);
    assert!(run_str(&mut con, &["RLOCK.ACQUIRE", "l", "a", "60000"]).is_err(), "unloaded");
    assert_eq!(cmd(&mut con, &["MODULE", "LOAD", &path]), Value::Okay);
    let stall: Vec<String> =
        redis::cmd("CONFIG").arg("GET").arg("rlock.stall-ms").query(&mut con).expect("CONFIG");
    assert_eq!(stall, ["rlock.stall-ms", "1500"], "a fresh load has the default");
    assert_eq!(info_field(&mut con, "rlock", "rlock_waits"), 0, "a fresh load counts afresh");
    assert_eq!(info_field(&mut con, "rlock", "rlock_handoffs"), 0, "a fresh load counts afresh");
    assert_eq!(server.log().matches("<rlock> rlock ").count(), 2, "a load line each time");
    cmd(&mut con, &["RLOCK.ACQUIRE", "l", "a", "60000"]);
    let waiter = in_thread(&server, &["RLOCK.ACQUIRE", "l", "b", "60000", "WAIT", "20000"]);
    poll("the waiter waits", LIMIT, || (waiting_clients(&mut con) == 1).then_some(()));
    assert_eq!(cmd(&mut con, &["RLOCK.RELEASE", "l", "a"]), Value::Int(1));
    assert_eq!(waiter.join().expect("waiter").0, Value::Nil);
    cmd(&mut con, &["RLOCK.RELEASE", "l", "b"]);
    assert_eq!(cmd(&mut con, &["PING"]), Value::SimpleString("PONG".into()));
    assert!(!server.log().contains("Skip register defrag"), "{}", server.log());
    assert_idle_and_unload(&mut con);
}

fn rlock_info(con: &mut Connection, field: &str) -> i64 {
    info_field(con, "rlock", field)
}

/// `INFO rlock`'s wait-time buckets (`rlock_wait_ms_*`) are reset when the module is loaded
/// again (`MODULE UNLOAD` + `MODULE LOAD`, the library staying mapped), as every other counter
/// is: never `rlock_waits:0` beside `rlock_wait_ms_count:1`, a histogram counting waits that,
/// by the other counters, never happened. A session binding present at the unload
/// refuses it (the hold would no longer end with its connection: lifecycle.rs); once the hold
/// is released the unload goes through and the new load starts with no binding.
#[test]
fn wait_time_buckets_start_from_zero_after_a_module_reload() {
    let server = unloadable_server();
    let mut con = server.conn();
    cmd(&mut con, &["RLOCK.ACQUIRE", "k", "h", "60000"]);
    let waiter = Pending::start_str(&server, &["RLOCK.ACQUIRE", "k", "w", "60000", "WAIT", "20"]);
    assert!(matches!(waiter.reply(LIMIT).0, Ok(Value::Int(_))), "timed out");
    assert_eq!(rlock_info(&mut con, "rlock_wait_ms_count"), 1);
    let mut session = server.conn();
    cmd(&mut session, &["RLOCK.ACQUIRE", "s", "o", "60000", "SESSION"]);
    assert_eq!(rlock_info(&mut con, "rlock_session_holds"), 1);
    poll("no module timer armed", LIMIT, || {
        (rlock_info(&mut con, "rlock_timers_armed") == 0).then_some(())
    });
    assert!(
        rlock_tests_integration::run_str(&mut con, &["MODULE", "UNLOAD", "rlock"]).is_err(),
        "a session hold is bound"
    );
    assert_eq!(cmd(&mut session, &["RLOCK.RELEASE", "s", "o"]), Value::Int(1));
    assert_eq!(cmd(&mut con, &["MODULE", "UNLOAD", "rlock"]), Value::Okay);
    let path = rlock_tests_integration::module_path();
    cmd(&mut con, &["MODULE", "LOAD", path.to_str().expect("path")]);
    assert_eq!(rlock_info(&mut con, "rlock_waits"), 0);
    for field in ["rlock_wait_ms_count", "rlock_wait_ms_sum", "rlock_wait_ms_le_inf"] {
        assert_eq!(rlock_info(&mut con, field), 0, "{field} after the reload");
    }
    assert_eq!(rlock_info(&mut con, "rlock_session_holds"), 0);
}

#[test]
fn info_counters_start_from_zero_after_a_module_reload() {
    let server = unloadable_server();
    let mut con = server.conn();
    cmd(&mut con, &["RLOCK.ACQUIRE", "k", "h", "60000"]);
    let waiter = Pending::start_str(&server, &["RLOCK.ACQUIRE", "k", "w", "60000", "WAIT", "100"]);
    let (reply, _) = waiter.reply(LIMIT);
    assert!(matches!(reply, Ok(Value::Int(n)) if n > 0), "timed out: {reply:?}");
    assert_eq!(info_field(&mut con, "rlock", "rlock_waits"), 1);
    poll("no module timer armed", LIMIT, || (timers_armed(&mut con) == 0).then_some(()));
    cmd(&mut con, &["MODULE", "UNLOAD", "rlock"]);
    let path = rlock_tests_integration::module_path();
    cmd(&mut con, &["MODULE", "LOAD", path.to_str().expect("path")]);
    assert_eq!(info_field(&mut con, "rlock", "rlock_waits"), 0);
    assert_eq!(info_field(&mut con, "rlock", "rlock_timeouts"), 0);
}

#[test]
fn a_flush_drops_the_checks_of_the_locks_it_emptied() {
    let server = Server::start();
    let mut con = server.conn();
    let mut other = server.conn();
    cmd(&mut other, &["SELECT", "1"]);
    for (c, prefix) in [(&mut con, "a"), (&mut other, "b")] {
        for i in 0..100 {
            let name = format!("{prefix}{i}");
            cmd(c, &["RSEM.SETPERMITS", &name, "1"]);
            let ids = cmd(c, &["RSEM.ACQUIRE", &name, "1", "LEASE", "600000"]);
            assert!(matches!(ids, Value::Array(_)), "{ids:?}");
        }
    }
    assert_eq!(scheduled_checks(&mut con), 200, "a check at each lease's end");
    cmd(&mut other, &["FLUSHDB"]);
    assert_eq!(scheduled_checks(&mut con), 100, "database 1's are gone, database 0's kept");
    cmd(&mut con, &["FLUSHALL"]);
    assert_eq!(scheduled_checks(&mut con), 0, "nothing kept until the old deadlines");
    assert_eq!(info_field(&mut con, "rlock_waits", "rlock_timers_armed"), 0);
}

#[test]
fn leases_and_tokens_survive_an_rdb_restart() {
    let mut server = Server::start();
    let mut con = server.conn();
    let token = cmd(&mut con, &["RLOCK.ACQUIRE", "l", "a", "60000", "TOKEN"]);
    assert_eq!(token, Value::Array(vec![Value::Int(1), Value::Int(1)]));
    cmd(&mut con, &["RLOCK.ACQUIRE", "l", "a", "60000", "TOKEN"]);
    let expiry = pexpiretime(&mut con, b"l");
    cmd(&mut con, &["SAVE"]);
    drop(con);
    server.restart(); // SIGKILL, then from dump.rdb (no AOF)
    let mut con = server.conn();
    assert_eq!(hgetall(&mut con, b"l"), vec![(b"a".to_vec(), b"2".to_vec())]);
    assert_eq!(pexpiretime(&mut con, b"l"), expiry, "the same absolute deadline");
    let busy = cmd(&mut con, &["RLOCK.ACQUIRE", "l", "b", "60000", "TOKEN"]);
    assert!(matches!(&busy, Value::Array(v) if v[0] == Value::Int(0)), "{busy:?}");
    cmd(&mut con, &["RLOCK.FORCERELEASE", "l"]);
    let next = cmd(&mut con, &["RLOCK.ACQUIRE", "l", "b", "60000", "TOKEN"]);
    // Tokens go on, above the floor the load from disk raised (grants after the last save
    // may be lost with it, and their tokens must not come back).
    let Value::Array(parts) = &next else { panic!("{next:?}") };
    assert_eq!(parts[0], Value::Int(1));
    let Value::Int(token) = parts[1] else { panic!("{next:?}") };
    assert!(token > 2, "tokens go on: {token}");
    assert_eq!(
        token,
        info_field(&mut con, "rlock", "rlock_token_floor"),
        "the first above the floor"
    );
}
