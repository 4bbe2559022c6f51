//! What a failed reconcile means for the key: controller101's `handleErr`, with its hot loops
//! removed.
//!
//! - [`ReconcileError::retry`] true (driver and apiserver failures): the worker puts the key
//!   back with `add_rate_limited`, so a Failed VM is retried with the rate limiter's per-item
//!   exponential backoff and never in a hot loop; a success `forget`s the key and resets the
//!   backoff. The backoff is capped at [`MAX_RETRY_DELAY`] ([`rate_limiter_capped`]), not client-go's
//!   1000 s: an engine that comes back is noticed within two minutes, not seventeen.
//! - Not retried: a key that is not `namespace/name`. A VM that is gone is not an error at all
//!   (the reconcile returns done), so a deleted object is never requeued forever; an invalid
//!   spec is recorded in the VM's status and waits for the user to edit the spec (the edit's
//!   event requeues it).
//! - [`ReconcileError::NotEntitled`]: the reconcile stopped because its context ended (the
//!   term is over or the runtime cancelled it) before its next side effect. That says nothing
//!   about the VM: no Failed status is written, no event recorded, and the error is not a
//!   failure of the key. [`ReconcileError::retry`] is false (this replica must not act on it
//!   again in this term); the runtime hands the key to the next leader, whose initial list
//!   enqueues every VM anyway.

use std::time::Duration;

use thiserror::Error;

use super::api::ApiError;
use super::driver::DriverError;
use crate::runtime::NotEntitled;

/// The longest a failing VM waits before its next try.
pub(crate) const MAX_RETRY_DELAY: Duration = Duration::from_secs(120);

/// The VM controller's queue limiter: per VM 5 ms doubling up to `max_delay`
/// (`--max-retry-delay`, by default [`MAX_RETRY_DELAY`]), and overall 10 retries a second with
/// bursts of 100 (client-go's `DefaultControllerRateLimiter` with the per-item cap lowered).
pub(crate) fn rate_limiter_capped(
    max_delay: Duration,
) -> crate::workqueue::MaxOfRateLimiter<crate::runtime::ObjectKey> {
    use crate::workqueue::{
        BucketRateLimiter, ItemExponentialFailureRateLimiter, MaxOfRateLimiter,
    };
    MaxOfRateLimiter::new(vec![
        Box::new(ItemExponentialFailureRateLimiter::new(
            Duration::from_millis(5),
            max_delay,
        )),
        Box::new(BucketRateLimiter::new(10.0, 100).expect("10 qps, burst 100 is valid")),
    ])
}

/// Why one reconcile of a key failed.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub(crate) enum ReconcileError {
    #[error("invalid workqueue key {key:?}: expected namespace/name")]
    /// A key that is not `namespace/name`.
    InvalidKey {
        /// The key as taken from the queue.
        key: String,
    },
    #[error(transparent)]
    /// An apiserver request failed.
    Api(ApiError),
    #[error("VirtualMachine {vm}: {source}")]
    /// A driver call failed.
    Driver {
        /// The VM's `namespace/name`.
        vm: String,
        /// The underlying error.
        source: DriverError,
    },
    /// The reconcile stopped before a side effect it was no longer entitled to cause.
    #[error("reconcile stopped: {0}")]
    NotEntitled(NotEntitled),
}

impl ReconcileError {
    /// True if the key should go back to the queue with rate-limited backoff.
    pub(crate) fn retry(&self) -> bool {
        match self {
            ReconcileError::InvalidKey { .. } | ReconcileError::NotEntitled(_) => false,
            ReconcileError::Api(_) | ReconcileError::Driver { .. } => true,
        }
    }
}

impl From<ApiError> for ReconcileError {
    /// A write the fence stopped is [`ReconcileError::NotEntitled`], not an apiserver failure.
    fn from(error: ApiError) -> Self {
        match error {
            ApiError::NotEntitled { reason, .. } => ReconcileError::NotEntitled(reason),
            other => ReconcileError::Api(other),
        }
    }
}

impl From<NotEntitled> for ReconcileError {
    fn from(reason: NotEntitled) -> Self {
        ReconcileError::NotEntitled(reason)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workqueue::RateLimiter;

    #[test]
    fn a_failing_vm_backs_off_exponentially_up_to_two_minutes() {
        let limiter = rate_limiter_capped(MAX_RETRY_DELAY);
        let key = crate::runtime::ObjectKey::new("ns", "vm");
        let delays: Vec<Duration> = (0..40).map(|_| limiter.when(&key)).collect();
        assert_eq!(delays[0], Duration::from_millis(5));
        assert_eq!(delays[1], Duration::from_millis(10));
        assert!(delays.windows(2).all(|w| w[0] <= w[1]), "{delays:?}");
        assert_eq!(*delays.last().unwrap(), MAX_RETRY_DELAY);
        limiter.forget(&key);
        assert_eq!(limiter.when(&key), Duration::from_millis(5));
    }

    #[test]
    fn engine_and_apiserver_failures_are_retried_but_bad_keys_are_dropped() {
        assert!(
            !ReconcileError::InvalidKey {
                key: "a/b/c".into()
            }
            .retry()
        );
        let driver = ReconcileError::Driver {
            vm: "ns/vm".into(),
            source: DriverError::Unreachable {
                engine: "docker engine at unix:///x".into(),
                message: "refused".into(),
            },
        };
        assert!(driver.retry());
        assert_eq!(
            driver.to_string(),
            "VirtualMachine ns/vm: docker engine at unix:///x is unreachable: refused"
        );
        assert!(
            ReconcileError::from(ApiError::Conflict {
                vm: "ns/vm".into(),
                operation: "status update"
            })
            .retry()
        );
    }

    #[test]
    fn a_reconcile_that_lost_its_entitlement_is_neither_retried_nor_a_failure() {
        let fenced = ReconcileError::from(ApiError::NotEntitled {
            vm: "ns/vm".into(),
            operation: "status update",
            reason: NotEntitled::NotLeading,
        });
        assert_eq!(fenced, ReconcileError::NotEntitled(NotEntitled::NotLeading));
        assert!(!fenced.retry());
        assert_eq!(
            fenced.to_string(),
            "reconcile stopped: this process no longer leads"
        );
    }
}
