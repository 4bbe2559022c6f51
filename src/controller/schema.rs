//! Schema pieces the two CRDs share (used through `#[schemars(schema_with = ...)]` and
//! `#[schemars(transform = ...)]` on `Foo`'s and `VirtualMachine`'s types; kube's
//! `CustomResource` derive does the rest).
//!
//! - [`conditions`]: a `Vec<Condition>` is a list keyed by `type` (server-side apply merges its
//!   items by type instead of replacing the list) whose `status` is one of three strings.
//! - [`plain_fields`]: what serde's attributes make schemars say about a struct's fields, but
//!   the CRD must not.
//!
//! k8s-openapi's own schemas (its `schemars` feature) are left off on purpose: they would not
//! carry the list keys or the enum, and they would compile a schema for every Kubernetes type
//! into k8s-openapi, the largest crate in the tree.

use schemars::{Schema, SchemaGenerator, json_schema};
use serde_json::{Map, Value};

/// A list of Kubernetes conditions (`metav1.Condition`), one per `type`.
pub(crate) fn conditions(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "array",
        "x-kubernetes-list-type": "map",
        "x-kubernetes-list-map-keys": ["type"],
        "items": {
            "type": "object",
            "required": ["type", "status", "lastTransitionTime", "reason", "message"],
            "properties": {
                "type": {"type": "string"},
                "status": {"type": "string", "enum": ["True", "False", "Unknown"]},
                "observedGeneration": {"type": "integer", "format": "int64", "minimum": 0},
                "lastTransitionTime": {"type": "string", "format": "date-time"},
                "reason": {"type": "string"},
                "message": {"type": "string"}
            }
        }
    })
}

/// Takes out of each property of a struct's schema what serde's attributes make schemars add
/// but the CRD must not say:
///
/// - a `default` (from `#[serde(default)]`): that is how the Rust type reads a missing field,
///   not a value the apiserver should write into every object it stores;
/// - `null` (from `Option`, which kube turns into `nullable: true`): these fields are left out
///   when `None` (`skip_serializing_if`), never written as `null`, and without `nullable` the
///   apiserver drops a `null` it is sent instead of storing it.
///
/// For `#[schemars(transform = plain_fields)]` on a struct: it runs once the struct's schema,
/// properties included, is built.
pub(crate) fn plain_fields(schema: &mut Schema) {
    let Some(Value::Object(properties)) = schema.get_mut("properties") else {
        return;
    };
    for property in properties.values_mut() {
        if let Value::Object(property) = property {
            property.remove("default");
            not_nullable(property);
        }
    }
}

/// `"type": ["integer", "null"]` becomes `"type": "integer"`, and an optional struct's
/// `anyOf: [X, {"type": "null"}]` becomes X.
fn not_nullable(schema: &mut Map<String, Value>) {
    if let Some(Value::Array(types)) = schema.get_mut("type") {
        types.retain(|t| t != "null");
        if let [only] = types.as_slice() {
            let only = only.clone();
            schema.insert("type".into(), only);
        }
    }
    let inner = match schema.get("anyOf") {
        Some(Value::Array(branches)) => {
            let mut rest = branches
                .iter()
                .filter(|b| b.get("type").is_none_or(|t| t != "null"));
            match (rest.next(), rest.next()) {
                (Some(Value::Object(only)), None) => Some(only.clone()),
                _ => None,
            }
        }
        _ => None,
    };
    if let Some(inner) = inner {
        schema.remove("anyOf");
        schema.extend(inner);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_fields_drops_defaults_and_null() {
        let mut schema = json_schema!({
            "type": "object",
            "properties": {
                "name": {"type": "string", "default": ""},
                "code": {"type": ["integer", "null"], "format": "int64"},
                "server": {
                    "description": "the server",
                    "anyOf": [{"type": "object", "properties": {"id": {"type": "string"}}}, {"type": "null"}]
                }
            }
        });
        plain_fields(&mut schema);
        assert_eq!(
            schema,
            json_schema!({
                "type": "object",
                "properties": {
                    "name": {"type": "string"},
                    "code": {"type": "integer", "format": "int64"},
                    "server": {
                        "description": "the server",
                        "type": "object",
                        "properties": {"id": {"type": "string"}}
                    }
                }
            })
        );
    }
}
