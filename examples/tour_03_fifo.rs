//! Tour, chapter 3 (docs/03-fifo.md): what sits between the reflector and the informer.
//! One ConfigMap is created, changed twice and deleted; the four watch events go into a
//! DeltaFIFO and into a RealFIFO, and each queue is popped until empty. The DeltaFIFO hands out
//! one item per key holding all its deltas; the RealFIFO (client-go's default since 1.33, and
//! kubeloop's) hands out every event on its own, in arrival order.

use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube_client::Client;
use kube_client::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube_client::core::WatchEvent;
use kubeloop::cache::{
    DeltaFIFO, Deltas, InformerQueue, KnownObjects, ListWatch, ListerWatcher, Popped, RealFIFO,
    ReflectorStore, ThreadSafeStore, WatchOptions, default_key_func, namespace_indexers,
};

const NAME: &str = "tour-03";

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let client = Client::try_default().await?;
    let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let _ = configmaps.delete(NAME, &DeleteParams::default()).await;
    let now = configmaps
        .list_metadata(&ListParams::default().limit(1))
        .await?
        .metadata
        .resource_version
        .unwrap_or_default();
    // Only our ConfigMap: other programs may be changing others in `default`.
    let lw = ListWatch::<ConfigMap>::namespaced(client.clone(), "default")
        .fields(&format!("metadata.name={NAME}"));
    let mut watch = lw
        .watch(&WatchOptions {
            resource_version: now,
            timeout_seconds: Some(10),
            ..Default::default()
        })
        .await?;

    let mut cm = ConfigMap::default();
    cm.metadata.name = Some(NAME.into());
    configmaps.create(&PostParams::default(), &cm).await?;
    for n in 1..=2 {
        let patch = serde_json::json!({"data": {"n": n.to_string()}});
        configmaps
            .patch(NAME, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
    }
    configmaps.delete(NAME, &DeleteParams::default()).await?;

    // The informer's cache: both queues consult it (a deletion of an unknown key, a resync).
    let known: Arc<dyn KnownObjects<ConfigMap>> =
        Arc::new(ThreadSafeStore::new(namespace_indexers::<ConfigMap>()));
    let delta_fifo = DeltaFIFO::new(default_key_func(), Some(known.clone()));
    let real_fifo = RealFIFO::new(default_key_func(), known);
    for _ in 0..4 {
        let Some(event) = watch.next().await else {
            break;
        };
        let (verb, result) = match event? {
            WatchEvent::Added(o) => ("ADDED", (delta_fifo.add(o.clone()), real_fifo.add(o))),
            WatchEvent::Modified(o) => (
                "MODIFIED",
                (delta_fifo.update(o.clone()), real_fifo.update(o)),
            ),
            WatchEvent::Deleted(o) => (
                "DELETED",
                (delta_fifo.delete(o.clone()), real_fifo.delete(o)),
            ),
            other => {
                println!("unexpected event {other:?}");
                continue;
            }
        };
        result.0?;
        result.1?;
        println!("watch event {verb:<8} -> queued in both");
    }
    println!(
        "DeltaFIFO holds {} item(s); RealFIFO holds {} item(s)",
        delta_fifo.len(),
        real_fifo.len()
    );

    while !delta_fifo.is_empty() {
        let popped = delta_fifo.pop(|deltas, _| describe(&deltas)).await?;
        println!("DeltaFIFO pop -> {popped}");
    }
    while !real_fifo.is_empty() {
        // A RealFIFO pop can also be a whole list or a resync (`Popped::ReplacedAll`,
        // `Popped::SyncAll`); four watch events are four single events.
        let popped = real_fifo
            .pop(|popped, _| match popped {
                Popped::Deltas(deltas) => describe(&deltas),
                other => format!("{other:?}"),
            })
            .await?;
        println!("RealFIFO  pop -> {popped}");
    }
    Ok(())
}

/// `default/tour-03: [Added rv=5, Updated rv=6]`
fn describe(deltas: &Deltas<ConfigMap>) -> String {
    let key = deltas
        .first()
        .and_then(|d| kubeloop::cache::meta_namespace_key(&**d.object()).ok())
        .unwrap_or_default();
    let items: Vec<String> = deltas
        .iter()
        .map(|d| {
            let rv = d
                .object()
                .metadata
                .resource_version
                .clone()
                .unwrap_or_default();
            format!("{:?} rv={rv}", d.delta_type())
        })
        .collect();
    format!("{key}: [{}]", items.join(", "))
}
