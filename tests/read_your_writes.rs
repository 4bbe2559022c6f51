//! Read-your-writes against the real control plane (issue 26): the sample controller and the
//! VM controller (on podman) each under a burst of 200 spec edits over 50 objects (each
//! object's 4 back to back, one object after the other), with their
//! informers' watch events slowed by a fault proxy, once with read-your-writes off and once on
//! (the default), same run.
//!
//! Two figures per run: the 409 Conflicts the apiserver answered on the controller's resources
//! (its own `apiserver_request_total{code="409"}`), and the reconciles that started on a cache
//! older than their key's last write (the runtime's `kubeloop_reconcile_stale_total`). With it
//! on, none starts stale; with it off, some do. Neither figure is a time. The apiserver-only
//! cluster runs no kube-controller-manager, so every write to these objects is the
//! controller's or the test's.

// `foo` is the resource under test, not a placeholder name.
#![allow(clippy::disallowed_names)]

use std::time::Duration;

use bollard::Docker;
use bollard::query_parameters::InspectContainerOptions;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube_client::Client;
use kube_client::api::{Api, Patch, PatchParams, PostParams};
use kubeloop::controller::sample::{self, ControllerConfig, Foo, FooSpec};
use kubeloop::controller::vm::{
    self, DockerDriver, DockerDriverConfig, Phase, VirtualMachine, VmControllerConfig,
};
use kubeloop::leaderelection::LeaseLock;
use kubeloop::runtime::{DEFAULT_FRESHNESS_WAIT, ReconcileMetrics};
use kubeloop::testing::eventually;
use kubeloop_testenv::{self as testenv, Cluster, HttpFaultProxy};
use tokio_util::sync::CancellationToken;

use kubeloop_testenv::vm::{ContainerCleanup, install_crd};

const CRD_YAML: &str = include_str!("../crds/foo.yaml");
const OBJECTS: usize = 50;
/// Edits per object in the burst: 200 in all.
const EDITS: i32 = 4;
/// How late the controllers' informers see each watch event.
const WATCH_DELAY: Duration = Duration::from_millis(300);
const WAIT: Duration = Duration::from_secs(300);

