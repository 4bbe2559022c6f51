//! What a user declares: the primary type, owned and watched types, workers, queue, rate
//! limiter, leader election and leader-only tasks. [`Controller::run`] (in `run.rs`) runs it
//! with a reconcile function and an error policy.
//!
//! Counterparts: controller-runtime's `builder.ControllerManagedBy(mgr).For(..).Owns(..)
//! .Watches(..).WithOptions(..).Complete(r)` and kube-runtime's `Controller::new(api, cfg)
//! .owns(..).watches(..).run(reconcile, error_policy, ctx)`. The shape underneath is
//! client-go's: informers whose event handlers enqueue `namespace/name` keys into one
//! rate-limited queue, and N workers calling the reconcile with a key.
//!
//! The queue is controller-runtime's priority queue unless [`Controller::plain_queue`] asks
//! for client-go's rate-limiting queue.
//!
//! Event handlers the builder registers (on the priority queue, adds from the informer's
//! initial list and updates with an unchanged resourceVersion go in at low priority, as
//! controller-runtime's builder does with `WithLowPriorityWhenUnchanged`):
//! - primary: add, update (resyncs included, unless an update filter says otherwise) and
//!   delete (tombstones included, unless [`Controller::enqueue_deletes`] is off) enqueue the
//!   object's own key;
//! - owned ([`Controller::owns`]): add, update (a changed resourceVersion only) and delete
//!   enqueue the key of the object's controller ownerReference if it names the primary kind
//!   and group and that object is in the primary cache (sample-controller's `handleObject`);
//! - watched ([`Controller::watches`]): each event enqueues the keys the mapping returns.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use futures::future::BoxFuture;
use kube_client::Resource;
use tokio_util::sync::CancellationToken;

use super::context::ReconcileContext;
use super::freshness::{DEFAULT_FRESHNESS_WAIT, Freshness};
use super::handlers::{UpdateFilter, add_all, owned_handler, primary_handler, update_priority};
use super::key::ObjectKey;
use super::queue::{ControllerQueue, QueueFairness};
use super::sharding::{RingStore, ShardRing, Sharding};
use super::terms::LeaderTask;
use crate::cache::{
    CacheObject, DeletedObject, InformerError, Lister, ResourceEventHandlerFuncs,
    SharedIndexInformer,
};
use crate::leaderelection::{LeaderCallbacks, LeaderElector, ResourceLock, StopReason};
use crate::workqueue::{
    MetricsProvider, QueueConfig, RateLimiter, default_controller_rate_limiter, priority_on_add,
};

/// A controller, declared; run it with [`Controller::run`].
pub struct Controller<K: CacheObject> {
    pub(super) name: String,
    pub(super) primary: SharedIndexInformer<K>,
    pub(super) enqueue_deletes: bool,
    pub(super) update_filter: Option<UpdateFilter<K>>,
    /// Every informer the runtime starts, waits for and stops (the primary's first).
    pub(super) informers: Vec<Box<dyn RunInformer>>,
    /// Handler registrations for the secondary informers, run once the queue exists.
    pub(super) registrations: Vec<Registration>,
    pub(super) options: ControllerOptions,
    pub(super) leader_election: Option<LeaderElection>,
    pub(super) sharding: Option<Sharding>,
    pub(super) leader_tasks: Vec<LeaderTask>,
    pub(super) ready: Arc<AtomicBool>,
}

