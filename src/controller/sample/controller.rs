//! Wiring: sample-controller's `NewController` and `Run` (controller.go) on kubeloop's shared
//! informers, rate-limited queue, shared worker loop and event recorder.
//!
//! Event handlers (sample-controller's):
//! - Foo add and update (resyncs included) -> enqueue the Foo's key. Deletions are left to the
//!   garbage collector, which deletes the owned Deployment through its ownerReference.
//! - Deployment add, update and delete (tombstones included) -> if its controller
//!   ownerReference is a Foo that is in the cache, enqueue that Foo (`handleObject`). Updates
//!   with an unchanged resourceVersion (the periodic resync) are ignored.
//!
//! [`run`] starts the informers, waits for their caches, runs the workers, and on
//! cancellation shuts the queue down with drain (keys already queued or in flight are
//! finished), stops the informers and flushes the event writer.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube_client::api::ListParams;
use kube_client::{Api, Client};
use tokio_util::sync::CancellationToken;

use super::api::KubeSyncClient;
use super::deployment::{controller_of, refers_to_foo};
use super::error::ControllerError;
use super::sync::sync_handler;
use super::types::Foo;
use crate::cache::{
    CacheMetrics, DeletedObject, FactoryOptions, Lister, ResourceEventHandlerFuncs,
    SharedInformerFactory, store::resource_version,
};
use crate::controller::worker::{WorkerConfig, enqueue, run_workers};
use crate::record::{BroadcasterConfig, EventBroadcaster, EventSource, KubeEventSink};
use crate::workqueue::{
    MetricsProvider, QueueConfig, RateLimitingQueue, sample_controller_rate_limiter,
};

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
        }
    }
}

