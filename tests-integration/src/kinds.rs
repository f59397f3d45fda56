//! The five kinds of hold a request can be made for (a reentrant lock, a read-write lock's read
//! and write sides, counted and leased semaphore permits), as the commands of each: its acquire
//! (with `REQUEST id`), a holder that makes it wait, its release, its replies read, and who
//! holds it. The cancellation tests run every test on each kind.

use redis::{Connection, Value};

use crate::helpers::{cmd, hgetall, run_str};

/// The lock kinds a request may be made for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Lock,
    Read,
    Write,
    Counted,
    Leased,
}

/// Every [`Kind`].
pub const KINDS: [Kind; 5] = [Kind::Lock, Kind::Read, Kind::Write, Kind::Counted, Kind::Leased];

/// `args` as owned strings.
#[must_use]
pub fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|a| (*a).to_owned()).collect()
}

/// Runs a command given as owned strings.
///
/// # Errors
/// The server's error reply, as text.
pub fn run_strings(con: &mut Connection, args: &[String]) -> Result<Value, String> {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    run_str(con, &args)
}

impl Kind {
    /// The resource of this kind the tests use, prefixed (an ACL pattern, say).
    #[must_use]
    pub fn key(self, prefix: &str) -> String {
        format!("{prefix}{self:?}").to_lowercase()
    }

    /// Prepares the resource: a semaphore of one permit.
    pub fn setup(self, con: &mut Connection, key: &str) {
        if matches!(self, Self::Counted | Self::Leased) {
            cmd(con, &["RSEM.SETPERMITS", key, "1"]);
        }
    }

    /// The acquire of `owner`, with `REQUEST id` if given, then `extra`.
    #[must_use]
    pub fn acquire(self, key: &str, owner: &str, id: Option<&str>, extra: &[&str]) -> Vec<String> {
        let mut a = match self {
            Self::Lock => strings(&["RLOCK.ACQUIRE", key, owner, "30000"]),
            Self::Read => strings(&["RWLOCK.ACQUIRE", key, owner, "READ", "30000"]),
            Self::Write => strings(&["RWLOCK.ACQUIRE", key, owner, "WRITE", "30000"]),
            Self::Counted => strings(&["RSEM.ACQUIRE", key, "1"]),
            Self::Leased => strings(&["RSEM.ACQUIRE", key, "1", "LEASE", "30000"]),
        };
        a.extend(strings(extra));
        if let Some(id) = id {
            a.extend(strings(&["REQUEST", id]));
        }
        a
    }

    /// A request of another client that conflicts with this kind's grant (it waits for it).
    #[must_use]
    pub fn rival(self, key: &str, extra: &[&str]) -> Vec<String> {
        match self {
            Self::Read => Self::Write.acquire(key, "rival", None, extra),
            other => other.acquire(key, "rival", None, extra),
        }
    }

    /// Takes the resource for a holder that makes this kind's requests wait.
    ///
    /// # Panics
    /// When it is not taken.
    pub fn occupy(self, con: &mut Connection, key: &str) {
        let args = match self {
            Self::Lock => strings(&["RLOCK.ACQUIRE", key, "holder", "30000"]),
            Self::Read => strings(&["RWLOCK.ACQUIRE", key, "holder", "WRITE", "30000"]),
            Self::Write => strings(&["RWLOCK.ACQUIRE", key, "holder", "READ", "30000"]),
            Self::Counted | Self::Leased => strings(&["RSEM.ACQUIRE", key, "1"]),
        };
        let reply = run_strings(con, &args).expect("occupy");
        assert!(matches!(reply, Value::Nil | Value::Int(1)), "{self:?} occupied: {reply:?}");
    }

    /// The command that gives back what [`Self::occupy`] took (to run or to queue).
    #[must_use]
    pub fn vacate_args(self, key: &str) -> Vec<String> {
        match self {
            Self::Lock => strings(&["RLOCK.RELEASE", key, "holder"]),
            Self::Read => strings(&["RWLOCK.RELEASE", key, "holder", "WRITE"]),
            Self::Write => strings(&["RWLOCK.RELEASE", key, "holder", "READ"]),
            Self::Counted | Self::Leased => strings(&["RSEM.RELEASE", key, "1"]),
        }
    }

    /// Gives back what [`Self::occupy`] took.
    ///
    /// # Panics
    /// When the release fails.
    pub fn vacate(self, con: &mut Connection, key: &str) {
        run_strings(con, &self.vacate_args(key)).expect("vacate");
    }

