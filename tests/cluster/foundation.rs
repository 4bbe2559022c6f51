//! The foundation's proof against the real control plane built by hack/build-control-plane:
//! the apiserver answers, objects can be created, watched and deleted, CRDs become
//! established, and with controller-manager, scheduler and kwok a Deployment runs and is
//! garbage-collected; the events.k8s.io/v1 recorder's writes (a create, a strategic merge
//! patch of `series`, a note at the API's limit) are what the apiserver accepts.

use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube_client::api::{Api, DeleteParams, ListParams, PostParams, WatchEvent, WatchParams};
use kubeloop::testing::eventually;
use kubeloop_testenv as testenv;

#[tokio::test]
async fn apiserver_lists_namespaces_and_reports_the_pinned_version() {
    let cluster = testenv::shared().await;
    let client = cluster.client().await.unwrap();
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let names: Vec<String> = namespaces
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|n| n.metadata.name)
        .collect();
    for expected in ["default", "kube-system", "kube-public"] {
        assert!(
            names.iter().any(|n| n == expected),
            "{expected} missing from {names:?}"
        );
    }
    let version = client.apiserver_version().await.unwrap();
    assert_eq!(version.git_version, testenv::kubernetes_version());
}

#[tokio::test]
async fn events_v1_repeats_become_one_event_whose_series_the_apiserver_keeps() {
    use kubeloop::record::{
        EventMetrics, EventType, EventsV1Broadcaster, EventsV1Config, KubeEventsV1Sink,
        NOTE_LENGTH_LIMIT,
    };
    let cluster = testenv::shared().await;
    let client = cluster.client().await.unwrap();
    let ns = cluster.new_namespace("events-v1").await.unwrap();
    let cm: ConfigMap = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "regarded", "namespace": ns, "uid": "u-1"}
    }))
    .unwrap();
    let metrics = EventMetrics::default();
    let broadcaster = EventsV1Broadcaster::start(
        KubeEventsV1Sink::new(client.clone()),
        EventsV1Config {
            metrics: Some(metrics.clone()),
            ..EventsV1Config::default()
        },
    );
    let recorder = broadcaster.new_recorder_as("foundation-test", "foundation-test-1");
    let long_note = "n".repeat(3 * NOTE_LENGTH_LIMIT);
    for _ in 0..50 {
        recorder.eventf(
            &cm,
            None,
            EventType::Warning,
            "SyncFailed",
            "Sync",
            &long_note,
        );
    }
    broadcaster.shutdown().await;
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(client, &ns);
    let listed = events.list(&ListParams::default()).await.unwrap().items;
    assert_eq!(listed.len(), 1, "{listed:?}");
    let event = &listed[0];
    assert_eq!(event.series.as_ref().map(|s| s.count), Some(50));
    assert_eq!(
        event.note.as_ref().map(String::len),
        Some(NOTE_LENGTH_LIMIT)
    );
    assert_eq!(
        event.reporting_controller.as_deref(),
        Some("foundation-test")
    );
    assert_eq!(
        event.regarding.as_ref().and_then(|r| r.name.as_deref()),
        Some("regarded")
    );
    assert_eq!(
        (metrics.writes_for("create"), metrics.writes_for("patch")),
        (1, 2),
        "a create, the series' start, its last count at shutdown"
    );
}

/// Discovery picks events.k8s.io/v1 on an apiserver that serves it, and core/v1 on one
/// started with `--runtime-config=events.k8s.io/v1=false` (whose core/v1 Events still work).
#[tokio::test]
async fn the_recorder_falls_back_to_core_v1_where_events_k8s_io_is_not_served() {
    use kubeloop::record::{AnyEventBroadcaster, EventType};
    let cluster = testenv::shared().await;
    let client = cluster.client().await.unwrap();
    let (broadcaster, recorder) = AnyEventBroadcaster::discover(client, "t", "t-1").await;
    assert!(recorder.is_v1());
    broadcaster.shutdown().await;

    let without = testenv::Cluster::start(testenv::ClusterOptions {
        apiserver_args: vec!["--runtime-config=events.k8s.io/v1=false".into()],
        ..testenv::ClusterOptions::apiserver_only()
    })
    .await
    .unwrap();
    let client = without.client().await.unwrap();
    let ns = without.new_namespace("events-core").await.unwrap();
    let (broadcaster, recorder) = AnyEventBroadcaster::discover(client.clone(), "t", "t-1").await;
    assert!(!recorder.is_v1());
    let cm: ConfigMap = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "regarded", "namespace": ns}
    }))
    .unwrap();
    recorder.event(&cm, None, EventType::Normal, "Tested", "Test", "on core/v1");
    broadcaster.shutdown().await;
    let events: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(client, &ns);
    let listed = events.list(&ListParams::default()).await.unwrap().items;
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0].message.as_deref(), Some("on core/v1"));

    // The sample controller's binary on that apiserver says so once, at start.
    let mut controller = testenv::Kubeloop::new(["sample-controller", "--namespace", &ns])
        .kubeconfig(without.kubeconfig_path())
        .start();
    let fallback = "does not serve events.k8s.io/v1: recording core/v1 Events";
    controller.wait_for_line_blocking(&[fallback], Duration::from_secs(30));
    // It goes on to wait for its informers (this apiserver has no Foo CRD); by then discovery
    // is long done.
    controller.wait_for_line_blocking(&["the Foo CRD"], Duration::from_secs(30));
    let log = controller.log();
    assert_eq!(log.matches(fallback).count(), 1, "{log}");
}

