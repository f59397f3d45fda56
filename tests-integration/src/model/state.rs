//! The model's state and its transitions (see the module's docs).

use std::collections::BTreeMap;

use redis::Value;

/// A connection: the server's client id.
pub type Conn = i64;
/// Milliseconds since the run began (the driver's clock).
pub type Ms = i64;

/// The owner a lock-delay holds the lock as.
pub const LOCKDELAY_OWNER: &str = "rlock:lockdelay";

/// When something happened: sent at `lo`, answered at `hi`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    pub lo: Ms,
    pub hi: Ms,
}

/// When a hold ends: somewhere in `[lo, hi]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deadline {
    pub lo: Ms,
    pub hi: Ms,
}

impl Deadline {
    /// No end: the record of a counted permits grant lasts until it is released or cancelled.
    pub const NEVER: Self = Self { lo: Ms::MAX / 4, hi: Ms::MAX / 4 };

    /// `lease` ms after a command that ran in `at`.
    #[must_use]
    pub const fn after(at: Window, lease: Ms) -> Self {
        Self { lo: at.lo + lease, hi: at.hi + lease }
    }

    /// Whether it has surely passed at `now` (the driver never asks inside the window).
    #[must_use]
    pub const fn passed(self, now: Window) -> bool {
        self.hi < now.lo
    }

    #[must_use]
    pub fn max(self, other: Self) -> Self {
        Self { lo: self.lo.max(other.lo), hi: self.hi.max(other.hi) }
    }

    #[must_use]
    pub fn min(self, other: Self) -> Self {
        Self { lo: self.lo.min(other.lo), hi: self.hi.min(other.hi) }
    }
}

/// A session binding: the connection, and the lock-delay its close starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bound {
    pub conn: Conn,
    pub delay: Ms,
}

/// A reentrant lock.
#[derive(Debug, Clone)]
pub struct Lock {
    pub owner: String,
    pub count: i64,
    pub end: Deadline,
    pub bound: Option<Bound>,
}

/// A read-write lock: the hash's expiry (`end`) bounds every hold.
#[derive(Debug, Clone, Default)]
pub struct Rw {
    pub writer: Option<(String, i64)>,
    pub wbound: Option<Bound>,
    pub readers: BTreeMap<String, Reader>,
    pub end: Option<Deadline>,
}

/// One owner's read side: each hold's lease end, by index ([`DEAD`]: ended, not released).
#[derive(Debug, Clone, Default)]
pub struct Reader {
    pub holds: Vec<Deadline>,
    pub bound: Option<Bound>,
}

/// A read hold whose lease ended (its index stays until a release drops it).
pub const DEAD: Deadline = Deadline { lo: -1_000_000_000, hi: -1_000_000_000 };

impl Reader {
    /// Its holds whose lease has not ended.
    #[must_use]
    pub fn live(&self) -> usize {
        self.holds.iter().filter(|d| **d != DEAD).count()
    }
}

/// A leased permit.
#[derive(Debug, Clone)]
pub struct Permit {
    pub end: Deadline,
    pub bound: Option<Bound>,
    /// A lock-delay after its session ended: still leased, no longer granted.
    pub placeholder: bool,
}

/// A semaphore: its count key, its leased permits, and the counted grants the run's clients
/// hold (oldest first; a release gives back the oldest, as its request when it has one).
#[derive(Debug, Clone, Default)]
pub struct Sem {
    pub count: Option<i64>,
    pub permits: BTreeMap<Vec<u8>, Permit>,
    pub held: Vec<Counted>,
}

/// Counted permits a client took and has not given back.
#[derive(Debug, Clone)]
pub struct Counted {
    pub permits: i64,
    pub request: Option<String>,
    /// Acquired `OWNERLESS`: given back by a plain or `ONCE` release, not as its request.
    pub ownerless: bool,
}

/// What a name holds.
#[derive(Debug, Clone)]
pub enum Entity {
    Lock(Lock),
    Rw(Rw),
    Sem(Sem),
    Latch(i64),
}

/// What a `REQUEST id` record says.
#[derive(Debug, Clone, PartialEq)]
pub enum Record {
    /// Cancelled, until then (60 s, or the cancelled grant's lease when longer).
    Cancelled { until: Deadline },
    /// Kept until the grant's lease (as given at the grant; counted permits: 60 s) ends.
    Granted { params: String, reply: Value, grant: Grant, until: Deadline },
}

/// The grant a record remembers, to tell whether it is still in place.
#[derive(Debug, Clone, PartialEq)]
pub enum Grant {
    Lock { owner: String },
    Rw { owner: String, write: bool },
    Counted { ended: bool },
    Leased { ids: Vec<Vec<u8>> },
}

/// One database.
#[derive(Debug, Clone, Default)]
pub struct Db {
    pub keys: BTreeMap<String, Entity>,
    /// `(lock name, request id)` → record.
    pub records: BTreeMap<(String, String), Record>,
    /// Names whose token counter key exists.
    pub counters: BTreeMap<String, ()>,
    /// Bindings left at a name by a lock `MOVE`d or `RENAME`d away (a binding stays with the
    /// name and its owner, as the module keys it): `(name, owner)` → the binding. A lock of that
    /// owner brought back under the name is bound again; a fresh grant of that owner there
    /// resets it (another owner's grant does not), and any end that frees the lock at the name
    /// drops every one of the name (a release to zero, a force-release, a give-back, a session
    /// end: the module drops every binding of a lock it frees; a lease's end drops none).
    pub ghosts: BTreeMap<(String, String), Bound>,
    /// The clients blocked in `RLOCK.ACQUIRE ... WAIT` on each lock, in queue order.
    pub queues: BTreeMap<String, Vec<Waiting>>,
}

impl Db {
    /// The lock at `name` was freed: the module drops every binding of the name.
    fn forget_ghosts(&mut self, name: &str) {
        self.ghosts.retain(|(n, _), _| n != name);
    }
}

/// A client blocked in `RLOCK.ACQUIRE ... WAIT`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Waiting {
    pub conn: Conn,
    pub owner: String,
    pub lease: Ms,
    pub session: Option<Ms>,
    pub timeout: Deadline,
    /// `GT`: granted as a re-entry, it never shortens the lease.
    pub gt: bool,
}

/// What a blocked client must be answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// nil: it holds the lock.
    Granted,
    /// The busy reply: its wait timed out.
    TimedOut,
}

