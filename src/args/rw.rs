//! The `RWLOCK.*` argument structs.

use super::session::{Session, SessionWords};
use super::{Arg, Lease, Mode, Parser, WaitFor, GT, READ, REQUEST, TOKEN, WAIT, WRITE};
use crate::error::LockError;

/// `RWLOCK.ACQUIRE key owner READ|WRITE lease-ms [WAIT timeout-ms] [TOKEN] [REQUEST id]
/// [SESSION [LOCKDELAY lockdelay-ms]] [GT]`
#[derive(Debug)]
pub struct RwAcquire<'a, A> {
    pub key: &'a A,
    pub owner: &'a A,
    pub mode: Mode,
    pub lease: Lease,
    pub wait: Option<WaitFor>,
    /// `TOKEN` (WRITE only): a grant also yields a fencing token.
    pub token: bool,
    /// `REQUEST id`: the outcome is remembered (see `args::Acquire`).
    pub request: Option<&'a A>,
    /// `SESSION`: the hold (this side) ends when the caller's connection closes.
    pub session: Option<Session>,
    /// `GT`: a re-entry never shortens a lease (see `rw_rules::Reads`).
    pub gt: bool,
}

impl<'a, A: Arg> RwAcquire<'a, A> {
    /// # Errors
    /// Wrong arity, empty owner or request id, bad mode, lease, timeout or lock-delay, `TOKEN`
    /// with `READ`, `LOCKDELAY` without `SESSION`, or a leftover argument.
    pub fn parse(args: &'a [A]) -> Result<Self, LockError> {
        let mut p = Parser::new(args, 5)?;
        let (key, owner) = (p.required()?, p.owner()?);
        let mode = Mode::parse(p.required()?.bytes())?;
        let lease = p.lease()?;
        let (mut wait, mut token, mut request, mut gt) = (None, false, None, false);
        let mut session = SessionWords::default();
        loop {
            if wait.is_none() && p.option(WAIT) {
                wait = Some(WaitFor::parse_after_word(p.take())?);
            } else if !token && mode == Mode::Write && p.option(TOKEN) {
                token = true;
            } else if !gt && p.option(GT) {
                gt = true;
            } else if request.is_none() && p.peek_is(REQUEST) {
                request = p.request()?;
            } else if !session.take(&mut p)? {
                break;
            }
        }
        p.finish()?;
        super::check_request_owner(owner, request)?;
        let session = session.finish()?;
        Ok(Self { key, owner, mode, lease, wait, token, request, session, gt })
    }
}

/// `RWLOCK.RELEASE key owner READ|WRITE [REQUEST id]`
#[derive(Debug)]
pub struct RwRelease<'a, A> {
    pub key: &'a A,
    pub owner: &'a A,
    pub mode: Mode,
    pub request: Option<&'a A>,
}

impl<'a, A: Arg> RwRelease<'a, A> {
    /// # Errors
    /// Wrong arity, empty owner or request id, bad mode, or a leftover argument.
    pub fn parse(args: &'a [A]) -> Result<Self, LockError> {
        let mut p = Parser::new(args, 4)?;
        let (key, owner) = (p.required()?, p.owner()?);
        let mode = Mode::parse(p.required()?.bytes())?;
        let request = p.request()?;
        p.finish()?;
        Ok(Self { key, owner, mode, request })
    }
}

/// `RWLOCK.RENEW key owner lease-ms [READ|WRITE] [GT]` (the two options in either order)
#[derive(Debug)]
pub struct RwRenew<'a, A> {
    pub key: &'a A,
    pub owner: &'a A,
    pub lease: Lease,
    /// `READ|WRITE`: renew only if the owner holds that side (`None`: every hold it has).
    pub mode: Option<Mode>,
    /// `GT`: no lease is shortened (see `rw_rules::Reads`).
    pub gt: bool,
}

impl<'a, A: Arg> RwRenew<'a, A> {
    /// # Errors
    /// Wrong arity, empty owner, bad lease or mode, or a leftover argument.
    pub fn parse(args: &'a [A]) -> Result<Self, LockError> {
        let mut p = Parser::new(args, 4)?;
        let (key, owner, lease) = (p.required()?, p.owner()?, p.lease()?);
        let (mut mode, mut gt) = (None, false);
        loop {
            if !gt && p.option(GT) {
                gt = true;
            } else if mode.is_none() && (p.peek_is(READ) || p.peek_is(WRITE)) {
                mode = p.take().map(|m| Mode::parse(m.bytes())).transpose()?;
            } else {
                break;
            }
        }
        // Anything else where the mode may come is a bad mode, as before `GT` existed.
        if mode.is_none() && !p.peek_is(GT) {
            if let Some(other) = p.take() {
                Mode::parse(other.bytes())?;
            }
        }
        p.finish()?;
        Ok(Self { key, owner, lease, mode, gt })
    }
}
