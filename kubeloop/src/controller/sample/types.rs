//! The Foo custom resource: sample-controller's `pkg/apis/samplecontroller/v1alpha1/types.go`.
//!
//! `Foo` implements k8s-openapi's `Resource` and `Metadata`, which gives it kube-client's
//! `Resource` (so `Api<Foo>`, listers and informers work as for built-in types). Serialising a
//! `Foo` always writes `apiVersion` and `kind`; deserialising ignores them.
//!
//! The schema the apiserver enforces (replicas 1..=10, deploymentName required) lives in
//! `crds/foo.yaml`; this type accepts whatever the apiserver stored.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta};
use serde::ser::SerializeStruct;
use serde::{Deserialize, Serialize, Serializer};

/// API group of Foo.
pub const GROUP: &str = "samplecontroller.k8s.io";
/// API version of Foo.
pub const VERSION: &str = "v1alpha1";
/// `apiVersion` of Foo.
pub const API_VERSION: &str = "samplecontroller.k8s.io/v1alpha1";
/// Kind of Foo.
pub const KIND: &str = "Foo";

/// A request for a Deployment of `spec.replicas` nginx Pods named `spec.deploymentName`.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
pub struct Foo {
    /// Standard object metadata.
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// What the user asks for.
    #[serde(default)]
    pub spec: FooSpec,
    /// What the controller observed.
    #[serde(default)]
    pub status: Option<FooStatus>,
}

/// Foo's spec (`FooSpec`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FooSpec {
    /// Name of the Deployment to create and own.
    #[serde(default)]
    pub deployment_name: String,
    /// Desired Pods; `None` leaves the Deployment's default (1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i32>,
}

/// Foo's status (`FooStatus`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FooStatus {
    /// The owned Deployment's `status.availableReplicas`.
    #[serde(default)]
    pub available_replicas: i32,
    /// Beyond sample-controller: `Stalled` (kstatus's condition for what only a person can fix)
    /// when the Foo can never be synced, naming the field and the limit; empty otherwise.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

impl Foo {
    /// A Foo named `name` in `namespace` with `spec`.
    pub fn new(namespace: &str, name: &str, spec: FooSpec) -> Self {
        Foo {
            metadata: ObjectMeta {
                namespace: Some(namespace.to_string()),
                name: Some(name.to_string()),
                ..Default::default()
            },
            spec,
            status: None,
        }
    }

    /// `metadata.name`, "" if unset.
    pub fn name(&self) -> &str {
        self.metadata.name.as_deref().unwrap_or("")
    }

    /// `metadata.namespace`, "" if unset.
    pub fn namespace(&self) -> &str {
        self.metadata.namespace.as_deref().unwrap_or("")
    }
}

impl Serialize for Foo {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let fields = if self.status.is_some() { 5 } else { 4 };
        let mut s = serializer.serialize_struct("Foo", fields)?;
        s.serialize_field("apiVersion", API_VERSION)?;
        s.serialize_field("kind", KIND)?;
        s.serialize_field("metadata", &self.metadata)?;
        s.serialize_field("spec", &self.spec)?;
        if let Some(status) = &self.status {
            s.serialize_field("status", status)?;
        }
        s.end()
    }
}

impl k8s_openapi::Resource for Foo {
    const API_VERSION: &'static str = API_VERSION;
    const GROUP: &'static str = GROUP;
    const KIND: &'static str = KIND;
    const VERSION: &'static str = VERSION;
    const URL_PATH_SEGMENT: &'static str = "foos";
    type Scope = k8s_openapi::NamespaceResourceScope;
}

impl k8s_openapi::Metadata for Foo {
    type Ty = ObjectMeta;

    fn metadata(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn metadata_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_foo_round_trips_through_json_with_api_version_and_kind() {
        let mut foo = Foo::new(
            "ns",
            "example-foo",
            FooSpec {
                deployment_name: "example-foo".into(),
                replicas: Some(1),
            },
        );
        foo.status = Some(FooStatus {
            available_replicas: 1,
            ..Default::default()
        });
        let json = serde_json::to_value(&foo).unwrap();
        assert_eq!(json["apiVersion"], "samplecontroller.k8s.io/v1alpha1");
        assert_eq!(json["kind"], "Foo");
        assert_eq!(json["spec"]["deploymentName"], "example-foo");
        assert_eq!(json["spec"]["replicas"], 1);
        assert_eq!(json["status"]["availableReplicas"], 1);
        let back: Foo = serde_json::from_value(json).unwrap();
        assert_eq!(back, foo);
    }

    #[test]
    fn a_foo_without_replicas_or_status_leaves_them_out() {
        let foo = Foo::new(
            "ns",
            "f",
            FooSpec {
                deployment_name: "d".into(),
                replicas: None,
            },
        );
        let json = serde_json::to_value(&foo).unwrap();
        assert!(json["spec"].get("replicas").is_none());
        assert!(json.get("status").is_none());
    }

    #[test]
    fn kube_client_sees_foo_as_a_namespaced_resource() {
        use kube_client::Resource;
        assert_eq!(Foo::kind(&()), "Foo");
        assert_eq!(Foo::api_version(&()), "samplecontroller.k8s.io/v1alpha1");
        assert_eq!(Foo::plural(&()), "foos");
        let url = Foo::url_path(&(), Some("ns"));
        assert_eq!(
            url,
            "/apis/samplecontroller.k8s.io/v1alpha1/namespaces/ns/foos"
        );
    }
}
