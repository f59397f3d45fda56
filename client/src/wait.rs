//! Server-side waits (`RLOCK.ACQUIRE ... WAIT`), in three steps: a dedicated connection to the
//! node that has the lock (`wait_connection`), the wait itself or its cancellation
//! ([`blocking_call`], settled by `Lock::wait_or_cancel`), and following the lock's slot when it
//! moved (the loop of `Lock::blocking_wait`). Each wait runs in a task of its own, so a caller that drops the
//! future (a cancelled wait) cannot leak the lock.

use std::sync::Arc;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::RedisError;
use tokio::sync::oneshot;

use crate::error::{Error, Result};
use crate::lock::Lock;
use crate::lock::{redirection, Attempt, MAX_REDIRECTS};

/// How long a cancelled wait may take to learn whether it was granted meanwhile.
const CANCEL_GRACE: Duration = Duration::from_secs(5);

/// How one wait on one node ended.
enum WaitEnd {
    /// The server answered (on `con`, the connection that asked).
    Answer(redis::RedisResult<redis::Value>, MultiplexedConnection),
    /// The caller went away; whatever the server answered was settled.
    Cancelled,
}

impl Lock {
    /// `RLOCK.ACQUIRE ... WAIT wait_ms` for the handle's own owner id (MultiLock).
    pub(crate) async fn wait_on_server(
        &self,
        lease_ms: u64,
        wait_ms: u64,
        token: bool,
    ) -> Result<Attempt> {
        let owner = Arc::clone(&self.owner);
        self.wait_on_server_as(&owner, lease_ms, wait_ms, token).await
    }

    /// `RLOCK.ACQUIRE ... WAIT wait_ms` on a dedicated connection, run by a task of its own so a
    /// caller that drops this future (a cancelled wait) cannot leak the lock: the task then
    /// makes the server answer at once (`CLIENT UNBLOCK ... TIMEOUT`), releases the lock if the
    /// answer was a grant, and discards the connection, so no late reply reaches a pooled one.
    /// `Busy`: the wait timed out.
    pub(crate) async fn wait_on_server_as(
        &self,
        owner: &Arc<str>,
        lease_ms: u64,
        wait_ms: u64,
        token: bool,
    ) -> Result<Attempt> {
        let (reply_tx, reply_rx) = oneshot::channel();
        let waiter = Arc::clone(owner);
        tokio::spawn(self.clone().blocking_wait(waiter, lease_ms, wait_ms, token, reply_tx));
        self.settle(reply_rx, owner).await
    }

    /// The waiting task: waits on the node that has the lock, following it when its slot
    /// moves, and delivers the answer (or settles it when nobody is left to take it).
    async fn blocking_wait(
        self,
        owner: Arc<str>,
        lease_ms: u64,
        wait_ms: u64,
        token: bool,
        mut reply: oneshot::Sender<Result<Attempt>>,
    ) {
        let mut node = match self.shared.target.node_for(&self.name, &mut self.conn()).await {
            Ok(node) => node,
            Err(e) => {
                let _ = reply.send(Err(e));
                return;
            }
        };
        let mut asking = false;
        for _ in 0..MAX_REDIRECTS {
            let acquire = self.acquire_cmd(&owner, lease_ms, Some(wait_ms), token);
            let (answer, con) =
                match self.wait_or_cancel(&node, asking, &acquire, &owner, &mut reply).await {
                    Ok(WaitEnd::Answer(answer, con)) => (answer, con),
                    Ok(WaitEnd::Cancelled) => return,
                    Err(e) => {
                        let _ = reply.send(Err(e));
                        return;
                    }
                };
            // The lock's slot moved (cluster): wait on the node that has it now.
            if let Some(((host, port), ask)) = answer.as_ref().err().and_then(redirection) {
                match self.shared.target.client_at(Some((&host, port))) {
                    Ok(next) => {
                        (node, asking) = (next, ask);
                        continue;
                    }
                    Err(e) => {
                        let _ = reply.send(Err(e));
                        return;
                    }
                }
            }
            self.deliver(answer, con, &owner, reply).await;
            return;
        }
        let _ = reply.send(Err(Error::Redis(RedisError::from((
            redis::ErrorKind::Server(redis::ServerErrorKind::Moved),
            "the lock's slot kept moving",
        )))));
    }

