//! `kubeloop::client::WriteApi` against the real apiserver: a Deployment (create, replace,
//! replace_status), a Lease and an Event of each API (create, replace; neither has a status
//! subresource) written as protobuf come out as the same objects kube-client's `Api` makes of
//! the same writes in JSON, and each answer, decoded from protobuf, is what a GET in JSON reads.
//! A recording layer under the writing client checks that every write went as protobuf and
//! every answer, the errors too, came back as protobuf.

use std::sync::Arc;

use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec, DeploymentStatus};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{
    Container, Event, EventSource, ObjectReference, PodSpec, PodTemplateSpec,
};
use k8s_openapi::api::events::v1::{Event as V1Event, EventSeries};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, MicroTime, ObjectMeta, Time};
use kube_client::api::{Api, PostParams};
use kube_client::client::Body;
use kube_client::core::NamespaceResourceScope;
use kube_client::{Client, Resource};
use kubeloop::client::WriteApi;
use kubeloop_testenv as testenv;
use parking_lot::Mutex;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

const PROTOBUF: &str = "application/vnd.kubernetes.protobuf";

/// One exchange as it crossed the wire: method, path, the request's and the answer's
/// `Content-Type`, the answer's code.
#[derive(Debug, Clone)]
struct Exchange {
    method: http::Method,
    path: String,
    sent: String,
    answered: String,
    code: u16,
}

/// A client to the cluster whose every exchange is recorded.
fn recording(base: Client) -> (Client, Arc<Mutex<Vec<Exchange>>>) {
    let log = Arc::new(Mutex::new(Vec::new()));
    let record = log.clone();
    let content_type = |headers: &http::HeaderMap| {
        headers
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string()
    };
    let service = tower::service_fn(move |request: http::Request<Body>| {
        let (base, record) = (base.clone(), record.clone());
        async move {
            let (method, path) = (request.method().clone(), request.uri().path().to_string());
            let sent = content_type(request.headers());
            let response = base.send(request).await?;
            record.lock().push(Exchange {
                method,
                path,
                sent,
                answered: content_type(response.headers()),
                code: response.status().as_u16(),
            });
            Ok::<_, kube_client::Error>(response)
        }
    });
    (Client::new(service, "default"), log)
}

/// The object without what the apiserver sets on every write (and the name, which differs
/// between the twins).
fn without_server_fields<K: Serialize>(object: &K) -> Value {
    let mut value = serde_json::to_value(object).unwrap();
    let meta = value["metadata"].as_object_mut().unwrap();
    for field in [
        "name",
        "uid",
        "resourceVersion",
        "creationTimestamp",
        "managedFields",
    ] {
        meta.remove(field);
    }
    value
}

/// One kind's writes: `object` created as `<name>-pb` through `writes` and as `<name>-json`
/// through kube's `Api`, then each answer edited by `edit` and replaced, then (if given) by
/// `status` and its status replaced. After every step the protobuf twin equals the JSON twin
/// but for server-set fields, and the protobuf answer equals a GET of it in JSON. Returns the
/// number of writes sent through `writes`.
async fn twins<K>(
    writes: &WriteApi<K>,
    api: &Api<K>,
    object: &K,
    edit: impl Fn(&mut K),
    status: Option<fn(&mut K)>,
) -> usize
where
    K: Resource<DynamicType = (), Scope = NamespaceResourceScope>
        + Clone
        + Serialize
        + DeserializeOwned
        + PartialEq
        + std::fmt::Debug,
{
    let name = object.meta().name.clone().unwrap();
    let named = |suffix: &str| {
        let mut twin = object.clone();
        twin.meta_mut().name = Some(format!("{name}-{suffix}"));
        twin
    };
    let pp = PostParams::default();

    let pb = writes.create(&named("pb")).await.unwrap();
    let json = api.create(&pp, &named("json")).await.unwrap();
    same(api, &pb, &json, "create").await;

    let (mut pb, mut json) = (pb, json);
    edit(&mut pb);
    edit(&mut json);
    let pb = writes.replace(&pb).await.unwrap();
    let json = api
        .replace(&json.meta().name.clone().unwrap(), &pp, &json)
        .await
        .unwrap();
    same(api, &pb, &json, "replace").await;

    let Some(status) = status else {
        return 2;
    };
    let (mut pb, mut json) = (pb, json);
    status(&mut pb);
    status(&mut json);
    let pb = writes.replace_status(&pb).await.unwrap();
    let json = api
        .replace_status(&json.meta().name.clone().unwrap(), &pp, &json)
        .await
        .unwrap();
    same(api, &pb, &json, "replace_status").await;
    3
}

