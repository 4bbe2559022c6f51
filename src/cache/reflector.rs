//! List-then-watch into a store: client-go `tools/cache/reflector.go` (`ListAndWatch`).
//!
//! The reflector is an explicit state machine (`State`): each variant says what the next
//! `step` does, and `step` returns the state after it. The rules are
//! client-go's (`reflector.go`, `pager.go` in tools/pager):
//! - LIST in pages of 500; resourceVersion "0" first, the last synced one on relists, ""
//!   after a LIST answered 410 / "too large resource version" (retried at once). A 410 on a
//!   continue page restarts as one unpaginated LIST. Relists at a specific version are not
//!   paginated unless the server paginated the first list (client-go's `paginatedResult`).
//! - The list goes to `store.replace`; only then does the last synced version move.
//! - WATCH from the last synced version with bookmarks and a server timeout random in
//!   [min_watch_timeout, 2 x min_watch_timeout). Every event (bookmarks too) moves the version.
//! - Clean close: re-watch at once. 410 (ERROR event or answer): relist at the last seen
//!   version, after backoff. Connection refused / 429 opening a watch: back off, re-watch.
//!   A watch that closes in under a second with no events, and any other failure: back off,
//!   relist.
//! - One backoff for everything ([`DelayWithReset`], as `BackoffConfig` sets it: jitter after
//!   the cap, reset every two minutes). A failure whose answer named a delay (`Retry-After`, or a
//!   Status's `retryAfterSeconds`) waits at least that long (see `Core::back_off`).
//! - A watch line that is not an event ends the watch like an error from the server: back
//!   off, relist (client-go's `StreamWatcher` reports it as an error event and stops).
//! - An object that does not decode into the type (or is over the size bound) is skipped,
//!   never fatal to its list or watch: a warning names it, its resourceVersion and the
//!   error, and `kubeloop_reflector_undecodable_objects_total` counts it. client-go fails
//!   the list and ends the watch instead, so one such object stops the whole informer; here
//!   the rest is served. A listed key that was skipped goes to the store's `replace_listed`
//!   as kept (the store keeps the last version that decoded); a skipped change leaves the
//!   store as it is; a skipped deletion goes to `delete_undecodable`. See `undecodable.rs`.
//! - Streaming list (`sendInitialEvents`, on by default as in client-go 1.35+): events are
//!   collected until the bookmark annotated `k8s.io/initial-events-end`, then replace. The
//!   bound is on lack of progress (`watch_list_timeout` between events, not on the whole
//!   stream); any failure falls back to a paged LIST (kubernetes#140890).
//! - With client-go's consistency detectors switched on (`KUBE_WATCHLIST_INCONSISTENCY_DETECTOR`,
//!   `KUBE_LIST_FROM_CACHE_INCONSISTENCY_DETECTOR`), each list is checked against etcd
//!   before the watch goes on: see `consistency.rs`.
//! - Resync: every `resync_period` (zero = off) the store's `resync` runs, if the
//!   `should_resync` hook agrees.
//!
//! Differs on purpose: there is no separate `Run`/`ListAndWatch`/`watch` call stack, and the
//! watch also ends if nothing (not even a bookmark) arrives for the server timeout plus a
//! minute, which guards against half-open TCP connections the server timeout cannot end.

use std::sync::Arc;
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use kube_client::core::WatchEvent;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::backoff::BackoffConfig;
use super::consistency::{self, ConsistencyDetectors, InconsistencyHandler};
use super::keys::{meta_namespace_key, resource_version};
use super::list_watch::{
    CacheObject, ListOptions, ListPage, ListerWatcher, SelectionChange, WatchOptions,
};
use super::list_watch_error::{ListWatchError, WatchStream};
use super::metrics::{CacheMetrics, ReflectorMetrics};
use super::store::{ReflectorStore, StoreError, TransformFunc};
use super::stored::{ListBuilder, ListedObjects, SentBytes};
use super::undecodable::{UndecodableObject, WatchEventType};
use super::wire::INITIAL_EVENTS_END_ANNOTATION;
use crate::backoff::DelayWithReset;

/// The smallest `min_watch_timeout` honoured (client-go `defaultMinWatchTimeout`).
const DEFAULT_MIN_WATCH_TIMEOUT: Duration = Duration::from_secs(5 * 60);

/// A watch that ends this soon with no events counts as failed (client-go: 1 s).
const SHORT_WATCH: Duration = Duration::from_secs(1);

/// Extra silence tolerated past the server timeout before a watch is given up as dead.
const WATCH_IDLE_GRACE: Duration = Duration::from_secs(60);

