//! The Foo custom resource: sample-controller's `pkg/apis/samplecontroller/v1alpha1/types.go`.
//!
//! [`FooSpec`] carries kube's `CustomResource` derive, which writes the `Foo` struct (metadata,
//! spec, optional status), its `Resource` impl (so `Api<Foo>`, listers and informers work as
//! for built-in types) and its CRD, [`CustomResourceExt::crd`](kube::CustomResourceExt::crd):
//! `crds/foo.yaml` is that CRD as YAML, written by `hack/generate-crds`. Serialising a `Foo`
//! always writes `apiVersion` and `kind`; deserialising ignores them.
//!
//! The schema the apiserver enforces (replicas 1..=10, deploymentName required and a DNS
//! subdomain, the Foo's name at most 63 characters) is written here, on the fields, as schemars
//! and kube attributes; the type itself accepts whatever the apiserver stored.
//!
//! Counterpart of the CRD: sample-controller's `artifacts/examples/crd-status-subresource.yaml`,
//! with deploymentName required and validated as a DNS subdomain (it names a Deployment).
//!
//! kube's derive also gives `Foo::new(name, spec)`, with no namespace; [`Foo::namespaced`] is
//! the one with a namespace. Its objects carry the CRD's one annotation
//! (`api-approved.kubernetes.io`) too: kube-derive copies the CRD's annotations into the objects
//! `Foo::new` makes.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::controller::schema::{conditions, plain_fields};

/// `apiVersion` of Foo.
pub(crate) const API_VERSION: &str = "samplecontroller.k8s.io/v1alpha1";
/// Kind of Foo.
pub(crate) const KIND: &str = "Foo";

/// Foo's spec: the Deployment to create and own, and its replicas.
// kube's derive writes `Foo` from this struct, and the CRD from the attributes below.
// `*.k8s.io` groups are protected: the apiserver refuses the CRD without the
// `api-approved.kubernetes.io` annotation; "unapproved, ..." says so honestly, as
// sample-controller's own CRD does. The name rule: the Foo's name becomes the value of the
// Deployment's `controller` label, which takes at most 63 characters, so a longer name could
// never be synced (a Foo created before this rule gets a Stalled condition and an InvalidName
// Warning event instead).
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "samplecontroller.k8s.io",
    version = "v1alpha1",
    kind = "Foo",
    namespaced,
    status = "FooStatus",
    derive = "Default",
    derive = "PartialEq",
    doc = "A request for a Deployment of spec.replicas nginx Pods named spec.deploymentName (kubeloop's port of kubernetes/sample-controller's Foo).",
    annotation(
        "api-approved.kubernetes.io",
        "unapproved, experimental-only; kubeloop's port of kubernetes/sample-controller"
    ),
    printcolumn(
        name = "Deployment",
        type_ = "string",
        description = "The Deployment this Foo owns",
        json_path = ".spec.deploymentName"
    ),
    printcolumn(
        name = "Replicas",
        type_ = "integer",
        description = "Pods asked for",
        json_path = ".spec.replicas"
    ),
    printcolumn(
        name = "Available",
        type_ = "integer",
        description = "Pods of the Deployment that are available",
        json_path = ".status.availableReplicas"
    ),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp"),
    validation = Rule::new("self.metadata.name.size() <= 63").message(
        "metadata.name must be at most 63 characters: it becomes the value of the Deployment's controller label"
    )
)]
#[serde(rename_all = "camelCase")]
// Required in the schema, defaulted when read: the apiserver refuses a Foo without it, and
// this type reads whatever the apiserver stored.
#[schemars(extend("required" = ["deploymentName"]), transform = plain_fields)]
pub struct FooSpec {
    /// Name of the Deployment to create and own.
    #[serde(default)]
    #[schemars(length(min = 1, max = 253))]
    #[schemars(regex(
        pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
    ))]
    pub deployment_name: String,
    /// Pods to run, 1 to 10.
    // `None` leaves the Deployment's default (1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 10))]
    pub replicas: Option<i32>,
}

/// Foo's status: what the controller observed.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = plain_fields)]
pub struct FooStatus {
    /// The owned Deployment's `status.availableReplicas`.
    #[serde(default)]
    pub available_replicas: i32,
    /// Beyond sample-controller: `Stalled` (kstatus's condition for what only a person can fix)
    /// when the Foo can never be synced, naming the field and the limit; empty otherwise.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(
        schema_with = "conditions",
        description = "Stalled (True when the Foo can never be synced, e.g. a name longer than the 63 characters of the label value it becomes), in the Kubernetes condition convention."
    )]
    pub conditions: Vec<Condition>,
}

impl Foo {
    /// A Foo named `name` in `namespace` with `spec`.
    pub fn namespaced(namespace: &str, name: &str, spec: FooSpec) -> Self {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_foo_round_trips_through_json_with_api_version_and_kind() {
        let mut foo = Foo::namespaced(
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
        let foo = Foo::namespaced(
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
        // The constants the controller names Foo by agree with the derive's.
        assert_eq!(Foo::api_version(&()), API_VERSION);
        assert_eq!(Foo::kind(&()), KIND);
        let url = Foo::url_path(&(), Some("ns"));
        assert_eq!(
            url,
            "/apis/samplecontroller.k8s.io/v1alpha1/namespaces/ns/foos"
        );
    }
}
