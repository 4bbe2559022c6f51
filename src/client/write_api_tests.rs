//! [`WriteApi`] against an in-memory server: a service under a real `kube_client::Client`
//! that records every request and answers from a script.

use std::borrow::Cow;
use std::collections::VecDeque;

use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec, DeploymentStatus};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use parking_lot::Mutex;
use serde::Deserialize;
use serde_json::json;

use super::*;

/// One request as the server saw it.
#[derive(Debug, Clone)]
struct Seen {
    method: http::Method,
    uri: String,
    content_type: String,
    accept: String,
    body: Vec<u8>,
}

/// What the server answers, in order: (code, Content-Type, body).
type Script = Vec<(u16, &'static str, Vec<u8>)>;

/// A client whose server answers `script` in order and records what it was sent.
fn server(script: Script) -> (Client, Arc<Mutex<Vec<Seen>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let answers = Arc::new(Mutex::new(VecDeque::from(script)));
    let record = seen.clone();
    let service = tower::service_fn(move |request: http::Request<Body>| {
        let (record, answers) = (record.clone(), answers.clone());
        async move {
            let (parts, body) = request.into_parts();
            let header = |name| {
                parts
                    .headers
                    .get(name)
                    .and_then(|v: &HeaderValue| v.to_str().ok())
                    .unwrap_or_default()
                    .to_string()
            };
            let seen = Seen {
                method: parts.method.clone(),
                uri: parts.uri.to_string(),
                content_type: header(header::CONTENT_TYPE),
                accept: header(header::ACCEPT),
                body: body.collect_bytes().await?.to_vec(),
            };
            record.lock().push(seen);
            let (code, content_type, body) = answers
                .lock()
                .pop_front()
                .expect("the script has an answer for every request");
            let response = http::Response::builder()
                .status(code)
                .header(header::CONTENT_TYPE, content_type)
                .body(Body::from(body))?;
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>(response)
        }
    });
    (Client::new(service, "default"), seen)
}

fn lease(resource_version: Option<&str>) -> Lease {
    Lease {
        metadata: ObjectMeta {
            name: Some("leader".into()),
            namespace: Some("ns".into()),
            resource_version: resource_version.map(Into::into),
            ..Default::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some("a".into()),
            lease_duration_seconds: Some(15),
            ..Default::default()
        }),
    }
}

fn deployment() -> Deployment {
    Deployment {
        metadata: ObjectMeta {
            name: Some("web".into()),
            namespace: Some("ns".into()),
            resource_version: Some("7".into()),
            ..Default::default()
        },
        spec: Some(DeploymentSpec {
            replicas: Some(2),
            selector: LabelSelector::default(),
            ..Default::default()
        }),
        status: Some(DeploymentStatus {
            available_replicas: Some(2),
            ..Default::default()
        }),
    }
}

const PB: &str = "application/vnd.kubernetes.protobuf";

fn status_pb(code: u16, reason: &str) -> Vec<u8> {
    protobuf::to_vec(&json!({
        "apiVersion": "v1",
        "kind": "Status",
        "status": "Failure",
        "message": format!("leases \"leader\": {reason}"),
        "reason": reason,
        "details": {"name": "leader", "group": "coordination.k8s.io", "kind": "leases"},
        "code": code,
    }))
    .unwrap()
}