/// A command the model knows (what the driver sends).
#[derive(Debug, Clone, PartialEq)]
pub enum Cmd {
    Acquire {
        name: String,
        owner: String,
        lease: Ms,
        token: bool,
        request: Option<String>,
        session: Option<Ms>,
        /// `GT`: a re-entry never shortens the lease.
        gt: bool,
    },
    Release {
        name: String,
        owner: String,
    },
    Renew {
        name: String,
        owner: String,
        lease: Ms,
        gt: bool,
    },
    ForceRelease {
        name: String,
    },
    Cancel {
        name: String,
        id: String,
    },
    RwAcquire {
        name: String,
        owner: String,
        write: bool,
        lease: Ms,
        token: bool,
        request: Option<String>,
        session: Option<Ms>,
        /// `GT`: a re-entry never shortens the owner's read holds.
        gt: bool,
    },
    RwRelease {
        name: String,
        owner: String,
        write: bool,
    },
    RwRenew {
        name: String,
        owner: String,
        lease: Ms,
        side: Option<bool>,
        gt: bool,
    },
    RwForceRelease {
        name: String,
    },
    SemSet {
        name: String,
        n: i64,
    },
    SemAdd {
        name: String,
        d: i64,
    },
    SemAcquire {
        name: String,
        n: i64,
        lease: Option<Ms>,
        request: Option<String>,
        session: Option<Ms>,
        /// `OWNERLESS` (with `request`, counted): the record lasts 60 s, not until released.
        ownerless: bool,
    },
    SemRelease {
        name: String,
        n: i64,
        /// `REQUEST id`: the counted grant given back is that request's (`once`: `ONCE id`, an
        /// ownerless release's own id).
        request: Option<String>,
        once: bool,
    },
    SemReleaseIds {
        name: String,
        ids: Vec<Vec<u8>>,
    },
    SemRenew {
        name: String,
        id: Vec<u8>,
        lease: Ms,
    },
    SemAvailable {
        name: String,
    },
    LatchSet {
        name: String,
        n: i64,
    },
    LatchDown {
        name: String,
        n: i64,
    },
    LatchCount {
        name: String,
    },
    LatchDelete {
        name: String,
    },
    /// `CLIENT KILL ID conn`.
    Kill {
        conn: Conn,
    },
    /// `SWAPDB 0 1`.
    SwapDb,
    /// `MOVE name db` (a reentrant lock's one key).
    Move {
        name: String,
        db: usize,
    },
    /// `RENAME from to` (a reentrant lock's one key).
    Rename {
        from: String,
        to: String,
    },
    FlushDb,
    DebugReload,
    /// A derived key evicted (under an `allkeys-*` policy): the token counter of `name`.
    EvictCounter {
        name: String,
    },
}

fn session_args(a: &mut Vec<Vec<u8>>, session: Option<Ms>) {
    if let Some(d) = session {
        a.push(b"SESSION".to_vec());
        if d > 0 {
            a.extend([b"LOCKDELAY".to_vec(), d.to_string().into_bytes()]);
        }
    }
}

fn gt_arg(a: &mut Vec<Vec<u8>>, gt: bool) {
    if gt {
        a.push(b"GT".to_vec());
    }
}

fn request_args(a: &mut Vec<Vec<u8>>, request: Option<&String>) {
    if let Some(id) = request {
        a.extend([b"REQUEST".to_vec(), id.clone().into_bytes()]);
    }
}

/// The token counter of lock `name` (Redisson's rule).
#[must_use]
pub fn counter_key(name: &str) -> String {
    format!("redisson_lock_token:{}", prefix(name))
}

/// `{K}`, or `K` when it holds a `{` (Redisson's prefixName).
#[must_use]
pub fn prefix(name: &str) -> String {
    if name.contains('{') {
        name.to_owned()
    } else {
        format!("{{{name}}}")
    }
}

impl Cmd {
    /// The command's words.
    #[must_use]
    pub fn args(&self) -> Vec<Vec<u8>> {
        let s = |x: &str| x.as_bytes().to_vec();
        let n = |x: i64| x.to_string().into_bytes();
        match self {
            Self::Acquire { name, owner, lease, token, request, session, gt } => {
                let mut a = vec![s("RLOCK.ACQUIRE"), s(name), s(owner), n(*lease)];
                if *token {
                    a.push(s("TOKEN"));
                }
                request_args(&mut a, request.as_ref());
                session_args(&mut a, *session);
                gt_arg(&mut a, *gt);
                a
            }
            Self::Release { name, owner } => vec![s("RLOCK.RELEASE"), s(name), s(owner)],
            Self::Renew { name, owner, lease, gt } => {
                let mut a = vec![s("RLOCK.RENEW"), s(name), s(owner), n(*lease)];
                gt_arg(&mut a, *gt);
                a
            }
            Self::ForceRelease { name } => vec![s("RLOCK.FORCERELEASE"), s(name)],
            Self::Cancel { name, id } => vec![s("RLOCK.CANCEL"), s(name), s(id)],
            Self::RwAcquire { name, owner, write, lease, token, request, session, gt } => {
                let side = if *write { "WRITE" } else { "READ" };
                let mut a = vec![s("RWLOCK.ACQUIRE"), s(name), s(owner), s(side), n(*lease)];
                if *token {
                    a.push(s("TOKEN"));
                }
                request_args(&mut a, request.as_ref());
                session_args(&mut a, *session);
                gt_arg(&mut a, *gt);
                a
            }
            Self::RwRelease { name, owner, write } => {
                vec![
                    s("RWLOCK.RELEASE"),
                    s(name),
                    s(owner),
                    s(if *write { "WRITE" } else { "READ" }),
                ]
            }
            Self::RwRenew { name, owner, lease, side, gt } => {
                let mut a = vec![s("RWLOCK.RENEW"), s(name), s(owner), n(*lease)];
                if let Some(w) = side {
                    a.push(s(if *w { "WRITE" } else { "READ" }));
                }
                gt_arg(&mut a, *gt);
                a
            }
            Self::RwForceRelease { name } => vec![s("RWLOCK.FORCERELEASE"), s(name)],
            Self::SemSet { name, n: c } => vec![s("RSEM.SETPERMITS"), s(name), n(*c)],
            Self::SemAdd { name, d } => vec![s("RSEM.ADDPERMITS"), s(name), n(*d)],
            Self::SemAcquire { name, n: c, lease, request, session, ownerless } => {
                let mut a = vec![s("RSEM.ACQUIRE"), s(name), n(*c)];
                if let Some(l) = lease {
                    a.extend([s("LEASE"), n(*l)]);
                    session_args(&mut a, *session);
                }
                request_args(&mut a, request.as_ref());
                if *ownerless {
                    a.push(s("OWNERLESS"));
                }
                a
            }
            Self::SemRelease { name, n: c, request, once } => {
                let mut a = vec![s("RSEM.RELEASE"), s(name), n(*c)];
                match request {
                    Some(id) if *once => a.extend([s("ONCE"), s(id)]),
                    _ => request_args(&mut a, request.as_ref()),
                }
                a
            }
            Self::SemReleaseIds { name, ids } => {
                let mut a = vec![s("RSEM.RELEASE"), s(name), s("ID")];
                a.extend(ids.iter().cloned());
                a
            }
            Self::SemRenew { name, id, lease } => {
                vec![s("RSEM.RENEW"), s(name), id.clone(), n(*lease)]
            }
            Self::SemAvailable { name } => vec![s("RSEM.AVAILABLE"), s(name)],
            Self::LatchSet { name, n: c } => vec![s("RLATCH.SETCOUNT"), s(name), n(*c)],
            Self::LatchDown { name, n: c } => vec![s("RLATCH.COUNTDOWN"), s(name), n(*c)],
            Self::LatchCount { name } => vec![s("RLATCH.COUNT"), s(name)],
            Self::LatchDelete { name } => vec![s("RLATCH.DELETE"), s(name)],
            Self::Kill { conn } => vec![s("CLIENT"), s("KILL"), s("ID"), n(*conn)],
            Self::SwapDb => vec![s("SWAPDB"), s("0"), s("1")],
            Self::Move { name, db } => vec![s("MOVE"), s(name), n(*db as i64)],
            Self::Rename { from, to } => vec![s("RENAME"), s(from), s(to)],
            Self::FlushDb => vec![s("FLUSHDB")],
            Self::DebugReload => vec![s("DEBUG"), s("RELOAD")],
            Self::EvictCounter { name } => vec![s("DEL"), s(&counter_key(name))],
        }
    }
}

