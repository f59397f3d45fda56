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

mod guard;
mod health;
mod record;
mod settings;
mod tokens;

pub use crate::error::Refused;
pub use guard::{
    grants_allowed, may_grant, not_master, record_check, resumed_from_stall, summary, Summary,
    AFTER_STALL_MS,
};
pub use health::{parse_link, quarantine_end, Health, Link};
pub use record::{
    found_message, keep_record, parse_count, recall, record_path, state_text, RecordNews,
    STATE_FILE,
};
pub use settings::{
    set_cluster_node_timeout, set_hz, stall_ms, MAX_LAG, MIN_REPLICAS, STALL, STALL_MS,
};
pub use tokens::{
    counters_evictable, failover_floor, raise_token_floor, token_floor, token_granted,
    TOKENS_PER_MS,
};

/// At load: a reloaded module may find its old statics.
pub fn reset() {
    guard::reset();
    record::reset();
    tokens::reset();
}
