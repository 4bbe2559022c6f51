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

use std::sync::{Arc, Weak};
use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;
use parking_lot::Mutex;
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::delta::{DeletedFinalStateUnknown, DeletedObject, Delta, DeltaType, Deltas};
use super::delta_fifo::DeltaFIFO;
use super::identity::InformerIdentity;
use super::index::{IndexError, Indexers, namespace_indexers};
use super::keys::{KeyFunc, default_key_func, resource_version};
use super::list_watch::{CacheObject, ListerWatcher};
use super::lister::Lister;
use super::metrics::{CacheMetrics, InformerSeries};
use super::processor::{
    EncodedPut, Listener, ListenerBuffer, MINIMUM_RESYNC_PERIOD, Notification, Queued,
    ResourceEventHandler, determine_resync_period, distribute, run_listener, should_resync,
};
use super::queue::{InformerQueue, KnownObjects, Popped, QueueKind, ReplacedAllInfo};
use super::real_fifo::{RealFIFO, RealFifoOptions};
use super::reflector::{
    Reflector, ReflectorConfig, WatchErrorHandler, default_watch_error_handler,
};
use super::store::{ReflectorStore, TransformFunc, kept_decoded};
use super::stored::{Listed, StoreKind, Stored};
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
    /// How the cache holds its objects: typed (client-go's) or compact (encoded, decoded on
    /// every read; see [`StoreKind`]).
    pub store: StoreKind,
    /// Who the informer is in client-go's `informer_*` series (client-go
    /// `SharedIndexInformerOptions.Identifier`); they are published into `metrics` only for
    /// a reserved identity. Default: none.
    pub identity: InformerIdentity,
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
    /// Whether a typed store rebuilds each object's fieldsV1 maps at their length (its
    /// source does not hand them out so: `ListerWatcher::fields_at_length`).
    rebuild_fields: bool,
    /// The store records the resourceVersion it is current to (an atomic queue).
    track_rv: bool,
    key_func: KeyFunc<K>,
    metrics: CacheMetrics,
    /// client-go's `informer_*` series, for a reserved identity.
    series: Option<InformerSeries>,
    /// Woken after each processed key (for `wait_for_cache_sync`).
    progressed: Notify,
    stop: CancellationToken,
    /// The reflector's last synced resourceVersion.
    last_sync_rv: Arc<parking_lot::RwLock<String>>,
    /// The last failure the reflector reported (what a sync that never comes is blamed on).
    last_error: Arc<Mutex<Option<String>>>,
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
        let rebuild_fields = !lw.fields_at_length();
        let store = ThreadSafeStore::of_kind(config.store, indexers);
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
                let fifo = RealFIFO::with_options(key_func.clone(), known, options)
                    .expect("options made consistent above");
                // A compact cache's lists arrive encoded (an atomic queue's only).
                if let Some(codec) = store.list_codec() {
                    fifo.set_list_codec(codec);
                }
                Arc::new(fifo)
            }
            QueueKind::DeltaFifo => Arc::new(DeltaFIFO::new(key_func.clone(), Some(known))),
        };
        if store.kind() == StoreKind::Typed {
            fifo.set_transform(Some(kept_decoded(None, rebuild_fields)));
        }
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
                rebuild_fields,
                track_rv,
                key_func,
                series: config.metrics.informer(&config.identity),
                metrics: config.metrics,
                progressed: Notify::new(),
                stop: CancellationToken::new(),
                last_sync_rv: Default::default(),
                last_error: Default::default(),
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
        let t = match self.shared.store.kind() {
            StoreKind::Typed => kept_decoded(Some(t), self.shared.rebuild_fields),
            #[cfg(feature = "compact-store")]
            StoreKind::Compact => t,
        };
        self.shared.fifo.set_transform(Some(t));
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
            for (key, stored) in self.shared.store.entries() {
                let (n, _) = self.shared.put_notification(&key, None, stored, true);
                buffer.push(n);
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
            on_error: Some(recording_error_handler(
                self.shared.last_error.clone(),
                inner.on_error.clone(),
            )),
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

    /// The last list or watch failure the reflector reported, if any (kept after a later
    /// success: it says why a cache that never synced did not). client-go has no getter;
    /// its `WatchErrorHandler` sees the same errors.
    pub fn last_error(&self) -> Option<String> {
        self.shared.last_error.lock().clone()
    }

    /// Whether the initial list has been processed (client-go `HasSynced`).
    pub fn has_synced(&self) -> bool {
        self.shared.fifo.has_synced()
    }

    /// Items in the informer's queue that have not reached its cache yet (what client-go
    /// 1.36's `informer_queued_items` reports).
    pub fn queued_items(&self) -> usize {
        self.shared.fifo.len()
    }

    /// Waits until synced; `false` if the informer is shut down first.
    pub async fn wait_for_cache_sync(&self) -> bool {
        self.shared.wait_until(|s| s.fifo.has_synced()).await
    }

    /// Whether `shutdown` was called.
    pub fn is_stopped(&self) -> bool {
        self.shared.stop.is_cancelled()
    }

    /// Stops everything and waits for the tasks to end. Idempotent.
    pub async fn shutdown(&self) {
        self.shared.stop.cancel();
        self.shared.fifo.close();
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

/// The reflector's error handler: records the error's text for
/// [`SharedIndexInformer::last_error`], then calls `handler` (client-go's default if `None`).
fn recording_error_handler(
    last_error: Arc<Mutex<Option<String>>>,
    handler: Option<WatchErrorHandler>,
) -> WatchErrorHandler {
    let handler = handler.unwrap_or_else(|| Arc::new(default_watch_error_handler));
    Arc::new(move |err| {
        *last_error.lock() = Some(err.to_string());
        handler(err)
    })
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
            .is_some_and(|s| s.fifo.has_synced() && self.buffer.initial_pending() == 0)
    }

    /// Waits until [`has_synced`](Self::has_synced); `false` if the informer stops first.
    pub async fn wait_for_sync(&self) -> bool {
        let Some(shared) = self.informer.upgrade() else {
            return false;
        };
        let buffer = self.buffer.clone();
        shared
            .wait_until(move |s| s.fifo.has_synced() && buffer.initial_pending() == 0)
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
                for (key, stored) in self.store.entries() {
                    let (n, _) = self.put_notification(&key, Some(stored.clone()), stored, false);
                    distribute(listeners, n, true);
                }
            }
            Popped::Bookmark(rv) => self.store.bookmark(&rv),
            Popped::DeletedUndecodable(key) => {
                // The deletion of an object whose final state did not decode: the last
                // version that decoded, if the store holds one, is the tombstone's state.
                if let Some(obj) = self.store.delete(&key) {
                    notify_removed(listeners, key, obj);
                }
            }
            Popped::Released(selector) => {
                // Shards given up: what the store holds of them goes, as a list that no
                // longer held them would remove it.
                let codec = self.store.codec();
                for (key, stored) in self.store.entries() {
                    if let Some(obj) = stored.load(codec.as_deref(), &key)
                        && selector.matches(obj.meta())
                        && self.store.delete(&key).is_some()
                    {
                        notify_removed(listeners, key, obj);
                    }
                }
            }
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
                    distribute(listeners, Notification::Delete(deleted), false);
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
        let old = old.map(Stored::Object);
        let (n, is_sync) = self.put_notification("", old, Stored::Object(obj), is_in_initial_list);
        distribute(listeners, n, is_sync);
    }

    /// The add (no `old`) or update of `new` over `old`, both as the store holds them, and
    /// whether it is a resync: an unchanged resourceVersion, only for handlers due one. A
    /// compact cache's frames are decoded by each handler when its turn comes; their
    /// resourceVersion is not read before, so identical frames count as unchanged (an
    /// object encoded before the dictionary existed and again after counts as changed,
    /// once). `key` names a frame that does not decode in the log.
    fn put_notification(
        &self,
        key: &str,
        old: Option<Stored<K>>,
        new: Stored<K>,
        is_in_initial_list: bool,
    ) -> (Queued<K>, bool) {
        match (old, new) {
            (None, Stored::Object(obj)) => {
                let n = Notification::Add {
                    obj,
                    is_in_initial_list,
                };
                (n.into(), false)
            }
            (Some(Stored::Object(old)), Stored::Object(new)) => {
                let is_sync = resource_version(&*old) == resource_version(&*new);
                (Notification::Update { old, new }.into(), is_sync)
            }
            (old, new) => {
                let is_sync = matches!((&old, &new),
                    (Some(Stored::Encoded(a)), Stored::Encoded(b)) if a == b);
                let codec = self
                    .store
                    .codec()
                    .expect("only a compact store holds frames");
                let put = EncodedPut {
                    key: key.to_string(),
                    old,
                    new,
                    is_in_initial_list,
                    codec,
                };
                (Queued::Encoded(Arc::new(put)), is_sync)
            }
        }
    }

    /// client-go `processReplacedAllInfo`: the store becomes exactly the list (so it reflects
    /// what handlers are told), then a tombstone for every key the list lacks, then an add
    /// or update per listed object in list order. An object whose key cannot be computed is
    /// reported and left out. A listed object that did not decode keeps the version the
    /// store holds, if any, with no notification (see `undecodable.rs`).
    ///
    /// A compact cache's list comes encoded, with its keys and its indexes (built from the
    /// objects as they arrived); each object is decoded once more for its notification,
    /// never all at once.
    fn replace_all(&self, listeners: &[Listener<K>], info: ReplacedAllInfo<K>, initial: bool) {
        let ReplacedAllInfo {
            resource_version: rv,
            objects,
            undecodable,
        } = info;
        let mut entries = Vec::with_capacity(objects.len());
        // Only the processing loop writes the store, so nothing changes it in between.
        let mut kept = Vec::new();
        let mut kept_entries = Vec::new();
        for key in undecodable {
            if let Some(stored) = self.store.stored(&key) {
                kept_entries.push((key.clone(), stored));
                kept.push(key);
            }
        }
        let mut indexed = None;
        // What to notify, in list order. Keys are computed again from decoded objects rather
        // than kept: a 100k-object list would otherwise hold a second copy of every key until
        // the handlers are notified. An encoded list has only its keys to go by.
        let (listed, keys): (Vec<Stored<K>>, Option<Vec<String>>) = match objects.into_repr() {
            Listed::Decoded(objects) => {
                let mut listed = Vec::with_capacity(objects.len());
                for obj in objects {
                    match (self.key_func)(&obj) {
                        Ok(key) => {
                            entries.push((key, Stored::Object(obj.clone())));
                            listed.push(Stored::Object(obj));
                        }
                        Err(e) => {
                            tracing::warn!(type_name = %self.type_name, "cannot store a listed object: {e}");
                        }
                    }
                }
                (listed, None)
            }
            Listed::Keyed(items, _, indices) => {
                let listed = items.iter().map(|(_, s)| s.clone()).collect();
                let keys = items.iter().map(|(k, _)| k.clone()).collect();
                entries.extend(items);
                indexed = Some(indices);
                (listed, Some(keys))
            }
        };
        let mut old = self
            .store
            .replace_entries(entries, indexed, kept_entries, &rv);
        for key in kept {
            old.take(&key);
        }
        // The previous object of each listed one, as the store held it: none at all in a
        // store that was empty (the first list), so no key is computed again for it.
        let mut previous = Vec::with_capacity(listed.len());
        for (i, stored) in listed.iter().enumerate() {
            let prev = match (&keys, stored) {
                _ if old.is_empty() => None,
                (Some(keys), _) => old.take(&keys[i]),
                (None, Stored::Object(obj)) => (self.key_func)(obj).ok().and_then(|k| old.take(&k)),
                (None, Stored::Encoded(_)) => unreachable!("a decoded list holds objects"),
            };
            previous.push(prev);
        }
        for (key, obj) in old.into_objects() {
            notify_removed(listeners, key, obj);
        }
        for (i, (stored, prev)) in listed.into_iter().zip(previous).enumerate() {
            // Only an encoded list's objects are decoded, and it has its keys.
            let key = keys.as_ref().map_or("", |keys| keys[i].as_str());
            if crate::trace::on() {
                let key = match &stored {
                    Stored::Object(obj) => (self.key_func)(obj).unwrap_or_default(),
                    Stored::Encoded(_) => key.to_string(),
                };
                let stage = if prev.is_some() { "updated" } else { "added" };
                trace_popped::<K>(&key, DeltaType::Replaced, stage, listeners.len());
            }
            let (n, is_sync) = self.put_notification(key, prev, stored, initial);
            distribute(listeners, n, is_sync);
        }
    }
}

