//! The control plane's components as processes: the flags each is started with, when each
//! counts as ready, and the slots that hold the running ones in the order they stop.
//! [`Components`] starts etcd, kube-apiserver, kube-controller-manager, kube-scheduler, the
//! real Node (node/) and kwok; [`super::Cluster`] decides which, and owns the certificates and
//! kubeconfigs they are started with.
//!
//! Invariants:
//! - A component is in its slot from its spawn on, so a readiness wait sees it exit and fails
//!   fast with its log's tail instead of waiting out the timeout.
//! - Slots stop dependants first and etcd last (the field order of `Processes`).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, ServiceAccount};
use kube_client::api::{Api, PostParams};
use kube_client::{Client, Config};
use parking_lot::Mutex;

use super::TestEnvError;
use super::create_dir;
use super::etcd::EtcdClient;
use super::node::{self, NODE_NAME, NodeConfig, NodeNetwork, NodePorts};
use super::options::ClusterOptions;
use super::ports::free_port;
use super::process::ManagedProcess;

/// The name of the fake Node that kwok manages in a
/// [`ClusterOptions::full`](super::ClusterOptions::full) cluster.
pub const KWOK_NODE: &str = "kwok-node-0";

/// The binaries a cluster may start; all must be there before the first starts.
const BINARIES: [&str; 5] = [
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kwok",
];

/// kwok v0.8.0 registers CEL types in an unlocked global map (easycel's `typeValueMap`), so two
/// goroutines building CEL environments at start-up can kill it (Go's "concurrent map writes",
/// with a trace through easycel). It is rare (one CI run in many) and only at start-up, so the
/// harness starts kwok again, up to this many times, when its log shows that crash.
const KWOK_START_ATTEMPTS: u32 = 3;

/// What every component is started with.
pub(super) struct Setup {
    /// Where the control-plane binaries are.
    pub(super) bin_dir: PathBuf,
    /// The cluster's working directory: the components write `logs/`, `etcd/`, `kcm/`,
    /// `scheduler/` and `node/` there, and read `pki/sa.key`.
    pub(super) dir: PathBuf,
    /// The admin kubeconfig the components reach the apiserver with.
    pub(super) kubeconfig: PathBuf,
    /// The same admin identity, for the readiness checks that ask the apiserver.
    pub(super) admin: Config,
    /// The cluster CA's certificate, which the controller-manager and the node hand on.
    pub(super) ca_cert: PathBuf,
    /// How long each component may take to become ready.
    pub(super) ready_timeout: Duration,
}

/// The running components of one cluster.
pub(super) struct Components {
    processes: Mutex<Processes>,
    setup: Setup,
}

#[derive(Default)]
struct Processes {
    // Field order is drop order: dependants first, etcd last. The node comes after the
    // scheduler and the controller-manager: it stops its pods through the apiserver, and no
    // pod may be created or bound meanwhile.
    kwok: Option<ManagedProcess>,
    scheduler: Option<ManagedProcess>,
    controller_manager: Option<ManagedProcess>,
    node: Option<node::Node>,
    apiserver: Option<ManagedProcess>,
    etcd: Option<ManagedProcess>,
}

/// Fails with [`TestEnvError::MissingBinary`] unless every component's binary is in `bin_dir`.
pub(super) fn check_binaries(bin_dir: &Path) -> Result<(), TestEnvError> {
    for name in BINARIES {
        let path = bin_dir.join(name);
        if !path.is_file() {
            return Err(TestEnvError::MissingBinary(path));
        }
    }
    Ok(())
}