    /// Waits on `node` until the server answers, or the caller goes away: then has the server
    /// answer now and settles what it answers (a grant is released, a lost answer undone).
    async fn wait_or_cancel(
        &self,
        node: &redis::Client,
        asking: bool,
        acquire: &redis::Cmd,
        owner: &str,
        reply: &mut oneshot::Sender<Result<Attempt>>,
    ) -> Result<WaitEnd> {
        match blocking_call(node, asking, acquire, reply.closed()).await? {
            Blocking::Answer(answer, con) => Ok(WaitEnd::Answer(answer, con)),
            Blocking::Cancelled(answer) => {
                match answer {
                    Some(Ok(answer)) => {
                        if Attempt::from_reply(&answer).is_ok_and(Attempt::is_held) {
                            let _ = self.release_as(owner).await;
                        }
                    }
                    // The connection failed, or no answer came: a grant may have been sent and
                    // never read (the server then keeps it). Undo it.
                    Some(Err(_)) | None => self.undo(owner).await,
                }
                Ok(WaitEnd::Cancelled)
            }
        }
    }

    /// Hands the server's answer to the caller: a grant after the replicas acknowledged it (on
    /// `con`, the connection the server attributes it to); a lost answer undone; a grant the
    /// caller no longer takes released.
    async fn deliver(
        &self,
        answer: redis::RedisResult<redis::Value>,
        mut con: MultiplexedConnection,
        owner: &str,
        reply: oneshot::Sender<Result<Attempt>>,
    ) {
        // A failed connection may have lost a grant the server sent (and keeps): undo it.
        let lost_reply = answer
            .as_ref()
            .is_err_and(|e| e.is_timeout() || e.is_io_error() || e.is_connection_dropped());
        let mut granted = answer.map_err(Error::from).and_then(|a| Attempt::from_reply(&a));
        if lost_reply {
            let _ = reply.send(granted);
            self.undo(owner).await;
            return;
        }
        if granted.as_ref().is_ok_and(|a| a.is_held()) {
            // Redis's WAIT counts the writes of the connection that asked.
            if let Err(e) = self.replicated_as(owner, &mut con).await {
                granted = Err(e);
            }
        }
        if let Err(Ok(Attempt::Held { .. })) = reply.send(granted) {
            // The caller went away just as the grant arrived.
            let _ = self.release_as(owner).await;
        }
    }
}

/// How a blocking command on a dedicated connection ended.
pub(crate) enum Blocking {
    /// The server answered (on the connection that asked).
    Answer(redis::RedisResult<redis::Value>, MultiplexedConnection),
    /// The caller went away; the server was made to answer at once (`CLIENT UNBLOCK ...
    /// TIMEOUT`), and this is what it answered within the grace (`None`: nothing came).
    Cancelled(Option<redis::RedisResult<redis::Value>>),
}

/// Sends a blocking `command` on a dedicated connection to `node` (after `ASKING` when
/// `asking`) and waits for its answer, or, when `gone` resolves first (the caller went away),
/// has the server answer now and returns what it answered, for the caller to settle. Dropping
/// the connection afterwards takes a wait still pending out of the server's queue.
pub(crate) async fn blocking_call(
    node: &redis::Client,
    asking: bool,
    command: &redis::Cmd,
    gone: impl std::future::Future<Output = ()>,
) -> Result<Blocking> {
    let (con, id) = wait_connection(node, asking).await?;
    // A clone of the same connection: Redis attributes the command's effects to this client.
    let mut waiting = con.clone();
    let wait = command.query_async::<redis::Value>(&mut waiting);
    tokio::pin!(wait);
    tokio::select! {
        answer = &mut wait => Ok(Blocking::Answer(answer, con)),
        () = gone => {
            if let Ok(mut unblocker) = node.get_multiplexed_async_connection().await {
                let _: redis::RedisResult<i64> = redis::cmd("CLIENT")
                    .arg("UNBLOCK")
                    .arg(id)
                    .arg("TIMEOUT")
                    .query_async(&mut unblocker)
                    .await;
            }
            Ok(Blocking::Cancelled(tokio::time::timeout(CANCEL_GRACE, wait).await.ok()))
        }
    }
}

/// A dedicated connection to `node` and its client id (for `CLIENT UNBLOCK`); `asking` sends
/// `ASKING` first (after an ASK redirection).
async fn wait_connection(
    node: &redis::Client,
    asking: bool,
) -> Result<(MultiplexedConnection, i64)> {
    let mut con = crate::conn::dedicated(node).await?;
    let id: i64 = redis::cmd("CLIENT").arg("ID").query_async(&mut con).await?;
    if asking {
        let () = redis::cmd("ASKING").query_async(&mut con).await?;
    }
    Ok((con, id))
}
