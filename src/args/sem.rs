//! The `RSEM.*` argument structs.

use super::session::{Session, SessionWords};
use super::{int, Arg, Lease, Parser, WaitFor, REQUEST, WAIT};
use crate::error::{IntArg, LockError};

/// The most leased permits one `RSEM.ACQUIRE ... LEASE` takes, and the most ids one
/// `RSEM.RELEASE ... ID` names. Each leased permit is a zset member written (and replicated) in
/// the call and an id in its reply: 10,000 of them cost the server what a `ZADD` of 10,000
/// members costs (most of the time goes there; 20 to 50 ms measured on a loaded 2-core machine)
/// and about 1 MB, where 3,000,000 blocked it for seconds and 2^32 hung it. Redisson's leased
/// acquires are typically a few permits (an id each); a client needing more takes them in
/// several calls.
pub const MAX_LEASED: usize = 10_000;

/// Reads a permit count: a positive integer, or (`zero_ok`) zero.
fn permits<A: Arg>(arg: &A, zero_ok: bool) -> Result<u64, LockError> {
    let arg_kind = if zero_ok { IntArg::PermitsOrZero } else { IntArg::Permits };
    int::unsigned(arg.bytes(), arg_kind)
}

/// `RSEM.SETPERMITS key permits` (zero or more).
#[derive(Debug)]
pub struct SemCount<'a, A> {
    pub key: &'a A,
    pub permits: u64,
}

impl<'a, A: Arg> SemCount<'a, A> {
    /// `RSEM.SETPERMITS key permits`.
    ///
    /// # Errors
    /// Wrong arity, or a count that is not a non-negative integer.
    pub fn parse_set(args: &'a [A]) -> Result<Self, LockError> {
        match args {
            [_, key, n] => Ok(Self { key, permits: permits(n, true)? }),
            _ => Err(LockError::WrongArity),
        }
    }
}

/// `RSEM.ADDPERMITS key delta`
#[derive(Debug)]
pub struct SemAdd<'a, A> {
    pub key: &'a A,
    pub delta: i64,
}

impl<'a, A: Arg> SemAdd<'a, A> {
    /// # Errors
    /// Wrong arity, or a delta that is not an integer that fits an `i64`.
    pub fn parse(args: &'a [A]) -> Result<Self, LockError> {
        let [_, key, delta] = args else { return Err(LockError::WrongArity) };
        let delta = int::integer(delta.bytes(), IntArg::Delta)?;
        Ok(Self { key, delta })
    }
}

/// Option word of `RSEM.ACQUIRE`: `LEASE lease-ms` (leased permits).
pub const LEASE: &[u8] = b"LEASE";
/// Option word of `RSEM.RELEASE`: `ID id [id ...]` (leased permits by id).
pub const ID: &[u8] = b"ID";
/// `RSEM.RELEASE key permits ONCE id`: an ownerless release, given back once per id.
pub const ONCE: &[u8] = b"ONCE";
/// `RSEM.ACQUIRE key permits REQUEST id OWNERLESS`: counted permits that will be released
/// ownerless (plain or `ONCE`), so the request's record lasts 60 s, not until released.
pub const OWNERLESS: &[u8] = b"OWNERLESS";

/// `RSEM.ACQUIRE key permits [LEASE lease-ms] [WAIT timeout-ms] [REQUEST id [OWNERLESS]]
/// [SESSION [LOCKDELAY lockdelay-ms]]` (`SESSION` with `LEASE` only, `OWNERLESS`
/// with `REQUEST` only; with `LEASE` it changes nothing: a leased grant's record ends with its
/// lease)
#[derive(Debug)]
pub struct SemAcquire<'a, A> {
    pub key: &'a A,
    pub permits: u64,
    /// `LEASE lease-ms`: leased permits, returned by id and reclaimed when the lease ends.
    pub lease: Option<Lease>,
    pub wait: Option<WaitFor>,
    /// `REQUEST id`: the outcome is remembered (see `args::Acquire`).
    pub request: Option<&'a A>,
    /// `SESSION`: each leased permit ends when the caller's connection closes.
    pub session: Option<Session>,
    /// `OWNERLESS`: a counted grant's request record lasts 60 s (the grant is given back by a
    /// plain or `ONCE` release) instead of until `RSEM.RELEASE key permits REQUEST id`.
    pub ownerless: bool,
}

