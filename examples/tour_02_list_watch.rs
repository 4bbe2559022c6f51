//! Tour, chapter 2 (docs/02-list-and-watch.md): LIST then WATCH from the list's
//! resourceVersion, the streaming list's closing bookmark, and the 410 Gone that sends a
//! reflector back to LIST. Uses `kubeloop::cache::ListWatch`, the reflector's source.

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube_client::Client;
use kube_client::api::{Api, DeleteParams, PostParams};
use kube_client::core::WatchEvent;
use kubeloop::cache::{ListOptions, ListWatch, ListerWatcher, WatchOptions};

const NAMES: [&str; 2] = ["tour-02-a", "tour-02-b"];

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let client = Client::try_default().await?;
    let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    for name in NAMES {
        let _ = configmaps.delete(name, &DeleteParams::default()).await;
    }
    // Only ConfigMaps labelled tour=02: other programs may be changing others in `default`.
    let lw = ListWatch::<ConfigMap>::namespaced(client.clone(), "default").labels("tour=02");

    // 1. LIST: the objects, and the resourceVersion the list is consistent at.
    let page = lw.list(&ListOptions::default()).await?;
    println!(
        "1. LIST: {} ConfigMaps at resourceVersion {}",
        page.items.len(),
        page.resource_version
    );

    // 2. WATCH from exactly that version: every change after the list, none twice.
    let mut watch = lw
        .watch(&WatchOptions {
            resource_version: page.resource_version.clone(),
            timeout_seconds: Some(10),
            allow_watch_bookmarks: true,
            ..Default::default()
        })
        .await?;
    let mut cm = ConfigMap::default();
    cm.metadata.name = Some(NAMES[0].into());
    cm.metadata.labels = Some([("tour".to_string(), "02".to_string())].into());
    configmaps.create(&PostParams::default(), &cm).await?;
    if let Some(Ok(WatchEvent::Added(o))) = watch.next().await {
        println!(
            "2. WATCH from {}: ADDED {} at resourceVersion {}",
            page.resource_version,
            o.metadata.name.unwrap_or_default(),
            o.metadata.resource_version.unwrap_or_default()
        );
    }
    drop(watch);

    // 3. The streaming list (sendInitialEvents=true): the current objects come as ADDED
    //    events, then a BOOKMARK annotated k8s.io/initial-events-end marks "the list is done"
    //    and carries its resourceVersion; the same stream then goes on as a watch.
    cm.metadata.name = Some(NAMES[1].into());
    configmaps.create(&PostParams::default(), &cm).await?;
    let mut stream = lw
        .watch(&WatchOptions {
            resource_version: String::new(),
            resource_version_match: Some("NotOlderThan".into()),
            allow_watch_bookmarks: true,
            send_initial_events: true,
            timeout_seconds: Some(10),
        })
        .await?;
    let mut initial = 0;
    while let Some(event) = stream.next().await {
        match event? {
            WatchEvent::Added(_) => initial += 1,
            WatchEvent::Bookmark(b) => {
                let end = b
                    .metadata
                    .annotations
                    .get("k8s.io/initial-events-end")
                    .cloned()
                    .unwrap_or_default();
                println!(
                    "3. streaming list: {initial} ADDED events, then BOOKMARK at resourceVersion {} (k8s.io/initial-events-end={end})",
                    b.metadata.resource_version
                );
                break;
            }
            other => println!("   unexpected: {other:?}"),
        }
    }
    drop(stream);

    // 4. A WATCH from a version the apiserver no longer keeps: 410 Gone, "too old resource
    //    version". etcd keeps history until it is compacted, which the apiserver asks for
    //    every 5 minutes; after that, old versions are gone for good. A reflector answers the
    //    410 by LISTing again, then watching from the new list's version.
    let old = WatchOptions {
        resource_version: "1".into(),
        timeout_seconds: Some(10),
        ..Default::default()
    };
    let answer = match lw.watch(&old).await {
        Err(e) => e.to_string(),
        Ok(mut stream) => match stream.next().await {
            Some(Ok(WatchEvent::Error(status))) => {
                format!("{} {}: {}", status.code, status.reason, status.message)
            }
            Some(Err(e)) => e.to_string(),
            Some(Ok(_)) => "events: etcd still has that history (no compaction in this \
                 cluster's life yet: the apiserver compacts every 5 minutes; run this again \
                 later to see the 410)"
                .to_string(),
            None => "the stream ended".to_string(),
        },
    };
    println!("4. WATCH from resourceVersion 1: {answer}");
    let relist = lw.list(&ListOptions::default()).await?;
    println!(
        "   so LIST again: {} ConfigMaps at resourceVersion {}, and WATCH from there",
        relist.items.len(),
        relist.resource_version
    );
    for name in NAMES {
        configmaps.delete(name, &DeleteParams::default()).await?;
    }
    Ok(())
}
