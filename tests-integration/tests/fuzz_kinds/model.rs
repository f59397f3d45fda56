//! The model `fuzz_kinds.rs` checks the server against: per semaphore the permits ever set or
//! added and the permits the run's clients hold, per lock whether a foreign write touched it;
//! the waiters; the foreign writes; the quiescence points.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use redis::{Connection, Value};
use rlock_tests_integration::{closes_a_cycle, BlockedCall, Rng};

/// The read-write locks (plain, braced, an unmatched brace).
pub const RW: [&str; 3] = ["rw0", "{t}:rw1", "r}w"];
/// The semaphores.
pub const SEM: [&str; 3] = ["s0", "{u}:s1", "s}x"];
const LIMIT: Duration = Duration::from_secs(20);

/// How many request ids plain acquires use at a time (`REQUEST id`): few, so retries happen;
/// the window moves every [`REQUEST_WINDOW_STEPS`] steps, so cancelled ids age out.
const REQUEST_POOL: usize = 4;
const REQUEST_WINDOW_STEPS: usize = 200;

/// The request record of request `id` on lock `name` (Redisson's prefixName rule).
pub fn record(name: &str, id: &str) -> String {
    format!("rlock_request:{}:{id}", prefix(name))
}

/// `{K}` or `K` when `K` has a `{` (Redisson's suffixName rule).
pub fn prefix(name: &str) -> String {
    if name.contains('{') {
        name.to_owned()
    } else {
        format!("{{{name}}}")
    }
}

/// The leased permits' zset of semaphore `i`.
pub fn zset(i: usize) -> String {
    format!("{}:timeout", prefix(SEM[i]))
}

/// A lease key of a read hold.
pub fn lease_key(i: usize, owner: &str, n: usize) -> String {
    format!("{}:{owner}:rwlock_timeout:{n}", prefix(RW[i]))
}

/// What a waiter asks.
pub enum Ask {
    Rw { name: usize, token: bool },
    Sem { name: usize, permits: i128, leased: bool, gen: u32 },
}

/// A blocked client and what it asked; `patient` ones wait far longer than any check's bound.
pub struct Waiter {
    pub call: BlockedCall,
    pub ask: Ask,
    pub patient: bool,
}

/// One semaphore as the run knows it.
#[derive(Default)]
pub struct SemModel {
    /// Every permit set (`SETPERMITS` that created it), added, or released beyond those held.
    pub total: i128,
    /// Unleased permits the run's clients took and have not released.
    pub held: i128,
    /// A foreign write touched it since its last reset: its counts are not checked.
    pub tainted: bool,
    /// Bumped at each reset: grants of older waiters are not counted.
    pub gen: u32,
    /// Permit ids granted (some since released or expired).
    pub ids: Vec<Vec<u8>>,
    /// Requests made with `REQUEST id` since the last reset, by id.
    pub requests: BTreeMap<String, Req>,
}

/// A request (`REQUEST id`) as the run knows it.
#[derive(Debug, Clone, Copy)]
pub struct Req {
    pub permits: i128,
    pub leased: bool,
    /// Granted by a plain acquire (a waiter's grant is counted when its reply is read), and
    /// not cancelled since: a retry is replayed by the server and takes nothing more.
    pub granted: bool,
}

/// The run.
pub struct Fuzz {
    pub seed: u64,
    pub step: usize,
    pub rw_tainted: [bool; 3],
    pub sem: [SemModel; 3],
    pub waiters: Vec<Waiter>,
    pub killed: BTreeSet<i64>,
    /// The request ids of the waiters of each read-write lock (what `RLOCK.CANCEL` may name).
    pub rw_ids: [Vec<String>; 3],
    next_request: u64,
    /// Until when a client may still sit paused by `CLIENT PAUSE` (see `kill_or_unblock`).
    pub paused_until: std::time::Instant,
    answered: usize,
    granted: usize,
    replies: usize,
    pub errors: usize,
    /// `RLOCK.CANCEL` replies seen: 0, 1 (dequeued), 2 (given back).
    cancels: [usize; 3],
}