    /// Releases the grant `reply` gave `owner`.
    ///
    /// # Panics
    /// When the release fails, or `reply` is no leased grant for [`Kind::Leased`].
    pub fn release(self, con: &mut Connection, key: &str, owner: &str, reply: &Value) {
        let args = match (self, reply) {
            (Self::Lock, _) => strings(&["RLOCK.RELEASE", key, owner]),
            (Self::Read, _) => strings(&["RWLOCK.RELEASE", key, owner, "READ"]),
            (Self::Write, _) => strings(&["RWLOCK.RELEASE", key, owner, "WRITE"]),
            (Self::Counted, _) => strings(&["RSEM.RELEASE", key, "1"]),
            (Self::Leased, Value::Array(ids)) => {
                let Value::BulkString(id) = &ids[0] else { panic!("{ids:?}") };
                let released: i64 = redis::cmd("RSEM.RELEASE")
                    .arg(key)
                    .arg("ID")
                    .arg(id)
                    .query(con)
                    .expect("RSEM.RELEASE ID");
                assert_eq!(released, 1);
                return;
            }
            (Self::Leased, other) => panic!("not leased ids: {other:?}"),
        };
        run_strings(con, &args).expect("release");
    }

    /// Whether `reply` is this kind's grant.
    #[must_use]
    pub fn granted(self, reply: &Value) -> bool {
        match self {
            Self::Lock | Self::Read | Self::Write => *reply == Value::Nil,
            Self::Counted => *reply == Value::Int(1),
            Self::Leased => matches!(reply, Value::Array(ids) if ids.len() == 1),
        }
    }

    /// Whether `reply` is this kind's not-granted reply (busy, or a wait that timed out).
    #[must_use]
    pub fn not_granted(self, reply: &Value) -> bool {
        match self {
            Self::Lock | Self::Read | Self::Write => matches!(reply, Value::Int(_)),
            Self::Counted => *reply == Value::Int(0),
            Self::Leased => *reply == Value::Nil,
        }
    }

    /// Who holds the resource: the lock's owner fields (`<owner>:write` for a writer), the
    /// leased permit ids, `taken` for counted permits out of the one [`Self::setup`] set.
    ///
    /// # Panics
    /// When the reads fail, or the semaphore counts more permits than that one.
    pub fn holders(self, con: &mut Connection, key: &str) -> Vec<String> {
        let (out, out_of_one) = self.read_holders(con, key);
        assert!(out_of_one >= 0, "{self:?}: more permits than set: {out:?}");
        out
    }

    /// [`Self::holders`] of a resource that may count more than one permit (two names that
    /// share a lease zset, say): the leased ids as they are, and no `taken` beyond them.
    ///
    /// # Panics
    /// When the reads fail.
    pub fn holders_as_seen(self, con: &mut Connection, key: &str) -> Vec<String> {
        self.read_holders(con, key).0
    }

    /// The holders, and how many counted permits of one are out beyond them (negative when the
    /// semaphore counts more than one).
    fn read_holders(self, con: &mut Connection, key: &str) -> (Vec<String>, i64) {
        match self {
            Self::Lock | Self::Read | Self::Write => {
                let fields = hgetall(con, key.as_bytes())
                    .into_iter()
                    .map(|(f, _)| String::from_utf8_lossy(&f).into_owned())
                    .filter(|f| f != "mode")
                    .collect();
                (fields, 0)
            }
            Self::Counted | Self::Leased => {
                let zset = format!("{{{key}}}:timeout");
                // One atomic read: a lease the server reclaims between two separate reads would
                // count its permit twice (in the set and back in the count).
                let (ids, count): (Vec<Vec<u8>>, Option<String>) = redis::pipe()
                    .atomic()
                    .cmd("ZRANGE")
                    .arg(&zset)
                    .arg(0)
                    .arg(-1)
                    .cmd("GET")
                    .arg(key)
                    .query(con)
                    .expect("ZRANGE, GET");
                let mut out: Vec<String> = ids.iter().map(|id| format!("{id:02x?}")).collect();
                let left = count.as_deref().unwrap_or("0").parse::<i64>().expect("count");
                let out_of_one = 1 - left - out.len() as i64;
                out.extend((0..out_of_one).map(|_| "taken".to_owned()));
                (out, out_of_one)
            }
        }
    }
}
