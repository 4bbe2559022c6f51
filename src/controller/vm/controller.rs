//! Wiring of the VirtualMachine controller (controller101's `controller.go` `New` / `Run`):
//! one VirtualMachine informer, its event handlers, a rate-limited workqueue of
//! `namespace/name` keys, and the shared worker loop ([`crate::runtime`]) calling
//! [`Reconciler::reconcile`].
//!
//! Event filter: the controller's own status writes must not wake it up again (each refresh
//! would otherwise trigger the next at once), so an update is enqueued only if the spec
//! (`metadata.generation`), the deletion timestamp or the finalizers changed, or if it is a
//! resync (same resourceVersion). Adds and deletes are always enqueued; a key whose object is
//! gone reconciles to `Done` and is forgotten. Periodic work comes from
//! [`Action::RequeueAfter`], not from resyncs.
//!
//! Everything else is the runtime's ([`crate::runtime::Controller`]): informer start and
//! sync, readiness, workers, leader election (the informer stays warm on a standby; only the
//! workers wait), the fence when leadership ends, and shutdown with drain. Each reconcile gets
//! its [`ReconcileContext`] and checks it before every side effect; while leading, a leader
//! task sweeps orphaned containers ([`super::sweep`]) at the start of each term and every
//! [`DEFAULT_SWEEP_INTERVAL`].

use std::sync::Arc;
use std::time::Duration;

use kube_client::Client;
use thiserror::Error;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::api::{KubeVmApi, VmApi};
use super::driver::Driver;
use super::error_policy::ReconcileError;
use super::reconcile::{Reconciler, ReconcilerConfig};
use super::sweep::{DEFAULT_SWEEP_INTERVAL, sweep_orphans};
use super::types::VirtualMachine;
use crate::cache::{FactoryOptions, ShardScope, SharedInformerFactory};
use crate::leaderelection::{LeaderElector, ResourceLock, StopReason};
use crate::record::{AnyEventBroadcaster, AnyEventRecorder, default_reporting_instance};
use crate::runtime::{
    Action, Controller, ControllerError, ErrorAction, ObjectKey, ReconcileContext, RingStore,
    ShardRing,
};

/// Settings of one controller instance.
#[derive(Clone, Debug)]
pub struct VmControllerConfig {
    /// Concurrent reconciles (`--threads`, controller101's default 2).
    pub workers: usize,
    /// Usage refresh of Active VMs (`--refresh-interval`).
    pub refresh_interval: Duration,
    /// Watch one namespace only (`None`: all).
    pub namespace: Option<String>,
    /// Where the informer's reflector and handlers report (`--metrics-bind-address` serves it).
    pub cache_metrics: crate::cache::CacheMetrics,
    /// Set once the informer has synced (standbys included); cleared when shutdown starts
    /// (what `/readyz` reports).
    pub ready: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// How often the leader sweeps orphaned containers (also once at the start of each term).
    pub sweep_interval: Duration,
    /// Concurrent refreshes (`--refresh-workers`): the requeue lane's workers, apart from the
    /// `workers` that create, delete and retry, so that refreshing many VMs never holds up a
    /// create or a delete (see [`crate::runtime::Controller::requeue_lane`]).
    pub refresh_workers: usize,
    /// The longest a VM that failed for a reason that may pass (engine down) waits before its
    /// next try (`--max-retry-delay`).
    pub max_retry_delay: Duration,
    /// How long a VM the engine refused waits before the same spec is tried again.
    pub refused_retry_interval: Duration,
    /// Read-your-writes: how long a reconcile waits at most for the cache to hold the VM's
    /// last status and finalizer writes (`None`: no wait; see
    /// [`crate::runtime::Controller::read_your_writes`]).
    pub freshness_wait: Option<Duration>,
    /// With [`run_sharded`]: split the VMs by their namespace's hash range, and have the
    /// informer list and watch only the shards this replica holds
    /// ([`crate::runtime::ShardRing::watch_held_shards`]; `--watch-held-shards`). The orphan
    /// sweep is unaffected: it runs on the holder of shard 0, lists every managed server on
    /// the engine and decides on each by a GET of its VM from the apiserver, never from this
    /// replica's cache, so a VM cached by another replica keeps its server.
    pub watch_held_shards: bool,
}

