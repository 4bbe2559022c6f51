//! Tour, chapter 4 (docs/04-indexer-and-listers.md): the informer's cache. Objects are stored
//! under their key `namespace/name`; an index maps a computed value (here the `app` label) to
//! the keys of the objects that have it; listers read the cache, never the apiserver.

use std::sync::Arc;

use k8s_openapi::api::core::v1::ConfigMap;
use kube_client::Client;
use kube_client::api::{Api, DeleteParams, PostParams};
use kubeloop::cache::{
    IndexFunc, InformerConfig, LabelSelector, ListWatch, SharedIndexInformer, namespace_indexers,
};

const OBJECTS: [(&str, &str); 3] = [
    ("tour-04-web-1", "web"),
    ("tour-04-web-2", "web"),
    ("tour-04-db", "db"),
];

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let client = Client::try_default().await?;
    let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    for (name, app) in OBJECTS {
        let _ = configmaps.delete(name, &DeleteParams::default()).await;
        let mut cm = ConfigMap::default();
        cm.metadata.name = Some(name.into());
        cm.metadata.labels = Some([("app".to_string(), app.to_string())].into());
        configmaps.create(&PostParams::default(), &cm).await?;
    }

    // The namespace index (client-go's MetaNamespaceIndexFunc) plus one of our own.
    let mut indexers = namespace_indexers::<ConfigMap>();
    let by_app: IndexFunc<ConfigMap> = Arc::new(|cm: &ConfigMap| {
        let app = cm.metadata.labels.as_ref().and_then(|l| l.get("app"));
        app.into_iter().cloned().collect()
    });
    indexers.insert("by-app".into(), by_app);
    let lw = ListWatch::<ConfigMap>::namespaced(client.clone(), "default");
    let informer = SharedIndexInformer::with_indexers(lw, indexers, InformerConfig::default());
    informer.start();
    informer.wait_for_cache_sync().await;

    let indexer = informer.indexer();
    let mut keys = indexer.list_keys();
    keys.retain(|k| k.starts_with("default/tour-04"));
    keys.sort();
    println!("keys in the cache: {keys:?}");
    let mut web = indexer.index_keys("by-app", "web")?;
    web.sort();
    println!("index by-app, value web -> {web:?}");
    let mut values = indexer.list_index_func_values("by-app")?;
    values.sort();
    println!("values of index by-app: {values:?}");

    let lister = informer.lister();
    let db = lister.get("default", "tour-04-db");
    println!(
        "lister.get(default, tour-04-db) -> {:?} (an Arc<ConfigMap> shared with the cache)",
        db.as_ref().and_then(|d| d.metadata.name.clone())
    );
    let selector = LabelSelector::parse("app in (web)")?;
    let mut names: Vec<String> = lister
        .namespaced("default")
        .list(&selector)
        .iter()
        .filter_map(|cm| cm.metadata.name.clone())
        .collect();
    names.sort();
    println!("lister.namespaced(default).list(app in (web)) -> {names:?}");

    informer.shutdown().await;
    for (name, _) in OBJECTS {
        configmaps.delete(name, &DeleteParams::default()).await?;
    }
    Ok(())
}
