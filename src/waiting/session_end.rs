//! Ending the holds of closed connections, from the module's 0 ms timer (never while writes
//! are paused: the timer waits for the pause's end; never on a replica). Each end is written
//! and replicated as the release would be, its waiters served and the release published; with
//! a lock-delay the ended hold is replaced by a placeholder holder (`sessions::PLACEHOLDER`, or
//! for a leased permit, the permit kept under its id) until the delay ends, so every client,
//! Redisson's included, sees the lock held.
//!
//! ACL: an end is the module's own work, as a lease expiry is: the acquire that bound the hold
//! was checked as its user, who may release its own hold; nothing is checked again (the
//! connection, and so its user, is gone). A hand-off to a waiter afterwards is checked as the
//! waiter's user, as every hand-off is.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

use redis_module::{Context, RedisString};

use super::hand_off::{freed, settle};
use super::kinds::{rw_applied, sem_give_back_ids};
use super::schedule::{schedule_check, Budget};
use super::session::{with, SESSION_STATS};
use super::state::lock_name;
use crate::error::LockError;
use crate::queue::LockName;
use crate::raw;
use crate::rules::{self, Deadline, View};
use crate::rw_rules::{self, Acquired, Mode, Reads, Rest, RwPlan, RwState};
use crate::sessions::{delay_until, permit_placeholder, Binding, Held, Hold, PLACEHOLDER};
use crate::store::rw::RwKey;
use crate::store::sem::Leases;
use crate::store::{LockKey, Unlocked};

/// What ending one hold (or a semaphore's permits) did.
enum EndOf {
    /// Nothing to end: the hold is gone, or is not the one bound (its lease ended).
    Nothing,
    /// One hold ended; `delayed`: a lock-delay followed.
    Hold { delayed: bool },
    /// Several holds of one lock (leased permits of a semaphore, read sides of a read-write
    /// lock): how many ended, and how many of those are delayed.
    Many { ended: u64, delayed: u64 },
}

/// What ending a hold key costs, in units of the tick's budget (`timers::TICK_BUDGET`): the
/// key opened and deleted, the `DEL` propagated, and its lease read first for a lock-delay.
const HOLD_KEY_COST: u64 = 3;

/// What ending one leased permit costs, in units of the tick's budget: its lease read, the
/// permit removed and given back.
const PERMIT_COST: u64 = 4;

/// Ends the holds whose connection closed, while the tick's work budget lasts (a master,
/// writes not paused: the caller checked). The leased permits of one semaphore are given back
/// together, and the read sides of one read-write lock end together (one plan, the lock read
/// once for all of them), as many as the budget allows. Returns whether more wait (the caller
/// ends them at its next tick, the server serving its clients in between).
pub(super) fn end_pending(ctx: &Context, budget: &Budget) -> bool {
    while !budget.spent() {
        let Some((hold, binding)) = with(|s| s.take_ending(1)).pop() else { break };
        end_next(ctx, hold, binding, budget);
    }
    with(|s| s.ends_pending())
}

/// Before a write command reads the lock `name` (the context's database), what is decided for
/// it but not yet applied is applied now, in the order the timer would have applied it: grants
/// to clients that left before their reply are undone, then the holds of closed connections are
/// ended (all of this lock's, whatever they cost: a command must not read any of them as in
/// place). So no command reads a grant whose end is decided as if it were in place (a `REQUEST`
/// retry replaying it, a renewal, a re-entry, a release or a cancel finding it). Done as the
/// module's own work (the end is not the caller's: nothing is checked against its ACL), on a
/// master, also inside a `MULTI` that paused writes (the transaction writes anyway), as Redis's
/// own lazy expiry deletes a key that a command then refuses to use.
pub fn apply_pending(ctx: &Context, name: &RedisString) {
    let ends = super::session::ends_pending();
    let undos = super::schedule::undos_pending();
    if !(ends || undos) || !raw::is_master(ctx) {
        return;
    }
    let lock = lock_name(ctx, name);
    let undos = undos && super::schedule::undo_due(&lock);
    let ends = ends && with(|s| s.ending(&lock));
    if !(ends || undos) {
        return;
    }
    crate::store::module_work(ctx, || {
        if undos {
            super::undo::undo_now(ctx, &lock);
        }
        if ends {
            let budget = Budget::unbounded();
            while let Some((hold, binding)) = with(|s| s.take_ending_of(&lock, 1)).pop() {
                end_next(ctx, hold, binding, &budget);
            }
        }
    });
    // The context's database is the caller's (all of this was of a lock in it).
    let _ = raw::select_db(ctx, lock.db);
}

