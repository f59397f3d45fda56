//! What a waiter is found by besides its id and handle: its tag (an acquire's request id,
//! unique among its lock's waiters) and its owner (the wait-for graph's edges start there); and
//! what it carries: the ACL user it asked as, when it started waiting.

use std::hash::Hash;

use super::{Queues, Waiter, WaiterId};

impl<H: Copy + Eq + Hash, R> Queues<H, R> {
    /// Tags waiter `id` with `tag` (an acquire's request id), unique among its lock's waiters:
    /// false, and nothing tagged, when another waiter of the lock has it (or `id` has a tag).
    pub fn set_tag(&mut self, id: WaiterId, tag: Vec<u8>) -> bool {
        let Some(waiter) = self.waiters.get_mut(&id) else { return false };
        let index = (waiter.lock.db, waiter.lock.key.clone(), tag);
        if waiter.tag.is_some() || self.by_tag.contains_key(&index) {
            return false;
        }
        waiter.tag = Some(index.2.clone());
        self.by_tag.insert(index, id);
        true
    }

    /// The waiter of the lock `key` of database `db` tagged `tag`.
    #[must_use]
    pub fn find_tagged(&self, db: i32, key: &[u8], tag: &[u8]) -> Option<WaiterId> {
        if self.by_tag.is_empty() {
            return None;
        }
        self.by_tag.get(&(db, key.to_vec(), tag.to_vec())).copied()
    }

    /// Records when waiter `id` started waiting (Unix ms).
    pub fn set_since(&mut self, id: WaiterId, now: i64) {
        if let Some(waiter) = self.waiters.get_mut(&id) {
            waiter.since = now;
        }
    }

    /// Indexes waiter `id` under `owner` ([`Self::waits_of`]); an empty owner (a semaphore
    /// waiter's) is not indexed. Once per waiter.
    pub fn set_owner(&mut self, id: WaiterId, owner: &[u8]) {
        let Some(waiter) = self.waiters.get_mut(&id) else { return };
        if owner.is_empty() || waiter.owner.is_some() {
            return;
        }
        waiter.owner = Some(owner.to_vec());
        let owners = self.by_owner.entry(waiter.lock.db).or_default();
        owners.entry(owner.to_vec()).or_default().insert(id);
    }

    /// The waiters of database `db` indexed under `owner` ([`Self::set_owner`]), oldest first.
    pub fn waits_of(&self, db: i32, owner: &[u8]) -> impl Iterator<Item = &Waiter<H, R>> + '_ {
        self.by_owner
            .get(&db)
            .and_then(|owners| owners.get(owner))
            .into_iter()
            .flatten()
            .filter_map(|id| self.waiters.get(id))
    }

    /// Whether any waiter of database `db` is indexed under `owner`: one lookup, no copy.
    #[must_use]
    pub fn owner_waits(&self, db: i32, owner: &[u8]) -> bool {
        self.by_owner.get(&db).is_some_and(|owners| owners.contains_key(owner))
    }

    /// Whether any waiter is indexed under an owner (in any database).
    #[must_use]
    pub fn any_owner_waits(&self) -> bool {
        !self.by_owner.is_empty()
    }

    /// Records the ACL user waiter `id` asked as.
    pub fn set_user(&mut self, id: WaiterId, user: Option<Vec<u8>>) {
        if let Some(waiter) = self.waiters.get_mut(&id) {
            waiter.user = user;
        }
    }
}
