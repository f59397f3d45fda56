//! The checks of what the caller may believe against the servers:
//!
//! - [`against_servers`]: a guard that says held (not lost, its deadline ahead) ⇒ the server
//!   holds it for that owner (or those permit ids), with a lease ending no earlier than the
//!   guard's `valid_until` (less [`TOLERANCE_MS`] for the clocks' milliseconds);
//! - [`exclusion`]: no two guards of different owners believe they hold one lock (a write
//!   side excludes every other owner);
//! - [`leftover_hash`], [`leftover_permits`]: after a settle, nothing is held that no guard
//!   knows of, except what [`Exempt`] allows (a hold whose guard was lost may stay until its
//!   lease ends).

use std::collections::{BTreeMap, BTreeSet};

use redis::Connection;
use tokio::time::Instant;

use super::belief::{Claim, Target};
use super::view;

/// Slack between the server's millisecond clock and the client's monotonic one.
pub const TOLERANCE_MS: i64 = 25;

/// A belief the servers (or another belief) contradict.
#[derive(Debug, Clone)]
pub struct Violation {
    /// The beliefs involved (`g<id>`).
    pub beliefs: Vec<usize>,
    /// The `server/key` names involved.
    pub keys: Vec<String>,
    /// Whether a session guard is involved (its client learns of a closed connection a
    /// moment after the server ended its holds).
    pub session: bool,
    pub text: String,
}

fn ms_until(until: Instant, now: Instant) -> i64 {
    i64::try_from(until.saturating_duration_since(now).as_millis()).unwrap_or(i64::MAX)
}

fn violation(claims: &[&Claim], text: String) -> Violation {
    let mut keys: Vec<String> = claims.iter().flat_map(|c| c.target.keys()).collect();
    keys.sort();
    keys.dedup();
    Violation {
        beliefs: claims.iter().map(|c| c.belief).collect(),
        keys,
        session: claims.iter().any(|c| c.session),
        text,
    }
}

fn names(claims: &[&Claim]) -> String {
    claims.iter().map(|c| format!("g{}", c.belief)).collect::<Vec<_>>().join(", ")
}

/// The claims of one owner on one side of one key, checked against the server's count of that
/// field and the lease(s) covering it. Distinct holds show as distinct deadlines (every guard of
/// one hold shares its deadline).
fn check_field(
    claims: &[&Claim],
    field: &str,
    state: &view::HashState,
    leases: Option<&[i64]>,
    now: Instant,
) -> Option<Violation> {
    let mut reqs: Vec<i64> =
        claims.iter().filter_map(|c| c.until).map(|u| ms_until(u, now)).collect();
    reqs.sort_unstable_by(|a, b| b.cmp(a));
    reqs.dedup();
    let holds = i64::try_from(reqs.len()).unwrap_or(i64::MAX);
    let count = state.count(field);
    let who = names(claims);
    if count < holds {
        return Some(violation(
            claims,
            format!(
                "{who} say held (valid {reqs:?} ms more) but the server counts {count} hold(s) \
                 of field {field:?} (hash {:?}, lease {:?} ms)",
                state.fields, state.lease_ms
            ),
        ));
    }
    let covered: Vec<i64> = match leases {
        Some(leases) => leases.to_vec(),
        None => vec![state.lease_ms.unwrap_or(-2); reqs.len()],
    };
    for (i, req) in reqs.iter().enumerate() {
        let lease = covered.get(i).copied().unwrap_or(-2);
        if lease.saturating_add(TOLERANCE_MS) < *req {
            return Some(violation(
                claims,
                format!(
                    "{who} say their holds are valid {reqs:?} ms more but the server's lease is \
                     {lease} ms (field {field:?} count {count}; leases {covered:?})"
                ),
            ));
        }
    }
    None
}

/// Checks every claim against the servers (`cons[i]`: a connection to server `i`).
///
/// # Panics
/// When a server does not answer.
#[must_use]
pub fn against_servers(cons: &mut [Connection], claims: &[Claim]) -> Vec<Violation> {
    let mut out = Vec::new();
    // Locks and read-write locks, by key then owner.
    let mut hashes: BTreeMap<(usize, String), Vec<&Claim>> = BTreeMap::new();
    let mut permits: BTreeMap<(usize, String), Vec<&Claim>> = BTreeMap::new();
    for claim in claims {
        match &claim.target {
            Target::Lock { server, key }
            | Target::Read { server, key }
            | Target::Write { server, key } => {
                hashes.entry((*server, key.clone())).or_default().push(claim);
            }
            Target::Permits { server, key } => {
                permits.entry((*server, key.clone())).or_default().push(claim);
            }
            Target::Multi { parts, quorum } => {
                let held = parts.iter().filter(|(s, k)| view::exists(&mut cons[*s], k)).count();
                if held < *quorum {
                    out.push(violation(
                        &[claim],
                        format!(
                            "g{} says held (not lost) but only {held} of its {} locks exist \
                             ({quorum} needed)",
                            claim.belief,
                            parts.len()
                        ),
                    ));
                }
            }
        }
    }
    for ((server, key), group) in hashes {
        let con = &mut cons[server];
        let state = view::hash(con, &key);
        let mut sides: BTreeMap<(String, bool), Vec<&Claim>> = BTreeMap::new();
        for claim in group {
            let read = matches!(claim.target, Target::Read { .. });
            sides.entry((claim.owner.clone(), read)).or_default().push(claim);
        }
        for ((owner, read), side) in sides {
            let leases = read.then(|| view::read_leases(con, &key, &owner));
            let now = Instant::now();
            let side: Vec<&Claim> =
                side.into_iter().filter(|c| c.until.is_some_and(|u| u > now)).collect();
            if side.is_empty() {
                continue;
            }
            let field = match side[0].target {
                Target::Write { .. } => format!("{owner}:write"),
                _ => owner.clone(),
            };
            out.extend(check_field(&side, &field, &state, leases.as_deref(), now));
        }
    }
    for ((server, key), group) in permits {
        let state = view::permits(&mut cons[server], &key);
        let now = Instant::now();
        for claim in group {
            let Some(until) = claim.until.filter(|u| *u > now) else { continue };
            let req = ms_until(until, now);
            for id in &claim.ids {
                let lease = state.leases.get(id).copied();
                if lease.is_none_or(|l| l.saturating_add(TOLERANCE_MS) < req) {
                    out.push(violation(
                        &[claim],
                        format!(
                            "g{} says its permits are valid {req} ms more, but permit {} has \
                             {lease:?} ms left on the server",
                            claim.belief,
                            hex(id)
                        ),
                    ));
                }
            }
        }
    }
    out
}

