//! Wiring of the VirtualMachine controller (controller101's `controller.go` `New` / `Run`):
//! one VirtualMachine informer, its event handlers, a rate-limited workqueue of
//! `namespace/name` keys, and the shared worker loop ([`crate::controller::worker`]) calling
//! [`Reconciler::reconcile`].
//!
//! Event filter: the controller's own status writes must not wake it up again (each refresh
//! would otherwise trigger the next at once), so an update is enqueued only if the spec
//! (`metadata.generation`), the deletion timestamp or the finalizers changed, or if it is a
//! resync (same resourceVersion). Adds and deletes are always enqueued; a key whose object is
//! gone reconciles to `Done` and is forgotten. Periodic work comes from
//! [`Action::RequeueAfter`], not from resyncs.
//!
//! Under leader election, [`run`] is handed the leader's [`LeaderContext`]: each reconcile first
//! checks [`LeaderContext::still_leading`], so no step starts after leadership ended, and the
//! context's cancellation stops the controller.

use std::sync::Arc;
use std::time::Duration;

use kube_client::Client;
use thiserror::Error;
use tokio_util::sync::CancellationToken;
use tracing::{error, info};

use futures::future::BoxFuture;

use super::api::{KubeVmApi, VmApi};
use super::driver::Driver;
use super::error_policy::ReconcileError;
use super::reconcile::{Reconciler, ReconcilerConfig};
use super::types::VirtualMachine;
use crate::cache::{
    DeletedObject, FactoryOptions, ResourceEventHandlerFuncs, SharedInformerFactory,
};
use crate::controller::context::ReconcileContext;
use crate::controller::worker::{Action, WorkerConfig, enqueue, key_of_deleted, run_workers};
use crate::leaderelection::LeaderContext;
use crate::record::{BroadcasterConfig, EventBroadcaster, EventSource, KubeEventSink};
use crate::workqueue::{QueueConfig, RateLimitingQueue, default_controller_rate_limiter};

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
    /// Set once the informer has synced and the workers run; cleared when shutdown starts
    /// (what `/readyz` reports for a leader).
    pub ready: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Default for VmControllerConfig {
    fn default() -> Self {
        Self {
            workers: 2,
            refresh_interval: super::reconcile::DEFAULT_REFRESH_INTERVAL,
            namespace: None,
            cache_metrics: crate::cache::CacheMetrics::default(),
            ready: Default::default(),
        }
    }
}

