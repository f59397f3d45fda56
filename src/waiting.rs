//! Server-side waiting: the Redis side of `RLOCK.ACQUIRE ... WAIT`.
//!
//! A waiter is a client blocked with `RedisModule_BlockClient` and queued FIFO per lock
//! ([`Queues`]). When the lock becomes free, the longest-waiting client becomes the holder (count
//! 1, its own lease) in the same event, and only then is it unblocked: exactly one client wakes
//! per hand-off, and nobody can take the lock in between.
//!
//! How a lock becomes free, and where the hand-off happens:
//! - `RLOCK.RELEASE` to zero, `RLOCK.FORCERELEASE`: inside the command (nothing is published,
//!   the lock never became free);
//! - the holder's lease ends: a timer at the deadline opens the key (Redis expires it), then
//!   hands off;
//! - `DEL`, eviction, Redis's own expiry, `FLUSHALL`/`FLUSHDB`: a keyspace or flush event marks
//!   the lock and a 0 ms timer hands off (module code must not write inside those events);
//!   until then, any `RLOCK.*` write on the lock hands off first ("settles" it), so no RLOCK
//!   client jumps the queue.
//!
//! Timeouts are the module's own (one timer for the earliest event of the schedule), never
//! Redis's: a waiter is decided once, granted or timed out, so a timeout cannot race a grant.
//! A client that leaves while waiting (disconnect, `CLIENT KILL`, `CLIENT UNBLOCK`) leaves its
//! queue at once; one that leaves after being granted but before its reply gets its hold
//! released (deferred to a timer), so no lock stays with a client that is gone.

use std::cell::{Cell, RefCell};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use redis_module::raw::RedisModuleTimerID;
use redis_module::server_events::{FlushSubevent, ServerRole};
use redis_module::{Context, InfoContext, NotifyEvent, RedisResult, RedisString, RedisValue};

use crate::args::{Lease, WaitFor};
use crate::error::LockError;
use crate::queue::{Event, LockName, Queues, Waiter, WaiterId};
use crate::raw::{self, Blocked, KeyKind, LockKey};
use crate::rules::{Deadline, Plan, Reply, Write};

/// What a blocked waiter is unblocked with; its reply callback turns it into the reply.
#[derive(Debug)]
pub enum Outcome {
    /// It holds the lock: reply nil, or `[1, token]` if it asked for a fencing token.
    Granted { lock: LockName, owner: Vec<u8>, token: Option<Option<u64>> },
    /// Its budget ran out: reply the holder's remaining lease (`[0, pttl]` with TOKEN).
    TimedOut { pttl: i64, token: bool },
    /// Reply this error.
    Failed(LockError),
    /// Reply this cluster redirection (`MOVED ...`, `ASK ...`, `CLUSTERDOWN ...`).
    Redirect(String),
}

thread_local! {
    // Redis runs every module callback on its main thread. Borrows of these cells never span a
    // call into Redis, which may call back into this module (a key expiring on open fires a
    // keyspace event, say).
    static QUEUES: RefCell<Queues<Blocked>> = RefCell::new(Queues::default());
    /// The armed schedule timer: when it fires, and its id.
    static TIMER: Cell<Option<(i64, RedisModuleTimerID)>> = const { Cell::new(None) };
    static DEFERRED: RefCell<Deferred> = RefCell::new(Deferred::default());
    /// Set while a timer of this module runs (no client command is being executed).
    static IN_TIMER: Cell<bool> = const { Cell::new(false) };
    /// Whether the cluster sweep timer is armed.
    static SWEEPING: Cell<bool> = const { Cell::new(false) };
}

/// Whether the module is running a timer rather than a client's command.
pub fn outside_command() -> bool {
    IN_TIMER.get()
}

/// Runs a timer's work, marked as outside any command, a panic logged instead of unwinding.
fn timer_work(ctx: &Context, work: impl FnOnce()) {
    IN_TIMER.set(true);
    raw::guard_callback(ctx, work);
    IN_TIMER.set(false);
}

