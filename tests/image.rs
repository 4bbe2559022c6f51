//! The image (`hack/build-image`, deploy/Dockerfile) run the way a pod runs it, against the
//! real control plane: podman runs it as the non-root user 65532, with a read-only root
//! filesystem (and no tmpfs added), no capabilities and no privilege escalation; a
//! ServiceAccount token from the TokenRequest API, the cluster's CA and the namespace are
//! mounted at the standard path, and `KUBERNETES_SERVICE_HOST`/`PORT` are set, so the
//! controllers take the in-cluster configuration path, with deploy/'s RBAC. Each does its work,
//! answers its probes, and its metrics endpoint (HTTPS, TokenReview + SubjectAccessReview)
//! refuses an anonymous scrape and answers a metrics reader's. Host networking stands in for
//! the pod network (the apiserver listens on 127.0.0.1).
//!
//! `hack/test` builds the image first (`hack/build-image`); `$KUBELOOP_IMAGE` names it.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use kubeloop::testing::eventually_explained_blocking;
use kubeloop_testenv::{self as testenv, Cluster};

use kubeloop_testenv::scrape_metrics;

/// The namespace of each controller's ServiceAccount (deploy/00-namespace.yaml).
fn namespace_of(sa: &str) -> &'static str {
    if sa == "vm-controller" {
        "kubeloop-vm-system"
    } else {
        "kubeloop-system"
    }
}
/// Where a pod finds its ServiceAccount's token, CA and namespace.
const SA_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
const ENGINE_SOCKET: &str = "/run/kubeloop/podman.sock";
/// The engine socket's group (hack/setup-podman's KUBELOOP_ENGINE_GID).
const ENGINE_GID: &str = "2375";
const WAIT: Duration = Duration::from_secs(120);

fn image() -> String {
    std::env::var("KUBELOOP_IMAGE").unwrap_or_else(|_| "localhost/kubeloop:0.1.0".into())
}

