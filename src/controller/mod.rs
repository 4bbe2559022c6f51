//! The controllers built on kubeloop's stack: the sample-controller equivalent (Foo ->
//! Deployment) and the VirtualMachine controller (VMs as containers through the Docker API).
//!
//! | kubeloop            | counterpart                                                   |
//! |---------------------|---------------------------------------------------------------|
//! | [`worker`]          | sample-controller's `runWorker` / `processNextWorkItem`       |
//! | [`vm`]              | controller101's VirtualMachine controller                   |

pub mod worker;
pub mod vm;