/// The whole model: two databases, each connection's database, the highest token seen per name.
#[derive(Debug, Clone, Default)]
pub struct Model {
    pub dbs: [Db; 2],
    pub conn_db: BTreeMap<Conn, usize>,
    pub tokens: BTreeMap<String, i64>,
    /// Blocked clients the model has answered, whose replies the driver has not checked yet.
    /// With when the model answered it (the client reads it and closes soon after).
    pub answers: Vec<(Conn, Answer, Window)>,
}

/// A reply that differs from the model's, or a broken invariant.
pub type Mismatch = String;

fn int(v: &Value) -> Option<i64> {
    match v {
        Value::Int(n) => Some(*n),
        _ => None,
    }
}

fn token_reply(granted: bool, v: i64) -> Value {
    Value::Array(vec![Value::Int(i64::from(granted)), Value::Int(v)])
}

/// How far the server's clock may read from the driver's windows (each rounds to the ms).
const CLOCK_SLACK: Ms = 5;

/// The lease a re-entry or renewal leaves on a hold that ends at `current`: the new one
/// (`new`), with `GT` the later of both (the server compares its exact expiries; in windows,
/// the later of each bound).
#[must_use]
pub fn extended(current: Deadline, new: Deadline, gt: bool) -> Deadline {
    if gt {
        current.max(new)
    } else {
        new
    }
}

/// A busy reply whose remaining lease is the holder's: one ending in `end`, read during `at`
/// (what tells a lease the server shortened or kept from the one the model has).
fn check_busy_lease(v: &Value, token: bool, end: Deadline, at: Window) -> Result<(), Mismatch> {
    let pttl = busy_pttl(v, token)?;
    let (lo, hi) = (end.lo - at.hi - CLOCK_SLACK, end.hi - at.lo + CLOCK_SLACK);
    if pttl < lo || pttl > hi {
        return Err(format!(
            "the busy reply's remaining lease is {pttl} ms; the holder's lease ends in {lo}..={hi} ms"
        ));
    }
    Ok(())
}

/// A busy reply: the holder's remaining lease (`-1`: none), `[0, pttl]` with `TOKEN`.
fn check_busy(v: &Value, token: bool) -> Result<(), Mismatch> {
    busy_pttl(v, token).map(|_| ())
}

fn busy_pttl(v: &Value, token: bool) -> Result<i64, Mismatch> {
    let pttl = if token {
        match v {
            Value::Array(a) if a.len() == 2 && a[0] == Value::Int(0) => int(&a[1]),
            _ => None,
        }
    } else {
        int(v)
    };
    match pttl {
        Some(p) if p >= -1 => Ok(p),
        _ => Err(format!("expected the busy reply (a remaining lease), got {v:?}")),
    }
}

impl Model {
    /// The database connection `c` is on.
    #[must_use]
    pub fn db_of(&self, c: Conn) -> usize {
        self.conn_db.get(&c).copied().unwrap_or(0)
    }

    /// The earliest deadline's window, among those not yet passed at `now.lo`: the driver waits
    /// past it rather than run a command whose outcome depends on which side of it the
    /// server is.
    #[must_use]
    pub fn deadlines(&self) -> Vec<Deadline> {
        let mut out = Vec::new();
        for db in &self.dbs {
            for e in db.keys.values() {
                match e {
                    Entity::Lock(l) => out.push(l.end),
                    Entity::Rw(rw) => {
                        out.extend(rw.end);
                        for r in rw.readers.values() {
                            out.extend(r.holds.iter().copied().filter(|d| *d != DEAD));
                        }
                    }
                    Entity::Sem(s) => out.extend(s.permits.values().map(|p| p.end)),
                    Entity::Latch(_) => {}
                }
            }
            for r in db.records.values() {
                match r {
                    Record::Cancelled { until } | Record::Granted { until, .. } => out.push(*until),
                }
            }
            out.extend(db.queues.values().flatten().map(|w| w.timeout));
        }
        out
    }

    /// Ends everything whose deadline passed before `now` (leases, lock-delays, waits).
    pub fn settle(&mut self, now: Window) {
        // What ends here ended at its deadline, maybe well before `now`: a waiter served or
        // timed out then may have read its answer and closed since.
        let since = self
            .deadlines()
            .into_iter()
            .filter(|d| d.passed(now))
            .map(|d| d.lo)
            .filter(|lo| *lo > now.lo - 10_000)
            .min()
            .map_or(now, |lo| Window { lo: lo.min(now.lo), hi: now.hi });
        self.settle_holds(now);
        for db in &mut self.dbs {
            for q in db.queues.values_mut() {
                for w in q.iter().filter(|w| w.timeout.passed(now)) {
                    self.answers.push((w.conn, Answer::TimedOut, since));
                }
                q.retain(|w| !w.timeout.passed(now));
            }
            db.queues.retain(|_, q| !q.is_empty());
        }
        self.serve(since);
    }

    /// Hands every free reentrant lock to its longest waiting client.
    pub fn serve(&mut self, now: Window) {
        for db in &mut self.dbs {
            for (name, q) in &mut db.queues {
                if q.is_empty() || db.keys.contains_key(name) {
                    continue;
                }
                let w = q.remove(0);
                let bound = w.session.map(|delay| Bound { conn: w.conn, delay });
                db.ghosts.remove(&(name.clone(), w.owner.clone()));
                let l =
                    Lock { owner: w.owner, count: 1, end: Deadline::after(now, w.lease), bound };
                db.keys.insert(name.clone(), Entity::Lock(l));
                self.answers.push((w.conn, Answer::Granted, now));
            }
            db.queues.retain(|_, q| !q.is_empty());
        }
    }

    /// `RLOCK.ACQUIRE name owner lease WAIT timeout [SESSION ...]` sent by a client of its own
    /// on `c` during `at`: `Some(reply)` when it is answered at once (granted or re-entered,
    /// nil; `DEADLOCK` as a simple string for that error), `None` when it waits in the queue
    /// (its answer comes in [`Model::answers`]).
    pub fn enqueue(&mut self, c: Conn, at: Window, name: &str, w: Waiting) -> Option<Value> {
        self.settle(at);
        let db = self.db_of(c);
        if let Some(Entity::Lock(l)) = self.dbs[db].keys.get(name) {
            if l.owner != w.owner && self.waits_for(db, &l.owner, &w.owner) {
                return Some(Value::SimpleString("DEADLOCK".into()));
            }
        }
        let d = &mut self.dbs[db];
        let queued = d.queues.get(name).is_some_and(|q| !q.is_empty());
        match d.keys.get_mut(name) {
            None if !queued => {
                let bound = w.session.map(|delay| Bound { conn: c, delay });
                d.ghosts.remove(&(name.to_owned(), w.owner.clone()));
                let l = Lock { owner: w.owner, count: 1, end: Deadline::after(at, w.lease), bound };
                d.keys.insert(name.to_owned(), Entity::Lock(l));
                Some(Value::Nil)
            }
            Some(Entity::Lock(l)) if l.owner == w.owner => {
                l.count += 1;
                l.end = extended(l.end, Deadline::after(at, w.lease), w.gt);
                Some(Value::Nil)
            }
            _ => {
                d.queues.entry(name.to_owned()).or_default().push(w);
                None
            }
        }
    }

    /// Whether `from` waits, through holders of locks it waits for, for a lock `to` holds (a
    /// wait of `to` behind `from` would close a cycle: refused with `DEADLOCK`).
    fn waits_for(&self, db: usize, from: &str, to: &str) -> bool {
        let d = &self.dbs[db];
        let mut seen: Vec<String> = Vec::new();
        let mut todo = vec![from.to_owned()];
        while let Some(o) = todo.pop() {
            if o == to {
                return true;
            }
            if seen.contains(&o) {
                continue;
            }
            seen.push(o.clone());
            for (name, q) in &d.queues {
                if q.iter().any(|w| w.owner == o) {
                    if let Some(Entity::Lock(l)) = d.keys.get(name) {
                        todo.push(l.owner.clone());
                    }
                }
            }
        }
        false
    }

