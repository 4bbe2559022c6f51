//! What the VM controller's real-cluster tests share (`tests/vm_controller.rs` with the Docker
//! and fake drivers, `tests/vm_qemu.rs` with the QEMU driver): the CRD, kubectl, applying a VM,
//! and waiting for a VM's status with the controller's log tail in the failure message.

#![allow(dead_code)] // each test binary uses its own subset

use std::time::{Duration, Instant};

use kube_client::api::Api;
use kubeloop::controller::vm::{Phase, VirtualMachine};
use kubeloop::testenv::Cluster;

pub const CRD: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/crds/virtualmachine.yaml");
pub const TEST_VM: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/test-vm.yaml");

/// A controller process under test whose log can be shown when a wait fails.
pub trait ControllerLog {
    /// Everything the controller has logged so far.
    fn log_text(&self) -> String;
}

/// Runs kubectl against the cluster; returns (success, stdout, stderr).
pub fn kubectl(cluster: &Cluster, args: &[&str]) -> (bool, String, String) {
    let out = cluster.kubectl(args);
    (out.success, out.stdout, out.stderr)
}

/// Applies the CRD once per test binary (tests run in parallel and two concurrent `kubectl
/// apply`s of a new object race to create it).
pub async fn install_crd(cluster: &Cluster) {
    static INSTALLED: std::sync::Mutex<bool> = std::sync::Mutex::new(false);
    let mut installed = INSTALLED.lock().unwrap_or_else(|p| p.into_inner());
    if *installed {
        return;
    }
    let (ok, out, err) = kubectl(cluster, &["apply", "-f", CRD]);
    assert!(ok, "applying the CRD: {out}{err}");
    let (ok, out, err) = kubectl(
        cluster,
        &[
            "wait",
            "--for",
            "condition=established",
            "--timeout=60s",
            "crd/virtualmachines.cloudnative.tw",
        ],
    );
    assert!(ok, "waiting for the CRD: {out}{err}");
    *installed = true;
}

/// `kubectl apply` of VM `ns/name` asking for `cpu` and `memory`.
pub fn apply_vm(cluster: &Cluster, ns: &str, name: &str, cpu: &str, memory: &str) {
    let manifest = format!(
        "apiVersion: cloudnative.tw/v1alpha1\nkind: VirtualMachine\nmetadata: {{name: {name}}}\nspec: {{resource: {{cpu: \"{cpu}\", memory: \"{memory}\"}}}}\n"
    );
    let path = cluster.dir().join(format!("{ns}-{name}.yaml"));
    std::fs::write(&path, manifest).unwrap();
    let (ok, out, err) = kubectl(cluster, &["apply", "-n", ns, "-f", path.to_str().unwrap()]);
    assert!(ok, "{out}{err}");
}

/// The VM as the apiserver has it now.
pub async fn vm(api: &Api<VirtualMachine>, name: &str) -> Option<VirtualMachine> {
    api.get_opt(name).await.expect("GET VirtualMachine")
}

/// The last `n` lines of `text`.
pub fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Polls every 200 ms until `check` holds for the VM, or fails naming `what` with the VM's last
/// status and the controller's log tail.
pub async fn wait_vm(
    api: &Api<VirtualMachine>,
    name: &str,
    what: &str,
    timeout: Duration,
    controller: &impl ControllerLog,
    check: impl Fn(&VirtualMachine) -> bool,
) -> VirtualMachine {
    let deadline = Instant::now() + timeout;
    loop {
        let current = vm(api, name).await;
        if let Some(v) = current.as_ref().filter(|v| check(v)) {
            return v.clone();
        }
        if Instant::now() > deadline {
            panic!(
                "{name}: {what} not seen within {timeout:?}; last status: {:?}\ncontroller log tail:\n{}",
                current.and_then(|v| v.status),
                tail(&controller.log_text(), 30)
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// [`wait_vm`] for a phase.
pub async fn wait_phase(
    api: &Api<VirtualMachine>,
    name: &str,
    phase: Phase,
    timeout: Duration,
    controller: &impl ControllerLog,
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
