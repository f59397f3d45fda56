//! Failover safety: which master may grant, and fencing tokens that never repeat across a
//! promotion.
//!
//! **A stale master grants nothing.** A master that has had replicas since it became master
//! refuses every grant (`ACQUIRE`, `RENEW`, hand-offs) while fewer than `rlock.min-replicas` of
//! them are online with a replication lag of at most `rlock.replica-max-lag` seconds: after a
//! pause or a partition, Sentinel or the cluster may already have promoted one of them, and
//! every grant here would be a split-brain grant. It refuses give-backs of counted permits
//! too (`RSEM.RELEASE key permits`, `RLOCK.CANCEL` of a counted grant:
//! [`Refused::give_back_message`]): they have no lease, so one answered here and thrown away
//! with this master's data when it is demoted would be lost for good. The default (`-1`,
//! "auto") requires one replica once one has been online; `0` turns the check off; `n > 0`
//! requires `n` always.
//! The replicas are checked on Redis's cron (10 times a second at the default `hz`); a check
//! goes stale quickly, so a master that was stopped (SIGSTOP, a VM pause) grants nothing when it
//! resumes until a fresh check, and a stall long enough for a failover starts a quarantine
//! longer than the lag bound, so acknowledgements buffered before the stall cannot pass for live
//! replicas. "Long enough" is `rlock.stall-ms` (default [`STALL_MS`]; set it at or below
//! Sentinel's `down-after-milliseconds`) and, in a cluster, never more than half the server's
//! own `cluster-node-timeout` (a failover cannot complete before a node is deemed failed).
//!
//! **The auto rule survives a restart.** Once a replica has been online, the master writes
//! [`STATE_FILE`] in its working directory (`dir`, where its RDB and AOF live), and again in the
//! new one after `CONFIG SET dir`; a module that loads and finds it starts as a master that has
//! had replicas: a master restarted before its failover was noticed grants nothing until a
//! replica is in sync again. The file is never removed by the module. It is looked at again
//! at most once a second ([`keep_record`]): deleted at run time, the master forgets that it has
//! had replicas (it runs standalone until one is online again); found (planted, or in a new
//! `dir`) by a server that has not changed role since the module loaded, it counts as at a
//! load. A replica that is promoted starts afresh as before: it grants until a replica has been
//! online, whatever file its directory holds. A refusal the file alone causes says so
//! ([`Refused::HadReplicasFile`]), and `INFO rlock` names the file ([`record_path`]).
//!
//! **A restart is a stall the module did not see.** A master killed and restarted before its
//! group noticed may be failed over all the same (Sentinel goes on with a failover it started),
//! and a replica not yet moved re-syncs from it within a second. So the file also counts the
//! replicas online at the master's last look ([`state_text`], kept in step by [`keep_record`]),
//! and a master that loads at its start with the file present ([`recall`], [`Health::restarted`])
//! grants nothing for the stall quarantine's length from its first check
//! ([`Refused::RestartQuarantine`]), nor, until its role changes or the file is deleted, while
//! fewer replicas are in sync than the file counted ([`Refused::ReplicasBeforeRestart`]): one
//! back of two is not enough, the other may have been promoted (and one promoted later leaves
//! it at once, its connection closed).
//!
//! **Tokens never repeat.** On promotion, and when a master loads its data from disk, the
//! module raises a *token floor* to the current Unix time in ms × 1,000,000: the next token of
//! every lock is at least the floor. A new master's tokens are therefore above every token the
//! old master issued (even ones that never replicated, or that a split-brain old master issued
//! later), as long as the old master issued fewer than a million tokens per lock per
//! millisecond since its own floor, and the clocks of the two servers agree to within the time
//! between the two promotions. Tokens stay integers that Redisson's `RFencedLock` (`INCR` on
//! the same counter) reads as increasing.
//!
//! The rules are plain Rust ([`Health`], [`parse_link`]); the cron and role hooks in `waiting`
//! feed them.

use std::cell::{Cell, RefCell};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};

use crate::error::LockError;

/// `rlock.min-replicas`: -1 auto (1 once a replica has been online), 0 off, n: n replicas.
pub static MIN_REPLICAS: AtomicI64 = AtomicI64::new(-1);
/// `rlock.replica-max-lag`: the largest replication lag, in seconds, of a replica in sync.
pub static MAX_LAG: AtomicI64 = AtomicI64::new(2);

/// The token floor (see the module docs); 0 until the first promotion or load from disk.
static TOKEN_FLOOR: AtomicU64 = AtomicU64::new(0);

/// Tokens per millisecond of the floor.
pub const TOKENS_PER_MS: u64 = 1_000_000;

/// `rlock.stall-ms`: a gap between two checks this long means the server stalled (stopped,
/// paused, blocked) long enough for a failover detector (Sentinel's down-after, a cluster's node
/// timeout) to act.
pub static STALL: AtomicI64 = AtomicI64::new(STALL_MS);

/// `rlock.stall-ms`'s default.
pub const STALL_MS: i64 = 1_500;

/// In a cluster, half the server's `cluster-node-timeout` (ms; `i64::MAX` outside a cluster).
static NODE_TIMEOUT_HALF: AtomicI64 = AtomicI64::new(i64::MAX);

/// The server's `cluster-node-timeout` (ms), when it runs in cluster mode.
pub fn set_cluster_node_timeout(ms: Option<i64>) {
    let half = ms.filter(|&ms| ms > 0).map_or(i64::MAX, |ms| ms / 2);
    NODE_TIMEOUT_HALF.store(half, Ordering::Relaxed);
}

/// The server's cron period in ms (`1000 / hz`, the configured `hz`: `dynamic-hz` only ever
/// shortens it), as last read (`store::settings`).
static CRON_PERIOD: AtomicI64 = AtomicI64::new(100);

/// The longest cron period in force since the last check (ms): a gap that spans a change of
/// `hz` ran partly at the old period, and is no stall for being longer than the new one.
static SPAN_PERIOD: AtomicI64 = AtomicI64::new(100);

