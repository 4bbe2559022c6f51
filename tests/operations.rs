//! Operations, checked against the real local control plane (RBAC on, service-account tokens
//! signed by the apiserver's key):
//! - deploy/ passes `kubectl apply --server-side --dry-run=server`, and every flag its Deployments pass is one
//!   the binary accepts;
//! - each controller runs as its ServiceAccount from deploy/, with a token from the
//!   TokenRequest API (`kubectl create token`), and does its job with exactly those rights;
//! - with one right removed, it reports an error naming that right instead of staying silent;
//! - the sample controller's /metrics shows the workqueue, reflector and handler-backlog series
//!   moving as Foos are processed (and client-go 1.36's `informer_*` series under the
//!   controller's informer name), and /healthz and /readyz answer.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use kubeloop::testing::eventually_blocking as eventually;
use kubeloop_testenv::{self as testenv, Cluster, Kubeloop, ManagedProcess};

const DEPLOY_NS: &str = "kubeloop-system";
/// The VM controller's namespace: its pods mount the node's engine socket, which Pod Security
/// allows only in a `privileged` namespace, so it has one of its own (deploy/00-namespace.yaml).
const VM_NS: &str = "kubeloop-vm-system";

/// The namespace of deploy/'s ServiceAccount `sa` (or of a renamed variant of it).
fn namespace_of(sa: &str) -> &'static str {
    if sa.starts_with("vm-controller") {
        VM_NS
    } else {
        DEPLOY_NS
    }
}
const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// CRDs installed and served; deploy/'s namespace exists. Once per test binary (concurrent
/// `kubectl apply`s of a new object race to create it).
fn install_crds_and_namespace(cluster: &Cluster) {
    static INSTALLED: std::sync::OnceLock<()> = std::sync::OnceLock::new();
    INSTALLED.get_or_init(|| {
        cluster
            .kubectl(&["apply", "-f", "crds/", "-f", "deploy/00-namespace.yaml"])
            .ok();
        cluster
            .kubectl(&[
                "wait",
                "--for",
                "condition=established",
                "--timeout=60s",
                "crd/foos.samplecontroller.k8s.io",
                "crd/virtualmachines.cloudnative.tw",
            ])
            .ok();
    });
}

/// deploy/'s RBAC and admission policy for the sample controller's ServiceAccount.
fn apply_sample_controller_rights(cluster: &Cluster) {
    cluster
        .kubectl(&[
            "apply",
            "-f",
            "deploy/sample-controller-rbac.yaml",
            "-f",
            "deploy/sample-controller-admission.yaml",
        ])
        .ok();
}

fn deploy_file(name: &str) -> String {
    std::fs::read_to_string(Path::new(ROOT).join("deploy").join(name)).unwrap()
}

/// deploy/'s RBAC for one controller with its ServiceAccount and roles renamed (so variants
/// with a right removed can live next to the real one), passed through `edit`.
fn rbac_variant(
    file: &str,
    sa: &str,
    suffix: &str,
    edit: impl Fn(String) -> String,
) -> (String, String) {
    let text = deploy_file(file);
    let renamed_sa = format!("{sa}{suffix}");
    let text = text
        .replace(&format!("name: {sa}\n"), &format!("name: {renamed_sa}\n"))
        .replace(&format!("kubeloop:{sa}"), &format!("kubeloop:{sa}{suffix}"));
    (edit(text), renamed_sa)
}

/// Applies a variant of deploy/`file` for a renamed ServiceAccount (`<sa><suffix>`) and returns
/// that account's name, a scratch directory and a kubeconfig with its token.
fn restricted_identity(
    cluster: &Cluster,
    file: &str,
    sa: &str,
    suffix: &str,
    edit: impl Fn(String) -> String,
) -> (String, PathBuf, PathBuf) {
    let (rbac, sa) = rbac_variant(file, sa, suffix, edit);
    cluster
        .kubectl_stdin(&["apply", "-f", "-"], Some(&rbac))
        .ok();
    let dir = tempdir(&format!("{sa}-dir"));
    let kubeconfig = service_account_kubeconfig(cluster, &sa, &dir);
    (sa, dir, kubeconfig)
}

/// An edit that replaces one rule's verb list, failing loudly if deploy/ no longer has it.
fn replace_verbs(
    file: &'static str,
    from: &'static str,
    to: &'static str,
) -> impl Fn(String) -> String {
    move |text: String| {
        let edited = text.replace(from, to);
        assert_ne!(
            edited, text,
            "deploy/{file} no longer has the rule `{from}` this test edits"
        );
        edited
    }
}

/// A kubeconfig for the apiserver of `cluster` that authenticates with a token of the
/// ServiceAccount `sa` in deploy/'s namespace, from the TokenRequest API.
fn service_account_kubeconfig(cluster: &Cluster, sa: &str, dir: &Path) -> PathBuf {
    let token = cluster
        .kubectl(&[
            "create",
            "token",
            sa,
            "-n",
            namespace_of(sa),
            "--duration=1h",
        ])
        .ok();
    let server = cluster
        .kubectl(&[
            "config",
            "view",
            "--raw",
            "--minify",
            "-o",
            "jsonpath={.clusters[0].cluster.server}",
        ])
        .ok();
    let ca = cluster
        .kubectl(&[
            "config",
            "view",
            "--raw",
            "--minify",
            "-o",
            "jsonpath={.clusters[0].cluster.certificate-authority-data}",
        ])
        .ok();
    let ca_line = if ca.trim().is_empty() {
        let path = cluster
            .kubectl(&[
                "config",
                "view",
                "--raw",
                "--minify",
                "-o",
                "jsonpath={.clusters[0].cluster.certificate-authority}",
            ])
            .ok();
        format!("certificate-authority: {}", path.trim())
    } else {
        format!("certificate-authority-data: {}", ca.trim())
    };
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: local\n  cluster:\n    server: {server}\n    {ca_line}\n\
         users:\n- name: {sa}\n  user:\n    token: {token}\ncontexts:\n- name: {sa}\n  context:\n    cluster: local\n    user: {sa}\n\
         current-context: {sa}\n",
        server = server.trim(),
        token = token.trim(),
    );
    let path = dir.join(format!("{sa}.kubeconfig"));
    std::fs::write(&path, text).unwrap();
    path
}

