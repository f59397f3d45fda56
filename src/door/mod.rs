//! The door: the one path every command that writes takes into a lock, in floor order.
//!
//! 1. **Load**: the lock's pending ends applied ([`load`]): holds of closed connections, grants
//!    to clients that left before their reply. Every command that writes a lock calls it first,
//!    after its pure argument checks and before any refusal of its own; the pending ends are the
//!    module's own work, owed whatever the command replies, so no command reads a lock whose end
//!    is pending. An acquire's load goes on ([`enter`]): what the waiting machinery knows of the
//!    lock, in memory (a `REQUEST` id being undone or waiting; the caller's `SESSION` binding),
//!    then what the store holds (may this master grant, the request's record: a retry of a grant
//!    still in place replays it here and goes no further; the token counter). Everything that
//!    can refuse is checked before the command writes anything of its own. The other commands'
//!    refusals come after [`load`] in their handlers (`RLOCK.RENEW`, `RWLOCK.RENEW`,
//!    `RSEM.RENEW`, a counted `RSEM.RELEASE`: the replica guard).
//! 2. **Decide**: the command opens its lock's key once (waiters owed a free lock served first,
//!    `waiting::settled_view`, `waiting::settle`) and asks the pure rules (`rules`, `rw_rules`,
//!    `sem_rules`, `latch_rules`, `request_rules`) for a plan: a reply, the writes, whether to
//!    wait.
//! 3. **Write** ([`Admitted::token`], [`Admitted::written`] for an acquire): the store's writes
//!    (the token, the lock, the request's record), then the grant's session binding (in memory).
//! 4. **Wake**: a wait is queued (`waiting::block_as`, after the deadlock search); a release
//!    hands off to the waiters (`waiting::freed_as`, `waiting::rw_applied`,
//!    `waiting::sem_raised`).
//!
//! Most handlers read these steps in order. Three releases keep their decide, write and wake in
//! one function of `waiting`, because the module's own work undoes a grant with them too
//! (`waiting::release_hold` for `RLOCK.RELEASE`, `waiting::rw_release` for `RWLOCK.RELEASE`,
//! `waiting::sem_give_back_ids` for `RSEM.RELEASE ... ID`, which session ends also use); the
//! handler loads, then calls it.
//!
//! Timers, server events and session ends do not enter here: they are the module's own work,
//! done by `waiting` (its `tick`, `session_end`, `undo`).

use redis_module::{Context, RedisString, RedisValue};

use crate::args;
use crate::error::{LockError, Refusal};
use crate::request_rules::{Asked, Granted};
use crate::sessions::{Bind, Held};
use crate::store::derived::TokenCounter;
use crate::store::request::{self, Beside, Prelude, Queued};
use crate::store::{self, Unlocked};
use crate::waiting;

/// What an acquire brings to the door.
pub(crate) struct Entry<'a> {
    /// The lock's key (the command's key).
    pub key: &'a RedisString,
    /// `SESSION [LOCKDELAY ms]`.
    pub session: Option<args::Session>,
    /// The unlock message a session end of this kind publishes (its channel is ACL-checked).
    pub unlocked: Unlocked,
    /// `REQUEST id`.
    pub request: Option<&'a RedisString>,
    /// What the request asks (its record must agree on a retry).
    pub asked: Asked<'a>,
    /// `TOKEN`: the counter's key is checked (slot, ACL) here.
    pub token: bool,
    /// The command's time (Unix ms).
    pub now: i64,
}

/// Through the door, or answered at it.
pub(crate) enum Entered {
    /// A retry whose first grant is still in place: reply this, change nothing.
    Replay(RedisValue),
    /// A new acquire, checked: what its grant writes beside the lock.
    Fresh(Admitted),
}

/// An acquire let in: its binding, and what its grant writes beside the lock (its request's
/// record and its token counter), each checked.
pub(crate) struct Admitted {
    pub bind: Option<Bind>,
    pub beside: Beside,
}

/// Step 1 of the door (see the module's doc) for every command that writes the lock `key`:
/// its pending ends applied (nothing happens on a replica, or with none pending). Nothing here
/// refuses: the command's own refusals come after it.
pub(crate) fn load(ctx: &Context, key: &RedisString) {
    waiting::apply_pending(ctx, key);
}

/// Step 1 of the door (see the module's doc) for the acquire `entry`: [`load`], then the
/// acquire's own checks.
///
/// # Errors
/// What the session binding refuses (on a replica, in a script, `NOPERM` for the channel);
/// `NOREPLICAS` ([`store::may_grant_at`]); what the request's record refuses (naming its id);
/// `NOPERM` or `CROSSSLOT` for the token counter.
pub(crate) fn enter(ctx: &Context, entry: Entry<'_>) -> Result<Entered, Refusal> {
    load(ctx, entry.key);
    // The waiting machinery's floor: in memory.
    let queued = entry.request.map(|id| queued(ctx, entry.key, id.as_slice()));
    let bind = waiting::session::caller(ctx, entry.key, entry.session, entry.unlocked)?;
    // The store's floor.
    store::may_grant_at(ctx, entry.now)?;
    let record = match (entry.request, queued) {
        (Some(id), Some(queued)) => {
            match request::prelude(ctx, entry.key, id.as_slice(), entry.asked, entry.now, queued)? {
                Prelude::Replay(reply) => return Ok(Entered::Replay(reply)),
                Prelude::Fresh(record) => Some(record),
            }
        }
        _ => None,
    };
    let counter = entry.token.then(|| TokenCounter::for_caller(ctx, entry.key)).transpose()?;
    Ok(Entered::Fresh(Admitted { bind, beside: Beside { counter, record } }))
}

impl Admitted {
    /// Step 3 of the door, before the lock is written: the grant's token (if `TOKEN`), drawn
    /// from the counter as it is now (after any hand-off of the decide step); nothing is
    /// written.
    ///
    /// # Errors
    /// A corrupt counter, or one at its end: nothing may be written then.
    pub fn token(&self, ctx: &Context) -> Result<Option<u64>, LockError> {
        self.beside.counter.as_ref().map(|c| c.next(ctx)).transpose()
    }

    /// Step 3 of the door, after the lock was written with `token` ([`Self::token`]): the
    /// counter and the request's record (`granted`, kept until `until`, Unix ms), then the
    /// grant's binding in memory (`bound`: the hold, whether it is fresh, its lease end; asked
    /// only where holds are watched), for the session ends to come.
    pub fn written(
        self,
        ctx: &Context,
        name: &RedisString,
        token: Option<u64>,
        granted: impl FnOnce() -> Option<(Granted, Option<i64>)>,
        bound: impl FnOnce() -> Option<(Held, bool, i64)>,
    ) {
        self.beside.write(ctx, token, granted);
        if !waiting::session::watching(self.bind.is_some()) {
            return;
        }
        if let Some((held, fresh, until)) = bound() {
            waiting::session::granted(ctx, name, held, fresh, self.bind, until);
        }
    }
}

/// What the queues and the deferred undos know of request `id` on the lock `name` (the
/// context's database).
fn queued(ctx: &Context, name: &RedisString, id: &[u8]) -> Queued {
    let undoing = waiting::schedule::undo_pending(&waiting::lock_name(ctx, name), id);
    Queued { undoing, waits: waiting::waits_as(ctx, name, id) }
}
