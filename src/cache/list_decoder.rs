//! Decodes a LIST response body item by item as its bytes arrive, so a LIST never holds the
//! whole body at once: only the item being received and the items decoded so far
//! (kubernetes/kubernetes#73497 asks this of client-go, which still reads the body whole).
//!
//! No client-go counterpart: client-go decodes the complete body. kube-client's
//! `Client::request` does too (into one `String`, then `serde_json::from_str`); for a
//! 100k-object LIST answered whole from the watch cache that body is about 150 MB on top of
//! the decoded objects.
//!
//! How: a small scanner over the top-level object of a `*List` body. It finds each key; the
//! value of `items` is split into its elements, each decoded with `serde_json` as soon as
//! its closing brace arrives, and the consumed bytes are dropped. `metadata` (resourceVersion,
//! continue) is decoded whole; any other key (`kind`, `apiVersion`) is skipped.
//!
//! Invariants (on [`ListDecoder`]):
//! - `buf[..pos]` has been consumed and is dropped at the end of each `feed`;
//! - `state` says what the bytes at `pos` must be.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ListMeta;
use serde::de::DeserializeOwned;

use super::store::{TransformFunc, apply_transform};

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
    /// An item or the list metadata did not decode.
    #[error("LIST body: {what} does not decode: {source}")]
    Item {
        /// `items[i]` or `metadata`.
        what: String,
        /// The decoder error.
        #[source]
        source: serde_json::Error,
    },
    /// The body ended inside the list.
    #[error("LIST body ended before the list was complete ({len} bytes read)")]
    Truncated {
        /// Bytes read.
        len: usize,
    },
}

/// What the bytes at `pos` must be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Whitespace, then the `{` of the list object.
    ObjectStart,
    /// Whitespace and a `,`, then a key, or the closing `}`.
    Key,
    /// A value to decode into the list metadata.
    Metadata,
    /// A value to skip (`kind`, `apiVersion`, anything unknown).
    Skip,
    /// The value of `items`: `[` or `null`.
    ItemsStart,
    /// Whitespace and a `,`, then an item, or the closing `]`.
    Item,
    /// The list object has ended.
    Done,
}

/// An incremental decoder of one LIST body.
pub(crate) struct ListDecoder<K> {
    buf: Vec<u8>,
    pos: usize,
    /// Bytes dropped from the front of `buf` so far (for error offsets).
    dropped: usize,
    state: State,
    items: Vec<K>,
    metadata: ListMeta,
    /// Run on each item as it is decoded.
    transform: Option<TransformFunc<K>>,
}

impl<K: DeserializeOwned> Default for ListDecoder<K> {
    fn default() -> Self {
        Self::new()
    }
}

impl<K: DeserializeOwned> ListDecoder<K> {
    /// A decoder at the start of a body.
    pub fn new() -> Self {
        Self {
            buf: Vec::new(),
            pos: 0,
            dropped: 0,
            state: State::ObjectStart,
            items: Vec::new(),
            metadata: ListMeta::default(),
            transform: None,
        }
    }

    /// Runs `transform` on each item as soon as it is decoded (the informer's transform,
    /// so the untransformed objects never pile up).
    pub fn with_transform(mut self, transform: Option<TransformFunc<K>>) -> Self {
        self.transform = transform;
        self
    }

    /// Feeds the next bytes of the body; decodes every item they complete.
    pub fn feed(&mut self, bytes: &[u8]) -> Result<(), ListDecodeError> {
        self.buf.extend_from_slice(bytes);
        self.advance(false)?;
        // Drop what is consumed; the incomplete rest moves to the front.
        self.buf.drain(..self.pos);
        self.dropped += self.pos;
        self.pos = 0;
        Ok(())
    }

    /// The body has ended: the items and the list metadata.
    pub fn finish(mut self) -> Result<(Vec<K>, ListMeta), ListDecodeError> {
        self.advance(true)?;
        if self.state != State::Done {
            return Err(ListDecodeError::Truncated {
                len: self.dropped + self.buf.len(),
            });
        }
        self.items.shrink_to_fit();
        Ok((self.items, self.metadata))
    }

    fn malformed(&self, at: usize, what: &'static str) -> ListDecodeError {
        ListDecodeError::Malformed {
            offset: self.dropped + at,
            what,
        }
    }

