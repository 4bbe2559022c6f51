//! `spec.resource` quantities to engine units: CPU in millicores, memory in bytes.
//!
//! Counterpart: apimachinery's `resource.Quantity` (`ParseQuantity`, `ScaledValue`), reduced to
//! the forms the CRD schema admits: an unsigned decimal number (`2`, `0.5`, `.5`) with an
//! optional suffix. CPU takes decimal suffixes (`m`, `k`, `M`, `G`); memory takes decimal
//! (`k`, `M`, `G`, `T`, `P`, `E`) and binary (`Ki` .. `Ei`) suffixes, so `4G` is 4 000 000 000
//! bytes and `4Gi` is 4 294 967 296. Exponent forms (`1e3`) and signs are refused, here and by
//! the schema ([`super::types::ResourceSpec`]'s, in `crds/virtualmachine.yaml`), so the two agree.
//!
//! As in `ScaledValue`, a value that is not a whole number of the target unit rounds up
//! (`0.0001` CPU is 1 m). Arithmetic is exact (integers, u128) and overflow is an error.
//!
//! Invariant: every `Ok` value is > 0 and at most the limit ([`MAX_CPU_MILLIS`],
//! [`MAX_MEMORY_BYTES`]): a VM asking for zero, or for more than the engines take, is refused
//! here, with the field and the limit named, before any engine is asked (a request the engine
//! cannot represent is not a transient engine error to retry). The CRD carries the same
//! limits, so the apiserver refuses such a VM in the first place.

use thiserror::Error;

use super::types::VirtualMachine;

/// What a VM asks the engine for, in engine units.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Resources {
    /// Millicores (`2` -> 2000, `500m` -> 500).
    pub cpu_millis: u64,
    /// Bytes.
    pub memory_bytes: u64,
}

/// A quantity string that is not acceptable.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub(crate) enum QuantityError {
    #[error("{value:?} is not a quantity: {problem}")]
    /// Not a Kubernetes quantity.
    Malformed {
        /// The quantity as written.
        value: String,
        /// What is wrong with it.
        problem: &'static str,
    },
    #[error("{value:?} has unknown suffix {suffix:?} (allowed: {allowed})")]
    /// A suffix this resource does not take.
    UnknownSuffix {
        /// The quantity as written.
        value: String,
        /// The suffix found.
        suffix: String,
        /// The suffixes allowed here.
        allowed: &'static str,
    },
    #[error("{value:?} must be greater than zero")]
    /// Zero or negative.
    NotPositive {
        /// The quantity as written.
        value: String,
    },
    #[error("{value:?} is more than {limit}")]
    /// More than the engines can take ([`MAX_CPU_MILLIS`], [`MAX_MEMORY_BYTES`]).
    TooLarge {
        /// The quantity as written.
        value: String,
        /// The most this resource takes, and why.
        limit: &'static str,
    },
}

/// A VM whose `spec.resource` cannot be turned into engine units.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub(crate) enum SpecError {
    #[error("VirtualMachine {vm}: spec.resource is missing (cpu and memory are required)")]
    /// `spec.resource` is missing.
    MissingResource {
        /// The VM's `namespace/name`.
        vm: String,
    },
    #[error("VirtualMachine {vm}: spec.resource.cpu {source}")]
    /// `spec.resource.cpu` is not valid.
    Cpu {
        /// The VM's `namespace/name`.
        vm: String,
        /// The underlying error.
        source: QuantityError,
    },
    #[error("VirtualMachine {vm}: spec.resource.memory {source}")]
    /// `spec.resource.memory` is not valid.
    Memory {
        /// The VM's `namespace/name`.
        vm: String,
        /// The underlying error.
        source: QuantityError,
    },
}

/// The most CPU a VM may ask for, in millicores: what the Docker API's `NanoCpus` (an int64
/// of nano-cores) holds, about 9.2 billion cores. `crds/virtualmachine.yaml` refuses more.
pub(crate) const MAX_CPU_MILLIS: u64 = i64::MAX as u64 / 1_000_000;
/// The most memory a VM may ask for, in bytes: 1 EiB, more than any machine has and well
/// inside what the Docker API's `Memory` (an int64) holds. (Not `i64::MAX` itself: a CRD rule
/// `quantity(self).compareTo(quantity('9223372036854775807')) <= 0` let `8Ei` through on
/// Kubernetes 1.36.3, so the CRD could not say that limit.)
/// `crds/virtualmachine.yaml` refuses more.
pub(crate) const MAX_MEMORY_BYTES: u64 = 1 << 60;

/// The most a resource takes, in its engine unit, and how an error says it.
struct Limit {
    max: u64,
    text: &'static str,
}

