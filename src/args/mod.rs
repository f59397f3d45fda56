//! Argument parsing: each command's arguments are read once into a typed struct, ending with a
//! check that nothing is left over. Plain Rust over byte strings, so it runs without a server.

pub mod int;
pub mod latch;
pub mod rw;
pub mod sem;
pub mod session;
pub mod waiters;

pub use latch::{LatchAwait, LatchCountDown, LatchSet};
pub use rw::{RwAcquire, RwRelease, RwRenew};
pub use sem::{SemAcquire, SemAdd, SemCount, SemRelease};
pub use session::Session;
pub use waiters::Waiters;

use crate::error::{IntArg, LockError};

/// Something that can be read as a command argument: a `RedisString` inside the server, a byte
/// slice in tests.
pub trait Arg {
    /// The argument's bytes (binary-safe: NUL bytes and non-UTF-8 allowed).
    fn bytes(&self) -> &[u8];
}

impl Arg for [u8] {
    fn bytes(&self) -> &[u8] {
        self
    }
}

impl Arg for &[u8] {
    fn bytes(&self) -> &[u8] {
        self
    }
}

impl<const N: usize> Arg for &[u8; N] {
    fn bytes(&self) -> &[u8] {
        &self[..]
    }
}

impl Arg for Vec<u8> {
    fn bytes(&self) -> &[u8] {
        self
    }
}

impl Arg for &str {
    fn bytes(&self) -> &[u8] {
        str::as_bytes(self)
    }
}

impl Arg for redis_module::RedisString {
    fn bytes(&self) -> &[u8] {
        self.as_slice()
    }
}

/// Option words of `RLOCK.ACQUIRE` (matched case-insensitively): `WAIT timeout-ms`, `TOKEN`.
pub const WAIT: &[u8] = b"WAIT";
pub const TOKEN: &[u8] = b"TOKEN";
/// Option word of the re-entrant and read-write acquires and renewals: `GT` (a hold the owner
/// already has keeps the later of its lease end and the new one, like `PEXPIRE ... GT`).
pub const GT: &[u8] = b"GT";
/// Option word of every release and acquire: `REQUEST id`.
pub const REQUEST: &[u8] = b"REQUEST";
/// The mode words of `RWLOCK.*`.
pub const READ: &[u8] = b"READ";
pub const WRITE: &[u8] = b"WRITE";

/// The longest owner an acquire with `REQUEST id` may have: its request record holds the owner,
/// and a record is read whole (`store::request`), so its size is bounded.
pub const MAX_REQUEST_OWNER: usize = 64 * 1024;

/// Refuses an owner too long for a request record.
///
/// # Errors
/// [`LockError::RequestOwnerTooLong`].
pub(crate) fn check_request_owner<A: Arg>(owner: &A, request: Option<&A>) -> Result<(), LockError> {
    if request.is_some() && owner.bytes().len() > MAX_REQUEST_OWNER {
        Err(LockError::RequestOwnerTooLong)
    } else {
        Ok(())
    }
}

/// A read-write lock's mode, and what an `RWLOCK.*` operation concerns (`READ` or `WRITE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Read,
    Write,
}

impl Mode {
    /// Reads `READ` or `WRITE` (any case).
    ///
    /// # Errors
    /// [`LockError::InvalidMode`] for anything else.
    pub fn parse(bytes: &[u8]) -> Result<Self, LockError> {
        if bytes.eq_ignore_ascii_case(READ) {
            Ok(Self::Read)
        } else if bytes.eq_ignore_ascii_case(WRITE) {
            Ok(Self::Write)
        } else {
            Err(LockError::InvalidMode)
        }
    }
}

/// How long `RLOCK.ACQUIRE ... WAIT` may block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitFor {
    /// `WAIT 0`: without limit, like `BLPOP key 0`.
    Ever,
    /// At most this many milliseconds (> 0).
    Millis(u64),
}

impl WaitFor {
    /// Reads `timeout-ms`: a non-negative decimal integer that fits an `i64`.
    ///
    /// # Errors
    /// [`LockError::BadInteger`] for anything else.
    pub fn parse(bytes: &[u8]) -> Result<Self, LockError> {
        match int::unsigned(bytes, IntArg::TimeoutMs)? {
            0 => Ok(Self::Ever),
            ms => Ok(Self::Millis(ms)),
        }
    }

    /// Reads the value after `WAIT` (`None`: it came last).
    ///
    /// # Errors
    /// As [`Self::parse`]; a missing value is [`LockError::BadInteger`] too.
    pub fn parse_after_word<A: Arg>(value: Option<&A>) -> Result<Self, LockError> {
        Self::parse(value.ok_or(int::missing(IntArg::TimeoutMs))?.bytes())
    }
}

/// A lease: a positive number of milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Lease(u64);

impl Lease {
    /// The lease of a request that takes none (a semaphore waiter's).
    pub const UNUSED: Self = Self(1);

