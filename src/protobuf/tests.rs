//! The decoder against the apiserver's own encoders: `testdata/` holds objects of the
//! built-in kinds with the awkward fields set, each encoded by k8s.io/apimachinery's protobuf
//! and JSON serializers (`hack/go/protobuf-table -fixtures`). Decoded from protobuf, each must
//! equal its JSON, key for key, and decode into the same k8s-openapi value.

use std::path::{Path, PathBuf};

use k8s_openapi::api::apps::v1::{ControllerRevision, Deployment, StatefulSet};
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::api::batch::v1::{CronJob, Job};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{
    ConfigMap, Event, Namespace, Node, PersistentVolumeClaim, Pod, Secret, Service, ServiceAccount,
};
use k8s_openapi::api::networking::v1::{Ingress, NetworkPolicy};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Status;
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::*;
use crate::protobuf::wire::delimited;

fn testdata() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src/protobuf/testdata")
}

fn fixture(name: &str) -> (Vec<u8>, Vec<u8>) {
    let read = |ext: &str| {
        let path = testdata().join(format!("{name}.{ext}"));
        std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    };
    (read("pb"), read("json"))
}

fn fixture_names() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(testdata())
        .unwrap()
        .filter_map(|e| {
            let name = e.unwrap().file_name().into_string().unwrap();
            name.strip_suffix(".pb").map(str::to_string)
        })
        .collect();
    names.sort();
    names
}

#[test]
fn every_fixture_decodes_to_its_json_key_for_key() {
    let names = fixture_names();
    assert!(names.len() >= 26, "{names:?}");
    for name in names {
        let (pb, json) = fixture(&name);
        let want: Value = serde_json::from_slice(&json).unwrap();
        let got: Value = from_slice(&pb).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(
            got,
            want,
            "{name}: protobuf decoded to\n{}\nbut the JSON is\n{}",
            serde_json::to_string_pretty(&got).unwrap(),
            serde_json::to_string_pretty(&want).unwrap()
        );
    }
}

fn same_typed<T: DeserializeOwned + PartialEq + std::fmt::Debug>(name: &str) {
    let (pb, json) = fixture(name);
    let from_json: T = serde_json::from_slice(&json).unwrap_or_else(|e| panic!("{name}.json: {e}"));
    let from_pb: T = from_slice(&pb).unwrap_or_else(|e| panic!("{name}.pb: {e}"));
    assert_eq!(from_pb, from_json, "{name}");
}

#[test]
fn every_fixture_decodes_to_the_k8s_openapi_value_its_json_gives() {
    same_typed::<ConfigMap>("configmap");
    same_typed::<ConfigMap>("configmap-bare");
    same_typed::<k8s_openapi::List<ConfigMap>>("configmap-list");
    same_typed::<Secret>("secret");
    same_typed::<Pod>("pod");
    same_typed::<Service>("service");
    same_typed::<Deployment>("deployment");
    same_typed::<StatefulSet>("statefulset");
    same_typed::<Job>("job");
    same_typed::<CronJob>("cronjob");
    same_typed::<Node>("node");
    same_typed::<Lease>("lease");
    same_typed::<Event>("event");
    same_typed::<Namespace>("namespace");
    same_typed::<ServiceAccount>("serviceaccount");
    same_typed::<Role>("role");
    same_typed::<RoleBinding>("rolebinding");
    same_typed::<PersistentVolumeClaim>("pvc");
    same_typed::<NetworkPolicy>("networkpolicy");
    same_typed::<Ingress>("ingress");
    same_typed::<HorizontalPodAutoscaler>("hpa");
    same_typed::<PodDisruptionBudget>("pdb");
    same_typed::<ControllerRevision>("controllerrevision");
    same_typed::<CustomResourceDefinition>("crd");
    same_typed::<Status>("status");
}

