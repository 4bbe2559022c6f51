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
//! Three more informers run beside the typed one through the same proxy, on enough objects
//! to train a compact store's dictionary: a compact one (`StoreKind::Compact`), a
//! metadata-only one (`PartialObjectMeta<ConfigMap>`) and a compact metadata-only one. Each
//! handler sees the same objects at the same versions and the same tombstones, the compact
//! lister hands out objects equal to the typed one's, and the metadata-only listers their
//! metadata, as `PartialObjectMetadata` from the apiserver.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube_client::Client;
use kube_client::api::{Api, PostParams};
use kube_client::core::PartialObjectMeta;
use kubeloop::cache::{
    CacheMetrics, InformerConfig, ListWatch, ReflectorConfig, SharedIndexInformer, StoreKind,
};
use kubeloop_testenv::informer::{
    Checker, Recording, assert_converges, churn, configmap, seed_configmaps,
};
use kubeloop_testenv::{Cluster, ClusterOptions, FaultProxy};
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
    // The others report elsewhere, so the metrics printed at the end are the typed one's.
    let elsewhere = |store| InformerConfig {
        metrics: CacheMetrics::new(),
        ..config(store)
    };
    let compact = SharedIndexInformer::new(
        ListWatch::<ConfigMap>::namespaced(proxied.clone(), &ns),
        elsewhere(StoreKind::Compact),
    );
    let metadata = |store| {
        SharedIndexInformer::new(
            ListWatch::<PartialObjectMeta<ConfigMap>>::namespaced(proxied.clone(), &ns),
            elsewhere(store),
        )
    };
    let (meta, meta_compact) = (metadata(StoreKind::Typed), metadata(StoreKind::Compact));
    let checker = Checker::default();
    informer.add_event_handler(checker.clone()).unwrap();
    let compact_checker = Checker::default();
    compact.add_event_handler(compact_checker.clone()).unwrap();
    let meta_checker = Checker::default();
    meta.add_event_handler(meta_checker.clone()).unwrap();
    let meta_compact_checker = Checker::default();
    meta_compact
        .add_event_handler(meta_compact_checker.clone())
        .unwrap();
    informer.start();
    compact.start();
    meta.start();
    meta_compact.start();
    assert!(informer.wait_for_cache_sync().await);
    assert!(compact.wait_for_cache_sync().await);
    assert!(meta.wait_for_cache_sync().await);
    assert!(meta_compact.wait_for_cache_sync().await);
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
    kubeloop::testing::eventually(
        "a watch 410, a relist and a watch again",
        Duration::from_secs(60),
        || async {
            // The relist's pages are done once a watch follows it: phase 2 must not cut a
            // relist still paging (which would relist at "" again, not at a version).
            let reqs = requests.lock().clone();
            let gone = reqs
                .iter()
                .position(|r| r.verb == "WATCH-ERROR" && r.code == 410);
            let relisted = gone.and_then(|at| {
                let list = reqs[at..]
                    .iter()
                    .position(|r| r.verb == "LIST" && r.code == 200)?;
                Some(at + list)
            });
            match relisted {
                Some(at)
                    if reqs[at..]
                        .iter()
                        .any(|r| r.verb == "WATCH" && r.code == 200) =>
                {
                    Ok(())
                }
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

    let wait = Duration::from_secs(90);
    assert_converges(&client, &ns, &compact.indexer(), &compact_checker, wait).await;
    assert_converges(&client, &ns, &meta.indexer(), &meta_checker, wait).await;
    let meta_compact_indexer = meta_compact.indexer();
    assert_converges(
        &client,
        &ns,
        &meta_compact_indexer,
        &meta_compact_checker,
        wait,
    )
    .await;

    let seen = checker.snapshot();
    assert!(seen.violations.is_empty(), "{:?}", seen.violations);
    let outage_deletions: Vec<String> = victims
        .iter()
        .filter(|v| deleted.contains(*v))
        .map(|name| format!("{ns}/{name}"))
        .collect();
    for key in &outage_deletions {
        assert!(
            seen.tombstones.contains(key),
            "{key} deleted during the outage, no tombstone"
        );
    }
    // The others: the same objects at the same versions, the same tombstones for the
    // outage's deletions.
    for (which, other) in [
        ("compact", &compact_checker),
        ("metadata-only", &meta_checker),
        ("compact metadata-only", &meta_compact_checker),
    ] {
        let other = other.snapshot();
        assert!(
            other.violations.is_empty(),
            "{which}: {:?}",
            other.violations
        );
        assert_eq!(other.present, seen.present, "{which}");
        for key in &outage_deletions {
            assert!(
                other.tombstones.contains(key),
                "{which}: {key}: no tombstone"
            );
        }
    }
    // Listers: the compact one hands out objects equal to the typed one's; the metadata-only
    // ones their metadata, sent by the apiserver as PartialObjectMetadata.
    let typed_objects = informer.indexer().list();
    assert_eq!(typed_objects.len(), compact.indexer().len());
    for obj in typed_objects {
        let name = obj.metadata.name.as_deref().unwrap();
        assert_eq!(
            compact.lister().get(&ns, name).as_deref(),
            Some(&*obj),
            "{name}"
        );
        for (which, informer) in [
            ("metadata-only", &meta),
            ("compact metadata-only", &meta_compact),
        ] {
            let partial = informer.lister().get(&ns, name);
            let partial = partial.unwrap_or_else(|| panic!("{which}: {name} missing"));
            assert_eq!(partial.metadata, obj.metadata, "{which}: {name}");
            let kind = partial.types.as_ref().map(|t| t.kind.as_str());
            assert_eq!(kind, Some("PartialObjectMetadata"), "{which}: {name}");
        }
    }
    // The relist at the compacted version got 410 and was retried at once with "".
    let reqs = requests.lock().clone();
    let recovery = &reqs[before_recovery..];
    let gone_list = recovery
        .iter()
        .position(|r| r.verb == "LIST" && r.code == 410 && !r.resource_version.is_empty())
        .unwrap_or_else(|| panic!("no 410 on a LIST at a version: {recovery:?}; all: {reqs:?}"));
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
    meta.shutdown().await;
    meta_compact.shutdown().await;
}
