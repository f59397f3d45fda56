//! A lock reported acquired only once a replica has its grant (Redis `WAIT`). Builds the
//! client from a `redis::Client`, so it needs `redis` as a dependency of its own.
use std::time::Duration;

use rlock_client::{LockClient, Options};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6390/".into());
    let options = Options::default().replica_ack(1, Duration::from_millis(500));
    let client = LockClient::with_options(redis::Client::open(url)?, options).await?;

    // Err(Error::NotReplicated) when no replica acknowledged within 500 ms
    let guard = client.lock("orders:42").acquire(Some(Duration::from_secs(10))).await?;
    guard.release().await?;
    Ok(())
}
