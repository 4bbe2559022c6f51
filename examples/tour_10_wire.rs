//! Tour, chapter 10 (docs/10-the-wire.md): the same ConfigMap in the two encodings the
//! apiserver speaks, JSON and Kubernetes protobuf; the envelope around a protobuf object; a
//! protobuf watch's length-prefixed frames; and what the informers' `ListWatch` asks for.
//! Runs against `$KUBECONFIG` (see docs/README.md).

use futures::StreamExt;
use http_body_util::BodyExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube_client::Client;
use kube_client::api::{Api, DeleteParams, PostParams};
use kube_client::core::PartialObjectMeta;
use kubeloop::cache::{ListWatch, Wire};
use kubeloop::protobuf::{self, Envelope, Frames, RawWatchEvent};

const NAME: &str = "tour-10";
const PATH: &str = "/api/v1/namespaces/default/configmaps";

/// GET `path` with `accept`: the response's `Content-Type` and body.
async fn get(
    client: &Client,
    path: &str,
    accept: &str,
) -> Result<(String, Vec<u8>), kube_client::Error> {
    let request = http::Request::get(path)
        .header(http::header::ACCEPT, accept)
        .body(kube_client::client::Body::from(Vec::new()))
        .expect("a valid request");
    let response = client.send(request).await?;
    let content_type = response.headers()[http::header::CONTENT_TYPE]
        .to_str()
        .unwrap_or_default()
        .to_string();
    let body = response.into_body().collect_bytes().await?;
    Ok((content_type, body.to_vec()))
}

/// The first `n` bytes, printable ASCII as is and the rest as `\xNN`.
fn shown(bytes: &[u8], n: usize) -> String {
    bytes
        .iter()
        .take(n)
        .map(|&b| match b {
            b' '..=b'~' => (b as char).to_string(),
            _ => format!("\\x{b:02x}"),
        })
        .collect()
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let client = Client::try_default().await?;
    let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let _ = configmaps.delete(NAME, &DeleteParams::default()).await;
    let mut cm = ConfigMap::default();
    cm.metadata.name = Some(NAME.into());
    cm.data = Some([("greeting".to_string(), "hello".to_string())].into());
    configmaps.create(&PostParams::default(), &cm).await?;

    // One object, both encodings.
    let path = format!("{PATH}/{NAME}");
    let (json_type, json) = get(&client, &path, "application/json").await?;
    let (pb_type, pb) = get(&client, &path, protobuf::CONTENT_TYPE).await?;
    println!("GET {path}");
    println!(
        "  as {json_type}: {} bytes: {}...",
        json.len(),
        shown(&json, 60)
    );
    println!("  as {pb_type}: {} bytes: {}...", pb.len(), shown(&pb, 60));

    // The envelope: k8s\0, then runtime.Unknown with the TypeMeta and the object's message.
    let envelope = Envelope::parse(&pb)?;
    println!(
        "the envelope: k8s\\0, then apiVersion={:?} kind={:?} and the object's message ({} bytes)",
        envelope.api_version,
        envelope.kind,
        envelope.raw.len()
    );
    let from_json: ConfigMap = serde_json::from_slice(&json)?;
    let from_pb: ConfigMap = envelope.decode()?;
    println!(
        "decoded from protobuf, it is the same ConfigMap as from JSON: {}",
        from_pb == from_json
    );

    // A protobuf watch: frames of a 4-byte big-endian length and a WatchEvent.
    let version = from_json
        .metadata
        .resource_version
        .clone()
        .unwrap_or_default();
    let watch = format!(
        "{PATH}?watch=true&resourceVersion={version}&timeoutSeconds=5&fieldSelector=metadata.name%3D{NAME}"
    );
    let request = http::Request::get(&watch)
        .header(http::header::ACCEPT, protobuf::CONTENT_TYPE)
        .body(kube_client::client::Body::from(Vec::new()))?;
    let response = client.send(request).await?;
    println!(
        "GET {watch}\n  answered {}",
        response.headers()[http::header::CONTENT_TYPE].to_str()?
    );
    let mut body = response.into_body().into_data_stream();
    let change = tokio::spawn(async move {
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        configmaps.delete(NAME, &DeleteParams::default()).await
    });
    let mut frames = Frames::new();
    'read: while let Some(chunk) = body.next().await {
        frames.push(&chunk?);
        while let Some(len) = frames.next_len() {
            let Some(frame) = frames.next_frame() else {
                break;
            };
            let event = RawWatchEvent::parse(frame)?;
            println!(
                "frame of {len} bytes: a {} of {} {}",
                event.event_type, event.object.api_version, event.object.kind
            );
            let decoded = event.decode::<ConfigMap>()?;
            if let kube_client::core::WatchEvent::Deleted(gone) = decoded {
                println!(
                    "  decoded: {} deleted",
                    gone.metadata.name.unwrap_or_default()
                );
                break 'read;
            }
        }
    }
    change.await??;

    // What the informers ask for.
    let typed = ListWatch::<ConfigMap>::namespaced(client.clone(), "default");
    let metadata = ListWatch::<PartialObjectMeta<ConfigMap>>::namespaced(client.clone(), "default");
    println!(
        "an informer of ConfigMaps asks for: {}",
        typed.list_accept()
    );
    println!(
        "a metadata-only informer asks for:  {}",
        metadata.list_accept()
    );
    println!(
        "told to read JSON (Wire::Json):      {}",
        typed.wire(Wire::Json).list_accept()
    );
    Ok(())
}