/// `kubeloop <args>` in the background, logging at `$OPS_TEST_RUST_LOG` (default info), with
/// no container engine (these tests check operations, not VMs).
fn start_controller(args: &[&str]) -> ManagedProcess {
    Kubeloop::new(args)
        .env(
            "RUST_LOG",
            std::env::var("OPS_TEST_RUST_LOG").unwrap_or("info".into()),
        )
        .env("DOCKER_HOST", "unix:///nonexistent/engine.sock")
        .start()
}

fn http_get(addr: &str, path: &str) -> (u16, String) {
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut raw = String::new();
    stream.read_to_string(&mut raw).unwrap();
    let status = raw[9..12].parse().unwrap();
    let body = raw
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (status, body)
}

/// The value of the sample whose line starts with `series` (name and labels), if any.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| {
        l.strip_prefix(series)
            .and_then(|rest| rest.trim().split(' ').next()?.parse().ok())
    })
}

fn tempdir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kubeloop-ops-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn foo_yaml(name: &str, replicas: u32) -> String {
    format!(
        "apiVersion: samplecontroller.k8s.io/v1alpha1\nkind: Foo\nmetadata:\n  name: {name}\nspec:\n  deploymentName: {name}\n  replicas: {replicas}\n"
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn deploy_manifests_pass_a_server_side_dry_run() {
    let cluster = testenv::shared_full().await;
    install_crds_and_namespace(cluster);
    let out = cluster
        .kubectl(&[
            "apply",
            "--server-side",
            "--field-manager=kubeloop-deploy",
            "--dry-run=server",
            "-f",
            "deploy/",
        ])
        .ok();
    for object in [
        "namespace/kubeloop-system",
        "serviceaccount/sample-controller",
        "clusterrole.rbac.authorization.k8s.io/kubeloop:sample-controller",
        "clusterrolebinding.rbac.authorization.k8s.io/kubeloop:sample-controller",
        "validatingadmissionpolicy.admissionregistration.k8s.io/kubeloop-sample-controller-foo-deployments",
        "validatingadmissionpolicybinding.admissionregistration.k8s.io/kubeloop-sample-controller-foo-deployments",
        "deployment.apps/sample-controller",
        "namespace/kubeloop-vm-system",
        "serviceaccount/vm-controller",
        "clusterrole.rbac.authorization.k8s.io/kubeloop:vm-controller",
        "clusterrolebinding.rbac.authorization.k8s.io/kubeloop:vm-controller",
        "role.rbac.authorization.k8s.io/kubeloop:vm-controller:leader-election",
        "rolebinding.rbac.authorization.k8s.io/kubeloop:vm-controller:leader-election",
        "deployment.apps/vm-controller",
        "clusterrole.rbac.authorization.k8s.io/kubeloop:metrics-auth",
        "clusterrolebinding.rbac.authorization.k8s.io/kubeloop:metrics-auth",
        "clusterrole.rbac.authorization.k8s.io/kubeloop:metrics-reader",
        "service/sample-controller-metrics",
        "service/vm-controller-metrics",
        "networkpolicy.networking.k8s.io/kubeloop-controllers",
    ] {
        assert!(
            out.lines()
                .any(|l| l.starts_with(object) && l.ends_with("(server dry run)")),
            "{object} missing from:\n{out}"
        );
    }
    // The VM controller's Deployment: two replicas, downward-API identity.
    let vm = cluster.kubectl(&[
            "apply",
            "--dry-run=server",
            "-f",
            "deploy/vm-controller.yaml",
            "-o",
            "jsonpath={.spec.replicas} {.spec.template.spec.containers[0].env[*].valueFrom.fieldRef.fieldPath}",
        ]).ok();
    assert_eq!(vm.trim(), "2 metadata.name metadata.namespace");
    // The sharded variant (applied instead of deploy/vm-controller.yaml).
    let sharded = cluster
        .kubectl(&["apply", "--dry-run=server", "-f", "deploy/sharded/"])
        .ok();
    for object in [
        "role.rbac.authorization.k8s.io/kubeloop:vm-controller:shards",
        "rolebinding.rbac.authorization.k8s.io/kubeloop:vm-controller:shards",
        "validatingadmissionpolicy.admissionregistration.k8s.io/kubeloop-vm-controller-ring-leases",
        "validatingadmissionpolicybinding.admissionregistration.k8s.io/kubeloop-vm-controller-ring-leases",
        "deployment.apps/vm-controller",
    ] {
        assert!(
            sharded
                .lines()
                .any(|l| l.starts_with(object) && l.ends_with("(server dry run)")),
            "{object} missing from:\n{sharded}"
        );
    }
}

/// Every `--flag` a Deployment in deploy/ passes must be one `kubeloop <subcommand>` knows,
/// or the pod crash-loops on an unknown argument.
#[test]
fn every_flag_in_the_deployments_is_one_the_binary_accepts() {
    let mut missing = Vec::new();
    for file in [
        "sample-controller.yaml",
        "vm-controller.yaml",
        "sharded/vm-controller.yaml",
    ] {
        let text = deploy_file(file);
        let args: Vec<&str> = text
            .lines()
            .skip_while(|l| l.trim() != "args:")
            .skip(1)
            .take_while(|l| l.trim_start().starts_with("- "))
            .map(|l| l.trim_start().trim_start_matches("- ").trim())
            .collect();
        let subcommand = args[0];
        let help = Kubeloop::new([subcommand, "--help"]).output();
        let help = String::from_utf8_lossy(&help.stdout).into_owned();
        assert!(
            help.contains("Usage"),
            "kubeloop {subcommand} --help: {help}"
        );
        for arg in &args[1..] {
            let flag = arg.split('=').next().unwrap();
            if !help.contains(&format!("{flag} "))
                && !help.contains(&format!("{flag}["))
                && !help.contains(&format!("{flag} <"))
            {
                missing.push(format!("{file}: kubeloop {subcommand} has no {flag}"));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "flags in deploy/ the binary does not accept:\n{}",
        missing.join("\n")
    );
}

/// The sample controller as deploy/'s ServiceAccount: creates and scales the Deployment,
/// writes status and Events; its /metrics moves with the work and its probes answer.
#[tokio::test(flavor = "multi_thread")]
async fn the_sample_controller_works_as_its_service_account_and_its_metrics_move() {
    let cluster = testenv::shared_full().await;
    install_crds_and_namespace(cluster);
    apply_sample_controller_rights(cluster);
    let ns = cluster.new_namespace("ops-sample").await.unwrap();
    let dir = tempdir("sample");
    let kubeconfig = service_account_kubeconfig(cluster, "sample-controller", &dir);
    let whoami = cluster
        .kubectl(&[
            "--kubeconfig",
            kubeconfig.to_str().unwrap(),
            "auth",
            "whoami",
            "-o",
            "jsonpath={.status.userInfo.username}",
        ])
        .ok();
    assert_eq!(
        whoami,
        "system:serviceaccount:kubeloop-system:sample-controller"
    );

    let mut controller = start_controller(&[
        "sample-controller",
        "--kubeconfig",
        kubeconfig.to_str().unwrap(),
        "--namespace",
        &ns,
        "--metrics-bind-address",
        "127.0.0.1:0",
        // Plain HTTP: this test is about the controller's work and series, not the
        // metrics auth (tests/ops_secure_serving.rs).
        "--metrics-secure=false",
        "--health-probe-bind-address",
        "127.0.0.1:0",
    ]);
    let line = controller.wait_for_line_blocking(&["serving metrics"], Duration::from_secs(30));
    let addr = line
        .split("addr=")
        .nth(1)
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .to_owned();
    eventually("/readyz ok", Duration::from_secs(30), || {
        (http_get(&addr, "/readyz").0 == 200).then_some(())
    });
    assert_eq!(http_get(&addr, "/healthz"), (200, "ok".to_string()));
    let (_, before) = http_get(&addr, "/metrics");
    let adds_before = sample(&before, r#"workqueue_adds_total{name="Foos"}"#).unwrap_or(0.0);
    assert!(
        before.contains("kubeloop_reflector_lists_total"),
        "reflector series:\n{before}"
    );
    assert!(
        before.contains("kubeloop_informer_handler_backlog"),
        "handler backlog series:\n{before}"
    );
    let events_before: f64 = before
        .lines()
        .filter(|l| l.starts_with("kubeloop_reflector_watch_events_total"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();

    // One Foo, then a scale-up: the Deployment follows and the status is written.
    cluster
        .kubectl_stdin(&["apply", "-n", &ns, "-f", "-"], Some(&foo_yaml("web", 1)))
        .ok();
    eventually("Deployment web available", Duration::from_secs(60), || {
        cluster
            .kubectl(&[
                "get",
                "deployment",
                "web",
                "-n",
                &ns,
                "-o",
                "jsonpath={.status.availableReplicas}",
            ])
            .result()
            .ok()
            .filter(|s| s == "1")
    });
    cluster
        .kubectl(&[
            "patch",
            "foo",
            "web",
            "-n",
            &ns,
            "--type",
            "merge",
            "-p",
            r#"{"spec":{"replicas":2}}"#,
        ])
        .ok();
    eventually(
        "Foo web status availableReplicas 2",
        Duration::from_secs(60),
        || {
            cluster
                .kubectl(&[
                    "get",
                    "foo",
                    "web",
                    "-n",
                    &ns,
                    "-o",
                    "jsonpath={.status.availableReplicas}",
                ])
                .result()
                .ok()
                .filter(|s| s == "2")
        },
    );
    eventually(
        "a Synced Event for Foo web",
        Duration::from_secs(30),
        || {
            cluster
                .kubectl(&[
                    "get",
                    "events",
                    "-n",
                    &ns,
                    "--field-selector",
                    "involvedObject.name=web,reason=Synced",
                    "-o",
                    "name",
                ])
                .result()
                .ok()
                .filter(|s| !s.trim().is_empty())
        },
    );
    let owner = cluster
        .kubectl(&[
            "get",
            "deployment",
            "web",
            "-n",
            &ns,
            "-o",
            "jsonpath={.metadata.ownerReferences[0].kind}/{.metadata.ownerReferences[0].name}",
        ])
        .ok();
    assert_eq!(
        owner, "Foo/web",
        "the Deployment is the controller's, owned by the Foo"
    );

    let (_, after) = http_get(&addr, "/metrics");
    let adds_after = sample(&after, r#"workqueue_adds_total{name="Foos"}"#).unwrap();
    // The priority queue's depth goes by priority, a series for each priority it has seen.
    assert!(
        sample(&after, r#"workqueue_depth{name="Foos",priority="0"}"#).is_some(),
        "workqueue_depth for Foos by priority:\n{after}"
    );
    assert!(
        adds_after >= adds_before + 3.0,
        "workqueue_adds_total{{name=\"Foos\"}} {adds_before} -> {adds_after}"
    );
    let events_after: f64 = after
        .lines()
        .filter(|l| l.starts_with("kubeloop_reflector_watch_events_total"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert!(
        events_after > events_before,
        "watch events {events_before} -> {events_after}"
    );
    assert!(
        sample(
            &after,
            r#"workqueue_work_duration_seconds_count{name="Foos"}"#
        )
        .unwrap_or(0.0)
            >= 3.0,
        "work duration observed per processed key:\n{after}"
    );
    // client-go 1.36's informer series, named after the controller (component-base's names
    // and labels).
    for (resource, group, version) in [
        ("foos", "samplecontroller.k8s.io", "v1alpha1"),
        ("deployments", "apps", "v1"),
    ] {
        let labels = format!(
            r#"{{name="sample-controller",group="{group}",version="{version}",resource="{resource}"}}"#
        );
        let rv = sample(&after, &format!("informer_store_resource_version{labels}"));
        assert!(
            rv.is_some_and(|rv| rv > 0.0),
            "informer_store_resource_version{labels}:\n{after}"
        );
        let queued = sample(&after, &format!("informer_queued_items{labels}"));
        assert!(queued.is_some(), "informer_queued_items{labels}:\n{after}");
        let processed = sample(
            &after,
            &format!("informer_processing_latency_seconds_count{labels}"),
        );
        assert!(
            processed.is_some_and(|n| n >= 1.0),
            "informer_processing_latency_seconds_count{labels}:\n{after}"
        );
    }
    assert!(
        !controller.log().contains("forbidden"),
        "deploy/'s rights were enough:\n{}",
        controller.log()
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// Without `create` on deployments the sample controller says so, naming the verb and the
/// resource, instead of waiting silently.
#[tokio::test(flavor = "multi_thread")]
async fn the_sample_controller_without_deployments_create_names_the_missing_right() {
    let cluster = testenv::shared_full().await;
    install_crds_and_namespace(cluster);
    let edit = replace_verbs(
        "sample-controller-rbac.yaml",
        r#"verbs: ["list", "watch", "create", "update"]"#,
        r#"verbs: ["list", "watch", "update"]"#,
    );
    let needles = ["forbidden", "cannot create resource", "deployments"];
    let (sa, ns, line) =
        sample_controller_missing_a_right(cluster, "-no-create", edit, &needles).await;
    assert!(line.contains(&sa), "the error names the identity: {line}");
    assert!(
        line.contains(&format!("key={ns}/web")),
        "the error line carries the Foo's key: {line}"
    );
}

/// Runs the sample controller as a variant of deploy/'s ServiceAccount (`<sa><suffix>`, its
/// RBAC passed through `edit`) in a fresh namespace with one Foo, and waits for the log line
/// with every one of `needles`. Returns the account, the namespace and the line.
async fn sample_controller_missing_a_right(
    cluster: &Cluster,
    suffix: &str,
    edit: impl Fn(String) -> String,
    needles: &[&str],
) -> (String, String, String) {
    let (sa, dir, kubeconfig) = restricted_identity(
        cluster,
        "sample-controller-rbac.yaml",
        "sample-controller",
        suffix,
        edit,
    );
    let ns = cluster
        .new_namespace(&format!("ops-sample{suffix}"))
        .await
        .unwrap();
    let mut controller = start_controller(&[
        "sample-controller",
        "--kubeconfig",
        kubeconfig.to_str().unwrap(),
        "--namespace",
        &ns,
    ]);
    cluster
        .kubectl_stdin(&["apply", "-n", &ns, "-f", "-"], Some(&foo_yaml("web", 1)))
        .ok();
    let line = controller.wait_for_line_blocking(needles, Duration::from_secs(30));
    eprintln!("the controller said: {line}");
    let _ = std::fs::remove_dir_all(dir);
    (sa, ns, line)
}

/// Without watch on foos the informer cannot sync (its streaming list is a watch, and so is
/// what follows a LIST); the controller must say which right it lacks rather than wait for a
/// sync that never comes. (Without list alone it syncs: the apiserver authorizes a streaming
/// list, client-go 1.36's default and kubeloop's, with the watch verb.)
#[tokio::test(flavor = "multi_thread")]
async fn the_sample_controller_without_foos_watch_names_the_missing_right() {
    let cluster = testenv::shared_full().await;
    install_crds_and_namespace(cluster);
    let (_, dir, kubeconfig) = restricted_identity(
        cluster,
        "sample-controller-rbac.yaml",
        "sample-controller",
        "-no-watch",
        replace_verbs(
            "sample-controller-rbac.yaml",
            r#"verbs: ["get", "list", "watch"]"#,
            r#"verbs: ["get", "list"]"#,
        ),
    );
    let mut controller = start_controller(&[
        "sample-controller",
        "--kubeconfig",
        kubeconfig.to_str().unwrap(),
    ]);
    let line = controller.wait_for_line_blocking(
        &["forbidden", "cannot watch resource", "foos"],
        Duration::from_secs(30),
    );
    eprintln!("the controller said: {line}");
    let _ = std::fs::remove_dir_all(dir);
}

/// The VM controller as deploy/'s ServiceAccount: takes the Lease in its namespace (the Role
/// limited to that Lease), finalizes and activates a VM, records Events.
#[tokio::test(flavor = "multi_thread")]
async fn the_vm_controller_works_as_its_service_account_with_leader_election() {
    let cluster = testenv::shared_full().await;
    install_crds_and_namespace(cluster);
    cluster
        .kubectl(&["apply", "-f", "deploy/vm-controller-rbac.yaml"])
        .ok();
    let ns = cluster.new_namespace("ops-vm").await.unwrap();
    let dir = tempdir("vm");
    let kubeconfig = service_account_kubeconfig(cluster, "vm-controller", &dir);
    let mut controller = start_controller(&[
        "vm-controller",
        "--kubeconfig",
        kubeconfig.to_str().unwrap(),
        "--vm-driver",
        "fake",
        "--namespace",
        &ns,
        "--holder-identity",
        "ops-test-replica",
        "--lease-lock-namespace",
        VM_NS,
        "--refresh-interval",
        "1s",
        "--metrics-bind-address",
        "127.0.0.1:0",
        // Plain HTTP: this test is about the controller's work and series, not the
        // metrics auth (tests/ops_secure_serving.rs).
        "--metrics-secure=false",
        "--health-probe-bind-address",
        "127.0.0.1:0",
    ]);
    let line = controller.wait_for_line_blocking(&["serving metrics"], Duration::from_secs(30));
    let addr = line
        .split("addr=")
        .nth(1)
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .to_owned();
    eventually(
        "Lease kubeloop-vm-system/controller101 held by the test replica",
        Duration::from_secs(30),
        || {
            cluster
                .kubectl(&[
                    "get",
                    "lease",
                    "controller101",
                    "-n",
                    VM_NS,
                    "-o",
                    "jsonpath={.spec.holderIdentity}",
                ])
                .result()
                .ok()
                .filter(|h| h == "ops-test-replica")
        },
    );
    cluster
        .kubectl_stdin(&["apply", "-n", &ns, "-f", "examples/test-vm.yaml"], None)
        .ok();
    eventually(
        "VM test-vm Active with usage",
        Duration::from_secs(60),
        || {
            cluster
                .kubectl(&[
                    "get",
                    "vm",
                    "test-vm",
                    "-n",
                    &ns,
                    "-o",
                    "jsonpath={.status.phase} {.status.server.usage.cpu}",
                ])
                .result()
                .ok()
                .filter(|s| s.starts_with("Active ") && s.len() > "Active ".len())
        },
    );
    // The leader's probes and series: ready once its informer synced, healthy while it renews,
    // and every family docs/metrics.md names present for the VM
    // controller too.
    assert_eq!(
        http_get(&addr, "/readyz").0,
        200,
        "/readyz of the leader with a synced informer"
    );
    let (status, health) = http_get(&addr, "/healthz?verbose");
    assert_eq!(status, 200, "{health}");
    assert!(health.contains("[+]leaderElection ok"), "{health}");
    let (_, metrics) = http_get(&addr, "/metrics");
    for series in [
        r#"workqueue_adds_total{name="virtualmachines"}"#,
        r#"controller_runtime_reconcile_total{controller="vm-controller",result="#,
        "kubeloop_reflector_lists_total",
        "kubeloop_informer_handler_backlog",
        "leader_election_master_status",
        r#"informer_queued_items{name="vm-controller",group="cloudnative.tw",version="v1alpha1",resource="virtualmachines"}"#,
        r#"informer_store_resource_version{name="vm-controller","#,
        r#"informer_processing_latency_seconds_count{name="vm-controller","#,
    ] {
        assert!(
            metrics.lines().any(|l| l.starts_with(series)),
            "{series} missing from:\n{metrics}"
        );
    }
    assert!(
        sample(&metrics, r#"workqueue_adds_total{name="virtualmachines"}"#).unwrap_or(0.0) >= 1.0,
        "the VM was queued:\n{metrics}"
    );
    let finalizers = cluster
        .kubectl(&[
            "get",
            "vm",
            "test-vm",
            "-n",
            &ns,
            "-o",
            "jsonpath={.metadata.finalizers}",
        ])
        .ok();
    assert!(!finalizers.is_empty(), "the controller added its finalizer");
    eventually("an Event for test-vm", Duration::from_secs(30), || {
        cluster
            .kubectl(&[
                "get",
                "events",
                "-n",
                &ns,
                "--field-selector",
                "involvedObject.name=test-vm",
                "-o",
                "name",
            ])
            .result()
            .ok()
            .filter(|s| !s.trim().is_empty())
    });
    cluster
        .kubectl(&["delete", "vm", "test-vm", "-n", &ns, "--wait=false"])
        .ok();
    eventually(
        "test-vm finalized and gone",
        Duration::from_secs(60),
        || {
            cluster
                .kubectl(&["get", "vm", "test-vm", "-n", &ns])
                .result()
                .ok()
                .is_none()
                .then_some(())
        },
    );
    assert!(
        !controller.log().contains("forbidden"),
        "deploy/'s rights were enough:\n{}",
        controller.log()
    );
    drop(controller);
    let _ = std::fs::remove_dir_all(dir);
}

/// Without the leader-election Role the VM controller names the Lease right it lacks.
#[tokio::test(flavor = "multi_thread")]
async fn the_vm_controller_without_lease_rights_names_the_missing_right() {
    let cluster = testenv::shared_full().await;
    install_crds_and_namespace(cluster);
    let (_, dir, kubeconfig) = restricted_identity(
        cluster,
        "vm-controller-rbac.yaml",
        "vm-controller",
        "-no-lease",
        |text| {
            let kept: Vec<&str> = text
                .split("\n---\n")
                .filter(|doc| {
                    !doc.contains("coordination.k8s.io") && !doc.contains("kind: RoleBinding")
                })
                .collect();
            assert_eq!(
                kept.len(),
                3,
                "ServiceAccount, ClusterRole, ClusterRoleBinding remain"
            );
            kept.join("\n---\n")
        },
    );
    let mut controller = start_controller(&[
        "vm-controller",
        "--kubeconfig",
        kubeconfig.to_str().unwrap(),
        "--vm-driver",
        "fake",
        "--holder-identity",
        "ops-test-no-lease",
        "--lease-lock-namespace",
        VM_NS,
        "--lease-lock-name",
        "ops-no-lease",
    ]);
    let line = controller.wait_for_line_blocking(&["forbidden", "leases"], Duration::from_secs(30));
    eprintln!("the controller said: {line}");
    assert!(
        line.contains("cannot get resource") || line.contains("cannot create resource"),
        "the verb is named: {line}"
    );
    drop(controller);
    let _ = std::fs::remove_dir_all(dir);
}

/// One VM controller replica as `kubeloop vm-controller` would run it once it serves the ops
/// flags: an elector reporting `leader_election_master_status`, its `leaderElection` health
/// check on /healthz, the workqueue series, all on one [`kubeloop_cli::OpsArgs`] server.
async fn vm_replica(
    client: kube_client::Client,
    ns: &str,
    identity: &str,
    stop: tokio_util::sync::CancellationToken,
) -> (
    String,
    tokio::task::JoinHandle<kubeloop::leaderelection::StopReason>,
) {
    use kubeloop::controller::vm::{self, FakeDriver, VmControllerConfig};
    use kubeloop::leaderelection::{
        HealthzAdaptor, LeaderElectionConfig, LeaderElector, LeaderMetricsProvider, LeaseLock,
    };
    use kubeloop::ops::{Check, CheckFn};
    use kubeloop_cli::OpsArgs;

    let provider = LeaderMetricsProvider::new();
    let config = LeaderElectionConfig {
        lease_duration: Duration::from_secs(4),
        renew_deadline: Duration::from_secs(3),
        retry_period: Duration::from_millis(500),
        release_on_cancel: true,
        recontend: false,
        name: format!("{ns}/controller101"),
    };
    let elector = LeaderElector::new(
        config,
        LeaseLock::new(client.clone(), ns, "controller101", identity),
    )
    .unwrap();
    elector.report_metrics_to(&provider);
    let health = HealthzAdaptor::new(Duration::from_secs(10));
    health.set_leader_election(&elector);
    let ops = OpsArgs {
        metrics_bind_address: "127.0.0.1:0".into(),
        health_probe_bind_address: "127.0.0.1:0".into(),
        // Plain HTTP: leader-election series, not the metrics auth, are tested here.
        metrics_secure: false,
        ..Default::default()
    };
    let readyz: Vec<Arc<dyn Check>> = vec![Arc::new(CheckFn::new("ping", || Ok(())))];
    let serving = ops
        .serve(
            || {
                let mut registry = prometheus_client::registry::Registry::default();
                kubeloop::workqueue::MetricsProvider::global().register(&mut registry);
                provider.register(&mut registry);
                registry
            },
            vec![Arc::new(health)],
            readyz,
            None,
            &stop,
        )
        .await
        .unwrap();
    let vm_config = VmControllerConfig {
        namespace: Some(ns.to_string()),
        refresh_interval: Duration::from_secs(1),
        ..Default::default()
    };
    let run = tokio::spawn(async move {
        match vm::run(client, FakeDriver::new(), vm_config, stop, Some(elector)).await {
            Ok(()) => kubeloop::leaderelection::StopReason::Shutdown,
            Err(vm::VmControllerError::LeadershipLost(reason)) => reason,
            Err(e) => panic!("the VM controller failed: {e}"),
        }
    });
    (serving.metrics.unwrap().to_string(), run)
}

async fn http_get_async(addr: String, path: &'static str) -> (u16, String) {
    tokio::task::spawn_blocking(move || http_get(&addr, path))
        .await
        .unwrap()
}

/// Leader-election status, the leaderElection health check and the VM workqueue series move
/// on a real Lease: the leader reports 1, the standby 0, and after the leader stops the
/// standby reports 1.
#[tokio::test(flavor = "multi_thread")]
async fn leader_election_status_and_health_follow_the_lease() {
    let cluster = testenv::shared_full().await;
    install_crds_and_namespace(cluster);
    let ns = cluster.new_namespace("ops-le").await.unwrap();
    let client = cluster.client().await.unwrap();
    let status = |text: &str| {
        sample(
            text,
            &format!("leader_election_master_status{{name=\"{ns}/controller101\"}}"),
        )
    };

    let stop_a = tokio_util::sync::CancellationToken::new();
    let (addr_a, run_a) = vm_replica(client.clone(), &ns, "replica-a", stop_a.clone()).await;
    let mut a_leads = false;
    for _ in 0..100 {
        if status(&http_get_async(addr_a.clone(), "/metrics").await.1) == Some(1.0) {
            a_leads = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        a_leads,
        "replica-a reports leader_election_master_status 1 once it holds the Lease"
    );
    let stop_b = tokio_util::sync::CancellationToken::new();
    let (addr_b, run_b) = vm_replica(client.clone(), &ns, "replica-b", stop_b.clone()).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (_, metrics_b) = http_get_async(addr_b.clone(), "/metrics").await;
    assert_eq!(
        status(&metrics_b),
        Some(0.0),
        "the standby reports 0:\n{metrics_b}"
    );
    let (code, health) = http_get_async(addr_a.clone(), "/healthz?verbose").await;
    assert_eq!(code, 200);
    assert!(health.contains("[+]leaderElection ok"), "{health}");

    // Work goes through the leader's queue.
    let (_, before) = http_get_async(addr_a.clone(), "/metrics").await;
    let adds =
        |text: &str| sample(text, r#"workqueue_adds_total{name="virtualmachines"}"#).unwrap_or(0.0);
    cluster
        .kubectl_stdin(&["apply", "-n", &ns, "-f", "examples/test-vm.yaml"], None)
        .ok();
    eventually("test-vm Active", Duration::from_secs(60), || {
        cluster
            .kubectl(&[
                "get",
                "vm",
                "test-vm",
                "-n",
                &ns,
                "-o",
                "jsonpath={.status.phase}",
            ])
            .result()
            .ok()
            .filter(|p| p == "Active")
    });
    let (_, after) = http_get_async(addr_a.clone(), "/metrics").await;
    assert!(
        adds(&after) > adds(&before),
        "workqueue_adds_total{{name=\"virtualmachines\"}} {} -> {}",
        adds(&before),
        adds(&after)
    );

    // The leader stops (releasing the Lease); the standby takes over and says so.
    stop_a.cancel();
    run_a.await.unwrap();
    let mut b_leads = false;
    for _ in 0..100 {
        if status(&http_get_async(addr_b.clone(), "/metrics").await.1) == Some(1.0) {
            b_leads = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(b_leads, "replica-b reports 1 after taking over");
    cluster
        .kubectl(&["delete", "vm", "test-vm", "-n", &ns, "--wait=false"])
        .ok();
    eventually(
        "test-vm finalized by the new leader",
        Duration::from_secs(60),
        || {
            cluster
                .kubectl(&["get", "vm", "test-vm", "-n", &ns])
                .result()
                .ok()
                .is_none()
                .then_some(())
        },
    );
    stop_b.cancel();
    run_b.await.unwrap();
}

/// Reconcile counts and errors under controller-runtime's names: successes as Foos sync, and
/// errors while a Foo points at a Deployment it does not own.
#[tokio::test(flavor = "multi_thread")]
async fn the_sample_controller_counts_reconciles_and_errors_in_its_metrics() {
    let cluster = testenv::shared_full().await;
    install_crds_and_namespace(cluster);
    let ns = cluster.new_namespace("ops-reconciles").await.unwrap();
    let mut controller = start_controller(&[
        "sample-controller",
        "--kubeconfig",
        cluster.kubeconfig_path().to_str().unwrap(),
        "--namespace",
        &ns,
        "--metrics-bind-address",
        "127.0.0.1:0",
        // Plain HTTP: this test is about the controller's work and series, not the
        // metrics auth (tests/ops_secure_serving.rs).
        "--metrics-secure=false",
    ]);
    let line = controller.wait_for_line_blocking(&["serving metrics"], Duration::from_secs(30));
    let addr = line
        .split("addr=")
        .nth(1)
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .to_owned();
    let series = |result: &str| {
        format!(
            r#"controller_runtime_reconcile_total{{controller="sample-controller",result="{result}"}}"#
        )
    };
    let errors = r#"controller_runtime_reconcile_errors_total{controller="sample-controller"}"#;

    cluster
        .kubectl_stdin(
            &["apply", "-n", &ns, "-f", "-"],
            Some(&foo_yaml("owned", 1)),
        )
        .ok();
    eventually(
        "a successful reconcile counted",
        Duration::from_secs(60),
        || sample(&http_get(&addr, "/metrics").1, &series("success")).filter(|n| *n >= 1.0),
    );
    // A Deployment the Foo does not own: sample-controller's ErrResourceExists, retried.
    cluster
        .kubectl(&["create", "deployment", "taken", "-n", &ns, "--image=nginx"])
        .ok();
    cluster
        .kubectl_stdin(
            &["apply", "-n", &ns, "-f", "-"],
            Some(&foo_yaml("taken", 1)),
        )
        .ok();
    let text = eventually("reconcile errors counted", Duration::from_secs(60), || {
        let text = http_get(&addr, "/metrics").1;
        sample(&text, errors).filter(|n| *n >= 1.0).map(|_| text)
    });
    assert_eq!(
        sample(&text, &series("error")),
        sample(&text, errors),
        "every error is also a result=error:\n{text}"
    );
    // The repeated ErrResourceExists is one Event whose series was patched, and the recorder
    // counts both writes.
    eventually("Event writes counted", Duration::from_secs(60), || {
        let text = http_get(&addr, "/metrics").1;
        ["create", "patch"]
            .iter()
            .all(|verb| {
                sample(
                    &text,
                    &format!(r#"kubeloop_event_writes_total{{verb="{verb}"}}"#),
                )
                .is_some_and(|n| n >= 1.0)
            })
            .then_some(())
    });
}

/// Waits until a ValidatingAdmissionPolicy just applied refuses `args` run as `kubeconfig`
/// (the apiserver compiles and loads a new policy asynchronously); the refusal's text.
fn refused_once_active(cluster: &Cluster, kubeconfig: &Path, args: &[&str]) -> String {
    eventually(
        "the admission policy to be in force",
        Duration::from_secs(30),
        || cluster.kubectl_as(kubeconfig, args).result().err(),
    )
}

/// RBAC gives the sample controller create and update on every Deployment; its admission
/// policy (deploy/sample-controller-admission.yaml) narrows that to Deployments a Foo
/// controls: with its ServiceAccount's token, a stray Deployment can be neither created nor
/// taken over, while the controller's own work goes on (the test above runs it with the
/// policy applied).
#[tokio::test(flavor = "multi_thread")]
async fn the_sample_controller_account_may_write_only_deployments_a_foo_controls() {
    let cluster = testenv::shared_full().await;
    install_crds_and_namespace(cluster);
    apply_sample_controller_rights(cluster);
    let ns = cluster.new_namespace("ops-sample-vap").await.unwrap();
    let dir = tempdir("sample-vap");
    let kubeconfig = service_account_kubeconfig(cluster, "sample-controller", &dir);
    let why = "the sample controller may only write Deployments that a Foo controls";

    let create = ["create", "deployment", "stray", "--image=nginx", "-n", &ns];
    let mut dry_run = create.to_vec();
    dry_run.push("--dry-run=server");
    let refusal = refused_once_active(cluster, &kubeconfig, &dry_run);
    assert!(refusal.contains(why), "{refusal}");
    let refusal = cluster
        .kubectl_as(&kubeconfig, &create)
        .result()
        .unwrap_err();
    assert!(
        refusal.contains(why) && refusal.contains("stray"),
        "{refusal}"
    );

    // A Deployment of someone else's: the account may not update it either.
    cluster
        .kubectl(&["create", "deployment", "theirs", "--image=nginx", "-n", &ns])
        .ok();
    let theirs = cluster
        .kubectl(&["get", "deployment", "theirs", "-n", &ns, "-o", "json"])
        .ok();
    let mut edited: serde_json::Value = serde_json::from_str(&theirs).unwrap();
    edited["spec"]["replicas"] = serde_json::json!(0);
    // Unconditional: the deployment controller writes the status between the get and the
    // replace, and a stale resourceVersion would be refused as a conflict before admission.
    edited["metadata"]
        .as_object_mut()
        .unwrap()
        .remove("resourceVersion");
    let path = dir.join("theirs.json");
    std::fs::write(&path, edited.to_string()).unwrap();
    let refusal = cluster
        .kubectl_as(&kubeconfig, &["replace", "-f", path.to_str().unwrap()])
        .result()
        .unwrap_err();
    assert!(
        refusal.contains(why) && refusal.contains("theirs"),
        "{refusal}"
    );
    let replicas = cluster
        .kubectl(&[
            "get",
            "deployment",
            "theirs",
            "-n",
            &ns,
            "-o",
            "jsonpath={.spec.replicas}",
        ])
        .ok();
    assert_eq!(replicas, "1", "left as it was");
    let _ = std::fs::remove_dir_all(dir);
}

/// The sample controller's Deployments block their Foo's deletion (`blockOwnerDeletion`), which
/// the OwnerReferencesPermissionEnforcement admission plugin (on in the harness's apiserver, as
/// in many production clusters) allows only to who may update the Foo's finalizers: without
/// that rule of deploy/'s ClusterRole, every create is refused, and the controller says so.
#[tokio::test(flavor = "multi_thread")]
async fn the_sample_controller_without_foos_finalizers_names_the_missing_right() {
    let cluster = testenv::shared_full().await;
    install_crds_and_namespace(cluster);
    let edit = replace_verbs(
        "sample-controller-rbac.yaml",
        "    resources: [\"foos/finalizers\"]\n    verbs: [\"update\"]\n",
        "    resources: [\"foos/finalizers\"]\n    verbs: [\"get\"]\n",
    );
    let needles = ["forbidden", "blockOwnerDeletion", "deployments"];
    sample_controller_missing_a_right(cluster, "-no-finalizers", edit, &needles).await;
}

/// The sharded VM controller's Role reaches every Lease of its namespace (ring Lease names
/// cannot be known in advance); deploy/sharded/vm-controller-admission.yaml narrows that to
/// the ring's Leases: with the ServiceAccount's token, another Lease of the namespace cannot
/// be deleted or updated, a ring Lease can.
#[tokio::test(flavor = "multi_thread")]
async fn the_sharded_vm_controller_account_may_write_only_its_ring_leases() {
    let cluster = testenv::shared_full().await;
    install_crds_and_namespace(cluster);
    cluster
        .kubectl(&[
            "apply",
            "-f",
            "deploy/vm-controller-rbac.yaml",
            "-f",
            "deploy/sharded/vm-controller-rbac.yaml",
            "-f",
            "deploy/sharded/vm-controller-admission.yaml",
        ])
        .ok();
    let dir = tempdir("vm-vap");
    let kubeconfig = service_account_kubeconfig(cluster, "vm-controller", &dir);
    let suffix = std::process::id();
    let (other, ring) = (format!("not-ours-{suffix}"), format!("ring-x-{suffix}"));
    let lease = |name: &str, labels: &str| {
        format!(
            "apiVersion: coordination.k8s.io/v1\nkind: Lease\nmetadata:\n  name: {name}\n  namespace: {VM_NS}\n  labels: {{{labels}}}\nspec:\n  holderIdentity: someone\n"
        )
    };
    cluster
        .kubectl_stdin(&["apply", "-f", "-"], Some(&lease(&other, "")))
        .ok();
    cluster
        .kubectl_stdin(
            &["apply", "-f", "-"],
            Some(&lease(&ring, "kubeloop.dev/ring: x")),
        )
        .ok();
    let why = "the VM controller may only write the Leases of its shard ring";

    let delete_other = ["delete", "lease", &other, "-n", VM_NS];
    let mut dry_run = delete_other.to_vec();
    dry_run.push("--dry-run=server");
    let refusal = refused_once_active(cluster, &kubeconfig, &dry_run);
    assert!(
        refusal.contains(why) && refusal.contains(&other),
        "{refusal}"
    );
    let refusal = cluster
        .kubectl_as(&kubeconfig, &delete_other)
        .result()
        .unwrap_err();
    assert!(refusal.contains(why), "{refusal}");
    // Nor may it take one over by labelling it as the ring's (RBAC lets it update).
    let mut taken: serde_json::Value = serde_json::from_str(
        &cluster
            .kubectl(&["get", "lease", &other, "-n", VM_NS, "-o", "json"])
            .ok(),
    )
    .unwrap();
    taken["metadata"]["labels"] = serde_json::json!({"kubeloop.dev/ring": "x"});
    let path = dir.join("taken.json");
    std::fs::write(&path, taken.to_string()).unwrap();
    let refusal = cluster
        .kubectl_as(&kubeconfig, &["replace", "-f", path.to_str().unwrap()])
        .result()
        .unwrap_err();
    assert!(refusal.contains(why), "{refusal}");
    assert!(
        cluster
            .kubectl(&["get", "lease", &other, "-n", VM_NS])
            .result()
            .ok()
            .is_some()
    );

    cluster
        .kubectl_as(&kubeconfig, &["delete", "lease", &ring, "-n", VM_NS])
        .result()
        .expect("a ring Lease may be deleted");
    cluster
        .kubectl(&["delete", "lease", &other, "-n", VM_NS])
        .ok();
    let _ = std::fs::remove_dir_all(dir);
}

/// Pod Security: the sample controller's namespace enforces `restricted` and its pod template
/// meets it (no warning); the VM controller's pods mount the engine socket, which only a
/// `privileged` namespace admits, so they live in one of their own, where `restricted` is
/// still warned about: the warning names the hostPath.
#[tokio::test(flavor = "multi_thread")]
async fn pod_security_restricted_holds_where_the_controllers_allow_it() {
    let cluster = testenv::shared_full().await;
    install_crds_and_namespace(cluster);
    let sample = cluster.kubectl(&[
        "apply",
        "--dry-run=server",
        "-f",
        "deploy/sample-controller.yaml",
    ]);
    assert!(sample.success, "{}", sample.stderr);
    assert!(
        !sample.stderr.contains("PodSecurity"),
        "the sample controller's pod meets restricted: {}",
        sample.stderr
    );
    let vm = cluster.kubectl(&[
        "apply",
        "--dry-run=server",
        "-f",
        "deploy/vm-controller.yaml",
    ]);
    assert!(vm.success, "{}", vm.stderr);
    assert!(
        vm.stderr
            .contains("would violate PodSecurity \"restricted:latest\"")
            && vm.stderr.contains("hostPath"),
        "the VM controller's namespace warns about its hostPath: {}",
        vm.stderr
    );
    // Enforced in kubeloop-system: a pod with the engine socket is refused there.
    let pod = format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: socket-grabber, namespace: {DEPLOY_NS}}}\nspec:\n  containers: [{{name: c, image: x}}]\n  volumes: [{{name: s, hostPath: {{path: /run/kubeloop/podman.sock}}}}]\n"
    );
    let refused = cluster.kubectl_stdin(&["apply", "--dry-run=server", "-f", "-"], Some(&pod));
    assert!(!refused.success, "{}", refused.stdout);
    assert!(
        refused
            .stderr
            .contains("violates PodSecurity \"restricted:latest\""),
        "{}",
        refused.stderr
    );
}
