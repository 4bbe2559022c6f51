//! `kubeloop vm-controller` end to end: the real local control plane (testenv, etcd +
//! kube-apiserver), the real binary (`CARGO_BIN_EXE_kubeloop`), kubectl, and podman serving
//! the Docker API (hack/setup-podman; `$DOCKER_HOST` or unix:///run/kubeloop/podman.sock).
//!
//! Each test works in its own namespace and runs its controllers with `--namespace` and a
//! Lease in that namespace, so tests running in parallel do not see each other's VMs. Every
//! container a test's VMs get is labelled with the namespace and removed when the test ends,
//! pass or fail ([`ContainerCleanup`]).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use bollard::Docker;
use bollard::exec::{CreateExecOptions, StartExecOptions};
use bollard::query_parameters::InspectContainerOptions;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use kube_client::api::{Api, WatchEvent, WatchParams};
use kubeloop::controller::vm::{DEFAULT_DOCKER_HOST, Phase, VirtualMachine};
use kubeloop::testing::{eventually, eventually_blocking, eventually_explained};
use kubeloop_testenv::{self as testenv, Cluster, ManagedProcess};

use kubeloop_testenv::Kubectl;
use kubeloop_testenv::vm::{
    self, ContainerCleanup, TEST_VM, apply_vm, delete_vm, install_crd, vm, wait_gone, wait_phase,
    wait_vm,
};

const RBAC: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/examples/vm-controller-rbac.yaml"
);

/// How long a test waits for a VM it just applied to reach its first settled phase (Active,
/// or Failed when the start fails).
const START: Duration = Duration::from_secs(90);

fn docker_host() -> String {
    std::env::var("DOCKER_HOST")
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| DEFAULT_DOCKER_HOST.to_string())
}

fn docker_at(host: &str) -> Docker {
    Docker::connect_with_host(host)
        .unwrap_or_else(|e| panic!("connecting to {host}: {e} (run hack/setup-podman)"))
}

fn container_name(ns: &str, name: &str) -> String {
    format!("kubeloop-vm_{ns}_{name}")
}

/// A `kubeloop vm-controller` process on the Docker driver (unless `extra` picks another) at
/// `docker_host`, with leader election in `ns` as `identity`.
fn spawn_controller(
    cluster: &Cluster,
    ns: &str,
    docker_host: &str,
    identity: &str,
    extra: &[&str],
) -> ManagedProcess {
    spawn_controller_as(
        cluster,
        cluster.kubeconfig_path(),
        ns,
        docker_host,
        identity,
        extra,
    )
}

/// As [`spawn_controller`], as the user of `kubeconfig`.
fn spawn_controller_as(
    cluster: &Cluster,
    kubeconfig: &Path,
    ns: &str,
    docker_host: &str,
    identity: &str,
    extra: &[&str],
) -> ManagedProcess {
    // The docker driver unless the test picks one.
    let driver: &[&str] = if extra.contains(&"--vm-driver") {
        &[]
    } else {
        &["--vm-driver", "docker"]
    };
    vm::controller(
        cluster,
        kubeconfig,
        &format!("vm-controller-{ns}-{identity}"),
    )
    .args([
        "--namespace",
        ns,
        "--lease-lock-namespace",
        ns,
        "--holder-identity",
        identity,
    ])
    .args(driver)
    .args(extra)
    .env("DOCKER_HOST", docker_host)
    .start()
}

/// Removes every container labelled with the namespace when dropped (through the podman CLI,
/// which shares the service's storage, so it works from `Drop` and during a panic).
fn labelled_containers(namespace: &str) -> Vec<String> {
    let filter = format!("label=kubeloop.dev/vm-namespace={namespace}");
    let out = Command::new("podman")
        .args(["ps", "-a", "--format", "{{.Names}}", "--filter", &filter])
        .output()
        .expect("podman ps");
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .map(str::to_string)
        .collect()
}

/// What the tests on podman start with: the shared cluster with the CRD, the engine checked
/// (and a client of it), a fresh namespace whose containers are removed when the test ends, and
/// the VM API in it. Bind `_cleanup` by name when destructuring: a field left to `..` is
/// dropped at once, and dropping it removes the containers.
struct PodmanTest {
    cluster: &'static Cluster,
    host: String,
    docker: Docker,
    ns: String,
    api: Api<VirtualMachine>,
    _cleanup: ContainerCleanup,
}

impl PodmanTest {
    async fn new(namespace_prefix: &str) -> Self {
        let cluster = testenv::shared().await;
        install_crd(cluster).await;
        let host = docker_host();
        engine_ready(&host).await;
        let docker = docker_at(&host);
        let ns = cluster.new_namespace(namespace_prefix).await.unwrap();
        let api = Api::namespaced(cluster.client().await.unwrap(), &ns);
        Self {
            cluster,
            host,
            docker,
            _cleanup: ContainerCleanup(ns.clone()),
            ns,
            api,
        }
    }
}

async fn engine_ready(host: &str) {
    let docker = docker_at(host);
    docker.ping().await.unwrap_or_else(|e| {
        panic!("the engine at {host} does not answer: {e} (run hack/setup-podman)")
    });
}

#[tokio::test]
async fn invalid_specs_are_refused_by_the_crd_schema_and_nothing_is_created() {
    let PodmanTest {
        cluster,
        host,
        ns,
        _cleanup,
        ..
    } = PodmanTest::new("vm-invalid").await;
    let mut controller = spawn_controller(cluster, &ns, &host, "only", &["--leader-elect=false"]);

    let cases = [
        (
            "cpu-abc",
            "resource: {cpu: abc, memory: 4G}",
            "spec.resource.cpu: Invalid value: \"abc\": cpu must be a quantity greater than zero",
        ),
        (
            "cpu-zero",
            "resource: {cpu: \"0\", memory: 4G}",
            "cpu must be a quantity greater than zero",
        ),
        (
            "cpu-zero-int",
            "resource: {cpu: 0, memory: 4G}",
            "spec.resource.cpu: Invalid value: 0: spec.resource.cpu in body should be greater than or equal to 1",
        ),
        (
            "memory-negative",
            "resource: {cpu: 2, memory: \"-4G\"}",
            "spec.resource.memory: Invalid value: \"-4G\": memory must be a quantity greater than zero",
        ),
        (
            "memory-negative-int",
            "resource: {cpu: 2, memory: -4}",
            "spec.resource.memory: Invalid value: -4: spec.resource.memory in body should be greater than or equal to 1",
        ),
        ("no-resource", "", "spec.resource: Required value"),
        (
            "no-memory",
            "resource: {cpu: 2}",
            "spec.resource.memory: Required value",
        ),
        // More than the controller takes (quantity.rs's MAX_CPU_MILLIS, what the Docker API's
        // int64 NanoCpus holds, and MAX_MEMORY_BYTES): refused by the apiserver, not retried
        // as an engine error.
        (
            "cpu-too-large",
            "resource: {cpu: \"9223372037\", memory: 4G}",
            "cpu must be at most 9223372036854m, the most the Docker API's NanoCpus field holds",
        ),
        (
            "cpu-too-large-int",
            "resource: {cpu: 9223372037, memory: 4G}",
            "spec.resource.cpu in body should be less than or equal to 9223372036",
        ),
        (
            "memory-too-large",
            "resource: {cpu: 2, memory: 2Ei}",
            "memory must be at most 1Ei (1152921504606846976 bytes)",
        ),
        (
            "memory-too-large-int",
            "resource: {cpu: 2, memory: 1152921504606846977}",
            "memory must be at most 1Ei (1152921504606846976 bytes)",
        ),
    ];

    for (name, spec, expected) in cases {
        let manifest = format!(
            "apiVersion: cloudnative.tw/v1alpha1\nkind: VirtualMachine\nmetadata: {{name: {name}}}\nspec: {{{spec}}}\n"
        );
        let path = cluster.dir().join(format!("{ns}-{name}.yaml"));
        std::fs::write(&path, manifest).unwrap();
        let Kubectl {
            success: ok,
            stdout: out,
            stderr: err,
            ..
        } = cluster.kubectl(&["apply", "-n", &ns, "-f", path.to_str().unwrap()]);
        assert!(!ok, "{name} must be refused, kubectl said: {out}");
        println!("{name}: {}", err.trim().replace('\n', " | "));
        assert!(
            err.contains("is invalid") && err.contains(expected),
            "{name}: the message should name the problem ({expected}): {err}"
        );
    }
    // The valid example passes the same schema.
    let Kubectl {
        success: ok,
        stdout: out,
        stderr: err,
        ..
    } = cluster.kubectl(&["apply", "-n", &ns, "--dry-run=server", "-f", TEST_VM]);
    assert!(ok, "test-vm must be accepted: {out}{err}");

    let Kubectl {
        success: ok,
        stdout: out,
        stderr: err,
        ..
    } = cluster.kubectl(&["get", "vms", "-n", &ns, "-o", "name"]);
    assert!(ok, "{err}");
    assert_eq!(out.trim(), "", "no VirtualMachine was stored");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        labelled_containers(&ns),
        Vec::<String>::new(),
        "no container was created"
    );
    assert_eq!(controller.terminate(Duration::from_secs(30)), Some(0));
}

/// The usage column of `kubectl get vms` for `name`: (STATUS, CPU, MEMORY).
fn kubectl_columns(cluster: &Cluster, ns: &str, name: &str) -> (String, Vec<String>) {
    let Kubectl {
        success: ok,
        stdout: out,
        stderr: err,
        ..
    } = cluster.kubectl(&["get", "vms", "-n", ns]);
    assert!(ok, "kubectl get vms: {err}");
    let header = out.lines().next().unwrap_or_default().to_string();
    let row = out
        .lines()
        .find(|l| l.split_whitespace().next() == Some(name))
        .unwrap_or_else(|| panic!("{name} missing from kubectl get vms:\n{out}"));
    (header, row.split_whitespace().map(str::to_string).collect())
}