    /// A lease of `ms` milliseconds; `None` for zero.
    #[must_use]
    pub const fn from_millis(ms: u64) -> Option<Self> {
        if ms == 0 {
            None
        } else {
            Some(Self(ms))
        }
    }

    /// The lease in milliseconds (always > 0).
    #[must_use]
    pub const fn as_millis(self) -> u64 {
        self.0
    }

    /// Reads `lease-ms`: a positive decimal integer that fits an `i64`.
    ///
    /// # Errors
    /// [`LockError::BadInteger`] for anything else (zero, negative, signs, spaces, overflow).
    pub fn parse(bytes: &[u8]) -> Result<Self, LockError> {
        int::unsigned(bytes, IntArg::LeaseMs).map(Self)
    }
}

/// Parses a strictly positive decimal integer that fits an `i64`: digits only, no sign, no
/// leading zero, no spaces. The form Redis itself writes for hash counters.
#[must_use]
pub fn parse_positive(bytes: &[u8]) -> Option<u64> {
    if bytes.is_empty() || bytes.len() > 19 || bytes[0] == b'0' {
        return None;
    }
    let mut n: u64 = 0;
    for &b in bytes {
        if !b.is_ascii_digit() {
            return None;
        }
        n = n.checked_mul(10)?.checked_add(u64::from(b - b'0'))?;
    }
    (n <= i64::MAX as u64).then_some(n)
}

/// Reads a command's arguments left to right; `finish` rejects leftovers.
pub(crate) struct Parser<'a, A> {
    args: &'a [A],
    next: usize,
}

impl<'a, A: Arg> Parser<'a, A> {
    /// Starts after the command name. `min` is the command's minimum argument count
    /// (the command name included); fewer is the standard wrong-arity error.
    pub(crate) fn new(args: &'a [A], min: usize) -> Result<Self, LockError> {
        if args.len() < min {
            return Err(LockError::WrongArity);
        }
        Ok(Self { args, next: 1 })
    }

    pub(crate) fn take(&mut self) -> Option<&'a A> {
        let arg = self.args.get(self.next)?;
        self.next += 1;
        Some(arg)
    }

    /// A mandatory argument; `new` already checked there are enough of them.
    pub(crate) fn required(&mut self) -> Result<&'a A, LockError> {
        self.take().ok_or(LockError::WrongArity)
    }

    pub(crate) fn owner(&mut self) -> Result<&'a A, LockError> {
        self.named(LockError::EmptyOwner)
    }

    /// The next argument, a name that must not be empty (`empty`: the error if it is).
    pub(crate) fn named(&mut self, empty: LockError) -> Result<&'a A, LockError> {
        let name = self.required()?;
        if name.bytes().is_empty() {
            return Err(empty);
        }
        Ok(name)
    }

    pub(crate) fn lease(&mut self) -> Result<Lease, LockError> {
        Lease::parse(self.required()?.bytes())
    }

    /// Whether every argument was read (no option follows).
    pub(crate) const fn done(&self) -> bool {
        self.next >= self.args.len()
    }

    /// Whether the next argument is the option word `word` (not consumed).
    pub(crate) fn peek_is(&self, word: &[u8]) -> bool {
        self.args.get(self.next).is_some_and(|a| a.bytes().eq_ignore_ascii_case(word))
    }

    /// The next argument if it is the option word `word`.
    pub(crate) fn option(&mut self, word: &[u8]) -> bool {
        let is_word = self.peek_is(word);
        if is_word {
            self.next += 1;
        }
        is_word
    }

    /// `REQUEST id`, if next.
    pub(crate) fn request(&mut self) -> Result<Option<&'a A>, LockError> {
        if !self.option(REQUEST) {
            return Ok(None);
        }
        let id = self.take().ok_or(LockError::MissingRequest)?;
        if id.bytes().is_empty() {
            return Err(LockError::InvalidRequest);
        }
        Ok(Some(id))
    }

    pub(crate) fn optional_lease(&mut self) -> Result<Option<Lease>, LockError> {
        self.take().map(|a| Lease::parse(a.bytes())).transpose()
    }

    pub(crate) fn finish(self) -> Result<(), LockError> {
        if self.next < self.args.len() {
            Err(LockError::Syntax)
        } else {
            Ok(())
        }
    }
}

/// `RLOCK.ACQUIRE key owner lease-ms [WAIT timeout-ms] [TOKEN] [REQUEST id]
/// [SESSION [LOCKDELAY lockdelay-ms]] [GT]`
#[derive(Debug)]
pub struct Acquire<'a, A> {
    pub key: &'a A,
    pub owner: &'a A,
    pub lease: Lease,
    /// `WAIT timeout-ms`: block while another owner holds the lock.
    pub wait: Option<WaitFor>,
    /// `TOKEN`: a grant also yields a fencing token (reply `[1, token]` / `[0, pttl]`).
    pub token: bool,
    /// `REQUEST id`: the outcome is remembered (a retry replies the first grant; `RLOCK.CANCEL`
    /// undoes it).
    pub request: Option<&'a A>,
    /// `SESSION`: the hold ends when the caller's connection closes.
    pub session: Option<Session>,
    /// `GT`: a re-entry never shortens the lease (see `rules::Extend`).
    pub gt: bool,
}

