//! The protobuf wire format, as far as Kubernetes uses it: varints, length-delimited fields,
//! fixed64 doubles, and (never sent by the apiserver, but skipped if a newer one did) fixed32.

use super::error::DecodeError as Error;

/// A field's value as it was on the wire.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Raw<'a> {
    Varint(u64),
    Fixed64(u64),
    Bytes(&'a [u8]),
    Fixed32(u32),
}

impl Raw<'_> {
    /// Whether the value is its type's zero: 0, false, or an empty string, bytes or message.
    pub(crate) fn is_zero(&self) -> bool {
        match *self {
            Raw::Varint(v) | Raw::Fixed64(v) => v == 0,
            Raw::Fixed32(v) => v == 0,
            Raw::Bytes(b) => b.is_empty(),
        }
    }
}

/// A cursor over one message's bytes.
#[derive(Debug, Clone)]
pub(crate) struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Self {
        Self { buf, pos: 0 }
    }

    /// Where the cursor is, in bytes from the message's start.
    pub(crate) fn position(&self) -> usize {
        self.pos
    }

    /// The message's length in bytes.
    pub(crate) fn len(&self) -> usize {
        self.buf.len()
    }

    /// A reader of the same message from `pos` on.
    pub(crate) fn at(&self, pos: usize) -> Self {
        Self { buf: self.buf, pos }
    }

    #[inline]
    pub(crate) fn varint(&mut self) -> Result<u64, Error> {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let Some(&byte) = self.buf.get(self.pos) else {
                return Err(Error::wire(format!(
                    "a varint cut short at byte {}",
                    self.pos
                )));
            };
            self.pos += 1;
            value |= u64::from(byte & 0x7f) << shift;
            if byte < 0x80 {
                return Ok(value);
            }
        }
        Err(Error::wire(format!(
            "a varint longer than ten bytes ending at byte {}",
            self.pos
        )))
    }

    #[inline]
    pub(crate) fn fixed64(&mut self) -> Result<u64, Error> {
        Ok(u64::from_le_bytes(
            self.take(8)?.try_into().expect("8 bytes"),
        ))
    }

    #[inline]
    fn take(&mut self, len: usize) -> Result<&'a [u8], Error> {
        let end = self
            .pos
            .checked_add(len)
            .filter(|&end| end <= self.buf.len())
            .ok_or_else(|| {
                Error::wire(format!(
                    "{len} bytes wanted at byte {} of a {}-byte message",
                    self.pos,
                    self.buf.len()
                ))
            })?;
        let bytes = &self.buf[self.pos..end];
        self.pos = end;
        Ok(bytes)
    }

    /// The next field's tag and value, or `None` at the end of the message. Inlined: its
    /// result, returned through memory from a call, was read back before the store had
    /// landed (a store-forwarding stall: a third of the field walk's time, by `perf annotate`).
    #[inline(always)]
    pub(crate) fn field(&mut self) -> Result<Option<(u32, Raw<'a>)>, Error> {
        if self.pos == self.buf.len() {
            return Ok(None);
        }
        let key = self.varint()?;
        let tag = u32::try_from(key >> 3)
            .ok()
            .filter(|&t| t > 0)
            .ok_or_else(|| Error::wire(format!("field number {} out of range", key >> 3)))?;
        let raw = match key & 7 {
            0 => Raw::Varint(self.varint()?),
            1 => Raw::Fixed64(self.fixed64()?),
            2 => {
                let len = self.varint()?;
                let len = usize::try_from(len).map_err(|_| Error::wire(format!("length {len}")))?;
                Raw::Bytes(self.take(len)?)
            }
            5 => Raw::Fixed32(u32::from_le_bytes(
                self.take(4)?.try_into().expect("4 bytes"),
            )),
            wire => {
                return Err(Error::wire(format!(
                    "wire type {wire} (field {tag}) at byte {}: groups and unknown types are not \
                     Kubernetes protobuf",
                    self.pos
                )));
            }
        };
        Ok(Some((tag, raw)))
    }
}

/// Reads the fields of a small fixed message (`Time`, `IntOrString`, ...) into `on_field`.
pub(crate) fn each_field<'a>(
    bytes: &'a [u8],
    mut on_field: impl FnMut(u32, Raw<'a>) -> Result<(), Error>,
) -> Result<(), Error> {
    let mut reader = Reader::new(bytes);
    while let Some((tag, raw)) = reader.field()? {
        on_field(tag, raw)?;
    }
    Ok(())
}

/// A length-delimited field `tag` holding `bytes`, for tests that build messages by hand.
#[cfg(test)]
pub(crate) fn delimited(tag: u8, bytes: &[u8]) -> Vec<u8> {
    let mut out = vec![tag << 3 | 2];
    let mut len = bytes.len();
    while len >= 0x80 {
        out.push(len as u8 | 0x80);
        len >>= 7;
    }
    out.push(len as u8);
    out.extend_from_slice(bytes);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_each_wire_type_and_stops_at_the_end() {
        // 1: varint 150; 2: "hi"; 3: fixed64 1.5; 4: fixed32 7.
        let mut bytes = vec![0x08, 0x96, 0x01, 0x12, 0x02, b'h', b'i', 0x19];
        bytes.extend_from_slice(&1.5f64.to_le_bytes());
        bytes.extend_from_slice(&[0x25, 7, 0, 0, 0]);
        let mut r = Reader::new(&bytes);
        assert_eq!(r.field().unwrap(), Some((1, Raw::Varint(150))));
        assert_eq!(r.field().unwrap(), Some((2, Raw::Bytes(b"hi"))));
        assert_eq!(
            r.field().unwrap(),
            Some((3, Raw::Fixed64(1.5f64.to_bits())))
        );
        assert_eq!(r.field().unwrap(), Some((4, Raw::Fixed32(7))));
        assert_eq!(r.field().unwrap(), None);
    }

    #[test]
    fn a_negative_int32_is_ten_bytes() {
        let mut bytes = vec![0x08];
        bytes.extend_from_slice(&[0xff; 9]);
        bytes.push(0x01);
        let mut r = Reader::new(&bytes);
        assert_eq!(r.field().unwrap(), Some((1, Raw::Varint(u64::MAX))));
        assert_eq!(u64::MAX as i64 as i32, -1);
    }

    #[test]
    fn truncated_and_malformed_input_is_an_error_not_a_panic() {
        for bad in [
            &[0x08][..],         // a key without its varint
            &[0x12, 0x05, b'a'], // a length past the end
            &[0x0b],             // wire type 3 (a group)
            &[0x00, 0x01],       // field number 0
            &[
                0x12, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f,
            ], // a huge length
            &[
                0x08, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01,
            ], // 11 bytes
        ] {
            let mut r = Reader::new(bad);
            assert!(r.field().is_err(), "{bad:?}");
        }
    }
}
