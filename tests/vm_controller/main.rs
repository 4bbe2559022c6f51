//! `kubeloop vm-controller` end to end: the real local control plane (testenv, etcd +
//! kube-apiserver), the real binary (`kubeloop_testenv::vm::controller`), kubectl, and podman
//! serving the Docker API (hack/setup-podman; `$DOCKER_HOST` or
//! unix:///run/kubeloop/podman.sock). One module per concern: a VM's life ([`lifecycle`]),
//! input the controller refuses ([`bad_input`]), engine failures and the status they give
//! ([`engine_failures`]), leader election ([`leadership`], [`chaos`]), [`sharding`], and
//! perturbation campaigns ([`perturbation`]); this file holds what they share.
//!
//! Each test works in its own namespace and runs its controllers with `--namespace` and a
//! Lease in that namespace, so tests running in parallel do not see each other's VMs (the
//! one exception, sharding's `--watch-held-shards` test, spreads its VMs over namespaces and
//! so runs on a cluster of its own). Every
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

mod bad_input;
mod chaos;
mod engine_failures;
mod leadership;
mod lifecycle;
mod perturbation;
mod sharding;

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
