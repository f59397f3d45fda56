//! The integer arguments of the commands as their errors name them: each one's range and its
//! four replies (missing, not an integer, too small, out of range), every text in one place.

/// An integer argument, as its errors name it, with its range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IntArg {
    /// `lease-ms` (also after `LEASE`): 1 to `i64::MAX`.
    LeaseMs,
    /// `timeout-ms` after `WAIT`: 0 (no limit) to `i64::MAX`.
    TimeoutMs,
    /// `permits` of an acquire or a release: 1 to `i64::MAX`.
    Permits,
    /// `permits` of `RSEM.SETPERMITS`: 0 to `i64::MAX`.
    PermitsOrZero,
    /// `delta` of `RSEM.ADDPERMITS`: any `i64`.
    Delta,
    /// `count` of `RLATCH.SETCOUNT`: 1 to `i64::MAX`.
    LatchCount,
    /// `amount` of `RLATCH.COUNTDOWN`: 1 to `i64::MAX`.
    Amount,
}

/// What is wrong with an integer argument.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IntProblem {
    /// Its option word (`WAIT`, `LEASE`) came last, without it.
    Missing,
    /// Not an integer as Redis writes one (digits, `-` first for a negative one, no leading
    /// zero, no `+`, no spaces).
    NotInteger,
    /// An integer below the argument's least value (0 or 1).
    TooSmall,
    /// An integer outside the argument's range otherwise (beyond the `i64` range).
    OutOfRange,
}

/// The four replies of one integer argument: missing, not an integer, too small, out of range.
macro_rules! int_messages {
    ($name:literal, $missing:literal, $too_small:literal, $range:literal) => {
        [
            concat!("ERR ", $name, " is missing", $missing),
            concat!("ERR ", $name, " is not an integer"),
            concat!("ERR ", $name, " ", $too_small),
            concat!("ERR ", $name, " is out of range (", $range, ")"),
        ]
    };
}

impl IntArg {
    /// The least and the greatest value the argument takes.
    #[must_use]
    pub const fn range(self) -> (i64, i64) {
        match self {
            Self::LeaseMs | Self::Permits | Self::LatchCount | Self::Amount => (1, i64::MAX),
            Self::TimeoutMs | Self::PermitsOrZero => (0, i64::MAX),
            Self::Delta => (i64::MIN, i64::MAX),
        }
    }

    /// The reply naming this argument and `problem` (every text is in this one place).
    #[must_use]
    pub const fn message(self, problem: IntProblem) -> &'static str {
        const LEASE: [&str; 4] = int_messages!(
            "lease-ms",
            " after LEASE",
            "must be positive",
            "1 to 9223372036854775807"
        );
        const TIMEOUT: [&str; 4] = int_messages!(
            "timeout-ms",
            " after WAIT",
            "must not be negative",
            "0 to 9223372036854775807"
        );
        const PERMITS: [&str; 4] =
            int_messages!("permits", "", "must be positive", "1 to 9223372036854775807");
        const PERMITS_OR_ZERO: [&str; 4] =
            int_messages!("permits", "", "must not be negative", "0 to 9223372036854775807");
        const DELTA: [&str; 4] = int_messages!(
            "delta",
            "",
            "is out of range (-9223372036854775808 to 9223372036854775807)",
            "-9223372036854775808 to 9223372036854775807"
        );
        const COUNT: [&str; 4] =
            int_messages!("count", "", "must be positive", "1 to 9223372036854775807");
        const AMOUNT: [&str; 4] =
            int_messages!("amount", "", "must be positive", "1 to 9223372036854775807");
        let texts = match self {
            Self::LatchCount => &COUNT,
            Self::Amount => &AMOUNT,
            Self::LeaseMs => &LEASE,
            Self::TimeoutMs => &TIMEOUT,
            Self::Permits => &PERMITS,
            Self::PermitsOrZero => &PERMITS_OR_ZERO,
            Self::Delta => &DELTA,
        };
        texts[problem as usize]
    }
}
