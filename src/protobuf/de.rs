//! A serde `Deserializer` over one protobuf message, driven by the field table, that shows the
//! message to a `Deserialize` impl exactly as Go's JSON of the same object would: the JSON
//! names, the zero values Go writes and the empty ones it omits, inline fields flattened, and
//! the special types (`Time`, `Quantity`, `IntOrString`, raw JSON, ...) in their JSON form.
//!
//! Counterpart: k8s.io/apimachinery's protobuf serializer decoding into Go structs
//! (`generated.pb.go`'s `Unmarshal`) followed by `encoding/json`'s `Marshal`, in one pass.

use serde::de::value::BorrowedStrDeserializer;
use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};

use super::error::DecodeError as Error;
use super::kinds;
use super::made::{exact_json, made_as};
use super::table::{E, Field, I, Kind, L, Message, P, Z};
use super::wire::{Raw, Reader, each_field};

/// One message's fields, shown as a JSON object.
pub(crate) struct MessageDe<'de> {
    message: &'static Message,
    bytes: &'de [u8],
    type_meta: Option<[&'de str; 2]>,
}

impl<'de> MessageDe<'de> {
    /// A top-level object's message, shown with the `apiVersion` and `kind` its envelope
    /// carries first, as Go's JSON shows them (none for a list's item, whose JSON has none).
    pub(crate) fn object(
        message: &'static Message,
        type_meta: Option<[&'de str; 2]>,
        bytes: &'de [u8],
    ) -> Self {
        Self {
            message,
            bytes,
            type_meta,
        }
    }
}

/// The methods that mean "whatever comes": each type below answers them from its own
/// `deserialize_any`, `deserialize_option` and `deserialize_newtype_struct`.
macro_rules! forward_the_rest {
    () => {
        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
            unit unit_struct seq tuple tuple_struct map struct identifier ignored_any
        }

        fn deserialize_newtype_struct<V: Visitor<'de>>(
            self,
            _name: &'static str,
            visitor: V,
        ) -> Result<V::Value, Error> {
            visitor.visit_newtype_struct(self)
        }

        /// An enum is a string (a unit variant), as in Go's JSON: serde's derive reads it
        /// through `visit_enum`.
        fn deserialize_enum<V: Visitor<'de>>(
            self,
            _name: &'static str,
            _variants: &'static [&'static str],
            visitor: V,
        ) -> Result<V::Value, Error> {
            self.deserialize_any(EnumFromStr(visitor))
        }
    };
}

/// A visitor that reads a string as a unit variant and anything else as its inner visitor
/// would.
struct EnumFromStr<V>(V);

impl<'de, V: Visitor<'de>> Visitor<'de> for EnumFromStr<V> {
    type Value = V::Value;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.expecting(f)
    }

    fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<V::Value, E> {
        self.0.visit_enum(BorrowedStrDeserializer::new(v))
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<V::Value, A::Error> {
        self.0.visit_map(map)
    }
}

impl<'de> Deserializer<'de> for MessageDe<'de> {
    type Error = Error;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        let mut fields = Fields::new(self.message, self.bytes);
        fields.type_meta = self.type_meta;
        visitor.visit_map(fields)
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        visitor.visit_some(self)
    }

    forward_the_rest!();
}

/// A message being read: where, which of its fields were seen, and (once its bytes are read)
/// which field's zero value comes next.
struct Frame<'de> {
    message: &'static Message,
    reader: Reader<'de>,
    seen: u128,
    /// The tag of the field read last (0 before the first).
    last_tag: u32,
    /// `None` while the bytes are read; then the next field to consider for a zero value.
    zeros: Option<usize>,
}

impl<'de> Frame<'de> {
    fn new(message: &'static Message, bytes: &'de [u8]) -> Self {
        Self {
            message,
            reader: Reader::new(bytes),
            seen: 0,
            last_tag: 0,
            zeros: None,
        }
    }
}

