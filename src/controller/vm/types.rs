//! The VirtualMachine custom resource (controller101's `pkg/apis/cloudnative/v1alpha1/types.go`).
//! [`VirtualMachineSpec`] carries kube's `CustomResource` derive, which writes the
//! `VirtualMachine` struct (metadata, spec, optional status), its [`kube_client::Resource`]
//! impl and its CRD, [`CustomResourceExt::crd`](kube::CustomResourceExt::crd):
//! `crds/virtualmachine.yaml` is that CRD as YAML, written by `hack/generate-crds`.
//!
//! Differences from controller101 on purpose: `spec.resource` is validated by the CRD schema
//! (written here, on the fields) and again by [`super::quantity`] before anything is created;
//! the status is written only through the status subresource, which the original lacked.
//!
//! Invariant: `status.phase` is one of the [`Phase`] strings; an unknown string read from the
//! apiserver deserialises as [`Phase::Unknown`] and is treated like a fresh object.
//!
//! kube's derive also gives `VirtualMachine::new(name, spec)`, with no namespace;
//! [`VirtualMachine::namespaced`] is the one with a namespace and quantity strings.

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta, Time};
use kube::CustomResource;
use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Serialize};

use crate::controller::schema::{conditions, plain_fields};

/// The finalizer that keeps a VM until its server is deleted (controller101's string).
pub const FINALIZER: &str = "finalizer.cloudnative.tw";

/// VirtualMachine's spec: what the user asks for.
// kube's derive writes `VirtualMachine` from this struct, and the CRD from the attributes below.
// Two printer columns of one type read to clippy as a repeated attribute.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "cloudnative.tw",
    version = "v1alpha1",
    kind = "VirtualMachine",
    namespaced,
    status = "VirtualMachineStatus",
    derive = "Default",
    derive = "PartialEq",
    doc = "A virtual machine backed by a container (the Docker API) or a QEMU process (kubeloop's port of controller101).",
    shortname = "vm",
    shortname = "vms",
    printcolumn(name = "STATUS", type_ = "string", json_path = ".status.phase"),
    printcolumn(name = "CPU", type_ = "number", json_path = ".status.server.usage.cpu"),
    printcolumn(
        name = "MEMORY",
        type_ = "number",
        json_path = ".status.server.usage.memory"
    ),
    printcolumn(
        name = "RESTARTS",
        type_ = "integer",
        json_path = ".status.restarts",
        priority = 1
    ),
    printcolumn(
        name = "AGE",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
// Required in the schema, optional here: `None` only for objects built in code.
#[schemars(extend("required" = ["resource"]), transform = plain_fields)]
pub struct VirtualMachineSpec {
    /// CPU and memory, both required.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource: Option<ResourceSpec>,
}

/// `spec.resource`: Kubernetes quantities (`cpu: 2`, `cpu: 500m`, `memory: 4G`, `memory: 4Gi`).
///
/// Each is written as an integer (cpu: 2) or a string (cpu: "500m", memory: 4G, memory: 4Gi).
/// The schema's patterns admit exactly what the controller parses (`quantity.rs`): an
/// unsigned decimal number with an optional suffix, no exponent. Its CEL rules refuse zero, and
/// more than the controller takes (`MAX_CPU_MILLIS`, `i64::MAX / 1_000_000` millicores, what
/// the Docker API's int64 NanoCpus holds, and `MAX_MEMORY_BYTES`, 1Ei).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ResourceSpec {
    /// CPU cores, e.g. 2 or "500m"; must be greater than zero.
    #[schemars(schema_with = "cpu_schema")]
    pub cpu: Quantity,
    /// Memory, e.g. 4G (4000000000 bytes) or 4Gi (4294967296 bytes); must be greater than zero.
    #[schemars(schema_with = "memory_schema")]
    pub memory: Quantity,
}

/// `spec.resource.cpu`: `pattern` applies to strings, `minimum` and `maximum` to integers.
fn cpu_schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "x-kubernetes-int-or-string": true,
        "pattern": r"^([0-9]+(\.[0-9]*)?|\.[0-9]+)(m|k|M|G)?$",
        "minimum": 1,
        "maximum": 9223372036_u64,
        "x-kubernetes-validations": [
            {
                "rule": "type(self) == int ? self > 0 : (isQuantity(self) && quantity(self).isGreaterThan(quantity('0')))",
                "message": "cpu must be a quantity greater than zero, e.g. 2 or 500m"
            },
            {
                "rule": "type(self) == int || !isQuantity(self) || quantity(self).compareTo(quantity('9223372036854m')) <= 0",
                "message": "cpu must be at most 9223372036854m, the most the Docker API's NanoCpus field holds"
            }
        ]
    })
}

