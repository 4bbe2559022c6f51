//! The oracle: what a namespace holds of the compared resources, with the fields that differ
//! from run to run taken out, compared field by field with the reference run's.
//!
//! Taken out: `uid`, `resourceVersion`, `creationTimestamp`, `generation`, `managedFields`,
//! `selfLink`, owner references' `uid`, and in each of `status.conditions` its times
//! (`lastTransitionTime`, `lastUpdateTime`, ...) and `message`: a condition's `type`, `status`
//! and `reason` are compared, the conditions in the order of their types. A generation's number
//! differs from run to run (a retried write may bump it without changing the object), so
//! `status.observedGeneration` and each condition's `observedGeneration` are compared as what
//! they say of `metadata.generation`: [`CAUGHT_UP`] or [`BEHIND`] (or ahead); a settled
//! reference with one behind is not settled ([`lagging`]).
//! A generated name is masked (`foo-*`); objects of one masked name are numbered
//! (`foo-*`, `foo-*#2`), so a duplicate shows as one more object.

use std::collections::BTreeMap;

use kube_client::Client;
use kube_client::api::{Api, ApiResource, DynamicObject, ListParams};
use serde_json::Value;

use super::log::stable_name;

/// The compared objects of one namespace: `resource/name` to the object's kept fields.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Snapshot(
    /// `resource/name` (masked, numbered) to the kept fields.
    pub BTreeMap<String, Value>,
);

/// `plural.group` (or `plural` for the core group) of `resource`, as plans name it.
pub fn resource_name(resource: &ApiResource) -> String {
    if resource.group.is_empty() {
        resource.plural.clone()
    } else {
        format!("{}.{}", resource.plural, resource.group)
    }
}

/// What `namespace` holds of `resources` now, normalized ([`normalize`]);
/// `ignored` are JSON pointers of further fields to leave out.
pub async fn snapshot(
    client: &Client,
    namespace: &str,
    resources: &[ApiResource],
    ignored: &[String],
) -> Result<Snapshot, kube_client::Error> {
    let mut objects = BTreeMap::new();
    for resource in resources {
        let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, resource);
        let mut listed: Vec<(String, Value)> = api
            .list(&ListParams::default())
            .await?
            .items
            .into_iter()
            .map(|o| {
                let value = serde_json::to_value(&o).unwrap_or(Value::Null);
                let name = stable_name(
                    o.metadata.name.as_deref().unwrap_or(""),
                    o.metadata.generate_name.as_deref(),
                );
                let mut value = normalize(value);
                for pointer in ignored {
                    remove_pointer(&mut value, pointer);
                }
                (name, value)
            })
            .collect();
        // Objects of one masked name in a stable order, so that numbering does not depend on
        // which the apiserver made first.
        listed.sort_by_cached_key(|(name, value)| (name.clone(), value.to_string()));
        let plural = resource_name(resource);
        let mut seen: BTreeMap<String, usize> = BTreeMap::new();
        for (name, value) in listed {
            let n = seen.entry(name.clone()).or_default();
            *n += 1;
            let key = match *n {
                1 => format!("{plural}/{name}"),
                n => format!("{plural}/{name}#{n}"),
            };
            objects.insert(key, value);
        }
    }
    Ok(Snapshot(objects))
}

/// The object without what differs from run to run.
pub fn normalize(mut object: Value) -> Value {
    if let Some(meta) = object.get_mut("metadata").and_then(Value::as_object_mut) {
        for field in [
            "uid",
            "resourceVersion",
            "creationTimestamp",
            "managedFields",
            "selfLink",
            "namespace",
        ] {
            meta.remove(field);
        }
        if let (Some(generate), Some(name)) = (
            meta.get("generateName").and_then(Value::as_str),
            meta.get("name").and_then(Value::as_str),
        ) {
            let masked = stable_name(name, Some(generate));
            meta.insert("name".into(), Value::String(masked));
        }
        if let Some(owners) = meta
            .get_mut("ownerReferences")
            .and_then(Value::as_array_mut)
        {
            for owner in owners.iter_mut().filter_map(Value::as_object_mut) {
                owner.remove("uid");
            }
        }
    }
    let generation = object
        .pointer("/metadata/generation")
        .and_then(Value::as_i64);
    if let Some(meta) = object.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.remove("generation");
    }
    if let Some(status) = object.get_mut("status").and_then(Value::as_object_mut) {
        if let Some(observed) = status.get_mut("observedGeneration") {
            *observed = against_generation(observed, generation);
        }
        if let Some(conditions) = status.get_mut("conditions").and_then(Value::as_array_mut) {
            for condition in conditions.iter_mut().filter_map(Value::as_object_mut) {
                condition.retain(|field, _| {
                    field != "message" && !(field.starts_with("last") && field.ends_with("Time"))
                });
                if let Some(observed) = condition.get_mut("observedGeneration") {
                    *observed = against_generation(observed, generation);
                }
            }
            conditions.sort_by_cached_key(|c| c.get("type").map(Value::to_string));
        }
    }
    object
}