/// kube-apiserver's flags: the flag set of controller-runtime's envtest, plus what
/// controller-manager needs (service account keys) and Node,RBAC authorization as kwokctl runs
/// it. `root` is the cluster's working directory (its certificates in `root/pki`).
pub(super) fn apiserver_args(
    root: &Path,
    etcd_port: u16,
    addr: SocketAddr,
    options: &ClusterOptions,
) -> Vec<String> {
    let pki = root.join("pki");
    let p = |f: &str| pki.join(f).display().to_string();
    let mut args = vec![
        format!("--etcd-servers=http://127.0.0.1:{etcd_port}"),
        format!("--cert-dir={}", pki.display()),
        format!("--tls-cert-file={}", p("apiserver.crt")),
        format!("--tls-private-key-file={}", p("apiserver.key")),
        format!("--client-ca-file={}", p("ca.crt")),
        format!("--secure-port={}", addr.port()),
        format!("--bind-address={}", addr.ip()),
        format!("--advertise-address={}", addr.ip()),
        "--service-cluster-ip-range=10.0.0.0/24".into(),
        "--allow-privileged=true".into(),
        "--authorization-mode=Node,RBAC".into(),
        format!("--service-account-issuer=https://{addr}/"),
        format!("--service-account-key-file={}", p("sa.pub")),
        format!("--service-account-signing-key-file={}", p("sa.key")),
        // As in many production clusters (and OpenShift): setting `blockOwnerDeletion` on an
        // ownerReference needs the right to update the owner's finalizers, so deploy/'s RBAC is
        // checked against it (tests/operations.rs).
        "--enable-admission-plugins=OwnerReferencesPermissionEnforcement".into(),
    ];

    if options.node {
        // The `kubernetes` Service's endpoint is the advertised address (the lease reconciler),
        // which pods reach; and the apiserver can reach the kubelet (logs, exec).
        args.push(format!(
            "--kubelet-client-certificate={}",
            p("apiserver-kubelet-client.crt")
        ));
        args.push(format!(
            "--kubelet-client-key={}",
            p("apiserver-kubelet-client.key")
        ));
        // The kubelet's address, never its name: a name would be looked up in the host's DNS,
        // which is not on this machine.
        args.push("--kubelet-preferred-address-types=InternalIP".into());
    } else {
        // No Service routing without a node: keep the `kubernetes` Service's endpoints empty
        // rather than naming a loopback address.
        args.push("--endpoint-reconciler-type=none".into());
    }

    // Without controller-manager nobody creates the `default` ServiceAccount, and the
    // ServiceAccount admission plugin would refuse every Pod (envtest does the same).
    if !options.controller_manager {
        args.push("--disable-admission-plugins=ServiceAccount".into());
    }
    args.extend(options.feature_gates_flag());
    args.extend(options.apiserver_args.iter().cloned());
    args
}

impl Components {
    /// No component running yet; creates the components' directories under `setup.dir`.
    pub(super) fn new(setup: Setup) -> Result<Self, TestEnvError> {
        for sub in ["logs", "etcd", "kcm", "scheduler"] {
            create_dir(&setup.dir.join(sub))?;
        }
        Ok(Self {
            processes: Mutex::new(Processes::default()),
            setup,
        })
    }

    /// Where the control-plane binaries (and kubectl) are.
    pub(super) fn bin_dir(&self) -> &Path {
        &self.setup.bin_dir
    }

    /// The pids of the components running now (etcd first).
    pub(super) fn pids(&self) -> Vec<u32> {
        let p = self.processes.lock();
        let mut pids: Vec<u32> = [
            &p.etcd,
            &p.apiserver,
            &p.controller_manager,
            &p.scheduler,
            &p.kwok,
        ]
        .into_iter()
        .flatten()
        .map(|m| m.pid())
        .collect();
        pids.extend(p.node.iter().flat_map(node::Node::pids));
        pids
    }

    /// Kills every component, dependants first, etcd last. Idempotent.
    pub(super) fn stop_all(&self) {
        let mut processes = self.processes.lock();
        processes.kwok.take();
        processes.scheduler.take();
        processes.controller_manager.take();
        processes.node.take();
        processes.apiserver.take();
        processes.etcd.take();
    }

