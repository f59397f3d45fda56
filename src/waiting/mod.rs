//! Server-side waiting: the Redis side of `RLOCK.ACQUIRE ... WAIT`.
//!
//! A waiter is a client blocked with `RedisModule_BlockClient` and queued FIFO per lock
//! ([`Queues`]) with its lock kind's request ([`Request`]). When the lock can be granted, the
//! longest-waiting client becomes a holder in the same event, and only then is it unblocked:
//! exactly one client wakes per grant, and nobody can take the lock in between. One hand-off
//! grants waiters from the head for as long as the kind's rules grant them (one, for a
//! reentrant lock), and stops at the first it cannot grant.
//!
//! How a lock becomes free, and where the hand-off happens:
//! - `RLOCK.RELEASE` to zero, `RLOCK.FORCERELEASE`: inside the command (nothing is published,
//!   the lock never became free);
//! - the holder's lease ends: a timer at the deadline opens the key (Redis expires it), then
//!   hands off ([`timers`]);
//! - `FLUSHALL`/`FLUSHDB`, `SWAPDB`: a server event (`events`) marks the lock and a 0 ms timer
//!   hands off (module code must not write inside those events);
//! - anything else (a Redisson client's unlock script, `DEL`, eviction, a `RENAME`): the same
//!   timer polls every lock with waiters, every [`crate::queue::POLL_MS`] ms in one tick (less
//!   often with many locks: at most [`crate::queue::POLLS_PER_SECOND`] looks a second), and
//!   hands off. The module subscribes to no keyspace event: with one,
//!   Redis would build a module context for every `DEL` and expiry of every key, lock or not.
//!
//! Until the hand-off, any `RLOCK.*` write on the lock hands off first ("settles" it), so no
//! RLOCK client jumps the queue.
//!
//! Timeouts are the module's own (one timer for the earliest event of the schedule), never
//! Redis's: a waiter is decided once, granted or timed out, so a timeout cannot race a grant.
//! A client that leaves while waiting (disconnect, `CLIENT KILL`, `CLIENT UNBLOCK`) leaves its
//! queue at once; one that leaves after being granted but before its reply gets its hold
//! released (deferred to a timer), so no lock stays with a client that is gone.
//!
//! In cluster mode, waiters whose slot moved away are redirected ([`cluster`]).
//!
//! A flush drops the session bindings, pending ends and checks of the databases it empties,
//! set aside for a reload that loads the data back in the same command ([`lifecycle`]).

pub mod cluster;
pub mod deadlock;
mod kinds;
pub mod lifecycle;
pub mod listing;
pub mod promotion;
mod requests;
pub mod session;
mod session_end;
pub mod timers;

pub use kinds::{
    rw_applied, rw_release, sem_give_back, sem_give_back_ids, sem_raised, sem_reclaim,
    sem_reclaim_due, sem_reclaim_keeping, sem_release, sem_release_ids, waiting_in,
    waiting_permits,
};
pub use requests::{dequeue, waits_as};
pub use session_end::apply_pending;

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};

use redis_module::{Context, RedisString};

use crate::args::WaitFor;
use crate::error::LockError;
use crate::queue::{End, Joining, LockName, Queues, Waiter};
use crate::raw::{self, BlockHandler, Blocked};
use crate::replicas;
use crate::rules::{self, Deadline, Kind, Reply, Request};
use crate::sessions::Held;
use crate::store::access::{self, check_publish};
use crate::store::waiters::{self, Head, Stamp};
use crate::store::{self, LockKey, Unlocked};

/// What a blocked waiter is unblocked with; its reply callback turns it into the reply.
#[derive(Debug)]
pub enum Outcome {
    /// It holds the lock as it asked (`request`): reply `reply` (nil, or `[1, token]`).
    /// With leased permits, `ids` (their ids) is the reply.
    /// `stamp` tells this grant apart, should it have to be undone.
    Granted { lock: LockName, request: Request, reply: Reply, ids: Vec<Vec<u8>>, stamp: Stamp },
    /// Its budget ran out: reply `reply` (the holder's remaining lease, or `[0, pttl]`).
    TimedOut(Reply),
    /// A latch awaiter whose latch opened: reply 1 (it holds nothing: nothing to undo).
    Opened,
    /// Reply this error.
    Failed(LockError),
    /// Reply this cluster redirection (`MOVED ...`, `ASK ...`, `CLUSTERDOWN ...`).
    Redirect(String),
}

