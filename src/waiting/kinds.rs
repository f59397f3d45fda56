//! What releases and changes of the read-write lock and the semaphore do to their waiters: the
//! kind's layout is written (`store`), then its queue is served (`settle`, `freed`), and read
//! holds are looked at when they end.

use redis_module::{Context, RedisString};

use super::hand_off::{check_release_publish, freed_as, settle, Publish};
use super::schedule::{forget_check, schedule_check};
use super::state::{lock_name, QUEUES};
use crate::error::LockError;
use crate::raw;
use crate::rules::Reply;
use crate::rw_rules::{self, Mode, RwPlan};
use crate::sem_rules;
use crate::store::access::check_publish;
use crate::store::rw::RwKey;
use crate::store::sem::{Leases, SemKey};
use crate::store::waiters;
use crate::store::{self, Unlocked};

/// Releases one read or write hold of `owner` on the read-write lock `name`: the rules of
/// `RWLOCK.RELEASE`, with the hand-off to waiters when the lock is freed or downgraded. Also
/// undoes a read-write grant whose client left.
///
/// # Errors
/// `WRONGTYPE` (a reentrant lock, or not a hash), a corrupt count, or `NOPERM` for the read hold
/// keys or the channel.
pub fn rw_release(
    ctx: &Context,
    name: &RedisString,
    owner: &[u8],
    mode: Mode,
) -> Result<Reply, LockError> {
    let key = RwKey::open(ctx, name, true);
    let state = key.state()?;
    if state.mode.is_none() {
        // Free: no hold to release. Waiters owed it get it first (on their own key handles);
        // nothing here can refuse after that.
        drop(key);
        settle(ctx, name);
        return Ok(Reply::Nil);
    }
    // Held: its head cannot be granted before this release (which hands it on if it frees or
    // downgrades the lock), and nothing is written before every refusal was checked.
    let now = raw::now_ms();
    let holds = key.holds(&state, now)?;
    let plan = rw_rules::release(&state, mode, owner, &holds, now);
    key.check(&plan)?;
    let publish = check_release_publish(ctx, name, plan.freed.map(Unlocked::Rw))?;
    key.apply(&plan);
    drop(key);
    rw_applied_as(ctx, name, &plan, publish);
    Ok(plan.reply)
}

/// After a read-write plan was applied: a freed lock goes to its waiters (or its release is
/// published), a downgraded one to the readers at the head of its queue, and new or renewed
/// read holds are looked at when they end.
pub fn rw_applied(ctx: &Context, name: &RedisString, plan: &RwPlan) {
    rw_applied_as(ctx, name, plan, Publish::Checked);
}

/// [`rw_applied`] after [`check_release_publish`].
pub fn rw_applied_as(ctx: &Context, name: &RedisString, plan: &RwPlan, publish: Publish) {
    super::session::rw_applied(ctx, name, plan);
    if let Some(mode) = plan.freed {
        // No hold is left to look at (the key is gone); a grant in the hand-off below
        // schedules its own.
        forget_check(ctx, name, mode == Mode::Read);
        freed_as(ctx, name, Unlocked::Rw(mode), publish);
    } else if plan.settle {
        settle(ctx, name);
    }
    if let Some(at) = waiters::reap_hint(plan) {
        schedule_check(ctx, &lock_name(ctx, name), at);
    }
}

/// How many clients wait for the read-write lock `key` of database `db` in `mode`.
pub fn waiting_in(db: i32, key: &[u8], mode: Mode) -> usize {
    QUEUES.with(|q| {
        q.try_borrow().map_or(0, |q| q.waiting_for(db, key, |r| waiters::rw_mode(r) == Some(mode)))
    })
}

/// Gives back `permits` of the semaphore `name` (the undo of a grant whose client left; a
/// counted `RSEM.RELEASE` does the same in its handler): its waiters are served, then the count
/// left is published. Returns it.
///
/// # Errors
/// `WRONGTYPE`, a value that is not an integer, an overflow, or `NOPERM` for the channel.
pub fn sem_release(ctx: &Context, name: &RedisString, permits: u64) -> Result<i64, LockError> {
    let key = SemKey::open(ctx, name, true);
    let state = key.state()?;
    let plan = sem_rules::release(state, permits)?;
    check_publish(ctx, name, Some(Unlocked::Permits(0)))?;
    key.apply(state, &plan);
    drop(key);
    sem_raised(ctx, name)
}

