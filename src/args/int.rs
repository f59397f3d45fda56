//! Integer arguments (`lease-ms`, `timeout-ms`, `permits`, `delta`), read as Redis reads an
//! integer and checked against the argument's range, each refusal telling apart what is wrong
//! (`error::IntArg`, `error::IntProblem`: the texts are in `error/int_arg.rs`).

use crate::error::{IntArg, IntProblem, LockError};

/// Reads `bytes` as the integer argument `arg`: Redis's form of an integer (digits, `-` first
/// for a negative one, no leading zero, no `+`, no spaces; `string2ll`'s), within `arg`'s range.
///
/// # Errors
/// [`LockError::BadInteger`] with [`IntProblem::NotInteger`] for another form,
/// [`IntProblem::TooSmall`] for an integer below the least value of an argument whose least
/// value is 0 or 1 (`-5` for `lease-ms`: "must be positive", however long), and
/// [`IntProblem::OutOfRange`] for any other integer outside the range.
pub fn integer(bytes: &[u8], arg: IntArg) -> Result<i64, LockError> {
    let bad = |problem| Err(LockError::BadInteger(arg, problem));
    let (negative, digits) = match bytes {
        [b'-', rest @ ..] => (true, rest),
        _ => (false, bytes),
    };
    // The common case, one pass: 1 to 18 digits without a leading zero (within the i64 range,
    // added up without overflow), read and checked at once.
    if let [first @ b'1'..=b'9', rest @ ..] = digits {
        if rest.len() < 18 {
            let mut magnitude = i64::from(first - b'0');
            for &d in rest {
                if !d.is_ascii_digit() {
                    return bad(IntProblem::NotInteger);
                }
                magnitude = magnitude * 10 + i64::from(d - b'0');
            }
            return in_range(if negative { -magnitude } else { magnitude }, arg);
        }
    }
    let canonical = match digits {
        [b'0'] => !negative,
        [b'1'..=b'9', rest @ ..] => rest.iter().all(u8::is_ascii_digit),
        _ => false,
    };
    if !canonical {
        return bad(IntProblem::NotInteger);
    }
    if digits.len() <= 18 {
        // "0" (the only short form the one pass above leaves).
        let magnitude = digits.iter().fold(0_i64, |n, &d| n * 10 + i64::from(d - b'0'));
        return in_range(if negative { -magnitude } else { magnitude }, arg);
    }
    let (least, greatest) = arg.range();
    // The magnitude, saturated past the i64 range (a longer number only needs to be known to
    // be beyond it; the form was checked above, so no digit is skipped unread).
    let mut magnitude: i128 = 0;
    for &d in digits {
        magnitude = magnitude * 10 + i128::from(d - b'0');
        if magnitude > i128::from(u64::MAX) {
            break;
        }
    }
    let value = if negative { -magnitude } else { magnitude };
    if value < i128::from(least) {
        return bad(if least >= 0 { IntProblem::TooSmall } else { IntProblem::OutOfRange });
    }
    if value > i128::from(greatest) {
        return bad(IntProblem::OutOfRange);
    }
    // In range: an i64.
    i64::try_from(value).or(bad(IntProblem::OutOfRange))
}

/// `value` if it lies within `arg`'s range, else the refusal [`integer`] names.
fn in_range(value: i64, arg: IntArg) -> Result<i64, LockError> {
    let (least, greatest) = arg.range();
    if value < least {
        let problem = if least >= 0 { IntProblem::TooSmall } else { IntProblem::OutOfRange };
        Err(LockError::BadInteger(arg, problem))
    } else if value > greatest {
        Err(LockError::BadInteger(arg, IntProblem::OutOfRange))
    } else {
        Ok(value)
    }
}

/// The refusal of an option word (`WAIT`, `LEASE`) that came last, without its value.
#[must_use]
pub const fn missing(arg: IntArg) -> LockError {
    LockError::BadInteger(arg, IntProblem::Missing)
}