impl Default for VmControllerConfig {
    fn default() -> Self {
        Self {
            workers: 2,
            refresh_interval: super::reconcile::DEFAULT_REFRESH_INTERVAL,
            namespace: None,
            cache_metrics: crate::cache::CacheMetrics::default(),
            ready: Default::default(),
            sweep_interval: DEFAULT_SWEEP_INTERVAL,
            refresh_workers: DEFAULT_REFRESH_WORKERS,
            max_retry_delay: super::error_policy::MAX_RETRY_DELAY,
            refused_retry_interval: super::reconcile::DEFAULT_REFUSED_RETRY_INTERVAL,
            freshness_wait: Some(crate::runtime::DEFAULT_FRESHNESS_WAIT),
            watch_held_shards: false,
        }
    }
}

/// The controller could not run, or stopped for another reason than shutdown.
#[derive(Debug, Error)]
pub enum VmControllerError {
    #[error("the VirtualMachine informer did not sync before shutdown")]
    /// Shutdown came before the informer synced.
    CacheNotSynced,
    /// The informer did not sync within the runtime's cache-sync timeout.
    #[error(transparent)]
    CacheSyncTimeout(ControllerError),
    #[error("registering the VirtualMachine event handler: {0}")]
    /// The event handler could not be registered.
    Handler(#[from] crate::cache::InformerError),
    #[error("leader election lost: {0:?}")]
    /// Leadership ended and the elector does not contend again.
    LeadershipLost(StopReason),
}

/// Concurrent refreshes by default: a refresh is one engine call and, when something changed,
/// one status write.
pub const DEFAULT_REFRESH_WORKERS: usize = 4;

/// The controller's name: queue metrics label, event source, log field.
pub const CONTROLLER_NAME: &str = "vm-controller";

/// Runs the controller until `stop` is cancelled (or, with an `elector` that does not contend
/// again, until leadership is lost), then drains the workers and stops the informer.
pub async fn run<D: Driver, L: ResourceLock>(
    client: Client,
    driver: D,
    config: VmControllerConfig,
    stop: CancellationToken,
    elector: Option<LeaderElector<L>>,
) -> Result<(), VmControllerError> {
    run_as(
        client,
        driver,
        config,
        stop,
        None,
        move |controller, recorder| match elector {
            Some(elector) => {
                elector.record_events_to(recorder);
                controller.leader_election(elector)
            }
            None => controller,
        },
    )
    .await
}

/// As [`run`], with VMs split over the shards of `ring`: several replicas work at once, each on
/// the VMs of the shards it holds (see [`crate::runtime::ShardRing`]). The orphan sweep runs
/// on the holder of shard 0. With [`VmControllerConfig::watch_held_shards`] (or a `ring`
/// given a scope already), the informer caches only the VMs of the shards held.
pub async fn run_sharded<D: Driver, R: RingStore>(
    client: Client,
    driver: D,
    config: VmControllerConfig,
    stop: CancellationToken,
    ring: ShardRing<R>,
) -> Result<(), VmControllerError> {
    let ring = if config.watch_held_shards {
        ring.with_shard_scope()
    } else {
        ring
    };
    let scope = ring.shard_scope().cloned();
    run_as(client, driver, config, stop, scope, move |controller, _| {
        controller.sharding(ring)
    })
    .await
}

/// The controller, its informer following `shard_scope` if given, with `coordinate` choosing
/// how replicas share the work.
async fn run_as<D: Driver>(
    client: Client,
    driver: D,
    config: VmControllerConfig,
    stop: CancellationToken,
    shard_scope: Option<ShardScope>,
    coordinate: impl FnOnce(Controller<VirtualMachine>, AnyEventRecorder) -> Controller<VirtualMachine>,
) -> Result<(), VmControllerError> {
    let factory = SharedInformerFactory::new(
        client.clone(),
        FactoryOptions {
            namespace: config.namespace.clone(),
            metrics: config.cache_metrics.clone(),
            shard_scope,
            ..FactoryOptions::default()
        },
    );
    // client-go 1.36's `informer_*` series under the controller's name; a second VM
    // controller in one process (tests) goes unnamed rather than failing.
    let factory = match crate::cache::InformerName::new(CONTROLLER_NAME) {
        Ok(name) => factory.with_informer_name(name),
        Err(e) => {
            tracing::warn!("informer metrics off for this controller: {e}");
            factory
        }
    };
    let (events, recorder) = AnyEventBroadcaster::discover(
        client.clone(),
        CONTROLLER_NAME,
        &default_reporting_instance(CONTROLLER_NAME),
    )
    .await;
    let mut controller = Controller::new(CONTROLLER_NAME, factory.informer::<VirtualMachine>())
        .update_filter(needs_reconcile)
        .queue_name("virtualmachines")
        .rate_limiter(super::error_policy::rate_limiter_capped(
            config.max_retry_delay,
        ))
        .workers(config.workers)
        .requeue_lane(config.refresh_workers)
        .read_your_writes(config.freshness_wait)
        .with_readiness(config.ready.clone());
    let reconciler = Arc::new(
        Reconciler::new(
            driver,
            KubeVmApi::new(client, controller.primary_lister()),
            ReconcilerConfig {
                refresh_interval: config.refresh_interval,
                refused_retry_interval: config.refused_retry_interval,
            },
        )
        .with_recorder(recorder.clone()),
    );
    let sweeper = Arc::clone(&reconciler);
    let (namespace, interval) = (config.namespace.clone(), config.sweep_interval);
    controller = controller.leader_task("orphan-sweep", move |ctx| {
        sweep_every(Arc::clone(&sweeper), namespace.clone(), interval, ctx)
    });
    controller = coordinate(controller, recorder);
    info!(
        engine = reconciler.driver().engine(),
        workers = config.workers,
        "starting the VirtualMachine controller"
    );
    let result = controller
        .run(reconcile_fn(reconciler), error_policy, stop)
        .await;
    events.shutdown().await;
    result.map_err(|e| match e {
        ControllerError::Handler(e) => VmControllerError::Handler(e),
        ControllerError::CacheSync { .. } => VmControllerError::CacheNotSynced,
        e @ ControllerError::CacheSyncTimeout { .. } => VmControllerError::CacheSyncTimeout(e),
        ControllerError::LeadershipLost(reason) => VmControllerError::LeadershipLost(reason),
    })
}

/// What each worker calls with a key and its context.
pub(crate) fn reconcile_fn<D: Driver, A: VmApi>(
    reconciler: Arc<Reconciler<D, A>>,
) -> impl Fn(
    ObjectKey,
    ReconcileContext,
) -> futures::future::BoxFuture<'static, Result<Action, ReconcileError>>
+ Send
+ Sync
+ 'static {
    move |key: ObjectKey, ctx: ReconcileContext| {
        let reconciler = Arc::clone(&reconciler);
        Box::pin(async move { reconciler.reconcile(&key, &ctx).await })
    }
}

