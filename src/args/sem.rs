//! The `RSEM.*` argument structs.

use super::{parse_positive, Arg, Parser, WaitFor, WAIT};
use crate::error::LockError;

/// Reads a permit count: a positive integer, or (`zero_ok`) zero.
fn permits<A: Arg>(arg: &A, zero_ok: bool) -> Result<u64, LockError> {
    match arg.bytes() {
        b"0" if zero_ok => Ok(0),
        bytes => parse_positive(bytes).ok_or(LockError::InvalidPermits),
    }
}

/// `RSEM.SETPERMITS key permits` (zero or more) and `RSEM.RELEASE key permits` (positive).
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

    /// `RSEM.RELEASE key permits`.
    ///
    /// # Errors
    /// Wrong arity, or a count that is not a positive integer.
    pub fn parse_release(args: &'a [A]) -> Result<Self, LockError> {
        match args {
            [_, key, n] => Ok(Self { key, permits: permits(n, false)? }),
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
        let delta = match delta.bytes() {
            b"0" => Some(0),
            [b'-', digits @ ..] => parse_positive(digits).map(|n| -(n as i64)),
            digits => parse_positive(digits).map(|n| n as i64),
        };
        Ok(Self { key, delta: delta.ok_or(LockError::InvalidDelta)? })
    }
}

/// `RSEM.ACQUIRE key permits [WAIT timeout-ms]`
#[derive(Debug)]
pub struct SemAcquire<'a, A> {
    pub key: &'a A,
    pub permits: u64,
    pub wait: Option<WaitFor>,
}

impl<'a, A: Arg> SemAcquire<'a, A> {
    /// # Errors
    /// Wrong arity, a count that is not a positive integer, a bad timeout, or a leftover
    /// argument.
    pub fn parse(args: &'a [A]) -> Result<Self, LockError> {
        let mut p = Parser::new(args, 3)?;
        let key = p.required()?;
        let permits = permits(p.required()?, false)?;
        let wait = if p.option(WAIT) {
            let timeout = p.take().ok_or(LockError::InvalidTimeout)?;
            Some(WaitFor::parse(timeout.bytes())?)
        } else {
            None
        };
        p.finish()?;
        Ok(Self { key, permits, wait })
    }
}
