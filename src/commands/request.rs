//! Exact cancellation (`request_rules`): `RLOCK.CANCEL key id`, which undoes whatever the
//! request got and makes sure it never gets anything later, and the counted give-back by
//! request id. (The step every acquire with `REQUEST id` takes first is the door's:
//! `door::request`.)

use redis_module::{Context, RedisResult, RedisString, RedisValue};

use crate::args;
use crate::door;
use crate::error::{LockError, Refusal};
use crate::raw;
use crate::request_rules::{self, replies, Cancel, CountedRelease, Granted, Record};
use crate::rules::Reply;
use crate::store;
use crate::store::request::{self as record, RequestRecord};
use crate::waiting;

/// `RLOCK.CANCEL key id`: 2, request `id`'s grant on the lock `key` was given back; 1, it was
/// waiting and left the queue (its client answered as a wait that timed out); 0, nothing to
/// undo. In every case its record then says cancelled: the request never gets anything later.
///
/// A record key that holds the record of a request on another lock (Redisson's prefix rule
/// gives some names and ids the same key): nothing of that request is touched; a request of
/// this lock that waits still leaves the queue (1), else `ERR request <id> belongs to another
/// acquire`.
pub fn cancel(ctx: &Context, argv: &[RedisString]) -> RedisResult {
    super::guarded_naming(ctx, || {
        let cmd = args::Cancel::parse(argv)?;
        door::load(ctx, cmd.key);
        let (name, id) = (cmd.key, cmd.request.as_slice());
        let record = RequestRecord::for_caller(ctx, name, id)?;
        let waits = waiting::waits_as(ctx, name, id);
        let stored = match record.read(ctx) {
            Err(LockError::RequestMismatch) if waits => {
                // Its own record could not be written: its queue entry is all it has.
                waiting::dequeue(ctx, name, id);
                waiting::settle(ctx, name);
                return Ok(RedisValue::Integer(replies::DEQUEUED));
            }
            Err(e @ LockError::RequestMismatch) => return Err(Refusal::Request(e, id.to_vec())),
            other => other?,
        };
        let cancel = request_rules::cancel(stored.as_ref(), waits);
        if let Cancel::GiveBack(Granted::Permits(_)) = cancel {
            // Counted permits, as `RSEM.RELEASE` gives them back: refused before anything is
            // written (the record too) where grants are.
            store::may_give_back(ctx)?;
        }
        let now = raw::now_ms();
        let reply = match cancel {
            Cancel::Dequeue => {
                waiting::dequeue(ctx, name, id);
                // The waiters behind it may be grantable now (a head that asked for more).
                waiting::settle(ctx, name);
                replies::DEQUEUED
            }
            Cancel::GiveBack(granted) if give_back(ctx, name, granted, now)? => replies::GIVEN_BACK,
            Cancel::GiveBack(_) | Cancel::Nothing => replies::NOTHING,
        };
        if stored != Some(Record::Cancelled) {
            // A retried cancel changes nothing (not even the record's expiry).
            record.cancel(ctx, now);
        }
        Ok(RedisValue::Integer(reply))
    })
}

/// `RSEM.RELEASE key permits REQUEST id`: gives back the counted permits that the acquire with
/// `REQUEST id` got, once: its record then says released, so a retried release gives back
/// nothing more and replies the count left, and `RLOCK.CANCEL` of the request replies 0. With
/// no record, nothing (this server never granted it). `ONCE id` (`once`): an ownerless release,
/// given back once per id (no record: given back, and the id then recorded as released).
///
/// # Errors
/// As `RSEM.RELEASE key permits`; `NOPERM`, `WRONGTYPE` or a corrupt record; the record of
/// another acquire (`ERR request <id> belongs to another acquire ...`).
pub(crate) fn release_counted(
    ctx: &Context,
    name: &RedisString,
    permits: u64,
    id: &[u8],
    once: bool,
) -> Result<RedisValue, Refusal> {
    let refused = |e| Refusal::Request(e, id.to_vec());
    let record = RequestRecord::for_caller(ctx, name, id)?;
    if waiting::waits_as(ctx, name, id) {
        // It holds nothing yet: a grant now would be recorded after this release.
        return Err(refused(LockError::RequestWaiting));
    }
    let stored = record.read(ctx).map_err(|e| match e {
        LockError::RequestMismatch => refused(e),
        e => e.into(),
    })?;
    if once && stored.is_none() {
        // An id given back once: not a late resend of one forgotten during a stall.
        store::may_take_unknown_id(ctx)?;
    }
    match request_rules::release_counted(stored.as_ref(), permits, once).map_err(refused)? {
        CountedRelease::GiveBack => {
            let left = super::permits::give_back(ctx, name, permits)?;
            record.released(ctx, raw::now_ms());
            Ok(RedisValue::Integer(left))
        }
        CountedRelease::Nothing => Ok(RedisValue::Integer(store::sem::available(ctx, name)?)),
    }
}

/// Gives back what `granted` still holds on the lock `name` at `now`, as its release would
/// (waiters served, the release published); returns whether anything was given back. A lock
/// whose key now holds another kind no longer holds the grant.
///
/// # Errors
/// What the release refuses (`NOPERM` for the channel, the hold keys or the lease zset; a
/// corrupt count); nothing is written then.
fn give_back(
    ctx: &Context,
    name: &RedisString,
    granted: &Granted,
    now: i64,
) -> Result<bool, LockError> {
    if let Granted::Leased(ids) = granted {
        let live = record::still_leased(ctx, name, ids, now)?;
        return Ok(!live.is_empty() && waiting::sem_give_back_ids(ctx, name, &live)? > 0);
    }
    match record::in_place(ctx, name, granted, now) {
        Ok(true) => {}
        Ok(false)
        | Err(LockError::WrongType | LockError::NotAReentrantLock | LockError::NotAnRwLock) => {
            return Ok(false);
        }
        Err(e) => return Err(e),
    }
    let released = match granted {
        Granted::Lock { owner, .. } => {
            let owner = RedisString::create_from_slice(ctx.get_raw(), owner);
            waiting::release_hold(ctx, name, &owner, None)?
        }
        Granted::Rw { mode, owner, .. } => waiting::rw_release(ctx, name, owner, *mode)?,
        Granted::Permits(permits) => {
            super::permits::give_back(ctx, name, *permits)?;
            Reply::Int(1)
        }
        Granted::Leased(_) => Reply::Nil,
    };
    Ok(released != Reply::Nil)
}
