//! An object the informer's type cannot decode, and the bound on one object's size: what
//! the list decoder, the watch decoder and the reflector say about an object they skip.
//!
//! client-go fails the whole LIST when one item does not decode into the typed object
//! (the list body is decoded as one value), and its watch decoder reports the event as an
//! error that ends the watch (apimachinery `watch/streamwatcher.go`), after which the
//! reflector relists and fails again: one object nobody can decode (a status field the Go
//! type requires and the CRD schema does not, removed through the status subresource, say)
//! stops every other object of the type from being served, in every namespace, for ever.
//! kubeloop does better on purpose: such an object is skipped, named in a warning and
//! counted (`kubeloop_reflector_undecodable_objects_total`), and everything else is served.
//!
//! What the cache does with a skipped object (the reflector applies this):
//! - never decoded: not served, until a later version decodes (that version is then an add
//!   for the handlers, as any object the cache did not hold);
//! - decoded before, a later version does not: the cache keeps serving the last version
//!   that decoded (stale, and counted and logged each time), in a watch and across relists
//!   alike, until a version decodes or the object is deleted. Dropping it instead would
//!   tell handlers the object was deleted, which it was not (a controller would clean up
//!   after an object that still exists);
//! - deleted: removed from the cache, with the last decodable version as the tombstone.
//!
//! After a restart, an object whose current version does not decode is not served (there
//! is no last good version to keep).
//!
//! The bound on one object ([`MAX_OBJECT_BYTES`]): client-go's streaming decoder
//! (apimachinery `pkg/runtime/serializer/streaming`, `NewDecoder`: `maxBytes: 16 * 1024 *
//! 1024`) refuses a watch frame over 16 MiB with `ErrObjectTooLarge`, which ends the watch.
//! Here a watch line or a list item over the bound is skipped like an object that does not
//! decode, named from the metadata within its first bytes, and its bytes are dropped as they
//! stream past rather than buffered.

use serde::Deserialize;
use serde::de::DeserializeOwned;

use super::json_scan::{Field, field_in_prefix};
use super::keys::object_key;
use crate::protobuf::LooseNames;

/// The largest watch line or list item decoded: client-go's streaming decoder's
/// `maxBytes` (16 MiB). etcd's default request limit (1.5 MiB) keeps real objects far below.
pub const MAX_OBJECT_BYTES: usize = 16 * 1024 * 1024;

/// The watch event an undecodable object came in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WatchEventType {
    /// `ADDED`.
    Added,
    /// `MODIFIED`.
    Modified,
    /// `DELETED`.
    Deleted,
}

impl WatchEventType {
    pub(crate) fn parse(s: &str) -> Option<Self> {
        match s {
            "ADDED" => Some(Self::Added),
            "MODIFIED" => Some(Self::Modified),
            "DELETED" => Some(Self::Deleted),
            _ => None,
        }
    }
}

/// Why an object was skipped.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UndecodableReason {
    /// The object does not fit the informer's type (the decoder's message).
    #[error("does not decode: {0}")]
    Decode(String),
    /// The object is over the size bound.
    #[error("is {size} bytes, over the bound of {limit} bytes on one object")]
    TooLarge {
        /// Its size in bytes (the watch line, or the list item).
        size: usize,
        /// The bound.
        limit: usize,
    },
}

/// An object skipped because it does not decode into the informer's type, named from its
/// metadata read loosely (only `name`, `namespace` and `resourceVersion`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{} at resourceVersion {} {reason}", self.describe_key(), self.describe_rv())]
pub struct UndecodableObject {
    /// `metadata.namespace` ("" if cluster-scoped or unreadable).
    pub namespace: String,
    /// `metadata.name` ("" if unreadable).
    pub name: String,
    /// `metadata.resourceVersion` ("" if unreadable).
    pub resource_version: String,
    /// The watch event it came in; `None` for a list item.
    pub event: Option<WatchEventType>,
    /// Why it was skipped.
    pub reason: UndecodableReason,
}

impl UndecodableObject {
    /// The cache key (`namespace/name` or `name`), if the name could be read.
    pub fn key(&self) -> Option<String> {
        (!self.name.is_empty()).then(|| object_key(&self.namespace, &self.name))
    }

