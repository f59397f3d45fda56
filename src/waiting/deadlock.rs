//! Deadlock detection on Redis: the search of `deadlock_rules` (sans I/O) answered from the
//! queues (who waits where) and the lock keys (who holds what) of the caller's database, just before a
//! reentrant or read-write lock waiter is queued. A wait that would close a cycle is refused
//! with `DEADLOCK ...` and nothing is queued.
//!
//! Only keys the caller may read are looked at (a lock it may not read adds no edge, so a
//! refusal never names a key or an owner the caller could not read itself); nothing is written
//! (a key whose lease ended reads as missing, as for any read).

use redis_module::{Context, RedisString};

use super::state::{anyone_waits, QUEUES};
use crate::deadlock_rules::{self, Found, Graph, Holders, Wants};
use crate::error::Refusal;
use crate::names;
use crate::raw::{self, Key, KeyKind, KeyRef, KeyUse};
use crate::rules::{Kind, Request};
use crate::rw_rules::{Mode, RwState};
use crate::store::access::KeyChecker;

/// What a queued request asks, for the graph (`None`: a semaphore's, not in it).
const fn wants(request: &Request) -> Option<Wants> {
    match request.kind {
        Kind::Reentrant => Some(Wants::Lock),
        Kind::Rw(Mode::Read) => Some(Wants::Read),
        Kind::Rw(Mode::Write) => Some(Wants::Write),
        Kind::Permits(_) | Kind::Leased(_) | Kind::Latch => None,
    }
}

/// The graph as the caller sees it: its database, its ACL user.
struct Live<'a> {
    ctx: &'a Context,
    db: i32,
    /// The command's key: Redis checked the caller's read access to it (the acquire commands'
    /// key specs declare it accessed), so it is read as it is, without another check.
    start: &'a RedisString,
    /// The command's key, open (by the command, or once for the search).
    start_key: &'a Key,
    /// The caller's ACL user name, as the command looked it up.
    user: Option<&'a [u8]>,
    /// The caller's ACL user, looked up at the first other key (most searches read none).
    checker: Option<KeyChecker>,
    /// The bytes of fields and values the search may still copy out of lock hashes.
    bytes: usize,
}

impl Live<'_> {
    /// The key `name`, if the caller may read it.
    fn readable(&mut self, name: &[u8]) -> Option<RedisString> {
        let key = RedisString::create_from_slice(self.ctx.get_raw(), name);
        let (ctx, user) = (self.ctx, self.user);
        let checker = self.checker.get_or_insert_with(|| KeyChecker::for_caller_named(ctx, user));
        checker.may(&key, KeyUse::Read).then_some(key)
    }
}

/// The answers to the search's questions.
impl Graph for Live<'_> {
    fn waits(&mut self, owner: &[u8]) -> bool {
        QUEUES.with(|q| q.try_borrow().is_ok_and(|q| q.owner_waits(self.db, owner)))
    }

    fn waits_of(&mut self, owner: &[u8]) -> Vec<(Vec<u8>, Wants)> {
        QUEUES.with(|q| {
            q.try_borrow().map_or_else(
                |_| Vec::new(),
                |q| {
                    q.waits_of(self.db, owner)
                        .filter_map(|w| Some((w.lock.key.clone(), wants(&w.request)?)))
                        .collect()
                },
            )
        })
    }

    fn holders(&mut self, name: &[u8], steps: &mut usize) -> Holders {
        let key = if name == self.start.as_slice() {
            KeyRef::Lent(self.start_key)
        } else {
            let Some(name) = self.readable(name) else { return Holders::Nobody };
            KeyRef::Opened(Key::open(self.ctx, &name, false))
        };
        if key.kind() != KeyKind::Hash {
            return Holders::Nobody;
        }
        let fields = key.field_count();
        if fields >= *steps {
            *steps = 0;
            return Holders::Nobody;
        }
        *steps -= fields + 1;
        let Some(fields) = key.hash_fields_within(&mut self.bytes) else {
            // Past the byte budget: no claim either way (the search ends).
            *steps = 0;
            return Holders::Nobody;
        };
        if !fields.iter().any(|(f, _)| f == names::MODE_FIELD) {
            return Holders::Lock(fields.into_iter().map(|(owner, _)| owner).collect());
        }
        match RwState::from_fields(fields, key.pttl()) {
            Ok(state) => Holders::Rw {
                write: state.mode == Some(Mode::Write),
                writer: state.writer.map(|(owner, _)| owner),
                readers: state.readers.into_iter().collect(),
            },
            // A corrupt hash grants nobody: no edge through it.
            Err(_) => Holders::Nobody,
        }
    }

    fn reader_live(&mut self, name: &[u8], owner: &[u8], reads: u64, steps: &mut usize) -> bool {
        // The latest hold first: it is the one most likely to be live.
        for index in (1..=reads).rev() {
            if *steps == 0 {
                return false;
            }
            *steps -= 1;
            let Some(hold) = self.readable(&names::read_hold(name, owner, index)) else {
                return false;
            };
            if Key::open(self.ctx, &hold, false).kind() != KeyKind::Empty {
                return true;
            }
        }
        false
    }
}

