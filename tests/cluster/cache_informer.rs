//! The cache against the real apiserver: ConfigMaps and a CRD's objects (dynamic and typed)
//! go through informers; handlers see the right sequence and listers return what the server
//! has. Also the streaming-list (sendInitialEvents) mode.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube_client::api::{Api, DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube_client::core::{ApiResource, DynamicObject, GroupVersionKind};
use kube_client::{Resource, ResourceExt};
use kubeloop::cache::{
    FactoryOptions, Indexer, InformerConfig, LabelSelector, ListWatch, ReflectorConfig,
    SharedIndexInformer, SharedInformerFactory, StoreKind,
};
use kubeloop::testing::eventually;
use kubeloop_testenv as testenv;
use kubeloop_testenv::informer::{Checker, assert_converges, configmap, ensure_widget_crd};
use serde::{Deserialize, Serialize};

/// Our own typed CRD object (what a controller crate would define).
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Widget {
    #[serde(rename = "apiVersion", default)]
    api_version: String,
    #[serde(default)]
    kind: String,
    metadata: ObjectMeta,
    #[serde(default)]
    spec: WidgetSpec,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct WidgetSpec {
    #[serde(default)]
    size: i64,
}

impl Resource for Widget {
    type DynamicType = ();
    type Scope = k8s_openapi::NamespaceResourceScope;
    fn kind(_: &()) -> Cow<'_, str> {
        "Widget".into()
    }
    fn group(_: &()) -> Cow<'_, str> {
        "test.kubeloop.dev".into()
    }
    fn version(_: &()) -> Cow<'_, str> {
        "v1".into()
    }
    fn plural(_: &()) -> Cow<'_, str> {
        "widgets".into()
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

fn names<K: Resource>(objs: &[std::sync::Arc<K>]) -> BTreeSet<String> {
    objs.iter()
        .map(|o| o.meta().name.clone().unwrap())
        .collect()
}

/// A typed store keeps each object's metadata at its length: serde decodes a managedFields
/// list of one entry into room for four, and the informer's transform gives it back.
fn assert_metadata_at_its_length(indexer: &Indexer<ConfigMap>) {
    for cm in indexer.list() {
        let fields = cm
            .metadata
            .managed_fields
            .as_ref()
            .expect("written by the apiserver");
        assert_eq!(fields.capacity(), fields.len(), "{}", cm.name_any());
    }
}

#[tokio::test]
async fn configmap_handlers_see_the_right_sequence_and_listers_match_the_server() {
    let cluster = testenv::shared().await;
    let client = cluster.client().await.unwrap();
    let ns = cluster.new_namespace("cache-cm").await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let pp = PostParams::default();
    api.create(&pp, &configmap("a", &[("app", "web")], "1"))
        .await
        .unwrap();
    api.create(&pp, &configmap("b", &[("app", "db")], "1"))
        .await
        .unwrap();

    let factory = SharedInformerFactory::new(
        client.clone(),
        FactoryOptions {
            namespace: Some(ns.clone()),
            ..Default::default()
        },
    );
    let informer = factory.informer::<ConfigMap>();
    let checker = Checker::default();
    let registration = informer.add_event_handler(checker.clone()).unwrap();
    factory.start();
    factory.start(); // idempotent
    let synced = factory.wait_for_cache_sync().await;
    assert_eq!(
        synced.into_iter().collect::<Vec<_>>(),
        [("v1/configmaps".to_string(), true)]
    );
    assert!(registration.wait_for_sync().await);

    let mut initial = checker.seen.lock().log.clone();
    initial.sort();
    assert_eq!(
        initial,
        [format!("add {ns}/a initial"), format!("add {ns}/b initial")]
    );

    api.create(&pp, &configmap("c", &[("app", "web")], "1"))
        .await
        .unwrap();
    api.patch(
        "a",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"data": {"value": "2"}})),
    )
    .await
    .unwrap();
    api.delete("b", &DeleteParams::default()).await.unwrap();

    let want = [
        format!("add {ns}/a initial"),
        format!("add {ns}/b initial"),
        format!("add {ns}/c"),
        format!("update {ns}/a"),
        format!("delete {ns}/b"),
    ];
    eventually("the live events", Duration::from_secs(30), || async {
        let log = checker.seen.lock().log.clone();
        if log.len() >= 5 && log[2..] == want[2..] {
            Ok(())
        } else {
            Err(format!("{log:?}"))
        }
    })
    .await;
    assert!(
        checker.violations().is_empty(),
        "{:?}",
        checker.violations()
    );
    assert_converges(
        &client,
        &ns,
        &informer.indexer(),
        &checker,
        Duration::from_secs(30),
    )
    .await;

    // Listers against the server's own label-selector LISTs.
    let lister = informer.lister();
    for selector in ["app=web", "app in (web,db)", "app!=web", "!app", ""] {
        let server: BTreeSet<String> = api
            .list(&ListParams::default().labels(selector))
            .await
            .unwrap()
            .items
            .iter()
            .map(|o| o.name_any())
            .collect();
        let parsed = LabelSelector::parse(selector).unwrap();
        assert_eq!(
            names(&lister.namespaced(&ns).list(&parsed)),
            server,
            "selector {selector:?}"
        );
        let all_namespaces: BTreeSet<String> = names(&lister.list(&parsed));
        assert_eq!(
            all_namespaces, server,
            "selector {selector:?} (all namespaces)"
        );
    }
    assert_eq!(
        lister.get(&ns, "a").unwrap().data.as_ref().unwrap()["value"],
        "2"
    );
    assert!(lister.get(&ns, "b").is_none());
    assert!(
        lister
            .namespaced("elsewhere")
            .list(&LabelSelector::everything())
            .is_empty()
    );

    factory.shutdown().await;
    assert!(informer.is_stopped());
}

