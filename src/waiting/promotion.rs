//! The lease checks of a promoted replica, or of a master that loaded its data from disk. A
//! master looks at each leased semaphore just after its earliest lease ends (the permits come
//! back, `redisson_sc` is published, waiters are served), and at each read-write lock just after
//! its earliest read hold ends (a reader whose every hold ended leaves): checks it schedules at
//! every grant and renewal. A replica gets the writes but never the checks, and a restart
//! (AOF, RDB) loads the data without them, so such a server reclaimed an ended lease only when a
//! command or a waiter touched the lock: with nobody waiting in the server, a semaphore's count
//! and lease zset kept the ended permit and nothing was published; a read-write lock kept a dead
//! reader's field (the owner's `WRITE` refused as an upgrade, the lock held by nobody while live
//! readers kept its hash's lease going) until some release or some waiter's poll.
//!
//! So a promotion, and a load from disk on a master, walks the keyspace once, every database,
//! a step at a time within the timer tick's work budget (`timers::TICK_BUDGET`: the server
//! serves its clients between ticks), and gives every leased semaphore it finds (by its lease
//! zset's name, `{name}:timeout`) and every read-write lock (a hash whose `mode` is `read` or
//! `write`) its check, due at once: it reclaims what ended and schedules the next lease end, as
//! on the old master. Key names are read, the key types the scan lends, and a key is opened only
//! when its name is a lease zset's or it is a hash (one field read: `mode`). A lock's lease and
//! a lock-delay need nothing: they end by Redis's own key expiry.

use std::cell::RefCell;

use redis_module::{Context, RedisString};

use super::kinds;
use super::schedule::{schedule_check, Budget};
use super::state::lock_name;
use crate::names;
use crate::queue::LockName;
use crate::raw::{self, scan::KeyScan, KeyKind};
use crate::rw_rules::Mode;

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
    super::schedule::defer(ctx, |d| d.promotion_walk = true);
}

/// A master loaded its data from disk (a restart from its AOF or RDB, `DEBUG RELOAD`): the
/// same walk (the checks of the server that wrote the file are not in it).
pub fn loaded(ctx: &Context) {
    promoted(ctx);
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

/// Whether the hash `name` is a read-write lock: its `mode` is `read` or `write` (a reentrant
/// lock's hash has no `mode`; a hash of something else that has one is checked too, and its
/// check finds no lock).
fn is_rw_lock(ctx: &Context, name: &[u8]) -> bool {
    let name = RedisString::create_from_slice(ctx.get_raw(), name);
    let key = raw::Key::open(ctx, &name, false);
    if key.kind() != KeyKind::Hash {
        return false;
    }
    let field = RedisString::create_from_slice(ctx.get_raw(), names::MODE_FIELD);
    key.hash_get(&field).is_some_and(|mode| {
        let mode = mode.as_bytes();
        mode == Mode::Read.as_bytes() || mode == Mode::Write.as_bytes()
    })
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
        let (mut zsets, mut hashes) = (Vec::new(), Vec::new());
        let more = walk.scan.step(ctx, &mut |key, is_hash| {
            if is_hash {
                hashes.push(key.to_vec());
            } else if key.ends_with(b":timeout") {
                zsets.push(key.to_vec());
            }
        });
        for zset in zsets {
            if let Some(sem) = semaphore_of(ctx, &zset) {
                schedule_check(ctx, &lock_name(ctx, &sem), now);
            }
        }
        for hash in hashes {
            if is_rw_lock(ctx, &hash) {
                let lock = LockName { db: walk.db, key: hash };
                schedule_check(ctx, &lock, now);
            }
        }
        if !more {
            walk = Walk { db: walk.db + 1, scan: KeyScan::new() };
        }
    }
    WALK.with(|w| *w.borrow_mut() = Some(walk));
    true
}