// client-go: gentype's Create with PrefersProtobuf (the body and both headers).
#[tokio::test]
async fn a_built_in_object_goes_as_protobuf_and_a_protobuf_answer_decodes() {
    let stored = lease(Some("42"));
    let (client, seen) = server(vec![(201, PB, protobuf::to_vec(&stored).unwrap())]);
    let api = WriteApi::<Lease>::new(client);
    assert!(api.writes_protobuf());

    let created = api.create(&lease(None)).await.unwrap();

    assert_eq!(created, stored);
    let seen = seen.lock();
    assert_eq!(seen.len(), 1);
    let request = &seen[0];
    assert_eq!(request.method, http::Method::POST);
    assert_eq!(
        request.uri,
        "/apis/coordination.k8s.io/v1/namespaces/ns/leases?"
    );
    assert_eq!(request.content_type, PB);
    assert_eq!(
        request.accept,
        "application/vnd.kubernetes.protobuf, application/json"
    );
    assert!(request.body.starts_with(&protobuf::MAGIC));
    assert_eq!(request.body, protobuf::to_vec(&lease(None)).unwrap());
    // What went is what was asked to be written.
    assert_eq!(
        protobuf::from_slice::<Lease>(&request.body).unwrap(),
        lease(None)
    );
}

#[tokio::test]
async fn a_json_answer_to_a_protobuf_write_decodes_as_json() {
    let stored = deployment();
    let (client, seen) = server(vec![(
        200,
        "application/json",
        serde_json::to_vec(&stored).unwrap(),
    )]);

    let replaced = WriteApi::<Deployment>::new(client)
        .replace(&deployment())
        .await
        .unwrap();

    assert_eq!(replaced, stored);
    let request = &seen.lock()[0];
    assert_eq!(request.method, http::Method::PUT);
    assert_eq!(request.uri, "/apis/apps/v1/namespaces/ns/deployments/web?");
    assert_eq!(request.content_type, PB);
}

#[tokio::test]
async fn a_status_write_goes_to_the_status_subresource() {
    let (client, seen) = server(vec![(200, PB, protobuf::to_vec(&deployment()).unwrap())]);

    WriteApi::<Deployment>::new(client)
        .replace_status(&deployment())
        .await
        .unwrap();

    let request = &seen.lock()[0];
    assert_eq!(request.method, http::Method::PUT);
    assert_eq!(
        request.uri,
        "/apis/apps/v1/namespaces/ns/deployments/web/status?"
    );
    assert_eq!(request.content_type, PB);
}

// client-go: rest/request.go transformResponse (a failed answer decoded as its Status, in the
// negotiated encoding).
#[tokio::test]
async fn a_protobuf_status_answer_is_the_api_error_with_its_code_and_reason() {
    let (client, _) = server(vec![(409, PB, status_pb(409, "Conflict"))]);

    let err = WriteApi::<Lease>::new(client)
        .replace(&lease(Some("41")))
        .await
        .unwrap_err();

    let Error::Api(status) = &err else {
        panic!("not an Api error: {err:?}");
    };
    assert_eq!(status.code, 409);
    assert_eq!(status.reason, "Conflict");
    assert!(status.is_conflict());
    assert_eq!(status.message, "leases \"leader\": Conflict");
    assert_eq!(status.details.as_ref().unwrap().name, "leader");
}

#[tokio::test]
async fn a_json_status_and_a_bare_text_error_are_api_errors_too() {
    let json_status = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
        "reason": "NotFound", "code": 404, "message": "leases \"leader\" not found"});
    let (client, _) = server(vec![
        (
            404,
            "application/json",
            serde_json::to_vec(&json_status).unwrap(),
        ),
        (503, "text/plain", b"upstream unavailable\n".to_vec()),
    ]);
    let api = WriteApi::<Lease>::new(client);

    let err = api.replace(&lease(Some("1"))).await.unwrap_err();
    assert!(matches!(&err, Error::Api(s) if s.is_not_found()), "{err:?}");

    let err = api.replace(&lease(Some("1"))).await.unwrap_err();
    assert!(
        matches!(&err, Error::Api(s) if s.code == 503 && s.message == "upstream unavailable"),
        "{err:?}"
    );
    // Neither is a reason to stop writing protobuf.
    assert!(api.writes_protobuf());
}

