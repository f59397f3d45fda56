//! MultiLock (the same lock on every server) and RedLock (a majority of them) over three
//! independent servers. `REDIS_URLS` (comma-separated) names them.
use std::time::Duration;

use rlock_client::{Error, LockClient, MultiLock, RedLock};

#[tokio::main]
async fn main() -> Result<(), Error> {
    let urls = std::env::var("REDIS_URLS").unwrap_or_else(|_| {
        "redis://127.0.0.1:6390/,redis://127.0.0.1:6391/,redis://127.0.0.1:6392/".into()
    });
    let mut clients = Vec::new();
    for url in urls.split(',') {
        clients.push(LockClient::open(url).await?);
    }

    // MultiLock: the same lock on every server, all or nothing.
    let multi = MultiLock::new(clients.iter().map(|c| c.lock("orders:42")).collect());
    let guard = multi.try_acquire(Duration::from_secs(2), Some(Duration::from_secs(10))).await?;
    guard.release().await?;

    // RedLock: a majority of N (odd) independent masters.
    let redlock = RedLock::new(&clients, "orders:42").node_timeout(Duration::from_millis(50));
    let guard = redlock.try_acquire(Duration::from_secs(2), Some(Duration::from_secs(10))).await?;
    let valid_for = guard.validity(); // lease - time taken - drift allowance
    println!("valid for {valid_for:?}");
    guard.release().await?;
    Ok(())
}