/// The value of the key just handed out.
enum Pending<'de> {
    /// `apiVersion` or `kind`, from the envelope.
    TypeMeta(&'de str),
    One(&'static Field, Option<Raw<'de>>),
    /// A repeated or map field, from its first occurrence's key on.
    Items(&'static Field, Reader<'de>),
    /// A pointer, slice or map the wire lacked, which Go's JSON shows as `null`.
    Null(&'static Field),
}

/// The `MapAccess` of a message: its fields in wire order (repeated fields gathered at their
/// first occurrence), then the zero values of the fields Go's JSON shows but the wire lacked.
struct Fields<'de> {
    /// `apiVersion` and `kind`, still to hand out first.
    type_meta: Option<[&'de str; 2]>,
    top: Frame<'de>,
    /// The frames an inline field's message interrupted.
    outer: Vec<Frame<'de>>,
    pending: Option<Pending<'de>>,
}

impl<'de> Fields<'de> {
    fn new(message: &'static Message, bytes: &'de [u8]) -> Self {
        Self {
            type_meta: None,
            top: Frame::new(message, bytes),
            outer: Vec::new(),
            pending: None,
        }
    }

    fn enter_inline(&mut self, field: &'static Field, bytes: &'de [u8]) -> Result<(), Error> {
        let Kind::Msg(index) = field.kind else {
            return Err(Error::wire(format!(
                "inline field {} is not a message",
                field.tag
            )));
        };
        let inner = Frame::new(kinds::message(index), bytes);
        self.outer.push(std::mem::replace(&mut self.top, inner));
        Ok(())
    }

    /// The next field to hand out, reading the wire and then the zero values.
    fn next_field(&mut self) -> Result<Option<&'static Field>, Error> {
        loop {
            let frame = &mut self.top;
            let message = frame.message;
            let Some(next_zero) = frame.zeros else {
                let start = frame.reader.position();
                let Some((tag, raw)) = frame.reader.field()? else {
                    frame.zeros = Some(0);
                    continue;
                };
                let last_tag = std::mem::replace(&mut frame.last_tag, tag);
                // A tag the table lacks comes from a newer server: skipped, as Go skips it.
                let Some(i) = message.field(tag) else {
                    continue;
                };
                let field = &message.fields[i];
                let bit = 1u128 << i;
                if field.has(L) || matches!(field.kind, Kind::Map(_)) {
                    // The run of occurrences is handed out with the first (Go writes a
                    // repeated field's items one after another; a second run, which no
                    // Kubernetes server writes, is refused rather than read twice over).
                    if frame.seen & bit == 0 {
                        frame.seen |= bit;
                        let items = frame.reader.at(start);
                        self.pending = Some(Pending::Items(field, items));
                        return Ok(Some(field));
                    }
                    if last_tag != tag {
                        return Err(Error::wire(format!(
                            "{}.{} (tag {tag}) comes in two runs with other fields between",
                            message.short_name(),
                            field.json
                        )));
                    }
                    continue;
                }
                frame.seen |= bit;
                if field.has(I) {
                    let Raw::Bytes(bytes) = raw else {
                        return Err(wrong_wire(message, field, &raw));
                    };
                    self.enter_inline(field, bytes)?;
                    continue;
                }
                if omitted_when_zero(field) && raw.is_zero() {
                    continue;
                }
                self.pending = Some(Pending::One(field, Some(raw)));
                return Ok(Some(field));
            };
            if let Some(field) = message.fields.get(next_zero) {
                frame.zeros = Some(next_zero + 1);
                if frame.seen & (1u128 << next_zero) != 0 || !shown_when_absent(field) {
                    continue;
                }
                if field.has(I) {
                    self.enter_inline(field, &[])?;
                    continue;
                }
                let nil = field.has(P) || field.has(L) || matches!(field.kind, Kind::Map(_));
                self.pending = Some(if nil {
                    Pending::Null(field)
                } else {
                    Pending::One(field, None)
                });
                return Ok(Some(field));
            }
            match self.outer.pop() {
                Some(parent) => self.top = parent,
                None => return Ok(None),
            }
        }
    }
}

/// Whether Go's JSON leaves the field out when its value is zero: `omitempty` on a scalar,
/// string, bytes (never on a struct, which encoding/json does not call empty), or `omitzero`;
/// never a pointer, whose presence is the point.
fn omitted_when_zero(field: &Field) -> bool {
    if field.has(P) {
        return false;
    }
    field.has(Z)
        || field.has(E)
            && matches!(
                field.kind,
                Kind::Str | Kind::Bool | Kind::I32 | Kind::I64 | Kind::F64 | Kind::Bytes
            )
}

