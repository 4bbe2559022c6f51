//! Where events are written: client-go `tools/record`'s `EventSink` interface and the
//! `EventSinkImpl` over `CoreV1().Events(ns)`; and `tools/events`' `EventSink` over
//! `EventsV1().Events(ns)`.
//!
//! [`KubeEventSink`] creates core/v1 Events and patches a repeat's `count`, `lastTimestamp`
//! and `message` with a JSON merge patch (client-go sends a strategic merge patch of the same
//! three fields; for these scalar fields the two are the same). [`KubeEventsV1Sink`] creates
//! events.k8s.io/v1 Events and patches a series with a strategic merge patch of `series`
//! alone, the patch client-go computes (`createPatchBytesForSeries`).
//!
//! Creates of either API go as protobuf ([`WriteApi`]), as client-go's typed Event clients
//! send them; the patches stay JSON, as client-go's do.

use std::future::Future;

use k8s_openapi::api::core::v1::Event;
use k8s_openapi::api::events::v1::Event as V1Event;
use kube_client::api::{ObjectMeta, Patch, PatchParams};
use kube_client::core::{NamespaceResourceScope, Request};
use kube_client::{Client, Resource};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::client::WriteApi;

/// Why an Event could not be written.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    /// The Event to patch no longer exists (expired after the apiserver's event TTL, or
    /// deleted); the writer creates it afresh.
    #[error("event {namespace}/{name} to patch no longer exists")]
    NotFound {
        /// The Event's namespace.
        namespace: String,
        /// The Event's name.
        name: String,
    },
    /// The apiserver refused the write (invalid, forbidden, namespace terminating...). Not
    /// retried, as client-go does not retry `StatusError`s.
    #[error("apiserver refused event {namespace}/{name}: {source}")]
    Rejected {
        /// The Event's namespace.
        namespace: String,
        /// The Event's name.
        name: String,
        /// The apiserver's answer.
        #[source]
        source: kube_client::Error,
    },
    /// The Event cannot be put in a request (the protobuf encoder refuses one of its
    /// fields): nothing was sent, and sending it again cannot help, so it is not retried.
    #[error("event {namespace}/{name} cannot be written: {source}")]
    Unwritable {
        /// The Event's namespace.
        namespace: String,
        /// The Event's name.
        name: String,
        /// The encoder's error, naming the kind and the field.
        #[source]
        source: kube_client::Error,
    },
    /// The request did not get an answer (connection refused, timeout): worth retrying.
    #[error("writing event {namespace}/{name} failed: {source}")]
    Transport {
        /// The Event's namespace.
        namespace: String,
        /// The Event's name.
        name: String,
        /// The client error.
        #[source]
        source: kube_client::Error,
    },
}

impl RecordError {
    /// Whether trying again later may succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(self, RecordError::Transport { .. })
    }

    /// Whether the apiserver answered that the Event exists already (409 AlreadyExists).
    pub fn is_already_exists(&self) -> bool {
        matches!(self, RecordError::Rejected { source: kube_client::Error::Api(status), .. }
            if status.code == 409 && status.reason == "AlreadyExists")
    }

    fn from_kube(meta: &ObjectMeta, source: kube_client::Error) -> Self {
        let namespace = meta.namespace.clone().unwrap_or_default();
        let name = meta.name.clone().unwrap_or_default();
        match &source {
            kube_client::Error::Api(status) if status.code == 404 => {
                RecordError::NotFound { namespace, name }
            }
            kube_client::Error::Api(_) => RecordError::Rejected {
                namespace,
                name,
                source,
            },
            kube_client::Error::BuildRequest(_) => RecordError::Unwritable {
                namespace,
                name,
                source,
            },
            _ => RecordError::Transport {
                namespace,
                name,
                source,
            },
        }
    }
}

/// Writes Events. Implemented by [`KubeEventSink`]; tests use an in-memory sink.
pub trait EventSink: Send + Sync + 'static {
    /// Creates `event`, returning what the apiserver stored.
    fn create(&self, event: &Event) -> impl Future<Output = Result<Event, RecordError>> + Send;
    /// Patches the Event named in `event.metadata` with `event`'s count, lastTimestamp and
    /// message.
    fn patch(&self, event: &Event) -> impl Future<Output = Result<Event, RecordError>> + Send;
}

/// An [`EventSink`] writing core/v1 Events through the apiserver.
#[derive(Clone)]
pub struct KubeEventSink {
    client: Client,
    creates: WriteApi<Event>,
}

impl KubeEventSink {
    /// A sink over `client`.
    pub fn new(client: Client) -> Self {
        KubeEventSink {
            creates: WriteApi::new(client.clone()),
            client,
        }
    }
}

