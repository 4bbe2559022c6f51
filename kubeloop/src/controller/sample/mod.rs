//! The sample-controller equivalent: a `Foo` asks for a Deployment of nginx Pods; the
//! controller creates it, keeps its replicas in line and reports available replicas back.
//! Counterpart: kubernetes/sample-controller.
//!
//! | kubeloop            | sample-controller                                        |
//! |---------------------|----------------------------------------------------------|
//! | [`types`]           | `pkg/apis/samplecontroller/v1alpha1/types.go`            |
//! | [`deployment`]      | `newDeployment`, `metav1.IsControlledBy`                 |
//! | [`sync`]            | `syncHandler`, `updateFooStatus`                         |
//! | [`api`]             | the clientsets and listers the sync uses                 |
//! | [`controller`]      | `NewController`, event handlers, `Run`                   |
//! | [`error`]           | the errors `syncHandler` returns                         |
//!
//! The CRD is `Foo::crd()` (kube's `CustomResourceExt`, from [`types`]), committed as
//! `crds/foo.yaml` (`hack/generate-crds`); an example `examples/example-foo.yaml`, the RBAC it needs
//! in-cluster `examples/sample-controller-rbac.yaml`; the binary runs it as
//! `kubeloop sample-controller`.

// `foo` is this controller's resource, not a placeholder name.
#![allow(clippy::disallowed_names)]

pub mod api;
pub mod controller;
pub mod deployment;
pub mod error;
pub mod sync;
pub mod types;

pub use api::{KubeSyncClient, SyncClient};
pub use controller::{CONTROLLER_NAME, ControllerConfig, run};
pub use error::{ControllerError, SyncError};
pub use types::{Foo, FooSpec, FooStatus};