/// Whether Go's JSON shows the field when the wire lacks it: any field without
/// `omitempty`/`omitzero` (a nil pointer, slice or map as `null`, a value as its zero).
fn shown_when_absent(field: &Field) -> bool {
    !(field.has(E) || field.has(Z))
}

fn wrong_wire(message: &Message, field: &Field, raw: &Raw<'_>) -> Error {
    Error::wire(format!(
        "{}.{} (tag {}): {raw:?} where the table says {:?}",
        message.short_name(),
        field.json,
        field.tag,
        field.kind
    ))
}

impl<'de> MapAccess<'de> for Fields<'de> {
    type Error = Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, Error> {
        if let Some([api_version, kind]) = self.type_meta {
            let (key, value, rest) = if api_version.is_empty() {
                ("kind", kind, None)
            } else {
                ("apiVersion", api_version, Some(["", kind]))
            };
            self.type_meta = rest;
            self.pending = Some(Pending::TypeMeta(value));
            return seed
                .deserialize(BorrowedStrDeserializer::new(key))
                .map(Some);
        }
        match self.next_field()? {
            Some(field) => seed
                .deserialize(BorrowedStrDeserializer::new(field.json))
                .map(Some),
            None => Ok(None),
        }
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, Error> {
        let (field, result) = match self.pending.take() {
            Some(Pending::One(field, raw)) => (
                field,
                seed.deserialize(ValueDe {
                    kind: field.kind,
                    raw,
                }),
            ),
            Some(Pending::Items(field, reader)) => (
                field,
                seed.deserialize(ItemsDe {
                    tag: field.tag,
                    kind: field.kind,
                    reader,
                }),
            ),
            Some(Pending::TypeMeta(value)) => {
                return seed.deserialize(BorrowedStrDeserializer::new(value));
            }
            Some(Pending::Null(field)) => (
                field,
                seed.deserialize(serde::de::value::UnitDeserializer::new()),
            ),
            None => return Err(Error::wire("a value asked for before its key".into())),
        };
        result.map_err(|e| e.within(field.json))
    }
}

/// One value of a field (or of a repeated field's item, or a map entry's value); `None` when
/// the wire lacked it and Go's JSON shows its zero value.
struct ValueDe<'de> {
    kind: Kind,
    raw: Option<Raw<'de>>,
}

impl<'de> ValueDe<'de> {
    fn bytes(&self) -> Result<&'de [u8], Error> {
        match self.raw {
            None => Ok(&[]),
            Some(Raw::Bytes(bytes)) => Ok(bytes),
            Some(other) => Err(Error::wire(format!(
                "{other:?} where {:?} is length-delimited",
                self.kind
            ))),
        }
    }

    fn varint(&self) -> Result<u64, Error> {
        match self.raw {
            None => Ok(0),
            Some(Raw::Varint(v)) => Ok(v),
            Some(other) => Err(Error::wire(format!(
                "{other:?} where {:?} is a varint",
                self.kind
            ))),
        }
    }

    /// Whether Go's JSON shows this value as `null`.
    fn is_null(&self) -> Result<bool, Error> {
        Ok(match self.kind {
            Kind::Bytes => self.raw.is_none(),
            Kind::Time | Kind::MicroTime => self.bytes()?.is_empty(),
            Kind::RawJson => tag_one(self.bytes()?)?.is_empty(),
            Kind::SchemaOrArray(_) | Kind::SchemaOrStringArray(_) => self.bytes()?.is_empty(),
            Kind::StringList => self.raw.is_none(),
            _ => false,
        })
    }
}

/// The bytes at tag 1 of a one-field message (`RawExtension`'s and `FieldsV1`'s raw JSON,
/// `Quantity`'s string), empty when the wire lacks them.
fn tag_one(bytes: &[u8]) -> Result<&[u8], Error> {
    let mut one: &[u8] = &[];
    each_field(bytes, |tag, value| {
        if let (1, Raw::Bytes(b)) = (tag, value) {
            one = b;
        }
        Ok(())
    })?;
    Ok(one)
}

