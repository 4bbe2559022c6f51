//! The VirtualMachine custom resource (controller101's `pkg/apis/cloudnative/v1alpha1/types.go`),
//! as a plain serde struct that implements [`kube_client::Resource`] by hand (no kube-derive).
//!
//! Differences from controller101 on purpose: `spec.resource` is validated by the CRD schema
//! (`crds/virtualmachine.yaml`) and again by [`super::quantity`] before anything is created;
//! the status is written only through the status subresource.
//!
//! Invariant: `status.phase` is one of the [`Phase`] strings; an unknown string read from the
//! apiserver deserialises as [`Phase::Unknown`] and is treated like a fresh object.

use std::borrow::Cow;

use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta, Time};
use kube_client::Resource;
use serde::{Deserialize, Serialize};

/// API group of the resource.
pub const GROUP: &str = "cloudnative.tw";
/// API version of the resource.
pub const VERSION: &str = "v1alpha1";
/// Kind of the resource.
pub const KIND: &str = "VirtualMachine";
/// Plural (the REST resource name).
pub const PLURAL: &str = "virtualmachines";
/// The finalizer that keeps a VM until its server is deleted (controller101's string).
pub const FINALIZER: &str = "finalizer.cloudnative.tw";

/// `cloudnative.tw/v1alpha1` `VirtualMachine`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachine {
    #[serde(default = "api_version")]
    /// `cloudnative.tw/v1alpha1`.
    pub api_version: String,
    #[serde(default = "kind")]
    /// `VirtualMachine`.
    pub kind: String,
    #[serde(default)]
    /// Name, namespace, uid, finalizers, ...
    pub metadata: ObjectMeta,
    #[serde(default)]
    /// What the user asks for.
    pub spec: VirtualMachineSpec,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    /// What the controller observed.
    pub status: Option<VirtualMachineStatus>,
}

/// `spec`: what the user asks for.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachineSpec {
    /// Required by the schema; `None` here only for objects built in code.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource: Option<ResourceSpec>,
}

/// `spec.resource`: Kubernetes quantities (`cpu: 2`, `cpu: 500m`, `memory: 4G`, `memory: 4Gi`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ResourceSpec {
    /// CPU cores (`2`, `500m`).
    pub cpu: Quantity,
    /// Memory (`4G`, `4Gi`).
    pub memory: Quantity,
}

/// `status`: what the controller observed.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachineStatus {
    #[serde(default)]
    /// Where the VM is in its life ([`Phase`]).
    pub phase: Phase,
    /// Why the VM is in its phase; empty when there is nothing to say (Active and healthy).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    /// The server backing the VM, as last seen.
    pub server: Option<ServerStatus>,
    /// Restarts of the server after it exited, since it last ran
    /// [`super::reconcile::CRASH_RESET_AFTER`] without exiting (a pod's `restartCount`).
    /// An `int32`, as the CRD says: the apiserver checks the schema's bounds, not its
    /// `format`, so the type is as wide as the CRD allows and no wider.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub restarts: i32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    /// When the status last changed in a way a user sees.
    pub last_update_time: Option<Time>,
    /// `Ready` and `ServerRunning` ([`super::conditions`]), derived from the rest of the status
    /// each time it is written.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// `status.server`: the container backing the VM.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
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
    /// `kvm` or `tcg` for a QEMU server (how its CPUs run); absent for containers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accelerator: Option<String>,
    #[serde(default)]
    /// CPU and memory use.
    pub usage: ServerUsage,
}

/// `status.server.usage`: percentages from the engine's stats.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ServerUsage {
    /// CPU% = cpu_delta / system_delta * online_cpus * 100 (100 = one core busy).
    pub cpu: f64,
    /// Mem% = usage / limit * 100.
    pub memory: f64,
}

/// `status.phase` (controller101's `VirtualMachinePhase`, plus the empty initial phase).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
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
    /// The server exited [`super::reconcile::CRASH_LOOP_AFTER`] times in a row; it is
    /// restarted with a growing delay (a pod's `CrashLoopBackOff`).
    CrashLoopBackOff,
    /// Deletion was requested; its server is being deleted.
    Terminating,
    /// A string this version does not know; handled like [`Phase::None`].
    #[serde(other)]
    Unknown,
}

fn is_zero(n: &i32) -> bool {
    *n == 0
}

fn api_version() -> String {
    format!("{GROUP}/{VERSION}")
}

fn kind() -> String {
    KIND.to_string()
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
    pub fn new(namespace: &str, name: &str, cpu: &str, memory: &str) -> Self {
        Self {
            api_version: api_version(),
            kind: kind(),
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

impl Resource for VirtualMachine {
    type DynamicType = ();
    type Scope = NamespaceResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        Cow::Borrowed(KIND)
    }
    fn group(_: &()) -> Cow<'_, str> {
        Cow::Borrowed(GROUP)
    }
    fn version(_: &()) -> Cow<'_, str> {
        Cow::Borrowed(VERSION)
    }
    fn plural(_: &()) -> Cow<'_, str> {
        Cow::Borrowed(PLURAL)
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
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
        assert_eq!(
            VirtualMachine::url_path(&(), Some("ns")),
            "/apis/cloudnative.tw/v1alpha1/namespaces/ns/virtualmachines"
        );
    }
}
