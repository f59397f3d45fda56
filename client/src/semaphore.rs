//! [`Semaphore`]: Redisson's counting semaphore on one server (`RSEM.*`).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::conn::{Conn, Shared};
use crate::error::{Error, Result};
use crate::options::wait_budget;
use crate::wait::{blocking_call, Blocking};

/// A counting semaphore (Redisson's `RSemaphore`, on its data layout): a number of permits that
/// `acquire` takes and `release` gives back. Permits have no owner: any client may release
/// them, as in Redisson. Waiting happens in the server, fairly: waiters are served in arrival
/// order and a large request is not overtaken by smaller ones.
///
/// A cancelled `acquire` takes nothing (permits granted as it was cancelled are given back).
/// An acquire whose answer was lost (the connection dropped while it waited) may have taken
/// permits: counted permits have no owner to give them back by (Redisson's alike).
///
/// ```no_run
/// # async fn example(client: rlock_client::LockClient) -> Result<(), rlock_client::Error> {
/// let slots = client.semaphore("uploads");
/// slots.try_set_permits(4).await?;
/// slots.acquire(1).await?;
/// // ... one of at most four uploads ...
/// slots.release(1).await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Semaphore {
    shared: Arc<Shared>,
    name: Arc<[u8]>,
}

impl std::fmt::Debug for Semaphore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Semaphore").field("name", &String::from_utf8_lossy(&self.name)).finish()
    }
}

impl Semaphore {
    pub(crate) const fn new(shared: Arc<Shared>, name: Arc<[u8]>) -> Self {
        Self { shared, name }
    }

    pub(crate) fn conn(&self) -> Conn {
        self.shared.conn.clone()
    }

    /// The client's background releaser.
    pub(crate) fn releaser(&self) -> &crate::releaser::Releaser {
        &self.shared.releaser
    }

    /// The semaphore's name (its Redis key).
    #[must_use]
    pub fn name(&self) -> &[u8] {
        &self.name
    }

    /// Sets the permits if the semaphore does not exist yet; `true` when it was set.
    ///
    /// # Errors
    /// [`Error::Redis`] when Redis fails.
    pub async fn try_set_permits(&self, permits: u64) -> Result<bool> {
        let set: i64 = redis::cmd("RSEM.SETPERMITS")
            .arg(&*self.name)
            .arg(permits)
            .query_async(&mut self.conn())
            .await?;
        Ok(set == 1)
    }

    /// Adds permits (negative: takes them away); returns the new count.
    ///
    /// # Errors
    /// [`Error::Redis`] when Redis fails.
    pub async fn add_permits(&self, delta: i64) -> Result<i64> {
        let mut command = redis::cmd("RSEM.ADDPERMITS");
        command.arg(&*self.name).arg(delta);
        Ok(command.query_async(&mut self.conn()).await?)
    }

    /// The available permits (0 when the semaphore does not exist).
    ///
    /// # Errors
    /// [`Error::Redis`] when Redis fails.
    pub async fn available(&self) -> Result<i64> {
        Ok(redis::cmd("RSEM.AVAILABLE").arg(&*self.name).query_async(&mut self.conn()).await?)
    }

    /// Gives `permits` back; returns the count left after the server served its waiters.
    ///
    /// # Errors
    /// [`Error::Redis`] when Redis fails.
    pub async fn release(&self, permits: u64) -> Result<i64> {
        let mut command = redis::cmd("RSEM.RELEASE");
        command.arg(&*self.name).arg(permits);
        Ok(command.query_async(&mut self.conn()).await?)
    }

    /// Takes `permits`, waiting in the server as long as it takes.
    ///
    /// # Errors
    /// [`Error::Redis`] when Redis fails.
    pub async fn acquire(&self, permits: u64) -> Result<()> {
        match self.take(permits, None, None).await? {
            Some(_) => Ok(()),
            None => Err(Error::TimedOut),
        }
    }

    /// Takes `permits`, waiting in the server at most `wait`; `false` when the wait ended first.
    ///
    /// # Errors
    /// [`Error::Redis`] when Redis fails.
    pub async fn try_acquire(&self, permits: u64, wait: Duration) -> Result<bool> {
        Ok(self.take(permits, None, Instant::now().checked_add(wait)).await?.is_some())
    }

    /// Gives back what an `RSEM.ACQUIRE` answered, if it was a grant: counted permits, or
    /// leased permits by id.
    pub(crate) async fn give_back(&self, answer: &redis::Value, permits: u64) {
        match answer {
            redis::Value::Int(1) => {
                let _ = self.release(permits).await;
            }
            redis::Value::Array(ids) => {
                let ids: Vec<&[u8]> = ids
                    .iter()
                    .filter_map(|v| match v {
                        redis::Value::BulkString(id) => Some(id.as_slice()),
                        _ => None,
                    })
                    .collect();
                let mut command = redis::cmd("RSEM.RELEASE");
                command.arg(&*self.name).arg("ID").arg(ids);
                let _: redis::RedisResult<i64> = command.query_async(&mut self.conn()).await;
            }
            _ => {}
        }
    }

    /// `RSEM.ACQUIRE name permits [LEASE ms] WAIT <budget>` on a dedicated connection, in a task
    /// of its own: when the caller drops this future, the task has the server answer at once
    /// and gives back what it granted meanwhile, so a cancelled acquire takes nothing. The
    /// grant's answer (`1`, or the leased permits' ids), `None` when not granted in time.
    pub(crate) async fn take(
        &self,
        permits: u64,
        lease_ms: Option<u64>,
        deadline: Option<Instant>,
    ) -> Result<Option<redis::Value>> {
        let wait_ms = match wait_budget(deadline) {
            Ok(ms) => ms,
            Err(Error::TimedOut) => return Ok(None),
            Err(e) => return Err(e),
        };
        let mut command = redis::cmd("RSEM.ACQUIRE");
        command.arg(&*self.name).arg(permits);
        if let Some(ms) = lease_ms {
            command.arg("LEASE").arg(ms);
        }
        command.arg("WAIT").arg(wait_ms);
        let node = self.shared.target.node_for(&self.name, &mut self.conn()).await?;
        let (mut tx, rx) = oneshot::channel::<Result<Option<redis::Value>>>();
        let semaphore = self.clone();
        tokio::spawn(async move {
            let end = blocking_call(&node, false, &command, tx.closed()).await;
            match end {
                Ok(Blocking::Answer(answer, _)) => {
                    let granted = answer.map(|v| match v {
                        redis::Value::Int(1) | redis::Value::Array(_) => Some(v),
                        _ => None,
                    });
                    if let Err(Ok(Some(grant))) = tx.send(granted.map_err(Error::from)) {
                        // The caller went away just as the permits arrived.
                        semaphore.give_back(&grant, permits).await;
                    }
                }
                Ok(Blocking::Cancelled(Some(Ok(answer)))) => {
                    semaphore.give_back(&answer, permits).await;
                }
                Ok(Blocking::Cancelled(_)) => {}
                Err(e) => {
                    let _ = tx.send(Err(e));
                }
            }
        });
        rx.await.unwrap_or_else(|_| {
            Err(Error::Redis(redis::RedisError::from((
                redis::ErrorKind::Io,
                "the task waiting for the permits stopped",
            ))))
        })
    }
}
