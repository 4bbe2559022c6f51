//! One recorder whichever Events API the apiserver serves: events.k8s.io/v1 (`series.rs`) when
//! it is served, core/v1 (`broadcaster.rs`) when it is not, chosen once at start by
//! discovery. client-go: `tools/events.NewEventBroadcasterAdapterWithContext` (it asks
//! discovery for `events.k8s.io/v1` the same way and keeps a core broadcaster as the
//! fallback), with `tools/record`'s `EventRecorderAdapter` mapping an event to core/v1: the
//! note becomes the message; the action and the related object are not sent.

use k8s_openapi::api::core::v1::ObjectReference;

use super::broadcaster::{EventBroadcaster, EventRecorder, EventType, object_reference};
use super::series::{EventsV1Broadcaster, EventsV1Config, EventsV1Recorder};
use super::sink::KubeEventsV1Sink;
use kube_client::Resource;

/// The broadcaster behind an [`AnyEventRecorder`]; shut it down when the controller stops.
pub enum AnyEventBroadcaster {
    /// events.k8s.io/v1.
    V1(EventsV1Broadcaster),
    /// core/v1, when events.k8s.io/v1 is not served.
    Core(EventBroadcaster),
}

/// Records on events.k8s.io/v1 or, where that is not served, on core/v1. Cheap to clone.
#[derive(Clone)]
pub enum AnyEventRecorder {
    /// events.k8s.io/v1, with series.
    V1(EventsV1Recorder),
    /// core/v1, with counts.
    Core(EventRecorder),
}

impl AnyEventBroadcaster {
    /// Asks the apiserver whether it serves events.k8s.io/v1 and starts the broadcaster for
    /// what it serves (the default settings), with a recorder reporting as
    /// `reporting_controller` from `reporting_instance`. A fallback to core/v1 is logged once.
    pub async fn discover(
        client: kube_client::Client,
        reporting_controller: &str,
        reporting_instance: &str,
    ) -> (Self, AnyEventRecorder) {
        match client.list_api_group_resources("events.k8s.io/v1").await {
            Ok(list) if list.resources.iter().any(|r| r.name == "events") => {
                let broadcaster = EventsV1Broadcaster::start(
                    KubeEventsV1Sink::new(client),
                    EventsV1Config::default(),
                );
                let recorder =
                    broadcaster.new_recorder_as(reporting_controller, reporting_instance);
                (Self::V1(broadcaster), AnyEventRecorder::V1(recorder))
            }
            answer => {
                let why = match answer {
                    Ok(_) => "it lists no events resource".to_owned(),
                    Err(e) => e.to_string(),
                };
                tracing::info!(
                    reason = %why,
                    "the apiserver does not serve events.k8s.io/v1: recording core/v1 Events"
                );
                let (broadcaster, recorder) =
                    EventBroadcaster::for_component(client, reporting_controller);
                (Self::Core(broadcaster), AnyEventRecorder::Core(recorder))
            }
        }
    }

    /// Writes what is queued and stops. See each broadcaster's `shutdown`.
    pub async fn shutdown(&self) {
        match self {
            Self::V1(b) => b.shutdown().await,
            Self::Core(b) => b.shutdown().await,
        }
    }
}

impl AnyEventRecorder {
    /// Records that `action` was taken on `regarding` (with `related` involved) for `reason`,
    /// `note` saying more (on core/v1: the note as the message, without the action and the
    /// related object).
    pub fn event<K>(
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
        self.event_for(
            object_reference(regarding),
            related,
            event_type,
            reason,
            action,
            note,
        );
    }

    /// [`event`](Self::event) about the object `regarding` points at.
    pub fn event_for(
        &self,
        regarding: ObjectReference,
        related: Option<ObjectReference>,
        event_type: EventType,
        reason: &str,
        action: &str,
        note: &str,
    ) {
        match self {
            Self::V1(r) => r.eventf_for(regarding, related, event_type, reason, action, note),
            Self::Core(r) => r.event_for(regarding, event_type, reason, note),
        }
    }

    /// Whether events go to events.k8s.io/v1.
    pub fn is_v1(&self) -> bool {
        matches!(self, Self::V1(_))
    }
}