    fn settle_holds(&mut self, now: Window) {
        for db in &mut self.dbs {
            let mut gone = Vec::new();
            for (name, e) in &mut db.keys {
                match e {
                    Entity::Lock(l) => {
                        if l.end.passed(now) {
                            gone.push(name.clone());
                        }
                    }
                    Entity::Rw(rw) => {
                        if rw.end.is_some_and(|d| d.passed(now)) {
                            gone.push(name.clone());
                            continue;
                        }
                        // An ended read hold keeps its place (its index in the hash's count)
                        // until released: a release drops the newest index, live or not.
                        for r in rw.readers.values_mut() {
                            for d in &mut r.holds {
                                if d.passed(now) {
                                    *d = DEAD;
                                }
                            }
                        }
                        rw.readers.retain(|_, r| r.live() > 0);
                        if rw.writer.is_none() && rw.readers.is_empty() {
                            gone.push(name.clone());
                        }
                    }
                    Entity::Sem(s) => {
                        let ended: Vec<Vec<u8>> = s
                            .permits
                            .iter()
                            .filter(|(_, p)| p.end.passed(now))
                            .map(|(id, _)| id.clone())
                            .collect();
                        for id in ended {
                            s.permits.remove(&id);
                            *s.count.get_or_insert(0) += 1;
                        }
                    }
                    Entity::Latch(_) => {}
                }
            }
            for name in gone {
                db.keys.remove(&name);
            }
        }
    }

    fn take_token(&mut self, name: &str, db: usize, v: i64) -> Result<(), Mismatch> {
        let last = self.tokens.get(name).copied().unwrap_or(0);
        if v <= last {
            return Err(format!(
                "fencing token {v} of {name} is not above the last one granted ({last})"
            ));
        }
        self.tokens.insert(name.to_owned(), v);
        self.dbs[db].counters.insert(name.to_owned(), ());
        Ok(())
    }

    /// Whether a record's grant is still in place (the one definition every reader shares).
    fn in_place(db: &Db, name: &str, grant: &Grant) -> bool {
        match (grant, db.keys.get(name)) {
            (Grant::Lock { owner }, Some(Entity::Lock(l))) => &l.owner == owner && l.count > 0,
            (Grant::Rw { owner, write: true }, Some(Entity::Rw(rw))) => {
                rw.writer.as_ref().is_some_and(|(w, _)| w == owner)
            }
            (Grant::Rw { owner, write: false }, Some(Entity::Rw(rw))) => {
                rw.readers.get(owner).is_some_and(|r| !r.holds.is_empty())
            }
            (Grant::Counted { ended }, _) => !ended,
            (Grant::Leased { ids }, Some(Entity::Sem(s))) => {
                ids.iter().all(|id| s.permits.get(id).is_some_and(|p| !p.placeholder))
            }
            _ => false,
        }
    }

    /// Whether a cancel has something to give back: the grant in place, or for leased permits
    /// any of its ids still leased (the others were released or ended).
    fn cancellable(db: &Db, name: &str, grant: &Grant) -> bool {
        match (grant, db.keys.get(name)) {
            (Grant::Leased { ids }, Some(Entity::Sem(s))) => {
                ids.iter().any(|id| s.permits.get(id).is_some_and(|p| !p.placeholder))
            }
            _ => Self::in_place(db, name, grant),
        }
    }

