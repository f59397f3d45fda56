//! [`Owner`]: one owner id for one unit of work (a task, a request handler), shared by every
//! lock it takes, as a Redisson thread's `UUID:threadId` is.

use std::fmt;
use std::sync::Arc;

use crate::engine::binding::Binding;
use crate::lock::Lock;
use crate::rwlock::RwLock;
use crate::shared::Shared;

/// One owner id for one unit of work; clones are the same owner.
#[derive(Clone)]
pub struct Owner {
    shared: Arc<Shared>,
    id: Arc<str>,
    session: Option<Arc<Binding>>,
}

impl fmt::Debug for Owner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Owner")
            .field("id", &self.id)
            .field("session", &self.session.is_some())
            .finish_non_exhaustive()
    }
}

impl Owner {
    /// A new owner of `shared`'s client, its holds bound to `session` if given.
    pub(crate) fn new(shared: &Arc<Shared>, session: Option<Arc<Binding>>) -> Self {
        let n = shared.next_handle.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Self { shared: Arc::clone(shared), id: Arc::from(format!("{}:{n}", shared.id)), session }
    }

    /// The owner id the server stores for every hold of this owner.
    #[must_use]
    pub fn id(&self) -> &str {
        &self.id
    }

    /// A handle on the lock `name` held as this owner.
    #[must_use]
    pub fn lock(&self, name: impl AsRef<[u8]>) -> Lock {
        Lock::new(&self.shared, &name.as_ref().into(), (Arc::clone(&self.id), true), self.session.clone())
    }

    /// A read-write lock named `name`, both sides held as this owner.
    #[must_use]
    pub fn rw_lock(&self, name: impl AsRef<[u8]>) -> RwLock {
        let (read, write) =
            Lock::rw_pair(&self.shared, &name.as_ref().into(), (&self.id, true), self.session.as_ref());
        RwLock::new(read, write)
    }
}