/// A `metav1.Time`: an RFC 3339 timestamp.
fn date_time(_: &mut SchemaGenerator) -> Schema {
    json_schema!({"type": "string", "format": "date-time"})
}

/// `spec.resource.memory`: as cpu, with the binary suffixes too.
fn memory_schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "x-kubernetes-int-or-string": true,
        "pattern": r"^([0-9]+(\.[0-9]*)?|\.[0-9]+)(k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$",
        "minimum": 1,
        "x-kubernetes-validations": [
            {
                "rule": "type(self) == int ? self > 0 : (isQuantity(self) && quantity(self).isGreaterThan(quantity('0')))",
                "message": "memory must be a quantity greater than zero, e.g. 4G or 4Gi"
            },
            {
                "rule": "type(self) == int ? self <= 1152921504606846976 : (!isQuantity(self) || quantity(self).compareTo(quantity('1Ei')) <= 0)",
                "message": "memory must be at most 1Ei (1152921504606846976 bytes)"
            }
        ]
    })
}

/// VirtualMachine's status: what the controller observed.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = plain_fields)]
pub struct VirtualMachineStatus {
    #[serde(default)]
    #[schemars(description = "Where the VM is in its life.")]
    /// Where the VM is in its life ([`Phase`]).
    pub phase: Phase,
    /// Why the VM is in its phase; empty when there is nothing to say (Active and healthy).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    /// The server backing the VM, as last seen.
    pub server: Option<ServerStatus>,
    /// Restarts of the server after it exited, since it last ran for
    /// ten minutes (`CRASH_RESET_AFTER` in `reconcile.rs`) without exiting (a pod's
    /// `restartCount`).
    /// An `int32`, as the CRD says: the apiserver checks the schema's bounds, not its
    /// `format`, so the type is as wide as the CRD allows and no wider.
    #[serde(default, skip_serializing_if = "is_zero")]
    #[schemars(
        range(min = 0, max = 2147483647),
        description = "Restarts of the server after it exited, since it last ran for ten minutes without exiting."
    )]
    pub restarts: i32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "date_time")]
    /// When the status last changed in a way a user sees.
    pub last_update_time: Option<Time>,
    /// `Ready` and `ServerRunning` (`conditions.rs`), derived from the rest of the status
    /// each time it is written.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(
        schema_with = "conditions",
        description = "Ready (the VM is Active on a running server) and ServerRunning (its server exists and runs), in the Kubernetes condition convention."
    )]
    pub conditions: Vec<Condition>,
}

/// The server backing the VM: a container or a QEMU process.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = plain_fields)]
pub struct ServerStatus {
    /// The engine's container id.
    #[serde(default)]
    pub id: String,
    /// The engine's state string (`running`, `exited`, ...).
    #[serde(default)]
    pub state: String,
    /// The exit code of the server's last run, while it is stopped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i64>,
    /// kvm or tcg for a QEMU server (how its CPUs run); absent for containers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accelerator: Option<String>,
    #[serde(default)]
    /// CPU and memory use.
    pub usage: ServerUsage,
}

/// CPU and memory use, percentages from the engine's stats.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ServerUsage {
    /// CPU% = cpu_delta / system_delta * online_cpus * 100 (100 = one core busy).
    pub cpu: f64,
    /// Mem% = usage / limit * 100.
    pub memory: f64,
}

/// `status.phase` (controller101's `VirtualMachinePhase`, plus the empty initial phase).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum Phase {
    /// Never reconciled: `""`.
    #[default]
    #[serde(rename = "")]
    None,
    /// Its server is being created or started.
    Creating,
    /// Its server runs.
    Active,
    /// Something went wrong; the reason says what.
    Failed,
    /// The server exited 3 times in a row (`CRASH_LOOP_AFTER` in `reconcile.rs`); it is
    /// restarted with a growing delay (a pod's `CrashLoopBackOff`).
    CrashLoopBackOff,
    /// Deletion was requested; its server is being deleted.
    Terminating,
    /// A string this version does not know; handled like [`Phase::None`]. Not in the schema's
    /// enum: the apiserver refuses it.
    #[serde(other)]
    #[schemars(skip)]
    Unknown,
}

