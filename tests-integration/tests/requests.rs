//! Exact cancellation (issue 24, part A): `REQUEST id` on every acquire (a retry replies the
//! first grant and adds nothing), `RLOCK.CANCEL key id` (gives a grant back, dequeues a waiter,
//! and makes sure the request never gets anything later), and the side-checked
//! `RWLOCK.RENEW key owner lease-ms READ|WRITE`. Every test runs each kind: a reentrant lock, a
//! read-write lock's read and write sides, counted and leased semaphore permits.

use std::time::{Duration, Instant};

use redis::{Connection, Value};
use rlock_tests_integration::{
    assert_replica_matches, blocked_clients, cmd, digest, hgetall, info_field, pexpiretime, poll,
    run_str, wait_blocked, wait_replica_online, Pending, Server,
};

const LIMIT: Duration = Duration::from_secs(10);

fn exists(con: &mut Connection, key: &str) -> bool {
    redis::cmd("EXISTS").arg(key).query::<i64>(con).expect("EXISTS") == 1
}

/// The lock kinds a request may be made for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Lock,
    Read,
    Write,
    Counted,
    Leased,
}

const KINDS: [Kind; 5] = [Kind::Lock, Kind::Read, Kind::Write, Kind::Counted, Kind::Leased];

fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|a| (*a).to_owned()).collect()
}

/// Runs a command given as owned strings.
fn go(con: &mut Connection, args: &[String]) -> Result<Value, String> {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    run_str(con, &args)
}

/// The request record of request `id` on the lock `key` (a name without braces).
fn record(key: &str, id: &str) -> String {
    format!("rlock_request:{{{key}}}:{id}")
}

/// What a record holds (`None`: no record).
fn stored(con: &mut Connection, key: &str, id: &str) -> Option<Vec<u8>> {
    redis::cmd("GET").arg(record(key, id)).query(con).expect("GET")
}

fn cancelled(con: &mut Connection, key: &str, id: &str) -> bool {
    stored(con, key, id).is_some_and(|v| v == b"rlock-request:1:C")
}

impl Kind {
    /// The resource of this kind the tests use, prefixed (an ACL pattern, say).
    fn key(self, prefix: &str) -> String {
        format!("{prefix}{self:?}").to_lowercase()
    }

    /// Prepares the resource: a semaphore of one permit.
    fn setup(self, con: &mut Connection, key: &str) {
        if matches!(self, Self::Counted | Self::Leased) {
            cmd(con, &["RSEM.SETPERMITS", key, "1"]);
        }
    }

