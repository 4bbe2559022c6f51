//! `kubeloop vm-controller` end to end: the real local control plane (testenv, etcd +
//! kube-apiserver), the real binary (`CARGO_BIN_EXE_kubeloop`), kubectl, and podman serving
//! the Docker API (hack/setup-podman; `$DOCKER_HOST` or unix:///run/kubeloop/podman.sock).
//!
//! Each test works in its own namespace and runs its controllers with `--namespace` and a
//! Lease in that namespace, so tests running in parallel do not see each other's VMs. Every
//! container a test's VMs get is labelled with the namespace and removed when the test ends,
//! pass or fail ([`ContainerCleanup`]).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bollard::Docker;
use bollard::exec::{CreateExecOptions, StartExecOptions};
use bollard::query_parameters::InspectContainerOptions;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use kube_client::api::{Api, WatchEvent, WatchParams};
use kubeloop::controller::vm::driver::docker::DEFAULT_DOCKER_HOST;
use kubeloop::controller::vm::{Phase, VirtualMachine};
use kubeloop::testenv::{self, Cluster};

const CRD: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/crds/virtualmachine.yaml");
const TEST_VM: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/test-vm.yaml");

fn docker_host() -> String {
    std::env::var("DOCKER_HOST").ok().filter(|h| !h.is_empty()).unwrap_or_else(|| DEFAULT_DOCKER_HOST.to_string())
}

fn docker_at(host: &str) -> Docker {
    Docker::connect_with_host(host).unwrap_or_else(|e| panic!("connecting to {host}: {e} (run hack/setup-podman)"))
}

fn container_name(ns: &str, name: &str) -> String {
    format!("kubeloop-vm_{ns}_{name}")
}

