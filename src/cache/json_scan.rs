//! Where a JSON value ends, found from its structure alone and resumably: the framing under
//! the list decoder and under the bound on one watch line or list item.
//!
//! client-go counterpart: apimachinery `pkg/util/framer` (`NewJSONFramedReader`), which frames
//! a stream into whole JSON objects with `encoding/json`'s `Decoder` (it reads a whole value
//! into memory before anything can look at it). Here the scan keeps its state between
//! chunks ([`ValueEnd`]), so every byte is looked at once however the value is cut, and a
//! value can be measured (and dropped) while it streams past.
//!
//! Only structure is checked (strings and their escapes, nesting); `serde_json` validates
//! what the scan frames.

/// The scan of one JSON value that arrives in pieces.
///
/// Invariant: `started` is false until the first byte is seen; after that, `depth` counts
/// the open `{`/`[` (0 for a top-level string or scalar), `in_string` says whether the last
/// byte scanned was inside a string, and `escaped` whether it was the `\` of an escape.
#[derive(Debug, Default, Clone)]
pub(crate) struct ValueEnd {
    started: bool,
    /// The first byte was a delimiter: the value is nothing.
    nothing: bool,
    scalar: bool,
    depth: usize,
    in_string: bool,
    escaped: bool,
}

impl ValueEnd {
    /// A scan at the value's first byte.
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether the value ended at its first byte, a `,`, `}` or `]` where a value starts (a
    /// value that goes on up to the end of one chunk and ends at the start of the next is not).
    pub fn was_nothing(&self) -> bool {
        self.nothing
    }

    /// Scans the value's next bytes (those after everything fed before). `Some(n)`: the
    /// value ends after the first `n` of them (a bare scalar ends before its delimiter).
    /// `None`: it goes on past `bytes`.
    pub fn feed(&mut self, bytes: &[u8]) -> Option<usize> {
        let mut i = 0;
        if !self.started {
            let &first = bytes.first()?;
            self.started = true;
            match first {
                b'{' | b'[' => self.depth = 1,
                b'"' => self.in_string = true,
                _ => self.scalar = true,
            }
            i = 1;
            if self.scalar && is_delimiter(first) {
                self.nothing = true;
                return Some(0);
            }
        }
        if self.scalar {
            return bytes[i..]
                .iter()
                .position(|&b| is_delimiter(b))
                .map(|n| i + n);
        }
        while i < bytes.len() {
            let b = bytes[i];
            i += 1;
            if self.in_string {
                if self.escaped {
                    self.escaped = false;
                } else if b == b'\\' {
                    self.escaped = true;
                } else if b == b'"' {
                    self.in_string = false;
                    if self.depth == 0 {
                        return Some(i);
                    }
                }
                continue;
            }
            match b {
                b'"' => self.in_string = true,
                b'{' | b'[' => self.depth += 1,
                b'}' | b']' => {
                    self.depth = self.depth.saturating_sub(1);
                    if self.depth == 0 {
                        return Some(i);
                    }
                }
                _ => {}
            }
        }
        None
    }
}

fn is_delimiter(b: u8) -> bool {
    matches!(b, b',' | b'}' | b']') || b.is_ascii_whitespace()
}

/// The first index at or after `i` that is not JSON whitespace.
pub(crate) fn skip_ws(buf: &[u8], mut i: usize) -> usize {
    while buf.get(i).is_some_and(|b| b.is_ascii_whitespace()) {
        i += 1;
    }
    i
}

/// The end (exclusive) of the string starting at `buf[start] == '"'`, if it is complete.
pub(crate) fn scan_string(buf: &[u8], start: usize) -> Option<usize> {
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

/// The value of a top-level field of the JSON object that `prefix` begins, when only the
/// object's first bytes are at hand (an object over the size bound): `Complete` if the
/// value ends within `prefix`, `Partial` (from the value's start to the end of `prefix`) if
/// it is the field `prefix` ends in. `None` if the field is not among the fields `prefix`
/// holds, or `prefix` does not begin an object.
pub(crate) fn field_in_prefix<'a>(prefix: &'a [u8], name: &[u8]) -> Option<Field<'a>> {
    let mut i = skip_ws(prefix, 0);
    if prefix.get(i) != Some(&b'{') {
        return None;
    }
    i += 1;
    loop {
        i = skip_ws(prefix, i);
        if prefix.get(i) == Some(&b',') {
            i = skip_ws(prefix, i + 1);
        }
        if prefix.get(i) != Some(&b'"') {
            return None;
        }
        let key_end = scan_string(prefix, i)?;
        let key = &prefix[i + 1..key_end - 1];
        let colon = skip_ws(prefix, key_end);
        if prefix.get(colon) != Some(&b':') {
            return None;
        }
        let start = skip_ws(prefix, colon + 1);
        let rest = prefix.get(start..)?;
        match ValueEnd::new().feed(rest) {
            Some(n) if key == name => return Some(Field::Complete(&rest[..n])),
            Some(n) => i = start + n,
            None if key == name => return Some(Field::Partial(rest)),
            None => return None,
        }
    }
}

/// A field's value found by [`field_in_prefix`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Field<'a> {
    /// The whole value.
    Complete(&'a [u8]),
    /// The value's first bytes.
    Partial(&'a [u8]),
}

impl<'a> Field<'a> {
    /// The bytes found, whole or not.
    pub fn bytes(self) -> &'a [u8] {
        match self {
            Field::Complete(b) | Field::Partial(b) => b,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn end_in_chunks(text: &str, chunk: usize) -> Option<usize> {
        let mut scan = ValueEnd::new();
        let mut done = 0;
        for part in text.as_bytes().chunks(chunk) {
            if let Some(n) = scan.feed(part) {
                return Some(done + n);
            }
            done += part.len();
        }
        None
    }

    // kubeloop's own: the end is found wherever the chunks cut strings, escapes and nesting.
    #[test]
    fn a_value_ends_at_the_same_byte_however_it_is_cut() {
        let cases = [
            (r#"{"a":"b}\"]","c":[1,{"d":"\\"}]} , next"#, 32),
            (r#""a \"quoted\" string", x"#, 21),
            ("12345,", 5),
            ("true]", 4),
            ("[[], {}] ", 8),
        ];
        for (text, want) in cases {
            for chunk in [1, 2, 3, 5, text.len()] {
                assert_eq!(
                    end_in_chunks(text, chunk),
                    Some(want),
                    "{text} in chunks of {chunk}"
                );
            }
        }
        assert_eq!(end_in_chunks(r#"{"open": ["#, 1), None);
    }

    #[test]
    fn fields_are_found_in_the_first_bytes_of_an_object() {
        let obj =
            br#"{"type":"MODIFIED","object":{"kind":"X","metadata":{"name":"a"},"data":"xxxxxxxx"#;
        assert_eq!(
            field_in_prefix(obj, b"type"),
            Some(Field::Complete(br#""MODIFIED""#))
        );
        let object = field_in_prefix(obj, b"object").unwrap();
        assert!(matches!(object, Field::Partial(_)));
        assert_eq!(
            field_in_prefix(object.bytes(), b"metadata"),
            Some(Field::Complete(br#"{"name":"a"}"#))
        );
        assert_eq!(field_in_prefix(object.bytes(), b"status"), None);
        assert_eq!(field_in_prefix(b"[1,2]", b"type"), None);
    }
}
