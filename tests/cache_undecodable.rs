//! Objects the informer's Rust type cannot decode, against the real apiserver: a CRD whose
//! schema allows what the type refuses (`spec.size` is `x-kubernetes-int-or-string`, the
//! type wants an integer; `status.phase` is optional in the schema, required by the type,
//! and removed through the status subresource as any client with status rights can).
//!
//! client-go fails the whole LIST on such an object and relists for ever, so no object of
//! the type is served in any namespace. Here every other object is served, in every
//! namespace, through a streaming list and after a restart through a paged LIST; a version
//! that stops decoding leaves the last good one served; the bad object is served once a
//! version decodes and removed when deleted; the metric counts each skip and the warning
//! names the object and its resourceVersion. The same on the protobuf wire: a built-in kind
//! read into a stricter type, through a paged LIST and a watch.

use std::borrow::Cow;
use std::collections::BTreeSet;
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube_client::api::{Api, DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube_client::core::{ApiResource, DynamicObject, GroupVersionKind};
use kube_client::{Client, Resource, ResourceExt};
use kubeloop::cache::{
    CacheMetrics, InformerConfig, ListWatch, ReflectorConfig, ReflectorMetrics,
    ResourceEventHandlerFuncs, SharedIndexInformer,
};
use kubeloop::testing::eventually;
use kubeloop_testenv as testenv;
use serde::{Deserialize, Serialize};
use serde_json::json;

/// The controller's view of a Gadget: stricter than the CRD's schema.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Gadget {
    #[serde(rename = "apiVersion", default)]
    api_version: String,
    #[serde(default)]
    kind: String,
    metadata: ObjectMeta,
    spec: GadgetSpec,
    #[serde(default)]
    status: Option<GadgetStatus>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
struct GadgetSpec {
    /// An integer here; the schema also allows a string.
    size: i64,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
struct GadgetStatus {
    /// Required here; optional in the schema.
    phase: String,
}

impl Resource for Gadget {
    type DynamicType = ();
    type Scope = k8s_openapi::NamespaceResourceScope;
    fn kind(_: &()) -> Cow<'_, str> {
        "Gadget".into()
    }
    fn group(_: &()) -> Cow<'_, str> {
        "test.kubeloop.dev".into()
    }
    fn version(_: &()) -> Cow<'_, str> {
        "v1".into()
    }
    fn plural(_: &()) -> Cow<'_, str> {
        "gadgets".into()
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

const TYPE: &str = "test.kubeloop.dev/v1/gadgets";
const RUN_LABEL: &str = "test.kubeloop.dev/run";

async fn ensure_gadget_crd(client: &Client) {
    let crd: CustomResourceDefinition = serde_json::from_value(json!({
        "metadata": {"name": "gadgets.test.kubeloop.dev"},
        "spec": {
            "group": "test.kubeloop.dev",
            "scope": "Namespaced",
            "names": {"plural": "gadgets", "singular": "gadget", "kind": "Gadget", "listKind": "GadgetList"},
            "versions": [{
                "name": "v1", "served": true, "storage": true,
                "subresources": {"status": {}},
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                    "spec": {"type": "object", "properties": {
                        "size": {"x-kubernetes-int-or-string": true},
                        "padding": {"type": "string"}
                    }},
                    "status": {"type": "object", "properties": {
                        "phase": {"type": "string"},
                        "ready": {"type": "boolean"}
                    }}
                }}}
            }]
        }
    }))
    .unwrap();
    kubeloop_testenv::ensure_crd(client, &crd).await;
}

fn gadget_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("test.kubeloop.dev", "v1", "Gadget"),
        "gadgets",
    )
}

/// Where the warnings of this test binary go (its one test sets the global subscriber).
#[derive(Clone, Default)]
struct Logs(Arc<Mutex<Vec<u8>>>);

