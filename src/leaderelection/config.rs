//! The elector's timing configuration: client-go's `LeaderElectionConfig` durations, its
//! validation in `NewLeaderElector`, and the defaults Kubernetes components use
//! (`k8s.io/component-base/config/v1alpha1` `RecommendedDefaultLeaderElectionConfiguration`).
//!
//! Differences on purpose:
//! - `lease_duration` must be a whole number of seconds, at least 1 s. The Lease object stores
//!   `leaseDurationSeconds` as an integer and client-go truncates, so a 1.5 s duration silently
//!   becomes 1 s on the wire (and 0.5 s becomes 0: every other candidate sees the lease as
//!   expired at once). The safety argument below needs the duration *other* candidates read,
//!   so we refuse values that would be truncated.
//! - Callbacks are not part of this struct: [`super::LeaderCallbacks`] can only be built with
//!   both required callbacks, so "OnStartedLeading must not be nil" cannot happen at run time.
//! - `recontend` and `release_on_cancel` are plain flags here (client-go has no re-contend).
//!
//! # Why `renew_deadline < lease_duration` lets the work stop in time
//! Let `S` be the local instant at which this process *sent* its last successful write of the
//! Lease. Any other candidate can only have observed that write after it was applied, so its
//! local observation time `O >= S`, and it will not consider the lease expired before
//! `O + lease_duration >= S + lease_duration`. This elector cancels the leader's work at
//! `S + renew_deadline` if no later write succeeded, and then waits at most until
//! `S + lease_duration` for the work to return. The gap `lease_duration - renew_deadline` is
//! therefore the time the work has to wind down before anyone else can become leader; with the
//! defaults that is 5 s. (It assumes the hosts' monotonic clocks run at the same rate, not that
//! they agree on the time: no timestamp written into the Lease is ever used for expiry.)

use std::time::Duration;

use thiserror::Error;

/// client-go `JitterFactor`: the acquire loop waits `retry_period * (1 + rand * 1.2)`.
pub const JITTER_FACTOR: f64 = 1.2;

/// Default `leaseDuration` of Kubernetes components (kube-controller-manager, kube-scheduler).
pub const DEFAULT_LEASE_DURATION: Duration = Duration::from_secs(15);
/// Default `renewDeadline` of Kubernetes components.
pub const DEFAULT_RENEW_DEADLINE: Duration = Duration::from_secs(10);
/// Default `retryPeriod` of Kubernetes components.
pub const DEFAULT_RETRY_PERIOD: Duration = Duration::from_secs(2);

/// Timing and behaviour of one [`super::LeaderElector`]. Build it with [`Default`] (the
/// Kubernetes component defaults) and adjust fields; it is checked by [`Self::validate`], which
/// [`super::LeaderElector::new`] calls.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaderElectionConfig {
    /// How long non-leaders wait, after observing a change of the Lease, before they may take
    /// it over. Written into the Lease as `leaseDurationSeconds`. Whole seconds, >= 1 s.
    pub lease_duration: Duration,
    /// How long the leader keeps trying to renew after its last successful write before it
    /// gives up, cancels its work and stops leading. Must be below `lease_duration`.
    pub renew_deadline: Duration,
    /// Interval between attempts (jittered by [`JITTER_FACTOR`] while acquiring).
    pub retry_period: Duration,
    /// On a graceful stop, write an empty holder with a 1 s duration so that a successor can
    /// take over at once instead of waiting for the lease to expire. The release happens after
    /// the leader's work stopped and before `on_stopped_leading` is called.
    pub release_on_cancel: bool,
    /// After losing the lease, go back to contending (as a follower) instead of returning
    /// from [`super::LeaderElector::run`] as client-go's one-shot `Run` does.
    pub recontend: bool,
    /// Name used in logs and health-check messages (client-go `Name`).
    pub name: String,
}

