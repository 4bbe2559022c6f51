//! The encoder against apimachinery's own marshalling: every Go-made fixture (`testdata/`,
//! the decoder's corpus, and `testdata-writes/`, objects as kubeloop's runtime writes them,
//! by `hack/go/protobuf-writes`) decoded and encoded again must be the same bytes; a value of
//! every kind in the table, filled from the table, must survive encode then decode; and bad
//! input is an error naming the object and the field.

use std::path::{Path, PathBuf};

use k8s_openapi::api::apps::v1::{ControllerRevision, Deployment, StatefulSet};
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::api::batch::v1::{CronJob, Job};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{
    ConfigMap, Event, Namespace, Node, PersistentVolumeClaim, Pod, Secret, Service, ServiceAccount,
};
use k8s_openapi::api::events::v1::Event as EventsEvent;
use k8s_openapi::api::networking::v1::{Ingress, NetworkPolicy};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Status;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value, json};

use super::*;
use crate::protobuf::generated::ROOTS;
use crate::protobuf::{Envelope, from_slice};

fn dir(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("src/protobuf")
        .join(name)
}

/// Every `.pb` fixture of both corpora, as (name, bytes).
fn fixtures() -> Vec<(String, Vec<u8>)> {
    let mut all = Vec::new();
    for corpus in ["testdata", "testdata-writes"] {
        for entry in std::fs::read_dir(dir(corpus)).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "pb") {
                let name = path.file_stem().unwrap().to_string_lossy().into_owned();
                all.push((format!("{corpus}/{name}"), std::fs::read(&path).unwrap()));
            }
        }
    }
    all.sort();
    all
}