impl<'a, A: Arg> SemAcquire<'a, A> {
    /// # Errors
    /// Wrong arity, a count that is not a positive integer (with `LEASE`: more than
    /// [`MAX_LEASED`]), a bad lease, timeout or lock-delay, an empty request id, `SESSION`
    /// without `LEASE`, `LOCKDELAY` without `SESSION`, or a leftover argument.
    pub fn parse(args: &'a [A]) -> Result<Self, LockError> {
        let mut p = Parser::new(args, 3)?;
        let key = p.required()?;
        let permits = permits(p.required()?, false)?;
        let (mut lease, mut wait, mut request) = (None, None, None);
        let mut session = SessionWords::default();
        let mut ownerless = false;
        loop {
            if lease.is_none() && p.option(LEASE) {
                let ms = p.take().ok_or(int::missing(IntArg::LeaseMs))?;
                lease = Some(Lease::parse(ms.bytes())?);
            } else if wait.is_none() && p.option(WAIT) {
                wait = Some(WaitFor::parse_after_word(p.take())?);
            } else if request.is_none() && p.peek_is(REQUEST) {
                request = p.request()?;
            } else if !ownerless && p.option(OWNERLESS) {
                ownerless = true;
            } else if !session.take(&mut p)? {
                break;
            }
        }
        p.finish()?;
        // Refused before anything is read: a waiter asking more would never be granted.
        if lease.is_some() && permits > MAX_LEASED as u64 {
            return Err(LockError::TooManyLeased);
        }
        let session = session.finish()?;
        if session.is_some() && lease.is_none() {
            // Counted permits have no owner and no id: nothing to bind to a connection.
            return Err(LockError::SessionNeedsLease);
        }
        if ownerless && request.is_none() {
            return Err(LockError::OwnerlessNeedsRequest);
        }
        Ok(Self { key, permits, lease, wait, request, session, ownerless })
    }
}

/// `RSEM.RELEASE key permits [REQUEST id | ONCE id]` or `RSEM.RELEASE key ID id [id ...]`
#[derive(Debug)]
pub enum SemRelease<'a, A> {
    /// `request`: the `REQUEST id` of the acquire whose counted permits these are, or (`once`)
    /// the `ONCE id` of an ownerless release.
    Count {
        key: &'a A,
        permits: u64,
        request: Option<&'a A>,
        once: bool,
    },
    Ids {
        key: &'a A,
        ids: &'a [A],
    },
}

impl<'a, A: Arg> SemRelease<'a, A> {
    /// # Errors
    /// Wrong arity, a count that is not a positive integer, or `ID` with no id, an empty one, or
    /// more than [`MAX_LEASED`].
    pub fn parse(args: &'a [A]) -> Result<Self, LockError> {
        match args {
            [_, key, word, ids @ ..] if word.bytes().eq_ignore_ascii_case(ID) => {
                if ids.is_empty() {
                    return Err(LockError::MissingPermitId);
                }
                if ids.iter().any(|id| id.bytes().is_empty()) {
                    return Err(LockError::InvalidPermitId);
                }
                if ids.len() > MAX_LEASED {
                    return Err(LockError::TooManyIds);
                }
                Ok(Self::Ids { key, ids })
            }
            [_, key, n] => {
                Ok(Self::Count { key, permits: permits(n, false)?, request: None, once: false })
            }
            [_, key, n, word, rest @ ..]
                if word.bytes().eq_ignore_ascii_case(REQUEST)
                    || word.bytes().eq_ignore_ascii_case(ONCE) =>
            {
                let permits = permits(n, false)?;
                let once = word.bytes().eq_ignore_ascii_case(ONCE);
                let (missing, empty) = if once {
                    (LockError::MissingOnce, LockError::InvalidOnce)
                } else {
                    (LockError::MissingRequest, LockError::InvalidRequest)
                };
                match rest {
                    [] => Err(missing),
                    [id] if id.bytes().is_empty() => Err(empty),
                    [id] => Ok(Self::Count { key, permits, request: Some(id), once }),
                    _ => Err(LockError::Syntax),
                }
            }
            // a word after the count that is neither REQUEST nor ONCE
            [_, _, n, _, ..] => {
                permits(n, false)?;
                Err(LockError::Syntax)
            }
            _ => Err(LockError::WrongArity),
        }
    }
}

/// `RSEM.RENEW key id lease-ms`: `RLOCK.RENEW`'s syntax, the permit id where the owner is.
///
/// # Errors
/// Wrong arity, an empty id, or a bad lease.
pub fn parse_renew<A: Arg>(args: &[A]) -> Result<super::Renew<'_, A>, LockError> {
    super::Renew::parse_named(args, LockError::EmptyId)
}
