//! The differential fuzz run against the executable model (`src/model/`): one real server with
//! the module and the model go through the same random interleavings of commands on several
//! connections and of the events between them (connections killed, alone or inside `MULTI`
//! beside a retry of the killed client's request, `SWAPDB`, `MOVE`, `RENAME`, `FLUSHDB`,
//! `DEBUG RELOAD`, `MODULE UNLOAD`/`LOAD`, a token counter evicted, leases and lock-delays
//! ending). After every step every reply is compared with the model's, and so is the keyspace of
//! both databases (abstracted: locks' owners and counts, read-write locks' writer and live read
//! holds, semaphores' counts and live leased permits, latches, token counters); tokens must
//! strictly increase per lock name, and a `REQUEST` retry is answered "granted" only while the
//! grant is still in place. Re-entries and renewals (`RLOCK.ACQUIRE`/`RENEW`,
//! `RWLOCK.ACQUIRE`/`RENEW`, a waiter's `RLOCK.ACQUIRE ... WAIT`) send `GT` one time in three, in
//! every profile. Right after a client's acquire or renewal of a lock or read-write lock (outside
//! `MULTI`) the leases it left (the lock key's, or the owner's read hold keys') are compared with
//! the model's, as is a reentrant lock's busy reply (the holder's remaining lease) always.
//!
//! Environment:
//! - `RLOCK_FUZZ_SEED` replays a run (the seed is printed, and named in every failure);
//! - `RLOCK_MODEL_PROFILES`: the profiles to run, comma-separated, each on a fresh server
//!   (default [`DEFAULT_PROFILES`]; `every`: all of [`PROFILES`]);
//! - `RLOCK_MODEL_MIX`: a custom feature list instead (see [`FEATURES`], [`EXTRA`]), run as
//!   profile `mix`;
//! - `RLOCK_MODEL_SECS`: the seconds all the profiles run, shared between them (default 40);
//!   `RLOCK_FUZZ_STEPS`: a number of steps per profile instead (`make fuzz` sets it).
//!
//! A run is replayed from its seed as far as timing allows: leases of 400 ms end between steps
//! where the machine's speed puts them, so a replay may take another path after the first one.
//! Each failure writes every step of the run to a file it names.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use redis::{Connection, Value};
use rlock_tests_integration::model::{
    counter_key, hex, prefix, Answer, Cmd, Conn, Deadline, Entity, Kind, Model, Name, Waiting,
    Window, DEAD, LOCKDELAY_OWNER,
};
use rlock_tests_integration::{
    blocked_clients, fuzz_seed, module_path, run, BlockedCall, Rng, Server,
};

/// Every feature a mix may turn on.
const FEATURES: [&str; 18] = [
    "lock",
    "rw",
    "sem",
    "leased",
    "latch",
    "request",
    "cancel",
    "token",
    "short",
    "session",
    "lockdelay",
    "kill",
    "multikill",
    "swapdb",
    "rename",
    "reload",
    "unload",
    "wait",
];

/// Features that only widen another: `renew` (more renewals), `evict` (token counters evicted),
/// `encoding` (`OBJECT ENCODING` of counts and counters compared), `counted-request` (`REQUEST`
/// on counted permits, which a client gives back with `RSEM.RELEASE n REQUEST id`), `killswap` (`MULTI;
/// CLIENT KILL; SWAPDB; EXEC` without `multikill`'s other commands; needs `swapdb`), `crowd`
/// (200 readers of their own hold `W0` for the whole run: the dead-reader checks of a lock with
/// many readers are spaced out; no force-release of `W0`).
const EXTRA: [&str; 6] = ["renew", "evict", "encoding", "counted-request", "killswap", "crowd"];

/// The named profiles: each a mix of features, most aimed at where two features meet; the
/// comment says what each drives.
const PROFILES: [(&str, &str); 12] = [
    // Every kind, requests, cancels, tokens, lease ends: no sessions, no server events.
    ("core", "lock,rw,sem,leased,latch,request,cancel,token,short,renew"),
    // Sessions and lock-delays of locks and read-write locks, connections killed, lease ends.
    ("sessions", "lock,rw,session,lockdelay,kill,short,renew"),
    // Clients blocked in RLOCK.ACQUIRE ... WAIT (some bound to sessions) beside releases,
    // cancels, kills, lease and lock-delay ends: each answered exactly once, in queue order.
    // Not in CI yet: a hand-off at a lease or lock-delay end followed by the served client's
    // close is timed by the server, and long runs still see the model's window miss it (a
    // waiter answered nil that the model had time out), on today's main as far as analysed.
    ("waiters", "lock,wait,request,cancel,session,lockdelay,kill,short,renew"),
    // Counted permits with REQUEST given back, then retried or cancelled.
    ("counted", "sem,request,counted-request,cancel"),
    // Leased permits bound to sessions with lock-delays, renewed, retried.
    ("leased-sessions", "leased,request,cancel,session,lockdelay,kill,renew"),
    // MULTI with CLIENT KILL beside retries and other commands.
    ("multikill", "lock,rw,request,session,lockdelay,multikill"),
    // SWAPDB (also in MULTI after a kill), MOVE, RENAME, FLUSHDB with sessions.
    ("swapdb", "lock,rw,session,kill,killswap,swapdb,rename"),
    // DEBUG RELOAD with sessions.
    ("reload", "lock,rw,session,kill,reload"),
    // MODULE UNLOAD/LOAD with sessions.
    ("unload", "lock,rw,session,kill,unload"),
    // Token counters evicted, MODULE UNLOAD/LOAD.
    ("tokens", "lock,rw,token,unload,evict"),
    // OBJECT ENCODING of counts and counters. Not in CI: the master keeps
    // `embstr`/`raw` where a replica holds `int`, a module API limit kept on purpose
    // (docs/operations.md); this profile shows it.
    ("encoding", "sem,latch,token,encoding"),
    // Everything at once.
    (
        "all",
        "lock,rw,sem,leased,latch,request,counted-request,cancel,token,short,renew,session,\
         lockdelay,kill,multikill,swapdb,rename,reload,unload,evict",
    ),
];

