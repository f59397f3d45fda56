//! Section 5, expiry -> grant: a holder stops renewing; how long after its lease deadline the head
//! waiter holds the lock. Measured on the server's clock: the deadline is the old holder's
//! PEXPIRETIME; the grant time is the new holder's PEXPIRETIME minus its lease.

use std::sync::Arc;

use redis::Value;

use crate::report::{num, Section, Target};
use crate::util::{self, channel, percentile, Scripts};
use crate::Sizes;

const LEASE: i64 = 200;
const NEXT_LEASE: i64 = 30_000;
const BATCH: usize = 10;

/// Who waits for the dead holder.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Waiter {
    /// `RLOCK.ACQUIRE ... WAIT` for a dead reentrant lock holder.
    Wait,
    /// A Redisson-style client retrying after the PTTL.
    PubSub,
    /// `RWLOCK.ACQUIRE ... WRITE ... WAIT` for a dead reader a Redisson client wrote (its hold
    /// key's lease ends long before the hash's: only the module's reader check frees it).
    RwDeadReader,
}

/// A dead Redisson reader on `key`: a 200 ms read hold in a hash that lives 60 s. Returns the
/// hold's deadline.
async fn dead_reader(con: &mut redis::aio::MultiplexedConnection, key: &str) -> i64 {
    let reader = rlock_tests_integration::redisson::RedissonRw::new(key, "dead-uuid:1");
    let _: Value = reader.read(LEASE as u64).command(None).query_async(con).await.expect("read");
    let _: i64 =
        redis::cmd("PEXPIRE").arg(key).arg(60_000).query_async(con).await.expect("pexpire");
    let hold = format!("{{{key}}}:dead-uuid:1:rwlock_timeout:1");
    redis::cmd("PEXPIRETIME").arg(&hold).query_async(con).await.expect("pexpiretime")
}

async fn round(
    server: Arc<rlock_tests_integration::Server>,
    key: String,
    waiter_kind: Waiter,
    scripts: Scripts,
) -> f64 {
    let mut con = util::conn(&server).await;
    let deadline = if waiter_kind == Waiter::RwDeadReader {
        dead_reader(&mut con, &key).await
    } else {
        util::call(&mut con, &["RLOCK.ACQUIRE", &key, "dead", &LEASE.to_string()]).await;
        redis::cmd("PEXPIRETIME").arg(&key).query_async(&mut con).await.expect("pexpiretime")
    };
    let mut waiter = util::conn(&server).await;
    if waiter_kind == Waiter::PubSub {
        let mut messages = util::subscription(&server, &channel(&key)).await.into_on_message();
        util::redisson_acquire(
            &mut waiter,
            &scripts,
            &key,
            NEXT_LEASE as u64,
            "next",
            &mut messages,
        )
        .await;
    } else {
        let mut acquire = if waiter_kind == Waiter::RwDeadReader {
            let mut c = redis::cmd("RWLOCK.ACQUIRE");
            c.arg(&key).arg("next:1").arg("WRITE");
            c
        } else {
            let mut c = redis::cmd("RLOCK.ACQUIRE");
            c.arg(&key).arg("next");
            c
        };
        let r: Value = acquire
            .arg(NEXT_LEASE)
            .arg("WAIT")
            .arg(0)
            .query_async(&mut waiter)
            .await
            .expect("wait");
        assert_eq!(r, Value::Nil);
    }
    let expires: i64 =
        redis::cmd("PEXPIRETIME").arg(&key).query_async(&mut con).await.expect("pexpiretime");
    (expires - NEXT_LEASE - deadline) as f64
}

async fn lateness(rounds: usize, waiter: Waiter) -> Vec<f64> {
    let server = Arc::new(util::server());
    let mut con = util::conn(&server).await;
    let scripts = Scripts::load(&mut con).await;
    let mut all = Vec::new();
    let mut next = 0;
    while next < rounds {
        let batch: Vec<_> = (next..(next + BATCH).min(rounds))
            .map(|i| {
                tokio::spawn(round(
                    Arc::clone(&server),
                    format!("exp:{i}"),
                    waiter,
                    scripts.clone(),
                ))
            })
            .collect();
        next += batch.len();
        for t in batch {
            all.push(t.await.expect("round"));
        }
    }
    all.sort_by(f64::total_cmp);
    all
}

pub async fn run(sizes: &Sizes) -> (Section, Vec<Target>) {
    let wait = lateness(sizes.expiry_rounds, Waiter::Wait).await;
    let pubsub = lateness(sizes.expiry_rounds, Waiter::PubSub).await;
    let reader = lateness(sizes.expiry_rounds, Waiter::RwDeadReader).await;
    let mut section = Section::new(
        "5. Expiry -> grant",
        &format!(
            "A holder with a {LEASE} ms lease dies (never releases); one client waits. Time from \
             the lease deadline to the waiter holding the lock, on the server's clock, over {} \
             rounds ({BATCH} locks at a time). The Redisson-style waiter retries after the PTTL \
             it was given (no message comes: nobody released). The read-write row: a Redisson \
             reader's {LEASE} ms read hold in a hash that lives 60 s; an RWLOCK writer waits; \
             from the hold's deadline to the writer holding the lock.",
            sizes.expiry_rounds
        ),
        &["style", "p50 ms", "p99 ms", "max ms"],
    );
    let rows = [
        ("rlock WAIT", &wait),
        ("Redisson-style pub/sub", &pubsub),
        ("RWLOCK writer WAIT, dead reader", &reader),
    ];
    for (name, v) in rows {
        section.row(vec![
            name.to_owned(),
            num(percentile(v, 50.0)),
            num(percentile(v, 99.0)),
            num(v.last().copied().unwrap_or(f64::NAN)),
        ]);
    }
    let targets = vec![
        Target::at_most("expiry -> grant p99 ms, WAIT", percentile(&wait, 99.0), 10.0),
        Target::at_most(
            "dead reader -> writer grant p99 ms, WAIT",
            percentile(&reader, 99.0),
            10.0,
        ),
    ];
    (section, targets)
}