/// Runs kubectl against the cluster; returns (success, stdout, stderr).
fn kubectl(cluster: &Cluster, args: &[&str]) -> (bool, String, String) {
    let out = Command::new(cluster.bin_dir().join("kubectl"))
        .arg("--kubeconfig")
        .arg(cluster.kubeconfig_path())
        .args(args)
        .output()
        .expect("running kubectl");
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

async fn install_crd(cluster: &Cluster) {
    let (ok, out, err) = kubectl(cluster, &["apply", "-f", CRD]);
    assert!(ok, "applying the CRD: {out}{err}");
    let (ok, out, err) =
        kubectl(cluster, &["wait", "--for", "condition=established", "--timeout=60s", "crd/virtualmachines.cloudnative.tw"]);
    assert!(ok, "waiting for the CRD: {out}{err}");
}

async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out after {timeout:?} waiting for {what}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A `kubeloop vm-controller` process; SIGKILLed on drop if still running.
struct Controller {
    child: Child,
    log: PathBuf,
}

impl Controller {
    fn spawn(cluster: &Cluster, ns: &str, docker_host: &str, identity: &str, extra: &[&str]) -> Self {
        let log = cluster.dir().join(format!("vm-controller-{ns}-{identity}-{}.log", std::process::id()));
        let file = std::fs::OpenOptions::new().create(true).append(true).open(&log).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_kubeloop"))
            .arg("vm-controller")
            .arg("--kubeconfig")
            .arg(cluster.kubeconfig_path())
            .args(["--namespace", ns, "--lease-lock-namespace", ns, "--holder-identity", identity, "--vm-driver", "docker"])
            .args(extra)
            .env("DOCKER_HOST", docker_host)
            .env("RUST_LOG", "info,kubeloop=debug")
            .stdin(Stdio::null())
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .spawn()
            .expect("starting kubeloop vm-controller");
        Self { child, log }
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn signal(&self, sig: libc::c_int) {
        // SAFETY: kill(2) on the pid of our own child.
        unsafe { libc::kill(self.child.id() as libc::pid_t, sig) };
    }

    /// SIGTERM and wait; returns the exit code.
    fn terminate(&mut self) -> Option<i32> {
        self.signal(libc::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status.code();
            }
            assert!(Instant::now() < deadline, "controller did not stop on SIGTERM; log:\n{}", self.log_text());
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Controller {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Removes every container labelled with the namespace when dropped (through the podman CLI,
/// which shares the service's storage, so it works from `Drop` and during a panic).
struct ContainerCleanup {
    namespace: String,
}

impl Drop for ContainerCleanup {
    fn drop(&mut self) {
        let filter = format!("label=kubeloop.dev/vm-namespace={}", self.namespace);
        let Ok(out) = Command::new("podman").args(["ps", "-aq", "--filter", &filter]).output() else { return };
        let ids: Vec<String> = String::from_utf8_lossy(&out.stdout).split_whitespace().map(str::to_string).collect();
        if !ids.is_empty() {
            let _ = Command::new("podman").args(["rm", "-f", "-t", "0"]).args(&ids).output();
        }
    }
}

fn labelled_containers(namespace: &str) -> Vec<String> {
    let filter = format!("label=kubeloop.dev/vm-namespace={namespace}");
    let out = Command::new("podman").args(["ps", "-a", "--format", "{{.Names}}", "--filter", &filter]).output().expect("podman ps");
    String::from_utf8_lossy(&out.stdout).split_whitespace().map(str::to_string).collect()
}

async fn vm(api: &Api<VirtualMachine>, name: &str) -> Option<VirtualMachine> {
    api.get_opt(name).await.expect("GET VirtualMachine")
}

async fn wait_phase(api: &Api<VirtualMachine>, name: &str, phase: Phase, timeout: Duration, controller: &Controller) -> VirtualMachine {
    let deadline = Instant::now() + timeout;
    loop {
        let current = vm(api, name).await;
        if let Some(v) = current.as_ref().filter(|v| v.phase() == phase) {
            return v.clone();
        }
        if Instant::now() > deadline {
            panic!(
                "{name} did not reach {phase:?} in {timeout:?}; last: {:?}\ncontroller log tail:\n{}",
                current.and_then(|v| v.status),
                tail(&controller.log_text(), 30)
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

async fn engine_ready(host: &str) {
    let docker = docker_at(host);
    docker.ping().await.unwrap_or_else(|e| panic!("the engine at {host} does not answer: {e} (run hack/setup-podman)"));
}

#[tokio::test]
async fn invalid_specs_are_refused_by_the_crd_schema_and_nothing_is_created() {
    let cluster = testenv::shared().await;
    install_crd(cluster).await;
    let ns = cluster.new_namespace("vm-invalid").await.unwrap();
    let _cleanup = ContainerCleanup { namespace: ns.clone() };
    engine_ready(&docker_host()).await;
    let mut controller = Controller::spawn(cluster, &ns, &docker_host(), "only", &["--leader-elect=false"]);

    let cases = [
        ("cpu-abc", "resource: {cpu: abc, memory: 4G}", "spec.resource.cpu"),
        ("cpu-zero", "resource: {cpu: \"0\", memory: 4G}", "cpu must be greater than zero"),
        ("cpu-zero-int", "resource: {cpu: 0, memory: 4G}", "spec.resource.cpu"),
        ("memory-negative", "resource: {cpu: 2, memory: \"-4G\"}", "spec.resource.memory"),
        ("memory-negative-int", "resource: {cpu: 2, memory: -4}", "spec.resource.memory"),
        ("no-resource", "", "spec.resource: Required value"),
        ("no-memory", "resource: {cpu: 2}", "spec.resource.memory: Required value"),
    ];
    for (name, spec, expected) in cases {
        let manifest = format!("apiVersion: cloudnative.tw/v1alpha1\nkind: VirtualMachine\nmetadata: {{name: {name}}}\nspec: {{{spec}}}\n");
        let path = cluster.dir().join(format!("{ns}-{name}.yaml"));
        std::fs::write(&path, manifest).unwrap();
        let (ok, out, err) = kubectl(cluster, &["apply", "-n", &ns, "-f", path.to_str().unwrap()]);
        assert!(!ok, "{name} must be refused, kubectl said: {out}");
        assert!(err.contains("is invalid") && err.contains(expected), "{name}: the message should name the problem ({expected}): {err}");
    }
    // The valid example passes the same schema.
    let (ok, out, err) = kubectl(cluster, &["apply", "-n", &ns, "--dry-run=server", "-f", TEST_VM]);
    assert!(ok, "test-vm must be accepted: {out}{err}");

    let (ok, out, err) = kubectl(cluster, &["get", "vms", "-n", &ns, "-o", "name"]);
    assert!(ok, "{err}");
    assert_eq!(out.trim(), "", "no VirtualMachine was stored");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(labelled_containers(&ns), Vec::<String>::new(), "no container was created");
    assert_eq!(controller.terminate(), Some(0));
}