/// Settings; the defaults are sample-controller's and client-go's.
pub struct ControllerOptions {
    /// Concurrent reconciles (sample-controller's `Run(ctx, 2)`).
    pub workers: usize,
    /// The workqueue's name for its metrics (client-go `RateLimitingQueueConfig.Name`); empty:
    /// no workqueue metrics. Defaults to the controller's name.
    pub queue_name: String,
    /// Where the workqueue reports (`None`: the process-wide provider).
    pub queue_metrics: Option<MetricsProvider>,
    /// The queue's rate limiter (`None`: client-go's `DefaultControllerRateLimiter`).
    pub rate_limiter: Option<Box<dyn RateLimiter<ObjectKey>>>,
    /// client-go's rate-limiting queue instead of the priority queue (the default, `false`).
    pub plain_queue: bool,
    /// How the priority queue shares out one priority's keys ([`Controller::fairness`]):
    /// round-robin across namespaces by default.
    pub fairness: QueueFairness,
    /// Workers of the requeue lane ([`Controller::requeue_lane`]); 0: no lane, timed requeues
    /// go back to the controller's queue as in client-go.
    pub requeue_workers: usize,
    /// How long a reconcile waits at most for its caches to hold its key's last writes
    /// ([`Controller::read_your_writes`]); `None`: it does not wait (stale starts are still
    /// counted).
    pub freshness_wait: Option<Duration>,
    /// How long [`Controller::run`] waits for every cache to sync before it fails with
    /// [`super::ControllerError::CacheSyncTimeout`] (controller-runtime's `CacheSyncTimeout`,
    /// [`DEFAULT_CACHE_SYNC_TIMEOUT`] by default).
    pub cache_sync_timeout: Duration,
}

/// controller-runtime's default `CacheSyncTimeout` (`pkg/controller/controller.go`): 2 minutes.
pub const DEFAULT_CACHE_SYNC_TIMEOUT: Duration = Duration::from_secs(2 * 60);

impl std::fmt::Debug for ControllerOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControllerOptions")
            .field("workers", &self.workers)
            .field("queue_name", &self.queue_name)
            .field("custom_rate_limiter", &self.rate_limiter.is_some())
            .field("plain_queue", &self.plain_queue)
            .field("fairness", &self.fairness)
            .field("requeue_workers", &self.requeue_workers)
            .field("freshness_wait", &self.freshness_wait)
            .field("cache_sync_timeout", &self.cache_sync_timeout)
            .finish()
    }
}

/// What the runtime does with each of a controller's informers, whatever its object type:
/// start it, wait for its cache (or ask whether it synced, on a shutdown), name it, stop it.
pub(super) trait RunInformer: Send + Sync {
    fn start(&self);
    fn type_name(&self) -> String;
    fn has_synced(&self) -> bool;
    fn last_error(&self) -> Option<String>;
    fn wait_for_cache_sync(&self) -> BoxFuture<'static, bool>;
    fn shutdown(&self) -> BoxFuture<'static, ()>;
}

impl<K: CacheObject> RunInformer for SharedIndexInformer<K> {
    fn start(&self) {
        SharedIndexInformer::start(self)
    }
    fn type_name(&self) -> String {
        SharedIndexInformer::type_name(self).to_string()
    }
    fn has_synced(&self) -> bool {
        SharedIndexInformer::has_synced(self)
    }
    fn last_error(&self) -> Option<String> {
        SharedIndexInformer::last_error(self)
    }
    fn wait_for_cache_sync(&self) -> BoxFuture<'static, bool> {
        let me = self.clone();
        Box::pin(async move { me.wait_for_cache_sync().await })
    }
    fn shutdown(&self) -> BoxFuture<'static, ()> {
        let me = self.clone();
        Box::pin(async move { me.shutdown().await })
    }
}

pub(super) type Registration =
    Box<dyn FnOnce(&ControllerQueue, &Arc<Freshness>) -> Result<(), InformerError> + Send + Sync>;

/// Leader election, with the lock type erased.
pub(super) struct LeaderElection {
    pub run: Box<
        dyn FnOnce(LeaderCallbacks, CancellationToken) -> BoxFuture<'static, StopReason>
            + Send
            + Sync,
    >,
}

