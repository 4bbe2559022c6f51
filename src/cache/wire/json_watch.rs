//! JSON watch streams: newline-delimited `WatchEvent`s, one a line (apimachinery's
//! `StreamWatcher` over the JSON framer, as client-go's rest client sets it up).

use futures::StreamExt;
use http_body_util::BodyExt;
use kube_client::client::Body;
use kube_client::core::{Status, WatchEvent};
use serde::de::DeserializeOwned;

use super::encoding::{Chunk, next_chunk};
use crate::cache::list_watch_error::{ListWatchError, WatchStream};
use crate::cache::undecodable::{UndecodableObject, oversized_event, undecodable_event};

/// The event stream of a watch body: newline-delimited JSON, one `WatchEvent` a line
/// (apimachinery's `StreamWatcher` over the JSON framer, as client-go's rest client sets it up).
///
/// - A complete line that is not a watch event is a [`ListWatchError::Decode`] (a line
///   carrying a bare `Status`, kind `Status`, is an [`ListWatchError::Api`]): the
///   reflector ends the watch and relists, as the StreamWatcher reports a decode
///   error and stops. kube-client's `request_events` would read any JSON object that is not
///   an event as a `Status` (all its fields have defaults), which hides what went wrong.
/// - An `ADDED`, `MODIFIED` or `DELETED` event whose object does not decode into `K`, and a
///   line over `max_line_bytes` (dropped as it streams past, never buffered whole), are a
///   [`ListWatchError::Undecodable`] naming the object, and the stream goes on (client-go's
///   StreamWatcher ends the watch on both; see `undecodable.rs`).
/// - The body ending, or breaking with an unexpected EOF, ends the stream (the reflector
///   re-watches); an unterminated last line is dropped unless it decodes whole.
/// - Any other read failure is a [`ListWatchError::Transport`], after which the stream ends.
pub(super) fn watch_events<K: DeserializeOwned + Send + 'static>(
    body: Body,
    url: String,
    max_line_bytes: usize,
) -> WatchStream<K> {
    watch_events_of_chunks(body.into_data_stream(), url, max_line_bytes)
}

/// [`watch_events`] over the body's chunks as they arrive.
pub(super) fn watch_events_of_chunks<K, S, D>(
    chunks: S,
    url: String,
    max_line_bytes: usize,
) -> WatchStream<K>
where
    K: DeserializeOwned + Send + 'static,
    S: futures::Stream<Item = Result<D, kube_client::Error>> + Send + Unpin + 'static,
    D: AsRef<[u8]>,
{
    /// Invariants: `buf[start..start + scanned]` holds no newline; while `oversized` is set,
    /// the line it names is being dropped and `buf` holds only its bytes since the last read.
    struct Lines<S> {
        body: S,
        buf: Vec<u8>,
        /// Where the unread part of `buf` starts.
        start: usize,
        /// How many bytes after `start` are known to hold no newline, so a line that arrives
        /// in many chunks is searched once, not once per chunk.
        scanned: usize,
        ended: bool,
        url: String,
        max_line_bytes: usize,
        /// The line over the bound streaming past: the object it names, its bytes so far.
        oversized: Option<(UndecodableObject, usize)>,
    }
    let lines = Lines {
        body: chunks,
        buf: Vec::new(),
        start: 0,
        scanned: 0,
        ended: false,
        url,
        max_line_bytes,
        oversized: None,
    };
    futures::stream::unfold(lines, |mut st| async move {
        loop {
            let from = st.start + st.scanned;
            if let Some(n) = st.buf[from..].iter().position(|b| *b == b'\n') {
                let line = &st.buf[st.start..from + n];
                st.start = from + n + 1;
                st.scanned = 0;
                let oversized = match st.oversized.take() {
                    Some((skip, size)) => Some(skip.with_size(size + line.len())),
                    None if line.len() > st.max_line_bytes => {
                        Some(oversized_event(line, line.len(), st.max_line_bytes))
                    }
                    None => None,
                };
                if let Some(skip) = oversized {
                    let err = ListWatchError::Undecodable {
                        verb: "WATCH",
                        url: st.url.clone(),
                        object: Box::new(skip),
                    };
                    return Some((Err(err), st));
                }
                if line.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                let event = decode_watch_line(line, &st.url);
                return Some((event, st));
            }
            if st.ended {
                let rest = std::mem::take(&mut st.buf);
                let rest = &rest[std::mem::take(&mut st.start)..];
                st.scanned = 0;
                // A line over the bound cut off by the close is dropped like any cut line.
                if st.oversized.take().is_some() || rest.iter().all(u8::is_ascii_whitespace) {
                    return None;
                }
                return match decode_watch_line::<K>(rest, &st.url) {
                    Err(ListWatchError::Decode { .. }) => None,
                    event => Some((event, st)),
                };
            }
            let pending = st.buf.len() - st.start;
            if let Some((_, size)) = &mut st.oversized {
                *size += pending;
                st.buf.clear();
                st.start = 0;
                st.scanned = 0;
            } else if pending > st.max_line_bytes {
                // Named from its first bytes, then dropped as it streams past.
                let skip = oversized_event(&st.buf[st.start..], 0, st.max_line_bytes);
                st.oversized = Some((skip, pending));
                st.buf.clear();
                st.start = 0;
                st.scanned = 0;
            } else {
                // Keep only the unread tail before reading more: each byte is moved once.
                st.scanned = pending;
                st.buf.drain(..st.start);
                st.start = 0;
            }
            match next_chunk(&mut st.body, &st.url).await {
                Chunk::Bytes(chunk) => st.buf.extend_from_slice(chunk.as_ref()),
                Chunk::End => st.ended = true,
                Chunk::Failed(err) => {
                    st.buf.clear();
                    st.start = 0;
                    st.scanned = 0;
                    st.oversized = None;
                    st.ended = true;
                    return Some((Err(err), st));
                }
            }
        }
    })
    .boxed()
}

