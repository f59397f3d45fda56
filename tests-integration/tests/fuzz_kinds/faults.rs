//! The faults `fuzz_kinds.rs` injects (waiters killed or unblocked, foreign writes to the
//! layouts), resets, and the quiescence points where every waiter must be answered.

use std::time::{Duration, Instant};

use redis::Connection;
use rlock_tests_integration::{run, run_str, server_time_ms, Rng};

use crate::model::{lease_key, record, zset, Ask, Fuzz, SemModel, RW, SEM};

impl Fuzz {
    /// Kills or unblocks a waiter (if any).
    pub fn kill_or_unblock(&mut self, rng: &mut Rng, con: &mut Connection) {
        let Some(w) = self.waiters.get(rng.below(self.waiters.len().max(1))) else { return };
        let id = w.call.id.to_string();
        // Redis 7.0 itself answers a client that CLIENT PAUSE holds twice when CLIENT UNBLOCK
        // ERROR frees it (UNBLOCKED, then its command runs), and aborts on CLIENT UNBLOCK
        // TIMEOUT ("Unknown btype in replyToBlockedClientTimedOut"): such a client is killed.
        if rng.below(2) == 0 || Instant::now() < self.paused_until {
            self.killed.insert(w.call.id);
            let _ = run(con, &[b"CLIENT", b"KILL", b"ID", id.as_bytes()]);
        } else {
            let how: &[u8] = if rng.below(2) == 0 { b"TIMEOUT" } else { b"ERROR" };
            let _ = run(con, &[b"CLIENT", b"UNBLOCK", id.as_bytes(), how]);
        }
    }

    /// Deletes lock `k` (`RW` then `SEM`) and its derived keys; its model starts afresh.
    pub fn reset(&mut self, con: &mut Connection, k: usize) {
        if k < RW.len() {
            run_str(con, &["DEL", RW[k]]).expect("DEL");
            self.rw_tainted[k] = false;
        } else {
            let i = k - RW.len();
            // Its request records go too: a retry would replay a grant the model forgot.
            let mut del = vec!["DEL".to_owned(), SEM[i].to_owned(), zset(i)];
            let ids = self.sem[i].requests.keys().cloned().chain(self.pool_requests());
            del.extend(ids.map(|id| record(SEM[i], &id)));
            let del: Vec<&str> = del.iter().map(String::as_str).collect();
            run_str(con, &del).expect("DEL");
            let gen = self.sem[i].gen + 1;
            self.sem[i] = SemModel { gen, ..SemModel::default() };
        }
    }

