//! Exact cancellation: `REQUEST id` on the acquires and `RLOCK.CANCEL`. Each test here failed
//! on the code it was written against; the defect is named in its doc comment. Every test runs
//! each kind: a reentrant lock, a read-write lock's read and write sides, counted and leased
//! semaphore permits.

use std::time::Duration;

use redis::{Connection, Value};

use rlock_tests_integration::{cmd, digest, hgetall, run_str, wait_blocked, Pending, Server};

const LIMIT: Duration = Duration::from_secs(10);

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

fn go(con: &mut Connection, args: &[String]) -> Result<Value, String> {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    run_str(con, &args)
}

impl Kind {
    fn key(self, prefix: &str) -> String {
        format!("{prefix}{self:?}").to_lowercase()
    }

    /// A semaphore of one permit.
    fn setup(self, con: &mut Connection, key: &str) {
        if matches!(self, Self::Counted | Self::Leased) {
            cmd(con, &["RSEM.SETPERMITS", key, "1"]);
        }
    }

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
    fn vacate(self, con: &mut Connection, key: &str) -> Vec<String> {
        match self {
            Self::Lock => strings(&["RLOCK.RELEASE", key, "holder"]),
            Self::Read => strings(&["RWLOCK.RELEASE", key, "holder", "WRITE"]),
            Self::Write => strings(&["RWLOCK.RELEASE", key, "holder", "READ"]),
            Self::Counted | Self::Leased => {
                let _ = con;
                strings(&["RSEM.RELEASE", key, "1"])
            }
        }
    }

    fn granted(self, reply: &Value) -> bool {
        match self {
            Self::Lock | Self::Read | Self::Write => *reply == Value::Nil,
            Self::Counted => *reply == Value::Int(1),
            Self::Leased => matches!(reply, Value::Array(ids) if ids.len() == 1),
        }
    }

    fn not_granted(self, reply: &Value) -> bool {
        match self {
            Self::Lock | Self::Read | Self::Write => matches!(reply, Value::Int(_)),
            Self::Counted => *reply == Value::Int(0),
            Self::Leased => *reply == Value::Nil,
        }
    }

    /// Who holds the resource: the lock's owner fields, or the semaphore's available count
    /// and leased ids.
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
                let count: Option<String> = redis::cmd("GET").arg(key).query(con).expect("GET");
                let left = count.as_deref().unwrap_or("0").parse::<i64>().expect("count");
                let taken = 1 - left - ids.len() as i64;
                let mut out: Vec<String> = ids.iter().map(|id| format!("{id:02x?}")).collect();
                out.extend((0..taken).map(|_| "taken".to_owned()));
                out
            }
        }
    }
}

fn exec(con: &mut Connection) -> Vec<Value> {
    match redis::ConnectionLike::req_command(con, &redis::cmd("EXEC")) {
        Ok(Value::Array(replies)) => replies,
        other => panic!("EXEC: {other:?}"),
    }
}

/// Defect: a waiter granted by a hand-off whose request is cancelled before its reply went out
/// (`RLOCK.CANCEL` in the same event-loop turn as the release that handed it the lock: another
/// client's command, a `MULTI`, a script) was answered *granted* (nil, `[1, token]`, its permit
/// ids) although the cancel had given its grant back (reply 2): its client believed it held a
/// lock nobody held. It must get its command's not-granted reply, as a waiter the cancel
/// dequeued does.
#[test]
fn a_waiter_cancelled_between_its_hand_off_and_its_reply_is_not_told_it_holds() {
    let server = Server::start();
    let mut con = server.conn();
    for kind in KINDS {
        let key = kind.key("h");
        kind.setup(&mut con, &key);
        kind.occupy(&mut con, &key);
        let args = kind.acquire(&key, "o", Some("r"), &["WAIT", "0"]);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let waiter = Pending::start_str(&server, &args);
        wait_blocked(&mut con, 1);
        cmd(&mut con, &["MULTI"]);
        let vacate = kind.vacate(&mut con, &key);
        go(&mut con, &vacate).expect("queued");
        cmd(&mut con, &["RLOCK.CANCEL", &key, "r"]);
        let replies = exec(&mut con);
        assert_eq!(replies[1], Value::Int(2), "{kind:?}: granted by the release, given back");
        assert!(kind.holders(&mut con, &key).is_empty(), "{kind:?}: nobody holds");
        let reply = waiter.reply(LIMIT).0.expect("a reply");
        assert!(kind.not_granted(&reply), "{kind:?}: the waiter was told {reply:?}");
        assert!(!kind.granted(&reply), "{kind:?}");
    }
}