    /// Starts etcd on `etcd`'s client port (and `peer_port`), data in `etcd/`, and waits until
    /// `/health` says healthy.
    pub(super) async fn start_etcd(
        &self,
        etcd: &EtcdClient,
        peer_port: u16,
    ) -> Result<(), TestEnvError> {
        let url = etcd.url();
        let args = vec![
            "--name=etcd".into(),
            format!("--data-dir={}", self.setup.dir.join("etcd").display()),
            format!("--listen-client-urls={url}"),
            format!("--advertise-client-urls={url}"),
            format!("--listen-peer-urls=http://127.0.0.1:{peer_port}"),
            format!("--initial-advertise-peer-urls=http://127.0.0.1:{peer_port}"),
            format!("--initial-cluster=etcd=http://127.0.0.1:{peer_port}"),
            "--unsafe-no-fsync=true".into(),
            "--log-level=warn".into(),
        ];
        self.processes.lock().etcd = Some(self.spawn("etcd", &args)?);
        self.wait_ready(
            "etcd",
            |p| p.etcd.as_mut(),
            || async { etcd.is_healthy().await.map_err(|e| e.to_string()) },
        )
        .await
    }

    /// Starts kube-apiserver with `args` ([`apiserver_args`]) and waits until /readyz answers ok.
    pub(super) async fn start_apiserver(&self, args: &[String]) -> Result<(), TestEnvError> {
        let process = self.spawn("kube-apiserver", args)?;
        self.processes.lock().apiserver = Some(process);
        let client = self.client()?;
        self.wait_ready(
            "kube-apiserver",
            |p| p.apiserver.as_mut(),
            || answers_ok(client.clone(), "/readyz"),
        )
        .await
    }

    /// Stops kube-apiserver (SIGTERM, then SIGKILL after 10 s). etcd keeps the data.
    pub(super) async fn stop_apiserver(&self) {
        let process = self.processes.lock().apiserver.take();
        if let Some(mut process) = process {
            tokio::task::spawn_blocking(move || process.stop(Duration::from_secs(10)))
                .await
                .ok();
        }
    }

    /// The flags kube-controller-manager and kube-scheduler share: the cluster's kubeconfig,
    /// HTTPS on loopback at `port` with certificates in `cert_dir` (under the cluster's
    /// directory), and the health paths open without authentication.
    fn serving_args(&self, port: u16, cert_dir: &str) -> Vec<String> {
        vec![
            format!("--kubeconfig={}", self.setup.kubeconfig.display()),
            "--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics".into(),
            "--bind-address=127.0.0.1".into(),
            format!("--secure-port={port}"),
            format!("--cert-dir={}", self.setup.dir.join(cert_dir).display()),
        ]
    }

    /// Starts kube-controller-manager and waits until Pods can be admitted.
    pub(super) async fn start_controller_manager(&self) -> Result<(), TestEnvError> {
        let port = free_port()?;
        let mut args = self.serving_args(port, "kcm");
        args.extend([
            format!("--root-ca-file={}", self.setup.ca_cert.display()),
            format!(
                "--service-account-private-key-file={}",
                self.setup.dir.join("pki/sa.key").display()
            ),
            "--leader-elect=false".into(),
            "--node-monitor-period=5s".into(),
            "--node-monitor-grace-period=40s".into(),
        ]);
        let process = self.spawn("kube-controller-manager", &args)?;
        self.processes.lock().controller_manager = Some(process);
        self.wait_https_healthz("kube-controller-manager", port, |p| {
            p.controller_manager.as_mut()
        })
        .await?;
        // Ready for tests means Pods can be admitted: the service-account controller has made
        // the `default` ServiceAccount that admission requires in every namespace.
        let client = self.client()?;
        self.wait_ready(
            "kube-controller-manager",
            |p| p.controller_manager.as_mut(),
            || {
                let api: Api<ServiceAccount> = Api::namespaced(client.clone(), "default");
                async move {
                    api.get_opt("default")
                        .await
                        .map(|sa| sa.is_some())
                        .map_err(|e| e.to_string())
                }
            },
        )
        .await
    }

