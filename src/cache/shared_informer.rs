//! One watch, one cache, many handlers: client-go `tools/cache/shared_informer.go`
//! (`sharedIndexInformer`) with `controller.go`'s `processDeltas`.
//!
//! Pieces per informer: a [`Reflector`] writing into a queue ([`RealFIFO`] by default, as
//! client-go 1.36 informers always use; [`DeltaFIFO`] with [`QueueKind::DeltaFifo`]), a loop
//! popping it that updates the [`ThreadSafeStore`] and fans notifications out to every
//! handler's buffer, and one task per handler.
//!
//! The queue's default is client-go 1.36's: an atomic RealFIFO ([`RealFifoOptions`]) that
//! queues a whole list as one item (the informer works out deletions against its store when
//! it pops it, [`Popped::ReplacedAll`]) and hands out watch events in batches of distinct
//! keys, each batch applied to the store under one lock.
//!
//! Locking: the queue's lock is held while a pop is processed, unless the queue unlocks
//! while processing (the atomic default, as client-go 1.36's `UnlockWhileProcessingFIFO`);
//! inside it the informer's one lock (`Inner`: handlers and lifecycle) and then the store's.
//! Adding a handler takes the informer lock, so its replay of the cache and live
//! notifications never interleave. No lock is held across an `.await`.
//!
//! Rules kept from client-go:
//! - an update whose resourceVersion did not change (resync, or a relist's `Replaced`) only
//!   goes to handlers due for a resync;
//! - a handler added after start gets the cache replayed as adds flagged
//!   `is_in_initial_list`, and its registration's `has_synced` waits for them;
//! - per-handler resync period: at least 1 s, never below the informer's check period once
//!   started; before start a smaller one lowers the check period.
//!
//! Differs on purpose: a handler resync period given to an informer whose default is 0 turns
//! the resync check on when added before start (client-go silently never resyncs then).

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;
use parking_lot::Mutex;
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::delta_fifo::{
    DeletedFinalStateUnknown, DeletedObject, Delta, DeltaFIFO, DeltaType, Deltas, KnownObjects,
    TransformFunc,
};
use super::index::{IndexError, Indexers, namespace_indexers};
use super::list_watch::{CacheObject, ListerWatcher};
use super::lister::Lister;
use super::metrics::CacheMetrics;
use super::processor::{
    Listener, ListenerBuffer, MINIMUM_RESYNC_PERIOD, Notification, ResourceEventHandler,
    determine_resync_period, distribute, run_listener, should_resync,
};
use super::queue::{InformerQueue, Popped, QueueKind, ReplacedAllInfo};
use super::real_fifo::{RealFIFO, RealFifoOptions};
use super::reflector::{Reflector, ReflectorConfig, WatchErrorHandler};
use super::store::{KeyFunc, ReflectorStore, default_key_func, resource_version};
use super::thread_safe_store::{Indexer, ThreadSafeStore};

/// Informer settings.
#[derive(Debug, Clone, Default)]
pub struct InformerConfig {
    /// Default handler resync period and the initial resync check period (zero = none).
    /// client-go: the factory's `defaultResync`, 0 unless set.
    pub resync_period: Duration,
    /// The reflector's settings (its `resync_period` is overridden by the check period).
    pub reflector: ReflectorConfig,
    /// Where the reflector and handler series go.
    pub metrics: CacheMetrics,
    /// The queue between reflector and handlers. client-go 1.36: always the RealFIFO.
    pub queue: QueueKind,
    /// How the RealFIFO queues lists and hands out events; `Default` is client-go 1.36's
    /// (atomic lists and resyncs, bookmarks, unlocked while processing, batches of 1000).
    /// Ignored with [`QueueKind::DeltaFifo`].
    pub real_fifo: RealFifoOptions,
}

/// Per-handler options.
#[derive(Debug, Clone, Default)]
pub struct HandlerOptions {
    /// Name for logs and the backlog gauge; `handler-<n>` if empty.
    pub name: String,
    /// Resync period; `None` takes the informer's default.
    pub resync_period: Option<Duration>,
}

/// What an informer refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InformerError {
    /// A setting that only applies before start.
    #[error("informer for {type_name} has already started: cannot {what}")]
    AlreadyStarted {
        /// The resource type.
        type_name: String,
        /// What was attempted.
        what: &'static str,
    },
    /// The informer was shut down.
    #[error("informer for {type_name} was shut down: cannot {what}")]
    Stopped {
        /// The resource type.
        type_name: String,
        /// What was attempted.
        what: &'static str,
    },
    /// An index change was refused.
    #[error("informer for {type_name}: {source}")]
    Index {
        /// The resource type.
        type_name: String,
        /// Why.
        #[source]
        source: IndexError,
    },
}

/// A shared informer for one resource type. Cloning shares it.
pub struct SharedIndexInformer<K> {
    shared: Arc<Shared<K>>,
}

/// A handler's registration (client-go `ResourceEventHandlerRegistration`).
pub struct HandlerRegistration<K> {
    id: u64,
    name: String,
    buffer: Arc<ListenerBuffer<K>>,
    informer: Weak<Shared<K>>,
}

type StartFn<K> = Box<dyn FnOnce(StartParams<K>) -> BoxFuture<'static, ()> + Send>;

/// What the reflector is built with at start.
struct StartParams<K> {
    last_sync_rv: Arc<parking_lot::RwLock<String>>,
    store: Arc<dyn ReflectorStore<K>>,
    config: ReflectorConfig,
    metrics: CacheMetrics,
    should_resync: Arc<dyn Fn() -> bool + Send + Sync>,
    on_error: Option<WatchErrorHandler>,
    cancel: CancellationToken,
}

struct Shared<K> {
    type_name: String,
    store: ThreadSafeStore<K>,
    fifo: Arc<dyn InformerQueue<K>>,
    /// The store records the resourceVersion it is current to (an atomic queue).
    track_rv: bool,
    key_func: KeyFunc<K>,
    metrics: CacheMetrics,
    /// Woken after each processed key (for `wait_for_cache_sync`).
    progressed: Notify,
    stop: CancellationToken,
    /// The reflector's last synced resourceVersion.
    last_sync_rv: Arc<parking_lot::RwLock<String>>,
    inner: Mutex<Inner<K>>,
}

struct Inner<K> {
    listeners: Vec<Listener<K>>,
    next_id: u64,
    /// How often the reflector asks whether a handler is due; the smallest handler period.
    resync_check_period: Duration,
    default_resync: Duration,
    reflector_config: ReflectorConfig,
    on_error: Option<WatchErrorHandler>,
    lifecycle: Lifecycle<K>,
}

enum Lifecycle<K> {
    /// Holds what builds the reflector.
    NotStarted(StartFn<K>),
    /// Reflector and processing loop tasks, and each listener's task.
    Running {
        tasks: Vec<JoinHandle<()>>,
        listener_tasks: Vec<(u64, JoinHandle<()>)>,
    },
    /// Shut down (or shutting down).
    Stopped,
}

impl<K> Clone for SharedIndexInformer<K> {
    fn clone(&self) -> Self {
        Self {
            shared: self.shared.clone(),
        }
    }
}

impl<K: CacheObject> SharedIndexInformer<K> {
    /// An informer over `lw` with the namespace index.
    pub fn new<L: ListerWatcher<K>>(lw: L, config: InformerConfig) -> Self {
        Self::with_indexers(lw, namespace_indexers::<K>(), config)
    }