thread_local! {
    // Redis runs every module callback on its main thread. Borrows of this cell never span a
    // call into Redis that may call back into this module (a key expiring on open fires a
    // keyspace event, say).
    static QUEUES: RefCell<Queues<Blocked, Request>> = RefCell::new(Queues::default());
}

/// Counters for `INFO rlock`.
pub struct Stats {
    pub waits: AtomicU64,
    pub handoffs: AtomicU64,
    pub timeouts: AtomicU64,
    pub left: AtomicU64,
    pub rollbacks: AtomicU64,
    /// Read-write lock checks that removed readers whose every hold lease had ended.
    pub reaps: AtomicU64,
    /// Latches opened by `RLATCH.COUNTDOWN` (to zero) or `RLATCH.DELETE`.
    pub latch_opens: AtomicU64,
    /// Latch awaiters answered 1 because their latch opened (counted apart from hand-offs).
    pub latch_releases: AtomicU64,
    /// Work the module's timer ticks did, in units of `raw::work` and queue entries walked.
    pub timer_work: AtomicU64,
    /// Timer ticks that stopped at their budget (`timers::TICK_BUDGET`), leaving the rest of
    /// their work to the next tick.
    pub ticks_split: AtomicU64,
}

pub static STATS: Stats = Stats {
    waits: AtomicU64::new(0),
    handoffs: AtomicU64::new(0),
    timeouts: AtomicU64::new(0),
    left: AtomicU64::new(0),
    rollbacks: AtomicU64::new(0),
    reaps: AtomicU64::new(0),
    latch_opens: AtomicU64::new(0),
    latch_releases: AtomicU64::new(0),
    timer_work: AtomicU64::new(0),
    ticks_split: AtomicU64::new(0),
};

fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

/// At load: `INFO rlock` starts from zero (a reloaded module may find its old statics and
/// thread-locals: the wait-time buckets live with the queues).
pub fn reset_stats() {
    let counters = [
        &STATS.waits,
        &STATS.handoffs,
        &STATS.timeouts,
        &STATS.left,
        &STATS.rollbacks,
        &STATS.reaps,
        &STATS.latch_opens,
        &STATS.latch_releases,
        &STATS.timer_work,
        &STATS.ticks_split,
    ];
    for counter in counters {
        counter.store(0, Ordering::Relaxed);
    }
    with_queues(Queues::reset_wait_times);
    session::reset();
}

fn with_queues<R>(f: impl FnOnce(&mut Queues<Blocked, Request>) -> R) -> R {
    QUEUES.with(|q| f(&mut q.borrow_mut()))
}

/// How many clients wait, over all locks (counted as waiting when the queues are in use: this is
/// asked from events that may fire inside the module's own work).
pub fn total_waiting() -> usize {
    QUEUES.with(|q| q.try_borrow().map_or(1, |q| q.total()))
}

/// Database `db` (`None`: every database) was flushed: the own checks of its locks go (and the
/// schedule timer with them, when nothing else is scheduled); returns them (lock, when).
pub fn forget_checks(ctx: &Context, db: Option<i32>) -> Vec<(LockName, i64)> {
    let dropped = QUEUES.with(|q| q.try_borrow_mut().map(|mut q| q.drop_checks(db)).ok());
    if dropped.is_some() {
        timers::arm(ctx);
    }
    dropped.unwrap_or_default()
}

/// `SWAPDB first second`: the own checks of the two databases' locks follow their data.
pub fn swap_checks(first: i32, second: i32) {
    QUEUES.with(|q| {
        if let Ok(mut q) = q.try_borrow_mut() {
            q.swap_checks(first, second);
        }
    });
}

/// How many locks have a check of their own scheduled (`INFO rlock`).
pub fn scheduled_checks() -> usize {
    QUEUES.with(|q| q.try_borrow().map_or(0, |q| q.checks()))
}

/// How many timers of this module are armed (schedule, deferred work, cluster sweep).
pub fn timers_armed() -> u64 {
    timers::armed() + u64::from(cluster::sweeping())
}

/// Whether anyone waits for any lock (the fast path of every command).
pub fn anyone_waits() -> bool {
    total_waiting() > 0
}

/// How many clients wait for the lock `key` of database `db` (counted as waiting when the
/// queues are in use).
pub fn waiting(db: i32, key: &[u8]) -> usize {
    QUEUES.with(|q| q.try_borrow().map_or(1, |q| q.waiting(db, key)))
}

