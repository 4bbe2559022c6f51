//! A real, local Kubernetes control plane for tests and the demo: controller-runtime's
//! `envtest` idea, plus kube-controller-manager, kube-scheduler and kwok fake nodes.
//!
//! [`Cluster::start`] runs etcd and kube-apiserver (and, with [`ClusterOptions::full`],
//! kube-controller-manager, kube-scheduler and kwok with one fake Node) on loopback with free
//! ports and generated certificates, waits until each is ready and writes an admin kubeconfig.
//! The binaries come from `hack/build-control-plane` into [`bin_dir`] (versions in
//! `hack/versions.env`: [`kubernetes_version`], [`etcd_version`], [`kwok_version`]).
//!
//! Invariants:
//! - No component outlives the test binary: see `process.rs` ([`ManagedProcess`]) for how (parent-death signal from
//!   one long-lived spawner thread), and [`Cluster`]'s `Drop` kills them in order. The one
//!   exception is a real node's containers when the test binary is killed: their containerd
//!   shims are not its children and outlive it; the next node cluster sweeps them (node/host.rs).
//! - Each cluster owns a temporary directory (certs, kubeconfigs, etcd data, logs); set
//!   `KUBELOOP_KEEP_TESTENV=1` to keep it for reading the logs after a failure.
//!
//! With [`ClusterOptions::node`] the workloads run for real instead: containerd, a kubelet and
//! kube-proxy make this machine a Node ([`NODE_NAME`]), and the apiserver listens on the pods'
//! bridge ([`NODE_IP`]) so that pods reach it; see `node/mod.rs` for the network and its limits.
//!
//! [`FaultProxy`] sits between a client and the apiserver to cut connections or refuse them;
//! [`HttpFaultProxy`] does that too, and speaks HTTP to answer watches with 429 and
//! `Retry-After`, corrupt watch events and count LISTs and WATCHes.
//!
//! The one way kubeloop's tests do each thing (cargo's `cargo-test-support`, controller-runtime's
//! envtest):
//! - run the `kubeloop` binary: [`Kubeloop`] (`Kubeloop::new(["sample-controller", ..])
//!   .kubeconfig(..).start()`), a [`ManagedProcess`] that never outlives the test, with its log,
//!   [`ManagedProcess::log_tail`], [`ManagedProcess::wait_for_line`] and signals; the examples
//!   through [`example`];
//! - wait: [`eventually`](kubeloop::testing::eventually) (in `kubeloop::testing`, which the
//!   library's unit tests use too), or [`ManagedProcess::eventually`], which adds the program's
//!   log tail to the failure;
//! - run kubectl: [`Cluster::kubectl`] (admin), [`Cluster::kubectl_as`] (another user),
//!   answering a [`Kubectl`];
//! - pick a port: [`free_port`];
//! - check an informer against the server ([`informer`]) and drive the VM controller ([`vm`]).
//!
//! [`perturb`] runs perturbation campaigns against a controller.

// `unsafe` (libc, each call with its SAFETY comment) only in the modules that allow it: the
// shared clusters' exit hook (cluster.rs), the node host's lock, kills and unmounts
// (node/host.rs), the processes' parent-death signal and signals (process.rs).
#![deny(unsafe_code)]

mod certs;
#[allow(unsafe_code)]
mod cluster;
mod components;
mod error;
mod etcd;
mod helpers;
pub mod informer;
mod kubeconfig;
mod node;
mod options;
pub mod perturb;
mod ports;
#[allow(unsafe_code)]
mod process;
mod programs;
mod proxy;
mod versions;
pub mod vm;

pub use cluster::{Cluster, shared, shared_full};
pub use components::KWOK_NODE;
pub use error::TestEnvError;
pub(crate) use error::{create_dir, write_file};
pub use helpers::{Kubectl, ensure_crd, scrape_metrics};
pub use node::{BRIDGE, ENGINE_LABEL, NODE_IP, NODE_NAME, POD_SUBNET};
pub use options::{ClusterOptions, SHARDED_LIST_AND_WATCH};
pub use ports::free_port;
pub use process::ManagedProcess;
pub use programs::{Kubeloop, example, kubeloop_binary};
pub use proxy::{FaultProxy, HttpFaultProxy, ProxiedRequest, RequestKind, UNDECODABLE_EVENT_LINE};
pub use versions::{bin_dir, etcd_version, kubernetes_version, kwok_version};