async fn same<K>(api: &Api<K>, pb: &K, json: &K, step: &str)
where
    K: Resource<DynamicType = ()>
        + Clone
        + Serialize
        + DeserializeOwned
        + PartialEq
        + std::fmt::Debug,
{
    let kind = K::kind(&());
    assert_eq!(
        without_server_fields(pb),
        without_server_fields(json),
        "{kind} after {step}: the protobuf write made another object than the JSON write"
    );
    let read = api.get(&pb.meta().name.clone().unwrap()).await.unwrap();
    assert_eq!(
        &read, pb,
        "{kind} after {step}: the protobuf answer is not what a GET reads"
    );
}

fn deployment(ns: &str) -> Deployment {
    let labels = [("app".to_string(), "web".to_string())].into();
    Deployment {
        metadata: ObjectMeta {
            name: Some("web".into()),
            namespace: Some(ns.into()),
            labels: Some([("tier".to_string(), "front".to_string())].into()),
            annotations: Some([("note".to_string(), String::new())].into()),
            ..Default::default()
        },
        spec: Some(DeploymentSpec {
            replicas: Some(0),
            selector: LabelSelector {
                match_labels: Some(labels),
                ..Default::default()
            },
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some([("app".to_string(), "web".to_string())].into()),
                    ..Default::default()
                }),
                spec: Some(PodSpec {
                    containers: vec![Container {
                        name: "web".into(),
                        image: Some("nginx:1.27".into()),
                        args: Some(vec!["--port".into(), String::new()]),
                        ..Default::default()
                    }],
                    ..Default::default()
                }),
            },
            ..Default::default()
        }),
        status: None,
    }
}

fn lease(ns: &str) -> Lease {
    Lease {
        metadata: ObjectMeta {
            name: Some("leader".into()),
            namespace: Some(ns.into()),
            ..Default::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some("a".into()),
            lease_duration_seconds: Some(15),
            acquire_time: Some(micro_time(1_700_000_000_123_456)),
            renew_time: Some(micro_time(1_700_000_000_123_456)),
            lease_transitions: Some(0),
            ..Default::default()
        }),
    }
}

fn micro_time(microseconds: i64) -> MicroTime {
    MicroTime(jiff::Timestamp::from_microsecond(microseconds).unwrap())
}

fn time(seconds: i64) -> Time {
    Time(jiff::Timestamp::from_second(seconds).unwrap())
}

fn about(ns: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some("apps/v1".into()),
        kind: Some("Deployment".into()),
        namespace: Some(ns.into()),
        name: Some("web-pb".into()),
        ..Default::default()
    }
}

fn core_event(ns: &str) -> Event {
    Event {
        metadata: ObjectMeta {
            name: Some("web.1".into()),
            namespace: Some(ns.into()),
            ..Default::default()
        },
        involved_object: about(ns),
        reason: Some("ScalingReplicaSet".into()),
        message: Some("Scaled up to 0".into()),
        type_: Some("Normal".into()),
        count: Some(1),
        first_timestamp: Some(time(1_700_000_000)),
        last_timestamp: Some(time(1_700_000_000)),
        source: Some(EventSource {
            component: Some("kubeloop-test".into()),
            ..Default::default()
        }),
        reporting_component: Some("kubeloop-test".into()),
        reporting_instance: Some("a".into()),
        ..Default::default()
    }
}

