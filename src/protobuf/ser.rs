//! The encoder: a built-in object written as the apiserver's protobuf, byte for byte as Go's
//! generated `Marshal` writes it, from the same field table the decoder reads with.
//!
//! The object is first serialized to a `serde_json::Value` (its Go JSON form, as k8s-openapi
//! writes it) and that value is walked against the table. A serde `Serializer` could skip the
//! intermediate value, but protobuf wants each message's fields in tag order with Go's zero
//! values for the ones the JSON left out, while k8s-openapi's `Serialize` impls hand fields
//! over in Rust declaration order and skip every `None`: a `Serializer` would have to buffer
//! each message's fields before writing them, which is the value again, built by hand. The
//! cost is one `Value` tree per write (an allocation per string and map), small beside the
//! request it goes into.
//!
//! Go's rules, from gogo-protobuf's generated `MarshalToSizedBuffer` (k8s.io/api's
//! `generated.pb.go`):
//! - a field that is not a pointer, slice or map is always written, its zero value included
//!   (an empty string, 0, false, an empty message); a `[]byte` is written unless it is nil;
//! - a pointer is written when it is set, even to a zero;
//! - a slice writes each item as one occurrence of its tag, a map one entry (key at tag 1,
//!   value at tag 2) per key in sorted order; an empty one writes nothing;
//! - `Time` is `{seconds = 1, nanos = 2}` with nanos 0 (`ProtoTime`), `MicroTime` keeps
//!   microseconds, and the zero time is an empty message;
//! - `IntOrString` writes all three of its fields, `Quantity` its string.
//!
//! What differs on purpose: a `Quantity` is written as given, where Go writes its canonical
//! form (`1000m` as `1`); the apiserver parses either the same way. A field the table does not
//! know is an error rather than dropped, so nothing the caller set is silently lost.
//!
//! Counterparts: k8s.io/apimachinery `pkg/runtime/serializer/protobuf` (`Serializer.Encode`:
//! the `k8s\0` prefix and `runtime.Unknown`), the types' `generated.pb.go`.

use serde::Serialize;
use serde_json::{Map, Value};

use super::envelope::MAGIC;
use super::kinds;
use super::table::{Field, I, Kind, L, Message, P};

/// Why an object could not be written as protobuf: which object (`apiVersion` and `kind`),
/// where (the JSON path of the field) and what.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}: {}{}", object_name(&.0.api_version, &.0.kind), path_prefix(&.0.path), .0.message)]
pub struct EncodeError(Box<Inner>);

#[derive(Debug, Clone, PartialEq, Eq)]
struct Inner {
    api_version: String,
    kind: String,
    path: String,
    message: String,
}

/// `apps/v1 Deployment`, or what the object lacked to be named so.
fn object_name(api_version: &str, kind: &str) -> String {
    match (api_version, kind) {
        ("", "") => "an object".into(),
        (api_version, "") => format!("an object of {api_version}"),
        (api_version, kind) => format!("{api_version} {kind}"),
    }
}

fn path_prefix(path: &str) -> String {
    if path.is_empty() {
        String::new()
    } else {
        format!("at {path}: ")
    }
}

impl EncodeError {
    fn new(message: String) -> Self {
        Self(Box::new(Inner {
            api_version: String::new(),
            kind: String::new(),
            path: String::new(),
            message,
        }))
    }

    /// The same error, one field further out.
    fn within(mut self, field: &str) -> Self {
        let path = &mut self.0.path;
        *path = if path.is_empty() {
            field.to_string()
        } else {
            format!("{field}.{path}")
        };
        self
    }

    fn of(mut self, api_version: &str, kind: &str) -> Self {
        self.0.api_version = api_version.to_string();
        self.0.kind = kind.to_string();
        self
    }

    /// The JSON path of the field that could not be written (`spec.replicas`), empty when the
    /// object as a whole could not.
    pub fn path(&self) -> &str {
        &self.0.path
    }

    /// The object's `kind`, as it gave it (empty when it gave none).
    pub fn kind(&self) -> &str {
        &self.0.kind
    }
}

type Result<T, E = EncodeError> = std::result::Result<T, E>;

/// Writes a built-in object (a k8s-openapi type, or a `serde_json::Value` of its JSON with
/// `apiVersion` and `kind`) as the apiserver's protobuf: `k8s\0`, then a `runtime.Unknown`
/// holding its TypeMeta and its message. The bytes are returned only whole: on an error
/// nothing is.
pub fn to_vec<T: Serialize + ?Sized>(object: &T) -> Result<Vec<u8>> {
    let value = serde_json::to_value(object)
        .map_err(|e| EncodeError::new(format!("does not serialize: {e}")))?;
    value_to_vec(&value)
}

