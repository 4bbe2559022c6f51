use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube_client::core::ObjectMeta;
use parking_lot::Mutex;
use tokio::time::Instant;

use super::*;
use crate::cache::{InformerConfig, SharedIndexInformer};
use crate::leaderelection::fake_lock::{FakeLockStore, Reach};
use crate::leaderelection::{LeaderElectionConfig, LeaderElector};
use crate::runtime::{QueueFairness, default_error_policy};
use crate::testing::FakeControllerSource;
use crate::testing::settle;

fn cm(name: &str) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            namespace: Some("ns".into()),
            name: Some(name.into()),
            uid: Some(format!("uid-{name}")),
            ..Default::default()
        },
        ..Default::default()
    }
}

fn informer<K: CacheObject>(source: &FakeControllerSource<K>) -> SharedIndexInformer<K>
where
    FakeControllerSource<K>: crate::cache::ListerWatcher<K>,
{
    SharedIndexInformer::new(source.clone(), InformerConfig::default())
}

/// Every reconcile: (key, start, end) on the paused clock.
#[derive(Clone, Default)]
struct Log(Arc<Mutex<Vec<Entry>>>);

/// (key, started, ended).
type Entry = (String, Instant, Option<Instant>);

impl Log {
    fn keys(&self) -> Vec<String> {
        self.0.lock().iter().map(|(k, _, _)| k.clone()).collect()
    }
    fn start(&self, key: &str) -> usize {
        let mut log = self.0.lock();
        log.push((key.to_string(), Instant::now(), None));
        log.len() - 1
    }
    fn end(&self, i: usize) {
        self.0.lock()[i].2 = Some(Instant::now());
    }
}

/// A reconcile that records itself and takes `work` (returning early, with an error, if
/// its context is cancelled and `honours_cancel`).
fn recording(
    log: Log,
    work: Duration,
    honours_cancel: bool,
) -> impl Fn(ObjectKey, ReconcileContext) -> futures::future::BoxFuture<'static, Result<Action, String>>
+ Send
+ Sync
+ 'static {
    move |key: ObjectKey, ctx| {
        let log = log.clone();
        Box::pin(async move {
            let i = log.start(key.as_str());
            let result = if honours_cancel {
                tokio::select! {
                    _ = ctx.cancelled() => Err("cancelled".to_string()),
                    _ = tokio::time::sleep(work) => Ok(Action::Done),
                }
            } else {
                tokio::time::sleep(work).await;
                Ok(Action::Done)
            };
            log.end(i);
            result
        })
    }
}

#[tokio::test(start_paused = true)]
async fn primary_owned_and_watched_events_each_reconcile_the_right_key() {
    let primary = FakeControllerSource::<ConfigMap>::new();
    let owned = FakeControllerSource::<Secret>::new();
    primary.add(cm("a"));
    primary.add(cm("b"));
    let log = Log::default();
    let watched_map = |s: &Secret| {
        s.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("for"))
            .map(|name| vec![ObjectKey::new("ns", name)])
            .unwrap_or_default()
    };
    let controller = Controller::new("test", informer(&primary))
        .owns(informer(&owned))
        .watches(informer(&owned), watched_map);
    let ready = controller.readiness();
    let shutdown = CancellationToken::new();
    let run = tokio::spawn(controller.run(
        recording(log.clone(), Duration::from_millis(1), true),
        default_error_policy,
        shutdown.clone(),
    ));
    settle().await;
    assert!(ready.load(Ordering::SeqCst), "ready once the caches synced");
    let mut first = log.keys();
    first.sort();
    assert_eq!(
        first,
        ["ns/a", "ns/b"],
        "the initial list reconciles every primary"
    );

    // An owned Secret whose controller is ConfigMap a: a's key.
    let mut secret = Secret {
        metadata: ObjectMeta {
            namespace: Some("ns".into()),
            name: Some("s".into()),
            owner_references: Some(vec![OwnerReference {
                api_version: "v1".into(),
                kind: "ConfigMap".into(),
                name: "a".into(),
                uid: "uid-a".into(),
                controller: Some(true),
                ..Default::default()
            }]),
            ..Default::default()
        },
        ..Default::default()
    };
    owned.add(secret.clone());
    settle().await;
    assert_eq!(log.keys()[2..], ["ns/a"]);
    // Owned by an uncached ConfigMap, or by another kind: nothing.
    secret.metadata.name = Some("t".into());
    secret.metadata.owner_references.as_mut().unwrap()[0].name = "gone".into();
    owned.add(secret.clone());
    secret.metadata.name = Some("u".into());
    secret.metadata.owner_references.as_mut().unwrap()[0] = OwnerReference {
        api_version: "apps/v1".into(),
        kind: "ConfigMap".into(),
        name: "a".into(),
        controller: Some(true),
        ..Default::default()
    };
    owned.add(secret.clone());
    settle().await;
    assert_eq!(log.keys().len(), 3);
    // The watch mapping: a Secret labelled for b.
    let mut labelled = Secret::default();
    labelled.metadata.namespace = Some("ns".into());
    labelled.metadata.name = Some("l".into());
    labelled.metadata.labels = Some(BTreeMap::from([("for".into(), "b".into())]));
    owned.add(labelled);
    settle().await;
    assert_eq!(log.keys()[3..], ["ns/b"]);
    // A primary deletion reconciles its key by default.
    primary.delete(cm("a"));
    settle().await;
    assert_eq!(log.keys()[4..], ["ns/a"]);

    shutdown.cancel();
    run.await.unwrap().unwrap();
    assert!(
        !ready.load(Ordering::SeqCst),
        "not ready once shutdown started"
    );
}

