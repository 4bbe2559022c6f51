//! What the two wires share: which one a response is in ([`Encoding`], read from its
//! `Content-Type`), which one a [`ListWatch`](crate::cache::ListWatch) asks for ([`Wire`]), a
//! decoded LIST and its errors, and how a watch body is read.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ListMeta;

use std::any::TypeId;

use kube_client::Resource;

use crate::cache::UndecodableObject;
use crate::cache::list_watch_error::ListWatchError;
use crate::cache::stored::SentBytes;
use crate::protobuf::{self, DecodeError, ObjectType};

/// The annotation on the bookmark that ends a streaming list's initial events.
pub const INITIAL_EVENTS_END_ANNOTATION: &str = "k8s.io/initial-events-end";

/// Which encoding a [`ListWatch`](crate::cache::ListWatch) asks the apiserver for.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Wire {
    /// client-go's defaults: protobuf for the built-in types (its typed clients since v0.32,
    /// `gentype`'s `PrefersProtobuf`) and for metadata-only lists and watches of any resource
    /// (its `metadata` client); JSON for custom resources and dynamic objects. JSON is
    /// accepted from a server that does not speak protobuf (an aggregated API, say): the
    /// decoder follows each response's `Content-Type`.
    #[default]
    Auto,
    /// JSON only: to read the wire as text while learning, or through a proxy that rewrites
    /// bodies.
    Json,
}

/// The encoding of one response body, from its `Content-Type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Encoding {
    Json,
    Protobuf,
}

impl Encoding {
    /// `application/vnd.kubernetes.protobuf` (with any parameters, `;stream=watch` for a
    /// watch) is protobuf; anything else is read as JSON, as client-go's rest client falls
    /// back to its JSON decoder.
    pub(crate) fn of(content_type: Option<&http::HeaderValue>) -> Self {
        let is_protobuf = content_type
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split(';').next())
            .is_some_and(|media| media.trim().eq_ignore_ascii_case(protobuf::CONTENT_TYPE));
        if is_protobuf {
            Self::Protobuf
        } else {
            Self::Json
        }
    }
}

/// What a protobuf list or watch of one type is made of.
#[derive(Debug, Clone)]
pub(crate) struct ProtobufType {
    /// The items' message.
    pub item: ObjectType,
    /// The items' `apiVersion` and `kind`, which a list's items do not carry.
    pub item_type: [String; 2],
    /// The list's kind, which the envelope must name (`ConfigMapList`).
    pub list_kind: String,
    /// The `apiVersion` and `kind` a list item is shown with, as the JSON of a list's items
    /// has them: none for a typed object, `PartialObjectMetadata`'s for metadata only.
    pub item_type_meta: Option<[String; 2]>,
}

impl ProtobufType {
    /// How `K` is read in protobuf under client-go's defaults, or `None` if it is read as
    /// JSON: a metadata-only type always in protobuf (`PartialObjectMetadata`, which every
    /// resource serves, custom ones too); a typed object (`DynamicType = ()`) of a kind the
    /// table knows in protobuf; a custom resource (not in the table) and a `DynamicObject`
    /// (client-go's dynamic client speaks JSON) as JSON.
    pub(crate) fn of<K: Resource<DynamicType: 'static>>(dyntype: &K::DynamicType) -> Option<Self> {
        if K::metadata_api() {
            const API_VERSION: &str = "meta.k8s.io/v1";
            const KIND: &str = "PartialObjectMetadata";
            return Some(Self {
                item: ObjectType::of(API_VERSION, KIND)?,
                item_type: [API_VERSION.to_string(), KIND.to_string()],
                list_kind: format!("{KIND}List"),
                item_type_meta: Some([API_VERSION.to_string(), KIND.to_string()]),
            });
        }
        if TypeId::of::<K::DynamicType>() != TypeId::of::<()>() {
            return None;
        }
        let (api_version, kind) = (K::api_version(dyntype), K::kind(dyntype));
        Some(Self {
            item: ObjectType::of(&api_version, &kind)?,
            list_kind: format!("{kind}List"),
            item_type: [api_version.into_owned(), kind.into_owned()],
            item_type_meta: None,
        })
    }
}