/// Tells the handlers that `key` left the store without a watch DELETE (a list no longer
/// held it, its final state did not decode, or its shard was given up): a tombstone of the
/// last version the store held.
fn notify_removed<K: CacheObject>(listeners: &[Listener<K>], key: String, obj: Arc<K>) {
    if crate::trace::on() {
        trace_popped::<K>(&key, DeltaType::Deleted, "removed", listeners.len());
    }
    let tombstone = DeletedObject::Unknown(DeletedFinalStateUnknown { key, obj });
    distribute(listeners, Notification::Delete(tombstone), false);
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
    let mut process = move |popped, initial| {
        let started = Instant::now();
        process_shared.process(popped, initial);
        if let Some(series) = &process_shared.series {
            series.processed(started.elapsed());
        }
    };
    loop {
        let popped = tokio::select! {
            _ = shared.stop.cancelled() => return,
            r = shared.fifo.pop_with(&mut process) => r,
        };
        if popped.is_err() {
            return;
        }
        // Read here, not in `process`: the queue may still be locked there.
        if let Some(series) = &shared.series {
            series.queued_items(shared.fifo.len());
            series
                .store_resource_version(&shared.store.reader().last_store_sync_resource_version());
        }
        shared.progressed.notify_waiters();
    }
}

#[cfg(test)]
mod tests;
