//! [`write_kubeconfig`]: a kubeconfig file for one client-certificate identity of the cluster
//! (the admin's, the kubelet's, kube-proxy's), for kubectl and the components to read.

use std::path::Path;

use super::certs::CertFiles;
use super::{TestEnvError, write_file};

/// Writes a kubeconfig at `path` for the apiserver at `server`, trusting the CA certificate at
/// `ca` and authenticating with `user`'s certificate and key. The user's name in the file is
/// always `kubeloop-admin`; what it may do comes from its certificate.
pub(super) fn write_kubeconfig(
    path: &Path,
    server: &str,
    ca: &Path,
    user: &CertFiles,
) -> Result<(), TestEnvError> {
    let text = format!(
        "apiVersion: v1
kind: Config
clusters:
- name: kubeloop-testenv
  cluster:
    server: {server}
    certificate-authority: {ca}
users:
- name: kubeloop-admin
  user:
    client-certificate: {cert}
    client-key: {key}
contexts:
- name: kubeloop-testenv
  context:
    cluster: kubeloop-testenv
    user: kubeloop-admin
    namespace: default
current-context: kubeloop-testenv
",
        ca = ca.display(),
        cert = user.cert.display(),
        key = user.key.display(),
    );
    write_file(path, &text)
}
