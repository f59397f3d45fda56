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

async fn round(
    server: Arc<rlock_tests_integration::Server>,
    key: String,
    pubsub: bool,
    scripts: Scripts,
) -> f64 {
    let mut con = util::conn(&server).await;
    util::call(&mut con, &["RLOCK.ACQUIRE", &key, "dead", &LEASE.to_string()]).await;
    let deadline: i64 =
        redis::cmd("PEXPIRETIME").arg(&key).query_async(&mut con).await.expect("pexpiretime");
    let mut waiter = util::conn(&server).await;
    if pubsub {
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
        let r: Value = redis::cmd("RLOCK.ACQUIRE")
            .arg(&key)
            .arg("next")
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

async fn lateness(rounds: usize, pubsub: bool) -> Vec<f64> {
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
                    pubsub,
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
    let wait = lateness(sizes.expiry_rounds, false).await;
    let pubsub = lateness(sizes.expiry_rounds, true).await;
    let mut section = Section::new(
        "5. Expiry -> grant",
        &format!(
            "A holder with a {LEASE} ms lease dies (never releases); one client waits. Time from \
             the lease deadline to the waiter holding the lock, on the server's clock, over {} \
             rounds ({BATCH} locks at a time). The Redisson-style waiter retries after the PTTL \
             it was given (no message comes: nobody released).",
            sizes.expiry_rounds
        ),
        &["style", "p50 ms", "p99 ms", "max ms"],
    );
    for (name, v) in [("rlock WAIT", &wait), ("Redisson-style pub/sub", &pubsub)] {
        section.row(vec![
            name.to_owned(),
            num(percentile(v, 50.0)),
            num(percentile(v, 99.0)),
            num(v.last().copied().unwrap_or(f64::NAN)),
        ]);
    }
    (section, vec![Target::at_most("expiry -> grant p99 ms, WAIT", percentile(&wait, 99.0), 10.0)])
}
