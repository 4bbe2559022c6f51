//! [`ClusterOptions`]: which components a [`super::Cluster`] runs besides etcd and
//! kube-apiserver, and how long each may take to become ready. A leaf: the cluster and the
//! component starters both read it.

use std::time::Duration;

/// KEP-5866's gate: list and watch accept `shardSelector` and lists echo it in
/// `metadata.shardInfo` (k8s.io/apiserver pkg/features/kube_features.go, alpha since 1.36).
pub const SHARDED_LIST_AND_WATCH: &str = "ShardedListAndWatch";

/// Which components to run besides etcd and kube-apiserver.
#[derive(Clone, Debug)]
pub struct ClusterOptions {
    /// kube-controller-manager: service accounts, garbage collection, Deployments, ReplicaSets.
    pub controller_manager: bool,
    /// kube-scheduler: binds Pods to the kwok node.
    pub scheduler: bool,
    /// kwok with one fake Node (`kwok-node-0`) that runs every Pod bound to it.
    pub kwok: bool,
    /// A real Node ([`NODE_NAME`](super::NODE_NAME)): containerd, kubelet and kube-proxy on
    /// this machine, the apiserver on the pods' bridge ([`NODE_IP`](super::NODE_IP)) instead
    /// of loopback. One at a time per machine; needs root and `hack/setup-node`.
    pub node: bool,
    /// kube-apiserver feature gates, passed as one `--feature-gates=Name=bool,...` flag in
    /// this order. Every constructor turns on [`SHARDED_LIST_AND_WATCH`] (alpha in 1.36, off
    /// by default), so tests run against the sharded list/watch path; a test that needs the
    /// apiserver without it starts its own cluster with the gate removed or set to false.
    pub feature_gates: Vec<(String, bool)>,
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
            feature_gates: vec![(SHARDED_LIST_AND_WATCH.to_owned(), true)],
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

impl ClusterOptions {
    /// Sets feature gate `name` to `enabled`, replacing an earlier setting of the same gate.
    pub fn with_feature_gate(mut self, name: &str, enabled: bool) -> Self {
        self.feature_gates.retain(|(gate, _)| gate != name);
        self.feature_gates.push((name.to_owned(), enabled));
        self
    }

    /// The `--feature-gates` flag for these gates, or `None` when there are none.
    pub(super) fn feature_gates_flag(&self) -> Option<String> {
        if self.feature_gates.is_empty() {
            return None;
        }
        let gates: Vec<String> = self
            .feature_gates
            .iter()
            .map(|(name, enabled)| format!("{name}={enabled}"))
            .collect();
        Some(format!("--feature-gates={}", gates.join(",")))
    }
}

impl Default for ClusterOptions {
    fn default() -> Self {
        Self::apiserver_only()
    }
}
