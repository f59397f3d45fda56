//! The releaser without a server: flushing, a job's bound, which failures are retried.

use std::time::{Duration, Instant};

use super::*;

/// A server's error reply `text`, as redis-rs reports it.
fn server_error(text: &str) -> RedisError {
    let reply = format!("-{text}\r\n");
    match redis::parse_redis_value(reply.as_bytes()) {
        Ok(Value::ServerError(e)) => e.into(),
        other => panic!("not an error reply: {other:?}"),
    }
}

/// A port nothing listens on (bound, then closed).
fn closed_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.local_addr().expect("addr").port()
}

fn unreachable() -> Releaser {
    let url = format!("redis://127.0.0.1:{}/", closed_port());
    Releaser::new(Route::Single(redis::Client::open(url).expect("client")))
}

#[test]
fn nothing_pending_flushes_and_drops_without_blocking() {
    let releaser = unreachable();
    let started = Instant::now();
    releaser.flush(Duration::from_secs(5));
    drop(releaser);
    assert!(started.elapsed() < Duration::from_millis(100), "{:?}", started.elapsed());
}

#[test]
fn a_job_that_gets_no_reply_is_retried_until_its_until_then_reports_the_failure() {
    let releaser = unreachable();
    let (done, reply) = oneshot::channel();
    let submitted = Instant::now();
    let until = submitted + Duration::from_millis(400);
    let mut cmd = redis::cmd("RLOCK.RELEASE");
    cmd.arg("l").arg("owner").arg("REQUEST").arg("id");
    releaser.submit(Arc::from(&b"l"[..]), cmd, until, Some(done));
    // The submit did not block; the flush waits for the job to end.
    assert!(submitted.elapsed() < Duration::from_millis(50), "{:?}", submitted.elapsed());
    releaser.flush(Duration::from_secs(5));
    let ended = submitted.elapsed();
    assert!(ended >= Duration::from_millis(350), "retried until its until: {ended:?}");
    assert!(ended < Duration::from_secs(3), "not past it: {ended:?}");
    let reply = reply.blocking_recv().expect("the job reports");
    assert!(reply.is_err_and(|e| connection_failed(&e)), "a connection failure");
}

#[test]
fn a_flush_is_bounded_by_its_maximum() {
    let releaser = unreachable();
    let cmd = redis::cmd("PING");
    releaser.submit(Arc::from(&b"k"[..]), cmd, Instant::now() + Duration::from_secs(1), None);
    let started = Instant::now();
    releaser.flush(Duration::from_millis(200));
    let took = started.elapsed();
    assert!(took >= Duration::from_millis(190) && took < Duration::from_secs(2), "{took:?}");
}

#[test]
fn refusals_of_a_server_that_is_not_the_one_to_ask_are_retried_final_answers_are_not() {
    for text in [
        "READONLY You can't write against a read only replica.",
        "NOREPLICAS Not enough good replicas to write.",
        "MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'.",
        "LOADING Redis is loading the dataset in memory",
        "MOVED 3999 127.0.0.1:6381",
        "ASK 3999 127.0.0.1:6381",
        "TRYAGAIN Multiple keys request during rehashing of slot",
        "CLUSTERDOWN The cluster is down",
    ] {
        assert!(worth_retrying(&server_error(text)), "{text}");
    }
    for text in [
        "ERR syntax error",
        "WRONGTYPE Operation against a key holding the wrong kind of value",
        "NOPERM this user has no permissions to access one of the keys used as arguments",
        "ERR unknown command 'rlock.release', with args beginning with: ",
    ] {
        assert!(!worth_retrying(&server_error(text)), "{text}");
    }
    let refused = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
    assert!(worth_retrying(&RedisError::from(refused)));
    assert!(worth_retrying(&timed_out("no answer")));
}

#[test]
fn a_lease_too_long_to_add_to_now_gives_a_day() {
    let until = until_after(Duration::MAX);
    assert!(until > Instant::now() + Duration::from_secs(86_000));
    let until = until_after(Duration::from_secs(3));
    assert!(until <= Instant::now() + Duration::from_secs(3));
}
