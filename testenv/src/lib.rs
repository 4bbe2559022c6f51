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
//! [`eventually`](kubeloop::testing::eventually) (in `kubeloop::testing`, with the unit tests'
//! helpers) and [`Cluster::kubectl`] are the waiting and kubectl helpers of every
//! real-cluster test; [`ManagedProcess`] runs the programs a test starts beside the cluster
//! (the `kubeloop` binary, a podman service), under the same never-outlive-the-test rule.

mod certs;
mod cluster;
mod components;
mod error;
mod etcd;
mod helpers;
mod kubeconfig;
mod node;
mod options;
pub mod perturb;
mod ports;
mod process;
mod programs;
mod proxy;
mod versions;

pub use cluster::{Cluster, shared, shared_full};
pub use components::KWOK_NODE;
pub use error::TestEnvError;
pub(crate) use error::{create_dir, write_file};
pub use helpers::{Kubectl, ensure_crd};
pub use node::{BRIDGE, ENGINE_LABEL, NODE_IP, NODE_NAME, POD_SUBNET};
pub use options::ClusterOptions;
pub use process::ManagedProcess;
pub use programs::{example, kubeloop_binary};
pub use proxy::{FaultProxy, HttpFaultProxy, ProxiedRequest, RequestKind, UNDECODABLE_EVENT_LINE};
pub use versions::{bin_dir, etcd_version, kubernetes_version, kwok_version};