fn podman(args: &[&str]) -> Result<String, String> {
    let out = Command::new("podman")
        .args(args)
        .output()
        .map_err(|e| format!("podman: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    } else {
        Err(format!(
            "podman {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// CRDs, deploy/'s namespace and both controllers' RBAC. Once per test binary.
fn install(cluster: &Cluster) {
    static INSTALLED: std::sync::OnceLock<()> = std::sync::OnceLock::new();
    INSTALLED.get_or_init(|| {
        cluster
            .kubectl(&[
                "apply",
                "-f",
                "crds/",
                "-f",
                "deploy/00-namespace.yaml",
                "-f",
                "deploy/sample-controller-rbac.yaml",
                "-f",
                "deploy/vm-controller-rbac.yaml",
                "-f",
                "deploy/metrics-rbac.yaml",
            ])
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

/// A container running the image as a pod would; removed on drop.
struct Pod {
    name: String,
    _secrets: tempfile::TempDir,
}

impl Pod {
    /// Runs `kubeloop <args>` as deploy/'s ServiceAccount `sa`. `extra`: more
    /// `podman run` options (the engine socket).
    fn run(cluster: &Cluster, sa: &str, extra: &[&str], args: &[&str]) -> Self {
        let image = image();
        podman(&["image", "exists", &image])
            .unwrap_or_else(|_| panic!("no image {image}: run hack/build-image (hack/test does)"));
        // What the kubelet projects into every pod: a bound token, the CA, the namespace.
        let secrets = tempfile::tempdir().unwrap();
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
        let files = [
            ("token", token.trim().as_bytes().to_vec()),
            (
                "ca.crt",
                std::fs::read(cluster.dir().join("pki/ca.crt")).unwrap(),
            ),
            ("namespace", namespace_of(sa).as_bytes().to_vec()),
        ];
        for (name, contents) in files {
            let path = secrets.path().join(name);
            std::fs::write(&path, contents).unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        }
        std::fs::set_permissions(secrets.path(), std::fs::Permissions::from_mode(0o755)).unwrap();

        let name = format!("kubeloop-pod-{sa}-{}", std::process::id());
        let _ = podman(&["rm", "-f", &name]);
        let port = cluster.apiserver_addr().port().to_string();
        let mount = format!("{}:{SA_DIR}:ro", secrets.path().display());
        let mut run = vec![
            "run",
            "-d",
            "--name",
            &name,
            "--network",
            "host",
            "--user",
            "65532:65532",
            "--read-only",
            "--read-only-tmpfs=false",
            "--cap-drop",
            "all",
            "--security-opt",
            "no-new-privileges",
            "--env",
            "KUBERNETES_SERVICE_HOST=127.0.0.1",
            "--env",
            "RUST_LOG=info",
            "--volume",
            &mount,
        ];
        let port_env = format!("KUBERNETES_SERVICE_PORT={port}");
        run.extend(["--env", &port_env]);
        run.extend_from_slice(extra);
        run.push(&image);
        run.extend_from_slice(args);
        podman(&run).unwrap();
        Pod {
            name,
            _secrets: secrets,
        }
    }

    /// Runs `kubeloop <args> --namespace ns` with metrics and probes on free loopback ports,
    /// as [`Pod::run`]; checks the pod's security settings, that its probes answer and that its
    /// metrics need a reader's token.
    async fn run_controller(
        cluster: &Cluster,
        sa: &str,
        extra: &[&str],
        args: &[&str],
        ns: &str,
    ) -> Self {
        let metrics = format!("127.0.0.1:{}", testenv::free_port().expect("a free port"));
        let probes = format!("127.0.0.1:{}", testenv::free_port().expect("a free port"));
        let mut all = args.to_vec();
        all.extend([
            "--namespace",
            ns,
            "--metrics-bind-address",
            &metrics,
            "--health-probe-bind-address",
            &probes,
        ]);
        let pod = Pod::run(cluster, sa, extra, &all);
        assert_runs_as_a_restricted_pod(&pod);
        probes_answer(&pod, &probes);
        metrics_need_a_reader_token(cluster, &pod, &metrics).await;
        pod
    }

    fn logs(&self) -> String {
        let out = Command::new("podman")
            .args(["logs", &self.name])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr)
    }

    fn inspect(&self, format: &str) -> String {
        podman(&["inspect", "--format", format, &self.name]).unwrap()
    }

    /// [`eventually_explained_blocking`]: panics with the container's state and log unless
    /// `check` holds within `limit`.
    fn wait<T>(&self, what: &str, limit: Duration, check: impl FnMut() -> Option<T>) -> T {
        eventually_explained_blocking(
            what,
            limit,
            || {
                format!(
                    "container state {}; its log:\n{}",
                    self.inspect("{{.State.Status}} {{.State.ExitCode}}"),
                    self.logs()
                )
            },
            check,
        )
    }
}

impl Drop for Pod {
    fn drop(&mut self) {
        let _ = podman(&["rm", "-f", "-t", "5", &self.name]);
    }
}

/// `kubectl get <what> -n ns -o jsonpath=<path>`; `None` if kubectl fails.
fn field(cluster: &Cluster, ns: &str, what: &[&str], path: &str) -> Option<String> {
    let jsonpath = format!("jsonpath={path}");
    let mut args = vec!["get"];
    args.extend_from_slice(what);
    args.extend(["-n", ns, "-o", &jsonpath]);
    cluster.kubectl(&args).result().ok()
}

/// A plain HTTP GET; (status, body).
fn http_get(addr: &str, path: &str) -> Option<(u16, String)> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr).ok()?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut raw = String::new();
    stream.read_to_string(&mut raw).ok()?;
    let status = raw.get(9..12)?.parse().ok()?;
    let body = raw.split_once("\r\n\r\n").map(|(_, b)| b.to_owned())?;
    Some((status, body))
}

/// The pod's security settings as podman applied them.
fn assert_runs_as_a_restricted_pod(pod: &Pod) {
    assert_eq!(pod.inspect("{{.Config.User}}"), "65532:65532");
    assert_eq!(pod.inspect("{{.HostConfig.ReadonlyRootfs}}"), "true");
    assert_eq!(pod.inspect("{{.EffectiveCaps}}"), "[]", "no capabilities");
}

/// The metrics endpoint of `pod` refuses an anonymous scrape (401) and answers one with the
/// token of a ServiceAccount bound to deploy/'s `kubeloop:metrics-reader` (200).
async fn metrics_need_a_reader_token(cluster: &Cluster, pod: &Pod, metrics: &str) {
    let ns = cluster.new_namespace("image-scraper").await.unwrap();
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
    pod.wait(
        "the metrics server to refuse an anonymous scrape",
        WAIT,
        || (scrape_metrics(metrics, None) == 401).then_some(()),
    );
    pod.wait("a metrics reader's scrape to be answered", WAIT, || {
        (scrape_metrics(metrics, Some(token.trim())) == 200).then_some(())
    });
}

fn probes_answer(pod: &Pod, probes: &str) {
    for path in ["/healthz", "/readyz"] {
        pod.wait(&format!("{path} to answer 200"), WAIT, || {
            http_get(probes, path).filter(|(status, _)| *status == 200)
        });
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_sample_controller_image_runs_as_a_pod_with_in_cluster_configuration() {
    let cluster = testenv::shared_full().await;
    install(cluster);
    let ns = cluster.new_namespace("image-sample").await.unwrap();
    let pod = Pod::run_controller(
        cluster,
        "sample-controller",
        &[],
        &["sample-controller"],
        &ns,
    )
    .await;

    // Its work: the Foo gets its Deployment, and the Deployment's Pods on the kwok node make
    // it available.
    let foo = "apiVersion: samplecontroller.k8s.io/v1alpha1\nkind: Foo\nmetadata:\n  name: web\nspec:\n  deploymentName: web\n  replicas: 1\n";
    cluster
        .kubectl_stdin(&["apply", "-n", &ns, "-f", "-"], Some(foo))
        .ok();
    pod.wait("the Foo's status to show 1 available replica", WAIT, || {
        let available = field(cluster, &ns, &["foo", "web"], "{.status.availableReplicas}")?;
        (available == "1").then_some(())
    });
    let owner = field(
        cluster,
        &ns,
        &["deployment", "web"],
        "{.metadata.ownerReferences[0].kind}",
    );
    assert_eq!(owner.as_deref(), Some("Foo"));
    let logs = pod.logs();
    assert!(
        logs.contains("source=in-cluster service account"),
        "the in-cluster configuration path was taken:\n{logs}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_vm_controller_image_runs_as_a_pod_on_the_engine_socket_through_its_group() {
    let cluster = testenv::shared_full().await;
    install(cluster);
    assert!(
        Path::new(ENGINE_SOCKET).exists(),
        "no engine socket at {ENGINE_SOCKET}: run hack/setup-podman (hack/test does)"
    );
    let ns = cluster.new_namespace("image-vm").await.unwrap();
    let socket = format!("{ENGINE_SOCKET}:{ENGINE_SOCKET}");
    let engine = [
        "--volume",
        &socket,
        "--group-add",
        ENGINE_GID,
        "--env",
        "DOCKER_HOST=unix:///run/kubeloop/podman.sock",
    ];
    let args = [
        "vm-controller",
        "--vm-driver=docker",
        "--leader-elect=false",
    ];
    let pod = Pod::run_controller(cluster, "vm-controller", &engine, &args, &ns).await;

    let vm = "apiVersion: cloudnative.tw/v1alpha1\nkind: VirtualMachine\nmetadata: {name: pod-vm}\nspec: {resource: {cpu: 100m, memory: 32Mi}}\n";
    cluster
        .kubectl_stdin(&["apply", "-n", &ns, "-f", "-"], Some(vm))
        .ok();
    pod.wait("the VM to be Active", WAIT, || {
        let phase = field(cluster, &ns, &["vm", "pod-vm"], "{.status.phase}")?;
        (phase == "Active").then_some(())
    });
    // Deleting it goes through the finalizer: the container goes, then the VM.
    cluster
        .kubectl(&["delete", "vm", "pod-vm", "-n", &ns, "--wait=false"])
        .ok();
    pod.wait("the VM to be finalized and gone", WAIT, || {
        let left = field(cluster, &ns, &["vm"], "{.items[*].metadata.name}")?;
        left.trim().is_empty().then_some(())
    });
    let containers = podman(&[
        "ps",
        "-a",
        "--filter",
        &format!("label=kubeloop.dev/vm-namespace={ns}"),
        "--format",
        "{{.Names}}",
    ])
    .unwrap();
    assert_eq!(containers, "", "the VM's container was removed");
}
