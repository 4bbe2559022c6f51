//! kube-runtime's side of `hack/bench-informer`: `reflector(writer, watcher(api, default
//! config))` on ConfigMaps, measured as `hack/go/bench-informer` measures client-go (same
//! flags, same output line). "Synced" is the store's `wait_until_ready` (the initial list
//! applied); the handler of the latency phase is the reflector stream's consumer.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::TryStreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, ObjectMeta, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{WatchStreamExt, reflector, watcher};
use parking_lot::Mutex;

struct Args {
    kubeconfig: String,
    namespace: String,
    transform: String,
    updates: usize,
    interval: Duration,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        kubeconfig: String::new(),
        namespace: "bench".into(),
        transform: "none".into(),
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
            // kube-runtime has no compact store: `compact` runs its default store.
            "--store" => match value()?.as_str() {
                "typed" | "compact" => {}
                other => return Err(format!("--store: typed or compact, not {other}")),
            },
            "--updates" => args.updates = value()?.parse().map_err(|e| format!("--updates: {e}"))?,
            "--interval-ms" => {
                args.interval = Duration::from_millis(
                    value()?.parse().map_err(|e| format!("--interval-ms: {e}"))?,
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
        kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
    let client = kube::Client::try_from(config)?;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &args.namespace);
    let strip = match args.transform.as_str() {
        "none" => false,
        "strip-managed-fields" => true,
        other => return Err(format!("unknown --transform {other}").into()),
    };

    let _ = cms.delete("probe", &DeleteParams::default()).await;
    cms.create(&PostParams::default(), &probe(-1)).await?;

    let seen: Arc<Mutex<HashMap<i64, Instant>>> = Default::default();
    let seen2 = seen.clone();
    let (reader, writer) = reflector::store::<ConfigMap>();

    let cpu0 = cpu_time();
    let start = Instant::now();
    let stream = watcher(cms.clone(), watcher::Config::default()).modify(move |cm| {
        if strip {
            cm.metadata.managed_fields = None;
        }
    });
    let task = tokio::spawn(
        reflector(writer, stream)
            .applied_objects()
            .try_for_each(move |cm| {
                if cm.metadata.name.as_deref() == Some("probe") {
                    let seq = cm.data.as_ref().and_then(|d| d.get("seq")).and_then(|s| s.parse().ok());
                    if let Some(n) = seq {
                        seen2.lock().entry(n).or_insert_with(Instant::now);
                    }
                }
                futures::future::ready(Ok(()))
            }),
    );
    reader.wait_until_ready().await?;
    let synced = start.elapsed();
    let cpu = cpu_time() - cpu0;
    let peak = proc_status("VmHWM");
    let objects = reader.len();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let after = proc_status("VmRSS");

    let mut sent = Vec::with_capacity(args.updates);
    for i in 0..args.updates {
        sent.push(Instant::now());
        cms.replace("probe", &PostParams::default(), &probe(i as i64)).await?;
        tokio::time::sleep(args.interval).await;
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while (0..args.updates as i64).any(|i| !seen.lock().contains_key(&i)) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let seen = seen.lock();
    let mut lat: Vec<f64> = (0..args.updates)
        .filter_map(|i| seen.get(&(i as i64)).map(|t| (*t - sent[i]).as_secs_f64() * 1000.0))
        .collect();
    if lat.len() < args.updates {
        return Err(format!("the stream saw {} of {} updates", lat.len(), args.updates).into());
    }
    lat.sort_by(f64::total_cmp);

    // Read cost, as the other sides measure it: the store's get of every (N/10000)th
    // object, and the median of three full `state()` lists.
    let mut refs: Vec<ObjectRef<ConfigMap>> = reader.state().iter().map(|o| ObjectRef::from_obj(&**o)).collect();
    refs.sort_by(|a, b| a.name.cmp(&b.name));
    let step = (refs.len() / 10_000).max(1);
    let mut gets = Vec::new();
    for r in refs.iter().step_by(step) {
        let t = Instant::now();
        let got = reader.get(r);
        gets.push(t.elapsed().as_secs_f64() * 1e6);
        got.ok_or(format!("store get {}: not found", r.name))?;
    }
    gets.sort_by(f64::total_cmp);
    let mut lists = Vec::new();
    for _ in 0..3 {
        let t = Instant::now();
        let all = reader.state();
        lists.push(t.elapsed().as_secs_f64() * 1000.0);
        if all.len() != objects {
            return Err(format!("listed {} of {objects} objects", all.len()).into());
        }
    }
    lists.sort_by(f64::total_cmp);
    task.abort();
    println!(
        "RESULT objects={objects} synced_ms={} cpu_ms={} peak_rss_kib={peak} rss_after_kib={after} p50_ms={:.2} p99_ms={:.2} get_p99_us={:.2} list_ms={:.1}",
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

fn cpu_time() -> Duration {
    // SAFETY: getrusage writes into the zeroed struct we pass.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// A KiB field of /proc/self/status.
fn proc_status(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}