const CPU_LIMIT: Limit = Limit {
    max: MAX_CPU_MILLIS,
    text: "9223372036854m, the most the Docker API's NanoCpus field holds",
};
const MEMORY_LIMIT: Limit = Limit {
    max: MAX_MEMORY_BYTES,
    text: "1Ei (1152921504606846976 bytes)",
};

const CPU_SUFFIXES: &str = "m, k, M, G or none";
const MEMORY_SUFFIXES: &str = "k, M, G, T, P, E, Ki, Mi, Gi, Ti, Pi, Ei or none";

/// The engine units of `vm.spec.resource`, or an error naming the VM and the field.
pub(crate) fn resources_of(vm: &VirtualMachine) -> Result<Resources, SpecError> {
    let key = vm.key();
    let resource = vm
        .spec
        .resource
        .as_ref()
        .ok_or_else(|| SpecError::MissingResource { vm: key.clone() })?;
    let cpu_millis = parse_cpu_millis(&resource.cpu.0).map_err(|source| SpecError::Cpu {
        vm: key.clone(),
        source,
    })?;
    let memory_bytes = parse_memory_bytes(&resource.memory.0)
        .map_err(|source| SpecError::Memory { vm: key, source })?;
    Ok(Resources {
        cpu_millis,
        memory_bytes,
    })
}

/// CPU in millicores: `"2"` -> 2000, `"500m"` -> 500, `"0.25"` -> 250.
pub(crate) fn parse_cpu_millis(value: &str) -> Result<u64, QuantityError> {
    let (number, suffix) = split_number(value, &CPU_LIMIT)?;
    // Multiplier to millicores, as a (numerator) power of ten.
    let scale: u128 = match suffix {
        "m" => 1,
        "" => 1_000,
        "k" => 1_000_000,
        "M" => 1_000_000_000,
        "G" => 1_000_000_000_000,
        _ => return Err(unknown_suffix(value, suffix, CPU_SUFFIXES)),
    };
    to_units(value, number, scale, &CPU_LIMIT)
}

/// Memory in bytes: `"4G"` -> 4 000 000 000, `"4Gi"` -> 4 294 967 296.
pub(crate) fn parse_memory_bytes(value: &str) -> Result<u64, QuantityError> {
    let (number, suffix) = split_number(value, &MEMORY_LIMIT)?;
    let scale: u128 = match suffix {
        "" => 1,
        "k" => 10u128.pow(3),
        "M" => 10u128.pow(6),
        "G" => 10u128.pow(9),
        "T" => 10u128.pow(12),
        "P" => 10u128.pow(15),
        "E" => 10u128.pow(18),
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        "Pi" => 1 << 50,
        "Ei" => 1 << 60,
        _ => return Err(unknown_suffix(value, suffix, MEMORY_SUFFIXES)),
    };
    to_units(value, number, scale, &MEMORY_LIMIT)
}

/// A decimal number as `digits / 10^fraction_len`.
struct Decimal {
    digits: u128,
    fraction_len: u32,
}

fn split_number<'a>(value: &'a str, limit: &Limit) -> Result<(Decimal, &'a str), QuantityError> {
    let malformed = |problem| QuantityError::Malformed {
        value: value.to_string(),
        problem,
    };
    let trimmed = value.trim();
    if trimmed.is_empty() {
        return Err(malformed("it is empty"));
    }
    if trimmed.starts_with('-') {
        return Err(malformed("it must not be negative"));
    }
    let end = trimmed
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(trimmed.len());
    let (number, suffix) = trimmed.split_at(end);
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty() && fraction.is_empty() {
        return Err(malformed("it does not start with a number"));
    }
    if fraction.contains('.') {
        return Err(malformed("it has more than one decimal point"));
    }
    let mut digits: u128 = 0;
    for c in whole.chars().chain(fraction.chars()) {
        digits = digits
            .checked_mul(10)
            .and_then(|d| d.checked_add(u128::from(c as u8 - b'0')))
            .ok_or_else(|| QuantityError::TooLarge {
                value: value.to_string(),
                limit: limit.text,
            })?;
    }
    let fraction_len =
        u32::try_from(fraction.len()).map_err(|_| malformed("it has too many digits"))?;
    if fraction_len > 30 {
        return Err(malformed("it has too many digits"));
    }
    Ok((
        Decimal {
            digits,
            fraction_len,
        },
        suffix,
    ))
}

fn to_units(
    value: &str,
    number: Decimal,
    scale: u128,
    limit: &Limit,
) -> Result<u64, QuantityError> {
    let too_large = || QuantityError::TooLarge {
        value: value.to_string(),
        limit: limit.text,
    };
    let scaled = number.digits.checked_mul(scale).ok_or_else(too_large)?;
    let divisor = 10u128.pow(number.fraction_len);
    let units = scaled.div_ceil(divisor);
    if units == 0 {
        return Err(QuantityError::NotPositive {
            value: value.to_string(),
        });
    }
    u64::try_from(units)
        .ok()
        .filter(|&units| units <= limit.max)
        .ok_or_else(too_large)
}

