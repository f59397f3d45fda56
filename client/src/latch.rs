//! [`Latch`]: Redisson's count-down latch (`RLATCH.*`), awaited in the server.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::engine::resume::{self, resumable, RETRY_FIRST, RETRY_MAX};
use crate::engine::waiting::{redirection, MAX_REDIRECTS};
use crate::engine::{bound, uncertain, wait_ms, within, GRACE};
use crate::error::{Error, Result};
use crate::shared::Shared;

/// A timeout reply (`0`) this close to the deadline is the deadline (the server's timer ticks
/// in milliseconds); one earlier means the server would not block (a replica).
const EARLY: Duration = Duration::from_millis(5);
/// The longest `RLATCH.AWAIT` timeout the server takes, in milliseconds (`i64::MAX`).
const MAX_BUDGET_MS: u64 = i64::MAX.unsigned_abs();
/// The longest one server-side wait lasts: a longer (or unlimited) wait is sent again as each
/// slice ends, so a connection that died without a word (a host gone, a cut network: no reset,
/// and no keepalive on the wait's connection) is noticed by its response timeout within a
/// slice, and the wait goes on where the latch is served now. A latch's awaiters are answered
/// together whatever their order, so sending a wait again costs nothing but the command.
const SLICE: Duration = Duration::from_secs(30);

/// A count-down latch (Redisson's `RCountDownLatch`, on its data layout: the key holds the
/// count, a missing key is an open latch): [`Latch::try_set_count`] closes it with a count,
/// [`Latch::count_down`] lowers it, and every [`Latch::wait`] returns once it reaches zero.
/// A latch has no holder: any client may count it down or delete it, and waiting takes
/// nothing, so there is nothing to give back when a wait is cancelled.
///
/// Waiting happens in the server (`RLATCH.AWAIT`), on a connection of the wait's own to the
/// server (or cluster node) that serves the latch; every awaiter is answered at once when the
/// latch opens, however it opens: a count-down to zero or [`Latch::delete`] at once, a Redisson
/// client's script or a plain `DEL` within the server's poll (10 ms). Dropping the `wait`
/// future at any point closes that connection, so no awaiter stays behind in the server.
///
/// ```no_run
/// # async fn example(client: rlock_client::LockClient) -> Result<(), rlock_client::Error> {
/// use std::time::Duration;
///
/// let ready = client.latch("workers:ready");
/// ready.try_set_count(3).await?;
/// // ... each of three workers, when it is ready:
/// ready.count_down().await?;
/// // ... elsewhere: wait until all three are, at most 10 s.
/// if ready.wait(Some(Duration::from_secs(10))).await? {
///     println!("all ready");
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Latch {
    shared: Arc<Shared>,
    name: Arc<[u8]>,
}

impl std::fmt::Debug for Latch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Latch").field("name", &String::from_utf8_lossy(&self.name)).finish()
    }
}

/// A count or amount as the server takes it: 1 to `i64::MAX`.
fn checked(value: u64) -> Result<i64> {
    i64::try_from(value).ok().filter(|n| *n > 0).ok_or(Error::InvalidCount { value })
}

impl Latch {
    pub(crate) const fn new(shared: Arc<Shared>, name: Arc<[u8]>) -> Self {
        Self { shared, name }
    }

    /// The latch's name (its Redis key).
    #[must_use]
    pub fn name(&self) -> &[u8] {
        &self.name
    }

    /// Sets the count if the latch does not exist (is open), closing it; `true` when it was
    /// set, `false` when a count was there already (nothing changes then), as Redisson's
    /// `trySetCount`.
    ///
    /// # Errors
    /// [`Error::InvalidCount`] for 0 or a count above `i64::MAX` (nothing is sent);
    /// [`Error::Redis`] when Redis fails or refuses (`WRONGTYPE` for a key of another type).
    pub async fn try_set_count(&self, count: u64) -> Result<bool> {
        let count = checked(count)?;
        let mut cmd = redis::cmd("RLATCH.SETCOUNT");
        cmd.arg(&*self.name).arg(count);
        Ok(self.shared.on_master::<i64>(&cmd).await? == 1)
    }

