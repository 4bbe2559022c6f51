//! The harness's error, and the two helpers every part of it writes its files with (an error
//! names the file). A leaf: every other file of the harness imports it, and it imports none of
//! them.

use std::path::PathBuf;

/// What went wrong while bringing up or driving the local control plane.
#[derive(Debug, thiserror::Error)]
pub enum TestEnvError {
    /// A control-plane binary is not where `hack/build-control-plane` puts it. The message is
    /// what a plain `cargo test` shows for every real-cluster test, so it says in one line how
    /// to run them.
    #[error(
        "control-plane binary {0} not found; real-cluster tests need the local control plane: run hack/test (builds it, then runs every test), or hack/build-control-plane once, then cargo test --all-features (KUBELOOP_BIN_DIR=<dir> if the binaries live elsewhere)"
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