/// [`to_vec`] of an object's JSON value.
fn value_to_vec(value: &Value) -> Result<Vec<u8>> {
    let Value::Object(object) = value else {
        return Err(EncodeError::new(format!(
            "an object is a JSON object, not {}",
            what(value)
        )));
    };
    let type_meta = |name: &str| match object.get(name) {
        Some(Value::String(s)) if !s.is_empty() => Ok(s.as_str()),
        _ => Err(EncodeError::new(format!(
            "the object has no {name}, which protobuf's envelope carries"
        ))),
    };
    let api_version = type_meta("apiVersion")?;
    let kind = type_meta("kind").map_err(|e| e.of(api_version, ""))?;
    let message = kinds::root(api_version, kind).ok_or_else(|| {
        EncodeError::new(
            "is not a built-in kind kubeloop's protobuf table knows (a custom resource is \
             written as JSON)"
                .into(),
        )
        .of(api_version, kind)
    })?;
    let mut out = Writer(Vec::with_capacity(256));
    out.0.extend_from_slice(&MAGIC);
    // runtime.Unknown, as `Unknown.NestedMarshalTo` writes it: TypeMeta, the object's
    // message, then an empty contentEncoding and contentType.
    out.nested(1, |out| {
        out.string(1, api_version);
        out.string(2, kind);
        Ok(())
    })?;
    out.nested(2, |out| write_message(out, message, Some(object)))
        .map_err(|e| e.of(api_version, kind))?;
    out.string(3, "");
    out.string(4, "");
    Ok(out.0)
}

/// A buffer being written forward. A nested message's length goes before its body, so one
/// byte is kept for it and the body moved along when the length needs more.
struct Writer(Vec<u8>);

const VARINT: u32 = 0;
const FIXED64: u32 = 1;
const DELIMITED: u32 = 2;

impl Writer {
    fn varint(&mut self, mut v: u64) {
        while v >= 0x80 {
            self.0.push(v as u8 | 0x80);
            v >>= 7;
        }
        self.0.push(v as u8);
    }

    fn key(&mut self, tag: u32, wire: u32) {
        self.varint(u64::from(tag << 3 | wire));
    }

    fn bytes(&mut self, tag: u32, bytes: &[u8]) {
        self.key(tag, DELIMITED);
        self.varint(bytes.len() as u64);
        self.0.extend_from_slice(bytes);
    }

    fn string(&mut self, tag: u32, s: &str) {
        self.bytes(tag, s.as_bytes());
    }

    /// A varint field: Go writes an int32 as `uint64(v)`, so a negative one is sign-extended
    /// to ten bytes.
    fn int(&mut self, tag: u32, v: i64) {
        self.key(tag, VARINT);
        self.varint(v as u64);
    }

    fn nested(&mut self, tag: u32, body: impl FnOnce(&mut Self) -> Result<()>) -> Result<()> {
        self.key(tag, DELIMITED);
        let at = self.0.len();
        self.0.push(0);
        body(self)?;
        let len = self.0.len() - at - 1;
        if len < 0x80 {
            self.0[at] = len as u8;
            return Ok(());
        }
        let mut prefix = Writer(Vec::with_capacity(10));
        prefix.varint(len as u64);
        self.0.splice(at..=at, prefix.0);
        Ok(())
    }
}

fn what(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a bool",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn expected(wanted: &str, value: &Value) -> EncodeError {
    EncodeError::new(format!("expected {wanted}, found {}", what(value)))
}

/// A message's fields in tag order, from `object` (its JSON; `None` for Go's zero value of the
/// struct).
fn write_message(
    out: &mut Writer,
    message: &'static Message,
    object: Option<&Map<String, Value>>,
) -> Result<()> {
    if let Some(object) = object {
        // A key no field of the message (or of a message inlined into it) is named. An
        // object's `apiVersion` and `kind` (its TypeMeta) are in no message: Go's generated
        // protobuf leaves TypeMeta out, and the envelope carries the top object's.
        for key in object.keys() {
            let type_meta = key == "apiVersion" || key == "kind";
            if !type_meta && !knows(message, key) {
                return Err(EncodeError::new(format!(
                    "{} has no field {key:?} in kubeloop's protobuf table",
                    message.short_name(),
                ))
                .within(key));
            }
        }
    }
    write_fields(out, message, object)
}

fn knows(message: &'static Message, key: &str) -> bool {
    message.fields.iter().any(|f| match f.kind {
        Kind::Msg(index) if f.has(I) => knows(kinds::message(index), key),
        _ => f.json == key,
    })
}

