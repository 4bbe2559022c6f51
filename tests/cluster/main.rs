//! The real-cluster tests that share one control plane per process
//! ([`kubeloop_testenv::shared`]): one test binary (as cargo's own suite is), so the dependency
//! graph is linked once and the apiserver started once for all of them.
//!
//! What keeps them safe together: each test works in a namespace of its own
//! (`Cluster::new_namespace`), installs its CRDs with `kubeloop_testenv::ensure_crd` (which
//! tolerates another test creating the same CRD first), and asserts nothing about the cluster
//! as a whole beyond what a shared cluster keeps (the built-in namespaces, the version). A
//! test that needs a process of its own stays in a binary of its own: one that restarts or
//! slows the apiserver (`cache_fault_*`), counts or times what crosses the process
//! (`cache_backoff`, `controller_runtime`, `read_your_writes`, `cache_sync_10k`'s peak RSS), sets
//! a process-global tracing subscriber (`cache_undecodable`), needs the shared apiserver
//! without the sample controller's CRD (`sample_controller`), or applies manifests with
//! `kubectl apply`, which can race another test creating the same object (`operations`,
//! `ops_secure_serving`, `tour`, `image`).

mod cache_consistency;
mod cache_factory_options;
mod cache_informer;
mod cache_shard_selector;
mod cli;
mod foundation;
mod leaderelection_lease_lock;
mod protobuf_wire;
mod protobuf_writes;
mod runtime_cache_sync;
mod runtime_shard_watches;
mod watch_tools;
