//! LIST bodies in protobuf, read as their bytes arrive, so a list is never held whole: `k8s\0`,
//! then a `runtime.Unknown` whose `raw` (tag 2) is the `*List` message, whose fields are its
//! `metadata` (tag 1, a `ListMeta`) and its `items` (tag 2, one field each, an object's message
//! without envelope or TypeMeta). [`ListReader`] cuts that stream into its parts; decoding
//! them is the caller's ([`ObjectType`](super::ObjectType)).
//!
//! Counterpart: none. client-go reads the whole body, then unmarshals the list
//! (`protobuf.go`'s `Serializer.Decode`); kubernetes/kubernetes#73497 asks for this.
//!
//! Invariants (on [`ListReader`]):
//! - `buf[..pos]` has been read, and is dropped at the end of each [`feed`](ListReader::feed);
//!   `dropped` counts the bytes dropped before `buf[0]`, so `dropped + pos` is the offset in
//!   the body;
//! - while `skip > 0`, the next `skip` bytes of the body are dropped as they arrive (a field
//!   nobody reads, or the rest of an item over the bound), and nothing else is parsed;
//! - a part is handed out only whole, except an item over the bound, handed out once with
//!   its first bytes ([`ListPart::Oversized`]).

use super::envelope::MAGIC;
use super::error::DecodeError as Error;
use super::wire::{Raw, each_field};

/// How much of an item over the bound is handed out to name it: its metadata comes first.
const OVERSIZED_PREFIX: usize = 4096;

/// One part of a list, as [`ListReader::feed`] hands it out.
#[derive(Debug, PartialEq, Eq)]
pub enum ListPart<'a> {
    /// The `ListMeta` message.
    Metadata(&'a [u8]),
    /// One item's message.
    Item(&'a [u8]),
    /// An item over the bound: its length and first bytes; the rest is dropped unread.
    Oversized {
        /// The item's first bytes (at most 4 KiB).
        prefix: &'a [u8],
        /// Its whole length.
        len: usize,
    },
}

/// Where the bytes at `pos` are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Before `k8s\0`.
    Magic,
    /// Among the fields of `runtime.Unknown`, before `raw`.
    Envelope,
    /// Inside the list message, which ends at this offset in the body.
    List { end: usize },
    /// Among the fields of `runtime.Unknown`, after `raw`.
    AfterList,
}

/// A field's key and the bytes of its header.
struct Header {
    tag: u64,
    /// The length of a length-delimited field; 8 or 4 for fixed ones; 0 for a varint, whose
    /// value is in the header.
    len: usize,
    /// Whether the value is length-delimited.
    delimited: bool,
    /// Bytes of the key and the length (or the varint value).
    size: usize,
}

/// A LIST body cut into its parts as it arrives.
#[derive(Debug)]
pub struct ListReader {
    buf: Vec<u8>,
    pos: usize,
    dropped: usize,
    skip: usize,
    state: State,
    /// The list kind the envelope must name (`ConfigMapList`).
    list_kind: String,
    /// The bound on one item (and on any other field, which is far smaller).
    max_item_bytes: usize,
}

impl ListReader {
    /// A reader at the start of a body that must be a list of kind `list_kind`, whose items
    /// over `max_item_bytes` are handed out as [`ListPart::Oversized`].
    pub fn new(list_kind: &str, max_item_bytes: usize) -> Self {
        Self {
            buf: Vec::new(),
            pos: 0,
            dropped: 0,
            skip: 0,
            state: State::Magic,
            list_kind: list_kind.to_string(),
            max_item_bytes,
        }
    }

