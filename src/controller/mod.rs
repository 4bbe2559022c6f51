//! The controllers built on kubeloop's stack: the sample-controller equivalent (Foo ->
//! Deployment) and the VirtualMachine controller (VMs as containers through the Docker API).
//!
//! | kubeloop            | counterpart                                                   |
//! |---------------------|---------------------------------------------------------------|
//! | [`context`]         | controller-runtime's `context.Context` handed to `Reconcile`   |
//! | [`worker`]          | sample-controller's `runWorker` / `processNextWorkItem`       |
//! | [`sample`]          | kubernetes/sample-controller (Foo -> Deployment)              |
//! | [`vm`]              | controller101's VirtualMachine controller                   |

pub mod context;
pub mod sample;
pub mod vm;
pub mod worker;

pub use context::{NotEntitled, ReconcileContext};