/// A snapshot of every fuzzed key: `{type, value}` per key, and for a hash the fields of
/// readers with a live lease key (ARGV[i]: the i-th key's lease-key prefix, or '').
const SNAPSHOT: &str = "local out = {} \
    for i, k in ipairs(KEYS) do \
        local t = redis.call('TYPE', k).ok \
        if t == 'hash' then \
            local h = redis.call('HGETALL', k) \
            local live = {} \
            for j = 1, #h, 2 do \
                local n = tonumber(h[j + 1]) \
                if h[j] ~= 'mode' and n and ARGV[i] ~= '' then \
                    for c = 1, math.min(n, 16) do \
                        if redis.call('EXISTS', ARGV[i] .. ':' .. h[j] .. ':rwlock_timeout:' .. c) == 1 then \
                            table.insert(live, h[j]) break \
                        end \
                    end \
                end \
            end \
            out[i] = {t, h, live} \
        elseif t == 'string' then out[i] = {t, redis.call('GET', k)} \
        elseif t == 'zset' then out[i] = {t, redis.call('ZCARD', k)} \
        else out[i] = {t} end \
    end \
    return out";

fn text(v: &Value) -> String {
    match v {
        Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        Value::SimpleString(s) => s.clone(),
        Value::Int(n) => n.to_string(),
        other => format!("{other:?}"),
    }
}

impl Fuzz {
    pub fn new(seed: u64) -> Self {
        Self {
            seed,
            step: 0,
            rw_tainted: [false; 3],
            sem: Default::default(),
            waiters: Vec::new(),
            killed: BTreeSet::new(),
            rw_ids: Default::default(),
            next_request: 0,
            paused_until: std::time::Instant::now(),
            answered: 0,
            granted: 0,
            replies: 0,
            errors: 0,
            cancels: [0; 3],
        }
    }

    pub fn at(&self) -> String {
        format!("seed {} (RLOCK_FUZZ_SEED), step {}", self.seed, self.step)
    }

    pub fn summary(&self) -> String {
        format!(
            "{} replies, {} errors, {} waiters answered ({} granted), cancels replied 0/1/2 {:?}",
            self.replies, self.errors, self.answered, self.granted, self.cancels
        )
    }

    /// A permit id of semaphore `i`: one it granted, or a made-up one.
    pub fn some_id(&self, rng: &mut Rng, i: usize) -> String {
        let ids = &self.sem[i].ids;
        if !ids.is_empty() && rng.below(4) > 0 {
            // Ids are raw bytes; the command is sent as text, so keep the ones that are UTF-8.
            if let Ok(s) = String::from_utf8(ids[rng.below(ids.len())].clone()) {
                return s;
            }
        }
        ["0123456789abcdef", "x", "9223372036854775807"][rng.below(3)].to_owned()
    }

    /// A new request id for a waiter of lock `name` (`RW` then `SEM`) asking `permits`.
    pub fn waiter_request(&mut self, k: usize, permits: i128, leased: bool) -> String {
        self.next_request += 1;
        let id = format!("w{}", self.next_request);
        if k < RW.len() {
            self.rw_ids[k].push(id.clone());
        } else {
            let req = Req { permits, leased, granted: false };
            self.sem[k - RW.len()].requests.insert(id.clone(), req);
        }
        id
    }

    /// A request id of the plain acquires' pool (see [`REQUEST_POOL`]).
    pub fn pool_request(&self, rng: &mut Rng) -> String {
        let base = REQUEST_POOL * (self.step / REQUEST_WINDOW_STEPS);
        format!("q{}", base + rng.below(REQUEST_POOL))
    }

    /// The pool's ids so far (a reset deletes their records).
    pub fn pool_requests(&self) -> impl Iterator<Item = String> {
        (0..REQUEST_POOL * (self.step / REQUEST_WINDOW_STEPS + 1)).map(|n| format!("q{n}"))
    }