    /// An object over the bound, with the size it reached once all of it went past.
    pub(crate) fn with_size(mut self, total: usize) -> Self {
        if let UndecodableReason::TooLarge { size, .. } = &mut self.reason {
            *size = total;
        }
        self
    }

    fn describe_key(&self) -> String {
        self.key()
            .map(|k| format!("object {k}"))
            .unwrap_or_else(|| "an object without a readable name".to_string())
    }

    fn describe_rv(&self) -> &str {
        if self.resource_version.is_empty() {
            "(unknown)"
        } else {
            &self.resource_version
        }
    }

    /// An object named from its protobuf message's first bytes (see `protobuf/names.rs`).
    pub(crate) fn from_names(
        names: LooseNames,
        event: Option<WatchEventType>,
        reason: UndecodableReason,
    ) -> Self {
        Self::new(
            LooseMeta {
                name: names.name,
                namespace: names.namespace,
                resource_version: names.resource_version,
            },
            event,
            reason,
        )
    }

    fn new(meta: LooseMeta, event: Option<WatchEventType>, reason: UndecodableReason) -> Self {
        Self {
            namespace: meta.namespace.unwrap_or_default(),
            name: meta.name.unwrap_or_default(),
            resource_version: meta.resource_version.unwrap_or_default(),
            event,
            reason,
        }
    }
}

