//! The command line both controllers share (cli/src/cmd/common.rs), run for real: the Go
//! controllers' command lines, typed as their READMEs and the articles type them
//! (`-kubeconfig=PATH -v=3 -logtostderr`), start `kubeloop sample-controller` and
//! `kubeloop vm-controller` against the real local apiserver (testenv: etcd + kube-apiserver);
//! and, as client-go's `SetupSignalHandler` does, a first SIGTERM starts the graceful drain
//! while a second one exits at once with status 1.
//!
//! A drain that lasts long enough to be interrupted comes from real work, not a stand-in: many
//! objects exist before the controller starts, it runs one worker, and its first SIGTERM comes
//! as soon as its caches have synced, so the queue still holds most of them. That the second
//! signal really cut the drain short is checked on the apiserver: fewer objects were handled
//! than exist.

// `foo` is the resource under test, not a placeholder name.
#![allow(clippy::disallowed_names)]

use std::path::Path;
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::Deployment;
use kube_client::api::{Api, ListParams, PostParams};
use kubeloop::controller::sample::{Foo, FooSpec};
use kubeloop::controller::vm::{Phase, VirtualMachine};
use kubeloop_testenv::{self as testenv, Cluster, Kubeloop, ManagedProcess};

const FOO_CRD: &str = include_str!("../../crds/foo.yaml");
const VM_CRD: &str = include_str!("../../crds/virtualmachine.yaml");
/// Objects waiting when the controller starts: with one worker and two or three API calls
/// each, seconds of draining, against the tens of milliseconds the test takes to send its
/// second signal.
const OBJECTS: usize = 200;

/// Creates `OBJECTS` objects made by `object(i)`, a few requests at a time.
async fn create_many<K>(api: &Api<K>, object: impl Fn(usize) -> K)
where
    K: kube_client::Resource
        + Clone
        + serde::Serialize
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    futures::stream::iter((0..OBJECTS).map(object))
        .map(|obj| async move { api.create(&PostParams::default(), &obj).await.map(|_| ()) })
        .buffer_unordered(8)
        .try_collect::<Vec<()>>()
        .await
        .expect("creating the test objects");
}

/// `kubeloop <args>` in the background, its log in the cluster's directory. The verbosity
/// comes from the command line (-v=3), not from the environment.
fn spawn_controller(cluster: &Cluster, name: &str, args: &[&str]) -> ManagedProcess {
    Kubeloop::new(args)
        .name(&format!("cli-{name}"))
        .env_remove("RUST_LOG")
        .log_in(cluster)
        .start()
}

/// SIGTERM, wait until the first one is handled, SIGTERM again; returns the exit code,
/// which must come within 10 s of the second signal.
async fn sigterm_twice(controller: &mut ManagedProcess) -> Option<i32> {
    controller.signal(libc::SIGTERM);
    controller
        .wait_for_line(
            &["shutting down: finishing queued work"],
            Duration::from_secs(10),
        )
        .await;
    controller.signal(libc::SIGTERM);
    controller.wait(Duration::from_secs(10)).await.code()
}

fn started_from_the_kubeconfig_flag(log: &str, kubeconfig: &Path) {
    let line = log
        .lines()
        .find(|l| l.contains("cluster configuration"))
        .unwrap_or_else(|| panic!("no cluster configuration line; log:\n{log}"));
    assert!(
        line.contains(&format!("--kubeconfig {}", kubeconfig.display())),
        "{line}"
    );
}