/// The profiles run when `RLOCK_MODEL_PROFILES` is not set (CI): those whose defects are
/// fixed. Add a profile here once the defects it finds are fixed.
///
/// Not `all` yet: on Valkey 8.1 it found the model and the server apart
/// (`RLOCK_FUZZ_SEED=1795799805145982147 RLOCK_MODEL_PROFILES=all`, step 542): in a `MULTI`,
/// `CLIENT KILL` of a connection bound to two leased permits, then `RSEM.AVAILABLE`: the server
/// 2, the model 4. A read-only command never writes, so it shows a closed session's permits
/// until the tick ends them (docs/sessions.md); the model applies the ends before every
/// command. The model is to learn that rule.
const DEFAULT_PROFILES: [&str; 9] = [
    "core",
    "sessions",
    "counted",
    "leased-sessions",
    "multikill",
    "swapdb",
    "reload",
    "unload",
    "tokens",
];

const LOCKS: [&str; 3] = ["L0", "L1", "{t}L2"];
const RWS: [&str; 2] = ["W0", "{t}W1"];
const SEMS: [&str; 2] = ["S0", "{u}S1"];
const LATCHES: [&str; 1] = ["C0"];
const OWNERS: [&str; 3] = ["A", "B", "C"];
const LONG: i64 = 100_000;
const SHORT: i64 = 400;
const DELAY: i64 = 300;
/// No command runs from this long before a deadline's window to this long after it.
const BEFORE: i64 = 120;
const AFTER: i64 = 20;
const CLIENTS: usize = 3;

/// The keyspace as the server has it, in the model's snapshot form.
const SNAPSHOT: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local out = {}
local function hexs(s) return (s:gsub('.', function(c) return string.format('%02x', string.byte(c)) end)) end
for i, k in ipairs(KEYS) do
  local kind = ARGV[i]
  local ty = redis.call('TYPE', k).ok
  if ty == 'hash' then
    local h = redis.call('HGETALL', k)
    if kind == 'rw' then
      local mode, writer, readers = 'none', '', {}
      local pre = (string.find(k, '{', 1, true) and k or ('{' .. k .. '}'))
      for j = 1, #h, 2 do
        local f, v = h[j], h[j + 1]
        if f == 'mode' then mode = v
        elseif string.sub(f, -6) == ':write' then writer = ' writer ' .. string.sub(f, 1, -7) .. '=' .. v
        else
          local live = 0
          for c = 1, math.min(tonumber(v) or 0, 64) do
            live = live + redis.call('EXISTS', pre .. ':' .. f .. ':rwlock_timeout:' .. c)
          end
          if live > 0 then table.insert(readers, f .. '=' .. live) end
        end
      end
      table.sort(readers)
      if writer ~= '' or #readers > 0 then
        table.insert(out, k) table.insert(out, 'rw ' .. mode .. writer .. ' readers [' .. table.concat(readers, ',') .. ']')
      end
    else
      local f = {}
      for j = 1, #h, 2 do table.insert(f, h[j] .. '=' .. h[j + 1]) end
      table.sort(f)
      table.insert(out, k) table.insert(out, 'lock ' .. table.concat(f, ','))
    end
  elseif ty == 'string' then
    local enc = redis.call('OBJECT', 'ENCODING', k)
    if kind == 'counter' then
      table.insert(out, k) table.insert(out, 'counter ' .. enc)
    else
      local v = redis.call('GET', k)
      if kind == 'sem' then
        local z = (string.find(k, '{', 1, true) and k or ('{' .. k .. '}')) .. ':timeout'
        v = tostring((tonumber(v) or 0) + redis.call('ZCOUNT', z, '-inf', now))
      end
      table.insert(out, k) table.insert(out, 'count ' .. v .. ' ' .. enc)
    end
  elseif ty == 'zset' then
    local m = redis.call('ZRANGEBYSCORE', k, '(' .. now, '+inf')
    local ids = {}
    for _, id in ipairs(m) do table.insert(ids, hexs(id)) end
    table.sort(ids)
    if #ids > 0 then table.insert(out, k) table.insert(out, 'leased ' .. table.concat(ids, ',')) end
    if kind == 'zset' and redis.call('EXISTS', string.sub(k, 1, -9)) == 0 then
      local n = redis.call('ZCOUNT', k, '-inf', now)
      if n > 0 then
        local name = string.sub(k, 1, -9)
        if string.sub(name, 1, 1) == '{' and string.sub(name, -1) == '}' then name = string.sub(name, 2, -2) end
        table.insert(out, name) table.insert(out, 'count ' .. n .. ' int')
      end
    end
  elseif ty ~= 'none' then
    table.insert(out, k) table.insert(out, 'type ' .. ty)
  end
end
return out";

/// The remaining leases of what a re-entry or renewal just set: the lock key's (`lock`), or the
/// owner `ARGV[2]`'s live read hold keys (`rw`), sorted.
const LEASES: &str = r"
local out = {}
if ARGV[1] == 'lock' then
  local p = redis.call('PTTL', KEYS[1])
  if p >= 0 then table.insert(out, p) end
else
  local pre = (string.find(KEYS[1], '{', 1, true) and KEYS[1] or ('{' .. KEYS[1] .. '}'))
  local n = tonumber(redis.call('HGET', KEYS[1], ARGV[2])) or 0
  for c = 1, math.min(n, 64) do
    local p = redis.call('PTTL', pre .. ':' .. ARGV[2] .. ':rwlock_timeout:' .. c)
    if p >= 0 then table.insert(out, p) end
  end
end
table.sort(out)
return out";

struct Client {
    con: Connection,
    id: Conn,
    db: usize,
    /// The last acquire with `REQUEST` it sent (what it retries after a disconnect).
    last_request: Option<Cmd>,
}

