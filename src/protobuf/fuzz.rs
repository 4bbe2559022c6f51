//! The fuzz targets' bodies for what reads protobuf off the wire, `fuzz_<target>` (`fuzz/`
//! runs them under libFuzzer), how a target reads its input as a body and the places where it
//! is cut into chunks, and [`replay`], which runs a target on the inputs that once failed it
//! (`testdata-fuzz/<target>/`). Built for the unit tests and under `--cfg fuzzing` (what
//! `hack/fuzz` builds with), nowhere else.

use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::batch::v1::{CronJob, Job};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Event, Node, Pod, Secret, Service};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Status};
use serde::de::{DeserializeOwned, IgnoredAny};
use serde_json::Value;

use super::generated::ROOTS;
use super::{Envelope, Frames, LooseNames, RawWatchEvent, decode_message, from_slice};

/// An input read as a head and a body: the head's first byte holds the number of cuts (low
/// three bits) and five bits of choices ([`Head::choice`]), then two bytes (big-endian) per
/// cut, each an offset in the body.
#[derive(Debug)]
pub struct Head {
    /// The choices (the first byte without its three low bits).
    pub choices: u8,
    /// Offsets in the body, sorted.
    pub cuts: Vec<usize>,
}

impl Head {
    /// Splits `data` into its head and its body; `None` if it is too short to have a head.
    pub fn split(data: &[u8]) -> Option<(Head, &[u8])> {
        let (&first, rest) = data.split_first()?;
        let (cuts, body) = rest.split_at_checked(2 * usize::from(first & 7))?;
        let mut cuts: Vec<usize> = cuts
            .chunks(2)
            .map(|c| usize::from(u16::from_be_bytes([c[0], c[1]])))
            .collect();
        cuts.sort_unstable();
        let choices = first >> 3;
        Some((Head { choices, cuts }, body))
    }

    /// The choice in bits `at..at + bits` of the choices.
    pub fn choice(&self, at: u32, bits: u32) -> usize {
        usize::from((self.choices >> at) & ((1 << bits) - 1))
    }
}

/// Panics unless reading the body whole and reading it in chunks gave the same.
pub fn same<T: PartialEq + std::fmt::Debug>(whole: T, chunked: T, cuts: &[usize]) {
    assert!(
        whole == chunked,
        "read whole:\n{whole:#?}\nread in chunks cut at {cuts:?}:\n{chunked:#?}"
    );
}

/// Target `protobuf_decode`: a message (no envelope) of the kind the input's first two bytes
/// pick among every top-level kind of the table, decoded as a JSON value, as nothing
/// (`IgnoredAny`) and, for a dozen kinds, as its k8s-openapi type. Never a panic; and where
/// the message decodes as a JSON value that its type reads, it decodes as that type straight
/// from protobuf, to the same value (the two roads a program can take agree).
pub fn fuzz_protobuf_decode(data: &[u8]) {
    let Some((pick, message)) = data.split_first_chunk::<2>() else {
        return;
    };
    let root = &ROOTS[usize::from(u16::from_be_bytes(*pick)) % ROOTS.len()];
    let (api_version, kind) = (root.api_version, root.kind);
    let value = decode_message::<Value>(api_version, kind, message).ok();
    let _ = decode_message::<IgnoredAny>(api_version, kind, message);
    let value = value.as_ref();
    match (api_version, kind) {
        ("v1", "Pod") => typed::<Pod>(api_version, kind, message, value),
        ("v1", "ConfigMap") => typed::<ConfigMap>(api_version, kind, message, value),
        ("v1", "Secret") => typed::<Secret>(api_version, kind, message, value),
        ("v1", "Service") => typed::<Service>(api_version, kind, message, value),
        ("v1", "Node") => typed::<Node>(api_version, kind, message, value),
        ("v1", "Event") => typed::<Event>(api_version, kind, message, value),
        ("v1", "Status") => typed::<Status>(api_version, kind, message, value),
        ("apps/v1", "Deployment") => typed::<Deployment>(api_version, kind, message, value),
        ("apps/v1", "StatefulSet") => typed::<StatefulSet>(api_version, kind, message, value),
        ("batch/v1", "Job") => typed::<Job>(api_version, kind, message, value),
        ("batch/v1", "CronJob") => typed::<CronJob>(api_version, kind, message, value),
        ("coordination.k8s.io/v1", "Lease") => typed::<Lease>(api_version, kind, message, value),
        ("apiextensions.k8s.io/v1", "CustomResourceDefinition") => {
            typed::<CustomResourceDefinition>(api_version, kind, message, value)
        }
        ("meta.k8s.io/v1", "PartialObjectMetadata") => {
            typed::<MetadataOnly>(api_version, kind, message, value)
        }
        _ => {}
    }
}

