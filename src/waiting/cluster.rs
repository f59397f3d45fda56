//! Waiting in cluster mode: a waiter whose lock's slot left this node is sent to the node that
//! has it (`MOVED`, `ASK`, `CLUSTERDOWN`), on a periodic sweep while clients wait, right after
//! an atomic slot migration ends, and before any grant.

use std::cell::Cell;
use std::time::Duration;

use redis_module::{CallOptionsBuilder, CallReply, CallResult, Context, RedisString};

use super::state::{anyone_waits, bump, unblock, with_queues, Outcome, STATS};
use crate::cluster::{key_slot, ClusterView, SlotState};
use crate::queue::LockName;
use crate::raw::{self, Key, KeyKind};
use crate::store;

thread_local! {
    /// Whether the cluster sweep timer is armed.
    static SWEEPING: Cell<bool> = const { Cell::new(false) };
}

/// How often waiters are checked against slot moves in cluster mode.
const CLUSTER_SWEEP: Duration = Duration::from_millis(200);

/// Whether the sweep timer is armed.
pub fn sweeping() -> bool {
    SWEEPING.get()
}

/// A client just started waiting: in cluster mode, make sure the sweep runs.
pub fn watch(ctx: &Context) {
    if raw::in_cluster(ctx) && !SWEEPING.get() {
        SWEEPING.set(true);
        ctx.create_timer(CLUSTER_SWEEP, sweep_timer, ());
    }
}

/// The hash slot of `key`: the server's own computation where it offers one, else the module's
/// CRC16 (`cluster::key_slot`, the same function).
fn slot_of(ctx: &Context, key: &[u8]) -> u16 {
    raw::key_slot(ctx, key).unwrap_or_else(|| key_slot(key))
}

/// In cluster mode: the redirection for a client waiting on `key` when this node cannot grant
/// it (`key_here`: the key exists on this node), or `None`.
pub fn redirect(ctx: &Context, key: &[u8], key_here: bool) -> Option<String> {
    if !raw::in_cluster(ctx) {
        return None;
    }
    cluster_view(ctx)?.redirect(slot_of(ctx, key), key_here)
}

/// This node's view of the cluster (`CLUSTER NODES`); `None` if it cannot be read.
fn cluster_view(ctx: &Context) -> Option<ClusterView> {
    let reply: CallResult = ctx.call_ext("CLUSTER", &CallOptionsBuilder::new().build(), &["NODES"]);
    match reply {
        Ok(CallReply::String(s)) => {
            Some(ClusterView::parse(&String::from_utf8_lossy(s.as_bytes())))
        }
        Ok(CallReply::VerbatimString(s)) => {
            let (_, text) = s.to_parts()?;
            Some(ClusterView::parse(&String::from_utf8_lossy(&text)))
        }
        _ => None,
    }
}

/// Unblocks every client waiting for `lock` with `redirect`.
pub fn redirect_all(lock: &LockName, redirect: &str) {
    let now = raw::now_ms();
    while let Some(waiter) = with_queues(|q| {
        let waiter = q.pop_head(lock.db, &lock.key)?;
        q.record_wait(waiter.since, now);
        Some(waiter)
    }) {
        bump(&STATS.left);
        unblock(waiter, Outcome::Redirect(redirect.to_owned()));
    }
}

/// Every few hundred ms while clients wait, sends the waiters of locks whose slot left this
/// node to the node that has it, so no waiter hangs on a slot moved away.
fn sweep_timer(ctx: &Context, (): ()) {
    store::module_work(ctx, || sweep(ctx));
    if anyone_waits() {
        ctx.create_timer(CLUSTER_SWEEP, sweep_timer, ());
    } else {
        SWEEPING.set(false);
    }
}

/// One sweep now (an atomic slot migration just ended), outside the periodic ones.
fn sweep_now(ctx: &Context, (): ()) {
    store::module_work(ctx, || sweep(ctx));
}

/// Redirects the waiters of every lock whose slot is not this node's any more.
fn sweep(ctx: &Context) {
    if !anyone_waits() {
        return;
    }
    let Some(view) = cluster_view(ctx) else { return };
    for lock in with_queues(|q| q.locks()) {
        let slot = slot_of(ctx, &lock.key);
        if matches!(view.slot_state(slot), SlotState::Mine) {
            continue;
        }
        let key_here = raw::select_db(ctx, lock.db) && {
            let name = RedisString::create_from_slice(ctx.get_raw(), &lock.key);
            Key::open(ctx, &name, false).kind() != KeyKind::Empty
        };
        if let Some(redirect) = view.redirect(slot, key_here) {
            redirect_all(&lock, &redirect);
        }
    }
    super::schedule::arm(ctx);
}

/// An atomic slot migration ended (exported, imported, aborted) or the server trimmed migrated
/// keys: the waiters are checked against the new slot owners at once (a timer: nothing is
/// done inside the server event itself), not at the next periodic sweep.
pub fn on_slots_moved(ctx: &Context) {
    if anyone_waits() {
        ctx.create_timer(Duration::ZERO, sweep_now, ());
    }
}
