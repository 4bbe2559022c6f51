//! The envelope around every object the apiserver sends as protobuf (`protobuf.go`): `k8s\0`
//! and a `runtime.Unknown` holding the object's TypeMeta and its message.

use serde::Deserialize;

use super::de::MessageDe;
use super::error::DecodeError;
use super::kinds;
use super::table::Message;
use super::wire::{Raw, each_field};

type Error = DecodeError;

/// The four bytes before every protobuf object the apiserver sends (`protobuf.go`'s
/// `protoEncodingPrefix`).
pub const MAGIC: [u8; 4] = *b"k8s\0";

/// The media type that asks for protobuf.
pub const CONTENT_TYPE: &str = "application/vnd.kubernetes.protobuf";

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
    /// the object's JSON, `apiVersion` and `kind` included).
    pub fn decode<T: Deserialize<'a>>(&self) -> Result<T, DecodeError> {
        ObjectType::of(self.api_version, self.kind)
            .ok_or_else(|| not_built_in(self.api_version, self.kind))?
            .decode(Some([self.api_version, self.kind]), self.raw)
    }
}

/// A built-in kind's message, looked up once for the many objects of a list or a watch.
#[derive(Debug, Clone, Copy)]
pub struct ObjectType {
    message: &'static Message,
}

impl ObjectType {
    /// The message of a top-level kind (`"v1"`, `"ConfigMap"`), if the table has it: every
    /// kind the client-go scheme registers, apiextensions' and meta/v1's
    /// `PartialObjectMetadata`; never a custom resource's.
    pub fn of(api_version: &str, kind: &str) -> Option<Self> {
        kinds::root(api_version, kind).map(|message| Self { message })
    }

    /// meta/v1 `ListMeta`, the `metadata` of every list.
    pub(crate) fn list_meta() -> Self {
        Self {
            message: kinds::list_meta(),
        }
    }

    /// Decodes one object's message (no envelope) into `T`, shown with `type_meta`
    /// (`apiVersion`, `kind`) first when given.
    pub fn decode<'a, T: Deserialize<'a>>(
        &self,
        type_meta: Option<[&'a str; 2]>,
        message: &'a [u8],
    ) -> Result<T, DecodeError> {
        T::deserialize(MessageDe::object(self.message, type_meta, message))
    }
}

fn utf8(bytes: &[u8]) -> Result<&str, DecodeError> {
    std::str::from_utf8(bytes).map_err(|e| Error::wire(format!("a string that is not UTF-8: {e}")))
}

/// Decodes one object's message (no envelope) of the given `apiVersion` and `kind` into `T`.
pub fn decode_message<'a, T: Deserialize<'a>>(
    api_version: &'a str,
    kind: &'a str,
    message: &'a [u8],
) -> Result<T, DecodeError> {
    Envelope {
        api_version,
        kind,
        raw: message,
    }
    .decode()
}

fn not_built_in(api_version: &str, kind: &str) -> DecodeError {
    Error::object(format!(
        "{api_version} {kind} is not a built-in kind kubeloop's protobuf table knows"
    ))
}

/// Decodes a body the apiserver sent as protobuf (`k8s\0`, the envelope, the object) into `T`.
pub fn from_slice<'a, T: Deserialize<'a>>(body: &'a [u8]) -> Result<T, DecodeError> {
    Envelope::parse(body)?.decode()
}
