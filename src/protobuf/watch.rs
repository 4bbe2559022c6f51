//! Watch streams in protobuf (`Content-Type: application/vnd.kubernetes.protobuf;stream=watch`):
//! frames of a 4-byte big-endian length and that many bytes (apimachinery's
//! `framer.NewLengthDelimitedFrameReader`), each a `metav1.WatchEvent` with no envelope (the
//! stream serializer is protobuf's raw one: `{type = 1, object = 2}`), whose `object`, a
//! `RawExtension`, holds the object with its envelope (`k8s\0`, `runtime.Unknown`).

use kube_client::core::Status;
use kube_client::core::watch::{Bookmark, WatchEvent};
use serde::Deserialize;

use super::envelope::Envelope;
use super::error::DecodeError;
use super::wire::{Raw, each_field};

/// The media type of a protobuf watch stream.
pub const WATCH_CONTENT_TYPE: &str = "application/vnd.kubernetes.protobuf;stream=watch";

/// A watch body's bytes as they arrive, cut into frames.
///
/// Invariant: `buf[start..]` is what is not yet handed out; a frame is handed out only whole.
#[derive(Debug, Default)]
pub struct Frames {
    buf: Vec<u8>,
    start: usize,
}

impl Frames {
    /// A reader with nothing in it.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds bytes read from the body.
    pub fn push(&mut self, chunk: &[u8]) {
        if self.start > 0 {
            // Keep only the unread tail before reading more: each byte is moved once.
            self.buf.drain(..self.start);
            self.start = 0;
        }
        self.buf.extend_from_slice(chunk);
    }

    /// The length the next frame announces, once its four bytes are in.
    pub fn next_len(&self) -> Option<usize> {
        let head = self.buf.get(self.start..self.start + 4)?;
        Some(u32::from_be_bytes(head.try_into().expect("4 bytes")) as usize)
    }

    /// The next whole frame, if it has arrived.
    pub fn next_frame(&mut self) -> Option<&[u8]> {
        let len = self.next_len()?;
        let from = self.start + 4;
        if self.buf.len() - from < len {
            return None;
        }
        self.start = from + len;
        Some(&self.buf[from..from + len])
    }

    /// The bytes held that are not handed out yet (the start of the next frame).
    pub fn unread(&self) -> &[u8] {
        &self.buf[self.start..]
    }

    /// Bytes held that are not a whole frame yet.
    pub fn pending(&self) -> usize {
        self.buf.len() - self.start
    }

    /// Drops `n` unread bytes (the start of a frame too large to hold, dropped as it streams
    /// past).
    pub fn discard(&mut self, n: usize) {
        self.start += n.min(self.pending());
    }
}

/// One frame's event: its type and its object's envelope.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawWatchEvent<'a> {
    /// `ADDED`, `MODIFIED`, `DELETED`, `BOOKMARK` or `ERROR`.
    pub event_type: &'a str,
    /// The object (a `Status` for `ERROR`).
    pub object: Envelope<'a>,
}

impl<'a> RawWatchEvent<'a> {
    /// Reads a frame's `WatchEvent` and the envelope of its object.
    pub fn parse(frame: &'a [u8]) -> Result<Self, DecodeError> {
        let (mut event_type, mut object) = ("", None);
        each_field(frame, |tag, value| {
            match (tag, value) {
                (1, Raw::Bytes(b)) => {
                    event_type = std::str::from_utf8(b).map_err(|e| {
                        DecodeError::wire(format!("an event type that is not UTF-8: {e}"))
                    })?;
                }
                // The RawExtension: its bytes at tag 1.
                (2, Raw::Bytes(extension)) => each_field(extension, |tag, value| {
                    if let (1, Raw::Bytes(raw)) = (tag, value) {
                        object = Some(raw);
                    }
                    Ok(())
                })?,
                _ => {}
            }
            Ok(())
        })?;
        let object = object.ok_or_else(|| {
            DecodeError::wire(format!("a {event_type:?} watch event without an object"))
        })?;
        Ok(Self {
            event_type,
            object: Envelope::parse(object)?,
        })
    }

    /// The event with its object decoded into `K` (a bookmark's into [`Bookmark`], an error's
    /// into [`Status`]).
    pub fn decode<K: Deserialize<'a>>(&self) -> Result<WatchEvent<K>, DecodeError> {
        Ok(match self.event_type {
            "ADDED" => WatchEvent::Added(self.object.decode()?),
            "MODIFIED" => WatchEvent::Modified(self.object.decode()?),
            "DELETED" => WatchEvent::Deleted(self.object.decode()?),
            "BOOKMARK" => WatchEvent::Bookmark(self.object.decode::<Bookmark>()?),
            "ERROR" => WatchEvent::Error(Box::new(self.object.decode::<Status>()?)),
            other => {
                return Err(DecodeError::object(format!(
                    "unknown watch event type {other:?}"
                )));
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(bytes: &[u8]) -> Vec<u8> {
        let mut out = (bytes.len() as u32).to_be_bytes().to_vec();
        out.extend_from_slice(bytes);
        out
    }

    #[test]
    fn frames_are_handed_out_whole_however_the_bytes_arrive() {
        let mut stream = frame(b"first");
        stream.extend(frame(b""));
        stream.extend(frame(b"third frame"));
        for chunk_size in 1..stream.len() {
            let mut frames = Frames::new();
            let mut got = Vec::new();
            for chunk in stream.chunks(chunk_size) {
                frames.push(chunk);
                while let Some(f) = frames.next_frame() {
                    got.push(f.to_vec());
                }
            }
            assert_eq!(
                got,
                [&b"first"[..], b"", b"third frame"],
                "chunks of {chunk_size}"
            );
            assert_eq!(frames.pending(), 0);
        }
    }

    #[test]
    fn a_frame_names_its_length_before_it_arrives() {
        let mut frames = Frames::new();
        frames.push(&[0, 0, 1]);
        assert_eq!(frames.next_len(), None);
        frames.push(&[0, b'x']);
        assert_eq!(frames.next_len(), Some(256));
        assert_eq!(frames.next_frame(), None);
        frames.discard(5);
        assert_eq!(frames.pending(), 0);
    }

    #[test]
    fn an_event_without_an_object_or_with_a_broken_envelope_is_an_error() {
        // {type: "ADDED"} alone.
        assert!(RawWatchEvent::parse(b"\x0a\x05ADDED").is_err());
        // {type: "ADDED", object: {raw: "nope"}}.
        assert!(RawWatchEvent::parse(b"\x0a\x05ADDED\x12\x06\x0a\x04nope").is_err());
    }
}
