//! [`Cluster`]: etcd, kube-apiserver and optionally kube-controller-manager, kube-scheduler and
//! kwok, started on loopback and torn down on drop; or, in node mode, a real kubelet Node
//! (node/) with the apiserver on the pods' bridge.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Namespace, Node};
use kube_client::api::{Api, ObjectMeta, PostParams};
use kube_client::config::AuthInfo;
use kube_client::{Client, Config};
use parking_lot::Mutex;

use super::certs::{self, Authority, CertFiles};
use super::node::{self, NODE_IP, NODE_NAME, NodeConfig, NodeNetwork, NodePorts};
use super::ports::free_port;
use super::process::ManagedProcess;
use super::{TestEnvError, versions};

/// Which components to run besides etcd and kube-apiserver.
#[derive(Clone, Debug)]
pub struct ClusterOptions {
    /// kube-controller-manager: service accounts, garbage collection, Deployments, ReplicaSets.
    pub controller_manager: bool,
    /// kube-scheduler: binds Pods to the kwok node.
    pub scheduler: bool,
    /// kwok with one fake Node (`kwok-node-0`) that runs every Pod bound to it.
    pub kwok: bool,
    /// A real Node ([`NODE_NAME`]): containerd, kubelet and kube-proxy on this machine, the
    /// apiserver on the pods' bridge ([`NODE_IP`]) instead of loopback. One at a time per
    /// machine; needs root and `hack/setup-node`.
    pub node: bool,
    /// Extra kube-apiserver flags, e.g. `--watch-cache=false` so that watches read etcd directly.
    pub apiserver_args: Vec<String>,
    /// How long each component may take to become ready.
    pub ready_timeout: Duration,
}

impl ClusterOptions {
    /// etcd and kube-apiserver only: enough for informers, leases, CRDs.
    pub fn apiserver_only() -> Self {
        Self {
            controller_manager: false,
            scheduler: false,
            kwok: false,
            node: false,
            apiserver_args: Vec::new(),
            ready_timeout: Duration::from_secs(90),
        }
    }

    /// A cluster that runs workloads: controller-manager, scheduler and a kwok node too.
    pub fn full() -> Self {
        Self {
            controller_manager: true,
            scheduler: true,
            kwok: true,
            ..Self::apiserver_only()
        }
    }

    /// A cluster with a real kubelet Node instead of kwok: controller-manager, scheduler,
    /// containerd, kubelet and kube-proxy (see node/mod.rs).
    pub fn node() -> Self {
        Self {
            controller_manager: true,
            scheduler: true,
            node: true,
            ..Self::apiserver_only()
        }
    }
}

impl Default for ClusterOptions {
    fn default() -> Self {
        Self::apiserver_only()
    }
}

/// The name of the fake Node that kwok manages in a [`ClusterOptions::full`] cluster.
pub const KWOK_NODE: &str = "kwok-node-0";

/// kwok v0.8.0 registers CEL types in an unlocked global map (easycel's `typeValueMap`), so two
/// goroutines building CEL environments at start-up can kill it (Go's "concurrent map writes",
/// with a trace through easycel). It is rare (one CI run in many) and only at start-up, so the
/// harness starts kwok again, up to this many times, when its log shows that crash.
const KWOK_START_ATTEMPTS: u32 = 3;

fn hit_kwok_start_race(log: &Path) -> bool {
    std::fs::read_to_string(log)
        .is_ok_and(|text| text.contains("concurrent map") || text.contains("wzshiming/easycel"))
}

