//! The command line both controllers share (src/cmd/common.rs), run for real: the Go
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

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube_client::Client;
use kube_client::api::{Api, ListParams, PostParams};
use kubeloop::controller::sample::{Foo, FooSpec};
use kubeloop::controller::vm::{Phase, VirtualMachine};
use kubeloop::testenv::{self, Cluster};
use tokio::process::{Child, Command};

const FOO_CRD: &str = include_str!("../crds/foo.yaml");
const VM_CRD: &str = include_str!("../crds/virtualmachine.yaml");
/// Objects waiting when the controller starts: with one worker and two or three API calls
/// each, seconds of draining, against the tens of milliseconds the test takes to send its
/// second signal.
const OBJECTS: usize = 200;

/// Creates the CRD in `yaml` (once per cluster) and waits until it is served.
async fn ensure_crd(client: &Client, yaml: &str) {
    let crd: CustomResourceDefinition = serde_saphyr::from_str(yaml).expect("the CRD parses");
    testenv::ensure_crd(client, &crd).await;
}

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

/// A controller process with its stderr in a file.
struct Controller {
    child: Child,
    log: PathBuf,
}

impl Controller {
    fn spawn(cluster: &Cluster, name: &str, args: &[&str]) -> Self {
        let log = cluster
            .dir()
            .join(format!("cli-{name}-{}.log", std::process::id()));
        let file = std::fs::File::create(&log).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_kubeloop"))
            .args(args)
            // The verbosity comes from the command line (-v=3), not from the environment.
            .env_remove("RUST_LOG")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(file)
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        Self { child, log }
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits for a log line holding `needle`; panics with the log if the process exits first
    /// or the line does not come in `limit`.
    async fn wait_for(&mut self, needle: &str, limit: Duration) {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            if self.log_text().contains(needle) {
                return;
            }
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!(
                    "exited ({status}) before logging {needle:?}; log:\n{}",
                    self.log_text()
                );
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "no {needle:?} within {limit:?}; log:\n{}",
                self.log_text()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn sigterm(&self) {
        let pid = self.child.id().expect("still running") as libc::pid_t;
        // SAFETY: signalling the child this test spawned and still owns.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    }

    /// SIGTERM, wait until the first one is handled, SIGTERM again; returns the exit code,
    /// which must come within 10 s of the second signal.
    async fn sigterm_twice(&mut self) -> Option<i32> {
        self.sigterm();
        self.wait_for(
            "shutting down: finishing queued work",
            Duration::from_secs(10),
        )
        .await;
        self.sigterm();
        let status = tokio::time::timeout(Duration::from_secs(10), self.child.wait())
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "still running 10 s after the second SIGTERM; log:\n{}",
                    self.log_text()
                )
            })
            .unwrap();
        status.code()
    }
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
    ensure_crd(&client, FOO_CRD).await;
    let ns = cluster.new_namespace("cli-sample").await.unwrap();
    let foos: Api<Foo> = Api::namespaced(client.clone(), &ns);
    create_many(&foos, |i| {
        let spec = FooSpec {
            deployment_name: format!("web-{i}"),
            replicas: Some(1),
        };
        Foo::new(&ns, &format!("foo-{i}"), spec)
    })
    .await;

    // sample-controller's README: `./sample-controller -kubeconfig=$HOME/.kube/config -v=3
    // -logtostderr`, plus one worker and the test's namespace, in Go's one-dash spelling too.
    let kubeconfig = format!("-kubeconfig={}", cluster.kubeconfig_path().display());
    let mut controller = Controller::spawn(
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
        .wait_for("starting workers", Duration::from_secs(60))
        .await;
    started_from_the_kubeconfig_flag(&controller.log_text(), cluster.kubeconfig_path());

    let code = controller.sigterm_twice().await;
    let log = controller.log_text();
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
    ensure_crd(&client, VM_CRD).await;
    let ns = cluster.new_namespace("cli-vm").await.unwrap();
    let vms: Api<VirtualMachine> = Api::namespaced(client.clone(), &ns);
    create_many(&vms, |i| {
        VirtualMachine::new(&ns, &format!("vm-{i}"), "1", "64Mi")
    })
    .await;

    // controller101's article: `go run cmd/main.go --kubeconfig=$HOME/.kube/config -v=3
    // --logtostderr --leader-elect=false --vm-driver=docker`, with one dash where Go allows
    // it, the fake driver and one worker.
    let kubeconfig = format!("-kubeconfig={}", cluster.kubeconfig_path().display());
    let namespace = format!("-namespace={ns}");
    let mut controller = Controller::spawn(
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
        .wait_for("starting workers", Duration::from_secs(60))
        .await;
    started_from_the_kubeconfig_flag(&controller.log_text(), cluster.kubeconfig_path());

    let code = controller.sigterm_twice().await;
    let log = controller.log_text();
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
