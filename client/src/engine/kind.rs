//! What differs between the kinds of holds, as data: the commands that acquire, renew and
//! release each kind, and how their replies read. Everything else (requests, holds, chains) is
//! written once, in terms of these.

use std::sync::Arc;

use redis::{Cmd, RedisError, Value};

use crate::error::{Error, Result};

/// What a request asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Kind {
    /// A reentrant lock (`RLOCK.*`).
    Lock,
    /// The read side of a read-write lock (`RWLOCK.* READ`).
    Read,
    /// The write side of a read-write lock (`RWLOCK.* WRITE`).
    Write,
    /// Counted permits of a semaphore (`RSEM.ACQUIRE key n`): no owner, no lease.
    Counted(u64),
    /// Leased permits of a semaphore (`RSEM.ACQUIRE key n LEASE ms`), held by id.
    Leased(u64),
}

/// Who holds a grant on the server: an owner id (locks), or permit ids (leased permits).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Holder {
    /// The owner id the server stores the hold under.
    Owner(Arc<str>),
    /// The leased permits' ids.
    Ids(Arc<[Vec<u8>]>),
}

/// What the server granted.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct Grant {
    /// The fencing token (a lock or write hold asked with `TOKEN`).
    pub(crate) token: Option<u64>,
    /// The leased permits' ids.
    pub(crate) ids: Vec<Vec<u8>>,
}

/// The server's answer to an acquire.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Answer {
    /// Granted (by this command, or by a hand-off while it waited).
    Granted(Grant),
    /// Not granted: held by others, not enough permits, or the wait timed out.
    Busy,
}

impl Kind {
    /// Whether its grants carry a lease (and so have a deadline, renewal and release).
    pub(crate) const fn leased(self) -> bool {
        !matches!(self, Self::Counted(_))
    }

    /// Whether its re-entries and renewals take `GT` (the lease ends at the later of the current
    /// end and now plus the lease: one applied late never shortens it): locks and both sides.
    pub(crate) const fn takes_gt(self) -> bool {
        matches!(self, Self::Lock | Self::Read | Self::Write)
    }

    /// Whether it can take a fencing token (a read hold cannot; permits neither).
    pub(crate) const fn fenced(self) -> bool {
        matches!(self, Self::Lock | Self::Write)
    }

