//! [`RwLock`]: Redisson's read-write lock on one server (`RWLOCK.*`), as two [`Lock`] handles.

use crate::lock::Lock;

/// A read-write lock (Redisson's `RReadWriteLock`, on its data layout): its [`read`] side is
/// shared by any number of holders, its [`write`] side held by one, excluding readers. Each side
/// is a [`Lock`] handle with the whole `Lock` API: `acquire` / `try_acquire` (waiting in the
/// server, fairly: a reader that comes while a writer waits queues behind it), guards, the
/// watchdog, the loss signal.
///
/// The two sides of one `RwLock` act as one Redisson thread: while this value's write guard
/// holds, its read side takes read at once (write → read re-entry), and releasing the write
/// guard then downgrades the lock to read. While its read side holds, asking its write side
/// for the lock is an upgrade, which the server refuses ([`crate::Error::UpgradeRefused`])
/// instead of waiting for itself.
///
/// [`read`]: RwLock::read
/// [`write`]: RwLock::write
///
/// ```no_run
/// # async fn example(client: rlock_client::LockClient) -> Result<(), rlock_client::Error> {
/// let config = client.rw_lock("config");
/// let reading = config.read().acquire(None).await?; // shared with other readers
/// // ... read ...
/// reading.release().await?;
/// let writing = config.write().acquire(None).await?; // alone
/// // ... write ...
/// writing.release().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct RwLock {
    read: Lock,
    write: Lock,
}

impl RwLock {
    pub(crate) const fn new(read: Lock, write: Lock) -> Self {
        Self { read, write }
    }

    /// The read side: shared holds.
    #[must_use]
    pub const fn read(&self) -> &Lock {
        &self.read
    }

    /// The write side: one holder, no readers.
    #[must_use]
    pub const fn write(&self) -> &Lock {
        &self.write
    }

    /// The lock's name (its Redis key).
    #[must_use]
    pub fn name(&self) -> &[u8] {
        self.read.name()
    }
}
