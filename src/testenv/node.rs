//! A real kubelet Node ([`super::ClusterOptions::node`]): containerd, the kubelet and
//! kube-proxy on this machine, running real containers from local images.
//!
//! Counterpart: what `kubeadm join` plus a CNI plugin set up on a node, scaled down to one
//! machine that is also the control plane. `hack/setup-node` installs containerd and builds
//! the kubelet, kube-proxy and the image archives; this module runs them per cluster.
//!
//! The network, and why it looks like this:
//! - Pods live on the bridge [`BRIDGE`] with the subnet [`POD_SUBNET`]; the bridge's own
//!   address [`NODE_IP`] is the pods' gateway, the Node's InternalIP, and where the apiserver
//!   listens. So a pod reaches the apiserver without any address outside this machine, and the
//!   `kubernetes` Service (what `KUBERNETES_SERVICE_HOST` names) gets that address as its
//!   endpoint (the apiserver's lease endpoint reconciler), which kube-proxy routes to.
//! - A FORWARD rule drops whatever the pods send off the bridge: nothing a pod does may reach
//!   an address outside this machine (the host forwards packets, for podman). Pods get no DNS
//!   servers (the kubelet's `resolvConf` is empty), and every image is imported from a local
//!   archive, named `localhost/...` so that even a mistaken pull would go to loopback.
//!
//! Invariants:
//! - One node cluster per machine at a time (the bridge, its subnet, the kubelet's port 10250
//!   and kube-proxy's rules are the host's): [`NodeNetwork`] holds an exclusive lock on
//!   [`LOCK_FILE`] from before the bridge exists until after it is gone.
//! - containerd's and the kubelet's state live in the cluster's directory; on drop every pod is
//!   stopped through the kubelet (so CNI releases its veth and address), then whatever is left
//!   is killed through containerd, every mount under the directory is detached, kube-proxy's
//!   rules are removed, and the bridge and the guard rule go.

use std::fs::File;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use super::TestEnvError;
use super::process::ManagedProcess;

/// The Node's name.
pub const NODE_NAME: &str = "kubeloop-node-0";
/// The label the node carries for deploy/vm-controller.yaml's nodeSelector: the
/// Docker-API engine (hack/setup-podman's socket) is on this machine.
pub const ENGINE_LABEL: &str = "kubeloop.dev/engine=true";
/// The bridge's address: the pods' gateway, the Node's InternalIP, the apiserver's address.
pub const NODE_IP: Ipv4Addr = Ipv4Addr::new(10, 244, 0, 1);
/// The pods' subnet, on [`BRIDGE`].
pub const POD_SUBNET: &str = "10.244.0.0/24";
/// The Linux bridge the harness makes and the CNI bridge plugin attaches pods to.
pub const BRIDGE: &str = "kubeloop0";
/// Held (flock) by the one node cluster this machine may run at a time.
const LOCK_FILE: &str = "/run/kubeloop/node.lock";
/// The sandbox image `hack/setup-node` builds (hack/go/pause) and saves as `pause.tar`.
const SANDBOX_IMAGE: &str = "localhost/kubeloop/pause:1.0";
/// Where Debian's containernetworking-plugins put the CNI plugins.
const CNI_BIN_DIR: &str = "/usr/lib/cni";
/// The sysctls the kubelet sets at start (its container manager's `setupKernelTunables`, as
/// `protectKernelDefaults: false` lets it): saved before it starts and put back on drop, so the
/// host keeps its own (kernel.panic comes from this machine's kernel command line, say).
const KERNEL_TUNABLES: [&str; 6] = [
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
];
/// How long stopping the pods through the kubelet may take on drop before they are killed.
const POD_STOP_TIMEOUT: Duration = Duration::from_secs(45);

/// The host side of the node: the lock, the bridge with [`NODE_IP`], and the rule that keeps
/// pod traffic on this machine. Made before the apiserver starts (it listens on the bridge's
/// address); undone on drop.
pub(super) struct NodeNetwork {
    _lock: File,
}

