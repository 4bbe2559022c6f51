//! The VirtualMachine controller: controller101 (cloud-native-taiwan) done right. VMs are
//! `cloudnative.tw/v1alpha1` VirtualMachine objects; each is backed by a container created
//! through the Docker API (or an in-memory fake).
//!
//! | kubeloop                 | controller101                                            |
//! |--------------------------|----------------------------------------------------------|
//! | [`types`]                | `pkg/apis/cloudnative/v1alpha1/types.go`                 |
//! | [`quantity`]             | `resource.Quantity` parsing (apimachinery)               |
//! | [`driver`]               | `pkg/driver` (`Interface`, `docker.go`, fake)            |
//! | [`reconcile`]            | `controller.go` `syncHandler` and helpers                |
//! | [`compensation`]         | (none) undoing a create that completed after the term     |
//! | [`sweep`]                | (none) removing servers whose VM is gone                  |
//! | [`error_policy`]         | `controller.go` `handleErr`                              |
//! | [`api`]                  | its clientset's `Update` / `UpdateStatus` calls           |
//! | [`controller`]           | `controller.go` `New` / `Run`, informer handlers         |
//!
//! The binary is `kubeloop vm-controller` (`src/cmd/vm_controller.rs`); the CRD is
//! `VirtualMachine::crd()` (kube's `CustomResourceExt`, from [`types`]), committed as
//! `crds/virtualmachine.yaml` (`hack/generate-crds`).

pub mod api;
pub mod compensation;
pub mod conditions;
pub mod controller;
pub mod driver;
pub mod error_policy;
#[cfg(test)]
mod fake_api;
#[cfg(test)]
mod fixture;
pub mod quantity;
pub mod reconcile;
pub mod sweep;
pub mod types;

pub use controller::{
    CONTROLLER_NAME, DEFAULT_REFRESH_WORKERS, VmControllerConfig, VmControllerError, run,
    run_sharded,
};
pub use reconcile::{DEFAULT_REFRESH_INTERVAL, Reconciler, ReconcilerConfig};
pub use sweep::{DEFAULT_SWEEP_INTERVAL, SweepError, SweepReport, sweep_orphans};
pub use types::{FINALIZER, Phase, VirtualMachine};