    /// Starts kube-scheduler and waits until its /healthz answers ok.
    pub(super) async fn start_scheduler(&self) -> Result<(), TestEnvError> {
        let port = free_port()?;
        let mut args = self.serving_args(port, "scheduler");
        args.push("--leader-elect=false".into());
        let process = self.spawn("kube-scheduler", &args)?;
        self.processes.lock().scheduler = Some(process);
        self.wait_https_healthz("kube-scheduler", port, |p| p.scheduler.as_mut())
            .await
    }

    /// Starts the real Node (node/) on `network`, its kubelet and kube-proxy with the given
    /// kubeconfigs, and waits until it is Ready and kube-proxy healthy.
    pub(super) async fn start_node(
        &self,
        network: NodeNetwork,
        kubelet_kubeconfig: &Path,
        kube_proxy_kubeconfig: &Path,
    ) -> Result<(), TestEnvError> {
        let node = node::Node::start(
            network,
            NodeConfig {
                dir: &self.setup.dir.join("node"),
                bin_dir: &self.setup.bin_dir,
                kubelet_kubeconfig,
                kube_proxy_kubeconfig,
                admin_kubeconfig: &self.setup.kubeconfig,
                client_ca: &self.setup.ca_cert,
                ports: NodePorts {
                    kubelet_healthz: free_port()?,
                    kube_proxy_healthz: free_port()?,
                    kube_proxy_metrics: free_port()?,
                },
            },
        )
        .await?;
        let kube_proxy_healthz = node.kube_proxy_healthz();
        self.processes.lock().node = Some(node);

        let nodes: Api<Node> = Api::all(self.client()?);
        let deadline = Instant::now() + self.setup.ready_timeout;
        loop {
            if let Some(exited) = self
                .processes
                .lock()
                .node
                .as_mut()
                .and_then(node::Node::exited)
            {
                return Err(exited);
            }
            // Ready for tests means pods can run and reach the apiserver: the Node is Ready, and
            // kube-proxy has programmed the Services (the `kubernetes` one).
            let last = match nodes.get_opt(NODE_NAME).await {
                Ok(Some(node)) if node::is_ready(&node) => {
                    if node::healthz_ok(kube_proxy_healthz) {
                        return Ok(());
                    }
                    "Ready; kube-proxy not yet healthy".to_owned()
                }
                Ok(Some(_)) => "registered, not Ready".to_owned(),
                Ok(None) => "not registered".to_owned(),
                Err(e) => e.to_string(),
            };
            if Instant::now() > deadline {
                return Err(TestEnvError::NotReady {
                    component: "kubelet".into(),
                    seconds: self.setup.ready_timeout.as_secs(),
                    detail: last,
                });
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// Starts kwok, registers its fake Node ([`KWOK_NODE`]) and waits until kwok reports it
    /// Ready; starts kwok again if it dies of its CEL start-up race ([`KWOK_START_ATTEMPTS`]).
    pub(super) async fn start_kwok(&self) -> Result<(), TestEnvError> {
        // Standalone kwok runs only the stages its configuration lists; hack/build-control-plane
        // assembles kwokctl's defaults (node ready + heartbeat, pod ready/complete/delete).
        let config = self.setup.bin_dir.join("kwok-stages.yaml");
        if !config.is_file() {
            return Err(TestEnvError::MissingBinary(config));
        }
        // No `--server-address` and node port 0: kwok then serves no kubelet endpoints (logs,
        // exec, metrics), which nothing here uses, and skips building its metrics CEL environment,
        // the start-up step that races the stage controllers (see KWOK_START_ATTEMPTS).
        let args = vec![
            format!("--kubeconfig={}", self.setup.kubeconfig.display()),
            format!("--config={}", config.display()),
            "--manage-all-nodes=false".into(),
            "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake".into(),
            "--cidr=10.0.0.0/24".into(),
            "--node-ip=10.0.0.1".into(),
            "--node-port=0".into(),
        ];
        let nodes: Api<Node> = Api::all(self.client()?);
        let node: Node = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": KWOK_NODE,
                "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
                "labels": {"type": "kwok", "kubernetes.io/hostname": KWOK_NODE, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64"}
            },
            "status": {
                "capacity": {"cpu": "32", "memory": "256Gi", "pods": "110"},
                "allocatable": {"cpu": "32", "memory": "256Gi", "pods": "110"}
            }
        }))
        .expect("a static Node parses");

        let mut attempt = 1;
        loop {
            let process = self.spawn("kwok", &args)?;
            self.processes.lock().kwok = Some(process);
            match nodes.create(&PostParams::default(), &node).await {
                Ok(_) => {}
                Err(kube_client::Error::Api(e)) if e.code == 409 && attempt > 1 => {}
                Err(e) => return Err(e.into()),
            }
            let ready = self
                .wait_ready(
                    "kwok",
                    |p| p.kwok.as_mut(),
                    || {
                        let nodes = nodes.clone();
                        async move {
                            let node = nodes.get(KWOK_NODE).await.map_err(|e| e.to_string())?;
                            let ready = node
                                .status
                                .and_then(|s| s.conditions)
                                .unwrap_or_default()
                                .iter()
                                .any(|c| c.type_ == "Ready" && c.status == "True");
                            Ok(ready)
                        }
                    },
                )
                .await;
            match ready {
                Err(TestEnvError::Exited { log, .. })
                    if attempt < KWOK_START_ATTEMPTS && hit_kwok_start_race(&log) =>
                {
                    let kept = log.with_file_name(format!("kwok.attempt-{attempt}.log"));
                    let _ = std::fs::rename(&log, &kept);
                    tracing::warn!(attempt, log = %kept.display(), "testenv: kwok crashed on its CEL start-up race; starting it again");
                    attempt += 1;
                }
                other => return other,
            }
        }
    }

