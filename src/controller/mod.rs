//! The controllers built on kubeloop's stack: the sample-controller equivalent (Foo ->
//! Deployment) and the VirtualMachine controller (VMs as containers through the Docker API).
//!
//! | kubeloop            | counterpart                                                   |
//! |---------------------|---------------------------------------------------------------|
//! | [`worker`]          | sample-controller's `runWorker` / `processNextWorkItem`       |
//! | [`sample`]          | kubernetes/sample-controller (Foo -> Deployment)              |
//! | [`vm`]              | controller101's VirtualMachine controller                   |

pub mod sample;
pub mod worker;
pub mod vm;
