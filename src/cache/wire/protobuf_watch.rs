//! Protobuf watch streams: 4-byte length-delimited `WatchEvent` frames
//! (`application/vnd.kubernetes.protobuf;stream=watch`; see `protobuf/watch.rs`), decoded
//! with the same rules as the JSON stream (`json_watch.rs`):
//!
//! - a whole frame that is not a watch event is a [`ListWatchError::Decode`], and the
//!   reflector ends the watch (apimachinery's `StreamWatcher`);
//! - an `ADDED`, `MODIFIED` or `DELETED` event whose object does not decode into `K`, and a
//!   frame over the bound (named from its first bytes, then dropped as it streams past, never
//!   held whole), are a [`ListWatchError::Undecodable`], and the stream goes on;
//! - the body ending ends the stream; a frame cut off by the close is dropped.
//!
//! Asked to, the stream hands out with each initial event of a streaming list the bytes its
//! object was sent as ([`SentBytes`]), for a compact store to keep instead of encoding the
//! decoded object again; it stops at the bookmark that ends the initial events, since later
//! events reach the store through the queue, which carries objects only.

use futures::StreamExt;
use http_body_util::BodyExt;
use kube_client::client::Body;
use kube_client::core::WatchEvent;
use serde::de::DeserializeOwned;

use super::encoding::{Chunk, INITIAL_EVENTS_END_ANNOTATION, next_chunk};
use crate::cache::list_watch_error::{ListWatchError, SentWatchStream};
use crate::cache::stored::SentBytes;
use crate::cache::undecodable::{UndecodableObject, UndecodableReason, WatchEventType};
use crate::protobuf::{DecodeError, Frames, LooseNames, RawWatchEvent};

/// How much of a frame over the bound is read to name its object: its metadata comes first.
const OVERSIZED_PREFIX: usize = 4096;

/// The event stream of a protobuf watch body; with `keep_sent`, the initial events come with
/// the bytes their objects were sent as.
pub(super) fn watch_events<K: DeserializeOwned + Send + 'static>(
    body: Body,
    url: String,
    max_frame_bytes: usize,
    keep_sent: bool,
) -> SentWatchStream<K> {
    watch_events_of_chunks(body.into_data_stream(), url, max_frame_bytes, keep_sent)
}

/// [`watch_events`] over the body's chunks as they arrive.
pub(super) fn watch_events_of_chunks<K, S, D>(
    chunks: S,
    url: String,
    max_frame_bytes: usize,
    keep_sent: bool,
) -> SentWatchStream<K>
where
    K: DeserializeOwned + Send + 'static,
    S: futures::Stream<Item = Result<D, kube_client::Error>> + Send + Unpin + 'static,
    D: AsRef<[u8]>,
{
    /// Invariant: while `oversized` is set, the frame it names is being dropped, and its
    /// count is of that frame's bytes still to come.
    struct Stream<S> {
        body: S,
        frames: Frames,
        ended: bool,
        url: String,
        max_frame_bytes: usize,
        oversized: Option<(UndecodableObject, usize)>,
        /// Whether objects still come with their bytes: until the initial events end.
        keep_sent: bool,
    }
    let stream = Stream {
        body: chunks,
        frames: Frames::new(),
        ended: false,
        url,
        max_frame_bytes,
        oversized: None,
        keep_sent,
    };
    futures::stream::unfold(stream, |mut st| async move {
        loop {
            if let Some((_, to_come)) = &mut st.oversized {
                let n = (*to_come).min(st.frames.pending());
                st.frames.discard(n);
                *to_come -= n;
                if *to_come == 0 {
                    let (skip, _) = st.oversized.take().expect("set just above");
                    let err = ListWatchError::Undecodable {
                        verb: "WATCH",
                        url: st.url.clone(),
                        object: Box::new(skip),
                    };
                    return Some((Err(err), st));
                }
            } else if let Some(len) = st.frames.next_len().filter(|&n| n > st.max_frame_bytes) {
                let frame = &st.frames.unread()[4..];
                let named_from = len.min(OVERSIZED_PREFIX);
                if frame.len() >= named_from {
                    // Named from exactly that many bytes, never from the frames after it.
                    let skip = oversized_frame(&frame[..named_from], len, st.max_frame_bytes);
                    st.oversized = Some((skip, len + 4));
                    continue;
                }
            } else if let Some(frame) = st.frames.next_frame() {
                let event = decode_frame(frame, &st.url, st.keep_sent);
                if let Ok((WatchEvent::Bookmark(b), _)) = &event
                    && b.metadata
                        .annotations
                        .contains_key(INITIAL_EVENTS_END_ANNOTATION)
                {
                    st.keep_sent = false;
                }
                return Some((event, st));
            }
            if st.ended {
                // A frame cut off by the close is dropped.
                return None;
            }
            match next_chunk(&mut st.body, &st.url).await {
                Chunk::Bytes(chunk) => st.frames.push(chunk.as_ref()),
                Chunk::End => st.ended = true,
                Chunk::Failed(err) => {
                    st.frames = Frames::new();
                    st.oversized = None;
                    st.ended = true;
                    return Some((Err(err), st));
                }
            }
        }
    })
    .boxed()
}