/// The running node: containerd, the kubelet and kube-proxy. Dropping it stops every pod and
/// removes what the node left on the host (see the module docs).
pub(super) struct Node {
    // Field order is drop order for what `Drop` does not take itself.
    kube_proxy: Option<ManagedProcess>,
    kubelet: Option<ManagedProcess>,
    containerd: Option<ManagedProcess>,
    dir: PathBuf,
    socket: PathBuf,
    kube_proxy_binary: PathBuf,
    admin_kubeconfig: PathBuf,
    kubectl: PathBuf,
    /// `/proc/sys/...` and its value before the kubelet started.
    saved_tunables: Vec<(PathBuf, String)>,
    /// Declared last: the bridge and the lock go after everything else.
    _network: NodeNetwork,
}

/// What the cluster hands the node: credentials it issued and where things are.
pub(super) struct NodeConfig<'a> {
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
    /// A free loopback port for the kubelet's healthz, and one each for kube-proxy's healthz
    /// and metrics.
    pub ports: [u16; 3],
}

/// Whether the Node's `Ready` condition is `True`.
pub(super) fn is_ready(node: &k8s_openapi::api::core::v1::Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

impl NodeNetwork {
    /// Takes the machine's node lock (waiting for another node cluster to finish), then makes
    /// the bridge and the guard rule, replacing what a killed run may have left.
    pub(super) fn create() -> Result<Self, TestEnvError> {
        let lock_path = Path::new(LOCK_FILE);
        if let Some(parent) = lock_path.parent() {
            std::fs::create_dir_all(parent).map_err(|source| TestEnvError::Io {
                path: parent.to_owned(),
                source,
            })?;
        }
        let lock = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(lock_path)
            .map_err(|source| TestEnvError::Io {
                path: lock_path.to_owned(),
                source,
            })?;
        // SAFETY: flock(2) on a descriptor we own; it blocks until the other holder exits.
        if unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&lock), libc::LOCK_EX) } != 0 {
            return Err(TestEnvError::Io {
                path: lock_path.to_owned(),
                source: std::io::Error::last_os_error(),
            });
        }
        remove_network();
        let address = format!("{NODE_IP}/24");
        run("ip", &["link", "add", BRIDGE, "type", "bridge"])?;
        run("ip", &["addr", "add", &address, "dev", BRIDGE])?;
        run("ip", &["link", "set", BRIDGE, "up"])?;
        run("iptables", &guard_rule("-I"))?;
        Ok(Self { _lock: lock })
    }
}

impl Drop for NodeNetwork {
    fn drop(&mut self) {
        remove_network();
    }
}

/// `iptables <op> FORWARD ...`: drop what comes from the pods' bridge and leaves by another
/// interface. Pod-to-pod and pod-to-node traffic (the apiserver, through the `kubernetes`
/// Service) never takes FORWARD off the bridge, so it is untouched.
fn guard_rule(op: &str) -> Vec<&str> {
    vec![
        op,
        "FORWARD",
        "-i",
        BRIDGE,
        "!",
        "-o",
        BRIDGE,
        "-m",
        "comment",
        "--comment",
        "kubeloop node: pods stay on this machine",
        "-j",
        "DROP",
    ]
}

/// Removes the guard rule (every copy) and the bridge; quiet when they are not there.
fn remove_network() {
    while run("iptables", &guard_rule("-D")).is_ok() {}
    // Veths of pods the kubelet did not stop would keep their addresses: deleting one end of a
    // veth deletes the pair.
    if let Ok(ports) = std::fs::read_dir(format!("/sys/class/net/{BRIDGE}/brif")) {
        for port in ports.flatten() {
            let _ = run("ip", &["link", "del", &port.file_name().to_string_lossy()]);
        }
    }
    let _ = run("ip", &["link", "del", BRIDGE]);
}

