//! The protobuf decoder (`kubeloop::protobuf`) against the real apiserver: objects of the
//! built-in kinds, made with the awkward fields set (both arms of IntOrString, times with
//! fractions, pointer zeros, empty maps and strings, binary data, inline fields, raw JSON),
//! are read by GET, LIST, streaming list and WATCH as JSON and as protobuf; what the protobuf
//! decodes to equals the JSON key for key, and decodes to the same k8s-openapi values; the
//! informers' `ListWatch`, which asks for protobuf by default, lists and streams the same
//! objects as when it is told to read JSON, for every kind here and metadata-only too.

use std::collections::BTreeMap;
use std::time::Duration;

use futures::StreamExt;
use http_body_util::BodyExt;
use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::api::batch::v1::{CronJob, Job};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{
    ConfigMap, Event, Namespace, PersistentVolumeClaim, Pod, Secret, Service, ServiceAccount,
};
use k8s_openapi::api::networking::v1::{Ingress, NetworkPolicy};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube_client::core::{
    ApiResource, DynamicObject, GroupVersionKind, PartialObjectMeta, WatchEvent,
};
use kube_client::{Client, ResourceExt};
use kubeloop::cache::{
    CacheObject, INITIAL_EVENTS_END_ANNOTATION, ListOptions, ListWatch, ListerWatcher,
    WatchOptions, Wire,
};
use kubeloop::protobuf::{self, Frames, RawWatchEvent};
use kubeloop_testenv as testenv;
use serde::de::DeserializeOwned;
use serde_json::Value;

const PROTOBUF: &str = "application/vnd.kubernetes.protobuf";

/// Every namespaced object the test makes: (API path segment, kind's plural, name).
const OBJECTS: &[(&str, &str, &str)] = &[
    ("api/v1", "configmaps", "awkward"),
    ("api/v1", "configmaps", "bare"),
    ("api/v1", "secrets", "creds"),
    ("api/v1", "services", "web"),
    ("api/v1", "serviceaccounts", "robot"),
    ("api/v1", "persistentvolumeclaims", "data"),
    ("api/v1", "pods", "web-0"),
    ("api/v1", "events", "web-0.1"),
    ("apis/apps/v1", "deployments", "web"),
    ("apis/apps/v1", "statefulsets", "db"),
    ("apis/batch/v1", "jobs", "once"),
    ("apis/batch/v1", "cronjobs", "nightly"),
    ("apis/coordination.k8s.io/v1", "leases", "leader"),
    ("apis/rbac.authorization.k8s.io/v1", "roles", "reader"),
    (
        "apis/rbac.authorization.k8s.io/v1",
        "rolebindings",
        "reader",
    ),
    ("apis/networking.k8s.io/v1", "networkpolicies", "deny"),
    ("apis/networking.k8s.io/v1", "ingresses", "web"),
    ("apis/autoscaling/v2", "horizontalpodautoscalers", "web"),
    ("apis/policy/v1", "poddisruptionbudgets", "web"),
];

const MANIFEST: &str = r#"
apiVersion: v1
kind: ConfigMap
metadata: {name: awkward, labels: {app: web, empty: ""}, annotations: {}}
data: {a: "1", empty: ""}
binaryData: {blob: AAEC/w==}
immutable: false
---
apiVersion: v1
kind: ConfigMap
metadata: {name: bare}
---
apiVersion: v1
kind: Secret
metadata: {name: creds}
type: Opaque
data: {password: aHVudGVyMg==}
---
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  selector: {app: web}
  ports:
  - {name: http, port: 80, targetPort: http}
  - {name: alt, port: 8080, targetPort: 8081}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: robot}
automountServiceAccountToken: false
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: data}
spec:
  accessModes: [ReadWriteOnce]
  storageClassName: ""
  resources: {requests: {storage: 5Gi}}
