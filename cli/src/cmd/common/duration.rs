//! Duration flags in Go's grammar: `time.ParseDuration`, so `--resync 1m30s` reads as it does
//! for the Go controllers (`300ms`, `1.5h`, `2h45m`, `10us` / `10µs`, `5ns`, `0`).
//!
//! Counterpart: Go's `time.ParseDuration` (src/time/format.go), ported step by step with its
//! overflow checks, so a text Go accepts parses to the same number of nanoseconds here and a
//! text Go refuses is refused. What differs on purpose: Go returns a signed `time.Duration`;
//! [`parse_go_duration`] does too (`i64` nanoseconds), and the flag parsers on top refuse
//! negative values ([`non_negative`]) or also zero ([`positive`]), since no flag of ours means
//! anything by a negative duration.

use std::time::Duration;

/// A duration text Go's `time.ParseDuration` would refuse, or one a flag does not take.
/// The messages quote the text as Go's do; clap adds the flag's name in front.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    #[error(
        "invalid duration {0:?} (want e.g. 30s, 1m30s, 300ms, 1.5h; units ns, us, µs, ms, s, m, h)"
    )]
    Invalid(String),
    #[error("missing unit in duration {0:?} (units ns, us, µs, ms, s, m, h)")]
    MissingUnit(String),
    #[error("unknown unit {unit:?} in duration {text:?} (units ns, us, µs, ms, s, m, h)")]
    UnknownUnit { unit: String, text: String },
    #[error("duration {0:?} must not be negative")]
    Negative(String),
    #[error("duration {0:?} must be greater than zero")]
    NotPositive(String),
}

const NANOSECOND: u64 = 1;
const MICROSECOND: u64 = 1_000 * NANOSECOND;
const MILLISECOND: u64 = 1_000 * MICROSECOND;
const SECOND: u64 = 1_000 * MILLISECOND;
const MINUTE: u64 = 60 * SECOND;
const HOUR: u64 = 60 * MINUTE;

/// 1<<63, the magnitude of Go's most negative Duration; every overflow check compares with it.
const LIMIT: u64 = 1 << 63;

/// Go's `time.ParseDuration`: a possibly signed sequence of decimal numbers, each with an
/// optional fraction and a unit suffix. Returns nanoseconds, as Go's `Duration` holds them.
pub fn parse_go_duration(text: &str) -> Result<i64, DurationError> {
    let invalid = || DurationError::Invalid(text.to_string());
    let mut s = text;
    let mut negative = false;
    if let Some(rest) = s.strip_prefix('-') {
        negative = true;
        s = rest;
    } else if let Some(rest) = s.strip_prefix('+') {
        s = rest;
    }
    // A bare zero needs no unit; any other number does.
    if s == "0" {
        return Ok(0);
    }
    if s.is_empty() {
        return Err(invalid());
    }
    let mut total: u64 = 0;
    while !s.is_empty() {
        if !(s.starts_with('.') || s.starts_with(|c: char| c.is_ascii_digit())) {
            return Err(invalid());
        }
        // [0-9]*
        let before = s.len();
        let (whole, rest) = leading_int(s).ok_or_else(invalid)?;
        s = rest;
        let had_whole = s.len() != before;
        // (\.[0-9]*)?
        let mut fraction = 0;
        let mut scale = 1.0;
        let mut had_fraction = false;
        if let Some(rest) = s.strip_prefix('.') {
            let before = rest.len();
            (fraction, scale, s) = leading_fraction(rest);
            had_fraction = s.len() != before;
        }
        if !had_whole && !had_fraction {
            // No digits at all, e.g. ".s" or "-.s".
            return Err(invalid());
        }
        // The unit runs up to the next number. Splitting at an ASCII byte is always a char
        // boundary, so "µs" stays whole.
        let unit_len = s
            .find(|c: char| c == '.' || c.is_ascii_digit())
            .unwrap_or(s.len());
        if unit_len == 0 {
            return Err(DurationError::MissingUnit(text.to_string()));
        }
        let (unit_text, rest) = s.split_at(unit_len);
        s = rest;
        let unit = unit_nanos(unit_text).ok_or_else(|| DurationError::UnknownUnit {
            unit: unit_text.to_string(),
            text: text.to_string(),
        })?;
        if whole > LIMIT / unit {
            return Err(invalid());
        }
        let mut value = whole * unit;
        if fraction > 0 {
            // Go computes the fraction in float64 too: exact to the nanosecond for up to an
            // hour's worth, and truncated the same way by the conversion.
            value += (fraction as f64 * (unit as f64 / scale)) as u64;
            if value > LIMIT {
                return Err(invalid());
            }
        }
        total += value;
        if total > LIMIT {
            return Err(invalid());
        }
    }
    if negative {
        // total <= 1<<63, so the negation fits (1<<63 itself is i64::MIN).
        return Ok((total as i64).wrapping_neg());
    }
    if total > LIMIT - 1 {
        return Err(invalid());
    }
    Ok(total as i64)
}