impl<K: CacheObject> Controller<K> {
    /// A controller named `name` (logs, metrics, the default queue name) over the primary
    /// type's informer.
    pub fn new(name: impl Into<String>, primary: SharedIndexInformer<K>) -> Self {
        let name = name.into();
        Controller {
            informers: vec![Box::new(primary.clone())],
            primary,
            enqueue_deletes: true,
            update_filter: None,
            registrations: Vec::new(),
            options: ControllerOptions {
                workers: 2,
                queue_name: name.clone(),
                queue_metrics: None,
                rate_limiter: None,
                plain_queue: false,
                fairness: QueueFairness::default(),
                requeue_workers: 0,
                freshness_wait: Some(DEFAULT_FRESHNESS_WAIT),
                cache_sync_timeout: DEFAULT_CACHE_SYNC_TIMEOUT,
            },
            name,
            leader_election: None,
            sharding: None,
            leader_tasks: Vec::new(),
            ready: Arc::default(),
        }
    }

    /// Reconcile the primary's owner when an object of type `C` it controls changes: the
    /// object's controller ownerReference must name `K`'s kind and API group, and the owner
    /// must be in the primary cache.
    pub fn owns<C>(mut self, owned: SharedIndexInformer<C>) -> Self
    where
        C: CacheObject,
        K: Resource<DynamicType = ()>,
    {
        let primary = self.primary.lister();
        let name = self.name.clone();
        let informer = owned.clone();
        self.informers.push(Box::new(owned));
        self.registrations.push(Box::new(move |queue, freshness| {
            informer.add_event_handler(owned_handler::<K, C>(primary, queue.clone(), name))?;
            informer.add_event_handler(freshness.source(informer.lister(), false))?;
            Ok(())
        }));
        self
    }

    /// Reconcile the keys `map` returns whenever an object of type `W` changes (added,
    /// updated, deleted; for a deletion the last known state).
    pub fn watches<W, F>(mut self, watched: SharedIndexInformer<W>, map: F) -> Self
    where
        W: CacheObject,
        F: Fn(&W) -> Vec<ObjectKey> + Send + Sync + 'static,
    {
        let map = Arc::new(map);
        let informer = watched.clone();
        self.informers.push(Box::new(watched));
        self.registrations.push(Box::new(move |queue, freshness| {
            informer.add_event_handler(freshness.source(informer.lister(), false))?;
            let (m_add, m_update, m_delete) = (map.clone(), map.clone(), map);
            let (q_add, q_update, q_delete) = (queue.clone(), queue.clone(), queue.clone());
            informer.add_event_handler(
                ResourceEventHandlerFuncs::new()
                    .on_add(move |obj: &Arc<W>, initial: bool| {
                        add_all(&q_add, m_add(obj), priority_on_add(initial))
                    })
                    .on_update(move |old: &Arc<W>, new: &Arc<W>| {
                        let priority = update_priority(old.as_ref(), new.as_ref());
                        add_all(&q_update, m_update(new), priority)
                    })
                    .on_delete(move |deleted: &DeletedObject<W>| {
                        add_all(&q_delete, m_delete(deleted.object()), None)
                    }),
            )?;
            Ok(())
        }));
        self
    }

    /// Enqueue a primary update only if `filter(old, new)` (default: every update, resyncs
    /// included). controller-runtime: an update predicate.
    pub fn update_filter(
        mut self,
        filter: impl Fn(&K, &K) -> bool + Send + Sync + 'static,
    ) -> Self {
        self.update_filter = Some(Arc::new(filter));
        self
    }

    /// Whether a deleted primary object enqueues its key (default `true`). sample-controller
    /// leaves deletions to the garbage collector and registers no delete handler.
    pub fn enqueue_deletes(mut self, enqueue: bool) -> Self {
        self.enqueue_deletes = enqueue;
        self
    }

    /// Concurrent reconciles (at least 1).
    pub fn workers(mut self, workers: usize) -> Self {
        self.options.workers = workers.max(1);
        self
    }