    /// An informer with its own indexers (add the namespace index yourself if wanted).
    pub fn with_indexers<L: ListerWatcher<K>>(
        lw: L,
        indexers: Indexers<K>,
        config: InformerConfig,
    ) -> Self {
        let type_name = lw.type_description();
        let store = ThreadSafeStore::new(indexers);
        let key_func = default_key_func::<K>();
        let known: Arc<dyn KnownObjects<K>> = Arc::new(store.reader());
        let mut options = config.real_fifo;
        if !options.atomic_events && (options.unlock_while_processing || options.emit_bookmarks) {
            tracing::warn!(
                %type_name,
                "RealFIFO options: unlock_while_processing and emit_bookmarks need atomic_events; both turned off"
            );
            options.unlock_while_processing = false;
            options.emit_bookmarks = false;
        }
        let track_rv = config.queue == QueueKind::RealFifo && options.atomic_events;
        let fifo: Arc<dyn InformerQueue<K>> = match config.queue {
            QueueKind::RealFifo => {
                // An atomic queue finds deletions in `replace_all`; a per-object one needs
                // the store.
                let known = (!options.atomic_events).then_some(known);
                Arc::new(
                    RealFIFO::with_options(key_func.clone(), known, options)
                        .expect("options made consistent above"),
                )
            }
            QueueKind::DeltaFifo => Arc::new(DeltaFIFO::new(key_func.clone(), Some(known))),
        };
        let start: StartFn<K> = Box::new(move |p: StartParams<K>| {
            let mut r = Reflector::new(lw, p.store, p.config)
                .with_metrics(&p.metrics)
                .with_should_resync(p.should_resync);
            if let Some(h) = p.on_error {
                r = r.with_watch_error_handler(h);
            }
            r = r.publish_last_sync_resource_version(p.last_sync_rv);
            r.run(p.cancel).boxed()
        });
        Self {
            shared: Arc::new(Shared {
                type_name,
                store,
                fifo,
                track_rv,
                key_func,
                metrics: config.metrics,
                progressed: Notify::new(),
                stop: CancellationToken::new(),
                last_sync_rv: Default::default(),
                inner: Mutex::new(Inner {
                    listeners: Vec::new(),
                    next_id: 0,
                    resync_check_period: config.resync_period,
                    default_resync: config.resync_period,
                    reflector_config: config.reflector,
                    on_error: None,
                    lifecycle: Lifecycle::NotStarted(start),
                }),
            }),
        }
    }

    /// The resource type this informer watches (`apiVersion/plural`).
    pub fn type_name(&self) -> &str {
        &self.shared.type_name
    }

    /// The read-only cache.
    pub fn indexer(&self) -> Indexer<K> {
        self.shared.store.reader()
    }

