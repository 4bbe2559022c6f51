//! Recording events without blocking: client-go `tools/record/event.go` (`eventBroadcasterImpl`,
//! `recorderImpl`, `StartRecordingToSink`, `recordToSink`).
//!
//! [`EventRecorder::event`] builds a core/v1 Event (timestamps taken at the call) and
//! `try_send`s it on a bounded channel; when the channel is full the event is dropped with a
//! warning, as client-go's broadcaster does (`DropIfChannelFull`, 1000 slots). One writer task
//! owns the [`EventCorrelator`] and the [`EventSink`], and writes events one at a time in the
//! order they were recorded.
//!
//! Retries (client-go `recordToSink`): transport errors are retried up to `max_tries` times,
//! `retry_interval` apart (client-go: 12 tries, 10 s); errors the apiserver answered are not.
//! A repeat whose Event has vanished is created afresh.
//!
//! Shutdown: [`EventBroadcaster::shutdown`] stops the writer after it has written what was
//! already queued (without retrying); events recorded afterwards are dropped. client-go's
//! `Shutdown` drops what is queued instead.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Event, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube_client::Resource;
use kube_client::core::ObjectMeta;
use parking_lot::Mutex;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::correlator::{CorrelatorConfig, EventCorrelator, Write};
use super::sink::{EventSink, RecordError};

/// Who reports an event (core/v1 `EventSource`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EventSource {
    /// The reporting component, e.g. `sample-controller`.
    pub component: String,
    /// The host it runs on, if worth telling.
    pub host: Option<String>,
}

/// An event's `type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    /// Things going as planned.
    Normal,
    /// Something a human may need to look at.
    Warning,
}

impl EventType {
    /// The API string ("Normal" or "Warning").
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Normal => "Normal",
            EventType::Warning => "Warning",
        }
    }
}

/// Settings of an [`EventBroadcaster`]; defaults are client-go's.
#[derive(Debug, Clone)]
pub struct BroadcasterConfig {
    /// Events waiting to be written before new ones are dropped (client-go
    /// `maxQueuedEvents` = 1000).
    pub queue_size: usize,
    /// Attempts per event on transport errors (client-go `maxTriesPerEvent` = 12).
    pub max_tries: u32,
    /// Wait between attempts (client-go `defaultSleepDuration` = 10 s).
    pub retry_interval: Duration,
    /// Repeat counting and spam filtering.
    pub correlator: CorrelatorConfig,
}

impl Default for BroadcasterConfig {
    fn default() -> Self {
        BroadcasterConfig {
            queue_size: 1000,
            max_tries: 12,
            retry_interval: Duration::from_secs(10),
            correlator: CorrelatorConfig::default(),
        }
    }
}

/// Owns the writer task; hands out [`EventRecorder`]s. client-go: `EventBroadcaster` started
/// with `StartRecordingToSink`.
pub struct EventBroadcaster {
    tx: mpsc::Sender<Event>,
    writer: WriterTask,
}

/// A broadcaster's writer task and what stops it: cancelled on shutdown and on drop. Both
/// recorders' broadcasters hold one.
pub(super) struct WriterTask {
    stop: CancellationToken,
    task: Mutex<Option<JoinHandle<()>>>,
}

impl WriterTask {
    /// Spawns `run(stop)` on the current tokio runtime.
    pub(super) fn spawn<F>(run: impl FnOnce(CancellationToken) -> F) -> Self
    where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        let stop = CancellationToken::new();
        let task = tokio::spawn(run(stop.clone()));
        WriterTask {
            stop,
            task: Mutex::new(Some(task)),
        }
    }

    /// Cancels the task and waits for it to end. Idempotent.
    pub(super) async fn shutdown(&self) {
        self.stop.cancel();
        let task = self.task.lock().take();
        if let Some(task) = task
            && let Err(e) = task.await
        {
            tracing::error!(error = %e, "event writer task ended abnormally");
        }
    }
}