    /// A request id for `RLOCK.CANCEL` on lock `k` (`RW` then `SEM`): one of a waiter still
    /// waiting, of an earlier waiter, or of the plain acquires' pool.
    pub fn some_request(&self, rng: &mut Rng, k: usize) -> String {
        let name = if k < RW.len() { RW[k] } else { SEM[k - RW.len()] };
        let waiting: Vec<&String> = self
            .waiters
            .iter()
            .filter(|w| w.call.args[1] == name)
            .filter_map(|w| {
                let at = w.call.args.iter().position(|a| a == "REQUEST")?;
                w.call.args.get(at + 1)
            })
            .collect();
        if !waiting.is_empty() && rng.below(2) == 0 {
            return waiting[rng.below(waiting.len())].clone();
        }
        let earlier: Vec<&String> = if k < RW.len() {
            self.rw_ids[k].iter().collect()
        } else {
            self.sem[k - RW.len()].requests.keys().collect()
        };
        if !earlier.is_empty() && rng.below(3) == 0 {
            return earlier[rng.below(earlier.len())].clone();
        }
        self.pool_request(rng)
    }

    /// Applies the successful reply `v` of `args` to the model, checking its shape.
    pub fn apply(&mut self, args: &[String], v: &Value) {
        self.replies += 1;
        let at = self.at();
        let cmd = args[0].as_str();
        if let ("RLOCK.CANCEL", Value::Int(c @ 0..=2)) = (cmd, v) {
            self.cancels[*c as usize] += 1;
        }
        let Some(i) = SEM.iter().position(|s| *s == args[1]) else {
            let ok = match cmd {
                "RWLOCK.ACQUIRE" => match v {
                    Value::Nil | Value::Int(_) => true,
                    Value::Array(a) => matches!(a.as_slice(), [Value::Int(0 | 1), Value::Int(_)]),
                    _ => false,
                },
                "RWLOCK.RELEASE" => matches!(v, Value::Nil | Value::Int(0 | 1)),
                "RWLOCK.RENEW" | "RWLOCK.FORCERELEASE" => matches!(v, Value::Int(0 | 1)),
                "RLOCK.CANCEL" => matches!(v, Value::Int(0..=2)),
                _ => matches!(v, Value::Nil | Value::Array(_)),
            };
            assert!(ok, "{at}: {args:?}: odd reply {v:?}");
            return;
        };
        let n: Option<i128> = args.get(2).and_then(|a| a.parse().ok());
        let leased = args.iter().any(|a| a == "LEASE");
        let request = args.iter().position(|a| a == "REQUEST").and_then(|p| args.get(p + 1));
        let m = &mut self.sem[i];
        match (cmd, v) {
            ("RSEM.ACQUIRE", Value::Int(1)) if !leased && request.is_some() => {
                let (n, id) = (n.expect("a count"), request.expect("an id"));
                // A retry of a grant the server remembers is replayed: nothing more taken.
                let replay =
                    m.requests.get(id).is_some_and(|r| r.granted && !r.leased && r.permits == n);
                if !replay {
                    m.held += n;
                }
                m.requests.insert(id.clone(), Req { permits: n, leased: false, granted: true });
            }
            ("RLOCK.CANCEL", Value::Int(c @ 0..=2)) => {
                if let Some(r) = m.requests.get_mut(&args[2]) {
                    // Given back (a waiter's grant is counted when its reply is read: the
                    // sum comes out the same; a killed waiter's never is: held is then low,
                    // which only loosens the check).
                    if *c == 2 && !r.leased {
                        m.held -= r.permits;
                    }
                    r.granted = false;
                }
            }
            ("RSEM.SETPERMITS", Value::Int(1)) => m.total += n.expect("a count"),
            ("RSEM.SETPERMITS", Value::Int(0)) => {}
            ("RSEM.ADDPERMITS", Value::Int(_)) => m.total += n.expect("a delta").max(0),
            ("RSEM.ACQUIRE", Value::Int(1)) if !leased => m.held += n.expect("a count"),
            ("RSEM.ACQUIRE", Value::Int(0)) if !leased => {}
            ("RSEM.ACQUIRE", Value::Nil) if leased => {}
            ("RSEM.ACQUIRE", Value::Array(ids)) if leased => {
                assert_eq!(Some(ids.len() as i128), n, "{at}: {args:?}: {v:?}");
                for id in ids {
                    let Value::BulkString(id) = id else { panic!("{at}: {args:?}: {v:?}") };
                    assert_eq!(id.len(), 16, "{at}: {args:?}: a permit id of 16 bytes");
                    m.ids.push(id.clone());
                }
            }
            ("RSEM.RELEASE", Value::Int(_)) if args[2] == "ID" => {}
            ("RSEM.RELEASE", Value::Int(_)) => {
                let n = n.expect("a count");
                let back = m.held.min(n);
                m.held -= back;
                m.total += n - back;
            }
            ("RSEM.RENEW", Value::Int(0 | 1)) | ("RSEM.AVAILABLE", Value::Int(_)) => {}
            ("RSEM.INFO", Value::Nil | Value::Array(_)) => {}
            _ => panic!("{at}: {args:?}: odd reply {v:?}"),
        }
    }

