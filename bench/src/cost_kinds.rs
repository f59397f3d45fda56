//! Section 1's read-write lock and semaphore rows, AOF on (`appendfsync no`): the server time
//! per call of `RWLOCK.*` and `RSEM.*` beside Redisson's scripts (EVALSHA) and the plain
//! command a write of one key costs (`SET NX PX`, `DEL`, `DECRBY`, `INCRBY`).

use redis::Cmd;
use rlock_tests_integration::command as cmd;
use rlock_tests_integration::redisson::{
    RedissonRw, REDISSON_READ, REDISSON_READ_UNLOCK, REDISSON_WRITE,
};

use crate::report::{num, ratio};
use crate::util;

const OWNER: &str = "8b9f3c1e-2a7d-4c55-9e0b-1f2d3c4b5a69:1";
const CLIENTS: usize = 50;
const PIPELINE: usize = 16;

/// `usec_per_call` of `stat` over `n` commands made by `make`, after a stats reset.
async fn usec<F>(
    server: &rlock_tests_integration::Server,
    n: u64,
    stat: &str,
    make: F,
) -> (f64, f64)
where
    F: Fn(u64) -> Cmd + Send + Sync + 'static,
{
    let mut con = util::conn(server).await;
    util::reset_stats(&mut con).await;
    let ops = util::drive(server, CLIENTS, PIPELINE, n, make).await;
    (util::usec_per_call(&mut con, stat).await, ops)
}

/// A Redisson script call as `EVALSHA sha`.
fn evalsha(call: &rlock_tests_integration::redisson::Call, sha: &str) -> Cmd {
    call.command(Some(sha))
}

/// The rows: operation, rlock µs, Lua µs, floor command, floor µs, rlock/Lua, rlock/floor.
pub async fn rows(n: u64) -> Vec<Vec<String>> {
    let server = rlock_tests_integration::Server::builder()
        .config("appendonly", "yes")
        .config("appendfsync", "no")
        .start();
    let mut con = util::conn(&server).await;
    let mut load = async |src: &str| -> String {
        redis::cmd("SCRIPT").arg("LOAD").arg(src).query_async(&mut con).await.expect("LOAD")
    };
    let (read, read_unlock, write) =
        (load(REDISSON_READ).await, load(REDISSON_READ_UNLOCK).await, load(REDISSON_WRITE).await);
    let (try_acquire, release) =
        (load(crate::semaphore::TRY_ACQUIRE).await, load(crate::semaphore::RELEASE).await);
    let s = &server;
    let mut out = Vec::new();
    let mut row =
        |name: &str, rlock: (f64, f64), lua: (f64, f64), floor: &str, plain: (f64, f64)| {
            out.push(vec![
                format!("{name}, AOF on"),
                num(rlock.0),
                num(lua.0),
                floor.to_owned(),
                num(plain.0),
                ratio(rlock.0, lua.0),
                ratio(rlock.0, plain.0),
                "-".to_owned(),
                "-".to_owned(),
                num(rlock.1),
                num(lua.1),
                num(plain.1),
            ]);
        };

    util::call(&mut con, &["FLUSHALL"]).await;
    let rl = usec(s, n, "rwlock.acquire", |i| {
        cmd(&["RWLOCK.ACQUIRE", &format!("r:{i}"), OWNER, "READ", "60000"])
    })
    .await;
    let sha = read.clone();
    let lua = usec(s, n, "evalsha", move |i| {
        evalsha(&RedissonRw::new(&format!("e:{i}"), OWNER).read(60_000), &sha)
    })
    .await;
    let set =
        usec(s, n, "set", |i| cmd(&["SET", &format!("s:{i}"), OWNER, "NX", "PX", "60000"])).await;
    row("RWLOCK read acquire, fresh key", rl, lua, "SET NX PX", set);

    let rl = usec(s, n, "rwlock.release", |i| {
        cmd(&["RWLOCK.RELEASE", &format!("r:{i}"), OWNER, "READ"])
    })
    .await;
    let sha = read_unlock.clone();
    let lua = usec(s, n, "evalsha", move |i| {
        evalsha(&RedissonRw::new(&format!("e:{i}"), OWNER).read_unlock(), &sha)
    })
    .await;
    let del = usec(s, n, "del", |i| cmd(&["DEL", &format!("s:{i}")])).await;
    row("RWLOCK read release to free (+ publish)", rl, lua, "DEL", del);

    util::call(&mut con, &["FLUSHALL"]).await;
    let rl = usec(s, n, "rwlock.acquire", |i| {
        cmd(&["RWLOCK.ACQUIRE", &format!("w:{i}"), OWNER, "WRITE", "60000"])
    })
    .await;
    let sha = write.clone();
    let lua = usec(s, n, "evalsha", move |i| {
        evalsha(&RedissonRw::new(&format!("e:{i}"), OWNER).write(60_000), &sha)
    })
    .await;
    let set =
        usec(s, n, "set", |i| cmd(&["SET", &format!("s:{i}"), OWNER, "NX", "PX", "60000"])).await;
    row("RWLOCK write acquire, fresh key", rl, lua, "SET NX PX", set);

    util::call(&mut con, &["FLUSHALL"]).await;
    let permits = (n * 4).to_string();
    for key in ["sem", "lua-sem", "plain"] {
        util::call(&mut con, &["SET", key, &permits]).await;
    }
    let rl = usec(s, n, "rsem.acquire", |_| cmd(&["RSEM.ACQUIRE", "sem", "1"])).await;
    let sha = try_acquire.clone();
    let lua = usec(s, n, "evalsha", move |_| cmd(&["EVALSHA", &sha, "1", "lua-sem", "1"])).await;
    let floor = usec(s, n, "decrby", |_| cmd(&["DECRBY", "plain", "1"])).await;
    row("RSEM acquire 1 (counted)", rl, lua, "DECRBY", floor);

    let rl = usec(s, n, "rsem.release", |_| cmd(&["RSEM.RELEASE", "sem", "1"])).await;
    let sha = release.clone();
    let lua = usec(s, n, "evalsha", move |_| {
        cmd(&["EVALSHA", &sha, "2", "lua-sem", "redisson_sc:{lua-sem}", "1"])
    })
    .await;
    let floor = usec(s, n, "incrby", |_| cmd(&["INCRBY", "plain", "1"])).await;
    row("RSEM release 1 (counted, + publish)", rl, lua, "INCRBY", floor);
    out
}