/// Work that events may not do themselves, done on a 0 ms timer.
#[derive(Default)]
struct Deferred {
    armed: bool,
    /// Locks to hand off if free.
    settle: Vec<LockName>,
    /// Every lock with waiters (after a flush).
    settle_all: bool,
    /// Holds granted to clients that left before their reply: release them.
    rollback: Vec<(LockName, Vec<u8>)>,
}

/// Counters for `INFO rlock`.
struct Stats {
    waiting: AtomicU64,
    waits: AtomicU64,
    handoffs: AtomicU64,
    timeouts: AtomicU64,
    left: AtomicU64,
    rollbacks: AtomicU64,
}

static STATS: Stats = Stats {
    waiting: AtomicU64::new(0),
    waits: AtomicU64::new(0),
    handoffs: AtomicU64::new(0),
    timeouts: AtomicU64::new(0),
    left: AtomicU64::new(0),
    rollbacks: AtomicU64::new(0),
};

fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

fn with_queues<R>(f: impl FnOnce(&mut Queues<Blocked>) -> R) -> R {
    QUEUES.with(|q| f(&mut q.borrow_mut()))
}

/// Takes a waiter out of the queues and the waiting count.
fn take(
    f: impl FnOnce(&mut Queues<Blocked>) -> Option<Waiter<Blocked>>,
) -> Option<Waiter<Blocked>> {
    let waiter = with_queues(f);
    if waiter.is_some() {
        STATS.waiting.fetch_sub(1, Ordering::Relaxed);
    }
    waiter
}

/// Whether anyone waits for any lock (one atomic load: the fast path of every command).
fn anyone_waits() -> bool {
    STATS.waiting.load(Ordering::Relaxed) > 0
}

/// How many clients wait for the lock `key` of database `db`.
pub fn waiting(db: i32, key: &[u8]) -> usize {
    if !anyone_waits() {
        return 0;
    }
    with_queues(|q| q.waiting(db, key))
}

/// What a blocking `RLOCK.ACQUIRE` asked for.
pub struct WaitRequest<'a> {
    pub owner: &'a [u8],
    pub lease: Lease,
    pub wait: WaitFor,
    /// It asked for a fencing token (`TOKEN`).
    pub token: bool,
}

/// Blocks the calling client until it holds the lock or `wait` passes. `holder_pttl`: the
/// current holder's remaining lease (-1: none), when the lock is worth checking again.
pub fn block(ctx: &Context, lock: LockName, request: &WaitRequest<'_>, holder_pttl: i64) {
    let WaitRequest { owner, lease, wait, token } = *request;
    let bc = raw::block_client(ctx);
    let now = raw::now_ms();
    let timeout_at = match wait {
        WaitFor::Ever => None,
        WaitFor::Millis(ms) => Some(now.saturating_add(i64::try_from(ms).unwrap_or(i64::MAX))),
    };
    with_queues(|q| {
        q.push(lock.clone(), owner.to_vec(), lease, token, bc, timeout_at);
        if holder_pttl >= 0 {
            q.schedule_lease_check(&lock, lease_end(now, holder_pttl));
        }
    });
    bump(&STATS.waiting);
    bump(&STATS.waits);
    arm(ctx);
    if raw::in_cluster(ctx) && !SWEEPING.get() {
        SWEEPING.set(true);
        ctx.create_timer(CLUSTER_SWEEP, sweep_cluster, ());
    }
}

/// How often waiters are checked against slot moves in cluster mode.
const CLUSTER_SWEEP: Duration = Duration::from_millis(200);

/// In cluster mode: the redirection for a client waiting on `key` when this node cannot grant
/// it (`key_here`: the key exists on this node), or `None`.
fn cluster_redirect(ctx: &Context, key: &[u8], key_here: bool) -> Option<String> {
    if !raw::in_cluster(ctx) {
        return None;
    }
    cluster_view(ctx)?.redirect(crate::cluster::key_slot(key), key_here)
}