/// Ends `hold` (of a closed connection), with the other holds of its lock that end together
/// with it (its permits; its read sides, as many as `budget` allows, the rest put back).
fn end_next(ctx: &Context, hold: Hold, binding: Binding, budget: &Budget) {
    let now = raw::now_ms();
    if !raw::select_db(ctx, hold.lock.db) {
        return;
    }
    let name = RedisString::create_from_slice(ctx.get_raw(), &hold.lock.key);
    let ended = match hold.held {
        Held::Permit(id) => {
            // The holds of one lock come together, its permits last.
            let limit = usize::try_from(budget.left() / PERMIT_COST).unwrap_or(usize::MAX);
            let like = |held: &Held| matches!(held, Held::Permit(_));
            let more = with(|s| s.take_ending_like(&hold.lock, like, limit));
            let mut permits = vec![(id, binding)];
            permits.extend(more.into_iter().filter_map(|(hold, binding)| match hold.held {
                Held::Permit(id) => Some((id, binding)),
                _ => None,
            }));
            end_permits(ctx, &name, &permits, now)
        }
        Held::Read(owner) => {
            // Every read side of the lock waiting to end, the budget deciding how many
            // end now (one plan for them all).
            let limit = usize::try_from(budget.left() / HOLD_KEY_COST).unwrap_or(usize::MAX);
            let like = |held: &Held| matches!(held, Held::Read(_));
            let more = with(|s| s.take_ending_like(&hold.lock, like, limit.max(1)));
            let mut sides = vec![(owner, binding)];
            sides.extend(more.into_iter().filter_map(|(hold, binding)| match hold.held {
                Held::Read(owner) => Some((owner, binding)),
                _ => None,
            }));
            end_reads(ctx, &name, &hold.lock, sides, budget, now)
        }
        _ if binding.stale(now) => return,
        Held::Lock(owner) => end_lock(ctx, &name, &owner, binding, now),
        Held::Write(owner) => end_write(ctx, &name, &owner, binding, now),
    };
    let (ended, delayed) = match ended {
        // The name holds another kind of lock now (or something else): not this hold.
        Ok(EndOf::Nothing)
        | Err(LockError::WrongType | LockError::NotAReentrantLock | LockError::NotAnRwLock) => {
            return
        }
        Ok(EndOf::Hold { delayed }) => (1, u64::from(delayed)),
        Ok(EndOf::Many { ended, delayed }) => (ended, delayed),
        Err(e) => {
            ctx.log_warning(&format!(
                "rlock: could not end a session hold whose connection closed (it ends with \
                 its lease): {e}"
            ));
            return;
        }
    };
    SESSION_STATS.ends.fetch_add(ended, Ordering::Relaxed);
    SESSION_STATS.delays.fetch_add(delayed, Ordering::Relaxed);
}

/// A reentrant lock's whole hold by `owner` ends: the lock is freed (handed to its waiters, or
/// the unlock message published), or held by the placeholder until the delay ends.
fn end_lock(
    ctx: &Context,
    name: &RedisString,
    owner: &[u8],
    binding: Binding,
    now: i64,
) -> Result<EndOf, LockError> {
    let owner = RedisString::create_from_slice(ctx.get_raw(), owner);
    let key = LockKey::open(ctx, name, true);
    let view = key.view(Some(&owner))?;
    let View::Held { mine: Some(_), pttl } = view else { return Ok(EndOf::Nothing) };
    let lease_until = (pttl >= 0).then(|| now.saturating_add(pttl));
    key.apply(Some(&owner), &rules::force_release(view));
    drop(key);
    with(|s| s.unbind_lock(&lock_name(ctx, name)));
    let Some(until) = delay_until(now, binding.bind.delay_ms, lease_until) else {
        freed(ctx, name, Unlocked::Lock);
        return Ok(EndOf::Hold { delayed: false });
    };
    let placeholder = RedisString::create_from_slice(ctx.get_raw(), PLACEHOLDER);
    let key = LockKey::open(ctx, name, true);
    key.apply(
        Some(&placeholder),
        &rules::acquire(View::Free, Deadline::at(until), rules::Extend::Set)?,
    );
    drop(key);
    // Its waiters are looked at again when the delay ends.
    settle(ctx, name);
    Ok(EndOf::Hold { delayed: true })
}