    /// Runs the state machine as far as the buffered bytes allow.
    fn advance(&mut self, at_end: bool) -> Result<(), ListDecodeError> {
        loop {
            let i = skip_ws(&self.buf, self.pos);
            let Some(&b) = self.buf.get(i) else {
                return Ok(());
            };
            match self.state {
                State::ObjectStart => {
                    if b != b'{' {
                        return Err(self.malformed(i, "a JSON object"));
                    }
                    self.pos = i + 1;
                    self.state = State::Key;
                }
                State::Key => {
                    let i = if b == b',' {
                        skip_ws(&self.buf, i + 1)
                    } else {
                        i
                    };
                    let Some(&b) = self.buf.get(i) else {
                        return Ok(());
                    };
                    if b == b'}' {
                        self.pos = i + 1;
                        self.state = State::Done;
                        continue;
                    }
                    if b != b'"' {
                        return Err(self.malformed(i, "a key"));
                    }
                    let Some(end) = scan_string(&self.buf, i) else {
                        return Ok(());
                    };
                    let colon = skip_ws(&self.buf, end);
                    let Some(&c) = self.buf.get(colon) else {
                        return Ok(());
                    };
                    if c != b':' {
                        return Err(self.malformed(colon, "':' after a key"));
                    }
                    self.state = match &self.buf[i + 1..end - 1] {
                        b"items" => State::ItemsStart,
                        b"metadata" => State::Metadata,
                        _ => State::Skip,
                    };
                    self.pos = colon + 1;
                }
                State::Metadata | State::Skip => {
                    let Some(end) = scan_value(&self.buf, i, at_end) else {
                        return Ok(());
                    };
                    if self.state == State::Metadata {
                        self.metadata =
                            serde_json::from_slice(&self.buf[i..end]).map_err(|source| {
                                ListDecodeError::Item {
                                    what: "metadata".into(),
                                    source,
                                }
                            })?;
                    }
                    self.pos = end;
                    self.state = State::Key;
                }
                State::ItemsStart => {
                    if b == b'[' {
                        self.pos = i + 1;
                        self.state = State::Item;
                    } else if b == b'n' {
                        // `"items": null` is an empty list.
                        let Some(end) = scan_value(&self.buf, i, at_end) else {
                            return Ok(());
                        };
                        self.pos = end;
                        self.state = State::Key;
                    } else {
                        return Err(self.malformed(i, "'[' or null after \"items\""));
                    }
                }
                State::Item => {
                    let i = if b == b',' {
                        skip_ws(&self.buf, i + 1)
                    } else {
                        i
                    };
                    let Some(&b) = self.buf.get(i) else {
                        return Ok(());
                    };
                    if b == b']' {
                        self.pos = i + 1;
                        self.state = State::Key;
                        continue;
                    }
                    let Some(end) = scan_value(&self.buf, i, at_end) else {
                        return Ok(());
                    };
                    let item = serde_json::from_slice(&self.buf[i..end]).map_err(|source| {
                        ListDecodeError::Item {
                            what: format!("items[{}]", self.items.len()),
                            source,
                        }
                    })?;
                    self.items
                        .push(apply_transform(self.transform.as_ref(), item));
                    self.pos = end;
                }
                State::Done => return Ok(()),
            }
        }
    }
}

fn skip_ws(buf: &[u8], mut i: usize) -> usize {
    while buf.get(i).is_some_and(|b| b.is_ascii_whitespace()) {
        i += 1;
    }
    i
}

/// The end (exclusive) of the string starting at `buf[start] == '"'`, if it is complete.
fn scan_string(buf: &[u8], start: usize) -> Option<usize> {
    let mut i = start + 1;
    while i < buf.len() {
        match buf[i] {
            b'\\' => i += 2,
            b'"' => return Some(i + 1),
            _ => i += 1,
        }
    }
    None
}

