//! deploy/ on a real kubelet Node: the manifests, unchanged, applied server-side to a cluster
//! whose workloads run for real (`ClusterOptions::node`: containerd, the kubelet and
//! kube-proxy on this machine; see testenv/src/node/). Both controllers' pods must be
//! scheduled onto the node, pass the probes the kubelet runs, reach the apiserver through the
//! `kubernetes` Service with the token the kubelet projects, do their work, and guard their
//! metrics: an anonymous scrape of the pod's :8443 gets 401, one with a token bound to
//! `kubeloop:metrics-reader` 200.
//!
//! What it does not show: deploy/networkpolicy.yaml is applied but nothing enforces it (the
//! CNI bridge plugin has no policy engine). The Foo's Deployment runs no pod: the sample
//! controller's Deployments run `nginx:latest`, which the kubelet would pull from a registry,
//! and nothing here may leave this machine; a ResourceQuota of 0 pods in the Foo's namespace
//! keeps its ReplicaSet from making one.
//!
//! Needs root, `hack/setup-node` (containerd, kubelet, kube-proxy, the image archives) and
//! `hack/setup-podman` (the VM controller's engine socket); `hack/test` runs both.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use kubeloop_testenv::{Cluster, ClusterOptions, NODE_NAME};

use kubeloop_testenv::scrape_metrics;

const SAMPLE_NS: &str = "kubeloop-system";
const VM_NS: &str = "kubeloop-vm-system";
/// hack/setup-podman's socket, which deploy/vm-controller.yaml mounts.
const ENGINE_SOCKET: &str = "/run/kubeloop/podman.sock";
const WAIT: Duration = Duration::from_secs(180);

/// `kubectl get <what> -n ns -o jsonpath=<path>`, or why not.
fn field(cluster: &Cluster, ns: &str, what: &[&str], path: &str) -> Result<String, String> {
    let jsonpath = format!("jsonpath={path}");
    let mut args = vec!["get"];
    args.extend_from_slice(what);
    args.extend(["-n", ns, "-o", &jsonpath]);
    cluster.kubectl(&args).result()
}

/// What the pods of a Deployment look like: one line per pod,
/// `<name> <node> <ip> <phase> <ready> <restarts>`.
fn pods(cluster: &Cluster, ns: &str, app: &str) -> Vec<String> {
    let selector = format!("app.kubernetes.io/name={app}");
    let path = r#"{range .items[*]}{.metadata.name} {.spec.nodeName} {.status.podIP} {.status.phase} {.status.conditions[?(@.type=="Ready")].status} {.status.containerStatuses[0].restartCount}{"\n"}{end}"#;
    field(cluster, ns, &["pods", "-l", &selector], path)
        .map(|out| out.lines().map(str::to_owned).collect())
        .unwrap_or_default()
}