/// Runs the controller until `shutdown` is cancelled, then drains and stops.
pub async fn run(
    client: Client,
    config: ControllerConfig,
    shutdown: CancellationToken,
) -> Result<(), ControllerError> {
    let broadcaster = EventBroadcaster::start(
        KubeEventSink::new(client.clone()),
        BroadcasterConfig::default(),
    );
    let recorder = broadcaster.new_recorder(EventSource {
        component: CONTROLLER_NAME.to_string(),
        host: None,
    });
    let factory = SharedInformerFactory::new(
        client.clone(),
        FactoryOptions {
            namespace: config.namespace.clone(),
            resync_period: config.resync,
            metrics: config.cache_metrics.clone(),
            ..Default::default()
        },
    );
    let foos = factory.informer::<Foo>();
    let deployments = factory.informer::<Deployment>();
    let queue = RateLimitingQueue::with_config(
        sample_controller_rate_limiter(),
        QueueConfig {
            name: config.queue_name.clone(),
            metrics_provider: config.queue_metrics.clone(),
        },
    );

    tracing::info!(controller = CONTROLLER_NAME, "setting up event handlers");
    foos.add_event_handler(foo_handler(queue.clone()))?;
    deployments.add_event_handler(deployment_handler(foos.lister(), queue.clone()))?;

    tokio::spawn(warn_if_crd_missing(
        client.clone(),
        config.namespace.clone(),
    ));
    factory.start();
    tracing::info!(
        controller = CONTROLLER_NAME,
        "waiting for informer caches to sync"
    );
    let synced = tokio::select! {
        synced = factory.wait_for_cache_sync() => Some(synced),
        _ = shutdown.cancelled() => None,
    };
    let not_synced: Vec<String> = match &synced {
        Some(synced) => synced
            .iter()
            .filter(|(_, ok)| !**ok)
            .map(|(name, _)| name.clone())
            .collect(),
        // Stopped while waiting: name the informers that had not synced by then.
        None => [
            (foos.type_name(), foos.has_synced()),
            (deployments.type_name(), deployments.has_synced()),
        ]
        .into_iter()
        .filter(|(_, synced)| !synced)
        .map(|(name, _)| name.to_string())
        .collect(),
    };
    if !not_synced.is_empty() {
        queue.shutdown();
        factory.shutdown().await;
        broadcaster.shutdown().await;
        return Err(ControllerError::CacheSync { not_synced });
    }

    let sync_client = Arc::new(KubeSyncClient::new(
        client,
        foos.lister(),
        deployments.lister(),
        recorder,
    ));
    tracing::info!(
        controller = CONTROLLER_NAME,
        workers = config.workers,
        "starting workers"
    );
    let workers = tokio::spawn(run_workers(
        queue.clone(),
        WorkerConfig {
            workers: config.workers,
            name: CONTROLLER_NAME.to_string(),
        },
        move |key: String| {
            let sync_client = Arc::clone(&sync_client);
            async move { sync_handler(sync_client.as_ref(), &key).await }
        },
    ));

    config.ready.store(true, Ordering::SeqCst);

    shutdown.cancelled().await;
    config.ready.store(false, Ordering::SeqCst);
    tracing::info!(
        controller = CONTROLLER_NAME,
        queued = queue.len(),
        "shutting down: draining the queue"
    );
    queue.shutdown_with_drain().await;
    if let Err(e) = workers.await {
        tracing::error!(controller = CONTROLLER_NAME, error = %e, "worker pool ended abnormally");
    }
    factory.shutdown().await;
    broadcaster.shutdown().await;
    tracing::info!(controller = CONTROLLER_NAME, "shut down");
    Ok(())
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

/// Foo add/update -> enqueue the Foo. sample-controller: `enqueueFoo` on `AddFunc`/`UpdateFunc`.
pub fn foo_handler(queue: RateLimitingQueue<String>) -> ResourceEventHandlerFuncs<Foo> {
    let on_update = queue.clone();
    ResourceEventHandlerFuncs::new()
        .on_add(move |foo: &Arc<Foo>, _| enqueue(&queue, foo.as_ref()))
        .on_update(move |_old: &Arc<Foo>, new: &Arc<Foo>| enqueue(&on_update, new.as_ref()))
}

/// Deployment add/update/delete -> enqueue the owning Foo. sample-controller: `handleObject`.
pub fn deployment_handler(
    foos: Lister<Foo>,
    queue: RateLimitingQueue<String>,
) -> ResourceEventHandlerFuncs<Deployment> {
    let (f_add, q_add) = (foos.clone(), queue.clone());
    let (f_update, q_update) = (foos.clone(), queue.clone());
    ResourceEventHandlerFuncs::new()
        .on_add(move |d: &Arc<Deployment>, _| handle_object(&f_add, &q_add, &d.metadata))
        .on_update(move |old: &Arc<Deployment>, new: &Arc<Deployment>| {
            // Periodic resyncs send the same version twice; two different versions of the
            // same Deployment always have different resourceVersions.
            if resource_version(old.as_ref()) == resource_version(new.as_ref()) {
                return;
            }
            handle_object(&f_update, &q_update, &new.metadata)
        })
        .on_delete(move |deleted: &DeletedObject<Deployment>| {
            // A tombstone's object is the last state the cache knew; its ownerReferences are
            // what we need, and they do not change over a Deployment's life in practice.
            if deleted.is_tombstone() {
                tracing::debug!(
                    controller = CONTROLLER_NAME,
                    "recovered deleted deployment from tombstone"
                );
            }
            handle_object(&foos, &queue, &deleted.object().metadata)
        })
}

/// Enqueues the Foo that controls the object described by `meta`, if it is in the cache.
fn handle_object(foos: &Lister<Foo>, queue: &RateLimitingQueue<String>, meta: &ObjectMeta) {
    let Some(owner) = controller_of(meta) else {
        return;
    };
    if !refers_to_foo(owner) {
        return;
    }
    let namespace = meta.namespace.as_deref().unwrap_or("");
    match foos.get(namespace, &owner.name) {
        Some(foo) => enqueue(queue, foo.as_ref()),
        None => tracing::debug!(
            controller = CONTROLLER_NAME,
            object = meta.name.as_deref().unwrap_or(""),
            foo = %owner.name,
            "ignoring orphaned object"
        ),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use k8s_openapi::api::apps::v1::Deployment;

    use super::*;
    use crate::cache::{DeletedFinalStateUnknown, ResourceEventHandler, ThreadSafeStore};
    use crate::controller::sample::deployment::new_deployment;
    use crate::controller::sample::types::FooSpec;
    use crate::workqueue::default_controller_rate_limiter;

    struct Setup {
        foo: Foo,
        handler: ResourceEventHandlerFuncs<Deployment>,
        queue: RateLimitingQueue<String>,
    }

    /// A Foo `ns/test` in a lister, and the Deployment handler over it.
    fn setup() -> Setup {
        let mut foo = Foo::new(
            "ns",
            "test",
            FooSpec {
                deployment_name: "web".into(),
                replicas: Some(1),
            },
        );
        foo.metadata.uid = Some("uid-1".into());
        let store = ThreadSafeStore::new(HashMap::new());
        store.add("ns/test".into(), Arc::new(foo.clone()));
        let queue = RateLimitingQueue::new(default_controller_rate_limiter());
        let handler = deployment_handler(Lister::new(store.reader()), queue.clone());
        Setup {
            foo,
            handler,
            queue,
        }
    }

    fn owned(foo: &Foo, rv: &str) -> Arc<Deployment> {
        let mut d = new_deployment(foo);
        d.metadata.resource_version = Some(rv.into());
        Arc::new(d)
    }

    async fn next_key(queue: &RateLimitingQueue<String>) -> String {
        let key = queue.get().await.expect("a key");
        queue.done(&key);
        key
    }

    #[tokio::test]
    async fn a_deployment_owned_by_a_cached_foo_enqueues_that_foo() {
        let s = setup();
        let h: &dyn ResourceEventHandler<Deployment> = &s.handler;
        h.on_add(&owned(&s.foo, "1"), false);
        assert_eq!(next_key(&s.queue).await, "ns/test");
        h.on_update(&owned(&s.foo, "1"), &owned(&s.foo, "2"));
        assert_eq!(next_key(&s.queue).await, "ns/test");
        h.on_delete(&DeletedObject::Object(owned(&s.foo, "3")));
        assert_eq!(next_key(&s.queue).await, "ns/test");
    }

    #[test]
    fn a_resync_with_an_unchanged_resource_version_is_ignored() {
        let s = setup();
        let h: &dyn ResourceEventHandler<Deployment> = &s.handler;
        h.on_update(&owned(&s.foo, "5"), &owned(&s.foo, "5"));
        assert_eq!(s.queue.len(), 0);
    }

    #[tokio::test]
    async fn a_tombstoned_deployment_enqueues_its_foo() {
        let s = setup();
        let h: &dyn ResourceEventHandler<Deployment> = &s.handler;
        h.on_delete(&DeletedObject::Unknown(DeletedFinalStateUnknown {
            key: "ns/web".into(),
            obj: owned(&s.foo, "9"),
        }));
        assert_eq!(next_key(&s.queue).await, "ns/test");
    }

    #[test]
    fn deployments_without_a_foo_controller_or_with_an_uncached_foo_are_ignored() {
        let s = setup();
        let h: &dyn ResourceEventHandler<Deployment> = &s.handler;
        let mut unowned = new_deployment(&s.foo);
        unowned.metadata.owner_references = None;
        h.on_add(&Arc::new(unowned), false);
        let mut other_kind = new_deployment(&s.foo);
        other_kind.metadata.owner_references.as_mut().unwrap()[0].kind = "ReplicaSet".into();
        h.on_add(&Arc::new(other_kind), false);
        let mut other_group = new_deployment(&s.foo);
        other_group.metadata.owner_references.as_mut().unwrap()[0].api_version =
            "example.com/v1".into();
        h.on_add(&Arc::new(other_group), false);
        let orphan = Foo::new(
            "ns",
            "not-cached",
            FooSpec {
                deployment_name: "x".into(),
                replicas: None,
            },
        );
        h.on_add(&owned(&orphan, "1"), false);
        let mut other_namespace = new_deployment(&s.foo);
        other_namespace.metadata.namespace = Some("elsewhere".into());
        h.on_add(&Arc::new(other_namespace), false);
        assert_eq!(s.queue.len(), 0);
    }

    #[tokio::test]
    async fn foo_adds_and_updates_including_resyncs_enqueue_the_foo() {
        let s = setup();
        let handler = foo_handler(s.queue.clone());
        let h: &dyn ResourceEventHandler<Foo> = &handler;
        let foo = Arc::new(s.foo.clone());
        h.on_add(&foo, true);
        assert_eq!(next_key(&s.queue).await, "ns/test");
        h.on_update(&foo, &foo);
        assert_eq!(next_key(&s.queue).await, "ns/test");
    }
}