    /// Serve keys that a reconcile asks back with [`super::Action::RequeueAfter`] (periodic
    /// work: refreshing observed state) from a queue of their own, with `workers` workers of
    /// their own, so that periodic work never waits behind, nor holds up, the work events
    /// bring (creates, deletes, spec changes, retries). A key is never reconciled in both lanes
    /// at once: a timed requeue of a key the main lane is reconciling is dropped (that
    /// reconcile decides when it comes next), and a key from the main lane waits for the
    /// requeue lane's reconcile of it to end. Failures go to the controller's queue and its
    /// rate limiter either way. Beyond client-go and controller-runtime, which serve both from
    /// one queue and one worker pool. 0 (the default): one queue.
    pub fn requeue_lane(mut self, workers: usize) -> Self {
        self.options.requeue_workers = workers;
        self
    }

    /// The workqueue's metrics name (empty: none).
    pub fn queue_name(mut self, name: impl Into<String>) -> Self {
        self.options.queue_name = name.into();
        self
    }

    /// Where the workqueue reports its metrics.
    pub fn queue_metrics(mut self, provider: MetricsProvider) -> Self {
        self.options.queue_metrics = Some(provider);
        self
    }

    /// The queue's rate limiter.
    pub fn rate_limiter(mut self, limiter: impl RateLimiter<ObjectKey> + 'static) -> Self {
        self.options.rate_limiter = Some(Box::new(limiter));
        self
    }

    /// Read-your-writes: a reconcile of a key waits, at most `wait`, until the controller's
    /// caches hold the writes its previous reconciles reported with
    /// [`ReconcileContext::wrote`] (default: on, [`DEFAULT_FRESHNESS_WAIT`]). `None` turns the
    /// wait off; reconciles that start on a stale cache are still counted in
    /// `kubeloop_reconcile_stale_total`. See [the runtime's docs](super#read-your-writes).
    pub fn read_your_writes(mut self, wait: Option<Duration>) -> Self {
        self.options.freshness_wait = wait;
        self
    }

    /// How long the start waits for every cache to sync (default
    /// [`DEFAULT_CACHE_SYNC_TIMEOUT`], controller-runtime's `CacheSyncTimeout`). A cache that
    /// never syncs (its list refused, say for want of RBAC) makes [`Controller::run`] fail
    /// with [`super::ControllerError::CacheSyncTimeout`], naming the resource and the last
    /// list or watch error.
    pub fn cache_sync_timeout(mut self, timeout: Duration) -> Self {
        self.options.cache_sync_timeout = timeout;
        self
    }

    /// Serve keys first in, first out from client-go's rate-limiting queue instead of the
    /// priority queue (the default since controller-runtime v0.23). With the priority queue,
    /// the keys of the initial list and of resyncs wait behind new objects and edits.
    pub fn plain_queue(mut self) -> Self {
        self.options.plain_queue = true;
        self
    }

    /// How the priority queue shares out the keys of one priority: round-robin across
    /// namespaces ([`QueueFairness::Namespace`], the default), first in first out
    /// ([`QueueFairness::Off`], controller-runtime's way), or across the keys of an
    /// extractor of your own ([`QueueFairness::Custom`]). The plain queue ignores it.
    ///
    /// # Examples
    /// ```
    /// use kubeloop::runtime::{ObjectKey, QueueFairness};
    /// use kubeloop::workqueue::FairnessKeys;
    ///
    /// // Fair across tenants (a namespace's text before its first `-`), then across each
    /// // tenant's namespaces.
    /// let fairness = QueueFairness::custom(|key: &ObjectKey| {
    ///     let ns = key.namespace().unwrap_or("");
    ///     FairnessKeys::new(&[ns.split('-').next().unwrap_or(ns), ns])
    /// });
    /// # let _ = fairness;
    /// ```
    pub fn fairness(mut self, fairness: QueueFairness) -> Self {
        self.options.fairness = fairness;
        self
    }

