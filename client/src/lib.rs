//! # rlock-client
//!
//! An async client for the rlock Redis module: reentrant locks, read-write locks, semaphores
//! and count-down latches ([`Latch`]) with Redisson's semantics, waiting in the server, on
//! tokio and redis-rs.
//!
//! The crate is not on crates.io: depend on it by path, with tokio's `macros` and
//! `rt-multi-thread` features for `#[tokio::main]` (the repository's `docs/clients.md` shows the
//! Cargo lines). `client/examples/` holds a runnable program per feature (a lock, a read-write
//! lock, semaphores, a latch, Sentinel, replica acknowledgement, MultiLock and RedLock):
//! `cargo run -p rlock-client --example quickstart` runs the first against `make run`'s server.
//!
//! ```no_run
//! use std::time::Duration;
//! use rlock_client::LockClient;
//!
//! # async fn example() -> Result<(), rlock_client::Error> {
//! let client = LockClient::open("redis://127.0.0.1:6390/").await?;
//! let lock = client.lock("orders:42");
//!
//! // Wait as long as it takes; no lease given, so a watchdog renews it until release.
//! let guard = lock.acquire(None).await?;
//! // ... critical section ...
//! guard.release().await?;
//!
//! // Wait at most 2 s; a 10 s lease that is not renewed.
//! match lock.try_acquire(Duration::from_secs(2), Some(Duration::from_secs(10))).await {
//!     Ok(guard) => guard.release().await?,
//!     Err(rlock_client::Error::TimedOut) => println!("busy"),
//!     Err(e) => return Err(e),
//! }
//! # Ok(()) }
//! ```
//!
//! One hold engine runs under every kind of guard ([`LockGuard`] for locks and both sides of a
//! [`RwLock`], [`PermitGuard`], [`MultiGuard`]) and the counted [`Semaphore`]'s acquire, so
//! each guarantee below holds for every kind alike.
//!
//! - **Owners.** Each [`Lock`] handle has its own id, `<client-uuid>:<n>`: re-entry is per
//!   handle (clones share it), not per thread, since async tasks move between threads. Each
//!   continuous hold (one server grant, count 1 on the server) is stored under
//!   `<client-uuid>:<n>:<hold>` ([`LockGuard::owner`]); the two sides of one [`RwLock`] share the
//!   owner of the other side's live hold (write → read re-entry and downgrade). An [`Owner`]
//!   ([`LockClient::owner`]) is one id for one unit of work, like a Redisson thread: every
//!   hold of its handles is stored under exactly that id, so the server refuses a wait that
//!   would close a cycle ([`Error::Deadlock`]); its handles of one name share one hold, so a
//!   nested acquire with a shorter lease never cuts short what an outer guard was promised.
//! - **Re-entry joins a hold only after the server confirmed that exact hold on that exact
//!   side** (`RLOCK.RENEW`, `RWLOCK.RENEW ... READ|WRITE`): a guard that outlived its grant never
//!   releases, renews or re-enters a later hold, nor lives on through the same owner's hold on
//!   the other side of a read-write lock.
//! - **Exact cancellation.** Every acquire is a request with an id of its own (`REQUEST id`).
//!   Whatever ends it without handing the caller its grant (the future dropped at any await
//!   point, the deadline, a lost reply, a failed replica or AOF acknowledgement) cancels it with
//!   `RLOCK.CANCEL key id` through the background releaser: the server gives back exactly what
//!   that request got (a hold, counted or leased permits), dequeues it if it still waits, or
//!   refuses it if it arrives later (a stalled server resuming). Nothing stays held, no permit
//!   is lost.
//! - **Deadlines.** Every acquire returns by its `wait` plus half a second (plus the
//!   acknowledgement's time with [`Options::replica_ack`] / [`Options::aof_ack`]), a stalled
//!   server included: [`Error::TimedOut`] (a counted semaphore's `try_acquire`: `Ok(false)`).
//!   `try_acquire(.., Duration::ZERO)` tries once, for every kind.
//! - **One deadline per hold**: a guard is valid until [`LockGuard::valid_until`] on this
//!   process's monotonic clock, the longest (send time + lease) the server confirmed for its
//!   hold (grant, re-entry, renewal); when it passes without a confirmation, the guard is lost
//!   ([`LockGuard::is_lost`], [`LockGuard::lost`]). No second, shorter deadline; a re-entry is
//!   never born lost.
//! - **Watchdog.** With no lease, the hold is taken with [`Options::watchdog_timeout`] (30 s)
//!   and renewed every third of it (never below what is confirmed) until released; a failed
//!   renewal is retried after 50 ms, doubling; a renewal that finds the hold gone marks it
//!   lost. A zero lease is refused ([`Error::ZeroLease`]) before anything is sent.
//! - **Bad arguments** fail at once with a clear error, nothing sent, never a panic
//!   ([`Error::ZeroLease`], [`Error::InvalidArgument`], [`Error::InvalidCount`]): a lease or
//!   timeout beyond [`MAX_DURATION`], a zero keepalive, a permit count the server would
//!   refuse, an empty or self-defeating [`MultiLock`] / [`RedLock`]; [`Options`] are checked
//!   when the client is made. A `wait` beyond [`MAX_DURATION`] waits without limit.
//! - **Waiting** is server-side: `... WAIT` on a dedicated connection; the server queues
//!   waiters FIFO and hands the lock (or permits) to one of them when it is free. No pub/sub,
//!   no polling.
//! - **A wait survives its connection.** A failover (the old master's `broken pipe`,
//!   `UNBLOCKED`, `READONLY`, ...) or a lost connection is no answer: the wait is sent again,
//!   with the same request id and the time left, to the master or node that serves the lock
//!   now (pauses of 50 ms doubling to 1 s; without a deadline until granted: drop the future to
//!   stop); the id hands over a grant made meanwhile. A connection that died silently (a host
//!   gone, a cut link: no reset, keepalive answered by a proxy) is noticed from another one:
//!   from 5 s into a wait, every 5 s, the same acquire without `WAIT` asks whether the server
//!   still has it waiting; when it does not and no answer came, the wait is sent again. A
//!   [`Session`]'s wait is never sent again: its connection found dead that way is killed on
//!   the server, the session closed, and the wait fails with [`Error::SessionClosed`].
//! - **Latches** ([`Latch`]) are awaited in the server too, on a connection of each wait's
//!   own (closed when the wait is dropped); a wait holds nothing, so after a lost connection
//!   it is sent again, and a timed wait returns `Ok(false)` by its timeout plus half a second.
//! - **Replica acknowledgement** ([`Options::replica_ack`]): a grant is reported only once that
//!   many replicas have it (Redis `WAIT`); otherwise it is cancelled.
//! - **Sentinel** ([`LockClient::sentinel`]): the master is asked of the Sentinels and asked
//!   again after an error that suggests it changed, never retried at its old address.
//! - **Durable acknowledgement** ([`Options::aof_ack`]): `WAITAOF` after each grant.
//! - **Several servers**: [`MultiLock`] takes the same lock on every one of several independent
//!   servers, [`RedLock`] on a majority of them, each grant under a fresh owner id, so a
//!   [`MultiGuard`] acts only on its own grants.
//! - **Dropping a guard** (a [`LockGuard`], a [`PermitGuard`], a [`MultiGuard`]) never blocks:
//!   the release goes to the client's background releaser, a thread of its own with its own
//!   connections, which sends it where the lock is served now (the master the Sentinels name
//!   now, any reachable cluster node and the slot map) and retries it until the hold's lease
//!   would have ended anyway. **No library work blocks the caller's runtime**: dropping the
//!   last handle of a client with releases pending waits for them (at most 5 s) only outside
//!   any runtime; inside one it leaves a task that waits asynchronously, or, when the runtime
//!   shuts down first, in its drop (the same 5 s at most). So a guard dropped at the end of
//!   `main` (synchronous or async), or while a runtime shuts down, is released all the same,
//!   and a stalled server never freezes a running runtime.