/// This node's view of the cluster (`CLUSTER NODES`); `None` if it cannot be read.
fn cluster_view(ctx: &Context) -> Option<crate::cluster::ClusterView> {
    use redis_module::{CallOptionsBuilder, CallReply, CallResult};
    let reply: CallResult = ctx.call_ext("CLUSTER", &CallOptionsBuilder::new().build(), &["NODES"]);
    match reply {
        Ok(CallReply::String(s)) => {
            Some(crate::cluster::ClusterView::parse(&String::from_utf8_lossy(s.as_bytes())))
        }
        Ok(CallReply::VerbatimString(s)) => {
            let (_, text) = s.to_parts()?;
            Some(crate::cluster::ClusterView::parse(&String::from_utf8_lossy(&text)))
        }
        _ => None,
    }
}

/// Unblocks every client waiting for `lock` with `redirect`.
fn redirect_all(lock: &LockName, redirect: &str) {
    while let Some(waiter) = take(|q| q.pop_head(lock.db, &lock.key)) {
        bump(&STATS.left);
        raw::unblock_client(waiter.handle, Some(Outcome::Redirect(redirect.to_owned())));
    }
}

/// Cluster mode: every few hundred ms while clients wait, sends the waiters of locks whose
/// slot left this node to the node that has it, so no waiter hangs on a slot moved away.
fn sweep_cluster(ctx: &Context, (): ()) {
    timer_work(ctx, || {
        if !anyone_waits() {
            return;
        }
        let Some(view) = cluster_view(ctx) else { return };
        for lock in with_queues(|q| q.locks()) {
            let slot = crate::cluster::key_slot(&lock.key);
            if matches!(view.slot_state(slot), crate::cluster::SlotState::Mine) {
                continue;
            }
            let key_here = raw::select_db(ctx, lock.db) && {
                let name = RedisString::create_from_slice(ctx.get_raw(), &lock.key);
                LockKey::open(ctx, &name, false).kind() != KeyKind::Empty
            };
            if let Some(redirect) = view.redirect(slot, key_here) {
                redirect_all(&lock, &redirect);
            }
        }
        arm(ctx);
    });
    if anyone_waits() {
        ctx.create_timer(CLUSTER_SWEEP, sweep_cluster, ());
    } else {
        SWEEPING.set(false);
    }
}

/// When a lease of `pttl` ms left at `now` is over: Redis expires a key once now > deadline.
const fn lease_end(now: i64, pttl: i64) -> i64 {
    now.saturating_add(pttl).saturating_add(1)
}

/// Hands a free lock to its longest-waiting client, or (when held) makes sure it is checked
/// again at its holder's deadline. Called on every RLOCK write to a lock, before the command's
/// own rules, so no newcomer takes a lock that waiters are owed.
pub fn settle(ctx: &Context, key: &LockKey, name: &RedisString) {
    if !waits_for(ctx, name) {
        return;
    }
    match key.kind() {
        KeyKind::Empty => {
            hand_off(ctx, key, name);
        }
        KeyKind::Hash => {
            let pttl = key.pttl();
            if pttl >= 0 {
                let lock = lock_name(ctx, name);
                let at = lease_end(raw::now_ms(), pttl);
                with_queues(|q| q.schedule_lease_check(&lock, at));
                arm(ctx);
            }
        }
        KeyKind::Other | KeyKind::String => {}
    }
}

/// Whether anyone waits for the lock `name` (no allocation: this runs on every RLOCK write).
fn waits_for(ctx: &Context, name: &RedisString) -> bool {
    anyone_waits() && with_queues(|q| q.waiting(raw::selected_db(ctx), name.as_slice()) > 0)
}