fn write_fields(
    out: &mut Writer,
    message: &'static Message,
    object: Option<&Map<String, Value>>,
) -> Result<()> {
    for field in message.fields {
        if field.has(I) {
            // An inline struct's fields are the parent's in JSON, its own message on the wire.
            let Kind::Msg(index) = field.kind else {
                return Err(EncodeError::new(format!(
                    "{}: inline field {} is not a message",
                    message.short_name(),
                    field.tag
                )));
            };
            out.nested(field.tag, |out| {
                write_fields(out, kinds::message(index), object)
            })?;
            continue;
        }
        let value = object
            .and_then(|o| o.get(field.json))
            .filter(|v| !v.is_null());
        write_field(out, field, value).map_err(|e| e.within(field.json))?;
    }
    Ok(())
}

fn write_field(out: &mut Writer, field: &'static Field, value: Option<&Value>) -> Result<()> {
    if let Kind::Map(entry) = field.kind {
        let Some(value) = value else { return Ok(()) };
        let Value::Object(map) = value else {
            return Err(expected("an object (a map)", value));
        };
        let mut keys: Vec<&String> = map.keys().collect();
        // Go's `sort.Strings`: byte order, as `str`'s.
        keys.sort_unstable();
        for key in keys {
            let value = Some(&map[key]).filter(|v| !v.is_null());
            out.nested(field.tag, |out| {
                out.string(1, key);
                // A nil `[]byte` value is left out; any other value is always written.
                if *entry == Kind::Bytes && value.is_none() {
                    return Ok(());
                }
                write_value(out, 2, *entry, value)
            })
            .map_err(|e| e.within(key))?;
        }
        return Ok(());
    }
    if field.has(L) {
        let Some(value) = value else { return Ok(()) };
        let Value::Array(items) = value else {
            return Err(expected("an array", value));
        };
        for (i, item) in items.iter().enumerate() {
            let item = Some(item).filter(|v| !v.is_null());
            write_value(out, field.tag, field.kind, item).map_err(|e| e.within(&i.to_string()))?;
        }
        return Ok(());
    }
    // A nil pointer, or a nil `[]byte`, is left out; any other value is written, zero or not.
    if value.is_none() && (field.has(P) || field.kind == Kind::Bytes) {
        return Ok(());
    }
    write_value(out, field.tag, field.kind, value)
}

