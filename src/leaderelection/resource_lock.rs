//! The lock interface and the record it stores (client-go:
//! `tools/leaderelection/resourcelock/interface.go`: `Interface`, `LeaderElectionRecord`).
//!
//! Differences on purpose:
//! - `get` returns `Ok(None)` for a missing object instead of a NotFound error.
//! - Failures are a typed [`LockError`]; a resourceVersion precondition failure is
//!   [`LockError::Conflict`] (another writer won the race) and is never retried blindly: the
//!   elector re-reads the record and decides again on its next attempt.
//! - Only the Lease lock exists (client-go dropped Endpoints/ConfigMap locks in 1.24+).

use std::future::Future;

use k8s_openapi::api::coordination::v1::LeaseSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use thiserror::Error;

/// What a lock holds: the state of the election as written by the last holder.
///
/// client-go compares the raw JSON of this record to decide whether it "changed"; comparing
/// the struct is the same test (every field is part of the JSON).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LeaderElectionRecord {
    /// Identity of the holder; empty when nobody holds the lease (after a release).
    pub holder_identity: String,
    /// How long others must wait, after observing a change, before taking over.
    pub lease_duration_seconds: i32,
    /// When the current holder acquired the lease (its own wall clock; informative only).
    pub acquire_time: Option<Timestamp>,
    /// When the holder last renewed (its own wall clock; informative only, never used for
    /// expiry).
    pub renew_time: Option<Timestamp>,
    /// How many times the lease changed hands.
    pub leader_transitions: i32,
    /// Coordinated leader election fields; carried through untouched.
    pub strategy: Option<String>,
    /// Coordinated leader election fields; carried through untouched.
    pub preferred_holder: Option<String>,
}

/// A lock failure, by the phase that failed.
#[derive(Debug, Error)]
pub enum LockError {
    /// The object changed since we read it (HTTP 409 on update): another candidate wrote first.
    #[error("{lock}: lost the race, the lease was changed by another writer (409 Conflict)")]
    Conflict {
        /// The lock's description (`namespace/name`).
        lock: String,
    },
    /// Create found an object already there (HTTP 409 AlreadyExists): lost the race to create.
    #[error("{lock}: lost the race, the lease was created by another candidate (AlreadyExists)")]
    AlreadyExists {
        /// The lock's description (`namespace/name`).
        lock: String,
    },
    /// `update` before any successful `get` or `create` (client-go: "lease not initialized").
    #[error("{lock}: cannot update before the lease was read or created")]
    NotInitialized {
        /// The lock's description (`namespace/name`).
        lock: String,
    },
    /// Reading the lease failed.
    #[error("{lock}: get failed: {source}")]
    Get {
        /// The lock's description (`namespace/name`).
        lock: String,
        /// The apiserver's error.
        source: kube_client::Error,
    },
    /// Creating the lease failed for another reason than AlreadyExists.
    #[error("{lock}: create failed: {source}")]
    Create {
        /// The lock's description (`namespace/name`).
        lock: String,
        /// The apiserver's error.
        source: kube_client::Error,
    },
    /// Updating the lease failed for another reason than a conflict.
    #[error("{lock}: update failed: {source}")]
    Update {
        /// The lock's description (`namespace/name`).
        lock: String,
        /// The apiserver's error.
        source: kube_client::Error,
    },
    /// A fake lock's injected failure (unit tests only have this variant's producer).
    #[error("{lock}: unavailable: {reason}")]
    Unavailable {
        /// The lock's description (`namespace/name`).
        lock: String,
        /// The injected reason.
        reason: String,
    },
}