    /// A client for the admin user, for a readiness check.
    fn client(&self) -> Result<Client, TestEnvError> {
        Ok(Client::try_from(self.setup.admin.clone())?)
    }

    fn spawn(&self, component: &str, args: &[String]) -> Result<ManagedProcess, TestEnvError> {
        let log = self.setup.dir.join("logs").join(format!("{component}.log"));
        ManagedProcess::spawn(component, &self.setup.bin_dir.join(component), args, &log)
    }

    /// Polls `probe` until it says ready, failing fast (with the log's tail) if the process exits.
    async fn wait_ready<P, F, Fut>(
        &self,
        component: &str,
        mut process: P,
        probe: F,
    ) -> Result<(), TestEnvError>
    where
        P: FnMut(&mut Processes) -> Option<&mut ManagedProcess>,
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = Result<bool, String>>,
    {
        let deadline = Instant::now() + self.setup.ready_timeout;
        loop {
            {
                let mut processes = self.processes.lock();
                if let Some(p) = process(&mut processes)
                    && let Some(status) = p.exited()
                {
                    return Err(TestEnvError::Exited {
                        component: component.to_owned(),
                        status: status.to_string(),
                        log: p.log_path().to_owned(),
                        tail: p.log_tail(30),
                    });
                }
            }
            let last = match probe().await {
                Ok(true) => return Ok(()),
                Ok(false) => "not ready".to_owned(),
                Err(e) => e,
            };
            if Instant::now() > deadline {
                return Err(TestEnvError::NotReady {
                    component: component.to_owned(),
                    seconds: self.setup.ready_timeout.as_secs(),
                    detail: last,
                });
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Polls `https://127.0.0.1:<port>/healthz` of a component serving a self-signed certificate.
    async fn wait_https_healthz<P>(
        &self,
        component: &str,
        port: u16,
        process: P,
    ) -> Result<(), TestEnvError>
    where
        P: FnMut(&mut Processes) -> Option<&mut ManagedProcess>,
    {
        let mut config = Config::new(
            format!("https://127.0.0.1:{port}")
                .parse()
                .expect("a loopback url parses"),
        );
        config.accept_invalid_certs = true;
        config.connect_timeout = Some(Duration::from_secs(2));
        let client = Client::try_from(config)?;
        self.wait_ready(component, process, || {
            answers_ok(client.clone(), "/healthz")
        })
        .await
    }
}

/// Whether a GET of `path` answers `ok` (a component's /readyz or /healthz).
async fn answers_ok(client: Client, path: &'static str) -> Result<bool, String> {
    let request = http::Request::get(path)
        .body(Vec::new())
        .expect("a static request");
    client
        .request_text(request)
        .await
        .map(|body| body.trim() == "ok")
        .map_err(|e| e.to_string())
}

fn hit_kwok_start_race(log: &Path) -> bool {
    std::fs::read_to_string(log)
        .is_ok_and(|text| text.contains("concurrent map") || text.contains("wzshiming/easycel"))
}

#[cfg(test)]
mod tests {
    use super::{ClusterOptions, apiserver_args, hit_kwok_start_race};
    use crate::NODE_IP;
    use std::net::SocketAddr;
    use std::path::Path;

    #[test]
    fn in_node_mode_the_apiserver_serves_the_bridge_and_reaches_the_kubelet_by_address() {
        let addr = SocketAddr::from((NODE_IP, 6443));
        let args = apiserver_args(Path::new("/c"), 2379, addr, &ClusterOptions::node());
        for flag in [
            "--bind-address=10.244.0.1",
            "--advertise-address=10.244.0.1",
            // A kubelet's name would be looked up in the host's DNS, off this machine.
            "--kubelet-preferred-address-types=InternalIP",
        ] {
            assert!(args.iter().any(|a| a == flag), "{flag} in {args:?}");
        }
        assert!(
            !args
                .iter()
                .any(|a| a.starts_with("--endpoint-reconciler-type"))
        );

        let loopback = SocketAddr::from(([127, 0, 0, 1], 6443));
        let args = apiserver_args(Path::new("/c"), 2379, loopback, &ClusterOptions::full());
        assert!(args.iter().any(|a| a == "--bind-address=127.0.0.1"));
        assert!(args.iter().any(|a| a == "--endpoint-reconciler-type=none"));
    }

    #[test]
    fn every_cluster_turns_sharded_list_and_watch_on_unless_a_test_turns_it_off() {
        let addr = SocketAddr::from(([127, 0, 0, 1], 6443));
        for options in [
            ClusterOptions::apiserver_only(),
            ClusterOptions::full(),
            ClusterOptions::node(),
        ] {
            let args = apiserver_args(Path::new("/c"), 2379, addr, &options);
            assert!(
                args.iter()
                    .any(|a| a == "--feature-gates=ShardedListAndWatch=true"),
                "{args:?}"
            );
        }

        let off = ClusterOptions::apiserver_only().with_feature_gate("ShardedListAndWatch", false);
        let args = apiserver_args(Path::new("/c"), 2379, addr, &off);
        let gates: Vec<_> = args
            .iter()
            .filter(|a| a.starts_with("--feature-gates"))
            .collect();
        assert_eq!(gates, ["--feature-gates=ShardedListAndWatch=false"]);

        let none = ClusterOptions {
            feature_gates: Vec::new(),
            ..ClusterOptions::apiserver_only()
        };
        let args = apiserver_args(Path::new("/c"), 2379, addr, &none);
        assert!(!args.iter().any(|a| a.starts_with("--feature-gates")));
    }

    #[test]
    fn only_the_cel_start_up_crash_makes_kwok_start_again() {
        let dir = tempfile::tempdir().unwrap();
        let crash = dir.path().join("crash.log");
        std::fs::write(&crash, "fatal error: concurrent map writes\n\ngoroutine 1 [running]:\ngithub.com/wzshiming/easycel.getTypeValue(...)\n").unwrap();
        let bad_flag = dir.path().join("flag.log");
        std::fs::write(&bad_flag, "Error: unknown flag: --bogus\n").unwrap();
        assert!(hit_kwok_start_race(&crash));
        assert!(!hit_kwok_start_race(&bad_flag));
        assert!(!hit_kwok_start_race(&dir.path().join("missing.log")));
    }
}
