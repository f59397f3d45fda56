//! Counted permits (nobody owns them) and leased permits (ids with a lease each).
//! `cargo run -p rlock-client --example semaphores` (REDIS_URL picks the server).
use std::time::Duration;

use rlock_client::{Error, LockClient};

#[tokio::main]
async fn main() -> Result<(), Error> {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6390/".into());
    let client = LockClient::open(url.as_str()).await?;

    let pool = client.semaphore("db-connections");
    pool.try_set_permits(10).await?; // only if the semaphore does not exist yet
    pool.acquire(2).await?; // waits in the server, FIFO
    println!("{} left", pool.release(2).await?);

    let workers = client.leased_semaphore("workers");
    workers.try_set_permits(4).await?;
    let hold = workers.acquire(1, Some(Duration::from_secs(60))).await?; // one id, leased 60 s
    println!("permit ids: {:?}", hold.ids());
    hold.release().await?; // by id; Err(Error::NotHeld) if its lease had ended
    Ok(())
}