/// Permits of the semaphore `name` came back: its waiters are served in order while the
/// permits last, then the count left is published on `redisson_sc:{name}` (Redisson's waiters
/// wake on it). Returns the count left.
///
/// # Errors
/// As `store::sem::available`.
pub fn sem_raised(ctx: &Context, name: &RedisString) -> Result<i64, LockError> {
    settle(ctx, name);
    let left = store::sem::available(ctx, name)?;
    store::publish_unlock(ctx, name, Unlocked::Permits(left));
    Ok(left)
}

/// Releases leased permits of the semaphore `name` by id, all or nothing (every id must be a
/// live lease): they come back to the count, its waiters are served and the count left is
/// published. Returns how many were released (0: nothing changed).
///
/// # Errors
/// `WRONGTYPE`, a corrupt count, `NOPERM` for the lease zset or the channel.
pub fn sem_release_ids(ctx: &Context, name: &RedisString, ids: &[&[u8]]) -> Result<i64, LockError> {
    let leases = Leases::for_caller(ctx, name)?;
    let now = raw::now_ms();
    if !sem_rules::releasable(&leases.scores(ctx, ids)?, now) {
        return Ok(0);
    }
    check_publish(ctx, name, Some(Unlocked::Permits(0)))?;
    // The count is checked before any id leaves the zset: an overflow changes nothing.
    let state = SemKey::open(ctx, name, false).state()?;
    let plan = sem_rules::release_ids(state, ids)?;
    let back = leases.remove(ctx, ids)?;
    for id in ids {
        super::session::ended(ctx, name, crate::sessions::Held::Permit(id.to_vec()));
    }
    let Ok(permits @ 1..) = u64::try_from(back) else { return Ok(0) };
    let key = SemKey::open(ctx, name, true);
    let plan = match plan.write {
        sem_rules::SemWrite::Add(n) if n == back => plan,
        // Not reached: every id was a live lease, so ZREM removed each distinct one.
        _ => sem_rules::release(state, permits)?,
    };
    key.apply(state, &plan);
    drop(key);
    sem_raised(ctx, name)?;
    Ok(back)
}

/// Reclaims the semaphore `name`'s leased permits whose lease ended by `now`, a bounded batch
/// (serving its waiters and publishing the count when some came back); returns when to look
/// again: the next millisecond (the next timer tick) when a whole batch came back, else the
/// earliest live lease's end.
///
/// # Errors
/// `WRONGTYPE`, a corrupt count, an overflow, `NOPERM` (the zset or the channel) for a caller.
pub fn sem_reclaim(ctx: &Context, name: &RedisString, now: i64) -> Result<Option<i64>, LockError> {
    sem_reclaim_keeping(ctx, name, now, 0)
}

/// [`sem_reclaim`] leaving room in the count for `reserve` permits the caller gives back next.
///
/// # Errors
/// As [`sem_reclaim`].
pub fn sem_reclaim_keeping(
    ctx: &Context,
    name: &RedisString,
    now: i64,
    reserve: u64,
) -> Result<Option<i64>, LockError> {
    Ok(reclaim_giving_back(ctx, name, now, reserve)?.0)
}

/// [`sem_reclaim`] giving back `reserve` permits in the same write when it writes the count:
/// when to look again, and the count left after the waiters were served when the reserve went
/// back (`None`: the caller gives it back itself).
fn reclaim_giving_back(
    ctx: &Context,
    name: &RedisString,
    now: i64,
    reserve: u64,
) -> Result<(Option<i64>, Option<i64>), LockError> {
    let reclaimed = store::sem::reclaim(ctx, name, now, reserve)?;
    let mut left = None;
    if reclaimed.back > 0 || reclaimed.reserved {
        let count = sem_raised(ctx, name)?;
        left = reclaimed.reserved.then_some(count);
    }
    if reclaimed.more {
        return Ok((Some(now.saturating_add(1)), left));
    }
    if !reclaimed.leases {
        // No zset, so nothing came back and nothing was granted since: no lease to look at.
        return Ok((None, left));
    }
    let Ok(leases) = Leases::of(ctx, name) else { return Ok((None, left)) };
    let (_, earliest) = leases.summary(ctx, now)?;
    Ok((earliest.map(|at| crate::rules::Deadline::at(at).over_at()), left))
}