    /// `READ` / `WRITE` for the sides of a read-write lock.
    const fn side(self) -> Option<&'static str> {
        match self {
            Self::Read => Some("READ"),
            Self::Write => Some("WRITE"),
            _ => None,
        }
    }

    /// `<family>.<verb>` of this kind.
    fn verb(self, verb: &str) -> Cmd {
        let family = match self {
            Self::Lock => "RLOCK",
            Self::Read | Self::Write => "RWLOCK",
            Self::Counted(_) | Self::Leased(_) => "RSEM",
        };
        redis::cmd(&format!("{family}.{verb}"))
    }

    /// The acquire command of request `request`: `WAIT wait_ms` when given, `TOKEN` when asked
    /// and this kind takes one. `owner` is ignored by permits, `lease_ms` by counted permits.
    pub(crate) fn acquire(
        self,
        key: &[u8],
        owner: &str,
        lease_ms: u64,
        wait_ms: Option<u64>,
        token: bool,
        request: &str,
    ) -> Cmd {
        let mut cmd = self.verb("ACQUIRE");
        cmd.arg(key);
        match self {
            Self::Lock | Self::Read | Self::Write => {
                cmd.arg(owner);
                if let Some(side) = self.side() {
                    cmd.arg(side);
                }
                cmd.arg(lease_ms);
            }
            Self::Counted(n) => {
                cmd.arg(n);
            }
            Self::Leased(n) => {
                cmd.arg(n).arg("LEASE").arg(lease_ms);
            }
        }
        if let Some(wait_ms) = wait_ms {
            cmd.arg("WAIT").arg(wait_ms);
        }
        if token && self.fenced() {
            cmd.arg("TOKEN");
        }
        cmd.arg("REQUEST").arg(request);
        if let Self::Counted(_) = self {
            // Given back ownerless (`Semaphore::release`, `ONCE id`): the request's record
            // lasts 60 s (a retry or a cancel of this acquire), not until a release names it.
            cmd.arg("OWNERLESS");
        }
        cmd
    }

    /// Reads an acquire's reply: locks `nil` / pttl, or with `TOKEN` `[1, token]` / `[0, pttl]`;
    /// counted permits `1` / `0`; leased permits an array of ids / `nil`.
    ///
    /// # Errors
    /// A reply of another shape (the caller cannot tell what happened).
    pub(crate) fn answer(self, reply: &Value) -> Result<Answer> {
        use Value::{Array, BulkString, Int, Nil};
        let granted = |token| Ok(Answer::Granted(Grant { token, ids: Vec::new() }));
        match (self, reply) {
            (Self::Lock | Self::Read | Self::Write, Nil) => granted(None),
            (Self::Lock | Self::Read | Self::Write, Int(_)) => Ok(Answer::Busy),
            (Self::Lock | Self::Write, Array(parts)) => match parts.as_slice() {
                [Int(1), Int(token)] => granted(u64::try_from(*token).ok()),
                [Int(1), Nil] => granted(None),
                [Int(0), Int(_)] => Ok(Answer::Busy),
                _ => Err(unexpected("acquire", reply)),
            },
            (Self::Counted(_), Int(1)) => granted(None),
            (Self::Counted(_), Int(0)) | (Self::Leased(_), Nil) => Ok(Answer::Busy),
            (Self::Leased(n), Array(items)) if u64::try_from(items.len()).ok() == Some(n) => {
                let ids = items.iter().map(|v| match v {
                    BulkString(id) => Some(id.clone()),
                    _ => None,
                });
                match ids.collect::<Option<Vec<_>>>() {
                    Some(ids) => Ok(Answer::Granted(Grant { token: None, ids })),
                    None => Err(unexpected("acquire", reply)),
                }
            }
            _ => Err(unexpected("acquire", reply)),
        }
    }

    /// The renewal of `holder`'s hold to `lease_ms`, checked on this kind's side: one command
    /// per permit id for leased permits. Counted permits have none.
    pub(crate) fn renew(self, key: &[u8], holder: &Holder, lease_ms: u64) -> Vec<Cmd> {
        match (self, holder) {
            (Self::Lock | Self::Read | Self::Write, Holder::Owner(owner)) => {
                let mut cmd = self.verb("RENEW");
                cmd.arg(key).arg(&**owner).arg(lease_ms);
                if let Some(side) = self.side() {
                    cmd.arg(side);
                }
                vec![cmd]
            }
            (Self::Leased(_), Holder::Ids(ids)) => ids
                .iter()
                .map(|id| {
                    let mut cmd = self.verb("RENEW");
                    cmd.arg(key).arg(id).arg(lease_ms);
                    cmd
                })
                .collect(),
            _ => Vec::new(),
        }
    }

    /// Reads the renewals' replies: `true` when every one renewed (`1`).
    ///
    /// # Errors
    /// A reply of another shape.
    pub(crate) fn renewed(replies: &[Value]) -> Result<bool> {
        let mut all = true;
        for reply in replies {
            match reply {
                Value::Int(1) => {}
                Value::Int(0) => all = false,
                other => return Err(unexpected("renewal", other)),
            }
        }
        Ok(all && !replies.is_empty())
    }

    /// The release of `holder`'s hold; `latch` makes a retried release of a lock reply what
    /// the first one did (`REQUEST id`). Leased permits are released by id (a retry finds them
    /// gone). Counted permits have none.
    pub(crate) fn release(self, key: &[u8], holder: &Holder, latch: &str) -> Option<Cmd> {
        let mut cmd = self.verb("RELEASE");
        cmd.arg(key);
        match (self, holder) {
            (Self::Lock | Self::Read | Self::Write, Holder::Owner(owner)) => {
                cmd.arg(&**owner);
                if let Some(side) = self.side() {
                    cmd.arg(side);
                }
                cmd.arg("REQUEST").arg(latch);
            }
            (Self::Leased(_), Holder::Ids(ids)) => {
                cmd.arg("ID").arg(&**ids);
            }
            _ => return None,
        }
        Some(cmd)
    }

    /// Reads a release's reply: `true` released, `false` not held (nothing changed).
    ///
    /// # Errors
    /// A reply of another shape.
    pub(crate) fn released(self, reply: &Value, holder: &Holder) -> Result<bool> {
        match (self, reply) {
            (Self::Lock | Self::Read | Self::Write, Value::Int(0 | 1)) => Ok(true),
            (Self::Lock | Self::Read | Self::Write, Value::Nil) => Ok(false),
            (Self::Leased(_), Value::Int(n)) => {
                let distinct = match holder {
                    Holder::Ids(ids) => {
                        let mut ids: Vec<&Vec<u8>> = ids.iter().collect();
                        ids.sort();
                        ids.dedup();
                        ids.len()
                    }
                    _ => 0,
                };
                Ok(usize::try_from(*n).is_ok_and(|n| n == distinct && n > 0))
            }
            _ => Err(unexpected("release", reply)),
        }
    }

    /// The hash field `owner`'s hold of this side is stored under (`HEXISTS` checks it).
    pub(crate) fn field(self, owner: &str) -> String {
        match self {
            Self::Write => format!("{owner}:write"),
            _ => owner.to_owned(),
        }
    }

    /// `RLOCK.FORCERELEASE` or `RWLOCK.FORCERELEASE`.
    pub(crate) fn force_release(self, key: &[u8]) -> Cmd {
        let mut cmd = self.verb("FORCERELEASE");
        cmd.arg(key);
        cmd
    }
}