impl<'de> Deserializer<'de> for ValueDe<'de> {
    type Error = Error;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        match self.kind {
            Kind::Str => visitor.visit_borrowed_str(utf8(self.bytes()?)?),
            Kind::Bool => visitor.visit_bool(self.varint()? != 0),
            // A negative int32 is sign-extended to 64 bits on the wire.
            Kind::I32 => visitor.visit_i64(i64::from(self.varint()? as i32)),
            Kind::I64 => visitor.visit_i64(self.varint()? as i64),
            Kind::F64 => match self.raw {
                None => visitor.visit_f64(0.0),
                Some(Raw::Fixed64(bits)) => go_number(f64::from_bits(bits), visitor),
                Some(other) => Err(Error::wire(format!("{other:?} where a double is fixed64"))),
            },
            Kind::Bytes => match self.raw {
                None => visitor.visit_unit(),
                _ => {
                    use base64::Engine as _;
                    visitor.visit_string(
                        base64::engine::general_purpose::STANDARD.encode(self.bytes()?),
                    )
                }
            },
            Kind::Msg(index) => {
                visitor.visit_map(Fields::new(kinds::message(index), self.bytes()?))
            }
            Kind::Map(_) => Err(Error::wire("a map entry outside its map".into())),
            Kind::Time | Kind::MicroTime => {
                let Some(at) = timestamp(self.kind, self.bytes()?)? else {
                    return visitor.visit_unit();
                };
                if let Some(made) = made_as::<V, _>(|| Ok(at)) {
                    return made;
                }
                let mut text = [0; TIME_TEXT];
                visitor.visit_str(rfc3339(at, &mut text)?)
            }
            // A Quantity the wire lacks (or an empty one) is zero, "0" in Go's JSON.
            Kind::Quantity => match tag_one(self.bytes()?)? {
                b"" => visitor.visit_borrowed_str("0"),
                text => visitor.visit_borrowed_str(utf8(text)?),
            },
            Kind::IntOrString => {
                let (mut is_string, mut int, mut string) = (false, 0i32, "");
                each_field(self.bytes()?, |tag, raw| {
                    match (tag, raw) {
                        (1, Raw::Varint(v)) => is_string = v == 1,
                        (2, Raw::Varint(v)) => int = v as i32,
                        (3, Raw::Bytes(b)) => string = utf8(b)?,
                        _ => {}
                    }
                    Ok(())
                })?;
                if is_string {
                    visitor.visit_borrowed_str(string)
                } else {
                    visitor.visit_i64(int.into())
                }
            }
            Kind::RawJson => {
                let raw = tag_one(self.bytes()?)?;
                if raw.is_empty() {
                    return visitor.visit_unit();
                }
                if let Some(made) = made_as::<V, _>(|| exact_json(raw)) {
                    return made;
                }
                let mut json = serde_json::Deserializer::from_slice(raw);
                let value = json.deserialize_any(visitor).map_err(Error::json)?;
                json.end().map_err(Error::json)?;
                Ok(value)
            }
            Kind::StringList => {
                visitor.visit_seq(Items::new(1, Kind::Str, Reader::new(self.bytes()?)))
            }
            Kind::SchemaOrArray(schema) => {
                schema_or_list(self.bytes()?, schema, Kind::Msg(schema), visitor)
            }
            Kind::SchemaOrBool(schema) => {
                let (mut allows, mut one) = (false, None);
                each_field(self.bytes()?, |tag, raw| {
                    match (tag, raw) {
                        (1, Raw::Varint(v)) => allows = v != 0,
                        (2, Raw::Bytes(b)) => one = Some(b),
                        _ => {}
                    }
                    Ok(())
                })?;
                match one {
                    Some(one) => visitor.visit_map(Fields::new(kinds::message(schema), one)),
                    None => visitor.visit_bool(allows),
                }
            }
            Kind::SchemaOrStringArray(schema) => {
                schema_or_list(self.bytes()?, schema, Kind::Str, visitor)
            }
        }
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        if self.is_null()? {
            visitor.visit_none()
        } else {
            visitor.visit_some(self)
        }
    }

    forward_the_rest!();
}

