//! The pinned versions of the control plane, read from `hack/versions.env`, the one file that
//! `hack/build-control-plane` reads too. Moving to a newer Kubernetes is a change to that file.

use std::path::PathBuf;

// `versions.env` beside this file is a symlink to hack/versions.env: inside the package, so
// `cargo package` copies the file in and the published crate builds from its own files (as
// workspaces link a crate's README.md or LICENSE to the repository's).
const VERSIONS_ENV: &str = include_str!("versions.env");

fn lookup(key: &str) -> &'static str {
    VERSIONS_ENV
        .lines()
        .filter_map(|line| line.split_once('='))
        .find(|(k, _)| k.trim() == key)
        .map(|(_, v)| v.trim())
        .unwrap_or_else(|| panic!("hack/versions.env has no {key}= line"))
}

/// The Kubernetes release the control plane is built from, e.g. `v1.36.3`.
pub fn kubernetes_version() -> &'static str {
    lookup("KUBERNETES_VERSION")
}

/// The etcd version in `hack/versions.env`.
pub fn etcd_version() -> &'static str {
    lookup("ETCD_VERSION")
}

/// The kwok version in `hack/versions.env`.
pub fn kwok_version() -> &'static str {
    lookup("KWOK_VERSION")
}

/// Where `hack/build-control-plane` put the binaries: `$KUBELOOP_BIN_DIR`, else
/// `$KUBELOOP_CACHE/bin/<kubernetes version>`, else `~/.cache/kubeloop/bin/<kubernetes version>`.
pub fn bin_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("KUBELOOP_BIN_DIR") {
        return PathBuf::from(dir);
    }
    let cache = std::env::var_os("KUBELOOP_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let home = std::env::var_os("HOME")
                .map(PathBuf::from)
                .unwrap_or_else(|| PathBuf::from("/root"));
            home.join(".cache").join("kubeloop")
        });
    cache.join("bin").join(kubernetes_version())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_are_read_from_hack_versions_env() {
        assert!(
            kubernetes_version().starts_with("v1."),
            "{}",
            kubernetes_version()
        );
        assert!(etcd_version().starts_with("v3.6."), "{}", etcd_version());
        assert!(kwok_version().starts_with("v0."), "{}", kwok_version());
    }

    #[test]
    fn bin_dir_names_the_kubernetes_version() {
        if std::env::var_os("KUBELOOP_BIN_DIR").is_none() {
            assert!(bin_dir().ends_with(kubernetes_version()));
        }
    }
}
