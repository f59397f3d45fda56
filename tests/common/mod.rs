//! The lock as the module's key layer stores it, for server-free tests: a hash owner -> count
//! with an absolute deadline (lazy expiry), to which the rules' plans are applied.

#![allow(dead_code)] // each test file uses part of it

use std::collections::BTreeMap;

use rlock::args::Lease;
use rlock::rules::{self, Deadline, Extend, Plan, Reply, View, Write};

pub fn lease(ms: u64) -> Lease {
    Lease::from_millis(ms).expect("positive")
}

pub fn at(now: i64, ms: u64) -> Deadline {
    Deadline::after(now, lease(ms)).expect("fits")
}

/// One lock key as Redis would hold it, with lazy expiry.
#[derive(Default)]
pub struct Model {
    pub owners: BTreeMap<String, u64>,
    pub deadline: Option<i64>,
    pub published: usize,
}

impl Model {
    pub fn view(&mut self, owner: Option<&str>, now: i64) -> View {
        if self.deadline.is_some_and(|d| d <= now) {
            self.owners.clear();
            self.deadline = None;
        }
        if self.owners.is_empty() {
            return View::Free;
        }
        View::Held {
            mine: owner.and_then(|o| self.owners.get(o).copied()),
            pttl: self.deadline.map_or(-1, |d| d - now),
        }
    }

    pub fn apply(&mut self, owner: Option<&str>, plan: Plan) -> Reply {
        match plan.write {
            Write::Keep => {}
            Write::SetCount(n) => {
                self.owners.insert(owner.expect("owner").to_owned(), n);
            }
            Write::Delete => {
                self.owners.clear();
                self.deadline = None;
            }
        }
        if let Some(d) = plan.expire_at {
            self.deadline = Some(d.unix_ms());
        }
        self.published += usize::from(plan.publish);
        plan.reply
    }

    pub fn acquire(&mut self, owner: &str, now: i64, ms: u64) -> Reply {
        let view = self.view(Some(owner), now);
        let plan = rules::acquire(view, at(now, ms), Extend::Set).expect("no overflow");
        self.apply(Some(owner), plan)
    }

    pub fn release(&mut self, owner: &str, now: i64) -> Reply {
        let view = self.view(Some(owner), now);
        self.apply(Some(owner), rules::release(view, None))
    }
}
