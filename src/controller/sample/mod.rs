//! The sample-controller equivalent: a `Foo` asks for a Deployment of nginx Pods; the
//! controller creates it, keeps its replicas in line and reports available replicas back.
//! Counterpart: kubernetes/sample-controller.
//!
//! | file              | what                                         | sample-controller                              |
//! |-------------------|----------------------------------------------|------------------------------------------------|
//! | `types.rs`        | [`Foo`], [`FooSpec`], [`FooStatus`]          | `pkg/apis/samplecontroller/v1alpha1/types.go`  |
//! | `deployment.rs`   | [`new_deployment`], ownership checks         | `newDeployment`, `metav1.IsControlledBy`       |
//! | `sync.rs`         | [`sync_handler`]                             | `syncHandler`, `updateFooStatus`               |
//! | `api.rs`          | [`SyncClient`], [`KubeSyncClient`]           | the clientsets and listers the sync uses       |
//! | `controller.rs`   | [`run`], [`ControllerConfig`]                | `NewController`, event handlers, `Run`         |
//! | `error.rs`        | [`SyncError`], [`ControllerError`]           | the errors `syncHandler` returns               |
//!
//! The files are private; what a program needs is re-exported here, so each item has one
//! path, `kubeloop::controller::sample::Item`.
//!
//! The CRD is `Foo::crd()` (kube's `CustomResourceExt`), committed as
//! `crds/foo.yaml` (`hack/generate-crds`); an example `examples/example-foo.yaml`, the RBAC it needs
//! in-cluster `examples/sample-controller-rbac.yaml`; the binary runs it as
//! `kubeloop sample-controller`.

// `foo` is this controller's resource, not a placeholder name.
#![allow(clippy::disallowed_names)]

mod api;
mod controller;
mod deployment;
mod error;
mod sync;
mod types;

pub use api::{KubeSyncClient, SyncClient};
pub use controller::{CONTROLLER_NAME, ControllerConfig, run};
pub use deployment::new_deployment;
pub use error::{ControllerError, SyncError};
pub use sync::sync_handler;
pub use types::{Foo, FooSpec, FooStatus};
