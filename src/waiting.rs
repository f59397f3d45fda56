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
use redis_module::server_events::{FlushSubevent, LoadingSubevent, ServerRole};
use redis_module::{Context, InfoContext, NotifyEvent, RedisResult, RedisString, RedisValue};

use crate::args::{Lease, WaitFor};
use crate::error::LockError;
use crate::queue::{Event, LockName, Queues, Waiter, WaiterId};
use crate::raw::{self, Blocked, KeyKind, LockKey};
use crate::replicas;
use crate::rules::{self, Deadline};

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
    cluster_view(ctx)?.redirect(raw::key_slot(ctx, key), key_here)
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
    timer_work(ctx, || sweep(ctx));
    if anyone_waits() {
        ctx.create_timer(CLUSTER_SWEEP, sweep_cluster, ());
    } else {
        SWEEPING.set(false);
    }
}

/// One sweep now (an atomic slot migration just ended), outside the periodic ones.
fn sweep_now(ctx: &Context, (): ()) {
    timer_work(ctx, || sweep(ctx));
}

/// Redirects the waiters of every lock whose slot is not this node's any more.
fn sweep(ctx: &Context) {
    if !anyone_waits() {
        return;
    }
    let Some(view) = cluster_view(ctx) else { return };
    for lock in with_queues(|q| q.locks()) {
        let slot = raw::key_slot(ctx, &lock.key);
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
}

/// An atomic slot migration ended (exported, imported, aborted) or the server trimmed migrated
/// keys: the waiters are checked against the new slot owners at once (a timer: nothing is
/// done inside the server event itself), not at the next periodic sweep.
pub fn on_slots_moved(ctx: &Context) {
    if anyone_waits() {
        ctx.create_timer(Duration::ZERO, sweep_now, ());
    }
}

/// When a lease of `pttl` ms left at `now` is over: Redis expires a key once now > deadline.
const fn lease_end(now: i64, pttl: i64) -> i64 {
    now.saturating_add(pttl).saturating_add(1)
}

/// Hands a free lock to its longest-waiting client, or (when held) makes sure it is checked
/// again at its holder's deadline. Called on every RLOCK write to a lock, before the command's
/// own rules, so no newcomer takes a lock that waiters are owed. Opens (and closes) its own key
/// handle: the caller opens its own afterwards, so no handle outlives a hand-off's writes.
pub fn settle(ctx: &Context, name: &RedisString) {
    if !waits_for(ctx, name) {
        return;
    }
    let key = LockKey::open(ctx, name, true);
    match key.kind() {
        KeyKind::Empty => {
            hand_off(ctx, &key, name);
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
///
/// A waiter that asked for a fencing token and cannot get one (the counter is corrupt or full,
/// or an `allkeys-*` policy is in force) gets that error and the next waiter is tried: nothing
/// is granted with an error reply. Never writes while writes are paused (timers check first).
pub fn hand_off(ctx: &Context, key: &LockKey, name: &RedisString) -> bool {
    if !waits_for(ctx, name) || !raw::is_master(ctx) || raw::writes_paused() {
        return false;
    }
    if replicas::may_grant(raw::now_ms()).is_err() {
        // A master that lost its replicas: the waiters stay queued; the replica check that
        // finds them in sync again settles every lock (`on_cron`).
        return false;
    }
    let lock = &lock_name(ctx, name);
    if let Some(redirect) = cluster_redirect(ctx, &lock.key, false) {
        // The slot left this node: its waiters must ask the node that has it now.
        redirect_all(lock, &redirect);
        return false;
    }
    loop {
        let Some(waiter) = take(|q| q.pop_head(lock.db, &lock.key)) else {
            return false;
        };
        // Everything that can refuse is checked before the grant is written.
        let token = match waiter.token.then(|| next_token(ctx, name)).transpose() {
            Ok(token) => token,
            Err(e) => {
                bump(&STATS.left);
                raw::unblock_client(waiter.handle, Some(Outcome::Failed(e)));
                continue;
            }
        };
        let deadline = Deadline::after(raw::now_ms(), waiter.lease).unwrap_or(Deadline::LAST);
        let owner = RedisString::create_from_slice(ctx.get_raw(), &waiter.owner);
        crate::commands::execute(ctx, key, name, Some(&owner), &rules::grant(deadline));
        let token = token.map(|(counter, token)| {
            counter.store(ctx, token);
            token
        });
        raw::unblock_client(
            waiter.handle,
            Some(Outcome::Granted { lock: lock.clone(), owner: waiter.owner, token }),
        );
        bump(&STATS.handoffs);
        with_queues(|q| q.schedule_lease_check(lock, deadline.unix_ms().saturating_add(1)));
        arm(ctx);
        return true;
    }
}

/// The counter and the next token of a grant made by a hand-off, checked, nothing written.
fn next_token(
    ctx: &Context,
    name: &RedisString,
) -> Result<(crate::commands::TokenCounter, u64), LockError> {
    let counter = crate::commands::TokenCounter::for_grant(ctx, name)?;
    let token = counter.next(ctx)?;
    Ok((counter, token))
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
    // The context is the waiter's own client, whose database is the lock's.
    let reply = match holder_pttl(ctx, &waiter.lock) {
        Ok(pttl) if waiter.token => Ok(crate::commands::busy_reply(pttl)),
        Ok(pttl) => Ok(RedisValue::Integer(pttl)),
        Err(e) => Err(e.into()),
    };
    ctx.reply(reply);
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

/// What a wait that ends without a grant replies, read in the context's selected database: the
/// holder's remaining lease (-1: no expiry), as a busy `RLOCK.ACQUIRE`; 0 when nobody holds it
/// at this instant but it could not be granted (writes paused): retry at once; `WRONGTYPE` when
/// the key now holds something else.
fn holder_pttl(ctx: &Context, lock: &LockName) -> Result<i64, LockError> {
    let name = RedisString::create_from_slice(ctx.get_raw(), &lock.key);
    let key = LockKey::open(ctx, &name, false);
    match key.kind() {
        KeyKind::Hash => Ok(key.pttl()),
        KeyKind::Empty => Ok(0),
        KeyKind::Other | KeyKind::String => Err(LockError::WrongType),
    }
}

/// Keyspace events (in the `redis_module!` table): a lock with waiters that was deleted,
/// expired or evicted is handed off on a 0 ms timer.
pub fn on_keyspace_event(ctx: &Context, _event: NotifyEvent, name: &str, key: &[u8]) {
    let db = raw::selected_db(ctx);
    keep_the_clients_database(ctx, name, db);
    // The module's own notifications (its writes hand off themselves) are not news.
    if !anyone_waits() || raw::notifying() {
        return;
    }
    // If the queues are borrowed, this event fired inside the module's own work: settle anyway.
    let queued = QUEUES.with(|q| q.try_borrow().map_or(true, |q| q.waiting(db, key) > 0));
    if queued {
        defer(ctx, |d| d.settle.push(LockName { db, key: key.to_vec() }));
    }
}

/// Valkey 8.1 (valkey PR #1819, until #4024) runs keyspace subscribers on the client executing
/// the command, after selecting the event's database on it, and never selects the client's own
/// back: with any module subscribed, a `MOVE` left its client in the destination database.
/// `MOVE` notifies `move_from` (in the client's database) just before `move_to`: select that
/// database back then. Elsewhere the context's client is a temporary one and this is harmless.
fn keep_the_clients_database(ctx: &Context, event: &str, db: i32) {
    thread_local! {
        static MOVED_FROM: Cell<Option<i32>> = const { Cell::new(None) };
    }
    match event {
        "move_from" => MOVED_FROM.set(Some(db)),
        "move_to" => {
            if let Some(from) = MOVED_FROM.take() {
                raw::select_db(ctx, from);
            }
        }
        _ => {}
    }
}

#[linkme::distributed_slice(redis_module::server_events::FLUSH_SERVER_EVENTS_LIST)]
fn on_flush(ctx: &Context, subevent: FlushSubevent) {
    if subevent == FlushSubevent::Ended && anyone_waits() {
        defer(ctx, |d| d.settle_all = true);
    }
}

/// `SWAPDB` moved whole databases: every lock with waiters is looked at again (handed off if
/// its database no longer holds it, checked at its new holder's deadline otherwise).
pub fn on_swapdb(ctx: &Context) {
    if anyone_waits() {
        defer(ctx, |d| d.settle_all = true);
    }
}

/// At load: `INFO rlock` starts from zero (a reloaded module may find its old statics).
pub fn reset_stats() {
    for counter in [&STATS.waits, &STATS.handoffs, &STATS.timeouts, &STATS.left, &STATS.rollbacks] {
        counter.store(0, Ordering::Relaxed);
    }
    replicas::reset();
}

/// Checks this master's replicas on every cron tick (`replicas`); when grants become allowed
/// again, the waiters held back meanwhile are served.
#[linkme::distributed_slice(redis_module::server_events::CRON_SERVER_EVENTS_LIST)]
fn on_cron(ctx: &Context, _: u64) {
    if !raw::is_master(ctx) {
        replicas::not_master();
        return;
    }
    let links: Vec<_> = raw::replica_lines(ctx)
        .unwrap_or_default()
        .iter()
        .filter_map(|line| replicas::parse_link(line))
        .collect();
    if replicas::record_check(raw::now_ms(), &links) && anyone_waits() {
        defer(ctx, |d| d.settle_all = true);
    }
}

/// A master loaded its data from disk (a restart): grants the last fsync missed may be lost,
/// so tokens from now on start above any this server issued before (`replicas`).
#[linkme::distributed_slice(redis_module::server_events::LOADING_SERVER_EVENTS_LIST)]
fn on_loading(ctx: &Context, subevent: LoadingSubevent) {
    thread_local! {
        static FROM_DISK: Cell<bool> = const { Cell::new(false) };
    }
    match subevent {
        LoadingSubevent::RdbStarted | LoadingSubevent::AofStarted => FROM_DISK.set(true),
        LoadingSubevent::ReplStarted => FROM_DISK.set(false),
        LoadingSubevent::Ended => {
            if FROM_DISK.replace(false) && raw::is_master(ctx) {
                replicas::raise_token_floor(raw::now_ms());
            }
        }
        LoadingSubevent::Failed => FROM_DISK.set(false),
    }
}

/// Promoted: tokens from now on are above any the old master issued, and the new master
/// starts with no replicas seen. Demoted to a replica: no lock can be granted here any more;
/// every waiter gets an error.
#[linkme::distributed_slice(redis_module::server_events::ROLE_CHANGED_SERVER_EVENTS_LIST)]
fn on_role_changed(ctx: &Context, role: ServerRole) {
    raw::note_replication();
    replicas::not_master();
    if role == ServerRole::Primary {
        replicas::raise_token_floor(raw::now_ms());
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
    let (required, in_sync, allowed, refused) = replicas::summary(raw::now_ms());
    let (server, capabilities) = crate::server::get()
        .map_or_else(|| (String::new(), String::new()), |s| (s.describe(), s.capabilities()));
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
        .add_section("replicas")
        .field("replicas_required", required.to_string())?
        .field("replicas_in_sync", in_sync.to_string())?
        .field("grants_allowed", u8::from(allowed).to_string())?
        .field("grants_refused", refused.to_string())?
        .field("token_floor", replicas::token_floor().to_string())?
        .build_section()?
        .add_section("server")
        .field("server", server)?
        .field("capabilities", capabilities)?
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

/// How often work that writes is retried while writes are paused (`CLIENT PAUSE`, `FAILOVER`):
/// a waiter owed a lock is served within this of the pause's end.
const PAUSE_RETRY: Duration = Duration::from_millis(1);

fn run_deferred(ctx: &Context, (): ()) {
    if raw::writes_paused() {
        // Keep the work (still armed) and look again shortly.
        ctx.create_timer(PAUSE_RETRY, run_deferred, ());
        return;
    }
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
        // While writes are paused nothing is granted: lease checks wait for the pause's end
        // (retried every PAUSE_RETRY), timeouts still end their waits.
        let paused = raw::writes_paused();
        let mut later = Vec::new();
        while let Some(event) = with_queues(|q| q.pop_due(now)) {
            match event {
                Event::Timeout(id) => time_out(ctx, id, paused),
                Event::LeaseCheck(lock) if paused => later.push(lock),
                Event::LeaseCheck(lock) => settle_lock(ctx, &lock),
            }
        }
        let retry_at = now.saturating_add(PAUSE_RETRY.as_millis() as i64);
        with_queues(|q| later.iter().for_each(|lock| q.schedule_lease_check(lock, retry_at)));
    });
    arm(ctx);
}

/// A waiter's budget ran out. A free lock goes to its head first (perhaps this waiter), unless
/// writes are paused.
fn time_out(ctx: &Context, id: WaiterId, paused: bool) {
    let Some(lock) = with_queues(|q| q.get(id).map(|w| w.lock.clone())) else {
        return;
    };
    if !paused {
        settle_lock(ctx, &lock);
    }
    let Some(waiter) = take(|q| q.remove(id)) else {
        return; // granted just now
    };
    bump(&STATS.timeouts);
    let outcome = if raw::select_db(ctx, lock.db) {
        match holder_pttl(ctx, &lock) {
            Ok(pttl) => Outcome::TimedOut { pttl, token: waiter.token },
            Err(e) => Outcome::Failed(e),
        }
    } else {
        Outcome::Failed(LockError::Internal)
    };
    raw::unblock_client(waiter.handle, Some(outcome));
}

/// Opens the lock from a timer and settles it.
fn settle_lock(ctx: &Context, lock: &LockName) {
    if !raw::select_db(ctx, lock.db) {
        return;
    }
    let name = RedisString::create_from_slice(ctx.get_raw(), &lock.key);
    settle(ctx, &name);
}

/// Releases one hold of `owner` (a grant whose client left), handing off if that frees it.
fn release_one(ctx: &Context, lock: &LockName, owner: &[u8]) {
    if !raw::select_db(ctx, lock.db) {
        return;
    }
    let name = RedisString::create_from_slice(ctx.get_raw(), &lock.key);
    let owner = RedisString::create_from_slice(ctx.get_raw(), owner);
    if let Err(e) = crate::commands::release_hold(ctx, &name, &owner, None) {
        ctx.log_warning(&format!("rlock: could not release a grant whose client left: {e}"));
    }
}