/// A configuration rejected by [`LeaderElectionConfig::validate`].
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum ConfigError {
    /// A duration is zero.
    #[error("leader election {name:?}: {field} must be greater than zero")]
    NotPositive {
        /// The election's name.
        name: String,
        /// The field that is zero.
        field: &'static str,
    },
    /// The Lease stores whole seconds only.
    #[error(
        "leader election {name:?}: lease_duration ({lease_duration:?}) must be a whole number of \
         seconds, because the Lease stores leaseDurationSeconds as an integer"
    )]
    LeaseNotWholeSeconds {
        /// The election's name.
        name: String,
        /// The lease duration given.
        lease_duration: Duration,
    },
    /// The lease would expire before the leader gives up renewing.
    #[error(
        "leader election {name:?}: lease_duration ({lease_duration:?}) must be greater than \
         renew_deadline ({renew_deadline:?})"
    )]
    LeaseNotLongerThanRenewDeadline {
        /// The election's name.
        name: String,
        /// The lease duration given.
        lease_duration: Duration,
        /// The renew deadline given.
        renew_deadline: Duration,
    },
    /// A jittered retry could come after the renew deadline.
    #[error(
        "leader election {name:?}: renew_deadline ({renew_deadline:?}) must be greater than \
         retry_period * 1.2 ({retry_period:?} * 1.2)"
    )]
    RenewDeadlineNotLongerThanJitteredRetry {
        /// The election's name.
        name: String,
        /// The renew deadline given.
        renew_deadline: Duration,
        /// The retry period given.
        retry_period: Duration,
    },
    /// The lock has no holder identity.
    #[error("leader election {name:?}: lock identity is empty")]
    EmptyIdentity {
        /// The election's name.
        name: String,
    },
}

impl Default for LeaderElectionConfig {
    fn default() -> Self {
        Self {
            lease_duration: DEFAULT_LEASE_DURATION,
            renew_deadline: DEFAULT_RENEW_DEADLINE,
            retry_period: DEFAULT_RETRY_PERIOD,
            release_on_cancel: true,
            recontend: false,
            name: String::new(),
        }
    }
}

impl LeaderElectionConfig {
    /// client-go's checks in `NewLeaderElector`, in its order, plus the whole-seconds rule:
    /// `lease_duration > renew_deadline > 1.2 * retry_period > 0`.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let name = || self.name.clone();
        for (field, value) in [
            ("lease_duration", self.lease_duration),
            ("renew_deadline", self.renew_deadline),
            ("retry_period", self.retry_period),
        ] {
            if value.is_zero() {
                return Err(ConfigError::NotPositive {
                    name: name(),
                    field,
                });
            }
        }
        if self.lease_duration <= self.renew_deadline {
            return Err(ConfigError::LeaseNotLongerThanRenewDeadline {
                name: name(),
                lease_duration: self.lease_duration,
                renew_deadline: self.renew_deadline,
            });
        }
        if self.renew_deadline <= self.retry_period.mul_f64(JITTER_FACTOR) {
            return Err(ConfigError::RenewDeadlineNotLongerThanJitteredRetry {
                name: name(),
                renew_deadline: self.renew_deadline,
                retry_period: self.retry_period,
            });
        }
        if self.lease_duration.subsec_nanos() != 0 {
            return Err(ConfigError::LeaseNotWholeSeconds {
                name: name(),
                lease_duration: self.lease_duration,
            });
        }
        Ok(())
    }

    /// The value written as `leaseDurationSeconds` (validated to fit and to be whole).
    pub(crate) fn lease_duration_seconds(&self) -> i32 {
        i32::try_from(self.lease_duration.as_secs()).unwrap_or(i32::MAX)
    }
}

/// The identity check lives apart from [`LeaderElectionConfig::validate`] because the identity
/// belongs to the lock (as in client-go, `lec.Lock.Identity()`).
pub(crate) fn validate_identity(name: &str, identity: &str) -> Result<(), ConfigError> {
    if identity.trim().is_empty() {
        return Err(ConfigError::EmptyIdentity {
            name: name.to_string(),
        });
    }
    Ok(())
}

