//! Throughput of the cache's in-memory pieces (no apiserver): DeltaFIFO add+pop, indexed
//! store writes, lister scans with a label selector, and the informer path as a whole (watch
//! event -> reflector -> RealFIFO -> indexer -> handler -> workqueue add) from an in-memory
//! watch stream.

// The allocator the `kubeloop` binary ships with (`kubeloop-cli`'s default feature `mimalloc`).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use futures::StreamExt;
use kube_client::core::WatchEvent;

use criterion::{Criterion, criterion_group, criterion_main};
use k8s_openapi::api::core::v1::ConfigMap;
use kube_client::api::ObjectMeta;
use kubeloop::cache::{
    DeltaFIFO, InformerConfig, InformerQueue, KnownObjects, LabelSelector, ListOptions, ListPage,
    ListWatchError, Lister, ListerWatcher, ReflectorStore, ResourceEventHandlerFuncs,
    SharedIndexInformer, ThreadSafeStore, WatchOptions, WatchStream, default_key_func,
    meta_namespace_key, namespace_indexers,
};
use kubeloop::workqueue::Queue;

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

/// A list/watch source whose one watch stream is fed by the bench through a channel.
struct ChannelSource {
    events: parking_lot::Mutex<Option<WatchRx>>,
}

type WatchRx = tokio::sync::mpsc::UnboundedReceiver<Result<WatchEvent<ConfigMap>, ListWatchError>>;

impl ListerWatcher<ConfigMap> for ChannelSource {
    async fn list(&self, _options: &ListOptions) -> Result<ListPage<ConfigMap>, ListWatchError> {
        Ok(ListPage {
            items: vec![],
            resource_version: "1".into(),
            continue_token: None,
            undecodable: vec![],
            shard_info: None,
        })
    }
    fn watch(
        &self,
        _options: &WatchOptions,
    ) -> impl Future<Output = Result<WatchStream<ConfigMap>, ListWatchError>> + Send {
        let rx = self.events.lock().take();
        async move {
            match rx {
                Some(rx) => Ok(tokio_stream_of(rx)),
                // A second watch (the bench never closes the first): one that stays open.
                None => Ok(futures::stream::pending().boxed()),
            }
        }
    }
    fn type_description(&self) -> String {
        "v1/configmaps".into()
    }
}

fn tokio_stream_of(mut rx: WatchRx) -> WatchStream<ConfigMap> {
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx)).boxed()
}

/// Watch events through a running informer into a workqueue, as a controller receives them:
/// the path `kubeloop::trace` hooks into (each stage does one relaxed atomic load when no key
/// is traced).
fn informer_path(c: &mut Criterion) {
    const EVENTS: usize = 1000;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let source = ChannelSource {
        events: parking_lot::Mutex::new(Some(rx)),
    };
    let mut config = InformerConfig::default();
    config.reflector.use_watch_list = false;
    let queue: Queue<String> = Queue::new();
    let handled = Arc::new(AtomicUsize::new(0));
    let informer = rt.block_on(async {
        let informer = SharedIndexInformer::new(source, config);
        let (q, n) = (queue.clone(), handled.clone());
        informer
            .add_event_handler(
                ResourceEventHandlerFuncs::new()
                    .on_add(move |o: &Arc<ConfigMap>, _| {
                        q.add(meta_namespace_key(&**o).unwrap());
                        n.fetch_add(1, Ordering::Relaxed);
                    })
                    .on_update({
                        let (q, n) = (queue.clone(), handled.clone());
                        move |_, o: &Arc<ConfigMap>| {
                            q.add(meta_namespace_key(&**o).unwrap());
                            n.fetch_add(1, Ordering::Relaxed);
                        }
                    }),
            )
            .unwrap();
        informer.start();
        informer.wait_for_cache_sync().await;
        informer
    });
    let objects: Vec<ConfigMap> = (0..EVENTS).map(cm).collect();
    let mut rv = 10usize;
    c.bench_function("informer_watch_event_to_workqueue_1000", |b| {
        b.iter(|| {
            let target = handled.load(Ordering::Relaxed) + EVENTS;
            for o in &objects {
                let mut o = o.clone();
                rv += 1;
                o.metadata.resource_version = Some(rv.to_string());
                tx.send(Ok(WatchEvent::Modified(o))).unwrap();
            }
            rt.block_on(async {
                while handled.load(Ordering::Relaxed) < target {
                    tokio::task::yield_now().await;
                }
                while !queue.is_empty() {
                    let k = queue.get().await.unwrap();
                    queue.done(&k);
                }
            });
        })
    });
    rt.block_on(informer.shutdown());
}

criterion_group!(benches, delta_fifo, store_and_lister, informer_path);
criterion_main!(benches);
