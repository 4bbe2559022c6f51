//! The apiserver is restarted under a running informer while objects are created, changed
//! and deleted around the restart. The cache converges to exactly the server's state, no
//! handler sees an object added twice without a delete between, and every deletion of a
//! known object reaches the handler (as a DELETED event or a tombstone).

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube_client::api::Api;
use kubeloop::cache::{CacheMetrics, InformerConfig, ListWatch, SharedIndexInformer};
use kubeloop_testenv as testenv;
use kubeloop_testenv::informer::{Checker, Recording, assert_converges, churn, seed_configmaps};
use parking_lot::Mutex;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apiserver_restart_converges() {
    let cluster = testenv::shared().await;
    let client = cluster.client().await.unwrap();
    let ns = cluster.new_namespace("cache-restart").await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    seed_configmaps(&api, "pre", 30).await;
    let requests = Arc::new(Mutex::new(Vec::new()));
    let metrics = CacheMetrics::new();
    let informer = SharedIndexInformer::new(
        Recording {
            inner: ListWatch::<ConfigMap>::namespaced(cluster.client().await.unwrap(), &ns),
            requests: requests.clone(),
        },
        InformerConfig {
            metrics: metrics.clone(),
            ..Default::default()
        },
    );
    let checker = Checker::default();
    informer.add_event_handler(checker.clone()).unwrap();
    let errors = Arc::new(Mutex::new(Vec::<String>::new()));
    let e = errors.clone();
    informer
        .set_watch_error_handler(move |err| e.lock().push(err.to_string()))
        .unwrap();
    informer.start();
    assert!(informer.wait_for_cache_sync().await);

    let victims: Vec<String> = (0..12).map(|i| format!("pre-{i}")).collect();
    // Changes before the stop, failing while the apiserver is down, and after it is back.
    let churner = tokio::spawn(churn(
        api.clone(),
        "restart",
        Duration::from_secs(25),
        victims.clone(),
    ));
    tokio::time::sleep(Duration::from_secs(2)).await;
    cluster.stop_apiserver().await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    cluster.start_apiserver().await.unwrap();
    let deleted = churner.await.unwrap();

    assert_converges(
        &client,
        &ns,
        &informer.indexer(),
        &checker,
        Duration::from_secs(120),
    )
    .await;
    let seen = checker.snapshot();
    assert!(seen.violations.is_empty(), "{:?}", seen.violations);
    for name in victims.iter().filter(|v| deleted.contains(*v)) {
        let key = format!("{ns}/{name}");
        assert!(
            seen.tombstones.contains(&key) || seen.deletes.contains(&key),
            "deletion of {key} never reached the handler"
        );
    }
    let tombstones = seen.tombstones.len();
    // The restart was noticed: the watch was re-opened.
    let reqs = requests.lock().clone();
    assert!(
        reqs.iter().filter(|r| r.verb == "WATCH").count() >= 2,
        "{reqs:?}"
    );
    // A watch that could not connect (apiserver down: connection refused) is retried as a
    // watch after backoff, not turned into a relist.
    for pair in reqs.windows(2) {
        if pair[0].verb == "WATCH" && pair[0].code == 0 {
            assert_eq!(
                pair[1].verb, "WATCH",
                "refused watch followed by {:?}: {reqs:?}",
                pair[1]
            );
        }
    }
    assert!(
        reqs.iter().any(|r| r.verb == "WATCH" && r.code == 0),
        "the restart refused a watch: {reqs:?}"
    );
    let m = metrics.reflector("v1/configmaps");
    println!(
        "RESULT restart: lists {} relists {} watches {} tombstones {tombstones} deleted {} errors {:?}",
        m.lists(),
        m.relists(),
        m.watches(),
        deleted.len(),
        errors.lock()
    );
    informer.shutdown().await;
}
