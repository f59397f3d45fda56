//! Exact cancellation, as plain Rust: the *request record* an acquire with `REQUEST id` leaves
//! (what it was granted, or that it was cancelled), its module-private encoding, and the
//! decisions made from it: what a retried acquire does ([`check_retry`], [`replay`]) and what
//! `RLOCK.CANCEL` undoes ([`cancel`]). Only the `store` reads and writes the record key
//! (`rlock_request:{<name>}:<id>`, see `names::request`).

use crate::args::sem::MAX_LEASED;
use crate::args::{parse_positive, Mode};
use crate::error::LockError;
use crate::rules::Reply;

/// How long the record of a grant with no lease of its own is kept, in ms: a lock's, and counted
/// permits acquired `OWNERLESS`. (Other counted grants' records have no end: they last until
/// the grant is released with `REQUEST id` or cancelled.)
pub const REQUEST_RECORD_MS: i64 = 60_000;

/// How long a cancelled request stays cancelled at least, in ms (longer when the grant it
/// recorded had a longer lease): an acquire with that id still in flight is refused that long.
pub const CANCELLED_MS: i64 = 60_000;

/// `RLOCK.CANCEL`'s replies.
pub mod replies {
    /// The request had been granted; its grant was given back.
    pub const GIVEN_BACK: i64 = 2;
    /// The request was waiting; it left the queue and its client got the not-granted reply.
    pub const DEQUEUED: i64 = 1;
    /// Nothing to undo.
    pub const NOTHING: i64 = 0;
}

/// What a request was granted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Granted {
    /// A reentrant lock hold of `owner` (with its fencing token, if one was asked for).
    Lock { owner: Vec<u8>, token: Option<u64> },
    /// A read or write hold of `owner` on a read-write lock.
    Rw { mode: Mode, owner: Vec<u8>, token: Option<u64> },
    /// Counted semaphore permits.
    Permits(u64),
    /// Leased semaphore permits, by id.
    Leased(Vec<Vec<u8>>),
}

/// A request record: the request's outcome as the server remembers it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record {
    Granted(Granted),
    /// `RLOCK.CANCEL` (or the rollback of a grant whose client left) ended it: it gets nothing.
    Cancelled,
    /// Its counted permits were given back by `RSEM.RELEASE key permits REQUEST id`: nothing
    /// is left to undo, and a retry of the acquire is a new acquire.
    Released,
}

