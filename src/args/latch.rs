//! The `RLATCH.*` argument structs.

use super::{int, Arg, WaitFor};
use crate::error::{IntArg, LockError};

/// `RLATCH.SETCOUNT key count` (a positive count).
#[derive(Debug)]
pub struct LatchSet<'a, A> {
    pub key: &'a A,
    pub count: u64,
}

impl<'a, A: Arg> LatchSet<'a, A> {
    /// # Errors
    /// Wrong arity, or a count that is not a positive integer.
    pub fn parse(args: &'a [A]) -> Result<Self, LockError> {
        let [_, key, count] = args else { return Err(LockError::WrongArity) };
        Ok(Self { key, count: int::unsigned(count.bytes(), IntArg::LatchCount)? })
    }
}

/// `RLATCH.COUNTDOWN key [amount]` (1 when not given).
#[derive(Debug)]
pub struct LatchCountDown<'a, A> {
    pub key: &'a A,
    pub amount: u64,
}

impl<'a, A: Arg> LatchCountDown<'a, A> {
    /// # Errors
    /// Wrong arity, or an amount that is not a positive integer.
    pub fn parse(args: &'a [A]) -> Result<Self, LockError> {
        match args {
            [_, key] => Ok(Self { key, amount: 1 }),
            [_, key, amount] => {
                Ok(Self { key, amount: int::unsigned(amount.bytes(), IntArg::Amount)? })
            }
            _ => Err(LockError::WrongArity),
        }
    }
}

/// `RLATCH.AWAIT key timeout-ms` (0: without limit).
#[derive(Debug)]
pub struct LatchAwait<'a, A> {
    pub key: &'a A,
    pub wait: WaitFor,
}

impl<'a, A: Arg> LatchAwait<'a, A> {
    /// # Errors
    /// Wrong arity, or a timeout that is not a non-negative integer.
    pub fn parse(args: &'a [A]) -> Result<Self, LockError> {
        let [_, key, timeout] = args else { return Err(LockError::WrongArity) };
        Ok(Self { key, wait: WaitFor::parse(timeout.bytes())? })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(words: &[&str]) -> Vec<Vec<u8>> {
        words.iter().map(|w| w.as_bytes().to_vec()).collect()
    }

    #[test]
    fn each_command_takes_its_arguments_and_names_a_bad_one() {
        let set = args(&["RLATCH.SETCOUNT", "l", "3"]);
        assert_eq!(LatchSet::parse(&set).map(|c| c.count), Ok(3));
        for (bad, text) in
            [("0", "ERR count must be positive"), ("x", "ERR count is not an integer")]
        {
            let set = args(&["RLATCH.SETCOUNT", "l", bad]);
            assert_eq!(
                LatchSet::parse(&set).map(|c| c.count).map_err(LockError::message),
                Err(text)
            );
        }
        let down = args(&["RLATCH.COUNTDOWN", "l"]);
        assert_eq!(LatchCountDown::parse(&down).map(|c| c.amount), Ok(1));
        let down = args(&["RLATCH.COUNTDOWN", "l", "5"]);
        assert_eq!(LatchCountDown::parse(&down).map(|c| c.amount), Ok(5));
        let down = args(&["RLATCH.COUNTDOWN", "l", "-1"]);
        assert_eq!(
            LatchCountDown::parse(&down).map(|c| c.amount).map_err(LockError::message),
            Err("ERR amount must be positive")
        );
        let extra = args(&["RLATCH.COUNTDOWN", "l", "1", "2"]);
        assert_eq!(LatchCountDown::parse(&extra).map(|c| c.amount), Err(LockError::WrongArity));
        let wait = args(&["RLATCH.AWAIT", "l", "0"]);
        assert_eq!(LatchAwait::parse(&wait).map(|c| c.wait), Ok(WaitFor::Ever));
        let wait = args(&["RLATCH.AWAIT", "l", "250"]);
        assert_eq!(LatchAwait::parse(&wait).map(|c| c.wait), Ok(WaitFor::Millis(250)));
    }
}
