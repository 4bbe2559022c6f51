//! The two controllers built on the runtime ([`crate::runtime`]): the sample-controller
//! equivalent (Foo -> Deployment) and the VirtualMachine controller (VMs as containers through
//! the Docker API, or real VMs through QEMU).
//!
//! Each is an application with a public module of its own, the one exception below the top
//! level to "modules are private" (`tests/local/layering.rs` lists it): their names would clash in
//! one (`run`, `CONTROLLER_NAME`, their configs and errors). Inside each, the files are private
//! and re-exported, so an item has one path, `kubeloop::controller::sample::Item` or
//! `kubeloop::controller::vm::Item`.
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