/// A read-write lock's write side held by `owner` ends (every re-entry), as its release
/// would; with a delay, the placeholder takes the write side if it can at once (the lock is
/// free).
fn end_write(
    ctx: &Context,
    name: &RedisString,
    owner: &[u8],
    binding: Binding,
    now: i64,
) -> Result<EndOf, LockError> {
    let key = RwKey::open(ctx, name, true);
    let state = key.state()?;
    let holds = key.holds(&state, now)?;
    let plan = rw_rules::end_side(&state, Mode::Write, owner, &holds, now);
    if plan.effects.is_empty() {
        return Ok(EndOf::Nothing);
    }
    let lease_until = state.deadline(now).filter(|&at| at != i64::MAX);
    key.check(&plan)?;
    key.apply(&plan);
    drop(key);
    super::session::rw_applied(ctx, name, &plan);
    let placeholder = delay_until(now, binding.bind.delay_ms, lease_until)
        .and_then(|until| rw_placeholder(ctx, name, Mode::Write, until, now));
    match placeholder {
        Some(placeholder) => {
            rw_applied(ctx, name, &placeholder);
            settle(ctx, name);
            Ok(EndOf::Hold { delayed: true })
        }
        None => {
            rw_applied(ctx, name, &plan);
            Ok(EndOf::Hold { delayed: false })
        }
    }
}

/// The read sides of `sides`' owners on the read-write lock `name` end (every read hold of
/// each), in one plan: as many as `budget` allows (at least one), the others put back to end at
/// the next tick. Only their own fields and hold keys are read and written, whatever the
/// number of other readers; the batch that ends the lock's last waiting side also settles it
/// as a release does (dead readers leave, the lease is recomputed from the readers that stay,
/// their holds read once). With a delay, the placeholder takes a read hold for each delayed
/// side, until its delay ends, before the lock can be freed. A stale binding (the hold's lease
/// ended) ends nothing.
fn end_reads(
    ctx: &Context,
    name: &RedisString,
    lock: &LockName,
    sides: Vec<(Vec<u8>, Binding)>,
    budget: &Budget,
    now: i64,
) -> Result<EndOf, LockError> {
    let mut sides: Vec<(Vec<u8>, Binding)> =
        sides.into_iter().filter(|(_, binding)| !binding.stale(now)).collect();
    if sides.is_empty() {
        return Ok(EndOf::Nothing);
    }
    let key = RwKey::open(ctx, name, true);
    let owners: Vec<Vec<u8>> = sides.iter().map(|(owner, _)| owner.clone()).collect();
    let (mine, fields) = key.state_of_readers(&owners)?;
    // As many sides as the budget allows, by their hold keys.
    let mut cost = 0u64;
    let mut taken = 0;
    for (owner, _) in &sides {
        let next = cost.saturating_add(mine.reads_of(owner).max(1).saturating_mul(HOLD_KEY_COST));
        if taken > 0 && next > budget.left() {
            break;
        }
        cost = next;
        taken += 1;
    }
    let later = sides.split_off(taken);
    let last = later.is_empty();
    with(|s| {
        s.put_back(later.into_iter().map(|(owner, binding)| {
            (Hold { lock: lock.clone(), held: Held::Read(owner) }, binding)
        }));
    });
    let ending: Vec<Vec<u8>> = sides.iter().map(|(owner, _)| owner.clone()).collect();
    // A delayed side's lock-delay is bounded by its own holds' lease: read before they go.
    let mut delays = Vec::new();
    for (owner, binding) in &sides {
        if binding.bind.delay_ms == 0 || mine.reads_of(owner) == 0 {
            continue;
        }
        let own = RwState {
            readers: [(owner.clone(), mine.reads_of(owner))].into(),
            ..RwState::default()
        };
        let holds = key.holds(&own, now)?;
        let lease_until =
            holds.get(owner).and_then(|h| h.values().copied().max()).filter(|&at| at != i64::MAX);
        delays.extend(delay_until(now, binding.bind.delay_ms, lease_until));
    }
    let plan = if last {
        // The last batch: settled with the whole hash and the holds of the readers that stay.
        let state = key.state()?;
        let mut staying = state.clone();
        for owner in &ending {
            staying.readers.remove(owner);
        }
        let holds = key.holds(&staying, now)?;
        rw_rules::end_reads(&state, &ending, Rest::Holds(&holds), now)
    } else {
        let dropped = ending.iter().filter(|o| mine.reads_of(o) > 0).count();
        // Besides `mode` and the sides that end: another reader, a writer.
        let others = fields.saturating_sub(1 + dropped) > 0;
        rw_rules::end_reads(&mine, &ending, Rest::Others(others), now)
    };
    if plan.effects.is_empty() {
        return Ok(EndOf::Nothing);
    }
    key.check(&plan)?;
    key.apply(&plan);
    drop(key);
    super::session::rw_applied(ctx, name, &plan);
    let ended = ending.iter().filter(|owner| mine.reads_of(owner) > 0).count();
    let placeholders: Vec<RwPlan> = delays
        .into_iter()
        .filter_map(|until| rw_placeholder(ctx, name, Mode::Read, until, now))
        .collect();
    if placeholders.is_empty() {
        rw_applied(ctx, name, &plan);
    } else {
        for placeholder in &placeholders {
            rw_applied(ctx, name, placeholder);
        }
        settle(ctx, name);
    }
    let count = |n: usize| u64::try_from(n).unwrap_or(u64::MAX);
    Ok(EndOf::Many { ended: count(ended), delayed: count(placeholders.len()) })
}