async fn start_busy_loop(docker: &Docker, container: &str) {
    let exec = docker
        .create_exec(
            container,
            CreateExecOptions {
                cmd: Some(vec!["sh", "-c", "while :; do :; done"]),
                ..Default::default()
            },
        )
        .await
        .expect("creating the exec");
    docker
        .start_exec(
            &exec.id,
            Some(StartExecOptions {
                detach: true,
                ..Default::default()
            }),
        )
        .await
        .expect("starting the exec");
}

#[tokio::test]
async fn test_vm_becomes_active_shows_usage_follows_load_and_is_cleaned_up_on_delete() {
    let PodmanTest {
        cluster,
        host,
        docker,
        ns,
        api,
        _cleanup,
    } = PodmanTest::new("vm-life").await;
    let refresh = Duration::from_secs(3);
    let mut controller =
        spawn_controller(cluster, &ns, &host, "one", &["--refresh-interval", "3s"]);

    let Kubectl {
        success: ok,
        stdout: out,
        stderr: err,
        ..
    } = cluster.kubectl(&["apply", "-n", &ns, "-f", TEST_VM]);
    assert!(ok, "{out}{err}");
    let applied_at = Instant::now();
    let active = wait_phase(&api, "test-vm", Phase::Active, START, &controller).await;
    println!(
        "test-vm Active {:?} after kubectl apply",
        applied_at.elapsed()
    );
    assert!(active.has_finalizer());
    let server = active.status.as_ref().unwrap().server.clone().unwrap();
    assert_eq!(server.state, "running");

    // The container: exact name, limits in engine units, labels naming the VM.
    let name = container_name(&ns, "test-vm");
    let inspected = docker
        .inspect_container(&name, None::<InspectContainerOptions>)
        .await
        .expect("the container exists");
    assert_eq!(inspected.id.as_deref(), Some(server.id.as_str()));
    let host_config = inspected.host_config.unwrap();
    assert_eq!(host_config.memory, Some(4_000_000_000));
    assert_eq!(host_config.nano_cpus, Some(2_000_000_000));
    let labels = inspected.config.unwrap().labels.unwrap();
    assert_eq!(labels.get("kubeloop.dev/vm-namespace"), Some(&ns));
    assert_eq!(
        labels.get("kubeloop.dev/vm-name").map(String::as_str),
        Some("test-vm")
    );
    assert_eq!(
        labels.get("kubeloop.dev/vm-uid"),
        active.metadata.uid.as_ref()
    );

    // The controller said so in an Event.
    eventually(
        "an Event about the VM going Active",
        Duration::from_secs(20),
        || {
            let Kubectl {
                success: ok,
                stdout: out,
                ..
            } = cluster.kubectl(&[
                "get",
                "events",
                "-n",
                &ns,
                "--field-selector",
                "involvedObject.name=test-vm",
            ]);
            async move { (ok && out.contains("Creating -> Active")).then_some(()) }
        },
    )
    .await;

    // kubectl shows the printer columns filled.
    let (header, row) = kubectl_columns(cluster, &ns, "test-vm");
    assert_eq!(
        header.split_whitespace().collect::<Vec<_>>(),
        vec!["NAME", "STATUS", "CPU", "MEMORY", "AGE"]
    );
    assert_eq!(row[1], "Active", "{row:?}");
    let idle_cpu: f64 = row[2]
        .parse()
        .unwrap_or_else(|_| panic!("CPU column is a number: {row:?}"));
    let memory: f64 = row[3]
        .parse()
        .unwrap_or_else(|_| panic!("MEMORY column is a number: {row:?}"));
    assert!(memory > 0.0, "a running httpd uses some memory: {row:?}");
    assert!(idle_cpu < 50.0, "idle httpd: {row:?}");

    // Load it: the CPU column follows within a refresh period (plus the stats sample and the
    // kubectl poll). One busy loop is 100% of a core on an idle host; on these shared 2-core
    // machines it gets far less when other builds run, so the bar is "clearly above idle".
    start_busy_loop(&docker, &name).await;
    let loaded_at = Instant::now();
    let threshold = (idle_cpu + 5.0).max(10.0);
    let busy_cpu = eventually(
        &format!("the CPU column to rise above {threshold}"),
        refresh * 3,
        || async {
            let (_, row) = kubectl_columns(cluster, &ns, "test-vm");
            row[2].parse::<f64>().ok().filter(|cpu| *cpu > threshold)
        },
    )
    .await;
    let rose_after = loaded_at.elapsed();
    println!(
        "CPU column: idle {idle_cpu} -> loaded {busy_cpu} after {rose_after:?} (refresh interval {refresh:?})"
    );

    // Delete: Terminating, then the container goes, then the object.
    let list = api.list(&Default::default()).await.unwrap();
    let rv = list.metadata.resource_version.unwrap();
    let mut events = api
        .watch(&WatchParams::default(), &rv)
        .await
        .unwrap()
        .boxed();
    delete_vm(cluster, &ns, "test-vm");
    let mut phases = Vec::new();
    let deleted = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(event) = events.try_next().await.expect("watch") {
            match event {
                WatchEvent::Modified(vm) => phases.push(vm.phase()),
                WatchEvent::Deleted(vm) => return vm,
                _ => {}
            }
        }
        panic!("watch ended")
    })
    .await
    .unwrap_or_else(|_| {
        panic!(
            "test-vm was not deleted; phases seen {phases:?}; log:\n{}",
            controller.log_tail(30)
        )
    });
    assert!(
        phases.contains(&Phase::Terminating),
        "phases seen while deleting: {phases:?}"
    );
    assert_eq!(deleted.phase(), Phase::Terminating);
    let gone = docker
        .inspect_container(&name, None::<InspectContainerOptions>)
        .await;
    assert!(
        matches!(
            gone,
            Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 404,
                ..
            })
        ),
        "the container is gone before the object: {gone:?}"
    );
    assert!(vm(&api, "test-vm").await.is_none());
    assert_eq!(controller.terminate(Duration::from_secs(30)), Some(0));
}

async fn container_exists(docker: &Docker, name: &str) -> bool {
    match docker
        .inspect_container(name, None::<InspectContainerOptions>)
        .await
    {
        Ok(_) => true,
        Err(bollard::errors::Error::DockerResponseServerError {
            status_code: 404, ..
        }) => false,
        Err(e) => panic!("inspecting {name}: {e}"),
    }
}

#[tokio::test]
async fn a_vm_deleted_while_the_controller_is_down_is_cleaned_up_when_it_comes_back() {
    let PodmanTest {
        cluster,
        host,
        docker,
        ns,
        api,
        _cleanup,
    } = PodmanTest::new("vm-zombie").await;
    let name = container_name(&ns, "zombie");

    let mut first = spawn_controller(cluster, &ns, &host, "first", &[]);
    apply_vm(cluster, &ns, "zombie", "1", "64Mi");
    wait_phase(&api, "zombie", Phase::Active, START, &first).await;
    assert_eq!(
        first.terminate(Duration::from_secs(30)),
        Some(0),
        "SIGTERM stops the controller cleanly"
    );

    // controller101 removed nothing here: the container outlived its VM for good.
    delete_vm(cluster, &ns, "zombie");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let held = vm(&api, "zombie")
        .await
        .expect("the finalizer keeps the object while no controller runs");
    assert!(held.metadata.deletion_timestamp.is_some());
    assert!(
        container_exists(&docker, &name).await,
        "nothing deleted the container yet"
    );

    let second = spawn_controller(cluster, &ns, &host, "second", &[]);
    wait_gone(&api, "zombie", Duration::from_secs(60), &second).await;
    assert!(
        !container_exists(&docker, &name).await,
        "the restarted controller deleted the container"
    );
    assert!(
        second
            .log()
            .contains("server deleted; removing the finalizer"),
        "{}",
        second.log_tail(20)
    );
}

/// A podman service of this test's own on a temp socket, so it can be stopped and restarted
/// without touching the shared one.
struct PrivateEngine {
    socket: PathBuf,
    log: PathBuf,
    service: Option<ManagedProcess>,
}

impl PrivateEngine {
    fn new(dir: &Path) -> Self {
        let socket =
            std::env::temp_dir().join(format!("kubeloop-vm-engine-{}.sock", std::process::id()));
        Self {
            socket,
            log: dir.join(format!("podman-private-{}.log", std::process::id())),
            service: None,
        }
    }

    fn host(&self) -> String {
        format!("unix://{}", self.socket.display())
    }

    async fn start(&mut self) {
        let _ = std::fs::remove_file(&self.socket);
        let mut command = Command::new("podman");
        command
            .args(["system", "service", "--time=0"])
            .arg(self.host());
        let service = ManagedProcess::start("podman system service", command, &self.log)
            .expect("starting podman system service");
        self.service = Some(service);
        let host = self.host();
        eventually(
            "the private podman service to answer",
            Duration::from_secs(30),
            || {
                let host = host.clone();
                async move {
                    let docker = Docker::connect_with_host(&host).ok()?;
                    docker.ping().await.ok().map(|_| ())
                }
            },
        )
        .await;
    }

    /// SIGKILL, as an engine that crashes.
    fn stop(&mut self) {
        self.service = None;
    }
}

impl Drop for PrivateEngine {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_file(&self.socket);
    }
}

