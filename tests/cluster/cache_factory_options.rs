//! The informer factory's client-go options on the real apiserver: a label-selector tweak
//! (`WithTweakListOptions`) keeps non-matching objects out of the cache, on the initial list
//! and on the watch (an object created later, one relabelled out, one relabelled in), and a
//! transform (`WithTransform`) runs before the store.

use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube_client::api::{Api, Patch, PatchParams, PostParams};
use kubeloop::cache::{FactoryOptions, SharedInformerFactory};
use kubeloop::testing::eventually;
use kubeloop_testenv as testenv;
use kubeloop_testenv::informer::configmap;

#[tokio::test(flavor = "multi_thread")]
async fn a_label_selector_tweak_keeps_other_objects_out_of_the_cache() {
    let cluster = testenv::shared().await;
    let client = cluster.client().await.unwrap();
    let ns = cluster.new_namespace("factory-tweak").await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let pp = PostParams::default();
    for (name, app) in [
        ("mine-1", "mine"),
        ("mine-2", "mine"),
        ("theirs-1", "theirs"),
    ] {
        api.create(&pp, &configmap(name, &[("app", app)], "x"))
            .await
            .unwrap();
    }
    api.create(&pp, &configmap("unlabelled", &[], "x"))
        .await
        .unwrap();

    let factory = SharedInformerFactory::new(
        client,
        FactoryOptions {
            namespace: Some(ns.clone()),
            ..Default::default()
        },
    )
    .with_tweak_list_options(|selectors| selectors.label_selector = Some("app=mine".into()))
    .with_transform(|meta| meta.managed_fields = None);
    let informer = factory.informer::<ConfigMap>();
    factory.start();
    assert!(informer.wait_for_cache_sync().await);
    let cached = || {
        let mut keys = informer.indexer().list_keys();
        keys.sort();
        keys
    };
    assert_eq!(cached(), [format!("{ns}/mine-1"), format!("{ns}/mine-2")]);
    assert!(
        informer
            .indexer()
            .list()
            .iter()
            .all(|cm| cm.metadata.managed_fields.is_none()),
        "the transform ran before the store"
    );

    // On the watch: a new non-matching object stays out, a relabelled one leaves, one
    // relabelled in arrives.
    api.create(&pp, &configmap("theirs-2", &[("app", "theirs")], "x"))
        .await
        .unwrap();
    let relabel =
        |app: &str| Patch::Merge(serde_json::json!({"metadata": {"labels": {"app": app}}}));
    api.patch("mine-2", &PatchParams::default(), &relabel("theirs"))
        .await
        .unwrap();
    api.patch("theirs-1", &PatchParams::default(), &relabel("mine"))
        .await
        .unwrap();
    api.create(&pp, &configmap("mine-3", &[("app", "mine")], "x"))
        .await
        .unwrap();
    let expected = [
        format!("{ns}/mine-1"),
        format!("{ns}/mine-3"),
        format!("{ns}/theirs-1"),
    ];
    eventually(
        "the watch to follow the selector",
        Duration::from_secs(30),
        || async { (cached() == expected).then_some(()) },
    )
    .await;
    factory.shutdown().await;
}