/// Waits until the Deployment's `replicas` pods run Ready on the node; their IPs.
async fn running_on_the_node(
    cluster: &Cluster,
    ns: &str,
    app: &str,
    replicas: usize,
) -> Vec<String> {
    kubeloop::testing::eventually(
        &format!("{replicas} {app} pod(s) Running and Ready on {NODE_NAME}"),
        WAIT,
        || async {
            let pods = pods(cluster, ns, app);
            let ready: Vec<String> = pods
                .iter()
                .filter_map(|line| {
                    let f: Vec<&str> = line.split(' ').collect();
                    (f.len() == 6 && f[1] == NODE_NAME && f[3] == "Running" && f[4] == "True")
                        .then(|| f[2].to_owned())
                })
                .collect();
            if ready.len() == replicas {
                Ok(ready)
            } else {
                let events = cluster
                    .kubectl(&["get", "events", "-n", ns, "--sort-by=.lastTimestamp"])
                    .stdout;
                Err(format!("pods: {pods:?}; events:\n{events}"))
            }
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn deploy_runs_on_a_real_kubelet_node() {
    assert!(
        Path::new(ENGINE_SOCKET).exists(),
        "no engine socket at {ENGINE_SOCKET}: run hack/setup-podman (hack/test does)"
    );
    let cluster = Cluster::start(ClusterOptions::node())
        .await
        .unwrap_or_else(|e| panic!("starting a cluster with a real node: {e}"));

    // The manifests as a user applies them, from the files themselves.
    cluster
        .kubectl(&["apply", "--server-side", "-f", "crds/"])
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
    cluster
        .kubectl(&["apply", "--server-side", "-f", "deploy/"])
        .ok();

    // Scheduled onto the real node, started by containerd, Ready by the kubelet's probes.
    let sample_ips = running_on_the_node(&cluster, SAMPLE_NS, "sample-controller", 1).await;
    let vm_ips = running_on_the_node(&cluster, VM_NS, "vm-controller", 2).await;
    for ip in sample_ips.iter().chain(&vm_ips) {
        assert!(
            ip.starts_with("10.244.0."),
            "a pod address on the node's bridge: {ip}"
        );
    }
    // Through the apiserver and the kubelet's server: the controller took the in-cluster path
    // (the projected token, KUBERNETES_SERVICE_HOST through kube-proxy).
    let logs = cluster
        .kubectl(&["logs", "-n", SAMPLE_NS, "deployment/sample-controller"])
        .ok();
    assert!(
        logs.contains("source=in-cluster service account"),
        "the in-cluster configuration path was taken:\n{logs}"
    );

    // The sample controller's work: a Foo gets its Deployment, controlled by the Foo. (No pod
    // of it may start: its image would be pulled from outside; see the module docs.)
    let ns = cluster.new_namespace("node-sample").await.unwrap();
    cluster
        .kubectl(&["create", "quota", "no-pods", "--hard=pods=0", "-n", &ns])
        .ok();
    let foo = "apiVersion: samplecontroller.k8s.io/v1alpha1\nkind: Foo\nmetadata:\n  name: web\nspec:\n  deploymentName: web\n  replicas: 1\n";
    cluster
        .kubectl_stdin(&["apply", "-n", &ns, "-f", "-"], Some(foo))
        .ok();
    let owner = kubeloop::testing::eventually("the Foo's Deployment", WAIT, || async {
        field(
            &cluster,
            &ns,
            &["deployment", "web"],
            "{.metadata.ownerReferences[0].kind}/{.metadata.ownerReferences[0].name}",
        )
    })
    .await;
    assert_eq!(owner, "Foo/web");
    let replicas = field(&cluster, &ns, &["deployment", "web"], "{.spec.replicas}");
    assert_eq!(
        replicas.as_deref(),
        Ok("1"),
        "the Deployment asks for the Foo's replicas"
    );

    // The VM controller's work, through the node's engine socket: a VM becomes Active, and
    // deleting it goes through the finalizer.
    let vm = "apiVersion: cloudnative.tw/v1alpha1\nkind: VirtualMachine\nmetadata: {name: node-vm}\nspec: {resource: {cpu: 100m, memory: 32Mi}}\n";
    cluster
        .kubectl_stdin(&["apply", "-n", &ns, "-f", "-"], Some(vm))
        .ok();
    kubeloop::testing::eventually("the VM to be Active", WAIT, || async {
        let phase = field(&cluster, &ns, &["vm", "node-vm"], "{.status.phase}")?;
        if phase == "Active" {
            Ok(())
        } else {
            Err(format!("phase {phase:?}"))
        }
    })
    .await;
    cluster
        .kubectl(&["delete", "vm", "node-vm", "-n", &ns, "--timeout=120s"])
        .ok();
    let label = format!("label=kubeloop.dev/vm-namespace={ns}");
    let containers = Command::new("podman")
        .args(["ps", "-a", "--filter", &label, "--format", "{{.Names}}"])
        .output()
        .unwrap();
    assert!(containers.status.success());
    assert_eq!(
        String::from_utf8_lossy(&containers.stdout).trim(),
        "",
        "the VM's container was removed"
    );

    // The metrics endpoints, scraped at the pods' addresses: anonymous 401, a reader's 200.
    cluster
        .kubectl(&["create", "serviceaccount", "scraper", "-n", &ns])
        .ok();
    cluster
        .kubectl(&[
            "create",
            "clusterrolebinding",
            &format!("{ns}-metrics-reader"),
            "--clusterrole=kubeloop:metrics-reader",
            &format!("--serviceaccount={ns}:scraper"),
        ])
        .ok();
    let token = cluster
        .kubectl(&["create", "token", "scraper", "-n", &ns])
        .ok();
    for ip in sample_ips.iter().chain(&vm_ips) {
        let addr = format!("{ip}:8443");
        let statuses = || {
            (
                scrape_metrics(&addr, None),
                scrape_metrics(&addr, Some(token.trim())),
            )
        };
        kubeloop::testing::eventually(
            &format!("{ip}:8443 to answer an anonymous scrape 401 and a reader's 200"),
            Duration::from_secs(30),
            || async {
                match statuses() {
                    (401, 200) => Ok(()),
                    other => Err(format!("(anonymous, reader) answered {other:?}")),
                }
            },
        )
        .await;
    }

    // Nothing restarted: the liveness probes held.
    for (ns, app) in [(SAMPLE_NS, "sample-controller"), (VM_NS, "vm-controller")] {
        for pod in pods(&cluster, ns, app) {
            assert!(pod.ends_with(" 0"), "no restarts: {pod}");
        }
    }
}
