//! `RLOCK.WAITERS`, `RWLOCK.WAITERS`, `RSEM.WAITERS`: `key [COUNT n]`.

use super::{parse_positive, Arg, Parser};
use crate::error::LockError;

/// Option word of `*.WAITERS`: `COUNT n`.
pub const COUNT: &[u8] = b"COUNT";

/// How many waiters `*.WAITERS` lists without `COUNT`.
pub const DEFAULT_WAITERS: usize = 10;

/// The most waiters one `*.WAITERS` call lists (`COUNT` above it is refused): the reply is
/// built with the server blocked.
pub const MAX_WAITERS: usize = 1_000;

/// `RLOCK.WAITERS key [COUNT n]` (and the `RWLOCK.`/`RSEM.` ones).
#[derive(Debug)]
pub struct Waiters<'a, A> {
    pub key: &'a A,
    /// How many waiters to list at most: 1 to [`MAX_WAITERS`].
    pub count: usize,
}

impl<'a, A: Arg> Waiters<'a, A> {
    /// # Errors
    /// Wrong arity, `COUNT` without a value or with one that is not an integer from 1 to
    /// [`MAX_WAITERS`], or a leftover argument.
    pub fn parse(args: &'a [A]) -> Result<Self, LockError> {
        let mut p = Parser::new(args, 2)?;
        let key = p.required()?;
        let mut count = DEFAULT_WAITERS;
        if p.option(COUNT) {
            let n = p.take().ok_or(LockError::InvalidCount)?;
            count = parse_positive(n.bytes())
                .and_then(|n| usize::try_from(n).ok())
                .filter(|&n| n <= MAX_WAITERS)
                .ok_or(LockError::InvalidCount)?;
        }
        p.finish()?;
        Ok(Self { key, count })
    }
}
