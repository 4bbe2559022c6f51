//! Faults between the informer and the apiserver, through the harness's FaultProxy: the
//! connection is cut mid-watch (repeatedly, while objects change), then a longer outage in
//! which objects are created, changed and deleted. After each, the cache converges to exactly
//! the server's state, no handler sees an object added twice without a delete between, and
//! deletions of known objects during the outage arrive as tombstones.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube_client::Client;
use kube_client::api::Api;
use kubeloop::cache::{CacheMetrics, InformerConfig, ListWatch, SharedIndexInformer};
use kubeloop_testenv::informer::{Checker, Recording, assert_converges, churn, seed_configmaps};
use kubeloop_testenv::{self as testenv, FaultProxy};
use parking_lot::Mutex;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cut_mid_watch_and_outage_converge_with_tombstones() {
    let cluster = testenv::shared().await;
    let client = cluster.client().await.unwrap();
    let ns = cluster.new_namespace("cache-cut").await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    seed_configmaps(&api, "pre", 30).await;

    let proxy = FaultProxy::start(cluster.apiserver_addr()).await.unwrap();
    let proxied = Client::try_from(cluster.client_config_via(proxy.addr())).unwrap();
    let requests = Arc::new(Mutex::new(Vec::new()));
    let metrics = CacheMetrics::new();
    let informer = SharedIndexInformer::new(
        Recording {
            inner: ListWatch::<ConfigMap>::namespaced(proxied, &ns),
            requests: requests.clone(),
        },
        InformerConfig {
            metrics: metrics.clone(),
            ..Default::default()
        },
    );
    let checker = Checker::default();
    informer.add_event_handler(checker.clone()).unwrap();
    informer.start();
    assert!(informer.wait_for_cache_sync().await);

    // Phase 1: cut every connection a few times while objects change.
    let churner = tokio::spawn(churn(api.clone(), "cut", Duration::from_secs(4), vec![]));
    for _ in 0..4 {
        tokio::time::sleep(Duration::from_millis(900)).await;
        proxy.cut_all();
    }
    churner.await.unwrap();
    assert_converges(
        &client,
        &ns,
        &informer.indexer(),
        &checker,
        Duration::from_secs(60),
    )
    .await;
    assert!(
        checker.violations().is_empty(),
        "{:?}",
        checker.violations()
    );
    let watches_after_cuts = requests.lock().iter().filter(|r| r.verb == "WATCH").count();
    assert!(
        watches_after_cuts >= 2,
        "the watch was re-opened after the cuts: {:?}",
        requests.lock()
    );

    // Phase 2: an outage (connections cut, new ones refused) while objects are created,
    // changed and deleted, including objects the handler already knows.
    let known_before: Vec<String> = (0..10).map(|i| format!("pre-{i}")).collect();
    proxy.set_blocked(true);
    proxy.cut_all();
    // Let the proxy close the open watch before anything changes.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let deleted = churn(
        api.clone(),
        "outage",
        Duration::from_secs(3),
        known_before.clone(),
    )
    .await;
    proxy.set_blocked(false);
    assert_converges(
        &client,
        &ns,
        &informer.indexer(),
        &checker,
        Duration::from_secs(90),
    )
    .await;
    let seen = checker.snapshot();
    assert!(seen.violations.is_empty(), "{:?}", seen.violations);
    for name in &known_before {
        if deleted.contains(name) {
            let key = format!("{ns}/{name}");
            assert!(
                seen.tombstones.contains(&key),
                "{key} was deleted during the outage but did not arrive as a tombstone; log tail: {:?}",
                &seen.log[seen.log.len().saturating_sub(20)..]
            );
        }
    }
    assert!(deleted.iter().filter(|d| d.starts_with("pre-")).count() >= 5);
    let m = metrics.reflector("v1/configmaps");
    assert!(m.relists() >= 1, "the outage forced a relist");
    println!(
        "RESULT cut/outage: lists {} relists {} watches {} tombstones {}",
        m.lists(),
        m.relists(),
        m.watches(),
        checker.seen.lock().tombstones.len()
    );
    informer.shutdown().await;
}
