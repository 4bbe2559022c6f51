//! The node's names and addresses, which the harness, the daemons' configurations and the tests
//! share.

use std::net::Ipv4Addr;

/// The Node's name.
pub const NODE_NAME: &str = "kubeloop-node-0";
/// The label the node carries for deploy/vm-controller.yaml's nodeSelector: the Docker-API
/// engine (hack/setup-podman's socket) is on this machine.
pub const ENGINE_LABEL: &str = "kubeloop.dev/engine=true";
/// The bridge's address: the pods' gateway, the Node's InternalIP, the apiserver's address.
pub const NODE_IP: Ipv4Addr = Ipv4Addr::new(10, 244, 0, 1);
/// The pods' subnet, on [`BRIDGE`].
pub const POD_SUBNET: &str = "10.244.0.0/24";
/// The Linux bridge the harness makes and the CNI bridge plugin attaches pods to.
pub const BRIDGE: &str = "kubeloop0";