    /// The invariants of every lock and semaphore, from one atomic snapshot.
    pub fn check_invariants(&mut self, con: &mut Connection) {
        let at = self.at();
        let mut keys: Vec<String> = RW.iter().map(|s| (*s).to_owned()).collect();
        let mut argv: Vec<String> = RW.iter().map(|s| prefix(s)).collect();
        for (i, name) in SEM.iter().enumerate() {
            keys.extend([(*name).to_owned(), zset(i)]);
            argv.extend([String::new(), String::new()]);
        }
        let snap: Vec<Value> = redis::cmd("EVAL_RO")
            .arg(SNAPSHOT)
            .arg(keys.len())
            .arg(&keys)
            .arg(&argv)
            .query(con)
            .unwrap_or_else(|e| panic!("{at}: snapshot: {e}"));
        let entry = |k: usize| -> (String, Vec<Value>) {
            let Value::Array(e) = &snap[k] else { panic!("{at}: snapshot {snap:?}") };
            (text(&e[0]), e[1..].to_vec())
        };
        for (i, name) in RW.iter().enumerate() {
            let (t, rest) = entry(i);
            if self.rw_tainted[i] || t == "none" {
                continue;
            }
            assert_eq!(t, "hash", "{at}: {name} is a {t}, no foreign write made it");
            let (Value::Array(h), Value::Array(live)) = (&rest[0], &rest[1]) else {
                panic!("{at}: {rest:?}")
            };
            let fields: Vec<(String, String)> =
                h.chunks(2).map(|p| (text(&p[0]), text(&p[1]))).collect();
            let writers: Vec<&str> =
                fields.iter().filter_map(|(f, _)| f.strip_suffix(":write")).collect();
            assert!(writers.len() <= 1, "{at}: {name} has writers {writers:?}: {fields:?}");
            let mode = fields.iter().find(|(f, _)| f == "mode").map(|(_, v)| v.as_str());
            assert!(
                matches!(mode, Some("read" | "write")),
                "{at}: {name} has no valid mode: {fields:?}"
            );
            if let Some(w) = writers.first() {
                assert_eq!(mode, Some("write"), "{at}: {name} has a writer: {fields:?}");
                let others: Vec<String> = live.iter().map(text).filter(|r| r != w).collect();
                assert!(
                    others.is_empty(),
                    "{at}: {name}: writer {w} and live readers {others:?}: {fields:?}"
                );
            }
        }
        for (i, m) in self.sem.iter().enumerate() {
            let ((t, count), (zt, zcard)) = (entry(RW.len() + 2 * i), entry(RW.len() + 2 * i + 1));
            if m.tainted {
                continue;
            }
            let available: i128 = match t.as_str() {
                "none" => 0,
                "string" => text(&count[0]).parse().unwrap_or_else(|_| {
                    panic!("{at}: {} holds {:?}, no foreign write put it", SEM[i], count[0])
                }),
                _ => panic!("{at}: {} is a {t}, no foreign write made it", SEM[i]),
            };
            let leased: i128 = match (zt.as_str(), zcard.first()) {
                ("none", _) => 0,
                ("zset", Some(Value::Int(n))) => i128::from(*n),
                _ => panic!("{at}: {} is a {zt}", zset(i)),
            };
            assert!(
                available + leased + m.held <= m.total,
                "{at}: {}: available {available} + leased {leased} + held {} > total {}",
                SEM[i],
                m.held,
                m.total
            );
        }
    }

