//! The seam between the requests (`list_watch.rs`) and the wires: a LIST body or a watch
//! body, decoded by the wire its response's `Content-Type` names.

use futures::{StreamExt, TryStreamExt};
use kube_client::client::Body;
use serde::de::DeserializeOwned;

use super::encoding::{DecodedList, Encoding, ListDecodeError, ProtobufType};
use super::{json_list, json_watch, protobuf_list, protobuf_watch};

use crate::cache::list_watch_error::SentWatchStream;
use crate::cache::store::TransformFunc;

/// A LIST body being decoded, in the encoding its response came in.
pub(crate) enum ListBody<K> {
    Json(json_list::ListDecoder<K>),
    Protobuf(protobuf_list::ListDecoder<K>),
}

impl<K: DeserializeOwned> ListBody<K> {
    /// A decoder for a body in `encoding` (a protobuf one needs what `protobuf` says the
    /// list holds), running `transform` on each item as it is decoded and skipping items
    /// over `max_item_bytes`; with `keep_sent`, a protobuf one keeps each item's bytes.
    pub(crate) fn new(
        encoding: Encoding,
        protobuf: Option<&ProtobufType>,
        transform: Option<TransformFunc<K>>,
        max_item_bytes: usize,
        keep_sent: bool,
    ) -> Result<Self, ListDecodeError> {
        Ok(match (encoding, protobuf) {
            (Encoding::Json, _) => Self::Json(
                json_list::ListDecoder::new()
                    .with_transform(transform)
                    .with_max_item_bytes(max_item_bytes),
            ),
            (Encoding::Protobuf, Some(of)) => Self::Protobuf(protobuf_list::ListDecoder::new(
                of.clone(),
                transform,
                max_item_bytes,
                keep_sent,
            )),
            (Encoding::Protobuf, None) => {
                return Err(ListDecodeError::Malformed {
                    offset: 0,
                    what: "JSON (the server answered protobuf, which was not asked for)",
                });
            }
        })
    }

    /// Feeds the next bytes of the body; decodes every item they complete.
    pub(crate) fn feed(&mut self, bytes: &[u8]) -> Result<(), ListDecodeError> {
        match self {
            Self::Json(d) => d.feed(bytes),
            Self::Protobuf(d) => d.feed(bytes),
        }
    }

    /// The body has ended: the items, the list metadata and the items skipped.
    pub(crate) fn finish(self) -> Result<DecodedList<K>, ListDecodeError> {
        match self {
            Self::Json(d) => d.finish(),
            Self::Protobuf(d) => d.finish(),
        }
    }
}

/// The event stream of a watch body in `encoding`; an object (line, frame) over
/// `max_object_bytes` is skipped. With `keep_sent`, a protobuf stream's initial events come
/// with the bytes their objects were sent as (a JSON stream's never do).
pub(crate) fn watch_events<K: DeserializeOwned + Send + 'static>(
    encoding: Encoding,
    body: Body,
    url: String,
    max_object_bytes: usize,
    keep_sent: bool,
) -> SentWatchStream<K> {
    match encoding {
        Encoding::Json => json_watch::watch_events(body, url, max_object_bytes)
            .map_ok(|event| (event, None))
            .boxed(),
        Encoding::Protobuf => protobuf_watch::watch_events(body, url, max_object_bytes, keep_sent),
    }
}