    /// The request step shared by every acquire: `Ok(Some(()))` when the reply was a replay
    /// (checked), `Ok(None)` to go on as a new acquire.
    #[allow(clippy::too_many_arguments)]
    fn request_step(
        &self,
        now: Window,
        db: usize,
        name: &str,
        id: Option<&String>,
        params: &str,
        v: &Value,
    ) -> Result<Option<()>, Mismatch> {
        let Some(id) = id else { return Ok(None) };
        match self.dbs[db].records.get(&(name.to_owned(), id.clone())) {
            Some(Record::Cancelled { until }) if !until.passed(now) => Err(format!(
                "request {id} was cancelled: expected `ERR request {id} was cancelled`, got {v:?}"
            )),
            Some(Record::Granted { params: p, reply, grant, until })
                if p == params
                    && !until.passed(now)
                    && Self::in_place(&self.dbs[db], name, grant) =>
            {
                if v == reply {
                    Ok(Some(()))
                } else {
                    Err(format!("a retry of request {id}, whose grant is in place, replied {v:?}, not the first reply {reply:?}"))
                }
            }
            _ => Ok(None),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn record(
        &mut self,
        db: usize,
        name: &str,
        id: Option<&String>,
        params: String,
        reply: &Value,
        grant: Grant,
        until: Deadline,
    ) {
        if let Some(id) = id {
            let r = Record::Granted { params, reply: reply.clone(), grant, until };
            self.dbs[db].records.insert((name.to_owned(), id.clone()), r);
        }
    }

    /// Checks the server's reply `v` to `cmd`, run on connection `c` during `at`, against the
    /// model, and applies `cmd`. An error reply (`Err(text)`) is checked the same way.
    ///
    /// # Errors
    /// What differed from the model.
    pub fn exec(
        &mut self,
        c: Conn,
        at: Window,
        cmd: &Cmd,
        v: &Result<Value, String>,
    ) -> Result<(), Mismatch> {
        let r = self.exec_one(c, at, cmd, v);
        self.serve(at);
        r
    }

    fn exec_one(
        &mut self,
        c: Conn,
        at: Window,
        cmd: &Cmd,
        v: &Result<Value, String>,
    ) -> Result<(), Mismatch> {
        self.settle(at);
        let db = self.db_of(c);
        match cmd {
            Cmd::Kill { conn } => {
                let ok = v == &Ok(Value::Int(1));
                if ok {
                    self.close(*conn, at);
                }
                return Ok(());
            }
            Cmd::SwapDb => {
                expect_ok(v)?;
                self.dbs.swap(0, 1);
                return Ok(());
            }
            Cmd::FlushDb => {
                expect_ok(v)?;
                self.dbs[db] = Db::default();
                return Ok(());
            }
            Cmd::DebugReload => return expect_ok(v),
            Cmd::EvictCounter { name } => {
                self.dbs[db].counters.remove(name);
                return Ok(());
            }
            Cmd::Move { name, db: to } => {
                let other = self.dbs[*to].keys.contains_key(name);
                let moved = match self.dbs[db].keys.get(name) {
                    Some(_) if !other && *to != db => self.dbs[db].keys.remove(name),
                    _ => None,
                };
                let want = Value::Int(i64::from(moved.is_some()));
                if let Some(e) = moved {
                    self.relocate(db, name, *to, name, e);
                }
                return same(v, &want);
            }
            Cmd::Rename { from, to } => {
                let Some(e) = self.dbs[db].keys.remove(from) else {
                    return match v {
                        Err(e) if e.starts_with("ERR no such key") => Ok(()),
                        _ => Err(format!(
                            "RENAME of a missing key: expected ERR no such key, got {v:?}"
                        )),
                    };
                };
                self.relocate(db, from, db, to, e);
                return expect_ok(v);
            }
            _ => {}
        }
        let v = match v {
            Ok(v) => v,
            Err(e) => {
                // The only errors the driver's commands may get: a cancelled request's retry.
                if let Some((name, id)) = acquire_request(cmd) {
                    if self.cancelled(db, name, id, at)
                        && e.starts_with(&format!("ERR request {id} was cancelled"))
                    {
                        return Ok(());
                    }
                }
                return Err(format!("unexpected error {e}"));
            }
        };
        if let Some((name, id)) = acquire_request(cmd) {
            if self.cancelled(db, name, id, at) {
                return Err(format!(
                    "request {id} was cancelled: expected `ERR request {id} was cancelled`, got {v:?}"
                ));
            }
        }
        match cmd {
            Cmd::Acquire { name, owner, lease, token, request, session, gt } => {
                let params = format!("lock {owner} {token}");
                if self.request_step(at, db, name, request.as_ref(), &params, v)?.is_some() {
                    return Ok(());
                }
                let end = Deadline::after(at, *lease);
                let state = self.dbs[db].keys.get(name).cloned();
                match state {
                    None => {
                        let granted = check_grant(v, *token)?;
                        if let Some(t) = granted {
                            self.take_token(name, db, t)?;
                        }
                        let bound = session.map(|delay| Bound { conn: c, delay });
                        self.dbs[db].ghosts.remove(&(name.clone(), owner.clone()));
                        let l = Lock { owner: owner.clone(), count: 1, end, bound };
                        self.dbs[db].keys.insert(name.clone(), Entity::Lock(l));
                        let grant = Grant::Lock { owner: owner.clone() };
                        self.record(db, name, request.as_ref(), params, v, grant, end);
                    }
                    Some(Entity::Lock(l)) if &l.owner == owner => {
                        let granted = check_grant(v, *token)?;
                        if let Some(t) = granted {
                            self.take_token(name, db, t)?;
                        }
                        // The record lasts until the lease the re-entry left (with `GT`,
                        // perhaps the earlier, later one).
                        let mut until = end;
                        if let Some(Entity::Lock(l)) = self.dbs[db].keys.get_mut(name) {
                            l.count += 1;
                            l.end = extended(l.end, end, *gt);
                            until = l.end;
                        }
                        let grant = Grant::Lock { owner: owner.clone() };
                        self.record(db, name, request.as_ref(), params, v, grant, until);
                    }
                    // A lock-delay's end is timed by the close the server saw: only its kind.
                    Some(Entity::Lock(l)) if l.owner == LOCKDELAY_OWNER => check_busy(v, *token)?,
                    Some(Entity::Lock(l)) => check_busy_lease(v, *token, l.end, at)?,
                    Some(other) => return Err(format!("model: {name} is {other:?}")),
                }
            }
            Cmd::Release { name, owner } => {
                let want = match self.dbs[db].keys.get_mut(name) {
                    Some(Entity::Lock(l)) if &l.owner == owner => {
                        l.count -= 1;
                        if l.count == 0 {
                            self.dbs[db].keys.remove(name);
                            self.dbs[db].forget_ghosts(name);
                            Value::Int(1)
                        } else {
                            Value::Int(0)
                        }
                    }
                    _ => Value::Nil,
                };
                same(&Ok(v.clone()), &want)?;
            }
            Cmd::Renew { name, owner, lease, gt } => {
                let want = match self.dbs[db].keys.get_mut(name) {
                    Some(Entity::Lock(l)) if &l.owner == owner => {
                        l.end = extended(l.end, Deadline::after(at, *lease), *gt);
                        1
                    }
                    _ => 0,
                };
                same(&Ok(v.clone()), &Value::Int(want))?;
            }
            Cmd::ForceRelease { name } | Cmd::RwForceRelease { name } => {
                let gone = self.dbs[db].keys.remove(name).is_some();
                if gone {
                    self.dbs[db].forget_ghosts(name);
                }
                same(&Ok(v.clone()), &Value::Int(i64::from(gone)))?;
            }
            Cmd::Cancel { name, id } => {
                let key = (name.clone(), id.clone());
                let mut until = Deadline::after(at, 60_000);
                // A record with no end (a counted grant's) is cancelled for 60 s.
                if let Some(Record::Granted { until: u, .. }) = self.dbs[db].records.get(&key) {
                    if *u != Deadline::NEVER {
                        until = until.max(*u);
                    }
                }
                let rec = self.dbs[db].records.insert(key, Record::Cancelled { until });
                let want = match rec {
                    Some(Record::Granted { grant, until, .. })
                        if !until.passed(at) && Self::cancellable(&self.dbs[db], name, &grant) =>
                    {
                        self.give_back(db, name, &grant, id);
                        2
                    }
                    _ => 0,
                };
                same(&Ok(v.clone()), &Value::Int(want))?;
            }
            Cmd::RwAcquire { name, owner, write, lease, token, request, session, gt } => {
                let params = format!("rw {owner} {write} {token}");
                if self.request_step(at, db, name, request.as_ref(), &params, v)?.is_some() {
                    return Ok(());
                }
                let end = Deadline::after(at, *lease);
                let mut rw = match self.dbs[db].keys.get(name) {
                    None => Rw::default(),
                    Some(Entity::Rw(rw)) => rw.clone(),
                    Some(other) => return Err(format!("model: {name} is {other:?}")),
                };
                let granted = if *write {
                    match &rw.writer {
                        None if rw.readers.is_empty() => true,
                        Some((w, _)) => w == owner,
                        None => false,
                    }
                } else {
                    match &rw.writer {
                        None => true,
                        Some((w, _)) => w == owner,
                    }
                };
                if !granted {
                    return check_busy(v, *token);
                }
                let t = check_grant(v, *token)?;
                if let Some(t) = t {
                    self.take_token(name, db, t)?;
                }
                // The record lasts as long as the grant: the read hold's lease, the hash's
                // expiry after a write (a re-entry's: the later of the hash's and the new one;
                // `GT` changes nothing there).
                let mut until = end;
                if *write {
                    match &mut rw.writer {
                        Some((_, n)) => {
                            *n += 1;
                            until = rw.end.map_or(end, |e| e.max(end));
                            rw.end = Some(until);
                        }
                        None => {
                            rw.writer = Some((owner.clone(), 1));
                            rw.wbound = session.map(|delay| Bound { conn: c, delay });
                            rw.end = Some(end);
                        }
                    }
                } else {
                    let r = rw.readers.entry(owner.clone()).or_default();
                    if r.holds.is_empty() {
                        r.bound = session.map(|delay| Bound { conn: c, delay });
                    }
                    // `GT`: the owner's live read holds and the new one all end at the later
                    // of the new lease and its latest hold.
                    // Without it the others keep their own.
                    if *gt {
                        until = raise_reads(r, end, true);
                    }
                    r.holds.push(until);
                    rw.end = Some(rw.end.map_or(until, |e| e.max(until)));
                }
                self.dbs[db].keys.insert(name.clone(), Entity::Rw(rw));
                let grant = Grant::Rw { owner: owner.clone(), write: *write };
                self.record(db, name, request.as_ref(), params, v, grant, until);
            }
            Cmd::RwRelease { name, owner, write } => {
                let want = match self.dbs[db].keys.get_mut(name) {
                    Some(Entity::Rw(rw)) => rw_release(rw, owner, *write),
                    _ => Value::Nil,
                };
                self.drop_if_free(db, name);
                same(&Ok(v.clone()), &want)?;
            }
            Cmd::RwRenew { name, owner, lease, side, gt } => {
                let mut end = Deadline::after(at, *lease);
                let want = match self.dbs[db].keys.get_mut(name) {
                    Some(Entity::Rw(rw)) => {
                        let writes = rw.writer.as_ref().is_some_and(|(w, _)| w == owner);
                        let reads = rw.readers.get(owner).is_some_and(|r| !r.holds.is_empty());
                        let (w, r) = match side {
                            None => (writes, reads),
                            Some(true) => (writes, false),
                            Some(false) => (false, reads),
                        };
                        if r {
                            if let Some(rd) = rw.readers.get_mut(owner) {
                                // The hash's lease is at least the read holds' (with `GT`,
                                // perhaps later than the new lease).
                                end = raise_reads(rd, end, *gt);
                            }
                        }
                        if w || r {
                            rw.end = Some(rw.end.map_or(end, |e| e.max(end)));
                        }
                        i64::from(w || r)
                    }
                    _ => 0,
                };
                same(&Ok(v.clone()), &Value::Int(want))?;
            }
            Cmd::SemSet { name, n } => {
                let s = self.sem(db, name)?;
                let want = if s.count.is_none() {
                    s.count = Some(*n);
                    1
                } else {
                    0
                };
                same(&Ok(v.clone()), &Value::Int(want))?;
            }
            Cmd::SemAdd { name, d } => {
                let s = self.sem(db, name)?;
                let c = s.count.unwrap_or(0) + d;
                s.count = Some(c);
                same(&Ok(v.clone()), &Value::Int(c))?;
            }
            Cmd::SemAcquire { name, n, lease, request, session, ownerless } => {
                let params = format!("sem {n} {}", lease.is_some());
                let end = match lease {
                    Some(l) => Deadline::after(at, *l),
                    None if *ownerless => Deadline::after(at, 60_000),
                    None => Deadline::NEVER,
                };
                if self.request_step(at, db, name, request.as_ref(), &params, v)?.is_some() {
                    return Ok(());
                }
                let s = self.sem(db, name)?;
                let avail = s.count.unwrap_or(0);
                if avail < *n {
                    let want = if lease.is_some() { Value::Nil } else { Value::Int(0) };
                    return same(&Ok(v.clone()), &want);
                }
                let grant = match lease {
                    None => {
                        same(&Ok(v.clone()), &Value::Int(1))?;
                        s.count = Some(avail - n);
                        let (permits, request) = (*n, request.clone());
                        s.held.push(Counted { permits, request, ownerless: *ownerless });
                        Grant::Counted { ended: false }
                    }
                    Some(l) => {
                        let Value::Array(ids) = v else {
                            return Err(format!("expected {n} permit ids, got {v:?}"));
                        };
                        let mut got = Vec::new();
                        for id in ids {
                            match id {
                                Value::BulkString(b)
                                    if b.len() == 16 && !s.permits.contains_key(b) =>
                                {
                                    got.push(b.clone())
                                }
                                _ => return Err(format!("expected {n} new permit ids, got {v:?}")),
                            }
                        }
                        if got.len() as i64 != *n {
                            return Err(format!("expected {n} permit ids, got {v:?}"));
                        }
                        s.count = Some(avail - n);
                        let end = Deadline::after(at, *l);
                        for id in &got {
                            let bound = session.map(|delay| Bound { conn: c, delay });
                            s.permits.insert(id.clone(), Permit { end, bound, placeholder: false });
                        }
                        Grant::Leased { ids: got }
                    }
                };
                self.record(db, name, request.as_ref(), params, v, grant, end);
            }
            Cmd::SemRelease { name, n, request: None, .. } => {
                // Counted permits carry no owner: a plain release ends no request's grant (the
                // client's own bookkeeping drops a grant of its own without a request).
                let s = self.sem(db, name)?;
                let c = s.count.unwrap_or(0) + n;
                s.count = Some(c);
                if let Some(i) = s.held.iter().position(|h| h.permits == *n && h.request.is_none())
                {
                    s.held.remove(i);
                }
                same(&Ok(v.clone()), &Value::Int(c))?;
            }
            Cmd::SemRelease { name, n, request: Some(id), once } => {
                // As the request: its grant given back once; the record then says released
                // (a cancel finds nothing, a retried release gives nothing more).
                let key = (name.clone(), id.clone());
                // A counted grant's record lasts until it is released or cancelled: with none,
                // this server never granted the request, and nothing is given back. An ownerless
                // release (`ONCE id`) gives back on its first send, and is then remembered 60 s.
                let give = match self.dbs[db].records.get(&key) {
                    Some(Record::Granted { grant: Grant::Counted { ended }, until, .. })
                        if !until.passed(at) =>
                    {
                        !ended
                    }
                    Some(Record::Granted { until, .. }) if !until.passed(at) => {
                        return Err(format!("RSEM.RELEASE {name} {n} REQUEST {id}: a record of another grant (not generated)"));
                    }
                    Some(Record::Cancelled { until }) if !until.passed(at) => false,
                    _ if *once => {
                        let until = Deadline::after(at, 60_000);
                        let (params, reply) = ("released".to_owned(), Value::Nil);
                        let grant = Grant::Counted { ended: true };
                        self.dbs[db]
                            .records
                            .insert(key.clone(), Record::Granted { params, reply, grant, until });
                        true
                    }
                    _ => false,
                };
                if give {
                    // Released: kept 60 s (a late cancel or a retried release finds it).
                    if let Some(Record::Granted {
                        grant: Grant::Counted { ended }, until, ..
                    }) = self.dbs[db].records.get_mut(&key)
                    {
                        *ended = true;
                        *until = Deadline::after(at, 60_000);
                    }
                }
                let s = self.sem(db, name)?;
                if give {
                    s.count = Some(s.count.unwrap_or(0) + n);
                    // (An ownerless release names no grant: a cancel of the request still finds
                    // it, so the model keeps its count.)
                    let named = |h: &Counted| h.request.as_deref() == Some(id.as_str());
                    if let Some(i) = s.held.iter().position(named) {
                        s.held.remove(i);
                    }
                }
                let c = s.count.unwrap_or(0);
                same(&Ok(v.clone()), &Value::Int(c))?;
            }
            Cmd::SemReleaseIds { name, ids } => {
                let s = self.sem(db, name)?;
                let mut uniq = ids.clone();
                uniq.sort();
                uniq.dedup();
                // A permit in its lock-delay left its id (a placeholder member holds it): a
                // release by the old id finds nothing.
                let live = uniq.iter().all(|id| s.permits.get(id).is_some_and(|p| !p.placeholder));
                let want = if live {
                    for id in &uniq {
                        s.permits.remove(id);
                    }
                    s.count = Some(s.count.unwrap_or(0) + uniq.len() as i64);
                    uniq.len() as i64
                } else {
                    0
                };
                self.drop_if_free(db, name);
                same(&Ok(v.clone()), &Value::Int(want))?;
            }
            Cmd::SemRenew { name, id, lease } => {
                let s = self.sem(db, name)?;
                let want = match s.permits.get_mut(id) {
                    Some(p) if !p.placeholder => {
                        p.end = Deadline::after(at, *lease);
                        1
                    }
                    _ => 0,
                };
                self.drop_if_free(db, name);
                same(&Ok(v.clone()), &Value::Int(want))?;
            }
            Cmd::SemAvailable { name } => {
                let want = match self.dbs[db].keys.get(name) {
                    Some(Entity::Sem(s)) => s.count.unwrap_or(0),
                    _ => 0,
                };
                same(&Ok(v.clone()), &Value::Int(want))?;
            }
            Cmd::LatchSet { name, n } => {
                let want = if self.dbs[db].keys.contains_key(name) {
                    0
                } else {
                    self.dbs[db].keys.insert(name.clone(), Entity::Latch(*n));
                    1
                };
                same(&Ok(v.clone()), &Value::Int(want))?;
            }
            Cmd::LatchDown { name, n } => {
                let want = match self.dbs[db].keys.get_mut(name) {
                    Some(Entity::Latch(c)) => {
                        *c = (*c - n).max(0);
                        let left = *c;
                        if left == 0 {
                            self.dbs[db].keys.remove(name);
                        }
                        left
                    }
                    _ => 0,
                };
                same(&Ok(v.clone()), &Value::Int(want))?;
            }
            Cmd::LatchCount { name } => {
                let want = match self.dbs[db].keys.get(name) {
                    Some(Entity::Latch(c)) => *c,
                    _ => 0,
                };
                same(&Ok(v.clone()), &Value::Int(want))?;
            }
            Cmd::LatchDelete { name } => {
                let gone = self.dbs[db].keys.remove(name).is_some();
                same(&Ok(v.clone()), &Value::Int(i64::from(gone)))?;
            }
            _ => {}
        }
        Ok(())
    }

    fn cancelled(&self, db: usize, name: &str, id: &str, now: Window) -> bool {
        matches!(
            self.dbs[db].records.get(&(name.to_owned(), id.to_owned())),
            Some(Record::Cancelled { until }) if !until.passed(now)
        )
    }

    /// A lock moved from `(db, name)` to `(to, to_name)`: its binding stays with the old name
    /// (a ghost there), and a ghost at the new name binds it again if it is the same owner's.
    fn relocate(&mut self, db: usize, name: &str, to: usize, to_name: &str, mut e: Entity) {
        if let Entity::Lock(l) = &mut e {
            if let Some(b) = l.bound.take() {
                self.dbs[db].ghosts.insert((name.to_owned(), l.owner.clone()), b);
            }
            // A lock the rename overwrites leaves its binding at the name too.
            if let Some(Entity::Lock(old)) = self.dbs[to].keys.get(to_name) {
                if let Some(b) = old.bound {
                    self.dbs[to].ghosts.insert((to_name.to_owned(), old.owner.clone()), b);
                }
            }
            if let Some(b) = self.dbs[to].ghosts.get(&(to_name.to_owned(), l.owner.clone())) {
                l.bound = Some(*b);
            }
        }
        self.dbs[to].keys.insert(to_name.to_owned(), e);
    }

    /// The semaphore `name` (created empty when missing).
    fn sem(&mut self, db: usize, name: &str) -> Result<&mut Sem, Mismatch> {
        let e =
            self.dbs[db].keys.entry(name.to_owned()).or_insert_with(|| Entity::Sem(Sem::default()));
        match e {
            Entity::Sem(s) => Ok(s),
            other => Err(format!("model: {name} is {other:?}")),
        }
    }

    fn drop_if_free(&mut self, db: usize, name: &str) {
        let free = match self.dbs[db].keys.get(name) {
            Some(Entity::Rw(rw)) => rw.writer.is_none() && rw.readers.is_empty(),
            Some(Entity::Sem(s)) => s.count.is_none() && s.permits.is_empty(),
            _ => false,
        };
        if free {
            self.dbs[db].keys.remove(name);
            self.dbs[db].forget_ghosts(name);
        }
    }

    /// `RLOCK.CANCEL` of a grant in place: one hold given back.
    fn give_back(&mut self, db: usize, name: &str, grant: &Grant, id: &str) {
        match grant {
            Grant::Lock { .. } => {
                if let Some(Entity::Lock(l)) = self.dbs[db].keys.get_mut(name) {
                    l.count -= 1;
                    if l.count == 0 {
                        self.dbs[db].keys.remove(name);
                        self.dbs[db].forget_ghosts(name);
                    }
                }
            }
            Grant::Rw { owner, write } => {
                if let Some(Entity::Rw(rw)) = self.dbs[db].keys.get_mut(name) {
                    rw_release(rw, owner, *write);
                }
                self.drop_if_free(db, name);
            }
            Grant::Counted { .. } => {
                if let Some(Entity::Sem(s)) = self.dbs[db].keys.get_mut(name) {
                    if let Some(i) = s.held.iter().position(|h| h.request.as_deref() == Some(id)) {
                        let h = s.held.remove(i);
                        s.count = Some(s.count.unwrap_or(0) + h.permits);
                    }
                }
            }
            Grant::Leased { ids } => {
                if let Some(Entity::Sem(s)) = self.dbs[db].keys.get_mut(name) {
                    for id in ids {
                        if s.permits.get(id).is_some_and(|p| !p.placeholder) {
                            s.permits.remove(id);
                            s.count = Some(s.count.unwrap_or(0) + 1);
                        }
                    }
                }
                self.drop_if_free(db, name);
            }
        }
    }

    /// Connection `conn` closed at `at`: every hold bound to it ends now (the module may apply
    /// it at its next tick, but before any later command reads the lock), a lock-delay taking
    /// its place where one was asked.
    pub fn close(&mut self, conn: Conn, at: Window) {
        self.close_holds(conn, at);
        for db in &mut self.dbs {
            for q in db.queues.values_mut() {
                q.retain(|w| w.conn != conn);
            }
        }
        self.serve(at);
    }

    fn close_holds(&mut self, conn: Conn, at: Window) {
        self.conn_db.remove(&conn);
        for db in &mut self.dbs {
            // A binding left at a name ends the lock there if it is still the owner's.
            let ghosts: Vec<(String, String, Bound)> = db
                .ghosts
                .iter()
                .filter(|(_, b)| b.conn == conn)
                .map(|((n, o), b)| (n.clone(), o.clone(), *b))
                .collect();
            for (name, owner, b) in ghosts {
                db.ghosts.remove(&(name.clone(), owner.clone()));
                if let Some(Entity::Lock(l)) = db.keys.get_mut(&name) {
                    if l.owner == owner && l.bound.is_none() {
                        l.bound = Some(b);
                    }
                }
            }
            let mut gone = Vec::new();
            let mut freed = Vec::new();
            for (name, e) in &mut db.keys {
                match e {
                    Entity::Lock(l) => {
                        if let Some(b) = l.bound.filter(|b| b.conn == conn) {
                            // The module drops every binding of the lock it ends.
                            freed.push(name.clone());
                            if b.delay > 0 {
                                let end = Deadline::after(at, b.delay).min(l.end);
                                *l = Lock {
                                    owner: LOCKDELAY_OWNER.into(),
                                    count: 1,
                                    end,
                                    bound: None,
                                };
                            } else {
                                gone.push(name.clone());
                            }
                        }
                    }
                    Entity::Rw(rw) => {
                        let ended: Vec<(String, Bound)> = rw
                            .readers
                            .iter()
                            .filter_map(|(o, r)| {
                                r.bound.filter(|b| b.conn == conn).map(|b| (o.clone(), b))
                            })
                            .collect();
                        for (owner, b) in ended {
                            let r = rw.readers.remove(&owner).unwrap_or_default();
                            let last = r.holds.iter().copied().reduce(Deadline::max);
                            if b.delay > 0 && rw.writer.is_none() {
                                if let Some(last) = last {
                                    let end = Deadline::after(at, b.delay).min(last);
                                    // One more read hold of the placeholder reader.
                                    rw.readers
                                        .entry(LOCKDELAY_OWNER.into())
                                        .or_default()
                                        .holds
                                        .push(end);
                                }
                            }
                        }
                        if let Some(b) = rw.wbound.filter(|b| b.conn == conn) {
                            rw.wbound = None;
                            let owner = rw.writer.take().map(|w| w.0).unwrap_or_default();
                            let own_reads = rw.readers.contains_key(&owner);
                            if b.delay > 0 && !own_reads && rw.readers.is_empty() {
                                let end = rw.end.map(|e| Deadline::after(at, b.delay).min(e));
                                rw.writer = Some((LOCKDELAY_OWNER.into(), 1));
                                rw.end = end;
                            }
                        }
                        if rw.writer.is_none() && rw.readers.is_empty() {
                            gone.push(name.clone());
                        }
                    }
                    Entity::Sem(s) => {
                        let ended: Vec<Vec<u8>> = s
                            .permits
                            .iter()
                            .filter(|(_, p)| p.bound.is_some_and(|b| b.conn == conn))
                            .map(|(id, _)| id.clone())
                            .collect();
                        for id in ended {
                            let p = s.permits.get_mut(&id).expect("a permit");
                            let delay = p.bound.map_or(0, |b| b.delay);
                            p.bound = None;
                            if delay > 0 {
                                p.placeholder = true;
                                p.end = Deadline::after(at, delay).min(p.end);
                            } else {
                                s.permits.remove(&id);
                                *s.count.get_or_insert(0) += 1;
                            }
                        }
                    }
                    Entity::Latch(_) => {}
                }
            }
            for name in gone.iter().chain(&freed) {
                db.forget_ghosts(name);
            }
            for name in gone {
                db.keys.remove(&name);
            }
        }
    }

    /// Whether any hold is bound to a connection (what `MODULE UNLOAD` must not drop).
    #[must_use]
    pub fn has_bindings(&self) -> bool {
        self.dbs.iter().any(|db| {
            db.keys.values().any(|e| match e {
                Entity::Lock(l) => l.bound.is_some(),
                Entity::Rw(rw) => {
                    rw.wbound.is_some() || rw.readers.values().any(|r| r.bound.is_some())
                }
                Entity::Sem(s) => s.permits.values().any(|p| p.bound.is_some()),
                Entity::Latch(_) => false,
            })
        })
    }

    /// The keyspace the model expects for `names` in database `db`, one line per key, in the
    /// form [`describe`] gives the server's.
    #[must_use]
    pub fn snapshot(&self, db: usize, names: &[Name]) -> BTreeMap<String, String> {
        let mut out = BTreeMap::new();
        for n in names {
            let d = &self.dbs[db];
            match (n.kind, d.keys.get(&n.name)) {
                (_, Some(Entity::Lock(l))) => {
                    out.insert(n.name.clone(), format!("lock {}={}", l.owner, l.count));
                }
                (_, Some(Entity::Rw(rw))) => {
                    out.insert(n.name.clone(), describe_rw(rw));
                }
                (_, Some(Entity::Sem(s))) => {
                    if let Some(c) = s.count {
                        out.insert(n.name.clone(), format!("count {c} int"));
                    }
                    let mut live: Vec<String> = s.permits.keys().map(|id| hex(id)).collect();
                    live.sort();
                    if !live.is_empty() {
                        out.insert(
                            format!("{}:timeout", prefix(&n.name)),
                            format!("leased {}", live.join(",")),
                        );
                    }
                }
                (_, Some(Entity::Latch(c))) => {
                    out.insert(n.name.clone(), format!("count {c} int"));
                }
                (_, None) => {}
            }
            if matches!(n.kind, Kind::Lock | Kind::Rw) && d.counters.contains_key(&n.name) {
                out.insert(counter_key(&n.name), "counter int".into());
            }
        }
        out
    }
}

/// A name the run uses, and its kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Name {
    pub name: String,
    pub kind: Kind,
}

/// The kinds of lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Lock,
    Rw,
    Sem,
    Latch,
}