/// What an acquire with `REQUEST id` asks for, compared with the grant its record holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Asked<'a> {
    /// `RLOCK.ACQUIRE` by `owner` (with `TOKEN`, or not).
    Lock { owner: &'a [u8], token: bool },
    /// `RWLOCK.ACQUIRE` of side `mode` by `owner`.
    Rw { mode: Mode, owner: &'a [u8], token: bool },
    /// `RSEM.ACQUIRE` of this many counted permits.
    Permits(u64),
    /// `RSEM.ACQUIRE ... LEASE` of this many leased permits.
    Leased(u64),
}

/// The first bytes of every record: a format name and version.
const MAGIC: &[u8] = b"rlock-request:1:";

fn push_field(out: &mut Vec<u8>, field: &[u8]) {
    out.extend_from_slice(field.len().to_string().as_bytes());
    out.push(b':');
    out.extend_from_slice(field);
}

fn token_field(token: Option<u64>) -> Vec<u8> {
    token.map(|t| t.to_string().into_bytes()).unwrap_or_default()
}

impl Record {
    /// The record as stored: [`MAGIC`], then `C` (cancelled), `D` (released) or `G`, a kind letter and
    /// length-prefixed fields (`<decimal length>:<bytes>`, binary-safe): `L`/`R`/`W` owner and
    /// token (empty: none), `P` the permit count, `S` the leased ids.
    #[must_use]
    pub fn encode(&self) -> Vec<u8> {
        let mut out = MAGIC.to_vec();
        let granted = match self {
            Self::Cancelled => {
                out.push(b'C');
                return out;
            }
            Self::Released => {
                out.push(b'D');
                return out;
            }
            Self::Granted(granted) => granted,
        };
        out.push(b'G');
        match granted {
            Granted::Lock { owner, token } => {
                out.push(b'L');
                push_field(&mut out, owner);
                push_field(&mut out, &token_field(*token));
            }
            Granted::Rw { mode, owner, token } => {
                out.push(match mode {
                    Mode::Read => b'R',
                    Mode::Write => b'W',
                });
                push_field(&mut out, owner);
                push_field(&mut out, &token_field(*token));
            }
            Granted::Permits(n) => {
                out.push(b'P');
                push_field(&mut out, n.to_string().as_bytes());
            }
            Granted::Leased(ids) => {
                out.push(b'S');
                for id in ids {
                    push_field(&mut out, id);
                }
            }
        }
        out
    }

    /// Reads a stored record. Every length is checked against the bytes that are there (a
    /// foreign value never sizes an allocation), and a leased record holds 1 to
    /// [`MAX_LEASED`] ids.
    ///
    /// # Errors
    /// [`LockError::CorruptRequest`] for anything [`Self::encode`] does not write.
    pub fn decode(stored: &[u8]) -> Result<Self, LockError> {
        let corrupt = LockError::CorruptRequest;
        let rest = stored.strip_prefix(MAGIC).ok_or(corrupt)?;
        let (state, rest) = rest.split_first().ok_or(corrupt)?;
        match (state, rest) {
            (b'C', []) => return Ok(Self::Cancelled),
            (b'D', []) => return Ok(Self::Released),
            (b'G', _) => {}
            _ => return Err(corrupt),
        }
        let (kind, rest) = rest.split_first().ok_or(corrupt)?;
        let fields = fields(rest, if *kind == b'S' { MAX_LEASED } else { 2 })?;
        let granted = match (kind, fields.as_slice()) {
            (b'L', [owner, token]) if !owner.is_empty() => {
                Granted::Lock { owner: owner.to_vec(), token: parse_token(token)? }
            }
            (b'R' | b'W', [owner, token]) if !owner.is_empty() => Granted::Rw {
                mode: if *kind == b'R' { Mode::Read } else { Mode::Write },
                owner: owner.to_vec(),
                token: parse_token(token)?,
            },
            (b'P', [n]) => Granted::Permits(parse_positive(n).ok_or(corrupt)?),
            (b'S', ids) if !ids.is_empty() && ids.iter().all(|id| !id.is_empty()) => {
                Granted::Leased(ids.iter().map(|id| id.to_vec()).collect())
            }
            _ => return Err(corrupt),
        };
        Ok(Self::Granted(granted))
    }
}

impl Record {
    /// The value stored for this record of a request on the lock `lock`: [`MAGIC`], the lock's
    /// name as a length-prefixed field, then the record as [`Self::encode`] writes it past its
    /// [`MAGIC`]. The name is there because the record key does not tell the lock apart:
    /// Redisson's prefix rule gives `a` with id `b:c` and `{a}:b` with id `c` (or `a` and `{a}`
    /// with the same id) the same key, and a cancel must never undo a grant on another lock.
    #[must_use]
    pub fn stored_for(&self, lock: &[u8]) -> Vec<u8> {
        let body = self.encode();
        let mut out = MAGIC.to_vec();
        push_field(&mut out, lock);
        out.extend_from_slice(&body[MAGIC.len()..]);
        out
    }

    /// Reads the value stored for a request on the lock `lock` (see [`Self::stored_for`]).
    ///
    /// # Errors
    /// [`LockError::CorruptRequest`] for anything [`Self::stored_for`] does not write;
    /// [`LockError::RequestMismatch`] for the record of a request on another lock whose record
    /// key is the same.
    pub fn load_for(stored: &[u8], lock: &[u8]) -> Result<Self, LockError> {
        let rest = stored.strip_prefix(MAGIC).ok_or(LockError::CorruptRequest)?;
        let (owner_lock, rest) = first_field(rest)?;
        let record = Self::decode(&[MAGIC, rest].concat())?;
        if owner_lock == lock {
            Ok(record)
        } else {
            Err(LockError::RequestMismatch)
        }
    }
}

/// The first length-prefixed field of `bytes` (`<decimal length>:<bytes>`), and what follows.
fn first_field(bytes: &[u8]) -> Result<(&[u8], &[u8]), LockError> {
    let corrupt = LockError::CorruptRequest;
    let colon = bytes.iter().take(20).position(|&b| b == b':').ok_or(corrupt)?;
    let len = match &bytes[..colon] {
        b"0" => 0,
        digits => parse_positive(digits).ok_or(corrupt)?,
    };
    let rest = &bytes[colon + 1..];
    let len = usize::try_from(len).ok().filter(|&len| len <= rest.len()).ok_or(corrupt)?;
    Ok(rest.split_at(len))
}

/// The length-prefixed fields of `bytes`, at most `max` of them.
fn fields(mut bytes: &[u8], max: usize) -> Result<Vec<&[u8]>, LockError> {
    let mut out = Vec::new();
    while !bytes.is_empty() {
        if out.len() >= max {
            return Err(LockError::CorruptRequest);
        }
        let (field, rest) = first_field(bytes)?;
        out.push(field);
        bytes = rest;
    }
    Ok(out)
}

fn parse_token(field: &[u8]) -> Result<Option<u64>, LockError> {
    match field {
        b"" => Ok(None),
        b"0" => Ok(Some(0)),
        digits => parse_positive(digits).map(Some).ok_or(LockError::CorruptRequest),
    }
}

impl Granted {
    /// Whether this grant answers `asked` (same kind, owner, side, permit count and `TOKEN`):
    /// only then is a retry a retry.
    #[must_use]
    pub fn answers(&self, asked: &Asked<'_>) -> bool {
        match (self, asked) {
            (Self::Lock { owner, token }, Asked::Lock { owner: o, token: t }) => {
                owner == o && token.is_some() == *t
            }
            (Self::Rw { mode, owner, token }, Asked::Rw { mode: m, owner: o, token: t }) => {
                mode == m && owner == o && token.is_some() == *t
            }
            (Self::Permits(n), Asked::Permits(m)) => n == m,
            (Self::Leased(ids), Asked::Leased(m)) => ids.len() as u64 == *m,
            _ => false,
        }
    }
}

/// What an acquire with a request id finds in its record, before anything else: `None`, a
/// new request (or one whose record expired); the grant a retry may replay (if it is still in
/// place, see [`replay`]).
///
/// # Errors
/// [`LockError::RequestCancelled`] for a cancelled request (it never gets anything, and never
/// waits); [`LockError::RequestMismatch`] when the record's grant answers another acquire.
pub fn check_retry<'r>(
    record: Option<&'r Record>,
    asked: &Asked<'_>,
) -> Result<Option<&'r Granted>, LockError> {
    match record {
        None | Some(Record::Released) => Ok(None),
        Some(Record::Cancelled) => Err(LockError::RequestCancelled),
        Some(Record::Granted(granted)) if granted.answers(asked) => Ok(Some(granted)),
        Some(Record::Granted(_)) => Err(LockError::RequestMismatch),
    }
}

