//! The field table's types: what the decoder knows of each message, generated from the Go API
//! types into `generated.rs` by `hack/generate-protobuf-table`.

/// What a field holds, as the decoder presents it to serde.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A string (length-delimited UTF-8).
    Str,
    /// A bool (varint).
    Bool,
    /// An int32 (varint; a negative one sign-extended to ten bytes).
    I32,
    /// An int64 (varint).
    I64,
    /// A double (fixed64).
    F64,
    /// Bytes, shown as base64 as Go's JSON shows a `[]byte`.
    Bytes,
    /// Another message of the table, by index.
    Msg(u16),
    /// A `map<string, V>`: repeated entries, each a message with the key at tag 1 and the value
    /// at tag 2.
    Map(&'static Kind),
    /// meta/v1 `Time`: `{seconds = 1, nanos = 2}`, shown as RFC 3339 to the second; an empty
    /// message is the zero time, `null`.
    Time,
    /// meta/v1 `MicroTime`: as `Time`, to the microsecond.
    MicroTime,
    /// resource `Quantity`: `{string = 1}`, its canonical form.
    Quantity,
    /// intstr `IntOrString`: `{type = 1, intVal = 2, strVal = 3}`.
    IntOrString,
    /// JSON carried as bytes at tag 1: `RawExtension`, `FieldsV1`, apiextensions' `JSON`.
    RawJson,
    /// A named `[]string` carried as a message of its own (`{items = 1}`), shown as an array.
    StringList,
    /// apiextensions' `JSONSchemaPropsOrArray` (`{schema = 1, jSONSchemas = 2}`): the array
    /// when it has items, else the schema.
    SchemaOrArray(u16),
    /// apiextensions' `JSONSchemaPropsOrBool` (`{allows = 1, schema = 2}`): the schema when
    /// set, else the bool.
    SchemaOrBool(u16),
    /// apiextensions' `JSONSchemaPropsOrStringArray` (`{schema = 1, property = 2}`): the
    /// strings when there are some, else the schema, else `null`.
    SchemaOrStringArray(u16),
}

/// `json:",omitempty"`: Go's JSON leaves the field out when it is empty (a struct is never
/// empty to encoding/json).
pub(crate) const E: u8 = 1;
/// `json:",omitzero"`: left out when it is the zero value.
pub(crate) const Z: u8 = 2;
/// A Go pointer: present or absent, and a present zero is meaningful.
pub(crate) const P: u8 = 4;
/// `json:",inline"`: the message's fields are shown as the parent's.
pub(crate) const I: u8 = 8;
/// A Go slice: every occurrence of the tag is one item of a JSON array.
pub(crate) const L: u8 = 16;

/// One field of a message.
#[derive(Debug)]
pub(crate) struct Field {
    /// The protobuf tag.
    pub(crate) tag: u32,
    /// The JSON name (empty for an inline field).
    pub(crate) json: &'static str,
    /// What it holds (of one item, for a repeated field).
    pub(crate) kind: Kind,
    flags: u8,
}

impl Field {
    pub(crate) const fn new(tag: u32, json: &'static str, kind: Kind, flags: u8) -> Self {
        Self {
            tag,
            json,
            kind,
            flags,
        }
    }

    /// Whether the field has `flag` (one of [`E`], [`Z`], [`P`], [`I`], [`L`]).
    pub(crate) fn has(&self, flag: u8) -> bool {
        self.flags & flag != 0
    }
}

/// One message: its Go type's name and its fields by ascending tag.
#[derive(Debug)]
pub(crate) struct Message {
    /// The Go type, e.g. `k8s.io/api/core/v1.ConfigMap` (for errors).
    pub(crate) go: &'static str,
    pub(crate) fields: &'static [Field],
}

impl Message {
    pub(crate) const fn new(go: &'static str, fields: &'static [Field]) -> Self {
        Self { go, fields }
    }

    /// The index in [`Message::fields`] of the field with this tag. Most messages number
    /// their fields from 1 without gaps, so the field is first looked for at `tag - 1`.
    pub(crate) fn field(&self, tag: u32) -> Option<usize> {
        let guess = (tag as usize).wrapping_sub(1);
        match self.fields.get(guess) {
            Some(f) if f.tag == tag => Some(guess),
            _ => self.fields.binary_search_by_key(&tag, |f| f.tag).ok(),
        }
    }

    /// The Go type's short name, `v1.ConfigMap`.
    pub(crate) fn short_name(&self) -> &'static str {
        self.go.rsplit('/').next().unwrap_or(self.go)
    }
}

/// A top-level kind and its message.
#[derive(Debug)]
pub(crate) struct Root {
    pub(crate) api_version: &'static str,
    pub(crate) kind: &'static str,
    pub(crate) message: u16,
}

impl Root {
    pub(crate) const fn new(api_version: &'static str, kind: &'static str, message: u16) -> Self {
        Self {
            api_version,
            kind,
            message,
        }
    }
}