/// One value at `tag`; `None` is Go's zero value of the kind.
fn write_value(out: &mut Writer, tag: u32, kind: Kind, value: Option<&Value>) -> Result<()> {
    match kind {
        Kind::Str => out.string(tag, string(value)?),
        Kind::Bool => {
            let b = match value {
                None => false,
                Some(Value::Bool(b)) => *b,
                Some(other) => return Err(expected("a bool", other)),
            };
            out.int(tag, i64::from(b));
        }
        Kind::I32 => {
            let v = integer(value)?;
            let v = i32::try_from(v)
                .map_err(|_| EncodeError::new(format!("{v} is out of an int32's range")))?;
            out.int(tag, i64::from(v));
        }
        Kind::I64 => out.int(tag, integer(value)?),
        Kind::F64 => {
            let v = match value {
                None => 0.0,
                Some(Value::Number(n)) => n
                    .as_f64()
                    .ok_or_else(|| EncodeError::new(format!("{n} is not a double")))?,
                Some(other) => return Err(expected("a number", other)),
            };
            out.key(tag, FIXED64);
            out.0.extend_from_slice(&v.to_bits().to_le_bytes());
        }
        Kind::Bytes => {
            use base64::Engine as _;
            let text = string(value)?;
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(text)
                .map_err(|e| EncodeError::new(format!("bytes that are not base64: {e}")))?;
            out.bytes(tag, &bytes);
        }
        Kind::Msg(index) => {
            let object = object(value)?;
            out.nested(tag, |out| write_message(out, kinds::message(index), object))?;
        }
        Kind::Map(_) => {
            return Err(EncodeError::new(
                "the table has a map inside a map, which Kubernetes has none of".into(),
            ));
        }
        Kind::Time | Kind::MicroTime => {
            let at = match value {
                None => None,
                Some(Value::String(text)) => time(text)?,
                Some(other) => return Err(expected("a time (RFC 3339 text)", other)),
            };
            out.nested(tag, |out| {
                if let Some(at) = at {
                    // Go's `Unix()` and `Nanosecond()`: the second rounded down, the
                    // nanoseconds after it.
                    let (mut seconds, mut nanos) = (at.as_second(), at.subsec_nanosecond());
                    if nanos < 0 {
                        (seconds, nanos) = (seconds - 1, nanos + 1_000_000_000);
                    }
                    // `Time.ProtoTime` leaves nanos at 0; `MicroTime` truncates to the
                    // microsecond.
                    let nanos = if kind == Kind::Time {
                        0
                    } else {
                        nanos - nanos % 1000
                    };
                    out.int(1, seconds);
                    out.int(2, i64::from(nanos));
                }
                Ok(())
            })?;
        }
        Kind::Quantity => {
            let text = match value {
                // The zero Quantity's String() is "0".
                None => "0",
                Some(Value::String(text)) => text,
                Some(Value::Number(n)) => {
                    let text = n.to_string();
                    return out.nested(tag, |out| {
                        out.string(1, &text);
                        Ok(())
                    });
                }
                Some(other) => return Err(expected("a quantity (a string)", other)),
            };
            out.nested(tag, |out| {
                out.string(1, text);
                Ok(())
            })?;
        }
        Kind::IntOrString => {
            let (is_string, int, text) = match value {
                None => (false, 0, ""),
                Some(Value::String(text)) => (true, 0, text.as_str()),
                Some(number @ Value::Number(_)) => {
                    let v = integer(Some(number))?;
                    let v = i32::try_from(v).map_err(|_| {
                        EncodeError::new(format!("{v} is out of an IntOrString's int32 range"))
                    })?;
                    (false, v, "")
                }
                Some(other) => return Err(expected("an int or a string", other)),
            };
            out.nested(tag, |out| {
                out.int(1, i64::from(is_string));
                out.int(2, i64::from(int));
                out.string(3, text);
                Ok(())
            })?;
        }
        Kind::RawJson => {
            out.nested(tag, |out| {
                if let Some(value) = value {
                    let raw = serde_json::to_vec(value)
                        .map_err(|e| EncodeError::new(format!("raw JSON: {e}")))?;
                    out.bytes(1, &raw);
                }
                Ok(())
            })?;
        }
        Kind::StringList => {
            let items = match value {
                None => &[][..],
                Some(Value::Array(items)) => items.as_slice(),
                Some(other) => return Err(expected("an array of strings", other)),
            };
            out.nested(tag, |out| {
                for (i, item) in items.iter().enumerate() {
                    out.string(1, string(Some(item)).map_err(|e| e.within(&i.to_string()))?);
                }
                Ok(())
            })?;
        }
        Kind::SchemaOrArray(schema) => out.nested(tag, |out| match value {
            None => Ok(()),
            Some(Value::Array(items)) => {
                for (i, item) in items.iter().enumerate() {
                    write_value(out, 2, Kind::Msg(schema), Some(item))
                        .map_err(|e| e.within(&i.to_string()))?;
                }
                Ok(())
            }
            Some(one) => write_value(out, 1, Kind::Msg(schema), Some(one)),
        })?,
        Kind::SchemaOrBool(schema) => out.nested(tag, |out| match value {
            None => {
                out.int(1, 0);
                Ok(())
            }
            Some(Value::Bool(allows)) => {
                out.int(1, i64::from(*allows));
                Ok(())
            }
            // Go's `UnmarshalJSON` of a schema sets `Allows` too.
            Some(one) => {
                out.int(1, 1);
                write_value(out, 2, Kind::Msg(schema), Some(one))
            }
        })?,
        Kind::SchemaOrStringArray(schema) => out.nested(tag, |out| match value {
            None => Ok(()),
            Some(Value::Array(items)) => {
                for (i, item) in items.iter().enumerate() {
                    out.string(2, string(Some(item)).map_err(|e| e.within(&i.to_string()))?);
                }
                Ok(())
            }
            Some(one) => write_value(out, 1, Kind::Msg(schema), Some(one)),
        })?,
    }
    Ok(())
}

fn string(value: Option<&Value>) -> Result<&str> {
    match value {
        None => Ok(""),
        Some(Value::String(s)) => Ok(s),
        Some(other) => Err(expected("a string", other)),
    }
}

fn integer(value: Option<&Value>) -> Result<i64> {
    match value {
        None => Ok(0),
        Some(Value::Number(n)) => n
            .as_i64()
            .ok_or_else(|| EncodeError::new(format!("{n} is not an integer in an int64's range"))),
        Some(other) => Err(expected("an integer", other)),
    }
}

fn object(value: Option<&Value>) -> Result<Option<&Map<String, Value>>> {
    match value {
        None => Ok(None),
        Some(Value::Object(map)) => Ok(Some(map)),
        Some(other) => Err(expected("an object", other)),
    }
}

/// A time's RFC 3339 text as an instant; `None` for Go's zero time, which is an empty message.
fn time(text: &str) -> Result<Option<jiff::Timestamp>> {
    let at: jiff::Timestamp = text
        .parse()
        .map_err(|e| EncodeError::new(format!("{text:?} is not an RFC 3339 time: {e}")))?;
    // Go's zero `time.Time`, 0001-01-01T00:00:00Z.
    const GO_ZERO: i64 = -62_135_596_800;
    Ok((at.as_second() != GO_ZERO || at.subsec_nanosecond() != 0).then_some(at))
}

#[cfg(test)]
#[path = "ser_tests.rs"]
mod tests;