/// Errors a retry cannot fix (see [`super::error_policy`]) drop the key; the rest back off.
pub(crate) fn error_policy(error: &ReconcileError, _key: &ObjectKey, _retries: u32) -> ErrorAction {
    if error.retry() {
        ErrorAction::RateLimited
    } else {
        ErrorAction::Drop
    }
}

/// The leader task: one sweep at the start of the term, then one every `interval`.
async fn sweep_every<D: Driver, A: VmApi>(
    reconciler: Arc<Reconciler<D, A>>,
    namespace: Option<String>,
    interval: Duration,
    ctx: ReconcileContext,
) {
    loop {
        match sweep_orphans(
            reconciler.driver(),
            reconciler.api(),
            namespace.as_deref(),
            &ctx,
        )
        .await
        {
            Ok(report) => info!(?report, "orphan sweep done"),
            Err(e) => warn!(error = %e, "orphan sweep did not finish"),
        }
        tokio::select! {
            _ = ctx.cancelled() => return,
            _ = tokio::time::sleep(interval) => {}
        }
    }
}

/// False for the controller's own status writes (only status and resourceVersion changed).
pub(crate) fn needs_reconcile(old: &VirtualMachine, new: &VirtualMachine) -> bool {
    let (o, n) = (&old.metadata, &new.metadata);
    o.resource_version == n.resource_version
        || o.generation != n.generation
        || o.deletion_timestamp != n.deletion_timestamp
        || o.finalizers != n.finalizers
        || old.spec != new.spec
}

#[cfg(test)]
mod tests {
    use tokio::task::JoinHandle;

    use super::*;
    use crate::controller::vm::fixture::VmFixture;
    use crate::controller::vm::types::{Phase, VirtualMachineStatus};
    use crate::runtime::{WorkerConfig, run_workers};
    use crate::workqueue::{ItemExponentialFailureRateLimiter, RateLimitingQueue};

