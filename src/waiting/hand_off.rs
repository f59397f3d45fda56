//! The hand-off: a lock that can be granted goes to its waiters, from the head of its queue,
//! before any newcomer; a freed lock nobody waits for publishes its unlock message; and the
//! reentrant lock's release, which frees it.

use std::sync::atomic::Ordering;

use redis_module::{Context, RedisString};

use super::schedule::arm;
use super::state::{bump, lock_name, look_again, unblock, waits_for, with_queues, Outcome, STATS};
use super::{cluster, session};
use crate::error::LockError;
use crate::queue::{End, LockName};
use crate::raw;
use crate::replicas;
use crate::rules::{self, Deadline, Reply};
use crate::sessions::Held;
use crate::store::access::{self, check_publish};
use crate::store::waiters::{self, Head};
use crate::store::{self, LockKey, Unlocked};

/// Grants the lock `name` to the waiters its rules allow now, from the head of its queue, or
/// (when its head cannot be granted) makes sure it is checked again at its holder's deadline.
/// Called on every RLOCK write to a lock, before the command's own rules, so no newcomer takes
/// a lock that waiters are owed. Opens (and closes) its own key handles: the caller opens its
/// own afterwards, so no handle outlives a hand-off's writes.
pub fn settle(ctx: &Context, name: &RedisString) {
    if waits_for(ctx, name) {
        hand_off(ctx, name);
    }
}

/// The reentrant lock `name` as `owner` sees it, opened for writing, after its waiters got what
/// they are owed: a free lock with waiters goes to them first ([`settle`], on its own key
/// handles), so no newcomer takes it. A held lock is not settled: its head cannot be granted
/// while it is held (a waiter is never its holder: an owner that holds re-enters at once), so
/// the common contended call opens the key once.
///
/// # Errors
/// As [`LockKey::view`].
pub fn settled_view<'a>(
    ctx: &'a Context,
    name: &'a RedisString,
    owner: &RedisString,
) -> Result<(LockKey<'a>, rules::View), LockError> {
    let key = LockKey::open(ctx, name, true);
    let view = key.view(Some(owner))?;
    if !matches!(view, rules::View::Free) || !waits_for(ctx, name) {
        return Ok((key, view));
    }
    drop(key);
    settle(ctx, name);
    let key = LockKey::open(ctx, name, true);
    let view = key.view(Some(owner))?;
    Ok((key, view))
}

/// An `RLATCH` command opened the latch `name` (counted down to zero, or deleted): every
/// awaiter is answered now.
pub fn latch_opened(ctx: &Context, name: &RedisString) {
    bump(&STATS.latch_opens);
    settle(ctx, name);
}

/// A command or timer freed the lock `name`: it goes to its waiters, or (nobody can take it)
/// the unlock message is published.
pub fn freed(ctx: &Context, name: &RedisString, unlocked: Unlocked) {
    freed_as(ctx, name, unlocked, Publish::Checked);
}

/// Whether the caller's permission to publish a release's unlock message was checked.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Publish {
    /// Checked (or nobody's to check: a timer, the module's own work).
    Checked,
    /// Not yet: the release hands the lock on to its waiters, and publishes nothing then.
    Unchecked,
}

/// Checks, before a release that may free the lock `name` (`freeing`) writes anything, that
/// the caller may publish its unlock message (`NOPERM` otherwise), unless others wait for the
/// lock: then the release hands it on and publishes nothing, and the check is left to the
/// publish itself ([`freed_as`]), should the hand-off grant nobody after all.
///
/// # Errors
/// [`LockError::NoPermChannel`].
pub fn check_release_publish(
    ctx: &Context,
    name: &RedisString,
    freeing: Option<Unlocked>,
) -> Result<Publish, LockError> {
    if freeing.is_some() && waits_for(ctx, name) {
        return Ok(Publish::Unchecked);
    }
    check_publish(ctx, name, freeing)?;
    Ok(Publish::Checked)
}

/// [`freed`] after [`check_release_publish`]: an unchecked unlock message is published only
/// when the caller may publish it (the release itself is done and cannot be refused any more:
/// the message is left out, and `ACL LOG` has an entry, when the caller may not).
pub fn freed_as(ctx: &Context, name: &RedisString, unlocked: Unlocked, publish: Publish) {
    if hand_off(ctx, name) {
        return;
    }
    if publish == Publish::Unchecked && check_publish(ctx, name, Some(unlocked)).is_err() {
        return;
    }
    store::publish_unlock(ctx, name, unlocked);
}

