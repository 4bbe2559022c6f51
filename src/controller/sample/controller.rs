//! Wiring: sample-controller's `NewController` and `Run` (controller.go), declared on
//! kubeloop's controller runtime ([`crate::runtime::Controller`]).
//!
//! Event handlers (sample-controller's, registered by the runtime):
//! - Foo add and update (resyncs included) -> enqueue the Foo's key. Deletions are left to the
//!   garbage collector, which deletes the owned Deployment through its ownerReference
//!   (`enqueue_deletes(false)`).
//! - Deployment add, update and delete (tombstones included) -> if its controller
//!   ownerReference is a Foo that is in the cache, enqueue that Foo (`handleObject`, the
//!   runtime's [`crate::runtime::Controller::owns`]). Updates with an unchanged
//!   resourceVersion (the periodic resync) are ignored.
//!
//! [`run`] hands the runtime the sync handler; the runtime starts the informers, waits for
//! their caches, runs the workers, and on cancellation shuts the queue down with drain (keys
//! already queued or in flight are finished) and stops the informers; then the event writer is
//! flushed.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use kube_client::api::ListParams;
use kube_client::{Api, Client};
use tokio_util::sync::CancellationToken;

use super::api::KubeSyncClient;
use super::error::ControllerError;
use super::sync::sync_handler;
use super::types::Foo;
use crate::cache::{CacheMetrics, FactoryOptions, InformerName, SharedInformerFactory};
use crate::record::{AnyEventBroadcaster, default_reporting_instance};
use crate::runtime::{
    Controller, ControllerError as RuntimeError, LeaseRing, ObjectKey, ReconcileContext, ShardRing,
    ShardingConfig, default_error_policy,
};
use crate::workqueue::{MetricsProvider, sample_controller_rate_limiter};

/// The controller's name: event source component, queue name, log field.
/// sample-controller: `controllerAgentName`.
pub const CONTROLLER_NAME: &str = "sample-controller";

/// How the controller runs; the defaults are sample-controller's.
#[derive(Debug, Clone)]
pub struct ControllerConfig {
    /// Concurrent syncs (`--workers`; sample-controller runs 2).
    pub workers: usize,
    /// Informer resync period (`--resync`; sample-controller's factories use 30 s).
    pub resync: Duration,
    /// Watch one namespace only (`None`: all, as sample-controller does).
    pub namespace: Option<String>,
    /// The workqueue's name for its metrics (empty: no metrics).
    pub queue_name: String,
    /// Where the workqueue reports (`None`: the process-wide provider).
    pub queue_metrics: Option<MetricsProvider>,
    /// Where the informers report.
    pub cache_metrics: CacheMetrics,
    /// Set once the caches have synced and the workers run; cleared when shutdown starts
    /// (what `/readyz` reports).
    pub ready: Arc<AtomicBool>,
    /// Split the Foos over shards held through Leases in `sharding_namespace`, so that several
    /// replicas work at once (`None`: one process does everything, as sample-controller).
    pub sharding: Option<ShardingConfig>,
    /// Namespace of the shard ring's Leases.
    pub sharding_namespace: String,
    /// With `sharding`: split the Foos by their namespace's hash range, and have the informers
    /// list and watch only the shards this replica holds
    /// ([`crate::runtime::ShardRing::watch_held_shards`]).
    pub watch_held_shards: bool,
    /// With `watch_held_shards`: where the shards start (`None`: equal hash ranges;
    /// [`crate::cache::ShardBounds`]).
    pub shard_bounds: Option<crate::cache::ShardBounds>,
    /// Read-your-writes: how long a sync waits at most for the caches to hold the Foo's last
    /// Deployment and status writes (`None`: no wait; see
    /// [`crate::runtime::Controller::read_your_writes`]).
    pub freshness_wait: Option<Duration>,
}

impl Default for ControllerConfig {
    fn default() -> Self {
        ControllerConfig {
            workers: 2,
            resync: Duration::from_secs(30),
            namespace: None,
            queue_name: "Foos".to_string(),
            queue_metrics: None,
            cache_metrics: CacheMetrics::default(),
            ready: Arc::default(),
            sharding: None,
            sharding_namespace: "default".to_string(),
            watch_held_shards: false,
            shard_bounds: None,
            freshness_wait: Some(crate::runtime::DEFAULT_FRESHNESS_WAIT),
        }
    }
}