/// apiextensions' `JSONSchemaPropsOrArray` and `JSONSchemaPropsOrStringArray`: `{schema = 1,
/// items = 2}`, shown as the items when there are some, else as the schema, else `null`.
fn schema_or_list<'de, V: Visitor<'de>>(
    bytes: &'de [u8],
    schema: u16,
    item: Kind,
    visitor: V,
) -> Result<V::Value, Error> {
    let (mut one, mut many) = (None, false);
    each_field(bytes, |tag, raw| {
        match (tag, raw) {
            (1, Raw::Bytes(b)) => one = Some(b),
            (2, _) => many = true,
            _ => {}
        }
        Ok(())
    })?;
    if many {
        let reader = Reader::new(bytes);
        visitor.visit_seq(Items::new(2, item, reader))
    } else if let Some(one) = one {
        visitor.visit_map(Fields::new(kinds::message(schema), one))
    } else {
        visitor.visit_unit()
    }
}

/// A double as Go's JSON writes it and a JSON reader then reads it: a whole number in the
/// integers' range has no decimal point (`1`, not `1.0`), so it is an integer.
fn go_number<'de, V: Visitor<'de>>(value: f64, visitor: V) -> Result<V::Value, Error> {
    const TWO_TO_THE_64: f64 = 18_446_744_073_709_551_616.0;
    if value.fract() != 0.0 || !value.is_finite() || value == 0.0 && value.is_sign_negative() {
        visitor.visit_f64(value)
    } else if (0.0..TWO_TO_THE_64).contains(&value) {
        visitor.visit_u64(value as u64)
    } else if value >= i64::MIN as f64 {
        visitor.visit_i64(value as i64)
    } else {
        visitor.visit_f64(value)
    }
}

fn utf8(bytes: &[u8]) -> Result<&str, Error> {
    std::str::from_utf8(bytes).map_err(|e| Error::wire(format!("a string that is not UTF-8: {e}")))
}

/// A `Time` as Go's JSON shows it (to the second), or a `MicroTime` (to the microsecond);
/// `None` for the zero time, which the wire carries as an empty message.
fn timestamp(kind: Kind, bytes: &[u8]) -> Result<Option<jiff::Timestamp>, Error> {
    if bytes.is_empty() {
        return Ok(None);
    }
    let (mut seconds, mut nanos) = (0i64, 0i32);
    each_field(bytes, |tag, raw| {
        match (tag, raw) {
            (1, Raw::Varint(v)) => seconds = v as i64,
            (2, Raw::Varint(v)) => nanos = v as i32,
            _ => {}
        }
        Ok(())
    })?;
    // metav1.Time's JSON has whole seconds (its protobuf form no longer carries nanos);
    // MicroTime's keeps microseconds.
    let nanos = if kind == Kind::Time {
        0
    } else {
        nanos - nanos % 1000
    };
    jiff::Timestamp::new(seconds, nanos).map(Some).map_err(|e| {
        Error::wire(format!(
            "a time out of range ({seconds} s, {nanos} ns): {e}"
        ))
    })
}

/// The longest time text: `-009999-12-31T23:59:59.999999Z` and some to spare.
const TIME_TEXT: usize = 40;

/// `at` as RFC 3339 in UTC, as Go's JSON writes it, written into `text`.
fn rfc3339(at: jiff::Timestamp, text: &mut [u8; TIME_TEXT]) -> Result<&str, Error> {
    let mut rest = &mut text[..];
    std::io::Write::write_fmt(&mut rest, format_args!("{at}"))
        .map_err(|e| Error::wire(format!("a time too long to write: {e}")))?;
    let len = TIME_TEXT - rest.len();
    utf8(&text[..len])
}

/// A repeated field or a map: every occurrence of its tag in the message, from the first.
struct ItemsDe<'de> {
    tag: u32,
    kind: Kind,
    reader: Reader<'de>,
}

impl<'de> Deserializer<'de> for ItemsDe<'de> {
    type Error = Error;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        match self.kind {
            Kind::Map(value) => visitor.visit_map(Entries {
                tag: self.tag,
                value: *value,
                reader: self.reader,
                pending: None,
                started: false,
            }),
            kind => visitor.visit_seq(Items::new(self.tag, kind, self.reader)),
        }
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        visitor.visit_some(self)
    }

    forward_the_rest!();
}