/// Grants the lock to waiters from the head of its queue while its rules allow; returns whether
/// anyone was granted. Each grant is written and replicated as that client's hold (by the
/// store, which knows the lock kind's layout), then the client is unblocked.
///
/// A latch's awaiters hold nothing and stand in nobody's line (a latch and a semaphore share
/// one layout, an integer string, and so may share a key): they are answered all at once when
/// the latch is open, wherever they stand in the queue, and the lock's other waiters pass
/// them by ([`answer_awaiters`]). Answering them grants nothing.
///
/// A waiter that can never be granted as it asked (a fencing token that cannot be issued: the
/// counter is corrupt or full, or an `allkeys-*` policy is in force) gets that error and the
/// next waiter is tried: nothing is granted with an error reply. Never writes while writes are
/// paused (timers check first), on a replica, or on a master whose replica guard refuses grants
/// (the waiters stay queued and the lock is looked at again at every poll until grants are
/// allowed; a latch's awaiters are still answered, as answering grants nothing).
pub fn hand_off(ctx: &Context, name: &RedisString) -> bool {
    if !waits_for(ctx, name) || !raw::is_master(ctx) || raw::writes_paused() {
        return false;
    }
    let lock = &lock_name(ctx, name);
    // A latch's awaiters are answered whatever the replica guard says: answering grants
    // nothing (no hold, no write), and an opening they miss now may be gone (the latch set
    // again) by the time grants resume.
    let mut slot_checked = false;
    if answer_awaiters(ctx, name, lock, &mut slot_checked).is_err() {
        return false;
    }
    if !replicas::grants_allowed(raw::now_ms()) {
        // Held back by the replica guard: looked at again at the next poll, so the waiters are
        // served as soon as grants are allowed, however that comes about (the quarantine ends,
        // a replica comes back, `rlock.min-replicas` is lowered).
        if waits_for(ctx, name) {
            look_again(lock, None);
            arm(ctx);
        }
        return false;
    }
    let mut granted = false;
    loop {
        let Some((id, request, user)) = with_queues(|q| {
            q.in_line_head(lock.db, &lock.key).map(|w| (w.id, w.request.clone(), w.user.clone()))
        }) else {
            return granted;
        };
        // Checked as the waiter's ACL user, not the releaser's (nor nobody's, from a timer).
        let now = raw::now_ms();
        let head =
            access::acting_as(user.as_deref(), || waiters::consider(ctx, name, &request, now));
        let grant = match head {
            Head::Grant(grant) => grant,
            Head::Wait { recheck_at } => {
                look_again(lock, recheck_at);
                arm(ctx);
                return granted;
            }
            Head::Refuse(e) => {
                if let Some(waiter) = with_queues(|q| q.remove_as(id, End::Left, Some(now))) {
                    bump(&STATS.left);
                    unblock(waiter, Outcome::Failed(e));
                }
                continue;
            }
        };
        if slot_moved(ctx, lock, &mut slot_checked) {
            drop(grant);
            return granted;
        }
        let Some(waiter) = with_queues(|q| q.remove_as(id, End::Granted, Some(now))) else {
            return granted;
        };
        let written = grant.write(ctx);
        session::waiter_granted(ctx, name, &request, &written);
        let exclusive = request.exclusive();
        let (reply, ids, stamp) = (written.reply, written.ids, written.stamp);
        unblock(waiter, Outcome::Granted { lock: lock.clone(), request, reply, ids, stamp });
        bump(&STATS.handoffs);
        granted = true;
        look_again(lock, written.lease_over_at);
        if let Some(at) = written.reap_at {
            with_queues(|q| q.schedule_check(lock, at));
        }
        arm(ctx);
        if exclusive {
            return true;
        }
    }
}

/// The slot of `lock` left this node (looked at once per hand-off, `checked` telling whether it
/// was): its waiters are redirected to the node that has it now.
fn slot_moved(ctx: &Context, lock: &LockName, checked: &mut bool) -> bool {
    if std::mem::replace(checked, true) {
        return false;
    }
    let Some(redirect) = cluster::redirect(ctx, &lock.key, false) else { return false };
    cluster::redirect_all(lock, &redirect);
    true
}

/// The slot of the lock moved away while its latch's awaiters were answered.
struct Redirected;

/// Answers the latch awaiters of `lock` (waiting apart from its line) when the latch is open:
/// every one of them at once, wherever each stands in the queue (a broadcast: nothing is
/// written, so no key is read again and the queue is walked once). A latch retyped or spoiled
/// under them answers them with that error.
fn answer_awaiters(
    ctx: &Context,
    name: &RedisString,
    lock: &LockName,
    slot_checked: &mut bool,
) -> Result<(), Redirected> {
    loop {
        let Some((id, request, user)) = with_queues(|q| {
            q.first_apart(lock.db, &lock.key).map(|w| (w.id, w.request.clone(), w.user.clone()))
        }) else {
            return Ok(());
        };
        let now = raw::now_ms();
        let head =
            access::acting_as(user.as_deref(), || waiters::consider(ctx, name, &request, now));
        match head {
            Head::Grant(grant) => {
                drop(grant);
                if slot_moved(ctx, lock, slot_checked) {
                    return Err(Redirected);
                }
                let opened = with_queues(|q| q.take_apart(lock.db, &lock.key, End::Granted, now));
                STATS.latch_releases.fetch_add(opened.len() as u64, Ordering::Relaxed);
                for waiter in opened {
                    unblock(waiter, Outcome::Opened);
                }
                return Ok(());
            }
            Head::Wait { recheck_at } => {
                look_again(lock, recheck_at);
                arm(ctx);
                return Ok(());
            }
            Head::Refuse(e) => {
                if let Some(waiter) = with_queues(|q| q.remove_as(id, End::Left, Some(now))) {
                    bump(&STATS.left);
                    unblock(waiter, Outcome::Failed(e));
                }
            }
        }
    }
}

/// Releases one hold of `owner` on the lock `name`: the rules of `RLOCK.RELEASE`, with the
/// hand-off to waiters when the lock is freed. Also undoes a grant whose client left.
///
/// # Errors
/// `WRONGTYPE`, a corrupt hold count, or `NOPERM` for the unlock channel.
pub fn release_hold(
    ctx: &Context,
    name: &RedisString,
    owner: &RedisString,
    deadline: Option<Deadline>,
) -> Result<Reply, LockError> {
    let (key, view) = settled_view(ctx, name, owner)?;
    let plan = rules::release(view, deadline);
    let publish = check_release_publish(ctx, name, plan.publish.then_some(Unlocked::Lock))?;
    let freed_it = key.apply(Some(owner), &plan);
    drop(key);
    if freed_it {
        session::lock_ended(ctx, name);
        freed_as(ctx, name, Unlocked::Lock, publish);
    } else if let (Some(deadline), true) = (plan.expire_at, plan.writes()) {
        session::renewed(ctx, name, Held::Lock(owner.as_slice().to_vec()), deadline.unix_ms());
    }
    Ok(plan.reply)
}