impl Node {
    /// Starts containerd, imports the images, then starts the kubelet and kube-proxy. The
    /// caller waits for the Node to be Ready.
    pub(super) fn start(
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
        let socket = dir.join("containerd.sock");
        let mut node = Node {
            kube_proxy: None,
            kubelet: None,
            containerd: None,
            socket: socket.clone(),
            kube_proxy_binary: kube_proxy_binary.clone(),
            admin_kubeconfig: config.admin_kubeconfig.to_owned(),
            kubectl: config.bin_dir.join("kubectl"),
            saved_tunables: KERNEL_TUNABLES
                .iter()
                .map(|name| Path::new("/proc/sys").join(name))
                .filter_map(|path| Some((path.clone(), std::fs::read_to_string(&path).ok()?)))
                .collect(),
            dir: dir.clone(),
            _network: network,
        };

        write(&dir.join("containerd.toml"), &containerd_config(&dir))?;
        write(&dir.join("cni/10-kubeloop.conflist"), &cni_config(&dir))?;
        node.containerd = Some(spawn(
            &dir,
            "containerd",
            &containerd_binary,
            &[format!(
                "--config={}",
                dir.join("containerd.toml").display()
            )],
        )?);
        node.wait_for_containerd()?;
        for archive in image_archives(config.bin_dir)? {
            node.ctr(&["images", "import", &archive.display().to_string()])?;
        }

        let [kubelet_healthz, proxy_healthz, proxy_metrics] = config.ports;
        write(
            &dir.join("kubelet.yaml"),
            &kubelet_config(&dir, &socket, config.client_ca, kubelet_healthz),
        )?;
        node.kubelet = Some(spawn(
            &dir,
            "kubelet",
            &kubelet_binary,
            &[
                format!("--config={}", dir.join("kubelet.yaml").display()),
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
            &kube_proxy_config(config.kube_proxy_kubeconfig, proxy_healthz, proxy_metrics),
        )?;
        node.kube_proxy = Some(spawn(
            &dir,
            "kube-proxy",
            &kube_proxy_binary,
            &[format!(
                "--config={}",
                dir.join("kube-proxy.yaml").display()
            )],
        )?);
        Ok(node)
    }

    /// The pids of containerd, the kubelet and kube-proxy.
    pub(super) fn pids(&self) -> Vec<u32> {
        [&self.containerd, &self.kubelet, &self.kube_proxy]
            .into_iter()
            .flatten()
            .map(ManagedProcess::pid)
            .collect()
    }

    /// The component that exited, with its log's tail, if any did.
    pub(super) fn exited(&mut self) -> Option<TestEnvError> {
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

    /// `ctr --address <socket> -n k8s.io <args>` (the CRI's namespace).
    fn ctr(&self, args: &[&str]) -> Result<String, TestEnvError> {
        let socket = self.socket.display().to_string();
        let mut all = vec!["--address", &socket, "--namespace", "k8s.io"];
        all.extend_from_slice(args);
        run("ctr", &all)
    }

    fn wait_for_containerd(&mut self) -> Result<(), TestEnvError> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let last = match self.ctr(&["version"]) {
                Ok(_) => return Ok(()),
                Err(e) => e.to_string(),
            };
            if let Some(exited) = self.exited() {
                return Err(exited);
            }
            if Instant::now() > deadline {
                return Err(TestEnvError::NotReady {
                    component: "containerd".into(),
                    seconds: 30,
                    detail: last,
                });
            }
            std::thread::sleep(Duration::from_millis(200));
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
    /// its veth and address. The callers have stopped the scheduler and the controller-manager,
    /// so no pod comes back.
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
        for (path, value) in &self.saved_tunables {
            let _ = std::fs::write(path, value);
        }
        // What the kubelet did not stop: killed and removed through containerd.
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
        // kube-proxy's own clean-up removes its chains; the kubelet has none, so what it made
        // (KUBE-FIREWALL, the canaries) is removed by hand.
        let _ = Command::new(&self.kube_proxy_binary)
            .args(["--cleanup", "--v=0"])
            .output();
        remove_kube_chains();
        remove_pod_cgroups();
        detach_mounts_under(&self.dir);
    }
}

fn containerd_config(dir: &Path) -> String {
    let d = |sub: &str| dir.join(sub).display().to_string();
    // restrict_oom_score_adj: runc fails to start a container ("can't get final child's PID
    // from pipe") where root lacks CAP_SYS_RESOURCE and the kubelet asks for a lower score.
    format!(
        r#"# Written by kubeloop's testenv (src/testenv/node.rs).
version = 2
root = "{root}"
state = "{state}"

[grpc]
  address = "{socket}"

[plugins."io.containerd.internal.v1.opt"]
  path = "{opt}"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{SANDBOX_IMAGE}"
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{CNI_BIN_DIR}"
    conf_dir = "{cni}"
"#,
        root = d("containerd/root"),
        state = d("containerd/state"),
        socket = d("containerd.sock"),
        opt = d("containerd/opt"),
        cni = d("cni"),
    )
}

/// The bridge plugin on [`BRIDGE`] with host-local addresses from [`POD_SUBNET`]; no IP
/// masquerade (nothing may leave the machine). containerd adds the loopback plugin itself.
fn cni_config(dir: &Path) -> String {
    serde_json::json!({
        "cniVersion": "1.0.0",
        "name": "kubeloop",
        "plugins": [{
            "type": "bridge",
            "bridge": BRIDGE,
            "isGateway": true,
            "ipMasq": false,
            "hairpinMode": true,
            "ipam": {
                "type": "host-local",
                "dataDir": dir.join("cni-ipam"),
                "ranges": [[{"subnet": POD_SUBNET, "gateway": NODE_IP.to_string()}]],
                "routes": [{"dst": "0.0.0.0/0"}]
            }
        }]
    })
    .to_string()
}

/// The kubelet, for this host: cgroup v1 with cgroupfs (no systemd), swap allowed, eviction
/// on memory only and no image garbage collection (the images cannot be pulled again), its
/// servers on the node address and loopback only, no DNS servers for pods.
fn kubelet_config(dir: &Path, socket: &Path, client_ca: &Path, healthz_port: u16) -> String {
    format!(
        r#"apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: "{NODE_IP}"
healthzBindAddress: 127.0.0.1
healthzPort: {healthz_port}
readOnlyPort: 0
containerRuntimeEndpoint: unix://{socket}
cgroupDriver: cgroupfs
failCgroupV1: false
failSwapOn: false
resolvConf: ""
podLogsDir: {logs}
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: true
  x509:
    clientCAFile: {client_ca}
authorization:
  mode: Webhook
evictionHard:
  memory.available: 100Mi
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
nodeStatusUpdateFrequency: 4s
"#,
        socket = socket.display(),
        logs = dir.join("pod-logs").display(),
        client_ca = client_ca.display(),
    )
}

/// kube-proxy in iptables mode for the pod subnet; its servers on loopback, NodePorts only on
/// the node address, and the host's conntrack settings left as they are.
fn kube_proxy_config(kubeconfig: &Path, healthz_port: u16, metrics_port: u16) -> String {
    format!(
        r#"apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection:
  kubeconfig: {kubeconfig}
hostnameOverride: {NODE_NAME}
mode: iptables
clusterCIDR: {POD_SUBNET}
healthzBindAddress: 127.0.0.1:{healthz_port}
metricsBindAddress: 127.0.0.1:{metrics_port}
nodePortAddresses: ["{NODE_IP}/32"]
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
"#,
        kubeconfig = kubeconfig.display(),
    )
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

/// Removes every `KUBE-*` chain, and the rules that jump to one, from the host's iptables and
/// ip6tables: what the kubelet made (KUBE-FIREWALL, which drops non-loopback packets to
/// 127.0.0.0/8, and its canary chains) and whatever kube-proxy's clean-up left. Only one node
/// cluster runs at a time (the node lock), so every such chain is this node's.
fn remove_kube_chains() {
    for program in ["iptables", "ip6tables"] {
        for table in ["filter", "nat", "mangle"] {
            let Ok(rules) = run(program, &["-t", table, "-S"]) else {
                continue;
            };
            for rule in rules.lines() {
                let words = rule_words(rule);
                let jumps_to_kube = words
                    .windows(2)
                    .any(|w| w[0] == "-j" && w[1].starts_with("KUBE-"));
                if words.first().map(String::as_str) == Some("-A") && jumps_to_kube {
                    let mut delete = vec!["-t", table, "-D"];
                    delete.extend(words[1..].iter().map(String::as_str));
                    let _ = run(program, &delete);
                }
            }
            for rule in rules.lines() {
                if let Some(chain) = rule.strip_prefix("-N KUBE-") {
                    let chain = format!("KUBE-{chain}");
                    let _ = run(program, &["-t", table, "-F", &chain]);
                    let _ = run(program, &["-t", table, "-X", &chain]);
                }
            }
        }
    }
}

/// Removes the `kubepods` cgroups the kubelet made in every hierarchy (cgroupfs driver), once
/// their processes are gone: children before parents.
fn remove_pod_cgroups() {
    fn collect(dir: &Path, into: &mut Vec<PathBuf>) {
        if let Ok(entries) = std::fs::read_dir(dir) {
            for entry in entries.flatten() {
                if entry.file_type().is_ok_and(|t| t.is_dir()) {
                    collect(&entry.path(), into);
                }
            }
        }
        into.push(dir.to_owned());
    }
    let Ok(hierarchies) = std::fs::read_dir("/sys/fs/cgroup") else {
        return;
    };
    for hierarchy in hierarchies.flatten() {
        let root = hierarchy.path().join("kubepods");
        let mut dirs = Vec::new();
        if root.is_dir() {
            collect(&root, &mut dirs);
        }
        for dir in dirs {
            let _ = std::fs::remove_dir(dir);
        }
    }
}

/// The words of a rule as `iptables -S` prints it, double-quoted ones (comments) as one word.
fn rule_words(rule: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut quoted = false;
    for c in rule.chars() {
        match c {
            '"' => quoted = !quoted,
            ' ' if !quoted => {
                if !word.is_empty() {
                    words.push(std::mem::take(&mut word));
                }
            }
            c => word.push(c),
        }
    }
    if !word.is_empty() {
        words.push(word);
    }
    words
}

/// Detaches every mount at or under `dir` (the pods' volumes, containerd's root filesystems
/// and sandbox shm), deepest first, so that the directory can be removed.
fn detach_mounts_under(dir: &Path) {
    let Ok(table) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return;
    };
    let mut mounts: Vec<&str> = table
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .filter(|point| Path::new(point).starts_with(dir))
        .collect();
    mounts.sort_by_key(|point| std::cmp::Reverse(point.len()));
    for point in mounts {
        let Ok(path) = std::ffi::CString::new(point) else {
            continue;
        };
        // SAFETY: umount2(2) with a NUL-terminated path we own.
        unsafe {
            libc::umount2(path.as_ptr(), libc::MNT_DETACH);
        }
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

/// Runs a host tool; its stdout, or an error with its stderr.
fn run(program: &str, args: &[&str]) -> Result<String, TestEnvError> {
    let out = Command::new(program)
        .args(args)
        .output()
        .map_err(|e| TestEnvError::HostCommand(format!("running {program}: {e}")))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(TestEnvError::HostCommand(format!(
            "{program} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
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

fn create_dir(path: &Path) -> Result<(), TestEnvError> {
    std::fs::create_dir_all(path).map_err(|source| TestEnvError::Io {
        path: path.to_owned(),
        source,
    })
}

fn write(path: &Path, contents: &str) -> Result<(), TestEnvError> {
    std::fs::write(path, contents).map_err(|source| TestEnvError::Io {
        path: path.to_owned(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::rule_words;

    #[test]
    fn a_rule_splits_into_words_with_its_quoted_comment_as_one() {
        let rule = r#"-A KUBE-FIREWALL ! -s 127.0.0.0/8 -m comment --comment "block incoming localnet connections" -j DROP"#;
        assert_eq!(
            rule_words(rule),
            [
                "-A",
                "KUBE-FIREWALL",
                "!",
                "-s",
                "127.0.0.0/8",
                "-m",
                "comment",
                "--comment",
                "block incoming localnet connections",
                "-j",
                "DROP"
            ]
        );
    }
}