/// A running local control plane. Dropping it kills every component and removes its files.
pub struct Cluster {
    /// Declared first so it is dropped first: processes die before their files are removed.
    processes: Mutex<Processes>,
    dir: Dir,
    bin_dir: PathBuf,
    ca: Authority,
    admin: CertFiles,
    etcd_url: String,
    apiserver_addr: SocketAddr,
    apiserver_args: Vec<String>,
    kubeconfig_path: PathBuf,
    ready_timeout: Duration,
    users_issued: AtomicU64,
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

/// The cluster's working directory; removed on drop unless `KUBELOOP_KEEP_TESTENV` is set.
enum Dir {
    Temp(tempfile::TempDir),
    Kept(PathBuf),
}

impl Dir {
    fn path(&self) -> &Path {
        match self {
            Dir::Temp(t) => t.path(),
            Dir::Kept(p) => p,
        }
    }
}

impl Cluster {
    /// Starts the components `options` asks for and waits until each is ready.
    pub async fn start(options: ClusterOptions) -> Result<Self, TestEnvError> {
        let started = Instant::now();
        let bin_dir = versions::bin_dir();
        for name in [
            "etcd",
            "kube-apiserver",
            "kube-controller-manager",
            "kube-scheduler",
            "kwok",
        ] {
            let path = bin_dir.join(name);
            if !path.is_file() {
                return Err(TestEnvError::MissingBinary(path));
            }
        }
        let temp = tempfile::Builder::new()
            .prefix("kubeloop-testenv-")
            .tempdir()
            .map_err(|source| TestEnvError::Io {
                path: std::env::temp_dir(),
                source,
            })?;
        let dir = if std::env::var_os("KUBELOOP_KEEP_TESTENV").is_some() {
            Dir::Kept(temp.keep())
        } else {
            Dir::Temp(temp)
        };
        let root = dir.path().to_owned();
        for sub in ["pki", "logs", "etcd", "kcm", "scheduler"] {
            super::create_dir(&root.join(sub))?;
        }
        // The node's bridge exists before the apiserver, which listens on its address.
        let network = if options.node {
            Some(NodeNetwork::create()?)
        } else {
            None
        };
        let apiserver_ip = if options.node {
            NODE_IP
        } else {
            Ipv4Addr::LOCALHOST
        };
        let pki = root.join("pki");
        let ca = Authority::create(&pki)?;
        ca.serving_cert(&pki, "apiserver", &[IpAddr::V4(apiserver_ip)])?;
        let admin = ca.client_cert(&pki, "admin", "kubeloop-admin", &["system:masters"])?;
        if options.node {
            ca.client_cert(
                &pki,
                "apiserver-kubelet-client",
                "kube-apiserver-kubelet-client",
                &["system:masters"],
            )?;
        }
        certs::service_account_key(&pki)?;

        let etcd_port = free_port()?;
        let etcd_peer_port = free_port()?;
        let apiserver_addr = SocketAddr::from((apiserver_ip, free_port()?));
        let kubeconfig_path = root.join("admin.kubeconfig");
        let cluster = Cluster {
            processes: Mutex::new(Processes::default()),
            bin_dir,
            ca,
            admin,
            etcd_url: format!("http://127.0.0.1:{etcd_port}"),
            apiserver_addr,
            apiserver_args: apiserver_args(&root, etcd_port, apiserver_addr, &options),
            kubeconfig_path,
            ready_timeout: options.ready_timeout,
            users_issued: AtomicU64::new(0),
            dir,
        };
        write_kubeconfig(
            &cluster.kubeconfig_path,
            &cluster.apiserver_url(),
            &cluster.ca.cert_path,
            &cluster.admin,
        )?;

        let etcd_args = vec![
            "--name=etcd".into(),
            format!("--data-dir={}", root.join("etcd").display()),
            format!("--listen-client-urls={}", cluster.etcd_url),
            format!("--advertise-client-urls={}", cluster.etcd_url),
            format!("--listen-peer-urls=http://127.0.0.1:{etcd_peer_port}"),
            format!("--initial-advertise-peer-urls=http://127.0.0.1:{etcd_peer_port}"),
            format!("--initial-cluster=etcd=http://127.0.0.1:{etcd_peer_port}"),
            "--unsafe-no-fsync=true".into(),
            "--log-level=warn".into(),
        ];
        cluster.processes.lock().etcd = Some(cluster.spawn("etcd", &etcd_args)?);
        cluster.wait_etcd_ready().await?;
        tracing::info!(
            elapsed_ms = started.elapsed().as_millis() as u64,
            "testenv: etcd ready"
        );

        cluster.start_apiserver().await?;
        tracing::info!(elapsed_ms = started.elapsed().as_millis() as u64, url = %cluster.apiserver_url(), "testenv: kube-apiserver ready");

        if options.controller_manager {
            cluster.start_controller_manager().await?;
            tracing::info!(
                elapsed_ms = started.elapsed().as_millis() as u64,
                "testenv: kube-controller-manager ready"
            );
        }
        if options.scheduler {
            cluster.start_scheduler().await?;
            tracing::info!(
                elapsed_ms = started.elapsed().as_millis() as u64,
                "testenv: kube-scheduler ready"
            );
        }
        if let Some(network) = network {
            cluster.start_node(network).await?;
            tracing::info!(
                elapsed_ms = started.elapsed().as_millis() as u64,
                "testenv: kubelet node ready"
            );
        }
        if options.kwok {
            cluster.start_kwok().await?;
            tracing::info!(
                elapsed_ms = started.elapsed().as_millis() as u64,
                "testenv: kwok node ready"
            );
        }
        Ok(cluster)
    }

