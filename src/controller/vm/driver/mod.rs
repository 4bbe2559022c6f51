//! Where VMs run: controller101's `pkg/driver` (`Interface`: CreateServer, DeleteServer,
//! IsServerExist, GetServerStatus), with three implementations: [`FakeDriver`] (in memory),
//! [`DockerDriver`] (containers through the Docker API, e.g. podman's) and [`QemuDriver`]
//! (`qemu-system-x86_64` processes).
//!
//! Differences on purpose: every call returns its errors (controller101 dropped those of
//! `IsServerExist`); `delete_server` of a missing server succeeds; `create_server` of a server
//! that already exists adopts it (starting it if stopped) instead of failing, so a VM whose
//! container survived a controller crash is not stuck in Creating; servers are named by
//! [`server_name`], which is injective over (namespace, name).
//!
//! Ownership is by uid, never by name: every server carries its VM's uid in the
//! [`LABEL_UID`] label. `create_server` adopts an existing server only if that label is the
//! VM's uid (else [`DriverError::NameTaken`]), and `delete_server` removes a server only if it
//! is (else [`DeleteOutcome::NotOwned`]). A server of the same name with another uid or none
//! belongs to a re-created VM of the same name, to another cluster on the same engine, or to
//! someone by hand, and is never touched. [`Driver::list_servers`] lists the servers carrying
//! [`LABEL_MANAGED_BY`], for the orphan sweep (`super::sweep`).
//!
//! The interface and its vocabulary are in `interface.rs`, a leaf the drivers import; this
//! file only names the modules and re-exports them.

mod docker;
mod fake;
mod interface;
mod qemu;

pub use docker::{DEFAULT_DOCKER_HOST, DEFAULT_IMAGE, DockerDriver, DockerDriverConfig};
pub use fake::FakeDriver;
pub use interface::{
    Created, DEFAULT_MANAGED_BY, DeleteOutcome, Driver, DriverError, DriverServerStatus,
    LABEL_MANAGED_BY, LABEL_NAME, LABEL_NAMESPACE, LABEL_UID, ManagedServer, ServerSpec,
    server_name,
};
pub(crate) use interface::{labels_for, uid_label_text};
pub use qemu::{
    Accel, MAX_VCPUS, MIN_MEMORY_MIB, QemuDriver, QemuDriverConfig, default_cache_dir,
    default_state_dir,
};
