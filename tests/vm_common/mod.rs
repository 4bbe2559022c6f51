//! What the VM controller's real-cluster tests share (`tests/vm_controller.rs` with the Docker
//! and fake drivers, `tests/vm_qemu.rs` with the QEMU driver): the controller process, the CRD,
//! kubectl, applying and deleting a VM, and waiting for a VM's status (or its end) with the
//! controller's log tail in the failure message.

#![allow(dead_code)] // each test binary uses its own subset

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use kube_client::api::Api;
use kubeloop::controller::vm::{Phase, VirtualMachine};
use kubeloop::testenv::Cluster;

pub const CRD: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/crds/virtualmachine.yaml");
pub const TEST_VM: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/test-vm.yaml");

/// A `kubeloop vm-controller` process under test, logging into a file of its own; SIGKILLed on
/// drop if still running. Each test file adds the `spawn` that gives its flags.
pub struct Controller {
    child: Child,
    log: PathBuf,
}

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
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .unwrap();
        let mut command = Command::new(env!("CARGO_BIN_EXE_kubeloop"));
        command
            .arg("vm-controller")
            .arg("--kubeconfig")
            .arg(kubeconfig);
        configure(&mut command);
        let child = command
            .env("RUST_LOG", "info,kubeloop=debug")
            .stdin(Stdio::null())
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .spawn()
            .expect("starting kubeloop vm-controller");
        Self { child, log }
    }

    /// Everything the controller has logged so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Sends `sig` (SIGSTOP and SIGCONT to freeze and resume it, say).
    pub fn signal(&self, sig: libc::c_int) {
        // SAFETY: kill(2) on the pid of our own child.
        unsafe { libc::kill(self.child.id() as libc::pid_t, sig) };
    }

    /// SIGTERM and wait; returns the exit code.
    pub fn terminate(&mut self) -> Option<i32> {
        self.signal(libc::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status.code();
            }
            assert!(
                Instant::now() < deadline,
                "controller did not stop on SIGTERM; log:\n{}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The exit status if the process has exited, without waiting.
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().unwrap()
    }

    /// SIGKILL and reap.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Controller {
    fn drop(&mut self) {
        self.kill();
    }
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
            tail(&controller.log_text(), 30)
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