/// Reflector settings; `Default` is client-go's.
#[derive(Debug, Clone)]
pub struct ReflectorConfig {
    /// LIST page size. client-go: 500 (pager `defaultPageSize`).
    pub page_size: u32,
    /// Lower bound of the random watch timeout; values under 5 min count as 5 min.
    /// client-go: 5 min (`defaultMinWatchTimeout`, also its floor).
    pub min_watch_timeout: Duration,
    /// Backoff after failures. client-go: 800 ms x2 to 30 s, jitter 1.0, reset after 2 min.
    pub backoff: BackoffConfig,
    /// Resync period; zero turns resync off. client-go: 0 unless an informer asks.
    pub resync_period: Duration,
    /// Use the streaming list (`sendInitialEvents=true`) instead of paged LISTs.
    /// client-go: the `WatchListClient` feature gate, on by default since 1.35.
    pub use_watch_list: bool,
    /// Bound on a streaming list's lack of progress: the watch must open, and each next event
    /// arrive, within this long, or the reflector falls back to a paged LIST. A stream that
    /// keeps delivering is never cut off, however long the list. client-go has no bound
    /// (kubernetes#140890); 60 s here.
    pub watch_list_timeout: Duration,
    /// client-go's consistency detectors. Default: as the environment sets them
    /// ([`ConsistencyDetectors::from_env`]), off when unset.
    pub consistency: ConsistencyDetectors,
}

impl Default for ReflectorConfig {
    fn default() -> Self {
        Self {
            page_size: 500,
            min_watch_timeout: Duration::from_secs(5 * 60),
            backoff: BackoffConfig::default(),
            resync_period: Duration::ZERO,
            use_watch_list: true,
            watch_list_timeout: Duration::from_secs(60),
            consistency: ConsistencyDetectors::from_env(),
        }
    }
}

/// Why a LIST or WATCH round ended badly (what the watch error handler is told).
#[derive(Debug, thiserror::Error)]
pub enum ReflectorError {
    /// LIST failed.
    #[error("{type_name}: failed to list: {source}")]
    List {
        /// The resource type.
        type_name: String,
        /// The request error.
        #[source]
        source: ListWatchError,
    },
    /// The store refused the listed objects.
    #[error("{type_name}: failed to store the list: {source}")]
    Replace {
        /// The resource type.
        type_name: String,
        /// The store error.
        #[source]
        source: StoreError,
    },
    /// Opening a WATCH failed, or the watch sent an ERROR event.
    #[error("{type_name}: watch failed: {source}")]
    Watch {
        /// The resource type.
        type_name: String,
        /// The request error or the ERROR event's status.
        #[source]
        source: ListWatchError,
    },
    /// The watch closed in under a second without any event.
    #[error("{type_name}: very short watch: watch lasted less than a second and no items received")]
    ShortWatch {
        /// The resource type.
        type_name: String,
    },
    /// The streaming list did not deliver its initial events (falls back to LIST).
    #[error("{type_name}: streaming list failed, falling back to a paged LIST: {reason}")]
    WatchList {
        /// The resource type.
        type_name: String,
        /// What went wrong.
        reason: String,
    },
}

impl ReflectorError {
    /// Whether this is a 410 Gone / Expired (a normal event after compaction).
    pub fn is_expired(&self) -> bool {
        match self {
            ReflectorError::List { source, .. } | ReflectorError::Watch { source, .. } => {
                source.is_expired()
            }
            _ => false,
        }
    }
}

/// Called with every LIST/WATCH failure (client-go `WatchErrorHandler`).
pub type WatchErrorHandler = Arc<dyn Fn(&ReflectorError) + Send + Sync>;

/// Asked before each periodic resync (client-go `ShouldResync`).
pub type ShouldResync = Arc<dyn Fn() -> bool + Send + Sync>;

/// client-go `DefaultWatchErrorHandler`: 410s are routine, everything else is a warning.
pub fn default_watch_error_handler(err: &ReflectorError) {
    if err.is_expired() {
        tracing::debug!("{err}");
    } else {
        tracing::warn!("{err}");
    }
}

/// Keeps a store in sync with the apiserver for one resource type.
pub struct Reflector<K, L> {
    core: Core<K, L>,
    resync_period: Duration,
    should_resync: Option<ShouldResync>,
}

/// What the next step does.
pub(crate) enum State<K> {
    /// Paged LIST at `relist_resource_version()`, replace the store, then [`State::Watch`].
    /// On failure: back off, then list again.
    List,
    /// Streaming list: open a `sendInitialEvents` watch, collect until the end bookmark,
    /// replace, then keep reading the same stream in [`State::Watching`]. Any failure or
    /// the deadline falls back to [`State::List`] at once.
    WatchList,
    /// Open a WATCH from the last synced version, then [`State::Watching`]. Connection
    /// refused / 429: back off and open again; anything else: back off and relist.
    Watch,
    /// Read one event from an open watch and apply it to the store.
    Watching {
        stream: WatchStream<K>,
        /// When the watch was opened (for the short-watch rule).
        started: Instant,
        /// Events received so far on this watch.
        events: u64,
        /// Give up the watch if nothing arrives by then.
        idle_deadline: Instant,
    },
    /// Sleep until `until`, then continue with `then`.
    Backoff { until: Instant, then: AfterBackoff },
}

/// Where a backoff leads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AfterBackoff {
    /// Relist (streaming or paged, as configured).
    Relist,
    /// Re-open the watch.
    Rewatch,
}