fn pb(name: &str) -> Vec<u8> {
    let path = dir(name).with_extension("pb");
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Where two encodings first differ, and the bytes around it, for a failure message.
fn first_difference(got: &[u8], want: &[u8]) -> String {
    let at = got
        .iter()
        .zip(want)
        .position(|(a, b)| a != b)
        .unwrap_or(got.len().min(want.len()));
    let around = |b: &[u8]| format!("{:02x?}", &b[at.saturating_sub(8)..(at + 16).min(b.len())]);
    format!(
        "{} bytes against Go's {}, first different at byte {at}: ours {} Go's {}",
        got.len(),
        want.len(),
        around(got),
        around(want)
    )
}

fn assert_same_bytes(name: &str, got: &[u8], want: &[u8]) {
    assert!(got == want, "{name}: {}", first_difference(got, want));
}

#[test]
fn every_fixture_decoded_as_json_encodes_to_gos_bytes() {
    let all = fixtures();
    assert!(all.len() >= 36, "{} fixtures", all.len());
    for (name, want) in all {
        let value: Value = from_slice(&want).unwrap_or_else(|e| panic!("{name}: {e}"));
        let got = to_vec(&value).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_same_bytes(&name, &got, &want);
    }
}

fn same_bytes_typed<T: DeserializeOwned + Serialize>(name: &str) {
    let want = pb(name);
    let typed: T = from_slice(&want).unwrap_or_else(|e| panic!("{name}: {e}"));
    let got = to_vec(&typed).unwrap_or_else(|e| panic!("{name}: {e}"));
    assert_same_bytes(name, &got, &want);
}

#[test]
fn every_fixture_decoded_as_its_k8s_openapi_type_encodes_to_gos_bytes() {
    // Objects as kubeloop's runtime writes them.
    same_bytes_typed::<Deployment>("testdata-writes/deployment-create");
    same_bytes_typed::<Deployment>("testdata-writes/deployment-status");
    same_bytes_typed::<Lease>("testdata-writes/lease-acquire");
    same_bytes_typed::<Lease>("testdata-writes/lease-renew");
    same_bytes_typed::<Event>("testdata-writes/event-core");
    same_bytes_typed::<Event>("testdata-writes/event-core-series");
    same_bytes_typed::<EventsEvent>("testdata-writes/event-events");
    same_bytes_typed::<EventsEvent>("testdata-writes/event-events-series");
    same_bytes_typed::<ConfigMap>("testdata-writes/configmap-maps");
    same_bytes_typed::<Pod>("testdata-writes/pod-sparse");
    // The decoder's corpus: the awkward fields of many kinds.
    same_bytes_typed::<ConfigMap>("testdata/configmap");
    same_bytes_typed::<ConfigMap>("testdata/configmap-bare");
    same_bytes_typed::<Secret>("testdata/secret");
    same_bytes_typed::<Pod>("testdata/pod");
    same_bytes_typed::<Service>("testdata/service");
    same_bytes_typed::<Deployment>("testdata/deployment");
    same_bytes_typed::<StatefulSet>("testdata/statefulset");
    same_bytes_typed::<Job>("testdata/job");
    same_bytes_typed::<CronJob>("testdata/cronjob");
    same_bytes_typed::<Node>("testdata/node");
    same_bytes_typed::<Lease>("testdata/lease");
    same_bytes_typed::<Event>("testdata/event");
    same_bytes_typed::<Namespace>("testdata/namespace");
    same_bytes_typed::<ServiceAccount>("testdata/serviceaccount");
    same_bytes_typed::<Role>("testdata/role");
    same_bytes_typed::<RoleBinding>("testdata/rolebinding");
    same_bytes_typed::<PersistentVolumeClaim>("testdata/pvc");
    same_bytes_typed::<NetworkPolicy>("testdata/networkpolicy");
    same_bytes_typed::<Ingress>("testdata/ingress");
    same_bytes_typed::<HorizontalPodAutoscaler>("testdata/hpa");
    same_bytes_typed::<PodDisruptionBudget>("testdata/pdb");
    same_bytes_typed::<ControllerRevision>("testdata/controllerrevision");
    same_bytes_typed::<CustomResourceDefinition>("testdata/crd");
    same_bytes_typed::<Status>("testdata/status");
}

#[test]
fn the_envelope_is_runtime_unknown_as_go_writes_it() {
    let bytes = to_vec(&json!({
        "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}
    }))
    .unwrap();
    let head = b"k8s\0\x0a\x0f\x0a\x02v1\x12\x09ConfigMap\x12";
    assert!(bytes.starts_with(head), "{bytes:02x?}");
    // An empty contentEncoding (3) and contentType (4) end it.
    assert!(bytes.ends_with(&[0x1a, 0x00, 0x22, 0x00]), "{bytes:02x?}");
    let envelope = Envelope::parse(&bytes).unwrap();
    assert_eq!((envelope.api_version, envelope.kind), ("v1", "ConfigMap"));
}

/// A value of message `index` with every field set to something other than its zero, as far
/// as `depth` allows (a message deeper than that is left out, as are the apiextensions schema
/// unions at depth 0). Inline fields' values are the parent's, as in Go's JSON.
fn fill(index: u16, depth: usize, into: &mut Map<String, Value>) {
    for field in kinds::message(index).fields {
        if field.has(I) {
            if let Kind::Msg(inner) = field.kind {
                fill(inner, depth, into);
            }
            continue;
        }
        let Some(value) = (match field.kind {
            Kind::Map(value) => {
                sample(*value, depth).map(|v| Value::Object(Map::from_iter([("k".into(), v)])))
            }
            kind if field.has(L) => sample(kind, depth).map(|v| json!([v, v])),
            kind => sample(kind, depth),
        }) else {
            continue;
        };
        into.insert(field.json.to_string(), value);
    }
}

fn sample(kind: Kind, depth: usize) -> Option<Value> {
    Some(match kind {
        Kind::Str => json!("s"),
        Kind::Bool => json!(true),
        Kind::I32 => json!(-7),
        Kind::I64 => json!(1_i64 << 40),
        Kind::F64 => json!(1.5),
        Kind::Bytes => json!("aGk="),
        Kind::Time => json!("2026-11-28T09:30:00Z"),
        Kind::MicroTime => json!("2026-11-28T09:30:00.123456Z"),
        Kind::Quantity => json!("1Gi"),
        Kind::IntOrString => json!("25%"),
        Kind::RawJson => json!({"a": [1, "b"]}),
        Kind::StringList => json!(["x", "y"]),
        Kind::Msg(index) => {
            if depth == 0 {
                return None;
            }
            let mut map = Map::new();
            fill(index, depth - 1, &mut map);
            Value::Object(map)
        }
        Kind::SchemaOrBool(_) => json!(false),
        Kind::SchemaOrArray(_) | Kind::SchemaOrStringArray(_) if depth == 0 => return None,
        Kind::SchemaOrArray(_) => json!([{"type": "string"}]),
        Kind::SchemaOrStringArray(_) => json!(["x"]),
        Kind::Map(_) => return None,
    })
}

/// Whether every value `want` sets is in `got` (which may hold more: the zero values Go's JSON
/// shows); the first difference's path otherwise.
fn contains(got: &Value, want: &Value, path: &str) -> Result<(), String> {
    match (got, want) {
        (Value::Object(got), Value::Object(want)) => want.iter().try_for_each(|(k, w)| {
            let at = format!("{path}.{k}");
            contains(got.get(k).ok_or(format!("{at} missing"))?, w, &at)
        }),
        (Value::Array(got), Value::Array(want)) if got.len() == want.len() => got
            .iter()
            .zip(want)
            .enumerate()
            .try_for_each(|(i, (g, w))| contains(g, w, &format!("{path}.{i}"))),
        (Value::Number(g), Value::Number(w)) if g.as_f64() == w.as_f64() => Ok(()),
        _ if got == want => Ok(()),
        _ => Err(format!("{path}: {got} where {want} was written")),
    }
}

#[test]
fn a_value_of_every_kind_in_the_table_survives_encode_then_decode() {
    for root in &ROOTS {
        let mut object = Map::new();
        object.insert("apiVersion".into(), json!(root.api_version));
        object.insert("kind".into(), json!(root.kind));
        fill(root.message, 5, &mut object);
        let object = Value::Object(object);
        let what = format!("{} {}", root.api_version, root.kind);
        let bytes = to_vec(&object).unwrap_or_else(|e| panic!("{what}: {e}"));
        let back: Value = from_slice(&bytes).unwrap_or_else(|e| panic!("{what}: {e}"));
        if let Err(difference) = contains(&back, &object, "") {
            panic!("{what}: {difference}");
        }
        // ...and what came back is written as the same bytes.
        let again = to_vec(&back).unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_same_bytes(&what, &again, &bytes);
    }
    assert!(ROOTS.len() > 100, "{} kinds", ROOTS.len());
}

fn deployment() -> Value {
    let pb = pb("testdata-writes/deployment-create");
    from_slice(&pb).unwrap()
}

fn error_of(object: &Value) -> EncodeError {
    to_vec(object).expect_err("should not encode")
}

#[test]
fn a_value_the_encoder_cannot_write_is_an_error_naming_the_kind_and_field() {
    let mut bad = deployment();
    bad["spec"]["replicas"] = json!("three");
    let err = error_of(&bad);
    assert_eq!(err.path(), "spec.replicas");
    assert_eq!(
        err.to_string(),
        "apps/v1 Deployment: at spec.replicas: expected an integer, found a string"
    );

    let mut bad = deployment();
    bad["spec"]["replicas"] = json!(1_i64 << 40);
    assert!(
        error_of(&bad)
            .to_string()
            .contains("at spec.replicas: 1099511627776 is out of an int32's range")
    );

    let mut bad = deployment();
    bad["spec"]["template"]["spec"]["containers"][0]["ports"] =
        json!([{"containerPort": 80}, {"containerPort": {"no": 1}}]);
    assert_eq!(
        error_of(&bad).path(),
        "spec.template.spec.containers.0.ports.1.containerPort"
    );

    let mut bad = deployment();
    bad["metadata"]["creationTimestamp"] = json!("yesterday");
    let err = error_of(&bad);
    assert_eq!(err.path(), "metadata.creationTimestamp");
    assert!(err.to_string().contains("not an RFC 3339 time"), "{err}");

    let mut bad = deployment();
    bad["metadata"]["labels"]["app"] = json!(1);
    assert_eq!(error_of(&bad).path(), "metadata.labels.app");

    // A field the table does not have is refused, not dropped.
    let mut bad = deployment();
    bad["spec"]["replicaz"] = json!(1);
    let err = error_of(&bad);
    assert_eq!(err.path(), "spec.replicaz");
    assert!(
        err.to_string()
            .contains("v1.DeploymentSpec has no field \"replicaz\""),
        "{err}"
    );

    let mut bad = deployment();
    bad["kind"] = json!("Foo");
    bad["apiVersion"] = json!("samplecontroller.k8s.io/v1alpha1");
    let err = error_of(&bad);
    assert_eq!(err.kind(), "Foo");
    assert!(
        err.to_string()
            .starts_with("samplecontroller.k8s.io/v1alpha1 Foo: is not a built-in kind"),
        "{err}"
    );

    let mut bad = deployment();
    bad.as_object_mut().unwrap().remove("kind");
    assert!(error_of(&bad).to_string().contains("has no kind"));
    assert!(error_of(&json!([1])).to_string().contains("not an array"));
}

/// Fuzzing by property: a fixture with one value swapped for a value of another JSON type
/// encodes or fails, but never panics.
#[test]
fn any_value_swapped_for_another_type_encodes_or_fails_but_never_panics() {
    fn leaves(value: &Value, path: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
        out.push(path.clone());
        let children: Vec<(String, &Value)> = match value {
            Value::Object(map) => map.iter().map(|(k, v)| (k.clone(), v)).collect(),
            Value::Array(items) => items
                .iter()
                .enumerate()
                .map(|(i, v)| (i.to_string(), v))
                .collect(),
            _ => return,
        };
        for (key, child) in children {
            path.push(key);
            leaves(child, path, out);
            path.pop();
        }
    }
    fn at<'v>(value: &'v mut Value, path: &[String]) -> &'v mut Value {
        path.iter().fold(value, |v, key| match v {
            Value::Array(items) => &mut items[key.parse::<usize>().unwrap()],
            other => &mut other[key.as_str()],
        })
    }
    let swaps = [
        json!(null),
        json!(true),
        json!(-1),
        json!(1e300),
        json!(u64::MAX),
        json!("x"),
        json!([1]),
        json!({"x": 1}),
    ];
    let mut errors = 0;
    for name in [
        "testdata-writes/deployment-status",
        "testdata/pod",
        "testdata/crd",
    ] {
        let value: Value = from_slice(&pb(name)).unwrap();
        let mut paths = Vec::new();
        leaves(&value, &mut Vec::new(), &mut paths);
        for path in paths.iter().skip(1) {
            for swap in &swaps {
                let mut changed = value.clone();
                *at(&mut changed, path) = swap.clone();
                let result = std::panic::catch_unwind(|| to_vec(&changed));
                match result {
                    Ok(Ok(_)) => {}
                    Ok(Err(_)) => errors += 1,
                    Err(_) => panic!("{name}: {} = {swap} panicked", path.join(".")),
                }
            }
        }
    }
    assert!(errors > 100, "only {errors} swaps were refused");
}