#[tokio::test]
async fn crd_objects_flow_through_dynamic_and_typed_informers() {
    let cluster = testenv::shared().await;
    let client = cluster.client().await.unwrap();
    ensure_widget_crd(&client).await;
    let ns = cluster.new_namespace("cache-crd").await.unwrap();
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("test.kubeloop.dev", "v1", "Widget"),
        "widgets",
    );
    let widgets: Api<Widget> = Api::namespaced(client.clone(), &ns);
    let pp = PostParams::default();
    let widget = |name: &str, size: i64, color: &str| Widget {
        api_version: "test.kubeloop.dev/v1".into(),
        kind: "Widget".into(),
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some([("color".to_string(), color.to_string())].into()),
            ..Default::default()
        },
        spec: WidgetSpec { size },
    };
    widgets.create(&pp, &widget("w1", 1, "red")).await.unwrap();

    let factory = SharedInformerFactory::new(
        client.clone(),
        FactoryOptions {
            namespace: Some(ns.clone()),
            ..Default::default()
        },
    );
    let dynamic = factory.dynamic_informer(&ar);
    let dyn_checker = Checker::default();
    dynamic.add_event_handler(dyn_checker.clone()).unwrap();
    let typed = SharedIndexInformer::new(
        ListWatch::<Widget>::namespaced(client.clone(), &ns),
        InformerConfig::default(),
    );
    let typed_checker = Checker::default();
    typed.add_event_handler(typed_checker.clone()).unwrap();
    factory.start();
    typed.start();
    assert!(dynamic.wait_for_cache_sync().await);
    assert!(typed.wait_for_cache_sync().await);

    widgets.create(&pp, &widget("w2", 2, "blue")).await.unwrap();
    widgets
        .patch(
            "w1",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"size": 10}})),
        )
        .await
        .unwrap();
    widgets
        .delete("w2", &DeleteParams::default())
        .await
        .unwrap();
    widgets.create(&pp, &widget("w3", 3, "red")).await.unwrap();

    let want = vec![
        format!("add {ns}/w1 initial"),
        format!("add {ns}/w2"),
        format!("update {ns}/w1"),
        format!("delete {ns}/w2"),
        format!("add {ns}/w3"),
    ];
    // DeltaFIFO orders events per key, not across keys: w2's add and delete can be popped
    // together before w1's update (client-go's DeltaFIFO does the same; RealFIFO would not).
    // So compare each key's own sequence.
    let by_key = |log: &[String]| -> BTreeMap<String, Vec<String>> {
        let mut keys: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for line in log {
            let key = line
                .split_whitespace()
                .nth(1)
                .unwrap_or_default()
                .to_owned();
            keys.entry(key).or_default().push(line.clone());
        }
        keys
    };
    let want = by_key(&want);
    for (which, checker) in [("dynamic", &dyn_checker), ("typed", &typed_checker)] {
        eventually(which, Duration::from_secs(30), || async {
            let log = checker.seen.lock().log.clone();
            if by_key(&log) == want {
                Ok(())
            } else {
                Err(format!("{log:?}"))
            }
        })
        .await;
        assert!(checker.violations().is_empty());
    }
    let w1 = typed.lister().get(&ns, "w1").unwrap();
    assert_eq!(w1.spec.size, 10);
    let d1 = dynamic.lister().get(&ns, "w1").unwrap();
    assert_eq!(d1.data["spec"]["size"], 10);
    let red = LabelSelector::parse("color=red").unwrap();
    assert_eq!(
        names(&typed.lister().namespaced(&ns).list(&red)),
        BTreeSet::from(["w1".to_string(), "w3".to_string()])
    );
    let server: BTreeSet<String> = Api::<DynamicObject>::namespaced_with(client.clone(), &ns, &ar)
        .list(&ListParams::default().labels("color=red"))
        .await
        .unwrap()
        .items
        .iter()
        .map(|o| o.name_any())
        .collect();
    assert_eq!(names(&dynamic.lister().namespaced(&ns).list(&red)), server);
    factory.shutdown().await;
    typed.shutdown().await;
}

