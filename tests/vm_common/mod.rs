//! What the VM controller's real-cluster tests share (`tests/vm_controller.rs` with the Docker
//! and fake drivers, `tests/vm_qemu.rs` with the QEMU driver): the controller process, the CRD,
//! kubectl, applying and deleting a VM, and waiting for a VM's status (or its end) with the
//! controller's log tail in the failure message.

#![allow(dead_code)] // each test binary uses its own subset

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use kube_client::api::Api;
use kubeloop::controller::vm::{Phase, VirtualMachine};
use kubeloop_testenv::{Cluster, ManagedProcess};

pub const CRD: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/crds/virtualmachine.yaml");
pub const TEST_VM: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/test-vm.yaml");

/// A `kubeloop vm-controller` process under test: a [`ManagedProcess`] (its methods through
/// `Deref`) logging into a file of the cluster's directory, SIGKILLed on drop if still
/// running. Each test file adds the `spawn` that gives its flags.
pub struct Controller(ManagedProcess);

impl Controller {
    /// Starts `kubeloop vm-controller --kubeconfig <kubeconfig>` with the flags and environment
    /// `configure` adds, at `RUST_LOG=info,kubeloop=debug`, its output appended to
    /// `<cluster dir>/<log_name>-<this test process's pid>.log`.
    pub fn start(
        cluster: &Cluster,
        kubeconfig: &Path,
        log_name: &str,
        configure: impl FnOnce(&mut Command),
    ) -> Self {
        let log = cluster
            .dir()
            .join(format!("{log_name}-{}.log", std::process::id()));
        let mut command = Command::new(kubeloop_testenv::kubeloop_binary());
        command
            .arg("vm-controller")
            .arg("--kubeconfig")
            .arg(kubeconfig);
        configure(&mut command);
        command.env("RUST_LOG", "info,kubeloop=debug");
        Self(
            ManagedProcess::start(log_name, command, &log)
                .expect("starting kubeloop vm-controller"),
        )
    }

    /// SIGTERM and wait (at most 30 s); returns the exit code.
    pub fn terminate(&mut self) -> Option<i32> {
        self.0.signal(libc::SIGTERM);
        self.0.wait_blocking(Duration::from_secs(30)).code()
    }
}

impl std::ops::Deref for Controller {
    type Target = ManagedProcess;
    fn deref(&self) -> &ManagedProcess {
        &self.0
    }
}

impl std::ops::DerefMut for Controller {
    fn deref_mut(&mut self) -> &mut ManagedProcess {
        &mut self.0
    }
}

/// Runs kubectl against the cluster; returns (success, stdout, stderr).
pub fn kubectl(cluster: &Cluster, args: &[&str]) -> (bool, String, String) {
    let out = cluster.kubectl(args);
    (out.success, out.stdout, out.stderr)
}

/// Creates crds/virtualmachine.yaml unless it exists and waits until it is served
/// ([`kubeloop_testenv::ensure_crd`]).
pub async fn install_crd(cluster: &Cluster) {
    let yaml = std::fs::read_to_string(CRD).expect("reading crds/virtualmachine.yaml");
    let crd = serde_saphyr::from_str(&yaml).expect("crds/virtualmachine.yaml parses");
    let client = cluster.client().await.expect("a client of the cluster");
    kubeloop_testenv::ensure_crd(&client, &crd).await;
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

/// `kubectl delete` of VM `ns/name`, without waiting for it to go.
pub fn delete_vm(cluster: &Cluster, ns: &str, name: &str) {
    let (ok, out, err) = kubectl(cluster, &["delete", "vm", name, "-n", ns, "--wait=false"]);
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
    controller: &Controller,
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
                controller.log_tail(30)
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
    controller: &Controller,
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

/// Polls every 200 ms until VM `name` is gone (finalized), or fails after `timeout` with the
/// controller's log tail.
pub async fn wait_gone(
    api: &Api<VirtualMachine>,
    name: &str,
    timeout: Duration,
    controller: &Controller,
) {
    let deadline = Instant::now() + timeout;
    while vm(api, name).await.is_some() {
        assert!(
            Instant::now() < deadline,
            "{name} was not finalized within {timeout:?}; controller log tail:\n{}",
            controller.log_tail(30)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Removes every container labelled with the namespace it holds when dropped (the end of a
/// test, pass or fail).
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