/// The lock `name` in the context's selected database.
pub fn lock_name(ctx: &Context, name: &RedisString) -> LockName {
    LockName { db: raw::selected_db(ctx), key: name.as_slice().to_vec() }
}

/// Grants the free lock (the key is empty) to its longest-waiting client, if any: writes and
/// replicates it as that client's lock, then unblocks the client. Returns whether it did.
pub fn hand_off(ctx: &Context, key: &LockKey, name: &RedisString) -> bool {
    if !waits_for(ctx, name) || !raw::is_master(ctx) {
        return false;
    }
    let lock = &lock_name(ctx, name);
    if let Some(redirect) = cluster_redirect(ctx, &lock.key, false) {
        // The slot left this node: its waiters must ask the node that has it now.
        redirect_all(lock, &redirect);
        return false;
    }
    let Some(waiter) = take(|q| q.pop_head(lock.db, &lock.key)) else {
        return false;
    };
    let now = raw::now_ms();
    let deadline = Deadline::after(now, waiter.lease).unwrap_or(Deadline::LAST);
    let owner = RedisString::create_from_slice(ctx.get_raw(), &waiter.owner);
    let grant = Plan {
        write: Write::SetCount(1),
        expire_at: Some(deadline),
        publish: false,
        reply: Reply::Nil,
    };
    crate::commands::execute(ctx, key, name, Some(&owner), &grant);
    // A waiter that asked for a fencing token gets the next one (none if the counter is bad:
    // the grant stands, the reply says `[1, nil]`).
    let token = waiter
        .token
        .then(|| crate::commands::Fencing::open(ctx, name).and_then(|f| f.next(ctx)).ok());
    raw::unblock_client(
        waiter.handle,
        Some(Outcome::Granted { lock: lock.clone(), owner: waiter.owner, token }),
    );
    bump(&STATS.handoffs);
    with_queues(|q| q.schedule_lease_check(lock, deadline.unix_ms().saturating_add(1)));
    arm(ctx);
    true
}

/// The reply of a client this module unblocked.
pub fn reply(ctx: &Context, outcome: Option<&Outcome>) {
    let result: RedisResult = match outcome {
        Some(Outcome::Granted { token: None, .. }) => Ok(RedisValue::Null),
        Some(Outcome::Granted { token: Some(token), .. }) => {
            Ok(crate::commands::token_reply(*token))
        }
        Some(Outcome::TimedOut { pttl, token: false }) => Ok(RedisValue::Integer(*pttl)),
        Some(Outcome::TimedOut { pttl, token: true }) => Ok(crate::commands::busy_reply(*pttl)),
        Some(Outcome::Failed(e)) => Err((*e).into()),
        Some(Outcome::Redirect(e)) => Err(redis_module::RedisError::String(e.clone())),
        None => Err(LockError::Internal.into()),
    };
    ctx.reply(result);
}

/// `CLIENT UNBLOCK <id> [TIMEOUT]` on a waiter: it leaves its queue and gets the timeout reply.
pub fn unblocked_by_command(ctx: &Context, bc: Blocked) {
    let Some(waiter) = take(|q| q.find(bc).and_then(|id| q.remove(id))) else {
        // Not ours to answer (already granted or timed out: its reply is on its way).
        return;
    };
    bump(&STATS.left);
    arm(ctx);
    let pttl = holder_pttl(ctx, &waiter.lock);
    let reply =
        if waiter.token { crate::commands::busy_reply(pttl) } else { RedisValue::Integer(pttl) };
    ctx.reply(Ok(reply));
    // Redis unblocks the client itself after this callback; this frees our handle.
    raw::unblock_client(bc, None);
}