/// [`integer`] for an argument whose least value is 0 or more, as a `u64`.
///
/// # Errors
/// As [`integer`].
pub fn unsigned(bytes: &[u8], arg: IntArg) -> Result<u64, LockError> {
    let value = integer(bytes, arg)?;
    u64::try_from(value).map_err(|_| LockError::BadInteger(arg, IntProblem::TooSmall))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problem(bytes: &str, arg: IntArg) -> Option<IntProblem> {
        match integer(bytes.as_bytes(), arg) {
            Ok(_) => None,
            Err(LockError::BadInteger(a, p)) if a == arg => Some(p),
            Err(e) => panic!("{bytes:?}: {e:?}"),
        }
    }

    #[test]
    fn each_problem_is_told_apart() {
        use IntProblem::{NotInteger, OutOfRange, TooSmall};
        let lease = IntArg::LeaseMs;
        assert_eq!(integer(b"1", lease), Ok(1));
        assert_eq!(integer(b"9223372036854775807", lease), Ok(i64::MAX));
        for (bytes, expected) in [
            ("0", TooSmall),
            ("-1", TooSmall),
            ("-99999999999999999999999", TooSmall),
            ("9223372036854775808", OutOfRange),
            ("99999999999999999999", OutOfRange),
            (&"9".repeat(10_000), OutOfRange),
            ("", NotInteger),
            ("-", NotInteger),
            ("-0", NotInteger),
            ("01", NotInteger),
            ("+1", NotInteger),
            (" 1", NotInteger),
            ("1 ", NotInteger),
            ("1.5", NotInteger),
            ("1e3", NotInteger),
            ("abc", NotInteger),
            ("\u{0}1", NotInteger),
            (&format!("{}x", "9".repeat(100)), NotInteger),
        ] {
            assert_eq!(problem(bytes, lease), Some(expected), "{bytes:?}");
        }
        assert_eq!(integer(b"0", IntArg::TimeoutMs), Ok(0));
        assert_eq!(problem("-1", IntArg::TimeoutMs), Some(TooSmall));
        assert_eq!(integer(b"-9223372036854775808", IntArg::Delta), Ok(i64::MIN));
        assert_eq!(problem("-9223372036854775809", IntArg::Delta), Some(OutOfRange));
        assert_eq!(problem("9223372036854775808", IntArg::Delta), Some(OutOfRange));
        assert_eq!(unsigned(b"0", IntArg::PermitsOrZero), Ok(0));
        assert_eq!(problem("-1", IntArg::PermitsOrZero), Some(TooSmall));
    }

    /// What Redis's `string2ll` form and the argument's range say of `bytes`, written plainly.
    fn reference(bytes: &[u8], arg: IntArg) -> Result<i64, IntProblem> {
        let text = std::str::from_utf8(bytes).map_err(|_| IntProblem::NotInteger)?;
        let digits = text.strip_prefix('-').unwrap_or(text);
        let canonical = (digits == "0" && !text.starts_with('-'))
            || (digits.starts_with(|c: char| ('1'..='9').contains(&c))
                && digits.chars().all(|c| c.is_ascii_digit()));
        if !canonical {
            return Err(IntProblem::NotInteger);
        }
        let (least, greatest) = arg.range();
        // Saturated far past the i64 range: only the side matters there.
        let magnitude: i128 = digits.get(..30).unwrap_or(digits).parse().unwrap_or(i128::MAX);
        let value = if text.starts_with('-') { -magnitude } else { magnitude };
        if value < i128::from(least) {
            Err(if least >= 0 { IntProblem::TooSmall } else { IntProblem::OutOfRange })
        } else if value > i128::from(greatest) {
            Err(IntProblem::OutOfRange)
        } else {
            Ok(i64::try_from(value).unwrap_or_default())
        }
    }

    #[test]
    fn random_spellings_read_as_redis_reads_an_integer() {
        let mut rng = rlock_tests_integration::Rng(0x9e37_79b9_7f4a_7c15);
        let alphabet = b"0123456789999-+ x.";
        let edges =
            [i64::MIN, i64::MAX, 0, 1, -1, 999_999_999_999_999_999, 100_000_000_000_000_000];
        let args = [
            IntArg::LeaseMs,
            IntArg::TimeoutMs,
            IntArg::Permits,
            IntArg::PermitsOrZero,
            IntArg::Delta,
        ];
        for round in 0..200_000 {
            let bytes: Vec<u8> = if round % 4 == 0 {
                // Near an edge of the i64 range or of the 18-digit path.
                let edge = edges[rng.below(edges.len())];
                let delta = rng.below(21) as i64 - 10;
                edge.saturating_add(delta).to_string().into_bytes()
            } else {
                let len = rng.below(24);
                (0..len).map(|_| alphabet[rng.below(alphabet.len())]).collect()
            };
            let arg = args[rng.below(args.len())];
            let got = match integer(&bytes, arg) {
                Ok(v) => Ok(v),
                Err(LockError::BadInteger(a, p)) if a == arg => Err(p),
                Err(e) => panic!("{e:?}"),
            };
            assert_eq!(
                got,
                reference(&bytes, arg),
                "{:?} as {arg:?}",
                String::from_utf8_lossy(&bytes)
            );
        }
    }

    #[test]
    fn every_text_names_its_argument_and_its_range() {
        for (arg, name, least) in [
            (IntArg::LeaseMs, "lease-ms", "1"),
            (IntArg::TimeoutMs, "timeout-ms", "0"),
            (IntArg::Permits, "permits", "1"),
            (IntArg::PermitsOrZero, "permits", "0"),
            (IntArg::Delta, "delta", &i64::MIN.to_string()),
        ] {
            let range = format!("({least} to {})", i64::MAX);
            assert_eq!(
                arg.message(IntProblem::OutOfRange),
                format!("ERR {name} is out of range {range}")
            );
            assert_eq!(
                arg.message(IntProblem::NotInteger),
                format!("ERR {name} is not an integer")
            );
            assert!(arg
                .message(IntProblem::Missing)
                .starts_with(&format!("ERR {name} is missing")));
            assert!(arg.message(IntProblem::TooSmall).starts_with(&format!("ERR {name} ")));
            assert_eq!(arg.range().0.to_string(), least);
            // No text names a command.
            for problem in [
                IntProblem::Missing,
                IntProblem::NotInteger,
                IntProblem::TooSmall,
                IntProblem::OutOfRange,
            ] {
                let text = arg.message(problem);
                assert!(!text.contains("RSEM") && !text.contains("LOCK."), "{text}");
            }
        }
    }
}