/// The server's configured `hz` (ticks of its cron per second, 1 to 500).
pub fn set_hz(hz: Option<i64>) {
    let period = hz.filter(|&hz| hz > 0).map_or(100, |hz| (1000 / hz).max(1));
    let old = CRON_PERIOD.swap(period, Ordering::Relaxed);
    SPAN_PERIOD.fetch_max(old.max(period), Ordering::Relaxed);
}

/// The longest cron period a gap between two checks may have run at.
fn longest_period() -> i64 {
    CRON_PERIOD.load(Ordering::Relaxed).max(SPAN_PERIOD.load(Ordering::Relaxed))
}

/// The stall threshold in force: `rlock.stall-ms`, and in a cluster at most half the node
/// timeout; never below 100 ms, nor below two cron periods: the checks run on the cron, so a
/// gap of one period is how they always run, never a stall (with `stall-ms 100` at the default
/// `hz 10`, every gap would otherwise have counted as one, and a healthy master refused almost
/// every grant).
#[must_use]
pub fn stall_ms() -> i64 {
    let set = STALL.load(Ordering::Relaxed).min(NODE_TIMEOUT_HALF.load(Ordering::Relaxed));
    set.max(100).max(2 * longest_period())
}

/// Which rule of the guard refused a grant: named in the `NOREPLICAS` reply and in `INFO
/// rlock` (`rlock_guard_refuses`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// Fewer replicas in sync (online, lag within `rlock.replica-max-lag`) than required at
    /// the last check (`rlock.min-replicas`; auto: one, once one has been online).
    TooFewReplicas,
    /// The quarantine after a stall: a gap between two checks over the stall threshold
    /// (`rlock.stall-ms`), during which only acknowledgements sent after it count.
    StallQuarantine,
    /// No recent check: none since this server became master (or loaded the module), or the
    /// last one is older than its validity (the server stalled just now, its cron has not run
    /// since).
    NoRecentCheck,
    /// Too few replicas in sync, the replica being required only because the file
    /// `rlock-had-replicas` in the server's working directory says this master has had replicas
    /// (no replica has been online since the module loaded).
    HadReplicasFile,
    /// The quarantine after a restart: a master that loaded with [`STATE_FILE`] present (it
    /// crashed or was restarted while it had replicas) grants nothing for as long as after a
    /// stall, counted from its first check: the group may be failing it over meanwhile.
    RestartQuarantine,
    /// After a restart, fewer replicas in sync than were online before it ([`STATE_FILE`]'s
    /// count), though the setting's own rule is met: a missing one may have been promoted.
    ReplicasBeforeRestart,
}

/// Both `NOREPLICAS` replies of each rule from one table: the rule's reason (and what the
/// caller can do) after what this master refuses, a grant or a give-back of counted permits.
macro_rules! refusal_texts {
    ($($rule:ident => $reason:literal,)*) => {
        impl Refused {
            /// The `NOREPLICAS` reply to a grant (an acquire, a renewal) this rule refuses.
            #[must_use]
            pub const fn message(self) -> &'static str {
                match self {
                    $(Self::$rule => concat!("NOREPLICAS this master grants no lock: ", $reason),)*
                }
            }

            /// The `NOREPLICAS` reply to a give-back of counted permits (`RSEM.RELEASE key
            /// permits`, `RLOCK.CANCEL` of a counted grant) this rule refuses: counted permits
            /// have no lease, so one given back here and lost with this master's data (it is
            /// replaced, and its writes thrown away when it is demoted) would be lost for good.
            #[must_use]
            pub const fn give_back_message(self) -> &'static str {
                match self {
                    $(Self::$rule => concat!(
                        "NOREPLICAS this master gives back no permits (a give-back here would be lost if it has been replaced): ",
                        $reason
                    ),)*
                }
            }
        }
    };
}

// Every text of the guard's refusal is here.
refusal_texts! {
    TooFewReplicas => "too few of its replicas are in sync (rlock.min-replicas, rlock.replica-max-lag); it may have been replaced, retry on the current master",
    StallQuarantine => "it stalled for longer than rlock.stall-ms and is in quarantine until its replicas acknowledge again; it may have been replaced, retry on the current master",
    NoRecentCheck => "its replicas were not checked recently (it stalled, or became master just now); it may have been replaced, retry on the current master",
    HadReplicasFile => "the file rlock-had-replicas in its working directory (INFO rlock: rlock_had_replicas_file) says it has had replicas, and none is in sync (rlock.min-replicas -1); it may have been replaced, retry on the current master, or delete the file (or set rlock.min-replicas 0) to run it standalone",
    RestartQuarantine => "it restarted as a master that had replicas (the file rlock-had-replicas in its working directory) and is in quarantine for rlock.replica-max-lag + 1.5 s; it may have been replaced, retry on the current master",
    ReplicasBeforeRestart => "it restarted, and fewer of its replicas are in sync than were online before (the file rlock-had-replicas in its working directory, INFO rlock: rlock_replicas_before_restart); a missing one may have been promoted, retry on the current master, or delete the file (or set rlock.min-replicas 0) once it is known not to be",
}

impl Refused {
    /// The rule's name in `INFO rlock`.
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Self::TooFewReplicas => "too_few_replicas",
            Self::StallQuarantine => "stall_quarantine",
            Self::NoRecentCheck => "no_recent_check",
            Self::HadReplicasFile => "had_replicas_file",
            Self::RestartQuarantine => "restart_quarantine",
            Self::ReplicasBeforeRestart => "replicas_before_restart",
        }
    }
}

/// The file, in the server's working directory, that says this server has had replicas as a
/// master (the auto rule's memory across restarts).
pub const STATE_FILE: &str = "rlock-had-replicas";

thread_local! {
    static HEALTH: Cell<Health> = const { Cell::new(Health::NEW) };
}

/// One attached replica as `INFO replication` shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Link {
    /// `state=online`: synced and streaming.
    pub online: bool,
    /// Seconds since its last acknowledgement (`lag=`).
    pub lag: i64,
}

