//! What a failed reconcile means for the key: controller101's `handleErr`, with its hot loops
//! removed.
//!
//! - [`ReconcileError::retry`] true (driver and apiserver failures): the worker puts the key
//!   back with `add_rate_limited`, so a Failed VM is retried with the rate limiter's per-item
//!   exponential backoff (5 ms doubling to 1000 s) and never in a hot loop; a success
//!   `forget`s the key and resets the backoff.
//! - Not retried: a key that is not `namespace/name`. A VM that is gone is not an error at all
//!   (the reconcile returns done), so a deleted object is never requeued forever; an invalid
//!   spec is recorded in the VM's status and waits for the user to edit the spec (the edit's
//!   event requeues it).

use thiserror::Error;

use super::api::ApiError;
use super::driver::DriverError;

/// Why one reconcile of a key failed.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum ReconcileError {
    #[error("invalid workqueue key {key:?}: expected namespace/name")]
    InvalidKey { key: String },
    #[error(transparent)]
    Api(#[from] ApiError),
    #[error("VirtualMachine {vm}: {source}")]
    Driver { vm: String, source: DriverError },
}

impl ReconcileError {
    /// True if the key should go back to the queue with rate-limited backoff.
    pub fn retry(&self) -> bool {
        match self {
            ReconcileError::InvalidKey { .. } => false,
            ReconcileError::Api(_) | ReconcileError::Driver { .. } => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