fn decode_watch_line<K: DeserializeOwned>(
    line: &[u8],
    url: &str,
) -> Result<WatchEvent<K>, ListWatchError> {
    match serde_json::from_slice::<WatchEvent<K>>(line) {
        Ok(event) => Ok(event),
        Err(source) => {
            #[derive(serde::Deserialize)]
            struct Kind {
                #[serde(default)]
                kind: String,
            }
            if serde_json::from_slice::<Kind>(line).is_ok_and(|k| k.kind == "Status")
                && let Ok(status) = serde_json::from_slice::<Status>(line)
            {
                return Err(ListWatchError::from_status("WATCH", url, &status));
            }
            if let Some(skip) = undecodable_event(line, &source) {
                return Err(ListWatchError::Undecodable {
                    verb: "WATCH",
                    url: url.to_string(),
                    object: Box::new(skip),
                });
            }
            Err(ListWatchError::Decode {
                verb: "WATCH",
                url: url.to_string(),
                source: source.into(),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::MAX_OBJECT_BYTES;
    use k8s_openapi::api::core::v1::ConfigMap;

    async fn events_of(body: &str) -> Vec<Result<WatchEvent<ConfigMap>, ListWatchError>> {
        watch_events::<ConfigMap>(
            Body::from(body.as_bytes().to_vec()),
            "/w".into(),
            MAX_OBJECT_BYTES,
        )
        .collect()
        .await
    }

    const ADDED: &str = r#"{"type":"ADDED","object":{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"a","namespace":"ns","resourceVersion":"5"}}}"#;

    // After apimachinery's watch/streamwatcher.go: a decode failure is reported as an error
    // (and the reflector ends the watch on it), not skipped.
    #[tokio::test]
    async fn a_complete_line_that_is_not_an_event_is_a_decode_error() {
        let body =
            format!("{ADDED}\n\n{{\"type\":\"MODIFIED\",\"object\":\"not an object\"}}\n{ADDED}\n");
        let events = events_of(&body).await;
        assert_eq!(events.len(), 3, "{events:?}");
        assert!(
            matches!(&events[0], Ok(WatchEvent::Added(cm)) if cm.metadata.name.as_deref() == Some("a"))
        );
        assert!(
            matches!(
                &events[1],
                Err(ListWatchError::Decode { verb: "WATCH", .. })
            ),
            "{:?}",
            events[1]
        );
        // A bare Status line is the server's error, not a decode failure.
        let status = r#"{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"Expired","code":410}"#;
        let events = events_of(&format!("{status}\n")).await;
        assert!(
            matches!(&events[..], [Err(e)] if e.is_expired()),
            "{events:?}"
        );
    }

    // Lines cut across chunks anywhere (a byte at a time, then mid-line) decode as whole
    // lines: the newline search resumes where the previous chunk's search ended.
    #[tokio::test]
    async fn events_split_across_chunks_decode_as_whole_lines() {
        let body = format!("{ADDED}\n\n{ADDED}\n{ADDED}\n");
        for size in [1, 7, 64, body.len()] {
            let chunks: Vec<Result<Vec<u8>, kube_client::Error>> = body
                .as_bytes()
                .chunks(size)
                .map(|c| Ok(c.to_vec()))
                .collect();
            let events: Vec<_> = watch_events_of_chunks::<ConfigMap, _, _>(
                futures::stream::iter(chunks),
                "/w".into(),
                MAX_OBJECT_BYTES,
            )
            .collect()
            .await;
            assert_eq!(events.len(), 3, "chunks of {size}: {events:?}");
            assert!(
                events.iter().all(|e| matches!(e, Ok(WatchEvent::Added(_)))),
                "chunks of {size}: {events:?}"
            );
        }
    }

    // kubeloop's own (client-go's StreamWatcher ends the watch on it): an event whose object
    // does not decode into the type is reported as that object, and the stream goes on.
    #[tokio::test]
    async fn an_event_whose_object_does_not_decode_is_skipped_and_the_stream_goes_on() {
        let bad = r#"{"type":"MODIFIED","object":{"kind":"ConfigMap","metadata":{"name":"bad","namespace":"ns","resourceVersion":"6"},"data":{"k":7}}}"#;
        let events = events_of(&format!("{bad}\n{ADDED}\n")).await;
        let [
            Err(ListWatchError::Undecodable { object, .. }),
            Ok(WatchEvent::Added(_)),
        ] = &events[..]
        else {
            panic!("{events:?}")
        };
        assert_eq!(object.key().as_deref(), Some("ns/bad"));
        assert_eq!(object.resource_version, "6");
        assert_eq!(object.event, Some(crate::cache::WatchEventType::Modified));
        let text = ListWatchError::Undecodable {
            verb: "WATCH",
            url: "/w".into(),
            object: object.clone(),
        }
        .to_string();
        assert!(
            text.starts_with("WATCH /w: skipping object ns/bad at resourceVersion 6 does not decode: invalid type: integer `7`"),
            "{text}"
        );
    }

    // client-go's streaming decoder: a frame over maxBytes (16 MiB) is ErrObjectTooLarge and
    // the rest of the frame is drained, after which its StreamWatcher ends the watch. Here the
    // line is skipped (named from its first bytes), dropped as it streams past, and the
    // stream goes on.
    #[tokio::test]
    async fn a_line_over_the_bound_is_skipped_and_the_stream_goes_on() {
        let big = format!(
            r#"{{"type":"DELETED","object":{{"metadata":{{"name":"big","namespace":"ns","resourceVersion":"8"}},"data":{{"k":"{}"}}}}}}"#,
            "x".repeat(5000)
        );
        let body = format!("{ADDED}\n{big}\n{ADDED}\n");
        for size in [1, 100, body.len()] {
            let chunks: Vec<Result<Vec<u8>, kube_client::Error>> = body
                .as_bytes()
                .chunks(size)
                .map(|c| Ok(c.to_vec()))
                .collect();
            let events: Vec<_> = watch_events_of_chunks::<ConfigMap, _, _>(
                futures::stream::iter(chunks),
                "/w".into(),
                1000,
            )
            .collect()
            .await;
            let [
                Ok(WatchEvent::Added(_)),
                Err(ListWatchError::Undecodable { object, .. }),
                Ok(WatchEvent::Added(_)),
            ] = &events[..]
            else {
                panic!("chunks of {size}: {events:?}")
            };
            assert_eq!(object.key().as_deref(), Some("ns/big"), "chunks of {size}");
            assert_eq!(object.event, Some(crate::cache::WatchEventType::Deleted));
            assert_eq!(
                object.reason,
                crate::cache::UndecodableReason::TooLarge {
                    size: big.len(),
                    limit: 1000
                },
                "chunks of {size}"
            );
        }
    }

    #[tokio::test]
    async fn an_unterminated_last_line_is_dropped_unless_it_decodes_whole() {
        let cut = &ADDED[..40];
        let events = events_of(&format!("{ADDED}\n{cut}")).await;
        assert_eq!(events.len(), 1, "{events:?}");
        let events = events_of(ADDED).await;
        assert!(
            matches!(&events[..], [Ok(WatchEvent::Added(_))]),
            "{events:?}"
        );
    }
}