#[tokio::test]
async fn streaming_list_mode_syncs_from_send_initial_events() {
    let cluster = testenv::shared().await;
    let client = cluster.client().await.unwrap();
    let ns = cluster.new_namespace("cache-watchlist").await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    for i in 0..20 {
        api.create(
            &PostParams::default(),
            &configmap(&format!("cm-{i}"), &[], "x"),
        )
        .await
        .unwrap();
    }
    let informer = SharedIndexInformer::new(
        ListWatch::<ConfigMap>::namespaced(client.clone(), &ns),
        InformerConfig {
            reflector: ReflectorConfig {
                use_watch_list: true,
                ..Default::default()
            },
            ..Default::default()
        },
    );
    let checker = Checker::default();
    informer.add_event_handler(checker.clone()).unwrap();
    let errors = std::sync::Arc::new(parking_lot::Mutex::new(Vec::<String>::new()));
    let e = errors.clone();
    informer
        .set_watch_error_handler(move |err| e.lock().push(err.to_string()))
        .unwrap();
    informer.start();
    assert!(informer.wait_for_cache_sync().await);
    assert_eq!(informer.indexer().len(), 20);
    api.create(&PostParams::default(), &configmap("late", &[], "x"))
        .await
        .unwrap();
    assert_converges(
        &client,
        &ns,
        &informer.indexer(),
        &checker,
        Duration::from_secs(30),
    )
    .await;
    // Listed through the stream, and "late" through a watch event.
    assert_metadata_at_its_length(&informer.indexer());
    // No fallback to a paged LIST happened: the stream delivered the initial state.
    assert!(errors.lock().is_empty(), "{:?}", errors.lock());
    informer.shutdown().await;
}

/// The real `ListWatch`, with every event of a streaming list (`sendInitialEvents`) delayed
/// by `delay`: a stream that makes progress slower than the reflector's bound.
struct SlowStreamingList {
    inner: ListWatch<ConfigMap>,
    delay: Duration,
}

impl kubeloop::cache::ListerWatcher<ConfigMap> for SlowStreamingList {
    fn list(
        &self,
        options: &kubeloop::cache::ListOptions,
    ) -> impl std::future::Future<
        Output = Result<kubeloop::cache::ListPage<ConfigMap>, kubeloop::cache::ListWatchError>,
    > + Send {
        self.inner.list(options)
    }

    fn watch(
        &self,
        options: &kubeloop::cache::WatchOptions,
    ) -> impl std::future::Future<
        Output = Result<kubeloop::cache::WatchStream<ConfigMap>, kubeloop::cache::ListWatchError>,
    > + Send {
        use futures::StreamExt;
        let slow = options.send_initial_events;
        let delay = self.delay;
        let fut = self.inner.watch(options);
        async move {
            let stream = fut.await?;
            if !slow {
                return Ok(stream);
            }
            Ok(stream
                .then(move |item| async move {
                    tokio::time::sleep(delay).await;
                    item
                })
                .boxed())
        }
    }

    fn type_description(&self) -> String {
        self.inner.type_description()
    }
}