// client-go: rest/client.go clientContentConfigProvider.UnsupportedMediaType (JSON for good
// after a 415); kubeloop also sends the refused write again as JSON.
#[tokio::test]
async fn a_415_sends_the_write_again_as_json_and_every_later_one_as_json() {
    let stored = lease(Some("42"));
    let refused = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
        "reason": "UnsupportedMediaType", "code": 415,
        "message": "the body of the request was in an unknown format"});
    let (client, seen) = server(vec![
        (
            415,
            "application/json",
            serde_json::to_vec(&refused).unwrap(),
        ),
        (
            201,
            "application/json",
            serde_json::to_vec(&stored).unwrap(),
        ),
        (
            200,
            "application/json",
            serde_json::to_vec(&stored).unwrap(),
        ),
    ]);
    let api = WriteApi::<Lease>::new(client);
    let clone = api.clone();

    assert_eq!(api.create(&lease(None)).await.unwrap(), stored);
    assert!(!api.writes_protobuf());
    assert!(!clone.writes_protobuf(), "clones share what was learnt");
    assert_eq!(clone.replace(&stored).await.unwrap(), stored);

    let seen = seen.lock();
    let sent: Vec<(&str, &str)> = seen
        .iter()
        .map(|s| (s.content_type.as_str(), s.accept.as_str()))
        .collect();
    assert_eq!(
        sent,
        [
            (PB, "application/vnd.kubernetes.protobuf, application/json"),
            ("application/json", "application/json"),
            ("application/json", "application/json"),
        ]
    );
    assert_eq!(
        serde_json::from_slice::<Lease>(&seen[1].body).unwrap(),
        lease(None)
    );
    assert_eq!(seen[0].uri, seen[1].uri);
}

#[tokio::test]
async fn a_415_to_the_json_write_too_is_the_callers_error() {
    let (client, seen) = server(vec![
        (415, "text/plain", b"no".to_vec()),
        (415, "text/plain", b"not this either".to_vec()),
    ]);

    let err = WriteApi::<Lease>::new(client)
        .create(&lease(None))
        .await
        .unwrap_err();

    assert!(matches!(&err, Error::Api(s) if s.code == 415), "{err:?}");
    assert_eq!(seen.lock().len(), 2, "one fallback, not a loop");
}

/// An object of a built-in kind whose `spec` the encoder refuses: a field the protobuf table
/// does not have. (A k8s-openapi object always fits the table; a `Resource` that serializes
/// what it likes need not.)
#[derive(Debug, Clone, Serialize, Deserialize)]
struct OddDeployment {
    #[serde(rename = "apiVersion")]
    api_version: String,
    kind: String,
    metadata: ObjectMeta,
    spec: serde_json::Value,
}

impl Resource for OddDeployment {
    type DynamicType = ();
    type Scope = NamespaceResourceScope;
    fn kind(_: &()) -> Cow<'_, str> {
        "Deployment".into()
    }
    fn group(_: &()) -> Cow<'_, str> {
        "apps".into()
    }
    fn version(_: &()) -> Cow<'_, str> {
        "v1".into()
    }
    fn plural(_: &()) -> Cow<'_, str> {
        "deployments".into()
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

#[tokio::test]
async fn an_object_the_encoder_refuses_is_an_error_naming_kind_and_field_and_sends_nothing() {
    let (client, seen) = server(vec![]);
    let odd = OddDeployment {
        api_version: "apps/v1".into(),
        kind: "Deployment".into(),
        metadata: deployment().metadata,
        spec: json!({"replicas": 1, "replicaz": 2}),
    };
    let api = WriteApi::<OddDeployment>::new(client);
    assert!(api.writes_protobuf());

    let err = api.create(&odd).await.unwrap_err();

    assert!(matches!(err, Error::BuildRequest(_)), "{err:?}");
    let message = format!("{err}: {}", std::error::Error::source(&err).unwrap());
    assert!(
        message.contains("apps/v1 Deployment: at spec.replicaz:"),
        "{message}"
    );
    assert!(seen.lock().is_empty(), "nothing was sent");
    assert!(
        api.writes_protobuf(),
        "an encoder error is not the server's"
    );
}