/// Lowercase hex of bytes.
#[must_use]
pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// A read-write lock as a snapshot line: mode, writer, live readers (`owner=holds`).
#[must_use]
pub fn describe_rw(rw: &Rw) -> String {
    let mode = if rw.writer.is_some() { "write" } else { "read" };
    let writer = rw.writer.as_ref().map_or(String::new(), |(w, n)| format!(" writer {w}={n}"));
    let mut readers: Vec<String> =
        rw.readers.iter().map(|(o, r)| format!("{o}={}", r.live())).collect();
    // Sorted as lines, as the server's snapshot sorts them.
    readers.sort();
    format!("rw {mode}{writer} readers [{}]", readers.join(","))
}

/// A renewal (or a `GT` re-entry) of `r`'s read holds with a lease ending at `end`: every live
/// hold then ends at the returned deadline (`end`; with `GT`, the later of it and the latest
/// live hold, so none is shortened).
fn raise_reads(r: &mut Reader, end: Deadline, gt: bool) -> Deadline {
    let until = if gt {
        r.holds.iter().copied().filter(|d| *d != DEAD).fold(end, Deadline::max)
    } else {
        end
    };
    for h in r.holds.iter_mut().filter(|h| **h != DEAD) {
        *h = until;
    }
    until
}

/// A read-write release: the reply, the state changed.
fn rw_release(rw: &mut Rw, owner: &str, write: bool) -> Value {
    if write {
        match &mut rw.writer {
            Some((w, n)) if w == owner => {
                *n -= 1;
                if *n > 0 {
                    return Value::Int(0);
                }
                rw.writer = None;
                rw.wbound = None;
                Value::Int(1)
            }
            _ => Value::Nil,
        }
    } else {
        let Some(r) = rw.readers.get_mut(owner) else { return Value::Nil };
        r.holds.pop();
        if r.live() == 0 {
            rw.readers.remove(owner);
        }
        if rw.writer.is_none() && rw.readers.is_empty() {
            Value::Int(1)
        } else {
            if rw.writer.is_none() {
                // The hash's expiry is recomputed from the live read holds.
                rw.end = rw
                    .readers
                    .values()
                    .flat_map(|r| r.holds.iter().copied())
                    .filter(|d| *d != DEAD)
                    .reduce(Deadline::max);
            }
            Value::Int(0)
        }
    }
}

