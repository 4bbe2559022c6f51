//! The configuration files of the node's daemons, as text: containerd's, the CNI network's, the
//! kubelet's and kube-proxy's. Each says what it sets for this host and why.

use std::path::Path;

use super::addresses::{BRIDGE, NODE_IP, NODE_NAME, POD_SUBNET};

/// The sandbox image `hack/setup-node` builds (hack/go/pause) and saves as `pause.tar`.
const SANDBOX_IMAGE: &str = "localhost/kubeloop/pause:1.0";
/// Where Debian's containernetworking-plugins put the CNI plugins.
const CNI_BIN_DIR: &str = "/usr/lib/cni";

/// containerd with its root, state and socket in the node's directory, the CRI plugin on
/// runc with cgroupfs, and the CNI network of [`cni_config`].
pub(super) fn containerd_config(dir: &Path) -> String {
    let d = |sub: &str| dir.join(sub).display().to_string();
    // restrict_oom_score_adj: runc fails to start a container ("can't get final child's PID
    // from pipe") where root lacks CAP_SYS_RESOURCE and the kubelet asks for a lower score.
    format!(
        r#"# Written by kubeloop's testenv (testenv/src/node/configs.rs).
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
pub(super) fn cni_config(dir: &Path) -> String {
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
pub(super) fn kubelet_config(
    dir: &Path,
    socket: &Path,
    client_ca: &Path,
    healthz_port: u16,
) -> String {
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
pub(super) fn kube_proxy_config(kubeconfig: &Path, healthz_port: u16, metrics_port: u16) -> String {
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

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    // The settings that keep the node's traffic on this machine (see node/mod.rs): a change
    // to any of them has to be a decision, not an accident.
    #[test]
    fn the_configurations_keep_the_nodes_traffic_on_this_machine() {
        let dir = Path::new("/tmp/kubeloop-testenv-x/node");
        let kubelet = kubelet_config(dir, &dir.join("c.sock"), Path::new("/ca.crt"), 1);
        assert!(
            kubelet.contains("resolvConf: \"\"\n"),
            "pods get no DNS servers"
        );
        assert!(kubelet.contains(&format!("address: \"{NODE_IP}\"")));
        assert!(kubelet.contains("healthzBindAddress: 127.0.0.1\n"));

        let cni: serde_json::Value = serde_json::from_str(&cni_config(dir)).unwrap();
        let bridge = &cni["plugins"][0];
        assert_eq!(bridge["bridge"], BRIDGE);
        assert_eq!(bridge["ipMasq"], false, "no masquerade off the machine");

        let containerd = containerd_config(dir);
        assert!(containerd.contains("sandbox_image = \"localhost/"));
        assert!(containerd.contains("stream_server_address = \"127.0.0.1\""));

        let proxy = kube_proxy_config(Path::new("/kp.kubeconfig"), 1, 2);
        assert!(proxy.contains(&format!("nodePortAddresses: [\"{NODE_IP}/32\"]")));
        assert!(proxy.contains("healthzBindAddress: 127.0.0.1:1\n"));
        assert!(proxy.contains("metricsBindAddress: 127.0.0.1:2\n"));
    }
}