/// The reflector's mutable state across steps.
struct Core<K, L> {
    lw: L,
    store: Arc<dyn ReflectorStore<K>>,
    config: ReflectorConfig,
    type_name: String,
    metrics: ReflectorMetrics,
    on_error: WatchErrorHandler,
    on_inconsistency: InconsistencyHandler,
    backoff: DelayWithReset,
    /// The version the store is known to be in sync with ("" before the first list).
    last_sync_rv: String,
    /// A copy of `last_sync_rv` readers can see (client-go `LastSyncResourceVersion`).
    published_rv: Arc<parking_lot::RwLock<String>>,
    /// A LIST at `last_sync_rv` answered 410: the next list asks "" (quorum read).
    rv_unavailable: bool,
    /// The server paginated a LIST at "0", so relists at a version stay paginated.
    paginated_result: bool,
    /// At least one LIST run has been started (for the relist counter).
    listed_once: bool,
}

/// Records a watch event of a followed key (see [`crate::trace`]).
fn trace_watch_event<K: CacheObject>(event: &WatchEvent<K>, how: &str) {
    let (verb, obj) = match event {
        WatchEvent::Added(o) => ("ADDED", o),
        WatchEvent::Modified(o) => ("MODIFIED", o),
        WatchEvent::Deleted(o) => ("DELETED", o),
        WatchEvent::Bookmark(_) | WatchEvent::Error(_) => return,
    };
    if let Ok(key) = meta_namespace_key(obj) {
        let kind = crate::trace::short_type_name::<K>();
        crate::trace::record(&key, crate::trace::Stage::WatchEvent, kind, || {
            format!("{verb}{how} rv={}", resource_version(obj))
        });
    }
}

impl<K: CacheObject, L: ListerWatcher<K>> Reflector<K, L> {
    /// A reflector that lists and watches through `lw` into `store`.
    pub fn new(lw: L, store: Arc<dyn ReflectorStore<K>>, config: ReflectorConfig) -> Self {
        let type_name = lw.type_description();
        let metrics = CacheMetrics::new().reflector(&type_name);
        Self {
            resync_period: config.resync_period,
            should_resync: None,
            core: Core {
                lw,
                store,
                backoff: config.backoff.delay_with_reset(),
                config,
                metrics,
                type_name,
                on_error: Arc::new(default_watch_error_handler),
                on_inconsistency: Arc::new(consistency::panic_on_inconsistency),
                last_sync_rv: String::new(),
                published_rv: Default::default(),
                rv_unavailable: false,
                paginated_result: false,
                listed_once: false,
            },
        }
    }

    /// Reports into `metrics` instead of private, unregistered series.
    pub fn with_metrics(mut self, metrics: &CacheMetrics) -> Self {
        self.core.metrics = metrics.reflector(&self.core.type_name);
        self
    }

    /// Replaces the watch error handler (client-go `SetWatchErrorHandler`).
    pub fn with_watch_error_handler(mut self, handler: WatchErrorHandler) -> Self {
        self.core.on_error = handler;
        self
    }

    /// Replaces what a consistency detector does on a difference (default:
    /// [`panic_on_inconsistency`](super::panic_on_inconsistency), as client-go).
    pub fn with_inconsistency_handler(mut self, handler: InconsistencyHandler) -> Self {
        self.core.on_inconsistency = handler;
        self
    }

    /// Consulted before each periodic resync.
    pub fn with_should_resync(mut self, should: ShouldResync) -> Self {
        self.should_resync = Some(should);
        self
    }

    /// A handle on the last synced resourceVersion, readable while the reflector runs
    /// (client-go `LastSyncResourceVersion`); "" before the first list.
    pub fn last_sync_resource_version(&self) -> Arc<parking_lot::RwLock<String>> {
        self.core.published_rv.clone()
    }

    /// Publishes the last synced resourceVersion into `handle` instead of a private one.
    pub fn publish_last_sync_resource_version(
        mut self,
        handle: Arc<parking_lot::RwLock<String>>,
    ) -> Self {
        self.core.published_rv = handle;
        self
    }

    /// The series this reflector reports into.
    pub fn metrics(&self) -> ReflectorMetrics {
        self.core.metrics.clone()
    }

    /// Runs until `cancel` fires.
    ///
    /// # Cancel safety
    /// Dropping the future stops the reflector; the store keeps what it had.
    pub async fn run(self, cancel: CancellationToken) {
        let Reflector {
            mut core,
            resync_period,
            should_resync,
        } = self;
        let store = core.store.clone();
        let resync = async move {
            if resync_period.is_zero() {
                return std::future::pending::<()>().await;
            }
            let mut tick = tokio::time::interval_at(Instant::now() + resync_period, resync_period);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                if should_resync.as_ref().is_none_or(|f| f()) {
                    if let Err(e) = store.resync() {
                        tracing::warn!("resync failed: {e}");
                    }
                }
            }
        };
        let machine = async move {
            let mut state = core.initial_state();
            loop {
                state = core.step(state).await;
            }
        };
        tokio::select! {
            // Checked first: a reflector cancelled before it runs does nothing.
            biased;
            _ = cancel.cancelled() => {}
            _ = resync => {}
            _ = machine => {}
        }
    }
}