    /// Reads `bytes`, the next ones of the body, handing each part that completes to
    /// `on_part`, in body order. An error from `on_part` stops the reading and is returned.
    pub fn feed<E: From<Error>>(
        &mut self,
        bytes: &[u8],
        mut on_part: impl FnMut(ListPart<'_>) -> Result<(), E>,
    ) -> Result<(), E> {
        self.buf.extend_from_slice(bytes);
        let result = self.advance(&mut on_part);
        self.buf.drain(..self.pos);
        self.dropped += self.pos;
        self.pos = 0;
        result
    }

    /// Says whether the body ended where a list may end.
    pub fn finish(&self) -> Result<(), Error> {
        if self.state == State::AfterList && self.skip == 0 && self.pos == self.buf.len() {
            return Ok(());
        }
        Err(Error::wire(format!(
            "the LIST body ended inside the list ({} bytes read)",
            self.dropped + self.buf.len()
        )))
    }

    fn offset(&self) -> usize {
        self.dropped + self.pos
    }

    fn advance<E: From<Error>>(
        &mut self,
        on_part: &mut impl FnMut(ListPart<'_>) -> Result<(), E>,
    ) -> Result<(), E> {
        loop {
            if self.skip > 0 {
                let n = self.skip.min(self.buf.len() - self.pos);
                self.pos += n;
                self.skip -= n;
                if self.skip > 0 {
                    return Ok(());
                }
            }
            let available = self.buf.len() - self.pos;
            match self.state {
                State::Magic => {
                    if available < MAGIC.len() {
                        return Ok(());
                    }
                    if self.buf[self.pos..self.pos + MAGIC.len()] != MAGIC {
                        return Err(Error::wire(
                            "the LIST body does not start with k8s\\0".to_string(),
                        )
                        .into());
                    }
                    self.pos += MAGIC.len();
                    self.state = State::Envelope;
                }
                State::List { end } if self.offset() == end => self.state = State::AfterList,
                State::List { end } => {
                    let Some(h) = self.header()? else {
                        return Ok(());
                    };
                    // `end` is at or past the offset; a length may be any u64 (no overflow).
                    if h.size.saturating_add(h.len) > end - self.offset() {
                        return Err(Error::wire(format!(
                            "a field of {} bytes at byte {} runs past the list's end at byte {end}",
                            h.len,
                            self.offset()
                        ))
                        .into());
                    }
                    match (h.tag, h.delimited) {
                        (2, true) if h.len > self.max_item_bytes => {
                            let shown = h.len.min(OVERSIZED_PREFIX);
                            if available < h.size + shown {
                                return Ok(());
                            }
                            let from = self.pos + h.size;
                            self.pos = from + shown;
                            self.skip = h.len - shown;
                            on_part(ListPart::Oversized {
                                prefix: &self.buf[from..from + shown],
                                len: h.len,
                            })?;
                        }
                        (1 | 2, true) => {
                            let Some(value) = self.whole(&h)? else {
                                return Ok(());
                            };
                            let value = &self.buf[value];
                            on_part(if h.tag == 1 {
                                ListPart::Metadata(value)
                            } else {
                                ListPart::Item(value)
                            })?;
                        }
                        _ => self.skip_field(&h),
                    }
                }
                State::Envelope | State::AfterList => {
                    let Some(h) = self.header()? else {
                        return Ok(());
                    };
                    match (h.tag, h.delimited, self.state) {
                        (2, true, State::Envelope) => {
                            self.pos += h.size;
                            self.state = State::List {
                                end: self.offset().saturating_add(h.len),
                            };
                        }
                        (1 | 3, true, _) => {
                            let Some(value) = self.whole(&h)? else {
                                return Ok(());
                            };
                            let value = &self.buf[value];
                            if h.tag == 1 {
                                self.check_kind(value)?;
                            } else if !value.is_empty() {
                                return Err(Error::wire(format!(
                                    "contentEncoding {:?}: kubeloop reads unencoded lists only",
                                    String::from_utf8_lossy(value)
                                ))
                                .into());
                            }
                        }
                        _ => self.skip_field(&h),
                    }
                }
            }
        }
    }

    /// The TypeMeta of the envelope must name the list kind asked for.
    fn check_kind(&self, type_meta: &[u8]) -> Result<(), Error> {
        let mut kind: &[u8] = &[];
        each_field(type_meta, |tag, value| {
            if let (2, Raw::Bytes(b)) = (tag, value) {
                kind = b;
            }
            Ok(())
        })?;
        if kind != self.list_kind.as_bytes() {
            return Err(Error::object(format!(
                "the LIST body is a {:?}, not a {}",
                String::from_utf8_lossy(kind),
                self.list_kind
            )));
        }
        Ok(())
    }

    /// Where the value of a length-delimited field is in `buf`, once all of it has arrived;
    /// the field is then read.
    fn whole(&mut self, h: &Header) -> Result<Option<std::ops::Range<usize>>, Error> {
        if h.len > self.max_item_bytes {
            return Err(Error::wire(format!(
                "a field of {} bytes at byte {}, over the bound of {}",
                h.len,
                self.offset(),
                self.max_item_bytes
            )));
        }
        if self.buf.len() - self.pos < h.size + h.len {
            return Ok(None);
        }
        let from = self.pos + h.size;
        self.pos = from + h.len;
        Ok(Some(from..self.pos))
    }

    fn skip_field(&mut self, h: &Header) {
        self.pos += h.size;
        self.skip = h.len;
    }

    /// The header of the field at `pos`, once all of it has arrived.
    fn header(&self) -> Result<Option<Header>, Error> {
        let bytes = &self.buf[self.pos..];
        let Some((key, key_size)) = varint(bytes)? else {
            return Ok(None);
        };
        let tag = key >> 3;
        if tag == 0 {
            return Err(Error::wire(format!(
                "field number 0 at byte {}",
                self.offset()
            )));
        }
        let (len, delimited, size) = match key & 7 {
            0 => match varint(&bytes[key_size..])? {
                Some((_, n)) => (0, false, key_size + n),
                None => return Ok(None),
            },
            1 => (8, false, key_size),
            5 => (4, false, key_size),
            2 => match varint(&bytes[key_size..])? {
                Some((len, n)) => (
                    usize::try_from(len).map_err(|_| Error::wire(format!("length {len}")))?,
                    true,
                    key_size + n,
                ),
                None => return Ok(None),
            },
            wire => {
                return Err(Error::wire(format!(
                    "wire type {wire} (field {tag}) at byte {}",
                    self.offset()
                )));
            }
        };
        Ok(Some(Header {
            tag,
            len,
            delimited,
            size,
        }))
    }
}

/// A varint at the start of `bytes` and its size, `None` if it has not all arrived.
fn varint(bytes: &[u8]) -> Result<Option<(u64, usize)>, Error> {
    let mut value = 0u64;
    for (i, &byte) in bytes.iter().enumerate().take(10) {
        value |= u64::from(byte & 0x7f) << (7 * i);
        if byte < 0x80 {
            return Ok(Some((value, i + 1)));
        }
    }
    if bytes.len() >= 10 {
        return Err(Error::wire("a varint longer than ten bytes".to_string()));
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protobuf::wire::delimited as field;

    /// `k8s\0` and an envelope of a `ConfigMapList` holding `list`.
    fn body(list: &[u8]) -> Vec<u8> {
        let mut type_meta = field(1, b"v1");
        type_meta.extend(field(2, b"ConfigMapList"));
        let mut out = MAGIC.to_vec();
        out.extend(field(1, &type_meta));
        out.extend(field(2, list));
        out.extend(field(3, b""));
        out.extend(field(4, b""));
        out
    }

    #[derive(Debug, PartialEq, Eq)]
    enum Part {
        Metadata(Vec<u8>),
        Item(Vec<u8>),
        Oversized(Vec<u8>, usize),
    }

    fn read(body: &[u8], chunk: usize, max: usize) -> Result<Vec<Part>, Error> {
        let mut reader = ListReader::new("ConfigMapList", max);
        let mut parts = Vec::new();
        for c in body.chunks(chunk) {
            reader.feed::<Error>(c, |p| {
                parts.push(match p {
                    ListPart::Metadata(m) => Part::Metadata(m.to_vec()),
                    ListPart::Item(i) => Part::Item(i.to_vec()),
                    ListPart::Oversized { prefix, len } => Part::Oversized(prefix.to_vec(), len),
                });
                Ok(())
            })?;
            let bound = max.max(OVERSIZED_PREFIX) + 32 + chunk;
            assert!(reader.buf.len() <= bound, "held {}", reader.buf.len());
        }
        reader.finish()?;
        Ok(parts)
    }

    /// Found by the fuzz target `protobuf_list` (`testdata-fuzz/protobuf_list/`): a field
    /// length near 2^64, in the list or around it, is an error, not an overflow.
    #[test]
    fn a_length_near_two_to_the_64_is_an_error() {
        let huge = [
            0x12, 0xf0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01,
        ];
        let mut list = field(1, b"\x0a\x0312");
        list.extend(huge);
        let err = read(&body(&list), 3, 1000).unwrap_err();
        assert!(
            err.to_string().contains("runs past the list's end"),
            "{err}"
        );
        // The list's own length: the body ends inside it.
        let mut type_meta = field(1, b"v1");
        type_meta.extend(field(2, b"ConfigMapList"));
        let body = [&MAGIC[..], &field(1, &type_meta), &huge, &field(2, b"item")].concat();
        let err = read(&body, 3, 1000).unwrap_err();
        assert!(err.to_string().contains("ended inside the list"), "{err}");
    }

    #[test]
    fn parts_come_out_whole_however_the_body_is_cut() {
        let mut list = field(1, b"\x0a\x0312");
        list.extend(field(2, b"first"));
        list.extend(field(2, b""));
        list.extend(field(2, &[7u8; 300]));
        let body = body(&list);
        for chunk in 1..body.len() {
            assert_eq!(
                read(&body, chunk, 1000).unwrap(),
                [
                    Part::Metadata(b"\x0a\x0312".to_vec()),
                    Part::Item(b"first".to_vec()),
                    Part::Item(Vec::new()),
                    Part::Item(vec![7; 300]),
                ],
                "chunks of {chunk}"
            );
        }
    }

    #[test]
    fn an_item_over_the_bound_is_named_from_its_start_and_dropped_unheld() {
        let mut big = b"metadata".to_vec();
        big.extend([9u8; 10_000]);
        let mut list = field(2, &big);
        list.extend(field(2, b"after"));
        let body = body(&list);
        for chunk in [1, 7, 100, 5000, body.len()] {
            let parts = read(&body, chunk, 200).unwrap();
            assert_eq!(parts.len(), 2);
            let Part::Oversized(prefix, len) = &parts[0] else {
                panic!("{parts:?}")
            };
            assert_eq!(*len, big.len());
            assert_eq!(prefix[..], big[..OVERSIZED_PREFIX]);
            assert_eq!(parts[1], Part::Item(b"after".to_vec()));
        }
    }

    #[test]
    fn an_empty_list_and_unknown_fields_read_cleanly() {
        assert_eq!(read(&body(&[]), 3, 100).unwrap(), []);
        // A varint field 7 and a bytes field 9 inside the list, from a newer server.
        let mut list = vec![7 << 3, 0x96, 0x01];
        list.extend(field(9, b"new"));
        list.extend(field(2, b"x"));
        assert_eq!(
            read(&body(&list), 2, 100).unwrap(),
            [Part::Item(b"x".to_vec())]
        );
    }

    #[test]
    fn bad_bodies_are_errors_that_say_what() {
        let good = body(&field(2, b"item"));
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (b"{\"kind\":\"ConfigMapList\"}".to_vec(), "k8s\\0"),
            (good[..good.len() - 5].to_vec(), "ended inside the list"),
            (
                [&MAGIC[..], &field(1, &field(2, b"PodList"))].concat(),
                "PodList",
            ),
            ([&MAGIC[..], &[0x0b]].concat(), "wire type 3"),
            (
                [&MAGIC[..], &field(2, &field(2, &[1; 50])[..10])].concat(),
                "runs past the list's end",
            ),
        ];
        for (bad, says) in cases {
            let err = read(&bad, 4, 100).unwrap_err().to_string();
            assert!(err.contains(says), "{err:?} should say {says:?}");
        }
    }
}
