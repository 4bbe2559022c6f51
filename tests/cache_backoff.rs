//! A LIST that keeps failing (RBAC forbids it) backs off more and more up to the cap instead
//! of looping (kube-rs's watcher once retried a failing LIST in a tight loop; kubeloop's
//! reflector must not). Short backoff parameters
//! keep the test quick; the default values are checked by the unit tests in
//! `src/cache/backoff.rs` and `src/cache/reflector.rs`.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube_client::Client;
use kubeloop::cache::{
    BackoffConfig, CacheMetrics, InformerConfig, ListWatch, ReflectorConfig, SharedIndexInformer,
};
use kubeloop_testenv as testenv;
use kubeloop_testenv::informer::Recording;
use parking_lot::Mutex;

#[tokio::test]
async fn forbidden_list_backs_off_up_to_the_cap() {
    let cluster = testenv::shared().await;
    let ns = cluster.new_namespace("cache-forbidden").await.unwrap();
    let alice =
        Client::try_from(cluster.user_config("alice", &["kubeloop:nobody"]).unwrap()).unwrap();
    let requests = Arc::new(Mutex::new(Vec::new()));
    let metrics = CacheMetrics::new();
    let backoff = BackoffConfig {
        initial: Duration::from_millis(100),
        max: Duration::from_millis(1600),
        factor: 2.0,
        jitter: 0.0,
        reset_after: Duration::from_secs(120),
    };
    let informer = SharedIndexInformer::new(
        Recording {
            inner: ListWatch::<ConfigMap>::namespaced(alice, &ns),
            requests: requests.clone(),
        },
        InformerConfig {
            metrics: metrics.clone(),
            reflector: ReflectorConfig {
                backoff,
                ..Default::default()
            },
            ..Default::default()
        },
    );
    let errors = Arc::new(Mutex::new(Vec::<String>::new()));
    let e = errors.clone();
    informer
        .set_watch_error_handler(move |err| e.lock().push(err.to_string()))
        .unwrap();
    informer.start();
    tokio::time::sleep(Duration::from_secs(9)).await;
    informer.shutdown().await;
    assert!(!informer.has_synced());

    let reqs = requests.lock().clone();
    assert!(reqs.iter().all(|r| r.code == 403), "{reqs:?}");
    // Each round is the streaming list (a WATCH with sendInitialEvents) and, when that is
    // refused, the paged LIST it falls back to at once; the rounds are spaced by the backoff.
    assert!(
        reqs.chunks(2)
            .all(|round| round[0].verb == "WATCH" && round.get(1).is_none_or(|r| r.verb == "LIST")),
        "{reqs:?}"
    );
    let lists: Vec<_> = reqs.iter().filter(|r| r.verb == "LIST").collect();
    let gaps: Vec<Duration> = lists.windows(2).map(|w| w[1].at - w[0].at).collect();
    // 100, 200, 400, 800, 1600 ms, then the cap: 1600 ms.
    let expected_ms = [100u64, 200, 400, 800, 1600, 1600];
    assert!(
        gaps.len() >= expected_ms.len(),
        "only {} attempts: {gaps:?}",
        lists.len()
    );
    for (gap, want) in gaps.iter().zip(expected_ms) {
        assert!(
            *gap >= Duration::from_millis(want),
            "a retry came after {gap:?}, before its backoff of {want} ms: {gaps:?}"
        );
    }
    // Growing, then flat at the cap: later gaps are never shorter than the cap.
    for gap in &gaps[4..] {
        assert!(*gap >= Duration::from_millis(1600), "{gaps:?}");
    }
    assert_eq!(
        metrics.reflector("v1/configmaps").list_errors() as usize,
        reqs.len()
    );
    assert!(errors.lock()[0].contains("403"), "{:?}", errors.lock());
    println!(
        "RESULT forbidden list: {} rounds in 9 s, gaps {:?}",
        lists.len(),
        gaps.iter().map(|g| g.as_millis()).collect::<Vec<_>>()
    );
}
