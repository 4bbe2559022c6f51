//! The watch resumes from a resourceVersion etcd has compacted. The apiserver runs with
//! `--watch-cache=false`, so watches and lists at a version are served by etcd and a
//! compacted version is answered with 410 Gone.
//!
//! Phase 1: the informer's version is made stale by writes elsewhere plus a compaction, then
//! its connection is cut: the re-watch gets 410 and the reflector relists.
//! Phase 2: an outage during which objects are created, changed and deleted, then a
//! compaction: the relist at the last synced version gets 410 and is retried at once with
//! resourceVersion "". Both times the cache converges to the server's state, deletions of
//! known objects arrive as tombstones, and nothing is added twice.
//!
//! A compact informer (`StoreKind::Compact`) runs beside the typed one through the same
//! proxy, on enough objects to train its dictionary: its handler sees the same objects,
//! versions and tombstones, and its lister hands out objects equal to the typed one's.

mod cache_common;

use std::sync::Arc;
use std::time::Duration;

use cache_common::{Checker, Recording, assert_converges, churn, configmap, seed_configmaps};
use k8s_openapi::api::core::v1::ConfigMap;
use kube_client::Client;
use kube_client::api::{Api, PostParams};
use kubeloop::cache::{
    CacheMetrics, InformerConfig, ListWatch, ReflectorConfig, SharedIndexInformer, StoreKind,
};
use kubeloop::testenv::{Cluster, ClusterOptions, FaultProxy};
use parking_lot::Mutex;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compacted_resource_version_leads_to_a_relist_that_converges() {
    let cluster = Cluster::start(ClusterOptions {
        apiserver_args: vec!["--watch-cache=false".into()],
        ..ClusterOptions::apiserver_only()
    })
    .await
    .unwrap();
    let client = cluster.client().await.unwrap();
    let ns = cluster.new_namespace("cache-compact").await.unwrap();
    let other_ns = cluster.new_namespace("cache-compact-other").await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let other: Api<ConfigMap> = Api::namespaced(client.clone(), &other_ns);
    // Past 128 objects, so the compact store's dictionary is trained on the first list.
    seed_configmaps(&api, "pre", 150).await;

    let proxy = FaultProxy::start(cluster.apiserver_addr()).await.unwrap();
    let proxied = Client::try_from(cluster.client_config_via(proxy.addr())).unwrap();
    let requests = Arc::new(Mutex::new(Vec::new()));
    let metrics = CacheMetrics::new();
    let config = |store| InformerConfig {
        metrics: metrics.clone(),
        reflector: ReflectorConfig {
            // Small pages so the first list is paginated and relists at a version are
            // too (client-go's paginatedResult rule); a paginated list at a compacted
            // version is Exact and gets 410.
            page_size: 5,
            // This test is about the paged LIST path (the streaming list is the default).
            use_watch_list: false,
            ..Default::default()
        },
        store,
        ..Default::default()
    };
    let informer = SharedIndexInformer::new(
        Recording {
            inner: ListWatch::<ConfigMap>::namespaced(proxied.clone(), &ns),
            requests: requests.clone(),
        },
        config(StoreKind::Typed),
    );
    let compact = SharedIndexInformer::new(
        ListWatch::<ConfigMap>::namespaced(proxied, &ns),
        InformerConfig {
            metrics: CacheMetrics::new(),
            ..config(StoreKind::Compact)
        },
    );
    let checker = Checker::default();
    informer.add_event_handler(checker.clone()).unwrap();
    let compact_checker = Checker::default();
    compact.add_event_handler(compact_checker.clone()).unwrap();
    informer.start();
    compact.start();
    assert!(informer.wait_for_cache_sync().await);
    assert!(compact.wait_for_cache_sync().await);
    assert!(requests.lock()[0].paginated);

    // Phase 1: writes the informer does not watch move etcd on; compact; cut.
    for i in 0..30 {
        other
            .create(
                &PostParams::default(),
                &configmap(&format!("o-{i}"), &[], "x"),
            )
            .await
            .unwrap();
    }
    cluster.compact_etcd().await.unwrap();
    // A watch cut in its first second with no events counts as failed and relists
    // (client-go's short-watch rule); wait past it so the cut leads to a re-watch.
    tokio::time::sleep(Duration::from_secs(2)).await;
    proxy.cut_all();
    assert_converges(
        &client,
        &ns,
        &informer.indexer(),
        &checker,
        Duration::from_secs(60),
    )
    .await;
    cache_common::eventually(
        "a watch 410 and a relist",
        Duration::from_secs(60),
        || async {
            let reqs = requests.lock().clone();
            let gone = reqs
                .iter()
                .position(|r| r.verb == "WATCH-ERROR" && r.code == 410);
            match gone {
                Some(at) if reqs[at..].iter().any(|r| r.verb == "LIST" && r.code == 200) => Ok(()),
                _ => Err(format!("{reqs:?}")),
            }
        },
    )
    .await;

    // Phase 2: outage with changes, compaction, recovery.
    let victims: Vec<String> = (0..8).map(|i| format!("pre-{i}")).collect();
    proxy.set_blocked(true);
    proxy.cut_all();
    // Let the proxy close the open watch before anything changes.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let deleted = churn(
        api.clone(),
        "compact",
        Duration::from_secs(3),
        victims.clone(),
    )
    .await;
    cluster.compact_etcd().await.unwrap();
    let before_recovery = requests.lock().len();
    proxy.set_blocked(false);
    assert_converges(
        &client,
        &ns,
        &informer.indexer(),
        &checker,
        Duration::from_secs(90),
    )
    .await;

    assert_converges(
        &client,
        &ns,
        &compact.indexer(),
        &compact_checker,
        Duration::from_secs(90),
    )
    .await;

    let seen = checker.snapshot();
    assert!(seen.violations.is_empty(), "{:?}", seen.violations);
    for name in victims.iter().filter(|v| deleted.contains(*v)) {
        let key = format!("{ns}/{name}");
        assert!(
            seen.tombstones.contains(&key),
            "{key} deleted during the outage, no tombstone"
        );
    }
    // The compact informer: the same objects at the same versions, the same tombstones for
    // the outage's deletions, and listers handing out equal objects.
    let compact_seen = compact_checker.snapshot();
    assert!(
        compact_seen.violations.is_empty(),
        "{:?}",
        compact_seen.violations
    );
    assert_eq!(compact_seen.present, seen.present);
    for name in victims.iter().filter(|v| deleted.contains(*v)) {
        let key = format!("{ns}/{name}");
        assert!(
            compact_seen.tombstones.contains(&key),
            "compact: {key}: no tombstone"
        );
    }
    let typed_objects = informer.indexer().list();
    assert_eq!(typed_objects.len(), compact.indexer().len());
    for obj in typed_objects {
        let name = obj.metadata.name.as_deref().unwrap();
        assert_eq!(
            compact.lister().get(&ns, name).as_deref(),
            Some(&*obj),
            "{name}"
        );
    }
    // The relist at the compacted version got 410 and was retried at once with "".
    let reqs = requests.lock().clone();
    let recovery = &reqs[before_recovery..];
    let gone_list = recovery
        .iter()
        .position(|r| r.verb == "LIST" && r.code == 410 && !r.resource_version.is_empty())
        .unwrap_or_else(|| panic!("no 410 on a LIST at a version: {recovery:?}"));
    let next = &recovery[gone_list + 1];
    assert_eq!(
        (next.verb, next.resource_version.as_str(), next.code),
        ("LIST", "", 200),
        "{recovery:?}"
    );
    let m = metrics.reflector("v1/configmaps");
    println!(
        "RESULT compaction: lists {} relists {} watches {} requests {:?}",
        m.lists(),
        m.relists(),
        m.watches(),
        reqs.iter()
            .map(|r| format!("{} rv={} {}", r.verb, r.resource_version, r.code))
            .collect::<Vec<_>>()
    );
    informer.shutdown().await;
    compact.shutdown().await;
}