/// The metadata fields read from an object that does not decode.
#[derive(Debug, Default, Deserialize)]
struct LooseMeta {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    namespace: Option<String>,
    #[serde(default, rename = "resourceVersion")]
    resource_version: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
struct LooseObject {
    #[serde(default)]
    metadata: LooseMeta,
}

#[derive(Debug, Deserialize)]
struct LooseEvent {
    #[serde(rename = "type")]
    type_: String,
    #[serde(default)]
    object: LooseObject,
}

/// Decodes one list item; if it does not decode, what the skip names.
pub(crate) fn decode_item<K: DeserializeOwned>(bytes: &[u8]) -> Result<K, UndecodableObject> {
    serde_json::from_slice(bytes).map_err(|e| {
        let meta = serde_json::from_slice::<LooseObject>(bytes)
            .map(|o| o.metadata)
            .unwrap_or_default();
        UndecodableObject::new(meta, None, UndecodableReason::Decode(e.to_string()))
    })
}

/// A watch line that did not decode as an event: the object it carries, if the line is an
/// `ADDED`, `MODIFIED` or `DELETED` event of an object with a readable name (anything else
/// is not an object to skip but a broken stream).
pub(crate) fn undecodable_event(
    line: &[u8],
    error: &serde_json::Error,
) -> Option<UndecodableObject> {
    let loose: LooseEvent = serde_json::from_slice(line).ok()?;
    let event = WatchEventType::parse(&loose.type_)?;
    let meta = loose.object.metadata;
    meta.name.as_ref().filter(|n| !n.is_empty())?;
    Some(UndecodableObject::new(
        meta,
        Some(event),
        UndecodableReason::Decode(error.to_string()),
    ))
}

/// A list item over the bound, named from the metadata within its first `limit` bytes (of
/// `prefix`, which holds at least those once the item crossed the bound): exactly those, so the
/// name does not depend on how many more bytes had arrived when the reader saw it cross.
pub(crate) fn oversized_item(prefix: &[u8], size: usize, limit: usize) -> UndecodableObject {
    let prefix = &prefix[..prefix.len().min(limit)];
    UndecodableObject::new(
        meta_in_prefix(prefix),
        None,
        UndecodableReason::TooLarge { size, limit },
    )
}

/// A watch line over the bound, named from the event type and metadata within its first
/// `limit` bytes (as [`oversized_item`]).
pub(crate) fn oversized_event(prefix: &[u8], size: usize, limit: usize) -> UndecodableObject {
    let prefix = &prefix[..prefix.len().min(limit)];
    let event = match field_in_prefix(prefix, b"type") {
        Some(Field::Complete(t)) => serde_json::from_slice::<String>(t)
            .ok()
            .and_then(|t| WatchEventType::parse(&t)),
        _ => None,
    };
    let meta = field_in_prefix(prefix, b"object")
        .map(|o| meta_in_prefix(o.bytes()))
        .unwrap_or_default();
    // A line whose type cannot be read is taken for a change (the cache keeps what it has).
    UndecodableObject::new(
        meta,
        Some(event.unwrap_or(WatchEventType::Modified)),
        UndecodableReason::TooLarge { size, limit },
    )
}

fn meta_in_prefix(prefix: &[u8]) -> LooseMeta {
    let Some(field) = field_in_prefix(prefix, b"metadata") else {
        return LooseMeta::default();
    };
    if let Field::Complete(m) = field {
        if let Ok(meta) = serde_json::from_slice(m) {
            return meta;
        }
    }
    // The metadata runs past the prefix (a large annotation, say), or does not decode whole (a
    // field of the wrong type): its fields one by one. A built-in type's name, namespace and
    // resourceVersion come first, so they are within it; a custom object's metadata keys come
    // sorted, after annotations and managedFields, which the real bound (16 MiB, annotations
    // capped at 256 KiB) still leaves in reach.
    let m = field.bytes();
    let string = |name: &[u8]| match field_in_prefix(m, name) {
        Some(Field::Complete(v)) => serde_json::from_slice(v).ok(),
        _ => None,
    };
    LooseMeta {
        name: string(b"name"),
        namespace: string(b"namespace"),
        resource_version: string(b"resourceVersion"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;

    #[test]
    fn an_item_that_does_not_decode_is_named_from_its_metadata() {
        let bad =
            br#"{"metadata":{"name":"a","namespace":"ns","resourceVersion":"7"},"data":{"k":1}}"#;
        let u = decode_item::<ConfigMap>(bad).unwrap_err();
        assert_eq!(u.key().as_deref(), Some("ns/a"));
        assert_eq!(u.resource_version, "7");
        let text = u.to_string();
        assert!(
            text.starts_with("object ns/a at resourceVersion 7 does not decode: invalid type"),
            "{text}"
        );
        let nameless = decode_item::<ConfigMap>(br#"{"metadata":7}"#).unwrap_err();
        assert_eq!(nameless.key(), None);
        assert!(nameless.to_string().contains("without a readable name"));
    }

    #[test]
    fn an_oversized_item_whose_metadata_runs_past_its_first_bytes_is_named_from_them() {
        let prefix = br#"{"apiVersion":"v1","metadata":{"name":"big","namespace":"ns","resourceVersion":"9","annotations":{"a":"xxxx"#;
        let u = oversized_item(prefix, 8834, 4096);
        assert_eq!(
            (u.key().as_deref(), u.resource_version.as_str()),
            (Some("ns/big"), "9")
        );
    }

    #[test]
    fn an_oversized_item_is_named_from_its_first_limit_bytes_field_by_field_if_need_be() {
        // Whole metadata that does not decode (namespace a number) is read field by field.
        let item = br#"{"metadata":{"name":"big","resourceVersion":"9","namespace":5},"data":{}}"#;
        let u = oversized_item(item, item.len(), 64);
        assert_eq!(
            (u.key().as_deref(), u.resource_version.as_str()),
            (Some("big"), "9")
        );
        // A name past the first `limit` bytes is not read, however many bytes are at hand.
        let u = oversized_item(item, item.len(), 20);
        assert_eq!(u.key(), None);
    }

    #[test]
    fn an_oversized_event_is_named_from_its_first_bytes() {
        let prefix = br#"{"type":"DELETED","object":{"metadata":{"name":"big","resourceVersion":"9"},"data":{"k":"xxxx"#;
        let u = oversized_event(prefix, 100, 90);
        assert_eq!(u.event, Some(WatchEventType::Deleted));
        assert_eq!(
            (u.key().as_deref(), u.resource_version.as_str()),
            (Some("big"), "9")
        );
        assert_eq!(
            u.to_string(),
            "object big at resourceVersion 9 is 100 bytes, over the bound of 90 bytes on one object"
        );
    }
}