/// What an `observedGeneration` says once normalized: it equals `metadata.generation`.
pub const CAUGHT_UP: &str = "= generation";
/// What an `observedGeneration` says once normalized: it is below `metadata.generation` (the
/// controller has not yet acted on the latest spec, or never wrote that it did).
pub const BEHIND: &str = "< generation";

/// `observed` as what it says of `generation`: [`CAUGHT_UP`], [`BEHIND`], `> generation`, or
/// `observed` itself when either is not a number.
fn against_generation(observed: &Value, generation: Option<i64>) -> Value {
    match (observed.as_i64(), generation) {
        (Some(o), Some(g)) if o == g => Value::String(CAUGHT_UP.into()),
        (Some(o), Some(g)) if o < g => Value::String(BEHIND.into()),
        (Some(_), Some(_)) => Value::String("> generation".into()),
        _ => observed.clone(),
    }
}

/// The fields of `snapshot` whose `observedGeneration` is behind the object's generation
/// (`key .path`): empty once the controllers caught up with every spec.
pub fn lagging(snapshot: &Snapshot) -> Vec<String> {
    let behind = Value::String(BEHIND.into()).to_string();
    snapshot
        .0
        .iter()
        .flat_map(|(key, object)| {
            flatten(object)
                .into_iter()
                .filter(|(path, value)| path.ends_with(".observedGeneration") && *value == behind)
                .map(move |(path, _)| format!("{key} {path}"))
        })
        .collect()
}

/// Removes the field at `pointer` (`/status/lastUpdateTime`), if there is one.
fn remove_pointer(value: &mut Value, pointer: &str) {
    let Some((parent, field)) = pointer.rsplit_once('/') else {
        return;
    };
    if let Some(map) = value.pointer_mut(parent).and_then(Value::as_object_mut) {
        map.remove(field);
    }
}

/// Every difference between `expected` and `got`, one line each: `key .path: expected X, got Y`,
/// or a missing or unexpected object. Empty when they are equal.
pub fn diff(expected: &Snapshot, got: &Snapshot) -> Vec<String> {
    let mut lines = Vec::new();
    for (key, want) in &expected.0 {
        match got.0.get(key) {
            None => lines.push(format!("{key}: missing")),
            Some(have) => {
                let (want, have) = (flatten(want), flatten(have));
                for (path, w) in &want {
                    match have.get(path) {
                        Some(h) if h == w => {}
                        Some(h) => lines.push(format!("{key} {path}: expected {w}, got {h}")),
                        None => lines.push(format!("{key} {path}: expected {w}, got nothing")),
                    }
                }
                for (path, h) in &have {
                    if !want.contains_key(path) {
                        lines.push(format!("{key} {path}: expected nothing, got {h}"));
                    }
                }
            }
        }
    }
    for key in got.0.keys() {
        if !expected.0.contains_key(key) {
            lines.push(format!("{key}: unexpected"));
        }
    }
    lines
}

