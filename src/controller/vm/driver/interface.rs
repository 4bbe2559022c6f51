//! The driver interface, controller101's `pkg/driver` `Interface`, and its vocabulary: the
//! labels that tie a server to its VM, what a server is and reports, and the errors. A leaf:
//! the drivers (docker, fake, qemu) implement it, and it imports none of them.

use std::collections::BTreeMap;
use std::future::Future;

use k8s_openapi::jiff::Timestamp;
use thiserror::Error;

/// Labels put on every server, so they can be traced back to their VM.
pub const LABEL_NAMESPACE: &str = "kubeloop.dev/vm-namespace";
/// The VM's name.
pub const LABEL_NAME: &str = "kubeloop.dev/vm-name";
/// The VM's `metadata.uid`: the only proof that a server belongs to a VM.
pub const LABEL_UID: &str = "kubeloop.dev/vm-uid";
/// Marks servers the VM controller manages; its value is [`DEFAULT_MANAGED_BY`] unless the
/// driver is configured otherwise (two clusters sharing one engine must use two values, or
/// each one's orphan sweep would take the other's servers for orphans).
pub const LABEL_MANAGED_BY: &str = "kubeloop.dev/managed-by";
/// The default value of [`LABEL_MANAGED_BY`].
pub const DEFAULT_MANAGED_BY: &str = "kubeloop-vm-controller";

/// What to create for one VM.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerSpec {
    /// From [`server_name`].
    pub name: String,
    /// The VM's namespace.
    pub vm_namespace: String,
    /// The VM's name.
    pub vm_name: String,
    /// The VM's uid (the server's [`LABEL_UID`]).
    pub vm_uid: String,
    /// Millicores (NanoCpus = millis * 1e6).
    pub cpu_millis: u64,
    /// Bytes.
    pub memory_bytes: u64,
}

/// A server as the engine reports it.
#[derive(Clone, Debug, PartialEq)]
pub struct DriverServerStatus {
    /// The engine's id.
    pub id: String,
    /// The engine's state string (`running`, `exited`, `created`, ...).
    pub state: String,
    /// True if the server is running (usage is meaningful only then).
    pub running: bool,
    /// CPU%, 100 = one core busy.
    pub cpu_percent: f64,
    /// Memory% of the limit.
    pub memory_percent: f64,
    /// The server's CPU limit in millicores (0: the engine did not say / unlimited).
    pub cpu_millis: u64,
    /// The server's memory limit in bytes (0: the engine did not say / unlimited).
    pub memory_bytes: u64,
    /// Its [`LABEL_UID`] label: the uid of the VM it belongs to (`None`: unlabelled).
    pub vm_uid: Option<String>,
    /// When the server last started (`None`: never started, or the engine did not say).
    pub started_at: Option<Timestamp>,
    /// When the server's last run ended, if it has stopped (`None` while it runs, if it never
    /// ran, or if the engine did not say).
    pub finished_at: Option<Timestamp>,
    /// The exit code of the server's last run, if it has stopped (with [`Self::finished_at`]).
    pub exit_code: Option<i64>,
    /// How the server's CPUs run, where the engine has a choice: `kvm` or `tcg` (QEMU);
    /// `None` for containers.
    pub accelerator: Option<String>,
}

impl DriverServerStatus {
    /// True if the server ran and stopped (exited, was killed, crashed), as opposed to one
    /// created and never started, or running.
    pub fn exited(&self) -> bool {
        !self.running && self.finished_at.is_some()
    }
}

/// What [`Driver::create_server`] did.
#[derive(Clone, Debug, PartialEq)]
pub struct Created {
    /// The server, running.
    pub status: DriverServerStatus,
    /// True if the server already existed (with this VM's uid) and was adopted, not created:
    /// undoing this call must then not delete it.
    pub adopted: bool,
}

/// What [`Driver::delete_server`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DeleteOutcome {
    /// The server (this engine id) was removed.
    Deleted {
        /// The engine's id of the server.
        id: String,
    },
    /// There was no such server.
    Absent,
    /// The server exists but its [`LABEL_UID`] is not the given uid (`None`: no such label); it
    /// was left alone.
    NotOwned {
        /// The server's engine id.
        id: String,
        /// Its [`LABEL_UID`] (`None`: none).
        found_uid: Option<String>,
    },
}

/// One server carrying [`LABEL_MANAGED_BY`], as [`Driver::list_servers`] reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ManagedServer {
    /// The engine's id.
    pub id: String,
    /// The server's name.
    pub name: String,
    /// [`LABEL_NAMESPACE`], [`LABEL_NAME`] and [`LABEL_UID`] (`None` where the label is missing).
    pub vm_namespace: Option<String>,
    /// [`LABEL_NAME`].
    pub vm_name: Option<String>,
    /// [`LABEL_UID`].
    pub vm_uid: Option<String>,
}