/// A LIST body that is not a well-formed `*List` object.
#[derive(Debug, thiserror::Error)]
pub enum ListDecodeError {
    /// The bytes are not the JSON shape of a list.
    #[error("malformed LIST body at byte {offset}: {what}")]
    Malformed {
        /// Offset in the whole body.
        offset: usize,
        /// What was expected.
        what: &'static str,
    },
    /// The list metadata did not decode (an item that does not decode is skipped, never
    /// an error).
    #[error("LIST body: {what} does not decode: {source}")]
    Item {
        /// `metadata`.
        what: String,
        /// The decoder error.
        #[source]
        source: serde_json::Error,
    },
    /// A protobuf LIST body that is malformed or whose metadata does not decode (an item
    /// that does not decode is skipped, never an error).
    #[error("LIST body: {0}")]
    Protobuf(#[from] DecodeError),
    /// The body ended inside the list.
    #[error("LIST body ended before the list was complete ({len} bytes read)")]
    Truncated {
        /// Bytes read.
        len: usize,
    },
}

/// A decoded LIST body.
#[derive(Debug)]
pub(crate) struct DecodedList<K> {
    /// The items that decoded, in list order.
    pub items: Vec<K>,
    /// The list's metadata (resourceVersion, continue).
    pub metadata: ListMeta,
    /// The items skipped: not decodable into `K`, or over the size bound.
    pub undecodable: Vec<UndecodableObject>,
    /// The bytes each item was sent as, in item order, when asked for (a protobuf list with
    /// no transform); else empty.
    pub sent: Vec<SentBytes>,
}

/// What reading a watch body's next chunk gave.
pub(crate) enum Chunk<D> {
    /// More bytes.
    Bytes(D),
    /// The body ended: closed, or cut the way watch streams end.
    End,
    /// A read failure, to report before the stream ends.
    Failed(ListWatchError),
}

/// The next chunk of the watch body of `url`, as both wires read it.
pub(crate) async fn next_chunk<S, D>(body: &mut S, url: &str) -> Chunk<D>
where
    S: futures::Stream<Item = Result<D, kube_client::Error>> + Unpin,
{
    match futures::StreamExt::next(body).await {
        Some(Ok(bytes)) => Chunk::Bytes(bytes),
        None => Chunk::End,
        Some(Err(e)) if ends_cleanly(&e) => {
            tracing::debug!(%url, "watch stream ended: {e}");
            Chunk::End
        }
        Some(Err(e)) => Chunk::Failed(ListWatchError::Transport {
            verb: "WATCH",
            url: url.to_string(),
            source: kube_client::Error::ReadEvents(std::io::Error::other(e)),
        }),
    }
}

/// A read failure that is how watch streams end: the connection closed mid-chunk (kube-client
/// treats an `UnexpectedEof` anywhere in the chain, or hyper's "unexpected EOF during chunk",
/// as a resumable end) or a client read timeout.
fn ends_cleanly(err: &kube_client::Error) -> bool {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = cur {
        if let Some(io) = e.downcast_ref::<std::io::Error>()
            && matches!(
                io.kind(),
                std::io::ErrorKind::UnexpectedEof | std::io::ErrorKind::TimedOut
            )
        {
            return true;
        }
        if e.to_string().contains("unexpected EOF during chunk") {
            return true;
        }
        cur = e.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_content_type_names_the_encoding() {
        let of = |v: &'static str| Encoding::of(Some(&http::HeaderValue::from_static(v)));
        assert_eq!(
            of("application/vnd.kubernetes.protobuf"),
            Encoding::Protobuf
        );
        assert_eq!(
            of("application/vnd.kubernetes.protobuf;stream=watch"),
            Encoding::Protobuf
        );
        assert_eq!(of("application/json"), Encoding::Json);
        assert_eq!(of("application/json;stream=watch"), Encoding::Json);
        assert_eq!(Encoding::of(None), Encoding::Json);
    }
}
