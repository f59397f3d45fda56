//! Session holds on Redis (`SESSION` on an acquire): grants bind their hold to the client's
//! connection, releases and flushes drop bindings, and a closed connection's holds are ended by
//! the module's 0 ms timer (`end`), never inside the server event that reports the close.
//!
//! Bindings live only in this master's memory (`sessions::Sessions`): a replica, a restarted
//! server or a promoted replica has none, and those holds end with their leases.

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};

use redis_module::{Context, RedisString};

use super::schedule as timers;
use super::state::lock_name;
use crate::args;
use crate::error::LockError;
use crate::raw;
use crate::rules::{Kind, Request};
use crate::rw_rules::{Effect, Mode, RwPlan};
use crate::sessions::{Bind, Dropped, Held, Hold, Lasts, Sessions};
use crate::store::waiters::{Stamp, Written};
use crate::store::{self, access::check_publish, Unlocked};

thread_local! {
    // Borrows never span a call into Redis (every callback runs on Redis's main thread).
    static SESSIONS: RefCell<Sessions> = RefCell::new(Sessions::default());
}

/// Counters for `INFO rlock`.
pub struct SessionStats {
    /// Holds ended because their connection closed.
    pub ends: AtomicU64,
    /// Of those, the ones followed by a lock-delay.
    pub delays: AtomicU64,
}

/// The session counters.
pub static SESSION_STATS: SessionStats =
    SessionStats { ends: AtomicU64::new(0), delays: AtomicU64::new(0) };

pub(super) fn with<R>(f: impl FnOnce(&mut Sessions) -> R) -> R {
    SESSIONS.with(|s| f(&mut s.borrow_mut()))
}

/// Whether no hold is bound and none waits to be ended: every hook returns at once then.
fn quiet() -> bool {
    SESSIONS.with(|s| s.try_borrow().map_or(true, |s| s.is_empty()))
}

/// Whether a grant (`bound`: with `SESSION`) or a renewal must be told to the sessions: not
/// when nothing is bound anywhere and this one is not (cheap: a plain acquire asks, and builds
/// what it would tell only when it must).
pub fn watching(bound: bool) -> bool {
    bound || !quiet()
}

/// Whether holds of closed connections wait to be ended (cheap: every command asks).
pub fn ends_pending() -> bool {
    SESSIONS.with(|s| s.try_borrow().is_ok_and(|s| s.ends_pending()))
}

/// At load: no binding, counters from zero.
pub fn reset() {
    with(Sessions::clear);
    SESSION_STATS.ends.store(0, Ordering::Relaxed);
    SESSION_STATS.delays.store(0, Ordering::Relaxed);
}

/// Whether a hold is bound or an end waits to be applied (after pruning the bindings whose
/// lease ended): `MODULE UNLOAD` is refused then.
pub fn promised(now: i64) -> bool {
    prune(now);
    !quiet()
}

/// How many holds are bound to a connection now (`INFO rlock`).
pub fn bound() -> usize {
    SESSIONS.with(|s| s.try_borrow().map_or(0, |s| s.len()))
}

/// The binding an acquire of the lock `name` with `SESSION` asks for, checked before anything
/// is written: the caller's own connection, on a master, and a caller allowed to do what the
/// end of its hold does (publish `unlocked` on the lock's channel; the keys the end writes were
/// checked by the acquire itself), since the end runs when the caller is gone.
///
/// # Errors
/// [`LockError::SessionOnReplica`]; [`LockError::SessionNoConnection`] inside a script or
/// another module's call (its client never disconnects); `NOPERM` for the channel.
pub fn caller(
    ctx: &Context,
    name: &RedisString,
    asked: Option<args::Session>,
    unlocked: Unlocked,
) -> Result<Option<Bind>, LockError> {
    let Some(asked) = asked else { return Ok(None) };
    if !raw::is_master(ctx) {
        return Err(LockError::SessionOnReplica);
    }
    let client = raw::connection_id(ctx).ok_or(LockError::SessionNoConnection)?;
    check_publish(ctx, name, Some(unlocked))?;
    Ok(Some(Bind { client, delay_ms: asked.delay_ms }))
}

/// A grant of `held` on the lock `name` (the context's database) was written, its hold lasting
/// until `until` (Unix ms): a fresh hold (`fresh`: count 0 -> 1, a new permit) is bound to
/// `bind`'s connection, or unbound without it; a re-entry keeps its binding, with the new lease
/// end.
pub fn granted(
    ctx: &Context,
    name: &RedisString,
    held: Held,
    fresh: bool,
    bind: Option<Bind>,
    until: i64,
) {
    granted_lasting(ctx, name, held, fresh, bind, until, Lasts::Exactly);
}