/// Parses a `slave<i>` line: `ip=127.0.0.1,port=6380,state=online,offset=123,lag=0`.
#[must_use]
pub fn parse_link(line: &[u8]) -> Option<Link> {
    let mut online = None;
    let mut lag = None;
    for part in line.split(|&b| b == b',') {
        if let Some(state) = part.strip_prefix(b"state=") {
            online = Some(state == b"online");
        } else if let Some(value) = part.strip_prefix(b"lag=") {
            lag = std::str::from_utf8(value).ok().and_then(|v| v.parse().ok());
        }
    }
    Some(Link { online: online?, lag: lag? })
}

/// What the last checks showed of this master's replicas.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Health {
    /// A replica has been online since this server last became master (or loaded the module).
    pub seen: bool,
    /// Replicas online within the lag bound at the last check.
    pub good: u32,
    /// Replicas online (whatever their lag) at the last check: what [`STATE_FILE`] records.
    pub online: u32,
    /// After a restart, the replicas that were online before it ([`STATE_FILE`]'s count): a
    /// grant needs at least that many in sync (0: not restarted, or the file was deleted).
    pub before_restart: u32,
    /// The quarantine (pending until the first check, or running) is the restart's, not a
    /// stall's.
    pub restart_quarantine: bool,
    /// When the last check ran (Unix ms); 0: never.
    pub checked_at: i64,
    /// No grant before this time (Unix ms): the quarantine after a stall.
    pub quarantine_until: i64,
    /// How long a check stays valid (ms): a few cron periods.
    pub valid_ms: i64,
    /// When the last check that found a stall (a gap over the threshold) ran (Unix ms); 0:
    /// never.
    pub stalled_at: i64,
}

impl Health {
    /// Before any check.
    pub const NEW: Self = Self {
        seen: false,
        good: 0,
        online: 0,
        before_restart: 0,
        restart_quarantine: false,
        checked_at: 0,
        quarantine_until: 0,
        valid_ms: 500,
        stalled_at: 0,
    };

    /// A master loaded with [`STATE_FILE`] present, whose count says `before` replicas were
    /// online before it stopped: it has had replicas, needs `before` of them in sync again, and
    /// (`quarantine`: a restart, not a load into a running server) starts in a quarantine at its
    /// first check.
    #[must_use]
    pub const fn restarted(before: u32, quarantine: bool) -> Self {
        Self { seen: true, before_restart: before, restart_quarantine: quarantine, ..Self::NEW }
    }

    /// The state after a check at `now` that found `links`. Checks run on Redis's cron; the
    /// usual gap between them sets how long a check stays valid (a few gaps, at least 500 ms,
    /// at most the stall threshold). `stall_ms`: the stall threshold ([`stall_ms`], never
    /// below two cron periods).
    #[must_use]
    pub fn checked(self, now: i64, links: &[Link], max_lag: i64, stall_ms: i64) -> Self {
        let gap = now - self.checked_at;
        let stalled = self.checked_at > 0 && gap > stall_ms;
        // The first check after a restart: the restart is a stall the module did not see (the
        // group saw the server silent, and may be failing it over).
        let restarting = self.checked_at == 0 && self.restart_quarantine;
        let valid_ms = if self.checked_at > 0 && !stalled {
            (3 * gap).clamp(stall_ms.min(500), stall_ms)
        } else {
            self.valid_ms
        };
        let quarantine_until = if stalled || restarting {
            quarantine_end(now, max_lag)
        } else {
            self.quarantine_until
        };
        let good = links.iter().filter(|l| l.online && l.lag <= max_lag).count();
        let online = links.iter().filter(|l| l.online).count();
        Self {
            seen: self.seen || online > 0,
            good: u32::try_from(good).unwrap_or(u32::MAX),
            online: u32::try_from(online).unwrap_or(u32::MAX),
            before_restart: self.before_restart,
            restart_quarantine: if stalled { false } else { self.restart_quarantine },
            checked_at: now,
            quarantine_until,
            valid_ms,
            stalled_at: if stalled { now } else { self.stalled_at },
        }
    }

    /// How many replicas in sync the setting alone (`min_replicas`) requires.
    fn configured(&self, min_replicas: i64) -> u32 {
        if min_replicas < 0 {
            u32::from(self.seen)
        } else {
            u32::try_from(min_replicas).unwrap_or(u32::MAX)
        }
    }

    /// How many replicas in sync a grant needs under `min_replicas` (the setting): what the
    /// setting requires and, after a restart, never fewer than were online before it; 0 (off)
    /// when the setting is 0.
    #[must_use]
    pub fn required(&self, min_replicas: i64) -> u32 {
        if min_replicas == 0 {
            return 0;
        }
        self.configured(min_replicas).max(self.before_restart)
    }

    /// The count [`STATE_FILE`] should hold: the replicas online now, and never fewer than
    /// were online before a restart (until they are all back, a promoted one may be missing).
    #[must_use]
    pub fn to_record(&self) -> u32 {
        self.online.max(self.before_restart).max(1)
    }

    /// Whether a grant may happen at `now`.
    ///
    /// # Errors
    /// [`LockError::NoReplicas`] when replicas are required and the last check is stale, the
    /// server is in quarantine after a stall or a restart, or too few replicas were in sync
    /// ([`Refused`], in that order; too few for the count before a restart, the setting's
    /// rule met, is [`Refused::ReplicasBeforeRestart`]).
    pub fn may_grant(&self, now: i64, min_replicas: i64) -> Result<(), LockError> {
        let required = self.required(min_replicas);
        if required == 0 {
            return Ok(());
        }
        // Never shorter than two cron periods: after `hz` went down, the next check comes
        // one new period after the last.
        let valid_ms = self.valid_ms.max(2 * longest_period());
        let fresh = self.checked_at > 0 && now - self.checked_at <= valid_ms;
        if !fresh {
            Err(LockError::NoReplicas(Refused::NoRecentCheck))
        } else if now < self.quarantine_until {
            Err(LockError::NoReplicas(if self.restart_quarantine {
                Refused::RestartQuarantine
            } else {
                Refused::StallQuarantine
            }))
        } else if self.good < required {
            Err(LockError::NoReplicas(if self.good >= self.configured(min_replicas) {
                Refused::ReplicasBeforeRestart
            } else {
                Refused::TooFewReplicas
            }))
        } else {
            Ok(())
        }
    }
}