/// A blocked client left (disconnected, killed, `CLIENT UNBLOCK ... ERROR`).
pub fn client_gone(ctx: &Context, bc: Blocked, outcome: Option<&Outcome>) {
    if take(|q| q.find(bc).and_then(|id| q.remove(id))).is_some() {
        bump(&STATS.left);
        raw::unblock_client(bc, None);
        arm(ctx);
        return;
    }
    // Granted, but gone before its reply: the hold must not stay with a client that is gone.
    if let Some(Outcome::Granted { lock, owner, .. }) = outcome {
        bump(&STATS.rollbacks);
        defer(ctx, |d| d.rollback.push((lock.clone(), owner.clone())));
    }
}

/// The remaining lease of the lock's holder (-2: none), read in the context's own database.
fn holder_pttl(ctx: &Context, lock: &LockName) -> i64 {
    let name = RedisString::create_from_slice(ctx.get_raw(), &lock.key);
    let key = LockKey::open(ctx, &name, false);
    match key.kind() {
        KeyKind::Hash => key.pttl(),
        KeyKind::Empty | KeyKind::Other | KeyKind::String => -2,
    }
}

/// Keyspace events (in the `redis_module!` table): a lock with waiters that was deleted,
/// expired or evicted is handed off on a 0 ms timer.
pub fn on_keyspace_event(ctx: &Context, _event: NotifyEvent, _name: &str, key: &[u8]) {
    if !anyone_waits() {
        return;
    }
    let db = raw::selected_db(ctx);
    // If the queues are borrowed, this event fired inside the module's own work: settle anyway.
    let queued = QUEUES.with(|q| q.try_borrow().map_or(true, |q| q.waiting(db, key) > 0));
    if queued {
        defer(ctx, |d| d.settle.push(LockName { db, key: key.to_vec() }));
    }
}

#[linkme::distributed_slice(redis_module::server_events::FLUSH_SERVER_EVENTS_LIST)]
fn on_flush(ctx: &Context, subevent: FlushSubevent) {
    if subevent == FlushSubevent::Ended && anyone_waits() {
        defer(ctx, |d| d.settle_all = true);
    }
}

/// Demoted to a replica: no lock can be granted here any more; every waiter gets an error.
#[linkme::distributed_slice(redis_module::server_events::ROLE_CHANGED_SERVER_EVENTS_LIST)]
fn on_role_changed(ctx: &Context, role: ServerRole) {
    raw::note_replication();
    if role != ServerRole::Replica {
        return;
    }
    for waiter in with_queues(Queues::drain) {
        STATS.waiting.fetch_sub(1, Ordering::Relaxed);
        bump(&STATS.left);
        raw::unblock_client(waiter.handle, Some(Outcome::Failed(LockError::Demoted)));
    }
    arm(ctx);
}

#[linkme::distributed_slice(redis_module::server_events::INFO_COMMAND_HANDLER_LIST)]
fn info(ctx: &InfoContext, _for_crash_report: bool) -> RedisResult<()> {
    let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
    ctx.builder()
        .add_section("waits")
        .field("waiting_clients", get(&STATS.waiting).to_string())?
        .field("waits", get(&STATS.waits).to_string())?
        .field("handoffs", get(&STATS.handoffs).to_string())?
        .field("timeouts", get(&STATS.timeouts).to_string())?
        .field("left_while_waiting", get(&STATS.left).to_string())?
        .field("grants_rolled_back", get(&STATS.rollbacks).to_string())?
        .field("timers_armed", timers_armed().to_string())?
        .build_section()?
        .build_info()?;
    Ok(())
}

/// Queues work for the 0 ms timer, arming it if needed.
fn defer(ctx: &Context, add: impl FnOnce(&mut Deferred)) {
    let arm_now = DEFERRED.with(|d| {
        let mut d = d.borrow_mut();
        add(&mut d);
        !std::mem::replace(&mut d.armed, true)
    });
    if arm_now {
        // A fn item with () data: the timer's data is zero-sized.
        ctx.create_timer(Duration::ZERO, run_deferred, ());
    }
}

