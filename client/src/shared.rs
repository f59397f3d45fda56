//! [`Shared`]: what every handle of one client holds: where the server is, the shared
//! connection, the background releaser and the settings. Above the connection and the releaser,
//! below everything that takes locks.

use std::time::Duration;

use crate::conn::{Conn, Target};
use crate::error::Result;
use crate::options::Options;
use crate::releaser::Releaser;

/// How many times a command for the master is sent again after a refusal that says the server
/// is not (or no longer) the master ([`Shared::on_master`]).
const MASTER_RETRIES: u32 = 2;
/// The pause before such a command is sent again.
const MASTER_PAUSE: Duration = Duration::from_millis(100);

/// What every handle of one [`crate::LockClient`] shares: where the server is, the shared
/// connection, the client's id (the prefix of its owner ids) and settings.
pub(crate) struct Shared {
    pub(crate) target: Target,
    pub(crate) conn: Conn,
    pub(crate) id: String,
    pub(crate) next_handle: std::sync::atomic::AtomicU64,
    pub(crate) options: Options,
    /// Runs releases and cancellations in the background (drops, abandoned acquires).
    pub(crate) releaser: Releaser,
}

impl Shared {
    /// Sends `cmd`, a write that must reach the current master (a counted permit release, a
    /// latch's count or count-down, ...), on the shared connection: for a Sentinel group the
    /// Sentinels are asked first (at most 0.5 s, [`Target::refresh`]) whether the cached master
    /// is still theirs, since a master they replaced keeps answering as a master until they
    /// demote it (its writes then lost); a refusal only a server that is not the master gives
    /// (`READONLY`, `NOREPLICAS`, `MASTERDOWN`, `LOADING`: nothing ran) sends it again, after
    /// the Sentinels are asked again, at most [`MASTER_RETRIES`] times. A connection error is
    /// returned (the command may have run: it is not sent twice); the next command asks the
    /// Sentinels again.
    ///
    /// # Errors
    /// The server's refusal, or Redis failing.
    pub(crate) async fn on_master<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> Result<T> {
        let mut retries = MASTER_RETRIES;
        loop {
            self.target.refresh().await;
            match cmd.query_async::<T>(&mut self.conn.clone()).await {
                Err(e)
                    if retries > 0 && self.target.is_sentinel() && crate::conn::not_master(&e) =>
                {
                    retries -= 1;
                    tokio::time::sleep(MASTER_PAUSE).await;
                }
                reply => return Ok(reply?),
            }
        }
    }
}