/// [`granted`], the binding's end set as `lasts` says (a read re-entry adds one hold beside
/// the owner's others: the binding lasts as long as the latest of them).
fn granted_lasting(
    ctx: &Context,
    name: &RedisString,
    held: Held,
    fresh: bool,
    bind: Option<Bind>,
    until: i64,
    lasts: Lasts,
) {
    if bind.is_none() && quiet() {
        return;
    }
    let hold = Hold { lock: lock_name(ctx, name), held };
    let now = raw::now_ms();
    if fresh {
        with(|s| s.granted(hold, bind, until, now));
    } else {
        with(|s| s.touch(&hold, until, lasts, bind, now));
    }
}

/// The lease end of the lock `name` as stored (no expiry: never).
pub fn lease_end(ctx: &Context, name: &RedisString) -> i64 {
    store::expire_time(ctx, name).unwrap_or(i64::MAX)
}

/// A read-write grant `plan` was written for `owner`: its side is bound (fresh) or touched.
pub fn rw_granted(
    ctx: &Context,
    name: &RedisString,
    owner: &[u8],
    plan: &RwPlan,
    bind: Option<Bind>,
) {
    if bind.is_none() && quiet() {
        return;
    }
    for effect in &plan.effects {
        match effect {
            Effect::SetReads { owner: o, count } if o == owner => {
                // A read side's binding lasts as long as the owner's own read holds, not the
                // whole hash (other readers may keep it longer).
                let until = plan.grant_until().unwrap_or_else(|| lease_end(ctx, name));
                let fresh = *count == 1 || reads_all_ended_before(ctx, name, o, *count);
                let held = Held::Read(o.clone());
                granted_lasting(ctx, name, held, fresh, bind, until, Lasts::AtLeast);
            }
            Effect::SetWrites { owner: o, count } if o == owner => {
                let held = Held::Write(o.clone());
                granted(ctx, name, held, *count == 1, bind, lease_end(ctx, name));
            }
            Effect::ExpireAt(_) if !plan.effects.iter().any(|e| is_writes_of(e, owner)) => {
                // The hash's lease is the write hold's: a read grant of the writer that moves
                // it moves its write side's end.
                write_lease_moved(ctx, name, owner);
            }
            _ => {}
        }
    }
}

/// Whether a read grant that made `owner`'s count `count` is in fact a fresh hold of a bound
/// read side: every one of its earlier holds (indexes below `count`) ended by its lease, the
/// field lingering until a dead-reader check. Read from their hold keys (their expiry, as the
/// server sees it), only when the side is bound; a binding made for those holds must not
/// carry over to this one.
fn reads_all_ended_before(ctx: &Context, name: &RedisString, owner: &[u8], count: u64) -> bool {
    let hold = Hold { lock: lock_name(ctx, name), held: Held::Read(owner.to_vec()) };
    if with(|s| s.get(&hold)).is_none() {
        return false;
    }
    crate::store::rw::live_read_holds_below(ctx, name, owner, count).is_ok_and(|live| live == 0)
}

fn is_writes_of(effect: &Effect, owner: &[u8]) -> bool {
    matches!(effect, Effect::SetWrites { owner: o, .. } if o == owner)
}

/// The hash of the read-write lock `name` got a new lease end: `owner`'s write side (if it
/// holds one, bound) lasts until it.
pub fn write_lease_moved(ctx: &Context, name: &RedisString, owner: &[u8]) {
    granted(ctx, name, Held::Write(owner.to_vec()), false, None, lease_end(ctx, name));
}

/// A waiter's grant was written: bound to its connection if it asked with `SESSION`.
pub fn waiter_granted(ctx: &Context, name: &RedisString, request: &Request, written: &Written) {
    let (stamp, ids) = (written.stamp, &written.ids);
    let bind = request.session;
    if bind.is_none() && quiet() {
        return;
    }
    let owner = || request.owner.clone();
    match (request.kind, stamp) {
        (Kind::Reentrant, Stamp::Hold { count, expire_at }) => {
            granted(ctx, name, Held::Lock(owner()), count == 1, bind, expire_at);
        }
        (Kind::Rw(Mode::Write), Stamp::Hold { count, .. }) => {
            granted(ctx, name, Held::Write(owner()), count == 1, bind, lease_end(ctx, name));
        }
        (Kind::Rw(Mode::Read), Stamp::ReadHold { index, expire_at }) => {
            let (held, fresh) = (Held::Read(owner()), index == 1);
            granted_lasting(ctx, name, held, fresh, bind, expire_at, Lasts::AtLeast);
        }
        (Kind::Leased(_), _) => {
            // The permits' lease end: their reclaim is due just after it.
            let until = written.reap_at.map_or(i64::MAX, |at| at.saturating_sub(1));
            for id in ids {
                granted(ctx, name, Held::Permit(id.clone()), true, bind, until);
            }
        }
        _ => {}
    }
}

