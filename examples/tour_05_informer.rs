//! Tour, chapter 5 (docs/05-shared-informer.md): one shared informer, two event handlers.
//! The factory hands out one informer per type however often it is asked (one LIST+WATCH for
//! every controller in the process); each handler gets every notification in order, from a
//! buffer of its own, so a slow handler never holds up another.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube_client::Client;
use kube_client::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kubeloop::cache::{FactoryOptions, ResourceEventHandlerFuncs, SharedInformerFactory};
use parking_lot::Mutex;

const NAME: &str = "tour-05";

type Log = Arc<Mutex<Vec<String>>>;

/// A handler that logs the notifications about our ConfigMap.
fn logging_handler(log: &Log) -> ResourceEventHandlerFuncs<ConfigMap> {
    let ours = |cm: &ConfigMap| cm.metadata.name.as_deref() == Some(NAME);
    let (a, u, d) = (log.clone(), log.clone(), log.clone());
    ResourceEventHandlerFuncs::new()
        .on_add(move |cm: &Arc<ConfigMap>, initial| {
            if ours(cm) {
                a.lock()
                    .push(format!("on_add (in initial list: {initial})"));
            }
        })
        .on_update(move |old: &Arc<ConfigMap>, new: &Arc<ConfigMap>| {
            if ours(new) {
                let rv = |c: &ConfigMap| c.metadata.resource_version.clone().unwrap_or_default();
                u.lock()
                    .push(format!("on_update rv {} -> {}", rv(old), rv(new)));
            }
        })
        .on_delete(move |gone| {
            if ours(gone.object()) {
                d.lock()
                    .push(format!("on_delete (tombstone: {})", gone.is_tombstone()));
            }
        })
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let client = Client::try_default().await?;
    let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let _ = configmaps.delete(NAME, &DeleteParams::default()).await;

    let factory = SharedInformerFactory::new(client, FactoryOptions::default());
    let first = factory.informer::<ConfigMap>();
    let second = factory.informer::<ConfigMap>();
    let (log_a, log_b): (Log, Log) = Default::default();
    first.add_event_handler(logging_handler(&log_a))?;
    second.add_event_handler(logging_handler(&log_b))?;
    println!(
        "asked the factory twice: the same informer? {}; handlers on it: {}",
        first.ptr_eq(&second),
        first.handler_count()
    );
    factory.start();
    factory.wait_for_cache_sync().await;
    println!("started: one LIST+WATCH of ConfigMaps, cache synced");

    let mut cm = ConfigMap::default();
    cm.metadata.name = Some(NAME.into());
    configmaps.create(&PostParams::default(), &cm).await?;
    let patch = serde_json::json!({"data": {"color": "blue"}});
    configmaps
        .patch(NAME, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    configmaps.delete(NAME, &DeleteParams::default()).await?;

    // Each handler runs on its own task; wait until both have seen the deletion.
    for _ in 0..100 {
        if log_a.lock().len() >= 3 && log_b.lock().len() >= 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for (name, log) in [("handler A", &log_a), ("handler B", &log_b)] {
        for line in log.lock().iter() {
            println!("{name}: {line}");
        }
    }
    factory.shutdown().await;
    Ok(())
}
