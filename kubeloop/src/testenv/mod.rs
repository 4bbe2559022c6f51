//! A real, local Kubernetes control plane for tests and the demo: controller-runtime's
//! `envtest` idea, plus kube-controller-manager, kube-scheduler and kwok fake nodes.
//!
//! [`Cluster::start`] runs etcd and kube-apiserver (and, with [`ClusterOptions::full`],
//! kube-controller-manager, kube-scheduler and kwok with one fake Node) on loopback with free
//! ports and generated certificates, waits until each is ready and writes an admin kubeconfig.
//! The binaries come from `hack/build-control-plane` (versions in `hack/versions.env`).
//!
//! Invariants:
//! - No component outlives the test binary: see [`process`] for how (parent-death signal from
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
//! [`eventually`] and [`Cluster::kubectl`] are the waiting and kubectl helpers of every
//! real-cluster test.

mod certs;
mod cluster;
mod helpers;
mod node;
mod ports;
pub mod process;
mod proxy;
pub mod versions;

use std::path::PathBuf;

pub use cluster::{Cluster, ClusterOptions, KWOK_NODE, shared, shared_full};
pub use helpers::{Kubectl, POLL_INTERVAL, Ready, ensure_crd, eventually, eventually_blocking};
pub use node::{BRIDGE, ENGINE_LABEL, NODE_IP, NODE_NAME, POD_SUBNET};
pub use proxy::{FaultProxy, HttpFaultProxy, ProxiedRequest, RequestKind, UNDECODABLE_EVENT_LINE};

/// What went wrong while bringing up or driving the local control plane.
#[derive(Debug, thiserror::Error)]
pub enum TestEnvError {
    /// A control-plane binary is not where `hack/build-control-plane` puts it.
    #[error(
        "control-plane binary {0} not found: run hack/build-control-plane first (or set KUBELOOP_BIN_DIR)"
    )]
    MissingBinary(PathBuf),
    /// Reading or writing a file of the cluster failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What failed.
        source: std::io::Error,
    },
    /// The cluster's certificates could not be generated.
    #[error("generating certificates: {0}")]
    Certificates(String),
    /// A component could not be started.
    #[error("starting {component}: {detail}")]
    Spawn {
        /// The component (etcd, kube-apiserver, ...).
        component: String,
        /// What went wrong.
        detail: String,
    },
    /// A component did not answer its readiness check in time.
    #[error("{component} did not become ready within {seconds} s: {detail}")]
    NotReady {
        /// The component.
        component: String,
        /// How long it was given.
        seconds: u64,
        /// The last failed check.
        detail: String,
    },
    /// A component exited while starting.
    #[error("{component} exited during start-up ({status}); last lines of {log}:\n{tail}")]
    Exited {
        /// The component.
        component: String,
        /// Its exit status.
        status: String,
        /// Its log file.
        log: PathBuf,
        /// The last lines of its log.
        tail: String,
    },
    /// The admin kubeconfig could not be written or read.
    #[error("kubeconfig {path}: {detail}")]
    Kubeconfig {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        detail: String,
    },
    /// Something the real node needs (ClusterOptions::node) is missing from this machine.
    #[error("node mode: {0} (hack/setup-node prepares the node; hack/test runs it)")]
    NodeSetup(String),
    /// A host tool the harness runs (ip, iptables, ctr) failed.
    #[error("{0}")]
    HostCommand(String),
    /// An apiserver request of the harness failed.
    #[error("apiserver request failed: {0}")]
    Api(#[from] kube_client::Error),
    /// An etcd request of the harness (a compaction) failed.
    #[error("etcd request failed: {0}")]
    Etcd(String),
}

/// Writes `contents` to `path`; an error names the file.
pub(crate) fn write_file(path: &std::path::Path, contents: &str) -> Result<(), TestEnvError> {
    std::fs::write(path, contents).map_err(|source| TestEnvError::Io {
        path: path.to_owned(),
        source,
    })
}

/// Creates `path` and its parents; an error names the directory.
pub(crate) fn create_dir(path: &std::path::Path) -> Result<(), TestEnvError> {
    std::fs::create_dir_all(path).map_err(|source| TestEnvError::Io {
        path: path.to_owned(),
        source,
    })
}
