//! What the events.k8s.io/v1 recorder counts (`series.rs`): the events it dropped, by why,
//! and the writes it sent, by verb. No client-go counterpart (`tools/events` counts nothing;
//! its source has a TODO for a count of recording attempts).
//!
//! Like the workqueue's `MetricsProvider`, an [`EventMetrics`] is a set of families the binary
//! registers in its registry; [`EventMetrics::global`] is the process-wide one a broadcaster
//! reports to unless its config names another.

use std::sync::OnceLock;

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

/// Why the events.k8s.io/v1 recorder did not write an event (the `reason` label).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum EventDropReason {
    /// 1,000 events were waiting already.
    queue_full,
    /// Its object's budget was spent (a new Event, not a repeat).
    spam,
    /// The apiserver refused it.
    refused,
    /// The apiserver could not be reached in the tries allowed.
    unreachable,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: EventDropReason,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VerbLabel {
    verb: &'static str,
}

/// The recorder's counters: `kubeloop_events_dropped_total{reason}` and
/// `kubeloop_event_writes_total{verb}` (`create`, `patch`).
#[derive(Clone, Debug, Default)]
pub struct EventMetrics {
    dropped: Family<ReasonLabel, Counter>,
    writes: Family<VerbLabel, Counter>,
}

impl EventMetrics {
    /// The process-wide families; register them once in the process's registry.
    pub fn global() -> &'static EventMetrics {
        static GLOBAL: OnceLock<EventMetrics> = OnceLock::new();
        GLOBAL.get_or_init(EventMetrics::default)
    }

    /// Registers both families in `registry`.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "kubeloop_events_dropped",
            "Events the events.k8s.io/v1 recorder did not write, by why: queue_full, spam (the \
             object's budget was spent), refused, unreachable",
            self.dropped.clone(),
        );
        registry.register(
            "kubeloop_event_writes",
            "Writes the events.k8s.io/v1 recorder sent to the apiserver, by verb",
            self.writes.clone(),
        );
    }

    pub(super) fn dropped(&self, reason: EventDropReason) {
        self.dropped.get_or_create(&ReasonLabel { reason }).inc();
    }

    pub(super) fn wrote(&self, verb: &'static str) {
        self.writes.get_or_create(&VerbLabel { verb }).inc();
    }

    /// Events dropped for `reason` so far.
    pub fn dropped_for(&self, reason: EventDropReason) -> u64 {
        self.dropped.get_or_create(&ReasonLabel { reason }).get()
    }

    /// Writes sent with `verb` (`create` or `patch`) so far.
    pub fn writes_for(&self, verb: &'static str) -> u64 {
        self.writes.get_or_create(&VerbLabel { verb }).get()
    }
}