/// The decoder reads the new corpus too: each `.pb` decodes to its `.json`, key for key.
#[test]
fn every_writes_fixture_decodes_to_its_json() {
    for (name, pb) in fixtures()
        .into_iter()
        .filter(|(name, _)| name.starts_with("testdata-writes/"))
    {
        let json = std::fs::read(dir(&name).with_extension("json")).unwrap();
        let want: Value = serde_json::from_slice(&json).unwrap();
        let got: Value = from_slice(&pb).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(got, want, "{name}");
    }
}

/// Go writes a map's entries in the byte order of their keys (`sort.Strings`), whatever order
/// the value holds them in (a `serde_json::Map` with `preserve_order` keeps insertion order).
#[test]
fn map_entries_are_written_in_byte_order_of_their_keys() {
    fn reversed(value: &Value) -> Value {
        match value {
            Value::Object(map) => Value::Object(
                map.iter()
                    .rev()
                    .map(|(k, v)| (k.clone(), reversed(v)))
                    .collect(),
            ),
            other => other.clone(),
        }
    }
    let want = pb("testdata-writes/configmap-maps");
    let value: Value = from_slice(&want).unwrap();
    let backwards = reversed(&value);
    let labels: Vec<&String> = backwards["metadata"]["labels"]
        .as_object()
        .unwrap()
        .keys()
        .collect();
    assert_eq!(labels, ["é", "a", "Z"], "the value holds them backwards");
    assert_same_bytes("configmap-maps", &to_vec(&backwards).unwrap(), &want);
}
