//! Decoding one object from Kubernetes protobuf (`kubeloop::protobuf`) against decoding the
//! same object from its JSON with serde_json, into the same k8s-openapi type: the test corpus's
//! ConfigMap (with managedFields), Pod and Deployment, as the real apiserver sent them
//! (`src/protobuf/testdata`, written by `hack/generate-protobuf-table`).
//!
//! ```text
//! cargo bench --bench protobuf
//! ```

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use serde::de::DeserializeOwned;

macro_rules! fixture {
    ($name:literal) => {
        (
            $name,
            &include_bytes!(concat!("../src/protobuf/testdata/", $name, ".pb"))[..],
            &include_bytes!(concat!("../src/protobuf/testdata/", $name, ".json"))[..],
        )
    };
}

fn decode<T: DeserializeOwned>(c: &mut Criterion, (name, pb, json): (&str, &[u8], &[u8])) {
    let mut group = c.benchmark_group(format!("decode/{name}"));
    group.bench_function("protobuf", |b| {
        b.iter(|| kubeloop::protobuf::from_slice::<T>(black_box(pb)).unwrap())
    });
    group.bench_function("json", |b| {
        b.iter(|| serde_json::from_slice::<T>(black_box(json)).unwrap())
    });
    group.finish();
}

fn benches(c: &mut Criterion) {
    decode::<ConfigMap>(c, fixture!("configmap"));
    decode::<Pod>(c, fixture!("pod"));
    decode::<Deployment>(c, fixture!("deployment"));
}

criterion_group!(protobuf, benches);
criterion_main!(protobuf);
