//! The controller runtime: what every controller built on kubeloop shares, in client-go's
//! shape. Informers' event handlers turn events into [`ObjectKey`]s, one rate-limited
//! workqueue deduplicates them, N workers call your reconcile with each key and its
//! [`ReconcileContext`]; readiness once the caches synced; leadership (standbys keep their
//! caches warm, only the workers wait) or sharding (several replicas, each reconciling the
//! keys of the shards it holds); shutdown with drain.
//!
//! A controller is declared with [`Controller`] (a primary type's informer, owned and watched
//! types, workers, queue, rate limiter, leader election or sharding, leader-only tasks) and run
//! with [`Controller::run`], a reconcile function and an error policy. The two controllers
//! (`kubeloop::controller`, features `sample-controller` and `vm-controller`) are built on it.
//!
//! # The map
//!
//! The files are private; what a controller author needs is re-exported here, so each item
//! has one path, `kubeloop::runtime::Item`. No two files import each other, directly or round
//! a longer circle, and none imports `ops`, `controller` or `testenv` (`tests/local/layering.rs`
//! checks all three).
//!
//! | file | what | client-go / controller-runtime / kube-runtime |
//! |---|---|---|
//! | `key.rs` | [`ObjectKey`], [`shard_of`] | controller-runtime `reconcile.Request`; kube-runtime `ObjectRef` |
//! | `action.rs` | [`Action`], [`ErrorAction`], [`default_error_policy`] | controller-runtime `reconcile.Result`; kube-runtime `Action`, `error_policy` |
//! | `context.rs` | [`ReconcileContext`], [`NotEntitled`] | the `context.Context` handed to `Reconcile` |
//! | `freshness.rs` | read-your-writes: no reconcile on a cache older than its key's last write | (none: controller-runtime #3320 is open) |
//! | `retry.rs` | [`retry_on_conflict`], [`on_error`], [`DEFAULT_RETRY`], [`DEFAULT_BACKOFF`] (a [`crate::backoff::Backoff`] each) | client-go `util/retry` |
//! | `reconcile_metrics.rs`, `shard_metrics.rs` | [`ReconcileMetrics`], [`ShardMetrics`] | controller-runtime `pkg/internal/controller/metrics` |
//! | `leadership.rs` | [`Term`] and the gate between leadership and workers | `leaderelection.RunOrDie` + the manager's leader-only runnables, with a fence |
//! | `queue.rs` | [`ControllerQueue`]: the priority queue (default) or the plain one | controller-runtime `priorityqueue.PriorityQueue`, client-go `TypedRateLimitingInterface` |
//! | `lanes.rs` | the controller's queue and the requeue lane | (none: knative's two-lane queue is the nearest) |
//! | `worker.rs` | the worker loop | sample-controller `runWorker` / `processNextWorkItem`; controller-runtime `reconcileHandler` |
//! | `terms.rs` | what a term starts and ends (gate, parked keys, leader tasks) | controller-runtime `LeaderElectionRunnable` |
//! | `sharding/` | [`ShardRing`], [`LeaseRing`], [`assign`] | (none built in; kubernetes-controller-sharding adds it to controller-runtime) |
//! | `handlers.rs` | [`enqueue_handler`], [`key_of`], [`controller_of`], [`refers_to`] | sample-controller `enqueueFoo` / `handleObject`; controller-runtime `handler.EnqueueRequestForOwner` |
//! | `builder.rs` | [`Controller`] declared: `new`, `owns`, `watches`, options | controller-runtime `pkg/builder`; kube-runtime `Controller::new/owns/watches` |
//! | `run.rs` | [`Controller::run`], [`ControllerError`] | controller-runtime `pkg/internal/controller/controller.go` (`Start`) |
//!
//! # Leadership
//!
//! Every reconcile (and leader task) started in a term of leadership has *ended* (returned,
//! or been dropped by its worker at the term's fence) before any other candidate can acquire
//! the Lease, measured on this process's clock; [`ReconcileContext::check`] fails from the
//! renew deadline on, so a reconcile that checks before each side effect causes none after
//! that. The arithmetic and its assumptions are written at the top of `leadership.rs`; how
//! shards move, at the top of `sharding/mod.rs`.
//!
//! # The queue
//!
//! The controller's queue is controller-runtime's priority queue ([`ControllerQueue`]; the
//! default there since v0.23): at startup and on resyncs every key is queued at low priority,
//! so a new object or a user's edit is reconciled before that backlog. A reconcile may ask for
//! a priority ([`Action::RequeueWithPriority`]); a retried key keeps its own.
//! [`Controller::plain_queue`] picks client-go's first-in-first-out queue instead.
//!
//! # Read-your-writes
//!
//! A reconcile reports the objects it wrote with [`ReconcileContext::wrote`]; the next
//! reconcile of the same key does not start until the caches of the controller's informers
//! hold those versions or newer ones (resourceVersions compared as integers within one
//! resource type, as KEP-5504 allows since Kubernetes 1.35), or until a bound passes
//! ([`Controller::read_your_writes`], default [`DEFAULT_FRESHNESS_WAIT`]); a reconcile that
//! starts on a stale cache anyway is counted in `kubeloop_reconcile_stale_total`. It covers the
//! controller's own reported writes only: what other writers did is unknown here (their
//! events enqueue the key anyway). The exact guarantee and its limits are at the top of
//! `freshness.rs`.
//!
//! # Example
//! ```no_run
//! # async fn demo(client: kube_client::Client) -> Result<(), Box<dyn std::error::Error>> {
//! use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
//! use kubeloop::cache::{FactoryOptions, SharedInformerFactory};
//! use kubeloop::runtime::{Action, Controller, ObjectKey, ReconcileContext, default_error_policy};
//! use tokio_util::sync::CancellationToken;
//!
//! let factory = SharedInformerFactory::new(client, FactoryOptions::default());
//! let deployments = factory.informer::<Deployment>().lister();
//! let shutdown = CancellationToken::new();
//! Controller::new("deployment-watcher", factory.informer::<Deployment>())
//!     .owns(factory.informer::<ReplicaSet>())
//!     .workers(2)
//!     .run(
//!         move |key: ObjectKey, ctx: ReconcileContext| {
//!             let deployments = deployments.clone();
//!             async move {
//!                 let namespace = key.namespace().unwrap_or_default();
//!                 if let Some(d) = deployments.get(namespace, key.name()) {
//!                     ctx.check()?; // still entitled? (before every side effect)
//!                     println!("{key}: generation {:?}", d.metadata.generation);
//!                 }
//!                 Ok::<_, kubeloop::runtime::NotEntitled>(Action::Done)
//!             }
//!         },
//!         default_error_policy,
//!         shutdown,
//!     )
//!     .await?;
//! # Ok(()) }
//! ```

