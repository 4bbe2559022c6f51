//! [`Node`]: containerd, the kubelet and kube-proxy, started in that order with their state in
//! the node's directory, and stopped on drop so that nothing of them stays on the host.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use super::addresses::{ENGINE_LABEL, NODE_IP, NODE_NAME};
use super::configs::{cni_config, containerd_config, kube_proxy_config, kubelet_config};
use super::host::{self, KernelTunables, NodeNetwork};
use crate::process::ManagedProcess;
use crate::{TestEnvError, create_dir, write_file as write};

/// How long containerd may take to answer.
const CONTAINERD_TIMEOUT: Duration = Duration::from_secs(30);
/// How long stopping the pods through the kubelet may take on drop before they are killed.
const POD_STOP_TIMEOUT: Duration = Duration::from_secs(45);

/// The running node. Dropping it stops every pod through the kubelet (so CNI releases each
/// veth and address), kills what is left through containerd, stops the daemons, puts back the
/// host's sysctls and sweeps the rest (host.rs), and finally removes the bridge.
pub(crate) struct Node {
    // `Drop` takes the processes in order: kube-proxy, the kubelet, containerd.
    kube_proxy: Option<ManagedProcess>,
    kubelet: Option<ManagedProcess>,
    containerd: Option<ManagedProcess>,
    dir: PathBuf,
    socket: PathBuf,
    kube_proxy_binary: PathBuf,
    kube_proxy_healthz: SocketAddr,
    admin_kubeconfig: PathBuf,
    kubectl: PathBuf,
    tunables: KernelTunables,
    /// Declared last: the bridge and the lock go after everything else.
    _network: NodeNetwork,
}

/// What the cluster hands the node: credentials it issued and where things are.
pub(crate) struct NodeConfig<'a> {
    /// The node's working directory (inside the cluster's).
    pub dir: &'a Path,
    /// kubelet, kube-proxy, kubectl.
    pub bin_dir: &'a Path,
    /// The kubelet's kubeconfig (user `system:node:<name>` in `system:nodes`).
    pub kubelet_kubeconfig: &'a Path,
    /// kube-proxy's kubeconfig (user `system:kube-proxy`).
    pub kube_proxy_kubeconfig: &'a Path,
    /// The admin kubeconfig, for stopping the pods on drop.
    pub admin_kubeconfig: &'a Path,
    /// The CA that signs client certificates (the kubelet authenticates the apiserver with it).
    pub client_ca: &'a Path,
    /// Free loopback ports for the daemons' own servers.
    pub ports: NodePorts,
}

/// Loopback ports of the daemons' own servers (the kubelet's API is on [`NODE_IP`]:10250).
pub(crate) struct NodePorts {
    pub kubelet_healthz: u16,
    pub kube_proxy_healthz: u16,
    pub kube_proxy_metrics: u16,
}

