//! A promoted replica's lease checks. A master looks at each leased semaphore just after its
//! earliest lease ends (the permits come back, `redisson_sc` is published, waiters are served):
//! a check it schedules at every grant and renewal. A replica gets the writes but never the
//! checks, so once promoted it reclaimed an ended lease only when a command or a waiter touched
//! the semaphore (a waiter's poll does; with nobody waiting in the server, the count and the
//! lease zset kept the ended permit and nothing was published).
//!
//! So a promotion walks the keyspace once, every database, a step at a time within the timer
//! tick's work budget (`timers::TICK_BUDGET`: the server serves its clients between ticks), and
//! gives every leased semaphore it finds (by its lease zset's name, `{name}:timeout`) its check,
//! due at once: it reclaims what ended and schedules the next lease end, as on the old master.
//! Only key names are read, and a key is opened only when its name is a lease zset's. Nothing
//! else needs it: a lock's lease and a lock-delay end by Redis's own key expiry, and a
//! read-write lock's dead readers are reaped by its waiters' poll (with nobody waiting, a dead
//! reader's field blocks no one).

use std::cell::RefCell;

use redis_module::{Context, RedisString};

use super::timers::Budget;
use super::{kinds, lock_name, schedule_check};
use crate::names;
use crate::raw::{self, scan::KeyScan, KeyKind};

/// Where the walk is: the database and its cursor.
struct Walk {
    db: i32,
    scan: KeyScan,
}

thread_local! {
    static WALK: RefCell<Option<Walk>> = const { RefCell::new(None) };
}

/// The server became a master: the walk starts (again, from the first database) on the next
/// tick.
pub fn promoted(ctx: &Context) {
    WALK.with(|w| *w.borrow_mut() = Some(Walk { db: 0, scan: KeyScan::new() }));
    super::timers::defer(ctx, |d| d.promotion_walk = true);
}

/// The server is no longer a master: the walk stops (a replica never writes).
pub fn stop() {
    WALK.with(|w| {
        if let Ok(mut w) = w.try_borrow_mut() {
            w.take();
        }
    });
}

/// The semaphore whose lease zset is `zset`, if it is one: of the (at most two) names it can
/// be the zset of, the one whose count exists, else Redisson's plain one (`a` for `{a}:timeout`).
fn semaphore_of(ctx: &Context, zset: &[u8]) -> Option<RedisString> {
    let names: Vec<RedisString> = names::unsuffixed(zset, b"timeout")
        .iter()
        .map(|name| RedisString::create_from_slice(ctx.get_raw(), name))
        .collect();
    let counted =
        names.iter().position(|n| raw::Key::open(ctx, n, false).kind() == KeyKind::String);
    let sem = names.into_iter().nth(counted.unwrap_or(0))?;
    kinds::is_semaphore(ctx, &sem).then_some(sem)
}

/// One tick's share of the walk; returns whether some is left for the next tick.
pub(super) fn step(ctx: &Context, budget: &Budget) -> bool {
    let Some(mut walk) = WALK.with(|w| w.borrow_mut().take()) else { return false };
    let now = raw::now_ms();
    while !budget.spent() {
        if !raw::select_db(ctx, walk.db) {
            // Past the last database: done.
            return false;
        }
        let mut zsets = Vec::new();
        let more = walk.scan.step(ctx, &mut |key| {
            if key.ends_with(b":timeout") {
                zsets.push(key.to_vec());
            }
        });
        for zset in zsets {
            if let Some(sem) = semaphore_of(ctx, &zset) {
                schedule_check(ctx, &lock_name(ctx, &sem), now);
            }
        }
        if !more {
            walk = Walk { db: walk.db + 1, scan: KeyScan::new() };
        }
    }
    WALK.with(|w| *w.borrow_mut() = Some(walk));
    true
}
