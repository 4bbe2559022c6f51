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

use super::api::KubeVmApi;
use super::driver::Driver;
use super::reconcile::{Reconciler, ReconcilerConfig};
use super::types::VirtualMachine;
use crate::cache::{DeletedObject, FactoryOptions, ResourceEventHandlerFuncs, SharedInformerFactory};
use crate::controller::worker::{Action, WorkerConfig, enqueue, key_of_deleted, run_workers};
use crate::leaderelection::LeaderContext;
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
}

impl Default for VmControllerConfig {
    fn default() -> Self {
        Self { workers: 2, refresh_interval: super::reconcile::DEFAULT_REFRESH_INTERVAL, namespace: None }
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
        FactoryOptions { namespace: config.namespace.clone(), ..FactoryOptions::default() },
    );
    let informer = factory.informer::<VirtualMachine>();
    let queue: RateLimitingQueue<String> =
        RateLimitingQueue::with_config(default_controller_rate_limiter(), QueueConfig::named("virtualmachines"));
    informer.add_event_handler(handlers(queue.clone()))?;

    let reconciler = Arc::new(Reconciler::new(
        driver,
        KubeVmApi::new(client, informer.lister()),
        ReconcilerConfig { refresh_interval: config.refresh_interval },
    ));
    info!(engine = reconciler.driver().engine(), workers = config.workers, "starting the VirtualMachine controller");
    factory.start();
    let synced = tokio::select! {
        synced = informer.wait_for_cache_sync() => synced,
        _ = stop.cancelled() => false,
    };
    if !synced {
        queue.shutdown();
        factory.shutdown().await;
        return Err(VmControllerError::CacheNotSynced);
    }
    info!("VirtualMachine informer synced; workers starting");

    let workers = tokio::spawn(run_workers(
        queue.clone(),
        WorkerConfig { workers: config.workers, name: "vm-controller".into() },
        move |key: String| {
            let reconciler = Arc::clone(&reconciler);
            let leader = leader.clone();
            async move {
                if leader.as_ref().is_some_and(|l| !l.still_leading()) {
                    // Leadership ended: do nothing; the queue is being shut down.
                    return Ok(Action::Done);
                }
                match reconciler.reconcile(&key).await {
                    Err(e) if !e.retry() => {
                        error!(key = %key, error = %e, "dropping key");
                        Ok(Action::Done)
                    }
                    other => other,
                }
            }
        },
    ));
    stop.cancelled().await;
    info!("stopping the VirtualMachine controller");
    queue.shutdown_with_drain().await;
    if let Err(e) = workers.await {
        error!(error = %e, "worker loop ended abnormally");
    }
    factory.shutdown().await;
    Ok(())
}

/// Adds and deletes always; updates only when something the controller acts on changed.
fn handlers(queue: RateLimitingQueue<String>) -> ResourceEventHandlerFuncs<VirtualMachine> {
    let (q_add, q_update, q_delete) = (queue.clone(), queue.clone(), queue);
    ResourceEventHandlerFuncs::new()
        .on_add(move |vm: &Arc<VirtualMachine>, _| enqueue(&q_add, vm.as_ref()))
        .on_update(move |old: &Arc<VirtualMachine>, new: &Arc<VirtualMachine>| {
            if needs_reconcile(old, new) {
                enqueue(&q_update, new.as_ref());
            }
        })
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
    use crate::controller::vm::types::{Phase, VirtualMachineStatus};

    #[test]
    fn status_only_updates_do_not_wake_the_controller_but_spec_and_deletion_do() {
        let mut old = VirtualMachine::new("ns", "vm", "1", "1Gi");
        old.metadata.resource_version = Some("1".into());
        old.metadata.generation = Some(1);
        let mut status_only = old.clone();
        status_only.metadata.resource_version = Some("2".into());
        status_only.status = Some(VirtualMachineStatus { phase: Phase::Active, ..Default::default() });
        assert!(!needs_reconcile(&old, &status_only));
        assert!(needs_reconcile(&old, &old.clone()), "a resync (same resourceVersion) is delivered");

        let mut spec = status_only.clone();
        spec.metadata.generation = Some(2);
        assert!(needs_reconcile(&old, &spec));
        let mut deleting = status_only.clone();
        deleting.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now()));
        assert!(needs_reconcile(&old, &deleting));
        let mut finalized = status_only;
        finalized.metadata.finalizers = Some(vec!["x".into()]);
        assert!(needs_reconcile(&old, &finalized));
    }
}