impl Drop for WriterTask {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// Records events about objects; cheap to clone, never blocks. client-go: `EventRecorder`.
#[derive(Clone)]
pub struct EventRecorder {
    tx: mpsc::Sender<Event>,
    source: Arc<EventSource>,
}

impl EventBroadcaster {
    /// Starts the writer task on the current tokio runtime, writing to `sink`.
    pub fn start<S: EventSink>(sink: S, config: BroadcasterConfig) -> Self {
        let (tx, rx) = mpsc::channel(config.queue_size.max(1));
        EventBroadcaster {
            tx,
            writer: WriterTask::spawn(|stop| write_loop(sink, rx, stop, config)),
        }
    }

    /// A broadcaster writing to the apiserver through `client` with the default settings, and a
    /// recorder reporting as `component` (what a controller's wiring needs; client-go:
    /// `NewBroadcaster` + `StartRecordingToSink` + `NewRecorder`).
    pub fn for_component(client: kube_client::Client, component: &str) -> (Self, EventRecorder) {
        let broadcaster = Self::start(
            super::KubeEventSink::new(client),
            BroadcasterConfig::default(),
        );
        let recorder = broadcaster.new_recorder(EventSource {
            component: component.to_string(),
            host: None,
        });
        (broadcaster, recorder)
    }

    /// A recorder reporting as `source`. client-go: `NewRecorder`.
    pub fn new_recorder(&self, source: EventSource) -> EventRecorder {
        EventRecorder {
            tx: self.tx.clone(),
            source: Arc::new(source),
        }
    }

    /// Writes what is queued, then stops the writer and waits for it. Idempotent.
    pub async fn shutdown(&self) {
        self.writer.shutdown().await;
    }
}

impl EventRecorder {
    /// Records an event about `obj`. client-go: `EventRecorder.Event`.
    pub fn event<K>(&self, obj: &K, event_type: EventType, reason: &str, message: &str)
    where
        K: Resource,
        K::DynamicType: Default,
    {
        self.event_for(object_reference(obj), event_type, reason, message);
    }

    /// Records an event about the object `reference` points at.
    pub fn event_for(
        &self,
        reference: ObjectReference,
        event_type: EventType,
        reason: &str,
        message: &str,
    ) {
        let event = self.make_event(reference, event_type, reason, message);
        tracing::debug!(
            object = %format!("{}/{}", event.involved_object.namespace.as_deref().unwrap_or(""), event.involved_object.name.as_deref().unwrap_or("")),
            kind = event.involved_object.kind.as_deref().unwrap_or(""),
            r#type = event_type.as_str(),
            reason,
            message,
            "event"
        );
        enqueue(&self.tx, event, |e| e.reason.as_deref());
    }

