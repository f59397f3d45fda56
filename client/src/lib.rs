//! # rlock-client
//!
//! An async client for the [rlock](../README.md) Redis module: reentrant distributed locks with
//! Redisson's semantics, on tokio and redis-rs.
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
//! - **Owners.** Each [`Lock`] handle has its own id, `<client-uuid>:<n>`: re-entry is per
//!   handle (clones share it), not per thread, since async tasks move between threads. Each
//!   continuous hold is stored under `<client-uuid>:<n>:<hold>` ([`LockGuard::owner`]).
//! - **Watchdog.** With no lease, the lock is taken with [`Options::watchdog_timeout`] (30 s) and
//!   renewed every third of it until released. A renewal that finds the lock gone marks the
//!   guard lost: see [`LockGuard::is_lost`] and [`LockGuard::lost`].
//! - **Waiting** is server-side: `RLOCK.ACQUIRE ... WAIT` on a dedicated connection; the server
//!   queues waiters FIFO and hands the lock to one of them when it is free. No pub/sub, no retry
//!   loop. Dropping an acquire future cancels the wait without leaking the lock: a grant that
//!   races the cancellation is released.
//! - **Replica acknowledgement** ([`Options::replica_ack`]): a lock is reported acquired only
//!   once that many replicas have its grant (Redis `WAIT`); otherwise it is released again.
//! - **Deadlines**: a guard's hold is valid until [`LockGuard::valid_until`] on this process's
//!   monotonic clock (grant asked + lease, pushed only by confirmed renewals); when it passes
//!   without a confirmation, the guard is lost ([`LockGuard::is_lost`], [`LockGuard::lost`]).
//! - **Sentinel** ([`LockClient::sentinel`]): the master is asked of the Sentinels and asked
//!   again after an error that suggests it changed, never retried at its old address.
//! - **Durable acknowledgement** ([`Options::aof_ack`]): `WAITAOF` after each grant.
//! - **Several servers**: [`MultiLock`] takes the same lock on every one of several independent
//!   servers, [`RedLock`] on a majority of them.
//! - **Holds are tied to their grant.** A handle's re-entries share one server hold (a
//!   *chain*) with an owner id of its own: a guard that outlived its grant never releases or
//!   renews a later hold, and an acquire that did not return a guard (cancelled, timed out,
//!   failed) leaves nothing held.
//! - **Dropping a guard** (a [`LockGuard`], a [`PermitGuard`], a [`MultiGuard`]) never blocks:
//!   the release goes to the client's background releaser, a thread of its own with its own
//!   connections, which sends it where the lock is served now (the master the Sentinels name
//!   now, any reachable cluster node and the slot map) and retries it until the hold's lease
//!   would have ended anyway. Dropping the last handle of a client waits (at most 5 s) for the
//!   releases still pending, so a guard dropped at the end of `main`, outside any runtime or
//!   while a runtime shuts down is released all the same.

mod client;
mod conn;
mod engine;
mod error;
mod leased;
mod lock;
mod multi;
mod options;
mod redlock;
mod releaser;
mod rwlock;
mod semaphore;

pub use client::LockClient;
pub use error::{Error, Result};
pub use leased::{LeasedSemaphore, PermitGuard};
pub use lock::{Lock, LockGuard};
pub use multi::{MultiGuard, MultiLock};
pub use options::{AofAck, Options, Remaining};
pub use redlock::RedLock;
pub use rwlock::RwLock;
pub use semaphore::Semaphore;
