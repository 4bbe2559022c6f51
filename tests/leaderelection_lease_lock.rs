//! `LeaseLock` against the real apiserver: resourceVersion preconditions turn a lost race into
//! a typed error, and a record survives the round trip through the API unchanged.

use kubeloop::leaderelection::{
    Clock, LeaderElectionRecord, LeaseLock, LockError, ResourceLock, SystemClock,
};
use kubeloop::testenv;

fn record(holder: &str, transitions: i32) -> LeaderElectionRecord {
    let now = SystemClock.now();
    LeaderElectionRecord {
        holder_identity: holder.into(),
        lease_duration_seconds: 15,
        acquire_time: Some(now),
        renew_time: Some(now),
        leader_transitions: transitions,
        ..Default::default()
    }
}

#[tokio::test]
async fn lease_lock_reports_lost_races_as_typed_errors() {
    let cluster = testenv::shared().await;
    let ns = cluster.new_namespace("le-lock").await.unwrap();
    let a = LeaseLock::new(cluster.client().await.unwrap(), &ns, "lock", "a");
    let b = LeaseLock::new(cluster.client().await.unwrap(), &ns, "lock", "b");
    assert_eq!(a.describe(), format!("{ns}/lock"));

    assert!(a.get().await.unwrap().is_none(), "no lease yet");
    let err = b.update(&record("b", 0)).await.unwrap_err();
    assert!(matches!(err, LockError::NotInitialized { .. }), "{err}");

    let written = record("a", 0);
    a.create(&written).await.unwrap();
    let err = b.create(&record("b", 0)).await.unwrap_err();
    assert!(matches!(err, LockError::AlreadyExists { .. }), "{err}");
    assert!(err.to_string().contains(&format!("{ns}/lock")), "{err}");

    // The record read back is exactly the one written (MicroTime keeps microseconds, and the
    // clock truncates to them).
    assert_eq!(b.get().await.unwrap(), Some(written));

    // a renews; b's update is based on the version it read before: 409, typed.
    a.update(&record("a", 0)).await.unwrap();
    let err = b.update(&record("b", 1)).await.unwrap_err();
    assert!(matches!(err, LockError::Conflict { .. }), "{err}");
    assert_eq!(b.get().await.unwrap().unwrap().holder_identity, "a");

    // After a fresh read b can write, and then a's cached version is the stale one.
    b.update(&record("b", 1)).await.unwrap();
    let err = a.update(&record("a", 0)).await.unwrap_err();
    assert!(matches!(err, LockError::Conflict { .. }), "{err}");
    let now = a.get().await.unwrap().unwrap();
    assert_eq!(
        (now.holder_identity.as_str(), now.leader_transitions),
        ("b", 1)
    );
}

#[tokio::test]
async fn lease_lock_errors_name_the_lease_when_the_namespace_is_missing() {
    let cluster = testenv::shared().await;
    let lock = LeaseLock::new(
        cluster.client().await.unwrap(),
        "no-such-namespace",
        "lock",
        "a",
    );
    let err = lock.create(&record("a", 0)).await.unwrap_err();
    assert!(matches!(err, LockError::Create { .. }), "{err}");
    assert!(err.to_string().contains("no-such-namespace/lock"), "{err}");
}
