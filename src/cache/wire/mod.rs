//! The two wires a LIST or WATCH body comes in, JSON and Kubernetes protobuf, each decoded
//! as its bytes arrive, and the seam that picks one per response by its `Content-Type`
//! (client-go's rest client picks its decoder the same way, from the serializers it
//! negotiated).
//!
//! | file | what |
//! |---|---|
//! | `body.rs` | the seam: `ListBody` and `watch_events`, by encoding |
//! | `json_list.rs` | a JSON LIST body, item by item |
//! | `json_watch.rs` | a JSON watch body, line by line |
//! | `protobuf_list.rs` | a protobuf LIST body, item by item (on `protobuf::ListReader`) |
//! | `protobuf_watch.rs` | a protobuf watch body, frame by frame |
//! | `fuzz.rs` | the fuzz targets' bodies for the four readers (`fuzz/`, `hack/fuzz`; tests and `--cfg fuzzing` only) |
//! | `encoding.rs` | [`Wire`] (what a ListWatch asks for), `Encoding` (what a response is in), [`ListDecodeError`]: what the others share |
//!
//! Imports run down the table: the four decoders import only `encoding.rs`.

mod body;
mod encoding;
#[cfg(any(test, fuzzing))]
mod fuzz;
mod json_list;
mod json_watch;
mod protobuf_list;
mod protobuf_watch;

pub(crate) use body::{ListBody, watch_events};
pub(crate) use encoding::{Encoding, ProtobufType};
pub use encoding::{INITIAL_EVENTS_END_ANNOTATION, ListDecodeError, Wire};
#[cfg(fuzzing)]
pub use fuzz::{fuzz_json_list, fuzz_json_watch, fuzz_protobuf_list, fuzz_protobuf_watch};
