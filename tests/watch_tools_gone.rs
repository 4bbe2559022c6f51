//! A [`RetryWatcher`] that must resume at a resourceVersion etcd has compacted away ends with
//! the 410, reported to the caller, instead of resuming. The apiserver runs with
//! `--watch-cache=false`, so a watch at a compacted version is answered 410 Gone (as in
//! `cache_fault_compaction.rs`); that compaction is why this test has an apiserver of its own.

use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube_client::api::{Api, PostParams};
use kube_client::core::WatchEvent;
use kube_client::{Client, ResourceExt};
use kubeloop::cache::ListWatch;
use kubeloop::watch::{RetryWatchError, RetryWatcher};
use kubeloop_testenv::informer::configmap;
use kubeloop_testenv::{Cluster, ClusterOptions, FaultProxy};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_watcher_ends_with_410_gone_when_its_version_was_compacted() {
    let cluster = Cluster::start(ClusterOptions {
        apiserver_args: vec!["--watch-cache=false".into()],
        ..ClusterOptions::apiserver_only()
    })
    .await
    .unwrap();
    let client = cluster.client().await.unwrap();
    let ns = cluster.new_namespace("retry-gone").await.unwrap();
    let other_ns = cluster.new_namespace("retry-gone-other").await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let other: Api<ConfigMap> = Api::namespaced(client.clone(), &other_ns);
    let pp = PostParams::default();
    let start = api
        .create(&pp, &configmap("start", &[], "x"))
        .await
        .unwrap();

    let proxy = FaultProxy::start(cluster.apiserver_addr()).await.unwrap();
    let proxied = Client::try_from(cluster.client_config_via(proxy.addr())).unwrap();
    let lw = ListWatch::<ConfigMap>::namespaced(proxied, &ns);
    let mut watcher = RetryWatcher::new(lw, &start.resource_version().unwrap()).unwrap();
    let a = api.create(&pp, &configmap("a", &[], "x")).await.unwrap();
    let first = tokio::time::timeout(Duration::from_secs(30), watcher.next())
        .await
        .expect("the first event")
        .unwrap()
        .unwrap();
    assert!(matches!(&first, WatchEvent::Added(cm) if cm.name_any() == "a"));
    assert_eq!(
        watcher.last_resource_version(),
        a.resource_version().unwrap()
    );

    // Cut the watcher off; while it is away, writes it does not watch move etcd on and a
    // compaction drops the version it would resume at.
    proxy.set_blocked(true);
    proxy.cut_all();
    for i in 0..30 {
        other
            .create(&pp, &configmap(&format!("o-{i}"), &[], "x"))
            .await
            .unwrap();
    }
    cluster.compact_etcd().await.unwrap();
    proxy.set_blocked(false);

    let end = tokio::time::timeout(Duration::from_secs(60), watcher.next())
        .await
        .expect("the watcher ends rather than resumes");
    let err = match end {
        Some(Err(err)) => err,
        other => panic!("expected the 410 to end the watcher, got {other:?}"),
    };
    match &err {
        RetryWatchError::Gone {
            resource_version,
            source,
            ..
        } => {
            assert_eq!(resource_version, &a.resource_version().unwrap());
            assert_eq!(source.code(), Some(410), "{err}");
        }
        other => panic!("not a 410: {other}"),
    }
    assert!(
        tokio::time::timeout(Duration::from_secs(5), watcher.next())
            .await
            .expect("ended")
            .is_none(),
        "nothing after the final error"
    );
}