fn events_v1_event(ns: &str) -> V1Event {
    V1Event {
        metadata: ObjectMeta {
            name: Some("web.2".into()),
            namespace: Some(ns.into()),
            ..Default::default()
        },
        event_time: Some(micro_time(1_700_000_000_654_321)),
        regarding: Some(about(ns)),
        reason: Some("Synced".into()),
        action: Some("Sync".into()),
        note: Some("synced".into()),
        type_: Some("Normal".into()),
        reporting_controller: Some("kubeloop.dev/test".into()),
        reporting_instance: Some("a".into()),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn built_in_writes_go_as_protobuf_and_make_what_json_writes_make() {
    let cluster = testenv::shared().await;
    let ns = cluster.new_namespace("pb-writes").await.unwrap();
    let plain = cluster.client().await.unwrap();
    let (client, log) = recording(cluster.client().await.unwrap());
    let mut writes = 0;

    writes += twins(
        &WriteApi::<Deployment>::new(client.clone()),
        &Api::namespaced(plain.clone(), &ns),
        &deployment(&ns),
        |d| d.spec.as_mut().unwrap().replicas = Some(3),
        Some(|d: &mut Deployment| {
            d.status = Some(DeploymentStatus {
                observed_generation: Some(2),
                replicas: Some(3),
                updated_replicas: Some(2),
                ready_replicas: Some(1),
                available_replicas: Some(1),
                unavailable_replicas: Some(2),
                ..Default::default()
            })
        }),
    )
    .await;
    writes += twins(
        &WriteApi::<Lease>::new(client.clone()),
        &Api::namespaced(plain.clone(), &ns),
        &lease(&ns),
        |l| {
            let spec = l.spec.as_mut().unwrap();
            spec.holder_identity = Some("b".into());
            spec.lease_transitions = Some(1);
            spec.renew_time = Some(micro_time(1_700_000_015_000_001));
        },
        None,
    )
    .await;
    writes += twins(
        &WriteApi::<Event>::new(client.clone()),
        &Api::namespaced(plain.clone(), &ns),
        &core_event(&ns),
        |e| {
            e.count = Some(2);
            e.last_timestamp = Some(time(1_700_000_060));
            e.message = Some("Scaled up to 3".into());
        },
        None,
    )
    .await;
    writes += twins(
        &WriteApi::<V1Event>::new(client.clone()),
        &Api::namespaced(plain.clone(), &ns),
        &events_v1_event(&ns),
        |e| {
            e.series = Some(EventSeries {
                count: 2,
                last_observed_time: micro_time(1_700_000_060_000_002),
            })
        },
        None,
    )
    .await;

    // The errors come back in protobuf too, as the codes callers match on.
    let leases = WriteApi::<Lease>::new(client.clone());
    let err = leases.create(&lease(&ns)).await;
    assert!(err.is_ok(), "{err:?}");
    let err = leases.create(&lease(&ns)).await.unwrap_err();
    assert!(
        matches!(&err, kube_client::Error::Api(s) if s.code == 409 && s.reason == "AlreadyExists"),
        "{err:?}"
    );
    let mut stale = lease(&ns);
    stale.metadata.resource_version = Some("1".into());
    let err = leases.replace(&stale).await.unwrap_err();
    assert!(
        matches!(&err, kube_client::Error::Api(s) if s.is_conflict()),
        "{err:?}"
    );
    writes += 3;

    let log = log.lock();
    assert_eq!(log.len(), writes, "{log:#?}");
    for exchange in log.iter() {
        assert!(
            matches!(exchange.method, http::Method::POST | http::Method::PUT),
            "{exchange:?}"
        );
        assert!(exchange.path.contains(&ns), "{exchange:?}");
        assert_eq!(exchange.sent, PROTOBUF, "{exchange:?}");
        assert_eq!(exchange.answered, PROTOBUF, "{exchange:?}");
    }
    assert_eq!(log.iter().filter(|e| e.code >= 400).count(), 2, "{log:#?}");
}
