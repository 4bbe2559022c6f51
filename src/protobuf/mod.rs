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
//! | `error.rs` | [`DecodeError`] |
//! | `wire.rs` | the wire format: varints, length-delimited and fixed fields |
//! | `table.rs` | the field table's types |
//! | `generated.rs` | the field table (generated) |
//! | `kinds.rs` | look-ups in the table: a message by index, a top-level kind's message |
//! | `made.rs` | values made as the very type a visitor makes (`serde_json::Value` maps at their length, `jiff::Timestamp`) |
//! | `de.rs` | the `Deserializer`: a message shown as Go's JSON of it |
//! | `envelope.rs` | [`Envelope`]: `k8s\0` and `runtime.Unknown`; [`ObjectType`]; [`from_slice`], [`decode_message`] |
//! | `watch.rs` | watch streams: [`Frames`] (4-byte length-delimited), [`RawWatchEvent`] |
//! | `list.rs` | LIST bodies as they arrive: [`ListReader`] |
//! | `names.rs` | [`LooseNames`]: what an object that is not decoded is called |
//! | `fuzz.rs` | the fuzz targets' bodies (`fuzz/`, `hack/fuzz`; tests and `--cfg fuzzing` only) |
//!
//! Imports run up the table: each file uses only files above it.

mod de;
mod envelope;
mod error;
mod generated;
mod kinds;
mod list;
// `Made`'s transmute: a value handed to a visitor as the type it makes (SAFETY comments there).
#[allow(unsafe_code)]
mod made;
mod names;
mod ser;
mod table;
mod watch;
mod wire;

pub use envelope::{CONTENT_TYPE, Envelope, MAGIC, ObjectType, decode_message, from_slice};
pub use error::DecodeError;
pub use list::{ListPart, ListReader};
pub use names::LooseNames;
pub use ser::{EncodeError, to_vec};
pub use watch::{Frames, RawWatchEvent, WATCH_CONTENT_TYPE};
#[cfg(test)]
pub(crate) use wire::delimited;
// The fuzz targets' bodies (`fuzz/`, `hack/fuzz`): `--cfg fuzzing` and the tests only.
#[cfg(any(test, fuzzing))]
pub(crate) mod fuzz;
#[cfg(fuzzing)]
#[doc(hidden)]
pub use fuzz::{fuzz_envelope, fuzz_protobuf_decode, fuzz_watch_framer};

#[cfg(test)]
mod tests;