impl<K: CacheObject, L: ListerWatcher<K>> Core<K, L> {
    fn initial_state(&self) -> State<K> {
        if self.config.use_watch_list && self.lw.supports_watch_list() {
            State::WatchList
        } else {
            State::List
        }
    }

    /// Runs one transition.
    async fn step(&mut self, state: State<K>) -> State<K> {
        match state {
            State::List => self.list().await,
            State::WatchList => self.watch_list().await,
            State::Watch => self.start_watch().await,
            State::Watching {
                stream,
                started,
                events,
                idle_deadline,
            } => {
                self.next_event(stream, started, events, idle_deadline)
                    .await
            }
            State::Backoff { until, then } => {
                tokio::time::sleep_until(until).await;
                match then {
                    AfterBackoff::Relist => self.initial_state(),
                    AfterBackoff::Rewatch => State::Watch,
                }
            }
        }
    }

    /// Backs off after a failure, for at least the delay the server asked for, if any.
    ///
    /// client-go honours `Retry-After` one layer down, in its rest client: `Request.Watch`
    /// (and `Do`, which LIST uses) retries an answer of 429 or 5xx that carries a
    /// `Retry-After` header up to 10 times (`maxRetries`), each after `max(backoff,
    /// Retry-After)`
    /// (rest/with_retry.go `checkWait`, `Before`; the default `NoBackoff` makes that the
    /// header's value), with no relist in between. Only when those retries run out does the
    /// reflector see the 429 and back off on its own clock (`delayHandler`), re-watching
    /// without a relist (`isWatchErrorRetriable`, reflector.go).
    ///
    /// kubeloop: with kube-client's `Config::default_retry` on (its default), a retry layer
    /// under the client does what client-go's rest client does: `RetryPolicy::server_retry`
    /// retries 429, 503 and 504 up to 15 times, each after `max(its backoff from 5 ms,
    /// Retry-After)`, so the reflector sees a 429 only when those run out. Whatever reaches
    /// the reflector (every 429 when `default_retry` is off) carries the server's delay
    /// ([`ListWatchError::retry_after`]), and the reflector waits `max(its backoff delay, that
    /// delay)` before the next attempt: the server's wish is honoured, and the backoff still
    /// grows when the server names no delay or a shorter one.
    /// `tests/cache_fault_throttle.rs` shows both against the real apiserver.
    fn back_off(&mut self, then: AfterBackoff, server_delay: Option<Duration>) -> State<K> {
        let backoff = self.backoff.step();
        let delay = server_delay.map_or(backoff, |d| d.max(backoff));
        tracing::debug!(type_name = %self.type_name, ?delay, ?server_delay, ?then, "backing off");
        State::Backoff {
            until: Instant::now() + delay,
            then,
        }
    }

    fn report(&self, err: ReflectorError) {
        (self.on_error)(&err);
    }

    /// client-go `relistResourceVersion`.
    fn relist_resource_version(&self) -> String {
        if self.rv_unavailable {
            String::new()
        } else if self.last_sync_rv.is_empty() {
            "0".to_string()
        } else {
            self.last_sync_rv.clone()
        }
    }

    fn set_last_sync(&mut self, rv: &str) {
        if rv.is_empty() {
            return;
        }
        self.last_sync_rv = rv.to_string();
        *self.published_rv.write() = self.last_sync_rv.clone();
        self.metrics.set_resource_version(rv);
    }

    fn count_list(&mut self) {
        self.metrics.lists.inc();
        if self.listed_once {
            self.metrics.relists.inc();
        }
        self.listed_once = true;
    }

    async fn list(&mut self) -> State<K> {
        if !self.last_sync_rv.is_empty()
            && let Some(change) = self.lw.prepare_selection_change()
            && let Some(next) = self.follow_selection(change).await
        {
            return next;
        }
        self.count_list();
        self.list_and_replace().await
    }

    /// kubeloop: a shard scope changed since the list the store holds
    /// ([`ListerWatcher::prepare_selection_change`]); the watch then opens on the new
    /// selection from the version the store was at, so the shards kept miss no change.
    ///
    /// Shards taken are listed alone, their objects added. The list asks for no version
    /// older than the store's, which the apiserver's watch cache answers in one response (an
    /// `Exact` list, or a paged one, goes to etcd, which reads every object of the type to
    /// find the shards'); the list-watch drops the watch's events of the added shards that
    /// the list already holds. The objects go in as watch `ADDED` events: the informer treats
    /// each as an add (as an update if it held the key). The list-from-cache detector does
    /// not check this list (it is of part of the store).
    ///
    /// The objects of shards given up leave the store ([`ReflectorStore::release`]).
    ///
    /// `None` when the list fails or the store cannot release: the whole selection is listed
    /// then.
    async fn follow_selection(&mut self, change: SelectionChange) -> Option<State<K>> {
        if change.gained && !self.list_gained().await {
            return None;
        }
        if let Some(released) = &change.released {
            match self.store.release(released) {
                Ok(true) => {}
                Ok(false) => return None,
                Err(e) => {
                    tracing::warn!(type_name = %self.type_name, "store refused to release shards given up: {e}");
                    return None;
                }
            }
        }
        Some(State::Watch)
    }

