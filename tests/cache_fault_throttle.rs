//! Faults in the watch itself, against the real apiserver, injected by the harness's
//! [`HttpFaultProxy`] between the informer and the apiserver: the proxy terminates TLS, forwards
//! every request to the apiserver, and can answer a watch with 429 or replace an event line of
//! an open watch stream. Every LIST, WATCH and event that is not the injected fault is the
//! apiserver's own, over HTTP, through kubeloop's real `ListWatch`; the proxy's request log
//! says what went over the wire and when.
//!
//! - 429 with `Retry-After: 2` on re-opening a watch, twice: each re-open comes no earlier
//!   than 2 s after the 429, from the same resourceVersion, without a LIST or a second
//!   streaming list (client-go: TestNoRelistOnTooManyRequests, here end to end), and the
//!   informer then follows changes. Run twice: with kube-client's retry layer off, every 429
//!   reaches the reflector, which waits out `Retry-After` itself; with it on (kube-client's
//!   default), kube-client retries after `Retry-After` below the reflector, as client-go's
//!   rest client does, and the reflector never sees the 429.
//! - An event line that does not decode ends the watch and the reflector relists (client-go's
//!   StreamWatcher reports a decode failure as an error and stops), so the change the event
//!   carried is not lost: the cache equals the server afterwards. The reflector's default
//!   list is the streaming list, so the relist is a second `sendInitialEvents` watch, not a
//!   LIST.

use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube_client::Client;
use kube_client::api::{Api, PostParams};
use kubeloop::cache::{
    BackoffConfig, CacheMetrics, InformerConfig, ListWatch, ReflectorConfig, SharedIndexInformer,
};
use kubeloop::testing::eventually;
use kubeloop_testenv::informer::{Checker, assert_converges, configmap, seed_configmaps};
use kubeloop_testenv::{self as testenv, HttpFaultProxy, ProxiedRequest, RequestKind};

/// Backoff well under the 2 s the throttled answers ask for, so a reflector that ignored
/// `Retry-After` would re-open the watch sooner and fail the test.
fn fast_backoff() -> ReflectorConfig {
    ReflectorConfig {
        backoff: BackoffConfig {
            initial: Duration::from_millis(200),
            max: Duration::from_secs(2),
            factor: 2.0,
            jitter: 0.0,
            reset_after: Duration::from_secs(120),
        },
        ..Default::default()
    }
}

/// An informer on the ConfigMaps of `ns`, listing and watching through `proxy`, with or
/// without kube-client's retry layer (`Config::default_retry`).
fn informer_via(
    cluster: &testenv::Cluster,
    proxy: &HttpFaultProxy,
    ns: &str,
    metrics: &CacheMetrics,
    kube_client_retry: bool,
) -> (SharedIndexInformer<ConfigMap>, String) {
    let mut config = cluster.client_config_via(proxy.addr());
    config.default_retry = kube_client_retry;
    let via_proxy = Client::try_from(config).unwrap();
    let lw = ListWatch::<ConfigMap>::namespaced(via_proxy, ns);
    let path = lw.path().to_string();
    let informer = SharedIndexInformer::new(
        lw,
        InformerConfig {
            reflector: fast_backoff(),
            metrics: metrics.clone(),
            ..Default::default()
        },
    );
    (informer, path)
}

fn watches_of(proxy: &HttpFaultProxy, path: &str) -> Vec<ProxiedRequest> {
    proxy
        .requests()
        .into_iter()
        .filter(|r| r.path == path && r.kind == RequestKind::Watch)
        .collect()
}

// Every 429 reaches kubeloop's ListWatch and the reflector, which must wait out Retry-After.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_throttled_watch_is_reopened_by_the_reflector_after_retry_after_without_a_relist() {
    let errors = throttled_watch_is_reopened(false).await;
    assert_eq!(errors.len(), 2, "the reflector saw both 429s: {errors:?}");
    assert!(errors.iter().all(|e| e.contains("429")), "{errors:?}");
}

// With kube-client's retry layer on (its default), the 429s are retried below the reflector,
// as client-go's rest client retries them below its reflector: the same requests on the
// wire, and the reflector never sees them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_kube_clients_retry_a_throttled_watch_is_retried_below_the_reflector() {
    let errors = throttled_watch_is_reopened(true).await;
    assert!(errors.is_empty(), "{errors:?}");
}