/// The controller could not run.
#[derive(Debug, Error)]
pub enum VmControllerError {
    #[error("the VirtualMachine informer did not sync before shutdown")]
    CacheNotSynced,
    #[error("registering the VirtualMachine event handler: {0}")]
    Handler(#[from] crate::cache::InformerError),
}

/// Runs the controller until `stop` is cancelled (or, with `leader`, until leadership ends),
/// then drains the workers and stops the informer.
pub async fn run<D: Driver>(
    client: Client,
    driver: D,
    config: VmControllerConfig,
    stop: CancellationToken,
    leader: Option<LeaderContext>,
) -> Result<(), VmControllerError> {
    let factory = SharedInformerFactory::new(
        client.clone(),
        FactoryOptions {
            namespace: config.namespace.clone(),
            metrics: config.cache_metrics.clone(),
            ..FactoryOptions::default()
        },
    );
    let informer = factory.informer::<VirtualMachine>();
    let queue: RateLimitingQueue<String> = RateLimitingQueue::with_config(
        default_controller_rate_limiter(),
        QueueConfig::named("virtualmachines"),
    );
    informer.add_event_handler(handlers(queue.clone()))?;

    let events = EventBroadcaster::start(
        KubeEventSink::new(client.clone()),
        BroadcasterConfig::default(),
    );
    let recorder = events.new_recorder(EventSource {
        component: "vm-controller".into(),
        host: None,
    });
    let reconciler = Arc::new(
        Reconciler::new(
            driver,
            KubeVmApi::new(client, informer.lister()),
            ReconcilerConfig {
                refresh_interval: config.refresh_interval,
            },
        )
        .with_recorder(recorder),
    );
    info!(
        engine = reconciler.driver().engine(),
        workers = config.workers,
        "starting the VirtualMachine controller"
    );
    factory.start();
    let synced = tokio::select! {
        synced = informer.wait_for_cache_sync() => synced,
        _ = stop.cancelled() => false,
    };
    if !synced {
        queue.shutdown();
        factory.shutdown().await;
        events.shutdown().await;
        return Err(VmControllerError::CacheNotSynced);
    }
    info!("VirtualMachine informer synced; workers starting");
    config.ready.store(true, std::sync::atomic::Ordering::SeqCst);

    let workers = tokio::spawn(run_workers(
        queue.clone(),
        WorkerConfig {
            workers: config.workers,
            name: "vm-controller".into(),
        },
        worker_fn(reconciler, leader),
    ));
    stop.cancelled().await;
    config.ready.store(false, std::sync::atomic::Ordering::SeqCst);
    info!("stopping the VirtualMachine controller");
    queue.shutdown_with_drain().await;
    if let Err(e) = workers.await {
        error!(error = %e, "worker loop ended abnormally");
    }
    factory.shutdown().await;
    events.shutdown().await;
    Ok(())
}

/// What each worker calls with a key: the reconcile, unless leadership has ended; errors that
/// must not be retried (see [`super::error_policy`]) are logged and the key dropped.
pub(crate) fn worker_fn<D: Driver, A: VmApi>(
    reconciler: Arc<Reconciler<D, A>>,
    leader: Option<LeaderContext>,
) -> impl Fn(String) -> BoxFuture<'static, Result<Action, ReconcileError>> + Send + Sync + 'static {
    move |key: String| {
        let reconciler = Arc::clone(&reconciler);
        let leader = leader.clone();
        Box::pin(async move {
            if leader.as_ref().is_some_and(|l| !l.still_leading()) {
                // Leadership ended: act no more; the queue is being shut down.
                return Ok(Action::Done);
            }
            // TODO(lead): hand the runtime's per-reconcile context (token + leadership term).
            match reconciler
                .reconcile(&key, &ReconcileContext::detached())
                .await
            {
                Err(e) if !e.retry() => {
                    error!(key = %key, error = %e, "dropping key");
                    Ok(Action::Done)
                }
                other => other,
            }
        })
    }
}

/// Adds and deletes always; updates only when something the controller acts on changed.
fn handlers(queue: RateLimitingQueue<String>) -> ResourceEventHandlerFuncs<VirtualMachine> {
    let (q_add, q_update, q_delete) = (queue.clone(), queue.clone(), queue);
    ResourceEventHandlerFuncs::new()
        .on_add(move |vm: &Arc<VirtualMachine>, _| enqueue(&q_add, vm.as_ref()))
        .on_update(
            move |old: &Arc<VirtualMachine>, new: &Arc<VirtualMachine>| {
                if needs_reconcile(old, new) {
                    enqueue(&q_update, new.as_ref());
                }
            },
        )
        .on_delete(move |deleted: &DeletedObject<VirtualMachine>| {
            if let Some(key) = key_of_deleted(deleted) {
                q_delete.add(key);
            }
        })
}

/// False for the controller's own status writes (only status and resourceVersion changed).
pub fn needs_reconcile(old: &VirtualMachine, new: &VirtualMachine) -> bool {
    let (o, n) = (&old.metadata, &new.metadata);
    o.resource_version == n.resource_version
        || o.generation != n.generation
        || o.deletion_timestamp != n.deletion_timestamp
        || o.finalizers != n.finalizers
        || old.spec != new.spec
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::vm::driver::FakeDriver;
    use crate::controller::vm::fake_api::FakeApi;
    use crate::controller::vm::types::{Phase, VirtualMachineStatus};
    use crate::workqueue::ItemExponentialFailureRateLimiter;

    #[tokio::test(start_paused = true)]
    async fn a_vm_that_keeps_failing_is_retried_with_exponential_backoff_not_in_a_hot_loop() {
        let driver = FakeDriver::new();
        let api = FakeApi::new();
        let key = api.create(VirtualMachine::new("ns", "vm", "1", "1Gi"));
        driver.fail_creates(u32::MAX);
        let reconciler = Arc::new(Reconciler::new(
            driver.clone(),
            api.clone(),
            ReconcilerConfig::default(),
        ));
        // The per-item part of the controller's default limiter: 5 ms doubling, cap 1000 s.
        let queue: RateLimitingQueue<String> =
            RateLimitingQueue::new(ItemExponentialFailureRateLimiter::new(
                Duration::from_millis(5),
                Duration::from_secs(1000),
            ));
        let workers = tokio::spawn(run_workers(
            queue.clone(),
            WorkerConfig {
                workers: 2,
                name: "test".into(),
            },
            worker_fn(reconciler, None),
        ));
        queue.add(key.clone());
        tokio::time::sleep(Duration::from_secs(10)).await;
        // Attempts at 0, 5, 15, 35, ... ms: 5 ms * (2^n - 1) <= 10 s gives n <= 10, so 11 or 12
        // attempts in 10 s; a hot loop would make thousands.
        let attempts = driver.calls("create");
        assert!(
            (10..=13).contains(&attempts),
            "{attempts} create attempts in 10 s"
        );
        assert_eq!(api.object(&key).unwrap().phase(), Phase::Failed);
        // Another 10 s add at most one attempt (the next delay is about 10 s).
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert!(driver.calls("create") <= attempts + 1);
        queue.shutdown_with_drain().await;
        workers.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn an_active_vm_is_refreshed_on_the_timed_requeue_and_a_deleted_one_stops_being_requeued()
    {
        let driver = FakeDriver::new();
        let api = FakeApi::new();
        let key = api.create(VirtualMachine::new("ns", "vm", "1", "1Gi"));
        let refresh = Duration::from_secs(20);
        let reconciler = Arc::new(Reconciler::new(
            driver.clone(),
            api.clone(),
            ReconcilerConfig {
                refresh_interval: refresh,
            },
        ));
        let queue: RateLimitingQueue<String> =
            RateLimitingQueue::new(ItemExponentialFailureRateLimiter::new(
                Duration::from_millis(5),
                Duration::from_secs(1000),
            ));
        let workers = tokio::spawn(run_workers(
            queue.clone(),
            WorkerConfig::default(),
            worker_fn(reconciler, None),
        ));
        queue.add(key.clone());
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(driver.calls("status"), 1);
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert_eq!(
            driver.calls("status"),
            4,
            "one refresh per 20 s, without any event"
        );

        // Deleted: finalized on the next pass, then never looked at again.
        api.delete(&key);
        queue.add(key.clone());
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(api.object(&key).is_none());
        let calls = driver.calls("status") + driver.calls("delete");
        tokio::time::sleep(Duration::from_secs(120)).await;
        assert_eq!(
            driver.calls("status") + driver.calls("delete"),
            calls,
            "no requeue of a deleted VM"
        );
        assert_eq!(queue.len(), 0);
        queue.shutdown_with_drain().await;
        workers.await.unwrap();
    }

    #[test]
    fn status_only_updates_do_not_wake_the_controller_but_spec_and_deletion_do() {
        let mut old = VirtualMachine::new("ns", "vm", "1", "1Gi");
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