/// An identity unique to this process: the hostname, `_`, and a random v4 UUID, as client-go
/// programs build theirs (`id := hostname + "_" + string(uuid.NewUUID())`).
///
/// Two processes must never share an identity: the elector steps down when it sees another
/// process write the lease under its own identity ([`super::StopReason::DuplicateIdentity`]).
/// A fresh identity per process also means a restarted process waits for its dead predecessor's
/// lease to expire, as any other candidate does. A hostname that is not UTF-8 is converted
/// lossily; an empty one leaves just `_<uuid>`.
pub fn default_identity() -> String {
    let host = gethostname::gethostname();
    format!("{}_{}", host.to_string_lossy(), uuid::Uuid::new_v4())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_identity_is_the_hostname_and_a_suffix_unique_per_call() {
        let (a, b) = (default_identity(), default_identity());
        assert_ne!(a, b);
        let host = gethostname::gethostname().to_string_lossy().into_owned();
        let suffix = a
            .strip_prefix(&format!("{host}_"))
            .unwrap_or_else(|| panic!("{a:?} does not start with {host:?}_"));
        assert!(
            uuid::Uuid::parse_str(suffix).is_ok(),
            "{suffix:?} is not a uuid"
        );
        assert!(validate_identity("x", &a).is_ok());
    }

    fn secs(s: f64) -> Duration {
        Duration::from_secs_f64(s)
    }

    fn config(lease: f64, renew: f64, retry: f64) -> LeaderElectionConfig {
        LeaderElectionConfig {
            lease_duration: secs(lease),
            renew_deadline: secs(renew),
            retry_period: secs(retry),
            name: "test".into(),
            ..Default::default()
        }
    }

    #[test]
    fn defaults_are_the_kubernetes_component_defaults_and_valid() {
        let c = LeaderElectionConfig::default();
        assert_eq!(c.lease_duration, Duration::from_secs(15));
        assert_eq!(c.renew_deadline, Duration::from_secs(10));
        assert_eq!(c.retry_period, Duration::from_secs(2));
        assert_eq!(c.validate(), Ok(()));
        assert_eq!(c.lease_duration_seconds(), 15);
    }

    // client-go: TestLeaderElectionConfigValidation (the valid half: 15 s / 2 s / 1 s).
    #[test]
    fn client_go_validation_example_is_accepted() {
        assert_eq!(config(15.0, 2.0, 1.0).validate(), Ok(()));
    }

    // client-go: NewLeaderElector's checks, one row per rule.
    #[test]
    fn bad_durations_are_rejected_with_the_rule_they_break() {
        type Expect = fn(&ConfigError) -> bool;
        let cases: Vec<(LeaderElectionConfig, Expect)> = vec![
            (config(10.0, 10.0, 1.0), |e| {
                matches!(e, ConfigError::LeaseNotLongerThanRenewDeadline { .. })
            }),
            (config(5.0, 10.0, 1.0), |e| {
                matches!(e, ConfigError::LeaseNotLongerThanRenewDeadline { .. })
            }),
            // 1.2 * 2 s = 2.4 s: a 2.4 s deadline is not strictly greater.
            (config(15.0, 2.4, 2.0), |e| {
                matches!(
                    e,
                    ConfigError::RenewDeadlineNotLongerThanJitteredRetry { .. }
                )
            }),
            (config(15.0, 2.0, 2.0), |e| {
                matches!(
                    e,
                    ConfigError::RenewDeadlineNotLongerThanJitteredRetry { .. }
                )
            }),
            (config(15.0, 10.0, 0.0), |e| {
                matches!(
                    e,
                    ConfigError::NotPositive {
                        field: "retry_period",
                        ..
                    }
                )
            }),
            (config(15.0, 0.0, 2.0), |e| {
                matches!(
                    e,
                    ConfigError::NotPositive {
                        field: "renew_deadline",
                        ..
                    }
                )
            }),
            (config(0.0, 10.0, 2.0), |e| {
                matches!(
                    e,
                    ConfigError::NotPositive {
                        field: "lease_duration",
                        ..
                    }
                )
            }),
            (config(4.5, 3.0, 0.5), |e| {
                matches!(e, ConfigError::LeaseNotWholeSeconds { .. })
            }),
        ];
        for (c, expected) in cases {
            let err = c
                .validate()
                .expect_err(&format!("{c:?} should be rejected"));
            assert!(expected(&err), "{c:?} rejected for the wrong reason: {err}");
            assert!(
                err.to_string().contains("\"test\""),
                "error does not name the election: {err}"
            );
        }
    }

    #[test]
    fn a_just_valid_jittered_retry_is_accepted() {
        assert_eq!(config(4.0, 3.0, 0.5).validate(), Ok(()));
        assert_eq!(config(15.0, 2.41, 2.0).validate(), Ok(()));
    }

    // client-go: TestLeaderElectionConfigValidation ("Lock identity is empty").
    #[test]
    fn empty_identity_is_rejected() {
        let err = validate_identity("test", "").unwrap_err();
        assert_eq!(
            err,
            ConfigError::EmptyIdentity {
                name: "test".into()
            }
        );
        assert_eq!(
            err.to_string(),
            "leader election \"test\": lock identity is empty"
        );
        assert!(validate_identity("test", "  ").is_err());
        assert_eq!(validate_identity("test", "pod-a"), Ok(()));
    }

    #[test]
    fn error_message_names_the_values() {
        let msg = config(10.0, 10.0, 1.0).validate().unwrap_err().to_string();
        assert!(
            msg.contains("lease_duration (10s)") && msg.contains("renew_deadline (10s)"),
            "{msg}"
        );
    }
}