    /// Counts the latch down by one; returns the count left (0: it is open now, or was
    /// already). Counting down a missing latch changes nothing.
    ///
    /// # Errors
    /// As [`Latch::count_down_by`].
    pub async fn count_down(&self) -> Result<u64> {
        self.count_down_by(1).await
    }

    /// Counts the latch down by `amount`, never below zero; returns the count left. At zero
    /// the latch opens: its key is deleted and every awaiter answered.
    ///
    /// # Errors
    /// [`Error::InvalidCount`] for 0 or an amount above `i64::MAX` (nothing is sent);
    /// [`Error::Redis`] when Redis fails or refuses.
    pub async fn count_down_by(&self, amount: u64) -> Result<u64> {
        let amount = checked(amount)?;
        let mut cmd = redis::cmd("RLATCH.COUNTDOWN");
        cmd.arg(&*self.name).arg(amount);
        let left: i64 = self.shared.on_master(&cmd).await?;
        Ok(u64::try_from(left).unwrap_or(0))
    }

    /// The count left (0 when the latch is open: missing, or a count at or below zero that
    /// another writer left in the key, which every awaiter takes as open too).
    ///
    /// # Errors
    /// [`Error::Redis`] when Redis fails or refuses.
    pub async fn count(&self) -> Result<u64> {
        Ok(u64::try_from(self.stored_count().await?).unwrap_or(0))
    }

    async fn stored_count(&self) -> Result<i64> {
        let mut cmd = redis::cmd("RLATCH.COUNT");
        cmd.arg(&*self.name);
        Ok(cmd.query_async(&mut self.shared.conn.clone()).await?)
    }

    /// Deletes the latch, which opens it (every awaiter is answered); `true` when it existed.
    ///
    /// # Errors
    /// [`Error::Redis`] when Redis fails or refuses.
    pub async fn delete(&self) -> Result<bool> {
        let mut cmd = redis::cmd("RLATCH.DELETE");
        cmd.arg(&*self.name);
        Ok(self.shared.on_master::<i64>(&cmd).await? == 1)
    }

    /// Waits until the latch is open (Redisson's `await`): at most `timeout`, or as long as
    /// it takes with `None`. `true` when it is open (at once if it is already), `false` when
    /// the timeout ended first (`Some(Duration::ZERO)`: one look). A timeout beyond what the
    /// server takes (`i64::MAX` ms, `Duration::MAX`) is as `None`.
    ///
    /// - **Bounded.** With a timeout, this returns by the timeout plus half a second whatever
    ///   the server does; a server that has not answered by then (stalled by `CLIENT PAUSE`,
    ///   unreachable) gives `Ok(false)`, as a wait that saw no opening in time.
    /// - **Reconnecting.** A wait holds nothing, so a lost connection (killed, a restart, a
    ///   Sentinel failover, a cluster slot that moved) is not an answer: the wait is sent again
    ///   on a new connection to the server (master, node) that serves the latch now, with the
    ///   time left, after a pause of 50 ms doubling up to 1 s. So is a wait the server would not
    ///   block (a demoted master, answering `0` at once). Without a timeout it keeps doing so
    ///   until the latch opens: bound it with a timeout, or drop the future, to stop.
    /// - **Sliced.** One server-side wait lasts at most 30 s; a longer or unlimited wait is
    ///   sent again as each slice ends, so a connection that died silently (a host gone, a cut
    ///   network) is noticed within a slice and half a second, not never.
    /// - **Cancellation.** Dropping the future at any point closes the wait's connection; the
    ///   server forgets the awaiter as soon as it sees the connection close.
    ///
    /// # Errors
    /// [`Error::Redis`] when the server refuses the wait (`WRONGTYPE` for a key of another
    /// type, `ERR` for a count that is not an integer, `NOPERM`); [`Error::NoModule`] for a
    /// server without `RLATCH.*`.
    pub async fn wait(&self, timeout: Option<Duration>) -> Result<bool> {
        let now = Instant::now();
        // A timeout too far to represent (as an instant, or in the server's milliseconds: at
        // most `i64::MAX`) is no limit.
        let deadline = timeout
            .filter(|t| t.as_millis() <= u128::from(MAX_BUDGET_MS))
            .and_then(|t| now.checked_add(t));
        match within(bound(deadline, now), self.awaiting(deadline)).await {
            Err(Error::TimedOut) => Ok(false),
            open => open,
        }
    }

