//! [`Semaphore`]: Redisson's counting semaphore on one server (`RSEM.*`).

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::conn::Conn;
use crate::engine::bound;
use crate::engine::kind::Kind;
use crate::engine::request::Request;
use crate::error::{Error, Result};
use crate::shared::Shared;

/// A counting semaphore (Redisson's `RSemaphore`, on its data layout): a number of permits that
/// `acquire` takes and `release` gives back. Permits have no owner: any client may release
/// them, as in Redisson. Waiting happens in the server, fairly: waiters are served in arrival
/// order and a large request is not overtaken by smaller ones.
///
/// Every acquire is a request with an id of its own (`REQUEST id`): an acquire that does not
/// return its permits to the caller (cancelled at any point, timed out, its answer lost, a
/// stalled server that grants as it resumes) is cancelled with `RLOCK.CANCEL`, which gives back
/// exactly what that request got, or makes the server refuse it if it arrives later. Permits
/// are conserved: available + taken = total.
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

/// How long after its first send a counted release is sent again until durable: while the
/// server remembers its request id (60 s), with room to spare.
const COUNTED_RESEND: Duration = Duration::from_secs(50);

/// The most permits one count takes (the server's integers are `i64`).
const MAX_PERMITS: u64 = i64::MAX.unsigned_abs();

/// Refuses a permit count outside `least..=most` before anything is sent.
pub(crate) fn checked_permits(what: &str, n: u64, least: u64, most: u64) -> Result<()> {
    if (least..=most).contains(&n) {
        return Ok(());
    }
    Err(Error::InvalidArgument(format!("{what} must be {least} to {most}, not {n}")))
}

impl Semaphore {
    pub(crate) const fn new(shared: Arc<Shared>, name: Arc<[u8]>) -> Self {
        Self { shared, name }
    }

    pub(crate) const fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    pub(crate) const fn key(&self) -> &Arc<[u8]> {
        &self.name
    }

    pub(crate) fn conn(&self) -> Conn {
        self.shared.conn.clone()
    }

    /// The semaphore's name (its Redis key).
    #[must_use]
    pub fn name(&self) -> &[u8] {
        &self.name
    }

    /// Sets the permits if the semaphore does not exist yet; `true` when it was set.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for more than `i64::MAX` permits (nothing sent);
    /// [`Error::Redis`] when Redis fails.
    pub async fn try_set_permits(&self, permits: u64) -> Result<bool> {
        checked_permits("the permits set", permits, 0, MAX_PERMITS)?;
        let mut cmd = redis::cmd("RSEM.SETPERMITS");
        cmd.arg(&*self.name).arg(permits);
        Ok(self.shared.on_master::<i64>(&cmd).await? == 1)
    }

    /// Adds permits (negative: takes them away); returns the new count.
    ///
    /// # Errors
    /// [`Error::Redis`] when Redis fails.
    pub async fn add_permits(&self, delta: i64) -> Result<i64> {
        let mut command = redis::cmd("RSEM.ADDPERMITS");
        command.arg(&*self.name).arg(delta);
        self.shared.on_master(&command).await
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
    /// Sent with a release id of its own (`RSEM.RELEASE key n ONCE id`: the server gives back
    /// once per id and remembers it for 60 s). Counted permits have no lease, so once the
    /// server answered, the client's background releaser makes the release durable: it sends
    /// the same command again and `WAIT`s for every replica of the master, again on the current
    /// master until they all acknowledged (for 50 s): a master that answered and then lost its
    /// role before it replicated (cut off and replaced) would lose it, and the permit with it.
    /// The call does not wait for that. When the call fails otherwise than by the server's
    /// refusal (a lost reply, a dropped connection, `NOREPLICAS`/`READONLY` from a server that
    /// is not the master, `TRYAGAIN` from a server that just resumed from a stall), the same
    /// release goes on in the background the same way: do not release those permits again.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a count outside 1 to `i64::MAX` (nothing sent);
    /// [`Error::Redis`] when Redis fails.
    pub async fn release(&self, permits: u64) -> Result<i64> {
        checked_permits("the permits released", permits, 1, MAX_PERMITS)?;
        let mut command = redis::cmd("RSEM.RELEASE");
        let id = uuid::Uuid::new_v4().simple().to_string();
        command.arg(&*self.name).arg(permits).arg("ONCE").arg(id);
        let until = crate::releaser::until_after(COUNTED_RESEND);
        let reply = self.shared.on_master(&command).await;
        // `TRYAGAIN` (an id the server does not take as new right after a stall): nothing ran,
        // and it goes on in the background as after a lost reply.
        let refused = matches!(&reply, Err(Error::Redis(e))
            if crate::error::from_server(e) && !crate::conn::not_master(e)
                && !crate::error::try_again(e));
        if !refused {
            let key = Arc::clone(&self.name);
            let durable = crate::releaser::Durable::Now;
            self.shared.releaser.submit_durable(key, command, until, durable, None);
        }
        reply
    }

    /// Takes `permits`, waiting in the server as long as it takes.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a count outside 1 to `i64::MAX` (nothing sent);
    /// [`Error::TimedOut`] when the server did not answer in time (the request is cancelled:
    /// no permit is taken); [`Error::Redis`] when Redis fails or refuses.
    pub async fn acquire(&self, permits: u64) -> Result<()> {
        match self.take(permits, None).await? {
            true => Ok(()),
            false => Err(Error::TimedOut),
        }
    }

    /// Takes `permits`, waiting in the server at most `wait` (`Duration::ZERO`: one try; beyond
    /// [`crate::MAX_DURATION`]: without limit); `false` when the wait ended first (nothing is
    /// taken then). Returns by `wait` plus half a second whatever the server does.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a count outside 1 to `i64::MAX` (nothing sent);
    /// [`Error::Redis`] when Redis fails or refuses.
    pub async fn try_acquire(&self, permits: u64, wait: Duration) -> Result<bool> {
        match self.take(permits, crate::engine::deadline_after(wait)).await {
            Err(Error::TimedOut) => Ok(false),
            taken => taken,
        }
    }

    /// One request for `permits` by `deadline`. Whatever ends it without the caller learning
    /// of the grant (a dropped future, the deadline, a lost reply) cancels it exactly
    /// (`RLOCK.CANCEL`: the server gives back what the request got, or refuses it later).
    async fn take(&self, permits: u64, deadline: Option<Instant>) -> Result<bool> {
        checked_permits("the permits asked for", permits, 1, MAX_PERMITS)?;
        let owner = Arc::from("");
        let mut request = Request::new(&self.shared, &self.name, Kind::Counted(permits), owner, 0);
        let granted = request.run(deadline, bound(deadline, Instant::now())).await?.is_some();
        request.taken();
        Ok(granted)
    }
}
