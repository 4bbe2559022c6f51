//! Events on events.k8s.io/v1, with series: client-go `tools/events` (v0.36.3), the API
//! `kubectl events`, the controller-manager and controller-runtime (#3262) record on.
//!
//! | kubeloop                   | client-go `tools/events`                                       |
//! |----------------------------|----------------------------------------------------------------|
//! | [`EventsV1Recorder::eventf`] | `event_recorder.go`: `recorderImpl.Eventf`, `makeEvent`     |
//! | [`EventsV1Broadcaster`]    | `event_broadcaster.go`: `eventBroadcasterImpl`, `recordToSink`, `attemptRecording`, `recordEvent`, `finishSeries`, `refreshExistingEventSeries` |
//! | [`EventsV1Sink`]           | `EventSink`, `EventSinkImpl`                                   |
//!
//! Behaviour kept from client-go:
//! - `eventf(regarding, related, type, reason, action, note)` builds an Event named
//!   `<regarding's name>.<nanoseconds in hex>` (a random UUID when that is not a valid name,
//!   `util.GenerateEventName`), in the regarding object's namespace (`default` for a
//!   cluster-scoped one), with `eventTime` now and the recorder's `reportingController` and
//!   `reportingInstance` (`<controller>-<hostname>` by default); it is queued without
//!   blocking, and dropped with a log line when 1,000 wait (`maxQueuedEvents`).
//! - Isomorphic events (same regarding, related, action, reason, type, reporting controller
//!   and instance; the note is not compared) become one Event: the first is created; the
//!   second gives it a `series` of count 2, written at once (a patch of `series`, or a create
//!   if the Event is gone); later ones only raise the count and the last observed time, in
//!   memory.
//! - A heartbeat every 30 minutes (`refreshTime`) patches every open series, so the Event
//!   outlives the apiserver's event TTL while it keeps happening; every 6 minutes
//!   (`finishTime`) a series not observed for 6 minutes has its final count written and ends,
//!   and a single event older than that is forgotten (a later isomorphic one starts afresh).
//! - Transport errors are retried up to 12 times, 10 s apart (`maxTriesPerEvent`,
//!   `defaultSleepDuration`); an Event the apiserver refuses is dropped, except that a series'
//!   create refused as AlreadyExists (the patch found no Event; another write just made it)
//!   is tried again.
//!
//! Beyond client-go:
//! - **A spam budget**: client-go's `tools/record` gives each source and object a token bucket
//!   (`EventSourceObjectSpamFilter`: 25 at once, then one per 5 minutes); `tools/events`
//!   dropped it. Here every event that would start a new Event (not a repeat, which only
//!   counts) takes a token of its reporting controller and instance and regarding object, so a
//!   hot loop that varies its reason or action writes at most 25 Events at once about one
//!   object, then one per 5 minutes. Repeats are never dropped, so series counts stay right.
//!   Drops are counted in `kubeloop_events_dropped_total{reason="spam"}` ([`EventMetrics`]).
//! - The note is cut to the API's limit (1 KiB, on a character boundary); client-go sends a
//!   longer one and the apiserver refuses the Event.
//! - Shutdown writes what was queued and the last count of every series that changed since
//!   it was written (client-go's `Shutdown` loses both), so a controller that stops leaves
//!   the right counts behind.
//!
//! One writer task owns the cache and the budget and writes one Event at a time (client-go
//! starts a goroutine per event); timers use tokio's clock, the API's times the wall clock.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::{Event, EventSeries};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube_client::Resource;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::broadcaster::{EventType, WriterTask, enqueue, event_meta, object_reference};
use super::metrics::{EventDropReason, EventMetrics};
use super::sink::{EventsV1Sink, RecordError};
use super::spam::SpamFilter;

/// The API's limit on `note`, in bytes (`NoteLengthLimit`, kubernetes
/// `pkg/apis/core/validation/events.go`).
pub const NOTE_LENGTH_LIMIT: usize = 1024;

