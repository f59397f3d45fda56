//! What the waiting machinery asks of a lock's layout, whatever its kind: can the waiter at the
//! head be granted now (and if so, the grant, checked and ready to write), and what does a wait
//! that ends without a grant reply. `waiting` stays the same for every kind: it asks, writes the
//! grants in queue order, and schedules a look at the holder's lease end.

use redis_module::{Context, RedisString};

use super::derived::TokenCounter;
use super::LockKey;
use crate::error::LockError;
use crate::rules::{Plan, Reply, Request, View};

/// The waiter at the head of a queue, as the lock stands now.
pub enum Head<'a> {
    /// It can be granted: write it with [`Grant::write`].
    Grant(Grant<'a>),
    /// It cannot yet; look again at `recheck_at` (Unix ms; `None`: when something changes).
    Wait { recheck_at: Option<i64> },
    /// It can never be granted as it asked (a fencing token that cannot be issued): answer it
    /// with this error and look at the next one.
    Refuse(LockError),
}

/// A grant to a waiter, checked: everything that can refuse was asked before anything is
/// written.
pub struct Grant<'a> {
    key: LockKey<'a>,
    owner: RedisString,
    plan: Plan,
    token: Option<(TokenCounter, u64)>,
}

/// Looks at the waiter at the head of the lock `name`'s queue, asking `request` at `now`.
pub fn consider<'a>(
    ctx: &'a Context,
    name: &'a RedisString,
    request: &Request,
    now: i64,
) -> Head<'a> {
    let owner = RedisString::create_from_slice(ctx.get_raw(), &request.owner);
    let key = LockKey::open(ctx, name, true);
    let Ok(view) = key.view(Some(&owner)) else {
        // Not a lock any more (WRONGTYPE, a corrupt count): nobody is granted.
        return Head::Wait { recheck_at: None };
    };
    let Some(plan) = request.grant(view, now) else {
        let recheck_at = match view {
            View::Held { pttl, .. } if pttl >= 0 => Some(crate::rules::lease_over_at(now, pttl)),
            _ => None,
        };
        return Head::Wait { recheck_at };
    };
    let token = if request.token {
        match next_token(ctx, name) {
            Ok(token) => Some(token),
            Err(e) => return Head::Refuse(e),
        }
    } else {
        None
    };
    Head::Grant(Grant { key, owner, plan, token })
}

/// The counter and the next token of a grant to a waiter, checked, nothing written.
fn next_token(ctx: &Context, name: &RedisString) -> Result<(TokenCounter, u64), LockError> {
    let counter = TokenCounter::for_grant(ctx, name)?;
    let token = counter.next(ctx)?;
    Ok((counter, token))
}

impl Grant<'_> {
    /// Writes and replicates the grant as the waiter's hold. Returns its reply and when its
    /// lease is over (Unix ms), for the next look at the queue.
    pub fn write(self, ctx: &Context) -> (Reply, Option<i64>) {
        let Self { key, owner, plan, token } = self;
        key.apply(Some(&owner), &plan);
        drop(key);
        let token = token.map(|(counter, token)| {
            counter.store(ctx, token);
            token
        });
        (crate::rules::granted(token), plan.expire_at.map(|d| d.over_at()))
    }
}

/// What a wait for the lock `name` that ends without a grant replies (timed out, or `CLIENT
/// UNBLOCK`), read in the context's selected database: the holder's remaining lease (-1: no
/// expiry) as a busy acquire; 0 when nobody holds it at this instant but it could not be
/// granted (writes paused): retry at once.
///
/// # Errors
/// `WRONGTYPE` when the key now holds something else.
pub fn not_granted(ctx: &Context, name: &[u8], request: &Request) -> Result<Reply, LockError> {
    let name = RedisString::create_from_slice(ctx.get_raw(), name);
    let pttl = match LockKey::open(ctx, &name, false).view(None)? {
        View::Held { pttl, .. } => pttl,
        View::Free => 0,
    };
    Ok(request.not_granted(pttl))
}
