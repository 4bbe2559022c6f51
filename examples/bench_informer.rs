//! kubeloop's side of `hack/bench-informer`: one `SharedIndexInformer` on ConfigMaps with
//! kubeloop's defaults, measured exactly as `hack/go/bench-informer` measures client-go (same
//! flags, same output line):
//!
//! ```text
//! cargo run --release --example bench_informer -- --kubeconfig K --namespace NS \
//!     [--transform strip-managed-fields] [--store typed|compact|metadata|metadata-compact] \
//!     [--streaming on|off] [--wire protobuf|json] \
//!     [--updates 200] [--interval-ms 20]
//! RESULT objects=N synced_ms=.. cpu_ms=.. peak_rss_kib=.. rss_after_kib=.. p50_ms=.. p99_ms=..
//!     get_p99_us=.. list_ms=.. list_bytes=.. stored_bytes=.. base_rss_kib=..
//! ```
//!
//! `synced_ms` and `cpu_ms` run from just before the informer starts to `has_synced`;
//! `peak_rss_kib` is VmHWM then, `rss_after_kib` VmRSS a second later; p50/p99 are the
//! latencies from just before an update request is sent to the handler seeing it. Then the
//! read cost through the lister: `get_p99_us` over a get of every (N/10000)th object,
//! `list_ms` the median of three full lists. Last, `list_bytes`: the size of the LIST body
//! the apiserver sends for the namespace in the informer's wire (`--wire`: protobuf, the
//! default, or JSON), its objects or their PartialObjectMetadata for a metadata-only side;
//! `stored_bytes`, what the compact store's frames hold (0: typed); and `base_rss_kib`,
//! VmRSS just before the informer starts (the process's baseline).
//!
//! It allocates with the system allocator (glibc's malloc), as the kube-runtime side does, so
//! the two Rust informers are compared on the same allocator; the `kubeloop` binary's mimalloc
//! is measured separately (benches/README.md, "Informer").

#[path = "bench_common/measure.rs"]
mod measure;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ConfigMap;
use kube_client::api::{Api, DeleteParams, ObjectMeta, PostParams};
use kube_client::config::{KubeConfigOptions, Kubeconfig};
use kube_client::core::PartialObjectMeta;
use kube_client::{Resource, ResourceExt};
use kubeloop::cache::{
    CacheObject, InformerConfig, ListWatch, ReflectorConfig, ResourceEventHandlerFuncs,
    SharedIndexInformer, StoreKind, Wire, strip_managed_fields,
};
use parking_lot::Mutex;

struct Args {
    kubeconfig: String,
    namespace: String,
    transform: String,
    store: String,
    streaming: bool,
    wire: Wire,
    updates: usize,
    interval: Duration,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        kubeconfig: String::new(),
        namespace: "bench".into(),
        transform: "none".into(),
        store: "typed".into(),
        streaming: true,
        wire: Wire::Auto,
        updates: 200,
        interval: Duration::from_millis(20),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--kubeconfig" => args.kubeconfig = value()?,
            "--namespace" => args.namespace = value()?,
            "--transform" => args.transform = value()?,
            "--store" => args.store = value()?,
            "--streaming" => {
                args.streaming = match value()?.as_str() {
                    "on" => true,
                    "off" => false,
                    other => return Err(format!("--streaming: on or off, not {other}")),
                }
            }
            "--wire" => {
                args.wire = match value()?.as_str() {
                    "protobuf" => Wire::Auto,
                    "json" => Wire::Json,
                    other => return Err(format!("--wire: protobuf or json, not {other}")),
                }
            }
            "--updates" => {
                args.updates = value()?.parse().map_err(|e| format!("--updates: {e}"))?
            }
            "--interval-ms" => {
                args.interval = Duration::from_millis(
                    value()?
                        .parse()
                        .map_err(|e| format!("--interval-ms: {e}"))?,
                )
            }
            other => return Err(format!("unknown flag {other}")),
        }
    }
    Ok(args)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = parse_args()?;
    let kubeconfig = Kubeconfig::read_from(&args.kubeconfig)?;
    let config =
        kube_client::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
            .await?;
    let client = kube_client::Client::try_from(config)?;

    match args.store.as_str() {
        "typed" | "compact" => run::<ConfigMap>(&args, client).await,
        "metadata" | "metadata-compact" => run::<PartialObjectMeta<ConfigMap>>(&args, client).await,
        other => Err(
            format!("--store: typed, compact, metadata or metadata-compact, not {other}").into(),
        ),
    }
}