#[tokio::test]
async fn an_engine_outage_fails_the_vm_naming_the_engine_and_it_is_active_again_once_back() {
    let cluster = testenv::shared().await;
    install_crd(cluster).await;
    let ns = cluster.new_namespace("vm-outage").await.unwrap();
    let _cleanup = ContainerCleanup(ns.clone());
    let mut engine = PrivateEngine::new(cluster.dir());
    engine.start().await;
    let host = engine.host();
    let api: Api<VirtualMachine> = Api::namespaced(cluster.client().await.unwrap(), &ns);
    // Retries of a failing VM wait at most 3 s (the default is 2 min).
    let controller = spawn_controller(
        cluster,
        &ns,
        &host,
        "one",
        &["--refresh-interval", "2s", "--max-retry-delay", "3s"],
    );

    apply_vm(cluster, &ns, "outage", "1", "64Mi");
    let before = wait_phase(&api, "outage", Phase::Active, START, &controller).await;
    let id_before = before.status.unwrap().server.unwrap().id;

    engine.stop();
    let failed = wait_phase(
        &api,
        "outage",
        Phase::Failed,
        Duration::from_secs(30),
        &controller,
    )
    .await;
    let reason = failed.status.unwrap().reason;
    assert!(
        reason.contains(&format!("docker engine at {host} is unreachable")),
        "the reason names the engine: {reason}"
    );
    println!("reason while the engine is down: {reason}");
    // Down for 30 s: uncapped, the retries (5 ms doubling) would by now be about 30 s apart.
    tokio::time::sleep(Duration::from_secs(30)).await;

    engine.start().await;
    let back = Instant::now();
    let after = wait_phase(
        &api,
        "outage",
        Phase::Active,
        Duration::from_secs(60),
        &controller,
    )
    .await;
    let noticed = back.elapsed();
    println!("the recovered engine was noticed after {noticed:?}");
    assert!(
        noticed < Duration::from_secs(15),
        "with retries capped at 3 s the recovered engine is noticed within a few seconds, took {noticed:?}"
    );
    let status = after.status.unwrap();
    assert_eq!(status.reason, "");
    assert_eq!(
        status.server.unwrap().id,
        id_before,
        "the container survived the outage and was adopted"
    );
}

async fn lease_holder(cluster: &Cluster, ns: &str) -> Option<String> {
    let leases: Api<Lease> = Api::namespaced(cluster.client().await.unwrap(), ns);
    leases
        .get_opt("controller101")
        .await
        .unwrap()
        .and_then(|l| l.spec)
        .and_then(|s| s.holder_identity)
        .filter(|h| !h.is_empty())
}

/// The notes of the events.k8s.io/v1 Events leader election recorded about the Lease.
async fn lease_event_notes(cluster: &Cluster, ns: &str) -> Vec<String> {
    use k8s_openapi::api::events::v1::Event;
    let events: Api<Event> = Api::namespaced(cluster.client().await.unwrap(), ns);
    events
        .list(&kube_client::api::ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| {
            e.regarding.as_ref().is_some_and(|r| {
                r.kind.as_deref() == Some("Lease") && r.name.as_deref() == Some("controller101")
            }) && e.reason.as_deref() == Some("LeaderElection")
                && e.reporting_controller.as_deref() == Some("vm-controller")
        })
        .filter_map(|e| e.note)
        .collect()
}

#[tokio::test]
async fn with_two_replicas_only_the_leader_acts_and_the_other_takes_over_when_it_dies() {
    let PodmanTest {
        cluster,
        host,
        docker,
        ns,
        api,
        _cleanup,
    } = PodmanTest::new("vm-ha").await;
    let timing = [
        "--lease-duration",
        "6s",
        "--renew-deadline",
        "4s",
        "--retry-period",
        "1s",
    ];

    let mut a = spawn_controller(cluster, &ns, &host, "replica-a", &timing);
    eventually("replica-a to lead", Duration::from_secs(30), || async {
        (lease_holder(cluster, &ns).await.as_deref() == Some("replica-a")).then_some(())
    })
    .await;
    let mut b = spawn_controller(cluster, &ns, &host, "replica-b", &timing);
    apply_vm(cluster, &ns, "first", "1", "64Mi");
    wait_phase(&api, "first", Phase::Active, START, &a).await;
    assert!(a.log().contains("became the leader"));
    let b_log = b.log();
    assert!(
        !b_log.contains("became the leader") && !b_log.contains("writing status"),
        "the standby must not act:\n{b_log}"
    );

    // The leader dies without releasing the lease; work arrives while nobody leads.
    a.kill();
    apply_vm(cluster, &ns, "second", "1", "64Mi");
    let killed_at = Instant::now();
    wait_phase(&api, "second", Phase::Active, START, &b).await;
    println!(
        "the standby finished the pending VM {:?} after the leader was killed",
        killed_at.elapsed()
    );
    assert_eq!(
        lease_holder(cluster, &ns).await.as_deref(),
        Some("replica-b")
    );
    assert!(container_exists(&docker, &container_name(&ns, "second")).await);
    // Both leaderships are on record as events.k8s.io/v1 Events about the Lease.
    eventually(
        "\"became leader\" Events of both replicas about the Lease",
        Duration::from_secs(30),
        || async {
            let notes = lease_event_notes(cluster, &ns).await;
            ["replica-a became leader", "replica-b became leader"]
                .iter()
                .all(|n| notes.iter().any(|seen| seen == n))
                .then_some(())
        },
    )
    .await;

    // The new leader also finishes the old leader's VMs: delete the first one.
    delete_vm(cluster, &ns, "first");
    // Cleaned up by replica-b.
    wait_gone(&api, "first", Duration::from_secs(60), &b).await;
    assert!(!container_exists(&docker, &container_name(&ns, "first")).await);

    // SIGTERM: the leader stops, releases the lease and exits 0.
    assert_eq!(b.terminate(Duration::from_secs(30)), Some(0));
    assert_eq!(
        lease_holder(cluster, &ns).await,
        None,
        "the lease was released"
    );
}

#[tokio::test]
async fn a_container_removed_behind_the_controllers_back_is_reported_and_recreated() {
    let PodmanTest {
        cluster,
        host,
        docker,
        ns,
        api,
        _cleanup,
    } = PodmanTest::new("vm-vanish").await;
    let controller = spawn_controller(cluster, &ns, &host, "one", &["--refresh-interval", "2s"]);

    apply_vm(cluster, &ns, "ghost", "500m", "64Mi");
    let active = wait_phase(&api, "ghost", Phase::Active, START, &controller).await;
    let old_id = active.status.unwrap().server.unwrap().id;

    let rv = api
        .get("ghost")
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let mut events = api
        .watch(&WatchParams::default(), &rv)
        .await
        .unwrap()
        .boxed();
    let name = container_name(&ns, "ghost");
    let out = Command::new("podman")
        .args(["rm", "-f", "-t", "0", &name])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "podman rm: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    let mut seen = Vec::new();
    let new_id = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(WatchEvent::Modified(vm)) = events.try_next().await.expect("watch") {
            let status = vm.status.clone().unwrap_or_default();
            seen.push((status.phase, status.reason.clone()));
            if status.phase == Phase::Active
                && let Some(server) = status.server.filter(|s| s.id != old_id)
            {
                return server.id;
            }
        }
        panic!("watch ended")
    })
    .await
    .unwrap_or_else(|_| panic!("not recreated; seen {seen:?}\n{}", controller.log_tail(30)));
    let vanished = seen
        .iter()
        .find(|(phase, _)| *phase == Phase::Failed)
        .unwrap_or_else(|| panic!("no Failed phase in {seen:?}"));
    assert!(
        vanished
            .1
            .contains(&format!("server {name} (id {old_id}) vanished")),
        "{vanished:?}"
    );
    let inspected = docker
        .inspect_container(&name, None::<InspectContainerOptions>)
        .await
        .unwrap();
    assert_eq!(inspected.id.as_deref(), Some(new_id.as_str()));
    assert_eq!(inspected.host_config.unwrap().nano_cpus, Some(500_000_000));
}

/// A kubeconfig for a user that has only what RBAC grants it: the admin kubeconfig with the
/// user's client certificate instead of the admin's.
fn restricted_kubeconfig(cluster: &Cluster, user: &str) -> PathBuf {
    let config = cluster.user_config(user, &[]).unwrap();
    let admin = std::fs::read_to_string(cluster.kubeconfig_path()).unwrap();
    let cert = config.auth_info.client_certificate.clone().unwrap();
    let key = config.auth_info.client_key.clone().unwrap();
    let text: Vec<String> = admin
        .lines()
        .map(|line| {
            if line.trim_start().starts_with("client-certificate:") {
                format!("    client-certificate: {cert}")
            } else if line.trim_start().starts_with("client-key:") {
                format!("    client-key: {key}")
            } else {
                line.to_string()
            }
        })
        .collect();
    let path = cluster.dir().join(format!("{user}.kubeconfig"));
    std::fs::write(&path, text.join("\n")).unwrap();
    path
}

#[tokio::test]
async fn the_example_rbac_is_enough_to_run_the_controller_with_leader_election() {
    let PodmanTest {
        cluster,
        host,
        ns,
        api,
        _cleanup,
        ..
    } = PodmanTest::new("vm-rbac").await;
    let user = format!("vm-controller-{ns}");
    let kubeconfig = restricted_kubeconfig(cluster, &user);

    // Without a binding the user can do nothing (the control for this test).
    let restricted = |args: &[&str]| {
        let out = cluster.kubectl_as(&kubeconfig, args);
        (out.success, out.stderr)
    };
    let (ok, err) = restricted(&["get", "vms", "-n", &ns]);
    assert!(!ok && err.contains("forbidden"), "{err}");

    let Kubectl {
        success: ok,
        stdout: out,
        stderr: err,
        ..
    } = cluster.kubectl(&["apply", "-f", RBAC]);
    assert!(ok, "{out}{err}");
    let binding = format!("vm-controller-test-{ns}");
    let Kubectl {
        success: ok,
        stdout: out,
        stderr: err,
        ..
    } = cluster.kubectl(&[
        "create",
        "clusterrolebinding",
        &binding,
        "--clusterrole=kubeloop-vm-controller",
        &format!("--user={user}"),
    ]);
    assert!(ok, "{out}{err}");
    eventually(
        "the binding to take effect",
        Duration::from_secs(30),
        || async { restricted(&["get", "vms", "-n", &ns]).0.then_some(()) },
    )
    .await;

    let controller = spawn_controller_as(cluster, &kubeconfig, &ns, &host, "restricted", &[]);
    apply_vm(cluster, &ns, "rbac", "1", "64Mi");
    wait_phase(&api, "rbac", Phase::Active, START, &controller).await;
    assert_eq!(
        lease_holder(cluster, &ns).await.as_deref(),
        Some("restricted")
    );
    delete_vm(cluster, &ns, "rbac");
    wait_gone(&api, "rbac", Duration::from_secs(60), &controller).await;
    let log = controller.log();
    assert!(
        !log.contains("forbidden") && !log.contains("Forbidden"),
        "no permission errors:\n{}",
        controller.log_tail(30)
    );
    cluster.kubectl(&["delete", "clusterrolebinding", &binding]);
}

