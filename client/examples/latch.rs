//! A count-down latch: three workers count it down, a coordinator waits for all of them.
//! `cargo run -p rlock-client --example latch` (REDIS_URL picks the server).
use std::time::Duration;

use rlock_client::{Error, LockClient};

#[tokio::main]
async fn main() -> Result<(), Error> {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6390/".into());
    let client = LockClient::open(url.as_str()).await?;

    let ready = client.latch("workers-ready");
    ready.try_set_count(3).await?; // only if the latch does not exist (is open)
    for worker in 0..3 {
        let ready = ready.clone();
        tokio::spawn(async move {
            // ... worker `worker` starts up, then:
            let left = ready.count_down().await?;
            println!("worker {worker} ready, {left} to go");
            Ok::<_, Error>(())
        });
    }
    // Waits in the server; false if 10 s pass first (a dropped wait leaves nothing behind).
    let all = ready.wait(Some(Duration::from_secs(10))).await?;
    println!("all ready: {all}");
    Ok(())
}