fn is_zero(n: &i32) -> bool {
    *n == 0
}

impl Phase {
    /// The string stored in `status.phase`.
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::None | Phase::Unknown => "",
            Phase::Creating => "Creating",
            Phase::Active => "Active",
            Phase::Failed => "Failed",
            Phase::CrashLoopBackOff => "CrashLoopBackOff",
            Phase::Terminating => "Terminating",
        }
    }
}

impl std::fmt::Display for Phase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl VirtualMachine {
    /// A VM named `namespace/name` asking for `cpu` and `memory` (quantity strings).
    pub fn namespaced(namespace: &str, name: &str, cpu: &str, memory: &str) -> Self {
        Self {
            metadata: ObjectMeta {
                namespace: Some(namespace.to_string()),
                name: Some(name.to_string()),
                ..Default::default()
            },
            spec: VirtualMachineSpec {
                resource: Some(ResourceSpec {
                    cpu: Quantity(cpu.to_string()),
                    memory: Quantity(memory.to_string()),
                }),
            },
            status: None,
        }
    }

    /// `namespace/name`, the workqueue key.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace(), self.name())
    }

    /// `metadata.namespace` or "".
    pub fn namespace(&self) -> &str {
        self.metadata.namespace.as_deref().unwrap_or("")
    }

    /// `metadata.name` or "".
    pub fn name(&self) -> &str {
        self.metadata.name.as_deref().unwrap_or("")
    }

    /// `metadata.uid` or "".
    pub fn uid(&self) -> &str {
        self.metadata.uid.as_deref().unwrap_or("")
    }

    /// The phase, `None` when there is no status yet.
    pub fn phase(&self) -> Phase {
        self.status.as_ref().map(|s| s.phase).unwrap_or_default()
    }

    /// True once deletion was requested.
    pub fn is_deleting(&self) -> bool {
        self.metadata.deletion_timestamp.is_some()
    }

    /// True if our finalizer is present.
    pub fn has_finalizer(&self) -> bool {
        self.metadata
            .finalizers
            .as_ref()
            .is_some_and(|f| f.iter().any(|x| x == FINALIZER))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_vm_from_the_apiserver_with_integer_quantities_and_a_status_deserialises() {
        let vm: VirtualMachine = serde_json::from_value(serde_json::json!({
            "apiVersion": "cloudnative.tw/v1alpha1", "kind": "VirtualMachine",
            "metadata": {"name": "test-vm", "namespace": "default", "finalizers": [FINALIZER]},
            "spec": {"resource": {"cpu": 2, "memory": "4G"}},
            "status": {"phase": "Active", "server": {"id": "abc", "state": "running", "usage": {"cpu": 12.5, "memory": 3.0}},
                       "lastUpdateTime": "2026-01-01T00:00:00Z"}
        }))
        .unwrap();
        assert_eq!(vm.spec.resource.as_ref().unwrap().cpu, Quantity("2".into()));
        assert_eq!(vm.phase(), Phase::Active);
        assert!(vm.has_finalizer());
        assert_eq!(vm.key(), "default/test-vm");
        assert_eq!(vm.status.unwrap().server.unwrap().usage.cpu, 12.5);
    }

    #[test]
    fn an_empty_or_unknown_phase_reads_as_not_yet_reconciled() {
        let empty: VirtualMachineStatus =
            serde_json::from_value(serde_json::json!({"phase": ""})).unwrap();
        assert_eq!(empty.phase, Phase::None);
        let odd: VirtualMachineStatus =
            serde_json::from_value(serde_json::json!({"phase": "Sleeping"})).unwrap();
        assert_eq!(odd.phase, Phase::Unknown);
        assert_eq!(
            serde_json::to_value(Phase::Creating).unwrap(),
            serde_json::json!("Creating")
        );
        assert_eq!(
            serde_json::to_value(Phase::None).unwrap(),
            serde_json::json!("")
        );
    }

    #[test]
    fn the_resource_url_is_the_crds_namespaced_path() {
        use kube_client::Resource;
        assert_eq!(VirtualMachine::kind(&()), "VirtualMachine");
        assert_eq!(
            VirtualMachine::url_path(&(), Some("ns")),
            "/apis/cloudnative.tw/v1alpha1/namespaces/ns/virtualmachines"
        );
    }
}
