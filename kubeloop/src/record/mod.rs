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
//! A controller calls [`EventRecorder::event`] from its sync loop; the call only puts the event
//! on a bounded channel (dropped and logged when full, as client-go's broadcaster does) and a
//! background task correlates repeats and writes core/v1 Events, so recording never blocks
//! the sync loop.

mod broadcaster;
mod correlator;
mod sink;

pub use broadcaster::{
    BroadcasterConfig, EventBroadcaster, EventRecorder, EventSource, EventType, object_reference,
};
pub use correlator::{CorrelatorConfig, EventCorrelator, Write};
pub use sink::{EventSink, KubeEventSink, RecordError};
