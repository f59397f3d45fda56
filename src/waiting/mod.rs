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
//! - `DEL`, eviction, Redis's own expiry, `FLUSHALL`/`FLUSHDB`, `SWAPDB`: a keyspace or server
//!   event (`events`) marks the lock and a 0 ms timer hands off (module code must not write
//!   inside those events); until then, any `RLOCK.*` write on the lock hands off first
//!   ("settles" it), so no RLOCK client jumps the queue.
//!
//! Timeouts are the module's own (one timer for the earliest event of the schedule), never
//! Redis's: a waiter is decided once, granted or timed out, so a timeout cannot race a grant.
//! A client that leaves while waiting (disconnect, `CLIENT KILL`, `CLIENT UNBLOCK`) leaves its
//! queue at once; one that leaves after being granted but before its reply gets its hold
//! released (deferred to a timer), so no lock stays with a client that is gone.
//!
//! In cluster mode, waiters whose slot moved away are redirected ([`cluster`]).

pub mod cluster;
pub mod timers;

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};

use redis_module::{Context, RedisString};

use crate::args::WaitFor;
use crate::error::LockError;
use crate::queue::{LockName, Queues, Waiter};
use crate::raw::{self, BlockHandler, Blocked};
use crate::replicas;
use crate::rules::{self, Deadline, Reply, Request};
use crate::store::access::check_publish;
use crate::store::derived::TokenCounter;
use crate::store::{self, LockKey};

/// What a blocked waiter is unblocked with; its reply callback turns it into the reply.
#[derive(Debug)]
pub enum Outcome {
    /// It holds the lock: reply nil, or `[1, token]` if it asked for a fencing token.
    Granted { lock: LockName, owner: Vec<u8>, token: Option<u64> },
    /// Its budget ran out: reply the holder's remaining lease (`[0, pttl]` with TOKEN).
    TimedOut { pttl: i64, token: bool },
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
}

pub static STATS: Stats = Stats {
    waits: AtomicU64::new(0),
    handoffs: AtomicU64::new(0),
    timeouts: AtomicU64::new(0),
    left: AtomicU64::new(0),
    rollbacks: AtomicU64::new(0),
};

fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

/// At load: `INFO rlock` starts from zero (a reloaded module may find its old statics).
pub fn reset_stats() {
    for counter in [&STATS.waits, &STATS.handoffs, &STATS.timeouts, &STATS.left, &STATS.rollbacks] {
        counter.store(0, Ordering::Relaxed);
    }
}

fn with_queues<R>(f: impl FnOnce(&mut Queues<Blocked, Request>) -> R) -> R {
    QUEUES.with(|q| f(&mut q.borrow_mut()))
}