#[tokio::test]
async fn streaming_list_that_cannot_finish_in_time_falls_back_to_a_paged_list() {
    let cluster = testenv::shared().await;
    let client = cluster.client().await.unwrap();
    let ns = cluster
        .new_namespace("cache-watchlist-fallback")
        .await
        .unwrap();
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    for i in 0..5 {
        api.create(
            &PostParams::default(),
            &configmap(&format!("cm-{i}"), &[], "x"),
        )
        .await
        .unwrap();
    }
    let metrics = kubeloop::cache::CacheMetrics::new();
    let informer = SharedIndexInformer::new(
        SlowStreamingList {
            inner: ListWatch::<ConfigMap>::namespaced(client.clone(), &ns),
            delay: Duration::from_millis(500),
        },
        InformerConfig {
            reflector: ReflectorConfig {
                use_watch_list: true,
                // Each event of the (slowed) stream comes later than this: no progress.
                watch_list_timeout: Duration::from_millis(100),
                ..Default::default()
            },
            metrics: metrics.clone(),
            ..Default::default()
        },
    );
    let checker = Checker::default();
    informer.add_event_handler(checker.clone()).unwrap();
    let errors = std::sync::Arc::new(parking_lot::Mutex::new(Vec::<String>::new()));
    let e = errors.clone();
    informer
        .set_watch_error_handler(move |err| e.lock().push(err.to_string()))
        .unwrap();
    informer.start();
    assert!(informer.wait_for_cache_sync().await);
    assert_converges(
        &client,
        &ns,
        &informer.indexer(),
        &checker,
        Duration::from_secs(30),
    )
    .await;
    assert_metadata_at_its_length(&informer.indexer());
    assert!(
        errors
            .lock()
            .iter()
            .any(|e| e.contains("falling back to a paged LIST")),
        "{:?}",
        errors.lock()
    );
    assert_eq!(metrics.reflector("v1/configmaps").lists(), 1);
    informer.shutdown().await;
}

/// A factory limited to one namespace still watches cluster-scoped types cluster-wide (client-go's
/// generated informers for Nodes or Namespaces take no namespace), while namespaced types stay
/// limited to it.
#[tokio::test]
async fn a_namespaced_factory_still_lists_cluster_scoped_types_cluster_wide() {
    use k8s_openapi::api::core::v1::Namespace;
    let cluster = testenv::shared().await;
    let client = cluster.client().await.unwrap();
    let ns = cluster.new_namespace("cache-scope").await.unwrap();
    let other = cluster.new_namespace("cache-scope-other").await.unwrap();
    for (namespace, name) in [(&ns, "mine"), (&other, "theirs")] {
        Api::<ConfigMap>::namespaced(client.clone(), namespace)
            .create(&PostParams::default(), &configmap(name, &[], "v"))
            .await
            .unwrap();
    }
    let factory = SharedInformerFactory::new(
        client.clone(),
        FactoryOptions {
            namespace: Some(ns.clone()),
            ..Default::default()
        },
    );
    let namespaces = factory.informer::<Namespace>();
    let configmaps = factory.informer::<ConfigMap>();
    factory.start();
    let synced = tokio::time::timeout(Duration::from_secs(30), factory.wait_for_cache_sync())
        .await
        .expect("both informers sync within 30 s");
    assert_eq!(synced.values().filter(|s| **s).count(), 2, "{synced:?}");

    let namespace_names = names(&namespaces.lister().list(&LabelSelector::everything()));
    for expected in ["default", "kube-system", ns.as_str(), other.as_str()] {
        assert!(
            namespace_names.contains(expected),
            "{expected} missing from {namespace_names:?}"
        );
    }
    let configmap_names: BTreeSet<String> = configmaps
        .lister()
        .list(&LabelSelector::everything())
        .iter()
        .filter(|c| c.metadata.namespace.as_deref() == Some(other.as_str()))
        .map(|c| c.name_any())
        .collect();
    assert!(
        configmap_names.is_empty(),
        "a factory for {ns} cached ConfigMaps of {other}: {configmap_names:?}"
    );
    assert!(
        configmaps
            .lister()
            .list(&LabelSelector::everything())
            .iter()
            .any(|c| c.name_any() == "mine")
    );
    factory.shutdown().await;
}