---
apiVersion: v1
kind: Pod
metadata: {name: web-0, labels: {app: web}}
spec:
  terminationGracePeriodSeconds: 0
  tolerations: [{key: k, operator: Exists, tolerationSeconds: -1, effect: NoExecute}]
  containers:
  - name: web
    image: nginx:1.27
    command: [nginx, -g, daemon off;]
    ports: [{name: http, containerPort: 80}]
    env: [{name: EMPTY}, {name: FROM, valueFrom: {fieldRef: {fieldPath: metadata.name}}}]
    resources: {limits: {cpu: 500m, memory: 1Gi}, requests: {cpu: "0.1"}}
    livenessProbe: {httpGet: {path: /healthz, port: http}, periodSeconds: 10}
    readinessProbe: {tcpSocket: {port: 8080}}
    securityContext: {runAsUser: 0, runAsNonRoot: false, privileged: false}
  volumes:
  - {name: config, configMap: {name: awkward, defaultMode: 0644}}
  - {name: scratch, emptyDir: {sizeLimit: 64Mi}}
---
apiVersion: v1
kind: Event
metadata: {name: web-0.1}
involvedObject: {kind: Pod, name: web-0, namespace: NAMESPACE}
reason: Started
message: started
type: Normal
count: 2
firstTimestamp: "2026-11-26T15:04:05Z"
lastTimestamp: "2026-11-26T15:04:05Z"
eventTime: "2026-11-26T15:04:05.123456Z"
reportingComponent: kubelet
reportingInstance: node-0
action: Started
series: {count: 2, lastObservedTime: "2026-11-26T15:04:06.654321Z"}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: web}
spec:
  replicas: 0
  selector: {matchLabels: {app: web}, matchExpressions: [{key: tier, operator: In, values: [a, b]}]}
  strategy: {type: RollingUpdate, rollingUpdate: {maxSurge: 25%, maxUnavailable: 0}}
  template:
    metadata: {labels: {app: web, tier: a}}
    spec: {containers: [{name: web, image: nginx:1.27}]}
---
apiVersion: apps/v1
kind: StatefulSet
metadata: {name: db}
spec:
  replicas: 3
  serviceName: db
  selector: {matchLabels: {app: db}}
  template:
    metadata: {labels: {app: db}}
    spec: {containers: [{name: db, image: postgres:17}]}
  volumeClaimTemplates:
  - metadata: {name: data}
    spec: {accessModes: [ReadWriteOnce], resources: {requests: {storage: 1Gi}}}
---
apiVersion: batch/v1
kind: Job
metadata: {name: once}
spec:
  suspend: true
  backoffLimit: 0
  template:
    spec: {restartPolicy: Never, containers: [{name: once, image: busybox:1.37}]}
---
apiVersion: batch/v1
kind: CronJob
metadata: {name: nightly}
spec:
  schedule: "0 3 * * *"
  timeZone: Etc/UTC
  suspend: true
  jobTemplate:
    spec:
      template:
        spec: {restartPolicy: OnFailure, containers: [{name: nightly, image: busybox:1.37}]}
---
apiVersion: coordination.k8s.io/v1
kind: Lease
metadata: {name: leader}
spec:
  holderIdentity: a_1
  leaseDurationSeconds: 15
  acquireTime: "2026-11-26T15:04:05.123456Z"
  renewTime: "2026-11-26T15:04:05.000001Z"
  leaseTransitions: 0
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: reader}
rules: [{apiGroups: [""], resources: [configmaps], verbs: [get, list, watch]}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: reader}
subjects: [{kind: ServiceAccount, name: robot}]
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: reader}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: deny}
spec:
  podSelector: {}
  policyTypes: [Ingress]
  ingress: [{ports: [{port: 443, endPort: 8443}]}]
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {name: web}
spec:
  ingressClassName: nginx
  rules:
  - host: example.com
    http:
      paths: [{path: /, pathType: Prefix, backend: {service: {name: web, port: {number: 80}}}}]
---
apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata: {name: web}
spec:
  scaleTargetRef: {apiVersion: apps/v1, kind: Deployment, name: web}
  minReplicas: 1
  maxReplicas: 5
  metrics: [{type: Resource, resource: {name: cpu, target: {type: AverageValue, averageValue: 250m}}}]
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata: {name: web}
spec:
  minAvailable: 50%
  selector: {matchLabels: {app: web}}
"#;