    /// Run the workers only while `elector` leads. Informers run and caches stay warm on a
    /// standby; see [the runtime's docs](crate::runtime#leadership) for what is guaranteed when
    /// leadership ends. The
    /// elector's own settings decide whether it contends again after a loss
    /// (`recontend`); without it [`Controller::run`] returns
    /// [`super::ControllerError::LeadershipLost`].
    pub fn leader_election<L: ResourceLock>(mut self, elector: LeaderElector<L>) -> Self {
        self.sharding = None;
        self.leader_election = Some(LeaderElection {
            run: Box::new(move |callbacks, stop| {
                Box::pin(async move { elector.run(callbacks, stop).await })
            }),
        });
        self
    }

    /// Split the keys into the ring's shards and reconcile only those of shards this replica
    /// holds, each through its own Lease, instead of one leader doing all the work. Replaces
    /// [`Controller::leader_election`] (set one or the other). Informers run on every replica;
    /// leader tasks run on the holder of shard 0. See [`ShardRing`] for how shards move
    /// and what is guaranteed when they do.
    pub fn sharding<R: RingStore>(mut self, ring: ShardRing<R>) -> Self {
        self.leader_election = None;
        self.sharding = Some(ring.erase());
        self
    }

    /// A task run while this process leads (or for the whole run without leader election),
    /// e.g. a periodic sweep; it gets a [`ReconcileContext`] for its term and must return when
    /// that context is cancelled.
    pub fn leader_task<F, Fut>(mut self, name: impl Into<String>, task: F) -> Self
    where
        F: Fn(ReconcileContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        self.leader_tasks.push(LeaderTask {
            name: name.into(),
            run: Arc::new(move |ctx| Box::pin(task(ctx))),
        });
        self
    }

    /// True once every cache has synced (standbys included), false again when shutdown starts:
    /// what `/readyz` should report.
    pub fn readiness(&self) -> Arc<AtomicBool> {
        self.ready.clone()
    }

    /// Report readiness into `flag` (shared with a `/readyz` check built before the
    /// controller) instead of a flag of the controller's own.
    pub fn with_readiness(mut self, flag: Arc<AtomicBool>) -> Self {
        self.ready = flag;
        self
    }

    /// The primary cache.
    pub fn primary_lister(&self) -> Lister<K> {
        self.primary.lister()
    }

    /// The queue the runtime will use: the priority queue unless the plain one was asked for,
    /// with the controller's rate limiter (default: client-go's `DefaultControllerRateLimiter`,
    /// as sample-controller uses; controller-runtime's own default is the per-item part alone).
    pub(super) fn make_queue(&mut self) -> ControllerQueue {
        let config = QueueConfig {
            name: self.options.queue_name.clone(),
            metrics_provider: self.options.queue_metrics.clone(),
        };
        let limiter = self
            .options
            .rate_limiter
            .take()
            .unwrap_or_else(|| Box::new(default_controller_rate_limiter()));
        ControllerQueue::new(
            self.options.plain_queue,
            self.options.fairness.clone(),
            limiter,
            config,
        )
    }

    /// The requeue lane's queue, of the same kind: named `<queue name>_requeue` in the
    /// metrics; its limiter is never asked (failures go to the controller's queue).
    pub(super) fn make_requeue_queue(&self) -> ControllerQueue {
        let name = match self.options.queue_name.as_str() {
            "" => String::new(),
            main => format!("{main}_requeue"),
        };
        let config = QueueConfig {
            name,
            metrics_provider: self.options.queue_metrics.clone(),
        };
        ControllerQueue::new(
            self.options.plain_queue,
            self.options.fairness.clone(),
            default_controller_rate_limiter(),
            config,
        )
    }

    /// The primary's handlers.
    pub(super) fn primary_handler(&self, queue: &ControllerQueue) -> ResourceEventHandlerFuncs<K> {
        primary_handler(
            queue.clone(),
            self.update_filter.clone(),
            self.enqueue_deletes,
        )
    }
}
