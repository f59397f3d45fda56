//! `RLOCK.WAITERS`, `RWLOCK.WAITERS`, `RSEM.WAITERS`: who waits for a lock, in queue order.
//! Read-only: the queue is the module's memory, the key is only read for its kind.

use redis_module::{Context, RedisResult, RedisString, RedisValue};

use super::guarded;
use crate::args;
use crate::error::LockError;
use crate::raw::{self, reply::Field};
use crate::rules::{Kind, Request};
use crate::store::rw::RwKey;
use crate::store::sem::SemKey;
use crate::store::LockKey;
use crate::waiting::listing::{self, Shown};

/// The request id field of a row: the waiter's `REQUEST id`, or nil.
fn request_field(request: &Request) -> Field<'_> {
    request.id.as_deref().map_or(Field::Nil, Field::Bytes)
}

/// Replies `rows` built by `fields` from the waiters of `cmd.key` whose request is `matching`.
fn reply_waiters(
    ctx: &Context,
    cmd: &args::Waiters<'_, RedisString>,
    matching: impl Fn(&Request) -> bool,
    fields: impl for<'a> Fn(&'a Shown) -> Vec<(&'static str, Field<'a>)>,
) -> Result<RedisValue, LockError> {
    let (db, now) = (raw::selected_db(ctx), raw::now_ms());
    let shown = listing::waiters(db, cmd.key.as_slice(), cmd.count, matching, now);
    let rows: Vec<_> = shown.iter().map(fields).collect();
    raw::reply::reply_maps(ctx, &rows);
    Ok(RedisValue::NoReply)
}

/// `RLOCK.WAITERS key [COUNT n]`
pub fn rlock(ctx: &Context, argv: &[RedisString]) -> RedisResult {
    guarded(ctx, || {
        let cmd = args::Waiters::parse(argv)?;
        // A read-write lock's hash, or another type: WRONGTYPE (a missing key lists its queue).
        LockKey::open(ctx, cmd.key, false).check_kind()?;
        reply_waiters(
            ctx,
            &cmd,
            |r| r.kind == Kind::Reentrant,
            |w| {
                vec![
                    ("owner", Field::Bytes(&w.request.owner)),
                    ("waited_ms", Field::Int(w.waited_ms)),
                    ("left_ms", Field::Int(w.left_ms)),
                    ("request", request_field(&w.request)),
                ]
            },
        )
    })
}

/// `RWLOCK.WAITERS key [COUNT n]`
pub fn rwlock(ctx: &Context, argv: &[RedisString]) -> RedisResult {
    guarded(ctx, || {
        let cmd = args::Waiters::parse(argv)?;
        // A reentrant lock's hash, or another type: WRONGTYPE.
        RwKey::open(ctx, cmd.key, false).state_of(None)?;
        reply_waiters(
            ctx,
            &cmd,
            |r| matches!(r.kind, Kind::Rw(_)),
            |w| {
                let mode = match w.request.kind {
                    Kind::Rw(mode) => Field::Bytes(mode.as_bytes()),
                    _ => Field::Nil,
                };
                vec![
                    ("owner", Field::Bytes(&w.request.owner)),
                    ("mode", mode),
                    ("waited_ms", Field::Int(w.waited_ms)),
                    ("left_ms", Field::Int(w.left_ms)),
                    ("request", request_field(&w.request)),
                ]
            },
        )
    })
}

/// `RSEM.WAITERS key [COUNT n]`
pub fn rsem(ctx: &Context, argv: &[RedisString]) -> RedisResult {
    guarded(ctx, || {
        let cmd = args::Waiters::parse(argv)?;
        // A hash or another type: WRONGTYPE; a string that is not a count: its error.
        SemKey::open(ctx, cmd.key, false).state()?;
        reply_waiters(
            ctx,
            &cmd,
            |r| matches!(r.kind, Kind::Permits(_) | Kind::Leased(_)),
            |w| {
                let (permits, leased) = match w.request.kind {
                    Kind::Permits(n) => (n, 0),
                    Kind::Leased(n) => (n, 1),
                    Kind::Reentrant | Kind::Rw(_) | Kind::Latch => (0, 0),
                };
                vec![
                    ("permits", Field::Int(i64::try_from(permits).unwrap_or(i64::MAX))),
                    ("leased", Field::Int(leased)),
                    ("waited_ms", Field::Int(w.waited_ms)),
                    ("left_ms", Field::Int(w.left_ms)),
                    ("request", request_field(&w.request)),
                ]
            },
        )
    })
}
