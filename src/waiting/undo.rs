//! Grants undone: a waiter granted a lock whose client left before its reply gets its hold
//! released (as its kind's release would), unless the lock no longer shows that grant.

use redis_module::{Context, RedisString};

use super::hand_off::release_hold;
use super::kinds::{rw_release, sem_release, sem_release_ids};
use super::schedule::{take_rollbacks_of, Undo};
use super::state::open_db;
use crate::error::LockError;
use crate::queue::LockName;
use crate::raw;
use crate::request_rules::Record;
use crate::rules::{Kind, Reply, Request};
use crate::store::request::RequestRecord;
use crate::store::waiters::{self, Stamp};

/// Undoes now the grants on `lock` whose clients left before their reply (a command on the
/// lock is about to read it: `session_end::apply_pending`); the timer undoes the others.
pub fn undo_now(ctx: &Context, lock: &LockName) {
    for undo in &take_rollbacks_of(lock) {
        undo_grant(ctx, undo);
    }
}

/// Undoes a grant whose client left before its reply: releases the hold it was granted (as
/// `RLOCK.RELEASE` / `RWLOCK.RELEASE` would), handing off if that frees the lock; unless the lock
/// no longer shows that grant as it was made (the same owner took it again meanwhile, by a grant
/// of its own): that hold is not the one to release.
///
/// A grant to a request with an id (`REQUEST id`) is undone only if its record does not say
/// it was cancelled already (`RLOCK.CANCEL` gave it back), and its record then says cancelled
/// (so a later `RLOCK.CANCEL` does not give it back twice, and a retry gets nothing).
pub(super) fn undo_grant(ctx: &Context, undo: &Undo) {
    let Undo { lock, request, ids, stamp } = undo;
    let Some(name) = open_db(ctx, lock) else { return };
    let record =
        request.id.as_deref().and_then(|id| RequestRecord::for_caller(ctx, &name, id).ok());
    let stored = record.as_ref().map(|record| record.read(ctx));
    if matches!(stored, Some(Ok(Some(Record::Cancelled | Record::Released)))) {
        // Given back already (`RLOCK.CANCEL`, or `RSEM.RELEASE ... REQUEST id`).
        return;
    }
    release_grant(ctx, &name, request, ids, *stamp);
    // Not over the record of a request on another lock that holds its record key.
    if let (Some(record), false) = (record, matches!(stored, Some(Err(LockError::RequestMismatch))))
    {
        record.cancel(ctx, raw::now_ms());
    }
}

/// The release part of [`undo_grant`].
fn release_grant(
    ctx: &Context,
    name: &RedisString,
    request: &Request,
    ids: &[Vec<u8>],
    stamp: Stamp,
) {
    if !waiters::still_granted(ctx, name, request, stamp) {
        ctx.log_notice(
            "rlock: a grant to a client that left was not undone: the lock no longer shows it \
             as it was made (its hold ends with its lease)",
        );
        return;
    }
    let undone = match request.kind {
        Kind::Reentrant => {
            let owner = RedisString::create_from_slice(ctx.get_raw(), &request.owner);
            release_hold(ctx, name, &owner, None)
        }
        Kind::Rw(mode) => rw_release(ctx, name, &request.owner, mode),
        Kind::Permits(permits) => sem_release(ctx, name, permits).map(|_| Reply::Nil),
        // An awaiter holds nothing: nothing to give back.
        Kind::Latch => Ok(Reply::Nil),
        Kind::Leased(_) => {
            let ids: Vec<&[u8]> = ids.iter().map(Vec::as_slice).collect();
            sem_release_ids(ctx, name, &ids).map(|_| Reply::Nil)
        }
    };
    if let Err(e) = undone {
        ctx.log_warning(&format!("rlock: could not release a grant whose client left: {e}"));
    }
}