/// Settings of an [`EventsV1Broadcaster`]; the defaults are client-go's, and the budget
/// `tools/record`'s.
#[derive(Debug, Clone)]
pub struct EventsV1Config {
    /// Events waiting to be written before new ones are dropped (`maxQueuedEvents` = 1000).
    pub queue_size: usize,
    /// Attempts per write on transport errors (`maxTriesPerEvent` = 12).
    pub max_tries: u32,
    /// Wait between attempts (`defaultSleepDuration` = 10 s).
    pub retry_interval: Duration,
    /// A series not observed for this long ends, and a single event is forgotten
    /// (`finishTime` = 6 min); also how often that is checked.
    pub finish_after: Duration,
    /// How often open series are written again (`refreshTime` = 30 min).
    pub refresh_every: Duration,
    /// New Events a reporter may start about one object at once (`defaultSpamBurst` = 25).
    pub spam_burst: u32,
    /// One more is allowed per this period once the burst is spent (`defaultSpamQPS`: one per
    /// 5 minutes).
    pub spam_refill: Duration,
    /// Where drops and writes are counted (`None`: [`EventMetrics::global`]).
    pub metrics: Option<EventMetrics>,
}

impl Default for EventsV1Config {
    fn default() -> Self {
        EventsV1Config {
            queue_size: 1000,
            max_tries: 12,
            retry_interval: Duration::from_secs(10),
            finish_after: Duration::from_secs(6 * 60),
            refresh_every: Duration::from_secs(30 * 60),
            spam_burst: 25,
            spam_refill: Duration::from_secs(300),
            metrics: None,
        }
    }
}

/// Owns the writer task; hands out [`EventsV1Recorder`]s. client-go: `tools/events`'
/// `EventBroadcaster` started with `StartRecordingToSinkWithContext`.
pub struct EventsV1Broadcaster {
    tx: mpsc::Sender<Event>,
    writer: WriterTask,
    metrics: EventMetrics,
}

/// Records events.k8s.io/v1 events; cheap to clone, never blocks. client-go: `tools/events`'
/// `EventRecorder`.
#[derive(Clone)]
pub struct EventsV1Recorder {
    tx: mpsc::Sender<Event>,
    reporting_controller: Arc<str>,
    reporting_instance: Arc<str>,
    metrics: EventMetrics,
}

impl EventsV1Broadcaster {
    /// Starts the writer task on the current tokio runtime, writing to `sink`.
    pub fn start<S: EventsV1Sink>(sink: S, config: EventsV1Config) -> Self {
        let (tx, rx) = mpsc::channel(config.queue_size.max(1));
        let metrics = config
            .metrics
            .clone()
            .unwrap_or_else(|| EventMetrics::global().clone());
        let writer = Writer {
            sink,
            cache: HashMap::new(),
            spam: SpamFilter::new(config.spam_burst, config.spam_refill, 4096),
            metrics: metrics.clone(),
            config,
        };
        EventsV1Broadcaster {
            tx,
            writer: WriterTask::spawn(|stop| writer.run(rx, stop)),
            metrics,
        }
    }

    /// A recorder reporting as `reporting_controller`, from the instance
    /// `<reporting_controller>-<hostname>`. client-go: `NewRecorder`.
    pub fn new_recorder(&self, reporting_controller: &str) -> EventsV1Recorder {
        self.new_recorder_as(
            reporting_controller,
            &default_reporting_instance(reporting_controller),
        )
    }

    /// A recorder reporting as `reporting_controller` from `reporting_instance` (say the
    /// leader election identity, which tells replicas apart).
    pub fn new_recorder_as(
        &self,
        reporting_controller: &str,
        reporting_instance: &str,
    ) -> EventsV1Recorder {
        EventsV1Recorder {
            tx: self.tx.clone(),
            reporting_controller: Arc::from(reporting_controller),
            reporting_instance: Arc::from(reporting_instance),
            metrics: self.metrics.clone(),
        }
    }

