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
//! - One [`Backoff`] for everything (apimachinery's `DelayWithReset`: jitter after the cap,
//!   reset every two minutes). A failure whose answer named a delay (`Retry-After`, or a
//!   Status's `retryAfterSeconds`) waits at least that long (see `Core::back_off`).
//! - An event that does not decode ends the watch like an error from the server: back off,
//!   relist (client-go's `StreamWatcher` reports it as an error event and stops).
//! - Streaming list (`sendInitialEvents`, on by default as in client-go 1.35+): events are
//!   collected until the bookmark annotated `k8s.io/initial-events-end`, then replace. The
//!   bound is on lack of progress (`watch_list_timeout` between events, not on the whole
//!   stream); any failure falls back to a paged LIST (kubernetes#140890).
//! - Resync: every `resync_period` (zero = off) the store's `resync` runs, if the
//!   `should_resync` hook agrees.
//!
//! Differs on purpose: there is no separate `Run`/`ListAndWatch`/`watch` call stack, and the
//! watch also ends if nothing (not even a bookmark) arrives for the server timeout plus a
//! minute, which guards against half-open TCP connections the server timeout cannot end.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use kube_client::core::WatchEvent;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::backoff::{Backoff, BackoffConfig};
use super::delta_fifo::apply_transform;
use super::list_watch::{
    CacheObject, ListOptions, ListWatchError, ListerWatcher, WatchOptions, WatchStream,
};
use super::metrics::{CacheMetrics, ReflectorMetrics};
use super::store::{ReflectorStore, StoreError, meta_namespace_key, resource_version};