    /// Whether both handles are the same informer.
    pub fn ptr_eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.shared, &other.shared)
    }

    /// A lister over the cache.
    pub fn lister(&self) -> Lister<K> {
        Lister::new(self.indexer())
    }

    /// Adds indexers (backfilled from the cache; allowed at any time).
    pub fn add_indexers(&self, indexers: Indexers<K>) -> Result<(), InformerError> {
        self.shared
            .store
            .add_indexers(indexers)
            .map_err(|source| InformerError::Index {
                type_name: self.shared.type_name.clone(),
                source,
            })
    }

    /// Transforms objects before they are stored (e.g. drop managedFields). Before start only
    /// (client-go `SetTransform`).
    pub fn set_transform(
        &self,
        transform: impl Fn(K) -> K + Send + Sync + 'static,
    ) -> Result<(), InformerError> {
        let inner = self.shared.inner.lock();
        self.ensure_not_started(&inner, "set a transform")?;
        let t: TransformFunc<K> = Arc::new(transform);
        self.shared.fifo.set_queue_transform(Some(t));
        Ok(())
    }

    /// Replaces the reflector's watch error handler. Before start only.
    pub fn set_watch_error_handler(
        &self,
        handler: impl Fn(&super::reflector::ReflectorError) + Send + Sync + 'static,
    ) -> Result<(), InformerError> {
        let mut inner = self.shared.inner.lock();
        self.ensure_not_started(&inner, "set a watch error handler")?;
        inner.on_error = Some(Arc::new(handler));
        Ok(())
    }

    fn ensure_not_started(
        &self,
        inner: &Inner<K>,
        what: &'static str,
    ) -> Result<(), InformerError> {
        match inner.lifecycle {
            Lifecycle::NotStarted(_) => Ok(()),
            Lifecycle::Running { .. } => Err(InformerError::AlreadyStarted {
                type_name: self.shared.type_name.clone(),
                what,
            }),
            Lifecycle::Stopped => Err(InformerError::Stopped {
                type_name: self.shared.type_name.clone(),
                what,
            }),
        }
    }

    /// Adds a handler with the informer's default resync period.
    pub fn add_event_handler(
        &self,
        handler: impl ResourceEventHandler<K>,
    ) -> Result<HandlerRegistration<K>, InformerError> {
        self.add_event_handler_with_options(handler, HandlerOptions::default())
    }

    /// Adds a handler with its own resync period (zero = none).
    pub fn add_event_handler_with_resync_period(
        &self,
        handler: impl ResourceEventHandler<K>,
        resync_period: Duration,
    ) -> Result<HandlerRegistration<K>, InformerError> {
        self.add_event_handler_with_options(
            handler,
            HandlerOptions {
                resync_period: Some(resync_period),
                ..Default::default()
            },
        )
    }

    /// Adds a handler. After start, the current cache is replayed to it first.
    pub fn add_event_handler_with_options(
        &self,
        handler: impl ResourceEventHandler<K>,
        options: HandlerOptions,
    ) -> Result<HandlerRegistration<K>, InformerError> {
        let handler: Arc<dyn ResourceEventHandler<K>> = Arc::new(handler);
        let mut inner = self.shared.inner.lock();
        let started = match inner.lifecycle {
            Lifecycle::NotStarted(_) => false,
            Lifecycle::Running { .. } => true,
            Lifecycle::Stopped => {
                return Err(InformerError::Stopped {
                    type_name: self.shared.type_name.clone(),
                    what: "add an event handler",
                });
            }
        };
        let mut requested = options.resync_period.unwrap_or(inner.default_resync);
        if !requested.is_zero() && requested < MINIMUM_RESYNC_PERIOD {
            tracing::warn!(
                "resync period {requested:?} is too small; using the minimum {MINIMUM_RESYNC_PERIOD:?}"
            );
            requested = MINIMUM_RESYNC_PERIOD;
        }
        if !started
            && !requested.is_zero()
            && (inner.resync_check_period.is_zero() || requested < inner.resync_check_period)
        {
            inner.resync_check_period = requested;
            let check = requested;
            for l in &mut inner.listeners {
                l.resync_period = determine_resync_period(l.requested_resync, check);
            }
        }
        let resync_period = determine_resync_period(requested, inner.resync_check_period);

        let id = inner.next_id;
        inner.next_id += 1;
        let name = if options.name.is_empty() {
            format!("handler-{id}")
        } else {
            options.name
        };
        let backlog = self
            .shared
            .metrics
            .handler_backlog(&self.shared.type_name, &name);
        let buffer = Arc::new(ListenerBuffer::new(backlog));
        if started {
            // The replay happens under the informer lock, so no live notification for this
            // handler can come before it.
            for obj in self.shared.store.list() {
                buffer.push(Notification::Add {
                    obj,
                    is_in_initial_list: true,
                });
            }
        }
        inner.listeners.push(Listener {
            id,
            name: name.clone(),
            handler: handler.clone(),
            buffer: buffer.clone(),
            requested_resync: requested,
            resync_period,
            next_resync: Instant::now() + resync_period,
            syncing: false,
        });
        if let Lifecycle::Running { listener_tasks, .. } = &mut inner.lifecycle {
            let key_func = Some(self.shared.key_func.clone());
            let task = tokio::spawn(run_listener(
                name.clone(),
                handler,
                buffer.clone(),
                key_func,
            ));
            listener_tasks.push((id, task));
        }
        Ok(HandlerRegistration {
            id,
            name,
            buffer,
            informer: Arc::downgrade(&self.shared),
        })
    }

    /// Removes a handler; what it had queued is dropped.
    pub fn remove_event_handler(&self, registration: &HandlerRegistration<K>) {
        // A registration from another informer names nothing here (ids are per informer).
        if !self.owns(registration) {
            return;
        }
        let mut inner = self.shared.inner.lock();
        inner.listeners.retain(|l| l.id != registration.id);
        registration.buffer.close();
        if let Lifecycle::Running { listener_tasks, .. } = &mut inner.lifecycle {
            listener_tasks.retain(|(id, _)| *id != registration.id);
        }
    }

    /// Whether `registration` is a handler currently registered on this informer (client-go's
    /// tests read `processor.listeners` for this).
    pub fn is_registered(&self, registration: &HandlerRegistration<K>) -> bool {
        self.owns(registration)
            && self
                .shared
                .inner
                .lock()
                .listeners
                .iter()
                .any(|l| l.id == registration.id)
    }

    /// How many handlers are registered.
    pub fn handler_count(&self) -> usize {
        self.shared.inner.lock().listeners.len()
    }

    fn owns(&self, registration: &HandlerRegistration<K>) -> bool {
        std::ptr::eq(registration.informer.as_ptr(), Arc::as_ptr(&self.shared))
    }

    /// Starts the reflector, the processing loop and the handlers' tasks. Idempotent; a no-op
    /// after shutdown. Needs a tokio runtime.
    pub fn start(&self) {
        let mut inner = self.shared.inner.lock();
        let start = match std::mem::replace(&mut inner.lifecycle, Lifecycle::Stopped) {
            Lifecycle::NotStarted(start) => start,
            other => {
                inner.lifecycle = other;
                return;
            }
        };
        let listener_tasks = inner
            .listeners
            .iter()
            .map(|l| {
                let key_func = Some(self.shared.key_func.clone());
                let task = run_listener(
                    l.name.clone(),
                    l.handler.clone(),
                    l.buffer.clone(),
                    key_func,
                );
                (l.id, tokio::spawn(task))
            })
            .collect();
        let weak = Arc::downgrade(&self.shared);
        let should: Arc<dyn Fn() -> bool + Send + Sync> = Arc::new(move || {
            weak.upgrade()
                .is_some_and(|s| should_resync(&mut s.inner.lock().listeners))
        });
        let config = ReflectorConfig {
            resync_period: inner.resync_check_period,
            ..inner.reflector_config.clone()
        };
        let reflector = start(StartParams {
            last_sync_rv: self.shared.last_sync_rv.clone(),
            store: self.shared.fifo.clone(),
            config,
            metrics: self.shared.metrics.clone(),
            should_resync: should,
            on_error: inner.on_error.clone(),
            cancel: self.shared.stop.clone(),
        });
        let processing = tokio::spawn(process_loop(self.shared.clone()));
        inner.lifecycle = Lifecycle::Running {
            tasks: vec![tokio::spawn(reflector), processing],
            listener_tasks,
        };
    }

    /// The resourceVersion of the last list or watch event the reflector synced
    /// (client-go `LastSyncResourceVersion`); "" before the first list.
    pub fn last_sync_resource_version(&self) -> String {
        self.shared.last_sync_rv.read().clone()
    }

    /// Whether the initial list has been processed (client-go `HasSynced`).
    pub fn has_synced(&self) -> bool {
        self.shared.fifo.queue_has_synced()
    }

    /// Waits until synced; `false` if the informer is shut down first.
    pub async fn wait_for_cache_sync(&self) -> bool {
        self.shared.wait_until(|s| s.fifo.queue_has_synced()).await
    }

    /// Whether `shutdown` was called.
    pub fn is_stopped(&self) -> bool {
        self.shared.stop.is_cancelled()
    }

    /// Stops everything and waits for the tasks to end. Idempotent.
    pub async fn shutdown(&self) {
        self.shared.stop.cancel();
        self.shared.fifo.close_queue();
        self.shared.progressed.notify_waiters();
        let tasks = {
            let mut inner = self.shared.inner.lock();
            for l in &inner.listeners {
                l.buffer.close();
            }
            match std::mem::replace(&mut inner.lifecycle, Lifecycle::Stopped) {
                Lifecycle::Running {
                    tasks,
                    listener_tasks,
                } => tasks
                    .into_iter()
                    .chain(listener_tasks.into_iter().map(|(_, t)| t))
                    .collect(),
                _ => Vec::new(),
            }
        };
        for t in tasks {
            if let Err(e) = t.await
                && e.is_panic()
            {
                tracing::error!(type_name = %self.shared.type_name, "informer task panicked: {e}");
            }
        }
    }
}

impl<K> std::fmt::Debug for HandlerRegistration<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HandlerRegistration")
            .field("id", &self.id)
            .field("name", &self.name)
            .finish()
    }
}

impl<K> HandlerRegistration<K> {
    /// The handler's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Notifications queued for the handler or in flight.
    pub fn backlog(&self) -> usize {
        self.buffer.backlog()
    }
}

impl<K: CacheObject> HandlerRegistration<K> {
    /// The informer has synced and this handler has handled every initial-list add
    /// (client-go `ResourceEventHandlerRegistration.HasSynced`).
    pub fn has_synced(&self) -> bool {
        self.informer
            .upgrade()
            .is_some_and(|s| s.fifo.queue_has_synced() && self.buffer.initial_pending() == 0)
    }

    /// Waits until [`has_synced`](Self::has_synced); `false` if the informer stops first.
    pub async fn wait_for_sync(&self) -> bool {
        let Some(shared) = self.informer.upgrade() else {
            return false;
        };
        let buffer = self.buffer.clone();
        shared
            .wait_until(move |s| s.fifo.queue_has_synced() && buffer.initial_pending() == 0)
            .await
    }
}

impl<K: CacheObject> Shared<K> {
    async fn wait_until(&self, done: impl Fn(&Self) -> bool) -> bool {
        loop {
            let progressed = self.progressed.notified();
            tokio::pin!(progressed);
            progressed.as_mut().enable();
            if done(self) {
                return true;
            }
            if self.stop.is_cancelled() {
                return false;
            }
            // Handlers finish outside the processing loop: poll as client-go does (100 ms).
            tokio::select! {
                _ = progressed => {}
                _ = tokio::time::sleep(Duration::from_millis(100)) => {}
                _ = self.stop.cancelled() => {}
            }
        }
    }