#[tokio::test]
async fn the_fake_driver_runs_vms_without_any_engine() {
    let cluster = testenv::shared().await;
    install_crd(cluster).await;
    let ns = cluster.new_namespace("vm-fake").await.unwrap();
    let api: Api<VirtualMachine> = Api::namespaced(cluster.client().await.unwrap(), &ns);
    // An engine address where nothing listens: the fake driver must not need it.
    let mut controller = spawn_controller(
        cluster,
        &ns,
        "unix:///nonexistent/kubeloop.sock",
        "fake",
        &["--vm-driver", "fake", "--leader-elect=false"],
    );
    let Kubectl {
        success: ok,
        stdout: out,
        stderr: err,
        ..
    } = cluster.kubectl(&["apply", "-n", &ns, "-f", TEST_VM]);
    assert!(ok, "{out}{err}");
    let active = wait_phase(
        &api,
        "test-vm",
        Phase::Active,
        Duration::from_secs(60),
        &controller,
    )
    .await;
    let status = active.status.unwrap();
    let server = status.server.clone().unwrap();
    assert!(server.id.starts_with("fake-"), "{server:?}");
    // Conditions in the Kubernetes convention, and an event for each phase change, as
    // `kubectl describe` shows them.
    let ready = status
        .conditions
        .iter()
        .find(|c| c.type_ == "Ready")
        .expect("a Ready condition");
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("True", "Active")
    );
    assert_eq!(ready.observed_generation, active.metadata.generation);
    let describe = eventually("both transition events", Duration::from_secs(30), || {
        let Kubectl { stdout: out, .. } =
            cluster.kubectl(&["describe", "vm", "test-vm", "-n", &ns]);
        let ok = out.contains("(new) -> Creating") && out.contains("Creating -> Active");
        async move { ok.then_some(out) }
    })
    .await;
    for expected in [
        "Type:",
        "Ready",
        "ServerRunning",
        "Last Transition Time:",
        "Observed Generation:",
    ] {
        assert!(
            describe.contains(expected),
            "{expected} missing from kubectl describe:\n{describe}"
        );
    }
    let Kubectl {
        success: ok,
        stdout: out,
        stderr: err,
        ..
    } = cluster.kubectl(&["delete", "vm", "test-vm", "-n", &ns, "--timeout=60s"]);
    assert!(ok, "{out}{err}");
    assert!(vm(&api, "test-vm").await.is_none());
    assert_eq!(controller.terminate(Duration::from_secs(30)), Some(0));
}

#[tokio::test]
async fn editing_the_resources_recreates_the_container_with_the_new_limits() {
    let PodmanTest {
        cluster,
        host,
        docker,
        ns,
        api,
        _cleanup,
    } = PodmanTest::new("vm-resize").await;
    let controller = spawn_controller(cluster, &ns, &host, "one", &[]);
    apply_vm(cluster, &ns, "grow", "500m", "64Mi");
    let active = wait_phase(&api, "grow", Phase::Active, START, &controller).await;
    let old_id = active.status.unwrap().server.unwrap().id;

    let Kubectl {
        success: ok,
        stdout: out,
        stderr: err,
        ..
    } = cluster.kubectl(&[
        "patch",
        "vm",
        "grow",
        "-n",
        &ns,
        "--type=merge",
        "-p",
        r#"{"spec":{"resource":{"cpu":"1500m","memory":"128Mi"}}}"#,
    ]);
    assert!(ok, "{out}{err}");
    let name = container_name(&ns, "grow");
    let new_id = eventually("a resized container", Duration::from_secs(60), || async {
        let vm = vm(&api, "grow").await?;
        let server = vm.status.filter(|s| s.phase == Phase::Active)?.server?;
        (server.id != old_id).then_some(server.id)
    })
    .await;
    let host_config = docker
        .inspect_container(&name, None::<InspectContainerOptions>)
        .await
        .unwrap();
    assert_eq!(host_config.id.as_deref(), Some(new_id.as_str()));
    let limits = host_config.host_config.unwrap();
    assert_eq!(limits.nano_cpus, Some(1_500_000_000));
    assert_eq!(limits.memory, Some(128 * 1024 * 1024));
}

/// Creates and starts a container named `name` with exactly `labels` (someone else's, or an
/// orphan), as the test's own client; returns its id.
async fn create_labelled_container(docker: &Docker, name: &str, labels: &[(&str, &str)]) -> String {
    use bollard::models::ContainerCreateBody;
    use bollard::query_parameters::CreateContainerOptionsBuilder;
    let body = ContainerCreateBody {
        image: Some(kubeloop::controller::vm::DEFAULT_IMAGE.to_string()),
        labels: Some(
            labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        ),
        ..ContainerCreateBody::default()
    };
    let created = docker
        .create_container(
            Some(CreateContainerOptionsBuilder::new().name(name).build()),
            body,
        )
        .await
        .unwrap_or_else(|e| panic!("creating container {name}: {e}"));
    docker
        .start_container(name, None)
        .await
        .unwrap_or_else(|e| panic!("starting container {name}: {e}"));
    created.id
}

async fn container_id(docker: &Docker, name: &str) -> Option<String> {
    match docker
        .inspect_container(name, None::<InspectContainerOptions>)
        .await
    {
        Ok(found) => found.id,
        Err(bollard::errors::Error::DockerResponseServerError {
            status_code: 404, ..
        }) => None,
        Err(e) => panic!("inspecting {name}: {e}"),
    }
}

#[tokio::test]
async fn a_container_of_another_owner_with_the_vms_name_is_reported_and_never_adopted_or_deleted() {
    use k8s_openapi::api::events::v1::Event;
    use kube_client::api::ListParams;

    let PodmanTest {
        cluster,
        host,
        docker,
        ns,
        api,
        _cleanup,
    } = PodmanTest::new("vm-taken").await;
    let name = container_name(&ns, "taken");
    // Another cluster's VM of the same namespace/name on the same engine: its own uid and its
    // own managed-by value (so no orphan sweep of ours may take it either).
    let foreign_id = create_labelled_container(
        &docker,
        &name,
        &[
            ("kubeloop.dev/vm-namespace", ns.as_str()),
            ("kubeloop.dev/vm-name", "taken"),
            ("kubeloop.dev/vm-uid", "uid-in-another-cluster"),
            (
                "kubeloop.dev/managed-by",
                "kubeloop-vm-controller@another-cluster",
            ),
        ],
    )
    .await;

    let mut controller =
        spawn_controller(cluster, &ns, &host, "one", &["--refresh-interval", "2s"]);
    apply_vm(cluster, &ns, "taken", "500m", "64Mi");
    let failed = wait_phase(&api, "taken", Phase::Failed, START, &controller).await;
    let uid = failed.metadata.uid.clone().unwrap();
    let reason = failed.status.unwrap().reason;
    for part in [
        name.as_str(),
        foreign_id.as_str(),
        "uid-in-another-cluster",
        uid.as_str(),
    ] {
        assert!(reason.contains(part), "{part:?} not in reason {reason:?}");
    }

    let events: Api<Event> = Api::namespaced(cluster.client().await.unwrap(), &ns);
    let warning = eventually(
        "a ServerNameTaken Warning event",
        Duration::from_secs(30),
        || async {
            events
                .list(&ListParams::default())
                .await
                .expect("listing events")
                .items
                .into_iter()
                .find(|e| {
                    e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("taken")
                        && e.reason.as_deref() == Some("ServerNameTaken")
                        && e.type_.as_deref() == Some("Warning")
                })
        },
    )
    .await;
    assert!(
        warning
            .note
            .as_deref()
            .is_some_and(|m| m.contains("uid-in-another-cluster")),
        "{warning:?}"
    );

    // A few refreshes later it is still Failed and the container untouched.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(vm(&api, "taken").await.unwrap().phase(), Phase::Failed);
    assert_eq!(container_id(&docker, &name).await, Some(foreign_id.clone()));

    // Deleting the VM lets the object go without touching the container.
    delete_vm(cluster, &ns, "taken");
    wait_gone(&api, "taken", Duration::from_secs(60), &controller).await;
    assert_eq!(
        container_id(&docker, &name).await,
        Some(foreign_id),
        "the other owner's container still exists\n{}",
        controller.log_tail(20)
    );
    assert_eq!(controller.terminate(Duration::from_secs(30)), Some(0));
}