#[tokio::test]
async fn sample_controller_takes_the_go_readme_command_line_and_a_second_sigterm_exits_1() {
    let cluster = testenv::shared().await;
    let client = cluster.client().await.unwrap();
    testenv::ensure_crd(
        &client,
        &serde_saphyr::from_str(FOO_CRD).expect("crds/foo.yaml parses"),
    )
    .await;
    let ns = cluster.new_namespace("cli-sample").await.unwrap();
    let foos: Api<Foo> = Api::namespaced(client.clone(), &ns);
    create_many(&foos, |i| {
        let spec = FooSpec {
            deployment_name: format!("web-{i}"),
            replicas: Some(1),
        };
        Foo::namespaced(&ns, &format!("foo-{i}"), spec)
    })
    .await;

    // sample-controller's README: `./sample-controller -kubeconfig=$HOME/.kube/config -v=3
    // -logtostderr`, plus one worker and the test's namespace, in Go's one-dash spelling too.
    let kubeconfig = format!("-kubeconfig={}", cluster.kubeconfig_path().display());
    let mut controller = spawn_controller(
        cluster,
        &ns,
        &[
            "sample-controller",
            &kubeconfig,
            "-v=3",
            "-logtostderr",
            "-namespace",
            &ns,
            "-workers=1",
        ],
    );
    controller
        .wait_for_line(&["starting workers"], Duration::from_secs(60))
        .await;
    started_from_the_kubeconfig_flag(&controller.log(), cluster.kubeconfig_path());

    let code = sigterm_twice(&mut controller).await;
    let log = controller.log();
    assert_eq!(
        code,
        Some(1),
        "exit status 1 after the second SIGTERM; log:\n{log}"
    );
    assert!(
        log.contains("received SIGTERM again, exiting at once"),
        "log:\n{log}"
    );
    // -v=3 is info: no debug lines.
    assert!(!log.contains(" DEBUG "), "log:\n{log}");
    let deployments: Api<Deployment> = Api::namespaced(client, &ns);
    let made = deployments
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .len();
    assert!(
        made < OBJECTS,
        "the second SIGTERM cut the drain short: {made} of {OBJECTS} Foos got their Deployment"
    );
}

#[tokio::test]
async fn vm_controller_takes_go_style_flags_and_a_second_sigterm_exits_1() {
    let cluster = testenv::shared().await;
    let client = cluster.client().await.unwrap();
    testenv::ensure_crd(
        &client,
        &serde_saphyr::from_str(VM_CRD).expect("crds/virtualmachine.yaml parses"),
    )
    .await;
    let ns = cluster.new_namespace("cli-vm").await.unwrap();
    let vms: Api<VirtualMachine> = Api::namespaced(client.clone(), &ns);
    create_many(&vms, |i| {
        VirtualMachine::namespaced(&ns, &format!("vm-{i}"), "1", "64Mi")
    })
    .await;

    // controller101's article: `go run cmd/main.go --kubeconfig=$HOME/.kube/config -v=3
    // --logtostderr --leader-elect=false --vm-driver=docker`, with one dash where Go allows
    // it, the fake driver and one worker.
    let kubeconfig = format!("-kubeconfig={}", cluster.kubeconfig_path().display());
    let namespace = format!("-namespace={ns}");
    let mut controller = spawn_controller(
        cluster,
        &ns,
        &[
            "vm-controller",
            &kubeconfig,
            "-v",
            "3",
            "--logtostderr",
            "--leader-elect=false",
            "--vm-driver",
            "fake",
            &namespace,
            "-threads",
            "1",
            "-refresh-interval=1m30s",
        ],
    );
    controller
        .wait_for_line(&["starting workers"], Duration::from_secs(60))
        .await;
    started_from_the_kubeconfig_flag(&controller.log(), cluster.kubeconfig_path());

    let code = sigterm_twice(&mut controller).await;
    let log = controller.log();
    assert_eq!(
        code,
        Some(1),
        "exit status 1 after the second SIGTERM; log:\n{log}"
    );
    assert!(
        log.contains("received SIGTERM again, exiting at once"),
        "log:\n{log}"
    );
    assert!(!log.contains(" DEBUG "), "log:\n{log}");
    let active = vms
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .filter(|vm| vm.status.as_ref().is_some_and(|s| s.phase == Phase::Active))
        .count();
    assert!(
        active < OBJECTS,
        "the second SIGTERM cut the drain short: {active} of {OBJECTS} VMs became Active"
    );
}