/// What a retried acquire replies when its first grant is still in place: what the first one
/// replied (nil or `[1, token]`, `1`, the same ids: `Err` carries the ids); `None` when the
/// grant is gone (the lease ended, it was released): the retry runs as a new acquire.
#[must_use]
pub fn replay(granted: &Granted, in_place: bool) -> Option<Result<Reply, Vec<Vec<u8>>>> {
    if !in_place {
        return None;
    }
    Some(match granted {
        Granted::Lock { token, .. } | Granted::Rw { token, .. } => {
            Ok(crate::rules::granted(*token))
        }
        Granted::Permits(_) => Ok(Reply::Int(1)),
        Granted::Leased(ids) => Err(ids.clone()),
    })
}

/// What `RLOCK.CANCEL` undoes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cancel<'r> {
    /// The request waits in the lock's queue: it leaves it (reply 1).
    Dequeue,
    /// The request was granted this: give it back if it is still in place (reply 2), else
    /// nothing is left to undo (reply 0).
    GiveBack(&'r Granted),
    /// Nothing to undo (reply 0): never seen, not granted, or already cancelled.
    Nothing,
}

/// What `RLOCK.CANCEL` does for a request with this record that is (or is not) `waiting`. In
/// every case the record becomes [`Record::Cancelled`] afterwards.
#[must_use]
pub const fn cancel(record: Option<&Record>, waiting: bool) -> Cancel<'_> {
    match (record, waiting) {
        (_, true) => Cancel::Dequeue,
        (Some(Record::Granted(granted)), false) => Cancel::GiveBack(granted),
        (Some(Record::Cancelled | Record::Released) | None, false) => Cancel::Nothing,
    }
}

/// What `RSEM.RELEASE key permits REQUEST id` (or `ONCE id`) does with the request's record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CountedRelease {
    /// Give the permits back; the record then says released (a cancel of the request finds
    /// nothing to undo, a retried release gives back nothing more). Also an ownerless release's
    /// first send (`ONCE id`, no record yet).
    GiveBack,
    /// Nothing to give back; reply the count left. Already given back (released, or
    /// cancelled), or no record for `REQUEST id`: a counted grant's record lasts until it is released or
    /// cancelled, so none means this server never granted the request (its grant was made on
    /// a master that failed over before replicating it, or never happened). Giving back there
    /// would add permits that were never taken.
    Nothing,
}

/// What releasing `permits` counted permits as request `id` does, from its record. `once`: the
/// id is an ownerless release's own (`ONCE id`), not an acquire's: with no record it gives
/// back (the first send of that release).
///
/// # Errors
/// [`LockError::RequestMismatch`] when the record holds another acquire's grant (another kind,
/// or another permit count).
pub fn release_counted(
    record: Option<&Record>,
    permits: u64,
    once: bool,
) -> Result<CountedRelease, LockError> {
    match record {
        None if once => Ok(CountedRelease::GiveBack),
        Some(Record::Granted(Granted::Permits(n))) if *n == permits => Ok(CountedRelease::GiveBack),
        Some(Record::Granted(_)) => Err(LockError::RequestMismatch),
        Some(Record::Cancelled | Record::Released) | None => Ok(CountedRelease::Nothing),
    }
}

/// Until when (Unix ms) a request cancelled at `now` stays cancelled: [`CANCELLED_MS`], or
/// longer when the record it replaces lasts longer (`expire_at`: its deadline, the recorded
/// grant's lease end).
#[must_use]
pub fn cancelled_until(now: i64, expire_at: Option<i64>) -> i64 {
    now.saturating_add(CANCELLED_MS).max(expire_at.unwrap_or(i64::MIN))
}
