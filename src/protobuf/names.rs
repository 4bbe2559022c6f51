//! What an object that will not be decoded is called: its `name`, `namespace` and
//! `resourceVersion`, read loosely from the first bytes of its message, so a skip can name it
//! (an object that does not fit the Rust type, or one over the size bound whose rest is never
//! held).
//!
//! Every top-level object's message has its `ObjectMeta` at tag 1, whose `name`, `namespace`
//! and `resourceVersion` are tags 1, 3 and 6; in a watch frame the object sits at tag 2 of
//! the `WatchEvent`, as tag 1 of a `RawExtension`, as `raw` (tag 2) of its envelope.

use super::envelope::MAGIC;
use super::wire::{Raw, Reader};

/// The names read from an object's first bytes; each `None` where it was not among them.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct LooseNames {
    /// `metadata.name`.
    pub name: Option<String>,
    /// `metadata.namespace`.
    pub namespace: Option<String>,
    /// `metadata.resourceVersion`.
    pub resource_version: Option<String>,
}

impl LooseNames {
    /// Read from an object's message (no envelope), whole or cut short.
    pub fn of_object(message: &[u8]) -> Self {
        let mut names = Self::default();
        let Some(meta) = loose_field(message, 1) else {
            return names;
        };
        let mut reader = Reader::new(meta);
        while let Ok(Some((tag, raw))) = reader.field() {
            let Raw::Bytes(b) = raw else { continue };
            let value = Some(String::from_utf8_lossy(b).into_owned());
            match tag {
                1 => names.name = value,
                3 => names.namespace = value,
                6 => names.resource_version = value,
                _ => {}
            }
        }
        // A field cut off at the end was not read whole; a name cut short would be wrong.
        names
    }

    /// Read from a protobuf watch frame, whole or cut short: the event's type (`ADDED`, ...)
    /// and its object's names.
    pub fn of_watch_frame(frame: &[u8]) -> (Option<String>, Self) {
        let event_type = loose_field(frame, 1)
            .filter(|t| t.len() < 16)
            .map(|t| String::from_utf8_lossy(t).into_owned());
        let names = loose_field(frame, 2)
            .and_then(|extension| loose_field(extension, 1))
            .and_then(|object| object.strip_prefix(&MAGIC))
            .and_then(|unknown| loose_field(unknown, 2))
            .map(Self::of_object)
            .unwrap_or_default();
        (event_type, names)
    }
}

/// The first length-delimited field `tag` of a message, the part of it that is there if the
/// message is cut short inside it; `None` if the message is malformed before it.
fn loose_field(message: &[u8], tag: u32) -> Option<&[u8]> {
    let mut reader = Reader::new(message);
    loop {
        let start = reader.position();
        match reader.field() {
            Ok(Some((t, Raw::Bytes(b)))) if t == tag => return Some(b),
            Ok(Some(_)) => {}
            Ok(None) => return None,
            Err(_) => return cut_field(&message[start..], tag),
        }
    }
}

/// The bytes of a length-delimited field `tag` that starts `bytes` and runs past its end.
fn cut_field(bytes: &[u8], tag: u32) -> Option<&[u8]> {
    let mut reader = Reader::new(bytes);
    let key = reader.varint().ok()?;
    if key >> 3 != u64::from(tag) || key & 7 != 2 {
        return None;
    }
    reader.varint().ok()?;
    Some(&bytes[reader.position()..])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protobuf::wire::delimited as field;

    fn object(data: usize) -> Vec<u8> {
        let meta = [
            field(1, b"web"),
            field(3, b"prod"),
            field(6, b"42"),
            field(8, b"labels..."),
        ]
        .concat();
        [field(1, &meta), field(2, &vec![b'x'; data])].concat()
    }

    #[test]
    fn names_come_from_a_whole_or_cut_object() {
        let whole = LooseNames {
            name: Some("web".into()),
            namespace: Some("prod".into()),
            resource_version: Some("42".into()),
        };
        let object = object(300);
        assert_eq!(LooseNames::of_object(&object), whole);
        assert_eq!(LooseNames::of_object(&object[..30]), whole);
        // Cut inside the namespace: the name only.
        let cut = LooseNames::of_object(&object[..9]);
        assert_eq!(cut.name.as_deref(), Some("web"));
        assert_eq!(cut.namespace, None);
        assert_eq!(LooseNames::of_object(b"\xff"), LooseNames::default());
    }

    #[test]
    fn names_come_from_a_cut_watch_frame() {
        let unknown = [
            field(1, b"\x0a\x02v1\x12\x09ConfigMap"),
            field(2, &object(500)),
        ]
        .concat();
        let extension = field(1, &[&MAGIC[..], &unknown].concat());
        let frame = [field(1, b"MODIFIED"), field(2, &extension)].concat();
        let (event, names) = LooseNames::of_watch_frame(&frame[..80]);
        assert_eq!(event.as_deref(), Some("MODIFIED"));
        assert_eq!(names.name.as_deref(), Some("web"));
        assert_eq!(names.resource_version.as_deref(), Some("42"));
    }
}