mod action;
mod builder;
mod context;
mod freshness;
mod handlers;
mod key;
mod lanes;
mod leadership;
mod queue;
mod reconcile_metrics;
mod retry;
mod run;
mod shard_metrics;
mod sharding;
mod terms;
mod worker;

pub use action::{Action, ErrorAction, default_error_policy};
pub use builder::{Controller, ControllerOptions, DEFAULT_CACHE_SYNC_TIMEOUT};
pub use context::{NotEntitled, ReconcileContext};
pub use freshness::DEFAULT_FRESHNESS_WAIT;
pub use handlers::{
    UpdateFilter, controller_of, enqueue, enqueue_handler, key_of, key_of_deleted, refers_to,
};
pub use key::{ObjectKey, shard_of};
pub use leadership::Term;
pub use queue::{ControllerQueue, QueueFairness};
pub use reconcile_metrics::{ReconcileMetrics, ReconcileResult};
pub use retry::{Conflict, DEFAULT_BACKOFF, DEFAULT_RETRY, on_error, retry_on_conflict};
pub use run::{ControllerError, NotSynced};
pub use shard_metrics::{ShardMetrics, ShardMetricsHandle};
pub use sharding::{
    FakeRing, LAYOUT_LABEL, LeaseRing, RING_LABEL, ROLE_LABEL, RingLease, RingRole, RingStore,
    SHARD_LABEL, ShardRing, ShardingConfig, ShardingError, assign, member_lease_name,
    shard_lease_name,
};
// The key-only worker loop, without informers or leadership, for the crate's unit tests (the
// worker's own, in worker.rs, and the controllers'; a test build has every feature on, through
// the dev-dependencies); a controller runs its workers through `Controller::run`.
#[cfg(test)]
pub(crate) use worker::{WorkerConfig, run_workers};
