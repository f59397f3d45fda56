//! An acquire's request record on Redis (exact cancellation, `request_rules`): the string key
//! `rlock_request:{<name>}:<id>` (`names::request`, in the lock's cluster slot), holding what
//! the request was granted until the grant's lease ends, or that it was cancelled. Read, then
//! written, on a key opened and closed at once, as the latch is; replicated as `SET` and
//! `PEXPIREAT`, so a replica or an AOF without the module holds the same record.

use redis_module::{Context, RedisString, RedisValue};

use super::access::check_key;
use super::derived::{derived_name, store_string, TokenCounter};
use super::rw::RwKey;
use super::sem::Leases;
use super::LockKey;
use crate::error::{LockError, Refusal};
use crate::names;
use crate::raw::{Key, KeyKind, KeyUse};
use crate::request_rules::{self, Asked, Granted, Record};
use crate::rules::View;
use crate::rw_rules::Mode;
use crate::sem_rules;

/// The longest record read beyond the lock's name it holds (a longer value is a foreign
/// writer's, refused without being copied): the largest the module writes is a leased grant
/// of `args::sem::MAX_LEASED` ids (about 190 KB), or a hold of an owner of
/// `args::MAX_REQUEST_OWNER` bytes.
const MAX_RECORD_LEN: usize = 256 * 1024;

/// What a grant writes beside the lock, after the lock itself: its fencing token into the
/// counter, then its request's record. The one writer of both, for every grant: an acquire's
/// (`door::Admitted::written`, `RSEM.ACQUIRE`'s) and a waiter's (`waiters::Grant::write`).
pub struct Beside {
    /// The token counter (the grant asked for `TOKEN`), checked.
    pub counter: Option<TokenCounter>,
    /// The request's record (the grant asked with `REQUEST id`), checked.
    pub record: Option<RequestRecord>,
}

impl Beside {
    /// Nothing beside the lock.
    pub const NONE: Self = Self { counter: None, record: None };

    /// Writes the grant's `token` into the counter, then what the record keeps (`granted`,
    /// asked only where there is a record: the grant, and until when, Unix ms, `None`: for
    /// good), each where the grant has one.
    pub fn write(
        self,
        ctx: &Context,
        token: Option<u64>,
        granted: impl FnOnce() -> Option<(Granted, Option<i64>)>,
    ) {
        if let (Some(counter), Some(token)) = (self.counter, token) {
            counter.store(ctx, token);
        }
        if let Some((record, (granted, until))) = self.record.and_then(|r| Some((r, granted()?))) {
            record.granted(ctx, granted, until);
        }
    }
}

/// The request record of one acquire request on one lock.
pub struct RequestRecord {
    name: RedisString,
    /// The lock's name, which the record holds (its key does not tell every lock apart).
    lock: Vec<u8>,
}

impl RequestRecord {
    /// The record of request `id` on `lock`, which the calling client (or the acting waiter,
    /// `access::acting_as`; nobody for the module's own work) must be allowed to read and write.
    ///
    /// # Errors
    /// [`LockError::CrossSlot`], or [`LockError::NoPermRequest`].
    pub fn for_caller(ctx: &Context, lock: &RedisString, id: &[u8]) -> Result<Self, LockError> {
        let name = derived_name(ctx, lock, &names::request(lock.as_slice(), id))?;
        check_key(ctx, &name, KeyUse::ReadWrite, LockError::NoPermRequest)?;
        Ok(Self { name, lock: lock.as_slice().to_vec() })
    }

    /// The record as stored (`None`: none, or it expired).
    ///
    /// # Errors
    /// `WRONGTYPE` for a key of another type; [`LockError::CorruptRequest`] for a string that
    /// is not a record; [`LockError::RequestMismatch`] for the record of a request on another
    /// lock whose record key is this one (`Record::stored_for`).
    pub fn read(&self, ctx: &Context) -> Result<Option<Record>, LockError> {
        let key = Key::open(ctx, &self.name, false);
        match key.kind() {
            KeyKind::Empty => Ok(None),
            KeyKind::String if key.string_len() > MAX_RECORD_LEN + self.lock.len() + 21 => {
                Err(LockError::CorruptRequest)
            }
            KeyKind::String => Record::load_for(&key.string_value(), &self.lock).map(Some),
            KeyKind::Hash | KeyKind::Other => Err(LockError::WrongType),
        }
    }

    /// Records `granted` until Unix ms `until` (the grant's lease end; `None`: no end, for
    /// counted permits, whose record lasts until they are released or cancelled).
    pub fn granted(&self, ctx: &Context, granted: Granted, until: Option<i64>) {
        self.store(ctx, &Record::Granted(granted), until);
    }

    /// Records the request as cancelled, at `now`, for [`request_rules::CANCELLED_MS`] or as
    /// long as the record it replaces would have lasted.
    pub fn cancel(&self, ctx: &Context, now: i64) {
        let expire_at = Some(Key::open(ctx, &self.name, false).expire_at()).filter(|&at| at >= 0);
        self.store(ctx, &Record::Cancelled, Some(request_rules::cancelled_until(now, expire_at)));
    }

    /// Records that the request's counted permits were given back, at `now`: kept as long as a
    /// cancelled record is (a late cancel or retried release must find it).
    pub fn released(&self, ctx: &Context, now: i64) {
        let expire_at = Some(Key::open(ctx, &self.name, false).expire_at()).filter(|&at| at >= 0);
        self.store(ctx, &Record::Released, Some(request_rules::cancelled_until(now, expire_at)));
    }