impl Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        std::io::stderr().write_all(buf)?;
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Logs {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

/// What the handlers saw, as "add ns/name", "update ns/name", "delete ns/name".
#[derive(Clone, Default)]
struct Seen(Arc<Mutex<Vec<String>>>);

impl Seen {
    fn handlers(&self) -> ResourceEventHandlerFuncs<Gadget> {
        let (add, update, delete) = (self.clone(), self.clone(), self.clone());
        ResourceEventHandlerFuncs::new()
            .on_add(move |g: &Arc<Gadget>, _| add.push("add", g))
            .on_update(move |_, g: &Arc<Gadget>| update.push("update", g))
            .on_delete(move |gone| delete.push("delete", gone.object()))
    }
    fn push(&self, what: &str, g: &Gadget) {
        let key = format!("{}/{}", g.namespace().unwrap(), g.name_any());
        self.0.lock().unwrap().push(format!("{what} {key}"));
    }
    fn contains(&self, event: &str) -> bool {
        self.0.lock().unwrap().iter().any(|e| e == event)
    }
}

fn keys(informer: &SharedIndexInformer<Gadget>) -> BTreeSet<String> {
    informer.indexer().list_keys().into_iter().collect()
}

fn key_set(keys: &[&str]) -> BTreeSet<String> {
    keys.iter().map(|k| k.to_string()).collect()
}

async fn wait_for_keys(informer: &SharedIndexInformer<Gadget>, want: &[&str], what: &str) {
    let want = key_set(want);
    eventually(what, Duration::from_secs(30), || {
        let got = keys(informer);
        let want = want.clone();
        async move {
            if got == want {
                Ok(())
            } else {
                Err(format!("cache holds {got:?}, want {want:?}"))
            }
        }
    })
    .await;
}

async fn wait_for_count(m: &ReflectorMetrics, at_least: u64, what: &str) {
    eventually(what, Duration::from_secs(30), || {
        let n = m.undecodable_objects();
        async move {
            if n >= at_least {
                Ok(())
            } else {
                Err(format!("{n} undecodable objects counted, want {at_least}"))
            }
        }
    })
    .await;
}

fn informer(
    client: &Client,
    run: &str,
    metrics: &CacheMetrics,
    streaming: bool,
) -> SharedIndexInformer<Gadget> {
    bounded_informer(
        client,
        run,
        metrics,
        streaming,
        kubeloop::cache::MAX_OBJECT_BYTES,
    )
}

/// An informer that skips objects over `max_object_bytes`.
fn bounded_informer(
    client: &Client,
    run: &str,
    metrics: &CacheMetrics,
    streaming: bool,
    max_object_bytes: usize,
) -> SharedIndexInformer<Gadget> {
    SharedIndexInformer::new(
        ListWatch::<Gadget>::all(client.clone())
            .labels(&format!("{RUN_LABEL}={run}"))
            .max_object_bytes(max_object_bytes),
        InformerConfig {
            reflector: ReflectorConfig {
                use_watch_list: streaming,
                ..Default::default()
            },
            metrics: metrics.clone(),
            ..Default::default()
        },
    )
}

/// The warnings of this test binary, collected by the global subscriber set once.
fn logs() -> Logs {
    static LOGS: std::sync::OnceLock<Logs> = std::sync::OnceLock::new();
    LOGS.get_or_init(|| {
        let logs = Logs::default();
        let writer = logs.clone();
        tracing_subscriber::fmt()
            .with_max_level(tracing::Level::WARN)
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .init();
        logs
    })
    .clone()
}

#[tokio::test]
async fn objects_that_do_not_decode_never_stop_the_others_being_served() {
    let logs = logs();

    let cluster = testenv::shared().await;
    let client = cluster.client().await.unwrap();
    ensure_gadget_crd(&client).await;
    let ns1 = cluster.new_namespace("undecodable-a").await.unwrap();
    let ns2 = cluster.new_namespace("undecodable-b").await.unwrap();
    let run = ns1.clone();
    let ar = gadget_resource();
    let api1: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns1, &ar);
    let api2: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns2, &ar);
    let create = |api: &Api<DynamicObject>, name: &str, size: serde_json::Value| {
        let api = api.clone();
        let mut obj = DynamicObject::new(name, &ar).data(json!({"spec": {"size": size}}));
        obj.metadata.labels = Some([(RUN_LABEL.to_string(), run.clone())].into());
        async move { api.create(&PostParams::default(), &obj).await.unwrap() }
    };
    let set_status = |api: &Api<DynamicObject>, name: &str, status: serde_json::Value| {
        let (api, name) = (api.clone(), name.to_string());
        async move {
            api.patch_status(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({ "status": status })),
            )
            .await
            .unwrap()
        }
    };
    let k = |ns: &str, name: &str| format!("{ns}/{name}");

    // Good objects in both namespaces, and two the type cannot decode.
    create(&api1, "good-a", json!(1)).await;
    create(&api1, "good-c", json!(3)).await;
    create(&api2, "good-b", json!(2)).await;
    set_status(&api2, "good-b", json!({"phase": "Ready"})).await;
    create(&api2, "good-d", json!(4)).await;
    let bad_size = create(&api1, "bad-size", json!("big")).await;
    create(&api2, "bad-status", json!(5)).await;
    let bad_status = set_status(&api2, "bad-status", json!({"ready": true})).await;

    // A streaming list (the default) serves every other object.
    let metrics = CacheMetrics::new();
    let counted = metrics.reflector(TYPE);
    let inf = informer(&client, &run, &metrics, true);
    let seen = Seen::default();
    inf.add_event_handler(seen.handlers()).unwrap();
    inf.start();
    assert!(
        tokio::time::timeout(Duration::from_secs(60), inf.wait_for_cache_sync())
            .await
            .unwrap()
    );
    let good = [
        k(&ns1, "good-a"),
        k(&ns1, "good-c"),
        k(&ns2, "good-b"),
        k(&ns2, "good-d"),
    ];
    // The streaming list is a consistent read, so the cache holds them at sync; waiting
    // instead keeps the test true if it falls back to a LIST from the watch cache.
    wait_for_keys(
        &inf,
        &good.each_ref().map(String::as_str),
        "the good objects to be served",
    )
    .await;
    wait_for_count(&counted, 2, "the two bad objects to be counted").await;
    assert_eq!(counted.undecodable_objects(), 2);
    let log = logs.text();
    for (key, rv) in [
        (k(&ns1, "bad-size"), bad_size.resource_version().unwrap()),
        (
            k(&ns2, "bad-status"),
            bad_status.resource_version().unwrap(),
        ),
    ] {
        assert!(
            log.contains(&format!(
                "object {key} at resourceVersion {rv} does not decode"
            )),
            "the warning names {key} at {rv}:\n{log}"
        );
    }
    assert!(log.contains("missing field `phase`"), "{log}");
    assert!(log.contains("invalid type: string \"big\""), "{log}");

    // good-b loses its required status field through the status subresource: the cache
    // keeps serving the last version that decoded.
    let stale = set_status(&api2, "good-b", json!({"phase": null, "ready": true})).await;
    wait_for_count(&counted, 3, "the change of good-b to be counted").await;
    let kept = inf.lister().get(&ns2, "good-b").unwrap();
    assert_eq!(kept.status.as_ref().unwrap().phase, "Ready");
    let log = logs.text();
    let rv = stale.resource_version().unwrap();
    assert!(
        log.contains(&format!("object {}/good-b at resourceVersion {rv}", ns2)),
        "{log}"
    );

    // The bad objects are served once a version decodes: adds for the handlers.
    api1.patch(
        "bad-size",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"size": 6}})),
    )
    .await
    .unwrap();
    set_status(&api2, "bad-status", json!({"phase": "Ready"})).await;
    let mut now = good.to_vec();
    now.extend([k(&ns1, "bad-size"), k(&ns2, "bad-status")]);
    wait_for_keys(
        &inf,
        &now.iter().map(String::as_str).collect::<Vec<_>>(),
        "the fixed objects to be served",
    )
    .await;
    assert_eq!(inf.lister().get(&ns1, "bad-size").unwrap().spec.size, 6);
    assert!(seen.contains(&format!("add {}", k(&ns1, "bad-size"))));
    assert!(seen.contains(&format!("add {}", k(&ns2, "bad-status"))));

    // Deleted: gone from the cache, whether its last version decoded or not.
    api1.patch(
        "good-a",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"size": "huge"}})),
    )
    .await
    .unwrap();
    wait_for_count(&counted, 4, "the change of good-a to be counted").await;
    api1.delete("bad-size", &DeleteParams::default())
        .await
        .unwrap();
    api1.delete("good-a", &DeleteParams::default())
        .await
        .unwrap();
    now.retain(|key| *key != k(&ns1, "bad-size") && *key != k(&ns1, "good-a"));
    wait_for_keys(
        &inf,
        &now.iter().map(String::as_str).collect::<Vec<_>>(),
        "the deleted objects to leave the cache",
    )
    .await;
    assert!(seen.contains(&format!("delete {}", k(&ns1, "bad-size"))));
    assert!(seen.contains(&format!("delete {}", k(&ns1, "good-a"))));
    // good-a's final state did not decode either: one more skip, counted.
    wait_for_count(&counted, 5, "the deletion of good-a to be counted").await;
    // Never a failed list or a relist on the way.
    assert_eq!((counted.list_errors(), counted.relists()), (0, 0));
    inf.shutdown().await;

    // A restart with a paged LIST: good-b's current version does not decode, so it is not
    // served (there is no good version to keep); everything else is.
    let metrics = CacheMetrics::new();
    let counted = metrics.reflector(TYPE);
    let inf = informer(&client, &run, &metrics, false);
    inf.start();
    assert!(
        tokio::time::timeout(Duration::from_secs(60), inf.wait_for_cache_sync())
            .await
            .unwrap()
    );
    let after_restart = [k(&ns1, "good-c"), k(&ns2, "good-d"), k(&ns2, "bad-status")];
    assert_eq!(
        keys(&inf),
        key_set(&after_restart.each_ref().map(String::as_str))
    );
    assert_eq!(counted.undecodable_objects(), 1);
    assert_eq!(counted.list_errors(), 0);
    // ... until a version of it decodes.
    set_status(&api2, "good-b", json!({"phase": "Ready"})).await;
    let mut all = after_restart.to_vec();
    all.push(k(&ns2, "good-b"));
    wait_for_keys(
        &inf,
        &all.iter().map(String::as_str).collect::<Vec<_>>(),
        "good-b to be served again",
    )
    .await;

    // The bound on one object, end to end (a small one here; client-go's is 16 MiB): an
    // object over it is skipped like one that does not decode, in a paged LIST and in the
    // watch, named from its first bytes; the others are served. `big` is within the default
    // bound; once this informer has it, the apiserver's watch cache (which answers the next
    // informer's LIST) has it too. Its bulk is in `spec`: the apiserver writes a custom
    // object's metadata keys sorted, so an 8 KiB annotation would stand before the name and,
    // past this test's 4 KiB bound, leave it unread whenever the bytes arrive in more than one
    // chunk (with the real 16 MiB bound that cannot happen: annotations are capped at 256 KiB).
    let padding = "x".repeat(8 * 1024);
    let mut big =
        DynamicObject::new("big", &ar).data(json!({"spec": {"size": 7, "padding": padding}}));
    big.metadata.labels = Some([(RUN_LABEL.to_string(), run.clone())].into());
    let big = api1.create(&PostParams::default(), &big).await.unwrap();
    let mut with_big = all.clone();
    with_big.push(k(&ns1, "big"));
    wait_for_keys(
        &inf,
        &with_big.iter().map(String::as_str).collect::<Vec<_>>(),
        "big to be served within the default bound",
    )
    .await;
    inf.shutdown().await;
    let metrics = CacheMetrics::new();
    let counted = metrics.reflector(TYPE);
    let inf = bounded_informer(&client, &run, &metrics, false, 4096);
    inf.start();
    assert!(
        tokio::time::timeout(Duration::from_secs(60), inf.wait_for_cache_sync())
            .await
            .unwrap()
    );
    assert_eq!(
        keys(&inf),
        all.iter().map(String::to_string).collect::<BTreeSet<_>>()
    );
    assert_eq!(counted.undecodable_objects(), 1);
    let log = logs.text();
    let rv = big.resource_version().unwrap();
    assert!(
        log.contains(&format!("object {}/big at resourceVersion {rv} is ", ns1))
            && log.contains("over the bound of 4096 bytes on one object"),
        "{log}"
    );
    // A watch line over the bound is skipped too, and the watch goes on.
    api2.patch(
        "good-d",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"annotations": {"padding": padding}}})),
    )
    .await
    .unwrap();
    wait_for_count(&counted, 2, "the oversized change of good-d to be counted").await;
    api1.patch(
        "big",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"padding": null}})),
    )
    .await
    .unwrap();
    all.push(k(&ns1, "big"));
    wait_for_keys(
        &inf,
        &all.iter().map(String::as_str).collect::<Vec<_>>(),
        "big to be served once it is within the bound",
    )
    .await;
    assert!(
        inf.lister()
            .get(&ns2, "good-d")
            .unwrap()
            .metadata
            .annotations
            .is_none()
    );
    assert_eq!(
        (counted.list_errors(), counted.relists()),
        (0, 0),
        "{}",
        logs.text()
    );
    inf.shutdown().await;
}

