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
//! continue) is decoded whole; any other key (`kind`, `apiVersion`) is skipped as it streams
//! past. The end of a value is found by a scan that keeps its state between chunks
//! ([`ValueEnd`]): each byte is scanned once, however finely the body is cut.
//!
//! An item that does not decode into `K`, or is over the size bound
//! ([`MAX_OBJECT_BYTES`](super::MAX_OBJECT_BYTES) by default), is skipped and reported in
//! [`DecodedList::undecodable`], never fatal to the list (client-go fails the whole list;
//! see `undecodable.rs`). An oversized item's bytes are dropped as they are scanned.
//!
//! Invariants (on [`ListDecoder`]):
//! - `buf[..pos]` has been consumed and is dropped at the end of each `feed`;
//! - `state` says what the bytes at `pos` must be; inside a value (`State::InValue`), the
//!   value starts at `pos` and `buf[pos..scan_at]` has been fed to `scan`;
//! - `oversized` is set while an item over the bound streams past; its bytes are consumed
//!   as scanned, so `buf` never holds more than the bound plus one chunk.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ListMeta;
use serde::de::DeserializeOwned;

use super::encoding::{DecodedList, ListDecodeError};
use crate::cache::json_scan::{ValueEnd, scan_string, skip_ws};
use crate::cache::store::{TransformFunc, apply_transform};
use crate::cache::undecodable::{MAX_OBJECT_BYTES, UndecodableObject, decode_item, oversized_item};

/// What the bytes at `pos` must be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Whitespace, then the `{` of the list object.
    ObjectStart,
    /// Whitespace and a `,`, then a key, or the closing `}`.
    Key,
    /// Whitespace, then the value of a key.
    ValueStart(Value),
    /// Inside a value that starts at `pos`.
    InValue(Value),
    /// The value of `items`: `[` or `null`.
    ItemsStart,
    /// Whitespace and a `,`, then an item, or the closing `]`.
    Item,
    /// The list object has ended.
    Done,
}

/// Which value is being read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Value {
    /// Decoded into the list metadata.
    Metadata,
    /// Skipped (`kind`, `apiVersion`, anything unknown): dropped as it is scanned.
    Skip,
    /// An element of `items`.
    Item,
}