/// Bytes as hex.
#[must_use]
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Two guards of different owners that both believe they hold one lock (a write side excludes
/// every other owner, readers share; a RedLock excludes other RedLocks of the same name).
#[must_use]
pub fn exclusion(claims: &[Claim]) -> Vec<Violation> {
    let mut locks: BTreeMap<(usize, String), Vec<(&Claim, bool)>> = BTreeMap::new();
    let mut redlocks: BTreeMap<Vec<(usize, String)>, Vec<&Claim>> = BTreeMap::new();
    for claim in claims {
        match &claim.target {
            Target::Lock { server, key } | Target::Write { server, key } => {
                locks.entry((*server, key.clone())).or_default().push((claim, true));
            }
            Target::Read { server, key } => {
                locks.entry((*server, key.clone())).or_default().push((claim, false));
            }
            Target::Multi { parts, quorum } if *quorum == parts.len() => {
                for (server, key) in parts {
                    locks.entry((*server, key.clone())).or_default().push((claim, true));
                }
            }
            Target::Multi { parts, .. } => redlocks.entry(parts.clone()).or_default().push(claim),
            Target::Permits { .. } => {}
        }
    }
    let mut out = Vec::new();
    for ((server, key), group) in locks {
        let exclusive: BTreeSet<&str> =
            group.iter().filter(|(_, x)| *x).map(|(c, _)| c.identity.as_str()).collect();
        let all: BTreeSet<&str> = group.iter().map(|(c, _)| c.identity.as_str()).collect();
        if !exclusive.is_empty() && all.len() > 1 {
            let claims: Vec<&Claim> = group.iter().map(|(c, _)| *c).collect();
            out.push(violation(
                &claims,
                format!(
                    "{} all believe they hold {server}/{key}, as {all:?} (one of them \
                     exclusively)",
                    names(&claims)
                ),
            ));
        }
    }
    for (parts, group) in redlocks {
        if group.len() > 1 {
            out.push(violation(
                &group,
                format!("{} all believe they hold the RedLock on {parts:?}", names(&group)),
            ));
        }
    }
    out
}

/// Holds a settle may find although no guard claims them: those of guards that were lost
/// (the server may keep them until their lease ends; an owner's lost hold sends no release).
#[derive(Debug, Default)]
pub struct Exempt {
    /// `(server, key, owner)` until when; owner `None`: any owner (a lost MultiGuard's, whose
    /// owners the guard does not say).
    pub holds: Vec<(usize, String, Option<String>, Instant)>,
    pub ids: Vec<(Vec<u8>, Instant)>,
}

impl Exempt {
    fn field(&self, server: usize, key: &str, field: &str, now: Instant) -> bool {
        let owner = field.strip_suffix(":write").unwrap_or(field);
        self.holds.iter().any(|(s, k, o, until)| {
            *s == server && k == key && *until > now && o.as_deref().is_none_or(|o| o == owner)
        })
    }

    fn id(&self, id: &[u8], now: Instant) -> bool {
        self.ids.iter().any(|(i, until)| i == id && *until > now)
    }
}

/// What is held at the (read-write) lock `key` that no guard knows of, if anything.
#[must_use]
pub fn leftover_hash(
    con: &mut Connection,
    server: usize,
    key: &str,
    exempt: &Exempt,
) -> Option<String> {
    let state = view::hash(con, key);
    let now = Instant::now();
    let stray: Vec<(&String, &i64)> = state
        .fields
        .iter()
        .filter(|(f, _)| f.as_str() != "mode" && !exempt.field(server, key, f, now))
        .collect();
    (!stray.is_empty())
        .then(|| format!("{server}/{key} holds {stray:?} (lease {:?} ms)", state.lease_ms))
}

/// What is leased at the semaphore `key` that no guard knows of, or permits not conserved
/// (available + leased != `total`).
#[must_use]
pub fn leftover_permits(
    con: &mut Connection,
    server: usize,
    key: &str,
    total: i64,
    exempt: &Exempt,
) -> Option<String> {
    let state = view::permits(con, key);
    let now = Instant::now();
    let stray: Vec<String> = state
        .leases
        .iter()
        .filter(|(id, left)| **left > 0 && !exempt.id(id, now))
        .map(|(id, left)| format!("{} ({left} ms left)", hex(id)))
        .collect();
    let conserved = state.available + state.leased == total;
    (!stray.is_empty() || !conserved).then(|| {
        format!(
            "{server}/{key}: {} available + {} leased of {total}; leased by nobody: {stray:?}",
            state.available, state.leased
        )
    })
}
