//! A client that finds its master through Sentinel, with fencing tokens and every grant
//! acknowledged by a replica. `SENTINEL_URLS` (comma-separated) names the Sentinels.
use std::time::Duration;

use rlock_client::{Error, LockClient, Options};

#[tokio::main]
async fn main() -> Result<(), Error> {
    let sentinels =
        std::env::var("SENTINEL_URLS").unwrap_or_else(|_| "redis://127.0.0.1:26379/".into());
    let client = LockClient::sentinel(
        sentinels.split(',').collect(),
        "mymaster",
        "redis://127.0.0.1/0", // database and credentials; the address is ignored
        // one acknowledging replica: ask for as many as the group has
        Options::default().fencing(true).replica_ack(1, Duration::from_millis(500)),
    )
    .await?;

    let guard = client.lock("orders:42").acquire(Some(Duration::from_secs(10))).await?;
    println!("token {:?}", guard.token()); // give it to the resource with every write
    guard.release().await?;
    Ok(())
}
