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

use futures::StreamExt;
use http_body_util::BodyExt;
use kube_client::client::Body;
use kube_client::core::WatchEvent;
use serde::de::DeserializeOwned;

use super::encoding::{Chunk, next_chunk};
use crate::cache::list_watch_error::{ListWatchError, WatchStream};
use crate::cache::undecodable::{UndecodableObject, UndecodableReason, WatchEventType};
use crate::protobuf::{DecodeError, Frames, LooseNames, RawWatchEvent};

/// How much of a frame over the bound is read to name its object: its metadata comes first.
const OVERSIZED_PREFIX: usize = 4096;

/// The event stream of a protobuf watch body.
pub(super) fn watch_events<K: DeserializeOwned + Send + 'static>(
    body: Body,
    url: String,
    max_frame_bytes: usize,
) -> WatchStream<K> {
    watch_events_of_chunks(body.into_data_stream(), url, max_frame_bytes)
}

/// [`watch_events`] over the body's chunks as they arrive.
fn watch_events_of_chunks<K, S, D>(chunks: S, url: String, max_frame_bytes: usize) -> WatchStream<K>
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
    }
    let stream = Stream {
        body: chunks,
        frames: Frames::new(),
        ended: false,
        url,
        max_frame_bytes,
        oversized: None,
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
                if frame.len() >= len.min(OVERSIZED_PREFIX) {
                    let skip = oversized_frame(frame, len, st.max_frame_bytes);
                    st.oversized = Some((skip, len + 4));
                    continue;
                }
            } else if let Some(frame) = st.frames.next_frame() {
                let event = decode_frame(frame, &st.url);
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

fn decode_frame<K: DeserializeOwned>(
    frame: &[u8],
    url: &str,
) -> Result<WatchEvent<K>, ListWatchError> {
    let decode_error = |e: DecodeError| ListWatchError::Decode {
        verb: "WATCH",
        url: url.to_string(),
        source: e.into(),
    };
    let raw = RawWatchEvent::parse(frame).map_err(decode_error)?;
    raw.decode::<K>()
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
        })
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
        let chunks: Vec<Result<Vec<u8>, kube_client::Error>> =
            body.chunks(chunk).map(|c| Ok(c.to_vec())).collect();
        watch_events_of_chunks::<ConfigMap, _, _>(futures::stream::iter(chunks), "/w".into(), max)
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
            let Err(ListWatchError::Undecodable { object, .. }) = &events[1] else {
                unreachable!()
            };
            assert!(
                matches!(&object.reason, UndecodableReason::Decode(m) if m.contains("Gadget123")),
                "{object}"
            );
            let Err(ListWatchError::Undecodable { object, .. }) = &events[2] else {
                unreachable!()
            };
            assert_eq!(object.event, Some(WatchEventType::Modified));
            assert!(
                object.key().is_some(),
                "named from its first bytes: {object}"
            );
            assert!(matches!(
                object.reason,
                UndecodableReason::TooLarge { limit: 2000, .. }
            ));
        }
    }
}