#[tokio::test]
async fn the_orphan_sweep_removes_a_labelled_container_whose_vm_does_not_exist() {
    use kubeloop::cache::{Lister, ThreadSafeStore};
    use kubeloop::controller::vm::{
        DockerDriver, DockerDriverConfig, KubeVmApi, SweepReport, sweep_orphans,
    };
    use kubeloop::runtime::ReconcileContext;

    let PodmanTest {
        cluster,
        host,
        docker,
        ns,
        api,
        _cleanup,
    } = PodmanTest::new("vm-sweep").await;

    // A live VM (no controller runs, so nothing else touches its container) and its container.
    apply_vm(cluster, &ns, "alive", "500m", "64Mi");
    let alive_uid = vm(&api, "alive").await.unwrap().metadata.uid.unwrap();
    let managed = "kubeloop-vm-controller";
    let alive = container_name(&ns, "alive");
    create_labelled_container(
        &docker,
        &alive,
        &[
            ("kubeloop.dev/vm-namespace", ns.as_str()),
            ("kubeloop.dev/vm-name", "alive"),
            ("kubeloop.dev/vm-uid", alive_uid.as_str()),
            ("kubeloop.dev/managed-by", managed),
        ],
    )
    .await;
    // The container of a VM that no longer exists (its maker died mid-create, say).
    let orphan = container_name(&ns, "gone");
    create_labelled_container(
        &docker,
        &orphan,
        &[
            ("kubeloop.dev/vm-namespace", ns.as_str()),
            ("kubeloop.dev/vm-name", "gone"),
            ("kubeloop.dev/vm-uid", "uid-of-a-deleted-vm"),
            ("kubeloop.dev/managed-by", managed),
        ],
    )
    .await;
    // Someone else's container without our managed-by label.
    let unmanaged = container_name(&ns, "unmanaged");
    create_labelled_container(
        &docker,
        &unmanaged,
        &[
            ("kubeloop.dev/vm-namespace", ns.as_str()),
            ("kubeloop.dev/vm-name", "unmanaged"),
            ("kubeloop.dev/vm-uid", "uid-of-someone-else"),
        ],
    )
    .await;

    let driver = DockerDriver::new(DockerDriverConfig {
        host: host.clone(),
        ..DockerDriverConfig::default()
    });
    // An informer cache that has seen nothing: the sweep must decide from live GETs.
    let vm_api = KubeVmApi::new(
        cluster.client().await.unwrap(),
        Lister::new(ThreadSafeStore::new(Default::default()).reader()),
    );
    let report = sweep_orphans(&driver, &vm_api, Some(&ns), &ReconcileContext::detached())
        .await
        .expect("the sweep runs");
    assert_eq!(
        report,
        SweepReport {
            examined: 2,
            removed: 1,
            kept: 1
        }
    );
    assert!(
        !container_exists(&docker, &orphan).await,
        "the orphan is removed"
    );
    assert!(
        container_exists(&docker, &alive).await,
        "the live VM's container stays"
    );
    assert!(
        container_exists(&docker, &unmanaged).await,
        "an unmanaged container stays"
    );
}

// ---------------------------------------------------------------------------------------------
// Chaos: three replicas under leader election while VMs are created, resized and deleted and
// the leader is SIGKILLed, SIGSTOPped past its lease, and cut off the apiserver.

/// One replica process of the chaos test (each incarnation has its own identity, as the
/// default identity would give it).
struct Replica {
    controller: ManagedProcess,
    identity: String,
    proxy: testenv::FaultProxy,
    /// When it was stopped or killed (a reconcile still open then ends there): stamped once
    /// the process could write no more (see [`wait_until_stopped`]), never before the signal.
    frozen_at: Option<jiff_now::Stamp>,
    /// When it was resumed after a SIGSTOP (no side effect may follow).
    resumed_at: Option<jiff_now::Stamp>,
}

mod jiff_now {
    pub type Stamp = k8s_openapi::jiff::Timestamp;
    pub fn now() -> Stamp {
        k8s_openapi::jiff::Timestamp::now()
    }
}

/// Waits until every thread of `controller` is stopped after a SIGSTOP, so that a stamp taken
/// afterwards is later than every line it logged before stopping. A stamp taken before the
/// signal is not: on a loaded machine the process may start a reconcile between the stamp and
/// the stop, and that reconcile, open until the process is resumed, would look as if it ran
/// through the successor's first reconciles.
fn wait_until_stopped(controller: &ManagedProcess) {
    let tasks = format!("/proc/{}/task", controller.pid());
    eventually_blocking(
        &format!("{} to stop on SIGSTOP", controller.name()),
        Duration::from_secs(10),
        || {
            std::fs::read_dir(&tasks)
                .unwrap_or_else(|e| panic!("{tasks}: {e}"))
                .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("stat")).ok())
                // The state follows the command name, which ends at the last ')'.
                .all(|stat| {
                    stat.rsplit(')')
                        .next()
                        .is_some_and(|rest| rest.trim_start().starts_with('T'))
                })
        },
    );
}

/// A kubeconfig that reaches the apiserver through `proxy`.
fn kubeconfig_via(cluster: &Cluster, proxy: &testenv::FaultProxy, name: &str) -> PathBuf {
    let text = std::fs::read_to_string(cluster.kubeconfig_path()).unwrap();
    let via = text.replace(
        &cluster.apiserver_url(),
        &format!("https://{}", proxy.addr()),
    );
    assert_ne!(via, text, "the kubeconfig names the apiserver URL");
    let path = cluster.dir().join(format!("chaos-{name}.kubeconfig"));
    std::fs::write(&path, via).unwrap();
    path
}

const CHAOS_TIMING: [&str; 10] = [
    "--lease-duration",
    "4s",
    "--renew-deadline",
    "3s",
    "--retry-period",
    "500ms",
    "--refresh-interval",
    "3s",
    "--threads",
    "2",
];

async fn start_replica(cluster: &Cluster, ns: &str, host: &str, identity: String) -> Replica {
    let proxy = testenv::FaultProxy::start(cluster.apiserver_addr())
        .await
        .unwrap();
    let kubeconfig = kubeconfig_via(cluster, &proxy, &identity);
    let controller = spawn_controller_as(cluster, &kubeconfig, ns, host, &identity, &CHAOS_TIMING);
    Replica {
        controller,
        identity,
        proxy,
        frozen_at: None,
        resumed_at: None,
    }
}

/// What still differs from the wanted state, `None` once every wanted VM is Active on a
/// container of its uid with its CPU and no other labelled container exists.
async fn chaos_problem(
    vms: &Api<VirtualMachine>,
    wanted: &std::collections::BTreeMap<String, &str>,
    docker: &Docker,
    ns: &str,
) -> Option<String> {
    for (name, cpu) in wanted {
        let Ok(Some(vm)) = vms.get_opt(name).await else {
            return Some(format!("{name}: not found"));
        };
        let phase = vm.phase();
        if phase != Phase::Active {
            let reason = vm
                .status
                .as_ref()
                .map(|s| s.reason.clone())
                .unwrap_or_default();
            return Some(format!("{name}: phase {phase:?} ({reason})"));
        }
        let Ok(inspected) = docker
            .inspect_container(&container_name(ns, name), None::<InspectContainerOptions>)
            .await
        else {
            return Some(format!("{name}: no container"));
        };
        let nano = inspected.host_config.as_ref().and_then(|h| h.nano_cpus);
        let want = cpu.trim_end_matches('m').parse::<i64>().unwrap() * 1_000_000;
        let uid = inspected
            .config
            .as_ref()
            .and_then(|c| c.labels.as_ref())
            .and_then(|l| l.get("kubeloop.dev/vm-uid").cloned());
        if nano != Some(want) || uid != vm.metadata.uid {
            return Some(format!(
                "{name}: container nano_cpus {nano:?} (want {want}), uid {uid:?} (want {:?})",
                vm.metadata.uid
            ));
        }
    }
    let mut containers = labelled_containers(ns);
    containers.sort();
    let mut expected: Vec<String> = wanted.keys().map(|n| container_name(ns, n)).collect();
    expected.sort();
    (containers != expected).then(|| format!("containers {containers:?}, expected {expected:?}"))
}

/// (start, end) of every reconcile in a replica's log, each end `None` if it never ended.
fn reconcile_intervals(log: &str) -> Vec<(String, jiff_now::Stamp, Option<jiff_now::Stamp>)> {
    let mut open: std::collections::HashMap<String, Vec<usize>> = Default::default();
    let mut out = Vec::new();
    for line in log.lines() {
        let started = line.contains("reconcile started");
        if !started && !line.contains("reconcile ended") {
            continue;
        }
        let Some(at) = line.split_whitespace().next().and_then(|t| t.parse().ok()) else {
            continue;
        };
        let Some(key) = line
            .split("key=")
            .nth(1)
            .and_then(|k| k.split_whitespace().next())
        else {
            continue;
        };
        if started {
            open.entry(key.to_string()).or_default().push(out.len());
            out.push((key.to_string(), at, None));
        } else if let Some(i) = open.get_mut(key).and_then(|v| v.pop()) {
            out[i].2 = Some(at);
        }
    }
    out
}