#[tokio::test(start_paused = true)]
async fn with_a_requeue_lane_event_work_never_waits_behind_timed_requeues_and_no_key_runs_twice_at_once()
 {
    // 40 keys that ask to come back every second, each reconcile taking 100 ms: 4 s of
    // periodic work per second, far more than the lane's 2 workers do. A new key's event
    // must still be reconciled at once, not behind that backlog.
    let primary = FakeControllerSource::<ConfigMap>::new();
    for i in 0..40 {
        primary.add(cm(&format!("p{i}")));
    }
    let log = Log::default();
    let recorder = log.clone();
    let reconcile = move |key: ObjectKey, _ctx: ReconcileContext| {
        let log = recorder.clone();
        Box::pin(async move {
            let i = log.start(key.as_str());
            tokio::time::sleep(Duration::from_millis(100)).await;
            log.end(i);
            if key.name().starts_with('p') {
                Ok(Action::RequeueAfter(Duration::from_secs(1)))
            } else {
                Ok::<_, String>(Action::Done)
            }
        }) as futures::future::BoxFuture<'static, Result<Action, String>>
    };
    let controller = Controller::new("test", informer(&primary))
        .workers(2)
        .requeue_lane(2);
    let shutdown = CancellationToken::new();
    let run = tokio::spawn(controller.run(reconcile, default_error_policy, shutdown.clone()));
    // The initial 40 go through the main lane (2 s), then keep the requeue lane busy.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let added = Instant::now();
    primary.add(cm("new"));
    tokio::time::sleep(Duration::from_secs(1)).await;
    let entries = log.0.lock().clone();
    let (_, started, ended) = entries
        .iter()
        .find(|(k, _, _)| k == "ns/new")
        .expect("the new key was reconciled")
        .clone();
    assert!(
        started - added < Duration::from_millis(20),
        "the new key waited {:?} behind timed requeues",
        started - added
    );
    assert!(ended.is_some());
    // Timed requeues ran in their own lane meanwhile (at most 2 at once: 20 a second).
    let requeued = entries
        .iter()
        .filter(|(k, s, _)| k.starts_with("ns/p") && *s > added)
        .count();
    assert!(
        (15..=21).contains(&requeued),
        "{requeued} timed requeues in the second after the add"
    );
    // No key was ever in two reconciles at once.
    let mut by_key: std::collections::HashMap<&str, Vec<(Instant, Instant)>> = Default::default();
    for (k, s, e) in &entries {
        by_key
            .entry(k.as_str())
            .or_default()
            .push((*s, e.unwrap_or(Instant::now())));
    }
    for (key, mut spans) in by_key {
        spans.sort();
        for w in spans.windows(2) {
            assert!(w[0].1 <= w[1].0, "{key} reconciled twice at once: {w:?}");
        }
    }
    shutdown.cancel();
    run.await.unwrap().unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_timed_requeue_of_a_key_in_reconcile_waits_for_it_and_errors_go_to_the_rate_limiter() {
    // Key a asks back after 50 ms and takes 10 ms; an update event at 55 ms makes the main
    // lane reconcile it while (or just after) the requeue lane does: never at once. Key b
    // fails once: its retry comes from the controller's queue with backoff.
    let primary = FakeControllerSource::<ConfigMap>::new();
    primary.add(cm("a"));
    primary.add(cm("b"));
    let log = Log::default();
    let recorder = log.clone();
    let failures = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let failed = failures.clone();
    let reconcile = move |key: ObjectKey, _ctx: ReconcileContext| {
        let log = recorder.clone();
        let failed = failed.clone();
        Box::pin(async move {
            let i = log.start(key.as_str());
            tokio::time::sleep(Duration::from_millis(10)).await;
            log.end(i);
            match key.as_str() {
                "ns/a" => Ok(Action::RequeueAfter(Duration::from_millis(50))),
                _ if failed.fetch_add(1, Ordering::SeqCst) == 0 => Err("boom".to_string()),
                _ => Ok(Action::Done),
            }
        }) as futures::future::BoxFuture<'static, Result<Action, String>>
    };
    let controller = Controller::new("test", informer(&primary))
        .workers(1)
        .requeue_lane(1);
    let shutdown = CancellationToken::new();
    let run = tokio::spawn(controller.run(reconcile, default_error_policy, shutdown.clone()));
    tokio::time::sleep(Duration::from_millis(65)).await;
    let mut a = cm("a");
    a.data = Some(BTreeMap::from([("k".into(), "v".into())]));
    primary.modify(a);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let entries = log.0.lock().clone();
    let a_spans: Vec<(Instant, Instant)> = entries
        .iter()
        .filter(|(k, _, _)| k == "ns/a")
        .map(|(_, s, e)| (*s, e.unwrap_or(Instant::now())))
        .collect();
    assert!(a_spans.len() >= 5, "{a_spans:?}");
    for w in a_spans.windows(2) {
        assert!(w[0].1 <= w[1].0, "a reconciled twice at once: {w:?}");
    }
    let b_runs = entries.iter().filter(|(k, _, _)| k == "ns/b").count();
    assert_eq!(b_runs, 2, "b failed once and was retried once");
    shutdown.cancel();
    run.await.unwrap().unwrap();
}

#[tokio::test(start_paused = true)]
async fn an_update_filter_and_enqueue_deletes_off_keep_those_events_out() {
    let primary = FakeControllerSource::<ConfigMap>::new();
    primary.add(cm("a"));
    let log = Log::default();
    let controller = Controller::new("test", informer(&primary))
        .update_filter(|old: &ConfigMap, new: &ConfigMap| old.data != new.data)
        .enqueue_deletes(false);
    let shutdown = CancellationToken::new();
    let run = tokio::spawn(controller.run(
        recording(log.clone(), Duration::from_millis(1), true),
        default_error_policy,
        shutdown.clone(),
    ));
    settle().await;
    let mut labelled = cm("a");
    labelled.metadata.labels = Some(BTreeMap::from([("x".into(), "y".into())]));
    primary.modify(labelled.clone());
    settle().await;
    assert_eq!(
        log.keys(),
        ["ns/a"],
        "a label change does not pass the filter"
    );
    labelled.data = Some(BTreeMap::from([("k".into(), "v".into())]));
    primary.modify(labelled.clone());
    settle().await;
    assert_eq!(log.keys(), ["ns/a", "ns/a"], "a data change does");
    primary.delete(labelled);
    settle().await;
    assert_eq!(log.keys().len(), 2, "deletes are not enqueued");
    shutdown.cancel();
    run.await.unwrap().unwrap();
}

#[tokio::test(start_paused = true)]
async fn the_error_policy_decides_between_backoff_fixed_delay_and_drop() {
    let primary = FakeControllerSource::<ConfigMap>::new();
    for name in ["backoff", "fixed", "drop"] {
        primary.add(cm(name));
    }
    let calls = Arc::new(Mutex::new(BTreeMap::<ObjectKey, Vec<Instant>>::new()));
    let c = calls.clone();
    let reconcile = move |key: ObjectKey, _ctx: ReconcileContext| {
        let c = c.clone();
        async move {
            c.lock()
                .entry(key.clone())
                .or_default()
                .push(Instant::now());
            Err::<Action, _>(key.to_string())
        }
    };
    let policy = |_: &String, key: &ObjectKey, retries: u32| match key.as_str() {
        "ns/fixed" => ErrorAction::RequeueAfter(Duration::from_secs(10)),
        "ns/drop" => ErrorAction::Drop,
        _ => {
            assert!(retries < 100);
            ErrorAction::RateLimited
        }
    };
    let controller = Controller::new("test", informer(&primary));
    let shutdown = CancellationToken::new();
    let run = tokio::spawn(controller.run(reconcile, policy, shutdown.clone()));
    tokio::time::sleep(Duration::from_secs(25)).await;
    shutdown.cancel();
    run.await.unwrap().unwrap();
    let calls = calls.lock();
    assert_eq!(calls["ns/drop"].len(), 1, "dropped after one failure");
    assert_eq!(calls["ns/fixed"].len(), 3, "at 0, 10 and 20 s");
    // 5 ms doubling: 0, 5, 15, 35, ... ms; 13 attempts by 25 s (5 ms * 2^12 = 20 s).
    assert!(
        (12..=14).contains(&calls["ns/backoff"].len()),
        "{:?}",
        calls["ns/backoff"].len()
    );
}

#[tokio::test(start_paused = true)]
async fn shutdown_drains_queued_and_in_flight_keys() {
    let primary = FakeControllerSource::<ConfigMap>::new();
    for i in 0..10 {
        primary.add(cm(&format!("c{i}")));
    }
    let log = Log::default();
    let controller = Controller::new("test", informer(&primary)).workers(2);
    let shutdown = CancellationToken::new();
    let run = tokio::spawn(controller.run(
        recording(log.clone(), Duration::from_secs(1), false),
        default_error_policy,
        shutdown.clone(),
    ));
    tokio::time::sleep(Duration::from_millis(1500)).await;
    shutdown.cancel();
    run.await.unwrap().unwrap();
    let log = log.0.lock();
    assert_eq!(
        log.len(),
        10,
        "every queued key was reconciled before stopping"
    );
    assert!(
        log.iter().all(|(_, _, end)| end.is_some()),
        "none was cut off"
    );
}

/// One worker, a second's work each, ten keys of `busy` queued before one of `quiet`: with
/// the default fairness `quiet`'s key is the second reconciled (the trace says under which
/// key it was handed out), with fairness off the last.
#[tokio::test(start_paused = true)]
async fn by_default_one_namespace_s_flood_does_not_hold_back_another_s_key() {
    for (fairness, quiet_at) in [(None, 1), (Some(QueueFairness::Off), 10)] {
        let primary = FakeControllerSource::<ConfigMap>::new();
        let log = Log::default();
        let mut controller = Controller::new("test", informer(&primary)).workers(1);
        if let Some(fairness) = fairness.clone() {
            controller = controller.fairness(fairness);
        }
        let shutdown = CancellationToken::new();
        let run = tokio::spawn(controller.run(
            recording(log.clone(), Duration::from_secs(1), false),
            default_error_policy,
            shutdown.clone(),
        ));
        settle().await;
        let in_ns = |ns: &str, name: &str| {
            let mut object = cm(name);
            object.metadata.namespace = Some(ns.into());
            object
        };
        for i in 0..10 {
            primary.add(in_ns("fair-busy", &format!("b{i}")));
        }
        // A key of this test's own, followed process-wide.
        let quiet = format!("fair-quiet-{quiet_at}/q");
        crate::trace::follow([quiet.as_str()]).unwrap();
        primary.add(in_ns(&format!("fair-quiet-{quiet_at}"), "q"));
        tokio::time::sleep(Duration::from_secs(15)).await;
        shutdown.cancel();
        run.await.unwrap().unwrap();
        let keys = log.keys();
        assert_eq!(keys.len(), 11, "{keys:?}");
        assert_eq!(
            keys.iter().position(|k| *k == quiet),
            Some(quiet_at),
            "fairness {fairness:?}: {keys:?}"
        );
        let took = crate::trace::timeline(&quiet)
            .unwrap()
            .into_iter()
            .find(|s| s.stage == crate::trace::Stage::WorkerTook)
            .expect("the worker's step");
        let under = format!("fairness key fair-quiet-{quiet_at}");
        assert_eq!(took.detail.contains(&under), fairness.is_none(), "{took:?}");
    }
}

/// lease 4 s, renew deadline 3 s, retry 0.5 s: fence = last renew + 3.5 s.
fn election() -> LeaderElectionConfig {
    LeaderElectionConfig {
        lease_duration: Duration::from_secs(4),
        renew_deadline: Duration::from_secs(3),
        retry_period: Duration::from_millis(500),
        release_on_cancel: true,
        recontend: true,
        name: "ns/test".into(),
    }
}

#[tokio::test(start_paused = true)]
async fn a_standby_keeps_its_cache_warm_and_reconciles_only_once_it_leads() {
    let primary = FakeControllerSource::<ConfigMap>::new();
    primary.add(cm("a"));
    let store = FakeLockStore::new();
    // Someone else holds the lease and keeps it until we cut them off.
    let other = LeaderElector::new(election(), store.lock_for("other")).unwrap();
    let other_stop = CancellationToken::new();
    let other_run = tokio::spawn({
        let stop = other_stop.clone();
        async move {
            other
                .run(
                    crate::leaderelection::LeaderCallbacks::new(|_| async {}, || {}),
                    stop,
                )
                .await
        }
    });
    settle().await;
    assert_eq!(store.holder(), "other");

    let log = Log::default();
    let elector = LeaderElector::new(election(), store.lock_for("me")).unwrap();
    let controller = Controller::new("test", informer(&primary)).leader_election(elector);
    let ready = controller.readiness();
    let lister = controller.primary_lister();
    let shutdown = CancellationToken::new();
    let run = tokio::spawn(controller.run(
        recording(log.clone(), Duration::from_millis(1), true),
        default_error_policy,
        shutdown.clone(),
    ));
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert!(
        ready.load(Ordering::SeqCst),
        "a standby is ready once its caches synced"
    );
    assert!(lister.get("ns", "a").is_some(), "and its cache is warm");
    assert!(log.keys().is_empty(), "but it reconciles nothing");

    // The leader dies (stops renewing without releasing): we take over after the lease.
    store.set_reach("other", Reach::Hang);
    let died = Instant::now();
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert_eq!(store.holder(), "me");
    let first = log.0.lock()[0].1;
    assert!(
        first - died <= Duration::from_millis(5000),
        "took over within lease + retry"
    );
    assert_eq!(log.keys(), ["ns/a"]);
    other_stop.cancel();
    let _ = other_run.await;
    shutdown.cancel();
    run.await.unwrap().unwrap();
    assert_eq!(store.holder(), "", "released on shutdown");
}

#[tokio::test(start_paused = true)]
async fn losing_the_lease_cancels_in_flight_reconciles_and_ends_them_before_anyone_can_acquire() {
    let primary = FakeControllerSource::<ConfigMap>::new();
    primary.add(cm("obeys"));
    primary.add(cm("ignores"));
    let store = FakeLockStore::new();
    let log = Log::default();
    let elector = LeaderElector::new(election(), store.lock_for("me")).unwrap();
    let controller = Controller::new("test", informer(&primary))
        .workers(2)
        .leader_election(elector);
    let shutdown = CancellationToken::new();
    // "ns/obeys" returns when cancelled; "ns/ignores" never looks at its context.
    let l = log.clone();
    let reconcile = move |key: ObjectKey, ctx: ReconcileContext| {
        let l = l.clone();
        async move {
            let i = l.start(key.as_str());
            if key == "ns/obeys" {
                ctx.cancelled().await;
            } else {
                tokio::time::sleep(Duration::from_secs(3600)).await;
            }
            l.end(i);
            Err::<Action, _>("cancelled".to_string())
        }
    };
    let run = tokio::spawn(controller.run(reconcile, default_error_policy, shutdown.clone()));
    settle().await;
    assert_eq!(store.holder(), "me");
    assert_eq!(log.keys().len(), 2, "both reconciles started");

    // The apiserver goes away: renewals fail from now on.
    store.set_reach("me", Reach::Refuse);
    let cut = Instant::now();
    // Another candidate comes up and takes the lease as soon as it may.
    let rival = LeaderElector::new(election(), store.lock_for("rival")).unwrap();
    let rival_started = Arc::new(Mutex::new(None::<Instant>));
    let rs = rival_started.clone();
    let rival_stop = CancellationToken::new();
    let rival_run = tokio::spawn({
        let stop = rival_stop.clone();
        async move {
            rival
                .run(
                    crate::leaderelection::LeaderCallbacks::new(
                        move |_| {
                            *rs.lock() = Some(Instant::now());
                            async {}
                        },
                        || {},
                    ),
                    stop,
                )
                .await
        }
    });
    tokio::time::sleep(Duration::from_secs(10)).await;
    let rival_led = rival_started.lock().expect("the rival acquired");
    let log = log.0.lock().clone();
    let obeys = log.iter().find(|(k, _, _)| k == "ns/obeys").unwrap();
    let end = obeys.2.expect("the cancelled reconcile returned");
    assert!(
        end - cut <= Duration::from_secs(3),
        "cancelled by the renew deadline: {:?}",
        end - cut
    );
    let ignores = log.iter().find(|(k, _, _)| k == "ns/ignores").unwrap();
    assert!(
        ignores.2.is_none(),
        "the stubborn one was dropped, never finished"
    );
    assert!(rival_led > end, "no successor before every reconcile ended");
    // Nothing of ours runs after the rival leads: the dropped future is gone.
    assert!(
        rival_led - cut >= Duration::from_secs(3),
        "{:?}",
        rival_led - cut
    );
    rival_stop.cancel();
    let _ = rival_run.await;
    shutdown.cancel();
    let _ = run.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_key_whose_term_ends_while_it_waits_for_its_caches_is_not_reconciled_in_that_term() {
    // The first reconcile of "a" reports a write the cache never catches up with, so the
    // next one waits (read-your-writes, up to 5 s). The Lease is lost meanwhile: when the
    // wait ends with the term, the reconcile must not start; the key is left for the next
    // leader.
    let primary = FakeControllerSource::<ConfigMap>::new();
    primary.add(cm("a"));
    let store = FakeLockStore::new();
    let elector = LeaderElector::new(election(), store.lock_for("me")).unwrap();
    let controller = Controller::new("test", informer(&primary)).leader_election(elector);
    // (when called, whether its context was entitled then)
    let calls = Arc::new(Mutex::new(Vec::<(Instant, bool)>::new()));
    let c = calls.clone();
    let reconcile = move |key: ObjectKey, ctx: ReconcileContext| {
        c.lock().push((Instant::now(), ctx.is_entitled()));
        let first = c.lock().len() == 1;
        async move {
            if first {
                let mut written = cm(key.name());
                written.metadata.resource_version = Some("1000000".into());
                ctx.wrote(&written);
            }
            Ok::<_, String>(Action::RequeueAfter(Duration::from_secs(1)))
        }
    };
    let shutdown = CancellationToken::new();
    let run = tokio::spawn(controller.run(reconcile, default_error_policy, shutdown.clone()));
    settle().await;
    assert_eq!(store.holder(), "me");
    // The requeue after 1 s finds the cache behind the write: the worker waits.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert_eq!(
        calls.lock().len(),
        1,
        "the second reconcile waits for the cache"
    );
    store.set_reach("me", Reach::Refuse);
    tokio::time::sleep(Duration::from_secs(10)).await;
    let calls = calls.lock().clone();
    assert!(
        calls.iter().all(|(_, entitled)| *entitled),
        "a reconcile started after its term ended: {calls:?}"
    );
    shutdown.cancel();
    let _ = run.await.unwrap();
}

// controller-runtime: TestController "should return an error if there is an error waiting
// for the informers" (CacheSyncTimeout), with the cause named.
#[tokio::test(start_paused = true)]
async fn a_cache_that_never_syncs_fails_the_start_after_the_timeout_naming_it_and_its_error() {
    let primary = FakeControllerSource::<ConfigMap>::new();
    let refused = FakeControllerSource::<Secret>::new();
    refused.set_list_error(Some("secrets is forbidden: User \"u\" cannot list"));
    let started = Instant::now();
    let controller = Controller::new("refused", informer(&primary))
        .watches(informer(&refused), |_: &Secret| Vec::new())
        .cache_sync_timeout(Duration::from_secs(10));
    assert_eq!(
        Controller::new("defaults", informer(&primary))
            .options
            .cache_sync_timeout,
        Duration::from_secs(120),
        "controller-runtime's default"
    );
    let reconcile = |_: ObjectKey, _: ReconcileContext| async { Ok::<_, String>(Action::Done) };
    let err = controller
        .run(reconcile, default_error_policy, CancellationToken::new())
        .await
        .unwrap_err();
    assert_eq!(started.elapsed(), Duration::from_secs(10));
    let ControllerError::CacheSyncTimeout { not_synced, .. } = &err else {
        panic!("{err}");
    };
    assert_eq!(not_synced.len(), 1, "{err}");
    assert_eq!(
        not_synced[0].resource,
        crate::cache::ListerWatcher::type_description(&refused)
    );
    assert!(
        not_synced[0]
            .last_error
            .as_deref()
            .is_some_and(|e| e.contains("403") || e.contains("forbidden")),
        "{err}"
    );
    assert!(err.to_string().contains("secrets is forbidden"), "{err}");
}