    /// The list of the shards taken (see [`follow_selection`](Self::follow_selection)):
    /// false if it failed.
    async fn list_gained(&mut self) -> bool {
        self.count_list();
        let options = ListOptions {
            resource_version: Some(self.last_sync_rv.clone()),
            ..Default::default()
        };
        let page = match self.list_page(&options, &None, false).await {
            Ok((page, _)) => page,
            Err(e) => {
                tracing::debug!(
                    type_name = %self.type_name,
                    "listing the added shards failed ({e}); listing the whole selection"
                );
                return false;
            }
        };
        self.skip_listed(page.undecodable);
        for obj in page.items {
            if let Err(e) = self.store.add(obj) {
                tracing::warn!(type_name = %self.type_name, "store refused a listed object: {e}");
            }
        }
        true
    }

    /// The paged LIST round, without counting it (a streaming-list fallback was counted).
    async fn list_and_replace(&mut self) -> State<K> {
        let rv = self.relist_resource_version();
        let mut result = self.list_pages(&rv).await;
        if let Err(e) = &result
            && (e.is_expired() || e.is_too_large_resource_version())
        {
            // The version is gone (or not reached yet): retry at once as a quorum read.
            tracing::debug!(type_name = %self.type_name, "list at {rv:?} failed ({e}); relisting at \"\"");
            self.rv_unavailable = true;
            let rv = self.relist_resource_version();
            result = self.list_pages(&rv).await;
        }
        match result {
            Ok((items, undecodable, rv)) => {
                let check = self.config.consistency.list_from_cache;
                let cached = check.then(|| listed_versions(&items));
                let skipped = check.then(|| undecodable.clone());
                if let Err(source) = self.store.replace_listed(items, undecodable, &rv) {
                    self.report(ReflectorError::Replace {
                        type_name: self.type_name.clone(),
                        source,
                    });
                    return self.back_off(AfterBackoff::Relist, None);
                }
                self.rv_unavailable = false;
                self.set_last_sync(&rv);
                if let (Some(cached), Some(skipped)) = (cached, skipped) {
                    self.check_consistency(&rv, cached, skipped).await;
                }
                State::Watch
            }
            Err(source) => {
                self.metrics.list_errors.inc();
                let server_delay = source.retry_after();
                self.report(ReflectorError::List {
                    type_name: self.type_name.clone(),
                    source,
                });
                self.back_off(AfterBackoff::Relist, server_delay)
            }
        }
    }

    /// All pages of one LIST at `rv` ("" = quorum read): the items, the keys of the items
    /// skipped as undecodable (each reported), and the list's version.
    async fn list_pages(&mut self, rv: &str) -> Result<Listed<K>, ListWatchError> {
        let paginate = self.paginated_result || rv.is_empty() || rv == "0";
        let first = ListOptions {
            resource_version: Some(rv.to_string()).filter(|r| !r.is_empty()),
            limit: Some(self.config.page_size).filter(|_| paginate),
            ..Default::default()
        };
        // The store's transform runs on each object as the LIST body is decoded; a store that
        // keeps frames keeps the bytes the apiserver sent where there is none.
        let transform = self.store.transformer();
        let codec = self.store.list_codec();
        let keep_sent = codec.is_some() && transform.is_none();
        let (mut page, sent) = self.list_page(&first, &transform, keep_sent).await?;
        if rv == "0" && page.continue_token.is_some() {
            self.paginated_result = true;
        }
        let mut items = ListBuilder::new(codec.clone(), &self.type_name);
        items.extend_sent(std::mem::take(&mut page.items), sent);
        let mut undecodable = self.skip_listed(std::mem::take(&mut page.undecodable));
        while let Some(token) = page.continue_token.take() {
            let next = ListOptions {
                limit: first.limit,
                continue_token: Some(token),
                ..Default::default()
            };
            match self.list_page(&next, &transform, keep_sent).await {
                Ok((p, sent)) => {
                    page = p;
                    items.extend_sent(std::mem::take(&mut page.items), sent);
                    let skipped = std::mem::take(&mut page.undecodable);
                    undecodable.append(&mut self.skip_listed(skipped));
                }
                Err(e) if e.is_expired() => {
                    // The snapshot behind the continue token is compacted: one full LIST.
                    tracing::debug!(type_name = %self.type_name, "continue token expired; full list");
                    let full = ListOptions {
                        limit: None,
                        continue_token: None,
                        ..first.clone()
                    };
                    let (p, sent) = self.list_page(&full, &transform, keep_sent).await?;
                    let undecodable = self.skip_listed(p.undecodable);
                    let mut items = ListBuilder::new(codec, &self.type_name);
                    items.extend_sent(p.items, sent);
                    return Ok((items.finish(), undecodable, p.resource_version));
                }
                Err(e) => return Err(e),
            }
        }
        Ok((items.finish(), undecodable, page.resource_version))
    }