/// How many clients wait in the line of the lock `key` of database `db`: those a newcomer must
/// not pass (a latch's awaiters, waiting apart, are in nobody's way; counted as waiting when
/// the queues are in use).
pub fn in_line(db: i32, key: &[u8]) -> usize {
    QUEUES.with(|q| q.try_borrow().map_or(1, |q| q.in_line(db, key)))
}

/// Whether anyone waits for the lock `name` (no allocation: this runs on every RLOCK write).
fn waits_for(ctx: &Context, name: &RedisString) -> bool {
    anyone_waits() && with_queues(|q| q.waiting(raw::selected_db(ctx), name.as_slice()) > 0)
}

/// The lock `name` in the context's selected database.
pub fn lock_name(ctx: &Context, name: &RedisString) -> LockName {
    LockName { db: raw::selected_db(ctx), key: name.as_slice().to_vec() }
}

/// Unblocks a waiter taken out of its queue.
fn unblock(waiter: Waiter<Blocked, Request>, outcome: Outcome) {
    raw::unblock_client::<Waiting>(waiter.handle, Some(outcome));
}

/// Blocks the calling client until it holds the lock or `wait` passes. `holder_pttl`: the
/// current holder's remaining lease (-1: none), when the lock is worth checking again.
pub fn block(ctx: &Context, lock: LockName, request: Request, wait: WaitFor, holder_pttl: i64) {
    block_as(ctx, lock, request, wait, holder_pttl, raw::User::current_name(ctx));
}

/// [`block`], for a command that looked its caller's ACL user name up already (`user`, as
/// [`raw::User::current_name`] gives it).
pub fn block_as(
    ctx: &Context,
    lock: LockName,
    request: Request,
    wait: WaitFor,
    holder_pttl: i64,
    user: Option<Vec<u8>>,
) {
    let bc = raw::block_client::<Waiting>(ctx);
    let now = raw::now_ms();
    let timeout_at = match wait {
        WaitFor::Ever => None,
        WaitFor::Millis(ms) => Some(now.saturating_add(i64::try_from(ms).unwrap_or(i64::MAX))),
    };
    // The tag is unique: the command refused an id already waiting on this lock.
    // A latch's awaiter holds nothing: it waits apart from the line (see [`hand_off`]).
    let joining = Joining {
        user,
        since: now,
        owner: request.owner.clone(),
        tag: request.id.clone(),
        apart: request.kind == Kind::Latch,
    };
    with_queues(|q| {
        q.enqueue(lock.clone(), request, bc, timeout_at, joining);
        let lease_over = (holder_pttl >= 0).then(|| rules::lease_over_at(now, holder_pttl));
        let at = q.look_again_at(now, lease_over);
        q.schedule_lease_check(&lock, at);
    });
    bump(&STATS.waits);
    timers::arm(ctx);
    cluster::watch(ctx);
}

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
            timers::arm(ctx);
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
                timers::arm(ctx);
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
        timers::arm(ctx);
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
                timers::arm(ctx);
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