/// Lines of a replica's log that cause side effects.
fn side_effects(log: &str) -> Vec<(jiff_now::Stamp, String)> {
    log.lines()
        .filter(|l| {
            l.contains("writing status")
                || l.contains("server running")
                || l.contains("server deleted")
        })
        .filter_map(|l| Some((l.split_whitespace().next()?.parse().ok()?, l.to_string())))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_three_replicas_converge_without_overlap_or_orphans() {
    let PodmanTest {
        cluster,
        host,
        docker,
        ns,
        api: vms,
        _cleanup,
    } = PodmanTest::new("chaos").await;

    let mut generation = 0;
    let mut next_identity = |slot: usize| {
        generation += 1;
        format!("r{slot}-{generation}")
    };
    let mut replicas: Vec<Replica> = Vec::new();
    for slot in 0..3 {
        replicas.push(start_replica(cluster, &ns, &host, next_identity(slot)).await);
    }
    let mut retired: Vec<Replica> = Vec::new();

    // 30 VMs; `wanted` is what should exist at the end, with its CPU.
    let mut wanted: std::collections::BTreeMap<String, &str> = Default::default();
    for i in 0..30 {
        let name = format!("vm-{i}");
        apply_vm(cluster, &ns, &name, "100m", "32Mi");
        wanted.insert(name, "100m");
    }
    let mut deleted = Vec::new();

    let started = Instant::now();
    let mut failovers = 0;
    let mut longest_without_leader = Duration::ZERO;
    let actions = [
        "kill", "stop", "cut", "kill", "stop", "cut", "kill", "stop", "cut",
    ];
    for (round, action) in actions.iter().enumerate() {
        // Churn: resize two, delete one, create one.
        let names: Vec<String> = wanted.keys().cloned().collect();
        for name in names.iter().skip(round * 3).take(2) {
            let cpu = if wanted[name] == "100m" {
                "200m"
            } else {
                "100m"
            };
            apply_vm(cluster, &ns, name, cpu, "32Mi");
            wanted.insert(name.clone(), cpu);
        }
        let victim = names[names.len() - 1 - round].clone();
        cluster.kubectl(&["delete", "vm", &victim, "-n", &ns, "--wait=false"]);
        wanted.remove(&victim);
        deleted.push(victim);
        // One new VM per round, after the 30 first ones.
        let fresh = format!("vm-{}", 30 + round);
        apply_vm(cluster, &ns, &fresh, "100m", "32Mi");
        wanted.insert(fresh, "100m");

        // The current leader, by the Lease.
        let leader = eventually("a leader", Duration::from_secs(60), || async {
            lease_holder(cluster, &ns).await
        })
        .await;
        let slot = replicas
            .iter()
            .position(|r| r.identity == leader)
            .unwrap_or_else(|| panic!("the holder {leader} is one of the live replicas"));
        let disrupted = Instant::now();
        match *action {
            // Stamped once the process is gone or stopped, not before the signal: a reconcile
            // it started in between would otherwise count as running until it was resumed
            // (or, killed, until the end).
            "kill" => {
                replicas[slot].controller.kill();
                replicas[slot].frozen_at = Some(jiff_now::now());
            }
            "stop" => {
                replicas[slot].controller.signal(libc::SIGSTOP);
                wait_until_stopped(&replicas[slot].controller);
                replicas[slot].frozen_at = Some(jiff_now::now());
            }
            _ => {
                replicas[slot].proxy.set_blocked(true);
                replicas[slot].proxy.cut_all();
            }
        }
        let new_leader = eventually("a new leader", Duration::from_secs(60), || {
            let (leader, ns) = (leader.clone(), ns.clone());
            async move { lease_holder(cluster, &ns).await.filter(|h| *h != leader) }
        })
        .await;
        let gap = disrupted.elapsed();
        longest_without_leader = longest_without_leader.max(gap);
        failovers += 1;
        println!("round {round}: {action} {leader} -> {new_leader} after {gap:?}");
        match *action {
            "stop" => {
                // Resumed well past its lease: it must act no more, step down and exit.
                tokio::time::sleep(Duration::from_secs(2)).await;
                replicas[slot].resumed_at = Some(jiff_now::now());
                replicas[slot].controller.signal(libc::SIGCONT);
            }
            "cut" => {
                tokio::time::sleep(Duration::from_secs(1)).await;
                replicas[slot].proxy.set_blocked(false);
            }
            _ => {}
        }
        if *action != "kill" {
            let exited = eventually(
                "the deposed leader to exit",
                Duration::from_secs(30),
                || {
                    let status = replicas[slot].controller.exited();
                    async move { status }
                },
            )
            .await;
            assert_eq!(exited.code(), Some(1), "a lost lease exits 1");
        }
        let fresh = start_replica(cluster, &ns, &host, next_identity(slot)).await;
        retired.push(std::mem::replace(&mut replicas[slot], fresh));
        tokio::time::sleep(Duration::from_secs(2)).await;
    }

    // Convergence: every wanted VM Active on a running container with its CPU; no other
    // labelled container; every deleted VM gone.
    eventually_explained(
        "convergence",
        Duration::from_secs(240),
        || {
            replicas
                .iter()
                .map(|r| format!("{}'s log:\n{}\n", r.identity, r.controller.log_tail(40)))
                .collect()
        },
        || async {
            match chaos_problem(&vms, &wanted, &docker, &ns).await {
                Some(problem) => Err(problem),
                None => Ok(()),
            }
        },
    )
    .await;
    for name in &deleted {
        assert!(
            vms.get_opt(name).await.unwrap().is_none(),
            "{name} was deleted"
        );
    }

    // No two replicas' reconciles overlapped; a resumed replica acted no more.
    let mut all: Vec<Replica> = retired;
    all.extend(replicas);
    let mut intervals = Vec::new();
    for replica in &all {
        let log = replica.controller.log();
        for (key, start, end) in reconcile_intervals(&log) {
            let end = match (end, replica.frozen_at) {
                // A stopped process does nothing while stopped; a killed one ends there.
                (Some(end), Some(frozen)) if start < frozen && end > frozen => frozen,
                (Some(end), _) => end,
                (None, Some(frozen)) if start < frozen => frozen,
                (None, _) => jiff_now::now(),
            };
            intervals.push((replica.identity.clone(), key, start, end));
        }
        if let Some(resumed) = replica.resumed_at {
            let late: Vec<_> = side_effects(&log)
                .into_iter()
                .filter(|(at, _)| *at > resumed)
                .collect();
            assert!(
                late.is_empty(),
                "{} acted after it was resumed: {late:?}",
                replica.identity
            );
        }
    }
    intervals.sort_by_key(|(_, _, start, _)| *start);
    let mut overlaps = Vec::new();
    for (i, a) in intervals.iter().enumerate() {
        for b in &intervals[i + 1..] {
            if b.2 >= a.3 {
                break;
            }
            if a.0 != b.0 {
                overlaps.push((a.clone(), b.clone()));
            }
        }
    }
    let orphans = labelled_containers(&ns).len() - wanted.len();
    println!(
        "chaos: {} reconciles over {} replica processes, {failovers} failovers, longest without a \
         leader {longest_without_leader:?}, orphans {orphans}, overlaps {}, {:?} in all",
        intervals.len(),
        all.len(),
        overlaps.len(),
        started.elapsed()
    );
    assert!(
        overlaps.is_empty(),
        "reconciles of two replicas overlapped: {:?}",
        &overlaps[..overlaps.len().min(5)]
    );
    assert_eq!(orphans, 0);
}

// ---------------------------------------------------------------------------------------------
// Sharding: three replicas share 300 VMs through shard Leases while replicas join, are
// SIGKILLed and SIGSTOPped.

const SHARD_TIMING: [&str; 16] = [
    "--vm-driver",
    "fake",
    "--fake-engine-latency",
    "50ms",
    "--shards",
    "6",
    "--lease-duration",
    "4s",
    "--renew-deadline",
    "3s",
    "--retry-period",
    "500ms",
    "--refresh-interval",
    "5s",
    "--threads",
    "2",
];

/// Holder of every shard Lease of the ring `controller101` in `ns` ("" for none).
async fn shard_holders(cluster: &Cluster, ns: &str, shards: u32) -> Vec<String> {
    let leases: Api<Lease> = Api::namespaced(cluster.client().await.unwrap(), ns);
    let mut holders = Vec::new();
    for shard in 0..shards {
        let holder = leases
            .get_opt(&format!("controller101-shard-{shard}"))
            .await
            .ok()
            .flatten()
            .and_then(|l| l.spec)
            .and_then(|s| s.holder_identity)
            .unwrap_or_default();
        holders.push(holder);
    }
    holders
}

/// Creates `n` VMs named vm-0.. in one `kubectl apply`.
fn apply_vms(cluster: &Cluster, ns: &str, n: usize) {
    let manifest: String = (0..n)
        .map(|i| format!(
            "---\napiVersion: cloudnative.tw/v1alpha1\nkind: VirtualMachine\nmetadata: {{name: vm-{i}}}\nspec: {{resource: {{cpu: \"100m\", memory: \"32Mi\"}}}}\n"
        ))
        .collect();
    let path = cluster.dir().join(format!("{ns}-vms.yaml"));
    std::fs::write(&path, manifest).unwrap();
    let Kubectl {
        success: ok,
        stdout: out,
        stderr: err,
        ..
    } = cluster.kubectl(&["apply", "-n", ns, "-f", path.to_str().unwrap()]);
    assert!(ok, "{out}{err}");
}

/// How many of the namespace's VMs are Active.
async fn active_vms(vms: &Api<VirtualMachine>) -> usize {
    vms.list(&Default::default())
        .await
        .map(|l| {
            l.items
                .iter()
                .filter(|vm| vm.phase() == Phase::Active)
                .count()
        })
        .unwrap_or(0)
}

/// Every reconcile of every replica from its log, and the pairs of reconciles of one key by two
/// replicas that overlapped. A reconcile open when its process was stopped or killed ends there
/// (a stopped process does nothing while stopped; the one in flight is dropped at its fence
/// when it resumes). Returns (reconciles, reconciles per replica, overlapping pairs).
#[allow(clippy::type_complexity)]
fn per_key_overlaps(
    replicas: &[(String, ManagedProcess, Option<jiff_now::Stamp>)],
) -> (
    usize,
    Vec<(String, usize)>,
    Vec<(
        (String, String, jiff_now::Stamp, jiff_now::Stamp),
        (String, String, jiff_now::Stamp, jiff_now::Stamp),
    )>,
) {
    let mut intervals = Vec::new();
    let mut per_replica = Vec::new();
    for (identity, controller, frozen_at) in replicas {
        let mine = reconcile_intervals(&controller.log());
        per_replica.push((identity.clone(), mine.len()));
        for (key, start, end) in mine {
            let end = match (end, *frozen_at) {
                (Some(end), Some(frozen)) if start < frozen && end > frozen => frozen,
                (Some(end), _) => end,
                (None, Some(frozen)) if start < frozen => frozen,
                (None, _) => jiff_now::now(),
            };
            intervals.push((identity.clone(), key, start, end));
        }
    }
    intervals.sort_by(|a, b| (&a.1, a.2).cmp(&(&b.1, b.2)));
    let mut overlaps = Vec::new();
    for (i, a) in intervals.iter().enumerate() {
        for b in &intervals[i + 1..] {
            if b.1 != a.1 || b.2 >= a.3 {
                break;
            }
            if a.0 != b.0 {
                overlaps.push((a.clone(), b.clone()));
            }
        }
    }
    (intervals.len(), per_replica, overlaps)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sharded_replicas_share_300_vms_and_no_key_is_reconciled_by_two_at_once() {
    let cluster = testenv::shared().await;
    install_crd(cluster).await;
    let ns = cluster.new_namespace("shards").await.unwrap();
    let vms: Api<VirtualMachine> = Api::namespaced(cluster.client().await.unwrap(), &ns);
    let spawn = |identity: &str| {
        spawn_controller(cluster, &ns, "unix:///nonexistent", identity, &SHARD_TIMING)
    };
    let started = Instant::now();

    // Two replicas, 300 VMs: all Active, the shards split 3/3.
    let mut replicas: Vec<(String, ManagedProcess, Option<jiff_now::Stamp>)> = vec![
        ("a".into(), spawn("a"), None),
        ("b".into(), spawn("b"), None),
    ];
    apply_vms(cluster, &ns, 300);
    eventually("300 VMs Active", Duration::from_secs(180), || async {
        (active_vms(&vms).await == 300).then_some(())
    })
    .await;
    let count = |holders: &[String], who: &str| holders.iter().filter(|h| *h == who).count();
    eventually(
        "a and b hold 3 shards each",
        Duration::from_secs(60),
        || async {
            let h = shard_holders(cluster, &ns, 6).await;
            (count(&h, "a") == 3 && count(&h, "b") == 3).then_some(())
        },
    )
    .await;
    println!(
        "sharding: 300 VMs Active on 2 replicas after {:?}",
        started.elapsed()
    );

    // A third joins: two shards each.
    replicas.push(("c".into(), spawn("c"), None));
    eventually("2 shards each", Duration::from_secs(60), || async {
        let h = shard_holders(cluster, &ns, 6).await;
        (count(&h, "a") == 2 && count(&h, "b") == 2 && count(&h, "c") == 2).then_some(())
    })
    .await;

    // SIGKILL a: its shards are owned again within lease duration + retry period.
    let killed = Instant::now();
    replicas[0].1.kill();
    replicas[0].2 = Some(jiff_now::now());
    let taken = eventually("a's shards taken over", Duration::from_secs(60), || async {
        let h = shard_holders(cluster, &ns, 6).await;
        (count(&h, "b") == 3 && count(&h, "c") == 3).then(|| killed.elapsed())
    })
    .await;
    println!(
        "sharding: a SIGKILLed, its shards owned again after {taken:?} (lease 4 s + retry 0.5 s)"
    );
    assert!(
        taken < Duration::from_secs(8),
        "a dead replica's shards are taken once its Leases expire, not a second lease later: {taken:?}"
    );

    // SIGSTOP b past its lease, then SIGCONT: c takes everything meanwhile; b comes back and
    // gets its share again.
    replicas[1].1.signal(libc::SIGSTOP);
    wait_until_stopped(&replicas[1].1);
    replicas[1].2 = Some(jiff_now::now());
    eventually("c holds every shard", Duration::from_secs(60), || async {
        let h = shard_holders(cluster, &ns, 6).await;
        (count(&h, "c") == 6).then_some(())
    })
    .await;
    replicas[1].1.signal(libc::SIGCONT);
    replicas.push(("d".into(), spawn("d"), None));
    eventually(
        "b, c and d hold 2 shards each",
        Duration::from_secs(60),
        || async {
            let h = shard_holders(cluster, &ns, 6).await;
            (count(&h, "b") == 2 && count(&h, "c") == 2 && count(&h, "d") == 2).then_some(())
        },
    )
    .await;
    eventually("300 VMs Active again", Duration::from_secs(120), || async {
        (active_vms(&vms).await == 300).then_some(())
    })
    .await;
    // Let a few refresh rounds run on the new map.
    tokio::time::sleep(Duration::from_secs(6)).await;

    // No key was reconciled by two replicas at once.
    let (intervals, per_replica, overlaps) = per_key_overlaps(&replicas);
    println!(
        "sharding: {intervals} reconciles ({per_replica:?}), overlaps {}, {:?} in all",
        overlaps.len(),
        started.elapsed()
    );
    assert!(
        overlaps.is_empty(),
        "two replicas reconciled one key at once: {:?}",
        &overlaps[..overlaps.len().min(5)]
    );
    for (identity, count) in &per_replica {
        assert!(*count > 0, "{identity} reconciled nothing");
    }
    for (_, controller, _) in replicas.iter_mut() {
        controller.kill();
    }
}

/// Waits until [`chaos_problem`] finds nothing left to converge.
async fn converge(
    what: &str,
    vms: &Api<VirtualMachine>,
    wanted: &std::collections::BTreeMap<String, &str>,
    docker: &Docker,
    ns: &str,
) {
    eventually(what, Duration::from_secs(180), || async {
        chaos_problem(vms, wanted, docker, ns)
            .await
            .is_none()
            .then_some(())
    })
    .await
}

/// The podman run of sharding: three replicas over 24 VMs on one engine; one is SIGKILLed. Every
/// VM converges on a container of its uid, no container is left without its VM, and no key is
/// reconciled by two replicas at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sharded_replicas_on_podman_converge_without_overlap_or_orphans() {
    let PodmanTest {
        cluster,
        host,
        docker,
        ns,
        api: vms,
        _cleanup,
    } = PodmanTest::new("shards-podman").await;
    // The chaos test's timing, sharded.
    let args: Vec<&str> = ["--shards", "4"].into_iter().chain(CHAOS_TIMING).collect();
    let mut replicas: Vec<(String, ManagedProcess, Option<jiff_now::Stamp>)> = ["a", "b", "c"]
        .iter()
        .map(|id| {
            (
                id.to_string(),
                spawn_controller(cluster, &ns, &host, id, &args),
                None,
            )
        })
        .collect();
    let mut wanted: std::collections::BTreeMap<String, &str> = Default::default();
    for i in 0..24 {
        let name = format!("vm-{i}");
        apply_vm(cluster, &ns, &name, "100m", "32Mi");
        wanted.insert(name, "100m");
    }
    converge(
        "24 VMs Active on their containers",
        &vms,
        &wanted,
        &docker,
        &ns,
    )
    .await;
    // Kill the holder of shard 0 (the one that sweeps) while it works; resize two VMs.
    let holder = shard_holders(cluster, &ns, 4).await[0].clone();
    let victim = replicas
        .iter()
        .position(|r| r.0 == holder)
        .expect("a replica holds shard 0");
    replicas[victim].1.kill();
    replicas[victim].2 = Some(jiff_now::now());
    for name in ["vm-0", "vm-1"] {
        apply_vm(cluster, &ns, name, "200m", "32Mi");
        wanted.insert(name.to_string(), "200m");
    }
    eventually(
        "the live replicas hold every shard",
        Duration::from_secs(60),
        || async {
            let h = shard_holders(cluster, &ns, 4).await;
            h.iter()
                .all(|h| !h.is_empty() && *h != holder)
                .then_some(())
        },
    )
    .await;
    converge(
        "every VM Active again with its new CPU",
        &vms,
        &wanted,
        &docker,
        &ns,
    )
    .await;
    let (intervals, per_replica, overlaps) = per_key_overlaps(&replicas);
    println!(
        "sharding on podman: {intervals} reconciles ({per_replica:?}), overlaps {}",
        overlaps.len()
    );
    assert!(
        overlaps.is_empty(),
        "two replicas reconciled one key at once: {:?}",
        &overlaps[..overlaps.len().min(5)]
    );
}

/// The events.k8s.io/v1 Events about VM `name` in `ns`: (type, reason, note), oldest first.
async fn vm_events(cluster: &Cluster, ns: &str, name: &str) -> Vec<(String, String, String)> {
    use k8s_openapi::api::events::v1::Event;
    let events: Api<Event> = Api::namespaced(cluster.client().await.unwrap(), ns);
    let mut list: Vec<Event> = events
        .list(&kube_client::api::ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
        .collect();
    list.sort_by_key(|e| e.metadata.creation_timestamp.clone().map(|t| t.0));
    list.into_iter()
        .map(|e| {
            (
                e.type_.unwrap_or_default(),
                e.reason.unwrap_or_default(),
                e.note.unwrap_or_default(),
            )
        })
        .collect()
}

/// `(status, reason, message)` of the VM's condition `type_`.
fn vm_condition(vm: &VirtualMachine, type_: &str) -> (String, String, String) {
    let c = vm
        .status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == type_))
        .unwrap_or_else(|| panic!("no {type_} condition in {:?}", vm.status));
    (c.status.clone(), c.reason.clone(), c.message.clone())
}