    /// One LIST page, transformed; with `keep_sent` (no transform), with the bytes each item
    /// was sent as.
    async fn list_page(
        &self,
        options: &ListOptions,
        transform: &Option<TransformFunc<K>>,
        keep_sent: bool,
    ) -> Result<(ListPage<K>, Vec<SentBytes>), ListWatchError> {
        let listed = if keep_sent {
            self.lw.list_keeping_sent(options).await?
        } else {
            let page = self.lw.list_transformed(options, transform.clone()).await?;
            (page, Vec::new())
        };
        self.metrics
            .listed_objects
            .inc_by(listed.0.items.len() as u64);
        Ok(listed)
    }

    /// Reports an object skipped because it does not decode.
    fn skip_undecodable(&self, skip: &UndecodableObject) {
        self.metrics.undecodable_objects.inc();
        let key = skip.key().unwrap_or_default();
        let event = match skip.event {
            None => "listed",
            Some(WatchEventType::Added) => "added",
            Some(WatchEventType::Modified) => "modified",
            Some(WatchEventType::Deleted) => "deleted",
        };
        let consequence = match skip.event {
            Some(WatchEventType::Deleted) => {
                "removing the last version that decoded from the cache, if it holds one"
            }
            _ => {
                "the cache keeps the last version that decoded, if it holds one, until a \
                 version decodes or the object is deleted"
            }
        };
        tracing::warn!(
            type_name = %self.type_name,
            object = %key,
            resource_version = %skip.resource_version,
            event,
            "skipping {skip}; {consequence}",
        );
    }

    /// Reports the skipped items of a LIST page; their keys.
    fn skip_listed(&self, skipped: Vec<UndecodableObject>) -> Vec<String> {
        skipped
            .iter()
            .filter_map(|skip| {
                self.skip_undecodable(skip);
                skip.key()
            })
            .collect()
    }

    /// Random in [min, 2 x min), where min is never below client-go's 5 minutes
    /// (`NewReflectorWithOptions` ignores a smaller `MinWatchTimeout`).
    fn watch_timeout(&self) -> Duration {
        crate::backoff::jitter(
            self.config.min_watch_timeout.max(DEFAULT_MIN_WATCH_TIMEOUT),
            1.0,
        )
    }

    async fn start_watch(&mut self) -> State<K> {
        if self.lw.selection_changed() {
            return self.initial_state();
        }
        let timeout = self.watch_timeout();
        let options = WatchOptions {
            resource_version: self.last_sync_rv.clone(),
            timeout_seconds: Some(timeout.as_secs().max(1) as u32),
            allow_watch_bookmarks: true,
            ..Default::default()
        };
        self.metrics.watches.inc();
        match self.lw.watch(&options).await {
            Ok(stream) => {
                let now = Instant::now();
                State::Watching {
                    stream,
                    started: now,
                    events: 0,
                    idle_deadline: now + timeout + WATCH_IDLE_GRACE,
                }
            }
            Err(source) => {
                let retry_watch = source.is_connection_refused() || source.is_too_many_requests();
                let server_delay = source.retry_after();
                self.report(ReflectorError::Watch {
                    type_name: self.type_name.clone(),
                    source,
                });
                if retry_watch {
                    self.back_off(AfterBackoff::Rewatch, server_delay)
                } else {
                    self.back_off(AfterBackoff::Relist, server_delay)
                }
            }
        }
    }

    /// The watch ended without an error from the server.
    fn watch_closed(&mut self, started: Instant, events: u64) -> State<K> {
        if self.lw.selection_changed() {
            // kubeloop: a shard scope moved on (`shard_scope.rs`): list the new selection now.
            return self.initial_state();
        }
        if events == 0 && started.elapsed() < SHORT_WATCH {
            self.report(ReflectorError::ShortWatch {
                type_name: self.type_name.clone(),
            });
            return self.back_off(AfterBackoff::Relist, None);
        }
        State::Watch
    }