    /// Applies one pop to the store and notifies the handlers: client-go `processDeltas`,
    /// `processDeltasInBatch` and `processReplacedAllInfo`.
    fn process(&self, popped: Popped<K>, is_in_initial_list: bool) {
        let inner = self.inner.lock();
        let listeners = &inner.listeners;
        match popped {
            Popped::Deltas(deltas) | Popped::Batch(deltas) => {
                self.apply_deltas(listeners, deltas, is_in_initial_list)
            }
            Popped::ReplacedAll(info) => self.replace_all(listeners, info, is_in_initial_list),
            Popped::SyncAll => {
                for obj in self.store.list() {
                    let n = Notification::Update {
                        old: obj.clone(),
                        new: obj,
                    };
                    distribute(listeners, &n, true);
                }
            }
            Popped::Bookmark(rv) => self.store.bookmark(&rv),
        }
    }

    /// Applies events to the store under one lock, then notifies (client-go
    /// `processDeltasInBatch`; one key's deltas or one event are a batch of their own). An
    /// event whose key cannot be computed is reported and skipped.
    fn apply_deltas(&self, listeners: &[Listener<K>], deltas: Deltas<K>, initial: bool) {
        let applied = self.store.transaction(|tx| {
            let mut applied = Vec::with_capacity(deltas.len());
            for delta in deltas {
                let delta_type = delta.delta_type();
                let key = match &delta {
                    Delta::Deleted(DeletedObject::Unknown(t)) => Ok(t.key.clone()),
                    d => (self.key_func)(d.object()),
                };
                let key = match key {
                    Ok(key) => key,
                    Err(e) => {
                        tracing::warn!(type_name = %self.type_name, "cannot apply a {delta_type:?} event: {e}");
                        continue;
                    }
                };
                // The store keeps the key; a copy only for a followed object's trace.
                let traced = crate::trace::on().then(|| key.clone());
                let old = match &delta {
                    Delta::Deleted(_) => tx.delete(&key),
                    d => tx.put(key, d.object().clone()),
                };
                if let Some(key) = traced {
                    let stage = match (&delta, &old) {
                        (Delta::Deleted(_), _) => "removed",
                        (_, Some(_)) => "updated",
                        (_, None) => "added",
                    };
                    trace_popped::<K>(&key, delta_type, stage, listeners.len());
                }
                applied.push((delta, old));
            }
            // client-go sets the store's resourceVersion from the last object written (a
            // tombstone has none); only an atomic queue keeps the store between versions.
            if self.track_rv
                && let Some((d, _)) = applied.last()
                && !matches!(d, Delta::Deleted(DeletedObject::Unknown(_)))
            {
                tx.set_resource_version(resource_version(&**d.object()));
            }
            applied
        });
        for (delta, old) in applied {
            match delta {
                Delta::Deleted(deleted) => {
                    distribute(listeners, &Notification::Delete(deleted), false);
                }
                Delta::Added(obj)
                | Delta::Updated(obj)
                | Delta::Replaced(obj)
                | Delta::Sync(obj) => self.notify_put(listeners, old, obj, initial),
            }
        }
    }

    /// Notifies the handlers of one object written to the store over `old`.
    fn notify_put(
        &self,
        listeners: &[Listener<K>],
        old: Option<Arc<K>>,
        obj: Arc<K>,
        is_in_initial_list: bool,
    ) {
        match old {
            Some(old) => {
                // Unchanged resourceVersion: a resync, only for handlers due one.
                let is_sync = resource_version(&*old) == resource_version(&*obj);
                distribute(listeners, &Notification::Update { old, new: obj }, is_sync);
            }
            None => {
                let n = Notification::Add {
                    obj,
                    is_in_initial_list,
                };
                distribute(listeners, &n, false);
            }
        }
    }

    /// client-go `processReplacedAllInfo`: the store becomes exactly the list (so it reflects
    /// what handlers are told), then a tombstone for every key the list lacks, then an add
    /// or update per listed object in list order. An object whose key cannot be computed is
    /// reported and left out.
    fn replace_all(&self, listeners: &[Listener<K>], info: ReplacedAllInfo<K>, initial: bool) {
        let ReplacedAllInfo {
            resource_version: rv,
            objects,
        } = info;
        let mut items = HashMap::with_capacity(objects.len());
        for obj in &objects {
            match (self.key_func)(obj) {
                Ok(key) => {
                    items.insert(key, obj.clone());
                }
                Err(e) => {
                    tracing::warn!(type_name = %self.type_name, "cannot store a listed object: {e}");
                }
            }
        }
        let mut old = self.store.replace(items, &rv);
        // Keys are computed again rather than kept: a 100k-object list would otherwise hold
        // a second copy of every key until the handlers are notified.
        let mut puts = Vec::with_capacity(objects.len());
        for obj in objects {
            if let Ok(key) = (self.key_func)(&obj) {
                let prev = old.remove(&key);
                if crate::trace::on() {
                    let stage = if prev.is_some() { "updated" } else { "added" };
                    trace_popped::<K>(&key, DeltaType::Replaced, stage, listeners.len());
                }
                puts.push((prev, obj));
            }
        }
        for (key, obj) in old {
            if crate::trace::on() {
                trace_popped::<K>(&key, DeltaType::Deleted, "removed", listeners.len());
            }
            let tombstone = DeletedObject::Unknown(DeletedFinalStateUnknown { key, obj });
            distribute(listeners, &Notification::Delete(tombstone), false);
        }
        for (prev, obj) in puts {
            self.notify_put(listeners, prev, obj, initial);
        }
    }
}

/// Records that a followed key left the FIFO and went into the indexer (see [`crate::trace`]).
fn trace_popped<K>(key: &str, delta_type: DeltaType, store: &str, handlers: usize) {
    let kind = crate::trace::short_type_name::<K>();
    crate::trace::record(key, crate::trace::Stage::FifoPopped, kind, || {
        format!("{delta_type:?}")
    });
    crate::trace::record(key, crate::trace::Stage::IndexerStored, kind, || {
        format!("{store}; notifying {handlers} handler(s)")
    });
}