/// The annotation on the bookmark that ends a streaming list's initial events.
pub const INITIAL_EVENTS_END_ANNOTATION: &str = "k8s.io/initial-events-end";

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
    backoff: Backoff,
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
                backoff: Backoff::new(config.backoff.clone()),
                config,
                metrics,
                type_name,
                on_error: Arc::new(default_watch_error_handler),
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
        let backoff = self.backoff.next_delay();
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
        self.count_list();
        self.list_and_replace().await
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
            Ok((items, rv)) => {
                if let Err(source) = self.store.replace_listed(items, &rv) {
                    self.report(ReflectorError::Replace {
                        type_name: self.type_name.clone(),
                        source,
                    });
                    return self.back_off(AfterBackoff::Relist, None);
                }
                self.rv_unavailable = false;
                self.set_last_sync(&rv);
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

    /// All pages of one LIST at `rv` ("" = quorum read): the items and the list's version.
    async fn list_pages(&mut self, rv: &str) -> Result<(Vec<Arc<K>>, String), ListWatchError> {
        let paginate = self.paginated_result || rv.is_empty() || rv == "0";
        let first = ListOptions {
            resource_version: Some(rv.to_string()).filter(|r| !r.is_empty()),
            limit: Some(self.config.page_size).filter(|_| paginate),
            ..Default::default()
        };
        // The store's transform runs on each object as the LIST body is decoded.
        let transform = self.store.transformer();
        let mut page = self.lw.list_transformed(&first, transform.clone()).await?;
        if rv == "0" && page.continue_token.is_some() {
            self.paginated_result = true;
        }
        let mut items = shared(std::mem::take(&mut page.items));
        while let Some(token) = page.continue_token.take() {
            let next = ListOptions {
                limit: first.limit,
                continue_token: Some(token),
                ..Default::default()
            };
            match self.lw.list_transformed(&next, transform.clone()).await {
                Ok(p) => {
                    page = p;
                    items.append(&mut shared(std::mem::take(&mut page.items)));
                }
                Err(e) if e.is_expired() => {
                    // The snapshot behind the continue token is compacted: one full LIST.
                    tracing::debug!(type_name = %self.type_name, "continue token expired; full list");
                    let full = ListOptions {
                        limit: None,
                        continue_token: None,
                        ..first.clone()
                    };
                    let p = self.lw.list_transformed(&full, transform.clone()).await?;
                    return Ok((shared(p.items), p.resource_version));
                }
                Err(e) => return Err(e),
            }
        }
        Ok((items, page.resource_version))
    }

    /// Random in [min, 2 x min), where min is never below client-go's 5 minutes
    /// (`NewReflectorWithOptions` ignores a smaller `MinWatchTimeout`).
    fn watch_timeout(&self) -> Duration {
        self.config
            .min_watch_timeout
            .max(DEFAULT_MIN_WATCH_TIMEOUT)
            .mul_f64(1.0 + rand::random::<f64>())
    }

    async fn start_watch(&mut self) -> State<K> {
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
            Ok((items, rv, stream)) => {
                if let Err(source) = self.store.replace_listed(items, &rv) {
                    self.report(ReflectorError::Replace {
                        type_name: self.type_name.clone(),
                        source,
                    });
                    return self.back_off(AfterBackoff::Relist, None);
                }
                self.rv_unavailable = false;
                self.set_last_sync(&rv);
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
    /// as ADDED); the rare DELETED before the end bookmark removes its key by a scan.
    async fn collect_initial_events(
        &mut self,
        options: &WatchOptions,
    ) -> Result<(Vec<Arc<K>>, String, WatchStream<K>), String> {
        let bound = self.config.watch_list_timeout;
        let silent = || format!("no progress for {bound:?} before the initial-events-end bookmark");
        let mut stream = tokio::time::timeout(bound, self.lw.watch(options))
            .await
            .map_err(|_| silent())?
            .map_err(|e| e.to_string())?;
        let transform = self.store.transformer();
        let mut items: Vec<Arc<K>> = Vec::new();
        loop {
            let next = tokio::time::timeout(bound, stream.next())
                .await
                .map_err(|_| silent())?;
            match next {
                None => return Err("the stream closed before the initial events ended".into()),
                Some(Ok(WatchEvent::Added(obj) | WatchEvent::Modified(obj))) => {
                    self.metrics.watch_events.inc();
                    if crate::trace::on() {
                        trace_watch_event(&WatchEvent::Added(obj.clone()), " (streaming list)");
                    }
                    items.push(Arc::new(apply_transform(transform.as_ref(), obj)));
                }
                Some(Ok(WatchEvent::Deleted(obj))) => {
                    self.metrics.watch_events.inc();
                    if let Ok(key) = meta_namespace_key(&obj) {
                        items.retain(|o| meta_namespace_key(&**o).is_ok_and(|k| k != key));
                    }
                }
                Some(Ok(WatchEvent::Bookmark(b))) => {
                    self.metrics.watch_events.inc();
                    let end = b
                        .metadata
                        .annotations
                        .get(INITIAL_EVENTS_END_ANNOTATION)
                        .is_some_and(|v| v == "true");
                    if end {
                        items.shrink_to_fit();
                        return Ok((items, b.metadata.resource_version, stream));
                    }
                }
                Some(Ok(WatchEvent::Error(status))) => {
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

/// Puts each listed object in the `Arc` the queue and the cache will share.
fn shared<K>(items: Vec<K>) -> Vec<Arc<K>> {
    items.into_iter().map(Arc::new).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::list_watch::ListPage;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube_client::api::ObjectMeta;
    use kube_client::core::watch::{Bookmark, BookmarkMeta};
    use kube_client::core::{Status, TypeMeta};
    use parking_lot::Mutex;
    use std::collections::VecDeque;

    fn cm(name: &str, rv: &str) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("ns".into()),
                resource_version: Some(rv.into()),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    fn api_err(code: u16, reason: &str) -> ListWatchError {
        ListWatchError::Api {
            verb: "LIST",
            url: "/fake".into(),
            code,
            reason: reason.into(),
            message: format!("fake {code}"),
            causes: vec![],
            retry_after_seconds: None,
        }
    }

    fn bookmark(rv: &str, end: bool) -> WatchEvent<ConfigMap> {
        let mut annotations = std::collections::BTreeMap::new();
        if end {
            annotations.insert(
                INITIAL_EVENTS_END_ANNOTATION.to_string(),
                "true".to_string(),
            );
        }
        WatchEvent::Bookmark(Bookmark {
            types: TypeMeta {
                api_version: "v1".into(),
                kind: "ConfigMap".into(),
            },
            metadata: BookmarkMeta {
                resource_version: rv.into(),
                annotations,
            },
        })
    }

    fn status_event(code: u16, reason: &str) -> WatchEvent<ConfigMap> {
        let mut s = Status::failure("fake", reason);
        s.code = code;
        WatchEvent::Error(Box::new(s))
    }

    /// A scripted watch: its events, then either the end of the stream or silence.
    struct ScriptedWatch {
        events: Vec<Result<WatchEvent<ConfigMap>, ListWatchError>>,
        then_hang: bool,
        /// Delay before each event.
        pace: Duration,
    }

    #[derive(Default)]
    struct Script {
        lists: VecDeque<Result<ListPage<ConfigMap>, ListWatchError>>,
        watches: VecDeque<Result<ScriptedWatch, ListWatchError>>,
        /// What was asked, with the (paused) time since the start.
        calls: Vec<(Duration, String)>,
        /// `timeoutSeconds` of every watch opened.
        watch_timeouts: Vec<Option<u32>>,
    }

    #[derive(Clone)]
    struct FakeLw {
        script: Arc<Mutex<Script>>,
        start: Instant,
    }

    impl FakeLw {
        fn new() -> Self {
            Self {
                script: Default::default(),
                start: Instant::now(),
            }
        }
        fn list_ok(&self, items: Vec<ConfigMap>, rv: &str, cont: Option<&str>) -> &Self {
            self.script.lock().lists.push_back(Ok(ListPage {
                items,
                resource_version: rv.into(),
                continue_token: cont.map(String::from),
            }));
            self
        }
        fn list_err(&self, e: ListWatchError) -> &Self {
            self.script.lock().lists.push_back(Err(e));
            self
        }
        fn watch(&self, events: Vec<WatchEvent<ConfigMap>>, then_hang: bool) -> &Self {
            self.script.lock().watches.push_back(Ok(ScriptedWatch {
                events: events.into_iter().map(Ok).collect(),
                then_hang,
                pace: Duration::from_millis(10),
            }));
            self
        }
        fn watch_raw(&self, w: Result<ScriptedWatch, ListWatchError>) -> &Self {
            self.script.lock().watches.push_back(w);
            self
        }
        fn calls(&self) -> Vec<(Duration, String)> {
            self.script.lock().calls.clone()
        }
        fn call_names(&self) -> Vec<String> {
            self.calls().into_iter().map(|c| c.1).collect()
        }
    }

    impl ListerWatcher<ConfigMap> for FakeLw {
        fn list(
            &self,
            o: &ListOptions,
        ) -> impl std::future::Future<Output = Result<ListPage<ConfigMap>, ListWatchError>> + Send
        {
            let mut s = self.script.lock();
            let desc = format!(
                "list rv={:?} limit={:?} continue={:?}",
                o.resource_version, o.limit, o.continue_token
            );
            s.calls.push((self.start.elapsed(), desc));
            // An exhausted script fails, which the reflector retries after backoff.
            let r = s
                .lists
                .pop_front()
                .unwrap_or_else(|| Err(api_err(500, "Script")));
            async move { r }
        }

        fn watch(
            &self,
            o: &WatchOptions,
        ) -> impl std::future::Future<Output = Result<WatchStream<ConfigMap>, ListWatchError>> + Send
        {
            let mut s = self.script.lock();
            let desc = format!(
                "watch rv={:?} bookmarks={} initial={} timeout_ok={}",
                o.resource_version,
                o.allow_watch_bookmarks,
                o.send_initial_events,
                o.timeout_seconds.is_some_and(|t| (300..600).contains(&t))
            );
            s.calls.push((self.start.elapsed(), desc));
            s.watch_timeouts.push(o.timeout_seconds);
            let w = s.watches.pop_front().unwrap_or(Ok(ScriptedWatch {
                events: vec![],
                then_hang: true,
                pace: Duration::ZERO,
            }));
            async move {
                let w = w?;
                let pace = w.pace;
                let events = futures::stream::iter(w.events).then(move |e| async move {
                    tokio::time::sleep(pace).await;
                    e
                });
                let stream: WatchStream<ConfigMap> = if w.then_hang {
                    events.chain(futures::stream::pending()).boxed()
                } else {
                    events.boxed()
                };
                Ok(stream)
            }
        }

        fn type_description(&self) -> String {
            "v1/configmaps".into()
        }
    }

    /// Records what the reflector wrote.
    #[derive(Default)]
    struct RecStore {
        ops: Mutex<Vec<String>>,
    }

    impl ReflectorStore<ConfigMap> for RecStore {
        fn add(&self, o: ConfigMap) -> Result<(), StoreError> {
            self.ops
                .lock()
                .push(format!("add {}", o.metadata.name.unwrap()));
            Ok(())
        }
        fn update(&self, o: ConfigMap) -> Result<(), StoreError> {
            self.ops
                .lock()
                .push(format!("update {}", o.metadata.name.unwrap()));
            Ok(())
        }
        fn delete(&self, o: ConfigMap) -> Result<(), StoreError> {
            self.ops
                .lock()
                .push(format!("delete {}", o.metadata.name.unwrap()));
            Ok(())
        }
        fn replace(&self, list: Vec<ConfigMap>, rv: &str) -> Result<(), StoreError> {
            let mut names: Vec<String> =
                list.into_iter().map(|o| o.metadata.name.unwrap()).collect();
            names.sort();
            self.ops
                .lock()
                .push(format!("replace [{}] @{rv}", names.join(",")));
            Ok(())
        }
        fn resync(&self) -> Result<(), StoreError> {
            self.ops.lock().push("resync".into());
            Ok(())
        }
    }

    /// The paged-LIST reflector most tests here script (streaming list tests turn it on).
    fn no_jitter() -> ReflectorConfig {
        ReflectorConfig {
            backoff: BackoffConfig {
                jitter: 0.0,
                ..Default::default()
            },
            use_watch_list: false,
            ..Default::default()
        }
    }

    /// Runs a reflector for `secs` of paused time and returns what the store saw.
    async fn run_for(
        lw: &FakeLw,
        config: ReflectorConfig,
        secs: u64,
        errors: Option<Arc<Mutex<Vec<String>>>>,
    ) -> (Vec<String>, ReflectorMetrics) {
        let store = Arc::new(RecStore::default());
        let mut r = Reflector::new(lw.clone(), store.clone(), config);
        if let Some(errs) = errors {
            r = r.with_watch_error_handler(Arc::new(move |e: &ReflectorError| {
                errs.lock().push(e.to_string())
            }));
        }
        let metrics = r.metrics();
        let cancel = CancellationToken::new();
        let task = tokio::spawn(r.run(cancel.clone()));
        tokio::time::sleep(Duration::from_secs(secs)).await;
        cancel.cancel();
        task.await.unwrap();
        let ops = store.ops.lock().clone();
        (ops, metrics)
    }

    // client-go: TestReflectorListAndWatch (list at "0", then watch from the list's RV)
    #[tokio::test(start_paused = true)]
    async fn lists_all_pages_then_watches_from_the_list_version() {
        let lw = FakeLw::new();
        lw.list_ok(vec![cm("a", "5"), cm("b", "6")], "10", Some("tok1"))
            .list_ok(vec![cm("c", "7")], "10", None)
            .watch(
                vec![
                    WatchEvent::Added(cm("d", "11")),
                    WatchEvent::Modified(cm("a", "12")),
                    WatchEvent::Deleted(cm("b", "13")),
                    bookmark("20", false),
                ],
                false,
            );
        let (ops, m) = run_for(&lw, no_jitter(), 5, None).await;
        assert_eq!(
            &ops[..4],
            ["replace [a,b,c] @10", "add d", "update a", "delete b"]
        );
        let calls = lw.call_names();
        assert_eq!(
            calls[0],
            r#"list rv=Some("0") limit=Some(500) continue=None"#
        );
        assert_eq!(
            calls[1],
            r#"list rv=None limit=Some(500) continue=Some("tok1")"#
        );
        assert_eq!(
            calls[2],
            r#"watch rv="10" bookmarks=true initial=false timeout_ok=true"#
        );
        // The clean close re-watches from the bookmark's version, without a relist.
        assert_eq!(
            calls[3],
            r#"watch rv="20" bookmarks=true initial=false timeout_ok=true"#
        );
        assert_eq!(m.lists(), 1);
        assert_eq!(m.relists(), 0);
        assert_eq!(m.watch_events(), 4);
        assert_eq!(m.last_resource_version(), 20);
    }

    // client-go: TestReflectorListAndWatchWithErrors / "410 on list -> RV \"\""
    #[tokio::test(start_paused = true)]
    async fn list_gone_retries_at_once_with_empty_resource_version() {
        let lw = FakeLw::new();
        lw.list_ok(vec![cm("a", "5")], "10", None)
            .watch(vec![status_event(410, "Expired")], true)
            // Relist at the last seen version: gone too.
            .list_err(api_err(410, "Expired"))
            .list_ok(vec![cm("b", "30")], "30", None)
            .watch(vec![], true);
        let errs = Arc::new(Mutex::new(vec![]));
        let (ops, m) = run_for(&lw, no_jitter(), 10, Some(errs.clone())).await;
        assert_eq!(ops, ["replace [a] @10", "replace [b] @30"]);
        let calls = lw.calls();
        let names: Vec<&str> = calls.iter().map(|c| c.1.as_str()).collect();
        assert_eq!(
            names[1],
            r#"watch rv="10" bookmarks=true initial=false timeout_ok=true"#
        );
        // Relist after the watch's 410 is at the last seen version, not "" ...
        assert_eq!(names[2], r#"list rv=Some("10") limit=None continue=None"#);
        // ... and its 410 is retried at once as a quorum read.
        assert_eq!(names[3], r#"list rv=None limit=Some(500) continue=None"#);
        assert_eq!(calls[3].0, calls[2].0, "retried without waiting");
        assert_eq!(
            names[4],
            r#"watch rv="30" bookmarks=true initial=false timeout_ok=true"#
        );
        // The relist after a watch failure waited for the backoff.
        assert!(calls[2].0 - calls[1].0 >= Duration::from_millis(800));
        assert_eq!(m.relists(), 1);
        assert!(errs.lock()[0].contains("410"), "{:?}", errs.lock());
    }

    // The kube-rs bug this reflector must not have: a LIST that keeps failing backs off more
    // and more, up to the cap.
    #[tokio::test(start_paused = true)]
    async fn failing_list_backs_off_up_to_the_cap() {
        let lw = FakeLw::new();
        for _ in 0..12 {
            lw.list_err(api_err(403, "Forbidden"));
        }
        let (_, m) = run_for(&lw, no_jitter(), 200, None).await;
        let times: Vec<Duration> = lw.calls().iter().map(|c| c.0).collect();
        let gaps: Vec<u128> = times
            .windows(2)
            .map(|w| (w[1] - w[0]).as_millis())
            .collect();
        assert_eq!(
            &gaps[..8],
            [800, 1600, 3200, 6400, 12800, 25600, 30000, 30000]
        );
        assert_eq!(m.list_errors() as usize, times.len());
    }

    // kubeloop's own: a clean watch close re-watches
    #[tokio::test(start_paused = true)]
    async fn short_watch_relists_but_a_normal_close_rewatches() {
        let lw = FakeLw::new();
        lw.list_ok(vec![], "10", None)
            // Closes at once with nothing: very short watch -> relist.
            .watch(vec![], false)
            .list_ok(vec![cm("a", "11")], "11", None)
            // Delivers an event, then closes: re-watch from its version.
            .watch(vec![WatchEvent::Added(cm("b", "12"))], false)
            .watch(vec![], true);
        let errs = Arc::new(Mutex::new(vec![]));
        let (ops, _) = run_for(&lw, no_jitter(), 10, Some(errs.clone())).await;
        assert_eq!(ops, ["replace [] @10", "replace [a] @11", "add b"]);
        let names = lw.call_names();
        assert!(names[2].starts_with(r#"list rv=Some("10")"#), "{names:?}");
        assert!(names[4].starts_with(r#"watch rv="12""#), "{names:?}");
        assert_eq!(names.len(), 5);
        assert!(errs.lock()[0].contains("very short watch"));
    }

    #[tokio::test(start_paused = true)]
    async fn watch_open_refused_or_429_backs_off_and_rewatches_without_relisting() {
        let lw = FakeLw::new();
        let refused = ListWatchError::Transport {
            verb: "WATCH",
            url: "/fake".into(),
            source: kube_client::Error::ReadEvents(std::io::Error::from(
                std::io::ErrorKind::ConnectionRefused,
            )),
        };
        assert!(refused.is_connection_refused());
        lw.list_ok(vec![], "10", None)
            .watch_raw(Err(refused))
            .watch_raw(Err(api_err(429, "TooManyRequests")))
            .watch(vec![], true);
        let (_, m) = run_for(&lw, no_jitter(), 10, None).await;
        let calls = lw.calls();
        let names: Vec<&str> = calls.iter().map(|c| c.1.as_str()).collect();
        assert_eq!(names.len(), 4, "{names:?}");
        assert!(names[1..].iter().all(|n| n.starts_with(r#"watch rv="10""#)));
        assert_eq!((calls[2].0 - calls[1].0).as_millis(), 800);
        assert_eq!((calls[3].0 - calls[2].0).as_millis(), 1600);
        assert_eq!(m.lists(), 1);
        assert_eq!(m.watches(), 3);
    }

    fn throttled(retry_after_secs: u32) -> ListWatchError {
        ListWatchError::Api {
            verb: "WATCH",
            url: "/fake".into(),
            code: 429,
            reason: "TooManyRequests".into(),
            message: "Too many requests, please try again later.".into(),
            causes: vec![],
            retry_after_seconds: Some(retry_after_secs),
        }
    }

    // client-go honours Retry-After in its rest client (rest/with_retry.go); here the
    // reflector's own backoff waits max(backoff, Retry-After), see `Core::back_off`.
    #[tokio::test(start_paused = true)]
    async fn a_watch_answered_429_with_retry_after_waits_at_least_that_long() {
        let lw = FakeLw::new();
        lw.list_ok(vec![], "10", None)
            // Asks for 5 s: more than the 800 ms backoff, so 5 s it is.
            .watch_raw(Err(throttled(5)))
            // Asks for 1 s: less than the 1.6 s backoff, so the backoff wins.
            .watch_raw(Err(throttled(1)))
            .watch(vec![], true);
        let (_, m) = run_for(&lw, no_jitter(), 20, None).await;
        let calls = lw.calls();
        let names: Vec<&str> = calls.iter().map(|c| c.1.as_str()).collect();
        assert_eq!(names.len(), 4, "{names:?}");
        assert!(names[1..].iter().all(|n| n.starts_with(r#"watch rv="10""#)));
        assert_eq!((calls[2].0 - calls[1].0).as_millis(), 5000);
        assert_eq!((calls[3].0 - calls[2].0).as_millis(), 1600);
        assert_eq!((m.lists(), m.relists()), (1, 0));
    }

    #[tokio::test(start_paused = true)]
    async fn a_list_answered_429_with_retry_after_waits_at_least_that_long() {
        let lw = FakeLw::new();
        let mut err = throttled(3);
        if let ListWatchError::Api { verb, .. } = &mut err {
            *verb = "LIST";
        }
        lw.list_err(err)
            .list_ok(vec![cm("a", "1")], "10", None)
            .watch(vec![], true);
        let (ops, _) = run_for(&lw, no_jitter(), 10, None).await;
        assert_eq!(ops, ["replace [a] @10"]);
        let calls = lw.calls();
        assert!(calls[1].1.starts_with("list"), "{calls:?}");
        assert_eq!((calls[1].0 - calls[0].0).as_millis(), 3000);
    }

    // client-go: TestReflectorListExtract's paginatedResult rule ("relists at a version are
    // paginated only if the server paginated the list at \"0\"")
    #[tokio::test(start_paused = true)]
    async fn relists_stay_paginated_when_the_server_paginated_the_first_list() {
        let lw = FakeLw::new();
        lw.list_ok(vec![cm("a", "1")], "10", Some("tok"))
            .list_ok(vec![cm("b", "2")], "10", None)
            .watch(vec![status_event(410, "Expired")], true)
            .list_ok(vec![cm("a", "1")], "11", None)
            .watch(vec![], true);
        let store = Arc::new(RecStore::default());
        let r = Reflector::new(lw.clone(), store.clone(), no_jitter());
        let rv = r.last_sync_resource_version();
        let cancel = CancellationToken::new();
        let task = tokio::spawn(r.run(cancel.clone()));
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert_eq!(*rv.read(), "11");
        cancel.cancel();
        task.await.unwrap();
        assert_eq!(
            lw.call_names()[3],
            r#"list rv=Some("10") limit=Some(500) continue=None"#
        );
    }

    // client-go: TestReflectorFullListIfTooLarge
    #[tokio::test(start_paused = true)]
    async fn too_large_resource_version_on_list_retries_with_empty_version() {
        let lw = FakeLw::new();
        lw.list_err(ListWatchError::Api {
            verb: "LIST",
            url: "/fake".into(),
            code: 504,
            reason: "Timeout".into(),
            message: "Too large resource version: 20, current: 10".into(),
            causes: vec!["ResourceVersionTooLarge".into()],
            retry_after_seconds: None,
        })
        .list_ok(vec![cm("a", "1")], "10", None)
        .watch(vec![], true);
        let (ops, _) = run_for(&lw, no_jitter(), 2, None).await;
        assert_eq!(ops, ["replace [a] @10"]);
        let names = lw.call_names();
        assert_eq!(
            names[0],
            r#"list rv=Some("0") limit=Some(500) continue=None"#
        );
        assert_eq!(names[1], r#"list rv=None limit=Some(500) continue=None"#);
    }

    #[tokio::test(start_paused = true)]
    async fn continue_token_expired_restarts_as_one_full_list() {
        let lw = FakeLw::new();
        lw.list_ok(vec![cm("a", "1")], "10", Some("tok"))
            .list_err(api_err(410, "Expired"))
            .list_ok(vec![cm("a", "1"), cm("b", "2")], "15", None)
            .watch(vec![], true);
        let (ops, _) = run_for(&lw, no_jitter(), 3, None).await;
        assert_eq!(ops, ["replace [a,b] @15"]);
        assert_eq!(
            lw.call_names()[2],
            r#"list rv=Some("0") limit=None continue=None"#
        );
    }

    // kubeloop's own, after client-go's streamwatcher.go: an event that does not decode ends
    // the watch, and the reflector relists instead of silently missing a change.
    #[tokio::test(start_paused = true)]
    async fn an_undecodable_event_ends_the_watch_and_relists() {
        let lw = FakeLw::new();
        let bad = serde_json::from_str::<ConfigMap>("{\"kind\":\"Pod\"}").unwrap_err();
        lw.list_ok(vec![], "10", None).watch_raw(Ok(ScriptedWatch {
            events: vec![
                Err(ListWatchError::Decode {
                    verb: "WATCH",
                    url: "/fake".into(),
                    source: kube_client::Error::SerdeError(bad),
                }),
                Ok(WatchEvent::Added(cm("a", "11"))),
            ],
            then_hang: true,
            pace: Duration::from_millis(1),
        }));
        lw.list_ok(vec![cm("a", "11")], "12", None)
            .watch(vec![], true);
        let errs = Arc::new(Mutex::new(vec![]));
        let (ops, m) = run_for(&lw, no_jitter(), 5, Some(errs.clone())).await;
        assert_eq!(ops, ["replace [] @10", "replace [a] @12"]);
        let calls = lw.call_names();
        assert_eq!(calls.len(), 4, "{calls:?}");
        assert!(calls[2].starts_with(r#"list rv=Some("10")"#), "{calls:?}");
        assert_eq!(m.relists(), 1);
        assert!(errs.lock()[0].contains("decode"), "{:?}", errs.lock());
    }

    #[tokio::test(start_paused = true)]
    async fn resync_runs_every_period_when_allowed() {
        let lw = FakeLw::new();
        lw.list_ok(vec![], "1", None).watch(vec![], true);
        let store = Arc::new(RecStore::default());
        let allowed = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let a = allowed.clone();
        let r = Reflector::new(
            lw.clone(),
            store.clone(),
            ReflectorConfig {
                resync_period: Duration::from_secs(10),
                ..no_jitter()
            },
        )
        .with_should_resync(Arc::new(move || {
            a.load(std::sync::atomic::Ordering::SeqCst)
        }));
        let cancel = CancellationToken::new();
        let task = tokio::spawn(r.run(cancel.clone()));
        tokio::time::sleep(Duration::from_secs(25)).await;
        allowed.store(false, std::sync::atomic::Ordering::SeqCst);
        tokio::time::sleep(Duration::from_secs(20)).await;
        cancel.cancel();
        task.await.unwrap();
        let resyncs = store.ops.lock().iter().filter(|o| *o == "resync").count();
        assert_eq!(resyncs, 2);
    }

    #[tokio::test(start_paused = true)]
    async fn watch_list_collects_until_the_end_bookmark_then_keeps_watching() {
        let lw = FakeLw::new();
        lw.watch(
            vec![
                WatchEvent::Added(cm("a", "5")),
                WatchEvent::Added(cm("b", "6")),
                bookmark("8", false),
                WatchEvent::Deleted(cm("b", "7")),
                bookmark("9", true),
                WatchEvent::Added(cm("c", "10")),
            ],
            true,
        );
        let config = ReflectorConfig {
            use_watch_list: true,
            ..no_jitter()
        };
        let (ops, m) = run_for(&lw, config, 5, None).await;
        assert_eq!(ops, ["replace [a] @9", "add c"]);
        assert_eq!(
            lw.call_names(),
            [r#"watch rv="" bookmarks=true initial=true timeout_ok=true"#]
        );
        assert_eq!(m.last_resource_version(), 10);
    }

    #[tokio::test(start_paused = true)]
    async fn watch_list_that_stalls_falls_back_to_a_paged_list() {
        let lw = FakeLw::new();
        // Initial events, but never the end bookmark (kubernetes#140890).
        lw.watch(vec![WatchEvent::Added(cm("a", "5"))], true)
            .list_ok(vec![cm("a", "5")], "7", None)
            .watch(vec![], true);
        let config = ReflectorConfig {
            use_watch_list: true,
            watch_list_timeout: Duration::from_secs(3),
            ..no_jitter()
        };
        let errs = Arc::new(Mutex::new(vec![]));
        let (ops, m) = run_for(&lw, config, 10, Some(errs.clone())).await;
        assert_eq!(ops, ["replace [a] @7"]);
        assert_eq!(m.lists(), 1, "the fallback is part of the same list round");
        let calls = lw.calls();
        assert!(
            calls[1]
                .1
                .starts_with(r#"list rv=Some("0") limit=Some(500)"#)
        );
        // The bound runs from the last event (at 10 ms), not from the start.
        assert_eq!(calls[1].0, Duration::from_millis(3010));
        assert!(errs.lock()[0].contains("falling back"), "{:?}", errs.lock());
    }

    // kubeloop's own: the bound is on lack of progress, so a slow but steady stream (an
    // event every 2 s for 20 s, bound 3 s) is read to its end bookmark without a fallback.
    #[tokio::test(start_paused = true)]
    async fn watch_list_that_keeps_delivering_is_not_cut_off() {
        let lw = FakeLw::new();
        let mut events: Vec<_> = (0..10)
            .map(|i| {
                Ok(WatchEvent::Added(cm(
                    &format!("o{i}"),
                    &(i + 1).to_string(),
                )))
            })
            .collect();
        events.push(Ok(bookmark("20", true)));
        lw.watch_raw(Ok(ScriptedWatch {
            events,
            then_hang: true,
            pace: Duration::from_secs(2),
        }));
        let config = ReflectorConfig {
            use_watch_list: true,
            watch_list_timeout: Duration::from_secs(3),
            ..no_jitter()
        };
        let errs = Arc::new(Mutex::new(vec![]));
        let (ops, m) = run_for(&lw, config, 30, Some(errs.clone())).await;
        assert_eq!(ops, ["replace [o0,o1,o2,o3,o4,o5,o6,o7,o8,o9] @20"]);
        assert_eq!(lw.call_names().len(), 1, "no fallback LIST");
        assert!(errs.lock().is_empty(), "{:?}", errs.lock());
        assert_eq!(m.lists(), 1);
    }

    fn pods(n: usize) -> Vec<ConfigMap> {
        (0..n)
            .map(|i| cm(&format!("pod-{i}"), &i.to_string()))
            .collect()
    }

    fn list_rvs(lw: &FakeLw) -> Vec<String> {
        lw.call_names()
            .into_iter()
            .filter_map(|c| {
                let rv = c.strip_prefix("list rv=")?.split(' ').next()?.to_string();
                Some(rv)
            })
            .collect()
    }

    // client-go: TestReflectorResyncWithResourceVersion
    #[tokio::test(start_paused = true)]
    async fn reflector_resync_with_resource_version() {
        let lw = FakeLw::new();
        // The watch fails, so the reflector lists again, at the version it synced.
        lw.list_ok(pods(4), "10", None)
            .watch(vec![status_event(500, "InternalError")], true)
            .list_ok(pods(8), "11", None)
            .watch(vec![], true);
        let (ops, _) = run_for(&lw, no_jitter(), 3, None).await;
        assert_eq!(
            ops,
            [
                "replace [pod-0,pod-1,pod-2,pod-3] @10",
                "replace [pod-0,pod-1,pod-2,pod-3,pod-4,pod-5,pod-6,pod-7] @11"
            ]
        );
        assert_eq!(list_rvs(&lw), [r#"Some("0")"#, r#"Some("10")"#]);
    }

    // client-go: TestReflectorExpiredExactResourceVersion
    #[tokio::test(start_paused = true)]
    async fn reflector_expired_exact_resource_version() {
        let lw = FakeLw::new();
        lw.list_ok(pods(4), "10", None)
            .watch(vec![status_event(500, "InternalError")], true)
            .list_err(api_err(410, "Expired"))
            .list_ok(pods(8), "11", None)
            .watch(vec![], true);
        let (ops, _) = run_for(&lw, no_jitter(), 3, None).await;
        assert_eq!(ops.len(), 2, "{ops:?}");
        assert!(ops[1].ends_with("@11"), "{ops:?}");
        assert_eq!(list_rvs(&lw), [r#"Some("0")"#, r#"Some("10")"#, "None"]);
    }

    // client-go: TestWatchTimeout
    #[tokio::test(start_paused = true)]
    async fn watch_timeout() {
        let cases = [
            (
                "no timeout",
                ReflectorConfig::default().min_watch_timeout,
                300,
            ),
            ("small timeout not honored", Duration::from_secs(1), 300),
            ("30m timeout", Duration::from_secs(30 * 60), 30 * 60),
        ];
        for (name, min_watch_timeout, want_min) in cases {
            let lw = FakeLw::new();
            lw.list_ok(vec![], "10", None).watch(vec![], true);
            let config = ReflectorConfig {
                min_watch_timeout,
                ..no_jitter()
            };
            run_for(&lw, config, 1, None).await;
            let got = lw.script.lock().watch_timeouts.clone();
            let t = got[0].expect("timeoutSeconds set");
            assert!(
                (want_min..=2 * want_min).contains(&t),
                "{name}: {t} not in [{want_min}, {}]",
                2 * want_min
            );
        }
    }

    // client-go: TestRetryInternalError ("retries off", client-go's default: kubeloop has
    // no MaxInternalErrorRetryDuration): an internal error on the watch ends it and the
    // reflector lists again instead of re-opening the watch.
    #[tokio::test(start_paused = true)]
    async fn retry_internal_error() {
        let lw = FakeLw::new();
        lw.list_ok(vec![], "1", None)
            .watch(vec![status_event(500, "InternalError")], true)
            .list_ok(vec![], "1", None)
            .watch(vec![], true);
        let (_, m) = run_for(&lw, no_jitter(), 3, None).await;
        let calls = lw.call_names();
        assert!(calls[0].starts_with("list") && calls[1].starts_with("watch"));
        assert!(calls[2].starts_with("list"), "{calls:?}");
        assert_eq!(m.relists(), 1);
    }

    // client-go: TestReflectorWatchHandler (the wrong-kind event is left out: a typed
    // kubeloop watch cannot decode one, and an undecodable event ends the watch).
    #[tokio::test(start_paused = true)]
    async fn reflector_watch_handler() {
        let store = Arc::new(ThreadSafeStoreAsReflectorStore::default());
        store.seed(&[cm("foo", ""), cm("bar", "")]);
        let lw = FakeLw::new();
        lw.list_ok(vec![cm("foo", ""), cm("bar", "")], "1", None)
            .watch(
                vec![
                    WatchEvent::Deleted(cm("foo", "")),
                    WatchEvent::Modified(cm("bar", "55")),
                    WatchEvent::Added(cm("baz", "32")),
                ],
                true,
            );
        let r = Reflector::new(lw.clone(), store.clone(), no_jitter());
        let rv = r.last_sync_resource_version();
        let cancel = CancellationToken::new();
        let task = tokio::spawn(r.run(cancel.clone()));
        tokio::time::sleep(Duration::from_secs(1)).await;
        cancel.cancel();
        task.await.unwrap();
        let state = store.state();
        assert_eq!(state.get("ns/foo"), None);
        assert_eq!(state.get("ns/bar").map(String::as_str), Some("55"));
        assert_eq!(state.get("ns/baz").map(String::as_str), Some("32"));
        assert_eq!(
            *rv.read(),
            "32",
            "the last event's version is the last synced one"
        );
    }

    // client-go: TestReflectorStopWatch
    #[tokio::test(start_paused = true)]
    async fn reflector_stop_watch() {
        let lw = FakeLw::new();
        lw.list_ok(vec![cm("a", "1")], "1", None)
            .watch(vec![], true);
        let store = Arc::new(RecStore::default());
        let r = Reflector::new(lw.clone(), store.clone(), no_jitter());
        let cancel = CancellationToken::new();
        cancel.cancel();
        r.run(cancel).await;
        assert!(store.ops.lock().is_empty(), "a stopped reflector wrote");
        assert!(
            lw.call_names().is_empty(),
            "a stopped reflector called the server"
        );
    }

    // client-go: TestNoRelistOnTooManyRequests
    #[tokio::test(start_paused = true)]
    async fn no_relist_on_too_many_requests() {
        let lw = FakeLw::new();
        lw.list_ok(vec![], "1", None);
        for _ in 0..4 {
            lw.watch_raw(Err(api_err(429, "TooManyRequests")));
        }
        lw.watch(vec![], true);
        let (_, m) = run_for(&lw, no_jitter(), 60, None).await;
        let calls = lw.call_names();
        let lists = calls.iter().filter(|c| c.starts_with("list")).count();
        let watches = calls.iter().filter(|c| c.starts_with("watch")).count();
        assert_eq!((lists, watches), (1, 5), "{calls:?}");
        assert_eq!(m.relists(), 0);
    }

    /// A key -> resourceVersion store, to check what watch events did (client-go's tests use
    /// a plain `Store`).
    #[derive(Default)]
    struct ThreadSafeStoreAsReflectorStore {
        items: Mutex<std::collections::BTreeMap<String, String>>,
    }

    impl ThreadSafeStoreAsReflectorStore {
        fn seed(&self, objs: &[ConfigMap]) {
            for o in objs {
                self.put(o);
            }
        }
        fn put(&self, o: &ConfigMap) {
            self.items.lock().insert(
                meta_namespace_key(o).unwrap(),
                o.metadata.resource_version.clone().unwrap_or_default(),
            );
        }
        fn state(&self) -> std::collections::BTreeMap<String, String> {
            self.items.lock().clone()
        }
    }

    impl ReflectorStore<ConfigMap> for ThreadSafeStoreAsReflectorStore {
        fn add(&self, o: ConfigMap) -> Result<(), StoreError> {
            self.put(&o);
            Ok(())
        }
        fn update(&self, o: ConfigMap) -> Result<(), StoreError> {
            self.put(&o);
            Ok(())
        }
        fn delete(&self, o: ConfigMap) -> Result<(), StoreError> {
            self.items.lock().remove(&meta_namespace_key(&o).unwrap());
            Ok(())
        }
        fn replace(&self, list: Vec<ConfigMap>, _: &str) -> Result<(), StoreError> {
            self.items.lock().clear();
            self.seed(&list);
            Ok(())
        }
        fn resync(&self) -> Result<(), StoreError> {
            Ok(())
        }
    }

    #[test]
    fn default_config_is_client_go() {
        let c = ReflectorConfig::default();
        assert_eq!(c.page_size, 500);
        assert_eq!(c.min_watch_timeout, Duration::from_secs(300));
        assert_eq!(c.backoff, BackoffConfig::default());
        assert_eq!(c.resync_period, Duration::ZERO);
        assert!(c.use_watch_list);
    }
}