fn same(v: &Result<Value, String>, want: &Value) -> Result<(), Mismatch> {
    match v {
        Ok(v) if v == want => Ok(()),
        _ => Err(format!("replied {v:?}, the model says {want:?}")),
    }
}

fn expect_ok(v: &Result<Value, String>) -> Result<(), Mismatch> {
    match v {
        Ok(Value::Okay) => Ok(()),
        Ok(Value::SimpleString(s)) if s == "OK" => Ok(()),
        _ => Err(format!("replied {v:?}, expected OK")),
    }
}

/// A grant's reply: nil, or `[1, token]` with `TOKEN` (the token returned).
fn check_grant(v: &Value, token: bool) -> Result<Option<i64>, Mismatch> {
    match (token, v) {
        (false, Value::Nil) => Ok(None),
        (true, Value::Array(a)) if a.len() == 2 && a[0] == Value::Int(1) => match a[1] {
            Value::Int(t) => Ok(Some(t)),
            _ => Err(format!("expected [1, token], got {v:?}")),
        },
        _ => Err(format!("the model grants it; the server replied {v:?}")),
    }
}

/// An acquire's lock and request id, when it has one.
fn acquire_request(cmd: &Cmd) -> Option<(&String, &String)> {
    match cmd {
        Cmd::Acquire { name, request: Some(id), .. }
        | Cmd::RwAcquire { name, request: Some(id), .. }
        | Cmd::SemAcquire { name, request: Some(id), .. } => Some((name, id)),
        _ => None,
    }
}

#[doc(hidden)]
pub fn token_array(granted: bool, v: i64) -> Value {
    token_reply(granted, v)
}