/// An incremental decoder of one LIST body.
pub(crate) struct ListDecoder<K> {
    buf: Vec<u8>,
    pos: usize,
    /// Bytes dropped from the front of `buf` so far (for error offsets).
    dropped: usize,
    state: State,
    /// The scan of the value at `pos` (see the invariants).
    scan: ValueEnd,
    scan_at: usize,
    /// The item streaming past over the bound, and its bytes so far.
    oversized: Option<(UndecodableObject, usize)>,
    items: Vec<K>,
    undecodable: Vec<UndecodableObject>,
    metadata: ListMeta,
    /// Run on each item as it is decoded.
    transform: Option<TransformFunc<K>>,
    /// The bound on one item.
    max_item_bytes: usize,
    /// Bytes fed to value scans (the work a test can count).
    scanned: usize,
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
            scan: ValueEnd::new(),
            scan_at: 0,
            oversized: None,
            items: Vec::new(),
            undecodable: Vec::new(),
            metadata: ListMeta::default(),
            transform: None,
            max_item_bytes: MAX_OBJECT_BYTES,
            scanned: 0,
        }
    }

    /// Runs `transform` on each item as soon as it is decoded (the informer's transform,
    /// so the untransformed objects never pile up).
    pub fn with_transform(mut self, transform: Option<TransformFunc<K>>) -> Self {
        self.transform = transform;
        self
    }

    /// Skips items over `bytes` (and the list metadata over it is an error).
    pub fn with_max_item_bytes(mut self, bytes: usize) -> Self {
        self.max_item_bytes = bytes;
        self
    }

    /// Feeds the next bytes of the body; decodes every item they complete.
    pub fn feed(&mut self, bytes: &[u8]) -> Result<(), ListDecodeError> {
        self.buf.extend_from_slice(bytes);
        self.advance()?;
        // Drop what is consumed; the incomplete rest moves to the front.
        self.buf.drain(..self.pos);
        self.dropped += self.pos;
        self.scan_at -= self.pos.min(self.scan_at);
        self.pos = 0;
        Ok(())
    }

    /// The body has ended: the items, the list metadata and the items skipped.
    pub fn finish(mut self) -> Result<DecodedList<K>, ListDecodeError> {
        self.advance()?;
        if self.state != State::Done {
            return Err(ListDecodeError::Truncated {
                len: self.dropped + self.buf.len(),
            });
        }
        self.items.shrink_to_fit();
        Ok(DecodedList {
            sent: Vec::new(),
            items: self.items,
            metadata: self.metadata,
            undecodable: self.undecodable,
        })
    }

    fn malformed(&self, at: usize, what: &'static str) -> ListDecodeError {
        ListDecodeError::Malformed {
            offset: self.dropped + at,
            what,
        }
    }

    /// Starts the scan of a value at `i`.
    fn enter_value(&mut self, i: usize, value: Value) {
        self.pos = i;
        self.scan = ValueEnd::new();
        self.scan_at = i;
        self.state = State::InValue(value);
    }

    /// Runs the state machine as far as the buffered bytes allow.
    fn advance(&mut self) -> Result<(), ListDecodeError> {
        loop {
            if let State::InValue(value) = self.state {
                if !self.in_value(value)? {
                    return Ok(());
                }
                continue;
            }
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
                        b"metadata" => State::ValueStart(Value::Metadata),
                        _ => State::ValueStart(Value::Skip),
                    };
                    self.pos = colon + 1;
                }
                State::ValueStart(value) => self.enter_value(i, value),
                State::ItemsStart => {
                    if b == b'[' {
                        self.pos = i + 1;
                        self.state = State::Item;
                    } else if b == b'n' {
                        // `"items": null` is an empty list.
                        let Some(null) = self.buf.get(i..i + 4) else {
                            return Ok(());
                        };
                        if null != b"null" {
                            return Err(self.malformed(i, "'[' or null after \"items\""));
                        }
                        self.pos = i + 4;
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
                    self.enter_value(i, Value::Item);
                }
                State::InValue(_) => unreachable!("handled above"),
                State::Done => return Ok(()),
            }
        }
    }

    /// Scans the value at `pos` further; true once it has ended and been handled.
    fn in_value(&mut self, value: Value) -> Result<bool, ListDecodeError> {
        let from = self.scan_at;
        let found = self.scan.feed(&self.buf[from..]);
        let Some(n) = found else {
            self.scanned += self.buf.len() - from;
            self.scan_at = self.buf.len();
            let len = self.buf.len() - self.pos;
            if let Some((_, size)) = &mut self.oversized {
                *size += len;
            } else if value == Value::Item && len > self.max_item_bytes {
                let skip = oversized_item(&self.buf[self.pos..], 0, self.max_item_bytes);
                self.oversized = Some((skip, len));
            } else if value == Value::Metadata && len > self.max_item_bytes {
                return Err(self.malformed(self.pos, "list metadata within the size bound"));
            } else if value != Value::Skip {
                return Ok(false);
            }
            // Skipped or oversized: consumed as scanned, never buffered.
            self.pos = self.buf.len();
            self.scan_at = self.pos;
            return Ok(false);
        };
        self.scanned += n;
        let end = from + n;
        if self.scan.was_nothing() {
            // A `,`, `}` or `]` where a value starts: without this, an item that is nothing
            // would be skipped at the same place again and again (`[}`). (Not `end == pos`: a
            // skipped or oversized value's bytes are consumed as they are scanned, so one that
            // ends at the start of a chunk ends where `pos` is.)
            return Err(self.malformed(self.pos, "a value"));
        }
        let bytes = &self.buf[self.pos..end];
        match value {
            // Over the bound is refused whether it arrived in one chunk or several.
            Value::Metadata if bytes.len() > self.max_item_bytes => {
                return Err(self.malformed(self.pos, "list metadata within the size bound"));
            }
            Value::Metadata => {
                self.metadata =
                    serde_json::from_slice(bytes).map_err(|source| ListDecodeError::Item {
                        what: "metadata".into(),
                        source,
                    })?;
            }
            Value::Skip => {}
            Value::Item => {
                if let Some((skip, size)) = self.oversized.take() {
                    self.undecodable.push(skip.with_size(size + bytes.len()));
                } else if bytes.len() > self.max_item_bytes {
                    let size = bytes.len();
                    self.undecodable
                        .push(oversized_item(bytes, size, self.max_item_bytes));
                } else {
                    match decode_item::<K>(bytes) {
                        Ok(item) => self
                            .items
                            .push(apply_transform(self.transform.as_ref(), item)),
                        Err(skip) => self.undecodable.push(skip),
                    }
                }
            }
        }
        self.pos = end;
        self.state = match value {
            Value::Metadata | Value::Skip => State::Key,
            Value::Item => State::Item,
        };
        Ok(true)
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
        let list = decode_list(text, chunk, MAX_OBJECT_BYTES)?;
        assert_eq!(list.undecodable, vec![], "{text}");
        Ok((list.items, list.metadata))
    }

    fn decode_list(
        text: &str,
        chunk: usize,
        max_item_bytes: usize,
    ) -> Result<DecodedList<ConfigMap>, ListDecodeError> {
        let mut d = ListDecoder::<ConfigMap>::new().with_max_item_bytes(max_item_bytes);
        for part in text.as_bytes().chunks(chunk) {
            d.feed(part)?;
        }
        d.finish()
    }

    /// Found by the fuzz target `json_list` (`protobuf/testdata-fuzz/json_list/`): an item
    /// that is nothing (a `,`, `}` or `]` where it starts) is an error; it was skipped at the
    /// same place again and again, each time one more skip held, until memory ran out.
    #[test]
    fn an_item_that_is_nothing_is_an_error_not_an_endless_skip() {
        for text in [
            r#"{"items":[}"#,
            r#"{"items":[{},,{}]}"#,
            r#"{"kind":,"items":[]}"#,
        ] {
            for chunk in [1, 4, text.len()] {
                let err = decode_list(text, chunk, MAX_OBJECT_BYTES).err();
                assert!(
                    matches!(
                        err,
                        Some(ListDecodeError::Malformed {
                            what: "a value",
                            ..
                        })
                    ),
                    "{text} in chunks of {chunk}: {err:?}"
                );
            }
        }
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
        let items = d.finish().unwrap().items;
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
        let err =
            decode_in_chunks(r#"{"metadata":{"resourceVersion":7},"items":[]}"#, 4).unwrap_err();
        assert!(
            err.to_string().contains("metadata does not decode"),
            "{err}"
        );
        let err = decode_in_chunks(r#"{"items":[{"metadata":{}}"#, 4).unwrap_err();
        assert!(matches!(err, ListDecodeError::Truncated { .. }), "{err}");
        let err = decode_in_chunks(r#"["not a list"]"#, 4).unwrap_err();
        assert!(err.to_string().contains("byte 0"), "{err}");
        let err = decode_in_chunks(r#"{"items":{}}"#, 4).unwrap_err();
        assert!(err.to_string().contains("after \"items\""), "{err}");
    }

    // kubeloop's own (client-go fails the whole list): an item that does not decode into the
    // type is skipped and named, the items around it decode, however the body is cut.
    #[test]
    fn an_item_that_does_not_decode_is_skipped_and_named() {
        let good = |i: usize| {
            format!(
                r#"{{"metadata":{{"name":"cm-{i}","namespace":"ns","resourceVersion":"{i}"}}}}"#
            )
        };
        let bad = r#"{"metadata":{"name":"bad","namespace":"other","resourceVersion":"5"},"data":{"k":["not","a","string"]}}"#;
        let text = format!(
            r#"{{"metadata":{{"resourceVersion":"9"}},"items":[{},{bad},{}]}}"#,
            good(1),
            good(2)
        );
        for chunk in [1, 5, text.len()] {
            let list = decode_list(&text, chunk, MAX_OBJECT_BYTES).unwrap();
            let names: Vec<_> = list
                .items
                .iter()
                .map(|c| c.metadata.name.clone().unwrap())
                .collect();
            assert_eq!(names, ["cm-1", "cm-2"], "chunk {chunk}");
            assert_eq!(list.metadata.resource_version.as_deref(), Some("9"));
            let [skip] = &list.undecodable[..] else {
                panic!("{:?}", list.undecodable)
            };
            assert_eq!(skip.key().as_deref(), Some("other/bad"));
            assert_eq!(skip.resource_version, "5");
            assert!(
                matches!(&skip.reason, crate::cache::undecodable::UndecodableReason::Decode(m) if m.contains("invalid type")),
                "{skip}"
            );
        }
    }

    /// Found by the fuzz target `json_list`: a skipped scalar whose delimiter is the first
    /// byte of the next chunk was taken for a value that is nothing (its bytes had been
    /// consumed, so it ended where it seemed to start), and the body for malformed.
    #[test]
    fn a_skipped_scalar_that_ends_at_a_chunk_start_is_not_nothing() {
        let text = r#"{"kind":12345,"metadata":{"resourceVersion":"4"},"items":[]}"#;
        for chunk in 1..text.len() {
            let list = decode_list(text, chunk, MAX_OBJECT_BYTES)
                .unwrap_or_else(|e| panic!("chunks of {chunk}: {e}"));
            assert_eq!(list.metadata.resource_version.as_deref(), Some("4"));
        }
    }

    // client-go's streaming decoder refuses a frame over 16 MiB (ErrObjectTooLarge, and the
    // watch ends); here an item over the bound is skipped like an undecodable one, named from
    // its first bytes, and never buffered whole.
    #[test]
    fn an_item_over_the_bound_is_skipped_without_being_buffered() {
        let big = format!(
            r#"{{"metadata":{{"name":"big","namespace":"ns","resourceVersion":"3"}},"data":{{"k":"{}"}}}}"#,
            "x".repeat(10_000)
        );
        let text = format!(
            r#"{{"metadata":{{"resourceVersion":"9"}},"items":[{big},{{"metadata":{{"name":"small"}}}}]}}"#
        );
        let mut d = ListDecoder::<ConfigMap>::new().with_max_item_bytes(1000);
        let mut max_buf = 0;
        for part in text.as_bytes().chunks(100) {
            d.feed(part).unwrap();
            max_buf = max_buf.max(d.buf.len());
        }
        let list = d.finish().unwrap();
        assert!(max_buf <= 1000 + 100, "buffered {max_buf} bytes");
        assert_eq!(list.items.len(), 1);
        let [skip] = &list.undecodable[..] else {
            panic!("{:?}", list.undecodable)
        };
        assert_eq!(skip.key().as_deref(), Some("ns/big"));
        assert_eq!(
            skip.reason,
            crate::cache::undecodable::UndecodableReason::TooLarge {
                size: big.len(),
                limit: 1000
            }
        );
        // An item that arrives whole in one chunk is measured too.
        let list = decode_list(&text, text.len(), 1000).unwrap();
        assert_eq!((list.items.len(), list.undecodable.len()), (1, 1));
    }

    // kubeloop's own: the work to find where items end is linear in the body however finely
    // it is cut (a scan that restarted at the item's first byte on every chunk would look
    // at a 200 KB item about 2000 times over in 100-byte chunks).
    #[test]
    fn each_byte_is_scanned_once_however_the_body_is_cut() {
        let big = format!(
            r#"{{"metadata":{{"name":"big","namespace":"ns"}},"data":{{"k":"{}"}}}}"#,
            "x".repeat(200_000)
        );
        let text = format!(r#"{{"kind":"ConfigMapList","metadata":{{}},"items":[{big},{big}]}}"#);
        for chunk in [1, 100, 4096] {
            let mut d = ListDecoder::<ConfigMap>::new();
            for part in text.as_bytes().chunks(chunk) {
                d.feed(part).unwrap();
            }
            let scanned = d.scanned;
            assert_eq!(d.finish().unwrap().items.len(), 2);
            assert!(
                scanned <= text.len(),
                "chunks of {chunk}: {scanned} bytes scanned for a {} byte body",
                text.len()
            );
        }
    }
}
