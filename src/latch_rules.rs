//! The count-down latch rules, as plain Rust, on Redisson's `RCountDownLatch` layout: the key is
//! a string holding the remaining count, and a missing key means open (count 0). Opening
//! publishes `0` on `redisson_countdownlatch__channel__{name}`, a new count (and a delete)
//! publishes `1` (Redisson's awaiters re-close on it). Each operation returns a [`LatchPlan`];
//! only the `store` touches Redis.
//!
//! Awaiters (`RLATCH.AWAIT`) are answered by [`is_open`]: all of them at once when the latch
//! opens, however it opens (a count-down to zero, a delete, a Redisson client's script).

use crate::rules::Reply;

/// What an operation writes to the key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LatchWrite {
    /// Nothing.
    Keep,
    /// `SET key <count>` (Redisson's `trySetCount`).
    Set(i64),
    /// `DECRBY key <amount>` (keeps a TTL), the count staying above zero.
    Decrement(i64),
    /// `DEL key`: the latch opened (or was deleted).
    Delete,
}

/// The message an operation publishes on the latch's channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LatchMessage {
    /// `0`: the latch opened.
    Opened,
    /// `1`: a new count was set, or the latch was deleted (Redisson's `delete()`).
    Closed,
}

/// What an operation does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LatchPlan {
    pub write: LatchWrite,
    pub publish: Option<LatchMessage>,
    /// Its awaiters are answered now (the latch opened or is gone).
    pub opens: bool,
    pub reply: Reply,
}

impl LatchPlan {
    const fn reply(reply: Reply) -> Self {
        Self { write: LatchWrite::Keep, publish: None, opens: false, reply }
    }
}

/// Whether a latch whose key holds `count` (`None`: missing) is open: missing, or at zero or
/// below (a count a foreign writer left there; Redisson's `getCount` reads it, its `await`
/// returns once it is not above zero).
#[must_use]
pub fn is_open(count: Option<i64>) -> bool {
    count.is_none_or(|c| c <= 0)
}

/// `SETCOUNT`: set `count` (positive, checked by the parser) when the key is missing (reply 1,
/// publish `1`), else reply 0 and change nothing, as Redisson's `trySetCount`.
#[must_use]
pub const fn set_count(current: Option<i64>, count: u64) -> LatchPlan {
    match current {
        Some(_) => LatchPlan::reply(Reply::Int(0)),
        None => LatchPlan {
            write: LatchWrite::Set(count as i64),
            publish: Some(LatchMessage::Closed),
            opens: false,
            reply: Reply::Int(1),
        },
    }
}

/// `COUNTDOWN`: the count less `amount`, never below zero; reply the count left. At zero the
/// key is deleted, `0` published and every awaiter answered. A missing latch stays missing
/// (reply 0, nothing published, as Redisson's `countDown` on a missing key); a stored count at
/// or below zero (a foreign writer's) is deleted, as Redisson's script does, without a publish.
#[must_use]
pub const fn count_down(current: Option<i64>, amount: u64) -> LatchPlan {
    let Some(count) = current else { return LatchPlan::reply(Reply::Int(0)) };
    if count <= 0 {
        return LatchPlan {
            write: LatchWrite::Delete,
            publish: None,
            opens: true,
            reply: Reply::Int(0),
        };
    }
    // `amount` is at most `i64::MAX` (the parser's bound), so this cannot overflow.
    let amount = amount as i64;
    if amount < count {
        return LatchPlan {
            write: LatchWrite::Decrement(amount),
            publish: None,
            opens: false,
            reply: Reply::Int(count - amount),
        };
    }
    LatchPlan {
        write: LatchWrite::Delete,
        publish: Some(LatchMessage::Opened),
        opens: true,
        reply: Reply::Int(0),
    }
}

/// `DELETE`: delete a latch that exists (reply 1, publish `1` as Redisson's `delete()`; its
/// awaiters are answered: a missing latch is open), else reply 0.
#[must_use]
pub const fn delete(current: Option<i64>) -> LatchPlan {
    match current {
        None => LatchPlan::reply(Reply::Int(0)),
        Some(_) => LatchPlan {
            write: LatchWrite::Delete,
            publish: Some(LatchMessage::Closed),
            opens: true,
            reply: Reply::Int(1),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_latch_is_open_when_missing_or_not_above_zero() {
        assert!(is_open(None));
        assert!(is_open(Some(0)));
        assert!(is_open(Some(-3)));
        assert!(!is_open(Some(1)));
    }

    #[test]
    fn set_count_only_sets_a_missing_latch() {
        let set = set_count(None, 3);
        assert_eq!(set.write, LatchWrite::Set(3));
        assert_eq!(set.publish, Some(LatchMessage::Closed));
        assert_eq!(set.reply, Reply::Int(1));
        assert_eq!(set_count(Some(2), 3), LatchPlan::reply(Reply::Int(0)));
        assert_eq!(set_count(Some(0), 3), LatchPlan::reply(Reply::Int(0)));
    }

    #[test]
    fn counting_down_stops_at_zero_and_opens_once() {
        let step = count_down(Some(3), 1);
        assert_eq!((step.write, step.publish, step.opens), (LatchWrite::Decrement(1), None, false));
        assert_eq!(step.reply, Reply::Int(2));
        for (count, amount) in [(1, 1), (2, 5), (5, u64::MAX >> 1)] {
            let open = count_down(Some(count), amount);
            assert_eq!(open.write, LatchWrite::Delete);
            assert_eq!(open.publish, Some(LatchMessage::Opened));
            assert!(open.opens);
            assert_eq!(open.reply, Reply::Int(0));
        }
        assert_eq!(count_down(None, 1), LatchPlan::reply(Reply::Int(0)));
        let stale = count_down(Some(-1), 1);
        assert_eq!(
            (stale.write, stale.publish, stale.reply),
            (LatchWrite::Delete, None, Reply::Int(0))
        );
    }

    #[test]
    fn delete_publishes_a_close_and_answers_awaiters() {
        let gone = delete(Some(4));
        assert_eq!(
            (gone.write, gone.publish, gone.opens),
            (LatchWrite::Delete, Some(LatchMessage::Closed), true)
        );
        assert_eq!(gone.reply, Reply::Int(1));
        assert_eq!(delete(None), LatchPlan::reply(Reply::Int(0)));
    }
}