/// Schedules the next look at a lock whose waiters (if any are left) wait: at `due` (its
/// holder's lease end, if known) or at the next poll, whichever comes first.
fn look_again(lock: &LockName, due: Option<i64>) {
    with_queues(|q| {
        let at = q.look_again_at(raw::now_ms(), due);
        q.schedule_lease_check(lock, at);
    });
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

/// Looks at `lock` at `at` (Unix ms), whether anyone waits for it or not.
pub fn schedule_check(ctx: &Context, lock: &LockName, at: i64) {
    with_queues(|q| q.schedule_check(lock, at));
    timers::arm(ctx);
}

/// At most this many own checks are looked at again at once when a freed lock's check was
/// not under its name ([`forget_check`]).
const RELOOK_AT_MOST: usize = 16;

/// The lock `name` holds nothing a check would look at any more (a read-write lock freed, a
/// semaphore without leases): its own check goes, and the schedule timer with it when nothing
/// else is scheduled. (No allocation when no lock has a check: this runs on RSEM writes.)
///
/// `had_checked_holds`: what was just released had a check (the last read hold, the last
/// leased permit). Found under no name, that check waits under the name the lock had before a
/// `RENAME` or `MOVE` (no keyspace event tells the module), keeping a timer armed and `MODULE
/// UNLOAD` refused until the hold's old deadline: when few checks are scheduled, each is
/// looked at now instead (a live one reschedules itself, a stale one goes).
pub fn forget_check(ctx: &Context, name: &RedisString, had_checked_holds: bool) {
    if scheduled_checks() == 0 {
        return;
    }
    let dropped = with_queues(|q| q.drop_check(&lock_name(ctx, name)));
    if dropped
        || (had_checked_holds && with_queues(|q| q.relook_checks(RELOOK_AT_MOST, raw::now_ms())))
    {
        timers::arm(ctx);
    }
}

/// The blocked-client callbacks of `RLOCK.ACQUIRE ... WAIT` (see [`BlockHandler`]).
pub struct Waiting;

impl BlockHandler for Waiting {
    type Outcome = Outcome;

    fn reply(ctx: &Context, outcome: Option<&Outcome>) {
        if let Some(Outcome::Granted { lock, request, .. }) = outcome {
            let id = request.id.as_deref();
            if id.is_some_and(|id| store::request::says_cancelled(ctx, &lock.key, id)) {
                // Cancelled between its grant and this reply (the cancel gave the grant back):
                // answered as a wait that timed out, never told it holds. The context is the
                // waiter's own client, whose database is the lock's.
                let reply = waiters::not_granted(ctx, &lock.key, request);
                ctx.reply(reply.map(store::to_value).map_err(Into::into));
                return;
            }
        }
        let reply = match outcome {
            Some(Outcome::Granted { ids, .. }) if !ids.is_empty() => {
                ctx.reply(Ok(store::ids_value(ids)));
                return;
            }
            Some(Outcome::Granted { reply, .. } | Outcome::TimedOut(reply)) => Ok(*reply),
            Some(Outcome::Opened) => Ok(Reply::Int(1)),
            Some(Outcome::Failed(e)) => Err((*e).into()),
            Some(Outcome::Redirect(e)) => Err(redis_module::RedisError::String(e.clone())),
            None => Err(LockError::Internal.into()),
        };
        ctx.reply(reply.map(store::to_value));
    }

    fn unblocked_by_command(ctx: &Context, bc: Blocked) {
        let now = raw::now_ms();
        let Some(waiter) =
            with_queues(|q| q.find(bc).and_then(|id| q.remove_as(id, End::Left, Some(now))))
        else {
            // Not ours to answer (already granted or timed out: its reply is on its way).
            return;
        };
        bump(&STATS.left);
        timers::arm(ctx);
        // The context is the waiter's own client, whose database is the lock's.
        let reply = waiters::not_granted(ctx, &waiter.lock.key, &waiter.request);
        ctx.reply(reply.map(store::to_value).map_err(Into::into));
        // Redis unblocks the client itself after this callback; this frees our handle.
        raw::unblock_client::<Self>(bc, None);
    }

    fn client_gone(ctx: &Context, bc: Blocked, outcome: Option<&Outcome>) {
        let now = raw::now_ms();
        if with_queues(|q| q.find(bc).and_then(|id| q.remove_as(id, End::Left, Some(now))))
            .is_some()
        {
            bump(&STATS.left);
            raw::unblock_client::<Self>(bc, None);
            timers::arm(ctx);
            return;
        }
        // Granted, but gone before its reply: the hold must not stay with a client that is gone.
        if let Some(Outcome::Granted { lock, request, ids, stamp, .. }) = outcome {
            bump(&STATS.rollbacks);
            let undo = timers::Undo {
                lock: lock.clone(),
                request: request.clone(),
                ids: ids.clone(),
                stamp: *stamp,
            };
            timers::defer(ctx, |d| d.rollback.push(undo));
        }
    }
}

/// The server became a replica: no lock can be granted here any more; every waiter gets an
/// error, and grants waiting to be undone are left to the new master's data (a replica never
/// writes: their holds end with their leases).
pub fn demoted(ctx: &Context) {
    timers::forget_rollbacks();
    promotion::stop();
    session::forget();
    let now = raw::now_ms();
    for waiter in with_queues(|q| {
        let drained = q.drain();
        for waiter in &drained {
            q.record_wait(waiter.since, now);
        }
        drained
    }) {
        bump(&STATS.left);
        unblock(waiter, Outcome::Failed(LockError::Demoted));
    }
    timers::arm(ctx);
}
