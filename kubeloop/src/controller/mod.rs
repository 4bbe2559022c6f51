//! The two controllers built on the runtime ([`crate::runtime`]), as users of its public API:
//! the sample-controller equivalent (Foo -> Deployment) and the VirtualMachine controller (VMs
//! as containers through the Docker API, or real VMs through QEMU).
//!
//! | kubeloop   | counterpart                                          |
//! |------------|------------------------------------------------------|
//! | [`sample`] | kubernetes/sample-controller (Foo -> Deployment)     |
//! | [`vm`]     | controller101's VirtualMachine controller            |

#[cfg(feature = "sample-controller")]
pub mod sample;
mod schema;
#[cfg(feature = "vm-controller")]
pub mod vm;