/// The items of a repeated field. A packed run of numbers (which Go's generated code does not
/// write, but a proto3 writer would) is read item by item too.
struct Items<'de> {
    tag: u32,
    kind: Kind,
    reader: Reader<'de>,
    packed: Option<Reader<'de>>,
    /// Whether the run of the tag has begun.
    started: bool,
}

impl<'de> Items<'de> {
    fn new(tag: u32, kind: Kind, reader: Reader<'de>) -> Self {
        Self {
            tag,
            kind,
            reader,
            packed: None,
            started: false,
        }
    }

    fn next_raw(&mut self) -> Result<Option<Raw<'de>>, Error> {
        loop {
            if let Some(packed) = &mut self.packed {
                if packed.position() < packed.len() {
                    return Ok(Some(match self.kind {
                        Kind::F64 => Raw::Fixed64(packed.fixed64()?),
                        _ => Raw::Varint(packed.varint()?),
                    }));
                }
                self.packed = None;
            }
            let Some((tag, raw)) = self.reader.field()? else {
                return Ok(None);
            };
            if tag != self.tag {
                // Fields before the run are passed over; the first one after it ends it.
                if self.started {
                    return Ok(None);
                }
                continue;
            }
            self.started = true;
            match raw {
                Raw::Bytes(run) if is_numeric(self.kind) => self.packed = Some(Reader::new(run)),
                raw => return Ok(Some(raw)),
            }
        }
    }
}

impl<'de> SeqAccess<'de> for Items<'de> {
    type Error = Error;

    /// How many items are left, when each is a field of its own (not a number, which a
    /// packed run may hold several of): a `Vec` is then allocated once, at its length.
    fn size_hint(&self) -> Option<usize> {
        if self.packed.is_some() || is_numeric(self.kind) {
            return None;
        }
        let (mut reader, mut started, mut left) = (self.reader.clone(), self.started, 0);
        while let Ok(Some((tag, _))) = reader.field() {
            if tag == self.tag {
                (started, left) = (true, left + 1);
            } else if started {
                break;
            }
        }
        Some(left)
    }

    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, Error> {
        match self.next_raw()? {
            Some(raw) => seed
                .deserialize(ValueDe {
                    kind: self.kind,
                    raw: Some(raw),
                })
                .map(Some),
            None => Ok(None),
        }
    }
}

/// Whether items of `kind` are numbers (which a packed run holds in one field).
fn is_numeric(kind: Kind) -> bool {
    matches!(kind, Kind::Bool | Kind::I32 | Kind::I64 | Kind::F64)
}

/// A map's entries: each occurrence of its tag is a message with the key at tag 1 and the
/// value at tag 2 (either may be missing when it is the zero value).
struct Entries<'de> {
    tag: u32,
    value: Kind,
    reader: Reader<'de>,
    pending: Option<Option<Raw<'de>>>,
    /// Whether the run of the tag has begun.
    started: bool,
}

impl<'de> MapAccess<'de> for Entries<'de> {
    type Error = Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, Error> {
        loop {
            let Some((tag, raw)) = self.reader.field()? else {
                return Ok(None);
            };
            if tag != self.tag {
                // As `Items`: the run ends at the first other field after it.
                if self.started {
                    return Ok(None);
                }
                continue;
            }
            self.started = true;
            let Raw::Bytes(entry) = raw else {
                return Err(Error::wire(format!("a map entry that is {raw:?}")));
            };
            let (mut key, mut value) = ("", None);
            each_field(entry, |tag, raw| {
                match (tag, raw) {
                    (1, Raw::Bytes(b)) => key = utf8(b)?,
                    (2, raw) => value = Some(raw),
                    _ => {}
                }
                Ok(())
            })?;
            self.pending = Some(value);
            return seed
                .deserialize(BorrowedStrDeserializer::new(key))
                .map(Some);
        }
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, Error> {
        let raw = self
            .pending
            .take()
            .ok_or_else(|| Error::wire("a map value asked for before its key".into()))?;
        seed.deserialize(ValueDe {
            kind: self.value,
            raw,
        })
    }
}

impl de::Error for Error {
    fn custom<T: std::fmt::Display>(msg: T) -> Self {
        Error::object(msg.to_string())
    }
}
