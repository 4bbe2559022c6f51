//! Comparing resourceVersions: apimachinery's `pkg/util/resourceversion`
//! (`CompareResourceVersion`, KEP-5504, stable in Kubernetes 1.35).
//!
//! The resourceVersions of one resource type are decimal integers that grow with every write,
//! so two of them may be compared. The rules are apimachinery's, exactly:
//! - a well-formed resourceVersion is a non-empty string of ASCII digits without a leading
//!   zero; `"0"` is rejected too (it is the special "any version" value of list and watch,
//!   never the version of a live object);
//! - there is no length limit: two well-formed values compare as decimal numbers of any size
//!   (the shorter is the smaller; equal lengths compare digit by digit), never capped at `u64`.
//!
//! The comparison means something only between two versions of the same resource type.

use std::cmp::Ordering;

/// A resourceVersion that is not a well-formed positive decimal integer (apimachinery's
/// `InvalidResourceVersion`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "resource version is not well formed: {0:?} (a positive decimal integer without leading zeros is expected)"
)]
pub struct InvalidResourceVersion(pub String);

/// Compares two resourceVersions of the same resource type (apimachinery's
/// `CompareResourceVersion`): `Less` when `a` is older than `b`.
///
/// # Errors
/// [`InvalidResourceVersion`] naming the first of `a`, `b` that is not well formed: empty,
/// `"0"`, a leading zero, or a character other than an ASCII digit.
///
/// # Examples
/// ```
/// use std::cmp::Ordering;
/// use kubeloop::cache::compare_resource_version as compare;
///
/// assert_eq!(compare("99", "100"), Ok(Ordering::Less));
/// assert!(compare("0", "1").is_err());
/// ```
pub fn compare_resource_version(a: &str, b: &str) -> Result<Ordering, InvalidResourceVersion> {
    let a = well_formed(a)?;
    let b = well_formed(b)?;
    // Both are digit strings without leading zeros: the longer is the larger, and equal
    // lengths order as their digits do.
    Ok(a.len().cmp(&b.len()).then_with(|| a.cmp(b)))
}

/// Whether `resource_version` is well formed, as [`compare_resource_version`] requires.
pub fn is_well_formed_resource_version(resource_version: &str) -> bool {
    let digits = resource_version.as_bytes();
    !digits.is_empty() && digits[0] != b'0' && digits.iter().all(u8::is_ascii_digit)
}

/// The newer of two resourceVersions, `current` when `candidate` is not well formed, or
/// `candidate` when `current` is `None`. For keeping a high-water mark.
pub fn newest_resource_version<'a>(
    current: Option<&'a str>,
    candidate: &'a str,
) -> Option<&'a str> {
    if !is_well_formed_resource_version(candidate) {
        return current;
    }
    match current {
        Some(current) if compare_resource_version(current, candidate) != Ok(Ordering::Less) => {
            Some(current)
        }
        _ => Some(candidate),
    }
}

fn well_formed(resource_version: &str) -> Result<&str, InvalidResourceVersion> {
    if is_well_formed_resource_version(resource_version) {
        Ok(resource_version)
    } else {
        Err(InvalidResourceVersion(resource_version.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// apimachinery v0.36.3 `pkg/util/resourceversion/resourceversion_test.go`,
    /// `TestCompareResourceVersion`, every case (`None`: an error is expected).
    #[test]
    fn compare_resource_version_cases() {
        let cases: &[(&str, &str, &str, Option<Ordering>)] = &[
            ("a less than b", "100", "200", Some(Ordering::Less)),
            ("a is zero, invalid", "0", "1", None),
            ("both zero", "0", "0", None),
            ("a greater than b", "200", "100", Some(Ordering::Greater)),
            ("b is 0, invalid", "1", "0", None),
            ("a equal to b small", "1", "1", Some(Ordering::Equal)),
            ("a equal to b", "100", "100", Some(Ordering::Equal)),
            ("a shorter than b", "99", "100", Some(Ordering::Less)),
            ("a longer than b", "100", "99", Some(Ordering::Greater)),
            ("a with leading zero", "0100", "100", None),
            ("b with leading zero", "100", "0100", None),
            ("a empty", "", "100", None),
            ("b empty", "100", "", None),
            ("a non-digit", "100a", "100", None),
            ("b non-digit", "100", "100a", None),
            (
                "large int a less than b",
                "99999999999999999999999999999999999999999999999999",
                "100000000000000000000000000000000000000000000000000",
                Some(Ordering::Less),
            ),
            (
                "large int a greater than b",
                "100000000000000000000000000000000000000000000000000",
                "99999999999999999999999999999999999999999999999999",
                Some(Ordering::Greater),
            ),
            (
                "large int a equal to b",
                "12345678901234567890123456789012345678901234567890",
                "12345678901234567890123456789012345678901234567890",
                Some(Ordering::Equal),
            ),
        ];
        for &(name, a, b, expected) in cases {
            assert_eq!(
                compare_resource_version(a, b).ok(),
                expected,
                "{name}: compare({a:?}, {b:?})"
            );
        }
    }

    #[test]
    fn the_error_names_the_first_malformed_version() {
        assert_eq!(
            compare_resource_version("12x", "0"),
            Err(InvalidResourceVersion("12x".into()))
        );
        assert_eq!(
            compare_resource_version("1", "-1"),
            Err(InvalidResourceVersion("-1".into()))
        );
        let message = compare_resource_version("0100", "1")
            .unwrap_err()
            .to_string();
        assert!(message.contains("\"0100\""), "{message}");
    }

    #[test]
    fn the_newest_keeps_a_high_water_mark_past_u64() {
        let beyond = "18446744073709551616"; // u64::MAX + 1
        assert_eq!(newest_resource_version(None, "5"), Some("5"));
        assert_eq!(newest_resource_version(Some("5"), "0"), Some("5"));
        assert_eq!(newest_resource_version(Some("5"), "4"), Some("5"));
        assert_eq!(
            newest_resource_version(Some("18446744073709551615"), beyond),
            Some(beyond)
        );
        assert_eq!(newest_resource_version(None, "bogus"), None);
    }
}