    /// The acquire of `owner`, with `REQUEST id` if given, then `extra`.
    fn acquire(self, key: &str, owner: &str, id: Option<&str>, extra: &[&str]) -> Vec<String> {
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
    fn rival(self, key: &str, extra: &[&str]) -> Vec<String> {
        match self {
            Self::Read => Self::Write.acquire(key, "rival", None, extra),
            other => other.acquire(key, "rival", None, extra),
        }
    }

    /// Takes the resource for a holder that makes this kind's requests wait.
    fn occupy(self, con: &mut Connection, key: &str) {
        let args = match self {
            Self::Lock => strings(&["RLOCK.ACQUIRE", key, "holder", "30000"]),
            Self::Read => strings(&["RWLOCK.ACQUIRE", key, "holder", "WRITE", "30000"]),
            Self::Write => strings(&["RWLOCK.ACQUIRE", key, "holder", "READ", "30000"]),
            Self::Counted | Self::Leased => strings(&["RSEM.ACQUIRE", key, "1"]),
        };
        let reply = go(con, &args).expect("occupy");
        assert!(matches!(reply, Value::Nil | Value::Int(1)), "{self:?} occupied: {reply:?}");
    }

    /// Gives back what [`Self::occupy`] took.
    fn vacate(self, con: &mut Connection, key: &str) {
        let args = match self {
            Self::Lock => strings(&["RLOCK.RELEASE", key, "holder"]),
            Self::Read => strings(&["RWLOCK.RELEASE", key, "holder", "WRITE"]),
            Self::Write => strings(&["RWLOCK.RELEASE", key, "holder", "READ"]),
            Self::Counted | Self::Leased => strings(&["RSEM.RELEASE", key, "1"]),
        };
        go(con, &args).expect("vacate");
    }

    /// Releases the grant `reply` gave `owner`.
    fn release(self, con: &mut Connection, key: &str, owner: &str, reply: &Value) {
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
        go(con, &args).expect("release");
    }

    /// Whether `reply` is this kind's grant.
    fn granted(self, reply: &Value) -> bool {
        match self {
            Self::Lock | Self::Read | Self::Write => *reply == Value::Nil,
            Self::Counted => *reply == Value::Int(1),
            Self::Leased => matches!(reply, Value::Array(ids) if ids.len() == 1),
        }
    }

    /// Whether `reply` is this kind's not-granted reply (busy, or a wait that timed out).
    fn not_granted(self, reply: &Value) -> bool {
        match self {
            Self::Lock | Self::Read | Self::Write => matches!(reply, Value::Int(_)),
            Self::Counted => *reply == Value::Int(0),
            Self::Leased => *reply == Value::Nil,
        }
    }

    /// Who holds the resource: the lock's owner fields (`<owner>:write` for a writer), the
    /// leased permit ids, `taken` for counted permits out.
    fn holders(self, con: &mut Connection, key: &str) -> Vec<String> {
        match self {
            Self::Lock | Self::Read | Self::Write => hgetall(con, key.as_bytes())
                .into_iter()
                .map(|(f, _)| String::from_utf8_lossy(&f).into_owned())
                .filter(|f| f != "mode")
                .collect(),
            Self::Counted | Self::Leased => {
                let zset = format!("{{{key}}}:timeout");
                let ids: Vec<Vec<u8>> =
                    redis::cmd("ZRANGE").arg(&zset).arg(0).arg(-1).query(con).expect("ZRANGE");
                let mut out: Vec<String> = ids.iter().map(|id| format!("{id:02x?}")).collect();
                let count: Option<String> = redis::cmd("GET").arg(key).query(con).expect("GET");
                let left = count.as_deref().unwrap_or("0").parse::<i64>().expect("count");
                let out_of_one = 1 - left - out.len() as i64;
                assert!(out_of_one >= 0, "{self:?}: more permits than set: {left} + {out:?}");
                out.extend((0..out_of_one).map(|_| "taken".to_owned()));
                out
            }
        }
    }
}

// ---- A1. a retried acquire -------------------------------------------------------------------

/// A retry with the same request id replies what the first grant replied and changes nothing
/// (no second count, no lease change, no second permit); once the grant is gone it is a new
/// acquire.
#[test]
fn a1_a_retried_acquire_replies_the_first_grant_and_adds_nothing() {
    let server = Server::start();
    let mut con = server.conn();
    for kind in KINDS {
        let key = kind.key("");
        kind.setup(&mut con, &key);
        let first = go(&mut con, &kind.acquire(&key, "o", Some("r1"), &[])).expect("acquire");
        assert!(kind.granted(&first), "{kind:?}: {first:?}");
        let holders = kind.holders(&mut con, &key);
        let before = digest(&mut con);
        for _ in 0..3 {
            let retry = go(&mut con, &kind.acquire(&key, "o", Some("r1"), &[])).expect("retry");
            assert_eq!(retry, first, "{kind:?}: the first reply");
            assert_eq!(digest(&mut con), before, "{kind:?}: the retry changed nothing");
        }
        assert_eq!(kind.holders(&mut con, &key), holders, "{kind:?}");
        // The record lasts as long as the grant's lease (counted permits: 60 s).
        let until = pexpiretime(&mut con, record(&key, "r1").as_bytes());
        let lease_end = match kind {
            Kind::Lock | Kind::Write => pexpiretime(&mut con, key.as_bytes()),
            Kind::Read => pexpiretime(&mut con, format!("{{{key}}}:o:rwlock_timeout:1").as_bytes()),
            Kind::Counted => until,
            Kind::Leased => {
                let score: f64 = redis::cmd("ZSCORE")
                    .arg(format!("{{{key}}}:timeout"))
                    .arg(match &first {
                        Value::Array(ids) => match &ids[0] {
                            Value::BulkString(id) => id.clone(),
                            other => panic!("{other:?}"),
                        },
                        other => panic!("{other:?}"),
                    })
                    .query(&mut con)
                    .expect("ZSCORE");
                score as i64
            }
        };
        assert_eq!(until, lease_end, "{kind:?}: the record ends with the grant's lease");
        let now = rlock_tests_integration::server_time_ms(&mut con);
        assert!(until > now + 25_000 && until <= now + 60_000, "{kind:?}: {until} vs {now}");
        // Released: a retry is a new acquire (counted permits carry no owner: replayed).
        kind.release(&mut con, &key, "o", &first);
        let again = go(&mut con, &kind.acquire(&key, "o", Some("r1"), &[])).expect("again");
        assert!(kind.granted(&again), "{kind:?}: {again:?}");
        let expected = if kind == Kind::Counted { 0 } else { 1 };
        assert_eq!(kind.holders(&mut con, &key).len(), expected, "{kind:?}");
    }
    // With TOKEN: the same token, not a new one.
    for args in [
        &["RLOCK.ACQUIRE", "t1", "o", "30000", "TOKEN", "REQUEST", "r"][..],
        &["RWLOCK.ACQUIRE", "t2", "o", "WRITE", "30000", "REQUEST", "r", "TOKEN"],
    ] {
        let first = cmd(&mut con, args);
        assert_eq!(first, Value::Array(vec![Value::Int(1), Value::Int(1)]), "{args:?}");
        assert_eq!(cmd(&mut con, args), first, "{args:?}: the same token");
        assert_eq!(cmd(&mut con, &["GET", &format!("redisson_lock_token:{{{}}}", args[1])]),
            Value::BulkString(b"1".to_vec()));
    }
    // The same id for another acquire (another owner, side, count, or TOKEN): refused.
    for args in [
        &["RLOCK.ACQUIRE", "lock", "x", "30000", "REQUEST", "r1"][..],
        &["RLOCK.ACQUIRE", "t1", "o", "30000", "REQUEST", "r"],
        &["RWLOCK.ACQUIRE", "read", "o", "WRITE", "30000", "REQUEST", "r1"],
        &["RSEM.ACQUIRE", "counted", "2", "REQUEST", "r1"],
    ] {
        let before = digest(&mut con);
        let err = run_str(&mut con, args).expect_err("another acquire");
        assert!(err.starts_with(&format!("ERR request {} belongs to another acquire", args[args.len() - 1])), "{args:?}: {err}");
        assert_eq!(digest(&mut con), before, "{args:?}");
    }
}

// ---- A2. RLOCK.CANCEL --------------------------------------------------------------------------

/// The blocked-command form of an acquire (a thread of its own).
fn start(server: &Server, args: &[String]) -> Pending {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    Pending::start_str(server, &args)
}

/// `RLOCK.CANCEL` of a granted request gives the grant back (2): its waiters are served, the
/// layout shows it gone. A retried cancel replies 0 and changes nothing; the request is then
/// refused for good, at once even with `WAIT`.
#[test]
fn a2_cancel_gives_a_granted_request_back_once_and_it_never_gets_anything_again() {
    let server = Server::start();
    let mut con = server.conn();
    for kind in KINDS {
        let key = kind.key("");
        kind.setup(&mut con, &key);
        let first = go(&mut con, &kind.acquire(&key, "o", Some("r1"), &[])).expect("acquire");
        assert!(kind.granted(&first), "{kind:?}: {first:?}");
        let rival = start(&server, &kind.rival(&key, &["WAIT", "0"]));
        wait_blocked(&mut con, 1);
        assert_eq!(cmd(&mut con, &["RLOCK.CANCEL", &key, "r1"]), Value::Int(2), "{kind:?}");
        let rival_grant = rival.reply(LIMIT).0.expect("served");
        let rival_kind = if kind == Kind::Read { Kind::Write } else { kind };
        assert!(rival_kind.granted(&rival_grant), "{kind:?}: the waiter is served");
        let holders = kind.holders(&mut con, &key);
        let expected = match kind {
            Kind::Lock => vec!["rival".to_owned()],
            Kind::Read | Kind::Write => vec!["rival:write".to_owned()],
            Kind::Counted => vec!["taken".to_owned()],
            Kind::Leased => holders.clone(),
        };
        assert_eq!(holders, expected, "{kind:?}: only the waiter holds");
        assert_eq!(holders.len(), 1, "{kind:?}: {holders:?}");
        assert!(!exists(&mut con, &format!("{{{key}}}:o:rwlock_timeout:1")), "{kind:?}");
        assert!(cancelled(&mut con, &key, "r1"), "{kind:?}: the record says cancelled");
        let ttl: i64 = redis::cmd("PTTL").arg(record(&key, "r1")).query(&mut con).expect("PTTL");
        assert!(ttl > 50_000 && ttl <= 60_000, "{kind:?}: cancelled for 60 s: {ttl}");
        // A retried cancel: 0, and nothing changes (not even the record's expiry).
        let before = digest(&mut con);
        assert_eq!(cmd(&mut con, &["RLOCK.CANCEL", &key, "r1"]), Value::Int(0), "{kind:?}");
        assert_eq!(digest(&mut con), before, "{kind:?}: a retried cancel changes nothing");
        // The request gets nothing later: refused at once, even where it would wait.
        rival_kind.release(&mut con, &key, "rival", &rival_grant);
        let before = digest(&mut con);
        for extra in [&[][..], &["WAIT", "0"]] {
            let args = kind.acquire(&key, "o", Some("r1"), extra);
            let err = go(&mut con, &args).expect_err("cancelled");
            assert_eq!(err, "ERR request r1 was cancelled", "{kind:?} {extra:?}");
        }
        assert_eq!(blocked_clients(&mut con), 0);
        assert_eq!(digest(&mut con), before, "{kind:?}: a cancelled acquire changes nothing");
    }
}

/// `RLOCK.CANCEL` of a waiting request takes it out of the queue (1): its blocked client is
/// answered at once with the not-granted reply, and nothing is granted to it later.
#[test]
fn a2_cancel_dequeues_a_waiting_request_and_answers_its_client_at_once() {
    let server = Server::start();
    let mut con = server.conn();
    for kind in KINDS {
        let key = kind.key("");
        kind.setup(&mut con, &key);
        kind.occupy(&mut con, &key);
        let waiter = start(&server, &kind.acquire(&key, "o", Some("r1"), &["WAIT", "0"]));
        wait_blocked(&mut con, 1);
        // The same request again, while it waits: refused, nothing changes.
        let before = digest(&mut con);
        let err = go(&mut con, &kind.acquire(&key, "o", Some("r1"), &["WAIT", "0"]))
            .expect_err("already waiting");
        assert_eq!(err, "ERR request r1 is already waiting", "{kind:?}");
        assert_eq!(digest(&mut con), before);
        let asked = Instant::now();
        assert_eq!(cmd(&mut con, &["RLOCK.CANCEL", &key, "r1"]), Value::Int(1), "{kind:?}");
        let (reply, at) = waiter.reply(LIMIT);
        assert!(kind.not_granted(&reply.expect("a reply")), "{kind:?}: the not-granted reply");
        assert!(at.duration_since(asked) < Duration::from_secs(2), "{kind:?}: at once");
        assert_eq!(blocked_clients(&mut con), 0, "{kind:?}: the queue is empty");
        assert!(cancelled(&mut con, &key, "r1"), "{kind:?}");
        kind.vacate(&mut con, &key);
        assert!(kind.holders(&mut con, &key).is_empty(), "{kind:?}: nothing granted to it");
        let err = go(&mut con, &kind.acquire(&key, "o", Some("r1"), &[])).expect_err("cancelled");
        assert_eq!(err, "ERR request r1 was cancelled", "{kind:?}");
    }
    // The waiters behind a cancelled head are served at once (it asked for more than is free).
    cmd(&mut con, &["RSEM.SETPERMITS", "s", "1"]);
    let head = Pending::start_str(&server, &["RSEM.ACQUIRE", "s", "2", "WAIT", "0", "REQUEST", "h"]);
    wait_blocked(&mut con, 1);
    let next = Pending::start_str(&server, &["RSEM.ACQUIRE", "s", "1", "WAIT", "0"]);
    wait_blocked(&mut con, 2);
    assert_eq!(cmd(&mut con, &["RLOCK.CANCEL", "s", "h"]), Value::Int(1));
    assert_eq!(head.reply(LIMIT).0, Ok(Value::Int(0)));
    assert_eq!(next.reply(LIMIT).0, Ok(Value::Int(1)), "served by the cancel");
    assert_eq!(cmd(&mut con, &["GET", "s"]), Value::BulkString(b"0".to_vec()));
}

/// `RLOCK.CANCEL` of a request never seen: 0, and the request is refused from then on (an
/// acquire still in flight cannot get anything after its cancel).
#[test]
fn a2_cancel_of_an_unknown_request_is_0_and_refuses_it_for_good() {
    let server = Server::start();
    let mut con = server.conn();
    for kind in KINDS {
        let key = kind.key("");
        kind.setup(&mut con, &key);
        assert_eq!(cmd(&mut con, &["RLOCK.CANCEL", &key, "r9"]), Value::Int(0), "{kind:?}");
        assert!(cancelled(&mut con, &key, "r9"));
        let err = go(&mut con, &kind.acquire(&key, "o", Some("r9"), &[])).expect_err("cancelled");
        assert_eq!(err, "ERR request r9 was cancelled", "{kind:?}");
        kind.occupy(&mut con, &key);
        let err = go(&mut con, &kind.acquire(&key, "o", Some("r9"), &["WAIT", "0"]))
            .expect_err("cancelled, not waiting");
        assert_eq!(err, "ERR request r9 was cancelled", "{kind:?}");
        assert_eq!(blocked_clients(&mut con), 0, "{kind:?}: never blocks");
        // A request that was refused as busy wrote nothing: nothing to undo either.
        let busy = go(&mut con, &kind.acquire(&key, "o", Some("r8"), &[])).expect("busy");
        assert!(kind.not_granted(&busy), "{kind:?}: {busy:?}");
        assert_eq!(stored(&mut con, &key, "r8"), None, "{kind:?}: no record");
        assert_eq!(cmd(&mut con, &["RLOCK.CANCEL", &key, "r8"]), Value::Int(0), "{kind:?}");
        kind.vacate(&mut con, &key);
        assert!(kind.holders(&mut con, &key).is_empty(), "{kind:?}");
    }
}

/// A request granted by a hand-off (it waited) has its record written by the hand-off: a retry
/// replays it, and `RLOCK.CANCEL` gives it back.
#[test]
fn a2_a_hand_off_grant_is_recorded_and_cancel_gives_it_back() {
    let server = Server::start();
    let mut con = server.conn();
    for kind in KINDS {
        let key = kind.key("");
        kind.setup(&mut con, &key);
        kind.occupy(&mut con, &key);
        let waiter = start(&server, &kind.acquire(&key, "o", Some("r1"), &["WAIT", "0"]));
        wait_blocked(&mut con, 1);
        kind.vacate(&mut con, &key);
        let granted = waiter.reply(LIMIT).0.expect("granted");
        assert!(kind.granted(&granted), "{kind:?}: {granted:?}");
        assert!(stored(&mut con, &key, "r1").is_some_and(|r| r.starts_with(b"rlock-request:1:G")));
        let retry = go(&mut con, &kind.acquire(&key, "o", Some("r1"), &["WAIT", "0"]));
        assert_eq!(retry, Ok(granted), "{kind:?}: the hand-off's grant, replayed");
        assert_eq!(kind.holders(&mut con, &key).len(), 1, "{kind:?}");
        assert_eq!(cmd(&mut con, &["RLOCK.CANCEL", &key, "r1"]), Value::Int(2), "{kind:?}");
        assert!(kind.holders(&mut con, &key).is_empty(), "{kind:?}: given back");
    }
}

/// A grant to a waiter that left before its reply is rolled back on a timer; the rollback makes
/// the request cancelled, so a later cancel gives nothing back twice (a counted semaphore's
/// count would grow). And a cancel (or a retry) that comes before the rollback: the grant is
/// given back once, by whichever comes first.
#[test]
fn a2_a_rolled_back_grant_is_cancelled_and_never_given_back_twice() {
    let server = Server::start();
    let mut con = server.conn();
    for (round, kind) in KINDS.iter().flat_map(|k| [(0, *k), (1, *k)]) {
        let key = kind.key(&format!("{round}"));
        kind.setup(&mut con, &key);
        kind.occupy(&mut con, &key);
        let waiter = start(&server, &kind.acquire(&key, "o", Some("r1"), &["WAIT", "0"]));
        wait_blocked(&mut con, 1);
        let rolled = info_field(&mut con, "rlock", "rlock_grants_rolled_back");
        let id = waiter.client_id().to_string();
        cmd(&mut con, &["MULTI"]);
        kind.vacate(&mut con, &key);
        cmd(&mut con, &["CLIENT", "KILL", "ID", &id]);
        if round == 1 {
            // Before the rollback's timer: a retry is refused, the cancel gives it back.
            go(&mut con, &kind.acquire(&key, "o", Some("r1"), &[])).expect("queued");
            cmd(&mut con, &["RLOCK.CANCEL", &key, "r1"]);
        }
        let exec = redis::ConnectionLike::req_command(&mut con, &redis::cmd("EXEC"));
        let Ok(Value::Array(replies)) = exec else { panic!("EXEC: {exec:?}") };
        if round == 1 {
            let refused = format!("{:?}", replies[2]);
            assert!(refused.contains("request r1 was cancelled"), "{kind:?}: {refused}");
            assert_eq!(replies[3], Value::Int(2), "{kind:?}: given back by the cancel");
        }
        let _ = waiter.reply(LIMIT);
        poll("the rollback", LIMIT, || {
            (info_field(&mut con, "rlock", "rlock_grants_rolled_back") == rolled + 1).then_some(())
        });
        poll("the record cancelled", LIMIT, || cancelled(&mut con, &key, "r1").then_some(()));
        poll("nothing held", LIMIT, || kind.holders(&mut con, &key).is_empty().then_some(()));
        let before = digest(&mut con);
        assert_eq!(cmd(&mut con, &["RLOCK.CANCEL", &key, "r1"]), Value::Int(0), "{kind:?}");
        assert_eq!(digest(&mut con), before, "{kind:?} {round}: nothing released twice");
        if matches!(kind, Kind::Counted | Kind::Leased) {
            assert_eq!(cmd(&mut con, &["GET", &key]), Value::BulkString(b"1".to_vec()), "{kind:?}");
        }
    }
}

// ---- A3. RWLOCK.RENEW ... READ|WRITE ---------------------------------------------------------

/// A write hold is not renewed by a `READ` renewal of the same owner (its read hold would keep
/// the write guard alive), nor a read hold by a `WRITE` renewal; without a side, every hold of
/// the owner is renewed, as before.
#[test]
fn a3_a_side_renewal_renews_only_the_side_the_owner_holds() {
    let server = Server::start();
    let mut con = server.conn();
    // A write hold only.
    cmd(&mut con, &["RWLOCK.ACQUIRE", "w", "o", "WRITE", "1000"]);
    let before = pexpiretime(&mut con, b"w");
    assert_eq!(cmd(&mut con, &["RWLOCK.RENEW", "w", "o", "60000", "READ"]), Value::Int(0));
    assert_eq!(pexpiretime(&mut con, b"w"), before, "a READ renewal leaves the write hold");
    assert_eq!(cmd(&mut con, &["RWLOCK.RENEW", "w", "o", "60000", "WRITE"]), Value::Int(1));
    assert!(pexpiretime(&mut con, b"w") > before + 50_000, "the write hold renewed");
    // A read hold only.
    cmd(&mut con, &["RWLOCK.ACQUIRE", "r", "o", "READ", "1000"]);
    let hold = b"{r}:o:rwlock_timeout:1";
    let (hash, key) = (pexpiretime(&mut con, b"r"), pexpiretime(&mut con, hold));
    assert_eq!(cmd(&mut con, &["RWLOCK.RENEW", "r", "o", "60000", "write"]), Value::Int(0));
    assert_eq!((pexpiretime(&mut con, b"r"), pexpiretime(&mut con, hold)), (hash, key));
    assert_eq!(cmd(&mut con, &["RWLOCK.RENEW", "r", "o", "60000", "read"]), Value::Int(1));
    assert!(pexpiretime(&mut con, hold) > key + 50_000, "the read hold renewed");
    assert!(pexpiretime(&mut con, b"r") > hash + 50_000, "and the hash covers it");
    // Both sides (a write hold, then a read re-entry): each side renews alone.
    cmd(&mut con, &["RWLOCK.ACQUIRE", "b", "o", "WRITE", "1000"]);
    cmd(&mut con, &["RWLOCK.ACQUIRE", "b", "o", "READ", "1000"]);
    let hold = b"{b}:o:rwlock_timeout:1";
    let key = pexpiretime(&mut con, hold);
    assert_eq!(cmd(&mut con, &["RWLOCK.RENEW", "b", "o", "60000", "WRITE"]), Value::Int(1));
    assert_eq!(pexpiretime(&mut con, hold), key, "WRITE leaves the read hold's lease");
    assert_eq!(cmd(&mut con, &["RWLOCK.RENEW", "b", "o", "60000", "READ"]), Value::Int(1));
    assert!(pexpiretime(&mut con, hold) > key + 50_000);
    // Without a side: as before, every hold.
    cmd(&mut con, &["RWLOCK.ACQUIRE", "n", "o", "WRITE", "1000"]);
    cmd(&mut con, &["RWLOCK.ACQUIRE", "n", "o", "READ", "1000"]);
    let (hash, key) =
        (pexpiretime(&mut con, b"n"), pexpiretime(&mut con, b"{n}:o:rwlock_timeout:1"));
    assert_eq!(cmd(&mut con, &["RWLOCK.RENEW", "n", "o", "60000"]), Value::Int(1));
    assert!(pexpiretime(&mut con, b"n") > hash + 50_000);
    assert!(pexpiretime(&mut con, b"{n}:o:rwlock_timeout:1") > key + 50_000);
    // Another owner, or a free lock: 0 with or without a side.
    for args in [
        &["RWLOCK.RENEW", "w", "x", "1000", "WRITE"][..],
        &["RWLOCK.RENEW", "free", "o", "1000", "READ"],
        &["RWLOCK.RENEW", "free", "o", "1000"],
    ] {
        assert_eq!(cmd(&mut con, args), Value::Int(0), "{args:?}");
    }
    assert!(!exists(&mut con, "free"), "nothing created");
    // Bad input.
    for (args, err) in [
        (&["RWLOCK.RENEW", "w", "o", "1000", "BOTH"][..], "ERR mode must be READ or WRITE"),
        (&["RWLOCK.RENEW", "w", "o", "1000", "READ", "x"], "ERR syntax error"),
        (&["RWLOCK.RENEW", "w", "o"], "ERR wrong number of arguments"),
    ] {
        let e = run_str(&mut con, args).expect_err("refused");
        assert!(e.starts_with(err), "{args:?}: {e}");
    }
    assert_eq!(
        hgetall(&mut con, b"w"),
        vec![(b"mode".to_vec(), b"write".to_vec()), (b"o:write".to_vec(), b"1".to_vec()),]
    );
    let _ = LIMIT;
}