/// A controller's view of a ConfigMap that requires `data` (a ConfigMap may have none): a
/// built-in kind, so the informer reads it in protobuf, and one the apiserver serves that
/// does not decode.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct FilledConfigMap {
    metadata: ObjectMeta,
    data: std::collections::BTreeMap<String, String>,
}

impl Resource for FilledConfigMap {
    type DynamicType = ();
    type Scope = k8s_openapi::NamespaceResourceScope;
    fn kind(_: &()) -> Cow<'_, str> {
        "ConfigMap".into()
    }
    fn group(_: &()) -> Cow<'_, str> {
        "".into()
    }
    fn version(_: &()) -> Cow<'_, str> {
        "v1".into()
    }
    fn plural(_: &()) -> Cow<'_, str> {
        "configmaps".into()
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// The protobuf wire, end to end: a paged LIST in protobuf skips the ConfigMap without
/// `data` and names it (namespace/name and resourceVersion) in its warning, serving the
/// others; a watch frame of another such ConfigMap is skipped and named the same way, and the
/// watch goes on.
#[tokio::test]
async fn a_protobuf_list_and_watch_skip_and_name_an_object_that_does_not_decode() {
    let logs = logs();
    let cluster = testenv::shared().await;
    let client = cluster.client().await.unwrap();
    let ns = cluster.new_namespace("undecodable-pb").await.unwrap();
    let api: Api<k8s_openapi::api::core::v1::ConfigMap> = Api::namespaced(client.clone(), &ns);
    let create = |name: &str, data: serde_json::Value| {
        let api = api.clone();
        let cm = serde_json::from_value(json!({"metadata": {"name": name}, "data": data})).unwrap();
        async move { api.create(&PostParams::default(), &cm).await.unwrap() }
    };
    create("filled", json!({"a": "1"})).await;
    let empty = create("empty", json!(null)).await;
    create("filled-2", json!({"b": "2"})).await;

    let list_watch = ListWatch::<FilledConfigMap>::namespaced(client.clone(), &ns);
    assert!(
        list_watch.asks_for_protobuf(),
        "a built-in kind is read in protobuf"
    );
    let metrics = CacheMetrics::new();
    let counted = metrics.reflector("v1/configmaps");
    let inf = SharedIndexInformer::new(
        list_watch,
        InformerConfig {
            reflector: ReflectorConfig {
                use_watch_list: false,
                ..Default::default()
            },
            metrics: metrics.clone(),
            ..Default::default()
        },
    );
    inf.start();
    assert!(
        tokio::time::timeout(Duration::from_secs(60), inf.wait_for_cache_sync())
            .await
            .unwrap()
    );
    let served: BTreeSet<String> = inf.indexer().list_keys().into_iter().collect();
    assert_eq!(
        served,
        key_set(&[&format!("{ns}/filled"), &format!("{ns}/filled-2")])
    );
    assert_eq!(counted.undecodable_objects(), 1);
    let log = logs.text();
    let rv = empty.resource_version().unwrap();
    assert!(
        log.contains(&format!(
            "object {ns}/empty at resourceVersion {rv} does not decode"
        )) && log.contains("missing field `data`"),
        "the LIST's warning names {ns}/empty at {rv}:\n{log}"
    );

    // A watch frame that does not decode: skipped, named, counted; the watch goes on.
    let empty_2 = create("empty-2", json!(null)).await;
    wait_for_count(&counted, 2, "the watch frame of empty-2 to be counted").await;
    let log = logs.text();
    let rv = empty_2.resource_version().unwrap();
    assert!(
        log.contains(&format!(
            "object {ns}/empty-2 at resourceVersion {rv} does not decode"
        )),
        "the watch's warning names {ns}/empty-2 at {rv}:\n{log}"
    );
    create("filled-3", json!({"c": "3"})).await;
    let want = [
        format!("{ns}/filled"),
        format!("{ns}/filled-2"),
        format!("{ns}/filled-3"),
    ];
    eventually("filled-3 to be served", Duration::from_secs(30), || {
        let got: BTreeSet<String> = inf.indexer().list_keys().into_iter().collect();
        let want = key_set(&want.each_ref().map(String::as_str));
        async move {
            if got == want {
                Ok(())
            } else {
                Err(format!("cache holds {got:?}, want {want:?}"))
            }
        }
    })
    .await;
    assert_eq!((counted.list_errors(), counted.relists()), (0, 0));
    inf.shutdown().await;
}
