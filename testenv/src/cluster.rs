//! [`Cluster`]: one local control plane as a test sees it. It owns the working directory, the
//! certificates and the admin kubeconfig, starts the components (components.rs) in order,
//! hands out clients and identities, and tears everything down on drop; in node mode a real
//! kubelet Node (node/) runs and the apiserver listens on the pods' bridge. [`shared`] and
//! [`shared_full`] are the clusters every test of one test binary shares.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Namespace;
use kube_client::api::{Api, ObjectMeta, PostParams};
use kube_client::config::AuthInfo;
use kube_client::{Client, Config};

use super::certs::{self, Authority, CertFiles};
use super::components::{self, Components, Setup};
use super::etcd::EtcdClient;
use super::kubeconfig::write_kubeconfig;
use super::node::{NODE_IP, NODE_NAME, NodeNetwork};
use super::options::ClusterOptions;
use super::ports::free_port;
use super::versions;
use super::{TestEnvError, create_dir};

/// A running local control plane. Dropping it kills every component and removes its files.
pub struct Cluster {
    /// Declared first so it is dropped first: processes die before their files are removed.
    components: Components,
    dir: Dir,
    ca: Authority,
    admin: CertFiles,
    etcd: EtcdClient,
    apiserver_addr: SocketAddr,
    apiserver_args: Vec<String>,
    kubeconfig_path: PathBuf,
    users_issued: AtomicU64,
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
        components::check_binaries(&bin_dir)?;
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
        let pki = root.join("pki");
        create_dir(&pki)?;
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
        let apiserver_url = format!("https://{apiserver_addr}");
        let kubeconfig_path = root.join("admin.kubeconfig");
        write_kubeconfig(&kubeconfig_path, &apiserver_url, &ca.cert_path, &admin)?;
        let components = Components::new(Setup {
            bin_dir,
            dir: root.clone(),
            kubeconfig: kubeconfig_path.clone(),
            admin: client_config(&apiserver_url, &ca, &admin),
            ca_cert: ca.cert_path.clone(),
            ready_timeout: options.ready_timeout,
        })?;
        let cluster = Cluster {
            components,
            ca,
            admin,
            etcd: EtcdClient::local(etcd_port),
            apiserver_addr,
            apiserver_args: components::apiserver_args(&root, etcd_port, apiserver_addr, &options),
            kubeconfig_path,
            users_issued: AtomicU64::new(0),
            dir,
        };
        let elapsed_ms = || started.elapsed().as_millis() as u64;

        cluster
            .components
            .start_etcd(&cluster.etcd, etcd_peer_port)
            .await?;
        tracing::info!(elapsed_ms = elapsed_ms(), "testenv: etcd ready");

        cluster.start_apiserver().await?;
        tracing::info!(elapsed_ms = elapsed_ms(), url = %cluster.apiserver_url(), "testenv: kube-apiserver ready");

        if options.controller_manager {
            cluster.components.start_controller_manager().await?;
            tracing::info!(
                elapsed_ms = elapsed_ms(),
                "testenv: kube-controller-manager ready"
            );
        }
        if options.scheduler {
            cluster.components.start_scheduler().await?;
            tracing::info!(elapsed_ms = elapsed_ms(), "testenv: kube-scheduler ready");
        }
        if let Some(network) = network {
            cluster.start_node(network).await?;
            tracing::info!(elapsed_ms = elapsed_ms(), "testenv: kubelet node ready");
        }
        if options.kwok {
            cluster.components.start_kwok().await?;
            tracing::info!(elapsed_ms = elapsed_ms(), "testenv: kwok node ready");
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
        self.components.pids()
    }

    /// Where the control-plane binaries (and kubectl) are.
    pub fn bin_dir(&self) -> &Path {
        self.components.bin_dir()
    }

    /// kube-client configuration for the admin user.
    pub fn client_config(&self) -> Config {
        client_config(&self.apiserver_url(), &self.ca, &self.admin)
    }

    /// Like [`Cluster::client_config`] but talking to `addr` (a [`super::FaultProxy`] or an
    /// [`super::HttpFaultProxy`]) instead.
    pub fn client_config_via(&self, addr: SocketAddr) -> Config {
        client_config(&format!("https://{addr}"), &self.ca, &self.admin)
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
        Ok(client_config(&self.apiserver_url(), &self.ca, &files))
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
        self.components.stop_apiserver().await;
    }

    /// Starts kube-apiserver on its original port (after [`Cluster::stop_apiserver`]) and waits
    /// until /readyz answers ok.
    pub async fn start_apiserver(&self) -> Result<(), TestEnvError> {
        self.components.start_apiserver(&self.apiserver_args).await
    }

    /// Compacts etcd up to its current revision, so a watch or list from an older
    /// resourceVersion that reaches etcd gets 410 Gone. Returns the compacted revision.
    pub async fn compact_etcd(&self) -> Result<i64, TestEnvError> {
        self.etcd.compact().await
    }

    /// Starts the real Node (node/) with its own credentials, and waits until it is Ready.
    async fn start_node(&self, network: NodeNetwork) -> Result<(), TestEnvError> {
        let root = self.dir();
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
        self.components
            .start_node(network, &kubelet, &kube_proxy)
            .await
    }

    /// Kills every component (dependants first, etcd last) and removes the working directory
    /// unless it is kept. SIGKILL is enough: nothing in a test cluster needs a graceful stop,
    /// and etcd runs with --unsafe-no-fsync on a directory about to go. Idempotent.
    fn teardown(&self) {
        self.components.stop_all();
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

/// kube-client configuration for the apiserver at `url`, trusting the cluster's CA and
/// authenticating with `identity`'s client certificate.
fn client_config(url: &str, ca: &Authority, identity: &CertFiles) -> Config {
    let mut config = Config::new(url.parse().expect("a loopback https url parses"));
    config.root_cert = Some(vec![ca.cert_der.clone()]);
    config.auth_info = AuthInfo {
        client_certificate: Some(identity.cert.display().to_string()),
        client_key: Some(identity.key.display().to_string()),
        ..AuthInfo::default()
    };
    config.default_namespace = "default".into();
    config.connect_timeout = Some(Duration::from_secs(5));
    config
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