    /// Writes what is queued and every series' last count, then stops the writer and waits
    /// for it. Idempotent.
    pub async fn shutdown(&self) {
        self.writer.shutdown().await;
    }
}

impl EventsV1Recorder {
    /// Records that `action` was taken on `regarding` (with `related` involved) for
    /// `reason`, `note` saying more. client-go: `EventRecorder.Eventf` (format the note with
    /// `format!`).
    pub fn eventf<K>(
        &self,
        regarding: &K,
        related: Option<ObjectReference>,
        event_type: EventType,
        reason: &str,
        action: &str,
        note: &str,
    ) where
        K: Resource,
        K::DynamicType: Default,
    {
        self.eventf_for(
            object_reference(regarding),
            related,
            event_type,
            reason,
            action,
            note,
        );
    }

    /// [`eventf`](Self::eventf) about the object `regarding` points at.
    pub fn eventf_for(
        &self,
        regarding: ObjectReference,
        related: Option<ObjectReference>,
        event_type: EventType,
        reason: &str,
        action: &str,
        note: &str,
    ) {
        let event = self.make_event(regarding, related, event_type, reason, action, note);
        tracing::debug!(
            object = %reference_text(event.regarding.as_ref()),
            r#type = event_type.as_str(),
            reason,
            action,
            note = event.note.as_deref().unwrap_or(""),
            "event"
        );
        if !enqueue(&self.tx, event, |e| e.reason.as_deref()) {
            self.metrics.dropped(EventDropReason::queue_full);
        }
    }

    /// client-go: `recorderImpl.makeEvent`.
    fn make_event(
        &self,
        regarding: ObjectReference,
        related: Option<ObjectReference>,
        event_type: EventType,
        reason: &str,
        action: &str,
        note: &str,
    ) -> Event {
        let now = Timestamp::now();
        Event {
            metadata: event_meta(&regarding, now),
            event_time: Some(MicroTime(now)),
            series: None,
            reporting_controller: Some(self.reporting_controller.to_string()),
            reporting_instance: Some(self.reporting_instance.to_string()),
            action: Some(action.to_owned()),
            reason: Some(reason.to_owned()),
            regarding: Some(regarding),
            related,
            note: Some(limit_note(note).to_owned()),
            type_: Some(event_type.as_str().to_owned()),
            ..Default::default()
        }
    }
}

/// `<reporting_controller>-<hostname>`: the reporting instance client-go's `NewRecorder` gives
/// a recorder.
pub fn default_reporting_instance(reporting_controller: &str) -> String {
    let host = gethostname::gethostname().to_string_lossy().into_owned();
    format!("{reporting_controller}-{host}")
}

/// `note` cut to [`NOTE_LENGTH_LIMIT`] bytes on a character boundary.
fn limit_note(note: &str) -> &str {
    if note.len() <= NOTE_LENGTH_LIMIT {
        return note;
    }
    let mut end = NOTE_LENGTH_LIMIT;
    while !note.is_char_boundary(end) {
        end -= 1;
    }
    &note[..end]
}

fn reference_text(reference: Option<&ObjectReference>) -> String {
    let r = reference.cloned().unwrap_or_default();
    format!(
        "{}/{}",
        r.namespace.as_deref().unwrap_or(""),
        r.name.as_deref().unwrap_or("")
    )
}

/// What makes two events isomorphic. client-go: `getKey` (`eventKey`), joined with a
/// separator no field can hold.
fn isomorphic_key(event: &Event) -> String {
    let mut key = [
        event.type_.as_deref(),
        event.action.as_deref(),
        event.reason.as_deref(),
        event.reporting_controller.as_deref(),
        event.reporting_instance.as_deref(),
    ]
    .map(|p| p.unwrap_or(""))
    .join("\u{0}");
    for reference in [event.regarding.as_ref(), event.related.as_ref()] {
        let r = reference.cloned().unwrap_or_default();
        for part in [
            r.api_version,
            r.kind,
            r.namespace,
            r.name,
            r.uid,
            r.field_path,
            r.resource_version,
        ] {
            key.push('\u{0}');
            key.push_str(part.as_deref().unwrap_or(""));
        }
    }
    key
}