/// A ConfigMap's `data` entry `{key, value}` as tag 2.
/// A repeated field's `Vec` is allocated once, at its length (the items' `size_hint`), where
/// serde_json's grows from room for four: a typed cache keeps none of that spare room.
#[test]
fn repeated_fields_are_allocated_at_their_length() {
    let (pb, _) = fixture("pod");
    let pod: Pod = from_slice(&pb).unwrap();
    let managed = pod.metadata.managed_fields.unwrap();
    let containers = pod.spec.unwrap().containers;
    let ports = containers[0].ports.as_ref().unwrap();
    for (what, len, capacity) in [
        ("managedFields", managed.len(), managed.capacity()),
        ("containers", containers.len(), containers.capacity()),
        ("ports", ports.len(), ports.capacity()),
    ] {
        assert!(len > 0, "{what}: the fixture has none");
        assert_eq!(capacity, len, "{what}");
    }
}

fn data_entry(key: &str, value: &str) -> Vec<u8> {
    let mut entry = vec![0x0a, key.len() as u8];
    entry.extend_from_slice(key.as_bytes());
    entry.extend_from_slice(&[0x12, value.len() as u8]);
    entry.extend_from_slice(value.as_bytes());
    let mut field = vec![0x12, entry.len() as u8];
    field.extend(entry);
    field
}

#[test]
fn a_repeated_field_is_one_run_and_a_second_run_is_refused() {
    let immutable = [0x20, 0x01];
    let one_run = [
        data_entry("a", "1"),
        data_entry("b", "2"),
        immutable.to_vec(),
    ]
    .concat();
    let cm: ConfigMap = decode_message("v1", "ConfigMap", &one_run).unwrap();
    assert_eq!(cm.data.unwrap().len(), 2);
    assert_eq!(cm.immutable, Some(true));

    let two_runs = [
        data_entry("a", "1"),
        immutable.to_vec(),
        data_entry("b", "2"),
    ]
    .concat();
    let err = decode_message::<ConfigMap>("v1", "ConfigMap", &two_runs).unwrap_err();
    assert!(
        err.to_string()
            .contains("v1.ConfigMap.data (tag 2) comes in two runs"),
        "{err}"
    );
    // A field the table does not know (tag 9) between the runs splits them too.
    let unknown = [0x48, 0x01];
    let split = [data_entry("a", "1"), unknown.to_vec(), data_entry("b", "2")].concat();
    assert!(decode_message::<ConfigMap>("v1", "ConfigMap", &split).is_err());
    // ...and alone it is skipped.
    let skipped = [unknown.to_vec(), data_entry("a", "1")].concat();
    let cm: ConfigMap = decode_message("v1", "ConfigMap", &skipped).unwrap();
    assert_eq!(cm.data.unwrap()["a"], "1");
}

/// A small deterministic generator (xorshift64*), so a failing mutation can be replayed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// `bytes` changed a little: a bit flipped, a byte set to an edge value (a varint's
/// continuation bit, a huge length), a byte dropped or doubled, or the end cut off.
fn mutate(bytes: &[u8], rng: &mut Rng) -> Vec<u8> {
    let mut out = bytes.to_vec();
    for _ in 0..=rng.below(3) {
        if out.is_empty() {
            break;
        }
        let at = rng.below(out.len());
        match rng.below(5) {
            0 => out[at] ^= 1 << rng.below(8),
            1 => out[at] = [0x00, 0x7f, 0x80, 0xff][rng.below(4)],
            2 => {
                out.remove(at);
            }
            3 => out.insert(at, out[at]),
            _ => out.truncate(at),
        }
    }
    out
}