/// The apiserver's 409 answers so far on `resources`, and the stale starts of `controller`'s
/// reconciles.
async fn figures(admin: &Client, resources: &[&str], controller: &str) -> (u64, u64) {
    let request = http::Request::get("/metrics").body(Vec::new()).unwrap();
    let text = admin
        .request_text(request)
        .await
        .expect("apiserver /metrics");
    let conflicts = text
        .lines()
        .filter(|l| l.starts_with("apiserver_request_total{") && l.contains(r#"code="409""#))
        .filter(|l| {
            resources
                .iter()
                .any(|r| l.contains(&format!(r#"resource="{r}""#)))
        })
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum::<f64>() as u64;
    (
        conflicts,
        ReconcileMetrics::global().stale_count(controller),
    )
}

/// What changed between two [`figures`] once the last reconciles, and their writes' own
/// events, are through.
async fn since(
    before: (u64, u64),
    admin: &Client,
    resources: &[&str],
    controller: &str,
) -> (u64, u64) {
    tokio::time::sleep(WATCH_DELAY * 4).await;
    let after = figures(admin, resources, controller).await;
    (after.0 - before.0, after.1 - before.1)
}

/// The fault proxy, and a client through it for the controller under test.
async fn slow_watches(cluster: &Cluster) -> (HttpFaultProxy, Client) {
    let proxy = HttpFaultProxy::start(cluster).await.unwrap();
    proxy.delay_watches(WATCH_DELAY);
    let via_proxy = Client::try_from(cluster.client_config_via(proxy.addr())).unwrap();
    (proxy, via_proxy)
}

/// Every Foo's Deployment asks for `replicas`, and every Foo has a status.
async fn foos_served(foos: &Api<Foo>, deployments: &Api<Deployment>, replicas: i32) -> bool {
    let listed = deployments.list(&Default::default()).await.unwrap().items;
    let at = listed
        .iter()
        .filter(|d| d.spec.as_ref().and_then(|s| s.replicas) == Some(replicas))
        .count();
    let foos = foos.list(&Default::default()).await.unwrap().items;
    at == OBJECTS && foos.iter().filter(|f| f.status.is_some()).count() == OBJECTS
}

/// One run of the sample controller: Foos synced, then the burst of replica edits.
async fn sample_burst(cluster: &Cluster, via_proxy: &Client, wait: Option<Duration>) -> (u64, u64) {
    let admin = cluster.client().await.unwrap();
    let phase = if wait.is_some() { "on" } else { "off" };
    let ns = cluster
        .new_namespace(&format!("ryw-{phase}"))
        .await
        .unwrap();
    let foos: Api<Foo> = Api::namespaced(admin.clone(), &ns);
    let deployments: Api<Deployment> = Api::namespaced(admin.clone(), &ns);
    for i in 0..OBJECTS {
        let spec = FooSpec {
            deployment_name: format!("foo-{i}"),
            replicas: Some(1),
        };
        let foo = Foo::namespaced(&ns, &format!("foo-{i}"), spec);
        foos.create(&PostParams::default(), &foo).await.unwrap();
    }
    let shutdown = CancellationToken::new();
    let config = ControllerConfig {
        namespace: Some(ns.clone()),
        queue_name: String::new(),
        freshness_wait: wait,
        ..Default::default()
    };
    let controller = tokio::spawn(sample::run(via_proxy.clone(), config, shutdown.clone()));
    eventually("every Foo synced", WAIT, || {
        foos_served(&foos, &deployments, 1)
    })
    .await;

    let resources = ["foos", "deployments"];
    let before = figures(&admin, &resources, sample::CONTROLLER_NAME).await;
    // Each Foo's edits back to back: they come while its first sync runs, so it syncs again
    // right after, before its own writes come back through the slow watch.
    for i in 0..OBJECTS {
        for replicas in 2..2 + EDITS {
            let patch = serde_json::json!({"spec": {"replicas": replicas}});
            let params = PatchParams::default();
            foos.patch(&format!("foo-{i}"), &params, &Patch::Merge(&patch))
                .await
                .unwrap();
        }
    }
    eventually("every edit synced", WAIT, || {
        foos_served(&foos, &deployments, 1 + EDITS)
    })
    .await;
    let burst = since(before, &admin, &resources, sample::CONTROLLER_NAME).await;
    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(30), controller)
        .await
        .expect("the controller stops")
        .unwrap()
        .expect("the controller ran without error");
    burst
}

/// Every VM is Active on a container with `millicores` of CPU.
async fn vms_served(vms: &Api<VirtualMachine>, docker: &Docker, ns: &str, millicores: i64) -> bool {
    let listed = vms.list(&Default::default()).await.unwrap().items;
    if listed.len() != OBJECTS
        || listed
            .iter()
            .any(|vm| vm.status.as_ref().is_none_or(|s| s.phase != Phase::Active))
    {
        return false;
    }
    for vm in &listed {
        let name = format!("kubeloop-vm_{ns}_{}", vm.metadata.name.as_deref().unwrap());
        let Ok(container) = docker
            .inspect_container(&name, None::<InspectContainerOptions>)
            .await
        else {
            return false;
        };
        let cpus = container.host_config.and_then(|h| h.nano_cpus);
        if cpus != Some(millicores * 1_000_000) {
            return false;
        }
    }
    true
}

/// One run of the VM controller on podman: VMs Active, then the burst of CPU edits (each a
/// resize: the container is created again with the new limit).
async fn vm_burst(cluster: &Cluster, via_proxy: &Client, wait: Option<Duration>) -> (u64, u64) {
    let admin = cluster.client().await.unwrap();
    let phase = if wait.is_some() { "on" } else { "off" };
    let ns = cluster
        .new_namespace(&format!("ryw-vm-{phase}"))
        .await
        .unwrap();
    let _cleanup = ContainerCleanup(ns.clone());
    let driver_config = DockerDriverConfig::from_env();
    let docker = Docker::connect_with_host(&driver_config.host).unwrap();
    let vms: Api<VirtualMachine> = Api::namespaced(admin.clone(), &ns);
    for i in 0..OBJECTS {
        let vm = VirtualMachine::namespaced(&ns, &format!("vm-{i}"), "100m", "32Mi");
        vms.create(&PostParams::default(), &vm).await.unwrap();
    }
    let shutdown = CancellationToken::new();
    // A refresh soon after each reconcile, as a controller that polls its engine often does:
    // the edits queue all 50 VMs behind 2 workers, so an edit's reconcile comes late enough for
    // the slow informer; a refresh 250 ms after a status write does not.
    let config = VmControllerConfig {
        namespace: Some(ns.clone()),
        freshness_wait: wait,
        refresh_interval: Duration::from_millis(250),
        ..Default::default()
    };
    let controller = tokio::spawn(vm::run(
        via_proxy.clone(),
        DockerDriver::new(driver_config),
        config,
        shutdown.clone(),
        None::<kubeloop::leaderelection::LeaderElector<LeaseLock>>,
    ));
    eventually("every VM Active", WAIT, || {
        vms_served(&vms, &docker, &ns, 100)
    })
    .await;

    let resources = ["virtualmachines"];
    let before = figures(&admin, &resources, vm::CONTROLLER_NAME).await;
    for i in 0..OBJECTS {
        for edition in 1..=EDITS {
            let cpu = format!("{}m", 100 + 100 * edition);
            let patch = serde_json::json!({"spec": {"resource": {"cpu": cpu}}});
            let params = PatchParams::default();
            vms.patch(&format!("vm-{i}"), &params, &Patch::Merge(&patch))
                .await
                .unwrap();
        }
    }
    let last = 100 + 100 * i64::from(EDITS);
    eventually("every VM resized", WAIT, || {
        vms_served(&vms, &docker, &ns, last)
    })
    .await;
    let burst = since(before, &admin, &resources, vm::CONTROLLER_NAME).await;
    // The finalizer: the VMs go with their containers before the controller stops.
    vms.delete_collection(&Default::default(), &Default::default())
        .await
        .unwrap();
    eventually("every VM gone", WAIT, || async {
        vms.list(&Default::default())
            .await
            .unwrap()
            .items
            .is_empty()
    })
    .await;
    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(60), controller)
        .await
        .expect("the controller stops")
        .unwrap()
        .expect("the controller ran without error");
    burst
}

/// Both runs' figures printed; 0 stale starts with read-your-writes on, some without.
fn report(controller: &str, off: (u64, u64), on: (u64, u64)) {
    println!(
        "{controller}, {OBJECTS} objects, {} edits, watch events {WATCH_DELAY:?} late:\n  \
         read-your-writes off: {} conflicts (409), {} stale reconciles\n  \
         read-your-writes on:  {} conflicts (409), {} stale reconciles",
        OBJECTS as i32 * EDITS,
        off.0,
        off.1,
        on.0,
        on.1
    );
    assert!(
        off.1 > 0,
        "{controller}: with read-your-writes off some reconciles should start stale: the burst did not exercise it"
    );
    assert_eq!(
        on.1, 0,
        "{controller}: with read-your-writes on none starts stale"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_sync_starts_on_a_cache_older_than_its_own_writes_with_read_your_writes_on() {
    let cluster = testenv::shared().await;
    let crd: CustomResourceDefinition =
        serde_saphyr::from_str(CRD_YAML).expect("crds/foo.yaml parses");
    testenv::ensure_crd(&cluster.client().await.unwrap(), &crd).await;
    let (_proxy, via_proxy) = slow_watches(cluster).await;
    let off = sample_burst(cluster, &via_proxy, None).await;
    let on = sample_burst(cluster, &via_proxy, Some(DEFAULT_FRESHNESS_WAIT)).await;
    report(sample::CONTROLLER_NAME, off, on);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_vm_reconcile_starts_on_a_cache_older_than_its_own_writes_with_read_your_writes_on() {
    let cluster = testenv::shared().await;
    install_crd(cluster).await;
    let (_proxy, via_proxy) = slow_watches(cluster).await;
    let off = vm_burst(cluster, &via_proxy, None).await;
    let on = vm_burst(cluster, &via_proxy, Some(DEFAULT_FRESHNESS_WAIT)).await;
    report(vm::CONTROLLER_NAME, off, on);
}
