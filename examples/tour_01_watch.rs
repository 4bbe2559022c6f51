//! Tour, chapter 1 (docs/01-watch-stream.md): the raw watch stream, one JSON object per line.
//!
//! Opens `GET /api/v1/namespaces/default/configmaps?watch=true` from the current
//! resourceVersion (only for our ConfigMap's name: `fieldSelector`), then creates, changes and deletes a ConfigMap, and prints each line the
//! apiserver sends, as it arrives. Runs against `$KUBECONFIG` (see docs/README.md).

use futures::{AsyncBufReadExt, StreamExt};
use k8s_openapi::api::core::v1::ConfigMap;
use kube_client::Client;
use kube_client::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};

const NAME: &str = "tour-01";

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let client = Client::try_default().await?;
    let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let _ = configmaps.delete(NAME, &DeleteParams::default()).await;

    // A LIST (of at most one item: only its resourceVersion matters) says "now".
    let now = configmaps
        .list_metadata(&ListParams::default().limit(1))
        .await?
        .metadata
        .resource_version
        .unwrap_or_default();
    println!("LIST says the collection is at resourceVersion {now}; watching from there");

    let url = format!(
        "/api/v1/namespaces/default/configmaps?watch=true&resourceVersion={now}&timeoutSeconds=5&fieldSelector=metadata.name%3D{NAME}"
    );
    let request = http::Request::get(&url).body(Vec::new())?;
    let mut lines = client.request_stream(request).await?.lines();
    println!("GET {url}");

    // Three changes, made while the watch is open.
    let changes = tokio::spawn(async move {
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        let mut cm = ConfigMap::default();
        cm.metadata.name = Some(NAME.into());
        cm.data = Some([("greeting".to_string(), "hello".to_string())].into());
        configmaps.create(&PostParams::default(), &cm).await?;
        let patch = serde_json::json!({"data": {"greeting": "hello again"}});
        configmaps
            .patch(NAME, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        configmaps.delete(NAME, &DeleteParams::default()).await?;
        Ok::<_, kube_client::Error>(())
    });

    let mut seen = 0;
    while let Some(line) = lines.next().await {
        let line = line?;
        let event: serde_json::Value = serde_json::from_str(&line)?;
        let object = &event["object"];
        println!(
            "event {:<8} {}/{} resourceVersion={} data={}",
            event["type"].as_str().unwrap_or("?"),
            object["metadata"]["namespace"].as_str().unwrap_or(""),
            object["metadata"]["name"].as_str().unwrap_or(""),
            object["metadata"]["resourceVersion"].as_str().unwrap_or(""),
            object["data"],
        );
        if seen == 0 {
            let shown: String = line.chars().take(160).collect();
            println!("  the raw line: {shown}...");
        }
        seen += 1;
        if seen == 3 {
            break;
        }
    }
    changes.await??;
    println!("{seen} events; each carries the whole object at its new resourceVersion");
    Ok(())
}