/// How many clients wait for the semaphore `key` of database `db`, and for how many permits
/// (`sem_rules::waiting_permits`: at most the largest count).
pub fn waiting_permits(db: i32, key: &[u8]) -> (usize, i64) {
    QUEUES.with(|q| {
        q.try_borrow().map_or((0, 0), |q| {
            let waiters = q.waiting_for(db, key, |r| waiters::permits(r) > 0);
            (waiters, sem_rules::waiting_permits(q.waiting_sum(db, key, waiters::permits)))
        })
    })
}

/// Whether the lock `name` that a timer looks at is a semaphore: its key is a string, or it is
/// missing (deleted, expired: its leased permits are still out) while a semaphore waiter waits
/// for it or its lease zset exists. (A read-write lock's key is a hash, and it has no such zset.)
pub fn is_semaphore(ctx: &Context, name: &RedisString) -> bool {
    match raw::Key::open(ctx, name, false).kind() {
        raw::KeyKind::String => true,
        raw::KeyKind::Empty => {
            let db = raw::selected_db(ctx);
            let permits_waited = QUEUES.with(|q| {
                q.try_borrow().is_ok_and(|q| {
                    q.waiting_for(db, name.as_slice(), |r| waiters::permits(r) > 0) > 0
                })
            });
            permits_waited
                || Leases::of(ctx, name).is_ok_and(|leases| leases.exists(ctx).unwrap_or(false))
        }
        raw::KeyKind::Hash | raw::KeyKind::Other => false,
    }
}

/// Leased permits whose lease ended come back first (as every Redisson semaphore script
/// begins), and the next lease end is looked at by a timer: what every `RSEM.*` write does
/// first.
pub fn sem_reclaim_due(ctx: &Context, name: &RedisString) -> Result<(), LockError> {
    sem_reclaim_due_keeping(ctx, name, 0, false).map(|_| ())
}

/// [`sem_reclaim_due`] giving back the `reserve` permits of a counted release (`RSEM.RELEASE key
/// permits`, checked by its caller) in the reclaim's own write when it makes one: then returns
/// the count left after the waiters were served (published); `None`: the reclaim wrote nothing,
/// and the caller gives the permits back itself.
///
/// # Errors
/// As [`sem_reclaim`]; nothing is written then.
pub fn sem_reclaim_due_giving_back(
    ctx: &Context,
    name: &RedisString,
    reserve: u64,
) -> Result<Option<i64>, LockError> {
    sem_reclaim_due_keeping(ctx, name, reserve, false)
}

/// [`sem_reclaim_due`] giving back the `reserve` permits of a release in the reclaim's own
/// write when it makes one (then returns the count left, see [`reclaim_giving_back`]);
/// `leases_released`: leased permits were just released by id (see [`forget_check`]).
fn sem_reclaim_due_keeping(
    ctx: &Context,
    name: &RedisString,
    reserve: u64,
    leases_released: bool,
) -> Result<Option<i64>, LockError> {
    let (next, left) = reclaim_giving_back(ctx, name, raw::now_ms(), reserve)?;
    match next {
        Some(at) => schedule_check(ctx, &lock_name(ctx, name), at),
        // No lease is out (the last was released by id, or the zset is gone): nothing to
        // reclaim at any time.
        None => forget_check(ctx, name, leases_released),
    }
    Ok(left)
}

/// `RSEM.RELEASE key ID id [id ...]` (and a cancelled request's leased permits, and the permits
/// of closed sessions): returns how many were released.
///
/// # Errors
/// As [`sem_release_ids`].
pub fn sem_give_back_ids<I: AsRef<[u8]>>(
    ctx: &Context,
    key: &RedisString,
    ids: &[I],
) -> Result<i64, LockError> {
    let ids: Vec<&[u8]> = ids.iter().map(AsRef::as_ref).collect();
    let released = sem_release_ids(ctx, key, &ids)?;
    sem_reclaim_due_keeping(ctx, key, 0, released > 0)?;
    Ok(released)
}