/// The spam budget's unit: the reporter and the regarding object.
fn spam_key(event: &Event) -> String {
    let r = event.regarding.clone().unwrap_or_default();
    [
        event.reporting_controller.as_deref().unwrap_or(""),
        event.reporting_instance.as_deref().unwrap_or(""),
        r.api_version.as_deref().unwrap_or(""),
        r.kind.as_deref().unwrap_or(""),
        r.namespace.as_deref().unwrap_or(""),
        r.name.as_deref().unwrap_or(""),
        r.uid.as_deref().unwrap_or(""),
    ]
    .join("\u{0}")
}

/// One isomorphic group, as the writer remembers it.
struct Cached {
    /// The Event as last written (or to be written), its series' count included.
    event: Event,
    /// When it was last observed (tokio's clock, for ending it).
    observed: Instant,
    /// Whether the series' count changed since it was last written.
    unwritten: bool,
}

/// The writer task's state. client-go: `eventBroadcasterImpl`'s `eventCache` and sink.
struct Writer<S> {
    sink: S,
    cache: HashMap<String, Cached>,
    spam: SpamFilter,
    metrics: EventMetrics,
    config: EventsV1Config,
}

impl<S: EventsV1Sink> Writer<S> {
    async fn run(mut self, mut rx: mpsc::Receiver<Event>, stop: CancellationToken) {
        let start = Instant::now();
        let mut finish = tokio::time::interval_at(
            start + self.config.finish_after,
            self.config.finish_after.max(Duration::from_millis(1)),
        );
        let mut refresh = tokio::time::interval_at(
            start + self.config.refresh_every,
            self.config.refresh_every.max(Duration::from_millis(1)),
        );
        loop {
            tokio::select! {
                event = rx.recv() => match event {
                    Some(event) => self.record(event, &stop).await,
                    None => break,
                },
                _ = finish.tick() => self.finish_series(&stop).await,
                _ = refresh.tick() => self.refresh_series(&stop).await,
                _ = stop.cancelled() => break,
            }
        }
        // Stopping: write what was recorded before the stop, then every series' last count.
        rx.close();
        while let Ok(event) = rx.try_recv() {
            self.record(event, &stop).await;
        }
        let unwritten: Vec<Event> = self
            .cache
            .values()
            .filter(|c| c.unwritten)
            .map(|c| c.event.clone())
            .collect();
        for event in unwritten {
            self.attempt(event, &stop).await;
        }
    }

    /// One recorded event: a new Event (if the budget allows), a series started (written),
    /// or a repeat counted. client-go: `recordToSink`.
    async fn record(&mut self, event: Event, stop: &CancellationToken) {
        let key = isomorphic_key(&event);
        let now = Instant::now();
        let write = match self.cache.get_mut(&key) {
            Some(cached) => {
                cached.observed = now;
                let observed = MicroTime(Timestamp::now());
                match &mut cached.event.series {
                    Some(series) => {
                        series.count += 1;
                        series.last_observed_time = observed;
                        cached.unwritten = true;
                        return;
                    }
                    None => {
                        cached.event.series = Some(EventSeries {
                            count: 2,
                            last_observed_time: observed,
                        });
                        cached.unwritten = false;
                        cached.event.clone()
                    }
                }
            }
            None => {
                if !self.spam.allow(spam_key(&event), now) {
                    self.metrics.dropped(EventDropReason::spam);
                    tracing::debug!(
                        object = %reference_text(event.regarding.as_ref()),
                        reason = event.reason.as_deref().unwrap_or(""),
                        "event dropped: its object's budget is spent"
                    );
                    return;
                }
                self.cache.insert(
                    key,
                    Cached {
                        event: event.clone(),
                        observed: now,
                        unwritten: false,
                    },
                );
                event
            }
        };
        self.attempt(write, stop).await;
    }