    /// `https://127.0.0.1:<port>` (`https://<NODE_IP>:<port>` in node mode).
    pub fn apiserver_url(&self) -> String {
        format!("https://{}", self.apiserver_addr)
    }

    /// The apiserver's address (for a [`super::FaultProxy`] in front of it): loopback, or
    /// [`NODE_IP`] in node mode.
    pub fn apiserver_addr(&self) -> SocketAddr {
        self.apiserver_addr
    }

    /// The admin kubeconfig (user `kubeloop-admin` in `system:masters`), usable with kubectl.
    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig_path
    }

    /// The cluster's working directory: `pki/`, `logs/<component>.log`, etcd's data.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The pids of the components running now (etcd first).
    pub fn component_pids(&self) -> Vec<u32> {
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

    /// Where the control-plane binaries (and kubectl) are.
    pub fn bin_dir(&self) -> &Path {
        &self.bin_dir
    }

    /// kube-client configuration for the admin user.
    pub fn client_config(&self) -> Config {
        self.config_for(&self.apiserver_url(), &self.admin)
    }

    /// Like [`Cluster::client_config`] but talking to `addr` (a [`super::FaultProxy`] or an
    /// [`super::HttpFaultProxy`]) instead.
    pub fn client_config_via(&self, addr: SocketAddr) -> Config {
        self.config_for(&format!("https://{addr}"), &self.admin)
    }

    /// A serving certificate for 127.0.0.1 signed by the cluster's CA, in memory (certificate
    /// and PKCS#8 key, DER): clients made with [`Cluster::client_config_via`] trust it.
    pub(super) fn serving_identity(&self, name: &str) -> Result<(Vec<u8>, Vec<u8>), TestEnvError> {
        self.ca.serving_identity(name)
    }

    /// A client for the admin user. Create one per tokio runtime: its connection pool lives there.
    pub async fn client(&self) -> Result<Client, TestEnvError> {
        Ok(Client::try_from(self.client_config())?)
    }

    /// Configuration for a user that is NOT an admin: a fresh client certificate with
    /// CN = `user` and O = `groups`. It can do only what RBAC grants it.
    pub fn user_config(&self, user: &str, groups: &[&str]) -> Result<Config, TestEnvError> {
        let n = self.users_issued.fetch_add(1, Ordering::Relaxed);
        let files =
            self.ca
                .client_cert(&self.dir().join("pki"), &format!("user-{n}"), user, groups)?;
        Ok(self.config_for(&self.apiserver_url(), &files))
    }

    /// Creates a namespace named `<prefix>-<random>` and returns its name.
    pub async fn new_namespace(&self, prefix: &str) -> Result<String, TestEnvError> {
        let client = self.client().await?;
        let api: Api<Namespace> = Api::all(client);
        let ns = Namespace {
            metadata: ObjectMeta {
                generate_name: Some(format!("{prefix}-")),
                ..ObjectMeta::default()
            },
            ..Namespace::default()
        };
        let created = api.create(&PostParams::default(), &ns).await?;
        Ok(created.metadata.name.unwrap_or_default())
    }

    /// Stops kube-apiserver (SIGTERM, then SIGKILL after 10 s). etcd keeps the data.
    pub async fn stop_apiserver(&self) {
        let process = self.processes.lock().apiserver.take();
        if let Some(mut process) = process {
            tokio::task::spawn_blocking(move || process.stop(Duration::from_secs(10)))
                .await
                .ok();
        }
    }

    /// Starts kube-apiserver on its original port (after [`Cluster::stop_apiserver`]) and waits
    /// until /readyz answers ok.
    pub async fn start_apiserver(&self) -> Result<(), TestEnvError> {
        let process = self.spawn("kube-apiserver", &self.apiserver_args)?;
        self.processes.lock().apiserver = Some(process);
        let client = Client::try_from(self.client_config())?;
        self.wait_ready(
            "kube-apiserver",
            |p| p.apiserver.as_mut(),
            || {
                let client = client.clone();
                async move {
                    let request = http::Request::get("/readyz")
                        .body(Vec::new())
                        .expect("a static request");
                    client
                        .request_text(request)
                        .await
                        .map(|body| body.trim() == "ok")
                        .map_err(|e| e.to_string())
                }
            },
        )
        .await
    }

    /// Compacts etcd up to its current revision, so a watch or list from an older
    /// resourceVersion that reaches etcd gets 410 Gone. Returns the compacted revision.
    pub async fn compact_etcd(&self) -> Result<i64, TestEnvError> {
        // etcd's JSON gateway: a range over an arbitrary key returns the header revision.
        let range = etcd_post(&self.etcd_url, "/v3/kv/range", r#"{"key":"Lw=="}"#).await?;
        let revision: i64 = range
            .get("header")
            .and_then(|h| h.get("revision"))
            .and_then(|r| {
                r.as_str()
                    .and_then(|s| s.parse().ok())
                    .or_else(|| r.as_i64())
            })
            .ok_or_else(|| TestEnvError::Etcd(format!("no header.revision in {range}")))?;
        etcd_post(
            &self.etcd_url,
            "/v3/kv/compaction",
            &format!(r#"{{"revision":"{revision}","physical":true}}"#),
        )
        .await?;
        Ok(revision)
    }

    fn config_for(&self, url: &str, identity: &CertFiles) -> Config {
        let mut config = Config::new(url.parse().expect("a loopback https url parses"));
        config.root_cert = Some(vec![self.ca.cert_der.clone()]);
        config.auth_info = AuthInfo {
            client_certificate: Some(identity.cert.display().to_string()),
            client_key: Some(identity.key.display().to_string()),
            ..AuthInfo::default()
        };
        config.default_namespace = "default".into();
        config.connect_timeout = Some(Duration::from_secs(5));
        config
    }

    fn spawn(&self, component: &str, args: &[String]) -> Result<ManagedProcess, TestEnvError> {
        let log = self.dir().join("logs").join(format!("{component}.log"));
        ManagedProcess::spawn(component, &self.bin_dir.join(component), args, &log)
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
        let deadline = Instant::now() + self.ready_timeout;
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
                    seconds: self.ready_timeout.as_secs(),
                    detail: last,
                });
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    async fn wait_etcd_ready(&self) -> Result<(), TestEnvError> {
        let url = self.etcd_url.clone();
        self.wait_ready(
            "etcd",
            |p| p.etcd.as_mut(),
            || {
                let url = url.clone();
                async move {
                    match etcd_get(&url, "/health").await {
                        Ok(body) => Ok(body.contains("\"health\":\"true\"")),
                        Err(e) => Err(e.to_string()),
                    }
                }
            },
        )
        .await
    }

    async fn start_controller_manager(&self) -> Result<(), TestEnvError> {
        let root = self.dir().to_owned();
        let port = free_port()?;
        let args = vec![
            format!("--kubeconfig={}", self.kubeconfig_path.display()),
            "--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics".into(),
            "--bind-address=127.0.0.1".into(),
            format!("--secure-port={port}"),
            format!("--cert-dir={}", root.join("kcm").display()),
            format!("--root-ca-file={}", self.ca.cert_path.display()),
            format!(
                "--service-account-private-key-file={}",
                root.join("pki/sa.key").display()
            ),
            "--leader-elect=false".into(),
            "--node-monitor-period=5s".into(),
            "--node-monitor-grace-period=40s".into(),
        ];
        let process = self.spawn("kube-controller-manager", &args)?;
        self.processes.lock().controller_manager = Some(process);
        self.wait_https_healthz("kube-controller-manager", port, |p| {
            p.controller_manager.as_mut()
        })
        .await?;
        // Ready for tests means Pods can be admitted: the service-account controller has made
        // the `default` ServiceAccount that admission requires in every namespace.
        let client = self.client().await?;
        self.wait_ready(
            "kube-controller-manager",
            |p| p.controller_manager.as_mut(),
            || {
                let api: Api<k8s_openapi::api::core::v1::ServiceAccount> =
                    Api::namespaced(client.clone(), "default");
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

    async fn start_scheduler(&self) -> Result<(), TestEnvError> {
        let port = free_port()?;
        let args = vec![
            format!("--kubeconfig={}", self.kubeconfig_path.display()),
            "--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics".into(),
            "--bind-address=127.0.0.1".into(),
            format!("--secure-port={port}"),
            format!("--cert-dir={}", self.dir().join("scheduler").display()),
            "--leader-elect=false".into(),
        ];
        let process = self.spawn("kube-scheduler", &args)?;
        self.processes.lock().scheduler = Some(process);
        self.wait_https_healthz("kube-scheduler", port, |p| p.scheduler.as_mut())
            .await
    }

    /// Starts the real Node (node/) with its own credentials, and waits until it is Ready.
    async fn start_node(&self, network: NodeNetwork) -> Result<(), TestEnvError> {
        let root = self.dir().to_owned();
        let pki = root.join("pki");
        let kubeconfig = |name: &str, user: &str, groups: &[&str]| {
            let files = self.ca.client_cert(&pki, name, user, groups)?;
            let path = root.join(format!("{name}.kubeconfig"));
            write_kubeconfig(&path, &self.apiserver_url(), &self.ca.cert_path, &files)?;
            Ok::<_, TestEnvError>(path)
        };
        // The Node authorizer's identity for a kubelet, and the user system:node-proxier binds.
        let kubelet = kubeconfig(
            "kubelet",
            &format!("system:node:{NODE_NAME}"),
            &["system:nodes"],
        )?;
        let kube_proxy = kubeconfig("kube-proxy", "system:kube-proxy", &[])?;
        let node = node::Node::start(
            network,
            NodeConfig {
                dir: &root.join("node"),
                bin_dir: &self.bin_dir,
                kubelet_kubeconfig: &kubelet,
                kube_proxy_kubeconfig: &kube_proxy,
                admin_kubeconfig: &self.kubeconfig_path,
                client_ca: &self.ca.cert_path,
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

        let nodes: Api<Node> = Api::all(self.client().await?);
        let deadline = Instant::now() + self.ready_timeout;
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
                    seconds: self.ready_timeout.as_secs(),
                    detail: last,
                });
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    async fn start_kwok(&self) -> Result<(), TestEnvError> {
        // Standalone kwok runs only the stages its configuration lists; hack/build-control-plane
        // assembles kwokctl's defaults (node ready + heartbeat, pod ready/complete/delete).
        let config = self.bin_dir.join("kwok-stages.yaml");
        if !config.is_file() {
            return Err(TestEnvError::MissingBinary(config));
        }
        // No `--server-address` and node port 0: kwok then serves no kubelet endpoints (logs,
        // exec, metrics), which nothing here uses, and skips building its metrics CEL environment,
        // the start-up step that races the stage controllers (see KWOK_START_RACE).
        let args = vec![
            format!("--kubeconfig={}", self.kubeconfig_path.display()),
            format!("--config={}", config.display()),
            "--manage-all-nodes=false".into(),
            "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake".into(),
            "--cidr=10.0.0.0/24".into(),
            "--node-ip=10.0.0.1".into(),
            "--node-port=0".into(),
        ];
        let client = self.client().await?;
        let nodes: Api<Node> = Api::all(client);
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
            let client = client.clone();
            async move {
                let request = http::Request::get("/healthz")
                    .body(Vec::new())
                    .expect("a static request");
                client
                    .request_text(request)
                    .await
                    .map(|body| body.trim() == "ok")
                    .map_err(|e| e.to_string())
            }
        })
        .await
    }
}

impl Cluster {
    /// Kills every component (dependants first, etcd last) and removes the working directory
    /// unless it is kept. SIGKILL is enough: nothing in a test cluster needs a graceful stop,
    /// and etcd runs with --unsafe-no-fsync on a directory about to go. Idempotent.
    fn teardown(&self) {
        let mut processes = self.processes.lock();
        processes.kwok.take();
        processes.scheduler.take();
        processes.controller_manager.take();
        processes.node.take();
        processes.apiserver.take();
        processes.etcd.take();
        match &self.dir {
            Dir::Kept(path) => {
                eprintln!("testenv: kept {} (KUBELOOP_KEEP_TESTENV)", path.display())
            }
            // TempDir removes it on drop too; removing here serves the shared clusters, which
            // live in statics and are never dropped.
            Dir::Temp(temp) => {
                let _ = std::fs::remove_dir_all(temp.path());
            }
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.teardown();
    }
}

/// The flag set of controller-runtime's envtest, plus what controller-manager needs (service
/// account keys) and Node,RBAC authorization as kwokctl runs it.
fn apiserver_args(
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
    args.extend(options.apiserver_args.iter().cloned());
    args
}

fn write_kubeconfig(
    path: &Path,
    server: &str,
    ca: &Path,
    user: &CertFiles,
) -> Result<(), TestEnvError> {
    let text = format!(
        "apiVersion: v1
kind: Config
clusters:
- name: kubeloop-testenv
  cluster:
    server: {server}
    certificate-authority: {ca}
users:
- name: kubeloop-admin
  user:
    client-certificate: {cert}
    client-key: {key}
contexts:
- name: kubeloop-testenv
  context:
    cluster: kubeloop-testenv
    user: kubeloop-admin
    namespace: default
current-context: kubeloop-testenv
",
        ca = ca.display(),
        cert = user.cert.display(),
        key = user.key.display(),
    );
    super::write_file(path, &text)
}

/// A one-shot HTTP/1.1 request to etcd's client port (plain http on loopback). Small enough
/// to write by hand, and it keeps a second HTTP client stack out of the harness.
async fn etcd_request(
    base: &str,
    method: &str,
    path: &str,
    body: &str,
) -> Result<String, TestEnvError> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let host = base.trim_start_matches("http://");
    let mut stream = tokio::net::TcpStream::connect(host)
        .await
        .map_err(|e| TestEnvError::Etcd(format!("connect {host}: {e}")))?;
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream
        .write_all(request.as_bytes())
        .await
        .map_err(|e| TestEnvError::Etcd(e.to_string()))?;
    let mut response = Vec::new();
    stream
        .read_to_end(&mut response)
        .await
        .map_err(|e| TestEnvError::Etcd(e.to_string()))?;
    let response = String::from_utf8_lossy(&response).into_owned();
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    if !head.starts_with("HTTP/1.1 200") {
        return Err(TestEnvError::Etcd(format!(
            "{method} {path}: {head} {body}"
        )));
    }
    Ok(body.to_owned())
}

async fn etcd_get(base: &str, path: &str) -> Result<String, TestEnvError> {
    etcd_request(base, "GET", path, "").await
}

async fn etcd_post(base: &str, path: &str, body: &str) -> Result<serde_json::Value, TestEnvError> {
    let text = etcd_request(base, "POST", path, body).await?;
    serde_json::from_str(&text).map_err(|e| TestEnvError::Etcd(format!("{path}: {e}: {text}")))
}

static SHARED: tokio::sync::OnceCell<Cluster> = tokio::sync::OnceCell::const_new();
static SHARED_FULL: tokio::sync::OnceCell<Cluster> = tokio::sync::OnceCell::const_new();

/// One etcd + kube-apiserver shared by every test in this test binary, started on first use.
/// Statics are never dropped, so an exit hook tears it down (and removes its files) when the
/// test binary exits normally; the parent-death signal covers every other way out.
pub async fn shared() -> &'static Cluster {
    SHARED
        .get_or_init(|| start_shared(ClusterOptions::apiserver_only()))
        .await
}

/// Like [`shared`], with controller-manager, scheduler and a kwok node.
pub async fn shared_full() -> &'static Cluster {
    SHARED_FULL
        .get_or_init(|| start_shared(ClusterOptions::full()))
        .await
}

async fn start_shared(options: ClusterOptions) -> Cluster {
    static HOOK: std::sync::Once = std::sync::Once::new();
    HOOK.call_once(|| {
        extern "C" fn teardown_shared() {
            for cluster in [SHARED.get(), SHARED_FULL.get()].into_iter().flatten() {
                cluster.teardown();
            }
        }
        // SAFETY: registering a plain extern "C" fn; it runs at exit(3), after libtest is done.
        unsafe {
            libc::atexit(teardown_shared);
        }
    });
    Cluster::start(options)
        .await
        .unwrap_or_else(|e| panic!("testenv: {e}"))
}

#[cfg(test)]
mod tests {
    use super::{ClusterOptions, NODE_IP, apiserver_args, hit_kwok_start_race};
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