/// A custom resource's type: a kind the protobuf table does not know.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Widget {
    #[serde(rename = "apiVersion")]
    api_version: String,
    kind: String,
    metadata: ObjectMeta,
}

impl Resource for Widget {
    type DynamicType = ();
    type Scope = NamespaceResourceScope;
    fn kind(_: &()) -> Cow<'_, str> {
        "Widget".into()
    }
    fn group(_: &()) -> Cow<'_, str> {
        "example.com".into()
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

#[tokio::test]
async fn a_custom_resource_and_a_json_only_api_write_json() {
    let widget = Widget {
        api_version: "example.com/v1".into(),
        kind: "Widget".into(),
        metadata: deployment().metadata,
    };
    let (client, seen) = server(vec![
        (
            201,
            "application/json",
            serde_json::to_vec(&widget).unwrap(),
        ),
        (
            201,
            "application/json",
            serde_json::to_vec(&lease(Some("1"))).unwrap(),
        ),
    ]);

    let widgets = WriteApi::<Widget>::new(client.clone());
    assert!(!widgets.writes_protobuf());
    assert_eq!(widgets.create(&widget).await.unwrap(), widget);
    let leases = WriteApi::<Lease>::new(client).wire(Wire::Json);
    assert!(!leases.writes_protobuf());
    leases.create(&lease(None)).await.unwrap();

    for request in seen.lock().iter() {
        assert_eq!(
            (request.content_type.as_str(), request.accept.as_str()),
            ("application/json", "application/json"),
            "{}",
            request.uri
        );
        assert!(request.body.starts_with(b"{"));
    }
}

#[tokio::test]
async fn an_object_with_no_namespace_is_refused_before_sending() {
    let (client, seen) = server(vec![]);
    let mut homeless = lease(None);
    homeless.metadata.namespace = None;

    let err = WriteApi::<Lease>::new(client)
        .create(&homeless)
        .await
        .unwrap_err();

    assert!(
        err.to_string()
            .contains("Lease \"leader\" has no metadata.namespace"),
        "{err}"
    );
    assert!(seen.lock().is_empty());
}

#[tokio::test]
async fn a_protobuf_answer_that_does_not_decode_is_a_decode_error() {
    let (client, _) = server(vec![(200, PB, b"k8s\0\x0a\x03".to_vec())]);

    let err = WriteApi::<Lease>::new(client)
        .replace(&lease(Some("1")))
        .await
        .unwrap_err();

    assert!(matches!(err, Error::SerdeError(_)), "{err:?}");
    assert!(
        err.to_string().contains("the Lease answer in protobuf"),
        "{err}"
    );
}

#[tokio::test]
async fn an_unread_create_sends_the_same_request_decodes_no_answer_and_keeps_errors() {
    // The answer's body would not decode: only a create that reads it fails.
    let undecodable = b"k8s\0\x0a\x03".to_vec();
    let (client, seen) = server(vec![
        (201, PB, undecodable.clone()),
        (201, PB, undecodable),
        (409, PB, status_pb(409, "AlreadyExists")),
    ]);
    let api = WriteApi::<Lease>::new(client);

    api.create_unread(&lease(None)).await.unwrap();
    assert!(api.create(&lease(None)).await.is_err());
    let err = api.create_unread(&lease(None)).await.unwrap_err();

    assert!(
        matches!(&err, Error::Api(status) if status.code == 409 && status.reason == "AlreadyExists"),
        "{err:?}"
    );
    let seen = seen.lock();
    assert_eq!(seen.len(), 3);
    for request in seen.iter() {
        assert_eq!(request.method, http::Method::POST);
        assert_eq!(
            request.uri,
            "/apis/coordination.k8s.io/v1/namespaces/ns/leases?"
        );
        assert_eq!(request.content_type, PB);
        assert_eq!(request.body, protobuf::to_vec(&lease(None)).unwrap());
    }
}