    /// client-go: `recorderImpl.makeEvent`.
    fn make_event(
        &self,
        reference: ObjectReference,
        event_type: EventType,
        reason: &str,
        message: &str,
    ) -> Event {
        let now = Timestamp::now();
        Event {
            metadata: event_meta(&reference, now),
            involved_object: reference,
            reason: Some(reason.to_string()),
            message: Some(message.to_string()),
            type_: Some(event_type.as_str().to_string()),
            source: Some(k8s_openapi::api::core::v1::EventSource {
                component: Some(self.source.component.clone()),
                host: self.source.host.clone(),
            }),
            first_timestamp: Some(Time(now)),
            last_timestamp: Some(Time(now)),
            count: Some(1),
            reporting_component: Some(self.source.component.clone()),
            reporting_instance: self.source.host.clone(),
            ..Default::default()
        }
    }
}

/// Queues `event` for the writer without waiting; false when the queue is full and the
/// event was dropped (logged, as client-go's broadcaster does with `DropIfChannelFull`).
/// `reason` names the event in the log.
pub(super) fn enqueue<E>(
    tx: &mpsc::Sender<E>,
    event: E,
    reason: impl Fn(&E) -> Option<&str>,
) -> bool {
    match tx.try_send(event) {
        Ok(()) => true,
        Err(mpsc::error::TrySendError::Full(e)) => {
            let reason = reason(&e).unwrap_or("");
            tracing::warn!(reason, "too many queued events, event dropped");
            false
        }
        Err(mpsc::error::TrySendError::Closed(e)) => {
            let reason = reason(&e).unwrap_or("");
            tracing::debug!(reason, "event recorder shut down, event dropped");
            true
        }
    }
}

/// An Event's name and namespace: in the namespace of the object it is about (`default` for
/// a cluster-scoped one), named by [`event_name`]. client-go: both recorders' `makeEvent`.
pub(super) fn event_meta(about: &ObjectReference, now: Timestamp) -> ObjectMeta {
    let namespace = match about.namespace.as_deref() {
        Some(ns) if !ns.is_empty() => ns,
        _ => "default",
    };
    ObjectMeta {
        name: Some(event_name(
            about.name.as_deref().unwrap_or(""),
            now.as_nanosecond(),
        )),
        namespace: Some(namespace.to_owned()),
        ..Default::default()
    }
}

/// `<name>.<nanos in hex>`, or a random UUID when that is not a DNS subdomain (a regarding
/// object named like an IPv6 address, or too long). client-go: `util.GenerateEventName`.
pub(super) fn event_name(regarding: &str, unix_nanos: i128) -> String {
    let name = format!("{regarding}.{unix_nanos:x}");
    if is_dns_subdomain(&name) {
        name
    } else {
        uuid::Uuid::new_v4().to_string()
    }
}

/// apimachinery's `NameIsDNSSubdomain`: at most 253 characters of lower-case alphanumerics,
/// `-` and `.`, each dot-separated label starting and ending alphanumeric.
pub(super) fn is_dns_subdomain(name: &str) -> bool {
    let alnum = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    name.len() <= 253
        && name.split('.').all(|label| {
            let bytes = label.as_bytes();
            !bytes.is_empty()
                && alnum(bytes[0])
                && alnum(bytes[bytes.len() - 1])
                && bytes.iter().all(|&c| alnum(c) || c == b'-')
        })
}

/// A reference to `obj` for `involvedObject`. client-go: `reference.GetReference`.
pub fn object_reference<K>(obj: &K) -> ObjectReference
where
    K: Resource,
    K::DynamicType: Default,
{
    let dt = K::DynamicType::default();
    let meta = obj.meta();
    ObjectReference {
        api_version: Some(K::api_version(&dt).into_owned()),
        kind: Some(K::kind(&dt).into_owned()),
        namespace: meta.namespace.clone(),
        name: meta.name.clone(),
        uid: meta.uid.clone(),
        resource_version: meta.resource_version.clone(),
        field_path: None,
    }
}

async fn write_loop<S: EventSink>(
    sink: S,
    mut rx: mpsc::Receiver<Event>,
    stop: CancellationToken,
    config: BroadcasterConfig,
) {
    let mut correlator = EventCorrelator::new(config.correlator.clone());
    loop {
        let event = tokio::select! {
            event = rx.recv() => match event {
                Some(event) => event,
                None => return,
            },
            _ = stop.cancelled() => break,
        };
        write_event(&sink, &mut correlator, event, &stop, &config).await;
    }
    // Stopping: write what was recorded before the stop, once each, then refuse more.
    rx.close();
    while let Ok(event) = rx.try_recv() {
        write_event(&sink, &mut correlator, event, &stop, &config).await;
    }
}

/// client-go: `recordToSink` + `recordEvent`.
async fn write_event<S: EventSink>(
    sink: &S,
    correlator: &mut EventCorrelator,
    event: Event,
    stop: &CancellationToken,
    config: &BroadcasterConfig,
) {
    let Some(write) = correlator.correlate(event, Instant::now()) else {
        tracing::debug!("event dropped by the spam filter");
        return;
    };
    let mut attempt = 1;
    loop {
        let result = match &write {
            Write::Create(e) => sink.create(e).await,
            Write::Patch(e) => match sink.patch(e).await {
                Err(RecordError::NotFound { .. }) => sink.create(e).await,
                other => other,
            },
        };
        let err = match result {
            Ok(written) => {
                correlator.update_state(&written);
                return;
            }
            Err(err) => err,
        };
        if !err.is_retryable() {
            tracing::error!(error = %err, "could not write event, dropping it");
            return;
        }
        if attempt >= config.max_tries || stop.is_cancelled() {
            tracing::error!(error = %err, attempts = attempt, "could not write event, giving up");
            return;
        }
        tracing::warn!(error = %err, attempt, "could not write event, will retry");
        attempt += 1;
        tokio::select! {
            _ = tokio::time::sleep(config.retry_interval) => {}
            _ = stop.cancelled() => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use k8s_openapi::api::core::v1::ConfigMap;

    use super::*;

    /// Stores events in memory; fails the first `fail_creates` creates with a transport error.
    #[derive(Clone, Default)]
    struct MemorySink {
        events: Arc<Mutex<Vec<Event>>>,
        patches: Arc<AtomicU32>,
        fail_creates: Arc<AtomicU32>,
        gate: Option<Arc<tokio::sync::Semaphore>>,
    }

    impl EventSink for MemorySink {
        async fn create(&self, event: &Event) -> Result<Event, RecordError> {
            if let Some(gate) = &self.gate {
                let _permit = gate.acquire().await;
            }
            if self.fail_creates.load(Ordering::SeqCst) > 0 {
                self.fail_creates.fetch_sub(1, Ordering::SeqCst);
                return Err(RecordError::Transport {
                    namespace: "ns".into(),
                    name: "x".into(),
                    source: kube_client::Error::LinesCodecMaxLineLengthExceeded,
                });
            }
            let mut events = self.events.lock();
            events.retain(|e| e.metadata.name != event.metadata.name);
            events.push(event.clone());
            Ok(event.clone())
        }
        async fn patch(&self, event: &Event) -> Result<Event, RecordError> {
            self.patches.fetch_add(1, Ordering::SeqCst);
            let mut events = self.events.lock();
            let Some(stored) = events
                .iter_mut()
                .find(|e| e.metadata.name == event.metadata.name)
            else {
                return Err(RecordError::NotFound {
                    namespace: "ns".into(),
                    name: event.metadata.name.clone().unwrap_or_default(),
                });
            };
            stored.count = event.count;
            stored.last_timestamp = event.last_timestamp.clone();
            stored.message = event.message.clone();
            Ok(stored.clone())
        }
    }

    fn cm() -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta {
                namespace: Some("ns".into()),
                name: Some("web".into()),
                uid: Some("u1".into()),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    fn source() -> EventSource {
        EventSource {
            component: "test-controller".into(),
            host: None,
        }
    }

    #[tokio::test]
    async fn recorded_events_are_written_with_reference_source_and_count() {
        let sink = MemorySink::default();
        let b = EventBroadcaster::start(sink.clone(), BroadcasterConfig::default());
        let r = b.new_recorder(source());
        r.event(&cm(), EventType::Warning, "ErrResourceExists", "it exists");
        b.shutdown().await;
        let events = sink.events.lock();
        assert_eq!(events.len(), 1);
        let e = &events[0];
        assert_eq!(e.type_.as_deref(), Some("Warning"));
        assert_eq!(e.reason.as_deref(), Some("ErrResourceExists"));
        assert_eq!(e.message.as_deref(), Some("it exists"));
        assert_eq!(e.count, Some(1));
        assert_eq!(e.metadata.namespace.as_deref(), Some("ns"));
        assert!(e.metadata.name.as_deref().unwrap().starts_with("web."));
        assert_eq!(e.involved_object.kind.as_deref(), Some("ConfigMap"));
        assert_eq!(e.involved_object.api_version.as_deref(), Some("v1"));
        assert_eq!(e.involved_object.uid.as_deref(), Some("u1"));
        assert_eq!(
            e.source.as_ref().and_then(|s| s.component.as_deref()),
            Some("test-controller")
        );
        assert!(e.first_timestamp.is_some() && e.first_timestamp == e.last_timestamp);
    }

    #[tokio::test]
    async fn repeats_become_one_event_with_a_count() {
        let sink = MemorySink::default();
        let b = EventBroadcaster::start(sink.clone(), BroadcasterConfig::default());
        let r = b.new_recorder(source());
        for _ in 0..5 {
            r.event(&cm(), EventType::Normal, "Synced", "synced");
        }
        r.event(&cm(), EventType::Normal, "Synced", "something else");
        b.shutdown().await;
        let events = sink.events.lock();
        assert_eq!(events.len(), 2, "{events:#?}");
        let synced = events
            .iter()
            .find(|e| e.message.as_deref() == Some("synced"))
            .unwrap();
        assert_eq!(synced.count, Some(5));
        assert_eq!(sink.patches.load(Ordering::SeqCst), 4);
    }

    #[tokio::test]
    async fn a_repeat_of_a_vanished_event_creates_it_again() {
        let sink = MemorySink::default();
        let b = EventBroadcaster::start(sink.clone(), BroadcasterConfig::default());
        let r = b.new_recorder(source());
        r.event(&cm(), EventType::Normal, "Synced", "synced");
        tokio::time::timeout(Duration::from_secs(5), async {
            while sink.events.lock().is_empty() {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .expect("first event written");
        sink.events.lock().clear(); // the apiserver's event TTL expired it
        r.event(&cm(), EventType::Normal, "Synced", "synced");
        b.shutdown().await;
        let events = sink.events.lock();
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].count, Some(2));
    }

    #[tokio::test(start_paused = true)]
    async fn transport_errors_are_retried_after_the_retry_interval() {
        let sink = MemorySink::default();
        sink.fail_creates.store(2, Ordering::SeqCst);
        let b = EventBroadcaster::start(
            sink.clone(),
            BroadcasterConfig {
                retry_interval: Duration::from_secs(10),
                ..Default::default()
            },
        );
        let r = b.new_recorder(source());
        r.event(&cm(), EventType::Normal, "Synced", "synced");
        tokio::time::sleep(Duration::from_secs(15)).await;
        assert!(sink.events.lock().is_empty(), "second attempt failed too");
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert_eq!(sink.events.lock().len(), 1, "third attempt succeeded");
        b.shutdown().await;
    }

    #[tokio::test]
    async fn recording_never_blocks_when_the_writer_is_stuck_and_overflow_is_dropped() {
        let gate = Arc::new(tokio::sync::Semaphore::new(0));
        let sink = MemorySink {
            gate: Some(gate.clone()),
            ..Default::default()
        };
        let b = EventBroadcaster::start(
            sink.clone(),
            BroadcasterConfig {
                queue_size: 3,
                ..Default::default()
            },
        );
        let r = b.new_recorder(source());
        // The writer takes the first event and blocks in the sink; 3 more fill the channel;
        // the rest are dropped. None of these calls waits.
        for i in 0..20 {
            r.event(&cm(), EventType::Normal, "Synced", &format!("message {i}"));
            tokio::task::yield_now().await;
        }
        gate.add_permits(100);
        b.shutdown().await;
        let written = sink.events.lock().len();
        assert_eq!(written, 4, "one in the writer plus a full channel of 3");
    }

    #[tokio::test]
    async fn events_recorded_after_shutdown_are_dropped() {
        let sink = MemorySink::default();
        let b = EventBroadcaster::start(sink.clone(), BroadcasterConfig::default());
        let r = b.new_recorder(source());
        b.shutdown().await;
        r.event(&cm(), EventType::Normal, "Synced", "late");
        tokio::task::yield_now().await;
        assert!(sink.events.lock().is_empty());
    }
}
