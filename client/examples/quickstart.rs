//! A lock taken and released twice: waiting as long as it takes (a watchdog renews the hold),
//! then waiting at most 2 s for a 10 s lease. Run it against `make run`'s server with
//! `cargo run -p rlock-client --example quickstart` (REDIS_URL picks another server).
use std::time::Duration;

use rlock_client::{Error, LockClient};

#[tokio::main]
async fn main() -> Result<(), Error> {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6390/".into());
    let client = LockClient::open(url.as_str()).await?;
    let lock = client.lock("orders:42"); // a handle with its own owner id

    let guard = lock.acquire(None).await?; // waits; no lease: the watchdog renews it
    println!("held by {}", guard.owner()); // ... critical section ...
    guard.release().await?; // Err(Error::NotHeld) if it was lost meanwhile

    match lock.try_acquire(Duration::from_secs(2), Some(Duration::from_secs(10))).await {
        Ok(guard) => guard.release().await?,
        Err(Error::TimedOut) => println!("busy"),
        Err(e) => return Err(e),
    }
    Ok(())
}