// controller-runtime: TransformStripManagedFields, against the real apiserver: every object the
// server sends carries managedFields; through the transform, the cache holds none of them.
#[tokio::test]
async fn the_strip_managed_fields_transform_leaves_none_in_the_cache() {
    let cluster = testenv::shared().await;
    let client = cluster.client().await.unwrap();
    let ns = cluster.new_namespace("cache-strip").await.unwrap();
    let api = Api::<ConfigMap>::namespaced(client.clone(), &ns);
    for name in ["a", "b"] {
        api.create(&PostParams::default(), &configmap(name, &[], "v"))
            .await
            .unwrap();
    }
    let on_server = api.get("a").await.unwrap();
    assert!(
        on_server.metadata.managed_fields.is_some(),
        "the apiserver records managedFields for a create"
    );
    let factory = SharedInformerFactory::new(
        client.clone(),
        FactoryOptions {
            namespace: Some(ns.clone()),
            ..Default::default()
        },
    );
    let configmaps = factory.informer::<ConfigMap>();
    configmaps
        .set_transform(kubeloop::cache::strip_managed_fields)
        .unwrap();
    factory.start();
    tokio::time::timeout(Duration::from_secs(30), factory.wait_for_cache_sync())
        .await
        .expect("synced within 30 s");
    // One more through the watch.
    api.create(&PostParams::default(), &configmap("c", &[], "v"))
        .await
        .unwrap();
    eventually(
        "the watched ConfigMap in the cache",
        Duration::from_secs(30),
        || {
            let cached = configmaps.lister().list(&LabelSelector::everything());
            async move { cached.len() == 3 }
        },
    )
    .await;
    for cached in configmaps.lister().list(&LabelSelector::everything()) {
        assert_eq!(
            cached.metadata.managed_fields,
            None,
            "{}",
            cached.name_any()
        );
        assert_eq!(
            cached
                .data
                .as_ref()
                .and_then(|d| d.get("value"))
                .map(String::as_str),
            Some("v"),
            "the rest is kept"
        );
    }
    factory.shutdown().await;
}

// kubeloop's own: the factory's metadata-only informers (client-go's metadatainformer) on
// the default streaming list, typed and compact: the apiserver sends PartialObjectMetadata,
// the cache holds every object's metadata, and a label change arrives as an update.
#[tokio::test]
async fn the_factory_metadata_informer_streams_partial_object_metadata() {
    let cluster = testenv::shared().await;
    let client = cluster.client().await.unwrap();
    let ns = cluster.new_namespace("cache-metadata").await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    for i in 0..5 {
        let cm = configmap(&format!("cm-{i}"), &[("app", "web")], "x");
        api.create(&PostParams::default(), &cm).await.unwrap();
    }
    for store in [StoreKind::Typed, StoreKind::Compact] {
        let factory = SharedInformerFactory::new(
            client.clone(),
            FactoryOptions {
                namespace: Some(ns.clone()),
                store,
                ..Default::default()
            },
        );
        let informer = factory.metadata_informer::<ConfigMap>();
        assert!(informer.ptr_eq(&factory.metadata_informer::<ConfigMap>()));
        let checker = Checker::default();
        informer.add_event_handler(checker.clone()).unwrap();
        factory.start();
        assert!(factory.wait_for_cache_sync().await.values().all(|s| *s));
        let cached = informer
            .lister()
            .list(&LabelSelector::parse("app=web").unwrap());
        assert_eq!(cached.len(), 5, "{store:?}");
        for partial in &cached {
            let kind = partial.types.as_ref().map(|t| t.kind.as_str());
            assert_eq!(kind, Some("PartialObjectMetadata"), "{store:?}");
            let full = api
                .get(partial.metadata.name.as_deref().unwrap())
                .await
                .unwrap();
            assert_eq!(partial.metadata, full.metadata, "{store:?}");
        }
        let patch = serde_json::json!({"metadata": {"labels": {"store": format!("{store:?}")}}});
        api.patch("cm-0", &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap();
        eventually(
            "the label change in the metadata cache",
            Duration::from_secs(30),
            || async {
                let labels = informer
                    .lister()
                    .get(&ns, "cm-0")
                    .and_then(|p| p.metadata.labels.clone());
                match labels.as_ref().and_then(|l| l.get("store")) {
                    Some(app) if *app == format!("{store:?}") => Ok(()),
                    other => Err(format!("{other:?}")),
                }
            },
        )
        .await;
        let update = format!("update {ns}/cm-0");
        assert!(checker.snapshot().log.contains(&update), "{store:?}");
        factory.shutdown().await;
    }
}