fn run_deferred(ctx: &Context, (): ()) {
    timer_work(ctx, || {
        let work = DEFERRED.with(|d| std::mem::take(&mut *d.borrow_mut()));
        for (lock, owner) in &work.rollback {
            release_one(ctx, lock, owner);
        }
        let mut locks = work.settle;
        if work.settle_all {
            locks.extend(with_queues(|q| q.locks()));
        }
        for lock in &locks {
            settle_lock(ctx, lock);
        }
    });
}

/// Re-arms the schedule timer for the earliest event, if it is not armed for it already; with
/// nothing scheduled, stops it (no timer outlives the waits).
fn arm(ctx: &Context) {
    let next = with_queues(|q| q.next_due());
    let armed = TIMER.get();
    match (next, armed) {
        (None, None) => return,
        (Some(next), Some((when, _))) if when <= next => return,
        _ => {}
    }
    if let Some((_, id)) = armed {
        // Zero-sized data, as created below.
        let _ = ctx.stop_timer::<()>(id);
        TIMER.set(None);
    }
    if let Some(next) = next {
        let id = ctx.create_timer(delay_until(next), run_schedule, ());
        TIMER.set(Some((next, id)));
    }
}

/// How many timers of this module are armed (schedule, deferred work, cluster sweep).
fn timers_armed() -> u64 {
    let deferred = DEFERRED.with(|d| d.try_borrow().map_or(true, |d| d.armed));
    u64::from(TIMER.get().is_some()) + u64::from(deferred) + u64::from(SWEEPING.get())
}

/// The timer period that reaches Unix ms `at`: computed from the µs clock (Redis adds the period
/// to its own µs clock), rounded up so the timer never fires before `at` begins.
fn delay_until(at: i64) -> Duration {
    let now_us = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX));
    let left_us = u64::try_from(at.saturating_mul(1000).saturating_sub(now_us)).unwrap_or(0);
    Duration::from_millis(left_us.div_ceil(1000))
}

fn run_schedule(ctx: &Context, (): ()) {
    TIMER.set(None);
    timer_work(ctx, || {
        let now = raw::now_ms();
        while let Some(event) = with_queues(|q| q.pop_due(now)) {
            match event {
                Event::Timeout(id) => time_out(ctx, id),
                Event::LeaseCheck(lock) => settle_lock(ctx, &lock),
            }
        }
    });
    arm(ctx);
}

/// A waiter's budget ran out. A free lock goes to its head first (perhaps this waiter).
fn time_out(ctx: &Context, id: WaiterId) {
    let Some(lock) = with_queues(|q| q.get(id).map(|w| w.lock.clone())) else {
        return;
    };
    settle_lock(ctx, &lock);
    let Some(waiter) = take(|q| q.remove(id)) else {
        return; // granted just now
    };
    bump(&STATS.timeouts);
    let pttl = holder_pttl(ctx, &lock);
    raw::unblock_client(waiter.handle, Some(Outcome::TimedOut { pttl, token: waiter.token }));
}

/// Opens the lock from a timer and settles it.
fn settle_lock(ctx: &Context, lock: &LockName) {
    if !raw::select_db(ctx, lock.db) {
        return;
    }
    let name = RedisString::create_from_slice(ctx.get_raw(), &lock.key);
    let key = LockKey::open(ctx, &name, true);
    settle(ctx, &key, &name);
}

/// Releases one hold of `owner` (a grant whose client left), handing off if that frees it.
fn release_one(ctx: &Context, lock: &LockName, owner: &[u8]) {
    if !raw::select_db(ctx, lock.db) {
        return;
    }
    let name = RedisString::create_from_slice(ctx.get_raw(), &lock.key);
    let owner = RedisString::create_from_slice(ctx.get_raw(), owner);
    let key = LockKey::open(ctx, &name, true);
    if let Err(e) = crate::commands::release_hold(ctx, &key, &name, &owner, None) {
        ctx.log_warning(&format!("rlock: could not release a grant whose client left: {e}"));
    }
}
