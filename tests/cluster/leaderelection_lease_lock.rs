//! `LeaseLock` against the real apiserver: resourceVersion preconditions turn a lost race into
//! a typed error, and a record survives the round trip through the API unchanged.

use kubeloop::leaderelection::{
    Clock, LeaderElectionRecord, LeaseLock, LockError, ResourceLock, SystemClock,
};
use kubeloop_testenv as testenv;

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

/// A handover between two electors on one Lease, both recording events: "became leader" and
/// "stopped leading" are events.k8s.io/v1 Events about the Lease (client-go's leader election
/// still writes core/v1 ones, kubernetes#82846).
#[tokio::test]
async fn a_handover_is_recorded_on_events_k8s_io_v1_about_the_lease() {
    use std::time::Duration;

    use k8s_openapi::api::events::v1::Event;
    use kube_client::api::{Api, ListParams};
    use kubeloop::leaderelection::{LeaderCallbacks, LeaderElectionConfig, LeaderElector};
    use kubeloop::record::AnyEventBroadcaster;
    use tokio_util::sync::CancellationToken;

    let cluster = testenv::shared().await;
    let client = cluster.client().await.unwrap();
    let ns = cluster.new_namespace("le-events").await.unwrap();
    // Two processes' recorders: their reporting instances differ (one recorder for both
    // would merge b's "became leader" into a's series, the note not being compared).
    let (events_a, recorder_a) =
        AnyEventBroadcaster::discover(client.clone(), "le-test", "a").await;
    let (events_b, recorder_b) =
        AnyEventBroadcaster::discover(client.clone(), "le-test", "b").await;
    assert!(recorder_a.is_v1() && recorder_b.is_v1());
    let config = LeaderElectionConfig {
        lease_duration: Duration::from_secs(2),
        renew_deadline: Duration::from_millis(1500),
        retry_period: Duration::from_millis(200),
        name: "le-events".into(),
        ..LeaderElectionConfig::default()
    };
    let run = |identity: &'static str, recorder: &kubeloop::record::AnyEventRecorder| {
        let lock = LeaseLock::new(client.clone(), &ns, "lock", identity);
        let elector = LeaderElector::new(config.clone(), lock).unwrap();
        elector.record_events_to(recorder.clone());
        let (led, leading) = tokio::sync::oneshot::channel::<()>();
        let led = std::sync::Mutex::new(Some(led));
        let callbacks = LeaderCallbacks::new(
            move |ctx| {
                if let Some(led) = led.lock().unwrap().take() {
                    let _ = led.send(());
                }
                async move { ctx.cancelled().await }
            },
            || {},
        );
        let stop = CancellationToken::new();
        let task = tokio::spawn({
            let stop = stop.clone();
            async move { elector.run(callbacks, stop).await }
        });
        (stop, task, leading)
    };
    let (stop_a, a, a_leads) = run("a", &recorder_a);
    a_leads.await.unwrap();
    let (stop_b, b, b_leads) = run("b", &recorder_b);
    stop_a.cancel();
    a.await.unwrap();
    b_leads.await.unwrap();
    stop_b.cancel();
    b.await.unwrap();
    events_a.shutdown().await;
    events_b.shutdown().await;

    let listed = Api::<Event>::namespaced(client, &ns)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items;
    let mut notes: Vec<String> = listed.iter().filter_map(|e| e.note.clone()).collect();
    notes.sort();
    assert_eq!(
        notes,
        [
            "a became leader",
            "a stopped leading",
            "b became leader",
            "b stopped leading"
        ],
        "{listed:#?}"
    );
    for event in &listed {
        let lease = event.regarding.as_ref().unwrap();
        assert_eq!(
            (
                lease.kind.as_deref(),
                lease.name.as_deref(),
                lease.namespace.as_deref()
            ),
            (Some("Lease"), Some("lock"), Some(ns.as_str()))
        );
        assert!(lease.uid.is_some(), "the Lease's uid");
        assert_eq!(event.reason.as_deref(), Some("LeaderElection"));
        assert_eq!(event.type_.as_deref(), Some("Normal"));
    }
}
