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
//!   archive, named `localhost/...` so that even a mistaken pull would go to loopback. The
//!   apiserver reaches the kubelet by its InternalIP, never by name (no DNS lookup).
//!
//! Invariants:
//! - One node cluster per machine at a time (the bridge, its subnet, the kubelet's port 10250,
//!   the iptables chains and the `kubepods` cgroups are the host's): `NodeNetwork` (host.rs)
//!   holds an exclusive lock on /run/kubeloop/node.lock from before the bridge exists until
//!   after it is gone.
//! - containerd's and the kubelet's state live in the cluster's directory; on drop every pod is
//!   stopped through the kubelet (so CNI releases its veth and address), whatever is left is
//!   killed, and everything the node changed on the host is undone (host.rs lists it). What a
//!   killed run left (its containers outlive it) is swept when the next node cluster starts.
//!
//! Files: `addresses.rs` (names and addresses), `configs.rs` (the daemons' configuration
//! files), `host.rs` (the host's side and its clean-up), `daemons.rs` ([`Node`] itself).

mod addresses;
mod configs;
mod daemons;
#[allow(unsafe_code)] // libc: the host lock, kills and unmounts.
mod host;

pub use addresses::{BRIDGE, ENGINE_LABEL, NODE_IP, NODE_NAME, POD_SUBNET};
pub(super) use daemons::{Node, NodeConfig, NodePorts, healthz_ok, is_ready};
pub(super) use host::NodeNetwork;