/// A fast smoke test over mutated real objects, the same mutations every run (the fuzzing
/// proper is coverage-guided: the targets in `fuzz/`, run by `hack/fuzz`, which learn new
/// inputs from each run): whatever the bytes, decoding returns a value or an error and never
/// panics. Each fixture is mutated 1,000 ways in each of three forms (the object as the
/// apiserver sends it, a watch event carrying it, a LIST body holding its message twice) and
/// decoded as its k8s-openapi type, as JSON values, and by the loose readers that name
/// skipped objects.
#[test]
fn mutated_objects_frames_and_lists_decode_or_fail_but_never_panic() {
    fn attempt<T: DeserializeOwned>(object: &[u8], frame: &[u8], list: &[u8]) {
        let _ = from_slice::<T>(object);
        let _ = from_slice::<Value>(object);
        if let Ok(event) = RawWatchEvent::parse(frame) {
            let _ = event.decode::<T>();
        }
        let _ = LooseNames::of_watch_frame(frame);
        for chunk in [1, 7, list.len().max(1)] {
            let mut reader = ListReader::new("AnyList", 1 << 20);
            for bytes in list.chunks(chunk) {
                let fed = reader.feed::<DecodeError>(bytes, |part| {
                    if let ListPart::Item(item) = part {
                        let _ = LooseNames::of_object(item);
                    }
                    Ok(())
                });
                if fed.is_err() {
                    break;
                }
            }
            let _ = reader.finish();
        }
    }
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for name in fixture_names() {
        let (pb, _) = fixture(&name);
        let message = Envelope::parse(&pb).unwrap().raw.to_vec();
        let frame = [delimited(1, b"ADDED"), delimited(2, &delimited(1, &pb))].concat();
        let type_meta = [delimited(1, b"v1"), delimited(2, b"AnyList")].concat();
        let items = [delimited(2, &message), delimited(2, &message)].concat();
        let list = [&MAGIC[..], &delimited(1, &type_meta), &delimited(2, &items)].concat();
        for round in 0..1_000 {
            let seed = rng.0;
            let (object, frame, list) = (
                mutate(&pb, &mut rng),
                mutate(&frame, &mut rng),
                mutate(&list, &mut rng),
            );
            let result = std::panic::catch_unwind(|| match name.as_str() {
                "configmap" | "configmap-bare" => attempt::<ConfigMap>(&object, &frame, &list),
                "pod" => attempt::<Pod>(&object, &frame, &list),
                "deployment" => attempt::<Deployment>(&object, &frame, &list),
                "crd" => attempt::<CustomResourceDefinition>(&object, &frame, &list),
                _ => attempt::<serde::de::IgnoredAny>(&object, &frame, &list),
            });
            assert!(
                result.is_ok(),
                "{name}, mutation {round} (rng seed {seed:#x}) panicked"
            );
        }
    }
}

/// The targets on well-formed inputs reach what they check: every fixture decodes through
/// `protobuf_decode` and `envelope`, and a stream of its frames, cut anywhere, through
/// `watch_framer`.
#[test]
fn the_protobuf_fuzz_targets_pass_on_every_fixture() {
    let kinds: Vec<(&str, &str)> = generated::ROOTS
        .iter()
        .map(|r| (r.api_version, r.kind))
        .collect();
    for name in fixture_names() {
        let (pb, _) = fixture(&name);
        let envelope = Envelope::parse(&pb).unwrap();
        let pick = kinds
            .iter()
            .position(|&k| k == (envelope.api_version, envelope.kind))
            .unwrap_or_else(|| panic!("{name}: not a top-level kind"));
        fuzz::fuzz_protobuf_decode(&[&(pick as u16).to_be_bytes()[..], envelope.raw].concat());
        fuzz::fuzz_envelope(&pb);
        let frame = [delimited(1, b"ADDED"), delimited(2, &delimited(1, &pb))].concat();
        let framed = [&(frame.len() as u32).to_be_bytes()[..], &frame].concat();
        let stream = [&framed[..], &framed, &framed[..7]].concat();
        for cut in [1, 5, framed.len(), framed.len() + 3] {
            let head = [&[1u8][..], &(cut as u16).to_be_bytes()].concat();
            fuzz::fuzz_watch_framer(&[&head[..], &stream].concat());
        }
    }
}