/// The end of a quarantine that starts at `now` (a stall, a restart): longer than the lag
/// bound, so a replica counts again only on an acknowledgement it sent after it began.
#[must_use]
pub fn quarantine_end(now: i64, max_lag: i64) -> i64 {
    now.saturating_add(max_lag.saturating_add(1).saturating_mul(1000)).saturating_add(500)
}

/// The rule a refusal names: [`Refused::HadReplicasFile`] when the replica is required only
/// because [`STATE_FILE`] was found (no replica has been online since, `seen_live` false, under
/// the auto rule), unless the restart's own rules refused.
fn named(rule: Refused, health: &Health, min: i64, seen_live: bool) -> Refused {
    let restart_rule = matches!(rule, Refused::RestartQuarantine | Refused::ReplicasBeforeRestart);
    if min < 0 && health.seen && !seen_live && !restart_rule {
        Refused::HadReplicasFile
    } else {
        rule
    }
}

/// Whether this master may grant now (always, for a server that needs no replicas).
///
/// # Errors
/// [`LockError::NoReplicas`], see [`Health::may_grant`]; its rule is
/// [`Refused::HadReplicasFile`] when the replica is required only because [`STATE_FILE`] was
/// found (no replica has been online since).
pub fn may_grant(now: i64) -> Result<(), LockError> {
    let min = MIN_REPLICAS.load(Ordering::Relaxed);
    let health = HEALTH.get();
    match health.may_grant(now, min) {
        Err(LockError::NoReplicas(rule)) => {
            REFUSED.fetch_add(1, Ordering::Relaxed);
            let seen_live = SEEN_LIVE.load(Ordering::Relaxed);
            Err(LockError::NoReplicas(named(rule, &health, min, seen_live)))
        }
        verdict => verdict,
    }
}

/// Whether this master may grant now, without counting a refusal: the waiters' hand-off asks
/// on every look at a lock with waiters (the poll), which would swamp the count of refused
/// commands.
#[must_use]
pub fn grants_allowed(now: i64) -> bool {
    HEALTH.get().may_grant(now, MIN_REPLICAS.load(Ordering::Relaxed)).is_ok()
}

/// How long after the check that found a stall an id the server has no record of is not
/// taken as new ([`resumed_from_stall`]), at least: the commands buffered through the stall
/// run right after that check.
pub const AFTER_STALL_MS: i64 = 500;

/// Whether the server stalled (stopped, or busy: no check for longer than [`stall_ms`]) just
/// now: its last check (Redis's cron, on a master) is that old at `now`, or found such a gap
/// less than [`AFTER_STALL_MS`] (and two cron periods) ago. A command run now may have waited
/// in the server's buffers through the stall, sent before the record of an id it carries
/// ended meanwhile. (After a SIGSTOP, or a long command, Redis runs its cron before it reads
/// the commands that arrived meanwhile: the first check sees the gap, then they run.)
#[must_use]
pub fn resumed_from_stall(now: i64) -> bool {
    let health = HEALTH.get();
    let unchecked = health.checked_at > 0 && now - health.checked_at > stall_ms();
    let after = AFTER_STALL_MS.max(2 * longest_period());
    unchecked || (health.stalled_at > 0 && now - health.stalled_at <= after)
}

/// Commands refused by [`may_grant`] since load.
static REFUSED: AtomicU64 = AtomicU64::new(0);

/// Folds a check into the state; returns whether grants became allowed by it (waiters that
/// were held back can be served now).
pub fn record_check(now: i64, links: &[Link]) -> bool {
    if links.iter().any(|l| l.online) {
        SEEN_LIVE.store(true, Ordering::Relaxed);
    }
    let min = MIN_REPLICAS.load(Ordering::Relaxed);
    let before = HEALTH.get();
    let after = before.checked(now, links, MAX_LAG.load(Ordering::Relaxed), stall_ms());
    HEALTH.set(after);
    // The next gap runs at the period in force now.
    SPAN_PERIOD.store(CRON_PERIOD.load(Ordering::Relaxed), Ordering::Relaxed);
    before.may_grant(now, min).is_err() && after.may_grant(now, min).is_ok()
}

/// What [`STATE_FILE`] says, for the file's readers, before its count line ([`state_text`]).
const STATE_TEXT: &str = "This Redis server, as a master, has had replicas. After a restart, the \
                          rlock module's replica guard grants nothing for rlock.replica-max-lag + \
                          1.5 s, nor until as many replicas as the line below counts (online \
                          before the restart) are in sync again (rlock.min-replicas 0 turns the \
                          guard off).\nDelete this file to run it standalone again.\n";

/// The line of [`STATE_FILE`] that counts the replicas online at the master's last look.
const COUNT_PREFIX: &str = "replicas ";

/// The text of [`STATE_FILE`] recording `count` replicas.
#[must_use]
pub fn state_text(count: u32) -> String {
    format!("{STATE_TEXT}{COUNT_PREFIX}{count}\n")
}

/// The count [`STATE_FILE`]'s text records: 1 when it has none (written by an older version,
/// or planted), as a file alone always meant one replica.
#[must_use]
pub fn parse_count(text: &str) -> u32 {
    text.lines()
        .find_map(|l| l.trim().strip_prefix(COUNT_PREFIX)?.trim().parse::<u32>().ok())
        .unwrap_or(1)
        .max(1)
}

/// Where [`STATE_FILE`] stands, as the module last saw it.
#[derive(Debug, Default)]
struct Record {
    /// The working directory the file was last found or written in (`None`: not known there).
    dir: Option<PathBuf>,
    /// The count the file in `dir` holds (`None`: not read yet).
    count: Option<u32>,
    /// A write failed in this directory (logged once; tried again at each look, once a second).
    failed_in: Option<PathBuf>,
    /// When the file was last looked at (Unix ms; 0: never).
    looked_at: i64,
}

thread_local! {
    static RECORD: RefCell<Record> = RefCell::new(Record::default());
}

/// A replica has been online since the module loaded, this server became master, or the file
/// was deleted (else, `seen` came from the file alone).
static SEEN_LIVE: AtomicBool = AtomicBool::new(false);

/// The file counts for this server: it has not changed role since the module loaded (a promoted
/// replica starts afresh, whatever its directory holds).
static FILE_COUNTS: AtomicBool = AtomicBool::new(true);