/// Whether the Node's `Ready` condition is `True`.
pub(crate) fn is_ready(node: &k8s_openapi::api::core::v1::Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

impl Node {
    /// Starts containerd, imports the images, then starts the kubelet and kube-proxy. The
    /// caller waits until [`Node::exited`] says nothing and the Node is Ready and
    /// `healthz_ok(kube_proxy_healthz())`.
    pub(crate) async fn start(
        network: NodeNetwork,
        config: NodeConfig<'_>,
    ) -> Result<Self, TestEnvError> {
        let dir = config.dir.to_owned();
        for sub in ["cni", "cni-ipam", "kubelet", "pod-logs", "containerd"] {
            create_dir(&dir.join(sub))?;
        }
        let containerd_binary = on_path("containerd")?;
        let kubelet_binary = in_dir(config.bin_dir, "kubelet")?;
        let kube_proxy_binary = in_dir(config.bin_dir, "kube-proxy")?;
        let archives = image_archives(config.bin_dir)?;
        let socket = dir.join("containerd.sock");
        let ports = config.ports;
        let mut node = Node {
            kube_proxy: None,
            kubelet: None,
            containerd: None,
            socket: socket.clone(),
            kube_proxy_binary: kube_proxy_binary.clone(),
            kube_proxy_healthz: SocketAddr::from((Ipv4Addr::LOCALHOST, ports.kube_proxy_healthz)),
            admin_kubeconfig: config.admin_kubeconfig.to_owned(),
            kubectl: config.bin_dir.join("kubectl"),
            tunables: KernelTunables::save(),
            dir: dir.clone(),
            _network: network,
        };

        write(&dir.join("containerd.toml"), &containerd_config(&dir))?;
        write(&dir.join("cni/10-kubeloop.conflist"), &cni_config(&dir))?;
        let config_flag = |file: &str| format!("--config={}", dir.join(file).display());
        node.containerd = Some(spawn(
            &dir,
            "containerd",
            &containerd_binary,
            &[config_flag("containerd.toml")],
        )?);
        node.wait_for_containerd().await?;
        for archive in archives {
            node.ctr(&["images", "import", &archive.display().to_string()])?;
        }

        write(
            &dir.join("kubelet.yaml"),
            &kubelet_config(&dir, &socket, config.client_ca, ports.kubelet_healthz),
        )?;
        node.kubelet = Some(spawn(
            &dir,
            "kubelet",
            &kubelet_binary,
            &[
                config_flag("kubelet.yaml"),
                format!("--kubeconfig={}", config.kubelet_kubeconfig.display()),
                format!("--root-dir={}", dir.join("kubelet").display()),
                format!("--hostname-override={NODE_NAME}"),
                format!("--node-ip={NODE_IP}"),
                format!("--node-labels={ENGINE_LABEL}"),
                "--v=1".into(),
            ],
        )?);

        write(
            &dir.join("kube-proxy.yaml"),
            &kube_proxy_config(
                config.kube_proxy_kubeconfig,
                ports.kube_proxy_healthz,
                ports.kube_proxy_metrics,
            ),
        )?;
        node.kube_proxy = Some(spawn(
            &dir,
            "kube-proxy",
            &kube_proxy_binary,
            &[config_flag("kube-proxy.yaml")],
        )?);
        Ok(node)
    }

    /// The pids of containerd, the kubelet and kube-proxy.
    pub(crate) fn pids(&self) -> Vec<u32> {
        [&self.containerd, &self.kubelet, &self.kube_proxy]
            .into_iter()
            .flatten()
            .map(ManagedProcess::pid)
            .collect()
    }

    /// The daemon that exited, with its log's tail, if one did.
    pub(crate) fn exited(&mut self) -> Option<TestEnvError> {
        for process in [
            &mut self.containerd,
            &mut self.kubelet,
            &mut self.kube_proxy,
        ]
        .into_iter()
        .flatten()
        {
            if let Some(status) = process.exited() {
                return Some(TestEnvError::Exited {
                    component: process.name().to_owned(),
                    status: status.to_string(),
                    log: process.log_path().to_owned(),
                    tail: process.log_tail(30),
                });
            }
        }
        None
    }

    /// Where kube-proxy answers /healthz: 200 once it has programmed the Services (the
    /// `kubernetes` one included), so that pods reach the apiserver.
    pub(crate) fn kube_proxy_healthz(&self) -> SocketAddr {
        self.kube_proxy_healthz
    }

    /// `ctr --address <socket> -n k8s.io <args>` (the CRI's namespace).
    fn ctr(&self, args: &[&str]) -> Result<String, TestEnvError> {
        let socket = self.socket.display().to_string();
        let mut all = vec!["--address", &socket, "--namespace", "k8s.io"];
        all.extend_from_slice(args);
        host::run("ctr", &all)
    }

    async fn wait_for_containerd(&mut self) -> Result<(), TestEnvError> {
        let deadline = tokio::time::Instant::now() + CONTAINERD_TIMEOUT;
        loop {
            let last = match self.ctr(&["version"]) {
                Ok(_) => return Ok(()),
                Err(e) => e.to_string(),
            };
            if let Some(exited) = self.exited() {
                return Err(exited);
            }
            if tokio::time::Instant::now() > deadline {
                return Err(TestEnvError::NotReady {
                    component: "containerd".into(),
                    seconds: CONTAINERD_TIMEOUT.as_secs(),
                    detail: last,
                });
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The tasks (running containers, sandboxes included) containerd holds.
    fn tasks(&self) -> Vec<String> {
        self.ctr(&["tasks", "ls", "--quiet"])
            .map(|out| out.lines().map(str::to_owned).collect())
            .unwrap_or_default()
    }

    /// Stops every pod through the kubelet: deletes them (at once, no grace) and waits until
    /// containerd runs no task. The kubelet then has stopped each sandbox, so CNI has released
    /// its veth and address. The cluster has stopped the scheduler and the controller-manager
    /// first, so no pod comes back. Sleeps the thread: it runs in `Drop`.
    fn stop_pods(&self) {
        let deleted = Command::new(&self.kubectl)
            .arg("--kubeconfig")
            .arg(&self.admin_kubeconfig)
            .args(["delete", "pods", "--all", "--all-namespaces", "--force"])
            .args(["--grace-period=0", "--wait=false", "--request-timeout=10s"])
            .output();
        if deleted.is_err() {
            return;
        }
        let deadline = Instant::now() + POD_STOP_TIMEOUT;
        while !self.tasks().is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if self.kubelet.is_some() && self.containerd.is_some() {
            self.stop_pods();
        }
        self.kube_proxy.take();
        self.kubelet.take();
        self.tunables.restore();
        // What the kubelet did not stop: killed and removed through containerd, which then
        // unmounts their root filesystems and ends their shims.
        if self.containerd.is_some() {
            let left = self.tasks();
            if !left.is_empty() {
                eprintln!(
                    "testenv: killing {} containers the kubelet left",
                    left.len()
                );
            }
            for task in left {
                let _ = self.ctr(&["tasks", "kill", "--signal", "SIGKILL", &task]);
                let _ = self.ctr(&["tasks", "delete", "--force", &task]);
            }
        }
        if let Some(mut containerd) = self.containerd.take() {
            containerd.stop(Duration::from_secs(5));
        }
        // kube-proxy's own clean-up removes its chains; the sweep removes the kubelet's (it has
        // no clean-up) and whatever else is left.
        let _ = Command::new(&self.kube_proxy_binary)
            .args(["--cleanup", "--v=0"])
            .output();
        let dir = self.dir.clone();
        host::sweep(&move |path| std::path::Path::new(path).starts_with(&dir));
    }
}

/// `GET /healthz` over plain HTTP on loopback answered 200 (kube-proxy's health server).
pub(crate) fn healthz_ok(addr: SocketAddr) -> bool {
    let Ok(mut stream) = TcpStream::connect_timeout(&addr, Duration::from_secs(1)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    let request = format!("GET /healthz HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    let mut response = String::new();
    stream.write_all(request.as_bytes()).is_ok()
        && stream.read_to_string(&mut response).is_ok()
        && response.starts_with("HTTP/1.1 200")
}

/// The archives `hack/setup-node` saved: `$KUBELOOP_NODE_IMAGES`, else `<bin dir>/node-images`.
fn image_archives(bin_dir: &Path) -> Result<Vec<PathBuf>, TestEnvError> {
    let dir = std::env::var_os("KUBELOOP_NODE_IMAGES")
        .map(PathBuf::from)
        .unwrap_or_else(|| bin_dir.join("node-images"));
    let archives: Vec<PathBuf> = ["pause.tar", "kubeloop.tar"]
        .iter()
        .map(|name| dir.join(name))
        .collect();
    match archives.iter().find(|a| !a.is_file()) {
        Some(missing) => Err(TestEnvError::NodeSetup(format!(
            "no image archive {}",
            missing.display()
        ))),
        None => Ok(archives),
    }
}

fn spawn(
    dir: &Path,
    name: &str,
    binary: &Path,
    args: &[String],
) -> Result<ManagedProcess, TestEnvError> {
    ManagedProcess::spawn(name, binary, args, &dir.join(format!("{name}.log")))
}

fn on_path(name: &str) -> Result<PathBuf, TestEnvError> {
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|paths| std::env::split_paths(&paths).collect::<Vec<_>>())
        .chain([PathBuf::from("/usr/bin"), PathBuf::from("/usr/sbin")])
        .map(|dir| dir.join(name))
        .find(|path| path.is_file())
        .ok_or_else(|| TestEnvError::NodeSetup(format!("no {name} on PATH")))
}

fn in_dir(dir: &Path, name: &str) -> Result<PathBuf, TestEnvError> {
    let path = dir.join(name);
    if path.is_file() {
        Ok(path)
    } else {
        Err(TestEnvError::NodeSetup(format!("no {}", path.display())))
    }
}