/// `.a.b[0].c` -> leaf value, for every leaf (an empty object or array is a leaf).
fn flatten(value: &Value) -> BTreeMap<String, String> {
    fn walk(value: &Value, path: String, out: &mut BTreeMap<String, String>) {
        match value {
            Value::Object(map) if !map.is_empty() => {
                for (k, v) in map {
                    walk(v, format!("{path}.{k}"), out);
                }
            }
            Value::Array(items) if !items.is_empty() => {
                for (i, v) in items.iter().enumerate() {
                    walk(v, format!("{path}[{i}]"), out);
                }
            }
            leaf => {
                out.insert(path, leaf.to_string());
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(value, String::new(), &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn what_differs_from_run_to_run_is_taken_out_and_generated_names_masked() {
        let object = json!({
            "metadata": {
                "name": "web-x7k2p", "generateName": "web-", "namespace": "ns-1", "uid": "u",
                "resourceVersion": "12", "creationTimestamp": "t", "generation": 3,
                "managedFields": [{}], "labels": {"app": "web"},
                "ownerReferences": [{"kind": "Foo", "name": "f", "uid": "u2", "controller": true}]
            },
            "spec": {"replicas": 2},
            "status": {"replicas": 2, "observedGeneration": 3, "conditions": [
                {"type": "Progressing", "status": "True", "reason": "NewReplicaSetAvailable",
                 "message": "m", "lastUpdateTime": "t", "lastTransitionTime": "t"},
                {"type": "Available", "status": "False", "reason": "MinimumReplicasUnavailable",
                 "message": "m", "lastTransitionTime": "t", "observedGeneration": 2}
            ]}
        });
        let mut normalized = normalize(object);
        remove_pointer(&mut normalized, "/spec/paused");
        remove_pointer(&mut normalized, "/status/replicas");
        assert_eq!(
            normalized,
            json!({
                "metadata": {
                    "name": "web-*", "generateName": "web-", "labels": {"app": "web"},
                    "ownerReferences": [{"kind": "Foo", "name": "f", "controller": true}]
                },
                "spec": {"replicas": 2},
                "status": {"observedGeneration": CAUGHT_UP, "conditions": [
                    {"type": "Available", "status": "False",
                     "reason": "MinimumReplicasUnavailable", "observedGeneration": BEHIND},
                    {"type": "Progressing", "status": "True", "reason": "NewReplicaSetAvailable"}
                ]}
            })
        );
    }

    #[test]
    fn a_condition_s_status_or_reason_and_a_lagging_observed_generation_are_differences() {
        let foo = |generation: i64, observed: i64, status: &str, reason: &str| {
            let object = json!({
                "metadata": {"name": "f", "generation": generation},
                "status": {"observedGeneration": observed, "conditions": [
                    {"type": "Ready", "status": status, "reason": reason, "message": generation.to_string()}
                ]}
            });
            Snapshot(BTreeMap::from([("foos/f".to_string(), normalize(object))]))
        };
        let reference = foo(2, 2, "True", "Active");
        // Other generation numbers, another message: the same.
        assert!(diff(&reference, &foo(5, 5, "True", "Active")).is_empty());
        assert!(lagging(&reference).is_empty());
        assert_eq!(
            diff(&reference, &foo(3, 2, "False", "Failed")),
            vec![
                "foos/f .status.conditions[0].reason: expected \"Active\", got \"Failed\"",
                "foos/f .status.conditions[0].status: expected \"True\", got \"False\"",
                "foos/f .status.observedGeneration: expected \"= generation\", got \"< generation\"",
            ]
        );
        assert_eq!(
            lagging(&foo(3, 2, "True", "Active")),
            vec!["foos/f .status.observedGeneration"]
        );
    }

    #[test]
    fn a_diff_names_each_field_and_each_missing_or_extra_object() {
        let expected = Snapshot(BTreeMap::from([
            (
                "deployments.apps/web".to_string(),
                json!({"spec": {"replicas": 3}}),
            ),
            ("deployments.apps/old".to_string(), json!({"spec": {}})),
        ]));
        let got = Snapshot(BTreeMap::from([
            (
                "deployments.apps/web".to_string(),
                json!({"spec": {"replicas": 1, "paused": true}}),
            ),
            ("deployments.apps/web-*#2".to_string(), json!({})),
        ]));
        assert_eq!(
            diff(&expected, &got),
            vec![
                "deployments.apps/old: missing",
                "deployments.apps/web .spec.replicas: expected 3, got 1",
                "deployments.apps/web .spec.paused: expected nothing, got true",
                "deployments.apps/web-*#2: unexpected",
            ]
        );
        assert!(diff(&expected, &expected).is_empty());
    }
}
