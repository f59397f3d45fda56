//! A separate process for the multi-process tests: `lock_worker <url> <lock> <counter> <n>`
//! takes `<lock>` with `RLOCK.ACQUIRE ... WAIT 0` n times, each time incrementing `<counter>`
//! non-atomically (GET, then SET) while holding it, and prints each hold interval as
//! "<start-ns> <end-ns>" (wall clock) on standard output.

use std::time::{SystemTime, UNIX_EPOCH};

fn now_ns() -> u128 {
    SystemTime::now().duration_since(UNIX_EPOCH).expect("clock").as_nanos()
}

/// `lock_worker hold <url> <lock> <lease-ms>`: takes the lock, prints "held", then sleeps
/// (a holder process to be killed).
fn hold(url: &str, lock: &str, lease: &str) -> ! {
    let mut con = redis::Client::open(url).expect("url").get_connection().expect("connect");
    let owner = format!("holder-{}", std::process::id());
    let granted: Option<i64> = redis::cmd("RLOCK.ACQUIRE")
        .arg(lock)
        .arg(&owner)
        .arg(lease)
        .query(&mut con)
        .expect("acquire");
    assert_eq!(granted, None, "the lock was free");
    println!("held");
    loop {
        std::thread::sleep(std::time::Duration::from_secs(60));
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let [_, mode, url, lock, lease] = args.as_slice() {
        if mode == "hold" {
            hold(url, lock, lease);
        }
    }
    let [_, url, lock, counter, n] = args.as_slice() else {
        eprintln!("usage: lock_worker <url> <lock> <counter> <iterations>");
        std::process::exit(2);
    };
    let n: usize = n.parse().expect("iterations");
    let owner = format!("worker-{}", std::process::id());
    let mut con =
        redis::Client::open(url.as_str()).expect("url").get_connection().expect("connect");
    let mut out = String::new();
    for _ in 0..n {
        let granted: Option<i64> = redis::cmd("RLOCK.ACQUIRE")
            .arg(lock)
            .arg(&owner)
            .arg(30_000)
            .arg("WAIT")
            .arg(0)
            .query(&mut con)
            .expect("acquire");
        assert_eq!(granted, None, "WAIT 0 replies only once the lock is held");
        let start = now_ns();
        let value: Option<i64> = redis::cmd("GET").arg(counter).query(&mut con).expect("get");
        let () = redis::cmd("SET")
            .arg(counter)
            .arg(value.unwrap_or(0) + 1)
            .query(&mut con)
            .expect("set");
        let end = now_ns();
        let released: i64 =
            redis::cmd("RLOCK.RELEASE").arg(lock).arg(&owner).query(&mut con).expect("release");
        assert_eq!(released, 1);
        out.push_str(&format!("{start} {end}\n"));
    }
    print!("{out}");
}