/// A driver call that failed.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum DriverError {
    /// The engine could not be reached at all (socket missing, connection refused, timeout).
    #[error("{engine} is unreachable: {message}")]
    Unreachable {
        /// The engine, as [`Driver::engine`] names it.
        engine: String,
        /// What the other side said.
        message: String,
    },
    /// The engine answered with an error.
    #[error("{engine} refused to {operation} server {server}: {message}")]
    Engine {
        /// The engine, as [`Driver::engine`] names it.
        engine: String,
        /// What was being done (e.g. `status update`, `create`).
        operation: &'static str,
        /// The server's name.
        server: String,
        /// What the other side said.
        message: String,
    },
    /// The engine refused the server for a reason retrying the same spec will not fix (its
    /// image is missing, its limits cannot be applied): the VM goes Failed and is retried only
    /// when its spec changes or after a long, bounded interval.
    #[error("{engine} refused to {operation} server {server}: {message}")]
    Refused {
        /// The engine, as [`Driver::engine`] names it.
        engine: String,
        /// What was being done (e.g. `status update`, `create`).
        operation: &'static str,
        /// The server's name.
        server: String,
        /// What the other side said.
        message: String,
    },
    /// A server of that name exists but does not carry the VM's uid (`found_uid: None`: no
    /// uid label at all); it was neither adopted nor changed.
    #[error(
        "{engine}: server {server} (id {id}) has {} but the VirtualMachine's uid is {wanted_uid}",
        uid_label_text(found_uid.as_deref())
    )]
    NameTaken {
        /// The engine, as [`Driver::engine`] names it.
        engine: String,
        /// The server's name.
        server: String,
        /// The engine's id of the server.
        id: String,
        /// The VirtualMachine's uid.
        wanted_uid: String,
        /// The server's `kubeloop.dev/vm-uid` label (`None`: it has none).
        found_uid: Option<String>,
    },
}

impl DriverError {
    /// True if retrying the same spec soon will not help ([`DriverError::Refused`]).
    pub fn is_permanent(&self) -> bool {
        matches!(self, DriverError::Refused { .. })
    }
}

/// `label kubeloop.dev/vm-uid=<uid>` or `no kubeloop.dev/vm-uid label`, for messages.
pub(crate) fn uid_label_text(found_uid: Option<&str>) -> String {
    match found_uid {
        Some(uid) => format!("label {LABEL_UID}={uid}"),
        None => format!("no {LABEL_UID} label"),
    }
}

/// The labels a server for `spec` is created with.
pub(crate) fn labels_for(spec: &ServerSpec, managed_by: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (LABEL_NAMESPACE.to_string(), spec.vm_namespace.clone()),
        (LABEL_NAME.to_string(), spec.vm_name.clone()),
        (LABEL_UID.to_string(), spec.vm_uid.clone()),
        (LABEL_MANAGED_BY.to_string(), managed_by.to_string()),
    ])
}

/// controller101's driver interface. Implementations are cheap to share (`&self` methods).
pub trait Driver: Send + Sync + 'static {
    /// Names the engine in messages and VM reasons (e.g. `docker engine at unix:///run/x.sock`).
    fn engine(&self) -> &str;

    /// Creates and starts the server labelled with `spec`'s VM, or adopts (and starts) an
    /// existing one of that name if its [`LABEL_UID`] is `spec.vm_uid`; one with another uid or
    /// none is [`DriverError::NameTaken`] and left as it is.
    fn create_server(
        &self,
        spec: &ServerSpec,
    ) -> impl Future<Output = Result<Created, DriverError>> + Send;

    /// Deletes the server named `name_or_id` (a name, or the engine's full id) if its
    /// [`LABEL_UID`] is `uid`, by the id it was found with, so a server created under the same
    /// name in between is never the one removed. A missing server is [`DeleteOutcome::Absent`],
    /// not an error.
    fn delete_server(
        &self,
        name_or_id: &str,
        uid: &str,
    ) -> impl Future<Output = Result<DeleteOutcome, DriverError>> + Send;

    /// Every server carrying [`LABEL_MANAGED_BY`] with this driver's value, running or not.
    fn list_servers(&self) -> impl Future<Output = Result<Vec<ManagedServer>, DriverError>> + Send;

    /// True if a server of exactly that name exists.
    fn server_exists(&self, name: &str) -> impl Future<Output = Result<bool, DriverError>> + Send;

    /// The server's state and usage; `None` if it does not exist.
    fn server_status(
        &self,
        name: &str,
    ) -> impl Future<Output = Result<Option<DriverServerStatus>, DriverError>> + Send;
}

/// The server (container) name of VM `namespace/name`: `kubeloop-vm_<namespace>_<name>`.
///
/// Injective: namespaces are DNS labels and VM names DNS subdomains, neither can contain `_`,
/// so the first `_` after the prefix ends the namespace. (`kubeloop-vm-<ns>-<name>` would map
/// `a-b/c` and `a/b-c` to the same container.) `_`, `.` and `-` are all valid in Docker and
/// podman container names (`[a-zA-Z0-9][a-zA-Z0-9_.-]*`).
pub fn server_name(namespace: &str, name: &str) -> String {
    format!("kubeloop-vm_{namespace}_{name}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_names_of_different_vms_never_collide() {
        assert_ne!(server_name("a-b", "c"), server_name("a", "b-c"));
        assert_ne!(server_name("a", "b.c"), server_name("a.b", "c"));
        assert_eq!(
            server_name("default", "test-vm"),
            "kubeloop-vm_default_test-vm"
        );
    }
}