impl EventSink for KubeEventSink {
    async fn create(&self, event: &Event) -> Result<Event, RecordError> {
        self.creates
            .create(&to_create(event))
            .await
            .map_err(|e| RecordError::from_kube(&event.metadata, e))
    }

    async fn patch(&self, event: &Event) -> Result<Event, RecordError> {
        let patch = serde_json::json!({
            "count": event.count,
            "lastTimestamp": event.last_timestamp,
            "message": event.message,
        });
        self.client
            .request(patch_request(event, &Patch::Merge(patch))?)
            .await
            .map_err(|e| RecordError::from_kube(&event.metadata, e))
    }
}

/// An Event of either API (core/v1 or events.k8s.io/v1), as the apiserver stores it.
trait EventKind:
    Resource<Scope = NamespaceResourceScope, DynamicType = ()>
    + Clone
    + Serialize
    + DeserializeOwned
    + std::fmt::Debug
{
}

impl<K> EventKind for K where
    K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>
        + Clone
        + Serialize
        + DeserializeOwned
        + std::fmt::Debug
{
}

/// `event` as it is created: in its namespace (`default` if it names none), without a
/// resourceVersion.
fn to_create<K: EventKind>(event: &K) -> K {
    let mut fresh = event.clone();
    let meta = fresh.meta_mut();
    meta.resource_version = None;
    if meta.namespace.as_deref().is_none_or(str::is_empty) {
        meta.namespace = Some("default".to_string());
    }
    fresh
}

/// The request patching the Event named in `event`'s metadata with `patch`.
fn patch_request<K: EventKind>(
    event: &K,
    patch: &Patch<serde_json::Value>,
) -> Result<http::Request<Vec<u8>>, RecordError> {
    let meta = event.meta();
    let namespace = meta.namespace.as_deref().unwrap_or("default");
    let name = meta.name.as_deref().unwrap_or_default();
    Request::new(K::url_path(&(), Some(namespace)))
        .patch(name, &PatchParams::default(), patch)
        .map_err(|e| RecordError::from_kube(meta, kube_client::Error::BuildRequest(e)))
}

/// Writes events.k8s.io/v1 Events. Implemented by [`KubeEventsV1Sink`]; tests use an
/// in-memory sink. client-go: `tools/events.EventSink`.
///
/// Differs on purpose: a write returns nothing of what the apiserver stored. client-go's sink
/// returns the stored Event, and its recorder drops it ("We don't want the new recorded Event
/// to be reflected in the client's cache", `recordToSink` in tools/events); here the answer's
/// body is not even decoded.
pub trait EventsV1Sink: Send + Sync + 'static {
    /// Creates `event`.
    fn create(&self, event: &V1Event) -> impl Future<Output = Result<(), RecordError>> + Send;
    /// Patches the `series` of the Event named in `event.metadata` to `event`'s.
    fn patch_series(&self, event: &V1Event)
    -> impl Future<Output = Result<(), RecordError>> + Send;
}

/// An [`EventsV1Sink`] writing through the apiserver. client-go: `tools/events.EventSinkImpl`.
#[derive(Clone)]
pub struct KubeEventsV1Sink {
    client: Client,
    creates: WriteApi<V1Event>,
}

impl KubeEventsV1Sink {
    /// A sink over `client`.
    pub fn new(client: Client) -> Self {
        KubeEventsV1Sink {
            creates: WriteApi::new(client.clone()),
            client,
        }
    }
}

impl EventsV1Sink for KubeEventsV1Sink {
    async fn create(&self, event: &V1Event) -> Result<(), RecordError> {
        self.creates
            .create_unread(&to_create(event))
            .await
            .map_err(|e| RecordError::from_kube(&event.metadata, e))
    }

    async fn patch_series(&self, event: &V1Event) -> Result<(), RecordError> {
        let patch = serde_json::json!({ "series": event.series });
        self.client
            .request_text(patch_request(event, &Patch::Strategic(patch))?)
            .await
            .map(drop)
            .map_err(|e| RecordError::from_kube(&event.metadata, e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_event_the_encoder_refuses_is_not_retried_and_a_cut_connection_is() {
        let meta = ObjectMeta {
            namespace: Some("default".into()),
            name: Some("e".into()),
            ..Default::default()
        };
        let unwritable = RecordError::from_kube(
            &meta,
            kube_client::Error::BuildRequest(kube_client::core::request::Error::SerializeBody(
                serde::ser::Error::custom("core/v1 Event: at count: out of range"),
            )),
        );
        assert!(
            matches!(unwritable, RecordError::Unwritable { .. }) && !unwritable.is_retryable(),
            "{unwritable:?}"
        );
        assert!(
            unwritable
                .to_string()
                .contains("default/e cannot be written")
        );
        let cut = RecordError::from_kube(
            &meta,
            kube_client::Error::Service("connection reset".into()),
        );
        assert!(cut.is_retryable(), "{cut:?}");
    }
}