/// The hold `held` on `name` ended (released to zero, given back): its binding goes.
pub fn ended(ctx: &Context, name: &RedisString, held: Held) {
    if !quiet() {
        let hold = Hold { lock: lock_name(ctx, name), held };
        with(|s| s.unbind(&hold));
    }
}

/// Every hold on `name` ended (a force-release, the lock freed or deleted): their bindings go.
pub fn lock_ended(ctx: &Context, name: &RedisString) {
    if !quiet() {
        let lock = lock_name(ctx, name);
        with(|s| s.unbind_lock(&lock));
    }
}

/// A read-write plan was applied: the sides it ended lose their bindings.
pub fn rw_applied(ctx: &Context, name: &RedisString, plan: &RwPlan) {
    if quiet() {
        return;
    }
    if plan.freed.is_some() || plan.effects.contains(&Effect::Delete) {
        lock_ended(ctx, name);
        return;
    }
    for effect in &plan.effects {
        match effect {
            Effect::DropReads { owner } => ended(ctx, name, Held::Read(owner.clone())),
            Effect::DropWrites { owner } => ended(ctx, name, Held::Write(owner.clone())),
            Effect::DropHold { owner, .. }
                if !plan.effects.contains(&Effect::DropReads { owner: owner.clone() }) =>
            {
                reads_shrank(ctx, name, owner);
            }
            _ => {}
        }
    }
}

/// One of `owner`'s read holds on `name` went (a partial release): its bound read side now
/// lasts as long as its remaining holds (read from their keys, only when the side is bound), so
/// an ended binding is never revived by a later read.
fn reads_shrank(ctx: &Context, name: &RedisString, owner: &[u8]) {
    let hold = Hold { lock: lock_name(ctx, name), held: Held::Read(owner.to_vec()) };
    if with(|s| s.get(&hold)).is_none() {
        return;
    }
    let now = raw::now_ms();
    match crate::store::rw::read_holds_end(ctx, name, owner, now) {
        Ok(Some(until)) => with(|s| s.touch(&hold, until, Lasts::Exactly, None, now)),
        Ok(None) => with(|s| s.unbind(&hold)),
        // Unreadable (the release read them): the binding keeps its end.
        Err(_) => {}
    }
}

/// The bound hold `held` on `name` was renewed: it now lasts until `until`.
pub fn renewed(ctx: &Context, name: &RedisString, held: Held, until: i64) {
    granted(ctx, name, held, false, None, until);
}

/// The connection of client `id` closed: its holds are ended by the module's timer (after a
/// write pause, on a master only).
pub fn client_closed(ctx: &Context, id: u64) {
    if quiet() {
        return;
    }
    if with(|s| s.closed(id)) {
        timers::defer(ctx, |d| d.session_ends = true);
    }
}

/// The cron tick: bindings whose lease ended are dropped (they are stale).
pub fn prune(now: i64) {
    if !quiet() {
        with(|s| s.prune(now, usize::MAX));
    }
}

/// Database `db` (`None`: all) was flushed: returns the bindings and pending ends that went
/// (`lifecycle` keeps them should the flush be a reload's).
pub fn flushed(db: Option<i32>) -> Dropped {
    SESSIONS.with(|s| s.try_borrow_mut().map(|mut s| s.flushed(db)).unwrap_or_default())
}

/// A reload brought back the data a flush emptied: its bindings and pending ends come back
/// (the ends applied at the next timer tick).
pub fn restore(ctx: &Context, dropped: Dropped) {
    if dropped.is_empty() {
        return;
    }
    if with(|s| {
        s.restore(dropped);
        s.ends_pending()
    }) {
        timers::defer(ctx, |d| d.session_ends = true);
    }
}

/// `SWAPDB first second`: bindings follow their holds.
pub fn swapped(first: i32, second: i32) {
    SESSIONS.with(|s| {
        if let Ok(mut s) = s.try_borrow_mut() {
            s.swapped(first, second);
        }
    });
}

/// No longer a master: bindings are forgotten (a replica never writes; holds end with their
/// leases).
pub fn forget() {
    SESSIONS.with(|s| {
        if let Ok(mut s) = s.try_borrow_mut() {
            s.clear();
        }
    });
}