/// A frame over the bound, named from its first bytes. A frame whose type cannot be read is
/// taken for a change (the cache keeps what it has), as in JSON.
fn oversized_frame(prefix: &[u8], size: usize, limit: usize) -> UndecodableObject {
    let (event, names) = LooseNames::of_watch_frame(prefix);
    let event = event.as_deref().and_then(WatchEventType::parse);
    UndecodableObject::from_names(
        names,
        Some(event.unwrap_or(WatchEventType::Modified)),
        UndecodableReason::TooLarge { size, limit },
    )
}

/// One frame's event, with its object's bytes if `keep_sent` and it has an object.
fn decode_frame<K: DeserializeOwned>(
    frame: &[u8],
    url: &str,
    keep_sent: bool,
) -> Result<(WatchEvent<K>, Option<Box<SentBytes>>), ListWatchError> {
    let decode_error = |e: DecodeError| ListWatchError::Decode {
        verb: "WATCH",
        url: url.to_string(),
        source: e.into(),
    };
    let raw = RawWatchEvent::parse(frame).map_err(decode_error)?;
    let event = raw
        .decode::<K>()
        .map_err(|e| match WatchEventType::parse(raw.event_type) {
            Some(event) => ListWatchError::Undecodable {
                verb: "WATCH",
                url: url.to_string(),
                object: Box::new(UndecodableObject::from_names(
                    LooseNames::of_object(raw.object.raw),
                    Some(event),
                    UndecodableReason::Decode(e.to_string()),
                )),
            },
            None => decode_error(e),
        })?;
    let sent = match &event {
        WatchEvent::Added(_) | WatchEvent::Modified(_) if keep_sent => Some(Box::new(SentBytes {
            api_version: raw.object.api_version.to_string(),
            kind: raw.object.kind.to_string(),
            message: raw.object.raw.to_vec(),
        })),
        _ => None,
    };
    Ok((event, sent))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::{MAX_OBJECT_BYTES, UndecodableReason};
    use crate::protobuf::delimited;
    use k8s_openapi::api::core::v1::ConfigMap;

    const CONFIG_MAP: &[u8] = include_bytes!("../../protobuf/testdata/configmap.pb");

    /// A frame: the length, then `{type, object: {raw: object}}`.
    fn frame(event_type: &str, object: &[u8]) -> Vec<u8> {
        let event = [
            delimited(1, event_type.as_bytes()),
            delimited(2, &delimited(1, object)),
        ]
        .concat();
        [&(event.len() as u32).to_be_bytes()[..], &event].concat()
    }

    async fn events_of(
        body: &[u8],
        chunk: usize,
        max: usize,
    ) -> Vec<Result<WatchEvent<ConfigMap>, ListWatchError>> {
        sent_events_of(body, chunk, max, false)
            .await
            .into_iter()
            .map(|e| e.map(|(event, _)| event))
            .collect()
    }

    async fn sent_events_of(
        body: &[u8],
        chunk: usize,
        max: usize,
        keep_sent: bool,
    ) -> Vec<Result<(WatchEvent<ConfigMap>, Option<Box<SentBytes>>), ListWatchError>> {
        let chunks: Vec<Result<Vec<u8>, kube_client::Error>> =
            body.chunks(chunk).map(|c| Ok(c.to_vec())).collect();
        let chunks = futures::stream::iter(chunks);
        watch_events_of_chunks::<ConfigMap, _, _>(chunks, "/w".into(), max, keep_sent)
            .collect()
            .await
    }

    fn kinds(events: &[Result<WatchEvent<ConfigMap>, ListWatchError>]) -> String {
        events
            .iter()
            .map(|e| match e {
                Ok(WatchEvent::Added(_)) => 'A',
                Ok(WatchEvent::Modified(_)) => 'M',
                Ok(WatchEvent::Deleted(_)) => 'D',
                Err(ListWatchError::Undecodable { .. }) => 'u',
                Err(ListWatchError::Decode { .. }) => 'x',
                _ => '?',
            })
            .collect()
    }

    // Frames cut across chunks anywhere decode whole, in order.
    #[tokio::test]
    async fn events_come_out_in_frame_order_however_the_body_is_cut() {
        let pattern = "AMDMA";
        let body: Vec<u8> = (0..200)
            .flat_map(|i| {
                let t = match pattern.as_bytes()[i % pattern.len()] {
                    b'A' => "ADDED",
                    b'M' => "MODIFIED",
                    _ => "DELETED",
                };
                frame(t, CONFIG_MAP)
            })
            .collect();
        let want: String = pattern.chars().cycle().take(200).collect();
        for chunk in [7, 1000, body.len()] {
            let events = events_of(&body, chunk, MAX_OBJECT_BYTES).await;
            assert_eq!(kinds(&events), want, "chunks of {chunk}");
        }
    }

    // As the JSON stream: an object that does not decode and a frame over the bound are
    // skipped and named, a frame that is not an event is a decode error, and the stream goes
    // on; a frame cut off by the close is dropped.
    #[tokio::test]
    async fn bad_frames_are_skipped_or_reported_and_the_stream_goes_on() {
        // The envelope names a kind the table does not know: the object does not decode.
        let mut unknown = CONFIG_MAP.to_vec();
        let at = unknown.windows(9).position(|w| w == b"ConfigMap").unwrap();
        unknown[at..at + 9].copy_from_slice(b"Gadget123");
        let big = [CONFIG_MAP, &[0u8; 3000][..]].concat();
        let body = [
            frame("ADDED", CONFIG_MAP),
            frame("MODIFIED", &unknown),
            frame("MODIFIED", &big),
            frame("ADDED", CONFIG_MAP),
            frame("MODIFIED", b"not an envelope"),
            frame("DELETED", CONFIG_MAP),
            frame("ADDED", CONFIG_MAP)[..20].to_vec(),
        ]
        .concat();
        for chunk in [1, 50, body.len()] {
            let events = events_of(&body, chunk, 2000).await;
            assert_eq!(kinds(&events), "AuuAxD", "chunks of {chunk}");
            // Both skipped frames carry the fixture's ConfigMap, default/web-config at
            // resourceVersion 12345, and are named so.
            let Err(ListWatchError::Undecodable { object, .. }) = &events[1] else {
                unreachable!()
            };
            assert!(
                matches!(&object.reason, UndecodableReason::Decode(m) if m.contains("Gadget123")),
                "{object}"
            );
            assert_eq!(object.key().as_deref(), Some("default/web-config"));
            assert_eq!(object.resource_version, "12345");
            assert_eq!(object.event, Some(WatchEventType::Modified));
            assert!(
                object.to_string().starts_with(
                    "object default/web-config at resourceVersion 12345 does not decode"
                ),
                "{object}"
            );
            let Err(ListWatchError::Undecodable { object, .. }) = &events[2] else {
                unreachable!()
            };
            assert_eq!(object.event, Some(WatchEventType::Modified));
            assert_eq!(
                object.key().as_deref(),
                Some("default/web-config"),
                "named from its first bytes: {object}"
            );
            assert_eq!(object.resource_version, "12345");
            assert!(matches!(
                object.reason,
                UndecodableReason::TooLarge { limit: 2000, .. }
            ));
        }
    }

    /// A ConfigMap envelope that is a bookmark at resourceVersion 9, ending the initial
    /// events if `end`.
    fn bookmark(end: bool) -> Vec<u8> {
        let annotation = [
            delimited(1, INITIAL_EVENTS_END_ANNOTATION.as_bytes()),
            delimited(2, b"true"),
        ]
        .concat();
        let mut meta = delimited(6, b"9");
        if end {
            meta.extend(delimited(12, &annotation));
        }
        let type_meta = [delimited(1, b"v1"), delimited(2, b"ConfigMap")].concat();
        let unknown = [delimited(1, &type_meta), delimited(2, &delimited(1, &meta))].concat();
        [&b"k8s\0"[..], &unknown].concat()
    }

    // kubeloop's own: asked to, the initial events come with the bytes their objects were
    // sent as, which decode to the same object; events after the bookmark that ends them,
    // and a deletion, come without.
    #[tokio::test]
    async fn initial_events_come_with_their_bytes_until_the_end_bookmark() {
        let body = [
            frame("ADDED", CONFIG_MAP),
            frame("BOOKMARK", &bookmark(false)),
            frame("DELETED", CONFIG_MAP),
            frame("ADDED", CONFIG_MAP),
            frame("BOOKMARK", &bookmark(true)),
            frame("MODIFIED", CONFIG_MAP),
        ]
        .concat();
        let events = sent_events_of(&body, 100, MAX_OBJECT_BYTES, true).await;
        let kept: Vec<bool> = events
            .iter()
            .map(|e| e.as_ref().unwrap().1.is_some())
            .collect();
        assert_eq!(kept, [true, false, false, true, false, false]);
        let Ok((WatchEvent::Added(object), Some(sent))) = &events[0] else {
            unreachable!()
        };
        assert_eq!((&*sent.api_version, &*sent.kind), ("v1", "ConfigMap"));
        let again: ConfigMap =
            crate::protobuf::decode_message(&sent.api_version, &sent.kind, &sent.message).unwrap();
        assert_eq!(&again, object);
        let without = sent_events_of(&body, 100, MAX_OBJECT_BYTES, false).await;
        assert!(without.iter().all(|e| e.as_ref().unwrap().1.is_none()));
    }
}
