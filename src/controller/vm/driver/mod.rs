//! Where VMs run: controller101's `pkg/driver` (`Interface`: CreateServer, DeleteServer,
//! IsServerExist, GetServerStatus), with two implementations: [`FakeDriver`] (in memory) and
//! [`DockerDriver`] (containers through the Docker API, e.g. podman's).
//!
//! Differences on purpose: every call returns its errors (controller101 dropped those of
//! `IsServerExist`); `delete_server` of a missing server succeeds; `create_server` of a server
//! that already exists adopts it (starting it if stopped) instead of failing, so a VM whose
//! container survived a controller crash is not stuck in Creating; servers are named by
//! [`server_name`], which is injective over (namespace, name).

pub mod docker;
pub mod fake;

use std::future::Future;

use thiserror::Error;

pub use docker::{DockerDriver, DockerDriverConfig};
pub use fake::FakeDriver;

/// What to create for one VM.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerSpec {
    /// From [`server_name`].
    pub name: String,
    pub vm_namespace: String,
    pub vm_name: String,
    pub vm_uid: String,
    /// Millicores (NanoCpus = millis * 1e6).
    pub cpu_millis: u64,
    /// Bytes.
    pub memory_bytes: u64,
}

/// A server as the engine reports it.
#[derive(Clone, Debug, PartialEq)]
pub struct ServerStatus {
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
}

/// A driver call that failed.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum DriverError {
    /// The engine could not be reached at all (socket missing, connection refused, timeout).
    #[error("{engine} is unreachable: {message}")]
    Unreachable { engine: String, message: String },
    /// The engine answered with an error.
    #[error("{engine} refused to {operation} server {server}: {message}")]
    Engine {
        engine: String,
        operation: &'static str,
        server: String,
        message: String,
    },
}

/// controller101's driver interface. Implementations are cheap to share (`&self` methods).
pub trait Driver: Send + Sync + 'static {
    /// Names the engine in messages and VM reasons (e.g. `docker engine at unix:///run/x.sock`).
    fn engine(&self) -> &str;

    /// Creates and starts the server, or adopts (and starts) an existing one of that name.
    fn create_server(
        &self,
        spec: &ServerSpec,
    ) -> impl Future<Output = Result<ServerStatus, DriverError>> + Send;

    /// Deletes the server; a server that does not exist is not an error.
    fn delete_server(&self, name: &str) -> impl Future<Output = Result<(), DriverError>> + Send;

    /// True if a server of exactly that name exists.
    fn server_exists(&self, name: &str) -> impl Future<Output = Result<bool, DriverError>> + Send;

    /// The server's state and usage; `None` if it does not exist.
    fn server_status(
        &self,
        name: &str,
    ) -> impl Future<Output = Result<Option<ServerStatus>, DriverError>> + Send;
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