/// For flags where `0` means "off" (`--resync 0`): Go's grammar, negative values refused.
pub fn non_negative(text: &str) -> Result<Duration, DurationError> {
    let nanos = parse_go_duration(text)?;
    if nanos < 0 {
        return Err(DurationError::Negative(text.to_string()));
    }
    Ok(Duration::from_nanos(nanos as u64))
}

/// For flags that need a duration to wait (lease durations, refresh interval): Go's grammar,
/// zero and negative values refused.
pub fn positive(text: &str) -> Result<Duration, DurationError> {
    let duration = non_negative(text)?;
    if duration.is_zero() {
        return Err(DurationError::NotPositive(text.to_string()));
    }
    Ok(duration)
}

fn unit_nanos(unit: &str) -> Option<u64> {
    Some(match unit {
        "ns" => NANOSECOND,
        // U+00B5 (micro sign) and U+03BC (Greek mu), as Go accepts both.
        "us" | "\u{b5}s" | "\u{3bc}s" => MICROSECOND,
        "ms" => MILLISECOND,
        "s" => SECOND,
        "m" => MINUTE,
        "h" => HOUR,
        _ => return None,
    })
}

/// Go's `leadingInt`: the leading `[0-9]*` and the rest; `None` on overflow past 1<<63.
fn leading_int(s: &str) -> Option<(u64, &str)> {
    let mut x: u64 = 0;
    let end = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    for digit in s[..end].bytes() {
        if x > LIMIT / 10 {
            return None;
        }
        x = x * 10 + u64::from(digit - b'0');
        if x > LIMIT {
            return None;
        }
    }
    Some((x, &s[end..]))
}

/// Go's `leadingFraction`: the leading `[0-9]*` after a decimal point, as an integer and the
/// power of ten it is scaled by. Digits past what fits are consumed and ignored (precision,
/// not an error).
fn leading_fraction(s: &str) -> (u64, f64, &str) {
    let mut x: u64 = 0;
    let mut scale = 1.0;
    let mut overflow = false;
    let end = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    for digit in s[..end].bytes() {
        if overflow {
            continue;
        }
        if x > (LIMIT - 1) / 10 {
            overflow = true;
            continue;
        }
        let y = x * 10 + u64::from(digit - b'0');
        if y > LIMIT {
            overflow = true;
            continue;
        }
        x = y;
        scale *= 10.0;
    }
    (x, scale, &s[end..])
}

#[cfg(test)]
mod tests {
    use super::*;

    const NS: i64 = NANOSECOND as i64;
    const US: i64 = MICROSECOND as i64;
    const MS: i64 = MILLISECOND as i64;
    const S: i64 = SECOND as i64;
    const M: i64 = MINUTE as i64;
    const H: i64 = HOUR as i64;

    // Go: time_test.go parseDurationTests / TestParseDuration, every case.
    #[test]
    fn go_parse_duration_table() {
        let cases: &[(&str, i64)] = &[
            // simple
            ("0", 0),
            ("5s", 5 * S),
            ("30s", 30 * S),
            ("1478s", 1478 * S),
            // sign
            ("-5s", -5 * S),
            ("+5s", 5 * S),
            ("-0", 0),
            ("+0", 0),
            // decimal
            ("5.0s", 5 * S),
            ("5.6s", 5 * S + 600 * MS),
            ("5.s", 5 * S),
            (".5s", 500 * MS),
            ("1.0s", S),
            ("1.00s", S),
            ("1.004s", S + 4 * MS),
            ("1.0040s", S + 4 * MS),
            ("100.00100s", 100 * S + MS),
            // different units
            ("10ns", 10 * NS),
            ("11us", 11 * US),
            ("12\u{b5}s", 12 * US),
            ("12\u{3bc}s", 12 * US),
            ("13ms", 13 * MS),
            ("14s", 14 * S),
            ("15m", 15 * M),
            ("16h", 16 * H),
            // composite durations
            ("3h30m", 3 * H + 30 * M),
            ("10.5s4m", 4 * M + 10 * S + 500 * MS),
            ("-2m3.4s", -(2 * M + 3 * S + 400 * MS)),
            (
                "1h2m3s4ms5us6ns",
                H + 2 * M + 3 * S + 4 * MS + 5 * US + 6 * NS,
            ),
            ("39h9m14.425s", 39 * H + 9 * M + 14 * S + 425 * MS),
            // large value
            ("52763797000ns", 52763797000 * NS),
            // more than 9 digits after decimal point (golang.org/issue/6617)
            ("0.3333333333333333333h", 20 * M),
            // 1<<53+1 cannot be stored precisely in a float64
            ("9007199254740993ns", (1 << 53) + 1),
            // the largest duration an int64 of nanoseconds holds
            ("9223372036854775807ns", i64::MAX),
            ("9223372036854775.807us", i64::MAX),
            ("9223372036s854ms775us807ns", i64::MAX),
            ("-9223372036854775808ns", i64::MIN),
            ("-9223372036854775.808us", i64::MIN),
            ("-9223372036s854ms775us808ns", i64::MIN),
            // largest negative round trip value (golang.org/issue/48629)
            ("-2562047h47m16.854775808s", i64::MIN),
            // huge string (golang.org/issue/15011)
            ("0.100000000000000000000h", 6 * M),
            // the first overflow check in leadingFraction
            ("0.830103483285477580700h", 49 * M + 48 * S + 372539827 * NS),
        ];
        for (text, want) in cases {
            assert_eq!(parse_go_duration(text), Ok(*want), "{text:?}");
        }
    }