#[tokio::test]
async fn a_container_killed_behind_the_controllers_back_is_failed_with_its_exit_code_then_restarted_after_its_backoff()
 {
    let PodmanTest {
        cluster,
        host,
        ns,
        api,
        _cleanup,
        ..
    } = PodmanTest::new("vm-killed").await;
    let controller = spawn_controller(cluster, &ns, &host, "one", &["--refresh-interval", "1s"]);

    apply_vm(cluster, &ns, "victim", "500m", "64Mi");
    let active = wait_phase(&api, "victim", Phase::Active, START, &controller).await;
    let id = active.status.unwrap().server.unwrap().id;
    let name = container_name(&ns, "victim");
    let out = Command::new("podman")
        .args(["kill", "--signal", "KILL", &name])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "podman kill: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    // Noticed on the next refresh: not Active, the exit code (SIGKILL: 137) in the reason and
    // the conditions, the same container kept for its restart.
    let failed = wait_phase(
        &api,
        "victim",
        Phase::Failed,
        Duration::from_secs(20),
        &controller,
    )
    .await;
    let status = failed.status.clone().unwrap();
    assert!(
        status.reason.contains("exited with code 137"),
        "{}",
        status.reason
    );
    assert_eq!(status.server.as_ref().unwrap().exit_code, Some(137));
    let (ready, ready_reason, _) = vm_condition(&failed, "Ready");
    assert_eq!((ready.as_str(), ready_reason.as_str()), ("False", "Failed"));
    let (running, running_reason, message) = vm_condition(&failed, "ServerRunning");
    assert_eq!(
        (running.as_str(), running_reason.as_str()),
        ("False", "Exited")
    );
    assert!(message.contains("exit code 137"), "{message}");

    // Restarted once its 10 s backoff passed: Active again on the same container, one restart.
    let restarted = wait_vm(
        &api,
        "victim",
        "Active again after one restart",
        Duration::from_secs(40),
        &controller,
        |v| v.phase() == Phase::Active && v.status.as_ref().is_some_and(|s| s.restarts == 1),
    )
    .await;
    assert_eq!(restarted.status.unwrap().server.unwrap().id, id);

    // The transitions are events, and `kubectl describe` shows them with the conditions.
    let events = eventually("the transition events", Duration::from_secs(10), || async {
        let events = vm_events(cluster, &ns, "victim").await;
        let reasons: Vec<&str> = events.iter().map(|(_, r, _)| r.as_str()).collect();
        (reasons.contains(&"Failed")
            && reasons.contains(&"Restarting")
            && reasons.iter().filter(|r| **r == "Active").count() >= 2)
            .then_some(events)
    })
    .await;
    let failed_event = events.iter().find(|(_, r, _)| r == "Failed").unwrap();
    assert_eq!(failed_event.0, "Warning");
    assert!(
        failed_event
            .2
            .contains(&format!("VirtualMachine {ns}/victim: Active -> Failed"))
            && failed_event.2.contains("code 137"),
        "{failed_event:?}"
    );
    let Kubectl {
        success: ok,
        stdout: described,
        stderr: err,
        ..
    } = cluster.kubectl(&["describe", "vm", "-n", &ns, "victim"]);
    assert!(ok, "{err}");
    for wanted in [
        "Conditions:",
        "ServerRunning",
        "Restarting",
        "Active -> Failed",
    ] {
        assert!(described.contains(wanted), "no {wanted:?} in:\n{described}");
    }
    drop(controller);
}

