//! Throughput of the cache's in-memory pieces (no apiserver): DeltaFIFO add+pop, indexed
//! store writes, lister scans with a label selector.

use std::hint::black_box;
use std::sync::Arc;

use criterion::{Criterion, criterion_group, criterion_main};
use k8s_openapi::api::core::v1::ConfigMap;
use kube_client::api::ObjectMeta;
use kubeloop::cache::{
    DeltaFIFO, KnownObjects, LabelSelector, Lister, ThreadSafeStore, default_key_func,
    index::namespace_indexers,
};

fn cm(i: usize) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(format!("cm-{i}")),
            namespace: Some(format!("ns-{}", i % 10)),
            resource_version: Some(i.to_string()),
            labels: Some([("shard".to_string(), (i % 7).to_string())].into()),
            ..Default::default()
        },
        ..Default::default()
    }
}

fn delta_fifo(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let objects: Vec<ConfigMap> = (0..1000).map(cm).collect();
    c.bench_function("delta_fifo_add_then_pop_1000", |b| {
        b.iter(|| {
            let store = ThreadSafeStore::new(namespace_indexers::<ConfigMap>());
            let known: Arc<dyn KnownObjects<ConfigMap>> = Arc::new(store.clone());
            let fifo = DeltaFIFO::new(default_key_func(), Some(known));
            for o in &objects {
                fifo.add(o.clone()).unwrap();
            }
            rt.block_on(async {
                for _ in 0..objects.len() {
                    fifo.pop(|d, _| black_box(d.len())).await.unwrap();
                }
            });
        })
    });
    c.bench_function("delta_fifo_replace_10000", |b| {
        let big: Vec<ConfigMap> = (0..10_000).map(cm).collect();
        b.iter(|| {
            let fifo = DeltaFIFO::new(default_key_func(), None);
            fifo.replace(big.clone(), "1").unwrap();
            black_box(fifo.len())
        })
    });
}

fn store_and_lister(c: &mut Criterion) {
    let objects: Vec<Arc<ConfigMap>> = (0..10_000).map(|i| Arc::new(cm(i))).collect();
    c.bench_function("thread_safe_store_add_10000_indexed", |b| {
        b.iter(|| {
            let store = ThreadSafeStore::new(namespace_indexers::<ConfigMap>());
            for (i, o) in objects.iter().enumerate() {
                store.add(format!("ns-{}/cm-{i}", i % 10), o.clone());
            }
            black_box(store.len())
        })
    });
    let store = ThreadSafeStore::new(namespace_indexers::<ConfigMap>());
    for (i, o) in objects.iter().enumerate() {
        store.add(format!("ns-{}/cm-{i}", i % 10), o.clone());
    }
    let lister = Lister::new(store.reader());
    let selector = LabelSelector::parse("shard in (1,2)").unwrap();
    c.bench_function("lister_list_10000_with_selector", |b| {
        b.iter(|| black_box(lister.list(&selector).len()))
    });
    c.bench_function("namespace_lister_1000_of_10000", |b| {
        b.iter(|| black_box(lister.namespaced("ns-3").list(&selector).len()))
    });
}

criterion_group!(benches, delta_fifo, store_and_lister);
criterion_main!(benches);