    /// A write to the layouts as a buggy Redisson client (or an operator) would make it.
    pub fn foreign_write(&mut self, rng: &mut Rng, con: &mut Connection) {
        let (r, s) = (rng.below(RW.len()), rng.below(SEM.len()));
        let owner = ["A", "B", "C", "X"][rng.below(4)];
        let counts = ["1", "0", "-1", "2", "x", "05", "100", "9223372036854775807", "1000000000"];
        let count = counts[rng.below(counts.len())];
        let now = server_time_ms(con);
        let cmd: Vec<String> = match rng.below(12) {
            0 => vec![
                "HSET".into(),
                RW[r].into(),
                "mode".into(),
                ["write", "read", "x"][rng.below(3)].into(),
            ],
            1 => vec!["HSET".into(), RW[r].into(), owner.into(), count.into()],
            2 => vec!["HSET".into(), RW[r].into(), format!("{owner}:write"), count.into()],
            3 => vec![
                "SET".into(),
                lease_key(r, owner, 1 + rng.below(2)),
                "1".into(),
                "PX".into(),
                "300".into(),
            ],
            4 => vec!["DEL".into(), lease_key(r, owner, 1)],
            5 => {
                let v =
                    ["10", "0", "-5", "abc", "9223372036854775807", "1e3", " 7", "+3", "05", "-0"];
                vec!["SET".into(), SEM[s].into(), v[rng.below(v.len())].into()]
            }
            6 | 7 => {
                let mut c = vec!["ZADD".into(), zset(s)];
                let many = if rng.below(4) == 0 { 100 } else { 3 };
                for _ in 0..=rng.below(many) {
                    let scores = [
                        "0".to_owned(),
                        "922337203685477".into(),
                        (now + 200).to_string(),
                        "-inf".into(),
                        "+inf".into(),
                        "1e300".into(),
                        "-5".into(),
                        "9223372036854775807".into(),
                    ];
                    c.push(scores[rng.below(scores.len())].clone());
                    c.push(format!("{:016x}", rng.next_u64()));
                }
                c
            }
            8 => vec!["HSET".into(), SEM[s].into(), "mode".into(), "read".into()],
            9 => {
                let all: Vec<String> = RW
                    .iter()
                    .map(|s| (*s).to_owned())
                    .chain(SEM.iter().map(|s| (*s).to_owned()))
                    .chain((0..SEM.len()).map(zset))
                    .collect();
                vec![
                    "RENAME".into(),
                    all[rng.below(all.len())].clone(),
                    all[rng.below(all.len())].clone(),
                ]
            }
            10 => vec![
                "PEXPIRE".into(),
                [RW[r], SEM[s]][rng.below(2)].into(),
                ["1", "50", "2000"][rng.below(3)].into(),
            ],
            _ => vec![
                "DEL".into(),
                [RW[r].to_owned(), SEM[s].to_owned(), zset(s)][rng.below(3)].clone(),
            ],
        };
        let args: Vec<&str> = cmd.iter().map(String::as_str).collect();
        let _ = run_str(con, &args);
        // Whatever it touched (the target of a RENAME included) is no longer checked.
        for a in &cmd[1..] {
            for (i, name) in RW.iter().enumerate() {
                self.rw_tainted[i] |= a == name;
            }
            for (i, name) in SEM.iter().enumerate() {
                self.sem[i].tainted |= a == name || *a == zset(i);
            }
        }
    }

    /// Frees every lock that has waiters until every waiter is answered: each round must answer
    /// one, and a waiter with a long timeout must be granted, not left blocked on a free lock.
    pub fn quiesce(&mut self, con: &mut Connection) {
        run_str(con, &["CONFIG", "SET", "rlock.min-replicas", "0"]).expect("CONFIG SET");
        let until = Instant::now() + Duration::from_secs(60);
        loop {
            self.reap(false);
            if self.waiters.is_empty() {
                return;
            }
            assert!(Instant::now() < until, "{}: the waiters never drained", self.at());
            let before = self.waiters.len();
            let mut need = [0_i128; 3];
            let mut rw = [false; 3];
            for w in &self.waiters {
                match w.ask {
                    Ask::Rw { name, .. } => rw[name] = true,
                    Ask::Sem { name, permits, .. } => need[name] += permits,
                }
            }
            for (i, _) in rw.iter().enumerate().filter(|(_, w)| **w) {
                self.reset(con, i);
            }
            for (i, need) in need.into_iter().enumerate() {
                if need > 0 {
                    self.reset(con, RW.len() + i);
                    let n = need.min(i128::from(i64::MAX)) as i64;
                    run_str(con, &["RSEM.SETPERMITS", SEM[i], &n.to_string()]).expect("SET");
                    self.sem[i].total = i128::from(n);
                }
            }
            let bound = Instant::now() + Duration::from_secs(2);
            while Instant::now() < bound && self.waiters.iter().all(|w| !w.call.finished()) {
                std::thread::sleep(Duration::from_millis(2));
            }
            self.reap(false);
            if self.waiters.len() == before {
                let stuck: Vec<&Vec<String>> =
                    self.waiters.iter().filter(|w| w.patient).map(|w| &w.call.args).collect();
                assert!(stuck.is_empty(), "{}: blocked on free locks: {stuck:?}", self.at());
            }
        }
    }
}