/// A `PartialObjectMetadata` as a program reads it (kube's `PartialObjectMeta` cannot be
/// compared).
#[derive(Debug, PartialEq, serde::Deserialize)]
struct MetadataOnly {
    metadata: ObjectMeta,
}

fn typed<T: DeserializeOwned + PartialEq + std::fmt::Debug>(
    api_version: &str,
    kind: &str,
    message: &[u8],
    value: Option<&Value>,
) {
    let direct = decode_message::<T>(api_version, kind, message);
    let Some(via_json) = value.and_then(|v| serde_json::from_value::<T>(v.clone()).ok()) else {
        return;
    };
    match direct {
        Ok(direct) => assert_eq!(
            direct, via_json,
            "{api_version} {kind}: straight and via JSON"
        ),
        Err(e) => panic!(
            "{api_version} {kind}: reads as JSON, and as {} from that, but not straight: {e}",
            std::any::type_name::<T>()
        ),
    }
}

/// Target `envelope`: the envelope (`k8s\0` and `runtime.Unknown`) of an object of any kind,
/// and a watch frame's `WatchEvent` around one, decoded as JSON values, and the loose readings
/// that name an object that is not decoded. Never a panic; an object decodes the same through
/// its envelope as through its message and the kind the envelope names.
pub fn fuzz_envelope(data: &[u8]) {
    let whole = from_slice::<Value>(data).map_err(|e| e.to_string());
    match Envelope::parse(data) {
        Ok(envelope) => {
            let alone = decode_message::<Value>(envelope.api_version, envelope.kind, envelope.raw);
            assert_eq!(whole, alone.map_err(|e| e.to_string()));
            let _ = LooseNames::of_object(envelope.raw);
        }
        Err(e) => assert_eq!(whole, Err(e.to_string())),
    }
    if let Ok(event) = RawWatchEvent::parse(data) {
        let _ = event.decode::<Value>();
        let _ = event.decode::<IgnoredAny>();
    }
    let _ = LooseNames::of_watch_frame(data);
    let _ = LooseNames::of_object(data);
}

/// Target `watch_framer`: the watch framer ([`Frames`]: a 4-byte big-endian length, then the
/// frame) against a reading of the whole stream at once. However the bytes arrive (the
/// input's head cuts them), it hands out the same frames, each whole and in order, holds the
/// unread tail of what arrived, and at the end holds exactly the bytes of the frame not yet
/// whole.
pub fn fuzz_watch_framer(data: &[u8]) {
    let Some((head, stream)) = Head::split(data) else {
        return;
    };
    let (mut want, mut rest) = (Vec::new(), stream);
    while let Some(len) = rest
        .first_chunk::<4>()
        .map(|l| u32::from_be_bytes(*l) as usize)
    {
        let Some(frame) = rest.get(4..).and_then(|r| r.get(..len)) else {
            break;
        };
        want.push(frame.to_vec());
        rest = &rest[4 + len..];
    }
    let mut frames = Frames::new();
    let mut got: Vec<Vec<u8>> = Vec::new();
    let mut from = 0;
    for cut in head.cuts.iter().copied().chain([stream.len()]) {
        if cut < from || cut > stream.len() {
            continue;
        }
        frames.push(&stream[from..cut]);
        from = cut;
        while let Some(frame) = frames.next_frame() {
            got.push(frame.to_vec());
        }
        assert_eq!(frames.unread(), &stream[cut - frames.pending()..cut]);
    }
    assert_eq!(got, want, "frames, with cuts at {:?}", head.cuts);
    assert_eq!(
        frames.pending(),
        rest.len(),
        "bytes held after the last frame"
    );
    let next = rest
        .first_chunk::<4>()
        .map(|l| u32::from_be_bytes(*l) as usize);
    assert_eq!(frames.next_len(), next);
}

/// Runs `target` on each input in `testdata-fuzz/<target>/` (each a failure the fuzz target
/// once found, named for it), and says which panicked.
#[cfg(test)]
pub(crate) fn replay(target: &str, run: fn(&[u8])) {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("src/protobuf/testdata-fuzz")
        .join(target);
    let paths: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    assert!(!paths.is_empty(), "{}: no inputs", dir.display());
    let mut failed: Vec<String> = paths
        .into_iter()
        .filter(|path| {
            let bytes = std::fs::read(path).unwrap();
            std::panic::catch_unwind(|| run(&bytes)).is_err()
        })
        .map(|path| path.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    failed.sort();
    assert!(
        failed.is_empty(),
        "{target} fails on {failed:?} in {}",
        dir.display()
    );
}
