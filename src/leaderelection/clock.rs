//! The wall clock used to stamp `acquireTime` / `renewTime` (client-go: `k8s.io/utils/clock`).
//!
//! Invariant: wall-clock readings are only ever *written* into the Lease for humans and tools
//! (`kubectl get lease`); expiry is judged on the monotonic clock (`tokio::time::Instant`, which
//! paused-time tests control) at the moment this process observed a change of the record. That
//! is why a skewed clock here, or on another host, cannot cause an early takeover or an endless
//! wait, and why [`SkewedClock`] exists: to prove it.

use std::time::{Duration, SystemTime};

use k8s_openapi::jiff::Timestamp;

/// Source of the timestamps written into the Lease.
pub trait Clock: Send + Sync + 'static {
    /// Now, truncated to whole microseconds (the precision of `MicroTime`), so that a record
    /// read back from the apiserver compares equal to the one that was written.
    fn now(&self) -> Timestamp;
}

/// The host's real-time clock.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

/// The host's clock shifted by a fixed offset: a host whose clock is wrong.
#[derive(Clone, Copy, Debug)]
pub struct SkewedClock {
    /// Added to the real time.
    pub ahead: Duration,
    /// Subtracted from the real time.
    pub behind: Duration,
}

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        to_micro_timestamp(SystemTime::now())
    }
}

impl Clock for SkewedClock {
    fn now(&self) -> Timestamp {
        let t = SystemTime::now() + self.ahead;
        to_micro_timestamp(t.checked_sub(self.behind).unwrap_or(SystemTime::UNIX_EPOCH))
    }
}

/// Converts and truncates to microseconds; times jiff cannot represent clamp to its range.
pub(crate) fn to_micro_timestamp(t: SystemTime) -> Timestamp {
    let micros = match t.duration_since(SystemTime::UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_micros()).unwrap_or(i64::MAX),
        Err(e) => -i64::try_from(e.duration().as_micros()).unwrap_or(i64::MAX),
    };
    Timestamp::from_microsecond(micros).unwrap_or(if micros < 0 {
        Timestamp::MIN
    } else {
        Timestamp::MAX
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn system_clock_is_truncated_to_microseconds() {
        let t = SystemClock.now();
        assert_eq!(t.subsec_nanosecond() % 1_000, 0);
    }

    #[test]
    fn skewed_clock_is_off_by_its_offset() {
        let behind = SkewedClock {
            ahead: Duration::ZERO,
            behind: Duration::from_secs(3600),
        }
        .now();
        let real = SystemClock.now();
        let ahead = SkewedClock {
            ahead: Duration::from_secs(3600),
            behind: Duration::ZERO,
        }
        .now();
        let lag = real.as_second() - behind.as_second();
        let lead = ahead.as_second() - real.as_second();
        assert!((3599..=3601).contains(&lag), "behind by {lag} s");
        assert!((3599..=3601).contains(&lead), "ahead by {lead} s");
    }
}
