//! The session options of the acquires: `SESSION` (the hold ends when the caller's connection
//! closes) and `LOCKDELAY lockdelay-ms` (after such an end, nobody gets the lock for that long).

use super::{parse_positive, Arg, Parser};
use crate::error::LockError;
use crate::sessions::MAX_LOCK_DELAY_MS;

/// Option word of `RLOCK.ACQUIRE`, `RWLOCK.ACQUIRE` and leased `RSEM.ACQUIRE`: `SESSION`.
pub const SESSION: &[u8] = b"SESSION";
/// Option word (with `SESSION` only): `LOCKDELAY lockdelay-ms`.
pub const LOCKDELAY: &[u8] = b"LOCKDELAY";

/// `SESSION [LOCKDELAY lockdelay-ms]`, as an acquire asked it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Session {
    /// The lock-delay after a hold ended by its connection closing (0: none).
    pub delay_ms: u64,
}

/// Reads `lockdelay-ms`: an integer from 0 to [`MAX_LOCK_DELAY_MS`].
///
/// # Errors
/// [`LockError::InvalidLockDelay`] for anything else.
pub fn parse_delay(bytes: &[u8]) -> Result<u64, LockError> {
    if bytes == b"0" {
        return Ok(0);
    }
    parse_positive(bytes).filter(|&ms| ms <= MAX_LOCK_DELAY_MS).ok_or(LockError::InvalidLockDelay)
}

/// `SESSION` and `LOCKDELAY ms` as an acquire's option loop reads them, in any order among its
/// other options.
#[derive(Debug, Default)]
pub(crate) struct SessionWords {
    session: bool,
    delay: Option<u64>,
}

impl SessionWords {
    /// Takes `SESSION` or `LOCKDELAY ms` if it comes next (each at most once); returns whether
    /// it took one.
    ///
    /// # Errors
    /// [`LockError::InvalidLockDelay`].
    pub(crate) fn take<A: Arg>(&mut self, p: &mut Parser<'_, A>) -> Result<bool, LockError> {
        if !self.session && p.option(SESSION) {
            self.session = true;
            return Ok(true);
        }
        if self.delay.is_none() && p.option(LOCKDELAY) {
            let ms = p.take().ok_or(LockError::InvalidLockDelay)?;
            self.delay = Some(parse_delay(ms.bytes())?);
            return Ok(true);
        }
        Ok(false)
    }

    /// The session asked for, if any.
    ///
    /// # Errors
    /// [`LockError::LockDelayNeedsSession`]: `LOCKDELAY` without `SESSION`.
    pub(crate) const fn finish(self) -> Result<Option<Session>, LockError> {
        match (self.session, self.delay) {
            (false, Some(_)) => Err(LockError::LockDelayNeedsSession),
            (false, None) => Ok(None),
            (true, delay) => Ok(Some(Session {
                delay_ms: match delay {
                    Some(ms) => ms,
                    None => 0,
                },
            })),
        }
    }
}