/// How often [`keep_record`] looks at the file (ms).
const LOOK_EVERY_MS: i64 = 1_000;

/// What [`keep_record`] did, for the log.
#[derive(Debug)]
pub enum RecordNews {
    Nothing,
    /// The file was written (first replica online, or a new `dir`), with this count.
    Written(PathBuf, u32),
    /// The file's count changed (replicas came or went).
    Counted(PathBuf, u32),
    /// It could not be written: a restart will not remember the replicas.
    WriteFailed(PathBuf, std::io::Error),
    /// It was found at run time (planted, or in a new `dir`): grants now need that many
    /// replicas.
    Found(PathBuf, u32),
    /// It was deleted at run time: the server runs standalone until a replica is online.
    Deleted(PathBuf),
}

/// The file at `dir`.
fn file_in(dir: &Path) -> PathBuf {
    dir.join(STATE_FILE)
}

/// The count of the file in the working directory (1 if unreadable: it exists).
fn read_count() -> u32 {
    std::fs::read_to_string(STATE_FILE).map_or(1, |text| parse_count(&text))
}

/// Writes the file in the working directory whole or not at all (a temporary file renamed over
/// it): a crash mid-write leaves the old count, never a truncated file.
fn write_count(count: u32) -> std::io::Result<()> {
    let tmp = format!("{STATE_FILE}.tmp");
    std::fs::write(&tmp, state_text(count))?;
    std::fs::rename(&tmp, STATE_FILE)
}

/// Keeps [`STATE_FILE`] in step (a master's cron): at most once a second, or at once when a
/// replica has been seen and the file is not known written or counts fewer replicas than are
/// online, it looks at the file in the working directory: written there if this master has had
/// replicas and it is missing from a directory it was never known in (a first replica, `CONFIG
/// SET dir`), rewritten when its count differs from [`Health::to_record`]; found there, it
/// counts (see the module docs); gone from the directory it was known in, it was deleted: the
/// master forgets its replicas. Costs one `stat` (and rarely a write) a second.
pub fn keep_record(now: i64) -> RecordNews {
    let health = HEALTH.get();
    let due = RECORD.with(|r| {
        let r = r.borrow();
        let behind = r.count.is_some_and(|c| c < health.to_record());
        now.saturating_sub(r.looked_at) >= LOOK_EVERY_MS
            || (health.seen && (r.dir.is_none() || behind) && r.failed_in.is_none())
    });
    if !due {
        return RecordNews::Nothing;
    }
    let Ok(cwd) = std::env::current_dir() else { return RecordNews::Nothing };
    let present = Path::new(STATE_FILE).exists();
    RECORD.with(|r| {
        let mut r = r.borrow_mut();
        r.looked_at = now;
        if present {
            if r.dir.as_deref() != Some(cwd.as_path()) || r.count.is_none() {
                r.dir = Some(cwd.clone());
                r.count = Some(read_count());
            }
            let count = r.count.unwrap_or(1);
            if !health.seen && FILE_COUNTS.load(Ordering::Relaxed) {
                HEALTH.set(Health { seen: true, before_restart: count, ..health });
                return RecordNews::Found(file_in(&cwd), count);
            }
            if health.seen && count != health.to_record() {
                return write(&mut r, &cwd, health.to_record(), false);
            }
            RecordNews::Nothing
        } else if r.dir.as_deref() == Some(cwd.as_path()) {
            r.dir = None;
            r.count = None;
            r.failed_in = None;
            SEEN_LIVE.store(false, Ordering::Relaxed);
            HEALTH.set(Health { seen: false, before_restart: 0, ..health });
            RecordNews::Deleted(file_in(&cwd))
        } else if health.seen {
            write(&mut r, &cwd, health.to_record(), true)
        } else {
            RecordNews::Nothing
        }
    })
}

/// Writes the file with `count` in `cwd` (`first`: it was not there).
fn write(r: &mut Record, cwd: &Path, count: u32, first: bool) -> RecordNews {
    match write_count(count) {
        Ok(()) => {
            r.dir = Some(cwd.to_path_buf());
            r.count = Some(count);
            r.failed_in = None;
            if first {
                RecordNews::Written(file_in(cwd), count)
            } else {
                RecordNews::Counted(file_in(cwd), count)
            }
        }
        Err(e) => {
            let new = r.failed_in.as_deref() != Some(cwd);
            r.failed_in = Some(cwd.to_path_buf());
            if new {
                RecordNews::WriteFailed(file_in(cwd), e)
            } else {
                RecordNews::Nothing
            }
        }
    }
}

/// The log line for [`STATE_FILE`] found at `path` (at load or at run time), counting `count`
/// replicas.
#[must_use]
pub fn found_message(path: &Path, count: u32) -> String {
    format!(
        "rlock: found {}: this master has had {count} replica(s) online: it grants nothing \
         until {count} are in sync again (and, after a restart, not for rlock.replica-max-lag + \
         1.5 s); delete the file, or set rlock.min-replicas 0, to run it standalone",
        path.display()
    )
}

/// Where [`STATE_FILE`] was last found or written (`INFO rlock`); `None`: nowhere known.
#[must_use]
pub fn record_path() -> Option<PathBuf> {
    RECORD.with(|r| r.try_borrow().ok().and_then(|r| r.dir.as_deref().map(file_in)))
}

/// At load: a master that finds [`STATE_FILE`] has had replicas before its restart, as many
/// online as the file counts: it needs them back in sync before it grants, and (`restart`: at
/// the server's start, not a `MODULE LOAD` into a running server) starts in a quarantine at
/// its first check. Returns the file's path and count then, for the log.
pub fn recall(restart: bool) -> Option<(PathBuf, u32)> {
    if !Path::new(STATE_FILE).exists() {
        return None;
    }
    let cwd = std::env::current_dir().ok()?;
    let count = read_count();
    HEALTH.set(Health::restarted(count, restart));
    RECORD.with(|r| {
        let mut r = r.borrow_mut();
        r.dir = Some(cwd.clone());
        r.count = Some(count);
    });
    Some((file_in(&cwd), count))
}

