//! What the VM controller's real-cluster tests share (kubeloop's `tests/vm_controller` with the
//! Docker and fake drivers, `tests/vm_qemu.rs` with the QEMU driver, the VM half of
//! `tests/read_your_writes.rs`): the controller process, the CRD, applying and deleting a VM,
//! waiting for a VM's status (or its end) with the controller's log tail in the failure
//! message, and removing a test's containers.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use kube_client::api::Api;
use kubeloop::controller::vm::{Phase, VirtualMachine};

use crate::{Cluster, Kubeloop, ManagedProcess};

/// The VirtualMachine CRD as committed (crds/virtualmachine.yaml of the repository).
pub const CRD: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../crds/virtualmachine.yaml");
/// The example VM of docs/running.md and hack/demo (examples/test-vm.yaml of the repository).
pub const TEST_VM: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/test-vm.yaml");

/// `kubeloop vm-controller --kubeconfig <kubeconfig>` at `RUST_LOG=info,kubeloop=debug`, its
/// log in the cluster's directory as `<log_name>-<this test process's pid>.log`; the caller
/// adds its flags and starts it.
pub fn controller(cluster: &Cluster, kubeconfig: &Path, log_name: &str) -> Kubeloop {
    Kubeloop::new(["vm-controller"])
        .kubeconfig(kubeconfig)
        .env("RUST_LOG", "info,kubeloop=debug")
        .name(log_name)
        .log_in(cluster)
}

/// Creates crds/virtualmachine.yaml unless it exists and waits until it is served
/// ([`crate::ensure_crd`]).
pub async fn install_crd(cluster: &Cluster) {
    let yaml = std::fs::read_to_string(CRD).expect("reading crds/virtualmachine.yaml");
    let crd = serde_saphyr::from_str(&yaml).expect("crds/virtualmachine.yaml parses");
    let client = cluster.client().await.expect("a client of the cluster");
    crate::ensure_crd(&client, &crd).await;
}

/// `kubectl apply` of VM `ns/name` asking for `cpu` and `memory`.
pub fn apply_vm(cluster: &Cluster, ns: &str, name: &str, cpu: &str, memory: &str) {
    let manifest = format!(
        "apiVersion: cloudnative.tw/v1alpha1\nkind: VirtualMachine\nmetadata: {{name: {name}}}\nspec: {{resource: {{cpu: \"{cpu}\", memory: \"{memory}\"}}}}\n"
    );
    cluster
        .kubectl_stdin(&["apply", "-n", ns, "-f", "-"], Some(&manifest))
        .ok();
}

/// `kubectl delete` of VM `ns/name`, without waiting for it to go.
pub fn delete_vm(cluster: &Cluster, ns: &str, name: &str) {
    cluster
        .kubectl(&["delete", "vm", name, "-n", ns, "--wait=false"])
        .ok();
}

/// The VM as the apiserver has it now.
pub async fn vm(api: &Api<VirtualMachine>, name: &str) -> Option<VirtualMachine> {
    api.get_opt(name).await.expect("GET VirtualMachine")
}

/// Waits until `check` holds for the VM, or fails naming `what` with the VM's last status and
/// the controller's log tail.
pub async fn wait_vm(
    api: &Api<VirtualMachine>,
    name: &str,
    what: &str,
    timeout: Duration,
    controller: &ManagedProcess,
    check: impl Fn(&VirtualMachine) -> bool,
) -> VirtualMachine {
    controller
        .eventually(&format!("{name}: {what}"), timeout, || async {
            match vm(api, name).await {
                Some(v) if check(&v) => Ok(v),
                current => Err(format!("last status: {:?}", current.and_then(|v| v.status))),
            }
        })
        .await
}

/// [`wait_vm`] for a phase.
pub async fn wait_phase(
    api: &Api<VirtualMachine>,
    name: &str,
    phase: Phase,
    timeout: Duration,
    controller: &ManagedProcess,
) -> VirtualMachine {
    wait_vm(
        api,
        name,
        &format!("phase {phase:?}"),
        timeout,
        controller,
        |v| v.phase() == phase,
    )
    .await
}

/// Waits until VM `name` is gone (finalized), or fails after `timeout` with the controller's
/// log tail.
pub async fn wait_gone(
    api: &Api<VirtualMachine>,
    name: &str,
    timeout: Duration,
    controller: &ManagedProcess,
) {
    controller
        .eventually(&format!("{name} to be finalized"), timeout, || async {
            vm(api, name).await.is_none()
        })
        .await
}

/// Removes every container labelled with the namespace it holds when dropped (the end of a
/// test, pass or fail), through the podman CLI, which shares the engine's storage, so it
/// works from `Drop` and during a panic.
pub struct ContainerCleanup(pub String);

impl Drop for ContainerCleanup {
    fn drop(&mut self) {
        let filter = format!("label=kubeloop.dev/vm-namespace={}", self.0);
        let Ok(out) = Command::new("podman")
            .args(["ps", "-aq", "--filter", &filter])
            .output()
        else {
            return;
        };
        let ids: Vec<String> = String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .map(str::to_string)
            .collect();
        if !ids.is_empty() {
            let _ = Command::new("podman")
                .args(["rm", "-f", "-t", "0"])
                .args(&ids)
                .output();
        }
    }
}