impl<'a, A: Arg> Acquire<'a, A> {
    /// # Errors
    /// Wrong arity, empty owner or request id, bad lease, timeout or lock-delay, `LOCKDELAY`
    /// without `SESSION`, or a leftover argument.
    pub fn parse(args: &'a [A]) -> Result<Self, LockError> {
        let mut p = Parser::new(args, 4)?;
        let (key, owner, lease) = (p.required()?, p.owner()?, p.lease()?);
        let (mut wait, mut token, mut request, mut gt) = (None, false, None, false);
        let mut session = session::SessionWords::default();
        while !p.done() {
            if wait.is_none() && p.option(WAIT) {
                wait = Some(WaitFor::parse_after_word(p.take())?);
            } else if !token && p.option(TOKEN) {
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
        check_request_owner(owner, request)?;
        let session = session.finish()?;
        Ok(Self { key, owner, lease, wait, token, request, session, gt })
    }
}

/// `RLOCK.CANCEL key id`: undo whatever acquire request `id` got on the lock (any kind) `key`.
#[derive(Debug)]
pub struct Cancel<'a, A> {
    pub key: &'a A,
    pub request: &'a A,
}

impl<'a, A: Arg> Cancel<'a, A> {
    /// # Errors
    /// Wrong arity, or an empty request id.
    pub fn parse(args: &'a [A]) -> Result<Self, LockError> {
        let [_, key, request] = args else { return Err(LockError::WrongArity) };
        if request.bytes().is_empty() {
            return Err(LockError::EmptyId);
        }
        Ok(Self { key, request })
    }
}

/// `RLOCK.RELEASE key owner [lease-ms] [REQUEST id]`
#[derive(Debug)]
pub struct Release<'a, A> {
    pub key: &'a A,
    pub owner: &'a A,
    /// When given, a lock still held after this release gets this lease.
    pub lease: Option<Lease>,
    /// `REQUEST id`: a retry with the same id returns the first result.
    pub request: Option<&'a A>,
}

impl<'a, A: Arg> Release<'a, A> {
    /// # Errors
    /// Wrong arity, empty owner or request id, bad lease, or a leftover argument.
    pub fn parse(args: &'a [A]) -> Result<Self, LockError> {
        let mut p = Parser::new(args, 3)?;
        let (key, owner) = (p.required()?, p.owner()?);
        let lease = if p.peek_is(REQUEST) { None } else { p.optional_lease()? };
        let request = p.request()?;
        p.finish()?;
        Ok(Self { key, owner, lease, request })
    }
}

/// `RLOCK.RENEW key owner lease-ms [GT]` (and `RSEM.RENEW key id lease-ms`, without `GT`)
#[derive(Debug)]
pub struct Renew<'a, A> {
    pub key: &'a A,
    pub owner: &'a A,
    pub lease: Lease,
    /// `GT`: the lease is never shortened (see `rules::Extend`).
    pub gt: bool,
}

impl<'a, A: Arg> Renew<'a, A> {
    /// # Errors
    /// Wrong arity, empty owner, bad lease, or a leftover argument.
    pub fn parse(args: &'a [A]) -> Result<Self, LockError> {
        let mut p = Parser::new(args, 4)?;
        let (key, owner, lease) = (p.required()?, p.owner()?, p.lease()?);
        let gt = p.option(GT);
        p.finish()?;
        Ok(Self { key, owner, lease, gt })
    }

    /// `<command> key name lease-ms`, the name (an owner, a permit id) refused with `empty` when
    /// it is empty.
    ///
    /// # Errors
    /// Wrong arity, empty name, bad lease, or a leftover argument.
    pub fn parse_named(args: &'a [A], empty: LockError) -> Result<Self, LockError> {
        let mut p = Parser::new(args, 4)?;
        let (key, owner, lease) = (p.required()?, p.named(empty)?, p.lease()?);
        let parsed = Self { key, owner, lease, gt: false };
        p.finish()?;
        Ok(parsed)
    }
}

/// The commands that take only a key: `RLOCK.PTTL key`, `RLOCK.FORCERELEASE key`,
/// `RLOCK.INFO key`. Fixed arity, like Redis's own `PTTL`: any other count is wrong arity.
#[derive(Debug)]
pub struct KeyOnly<'a, A> {
    pub key: &'a A,
}

impl<'a, A: Arg> KeyOnly<'a, A> {
    /// # Errors
    /// Wrong arity.
    pub fn parse(args: &'a [A]) -> Result<Self, LockError> {
        match args {
            [_, key] => Ok(Self { key }),
            _ => Err(LockError::WrongArity),
        }
    }
}