/// Builds (once) an image like the VM image whose command exits with 3 at once.
fn exiting_image() -> String {
    let image = "localhost/kubeloop/vm-exit3:latest".to_string();
    let exists = Command::new("podman")
        .args(["image", "exists", &image])
        .status()
        .unwrap();
    if exists.success() {
        return image;
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("Containerfile"),
        format!(
            "FROM {}\nCMD [\"/bin/sh\", \"-c\", \"exit 3\"]\n",
            kubeloop::controller::vm::DEFAULT_IMAGE
        ),
    )
    .unwrap();
    let out = Command::new("podman")
        .args(["build", "-t", &image])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "podman build: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    image
}

#[tokio::test]
async fn a_server_that_keeps_exiting_is_restarted_with_a_growing_backoff_and_goes_crash_loop_back_off()
 {
    let PodmanTest {
        cluster,
        host,
        ns,
        api,
        _cleanup,
        ..
    } = PodmanTest::new("vm-crashloop").await;
    let image = exiting_image();
    let controller = spawn_controller(
        cluster,
        &ns,
        &host,
        "one",
        &["--refresh-interval", "1s", "--vm-image", &image],
    );
    let started = Instant::now();
    apply_vm(cluster, &ns, "crasher", "100m", "32Mi");

    // Exits at once each time: waits of 10 s then 20 s, and after the third exit in a row
    // CrashLoopBackOff (waiting 40 s), with the exit code.
    let looping = wait_phase(
        &api,
        "crasher",
        Phase::CrashLoopBackOff,
        Duration::from_secs(75),
        &controller,
    )
    .await;
    let took = started.elapsed();
    let status = looping.status.clone().unwrap();
    assert_eq!(status.restarts, 2, "{status:?}");
    assert!(
        status.reason.contains("exited with code 3") && status.reason.contains("exit 3 in a row"),
        "{}",
        status.reason
    );
    assert_eq!(vm_condition(&looping, "Ready").1, "CrashLoopBackOff");
    assert!(
        took >= Duration::from_secs(30),
        "two restarts must wait 10 s + 20 s, took {took:?}"
    );
    // No hot restarts: 15 s later (inside the 40 s wait) still 2 restarts.
    tokio::time::sleep(Duration::from_secs(15)).await;
    let later = vm(&api, "crasher").await.unwrap();
    assert_eq!(later.status.as_ref().unwrap().restarts, 2);
    assert_eq!(later.phase(), Phase::CrashLoopBackOff);
    let events = vm_events(cluster, &ns, "crasher").await;
    let crash_loop = events
        .iter()
        .find(|(_, r, _)| r == "CrashLoopBackOff")
        .unwrap_or_else(|| panic!("no CrashLoopBackOff event in {events:?}"));
    assert_eq!(crash_loop.0, "Warning");
    let restarting = events.iter().filter(|(_, r, _)| r == "Restarting").count();
    assert_eq!(restarting, 2, "{events:?}");
}

#[tokio::test]
async fn limits_the_engine_refuses_give_a_failed_vm_that_is_not_retried_hot_and_an_edit_fixes_it() {
    let PodmanTest {
        cluster,
        host,
        ns,
        api,
        _cleanup,
        ..
    } = PodmanTest::new("vm-refused").await;
    let controller = spawn_controller(cluster, &ns, &host, "one", &["--refresh-interval", "1s"]);

    // 1 MiB is less than the container's init already uses: the OCI runtime refuses to start.
    apply_vm(cluster, &ns, "tiny", "100m", "1Mi");
    let failed = wait_phase(
        &api,
        "tiny",
        Phase::Failed,
        Duration::from_secs(60),
        &controller,
    )
    .await;
    let reason = failed.status.clone().unwrap().reason;
    assert!(
        reason.contains("refused to start") && reason.contains("memory limit"),
        "{reason}"
    );
    // The user who can fix it is told, on the object: a condition and a Warning event that
    // say what was refused and why.
    let (ready, ready_reason, message) = vm_condition(&failed, "Ready");
    assert_eq!((ready.as_str(), ready_reason.as_str()), ("False", "Failed"));
    assert!(message.contains("memory limit"), "{message}");
    let events = vm_events(cluster, &ns, "tiny").await;
    assert!(
        events
            .iter()
            .any(|(t, r, m)| t == "Warning" && r == "Failed" && m.contains("memory limit")),
        "no Warning event naming the memory limit in {events:?}"
    );

    // The add and the finalizer patch's update may each give one attempt; then none for
    // ten minutes. Over 10 s (ten refresh intervals): no attempt and no write.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let failed = vm(&api, "tiny").await.unwrap();
    assert_eq!(failed.phase(), Phase::Failed);
    let rv = failed.metadata.resource_version.clone();
    let attempts = || controller.log().matches("driver call failed").count();
    let before = attempts();
    tokio::time::sleep(Duration::from_secs(10)).await;
    let still = vm(&api, "tiny").await.unwrap();
    assert_eq!(
        still.metadata.resource_version, rv,
        "no status write: {:?}",
        still.status
    );
    assert_eq!(
        attempts(),
        before,
        "tried again within 10 s:\n{}",
        controller.log_tail(20)
    );

    // An edit of the spec is tried at once and recreates the container with the new limit.
    apply_vm(cluster, &ns, "tiny", "100m", "64Mi");
    let active = wait_phase(
        &api,
        "tiny",
        Phase::Active,
        Duration::from_secs(60),
        &controller,
    )
    .await;
    assert_eq!(vm_condition(&active, "Ready").0, "True");
}

/// A VM campaign on `engine`: the first generated plan of each kind must pass.
async fn vm_campaign_passes(engine: kubeloop_testenv::perturb::VmEngine) {
    let cluster = testenv::shared().await;
    install_crd(cluster).await;
    let (workload, controller) = kubeloop_testenv::perturb::vm(engine);
    let campaign = kubeloop_testenv::perturb::Campaign::new(
        cluster.client_config(),
        workload,
        controller,
        Default::default(),
    );
    let findings = campaign
        .check(kubeloop_testenv::perturb::Reference::first_of_each_kind, 3)
        .await
        .expect("the reference run passes and generates plans");
    assert!(findings.is_empty(), "findings:\n{}", findings.join("\n"));
}

/// The VM controller on its fake engine passes the first generated plan of each kind
/// (kubeloop_testenv::perturb: a crash between two writes of a reconcile, a view held back, a VM's
/// events coalesced), with no orphaned server left on the engine. Every plan:
/// `hack/perturb --workload vm-fake` (a few minutes).
#[tokio::test(flavor = "multi_thread")]
async fn the_vm_controller_passes_a_crash_a_held_view_and_a_coalescing_on_the_fake_engine() {
    vm_campaign_passes(kubeloop_testenv::perturb::VmEngine::Fake).await;
}

/// The same on podman through the Docker API: real containers, and none left behind.
#[tokio::test(flavor = "multi_thread")]
async fn the_vm_controller_passes_a_crash_a_held_view_and_a_coalescing_on_podman() {
    vm_campaign_passes(kubeloop_testenv::perturb::VmEngine::Podman).await;
}