mod client;
mod conn;
mod engine;
mod error;
mod latch;
mod leased;
mod lock;
mod multi;
mod options;
mod owner;
mod redlock;
mod releaser;
mod rwlock;
mod semaphore;
mod session;
mod shared;

pub use client::LockClient;
pub use error::{Error, Result};
pub use latch::Latch;
pub use leased::{LeasedSemaphore, PermitGuard};
pub use lock::{Lock, LockGuard};
pub use multi::{MultiGuard, MultiLock};
pub use options::{AofAck, Options, Remaining};
pub use owner::Owner;
pub use redlock::RedLock;
pub use rwlock::RwLock;
pub use semaphore::Semaphore;
pub use session::{Session, SessionOptions};

/// The longest lease, wait or timeout the client takes (2^60 ms, some 36 million years): far
/// beyond any use, and short enough that no clock arithmetic of the client or the server
/// overflows (a MultiLock takes its locks with twice the lease first). A lease or timeout
/// beyond it is refused with [`Error::InvalidArgument`] before anything is sent; a wait beyond
/// it (`try_acquire`) waits without limit.
pub const MAX_DURATION: std::time::Duration = std::time::Duration::from_millis(1 << 60);

/// The shortest lease taken: one millisecond, the server's unit. A shorter nonzero lease is
/// refused with [`Error::InvalidArgument`] before anything is sent (it was sent as 1 ms: a
/// grant already over when the acquire returned).
pub const MIN_LEASE: std::time::Duration = std::time::Duration::from_millis(1);

/// The shortest [`Options::watchdog_timeout`]: 100 ms. The watchdog renews every third of it,
/// so at most 30 renewals a second per hold, each with at least 66 ms to be answered; shorter
/// is a busy loop of renewals and a hold lost at the first hiccup (a hold that must end within
/// milliseconds of its holder's death takes a lease, or a session hold). Refused with
/// [`Error::InvalidArgument`] when the client is made.
pub const MIN_WATCHDOG_TIMEOUT: std::time::Duration = std::time::Duration::from_millis(100);