    /// One look on the shared connection (an open latch needs no connection of its own), then
    /// server-side waits until `deadline`, sent again while they end without an answer.
    async fn awaiting(&self, deadline: Option<Instant>) -> Result<bool> {
        match self.stored_count().await {
            Ok(count) if count <= 0 => return Ok(true),
            Err(e) if !uncertain(&e) => return Err(e),
            // Closed, or not known: the wait answers.
            Ok(_) | Err(_) => {}
        }
        let mut pause = RETRY_FIRST;
        loop {
            let now = Instant::now();
            if deadline.is_some_and(|d| d <= now) {
                return Ok(false);
            }
            // This attempt's server-side wait: to the deadline, or to the end of its slice.
            let slice_end = now.checked_add(SLICE).filter(|&end| deadline.is_none_or(|d| end < d));
            let until = slice_end.or(deadline);
            match self.await_once(until, now).await {
                Ok(true) => return Ok(true),
                Ok(false) if until.is_some_and(|d| d <= Instant::now() + EARLY) => {
                    if slice_end.is_none() {
                        return Ok(false);
                    }
                    // Its slice ended: sent again at once.
                    pause = RETRY_FIRST;
                    continue;
                }
                // Answered `0` with time left: the server would not block (a replica).
                Ok(false) => resume::forget_master(&self.shared),
                Err(e) if resumable(&e) => resume::forget_master(&self.shared),
                Err(e) => return Err(e),
            }
            // A wait that lasted was a working one: the next attempt goes out at once.
            if now.elapsed() > RETRY_MAX {
                pause = RETRY_FIRST;
            }
            let left = deadline.map_or(pause, |d| d.saturating_duration_since(Instant::now()));
            tokio::time::sleep(pause.min(left)).await;
            pause = pause.saturating_mul(2).min(RETRY_MAX);
        }
    }

    /// One `RLATCH.AWAIT` with the time left until `deadline`, on a connection of its own to
    /// the node serving the latch, following MOVED/ASK. The connection closes when this ends
    /// or is dropped.
    async fn await_once(&self, deadline: Option<Instant>, now: Instant) -> Result<bool> {
        let budget = wait_ms(deadline, now);
        // A backstop that frees the connection: the caller's bound comes first.
        let response_timeout = deadline
            .map(|d| d.saturating_duration_since(now).saturating_add(GRACE).saturating_add(GRACE));
        let shared = &self.shared;
        // A master the Sentinels replaced blocks a wait as a master until they demote it, and
        // never sees the count-downs that go to the new one: ask them first.
        shared.target.refresh().await;
        let mut node = shared.target.node_for(&self.name, &mut shared.conn.clone()).await?;
        let mut asking = false;
        for _ in 0..=MAX_REDIRECTS {
            let mut con = crate::conn::dedicated(&node, response_timeout).await?;
            if asking {
                redis::cmd("ASKING").query_async::<()>(&mut con).await?;
            }
            let mut cmd = redis::cmd("RLATCH.AWAIT");
            cmd.arg(&*self.name).arg(budget);
            match cmd.query_async::<i64>(&mut con).await {
                Ok(open) => return Ok(open == 1),
                Err(e) => match redirection(&e) {
                    // The latch's slot moved (cluster): wait on the node that has it now.
                    Some(((host, port), ask)) => {
                        (node, asking) = (shared.target.client_at(Some((&host, port)))?, ask);
                    }
                    None => return Err(e.into()),
                },
            }
        }
        Err(Error::Redis(redis::RedisError::from((
            redis::ErrorKind::Server(redis::ServerErrorKind::TryAgain),
            "the latch's slot kept moving",
        ))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_and_amounts_are_checked_before_sending() {
        assert_eq!(checked(1).ok(), Some(1));
        assert_eq!(checked(i64::MAX.unsigned_abs()).ok(), Some(i64::MAX));
        for bad in [0, i64::MAX.unsigned_abs() + 1, u64::MAX] {
            assert!(matches!(checked(bad), Err(Error::InvalidCount { value }) if value == bad));
        }
    }
}
