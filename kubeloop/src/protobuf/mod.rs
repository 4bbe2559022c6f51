//! Kubernetes protobuf, decoded straight into k8s-openapi's types: a serde `Deserializer` over
//! the wire bytes drives the types' own `Deserialize` impls, so a program gets the same structs
//! as from JSON, with no intermediate message type.
//!
//! What the apiserver sends for `Accept: application/vnd.kubernetes.protobuf` is an envelope,
//! the four bytes `k8s\0` and a `runtime.Unknown` message: the object's `apiVersion` and `kind`
//! (its TypeMeta, which the object's own message leaves out), then the object's message. What
//! each of that message's fields means (its JSON name, whether Go omits it when empty, whether
//! it is a pointer or inlined, what it holds) is in a table generated from the Go API types at
//! the pinned Kubernetes version (`generated.rs`, by `hack/generate-protobuf-table`).
//!
//! Counterparts: k8s.io/apimachinery `pkg/runtime/serializer/protobuf` (the envelope:
//! `protobuf.go`), the types' `generated.pb.go` (the fields), and their JSON tags.
//!
//! | File | Holds |
//! |---|---|
//! | `wire.rs` | the wire format: varints, length-delimited and fixed fields |
//! | `table.rs` | the field table's types and look-ups |
//! | `generated.rs` | the field table (generated) |
//! | `de.rs` | the `Deserializer`: a message shown as Go's JSON of it |

mod de;
mod generated;
mod table;
mod wire;

use serde::Deserialize;

use wire::{Raw, each_field};

/// The four bytes before every protobuf object the apiserver sends (`protobuf.go`'s
/// `protoEncodingPrefix`).
pub const MAGIC: [u8; 4] = *b"k8s\0";

/// The media type that asks for protobuf.
pub const CONTENT_TYPE: &str = "application/vnd.kubernetes.protobuf";

/// Why bytes did not decode: malformed protobuf, or a message that does not fit the Rust type.
/// Says where (the JSON path of the field) and what.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}{message}", path_prefix(.path))]
pub struct DecodeError {
    path: String,
    message: String,
}

fn path_prefix(path: &str) -> String {
    if path.is_empty() {
        String::new()
    } else {
        format!("at {path}: ")
    }
}

type Error = DecodeError;

impl DecodeError {
    fn wire(message: String) -> Self {
        Self {
            path: String::new(),
            message: format!("malformed protobuf: {message}"),
        }
    }

    fn object(message: String) -> Self {
        Self {
            path: String::new(),
            message,
        }
    }

    fn json(error: serde_json::Error) -> Self {
        Self::object(format!("raw JSON inside protobuf: {error}"))
    }

    /// The same error, one field further out.
    fn within(mut self, field: &str) -> Self {
        self.path = if self.path.is_empty() {
            field.to_string()
        } else {
            format!("{field}.{}", self.path)
        };
        self
    }

    /// The JSON path of the field that did not decode (`spec.containers.image`), empty at the
    /// top.
    pub fn path(&self) -> &str {
        &self.path
    }
}

/// An object's envelope: its TypeMeta and its message's bytes (`runtime.Unknown`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Envelope<'a> {
    /// The object's `apiVersion`, e.g. `apps/v1`.
    pub api_version: &'a str,
    /// The object's `kind`, e.g. `Deployment`.
    pub kind: &'a str,
    /// The object's message.
    pub raw: &'a [u8],
}

impl<'a> Envelope<'a> {
    /// Reads `k8s\0` and the `runtime.Unknown` after it.
    pub fn parse(body: &'a [u8]) -> Result<Self, DecodeError> {
        let Some(unknown) = body.strip_prefix(&MAGIC) else {
            return Err(Error::wire(format!(
                "the body does not start with k8s\\0 (it starts {:?})",
                String::from_utf8_lossy(&body[..body.len().min(8)])
            )));
        };
        let mut envelope = Envelope {
            api_version: "",
            kind: "",
            raw: &[],
        };
        let mut encoding: &[u8] = &[];
        each_field(unknown, |tag, value| {
            match (tag, value) {
                (1, Raw::Bytes(type_meta)) => each_field(type_meta, |tag, value| {
                    match (tag, value) {
                        (1, Raw::Bytes(b)) => envelope.api_version = utf8(b)?,
                        (2, Raw::Bytes(b)) => envelope.kind = utf8(b)?,
                        _ => {}
                    }
                    Ok(())
                })?,
                (2, Raw::Bytes(raw)) => envelope.raw = raw,
                (3, Raw::Bytes(b)) => encoding = b,
                _ => {}
            }
            Ok(())
        })?;
        if !encoding.is_empty() {
            return Err(Error::wire(format!(
                "contentEncoding {:?}: kubeloop reads unencoded objects only",
                String::from_utf8_lossy(encoding)
            )));
        }
        Ok(envelope)
    }

    /// The object, decoded into `T` (a k8s-openapi type, or any `Deserialize` that reads
    /// the object's JSON).
    pub fn decode<T: Deserialize<'a>>(&self) -> Result<T, DecodeError> {
        decode_message(self.api_version, self.kind, self.raw)
    }
}

fn utf8(bytes: &[u8]) -> Result<&str, DecodeError> {
    std::str::from_utf8(bytes).map_err(|e| Error::wire(format!("a string that is not UTF-8: {e}")))
}

/// Decodes one object's message (no envelope) of the given `apiVersion` and `kind` into `T`.
pub fn decode_message<'a, T: Deserialize<'a>>(
    api_version: &str,
    kind: &str,
    message: &'a [u8],
) -> Result<T, DecodeError> {
    let table = table::root(api_version, kind).ok_or_else(|| {
        Error::object(format!(
            "{api_version} {kind} is not a built-in kind kubeloop's protobuf table knows"
        ))
    })?;
    T::deserialize(de::MessageDe::new(table, message))
}

/// Decodes a body the apiserver sent as protobuf (`k8s\0`, the envelope, the object) into `T`.
pub fn from_slice<'a, T: Deserialize<'a>>(body: &'a [u8]) -> Result<T, DecodeError> {
    Envelope::parse(body)?.decode()
}

#[cfg(test)]
mod tests;
