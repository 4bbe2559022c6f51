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
//!   one long-lived spawner thread), and [`Cluster`]'s `Drop` kills them in order.
//! - Each cluster owns a temporary directory (certs, kubeconfigs, etcd data, logs); set
//!   `KUBELOOP_KEEP_TESTENV=1` to keep it for reading the logs after a failure.
//!
//! [`FaultProxy`] sits between a client and the apiserver to cut connections or refuse them.
//! [`eventually`] and [`Cluster::kubectl`] are the waiting and kubectl helpers of every
//! real-cluster test.

mod certs;
mod cluster;
mod helpers;
mod ports;
pub mod process;
mod proxy;
pub mod versions;

use std::path::PathBuf;

pub use cluster::{Cluster, ClusterOptions, KWOK_NODE, shared, shared_full};
pub use helpers::{Kubectl, POLL_INTERVAL, Ready, eventually, eventually_blocking};
pub use proxy::FaultProxy;

/// What went wrong while bringing up or driving the local control plane.
#[derive(Debug, thiserror::Error)]
pub enum TestEnvError {
    #[error(
        "control-plane binary {0} not found: run hack/build-control-plane first (or set KUBELOOP_BIN_DIR)"
    )]
    MissingBinary(PathBuf),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("generating certificates: {0}")]
    Certificates(String),
    #[error("starting {component}: {detail}")]
    Spawn { component: String, detail: String },
    #[error("{component} did not become ready within {seconds} s: {detail}")]
    NotReady {
        component: String,
        seconds: u64,
        detail: String,
    },
    #[error("{component} exited during start-up ({status}); last lines of {log}:\n{tail}")]
    Exited {
        component: String,
        status: String,
        log: PathBuf,
        tail: String,
    },
    #[error("kubeconfig {path}: {detail}")]
    Kubeconfig { path: PathBuf, detail: String },
    #[error("apiserver request failed: {0}")]
    Api(#[from] kube_client::Error),
    #[error("etcd request failed: {0}")]
    Etcd(String),
}