    /// Ends the series not observed for more than `finish_after` (writing their last count)
    /// and forgets single events older than that. client-go: `finishSeries`, with two
    /// differences (client-go 0.36 writes every ended series and keeps one whose write is to
    /// be retried, for the next check): an ended series is written only if its count changed
    /// since it was last written (a heartbeat or the series' start wrote it already), and it
    /// is evicted whether or not that write succeeds, since [`attempt`](Self::attempt) has
    /// already retried transport errors and a refused Event stays refused.
    async fn finish_series(&mut self, stop: &CancellationToken) {
        let Some(cutoff) = Instant::now().checked_sub(self.config.finish_after) else {
            return;
        };
        let ended: Vec<String> = self
            .cache
            .iter()
            .filter(|(_, c)| c.observed < cutoff)
            .map(|(k, _)| k.clone())
            .collect();
        for key in ended {
            let Some(cached) = self.cache.remove(&key) else {
                continue;
            };
            // client-go writes every ended series; here only an unwritten count. Evicted
            // even when the write fails (client-go keeps a retryable failure for later).
            if cached.event.series.is_some() && cached.unwritten {
                self.attempt(cached.event, stop).await;
            }
        }
    }

    /// Writes every open series again. client-go: `refreshExistingEventSeries`.
    async fn refresh_series(&mut self, stop: &CancellationToken) {
        let open: Vec<(String, Event)> = self
            .cache
            .iter()
            .filter(|(_, c)| c.event.series.is_some())
            .map(|(k, c)| (k.clone(), c.event.clone()))
            .collect();
        for (key, event) in open {
            if self.attempt(event, stop).await
                && let Some(cached) = self.cache.get_mut(&key)
            {
                cached.unwritten = false;
            }
        }
    }

    /// Writes `event`, retrying transport errors; whether it was written. client-go:
    /// `attemptRecording`.
    async fn attempt(&mut self, event: Event, stop: &CancellationToken) -> bool {
        let mut tries = 1;
        loop {
            let err = match self.write(&event).await {
                Ok(()) => return true,
                Err(err) => err,
            };
            if !err.retry {
                tracing::error!(error = %err.error, "could not write event, dropping it");
                self.metrics.dropped(EventDropReason::refused);
                return false;
            }
            if tries >= self.config.max_tries || stop.is_cancelled() {
                tracing::error!(error = %err.error, tries, "could not write event, giving up");
                self.metrics.dropped(EventDropReason::unreachable);
                return false;
            }
            tracing::warn!(error = %err.error, tries, "could not write event, will retry");
            tries += 1;
            tokio::select! {
                _ = tokio::time::sleep(self.config.retry_interval) => {}
                _ = stop.cancelled() => {}
            }
        }
    }

    /// One write: a series is patched (created if its Event is gone), a single event
    /// created. client-go: `recordEvent`.
    async fn write(&self, event: &Event) -> Result<(), WriteError> {
        let series = event.series.is_some();
        if series {
            self.metrics.wrote("patch");
            match self.sink.patch_series(event).await {
                Ok(_) => return Ok(()),
                Err(RecordError::NotFound { .. }) => {}
                Err(error) => {
                    let retry = error.is_retryable();
                    return Err(WriteError { error, retry });
                }
            }
        }
        self.metrics.wrote("create");
        match self.sink.create(event).await {
            Ok(_) => Ok(()),
            // The patch found no Event and another write has just made it: patch again.
            Err(error) if series && error.is_already_exists() => {
                Err(WriteError { error, retry: true })
            }
            Err(error) => {
                let retry = error.is_retryable();
                Err(WriteError { error, retry })
            }
        }
    }
}

struct WriteError {
    error: RecordError,
    retry: bool,
}

#[cfg(test)]
#[path = "series_tests.rs"]
mod tests;