/// Runs the controller until `shutdown` is cancelled, then drains and stops.
pub async fn run(
    client: Client,
    config: ControllerConfig,
    shutdown: CancellationToken,
) -> Result<(), ControllerError> {
    let (broadcaster, recorder) = AnyEventBroadcaster::discover(
        client.clone(),
        CONTROLLER_NAME,
        &default_reporting_instance(CONTROLLER_NAME),
    )
    .await;
    let ring = match config.sharding.clone() {
        Some(sharding) => {
            let ring = ShardRing::new(
                sharding,
                LeaseRing::new(client.clone(), &config.sharding_namespace),
            )?;
            Some(
                match (config.watch_held_shards, config.shard_bounds.clone()) {
                    (true, Some(bounds)) => {
                        ring.watch_held_shards(crate::cache::ShardScope::with_bounds(bounds))?
                    }
                    (true, None) => ring.with_shard_scope(),
                    (false, _) => ring,
                },
            )
        }
        None => None,
    };
    let scope = ring.as_ref().and_then(|ring| ring.shard_scope().cloned());
    let factory = SharedInformerFactory::new(
        client.clone(),
        FactoryOptions {
            namespace: config.namespace.clone(),
            resync_period: config.resync,
            metrics: config.cache_metrics.clone(),
            shard_scope: scope,
            ..Default::default()
        },
    );
    // client-go 1.36's `informer_*` series under the controller's name; a second sample
    // controller in one process (tests) goes unnamed rather than failing.
    let factory = match InformerName::new(CONTROLLER_NAME) {
        Ok(name) => factory.with_informer_name(name),
        Err(e) => {
            tracing::warn!("informer metrics off for this controller: {e}");
            factory
        }
    };
    let foos = factory.informer::<Foo>();
    let deployments = factory.informer::<Deployment>();
    let mut controller = Controller::new(CONTROLLER_NAME, foos.clone())
        .owns(deployments.clone())
        .enqueue_deletes(false)
        .workers(config.workers)
        .queue_name(config.queue_name.clone())
        .rate_limiter(sample_controller_rate_limiter())
        .read_your_writes(config.freshness_wait)
        .with_readiness(config.ready.clone());
    if let Some(provider) = config.queue_metrics.clone() {
        controller = controller.queue_metrics(provider);
    }
    if let Some(ring) = ring {
        controller = controller.sharding(ring);
    }
    tokio::spawn(warn_if_crd_missing(
        client.clone(),
        config.namespace.clone(),
    ));

    let sync_client = Arc::new(KubeSyncClient::new(
        client,
        foos.lister(),
        deployments.lister(),
        recorder,
    ));
    let reconcile = move |key: ObjectKey, ctx: ReconcileContext| {
        let sync_client = Arc::clone(&sync_client);
        async move { sync_handler(sync_client.as_ref(), &key, &ctx).await }
    };
    let result = controller
        .run(reconcile, default_error_policy, shutdown)
        .await;
    broadcaster.shutdown().await;
    match result {
        Ok(()) => Ok(()),
        Err(RuntimeError::CacheSync { not_synced }) => {
            Err(ControllerError::CacheSync { not_synced })
        }
        Err(e @ RuntimeError::CacheSyncTimeout { .. }) => Err(ControllerError::CacheSyncTimeout(e)),
        Err(RuntimeError::Handler(e)) => Err(e.into()),
        // Only a controller under leader election can lose it; this one runs without (shard
        // electors contend again after a loss).
        Err(RuntimeError::LeadershipLost(reason)) => unreachable!("no leader election: {reason:?}"),
    }
}

/// The Foo informer cannot sync without the CRD, and its list errors alone do not say why:
/// say it once, plainly. The informer keeps retrying, so installing the CRD later works.
async fn warn_if_crd_missing(client: Client, namespace: Option<String>) {
    let foos: Api<Foo> = match &namespace {
        Some(ns) => Api::namespaced(client, ns),
        None => Api::all(client),
    };
    if let Err(kube_client::Error::Api(status)) = foos.list(&ListParams::default().limit(1)).await
        && status.code == 404
    {
        tracing::warn!(
            controller = CONTROLLER_NAME,
            "the Foo CRD (foos.samplecontroller.k8s.io) is not installed; apply crds/foo.yaml. Waiting for it."
        );
    }
}