/// This server is not a master: it grants nothing, and forgets its replicas. When it is
/// promoted it starts afresh: a new master grants like a standalone server until a replica
/// has come online.
pub fn not_master() {
    HEALTH.set(Health::NEW);
    SEEN_LIVE.store(false, Ordering::Relaxed);
    FILE_COUNTS.store(false, Ordering::Relaxed);
}

/// This server just became a master (promotion) or loaded its data from disk (a restart):
/// tokens from now on are above any its predecessor could have issued.
pub fn raise_token_floor(now: i64) {
    let floor = u64::try_from(now).unwrap_or(0).saturating_mul(TOKENS_PER_MS);
    TOKEN_FLOOR.fetch_max(floor.min(i64::MAX as u64), Ordering::Relaxed);
}

/// The largest token this server granted since load.
static TOKEN_HIGH: AtomicU64 = AtomicU64::new(0);

/// Set (for good) once an `allkeys-*` eviction policy has been in force since load: a token
/// counter may have been evicted (it has no TTL), and restarting from a missing counter would
/// repeat tokens.
static COUNTERS_EVICTABLE: AtomicBool = AtomicBool::new(false);

/// An `allkeys-*` policy is (or was) in force: from now on every token also exceeds every token
/// this server granted ([`token_floor`]).
pub fn counters_evictable() {
    COUNTERS_EVICTABLE.store(true, Ordering::Relaxed);
}

/// A token was granted: the high-water mark that tokens exceed once counters are evictable.
pub fn token_granted(token: u64) {
    TOKEN_HIGH.fetch_max(token, Ordering::Relaxed);
}

/// The least token the next grant may take, for [`crate::rules::next_token`]: the failover floor
/// and, once counters may have been evicted, one more than the largest token this server granted
/// (so an evicted counter never restarts below a token already given; tokens then grow across
/// every lock of the server, still strictly increasing per lock).
#[must_use]
pub fn token_floor() -> u64 {
    let floor = TOKEN_FLOOR.load(Ordering::Relaxed);
    if COUNTERS_EVICTABLE.load(Ordering::Relaxed) {
        floor.max(TOKEN_HIGH.load(Ordering::Relaxed).saturating_add(1))
    } else {
        floor
    }
}

/// The failover floor alone, for `INFO rlock`.
#[must_use]
pub fn failover_floor() -> u64 {
    TOKEN_FLOOR.load(Ordering::Relaxed)
}

/// At load: a reloaded module may find its old statics.
pub fn reset() {
    HEALTH.set(Health::NEW);
    RECORD.with(|r| *r.borrow_mut() = Record::default());
    SEEN_LIVE.store(false, Ordering::Relaxed);
    FILE_COUNTS.store(true, Ordering::Relaxed);
    TOKEN_FLOOR.store(0, Ordering::Relaxed);
    TOKEN_HIGH.store(0, Ordering::Relaxed);
    COUNTERS_EVICTABLE.store(false, Ordering::Relaxed);
    REFUSED.store(0, Ordering::Relaxed);
}

/// The guard's state for `INFO rlock`.
#[derive(Debug, Clone, Copy)]
pub struct Summary {
    /// Replicas in sync a grant needs now.
    pub required: u32,
    /// Replicas in sync at the last check.
    pub in_sync: u32,
    /// The replicas online before a restart that a grant needs back (0: none).
    pub before_restart: u32,
    /// The rule that refuses grants now (`None`: grants allowed).
    pub refusing: Option<Refused>,
    /// Grants refused since load.
    pub refused: u64,
}