/// Pops the FIFO until shutdown (client-go `controller.processLoop`).
async fn process_loop<K: CacheObject>(shared: Arc<Shared<K>>) {
    let process_shared = shared.clone();
    let mut process = move |popped, initial| process_shared.process(popped, initial);
    loop {
        let popped = tokio::select! {
            _ = shared.stop.cancelled() => return,
            r = shared.fifo.pop_with(&mut process) => r,
        };
        if popped.is_err() {
            return;
        }
        shared.progressed.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::fake_source::FakeControllerSource;
    use crate::cache::processor::ResourceEventHandlerFuncs;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube_client::api::ObjectMeta;

    fn cm(name: &str) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("ns".into()),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    fn cm_data(name: &str, v: &str) -> ConfigMap {
        let mut c = cm(name);
        c.data = Some([("v".to_string(), v.to_string())].into());
        c
    }

    /// Writes what a handler sees as short strings.
    #[derive(Clone, Default)]
    struct Recorder {
        events: Arc<Mutex<Vec<String>>>,
    }

    fn name(o: &ConfigMap) -> String {
        o.metadata.name.clone().unwrap()
    }

    impl ResourceEventHandler<ConfigMap> for Recorder {
        fn on_add(&self, obj: &Arc<ConfigMap>, initial: bool) {
            let tag = if initial { " initial" } else { "" };
            self.events.lock().push(format!("add {}{tag}", name(obj)));
        }
        fn on_update(&self, old: &Arc<ConfigMap>, new: &Arc<ConfigMap>) {
            let e = if resource_version(&**old) == resource_version(&**new) {
                format!("sync {}", name(new))
            } else {
                format!("update {}", name(new))
            };
            self.events.lock().push(e);
        }
        fn on_delete(&self, obj: &DeletedObject<ConfigMap>) {
            let e = match obj {
                DeletedObject::Object(o) => format!("delete {}", name(o)),
                DeletedObject::Unknown(t) => format!("tombstone {}", t.key),
            };
            self.events.lock().push(e);
        }
    }

    impl Recorder {
        fn take(&self) -> Vec<String> {
            std::mem::take(&mut *self.events.lock())
        }
        fn count(&self, prefix: &str) -> usize {
            self.events
                .lock()
                .iter()
                .filter(|e| e.starts_with(prefix))
                .count()
        }
    }

    fn informer(source: &FakeControllerSource, resync: Duration) -> SharedIndexInformer<ConfigMap> {
        let config = InformerConfig {
            resync_period: resync,
            reflector: ReflectorConfig {
                backoff: crate::cache::BackoffConfig {
                    jitter: 0.0,
                    ..Default::default()
                },
                ..Default::default()
            },
            ..Default::default()
        };
        SharedIndexInformer::new(source.clone(), config)
    }

    async fn settle() {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // client-go: TestSharedInformerInitializationRace / the basic informer flow
    #[tokio::test(start_paused = true)]
    async fn handlers_see_initial_list_then_live_changes_in_order() {
        let source = FakeControllerSource::new();
        source.add(cm("a"));
        source.add(cm("b"));
        let inf = informer(&source, Duration::ZERO);
        let rec = Recorder::default();
        let reg = inf.add_event_handler(rec.clone()).unwrap();
        assert!(!inf.has_synced());
        inf.start();
        assert!(inf.wait_for_cache_sync().await);
        assert!(reg.wait_for_sync().await);
        let mut initial = rec.take();
        initial.sort();
        assert_eq!(initial, ["add a initial", "add b initial"]);

        source.modify(cm_data("a", "1"));
        source.delete(cm("b"));
        source.add(cm("c"));
        settle().await;
        assert_eq!(rec.take(), ["update a", "delete b", "add c"]);
        assert_eq!(inf.last_sync_resource_version(), "5");
        let mut keys = inf.indexer().list_keys();
        keys.sort();
        assert_eq!(keys, ["ns/a", "ns/c"]);
        assert_eq!(
            inf.lister().get("ns", "a").unwrap().data.as_ref().unwrap()["v"],
            "1"
        );
        inf.shutdown().await;
    }

    fn informer_with(
        source: &FakeControllerSource,
        queue: QueueKind,
        real_fifo: RealFifoOptions,
    ) -> SharedIndexInformer<ConfigMap> {
        let mut config = informer(source, Duration::ZERO)
            .shared
            .inner
            .lock()
            .reflector_config
            .clone();
        config.resync_period = Duration::ZERO;
        SharedIndexInformer::new(
            source.clone(),
            InformerConfig {
                reflector: config,
                queue,
                real_fifo,
                ..Default::default()
            },
        )
    }

    // kubeloop's own: the three queue settings (client-go 1.36's atomic RealFIFO, the
    // per-object RealFIFO of 1.33-1.35, the DeltaFIFO) give a handler the same events through
    // a list, watch events, and a relist that finds a deletion, a change and an addition it
    // never saw; the atomic queue tells the deletion first, as client-go's
    // `processReplacedAllInfo` does.
    #[tokio::test(start_paused = true)]
    async fn every_queue_setting_gives_handlers_the_same_events() {
        let settings = [
            (
                "atomic RealFIFO",
                QueueKind::RealFifo,
                RealFifoOptions::default(),
            ),
            (
                "per-object RealFIFO",
                QueueKind::RealFifo,
                RealFifoOptions::non_atomic(),
            ),
            (
                "DeltaFIFO",
                QueueKind::DeltaFifo,
                RealFifoOptions::default(),
            ),
        ];
        for (name, queue, real_fifo) in settings {
            let source = FakeControllerSource::new();
            source.add(cm("a"));
            source.add(cm("b"));
            let inf = informer_with(&source, queue, real_fifo);
            let rec = Recorder::default();
            let reg = inf.add_event_handler(rec.clone()).unwrap();
            inf.start();
            assert!(reg.wait_for_sync().await, "{name}");
            let mut initial = rec.take();
            initial.sort();
            assert_eq!(initial, ["add a initial", "add b initial"], "{name}");

            source.modify(cm_data("a", "1"));
            source.delete(cm("b"));
            source.add(cm("c"));
            settle().await;
            assert_eq!(rec.take(), ["update a", "delete b", "add c"], "{name}");

            // Lost while "disconnected"; the relist after the compaction finds them.
            source.delete_silently(cm("c"));
            source.modify_silently(cm_data("a", "2"));
            source.add_silently(cm("d"));
            source.compact();
            tokio::time::sleep(Duration::from_secs(5)).await;
            let relist = rec.take();
            if real_fifo.atomic_events && queue == QueueKind::RealFifo {
                assert_eq!(relist.first().map(String::as_str), Some("tombstone ns/c"));
            }
            let mut relist = relist;
            relist.sort();
            assert_eq!(relist, ["add d", "tombstone ns/c", "update a"], "{name}");
            let mut keys = inf.indexer().list_keys();
            keys.sort();
            assert_eq!(keys, ["ns/a", "ns/d"], "{name}");
            assert_eq!(
                inf.lister().get("ns", "a").unwrap().data.as_ref().unwrap()["v"],
                "2",
                "{name}"
            );
            inf.shutdown().await;
        }
    }

    // kubeloop's own (client-go `threadSafeMap.rv`, kept with the `AtomicFIFO` gate on): an
    // informer with an atomic queue knows the resourceVersion its store is current to, the
    // list's and then each applied event's; with a per-object queue it reports "".
    #[tokio::test(start_paused = true)]
    async fn the_store_knows_its_resource_version_with_an_atomic_queue() {
        for (real_fifo, tracked) in [
            (RealFifoOptions::default(), true),
            (RealFifoOptions::non_atomic(), false),
        ] {
            let source = FakeControllerSource::new();
            source.add(cm("a"));
            source.add(cm("b"));
            let inf = informer_with(&source, QueueKind::RealFifo, real_fifo);
            let indexer = inf.indexer();
            assert_eq!(indexer.last_store_sync_resource_version(), "");
            inf.start();
            assert!(inf.wait_for_cache_sync().await);
            let want = |rv: &str| {
                if tracked {
                    rv.to_string()
                } else {
                    String::new()
                }
            };
            assert_eq!(indexer.last_store_sync_resource_version(), want("2"));
            source.add(cm("c"));
            source.modify(cm_data("a", "1"));
            settle().await;
            assert_eq!(indexer.last_store_sync_resource_version(), want("4"));
            inf.shutdown().await;
        }
    }

    // client-go: TestAddWhileActive / TestSharedInformerMultipleRegistration
    #[tokio::test(start_paused = true)]
    async fn a_handler_added_after_start_gets_the_cache_replayed() {
        let source = FakeControllerSource::new();
        source.add(cm("a"));
        let inf = informer(&source, Duration::ZERO);
        let first = Recorder::default();
        inf.add_event_handler(first.clone()).unwrap();
        inf.start();
        assert!(inf.wait_for_cache_sync().await);
        source.add(cm("b"));
        settle().await;

        let late = Recorder::default();
        let reg = inf.add_event_handler(late.clone()).unwrap();
        assert!(reg.wait_for_sync().await);
        assert!(reg.has_synced());
        let mut replayed = late.take();
        replayed.sort();
        assert_eq!(replayed, ["add a initial", "add b initial"]);
        source.add(cm("c"));
        settle().await;
        assert_eq!(late.take(), ["add c"]);
        assert_eq!(first.take(), ["add a initial", "add b", "add c"]);
        inf.shutdown().await;
    }

    // client-go: TestSharedInformerWatchDisruption (deletions missed during the disruption
    // reach handlers as tombstones; nothing is added twice)
    #[tokio::test(start_paused = true)]
    async fn deletions_missed_across_a_relist_arrive_as_tombstones() {
        let source = FakeControllerSource::new();
        source.add(cm("a"));
        source.add(cm("b"));
        let inf = informer(&source, Duration::ZERO);
        let rec = Recorder::default();
        inf.add_event_handler(rec.clone()).unwrap();
        inf.start();
        assert!(inf.wait_for_cache_sync().await);
        settle().await;
        rec.take();

        // The events of these changes are lost; then the history is compacted (410).
        source.delete_silently(cm("a"));
        source.compact();
        source.add(cm("c"));
        tokio::time::sleep(Duration::from_secs(3)).await;
        let mut seen = rec.take();
        seen.sort();
        // b is unchanged: its Replaced delta with the same resourceVersion is not delivered.
        assert_eq!(seen, ["add c", "tombstone ns/a"]);
        let mut keys = inf.indexer().list_keys();
        keys.sort();
        assert_eq!(keys, ["ns/b", "ns/c"]);
        assert_eq!(source.list_count(), 2);
        inf.shutdown().await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_clean_watch_close_resumes_without_a_relist() {
        let source = FakeControllerSource::new();
        source.add(cm("a"));
        let inf = informer(&source, Duration::ZERO);
        let rec = Recorder::default();
        inf.add_event_handler(rec.clone()).unwrap();
        inf.start();
        assert!(inf.wait_for_cache_sync().await);
        tokio::time::sleep(Duration::from_secs(2)).await;
        source.break_watches();
        source.modify(cm_data("a", "2"));
        source.add(cm("b"));
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(rec.take(), ["add a initial", "update a", "add b"]);
        assert_eq!(source.list_count(), 1);
        inf.shutdown().await;
    }

    // client-go: TestListenerResyncPeriods
    #[tokio::test(start_paused = true)]
    async fn each_listener_resyncs_on_its_own_period() {
        listener_resync_periods(Duration::ZERO).await;
    }

    // client-go: TestListenerResyncPeriodsDelayed (the handlers start a second after the
    // first notifications were distributed; their buffers hold them, nothing deadlocks)
    #[tokio::test(start_paused = true)]
    async fn listener_resync_periods_delayed() {
        crate::cache::processor::LISTENER_START_DELAY.with(|d| d.set(Duration::from_secs(1)));
        listener_resync_periods(Duration::from_secs(1)).await;
        crate::cache::processor::LISTENER_START_DELAY.with(|d| d.set(Duration::ZERO));
    }

    async fn listener_resync_periods(startup_delay: Duration) {
        let source = FakeControllerSource::new();
        source.add(cm("a"));
        let inf = informer(&source, Duration::from_secs(1));
        let (r1, r2, r3) = (
            Recorder::default(),
            Recorder::default(),
            Recorder::default(),
        );
        inf.add_event_handler_with_resync_period(r1.clone(), Duration::from_secs(1))
            .unwrap();
        inf.add_event_handler_with_resync_period(r2.clone(), Duration::from_secs(2))
            .unwrap();
        inf.add_event_handler_with_resync_period(r3.clone(), Duration::ZERO)
            .unwrap();
        inf.start();
        assert!(inf.wait_for_cache_sync().await);
        if !startup_delay.is_zero() {
            assert_eq!(r1.count("add a"), 0, "the handlers have not started yet");
        }
        tokio::time::sleep(Duration::from_millis(4500)).await;
        for r in [&r1, &r2, &r3] {
            assert_eq!(r.count("add a"), 1, "startup delay {startup_delay:?}");
        }
        assert_eq!(r1.count("sync a"), 4, "startup delay {startup_delay:?}");
        assert_eq!(r2.count("sync a"), 2, "startup delay {startup_delay:?}");
        assert_eq!(r3.count("sync a"), 0, "startup delay {startup_delay:?}");
        inf.shutdown().await;
    }

    // client-go: TestResyncCheckPeriod
    #[tokio::test(start_paused = true)]
    async fn resync_check_period_follows_handlers_before_start_only() {
        let source = FakeControllerSource::new();
        let inf = informer(&source, Duration::from_secs(60));
        let check =
            |inf: &SharedIndexInformer<ConfigMap>| inf.shared.inner.lock().resync_check_period;
        let periods = |inf: &SharedIndexInformer<ConfigMap>| {
            inf.shared
                .inner
                .lock()
                .listeners
                .iter()
                .map(|l| l.resync_period)
                .collect::<Vec<_>>()
        };
        inf.add_event_handler(Recorder::default()).unwrap();
        assert_eq!(check(&inf), Duration::from_secs(60));
        inf.add_event_handler_with_resync_period(Recorder::default(), Duration::from_secs(10))
            .unwrap();
        assert_eq!(check(&inf), Duration::from_secs(10));
        // Below the minimum: raised to 1 s, which becomes the check period.
        inf.add_event_handler_with_resync_period(Recorder::default(), Duration::from_millis(10))
            .unwrap();
        assert_eq!(check(&inf), Duration::from_secs(1));
        assert_eq!(
            periods(&inf),
            [
                Duration::from_secs(60),
                Duration::from_secs(10),
                Duration::from_secs(1)
            ]
        );
        inf.start();
        // After start, the check period no longer moves; nothing below it.
        let inf2 = informer(&source, Duration::from_secs(5));
        inf2.start();
        inf2.add_event_handler_with_resync_period(Recorder::default(), Duration::from_secs(2))
            .unwrap();
        assert_eq!(check(&inf2), Duration::from_secs(5));
        assert_eq!(periods(&inf2), [Duration::from_secs(5)]);
        inf.shutdown().await;
        inf2.shutdown().await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_handler_resync_turns_the_check_on_when_the_informer_default_is_zero() {
        let source = FakeControllerSource::new();
        source.add(cm("a"));
        let inf = informer(&source, Duration::ZERO);
        let rec = Recorder::default();
        inf.add_event_handler_with_resync_period(rec.clone(), Duration::from_secs(2))
            .unwrap();
        inf.start();
        tokio::time::sleep(Duration::from_millis(4500)).await;
        assert_eq!(rec.count("sync a"), 2);
        inf.shutdown().await;
    }

    // client-go: TestAddOnStoppedSharedInformer
    #[tokio::test(start_paused = true)]
    async fn adding_to_a_stopped_informer_is_an_error() {
        let source = FakeControllerSource::new();
        let inf = informer(&source, Duration::ZERO);
        inf.start();
        inf.shutdown().await;
        let err = inf.add_event_handler(Recorder::default()).unwrap_err();
        assert!(matches!(err, InformerError::Stopped { .. }));
        assert!(err.to_string().contains("v1/configmaps"));
        assert!(!inf.wait_for_cache_sync().await || inf.has_synced());
    }

    // client-go: TestSharedInformerTransformer
    #[tokio::test(start_paused = true)]
    async fn transform_runs_before_the_store_and_only_before_start() {
        let source = FakeControllerSource::new();
        let mut with_fields = cm("a");
        with_fields.metadata.managed_fields = Some(vec![Default::default()]);
        source.add(with_fields);
        let inf = informer(&source, Duration::ZERO);
        inf.set_transform(|mut o: ConfigMap| {
            o.metadata.managed_fields = None;
            o
        })
        .unwrap();
        inf.start();
        assert!(inf.wait_for_cache_sync().await);
        assert!(
            inf.lister()
                .get("ns", "a")
                .unwrap()
                .metadata
                .managed_fields
                .is_none()
        );
        let err = inf.set_transform(|o| o).unwrap_err();
        assert!(matches!(err, InformerError::AlreadyStarted { .. }), "{err}");
        inf.shutdown().await;
    }

    // kubeloop's own: the reflector runs the transform on each listed object as it arrives
    // (client-go's TransformingStore) and the queue does not run it again, for both queues;
    // watch events are transformed once by the queue.
    #[tokio::test(start_paused = true)]
    async fn listed_and_watched_objects_are_transformed_exactly_once() {
        for queue in [QueueKind::RealFifo, QueueKind::DeltaFifo] {
            let source = FakeControllerSource::new();
            source.add(cm("a"));
            let inf = SharedIndexInformer::new(
                source.clone(),
                InformerConfig {
                    queue,
                    ..Default::default()
                },
            );
            inf.set_transform(|mut o: ConfigMap| {
                let data = o.data.get_or_insert_with(Default::default);
                let n: u32 = data.get("runs").map_or(0, |v| v.parse().unwrap());
                data.insert("runs".into(), (n + 1).to_string());
                o
            })
            .unwrap();
            inf.start();
            assert!(inf.wait_for_cache_sync().await);
            source.add(cm("b"));
            settle().await;
            for name in ["a", "b"] {
                let o = inf.lister().get("ns", name).expect(name);
                assert_eq!(o.data.as_ref().unwrap()["runs"], "1", "{queue:?} {name}");
            }
            inf.shutdown().await;
        }
    }

    #[tokio::test(start_paused = true)]
    async fn start_is_idempotent_and_shutdown_waits_for_tasks() {
        let source = FakeControllerSource::new();
        source.add(cm("a"));
        let inf = informer(&source, Duration::ZERO);
        let rec = Recorder::default();
        let reg = inf.add_event_handler(rec.clone()).unwrap();
        inf.start();
        inf.start();
        assert!(inf.wait_for_cache_sync().await);
        settle().await;
        assert_eq!(source.list_count(), 1);
        inf.shutdown().await;
        inf.shutdown().await;
        assert!(inf.is_stopped());
        // After shutdown nothing is delivered any more.
        source.add(cm("late"));
        settle().await;
        assert_eq!(rec.take(), ["add a initial"]);
        assert_eq!(reg.backlog(), 0);
        // And removing a handler drops it.
        inf.remove_event_handler(&reg);
    }

    // client-go: TestSharedInformerErrorHandling
    #[tokio::test(start_paused = true)]
    async fn shared_informer_error_handling() {
        let source = FakeControllerSource::new();
        source.add(cm("pod1"));
        source.set_list_error(Some("Access Denied"));
        let inf = informer(&source, Duration::from_secs(1));
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        inf.set_watch_error_handler(move |e| {
            let _ = tx.send(e.to_string());
        })
        .unwrap();
        inf.start();
        let err = tokio::time::timeout(Duration::from_secs(1), rx.recv())
            .await
            .expect("no error reported within a second")
            .unwrap();
        assert!(err.contains("Access Denied"), "{err}");
        assert!(!inf.has_synced());
        inf.shutdown().await;
    }

    // client-go: TestSharedInformerRemoveHandler
    #[tokio::test(start_paused = true)]
    async fn shared_informer_remove_handler() {
        let source = FakeControllerSource::new();
        source.add(cm("pod1"));
        let inf = informer(&source, Duration::from_secs(1));
        let h1 = inf.add_event_handler(Recorder::default()).unwrap();
        let h2 = inf.add_event_handler(Recorder::default()).unwrap();
        assert_eq!(inf.handler_count(), 2);
        inf.remove_event_handler(&h2);
        assert_eq!(inf.handler_count(), 1);
        inf.remove_event_handler(&h1);
        assert_eq!(inf.handler_count(), 0);
    }

    // client-go: TestSharedInformerRemoveForeignHandler
    #[tokio::test(start_paused = true)]
    async fn shared_informer_remove_foreign_handler() {
        let source = FakeControllerSource::new();
        source.add(cm("pod1"));
        let inf = informer(&source, Duration::from_secs(1));
        let source2 = FakeControllerSource::new();
        source2.add(cm("pod1"));
        let inf2 = informer(&source2, Duration::from_secs(1));
        let h1 = inf.add_event_handler(Recorder::default()).unwrap();
        let h2 = inf.add_event_handler(Recorder::default()).unwrap();
        // The other informer's first handler has the same id as `h1` would there.
        let foreign = inf2.add_event_handler(Recorder::default()).unwrap();
        assert_eq!((inf.handler_count(), inf2.handler_count()), (2, 1));
        assert!(!inf2.is_registered(&h1) && !inf2.is_registered(&h2));
        inf2.remove_event_handler(&h1);
        inf2.remove_event_handler(&h2);
        assert_eq!((inf.handler_count(), inf2.handler_count()), (2, 1));
        assert!(
            inf2.is_registered(&foreign),
            "a foreign removal took a handler of ours"
        );
        inf.remove_event_handler(&h1);
        inf.remove_event_handler(&h2);
        assert_eq!((inf.handler_count(), inf2.handler_count()), (0, 1));
    }

    // client-go: TestSharedInformerMultipleRegistration
    #[tokio::test(start_paused = true)]
    async fn shared_informer_multiple_registration() {
        let source = FakeControllerSource::new();
        source.add(cm("pod1"));
        let inf = informer(&source, Duration::from_secs(1));
        let handler = Recorder::default();
        let reg1 = inf.add_event_handler(handler.clone()).unwrap();
        let reg2 = inf.add_event_handler(handler.clone()).unwrap();
        assert!(inf.is_registered(&reg1) && inf.is_registered(&reg2));
        assert_eq!(inf.handler_count(), 2);
        inf.remove_event_handler(&reg1);
        assert!(!inf.is_registered(&reg1));
        assert!(inf.is_registered(&reg2));
        assert_eq!(inf.handler_count(), 1);
        inf.remove_event_handler(&reg2);
        assert!(!inf.is_registered(&reg2));
        assert_eq!(inf.handler_count(), 0);
    }

    // client-go: TestRemovingRemovedSharedInformer
    #[tokio::test(start_paused = true)]
    async fn removing_removed_shared_informer() {
        let source = FakeControllerSource::new();
        source.add(cm("pod1"));
        let inf = informer(&source, Duration::from_secs(1));
        let reg = inf.add_event_handler(Recorder::default()).unwrap();
        inf.remove_event_handler(&reg);
        assert!(!inf.is_registered(&reg));
        inf.remove_event_handler(&reg);
        assert!(!inf.is_registered(&reg));
        assert_eq!(inf.handler_count(), 0);
    }

    // client-go: TestRemoveOnStoppedSharedInformer
    #[tokio::test(start_paused = true)]
    async fn remove_on_stopped_shared_informer() {
        let source = FakeControllerSource::new();
        source.add(cm("pod1"));
        let inf = informer(&source, Duration::ZERO);
        let reg = inf.add_event_handler(Recorder::default()).unwrap();
        inf.start();
        assert!(inf.wait_for_cache_sync().await);
        inf.shutdown().await;
        assert!(inf.is_stopped());
        inf.remove_event_handler(&reg);
        assert!(!inf.is_registered(&reg));
    }

    // client-go: TestRemoveWhileActive
    #[tokio::test(start_paused = true)]
    async fn remove_while_active() {
        let source = FakeControllerSource::new();
        let inf = informer(&source, Duration::ZERO);
        let rec = Recorder::default();
        let reg = inf.add_event_handler(rec.clone()).unwrap();
        inf.start();
        assert!(inf.wait_for_cache_sync().await);
        source.add(cm("pod1"));
        settle().await;
        assert_eq!(rec.take(), ["add pod1"]);
        inf.remove_event_handler(&reg);
        assert!(!inf.is_registered(&reg));
        source.add(cm("pod2"));
        settle().await;
        assert!(rec.take().is_empty(), "a removed handler got events");
        assert!(
            inf.lister().get("ns", "pod2").is_some(),
            "the cache still follows"
        );
        inf.shutdown().await;
    }

    /// Checks the per-key event rules as events arrive and keeps the handler's view.
    #[derive(Clone, Default)]
    struct Invariants {
        present: Arc<Mutex<std::collections::BTreeMap<String, String>>>,
        violations: Arc<Mutex<Vec<String>>>,
    }

    impl ResourceEventHandler<ConfigMap> for Invariants {
        fn on_add(&self, obj: &Arc<ConfigMap>, _: bool) {
            let key = format!("ns/{}", name(obj));
            let rv = resource_version(&**obj).to_string();
            if self.present.lock().insert(key.clone(), rv).is_some() {
                self.violations.lock().push(format!("{key} added twice"));
            }
        }
        fn on_update(&self, _old: &Arc<ConfigMap>, new: &Arc<ConfigMap>) {
            let key = format!("ns/{}", name(new));
            let rv = resource_version(&**new).to_string();
            if self.present.lock().insert(key.clone(), rv).is_none() {
                self.violations
                    .lock()
                    .push(format!("{key} updated, never added"));
            }
        }
        fn on_delete(&self, obj: &DeletedObject<ConfigMap>) {
            let key = format!("ns/{}", name(obj.object()));
            if self.present.lock().remove(&key).is_none() {
                self.violations
                    .lock()
                    .push(format!("{key} deleted, not present"));
            }
        }
    }

    // A randomized version of client-go's TestSharedInformerWatchDisruption: live changes,
    // outages that lose changes followed by compaction (410), clean watch breaks, late
    // handlers and resyncs, in random order. Afterwards the cache and every handler's view
    // equal the source, and no handler ever saw an impossible sequence.
    #[tokio::test(start_paused = true)]
    async fn random_changes_outages_and_compactions_always_converge() {
        use rand::{Rng, SeedableRng, rngs::StdRng};
        for seed in 0..25u64 {
            let mut rng = StdRng::seed_from_u64(seed);
            let source = FakeControllerSource::new();
            for i in 0..5 {
                source.add(cm(&format!("o{i}")));
            }
            let resync = if rng.random_bool(0.5) {
                Duration::from_secs(1)
            } else {
                Duration::ZERO
            };
            let inf = informer(&source, resync);
            let mut handlers = vec![Invariants::default()];
            inf.add_event_handler(handlers[0].clone()).unwrap();
            inf.start();
            let mut next = 5;
            for step in 0..150 {
                let names = source.names();
                let pick = |rng: &mut StdRng| names[rng.random_range(0..names.len())].clone();
                match rng.random_range(0..10) {
                    0..=2 => {
                        source.add(cm(&format!("o{next}")));
                        next += 1;
                    }
                    3 | 4 if !names.is_empty() => {
                        source.modify(cm_data(&pick(&mut rng), &step.to_string()))
                    }
                    5 if !names.is_empty() => source.delete(cm(&pick(&mut rng))),
                    6 => {
                        for _ in 0..rng.random_range(1..4) {
                            let names = source.names();
                            match rng.random_range(0..3) {
                                0 => {
                                    source.add_silently(cm(&format!("o{next}")));
                                    next += 1;
                                }
                                1 if !names.is_empty() => {
                                    let n = names[rng.random_range(0..names.len())].clone();
                                    source.modify_silently(cm_data(&n, "lost"));
                                }
                                _ if !names.is_empty() => {
                                    let n = names[rng.random_range(0..names.len())].clone();
                                    source.delete_silently(cm(&n));
                                }
                                _ => {}
                            }
                        }
                        source.compact();
                    }
                    7 => source.break_watches(),
                    8 if handlers.len() < 3 => {
                        let h = Invariants::default();
                        inf.add_event_handler(h.clone()).unwrap();
                        handlers.push(h);
                    }
                    _ => {}
                }
                tokio::time::sleep(Duration::from_millis(rng.random_range(0..40))).await;
            }
            // Longer than the largest backoff.
            tokio::time::sleep(Duration::from_secs(120)).await;
            let want = source.snapshot();
            let cache: std::collections::BTreeMap<String, String> = inf
                .indexer()
                .list()
                .iter()
                .map(|o| {
                    (
                        format!("ns/{}", name(o)),
                        resource_version(&**o).to_string(),
                    )
                })
                .collect();
            assert_eq!(cache, want, "seed {seed}: cache");
            for (i, h) in handlers.iter().enumerate() {
                assert!(
                    h.violations.lock().is_empty(),
                    "seed {seed} handler {i}: {:?}",
                    h.violations.lock()
                );
                assert_eq!(*h.present.lock(), want, "seed {seed}: handler {i}'s view");
            }
            inf.shutdown().await;
        }
    }

    // The gate is a std mutex held across awaits on purpose: it is what makes the handler slow.
    #[allow(clippy::await_holding_lock)]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_slow_handler_does_not_block_the_others_and_shows_a_backlog() {
        let source = FakeControllerSource::new();
        let inf = informer(&source, Duration::ZERO);
        let gate = Arc::new(std::sync::Mutex::new(()));
        let held = gate.lock().unwrap();
        let g = gate.clone();
        let slow = inf
            .add_event_handler_with_options(
                ResourceEventHandlerFuncs::new().on_add(move |_: &Arc<ConfigMap>, _| {
                    drop(g.lock().unwrap());
                }),
                HandlerOptions {
                    name: "slow".into(),
                    resync_period: None,
                },
            )
            .unwrap();
        let fast = Recorder::default();
        inf.add_event_handler(fast.clone()).unwrap();
        inf.start();
        for i in 0..50 {
            source.add(cm(&format!("o{i}")));
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while fast.count("add") < 50 && std::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(fast.count("add"), 50);
        // The slow handler is stuck on its first notification; the rest wait in its buffer.
        assert_eq!(slow.backlog(), 50);
        let metrics = inf.shared.metrics.handler_backlog("v1/configmaps", "slow");
        assert_eq!(metrics.get(), 50);
        drop(held);
        while slow.backlog() > 0 && std::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(slow.backlog(), 0);
        inf.shutdown().await;
    }
}