    // Go: time_test.go parseDurationErrorTests / TestParseDurationErrors, the cases a Rust
    // &str can hold (the invalid-UTF-8 ones cannot reach us: clap refuses non-UTF-8 values).
    #[test]
    fn go_parse_duration_error_table() {
        let cases = [
            // invalid
            "",
            "3",
            "-",
            "s",
            ".",
            "-.",
            ".s",
            "+.s",
            "1d",
            "\u{fffd}",
            "\u{fffd} hello \u{fffd} world",
            // overflow
            "9223372036854775810ns",
            "9223372036854775808ns",
            "-9223372036854775809ns",
            "9223372036854776us",
            "3000000h",
            "9223372036854775.808us",
            "9223372036854ms775us808ns",
        ];
        for text in cases {
            let err = parse_go_duration(text).expect_err(text);
            assert!(
                err.to_string().contains(&format!("{text:?}")),
                "{text:?}: the error quotes the text: {err}"
            );
        }
    }

    #[test]
    fn errors_say_what_is_wrong_as_go_does() {
        assert_eq!(
            parse_go_duration("3"),
            Err(DurationError::MissingUnit("3".into()))
        );
        assert_eq!(
            parse_go_duration("1d"),
            Err(DurationError::UnknownUnit {
                unit: "d".into(),
                text: "1d".into()
            })
        );
        // Go does not trim: a space is part of the unit.
        assert_eq!(
            parse_go_duration("30s "),
            Err(DurationError::UnknownUnit {
                unit: "s ".into(),
                text: "30s ".into()
            })
        );
    }

    #[test]
    fn the_spellings_of_the_brief_and_the_go_readmes() {
        let cases = [
            ("1m30s", Duration::from_secs(90)),
            ("300ms", Duration::from_millis(300)),
            ("1.5h", Duration::from_secs(5400)),
            ("2h45m", Duration::from_secs(2 * 3600 + 45 * 60)),
            ("10us", Duration::from_micros(10)),
            ("10\u{b5}s", Duration::from_micros(10)),
            ("7ns", Duration::from_nanos(7)),
            ("0", Duration::ZERO),
        ];
        for (text, want) in cases {
            assert_eq!(non_negative(text), Ok(want), "{text:?}");
        }
    }

    #[test]
    fn flags_refuse_negative_values_and_positive_flags_refuse_zero() {
        assert_eq!(
            non_negative("-5s"),
            Err(DurationError::Negative("-5s".into()))
        );
        // Go reads "-0" as zero, which is not negative.
        assert_eq!(non_negative("-0"), Ok(Duration::ZERO));
        assert_eq!(non_negative("0s"), Ok(Duration::ZERO));
        for zero in ["0", "0s", "0.0h", "-0"] {
            assert_eq!(
                positive(zero),
                Err(DurationError::NotPositive(zero.into())),
                "{zero:?}"
            );
        }
        assert_eq!(
            positive("-1ms"),
            Err(DurationError::Negative("-1ms".into()))
        );
        assert_eq!(positive("15s"), Ok(Duration::from_secs(15)));
        // The old home-made grammar of the VM controller took plain seconds; Go does not.
        assert_eq!(positive("20"), Err(DurationError::MissingUnit("20".into())));
    }
}
