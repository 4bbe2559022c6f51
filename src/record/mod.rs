//! Events for `kubectl describe`: client-go's `tools/record`.
//!
//! | kubeloop                  | client-go `tools/record`                               |
//! |---------------------------|--------------------------------------------------------|
//! | [`EventRecorder`]         | `EventRecorder` (`recorder.Event`, `Eventf`)           |
//! | [`EventBroadcaster`]      | `EventBroadcaster` + `StartRecordingToSink`            |
//! | [`EventCorrelator`]       | `events_cache.go`: `EventCorrelator`, `eventLogger`,   |
//! |                           | `EventSourceObjectSpamFilter`                          |
//! | [`EventSink`]             | `EventSink` (`typed/core/v1.EventSinkImpl`)            |
//!
//! And events.k8s.io/v1, client-go's `tools/events` (`series.rs`, whose docs say what it
//! keeps and adds): [`EventsV1Broadcaster`], [`EventsV1Recorder`] (`eventf(regarding, related,
//! type, reason, action, note)`), [`EventsV1Sink`], repeats merged into one Event's `series`,
//! with `tools/record`'s per-object spam budget carried over ([`EventMetrics`] counts drops).
//! [`AnyEventBroadcaster::discover`] picks events.k8s.io/v1 when the apiserver serves it and
//! core/v1 otherwise (client-go: `NewEventBroadcasterAdapter`).
//!
//! A controller calls [`EventRecorder::event`] from its sync loop; the call only puts the event
//! on a bounded channel (dropped and logged when full, as client-go's broadcaster does) and a
//! background task correlates repeats and writes core/v1 Events, so recording never blocks
//! the sync loop.

mod adapter;
mod broadcaster;
mod correlator;
mod metrics;
mod series;
mod sink;
mod spam;

pub use adapter::{AnyEventBroadcaster, AnyEventRecorder};
pub use broadcaster::{
    BroadcasterConfig, EventBroadcaster, EventRecorder, EventSource, EventType, object_reference,
};
pub use correlator::{CorrelatorConfig, EventCorrelator, Write};
pub use metrics::{EventDropReason, EventMetrics};
pub use series::{
    EventsV1Broadcaster, EventsV1Config, EventsV1Recorder, NOTE_LENGTH_LIMIT,
    default_reporting_instance,
};
pub use sink::{EventSink, EventsV1Sink, KubeEventSink, KubeEventsV1Sink, RecordError};