struct Run {
    name: String,
    seed: u64,
    features: Vec<String>,
    server: Server,
    admin: [Connection; 2],
    clients: Vec<Client>,
    model: Model,
    rng: Rng,
    /// Draws `GT` (see [`Run::gt`]).
    gt_rng: Rng,
    /// Ownerless `ONCE` releases, drawn apart so that other draws replay as before.
    once_rng: Rng,
    start: Instant,
    step: usize,
    /// Acquires with `REQUEST id`, to retry (the newest last).
    templates: Vec<Cmd>,
    next_request: usize,
    trail: Vec<String>,
    names: Vec<Name>,
    /// Permit ids granted (some since ended), to release or renew.
    ids: BTreeMap<String, Vec<Vec<u8>>>,
    /// A connection closed in this step.
    closed: bool,
    /// Clients blocked in `RLOCK.ACQUIRE ... WAIT`, by connection.
    waiters: Vec<(Conn, BlockedCall)>,
    answered: usize,
}

fn has(features: &[String], f: &str) -> bool {
    features.iter().any(|x| x == f)
}

fn now_ms(start: Instant) -> i64 {
    start.elapsed().as_millis() as i64
}

fn text(args: &[Vec<u8>]) -> String {
    args.iter()
        .map(|a| match std::str::from_utf8(a) {
            Ok(s) if a.len() != 16 || s == "0123456789abcdef" => s.to_owned(),
            _ => hex(a),
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn value_text(v: &Result<Value, String>) -> String {
    match v {
        Ok(Value::BulkString(b)) if b.len() == 16 => hex(b),
        Ok(Value::Array(a)) => {
            let parts: Vec<String> = a.iter().map(|x| value_text(&Ok(x.clone()))).collect();
            format!("[{}]", parts.join(", "))
        }
        Ok(v) => format!("{v:?}"),
        Err(e) => format!("(error) {e}"),
    }
}

fn send(con: &mut Connection, args: &[Vec<u8>]) -> Result<Value, String> {
    let argv: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
    run(con, &argv)
}

/// Whether the server is one that crashes under quick `MODULE UNLOAD` / `LOAD` cycles (Redis 8).
fn unload_crashes(con: &mut redis::Connection) -> bool {
    let info: String = redis::cmd("INFO").arg("server").query(con).expect("INFO");
    let valkey = info.contains("valkey_version:") || info.contains("server_name:valkey");
    !valkey && info.lines().any(|l| l.starts_with("redis_version:8."))
}

impl Run {
    fn new(name: &str, mix: &str, seed: u64) -> Self {
        let features: Vec<String> = mix.split(',').map(|s| s.trim().to_owned()).collect();
        for f in &features {
            assert!(
                FEATURES.contains(&f.as_str()) || EXTRA.contains(&f.as_str()),
                "unknown feature {f} (known: {FEATURES:?}, {EXTRA:?})"
            );
        }
        let server = Server::builder()
            .config("enable-module-command", "yes")
            .config("maxmemory-policy", "allkeys-lru")
            .start();
        let mut admin = [server.conn(), server.conn()];
        let _ = run(&mut admin[1], &[b"SELECT", b"1"]).expect("SELECT");
        let mut features = features;
        if features.iter().any(|f| f == "unload") && unload_crashes(&mut admin[0]) {
            // Redis 8.2 crashes (SIGSEGV in processCommand) on a command that follows quick
            // MODULE UNLOAD / MODULE LOAD cycles, with older builds of the module too; left out
            // there until it is understood.
            eprintln!("model_fuzz {name}: MODULE UNLOAD left out on Redis 8");
            features.retain(|f| f != "unload");
        }
        let mut model = Model::default();
        let clients = (0..CLIENTS)
            .map(|_| {
                let mut con = server.conn();
                let id = rlock_tests_integration::client_id(&mut con);
                model.conn_db.insert(id, 0);
                Client { con, id, db: 0, last_request: None }
            })
            .collect();
        let mut names = Vec::new();
        for n in LOCKS {
            names.push(Name { name: n.into(), kind: Kind::Lock });
        }
        for n in RWS {
            names.push(Name { name: n.into(), kind: Kind::Rw });
        }
        for n in SEMS {
            names.push(Name { name: n.into(), kind: Kind::Sem });
        }
        for n in LATCHES {
            names.push(Name { name: n.into(), kind: Kind::Latch });
        }
        Self {
            name: name.into(),
            seed,
            features,
            server,
            admin,
            clients,
            model,
            rng: Rng(seed),
            gt_rng: Rng((seed ^ 0x4754_4754_4754_4754) | 1),
            once_rng: Rng((seed ^ 0x4f4e_4345_4f4e_4345) | 1),
            start: Instant::now(),
            step: 0,
            templates: Vec::new(),
            next_request: 0,
            trail: Vec::new(),
            names,
            ids: BTreeMap::new(),
            closed: false,
            waiters: Vec::new(),
            answered: 0,
        }
    }

    fn has(&self, f: &str) -> bool {
        has(&self.features, f)
    }

    fn at(&self) -> String {
        format!(
            "profile {} seed {} (RLOCK_FUZZ_SEED={} RLOCK_MODEL_PROFILES={}), step {} at {} ms",
            self.name,
            self.seed,
            self.seed,
            self.name,
            self.step,
            now_ms(self.start)
        )
    }

    fn fail(&self, what: &str) -> ! {
        let trail =
            self.trail.iter().rev().take(60).rev().cloned().collect::<Vec<_>>().join("\n  ");
        // Every earlier step naming the same lock or request, for the longer stories.
        let words: Vec<&str> =
            what.split(' ').take(3).skip(1).map(|w| w.trim_end_matches(':')).collect();
        let related = self
            .trail
            .iter()
            .filter(|l| words.iter().any(|w| w.len() > 1 && l.contains(&format!(" {w} "))))
            .cloned()
            .collect::<Vec<_>>()
            .join("\n  ");
        let file = std::env::temp_dir().join(format!("model_fuzz-{}-{}.log", self.name, self.seed));
        let _ = std::fs::write(&file, self.trail.join("\n"));
        panic!(
            "{}: {what}\nsteps naming {words:?}:\n  {related}\nlast steps:\n  {trail}\n(every step: {})",
            self.at(),
            file.display()
        );
    }

    fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[self.rng.below(items.len())]
    }

    fn lease(&mut self) -> i64 {
        if self.has("short") && self.rng.below(3) == 0 {
            SHORT
        } else {
            LONG
        }
    }

    /// Whether a re-entry or renewal sends `GT` (one in three): drawn from a generator of its
    /// own, so a seed picks the same commands as before `GT` was generated.
    fn gt(&mut self) -> bool {
        self.gt_rng.below(3) == 0
    }

    fn session(&mut self) -> Option<i64> {
        if !self.has("session") || self.rng.below(2) == 0 {
            return None;
        }
        Some(if self.has("lockdelay") && self.rng.below(2) == 0 { DELAY } else { 0 })
    }

    /// Waits until no deadline's window is open around now (see [`BEFORE`]), then settles the
    /// model.
    fn settle(&mut self) {
        loop {
            let now = now_ms(self.start);
            let open = self
                .model
                .deadlines()
                .into_iter()
                .filter(|d| d.lo - BEFORE <= now && now <= d.hi + AFTER)
                .map(|d| d.hi + AFTER + 1)
                .max();
            match open {
                Some(until) => {
                    std::thread::sleep(Duration::from_millis((until - now).max(1) as u64))
                }
                None => break,
            }
        }
        let now = now_ms(self.start);
        self.model.settle(Window { lo: now, hi: now });
        if !self.model.answers.is_empty() {
            self.check_answers();
            self.settle();
        }
    }

    /// A request id: a retry of an earlier acquire (its exact command), or a new one.
    fn request(&mut self) -> Option<String> {
        if !self.has("request") || self.rng.below(2) == 0 {
            return None;
        }
        self.next_request += 1;
        Some(format!("q{}", self.next_request))
    }

    /// A random lock command (never an event).
    fn command(&mut self) -> Cmd {
        let mut kinds = Vec::new();
        for (f, k) in [("lock", 0), ("rw", 1), ("sem", 2), ("leased", 3), ("latch", 4)] {
            if self.has(f) {
                kinds.push(k);
            }
        }
        if kinds.is_empty() {
            kinds.push(0);
        }
        // A retry of an earlier request, as a client after a lost reply.
        if !self.templates.is_empty() && self.rng.below(5) == 0 {
            let i = self.rng.below(self.templates.len());
            return self.templates[i].clone();
        }
        let owner = self.pick(&OWNERS).to_owned();
        let renew = self.has("renew") || self.has("core");
        match kinds[self.rng.below(kinds.len())] {
            0 => {
                let name = self.pick(&LOCKS).to_owned();
                match self.rng.below(12) {
                    0..=5 => {
                        let lease = self.lease();
                        let token = self.has("token") && self.rng.below(3) == 0;
                        let request = self.request();
                        let session = self.session();
                        let gt = self.gt();
                        Cmd::Acquire { name, owner, lease, token, request, session, gt }
                    }
                    6..=8 => Cmd::Release { name, owner },
                    9 if renew || self.rng.below(2) == 0 => {
                        Cmd::Renew { name, owner, lease: self.lease(), gt: self.gt() }
                    }
                    10 if self.has("cancel") => self.cancel(name),
                    _ => Cmd::ForceRelease { name },
                }
            }
            1 => {
                let name = self.pick(&RWS).to_owned();
                let write = self.rng.below(2) == 0;
                match self.rng.below(12) {
                    0..=5 => {
                        let lease = self.lease();
                        let token = write && self.has("token") && self.rng.below(3) == 0;
                        let request = self.request();
                        let session = self.session();
                        let gt = self.gt();
                        Cmd::RwAcquire { name, owner, write, lease, token, request, session, gt }
                    }
                    6..=8 => Cmd::RwRelease { name, owner, write },
                    9 => {
                        let side = [None, Some(true), Some(false)][self.rng.below(3)];
                        let (lease, gt) = (self.lease(), self.gt());
                        Cmd::RwRenew { name, owner, lease, side, gt }
                    }
                    10 if self.has("cancel") => self.cancel(name),
                    _ if self.has("crowd") && name == RWS[0] => {
                        Cmd::RwRelease { name, owner, write }
                    }
                    _ => Cmd::RwForceRelease { name },
                }
            }
            k @ (2 | 3) => {
                let name = self.pick(&SEMS).to_owned();
                let leased = k == 3;
                match self.rng.below(14) {
                    0 => Cmd::SemSet { name, n: [1, 2, 3][self.rng.below(3)] },
                    1 => Cmd::SemAdd { name, d: [1, 2, -1][self.rng.below(3)] },
                    2..=6 => {
                        let n = [1, 1, 2][self.rng.below(3)];
                        let lease = leased.then(|| self.lease());
                        let request = if leased || self.has("counted-request") {
                            self.request()
                        } else {
                            None
                        };
                        let session = if leased { self.session() } else { None };
                        // Now and then ownerless (as the clients' `Semaphore.acquire(n)`), its
                        // permits then given back by a plain or `ONCE` release.
                        let ownerless = !leased && request.is_some() && self.once_rng.below(2) == 0;
                        Cmd::SemAcquire { name, n, lease, request, session, ownerless }
                    }
                    7..=8 if !leased => {
                        // Give back what a client holds (the oldest grant, as its request when
                        // it has one, as clients do), now and then more.
                        let held = match self.model.dbs[0].keys.get(&name) {
                            Some(rlock_tests_integration::model::Entity::Sem(s)) => {
                                let h = s.held.first();
                                h.map(|h| (h.permits, h.request.clone().filter(|_| !h.ownerless)))
                            }
                            _ => None,
                        };
                        let (n, request) = held.unwrap_or((1, None));
                        // An ownerless release under its own id (sent twice now and then: a
                        // lost reply), as the clients send `Semaphore.release(n)`.
                        if request.is_none()
                            && self.has("counted-request")
                            && self.once_rng.below(3) == 0
                        {
                            let id = format!("once{}", self.once_rng.below(4));
                            return Cmd::SemRelease { name, n, request: Some(id), once: true };
                        }
                        Cmd::SemRelease { name, n, request, once: false }
                    }
                    7..=9 => {
                        let ids = self.some_ids(&name);
                        Cmd::SemReleaseIds { name, ids }
                    }
                    10..=11 if leased && renew => {
                        let id = self.some_ids(&name).swap_remove(0);
                        Cmd::SemRenew { name, id, lease: self.lease() }
                    }
                    12 if self.has("cancel") => self.cancel(name),
                    _ => Cmd::SemAvailable { name },
                }
            }
            _ => {
                let name = self.pick(&LATCHES).to_owned();
                match self.rng.below(4) {
                    0 => Cmd::LatchSet { name, n: [1, 2, 5][self.rng.below(3)] },
                    1 => Cmd::LatchDown { name, n: [1, 1, 3][self.rng.below(3)] },
                    2 => Cmd::LatchCount { name },
                    _ => Cmd::LatchDelete { name },
                }
            }
        }
    }

    /// `RLOCK.CANCEL` of one of the lock's requests (or a made-up one).
    fn cancel(&mut self, name: String) -> Cmd {
        let ids: Vec<String> = self
            .templates
            .iter()
            .filter_map(|t| match t {
                Cmd::Acquire { name: n, request: Some(id), .. }
                | Cmd::RwAcquire { name: n, request: Some(id), .. }
                | Cmd::SemAcquire { name: n, request: Some(id), .. }
                    if *n == name =>
                {
                    Some(id.clone())
                }
                _ => None,
            })
            .collect();
        let id = if ids.is_empty() {
            "nobody".to_owned()
        } else {
            ids[self.rng.below(ids.len())].clone()
        };
        Cmd::Cancel { name, id }
    }

    fn some_ids(&mut self, name: &str) -> Vec<Vec<u8>> {
        let known = self.ids.get(name).cloned().unwrap_or_default();
        if known.is_empty() || self.rng.below(6) == 0 {
            return vec![b"0123456789abcdef".to_vec()];
        }
        let mut out = vec![known[self.rng.below(known.len())].clone()];
        if self.rng.below(4) == 0 {
            out.push(known[self.rng.below(known.len())].clone());
        }
        out
    }

    /// Learns what a reply taught (permit ids, request templates).
    fn learn(&mut self, c: usize, cmd: &Cmd, v: &Result<Value, String>) {
        if let (Cmd::SemAcquire { name, .. }, Ok(Value::Array(ids))) = (cmd, v) {
            let known = self.ids.entry(name.clone()).or_default();
            for id in ids {
                if let Value::BulkString(b) = id {
                    known.push(b.clone());
                }
            }
            let len = known.len();
            if len > 16 {
                known.drain(..len - 16);
            }
        }
        let is_request = matches!(
            cmd,
            Cmd::Acquire { request: Some(_), .. }
                | Cmd::RwAcquire { request: Some(_), .. }
                | Cmd::SemAcquire { request: Some(_), .. }
        );
        if is_request {
            if !self.templates.contains(cmd) {
                self.templates.push(cmd.clone());
                if self.templates.len() > 12 {
                    self.templates.remove(0);
                }
            }
            self.clients[c].last_request = Some(cmd.clone());
        }
    }

    /// Runs `cmd` on client `c` and checks it against the model.
    fn client_cmd(&mut self, c: usize, cmd: &Cmd) {
        let args = cmd.args();
        let t0 = now_ms(self.start);
        let v = send(&mut self.clients[c].con, &args);
        let at = Window { lo: t0, hi: now_ms(self.start) };
        let id = self.clients[c].id;
        self.trail.push(format!(
            "{t0}ms c{c}(id {id}, db {}): {} -> {}",
            self.clients[c].db,
            text(&args),
            value_text(&v)
        ));
        if let Err(m) = self.model.exec(id, at, cmd, &v) {
            self.fail(&format!("{}: {m}", text(&args)));
        }
        self.learn(c, cmd, &v);
        self.check_answers();
        self.check_leases(c, cmd);
    }

    /// After a lock's or read-write lock's acquire or renewal: the leases it left on the server
    /// (the lock's, or the owner's read holds) end where the model's do (`GT` kept or raised
    /// them, a plain one set them), so a lease set wrong shows at once, not only if it ends.
    fn check_leases(&mut self, c: usize, cmd: &Cmd) {
        let (name, kind, owner) = match cmd {
            Cmd::Acquire { name, .. } | Cmd::Renew { name, .. } => (name, "lock", ""),
            Cmd::RwAcquire { name, owner, .. } | Cmd::RwRenew { name, owner, .. } => {
                (name, "rw", owner.as_str())
            }
            _ => return,
        };
        // No deadline's window open (the model settled), as for any command.
        self.settle();
        let db = self.model.db_of(self.clients[c].id);
        let mut want: Vec<Deadline> = match self.model.dbs[db].keys.get(name) {
            Some(Entity::Lock(l)) if kind == "lock" && l.owner != LOCKDELAY_OWNER => vec![l.end],
            Some(Entity::Rw(rw)) if kind == "rw" => rw
                .readers
                .get(owner)
                .map(|r| r.holds.iter().copied().filter(|d| *d != DEAD).collect())
                .unwrap_or_default(),
            _ => return,
        };
        want.sort_by_key(|d| d.lo);
        let t0 = now_ms(self.start);
        let got = redis::cmd("EVAL_RO")
            .arg(LEASES)
            .arg(1)
            .arg(name)
            .arg(kind)
            .arg(owner)
            .query::<Vec<i64>>(&mut self.admin[db]);
        let t1 = now_ms(self.start);
        let got = got.unwrap_or_else(|e| self.fail(&format!("leases of {name}: {e}")));
        // A hold missing on either side is the keyspace check's to report.
        if got.len() != want.len() {
            return;
        }
        let slack = 5;
        for (p, d) in got.iter().zip(&want) {
            let (lo, hi) = (d.lo - t1 - slack, d.hi - t0 + slack);
            if *p < lo || *p > hi {
                self.fail(&format!(
                    "leases {name} {owner}: the server's remaining leases {got:?} ms; the model's end in {:?}",
                    want.iter().map(|d| (d.lo - t1 - slack, d.hi - t0 + slack)).collect::<Vec<_>>()
                ));
            }
        }
    }

    /// An admin command (on database `db`'s admin connection) checked against the model.
    fn admin_cmd(&mut self, db: usize, cmd: &Cmd) {
        let args = cmd.args();
        let t0 = now_ms(self.start);
        let v = send(&mut self.admin[db], &args);
        let at = Window { lo: t0, hi: now_ms(self.start) };
        self.trail.push(format!("{t0}ms admin(db {db}): {} -> {}", text(&args), value_text(&v)));
        // The admin connections are not clients of the model: give them their database.
        self.model.conn_db.insert(-1 - db as i64, db);
        if let Err(m) = self.model.exec(-1 - db as i64, at, cmd, &v) {
            self.fail(&format!("{}: {m}", text(&args)));
        }
        self.check_answers();
    }

    /// Client `c`'s connection is gone: a new one, on the same database.
    fn reconnect(&mut self, c: usize) {
        let mut con = self.server.conn();
        let id = rlock_tests_integration::client_id(&mut con);
        let db = self.clients[c].db;
        if db != 0 {
            run(&mut con, &[b"SELECT", b"1"]).expect("SELECT");
        }
        self.model.conn_db.insert(id, db);
        self.clients[c].con = con;
        self.clients[c].id = id;
    }

    /// `CLIENT KILL` of client `c`, then (one time in two) its retry of its last request on its
    /// new connection, as docs/sessions.md tells clients to do.
    fn kill(&mut self, c: usize) {
        let victim = self.clients[c].id;
        self.closed = true;
        let db = self.rng.below(2);
        self.admin_cmd(db, &Cmd::Kill { conn: victim });
        self.reconnect(c);
        if self.rng.below(2) == 0 {
            if let Some(retry) = self.clients[c].last_request.clone() {
                self.client_cmd(c, &retry);
            }
        }
    }

    /// `MULTI; CLIENT KILL ID <c's>; <a retry of c's last request, a SWAPDB, or any command>;
    /// EXEC` on client `by`.
    fn multi_kill(&mut self, by: usize, c: usize) {
        let victim = self.clients[c].id;
        self.closed = true;
        let mut cmds = vec![Cmd::Kill { conn: victim }];
        // `killswap` alone: only `MULTI; CLIENT KILL; SWAPDB 0 1; EXEC` (the queued ends
        // across the swap, without a command reading the lock in the same transaction).
        let then = match if self.has("multikill") { self.rng.below(4) } else { 2 } {
            0 | 1 => self.clients[c].last_request.clone(),
            2 if self.has("swapdb") => Some(Cmd::SwapDb),
            _ => Some(self.command()),
        };
        cmds.extend(then);
        if self.has("multikill") && self.rng.below(3) == 0 {
            cmds.push(self.command());
        }
        let t0 = now_ms(self.start);
        let con = &mut self.clients[by].con;
        run(con, &[b"MULTI"]).unwrap_or_else(|e| panic!("MULTI: {e}"));
        for cmd in &cmds {
            let _ = send(con, &cmd.args());
        }
        let exec = redis::ConnectionLike::req_command(con, &redis::cmd("EXEC"));
        let at = Window { lo: t0, hi: now_ms(self.start) };
        let Ok(Value::Array(replies)) = exec else { self.fail(&format!("EXEC: {exec:?}")) };
        let id = self.clients[by].id;
        self.trail.push(format!("{t0}ms c{by}(id {id}): MULTI"));
        for (cmd, r) in cmds.iter().zip(replies) {
            let v = match r {
                Value::ServerError(e) => Err(format!("{} {}", e.code(), e.details().unwrap_or(""))),
                other => Ok(other),
            };
            self.trail.push(format!("  {} -> {}", text(&cmd.args()), value_text(&v)));
            if let Err(m) = self.model.exec(id, at, cmd, &v) {
                self.fail(&format!("in MULTI: {}: {m}", text(&cmd.args())));
            }
            self.learn(by, cmd, &v);
        }
        self.trail.push(format!("c{by}: EXEC"));
        self.reconnect(c);
        self.check_answers();
    }

    /// `MODULE UNLOAD rlock` (then `MODULE LOAD`): refused while anything would be lost.
    fn unload(&mut self) {
        let bound = self.model.has_bindings();
        let v = run(&mut self.admin[0], &[b"MODULE", b"UNLOAD", b"rlock"]);
        self.trail.push(format!("admin: MODULE UNLOAD rlock -> {}", value_text(&v)));
        if v.is_ok() {
            let path = module_path();
            let load =
                run(&mut self.admin[0], &[b"MODULE", b"LOAD", path.to_string_lossy().as_bytes()]);
            self.trail.push(format!("admin: MODULE LOAD -> {}", value_text(&load)));
            assert!(load.is_ok(), "{}: MODULE LOAD: {load:?}", self.at());
            if bound {
                self.fail("MODULE UNLOAD succeeded while holds were bound to connections: their sessions are lost");
            }
        }
    }

    /// A client of its own blocks in `RLOCK.ACQUIRE ... WAIT` (or is answered at once).
    fn start_waiter(&mut self) {
        if self.waiters.len() >= 3 {
            return;
        }
        let name = self.pick(&LOCKS).to_owned();
        // An owner of its own: what a queued owner's other acquires do (re-entries of a lock
        // it waits for, cycles) is left to deadlock.rs and waiting.rs.
        self.next_request += 1;
        let owner = format!("W{}", self.next_request);
        // A waiter's connection closes as soon as it read its answer: with a lock-delay, each
        // hand-off would start a delay timed by that close (not a step of the run), and chains
        // of them drift from the model's windows. Its session has none.
        let session = self.session().map(|_| 0);
        let timeout = [600, 2000, 8000][self.rng.below(3)];
        let mut args = vec![
            "RLOCK.ACQUIRE".to_owned(),
            name.clone(),
            owner.clone(),
            LONG.to_string(),
            "WAIT".into(),
            timeout.to_string(),
        ];
        if let Some(d) = session {
            args.push("SESSION".into());
            if d > 0 {
                args.extend(["LOCKDELAY".into(), d.to_string()]);
            }
        }
        let gt = self.gt();
        if gt {
            args.push("GT".into());
        }
        let before = blocked_clients(&mut self.admin[0]);
        let t0 = now_ms(self.start);
        let call = BlockedCall::start(&self.server, args.clone(), Duration::from_secs(60));
        // The model must see it where the server queued it: wait until it blocks or is answered.
        let until = Instant::now() + Duration::from_secs(5);
        while !call.finished() && blocked_clients(&mut self.admin[0]) == before {
            assert!(Instant::now() < until, "{}: {args:?} neither blocked nor answered", self.at());
            std::thread::sleep(Duration::from_millis(1));
        }
        let at = Window { lo: t0, hi: now_ms(self.start) };
        let conn = call.id;
        self.model.conn_db.insert(conn, 0);
        self.trail.push(format!("{t0}ms w(id {conn}): {}", args.join(" ")));
        let timeout = Deadline::after(at, timeout);
        let w = Waiting { conn, owner, lease: LONG, session, timeout, gt };
        match self.model.enqueue(conn, at, &name, w) {
            Some(want) => {
                let (reply, ping) = call.join(Duration::from_secs(5), &self.at());
                self.trail.push(format!("  w(id {conn}) answered at once: {}", value_text(&reply)));
                self.waiter_gone(conn, at.lo);
                let deadlock = want == Value::SimpleString("DEADLOCK".into())
                    && matches!(&reply, Err(e) if e.starts_with("DEADLOCK "));
                if (!deadlock && reply != Ok(want.clone()))
                    || ping != Ok(Value::SimpleString("PONG".into()))
                {
                    self.fail(&format!("waiter {conn}: replied {reply:?} then {ping:?}; the model says {want:?} at once"));
                }
            }
            None => self.waiters.push((conn, call)),
        }
    }

    /// A waiter's connection closes once it read its answer (its thread ends): its session
    /// holds end as any closed connection's do.
    fn waiter_gone(&mut self, conn: Conn, answered: i64) {
        let t0 = answered;
        // The thread dropped the connection before `join` returned: wait until the server has
        // freed the client (its ends are then queued, and applied before any later command).
        let until = Instant::now() + Duration::from_secs(2);
        loop {
            let list =
                run(&mut self.admin[0], &[b"CLIENT", b"LIST", b"ID", conn.to_string().as_bytes()]);
            if matches!(&list, Ok(Value::BulkString(b)) if b.is_empty())
                || matches!(&list, Ok(Value::VerbatimString { text, .. }) if text.is_empty())
            {
                break;
            }
            assert!(
                Instant::now() < until,
                "{}: waiter {conn} still connected: {list:?}",
                self.at()
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        self.closed = true;
        self.model.close(conn, Window { lo: t0, hi: now_ms(self.start) });
    }

    /// Every blocked client the model answered got that answer, once; no other was answered.
    fn check_answers(&mut self) {
        // A waiter's close may end its session hold and serve the next waiter: until none is left.
        while !self.model.answers.is_empty() {
            self.check_answered();
        }
        let early: Vec<Conn> =
            self.waiters.iter().filter(|(_, w)| w.finished()).map(|(c, _)| *c).collect();
        if let Some(conn) = early.first() {
            let i = self.waiters.iter().position(|(c, _)| c == conn).expect("a waiter");
            let (_, call) = self.waiters.remove(i);
            let (reply, ping) = call.join(Duration::from_secs(2), &self.at());
            self.fail(&format!(
                "waiter {conn} was answered {reply:?} (then {ping:?}) while the model has it waiting"
            ));
        }
    }

    fn check_answered(&mut self) {
        let answers = std::mem::take(&mut self.model.answers);
        for (conn, answer, when) in answers {
            let Some(i) = self.waiters.iter().position(|(c, _)| *c == conn) else {
                continue; // answered after its connection was killed: nobody reads it
            };
            let (_, call) = self.waiters.remove(i);
            let (reply, ping) = call.join(Duration::from_secs(2), &self.at());
            self.trail.push(format!("  w(id {conn}) answered: {}", value_text(&reply)));
            self.waiter_gone(conn, when.lo);
            self.answered += 1;
            let ok = match answer {
                Answer::Granted => reply == Ok(Value::Nil),
                Answer::TimedOut => matches!(reply, Ok(Value::Int(n)) if n >= -1),
            };
            if !ok || ping != Ok(Value::SimpleString("PONG".into())) {
                self.fail(&format!(
                    "waiter {conn}: replied {reply:?} then {ping:?}; the model says {answer:?}"
                ));
            }
        }
    }

    fn step(&mut self) {
        self.settle();
        self.closed = false;
        if self.step == 0 && self.has("crowd") {
            for i in 0..200 {
                let cmd = Cmd::RwAcquire {
                    name: RWS[0].into(),
                    owner: format!("R{i}"),
                    write: false,
                    lease: LONG,
                    token: false,
                    request: None,
                    session: None,
                    gt: false,
                };
                self.admin_cmd(0, &cmd);
            }
        }
        let roll = self.rng.below(100);
        let c = self.rng.below(CLIENTS);
        match roll {
            0..=4 if self.has("kill") => self.kill(c),
            5..=9 if self.has("multikill") || self.has("killswap") => {
                let by = (c + 1 + self.rng.below(CLIENTS - 1)) % CLIENTS;
                self.multi_kill(by, c);
            }
            10..=11 if self.has("swapdb") => {
                let db = self.rng.below(2);
                self.admin_cmd(db, &Cmd::SwapDb);
            }
            12..=13 if self.has("swapdb") => {
                let to = 1 - self.clients[c].db;
                run(&mut self.clients[c].con, &[b"SELECT", to.to_string().as_bytes()])
                    .expect("SELECT");
                self.trail.push(format!("c{c}: SELECT {to}"));
                self.clients[c].db = to;
                self.model.conn_db.insert(self.clients[c].id, to);
            }
            14 if self.has("swapdb") => {
                let name = self.pick(&LOCKS).to_owned();
                let db = self.rng.below(2);
                self.admin_cmd(db, &Cmd::Move { name, db: 1 - db });
            }
            15 if self.has("rename") => {
                let from = self.pick(&LOCKS).to_owned();
                let to = self.pick(&LOCKS).to_owned();
                if from != to {
                    let db = self.rng.below(2);
                    self.admin_cmd(db, &Cmd::Rename { from, to });
                }
            }
            16 if self.has("rename") && self.rng.below(4) == 0 => {
                let db = self.rng.below(2);
                self.admin_cmd(db, &Cmd::FlushDb);
            }
            17 if self.has("reload") => {
                self.admin_cmd(0, &Cmd::DebugReload);
            }
            18 if self.has("unload") => self.unload(),
            19..=20 if self.has("evict") => {
                let name = self.pick(&LOCKS).to_owned();
                let db = self.rng.below(2);
                self.admin_cmd(db, &Cmd::EvictCounter { name });
            }
            21..=26 if self.has("wait") => self.start_waiter(),
            27..=28 if self.has("wait") && self.has("kill") && !self.waiters.is_empty() => {
                // A blocked client's connection killed: it leaves the queue.
                let i = self.rng.below(self.waiters.len());
                let (conn, _call) = self.waiters.remove(i);
                self.closed = true;
                self.admin_cmd(0, &Cmd::Kill { conn });
            }
            _ => {
                let cmd = self.command();
                self.client_cmd(c, &cmd);
            }
        }
        self.check_answers();
        self.check_keyspace();
    }

    /// Compares the keyspace with the model's. Right after a connection closed, the module may
    /// apply its ends at its next tick (a plain read of the keyspace is no rlock command, which
    /// would see them applied): then the comparison is retried for a moment.
    fn check_keyspace(&mut self) {
        let until = Instant::now() + Duration::from_millis(300);
        loop {
            match self.keyspace_diff() {
                None => return,
                Some(_) if self.closed && Instant::now() < until => {
                    std::thread::sleep(Duration::from_millis(5));
                }
                Some(what) => self.fail(&what),
            }
        }
    }

    fn keyspace_diff(&mut self) -> Option<String> {
        self.settle();
        let mut keys = Vec::new();
        let mut kinds = Vec::new();
        for n in &self.names {
            let (k, kind) = match n.kind {
                Kind::Lock => (n.name.clone(), "lock"),
                Kind::Rw => (n.name.clone(), "rw"),
                Kind::Sem => (n.name.clone(), "sem"),
                Kind::Latch => (n.name.clone(), "latch"),
            };
            keys.push(k);
            kinds.push(kind.to_owned());
            if n.kind == Kind::Sem {
                keys.push(format!("{}:timeout", prefix(&n.name)));
                kinds.push("zset".into());
            }
            if matches!(n.kind, Kind::Lock | Kind::Rw) {
                keys.push(counter_key(&n.name));
                kinds.push("counter".into());
            }
        }
        let encoding = self.has("encoding");
        for db in 0..2 {
            let v = redis::cmd("EVAL_RO")
                .arg(SNAPSHOT)
                .arg(keys.len())
                .arg(&keys)
                .arg(&kinds)
                .query::<Vec<String>>(&mut self.admin[db]);
            let got = v.unwrap_or_else(|e| self.fail(&format!("snapshot: {e}")));
            let mut server: BTreeMap<String, String> =
                got.chunks(2).map(|p| (p[0].clone(), p[1].clone())).collect();
            let mut model = self.model.snapshot(db, &self.names);
            if !encoding {
                for m in [&mut server, &mut model] {
                    for v in m.values_mut() {
                        for enc in [" int", " raw", " embstr"] {
                            if let Some(s) = v.strip_suffix(enc) {
                                *v = s.to_owned();
                            }
                        }
                    }
                }
            }
            if server != model {
                let mut diff = Vec::new();
                let mut names = Vec::new();
                for k in server.keys().chain(model.keys()) {
                    let (s, m) = (server.get(k), model.get(k));
                    if s != m && !diff.iter().any(|d: &String| d.starts_with(&format!("{k}:"))) {
                        diff.push(format!("{k}: server {s:?}, model {m:?}"));
                        names.push(k.clone());
                    }
                }
                names.push(String::new());
                return Some(format!(
                    "keyspace {}: db {db} differs from the model's:\n  {}",
                    names[..2.min(names.len())].join(" "),
                    diff.join("\n  ")
                ));
            }
        }
        None
    }
}

fn profiles() -> Vec<(String, String)> {
    if let Ok(mix) = std::env::var("RLOCK_MODEL_MIX") {
        return vec![("mix".into(), mix)];
    }
    let chosen =
        std::env::var("RLOCK_MODEL_PROFILES").unwrap_or_else(|_| DEFAULT_PROFILES.join(","));
    PROFILES
        .iter()
        .filter(|(n, _)| chosen == "every" || chosen.split(',').any(|c| c.trim() == *n))
        .map(|(n, m)| ((*n).to_owned(), (*m).to_owned()))
        .collect()
}

#[test]
fn every_command_and_event_matches_the_model() {
    let seed = fuzz_seed();
    let total: u64 =
        std::env::var("RLOCK_MODEL_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(40);
    let steps: Option<usize> = std::env::var("RLOCK_FUZZ_STEPS").ok().and_then(|s| s.parse().ok());
    let list = profiles();
    assert!(!list.is_empty(), "RLOCK_MODEL_PROFILES names no profile of {PROFILES:?}");
    let secs = (total / list.len() as u64).max(1);
    for (name, mix) in list {
        eprintln!("model_fuzz profile {name} ({mix}) seed {seed} (replay: RLOCK_FUZZ_SEED={seed} RLOCK_MODEL_PROFILES={name})");
        let mut run = Run::new(&name, &mix, seed);
        let until = Instant::now() + Duration::from_secs(secs);
        while steps.map_or(Instant::now() < until, |n| run.step < n) {
            run.step();
            run.step += 1;
        }
        assert!(!run.server.log().contains("panicked"), "{}: {}", run.at(), run.server.log());
        eprintln!("profile {name}: {} steps in {:?}", run.step, run.start.elapsed());
    }
}