    /// Whether a waiter of lock `name` was granted within [`LIMIT`]: what explains a refused
    /// command that changed the data. A queue owed a lock freed by its lease (before the poll
    /// served it) is served first, as the poll would have; then the command's own refusal (an
    /// owner whose queued read was just granted asks for the write lock) writes nothing more.
    pub fn served_queue_of(&mut self, name: &str) -> bool {
        let of_name = |w: &Waiter| match w.ask {
            Ask::Rw { name: i, .. } => RW[i] == name,
            Ask::Sem { name: i, .. } => SEM[i] == name,
        };
        let until = std::time::Instant::now() + LIMIT;
        while !self.waiters.iter().any(|w| of_name(w) && w.call.finished()) {
            if std::time::Instant::now() > until {
                return false;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        let (waiters, others): (Vec<_>, Vec<_>) = std::mem::take(&mut self.waiters)
            .into_iter()
            .partition(|w| of_name(w) && w.call.finished());
        let granted = self.granted;
        self.waiters = waiters;
        self.reap(true);
        self.waiters = others;
        self.granted > granted
    }

    /// Collects the waiters that have replied (all of them when `all`), checking each reply.
    pub fn reap(&mut self, all: bool) {
        for w in std::mem::take(&mut self.waiters) {
            if !all && !w.call.finished() {
                self.waiters.push(w);
                continue;
            }
            let (id, args, at) = (w.call.id, w.call.args.clone(), self.at());
            let (reply, ping) = w.call.join(LIMIT, &at);
            self.answered += 1;
            if self.killed.contains(&id) {
                continue; // its connection was killed: any outcome, or none
            }
            assert_eq!(
                ping,
                Ok(Value::SimpleString("PONG".into())),
                "{at}: waiter {id} {args:?} answered more than once (first {reply:?})"
            );
            let codes = ["ERR ", "WRONGTYPE ", "UNBLOCKED ", "NOREPLICAS "];
            let ok = match (&w.ask, &reply) {
                // A read-write wait that would close a cycle of owners is refused;
                // its links must name this run's owners and locks and close (that the cycle
                // existed is checked against the data in tests/deadlock.rs).
                (Ask::Rw { .. }, Err(e)) if e.starts_with("DEADLOCK ") => {
                    closes_a_cycle(e, &OWNERS_OF_THE_RUN, &RW)
                }
                (_, Err(e)) => codes.iter().any(|c| e.starts_with(c)),
                (Ask::Rw { token: false, .. }, Ok(Value::Nil | Value::Int(_))) => true,
                (Ask::Rw { token: true, .. }, Ok(Value::Array(a))) => {
                    matches!(a.as_slice(), [Value::Int(0 | 1), Value::Int(_)])
                }
                (Ask::Sem { name, permits, leased, gen }, Ok(v)) => {
                    let m = &mut self.sem[*name];
                    match (leased, v) {
                        (false, Value::Int(1)) if *gen == m.gen => m.held += permits,
                        (true, Value::Array(ids)) => {
                            assert_eq!(ids.len() as i128, *permits, "{at}: {args:?}: {v:?}");
                            for id in ids {
                                if let Value::BulkString(id) = id {
                                    m.ids.push(id.clone());
                                }
                            }
                        }
                        _ => {}
                    }
                    matches!(
                        (leased, v),
                        (false, Value::Int(0 | 1)) | (true, Value::Nil | Value::Array(_))
                    )
                }
                _ => false,
            };
            if matches!(reply, Ok(Value::Nil) if matches!(w.ask, Ask::Rw { .. }))
                || matches!(reply, Ok(Value::Int(1) | Value::Array(_)))
            {
                self.granted += 1;
            }
            assert!(ok, "{at}: waiter {id} {args:?} replied {reply:?}");
        }
    }
}

/// The owners this run uses (the fault injector's `X` included).
const OWNERS_OF_THE_RUN: [&str; 5] = ["A", "B", "C", "6f1e2a3b-uuid:7", "X"];