    fn store(&self, ctx: &Context, record: &Record, until: Option<i64>) {
        let value = RedisString::create_from_slice(ctx.get_raw(), &record.stored_for(&self.lock));
        store_string(ctx, &self.name, &value, c"set", until);
    }
}

/// Whether request `id`'s record on the lock `lock` (the context's database) says cancelled,
/// read as the module (no ACL check: a waiter's reply, for a record its grant just wrote). A
/// waiter granted by a hand-off whose request was cancelled before its reply went out (the
/// cancel gave the grant back) is told it was not granted.
pub fn says_cancelled(ctx: &Context, lock: &[u8], id: &[u8]) -> bool {
    let name = RedisString::create_from_slice(ctx.get_raw(), &names::request(lock, id));
    let record = RequestRecord { name, lock: lock.to_vec() };
    matches!(record.read(ctx), Ok(Some(Record::Cancelled)))
}

/// Whether `granted` is still in place on the lock `name` at `now`: the owner still holds that
/// lock (a reentrant lock), that side (a read-write lock: read holds, or the write hold in write
/// mode); every leased id is still leased; counted permits carry no owner: always.
///
/// # Errors
/// `WRONGTYPE` (the key, or the lease zset), a corrupt count, `NOPERM` for the lease zset.
pub fn in_place(
    ctx: &Context,
    name: &RedisString,
    granted: &Granted,
    now: i64,
) -> Result<bool, LockError> {
    match granted {
        Granted::Lock { owner, .. } => {
            let owner = RedisString::create_from_slice(ctx.get_raw(), owner);
            let view = LockKey::open(ctx, name, false).view(Some(&owner))?;
            Ok(matches!(view, View::Held { mine: Some(_), .. }))
        }
        Granted::Rw { mode, owner, .. } => {
            let key = RwKey::open(ctx, name, false);
            // Read holds whose leases all ended are not in place, field or no field.
            let state = key.with_live_reads(key.state_of(Some(owner))?, owner, now)?;
            Ok(match mode {
                Mode::Read => state.mode.is_some() && state.reads_of(owner) > 0,
                Mode::Write => state.mode == Some(Mode::Write) && state.writes_of(owner) > 0,
            })
        }
        Granted::Permits(_) => Ok(true),
        Granted::Leased(ids) => {
            let leases = Leases::for_caller(ctx, name)?;
            let ids: Vec<&[u8]> = ids.iter().map(Vec::as_slice).collect();
            Ok(sem_rules::releasable(&leases.scores(ctx, &ids)?, now))
        }
    }
}

/// The ids of `ids` still leased at `now` (a cancel gives back those).
///
/// # Errors
/// `WRONGTYPE` for the lease zset, `NOPERM`.
pub fn still_leased(
    ctx: &Context,
    name: &RedisString,
    ids: &[Vec<u8>],
    now: i64,
) -> Result<Vec<Vec<u8>>, LockError> {
    let leases = Leases::for_caller(ctx, name)?;
    let refs: Vec<&[u8]> = ids.iter().map(Vec::as_slice).collect();
    let scores = leases.scores(ctx, &refs)?;
    Ok(ids
        .iter()
        .zip(scores)
        .filter(|(_, score)| score.is_some_and(|at| at > now))
        .map(|(id, _)| id.clone())
        .collect())
}

/// What the waiting machinery knows of a request on a lock (the door reads it before the
/// store).
#[derive(Clone, Copy)]
pub struct Queued {
    /// Its grant is being undone (its client left before the reply).
    pub undoing: bool,
    /// It waits in the lock's queue.
    pub waits: bool,
}

/// What an acquire does after its request's record was read.
pub enum Prelude {
    /// A retry whose first grant is still in place: reply this, change nothing.
    Replay(RedisValue),
    /// Go on as a new acquire; a grant writes this record.
    Fresh(RequestRecord),
}

/// The step an acquire with `REQUEST id` takes on the lock `name` at `now`, before anything is
/// written (and before a `WAIT` blocks): the record must be in the lock's slot and usable by
/// the caller; a retry of a grant still in place replies the first grant; a request that was
/// cancelled, answers another acquire, or waits already (`queued`) is refused.
///
/// # Errors
/// [`LockError::CrossSlot`], `NOPERM`, `WRONGTYPE` or [`LockError::CorruptRequest`] for the
/// record; [`LockError::RequestCancelled`], [`LockError::RequestMismatch`],
/// [`LockError::RequestWaiting`] naming the id; what reading the grant's lock refuses.
pub fn prelude(
    ctx: &Context,
    name: &RedisString,
    id: &[u8],
    asked: Asked<'_>,
    now: i64,
    queued: Queued,
) -> Result<Prelude, Refusal> {
    let refused = |e| Refusal::Request(e, id.to_vec());
    let record = RequestRecord::for_caller(ctx, name, id)?;
    if queued.undoing {
        // Its grant is being undone (its client left before the reply): cancelled.
        return Err(refused(LockError::RequestCancelled));
    }
    let stored = record.read(ctx).map_err(|e| match e {
        // Another lock's request holds this record key: the id is taken.
        LockError::RequestMismatch => refused(e),
        e => e.into(),
    })?;
    if let Some(granted) = request_rules::check_retry(stored.as_ref(), &asked).map_err(refused)? {
        let in_place = in_place(ctx, name, granted, now)?;
        match request_rules::replay(granted, in_place) {
            Some(Ok(reply)) => return Ok(Prelude::Replay(super::to_value(reply))),
            Some(Err(ids)) => return Ok(Prelude::Replay(super::ids_value(&ids))),
            None => {}
        }
    }
    if queued.waits {
        return Err(refused(LockError::RequestWaiting));
    }
    Ok(Prelude::Fresh(record))
}