fn unknown_suffix(value: &str, suffix: &str, allowed: &'static str) -> QuantityError {
    QuantityError::UnknownSuffix {
        value: value.to_string(),
        suffix: suffix.to_string(),
        allowed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_quantities_become_millicores() {
        for (input, millis) in [
            ("2", 2000),
            ("500m", 500),
            ("0.5", 500),
            (".25", 250),
            ("1.5", 1500),
            ("0.0001", 1),
            ("1k", 1_000_000),
        ] {
            assert_eq!(parse_cpu_millis(input), Ok(millis), "{input}");
        }
    }

    #[test]
    fn memory_quantities_become_bytes_with_decimal_and_binary_suffixes() {
        for (input, bytes) in [
            ("4G", 4_000_000_000u64),
            ("4Gi", 4_294_967_296),
            ("512Mi", 536_870_912),
            ("1.5Gi", 1_610_612_736),
            ("64M", 64_000_000),
            ("1024", 1024),
            ("1k", 1000),
            ("1Ki", 1024),
        ] {
            assert_eq!(parse_memory_bytes(input), Ok(bytes), "{input}");
        }
    }

    #[test]
    fn invalid_quantities_are_refused_with_the_reason() {
        assert!(matches!(
            parse_cpu_millis("abc"),
            Err(QuantityError::Malformed { .. })
        ));
        assert!(matches!(
            parse_cpu_millis("-1"),
            Err(QuantityError::Malformed {
                problem: "it must not be negative",
                ..
            })
        ));
        assert!(matches!(
            parse_cpu_millis("0"),
            Err(QuantityError::NotPositive { .. })
        ));
        assert!(matches!(
            parse_cpu_millis("0m"),
            Err(QuantityError::NotPositive { .. })
        ));
        assert!(matches!(
            parse_cpu_millis("2Gi"),
            Err(QuantityError::UnknownSuffix { .. })
        ));
        assert!(matches!(
            parse_memory_bytes("-4G"),
            Err(QuantityError::Malformed { .. })
        ));
        assert!(matches!(
            parse_memory_bytes("4X"),
            Err(QuantityError::UnknownSuffix { .. })
        ));
        assert!(matches!(
            parse_memory_bytes("1.2.3"),
            Err(QuantityError::Malformed { .. })
        ));
        assert!(matches!(
            parse_memory_bytes(""),
            Err(QuantityError::Malformed { .. })
        ));
        assert!(matches!(
            parse_memory_bytes("100000000000000E"),
            Err(QuantityError::TooLarge { .. })
        ));
    }

    #[test]
    fn quantities_up_to_the_engine_limits_are_taken_and_more_is_refused_naming_the_limit() {
        assert_eq!(parse_cpu_millis("9223372036854m"), Ok(MAX_CPU_MILLIS));
        assert_eq!(parse_cpu_millis("9223372036"), Ok(9_223_372_036_000));
        let err = parse_cpu_millis("9223372037").unwrap_err();
        assert!(matches!(err, QuantityError::TooLarge { .. }));
        assert!(err.to_string().contains("NanoCpus"), "{err}");
        assert_eq!(parse_memory_bytes("1Ei"), Ok(MAX_MEMORY_BYTES));
        assert_eq!(
            parse_memory_bytes("1152921504606846976"),
            Ok(MAX_MEMORY_BYTES)
        );
        let err = parse_memory_bytes("1152921504606846977").unwrap_err();
        assert!(err.to_string().contains("more than 1Ei"), "{err}");
        assert!(matches!(
            parse_memory_bytes("8Ei"),
            Err(QuantityError::TooLarge { .. })
        ));
    }

    #[test]
    fn spec_errors_name_the_vm_and_the_field() {
        let vm = VirtualMachine::namespaced("ns", "web", "abc", "4G");
        let err = resources_of(&vm).unwrap_err().to_string();
        assert!(
            err.contains("VirtualMachine ns/web")
                && err.contains("spec.resource.cpu")
                && err.contains("\"abc\""),
            "{err}"
        );

        let mut vm = VirtualMachine::namespaced("ns", "web", "2", "4G");
        vm.spec.resource = None;
        assert_eq!(
            resources_of(&vm),
            Err(SpecError::MissingResource {
                vm: "ns/web".into()
            })
        );

        let vm = VirtualMachine::namespaced("ns", "web", "2", "4G");
        assert_eq!(
            resources_of(&vm),
            Ok(Resources {
                cpu_millis: 2000,
                memory_bytes: 4_000_000_000
            })
        );
    }
}