/// The end (exclusive) of the JSON value starting at `buf[start]`, if it is complete. Only
/// the structure is checked (strings, nesting); `serde_json` validates the rest. A bare
/// scalar ends at a delimiter, or at the end of the body once `at_end`.
fn scan_value(buf: &[u8], start: usize, at_end: bool) -> Option<usize> {
    match buf[start] {
        b'"' => scan_string(buf, start),
        b'{' | b'[' => {
            let mut depth = 0usize;
            let mut i = start;
            while i < buf.len() {
                match buf[i] {
                    b'"' => {
                        i = scan_string(buf, i)?;
                        continue;
                    }
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth -= 1;
                        if depth == 0 {
                            return Some(i + 1);
                        }
                    }
                    _ => {}
                }
                i += 1;
            }
            None
        }
        _ => {
            let len = buf[start..]
                .iter()
                .position(|b| matches!(b, b',' | b'}' | b']') || b.is_ascii_whitespace());
            match len {
                Some(n) => Some(start + n),
                None if at_end => Some(buf.len()),
                None => None,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;

    fn body(n: usize) -> String {
        let items: Vec<String> = (0..n)
            .map(|i| {
                format!(
                    r#"{{"metadata":{{"name":"cm-{i}","namespace":"ns","resourceVersion":"{}","labels":{{"a":"b}}[\"{{"}}}},"data":{{"k":"v,]}}{i}"}}}}"#,
                    i + 10
                )
            })
            .collect();
        format!(
            r#"{{"kind":"ConfigMapList","apiVersion":"v1","metadata":{{"resourceVersion":"99","continue":"tok"}},"items":[{}]}}"#,
            items.join(",")
        )
    }

    fn decode_in_chunks(
        text: &str,
        chunk: usize,
    ) -> Result<(Vec<ConfigMap>, ListMeta), ListDecodeError> {
        let mut d = ListDecoder::<ConfigMap>::new();
        for part in text.as_bytes().chunks(chunk) {
            d.feed(part)?;
        }
        d.finish()
    }

    // kubeloop's own: every chunking of a body decodes to what serde_json makes of it whole,
    // including strings that hold braces, brackets, commas and escaped quotes.
    #[test]
    fn any_chunking_decodes_like_the_whole_body() {
        let text = body(5);
        let whole: serde_json::Value = serde_json::from_str(&text).unwrap();
        let want: Vec<ConfigMap> = serde_json::from_value(whole["items"].clone()).unwrap();
        for chunk in [1, 2, 3, 7, 64, 1000, text.len()] {
            let (items, meta) = decode_in_chunks(&text, chunk).unwrap();
            assert_eq!(items, want, "chunk {chunk}");
            assert_eq!(meta.resource_version.as_deref(), Some("99"));
            assert_eq!(meta.continue_.as_deref(), Some("tok"));
        }
    }

    // kubeloop's own: the decoder keeps only the unfinished item, not the body.
    #[test]
    fn consumed_bytes_are_dropped_as_items_complete() {
        let text = body(200);
        let mut d = ListDecoder::<ConfigMap>::new();
        let mut max_buf = 0;
        for part in text.as_bytes().chunks(100) {
            d.feed(part).unwrap();
            max_buf = max_buf.max(d.buf.len());
        }
        let (items, _) = d.finish().unwrap();
        assert_eq!(items.len(), 200);
        let one_item = text.len() / 200;
        assert!(
            max_buf < 2 * one_item + 100,
            "buffered {max_buf} bytes of a {} byte body",
            text.len()
        );
    }

    #[test]
    fn empty_and_null_item_lists() {
        for text in [
            r#"{"kind":"ConfigMapList","metadata":{"resourceVersion":"5"},"items":[]}"#,
            r#"{"metadata":{"resourceVersion":"5"},"items":null}"#,
            r#" { "items" : [ ] , "metadata" : { "resourceVersion" : "5" } } "#,
        ] {
            let (items, meta) = decode_in_chunks(text, 3).unwrap();
            assert!(items.is_empty(), "{text}");
            assert_eq!(meta.resource_version.as_deref(), Some("5"), "{text}");
        }
    }

    #[test]
    fn bad_bodies_get_errors_that_say_where() {
        let err = decode_in_chunks(r#"{"items":[{"metadata":{"name":7}}]}"#, 4).unwrap_err();
        assert!(err.to_string().contains("items[0]"), "{err}");
        let err = decode_in_chunks(r#"{"items":[{"metadata":{}}"#, 4).unwrap_err();
        assert!(matches!(err, ListDecodeError::Truncated { .. }), "{err}");
        let err = decode_in_chunks(r#"["not a list"]"#, 4).unwrap_err();
        assert!(err.to_string().contains("byte 0"), "{err}");
        let err = decode_in_chunks(r#"{"items":{}}"#, 4).unwrap_err();
        assert!(err.to_string().contains("after \"items\""), "{err}");
    }
}
