//! kubeloop: client-go's controller machinery rebuilt in Rust, from scratch, on raw watch streams.
//!
//! The map follows client-go so that a reader who knows one finds their way in the other:
//!
//! | kubeloop              | client-go / Kubernetes                           |
//! |-----------------------|--------------------------------------------------|
//! | [`cache`]             | `k8s.io/client-go/tools/cache`                   |
//! | [`workqueue`]         | `k8s.io/client-go/util/workqueue`                |
//! | [`leaderelection`]    | `k8s.io/client-go/tools/leaderelection`          |
//! | [`record`]            | `k8s.io/client-go/tools/record`                  |
//! | [`controller`]        | `k8s.io/sample-controller`, controller101        |
//! | [`ops`]               | component-base metrics registry, apiserver healthz |
//! | [`testenv`]           | controller-runtime's `envtest`, plus kwok nodes  |
//! | [`testing`]           | `tools/cache/testing`, fake clientset reactors   |
//!
//! kube-client does the HTTP, kubeconfig and authentication; everything that turns a watch
//! stream into work for a controller is in this crate.

pub mod cache;
#[cfg(feature = "controllers")]
pub mod controller;
pub mod leaderelection;
#[cfg(feature = "ops")]
pub mod ops;
pub mod record;
#[cfg(feature = "testenv")]
pub mod testenv;
pub mod testing;
pub mod trace;
pub mod workqueue;

/// The README's Rust examples, compiled and run as doc tests so they cannot rot.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