/// For `INFO rlock`.
#[must_use]
pub fn summary(now: i64) -> Summary {
    let health = HEALTH.get();
    let min = MIN_REPLICAS.load(Ordering::Relaxed);
    let refusing = match health.may_grant(now, min) {
        Err(LockError::NoReplicas(rule)) => {
            Some(named(rule, &health, min, SEEN_LIVE.load(Ordering::Relaxed)))
        }
        _ => None,
    };
    Summary {
        required: health.required(min),
        in_sync: health.good,
        before_restart: health.before_restart,
        refusing,
        refused: REFUSED.load(Ordering::Relaxed),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const UP: Link = Link { online: true, lag: 0 };

    #[test]
    fn a_refused_give_back_says_so_with_the_reason_of_the_refused_grant() {
        let rules = [
            Refused::TooFewReplicas,
            Refused::StallQuarantine,
            Refused::NoRecentCheck,
            Refused::HadReplicasFile,
            Refused::RestartQuarantine,
            Refused::ReplicasBeforeRestart,
        ];
        for rule in rules {
            let grant = rule.message().strip_prefix("NOREPLICAS this master grants no lock: ");
            let give_back = rule.give_back_message().strip_prefix(
                "NOREPLICAS this master gives back no permits (a give-back here would be lost if it has been replaced): ",
            );
            assert!(grant.is_some_and(|reason| reason.len() > 20), "{rule:?}");
            assert_eq!(give_back, grant, "{rule:?}");
        }
    }

    #[test]
    fn parses_info_lines() {
        assert_eq!(
            parse_link(b"ip=127.0.0.1,port=6380,state=online,offset=123,lag=1"),
            Some(Link { online: true, lag: 1 })
        );
        assert_eq!(
            parse_link(b"ip=::1,port=1,state=wait_bgsave,offset=0,lag=0"),
            Some(Link { online: false, lag: 0 })
        );
        assert_eq!(parse_link(b"ip=::1,port=1"), None);
    }

    #[test]
    fn a_check_after_a_gap_over_the_threshold_records_when_it_found_the_stall() {
        let h = Health::NEW.checked(1_000, &[], 2, STALL_MS).checked(1_100, &[], 2, STALL_MS);
        assert_eq!(h.stalled_at, 0, "a cron period is no stall");
        let h = h.checked(1_100 + STALL_MS + 1, &[], 2, STALL_MS);
        assert_eq!(h.stalled_at, 1_100 + STALL_MS + 1);
        let h = h.checked(1_200 + STALL_MS + 1, &[], 2, STALL_MS);
        assert_eq!(h.stalled_at, 1_100 + STALL_MS + 1, "kept until the next stall");
    }

    #[test]
    fn a_master_without_replicas_grants_and_one_that_had_them_needs_them() {
        let h = Health::NEW.checked(1_000, &[], 2, STALL_MS);
        assert_eq!(h.may_grant(1_050, -1), Ok(()));
        let h = h.checked(1_100, &[UP], 2, STALL_MS);
        assert_eq!(h.may_grant(1_150, -1), Ok(()));
        let lagging = Link { online: true, lag: 3 };
        let h = h.checked(1_200, &[lagging], 2, STALL_MS);
        assert_eq!(h.may_grant(1_250, -1), Err(LockError::NoReplicas(Refused::TooFewReplicas)));
        let h = h.checked(1_300, &[], 2, STALL_MS);
        assert_eq!(h.may_grant(1_350, -1), Err(LockError::NoReplicas(Refused::TooFewReplicas)));
        assert_eq!(h.may_grant(1_350, 0), Ok(()), "0 turns the check off");
        assert_eq!(
            Health::NEW.may_grant(5, 1),
            Err(LockError::NoReplicas(Refused::NoRecentCheck)),
            "explicit minimum"
        );
    }

    #[test]
    fn a_stale_check_or_a_stall_refuses_until_fresh_acknowledgements() {
        let h = Health::NEW.checked(1_000, &[UP], 2, STALL_MS).checked(1_100, &[UP], 2, STALL_MS);
        assert_eq!(h.may_grant(1_500, -1), Ok(()));
        assert_eq!(
            h.may_grant(1_700, -1),
            Err(LockError::NoReplicas(Refused::NoRecentCheck)),
            "check too old"
        );
        // Stopped for 5 s: the first check after it still sees the replica (buffered acks).
        let h = h.checked(6_000, &[UP], 2, STALL_MS);
        assert_eq!(h.may_grant(6_050, -1), Err(LockError::NoReplicas(Refused::StallQuarantine)));
        let mut h = h;
        for now in (6_100..=9_400).step_by(100) {
            h = h.checked(now, &[UP], 2, STALL_MS);
            assert_eq!(
                h.may_grant(now + 50, -1),
                Err(LockError::NoReplicas(Refused::StallQuarantine)),
                "in quarantine"
            );
        }
        let h = h.checked(9_500, &[UP], 2, STALL_MS);
        assert_eq!(h.may_grant(9_550, -1), Ok(()));
    }

    #[test]
    fn the_stall_threshold_is_the_setting() {
        let h = Health::NEW.checked(1_000, &[UP], 2, 1_000).checked(1_100, &[UP], 2, 1_000);
        let h = h.checked(2_300, &[UP], 2, 1_000);
        assert!(h.quarantine_until > 2_300, "a 1.2 s stall over a 1 s threshold");
        assert_eq!(h.may_grant(2_350, -1), Err(LockError::NoReplicas(Refused::StallQuarantine)));
        let h = Health::NEW.checked(1_000, &[UP], 2, 1_500).checked(2_200, &[UP], 2, 1_500);
        assert_eq!(h.quarantine_until, 0, "not over the default");
    }

    #[test]
    fn a_slow_cron_widens_the_validity() {
        let h = Health::NEW.checked(1_000, &[UP], 2, STALL_MS).checked(2_000, &[UP], 2, STALL_MS);
        assert_eq!(h.quarantine_until, 0, "a 1 s cron period is no stall");
        assert_eq!(h.may_grant(3_400, -1), Ok(()));
        let h = h.checked(3_010, &[UP], 2, STALL_MS);
        assert_eq!(h.quarantine_until, 0);
    }

    /// The cron's own gap at the configured `hz` is never a stall, whatever `rlock.stall-ms`
    /// accepts: with its minimum (100) at the default `hz` (10), a healthy master's checks every
    /// ~100 ms (a little more when the server is busy) grant throughout.
    #[test]
    fn the_smallest_stall_setting_never_refuses_a_master_whose_cron_runs_on_time() {
        for hz in [1, 10, 100, 500] {
            set_hz(Some(hz));
            STALL.store(100, Ordering::Relaxed);
            let period = 1000 / hz;
            let threshold = stall_ms();
            assert!(threshold >= 2 * period, "hz {hz}: {threshold}");
            let mut h = Health::NEW.checked(1_000, &[UP], 2, threshold);
            let mut now = 1_000;
            for i in 0..200 {
                // On time, or late by up to half a period.
                now += period + (i % 3) * period / 4;
                h = h.checked(now, &[UP], 2, threshold);
                assert_eq!(h.quarantine_until, 0, "hz {hz}: gap {} is no stall", period);
                assert_eq!(h.may_grant(now + period - 1, -1), Ok(()), "hz {hz} at {i}");
            }
            // A real stall still counts.
            let h = h.checked(now + threshold + 1, &[UP], 2, threshold);
            assert!(h.quarantine_until > 0, "hz {hz}");
        }
        // A gap that spans a change of hz ran partly at the old period: no stall, and a check
        // made at the short period stays valid until the first check at the long one.
        set_hz(Some(1));
        SPAN_PERIOD.store(1000, Ordering::Relaxed);
        let h = Health::NEW.checked(1_000, &[UP], 2, stall_ms());
        set_hz(Some(500));
        let h = h.checked(2_000, &[UP], 2, stall_ms());
        assert_eq!(h.quarantine_until, 0, "hz 1 -> 500: the 1 s gap is the old period's");
        SPAN_PERIOD.store(2, Ordering::Relaxed);
        let h = h.checked(2_002, &[UP], 2, stall_ms());
        set_hz(Some(1));
        assert_eq!(h.may_grant(2_002 + 999, -1), Ok(()), "hz 500 -> 1: the next check is 1 s away");
        set_hz(Some(10));
        SPAN_PERIOD.store(100, Ordering::Relaxed);
        STALL.store(STALL_MS, Ordering::Relaxed);
    }

    /// Checks every 100 ms from `from` to `to` (inclusive) finding `links`; whether a grant
    /// was allowed after each.
    fn run(mut h: Health, from: i64, to: i64, links: &[Link], min: i64) -> (Health, Vec<bool>) {
        let mut allowed = Vec::new();
        for now in (from..=to).step_by(100) {
            h = h.checked(now, links, 2, STALL_MS);
            allowed.push(h.may_grant(now + 50, min).is_ok());
        }
        (h, allowed)
    }

    #[test]
    fn a_restarted_master_is_quarantined_from_its_first_check_as_after_a_stall() {
        // Loaded at 1_000, first check at 5_000 (a long AOF load): the quarantine runs from
        // the check, for rlock.replica-max-lag (2) + 1.5 s, replica in sync or not.
        let h = Health::restarted(1, true);
        assert_eq!(h.may_grant(1_000, -1), Err(LockError::NoReplicas(Refused::NoRecentCheck)));
        let h = h.checked(5_000, &[UP], 2, STALL_MS);
        assert_eq!(h.quarantine_until, quarantine_end(5_000, 2));
        assert_eq!(h.quarantine_until, 8_500);
        let (h, allowed) = run(h, 5_100, 8_300, &[UP], -1);
        assert!(allowed.iter().all(|a| !a), "in quarantine: {allowed:?}");
        assert_eq!(h.may_grant(8_400, -1), Err(LockError::NoReplicas(Refused::RestartQuarantine)));
        let h = h.checked(8_500, &[UP], 2, STALL_MS);
        assert_eq!(h.may_grant(8_550, -1), Ok(()));
        // Only the first check starts it: later ones on time never do again.
        let (_, allowed) = run(h, 8_600, 20_000, &[UP], -1);
        assert!(allowed.iter().all(|a| *a));
        // A MODULE LOAD into a running server: no quarantine, the count still holds.
        let h = Health::restarted(2, false).checked(5_000, &[UP, UP], 2, STALL_MS);
        assert_eq!(h.quarantine_until, 0);
        assert_eq!(h.may_grant(5_050, -1), Ok(()));
    }

    #[test]
    fn a_restarted_master_needs_as_many_replicas_in_sync_as_were_online_before() {
        let lagging = Link { online: true, lag: 5 };
        let down = Link { online: false, lag: 0 };
        for before in 1..=4_u32 {
            for min in [-1_i64, 1, 2, 3] {
                // Every mix of links, long after the quarantine.
                for mask in 0..81_u32 {
                    let links: Vec<Link> = (0..4)
                        .map(|i| [UP, lagging, down][(mask / 3_u32.pow(i) % 3) as usize])
                        .collect();
                    let h = Health::restarted(before, true).checked(1_000, &links, 2, STALL_MS);
                    let (h, _) = run(h, 1_100, 6_000, &links, min);
                    let good = links.iter().filter(|l| **l == UP).count() as u32;
                    let setting = if min < 0 { 1 } else { min as u32 };
                    let verdict = h.may_grant(6_050, min);
                    let case = format!("before {before}, min {min}, links {links:?}");
                    assert_eq!(h.required(min), setting.max(before), "{case}");
                    assert_eq!(verdict.is_ok(), good >= setting.max(before), "{case}");
                    if verdict.is_err() {
                        let rule = if good >= setting {
                            Refused::ReplicasBeforeRestart
                        } else {
                            Refused::TooFewReplicas
                        };
                        assert_eq!(verdict, Err(LockError::NoReplicas(rule)), "{case}");
                    }
                    // rlock.min-replicas 0 turns it all off, the quarantine included.
                    assert_eq!(h.may_grant(6_050, 0), Ok(()), "{case}");
                    assert_eq!(Health::restarted(before, true).may_grant(0, 0), Ok(()));
                    // The file never records fewer than the count before the restart.
                    assert_eq!(h.to_record(), before.max(good + lagging_online(&links)));
                }
            }
        }
    }

    fn lagging_online(links: &[Link]) -> u32 {
        links.iter().filter(|l| l.online && l.lag > 2).count() as u32
    }

    #[test]
    fn a_stall_after_a_restart_is_named_as_a_stall() {
        let h = Health::restarted(1, true).checked(1_000, &[UP], 2, STALL_MS);
        let (h, _) = run(h, 1_100, 5_000, &[UP], -1);
        let h = h.checked(7_000, &[UP], 2, STALL_MS);
        assert_eq!(h.may_grant(7_050, -1), Err(LockError::NoReplicas(Refused::StallQuarantine)));
    }

    #[test]
    fn the_files_count_reads_back_and_defaults_to_one() {
        for count in [1, 2, 7, 1000] {
            assert_eq!(parse_count(&state_text(count)), count);
        }
        assert_eq!(parse_count("planted"), 1, "no count line: one replica, as before");
        assert_eq!(parse_count(STATE_TEXT), 1, "an older version's file");
        assert_eq!(parse_count("replicas 0\n"), 1, "never below one");
        assert_eq!(parse_count("replicas x\n"), 1);
        assert!(state_text(3).starts_with(STATE_TEXT));
    }

    #[test]
    fn only_the_restarts_own_rules_are_not_renamed_for_the_file() {
        let h = Health::restarted(2, true);
        for rule in [Refused::TooFewReplicas, Refused::NoRecentCheck, Refused::StallQuarantine] {
            assert_eq!(named(rule, &h, -1, false), Refused::HadReplicasFile);
            assert_eq!(named(rule, &h, -1, true), rule, "a replica has been online since");
            assert_eq!(named(rule, &h, 1, false), rule, "an explicit setting");
        }
        for rule in [Refused::RestartQuarantine, Refused::ReplicasBeforeRestart] {
            assert_eq!(named(rule, &h, -1, false), rule);
        }
    }

    #[test]
    fn each_refusal_names_its_rule() {
        for rule in [
            Refused::TooFewReplicas,
            Refused::StallQuarantine,
            Refused::NoRecentCheck,
            Refused::HadReplicasFile,
            Refused::RestartQuarantine,
            Refused::ReplicasBeforeRestart,
        ] {
            let text = LockError::NoReplicas(rule).message();
            assert!(text.starts_with("NOREPLICAS "), "{text}");
            assert!(!rule.name().is_empty());
        }
        assert!(Refused::StallQuarantine.message().contains("rlock.stall-ms"));
        assert!(Refused::TooFewReplicas.message().contains("rlock.min-replicas"));
    }
}