    async fn next_event(
        &mut self,
        mut stream: WatchStream<K>,
        started: Instant,
        mut events: u64,
        idle_deadline: Instant,
    ) -> State<K> {
        let item = match tokio::time::timeout_at(idle_deadline, stream.next()).await {
            Ok(item) => item,
            Err(_) => {
                tracing::debug!(type_name = %self.type_name, "watch silent past its timeout; re-watching");
                return State::Watch;
            }
        };
        let event = match item {
            None => return self.watch_closed(started, events),
            Some(Ok(event)) => event,
            Some(Err(e @ ListWatchError::Decode { .. })) => {
                // client-go's StreamWatcher turns a decode failure into an error event and
                // stops; the reflector then backs off and relists. The event may have been
                // a change we would otherwise miss, so skipping it is not safe.
                return self.watch_failed(e);
            }
            Some(Err(e @ ListWatchError::Api { .. })) => return self.watch_failed(e),
            Some(Err(ListWatchError::Undecodable { object, .. })) => {
                // Skipped, never fatal to the watch (client-go ends it; see undecodable.rs).
                events += 1;
                self.metrics.watch_events.inc();
                self.skip_undecodable(&object);
                if object.event == Some(WatchEventType::Deleted)
                    && let Some(key) = object.key()
                    && let Err(e) = self.store.delete_undecodable(&key)
                {
                    tracing::warn!(type_name = %self.type_name, "store refused a watch event: {e}");
                }
                self.set_last_sync(&object.resource_version);
                return State::Watching {
                    stream,
                    started,
                    events,
                    idle_deadline,
                };
            }
            Some(Err(e @ ListWatchError::Transport { .. })) => {
                // A broken connection is a close, as client-go's StreamWatcher treats it.
                tracing::debug!(type_name = %self.type_name, "watch stream broke: {e}");
                return self.watch_closed(started, events);
            }
        };
        events += 1;
        self.metrics.watch_events.inc();
        if crate::trace::on() {
            trace_watch_event(&event, "");
        }
        let (rv, result) = match event {
            WatchEvent::Added(obj) => (resource_version(&obj).to_string(), self.store.add(obj)),
            WatchEvent::Modified(obj) => {
                (resource_version(&obj).to_string(), self.store.update(obj))
            }
            WatchEvent::Deleted(obj) => {
                (resource_version(&obj).to_string(), self.store.delete(obj))
            }
            WatchEvent::Bookmark(b) => {
                let result = self.store.bookmark(&b.metadata.resource_version);
                (b.metadata.resource_version, result)
            }
            WatchEvent::Error(status) => {
                return self.watch_failed(ListWatchError::from_status(
                    "WATCH",
                    &format!("({} watch stream)", self.type_name),
                    &status,
                ));
            }
        };
        if let Err(e) = result {
            tracing::warn!(type_name = %self.type_name, "store refused a watch event: {e}");
        }
        self.set_last_sync(&rv);
        State::Watching {
            stream,
            started,
            events,
            idle_deadline,
        }
    }

    /// The watch ended with an error from the server (410 included): relist after backoff.
    fn watch_failed(&mut self, source: ListWatchError) -> State<K> {
        let server_delay = source.retry_after();
        self.report(ReflectorError::Watch {
            type_name: self.type_name.clone(),
            source,
        });
        self.back_off(AfterBackoff::Relist, server_delay)
    }

    async fn watch_list(&mut self) -> State<K> {
        self.count_list();
        let timeout = self.watch_timeout();
        let options = WatchOptions {
            resource_version: if self.rv_unavailable {
                String::new()
            } else {
                self.last_sync_rv.clone()
            },
            resource_version_match: Some("NotOlderThan".to_string()),
            timeout_seconds: Some(timeout.as_secs().max(1) as u32),
            allow_watch_bookmarks: true,
            send_initial_events: true,
        };
        self.metrics.watches.inc();
        let failure = match self.collect_initial_events(&options).await {
            Ok((items, undecodable, rv, stream)) => {
                let check = self.config.consistency.watch_list;
                let cached = check.then(|| listed_versions(&items));
                let skipped = check.then(|| undecodable.clone());
                if let Err(source) = self.store.replace_listed(items, undecodable, &rv) {
                    self.report(ReflectorError::Replace {
                        type_name: self.type_name.clone(),
                        source,
                    });
                    return self.back_off(AfterBackoff::Relist, None);
                }
                self.rv_unavailable = false;
                self.set_last_sync(&rv);
                if let (Some(cached), Some(skipped)) = (cached, skipped) {
                    self.check_consistency(&rv, cached, skipped).await;
                }
                let now = Instant::now();
                return State::Watching {
                    stream,
                    started: now,
                    // The initial events count: this watch is not a "short" one.
                    events: 1,
                    idle_deadline: now + timeout + WATCH_IDLE_GRACE,
                };
            }
            Err(reason) => reason,
        };
        self.report(ReflectorError::WatchList {
            type_name: self.type_name.clone(),
            reason: failure,
        });
        self.metrics.list_errors.inc();
        // Making progress with a paged LIST beats waiting for the stream again.
        self.list_and_replace().await
    }