/// Defect: the record key `rlock_request:` + prefixed name + `:` + id is shared by two locks
/// whose name and id split it differently (lock `a` with id `b:c` and lock `{a}:b` with id `c`;
/// `a` with `y}:c` and `a}:y` with `c`; `a` and `{a}` with one id), and the record did not say
/// which lock it belongs to: `RLOCK.CANCEL a b:c` read the grant of `{a}:b`'s request `c`
/// (owner `X`) and released `X`'s hold on `a` (made by a plain acquire, with no request at
/// all), and marked `{a}:b`'s request cancelled while its grant stayed held (a later cancel of
/// it: 0). A record of another lock is now that: the id is taken (`ERR request <id> belongs to
/// another acquire`), nothing changes, nothing is undone on the wrong lock.
#[test]
fn a_record_key_shared_by_two_locks_never_undoes_a_grant_on_the_other_lock() {
    let server = Server::start();
    let mut con = server.conn();
    for kind in KINDS {
        let m = kind.key("");
        for (mine, other, mine_id, other_id) in [
            (m.clone(), format!("{{{m}}}:b"), "b:c", "c"),
            (m.clone(), format!("{m}}}:y"), "y}:c", "c"),
            (m.clone(), format!("{{{m}}}"), "c", "c"),
        ] {
            // The two names and ids spell the same record key.
            let key_of = |name: &str, id: &str| {
                if name.contains('{') {
                    format!("rlock_request:{name}:{id}")
                } else {
                    format!("rlock_request:{{{name}}}:{id}")
                }
            };
            assert_eq!(key_of(&mine, mine_id), key_of(&other, other_id), "{kind:?}");
            kind.setup(&mut con, &mine);
            kind.setup(&mut con, &other);
            // The other lock's request is granted; the same owner holds `mine` by a plain
            // acquire (no request).
            let theirs = go(&mut con, &kind.acquire(&other, "X", Some(other_id), &[]));
            assert!(kind.granted(&theirs.clone().expect("granted")), "{kind:?}: {theirs:?}");
            let plain = go(&mut con, &kind.acquire(&mine, "X", None, &[])).expect("plain");
            assert!(kind.granted(&plain), "{kind:?}: {plain:?}");
            let (mine_before, other_before) =
                (kind.holders(&mut con, &mine), kind.holders(&mut con, &other));
            let before = digest(&mut con);
            let taken = format!("ERR request {mine_id} belongs to another acquire");
            let cancel = run_str(&mut con, &["RLOCK.CANCEL", &mine, mine_id]);
            assert_eq!(kind.holders(&mut con, &mine), mine_before, "{kind:?}: `{mine}` kept");
            assert_eq!(kind.holders(&mut con, &other), other_before, "{kind:?}");
            assert!(cancel.as_ref().is_err_and(|e| e.starts_with(&taken)), "{kind:?}: {cancel:?}");
            let acquire = go(&mut con, &kind.acquire(&mine, "X", Some(mine_id), &[]));
            assert!(
                acquire.as_ref().is_err_and(|e| e.starts_with(&taken)),
                "{kind:?}: {acquire:?}"
            );
            assert_eq!(digest(&mut con), before, "{kind:?}: nothing changes on an error");
            // The other lock's request is still its own: a retry replays it, its cancel
            // gives it back.
            let retry = go(&mut con, &kind.acquire(&other, "X", Some(other_id), &[]));
            assert_eq!(retry, theirs, "{kind:?}: `{other}`'s request replayed");
            let back = run_str(&mut con, &["RLOCK.CANCEL", &other, other_id]);
            assert_eq!(back, Ok(Value::Int(2)), "{kind:?}: `{other}`'s grant given back");
            assert!(kind.holders(&mut con, &other).is_empty(), "{kind:?}");
            cmd(&mut con, &["FLUSHALL"]);
        }
    }
}
