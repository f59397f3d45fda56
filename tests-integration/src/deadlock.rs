//! Deadlock refusals (a wait that would close a cycle of owners): reading a `DEADLOCK` reply
//! (`DEADLOCK this wait would close a cycle: ` and its links `X waits for K held by Y`,
//! separated by `; `, the new wait's link first), and what a refused wait must leave as it was.

use redis::{Connection, Value};

use crate::{blocked_clients, digest, run};

/// What every `DEADLOCK` reply starts with, before its links.
pub const DEADLOCK_PREFIX: &str = "DEADLOCK this wait would close a cycle: ";

/// One link of a `DEADLOCK` reply: `waiter` waits for `key`, held by `holder`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Link<'a> {
    /// The owner that waits.
    pub waiter: &'a str,
    /// The lock it waits for.
    pub key: &'a str,
    /// The owner that holds that lock.
    pub holder: &'a str,
}

/// The links of a `DEADLOCK` reply in reply order; `None` when `reply` is no `DEADLOCK` reply
/// or a link is not of the form `X waits for K held by Y`.
#[must_use]
pub fn deadlock_links(reply: &str) -> Option<Vec<Link<'_>>> {
    reply
        .strip_prefix(DEADLOCK_PREFIX)?
        .split("; ")
        .map(|l| {
            let (waiter, rest) = l.split_once(" waits for ")?;
            let (key, holder) = rest.split_once(" held by ")?;
            Some(Link { waiter, key, holder })
        })
        .collect()
}

/// Whether a `DEADLOCK` reply's links close a cycle (each link's holder is the next link's
/// waiter, the last's the first's) of the run's `owners` and `locks`: every waiter and holder
/// one of `owners`, every key one of `locks`.
#[must_use]
pub fn closes_a_cycle(reply: &str, owners: &[&str], locks: &[&str]) -> bool {
    let Some(links) = deadlock_links(reply) else {
        return false;
    };
    links.iter().enumerate().all(|(i, link)| {
        let next = links[(i + 1) % links.len()].waiter;
        owners.contains(&link.waiter)
            && locks.contains(&link.key)
            && owners.contains(&link.holder)
            && link.holder == next
    })
}

/// Everything a refused wait must leave as it was: the data (`DEBUG DIGEST`), the module's
/// wait counters (`INFO rlock_waits` but the armed timers), the blocked clients and the queues
/// of `keys` (`(command, key)`: `RLOCK.WAITERS k`, ...), each waiter's fields but the `moving`
/// ones (`waited_ms`, and `left_ms` where a wait has a timeout: time passes).
///
/// # Panics
/// When a `*.WAITERS` command replies anything but an array of waiters.
#[must_use]
pub fn wait_state<K: AsRef<[u8]>>(
    con: &mut Connection,
    keys: &[(&str, K)],
    moving: &[&str],
) -> Vec<String> {
    let mut state = vec![digest(con)];
    let info: String = redis::cmd("INFO").arg("rlock_waits").query(con).expect("INFO");
    // The timers' own figures move with every tick, whatever a refused command did.
    let timers = ["rlock_timers_armed", "rlock_timer_work", "rlock_timer_ticks_split"];
    state.extend(
        info.lines().filter(|l| !timers.iter().any(|t| l.starts_with(t))).map(str::to_owned),
    );
    state.push(blocked_clients(con).to_string());
    for (command, key) in keys {
        let Ok(Value::Array(rows)) = run(con, &[command.as_bytes(), key.as_ref()]) else {
            panic!("{command} {:?}", String::from_utf8_lossy(key.as_ref()))
        };
        for row in rows {
            let Value::Array(fields) = row else { panic!("{row:?}") };
            let moves = |name: &Value| {
                moving.iter().any(|m| *name == Value::BulkString(m.as_bytes().to_vec()))
            };
            let kept = fields.chunks(2).filter(|p| !moves(&p[0]));
            state.push(format!("{:?}", kept.collect::<Vec<_>>()));
        }
    }
    state
}

#[cfg(test)]
mod tests {
    use super::*;

    const OWNERS: [&str; 2] = ["A", "B"];
    const LOCKS: [&str; 2] = ["k1", "k2"];

    #[test]
    fn links_are_read_in_reply_order() {
        let reply = "DEADLOCK this wait would close a cycle: B waits for k1 held by A; \
                     A waits for k2 held by B";
        let links = deadlock_links(reply).expect("links");
        assert_eq!(links[0], Link { waiter: "B", key: "k1", holder: "A" });
        assert_eq!(links[1], Link { waiter: "A", key: "k2", holder: "B" });
        assert!(closes_a_cycle(reply, &OWNERS, &LOCKS));
    }

    #[test]
    fn a_chain_a_stranger_or_a_malformed_link_is_no_cycle() {
        let p = DEADLOCK_PREFIX;
        for reply in [
            format!("{p}B waits for k1 held by A; A waits for k2 held by A"),
            format!("{p}B waits for k1 held by A; A waits for k2 held by C"),
            format!("{p}B waits for k3 held by A; A waits for k2 held by B"),
            format!("{p}B waits for k1 held by A; A wants k2 held by B"),
            p.to_owned(),
            "ERR B waits for k1 held by B".to_owned(),
        ] {
            assert!(!closes_a_cycle(&reply, &OWNERS, &LOCKS), "{reply}");
        }
        assert_eq!(deadlock_links("ERR no"), None);
    }
}
