//! The VirtualMachine controller: controller101 (cloud-native-taiwan) done right. VMs are
//! `cloudnative.tw/v1alpha1` VirtualMachine objects; each is backed by a server from one of
//! three drivers: a container through the Docker API ([`DockerDriver`]), a
//! `qemu-system-x86_64` process ([`QemuDriver`]), or an in-memory fake ([`FakeDriver`]).
//!
//! | file              | what                                          | controller101                                    |
//! |-------------------|-----------------------------------------------|--------------------------------------------------|
//! | `types.rs`        | [`VirtualMachine`] and its spec and status    | `pkg/apis/cloudnative/v1alpha1/types.go`         |
//! | `quantity.rs`     | cpu and memory quantities parsed              | `resource.Quantity` parsing (apimachinery)       |
//! | `driver/`         | [`Driver`] and its vocabulary (`interface.rs`); [`DockerDriver`] (`docker.rs`), [`QemuDriver`] (`qemu/`: launch, state directories, QMP, usage), [`FakeDriver`] (`fake.rs`) | `pkg/driver` (`Interface`, `docker.go`, fake; the KVM driver it planned) |
//! | `reconcile.rs`, `reconcile/` | the phase machine                  | `controller.go` `syncHandler` and helpers        |
//! | `compensation.rs` | undoing a create that completed after the term | (none)                                          |
//! | `sweep.rs`        | [`sweep_orphans`]: servers whose VM is gone   | (none)                                           |
//! | `error_policy.rs` | which errors are retried, and how soon        | `controller.go` `handleErr`                      |
//! | `api.rs`          | [`VmApi`], [`KubeVmApi`]: status and finalizer writes | its clientset's `Update` / `UpdateStatus` calls |
//! | `conditions.rs`   | the `Ready` and `ServerRunning` conditions    | (none)                                           |
//! | `controller.rs`   | [`run`], [`run_sharded`], [`VmControllerConfig`] | `controller.go` `New` / `Run`, informer handlers |
//! | `fake_api.rs`, `fixture.rs` | the unit tests' in-memory API and reconciler (tests only) | (none)                          |
//!
//! The files are private; what a program needs is re-exported here, so each item has one
//! path, `kubeloop::controller::vm::Item`: the controller and its settings, the CRD types, the
//! driver interface and its three drivers, and the orphan sweep. [`FakeDriver`] is public as a
//! driver (`--vm-driver fake`); the controls the unit tests steer it with are compiled in tests
//! only. The QEMU driver's state directories and QMP client are its internals: the test that
//! looks inside a running QEMU VM (`tests/vm_qemu.rs`) compiles their files into itself.
//!
//! The binary is `kubeloop vm-controller` (`cli/src/cmd/vm_controller.rs`); the CRD is
//! `VirtualMachine::crd()` (kube's `CustomResourceExt`), committed as
//! `crds/virtualmachine.yaml` (`hack/generate-crds`).

mod api;
mod compensation;
mod conditions;
mod controller;
mod driver;
mod error_policy;
#[cfg(test)]
mod fake_api;
#[cfg(test)]
mod fixture;
mod quantity;
mod reconcile;
mod sweep;
mod types;

pub use api::{ApiError, KubeVmApi, VmApi};
pub use controller::{
    CONTROLLER_NAME, DEFAULT_REFRESH_WORKERS, VmControllerConfig, VmControllerError, run,
    run_sharded,
};
pub use driver::{
    Accel, Created, DEFAULT_DOCKER_HOST, DEFAULT_IMAGE, DEFAULT_MANAGED_BY, DeleteOutcome,
    DockerDriver, DockerDriverConfig, Driver, DriverError, DriverServerStatus, FakeDriver,
    LABEL_MANAGED_BY, LABEL_NAME, LABEL_NAMESPACE, LABEL_UID, MAX_VCPUS, MIN_MEMORY_MIB,
    ManagedServer, QemuDriver, QemuDriverConfig, ServerSpec, default_cache_dir, default_state_dir,
    server_name,
};
pub use reconcile::DEFAULT_REFRESH_INTERVAL;
pub use sweep::{DEFAULT_SWEEP_INTERVAL, SweepError, SweepReport, sweep_orphans};
pub use types::{
    FINALIZER, Phase, ResourceSpec, ServerStatus, ServerUsage, VirtualMachine, VirtualMachineSpec,
    VirtualMachineStatus,
};