    /// Reads a streaming list up to its end bookmark. The bound is on lack of progress:
    /// opening the watch and every next event must each come within `watch_list_timeout`,
    /// so a long stream that keeps delivering is never cut off.
    ///
    /// The objects are kept in arrival order in a `Vec` (the server sends each object once
    /// as ADDED); the rare DELETED before the end bookmark removes its key by a scan, as
    /// does an object that does not decode (whose key joins the undecodable ones).
    async fn collect_initial_events(
        &mut self,
        options: &WatchOptions,
    ) -> Result<(ListedObjects<K>, Vec<String>, String, WatchStream<K>), String> {
        let bound = self.config.watch_list_timeout;
        let silent = || format!("no progress for {bound:?} before the initial-events-end bookmark");
        let transform = self.store.transformer();
        let codec = self.store.list_codec();
        // A store that keeps frames keeps the bytes the apiserver sent, where no transform
        // changes the object.
        let watch = async {
            if codec.is_some() && transform.is_none() {
                self.lw.watch_keeping_sent(options).await
            } else {
                let stream = self.lw.watch(options).await?;
                Ok(stream.map_ok(|event| (event, None)).boxed())
            }
        };
        let mut stream = tokio::time::timeout(bound, watch)
            .await
            .map_err(|_| silent())?
            .map_err(|e| e.to_string())?;
        let mut items = ListBuilder::new(codec, &self.type_name);
        let mut undecodable: std::collections::BTreeSet<String> = Default::default();
        loop {
            let next = tokio::time::timeout(bound, stream.next())
                .await
                .map_err(|_| silent())?;
            match next {
                None => return Err("the stream closed before the initial events ended".into()),
                Some(Ok((WatchEvent::Added(obj) | WatchEvent::Modified(obj), sent))) => {
                    self.metrics.watch_events.inc();
                    if crate::trace::on() {
                        trace_watch_event(&WatchEvent::Added(obj.clone()), " (streaming list)");
                    }
                    if !undecodable.is_empty()
                        && let Ok(key) = meta_namespace_key(&obj)
                    {
                        undecodable.remove(&key);
                    }
                    match &transform {
                        None => items.push_sent(obj, sent),
                        Some(t) => items.push(t(obj)),
                    }
                }
                Some(Ok((WatchEvent::Deleted(obj), _))) => {
                    self.metrics.watch_events.inc();
                    if let Ok(key) = meta_namespace_key(&obj) {
                        items.remove(&key);
                        undecodable.remove(&key);
                    }
                }
                Some(Err(ListWatchError::Undecodable { object, .. })) => {
                    self.metrics.watch_events.inc();
                    self.skip_undecodable(&object);
                    if let Some(key) = object.key() {
                        items.remove(&key);
                        if object.event == Some(WatchEventType::Deleted) {
                            undecodable.remove(&key);
                        } else {
                            undecodable.insert(key);
                        }
                    }
                }
                Some(Ok((WatchEvent::Bookmark(b), _))) => {
                    self.metrics.watch_events.inc();
                    let end = b
                        .metadata
                        .annotations
                        .get(INITIAL_EVENTS_END_ANNOTATION)
                        .is_some_and(|v| v == "true");
                    if end {
                        let undecodable = undecodable.into_iter().collect();
                        let items = items.finish();
                        let stream = stream.map_ok(|(event, _)| event).boxed();
                        return Ok((items, undecodable, b.metadata.resource_version, stream));
                    }
                }
                Some(Ok((WatchEvent::Error(status), _))) => {
                    return Err(ListWatchError::from_status(
                        "WATCH",
                        &format!("({} watch stream)", self.type_name),
                        &status,
                    )
                    .to_string());
                }
                Some(Err(e)) => return Err(e.to_string()),
            }
        }
    }
}

impl<K: CacheObject, L: ListerWatcher<K>> Core<K, L> {
    /// A consistency detector's check of the list just stored at `rv` (see `consistency.rs`):
    /// a paged LIST from etcd at `rv` (Exact), retried every second until it succeeds.
    async fn check_consistency(
        &self,
        rv: &str,
        cached: Vec<(String, String)>,
        skipped: Vec<String>,
    ) {
        if rv.is_empty() || rv == "0" {
            return;
        }
        tracing::warn!(type_name = %self.type_name, "data consistency check is enabled, this will result in an additional call to the API server");
        let (etcd, undecodable) = loop {
            match self.list_exact(rv).await {
                Ok(listed) => break listed,
                Err(e) => {
                    tracing::error!(type_name = %self.type_name, "failed to list data from the server for the consistency check, retrying: {e}");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        };
        let skipped = skipped.into_iter().chain(undecodable).collect();
        if let Some(found) = consistency::compare(&self.type_name, rv, cached, etcd, &skipped) {
            tracing::error!("{found}");
            (self.on_inconsistency)(&found);
        }
    }

    /// Every `(key, resourceVersion)` of a LIST at exactly `rv`, and the keys that did not
    /// decode.
    async fn list_exact(
        &self,
        rv: &str,
    ) -> Result<(Vec<(String, String)>, Vec<String>), ListWatchError> {
        let mut options = ListOptions {
            resource_version: Some(rv.to_string()),
            resource_version_match: Some("Exact".to_string()),
            limit: Some(self.config.page_size),
            ..Default::default()
        };
        let (mut versions, mut undecodable) = (Vec::new(), Vec::new());
        loop {
            let page = self.lw.list(&options).await?;
            versions.extend(page.items.iter().filter_map(|o| {
                let key = meta_namespace_key(o).ok()?;
                Some((key, resource_version(o).to_string()))
            }));
            undecodable.extend(page.undecodable.iter().filter_map(|u| u.key()));
            match page.continue_token {
                Some(token) => {
                    options = ListOptions {
                        limit: options.limit,
                        continue_token: Some(token),
                        ..Default::default()
                    }
                }
                None => return Ok((versions, undecodable)),
            }
        }
    }
}

/// Each listed object's key and resourceVersion, as the store will hold it (a compact
/// store's frames decoded again).
fn listed_versions<K: CacheObject>(items: &ListedObjects<K>) -> Vec<(String, String)> {
    items
        .clone()
        .into_decoded()
        .iter()
        .filter_map(|o| {
            Some((
                meta_namespace_key(&**o).ok()?,
                resource_version(&**o).to_string(),
            ))
        })
        .collect()
}

/// A LIST's objects, the keys of its items that did not decode, and its resourceVersion.
type Listed<K> = (ListedObjects<K>, Vec<String>, String);

#[cfg(test)]
mod tests;