/// A GET of `path` with `accept`: the response's content type and body.
async fn get(client: &Client, path: &str, accept: &str) -> (u16, String, Vec<u8>) {
    let request = http::Request::get(path)
        .header(http::header::ACCEPT, accept)
        .body(Vec::new())
        .unwrap();
    let response = client
        .send(request.map(kube_client::client::Body::from))
        .await
        .unwrap_or_else(|e| panic!("GET {path}: {e}"));
    let status = response.status().as_u16();
    let content_type = response
        .headers()
        .get(http::header::CONTENT_TYPE)
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default();
    let body = response
        .into_body()
        .collect()
        .await
        .unwrap()
        .to_bytes()
        .to_vec();
    (status, content_type, body)
}

/// `path` read as JSON and as protobuf: the JSON, and what the protobuf decodes to. An object
/// is read again until both reads have its same version (the CRD's status is written by the
/// apiserver's own controllers while other tests apply it).
async fn both(client: &Client, path: &str) -> (Value, Value) {
    for _ in 0..20 {
        let (status, content_type, json) = get(client, path, "application/json").await;
        assert_eq!(
            status,
            200,
            "GET {path}: {}",
            String::from_utf8_lossy(&json)
        );
        assert_eq!(content_type, "application/json", "{path}");
        let (status, content_type, pb) = get(client, path, PROTOBUF).await;
        assert_eq!(status, 200, "GET {path} as protobuf");
        assert_eq!(content_type, PROTOBUF, "{path}");
        let decoded: Value = protobuf::from_slice(&pb)
            .unwrap_or_else(|e| panic!("{path}: the protobuf did not decode: {e}"));
        let json: Value = serde_json::from_slice(&json).unwrap();
        let version = |v: &Value| v["metadata"]["resourceVersion"].clone();
        if json["items"].is_array() || version(&json) == version(&decoded) {
            return (json, decoded);
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    panic!("{path} changed between every JSON and protobuf read");
}

/// Leaves out the `apiVersion` and `kind` of objects embedded in others (a StatefulSet's
/// `volumeClaimTemplates`): Go's TypeMeta has no protobuf tag, so only the top-level object's,
/// carried by the envelope, is on the wire (client-go's objects read from protobuf lack them
/// too); k8s-openapi's types keep no TypeMeta, so their values are equal either way.
fn without_embedded_type_meta(value: &mut Value, top: bool) {
    match value {
        Value::Object(fields) => {
            if !top && fields.contains_key("metadata") {
                fields.remove("apiVersion");
                fields.remove("kind");
            }
            fields
                .values_mut()
                .for_each(|v| without_embedded_type_meta(v, false));
        }
        Value::Array(items) => items
            .iter_mut()
            .for_each(|v| without_embedded_type_meta(v, false)),
        _ => {}
    }
}

fn assert_same(path: &str, json: &Value, decoded: &Value) {
    let (mut json, mut decoded) = (json.clone(), decoded.clone());
    // A list's items are embedded objects with metadata; the list itself is the top.
    without_embedded_type_meta(&mut json, true);
    without_embedded_type_meta(&mut decoded, true);
    assert_eq!(
        decoded,
        json,
        "{path}: the protobuf decoded to\n{}\nbut the JSON is\n{}",
        serde_json::to_string_pretty(&decoded).unwrap(),
        serde_json::to_string_pretty(&json).unwrap()
    );
}

/// `path` decodes to the same `T` from both wires.
async fn same_typed<T: DeserializeOwned + PartialEq + std::fmt::Debug>(
    client: &Client,
    path: &str,
) {
    let (_, _, json) = get(client, path, "application/json").await;
    let (_, _, pb) = get(client, path, PROTOBUF).await;
    let from_json: T = serde_json::from_slice(&json).unwrap();
    let from_pb: T = protobuf::from_slice(&pb).unwrap_or_else(|e| panic!("{path}: {e}"));
    assert_eq!(from_pb, from_json, "{path}");
}

async fn setup() -> (Client, String) {
    let cluster = testenv::shared().await;
    let client = cluster.client().await.unwrap();
    let ns = cluster.new_namespace("protobuf").await.unwrap();
    cluster
        .kubectl_stdin(
            &["apply", "-n", &ns, "-f", "-"],
            Some(&MANIFEST.replace("NAMESPACE", &ns)),
        )
        .ok();
    (client, ns)
}

/// Creates the sample controller's CRD (once per cluster) and waits until it is served.
async fn ensure_foo_crd(client: &Client) {
    let crd: CustomResourceDefinition =
        serde_saphyr::from_str(include_str!("../../crds/foo.yaml")).expect("the CRD parses");
    testenv::ensure_crd(client, &crd).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn every_kind_reads_the_same_by_get_and_list_from_both_wires() {
    let (client, ns) = setup().await;
    ensure_foo_crd(&client).await;
    for (api, plural, name) in OBJECTS {
        let path = format!("/{api}/namespaces/{ns}/{plural}/{name}");
        let (json, decoded) = both(&client, &path).await;
        assert_same(&path, &json, &decoded);

        // A LIST: the items and the list's metadata but its resourceVersion (another test's
        // write between the two LISTs moves it).
        let path = format!("/{api}/namespaces/{ns}/{plural}");
        let (mut json, mut decoded) = both(&client, &path).await;
        for list in [&mut json, &mut decoded] {
            list["metadata"]
                .as_object_mut()
                .unwrap()
                .remove("resourceVersion");
        }
        assert_same(&path, &json, &decoded);
    }
    for path in [
        format!("/api/v1/namespaces/{ns}"),
        "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/foos.samplecontroller.k8s.io"
            .to_string(),
    ] {
        let (json, decoded) = both(&client, &path).await;
        assert_same(&path, &json, &decoded);
    }

    same_typed::<ConfigMap>(
        &client,
        &format!("/api/v1/namespaces/{ns}/configmaps/awkward"),
    )
    .await;
    same_typed::<Service>(&client, &format!("/api/v1/namespaces/{ns}/services/web")).await;
    same_typed::<Pod>(&client, &format!("/api/v1/namespaces/{ns}/pods/web-0")).await;
    same_typed::<Deployment>(
        &client,
        &format!("/apis/apps/v1/namespaces/{ns}/deployments/web"),
    )
    .await;
    same_typed::<StatefulSet>(
        &client,
        &format!("/apis/apps/v1/namespaces/{ns}/statefulsets/db"),
    )
    .await;
    same_typed::<Lease>(
        &client,
        &format!("/apis/coordination.k8s.io/v1/namespaces/{ns}/leases/leader"),
    )
    .await;
    same_typed::<CustomResourceDefinition>(
        &client,
        "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/foos.samplecontroller.k8s.io",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_error_body_is_a_protobuf_status() {
    let (client, ns) = setup().await;
    let path = format!("/api/v1/namespaces/{ns}/configmaps/missing");
    let (status, content_type, body) = get(&client, &path, PROTOBUF).await;
    assert_eq!(status, 404);
    assert_eq!(content_type, PROTOBUF);
    let decoded: kube_client::core::Status = protobuf::from_slice(&body).unwrap();
    assert_eq!(decoded.code, 404);
    assert_eq!(decoded.reason, "NotFound");
    assert!(
        decoded.message.contains("\"missing\""),
        "{}",
        decoded.message
    );
}

/// The events of a protobuf watch of `path` (a query string included) until `done` says so.
async fn watch_frames(
    client: &Client,
    path: &str,
    mut done: impl FnMut(&WatchEvent<ConfigMap>) -> bool,
) -> Vec<WatchEvent<ConfigMap>> {
    let request = http::Request::get(path)
        .header(http::header::ACCEPT, PROTOBUF)
        .body(Vec::new())
        .unwrap();
    let response = client
        .send(request.map(kube_client::client::Body::from))
        .await
        .unwrap();
    assert_eq!(
        response.headers()[http::header::CONTENT_TYPE],
        protobuf::WATCH_CONTENT_TYPE
    );
    let mut body = response.into_body();
    let mut frames = Frames::new();
    let mut events = Vec::new();
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        while let Some(frame) = frames.next_frame() {
            let event = RawWatchEvent::parse(frame)
                .unwrap()
                .decode::<ConfigMap>()
                .unwrap();
            let stop = done(&event);
            events.push(event);
            if stop {
                return events;
            }
        }
        let chunk = tokio::time::timeout_at(deadline, body.frame())
            .await
            .expect("the watch's events within 30 s")
            .expect("the watch body ended")
            .unwrap();
        if let Ok(data) = chunk.into_data() {
            frames.push(&data);
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_streaming_list_and_a_watch_deliver_what_json_reads() {
    let (client, ns) = setup().await;
    let list = format!("/api/v1/namespaces/{ns}/configmaps");
    let (_, _, json) = get(&client, &list, "application/json").await;
    let listed: k8s_openapi::List<ConfigMap> = serde_json::from_slice(&json).unwrap();
    let listed: BTreeMap<String, ConfigMap> = listed
        .items
        .into_iter()
        .map(|cm| (cm.metadata.name.clone().unwrap(), cm))
        .collect();

    // The streaming list: the namespace's ConfigMaps as ADDED events, then the bookmark that
    // ends the initial events.
    let stream = format!(
        "{list}?watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true"
    );
    let events = watch_frames(&client, &stream, |e| {
        matches!(e, WatchEvent::Bookmark(b) if b.metadata.annotations.contains_key("k8s.io/initial-events-end"))
    })
    .await;
    let mut streamed = BTreeMap::new();
    for event in &events {
        match event {
            WatchEvent::Added(cm) => {
                streamed.insert(cm.metadata.name.clone().unwrap(), cm.clone());
            }
            WatchEvent::Bookmark(b) => assert!(!b.metadata.resource_version.is_empty()),
            other => panic!("{other:?} in a streaming list"),
        }
    }
    assert_eq!(streamed, listed);

    // A watch from the list's version sees an edit as the JSON GET after it reads it.
    let version = listed["awkward"].metadata.resource_version.clone().unwrap();
    let watch = format!("{list}?watch=true&resourceVersion={version}");
    let edit = {
        let client = client.clone();
        let ns = ns.clone();
        tokio::spawn(async move {
            tokio::time::sleep(std::time::Duration::from_millis(300)).await;
            let api: kube_client::Api<ConfigMap> = kube_client::Api::namespaced(client, &ns);
            let patch =
                serde_json::json!({"data": {"b": "2"}, "metadata": {"annotations": {"note": ""}}});
            api.patch(
                "bare",
                &kube_client::api::PatchParams::default(),
                &kube_client::api::Patch::Merge(patch),
            )
            .await
            .unwrap()
        })
    };
    let events = watch_frames(&client, &watch, |e| matches!(e, WatchEvent::Modified(_))).await;
    let after = edit.await.unwrap();
    let Some(WatchEvent::Modified(seen)) = events.last() else {
        panic!("{events:?}")
    };
    assert_eq!(seen, &after);
}

/// A LIST at `resource_version` exactly, so two reads see the same objects whatever is
/// written between them.
fn exactly_at(resource_version: &str) -> ListOptions {
    ListOptions {
        resource_version: Some(resource_version.to_string()),
        resource_version_match: Some("Exact".to_string()),
        ..Default::default()
    }
}

/// The objects as JSON values, to compare (kube's `PartialObjectMeta` has no `PartialEq`).
fn values<K: serde::Serialize>(objects: &[K]) -> Vec<Value> {
    objects
        .iter()
        .map(|o| serde_json::to_value(o).unwrap())
        .collect()
}

/// What `lw` lists and streams asking for protobuf (its default) equals what it lists and
/// streams in JSON, object for object.
async fn same_through_list_watch<K: CacheObject>(lw: ListWatch<K>)
where
    K::DynamicType: 'static,
{
    let what = lw.type_description();
    assert!(lw.asks_for_protobuf(), "{what} asks for protobuf");
    let json = lw.clone().wire(Wire::Json);
    let listed = lw.list(&ListOptions::default()).await.unwrap();
    let from_json = json
        .list(&exactly_at(&listed.resource_version))
        .await
        .unwrap();
    assert!(!listed.items.is_empty(), "{what}: nothing listed");
    assert!(
        listed.undecodable.is_empty() && from_json.undecodable.is_empty(),
        "{what}: {:?} {:?}",
        listed.undecodable,
        from_json.undecodable
    );
    assert_eq!(
        values(&listed.items),
        values(&from_json.items),
        "{what}: LIST"
    );

    // The streaming list, in each wire, holds what a JSON LIST at its bookmark's version does.
    for (wire, lw) in [("protobuf", &lw), ("JSON", &json)] {
        let options = WatchOptions {
            send_initial_events: true,
            resource_version_match: Some("NotOlderThan".into()),
            allow_watch_bookmarks: true,
            ..Default::default()
        };
        let mut events = lw.watch(&options).await.unwrap();
        let mut streamed = Vec::new();
        let version = loop {
            let event = match tokio::time::timeout(Duration::from_secs(30), events.next()).await {
                Ok(Some(Ok(event))) => event,
                Ok(Some(Err(e))) => panic!("{what} in {wire}: {e}"),
                Ok(None) => panic!("{what} in {wire}: the stream ended"),
                Err(_) => panic!("{what} in {wire}: no initial-events bookmark within 30 s"),
            };
            match event {
                WatchEvent::Added(object) => streamed.push(object),
                WatchEvent::Bookmark(b)
                    if b.metadata
                        .annotations
                        .contains_key(INITIAL_EVENTS_END_ANNOTATION) =>
                {
                    break b.metadata.resource_version;
                }
                WatchEvent::Bookmark(_) => {}
                other => panic!("{what} in {wire}: {other:?} in a streaming list"),
            }
        };
        streamed.sort_by_key(|o| (o.namespace(), o.name_any()));
        let at_version = json.list(&exactly_at(&version)).await.unwrap();
        assert_eq!(
            values(&streamed),
            values(&at_version.items),
            "{what}: streaming list in {wire}"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_informers_list_watch_reads_the_same_from_both_wires() {
    let (client, ns) = setup().await;
    macro_rules! typed {
        ($($kind:ty),*) => {
            $(same_through_list_watch(ListWatch::<$kind>::namespaced(client.clone(), &ns)).await;)*
        };
    }
    typed!(
        ConfigMap,
        Secret,
        Service,
        ServiceAccount,
        PersistentVolumeClaim,
        Pod,
        Event,
        Deployment,
        StatefulSet,
        Job,
        CronJob,
        Lease,
        Role,
        RoleBinding,
        NetworkPolicy,
        Ingress,
        HorizontalPodAutoscaler,
        PodDisruptionBudget
    );
    same_through_list_watch(ListWatch::<Namespace>::all(client.clone())).await;
    ensure_foo_crd(&client).await;
    same_through_list_watch(ListWatch::<CustomResourceDefinition>::all(client.clone())).await;

    // Metadata only: protobuf PartialObjectMetadata for built-in kinds and custom resources.
    same_through_list_watch(ListWatch::<PartialObjectMeta<ConfigMap>>::namespaced(
        client.clone(),
        &ns,
    ))
    .await;
    same_through_list_watch(ListWatch::<PartialObjectMeta<Pod>>::namespaced(
        client.clone(),
        &ns,
    ))
    .await;
    testenv::shared()
        .await
        .kubectl_stdin(
            &["apply", "-n", &ns, "-f", "-"],
            Some(
                "apiVersion: samplecontroller.k8s.io/v1alpha1\nkind: Foo\n\
                 metadata: {name: web, labels: {app: web}}\nspec: {deploymentName: web, replicas: 1}\n",
            ),
        )
        .ok();
    let foos = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("samplecontroller.k8s.io", "v1alpha1", "Foo"),
        "foos",
    );
    let custom = ListWatch::<DynamicObject>::new(client.clone(), &foos, Some(&ns));
    assert!(
        !custom.asks_for_protobuf(),
        "a custom resource is read as JSON"
    );
    same_through_list_watch(ListWatch::<PartialObjectMeta<DynamicObject>>::new(
        client.clone(),
        &foos,
        Some(&ns),
    ))
    .await;
}
