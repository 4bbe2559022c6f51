//! Initial sync of 10,000 ConfigMaps from the real apiserver, by streaming list (the default)
//! and by paged LIST: the cache equals the server's list. Prints the sync time and the process's peak RSS (VmHWM) for the notes; no time
//! limit is asserted (speed belongs in benches).

use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube_client::api::{Api, PostParams};
use kubeloop::cache::{
    CacheMetrics, InformerConfig, ListWatch, ReflectorConfig, SharedIndexInformer,
};
use kubeloop_testenv as testenv;
use kubeloop_testenv::informer::{cache_state, configmap, peak_rss_kib, server_configmaps};

const OBJECTS: usize = 10_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn initial_sync_of_ten_thousand_configmaps_matches_the_server() {
    let cluster = testenv::shared().await;
    let client = cluster.client().await.unwrap();
    let ns = cluster.new_namespace("cache-10k").await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);

    let setup = Instant::now();
    let created = futures::stream::iter(0..OBJECTS)
        .map(|i| {
            let api = api.clone();
            async move {
                let cm = configmap(
                    &format!("cm-{i:05}"),
                    &[("shard", &(i % 10).to_string())],
                    "x",
                );
                // Retry a throttled or failed create a few times so setup is not flaky.
                for attempt in 0..5 {
                    match api.create(&PostParams::default(), &cm).await {
                        Ok(_) => return true,
                        Err(e) if attempt == 4 => panic!("creating cm-{i}: {e}"),
                        Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
                    }
                }
                false
            }
        })
        .buffer_unordered(64)
        .filter(|ok| futures::future::ready(*ok))
        .count()
        .await;
    assert_eq!(created, OBJECTS);
    println!(
        "setup: created {OBJECTS} ConfigMaps in {:?}",
        setup.elapsed()
    );

    let rss_before = peak_rss_kib();
    let metrics = CacheMetrics::new();
    let informer = SharedIndexInformer::new(
        ListWatch::<ConfigMap>::namespaced(client.clone(), &ns),
        InformerConfig {
            metrics: metrics.clone(),
            ..Default::default()
        },
    );
    let start = Instant::now();
    informer.start();
    assert!(informer.wait_for_cache_sync().await);
    let sync_time = start.elapsed();
    let rss_after = peak_rss_kib();

    let server = server_configmaps(&client, &ns).await.unwrap();
    assert_eq!(server.len(), OBJECTS);
    assert_eq!(cache_state(&informer.indexer()), server);
    let m = metrics.reflector("v1/configmaps");
    assert_eq!(m.lists(), 1);
    println!(
        "RESULT initial sync of {OBJECTS} ConfigMaps: {sync_time:?}; peak RSS (VmHWM) \
         before informer {rss_before} KiB, after sync {rss_after} KiB"
    );
    informer.shutdown().await;

    // The same objects through the paged-LIST path (the streaming list's fallback): the watch
    // cache answers the LIST at "0" whole, and the body is decoded item by item as it arrives.
    let metrics = CacheMetrics::new();
    let listed = SharedIndexInformer::new(
        ListWatch::<ConfigMap>::namespaced(client.clone(), &ns),
        InformerConfig {
            reflector: ReflectorConfig {
                use_watch_list: false,
                ..Default::default()
            },
            metrics: metrics.clone(),
            ..Default::default()
        },
    );
    let start = Instant::now();
    listed.start();
    assert!(listed.wait_for_cache_sync().await);
    let list_sync_time = start.elapsed();
    assert_eq!(cache_state(&listed.indexer()), server);
    assert_eq!(metrics.reflector("v1/configmaps").lists(), 1);
    println!("RESULT initial sync of {OBJECTS} ConfigMaps by paged LIST: {list_sync_time:?}");
    listed.shutdown().await;
}
