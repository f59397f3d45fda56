//! [`Owner`]: one owner id for one unit of work (a task, a request handler), shared by every
//! lock it takes, as a Redisson thread's `UUID:threadId` is.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError, Weak};

use crate::engine::binding::Binding;
use crate::engine::chain::Chain;
use crate::engine::kind::Kind;
use crate::lock::Lock;
use crate::rwlock::RwLock;
use crate::shared::Shared;

/// One owner id for one unit of work (a task, a request handler): every lock it takes through
/// [`Owner::lock`] and [`Owner::rw_lock`] (both sides) is held under exactly this id, with no
/// per-hold suffix, as every lock of one Redisson thread is held under `UUID:threadId`. Made by
/// [`crate::LockClient::owner`] (or [`crate::Session::owner`]); clones are the same owner.
///
/// What one owner id buys: the server sees the owner's holds and waits as **one party**. A
/// wait that would close a cycle of owners waiting for each other (this owner holds `a` and
/// waits for `b`, whose holder waits for `a`) is refused at once with [`crate::Error::Deadlock`]
/// naming the cycle, nothing taken or queued: release what the owner holds and retry. Handles
/// from [`crate::LockClient::lock`] give each hold an id of its own, so a cycle among them has
/// no common owner to follow and is never refused (its waits end with their timeouts).
///
/// The consequences, as for a Redisson thread:
/// - The owner's holds of one lock are **one hold**, on the client as on the server: every
///   handle of one name (and side) it makes shares it, so an acquire through another handle
///   while the owner holds the lock re-enters that hold as a handle's own re-entry does
///   (count 1 on the server; each guard gives back only itself, the last one releases the
///   hold). No lease the client sends (a nested acquire's shorter one, a renewal) ever ends
///   the hold before what any live guard of it was promised ([`crate::LockGuard::valid_until`]).
///   A read-write lock's sides follow Redisson's rules for one owner across all its handles:
///   holding write it takes read at once (releasing the write then downgrades); holding read,
///   asking to write is the upgrade the server refuses ([`crate::Error::UpgradeRefused`]).
///   The server keeps the write hold as long as the lock's key, which the owner's read holds
///   keep: so a write guard stays valid (and releases its hold when it goes) as long as a read
///   hold the owner took under it is confirmed, even past the write's own lease.
/// - A [`crate::MultiLock`] or [`crate::RedLock`] over the owner's handles takes fresh owner
///   ids (`<owner>:<n>`), never the owner's: it never re-enters the owner's hold, and its stale
///   guard never releases the owner's later one.
/// - The server cannot tell two holds of one owner on one lock apart. A guard whose hold is
///   **known lost** (its deadline passed unconfirmed, or the server said it is gone) is
///   answered [`crate::Error::NotHeld`] when released. Its release still goes out (when the
///   guard is released or dropped) while the hold's count may still be on the server: a lease
///   sent for it, answered or not (a re-entry or renewal given up before its answer), or a
///   read acquire or renewal of the owner under its write hold (which keeps the write field
///   as long as the key), may last until after now; the owner's next hold on that side is
///   only asked for once that release was answered (or given up), so it never ends a later
///   hold. Found gone, or every such lease over, it sends nothing. But a
///   hold lost *unnoticed* (deleted or expired on the server before its deadline: a
///   force-release, eviction, a failover to a replica that missed it) while the same owner took
///   the lock again through another handle: its guard's renewals and release act on that later
///   hold. Never on another owner's.
/// - So an owner belongs to **one unit of work at a time**: two tasks sharing one `Owner` (or
///   its clones) both get a lock the other holds, as it is a re-entry to the server. Make one
///   per task or request, never one per process.
///
/// ```no_run
/// # async fn example(client: rlock_client::LockClient) -> Result<(), rlock_client::Error> {
/// let owner = client.owner(); // one per task or request
/// let accounts = owner.lock("accounts").acquire(None).await?;
/// match owner.lock("ledger").acquire(None).await {
///     Ok(ledger) => ledger.release().await?, // ... both held ...
///     // Someone holding `ledger` waits for `accounts`: waiting would never end.
///     Err(rlock_client::Error::Deadlock { cycle }) => println!("backing off: {cycle}"),
///     Err(e) => return Err(e),
/// }
/// accounts.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Owner {
    shared: Arc<Shared>,
    id: Arc<str>,
    session: Option<Arc<Binding>>,
    /// The owner's chain per lock name and side, while any handle or guard keeps it: every
    /// handle of one name shares it, so the owner's holds of one lock are one hold on the
    /// client as on the server.
    chains: Arc<Mutex<Chains>>,
}

/// An owner's chains, by lock name and side.
type Chains = HashMap<(Arc<[u8]>, Kind), Weak<Chain>>;

impl fmt::Debug for Owner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Owner")
            .field("id", &self.id)
            .field("session", &self.session.is_some())
            .finish_non_exhaustive()
    }
}

impl Owner {
    /// A new owner of `shared`'s client, `<client-uuid>:<n>` (as a handle's id: it never
    /// collides with a hold's `<client-uuid>:<n>:<hold>`), its holds bound to `session`.
    pub(crate) fn new(shared: &Arc<Shared>, session: Option<Arc<Binding>>) -> Self {
        let n = shared.next_handle.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let id = Arc::from(format!("{}:{n}", shared.id));
        Self { shared: Arc::clone(shared), id, session, chains: Arc::default() }
    }

    /// The owner's chain of `kind` on `name`: the live one, or a new one.
    fn chain(&self, name: &[u8], kind: Kind) -> Arc<Chain> {
        let mut chains = self.chains.lock().unwrap_or_else(PoisonError::into_inner);
        let key: (Arc<[u8]>, Kind) = (name.into(), kind);
        if let Some(chain) = chains.get(&key).and_then(Weak::upgrade) {
            return chain;
        }
        // Forget chains nobody keeps: the map stays within twice the chains alive.
        if chains.len() >= 16 && chains.len().is_power_of_two() {
            chains.retain(|_, chain| chain.strong_count() > 0);
        }
        let owner = (Arc::clone(&self.id), true);
        let chain = Chain::new(&self.shared, &key.0, kind, owner, self.session.clone());
        chains.insert(key, Arc::downgrade(&chain));
        chain
    }

    /// The owner id the server stores every hold of this owner under (`<client-uuid>:<n>`).
    #[must_use]
    pub fn id(&self) -> &str {
        &self.id
    }

    /// A handle on the lock `name` held as this owner (re-entry per handle and its clones, as
    /// any [`Lock`]; across handles, on the server).
    #[must_use]
    pub fn lock(&self, name: impl AsRef<[u8]>) -> Lock {
        Lock::from_chain(self.chain(name.as_ref(), Kind::Lock))
    }

    /// A read-write lock named `name`, both sides held as this owner (the handles of one side
    /// of one name share their hold, as [`Owner::lock`]'s do).
    #[must_use]
    pub fn rw_lock(&self, name: impl AsRef<[u8]>) -> RwLock {
        let name = name.as_ref();
        let (read, write) = (self.chain(name, Kind::Read), self.chain(name, Kind::Write));
        Chain::link(&read, &write);
        RwLock::new(Lock::from_chain(read), Lock::from_chain(write))
    }
}
