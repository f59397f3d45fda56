//! A session: locks bound to one connection of their own, released by the server as soon as
//! that connection closes (this process dies, the session is dropped), not at the end of their
//! lease. `cargo run -p rlock-client --example session` (REDIS_URL picks the server).
use std::time::Duration;

use rlock_client::{Error, LockClient, SessionOptions};

#[tokio::main]
async fn main() -> Result<(), Error> {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6390/".into());
    let client = LockClient::open(url.as_str()).await?;

    // After a hold ends because the connection closed, nobody gets it for 2 s (LOCKDELAY).
    let options = SessionOptions::default().lock_delay(Duration::from_secs(2));
    let session = client.session_with(options).await?;
    let guard = session.lock("orders:42").acquire(None).await?; // watchdog-renewed
    tokio::select! {
        () = guard.lost() => println!("lost: the session closed or the hold ended"),
        () = tokio::time::sleep(Duration::from_millis(100)) => println!("work done"),
    }
    guard.release().await?; // a normal release: no lock-delay
    drop(session); // closes its connection: anything still held through it ends at once
    Ok(())
}