/// The server's record of the request `id` on `key` (written when it is granted):
/// `rlock_request:{<key>}:<id>`, or `rlock_request:<key>:<id>` when the key has a brace.
pub(crate) fn record(key: &[u8], id: &str) -> Vec<u8> {
    let braced = key.contains(&b'{');
    let mut out = b"rlock_request:".to_vec();
    if !braced {
        out.push(b'{');
    }
    out.extend_from_slice(key);
    if !braced {
        out.push(b'}');
    }
    out.push(b':');
    out.extend_from_slice(id.as_bytes());
    out
}

/// `RLOCK.CANCEL key request`: undoes whatever the request got, whatever its kind.
pub(crate) fn cancel(key: &[u8], request: &str) -> Cmd {
    let mut cmd = redis::cmd("RLOCK.CANCEL");
    cmd.arg(key).arg(request);
    cmd
}

/// A reply of a shape the client does not know.
pub(crate) fn unexpected(what: &str, reply: &Value) -> Error {
    Error::Redis(RedisError::from((
        redis::ErrorKind::UnexpectedReturnType,
        "unexpected reply",
        format!("{what}: {reply:?}"),
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(cmd: &Cmd) -> Vec<String> {
        cmd.args_iter()
            .map(|a| match a {
                redis::Arg::Simple(b) => String::from_utf8_lossy(b).into_owned(),
                _ => "<cursor>".to_owned(),
            })
            .collect()
    }

    #[test]
    fn a_request_s_record_key_follows_the_server_s_prefix_rule() {
        assert_eq!(record(b"job", "r1"), b"rlock_request:{job}:r1");
        assert_eq!(record(b"a{7}b", "r1"), b"rlock_request:a{7}b:r1");
    }

    #[test]
    fn acquire_commands_carry_the_request_and_only_the_options_their_kind_takes() {
        let a = |kind: Kind, wait, token| args(&kind.acquire(b"k", "o", 100, wait, token, "r1"));
        assert_eq!(
            a(Kind::Lock, None, true),
            ["RLOCK.ACQUIRE", "k", "o", "100", "TOKEN", "REQUEST", "r1"]
        );
        assert_eq!(
            a(Kind::Read, Some(5), true),
            ["RWLOCK.ACQUIRE", "k", "o", "READ", "100", "WAIT", "5", "REQUEST", "r1"]
        );
        assert_eq!(
            a(Kind::Write, Some(5), true),
            ["RWLOCK.ACQUIRE", "k", "o", "WRITE", "100", "WAIT", "5", "TOKEN", "REQUEST", "r1"]
        );
        assert_eq!(
            a(Kind::Counted(3), Some(0), true),
            ["RSEM.ACQUIRE", "k", "3", "WAIT", "0", "REQUEST", "r1", "OWNERLESS"]
        );
        assert_eq!(
            a(Kind::Leased(2), None, false),
            ["RSEM.ACQUIRE", "k", "2", "LEASE", "100", "REQUEST", "r1"]
        );
    }

    #[test]
    fn acquire_replies_read_as_grants_or_busy_and_anything_else_is_an_error() {
        use Value::{Array, BulkString, Int, Nil};
        let granted = |token| Some(Answer::Granted(Grant { token, ids: vec![] }));
        assert_eq!(Kind::Lock.answer(&Nil).ok(), granted(None));
        assert_eq!(Kind::Write.answer(&Int(-1)).ok(), Some(Answer::Busy));
        assert_eq!(Kind::Lock.answer(&Array(vec![Int(1), Int(7)])).ok(), granted(Some(7)));
        assert_eq!(Kind::Write.answer(&Array(vec![Int(0), Int(12)])).ok(), Some(Answer::Busy));
        assert!(Kind::Read.answer(&Array(vec![Int(1), Int(7)])).is_err(), "a read takes no token");
        assert!(Kind::Lock.answer(&Array(vec![Int(2), Int(7)])).is_err());
        assert_eq!(Kind::Counted(2).answer(&Int(1)).ok(), granted(None));
        assert_eq!(Kind::Counted(2).answer(&Int(0)).ok(), Some(Answer::Busy));
        assert!(Kind::Counted(2).answer(&Nil).is_err());
        let ids = Array(vec![BulkString(vec![1; 16]), BulkString(vec![2; 16])]);
        assert_eq!(
            Kind::Leased(2).answer(&ids).ok(),
            Some(Answer::Granted(Grant { token: None, ids: vec![vec![1; 16], vec![2; 16]] }))
        );
        assert!(Kind::Leased(3).answer(&ids).is_err(), "as many ids as permits asked");
        assert!(Kind::Leased(1).answer(&Array(vec![Int(1)])).is_err());
        assert_eq!(Kind::Leased(1).answer(&Nil).ok(), Some(Answer::Busy));
    }

    #[test]
    fn renewals_and_releases_name_their_side_and_read_their_replies() {
        let owner = Holder::Owner(Arc::from("o"));
        let r = |kind: Kind| kind.renew(b"k", &owner, 30).iter().map(args).collect::<Vec<_>>();
        assert_eq!(r(Kind::Lock), [["RLOCK.RENEW", "k", "o", "30"]]);
        assert_eq!(r(Kind::Write), [["RWLOCK.RENEW", "k", "o", "30", "WRITE"]]);
        assert_eq!(r(Kind::Read), [["RWLOCK.RENEW", "k", "o", "30", "READ"]]);
        let ids = Holder::Ids(Arc::from(vec![b"a".to_vec(), b"b".to_vec()]));
        assert_eq!(Kind::Leased(2).renew(b"k", &ids, 9).len(), 2);
        assert!(Kind::Counted(1).renew(b"k", &owner, 9).is_empty());
        assert_eq!(Kind::renewed(&[Value::Int(1), Value::Int(1)]).ok(), Some(true));
        assert_eq!(Kind::renewed(&[Value::Int(1), Value::Int(0)]).ok(), Some(false));
        assert_eq!(Kind::renewed(&[]).ok(), Some(false));
        assert!(Kind::renewed(&[Value::Nil]).is_err());

        let release = Kind::Read.release(b"k", &owner, "l1").map(|c| args(&c)).unwrap_or_default();
        assert_eq!(release, ["RWLOCK.RELEASE", "k", "o", "READ", "REQUEST", "l1"]);
        let release =
            Kind::Leased(2).release(b"k", &ids, "l1").map(|c| args(&c)).unwrap_or_default();
        assert_eq!(release, ["RSEM.RELEASE", "k", "ID", "a", "b"]);
        assert!(Kind::Counted(1).release(b"k", &owner, "l1").is_none());
        assert_eq!(Kind::Lock.released(&Value::Int(0), &owner).ok(), Some(true));
        assert_eq!(Kind::Lock.released(&Value::Nil, &owner).ok(), Some(false));
        assert_eq!(Kind::Leased(2).released(&Value::Int(2), &ids).ok(), Some(true));
        assert_eq!(Kind::Leased(2).released(&Value::Int(0), &ids).ok(), Some(false));
        assert_eq!(Kind::Write.field("o"), "o:write");
    }
}