/// Refuses (`DEADLOCK ...`) the wait of `request` for the lock `name` (the context's database)
/// when it would close a cycle of owners waiting for each other. Nothing is read when nobody
/// with an owner waits, and only the lock `name` (one scan, nothing copied) when none of its
/// holders waits anywhere (no cycle can close then): the full search runs only when one does.
///
/// `open`: the lock's key, when the command has it open still (it is read through it, not
/// opened again); `user`: the caller's ACL user name, as the command looked it up
/// ([`raw::User::current_name`]), for the keys beyond the command's.
///
/// # Errors
/// [`Refusal::Deadlock`], naming the cycle.
pub fn refuse_cycle(
    ctx: &Context,
    name: &RedisString,
    request: &Request,
    open: Option<&Key>,
    user: Option<&[u8]>,
) -> Result<(), Refusal> {
    let Some(wants) = wants(request) else { return Ok(()) };
    let owners_wait =
        anyone_waits() && QUEUES.with(|q| q.try_borrow().is_ok_and(|q| q.any_owner_waits()));
    if !owners_wait {
        return Ok(());
    }
    let db = raw::selected_db(ctx);
    let start_key = KeyRef::lent_or_open(open, ctx, name, false);
    if !holder_waits(db, &start_key, &request.owner) {
        return Ok(());
    }
    let bytes = deadlock_rules::MAX_BYTES;
    let mut graph =
        Live { ctx, db, start: name, start_key: &start_key, user, checker: None, bytes };
    // The search decides (sans I/O); the queues and the keys answer its questions.
    match deadlock_rules::find_cycle(&mut graph, &request.owner, name.as_slice(), wants) {
        Found::Cycle(cycle) => Err(Refusal::Deadlock(deadlock_rules::describe(&cycle))),
        Found::NoCycle | Found::OverBudget => Ok(()),
    }
}

/// Whether a field of the lock `key` names an owner other than `waiter` who waits in a queue
/// of database `db` ([`deadlock_rules::field_owners`]: every holder that could lead the search
/// on is among them). The caller may read `key` (its command's key). A hash the search would
/// not read (as many fields as its budget, or more) leads nowhere.
fn holder_waits(db: i32, key: &Key, waiter: &[u8]) -> bool {
    if key.kind() != KeyKind::Hash || key.field_count() >= deadlock_rules::MAX_STEPS {
        return false;
    }
    QUEUES.with(|q| {
        let Ok(q) = q.try_borrow() else { return false };
        let mut found = false;
        key.for_each_field(&mut |field, _| {
            found = found
                || deadlock_rules::field_owners(field).any(|o| o != waiter && q.owner_waits(db, o));
        });
        found
    })
}