#[tokio::test]
async fn configmap_is_created_watched_and_deleted() {
    let cluster = testenv::shared().await;
    let client = cluster.client().await.unwrap();
    let ns = cluster.new_namespace("foundation").await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(client, &ns);

    let list = api.list(&ListParams::default()).await.unwrap();
    let rv = list.metadata.resource_version.unwrap();
    let mut events = api
        .watch(&WatchParams::default(), &rv)
        .await
        .unwrap()
        .boxed();

    let cm: ConfigMap = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "hello"}, "data": {"greeting": "hi"}
    }))
    .unwrap();
    api.create(&PostParams::default(), &cm).await.unwrap();
    api.delete("hello", &DeleteParams::default()).await.unwrap();

    let mut seen = Vec::new();
    while seen.len() < 2 {
        let event = tokio::time::timeout(Duration::from_secs(30), events.try_next())
            .await
            .expect("watch event")
            .unwrap()
            .expect("watch open");
        match event {
            WatchEvent::Added(o) => seen.push(("ADDED", o.metadata.name.unwrap())),
            WatchEvent::Deleted(o) => seen.push(("DELETED", o.metadata.name.unwrap())),
            WatchEvent::Modified(o) => seen.push(("MODIFIED", o.metadata.name.unwrap())),
            WatchEvent::Bookmark(_) => {}
            WatchEvent::Error(e) => panic!("watch error {e:?}"),
        }
    }
    assert_eq!(
        seen,
        vec![
            ("ADDED", "hello".to_owned()),
            ("DELETED", "hello".to_owned())
        ]
    );
    assert!(api.get_opt("hello").await.unwrap().is_none());
}

#[tokio::test]
async fn crd_becomes_established() {
    let cluster = testenv::shared().await;
    let client = cluster.client().await.unwrap();
    let crd: CustomResourceDefinition = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "gadgets.foundation.kubeloop.dev"},
        "spec": {
            "group": "foundation.kubeloop.dev",
            "names": {"plural": "gadgets", "singular": "gadget", "kind": "Gadget"},
            "scope": "Namespaced",
            "versions": [{"name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}]
        }
    }))
    .unwrap();
    testenv::ensure_crd(&client, &crd).await;
}

#[tokio::test]
async fn fault_proxy_cuts_a_watch_and_refuses_while_blocked() {
    let cluster = testenv::shared().await;
    let proxy = testenv::FaultProxy::start(cluster.apiserver_addr())
        .await
        .unwrap();
    let client = kube_client::Client::try_from(cluster.client_config_via(proxy.addr())).unwrap();
    let ns = cluster.new_namespace("proxy").await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(client, &ns);
    let rv = api
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let mut events = api
        .watch(&WatchParams::default().timeout(290), &rv)
        .await
        .unwrap()
        .boxed();

    proxy.cut_all();
    // The watch stream ends (or errors) instead of hanging: the connection was reset.
    let ended = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            match events.next().await {
                None | Some(Err(_)) => return,
                Some(Ok(_)) => continue,
            }
        }
    })
    .await;
    assert!(ended.is_ok(), "the watch should end when the proxy cuts it");

    proxy.set_blocked(true);
    let refused = api.list(&ListParams::default()).await;
    assert!(
        refused.is_err(),
        "a blocked proxy should refuse the request"
    );
    proxy.set_blocked(false);
    api.list(&ListParams::default())
        .await
        .expect("requests pass again once unblocked");
}

#[tokio::test]
async fn deployment_runs_on_kwok_and_is_garbage_collected() {
    let cluster = testenv::shared_full().await;
    let client = cluster.client().await.unwrap();
    let ns = cluster.new_namespace("workload").await.unwrap();
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    let replicasets: Api<ReplicaSet> = Api::namespaced(client.clone(), &ns);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);

    let deployment: Deployment = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "web"},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{"name": "web", "image": "nginx:latest"}]}
            }
        }
    }))
    .unwrap();
    deployments
        .create(&PostParams::default(), &deployment)
        .await
        .unwrap();

    eventually("2 available replicas", Duration::from_secs(120), || {
        let deployments = deployments.clone();
        async move {
            let d = deployments.get("web").await.unwrap();
            d.status.and_then(|s| s.available_replicas) == Some(2)
        }
    })
    .await;
    let running = pods.list(&ListParams::default()).await.unwrap();
    assert_eq!(running.items.len(), 2);
    for pod in &running.items {
        let status = pod.status.as_ref().unwrap();
        assert_eq!(status.phase.as_deref(), Some("Running"));
        assert_eq!(
            pod.spec.as_ref().unwrap().node_name.as_deref(),
            Some(testenv::KWOK_NODE)
        );
    }
    assert_eq!(
        replicasets
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .len(),
        1
    );

    deployments
        .delete("web", &DeleteParams::background())
        .await
        .unwrap();
    eventually(
        "the ReplicaSet and Pods to be garbage-collected",
        Duration::from_secs(120),
        || {
            let (replicasets, pods) = (replicasets.clone(), pods.clone());
            async move {
                replicasets
                    .list(&ListParams::default())
                    .await
                    .unwrap()
                    .items
                    .is_empty()
                    && pods
                        .list(&ListParams::default())
                        .await
                        .unwrap()
                        .items
                        .is_empty()
            }
        },
    )
    .await;
}