/// A resource the elector can take: client-go's `resourcelock.Interface`.
///
/// Implementations keep the object they last read or wrote, and `update` writes against its
/// resourceVersion, so that an update can only succeed if nobody wrote in between.
pub trait ResourceLock: Send + Sync + 'static {
    /// Reads the record; `None` if the lock object does not exist.
    fn get(&self) -> impl Future<Output = Result<Option<LeaderElectionRecord>, LockError>> + Send;
    /// Creates the lock object holding `record`.
    fn create(
        &self,
        record: &LeaderElectionRecord,
    ) -> impl Future<Output = Result<(), LockError>> + Send;
    /// Replaces the record, conditional on the object not having changed since our last read or
    /// write ([`LockError::Conflict`] otherwise).
    fn update(
        &self,
        record: &LeaderElectionRecord,
    ) -> impl Future<Output = Result<(), LockError>> + Send;
    /// True if the object returned by the last `get` is this lock's own last successful
    /// `create` or `update` (the same resourceVersion), i.e. nobody wrote since this lock did.
    ///
    /// The elector uses it to tell its own record from one that names the same identity but was
    /// written by another process (a second candidate started with the same identity, or an
    /// earlier incarnation of this one). It also compares the record itself with what it wrote,
    /// which covers a write whose answer was lost and a metadata-only change by someone else.
    fn last_read_is_own_write(&self) -> bool;
    /// This candidate's identity (non-empty; checked by the elector).
    fn identity(&self) -> &str;
    /// `namespace/name` of the lock object, for logs and errors.
    fn describe(&self) -> String;
    /// A reference to the lock object, what leader election's events are about (`None`: a
    /// lock that is no Kubernetes object, whose elector records no events). client-go: the
    /// subject of `resourcelock.Interface.RecordEvent`.
    fn reference(&self) -> Option<k8s_openapi::api::core::v1::ObjectReference> {
        None
    }
}

/// client-go: `LeaseSpecToLeaderElectionRecord`. Missing fields read as empty / zero.
pub fn lease_spec_to_record(spec: &LeaseSpec) -> LeaderElectionRecord {
    LeaderElectionRecord {
        holder_identity: spec.holder_identity.clone().unwrap_or_default(),
        lease_duration_seconds: spec.lease_duration_seconds.unwrap_or(0),
        acquire_time: spec.acquire_time.as_ref().map(|t| t.0),
        renew_time: spec.renew_time.as_ref().map(|t| t.0),
        leader_transitions: spec.lease_transitions.unwrap_or(0),
        strategy: spec.strategy.clone(),
        preferred_holder: spec.preferred_holder.clone(),
    }
}

/// client-go: `LeaderElectionRecordToLeaseSpec`. The scalar fields are always written, so a
/// released lease reads back as holder "" and duration 1 rather than as absent fields.
pub fn record_to_lease_spec(record: &LeaderElectionRecord) -> LeaseSpec {
    LeaseSpec {
        holder_identity: Some(record.holder_identity.clone()),
        lease_duration_seconds: Some(record.lease_duration_seconds),
        acquire_time: record.acquire_time.map(MicroTime),
        renew_time: record.renew_time.map(MicroTime),
        lease_transitions: Some(record.leader_transitions),
        strategy: record.strategy.clone(),
        preferred_holder: record.preferred_holder.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(micros: i64) -> Timestamp {
        Timestamp::from_microsecond(micros).unwrap()
    }

    // client-go: TestLeaseSpecToLeaderElectionRecordRoundTrip
    #[test]
    fn lease_spec_to_leader_election_record_round_trip() {
        let old_spec = LeaseSpec {
            holder_identity: Some("foo".into()),
            lease_duration_seconds: Some(10),
            acquire_time: Some(MicroTime(ts(1_700_000_000_123_456))),
            renew_time: Some(MicroTime(ts(1_700_000_005_654_321))),
            lease_transitions: Some(1),
            ..Default::default()
        };
        let old_record = lease_spec_to_record(&old_spec);
        let new_spec = record_to_lease_spec(&old_record);
        assert_eq!(old_spec, new_spec);
        let new_record = lease_spec_to_record(&new_spec);
        assert_eq!(old_record, new_record);
        assert_eq!(old_record.holder_identity, "foo");
        assert_eq!(old_record.lease_duration_seconds, 10);
        assert_eq!(old_record.leader_transitions, 1);
    }

    #[test]
    fn an_empty_spec_reads_as_an_unheld_record() {
        let r = lease_spec_to_record(&LeaseSpec::default());
        assert_eq!(r, LeaderElectionRecord::default());
        assert!(r.holder_identity.is_empty());
    }

    #[test]
    fn coordinated_election_fields_are_carried_through() {
        let spec = LeaseSpec {
            strategy: Some("OldestEmulationVersion".into()),
            preferred_holder: Some("b".into()),
            ..Default::default()
        };
        let back = record_to_lease_spec(&lease_spec_to_record(&spec));
        assert_eq!(back.strategy.as_deref(), Some("OldestEmulationVersion"));
        assert_eq!(back.preferred_holder.as_deref(), Some("b"));
    }
}
