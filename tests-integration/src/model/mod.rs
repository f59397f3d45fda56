//! An executable reference model of rlock's commands, in plain Rust (no server): what every
//! command should reply and leave in the keyspace, and what the events between commands do (a
//! connection closing, a lease or lock-delay ending, `SWAPDB`, `MOVE`, `RENAME`, `FLUSHDB`,
//! `DEBUG RELOAD`, `MODULE UNLOAD`/`LOAD`, a derived key evicted).
//!
//! It models the *intended* semantics: docs/commands.md and docs/sessions.md, with one
//! definition of "this grant is still in place" shared by every reader of it (a `REQUEST` replay,
//! a renew, a re-entry, a cancel): a hold whose end is decided (a closed session's end, a
//! lock-delay placeholder, an expired hold, released counted permits) is not in place, and a
//! closed connection's ends are applied before any later command reads the lock.
//!
//! Time is the caller's: every deadline is a window `[lo, hi]` (the command was sent at `lo -
//! lease`, answered at `hi - lease`); the driver never runs a command while a deadline's window
//! is open (see [`Model::unsettled_until`]), so every hold is either surely live or surely ended.
//!
//! [`Model::exec`] takes a command, the connection and time it ran on, and the server's reply:
//! it checks the reply against the model (exactly where the model knows it, by properties where
//! the server chooses: a busy lock's remaining lease, a new permit id, a token), applies the
//! command, and returns what differed. [`Model::snapshot`] is the keyspace the model expects, in
//! the abstract form the driver reads from the server.

mod state;

pub use state::*;

#[cfg(test)]
mod tests;