    /// The reconcile as the key-only worker loop takes it, with a context that never ends.
    fn worker_fn<D: Driver, A: VmApi>(
        reconciler: Arc<Reconciler<D, A>>,
    ) -> impl Fn(ObjectKey) -> futures::future::BoxFuture<'static, Result<Action, ReconcileError>>
    + Send
    + Sync
    + 'static {
        let reconcile = reconcile_fn(reconciler);
        move |key| reconcile(key, ReconcileContext::detached())
    }

    /// Workers running the fixture's reconciler, on a queue with the per-item part of the
    /// controller's default limiter (5 ms doubling, cap 1000 s).
    fn start_workers(
        f: &VmFixture,
        config: WorkerConfig,
    ) -> (RateLimitingQueue<ObjectKey>, JoinHandle<()>) {
        let queue: RateLimitingQueue<ObjectKey> =
            RateLimitingQueue::new(ItemExponentialFailureRateLimiter::new(
                Duration::from_millis(5),
                Duration::from_secs(1000),
            ));
        let workers = tokio::spawn(run_workers(
            queue.clone(),
            config,
            worker_fn(Arc::clone(&f.reconciler)),
        ));
        (queue, workers)
    }

    #[tokio::test(start_paused = true)]
    async fn a_vm_that_keeps_failing_is_retried_with_exponential_backoff_not_in_a_hot_loop() {
        let f = VmFixture::new();
        let key = f.create_vm();
        f.driver.fail_creates(u32::MAX);
        let (queue, workers) = start_workers(
            &f,
            WorkerConfig {
                workers: 2,
                name: "test".into(),
            },
        );
        queue.add(key.clone());
        tokio::time::sleep(Duration::from_secs(10)).await;
        // Attempts at 0, 5, 15, 35, ... ms: 5 ms * (2^n - 1) <= 10 s gives n <= 10, so 11 or 12
        // attempts in 10 s; a hot loop would make thousands.
        let attempts = f.driver.calls("create");
        assert!(
            (10..=13).contains(&attempts),
            "{attempts} create attempts in 10 s"
        );
        assert_eq!(f.api.object(&key).unwrap().phase(), Phase::Failed);
        // Another 10 s add at most one attempt (the next delay is about 10 s).
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert!(f.driver.calls("create") <= attempts + 1);
        queue.shutdown_with_drain().await;
        workers.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn an_active_vm_is_refreshed_on_the_timed_requeue_and_a_deleted_one_stops_being_requeued()
    {
        let f = VmFixture::new();
        // The fixture's reconciler refreshes an Active VM every `fixture::REFRESH`, 20 s.
        let key = f.create_vm();
        let (queue, workers) = start_workers(&f, WorkerConfig::default());
        queue.add(key.clone());
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(f.driver.calls("status"), 1);
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert_eq!(
            f.driver.calls("status"),
            4,
            "one refresh per 20 s, without any event"
        );

        // Deleted: finalized on the next pass, then never looked at again.
        f.api.delete(&key);
        queue.add(key.clone());
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(f.api.object(&key).is_none());
        let calls = f.driver.calls("status") + f.driver.calls("delete");
        tokio::time::sleep(Duration::from_secs(120)).await;
        assert_eq!(
            f.driver.calls("status") + f.driver.calls("delete"),
            calls,
            "no requeue of a deleted VM"
        );
        assert_eq!(queue.len(), 0);
        queue.shutdown_with_drain().await;
        workers.await.unwrap();
    }

    #[test]
    fn status_only_updates_do_not_wake_the_controller_but_spec_and_deletion_do() {
        let mut old = VirtualMachine::namespaced("ns", "vm", "1", "1Gi");
        old.metadata.resource_version = Some("1".into());
        old.metadata.generation = Some(1);
        let mut status_only = old.clone();
        status_only.metadata.resource_version = Some("2".into());
        status_only.status = Some(VirtualMachineStatus {
            phase: Phase::Active,
            ..Default::default()
        });
        assert!(!needs_reconcile(&old, &status_only));
        assert!(
            needs_reconcile(&old, &old.clone()),
            "a resync (same resourceVersion) is delivered"
        );

        let mut spec = status_only.clone();
        spec.metadata.generation = Some(2);
        assert!(needs_reconcile(&old, &spec));
        let mut deleting = status_only.clone();
        deleting.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::now(),
            ));
        assert!(needs_reconcile(&old, &deleting));
        let mut finalized = status_only;
        finalized.metadata.finalizers = Some(vec!["x".into()]);
        assert!(needs_reconcile(&old, &finalized));
    }
}
