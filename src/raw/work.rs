//! The module's work, counted where it is done: every key opened, every hash field scanned,
//! every command propagated and every blocked client unblocked adds to one meter, in units of
//! about one key read. Work done in one go from a timer (a tick of timeouts, the ends of a
//! closed connection's holds) is bounded by what this meter says it cost, not by how many items
//! it took: one item can be one key or a hundred thousand.

use std::cell::Cell;

/// What unblocking a client costs, in units (its reply is built and written in the server's
/// next loop: several key reads' worth).
pub const UNBLOCK: u64 = 8;

thread_local! {
    // Redis calls the module on its main thread only.
    static DONE: Cell<u64> = const { Cell::new(0) };
}

/// Adds `units` of work.
pub fn add(units: u64) {
    DONE.set(DONE.get().wrapping_add(units));
}

/// The work done so far (wrapping): the difference of two readings is what ran in between.
#[must_use]
pub fn done() -> u64 {
    DONE.get()
}