/// How many clients wait, over all locks (counted as waiting when the queues are in use: this is
/// asked from events that may fire inside the module's own work).
pub fn total_waiting() -> usize {
    QUEUES.with(|q| q.try_borrow().map_or(1, |q| q.total()))
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
    let bc = raw::block_client::<Waiting>(ctx);
    let now = raw::now_ms();
    let timeout_at = match wait {
        WaitFor::Ever => None,
        WaitFor::Millis(ms) => Some(now.saturating_add(i64::try_from(ms).unwrap_or(i64::MAX))),
    };
    with_queues(|q| {
        q.push(lock.clone(), request, bc, timeout_at);
        if holder_pttl >= 0 {
            q.schedule_lease_check(&lock, rules::lease_over_at(now, holder_pttl));
        }
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

/// A command or timer freed the lock `name`: it goes to its waiters, or (nobody can take it)
/// the unlock message is published.
pub fn freed(ctx: &Context, name: &RedisString) {
    if !hand_off(ctx, name) {
        store::publish_unlock(ctx, name);
    }
}

/// Grants the lock to waiters from the head of its queue while its rules allow; returns whether
/// anyone was granted. Writes and replicates each grant as that client's hold, then unblocks
/// the client.
///
/// A waiter that asked for a fencing token and cannot get one (the counter is corrupt or full,
/// or an `allkeys-*` policy is in force) gets that error and the next waiter is tried: nothing
/// is granted with an error reply. Never writes while writes are paused (timers check first),
/// on a replica, or on a master that lost its replicas (the waiters stay queued; the replica
/// check that finds them in sync again settles every lock, see `events::on_cron`).
pub fn hand_off(ctx: &Context, name: &RedisString) -> bool {
    if !waits_for(ctx, name) || !raw::is_master(ctx) || raw::writes_paused() {
        return false;
    }
    if replicas::may_grant(raw::now_ms()).is_err() {
        return false;
    }
    let lock = &lock_name(ctx, name);
    let mut granted = false;
    let mut checked_slot = false;
    loop {
        let head = with_queues(|q| {
            q.head(lock.db, &lock.key)
                .map(|w| (w.id, RedisString::create_from_slice(ctx.get_raw(), &w.request.owner)))
        });
        let Some((id, owner)) = head else { return granted };
        let key = LockKey::open(ctx, name, true);
        let Ok(view) = key.view(Some(&owner)) else { return granted };
        let now = raw::now_ms();
        let plan = with_queues(|q| q.get(id).and_then(|w| w.request.grant(view, now)));
        let Some(plan) = plan else {
            // The head cannot be granted yet: look again when the holder's lease ends.
            if let rules::View::Held { pttl, .. } = view {
                if pttl >= 0 {
                    with_queues(|q| q.schedule_lease_check(lock, rules::lease_over_at(now, pttl)));
                    timers::arm(ctx);
                }
            }
            return granted;
        };
        if !checked_slot {
            checked_slot = true;
            if let Some(redirect) = cluster::redirect(ctx, &lock.key, false) {
                // The slot left this node: its waiters must ask the node that has it now.
                drop(key);
                cluster::redirect_all(lock, &redirect);
                return granted;
            }
        }
        let Some(waiter) = with_queues(|q| q.remove(id)) else { return granted };
        // Everything that can refuse is checked before the grant is written.
        let token = match waiter.request.token.then(|| next_token(ctx, name)).transpose() {
            Ok(token) => token,
            Err(e) => {
                drop(key);
                bump(&STATS.left);
                unblock(waiter, Outcome::Failed(e));
                continue;
            }
        };
        key.apply(Some(&owner), &plan);
        drop(key);
        let token = token.map(|(counter, token)| {
            counter.store(ctx, token);
            token
        });
        let exclusive = waiter.request.exclusive();
        let owner = waiter.request.owner.clone();
        unblock(waiter, Outcome::Granted { lock: lock.clone(), owner, token });
        bump(&STATS.handoffs);
        granted = true;
        if let Some(deadline) = plan.expire_at {
            with_queues(|q| q.schedule_lease_check(lock, deadline.over_at()));
            timers::arm(ctx);
        }
        if exclusive {
            return true;
        }
    }
}

/// The counter and the next token of a grant made by a hand-off, checked, nothing written.
fn next_token(ctx: &Context, name: &RedisString) -> Result<(TokenCounter, u64), LockError> {
    let counter = TokenCounter::for_grant(ctx, name)?;
    let token = counter.next(ctx)?;
    Ok((counter, token))
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
    settle(ctx, name);
    let key = LockKey::open(ctx, name, true);
    let plan = rules::release(key.view(Some(owner))?, deadline);
    check_publish(ctx, name, plan.publish)?;
    let freed_it = key.apply(Some(owner), &plan);
    drop(key);
    if freed_it {
        freed(ctx, name);
    }
    Ok(plan.reply)
}

/// What a wait that ends without a grant replies, read in the context's selected database: the
/// holder's remaining lease (-1: no expiry), as a busy `RLOCK.ACQUIRE`; 0 when nobody holds it
/// at this instant but it could not be granted (writes paused): retry at once; `WRONGTYPE` when
/// the key now holds something else.
fn holder_pttl(ctx: &Context, lock: &LockName) -> Result<i64, LockError> {
    let name = RedisString::create_from_slice(ctx.get_raw(), &lock.key);
    match LockKey::open(ctx, &name, false).view(None)? {
        rules::View::Held { pttl, .. } => Ok(pttl),
        rules::View::Free => Ok(0),
    }
}

/// The blocked-client callbacks of `RLOCK.ACQUIRE ... WAIT` (see [`BlockHandler`]).
pub struct Waiting;

impl BlockHandler for Waiting {
    type Outcome = Outcome;

    fn reply(ctx: &Context, outcome: Option<&Outcome>) {
        let reply = match outcome {
            Some(Outcome::Granted { token, .. }) => Ok(rules::granted(*token)),
            Some(Outcome::TimedOut { pttl, token }) => Ok(rules::busy(*pttl, *token)),
            Some(Outcome::Failed(e)) => Err((*e).into()),
            Some(Outcome::Redirect(e)) => Err(redis_module::RedisError::String(e.clone())),
            None => Err(LockError::Internal.into()),
        };
        ctx.reply(reply.map(store::to_value));
    }

    fn unblocked_by_command(ctx: &Context, bc: Blocked) {
        let Some(waiter) = with_queues(|q| q.find(bc).and_then(|id| q.remove(id))) else {
            // Not ours to answer (already granted or timed out: its reply is on its way).
            return;
        };
        bump(&STATS.left);
        timers::arm(ctx);
        // The context is the waiter's own client, whose database is the lock's.
        let reply = holder_pttl(ctx, &waiter.lock)
            .map(|pttl| store::to_value(rules::busy(pttl, waiter.request.token)));
        ctx.reply(reply.map_err(Into::into));
        // Redis unblocks the client itself after this callback; this frees our handle.
        raw::unblock_client::<Self>(bc, None);
    }

    fn client_gone(ctx: &Context, bc: Blocked, outcome: Option<&Outcome>) {
        if with_queues(|q| q.find(bc).and_then(|id| q.remove(id))).is_some() {
            bump(&STATS.left);
            raw::unblock_client::<Self>(bc, None);
            timers::arm(ctx);
            return;
        }
        // Granted, but gone before its reply: the hold must not stay with a client that is gone.
        if let Some(Outcome::Granted { lock, owner, .. }) = outcome {
            bump(&STATS.rollbacks);
            timers::defer(ctx, |d| d.rollback.push((lock.clone(), owner.clone())));
        }
    }
}

/// The server became a replica: no lock can be granted here any more; every waiter gets an
/// error.
pub fn demoted(ctx: &Context) {
    for waiter in with_queues(Queues::drain) {
        bump(&STATS.left);
        unblock(waiter, Outcome::Failed(LockError::Demoted));
    }
    timers::arm(ctx);
}