/// Syncs an informer of `K` (ConfigMaps, or their metadata) and measures it.
async fn run<K>(args: &Args, client: kube_client::Client) -> Result<(), Box<dyn std::error::Error>>
where
    K: CacheObject + Resource<DynamicType = ()>,
{
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &args.namespace);
    let store = if args.store.ends_with("compact") {
        StoreKind::Compact
    } else {
        StoreKind::Typed
    };
    let informer = SharedIndexInformer::new(
        ListWatch::<K>::namespaced(client.clone(), &args.namespace).wire(args.wire),
        InformerConfig {
            reflector: ReflectorConfig {
                use_watch_list: args.streaming,
                ..Default::default()
            },
            store,
            ..Default::default()
        },
    );
    match args.transform.as_str() {
        "none" => {}
        "strip-managed-fields" => informer.set_transform(strip_managed_fields::<K>)?,
        other => return Err(format!("unknown --transform {other}").into()),
    }
    // The latency phase's probe: the handler records when it sees each sequence number.
    let seen: Arc<Mutex<HashMap<i64, Instant>>> = Default::default();
    let seen2 = seen.clone();
    informer.add_event_handler(ResourceEventHandlerFuncs::new().on_update(
        move |_old: &Arc<K>, new: &Arc<K>| {
            if new.meta().name.as_deref() != Some("probe") {
                return;
            }
            // In an annotation, which a metadata-only informer sees too.
            let seq = new.annotations().get("seq").and_then(|s| s.parse().ok());
            if let Some(n) = seq {
                seen2.lock().entry(n).or_insert_with(Instant::now);
            }
        },
    ))?;
    // The probe exists before the informer starts, so it is part of the initial list.
    let _ = cms.delete("probe", &DeleteParams::default()).await;
    cms.create(&PostParams::default(), &probe(-1)).await?;

    let base = measure::proc_status("VmRSS");
    let cpu0 = measure::cpu_time();
    let start = Instant::now();
    informer.start();
    if !informer.wait_for_cache_sync().await {
        return Err("cache did not sync".into());
    }
    let synced = start.elapsed();
    let cpu = measure::cpu_time() - cpu0;
    let peak = measure::proc_status("VmHWM");
    let objects = informer.indexer().list_keys().len();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let after = measure::proc_status("VmRSS");

    let mut sent = Vec::with_capacity(args.updates);
    for i in 0..args.updates {
        sent.push(Instant::now());
        cms.replace("probe", &PostParams::default(), &probe(i as i64))
            .await?;
        tokio::time::sleep(args.interval).await;
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while (0..args.updates as i64).any(|i| !seen.lock().contains_key(&i))
        && Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let seen = seen.lock().clone();
    let mut lat: Vec<f64> = (0..args.updates)
        .filter_map(|i| {
            seen.get(&(i as i64))
                .map(|t| (*t - sent[i]).as_secs_f64() * 1000.0)
        })
        .collect();
    if lat.len() < args.updates {
        return Err(format!("the handler saw {} of {} updates", lat.len(), args.updates).into());
    }
    lat.sort_by(f64::total_cmp);

    // Read cost, through the lister, as the Go side measures it.
    let lister = informer.lister();
    let mut keys = informer.indexer().list_keys();
    keys.sort();
    let step = (keys.len() / 10_000).max(1);
    let mut gets = Vec::new();
    for key in keys.iter().step_by(step) {
        let (_, name) = kubeloop::cache::split_meta_namespace_key(key)?;
        let t = Instant::now();
        let got = lister.get(&args.namespace, name);
        gets.push(t.elapsed().as_secs_f64() * 1e6);
        got.ok_or(format!("lister get {key}: not found"))?;
    }
    gets.sort_by(f64::total_cmp);
    let mut lists = Vec::new();
    for _ in 0..3 {
        let t = Instant::now();
        let all = lister.list(&kubeloop::cache::LabelSelector::everything());
        lists.push(t.elapsed().as_secs_f64() * 1000.0);
        if all.len() != objects {
            return Err(format!("listed {} of {objects} objects", all.len()).into());
        }
    }
    lists.sort_by(f64::total_cmp);
    let stored_bytes = informer.indexer().stored_bytes().unwrap_or(0);
    informer.shutdown().await;
    // The same negotiation as the informer's: a metadata-only side counts the metadata.
    let lw = ListWatch::<K>::namespaced(client.clone(), &args.namespace).wire(args.wire);
    let request = http::Request::get(lw.path())
        .header(http::header::ACCEPT, lw.list_accept())
        .body(Vec::new())?;
    let response = client
        .send(request.map(kube_client::client::Body::from))
        .await?;
    let list_bytes = http_body_util::BodyExt::collect(response.into_body())
        .await?
        .to_bytes()
        .len();
    println!(
        "RESULT objects={objects} synced_ms={} cpu_ms={} peak_rss_kib={peak} rss_after_kib={after} p50_ms={:.2} p99_ms={:.2} get_p99_us={:.2} list_ms={:.1} list_bytes={list_bytes} stored_bytes={stored_bytes} base_rss_kib={base}",
        synced.as_millis(),
        cpu.as_millis(),
        pct(&lat, 50),
        pct(&lat, 99),
        pct(&gets, 99),
        lists[1],
    );
    Ok(())
}

fn probe(seq: i64) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some("probe".into()),
            annotations: Some(BTreeMap::from([("seq".to_string(), seq.to_string())])),
            ..Default::default()
        },
        data: Some(BTreeMap::from([("seq".to_string(), seq.to_string())])),
        ..Default::default()
    }
}

fn pct(sorted: &[f64], p: usize) -> f64 {
    let i = (sorted.len() * p).div_ceil(100).saturating_sub(1);
    sorted[i]
}