/// Two 429s with Retry-After: 2 on re-opening a watch; the watch is re-opened no sooner
/// than 2 s after each, from the same version, with no LIST and no second streaming list,
/// and the informer then follows changes. Returns what the watch error handler was told.
async fn throttled_watch_is_reopened(kube_client_retry: bool) -> Vec<String> {
    let cluster = testenv::shared().await;
    let client = cluster.client().await.unwrap();
    let ns = cluster.new_namespace("cache-throttle").await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    seed_configmaps(&api, "pre", 20).await;

    let proxy = HttpFaultProxy::start(cluster).await.unwrap();
    let metrics = CacheMetrics::new();
    let (informer, path) = informer_via(cluster, &proxy, &ns, &metrics, kube_client_retry);
    let checker = Checker::default();
    informer.add_event_handler(checker.clone()).unwrap();
    let errors = std::sync::Arc::new(parking_lot::Mutex::new(Vec::<String>::new()));
    let e = errors.clone();
    informer
        .set_watch_error_handler(move |err| e.lock().push(err.to_string()))
        .unwrap();
    informer.start();
    assert!(informer.wait_for_cache_sync().await);
    let synced = watches_of(&proxy, &path);
    assert!(
        synced.len() == 1 && synced[0].is_streaming_list(),
        "the informer synced with one streaming list: {synced:?}"
    );
    assert_eq!(proxy.lists(&path), 0);

    // The next two watches of the path are answered 429 with Retry-After: 2. Cutting the
    // connections ends the open watch, so the reflector re-opens it at once and meets them.
    proxy.throttle_watches(&path, 2, 2);
    proxy.cut_all();
    eventually(
        "the watch to be re-opened after two 429s",
        Duration::from_secs(30),
        || async {
            let n = proxy.watches(&path);
            if n >= 2 {
                Ok(())
            } else {
                Err(format!("{n} watches forwarded"))
            }
        },
    )
    .await;
    for i in 0..5 {
        api.create(
            &PostParams::default(),
            &configmap(&format!("during-{i}"), &[], "x"),
        )
        .await
        .unwrap();
    }
    assert_converges(
        &client,
        &ns,
        &informer.indexer(),
        &checker,
        Duration::from_secs(30),
    )
    .await;

    let watches = watches_of(&proxy, &path);
    assert!(watches.len() >= 4, "{watches:#?}");
    let (throttled, reopened) = (&watches[1..3], &watches[3]);
    assert!(
        throttled.iter().all(|w| w.throttled && w.status == 429),
        "{watches:#?}"
    );
    assert!(
        !reopened.throttled && reopened.status == 200,
        "{reopened:?}"
    );
    for w in &watches[1..4] {
        assert!(!w.is_streaming_list(), "a plain watch, not a relist: {w:?}");
        assert_eq!(
            w.param("resourceVersion"),
            throttled[0].param("resourceVersion"),
            "every attempt resumes from the same version"
        );
    }
    assert!(
        throttled[0]
            .param("resourceVersion")
            .is_some_and(|rv| !rv.is_empty())
    );
    for pair in watches[1..4].windows(2) {
        let gap = pair[1].at - pair[0].at;
        assert!(
            gap >= Duration::from_secs(2),
            "a watch re-opened {gap:?} after a 429 with Retry-After: 2"
        );
    }
    assert_eq!(
        proxy.lists(&path),
        0,
        "a 429 on the watch must not cause a LIST"
    );
    assert_eq!(
        watches.iter().filter(|w| w.is_streaming_list()).count(),
        1,
        "nor a second streaming list"
    );
    let m = metrics.reflector("v1/configmaps");
    assert_eq!((m.lists(), m.relists()), (1, 0));
    assert!(
        checker.violations().is_empty(),
        "{:?}",
        checker.violations()
    );
    informer.shutdown().await;
    errors.lock().clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_undecodable_event_ends_the_watch_and_the_reflector_relists() {
    let cluster = testenv::shared().await;
    let client = cluster.client().await.unwrap();
    let ns = cluster.new_namespace("cache-undecodable").await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    seed_configmaps(&api, "pre", 20).await;

    let proxy = HttpFaultProxy::start(cluster).await.unwrap();
    let metrics = CacheMetrics::new();
    let (informer, path) = informer_via(cluster, &proxy, &ns, &metrics, true);
    let checker = Checker::default();
    informer.add_event_handler(checker.clone()).unwrap();
    let errors = std::sync::Arc::new(parking_lot::Mutex::new(Vec::<String>::new()));
    let e = errors.clone();
    informer
        .set_watch_error_handler(move |err| e.lock().push(err.to_string()))
        .unwrap();
    informer.start();
    assert!(informer.wait_for_cache_sync().await);
    assert_eq!(metrics.reflector("v1/configmaps").lists(), 1);
    assert_eq!(watches_of(&proxy, &path).len(), 1);

    // The event for `lost` arrives as a line that is not an event: skipping it would lose
    // the object for good.
    proxy.corrupt_watch_events(&path, 1);
    api.create(&PostParams::default(), &configmap("lost", &[], "x"))
        .await
        .unwrap();
    for i in 0..3 {
        api.create(
            &PostParams::default(),
            &configmap(&format!("after-{i}"), &[], "x"),
        )
        .await
        .unwrap();
    }
    assert_converges(
        &client,
        &ns,
        &informer.indexer(),
        &checker,
        Duration::from_secs(30),
    )
    .await;
    assert!(
        informer.lister().namespaced(&ns).get("lost").is_some(),
        "the object behind the bad event"
    );
    assert!(
        errors.lock().iter().any(|e| e.contains("cannot decode")),
        "{:?}",
        errors.lock()
    );
    let m = metrics.reflector("v1/configmaps");
    assert_eq!(m.relists(), 1, "one relist after the bad event");
    // The relist is the reflector's default streaming list: a second sendInitialEvents
    // watch, from the version the cache had reached. No paged LIST, and no plain watch
    // resuming past the bad event.
    let watches = watches_of(&proxy, &path);
    assert_eq!(watches.len(), 2, "{watches:#?}");
    assert!(
        watches.iter().all(|w| w.is_streaming_list()),
        "{watches:#?}"
    );
    assert_eq!(proxy.lists(&path), 0);
    assert!(
        checker.violations().is_empty(),
        "{:?}",
        checker.violations()
    );
    informer.shutdown().await;
}