/// The placeholder takes `side` of the read-write lock `name` until `until`, if it can be
/// granted at once; its plan, applied.
fn rw_placeholder(
    ctx: &Context,
    name: &RedisString,
    side: Mode,
    until: i64,
    now: i64,
) -> Option<RwPlan> {
    let key = RwKey::open(ctx, name, true);
    let state = key.state_of(Some(PLACEHOLDER)).ok()?;
    let acquired =
        rw_rules::acquire(&state, side, PLACEHOLDER, now, Deadline::at(until), false, Reads::Set)
            .ok()?;
    let Acquired::Granted(plan) = acquired else { return None };
    key.check(&plan).ok()?;
    key.apply(&plan);
    Some(plan)
}

/// Leased permits of the semaphore `name` end: those without a delay come back together (its
/// waiters served, the count published once), each delayed one is leased under a placeholder
/// member (`sessions::permit_placeholder`) until its delay ends, when its reclaim brings it
/// back; its own id is gone at once. A permit whose lease ended (or whose binding
/// is stale) is left to its reclaim.
fn end_permits(
    ctx: &Context,
    name: &RedisString,
    permits: &[(Vec<u8>, Binding)],
    now: i64,
) -> Result<EndOf, LockError> {
    let leases = Leases::of(ctx, name)?;
    let ids: Vec<&[u8]> = permits.iter().map(|(id, _)| id.as_slice()).collect();
    let scores = leases.scores(ctx, &ids)?;
    let mut back: Vec<&[u8]> = Vec::new();
    // Delay end -> the permits held by a placeholder until then.
    let mut moved: BTreeMap<i64, Vec<&[u8]>> = BTreeMap::new();
    let mut delayed: Vec<&[u8]> = Vec::new();
    for ((id, binding), score) in permits.iter().zip(scores) {
        let Some(lease_until) = score.filter(|&at| at > now && !binding.stale(now)) else {
            continue;
        };
        match delay_until(now, binding.bind.delay_ms, Some(lease_until)) {
            None => back.push(id),
            Some(until) => {
                moved.entry(until).or_default().push(id);
                delayed.push(id);
            }
        }
    }
    // A delayed permit leaves its id: the id's grant ended (a `REQUEST` retry must not replay
    // it, `RSEM.RENEW` must not revive it, a cancel finds nothing to give back), and a
    // placeholder member holds the permit until the delay's end, when it comes back as any
    // ended lease does.
    if !delayed.is_empty() {
        leases.remove(ctx, &delayed)?;
    }
    for (until, ids) in &moved {
        let placeholders: Vec<Vec<u8>> = ids.iter().map(|id| permit_placeholder(id)).collect();
        let refs: Vec<&[u8]> = placeholders.iter().map(Vec::as_slice).collect();
        leases.lease(ctx, &refs, *until)?;
    }
    if let Some(&first) = moved.keys().next() {
        schedule_check(ctx, &lock_name(ctx, name), Deadline::at(first).over_at());
    }
    let lock = lock_name(ctx, name);
    with(|s| {
        for id in &delayed {
            s.unbind(&Hold { lock: lock.clone(), held: Held::Permit(id.to_vec()) });
        }
    });
    if !back.is_empty() {
        sem_give_back_ids(ctx, name, &back)?;
    }
    let count = |ids: &[&[u8]]| u64::try_from(ids.len()).unwrap_or(u64::MAX);
    let delays = count(&delayed);
    Ok(EndOf::Many { ended: count(&back).saturating_add(delays), delayed: delays })
}
