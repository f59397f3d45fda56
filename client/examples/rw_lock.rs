//! A read-write lock: a shared read hold, then an exclusive write hold.
//! `cargo run -p rlock-client --example rw_lock` (REDIS_URL picks the server).
use rlock_client::{Error, LockClient};

#[tokio::main]
async fn main() -> Result<(), Error> {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6390/".into());
    let client = LockClient::open(url.as_str()).await?;

    let config = client.rw_lock("config");
    let reading = config.read().acquire(None).await?; // shared; a waiting writer goes first
    reading.release().await?;
    let writing = config.write().acquire(None).await?; // alone
    writing.release().await?;
    Ok(())
}
