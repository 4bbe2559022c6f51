//! kubeloop's program for `hack/bench-shard-watches`: ConfigMaps over many namespaces, cached by
//! one unsharded informer, or by one replica of a ring whose informers list and watch only the
//! shards it holds (`ShardRing::watch_held_shards`, KEP-5866's `shardSelector`).
//!
//! ```text
//! bench_shard_ring --kubeconfig K --label KEY=VALUE --create N --namespaces M
//!     creates N ConfigMaps of 1 KiB over M new namespaces, each with the label; prints
//!     CREATED objects=N namespaces=M
//! bench_shard_ring --kubeconfig K --label KEY=VALUE
//!     RESULT side=unsharded objects= synced_ms= cpu_ms= reconciled_ms= reconciled_cpu_ms=
//!     peak_rss_kib= rx_bytes=
//! bench_shard_ring --kubeconfig K --label KEY=VALUE --replica ID --ring R --lease-namespace NS
//!     --shards S --expect E [--bounds B]
//!     RESULT side=replica identity= held= objects= synced_ms= cpu_ms= reconciled_ms=
//!     reconciled_cpu_ms= peak_rss_kib= rx_bytes=
//!     then, for each shard it takes over later:
//!     TAKEOVER identity= gained= objects= listed_ms=
//!     and runs until killed.
//! ```
//!
//! Both sides run the same controller over the informer, reconciling each key with a no-op
//! (the unsharded side without a ring): "the unsharded replica". `synced_ms` and `cpu_ms` run
//! from just before the controller starts: for the unsharded side to `has_synced`; for a
//! replica to the moment it holds `E` shards and its informer has listed them and holds their
//! objects (its object count unchanged over 100 ms: up to 0.1 s of each replica's time is that
//! wait). A replica reconciles a shard's keys as soon as the shard's term opens, the
//! unsharded controller only after its cache synced, so `cpu_ms` holds some reconciles on a
//! replica and none on the unsharded side; `reconciled_ms` and `reconciled_cpu_ms` run to the
//! moment every key cached was reconciled once, the same work on both sides. `peak_rss_kib`
//! is read then. `rx_bytes` is what the process received over its
//! open TCP connections then (TCP_INFO's `tcpi_bytes_received`: the apiserver's answers as
//! sent, TLS included; the informer keeps its connections open, so nothing it received is
//! lost with a closed one). `listed_ms` runs from the moment a replica's held shards grew to
//! the moment its cache holds the new shards' objects.
//!
//! `--bounds` cuts the ring at those bounds (`kubeloop shard-bounds`, `ShardBounds`' text form)
//! instead of equal hash ranges.
//!
//! Both sides are this program with the same informer (typed store, protobuf, client-go's
//! defaults otherwise), the system allocator; a replica's lease timings are 4 s / 3 s /
//! 0.5 s (the tests'), so that a killed replica's shards move within seconds.

#[path = "bench_common/measure.rs"]
mod measure;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube_client::Client;
use kube_client::api::{Api, ObjectMeta, PostParams};
use kube_client::config::{KubeConfigOptions, Kubeconfig};
use kubeloop::cache::{
    CacheMetrics, FactoryOptions, ShardBounds, ShardScope, SharedIndexInformer,
    SharedInformerFactory,
};
use kubeloop::runtime::{
    Action, Controller, LeaseRing, ObjectKey, ReconcileContext, ShardRing, ShardingConfig,
    default_error_policy,
};

type Error = Box<dyn std::error::Error + Send + Sync>;

#[derive(Default)]
struct Args {
    kubeconfig: String,
    label: String,
    create: usize,
    namespaces: usize,
    replica: Option<String>,
    ring: String,
    lease_namespace: String,
    shards: u32,
    expect: usize,
    bounds: Option<ShardBounds>,
}

fn parse_args() -> Result<Args, Error> {
    let mut args = Args {
        namespaces: 200,
        ring: "bench".into(),
        lease_namespace: "default".into(),
        shards: 4,
        expect: 1,
        ..Default::default()
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--kubeconfig" => args.kubeconfig = value()?,
            "--label" => args.label = value()?,
            "--create" => args.create = value()?.parse()?,
            "--namespaces" => args.namespaces = value()?.parse()?,
            "--replica" => args.replica = Some(value()?),
            "--ring" => args.ring = value()?,
            "--lease-namespace" => args.lease_namespace = value()?,
            "--shards" => args.shards = value()?.parse()?,
            "--expect" => args.expect = value()?.parse()?,
            "--bounds" => args.bounds = Some(value()?.parse()?),
            other => return Err(format!("unknown flag {other}").into()),
        }
    }
    if args.kubeconfig.is_empty() || !args.label.contains('=') {
        return Err("--kubeconfig and --label KEY=VALUE are required".into());
    }
    Ok(args)
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    let args = parse_args()?;
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let config = kube_client::Config::from_custom_kubeconfig(
        Kubeconfig::read_from(&args.kubeconfig)?,
        &KubeConfigOptions::default(),
    )
    .await?;
    let client = Client::try_from(config)?;
    if args.create > 0 {
        return create(&args, client).await;
    }
    match &args.replica {
        None => unsharded(&args, client).await,
        Some(identity) => replica(&args, client, identity).await,
    }
}

/// `--create`: the namespaces, then the ConfigMaps spread over them, 32 requests at a time.
async fn create(args: &Args, client: Client) -> Result<(), Error> {
    let (key, value) = args.label.split_once('=').expect("checked");
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let mut names = Vec::new();
    for i in 0..args.namespaces {
        // The number first: FNV-1a's last bytes barely reach the top bits a shard range is
        // cut on, so names that differ only at their end fall in the same shard.
        let name = format!("ns{i}-{value}");
        let ns = Namespace {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                ..Default::default()
            },
            ..Default::default()
        };
        namespaces.create(&PostParams::default(), &ns).await?;
        names.push(name);
    }
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    let requests = (0..args.create).map(|i| {
        // 1 KiB of hex from a xorshift: as hard to compress as random data.
        let mut data = String::with_capacity(1024);
        for _ in 0..64 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            data.push_str(&format!("{seed:016x}"));
        }
        let api: Api<ConfigMap> = Api::namespaced(client.clone(), &names[i % names.len()]);
        let cm = ConfigMap {
            metadata: ObjectMeta {
                name: Some(format!("cm-{i}")),
                labels: Some(BTreeMap::from([(key.to_string(), value.to_string())])),
                ..Default::default()
            },
            data: Some(BTreeMap::from([("payload".to_string(), data)])),
            ..Default::default()
        };
        async move { api.create(&PostParams::default(), &cm).await }
    });
    let mut made = futures::stream::iter(requests).buffer_unordered(32);
    while let Some(result) = made.next().await {
        result?;
    }
    println!(
        "CREATED objects={} namespaces={}",
        args.create, args.namespaces
    );
    Ok(())
}

fn factory(
    args: &Args,
    client: Client,
    scope: Option<ShardScope>,
    metrics: &CacheMetrics,
) -> SharedInformerFactory {
    SharedInformerFactory::new(
        client,
        FactoryOptions {
            label_selector: Some(args.label.clone()),
            shard_scope: scope,
            metrics: metrics.clone(),
            ..Default::default()
        },
    )
}

/// The ConfigMaps the informer's LISTs brought so far.
fn listed(metrics: &CacheMetrics) -> u64 {
    metrics.reflector("v1/configmaps").listed_objects()
}

fn rx_bytes() -> u64 {
    measure::tcp_bytes_received()
}

/// Runs `controller` with a reconcile that only counts, into the count returned.
fn run_counting(controller: Controller<ConfigMap>) -> Arc<AtomicUsize> {
    let reconciled = Arc::new(AtomicUsize::new(0));
    let count = reconciled.clone();
    tokio::spawn(controller.run(
        move |_key: ObjectKey, _ctx: ReconcileContext| {
            count.fetch_add(1, Ordering::Relaxed);
            async { Ok::<_, Error>(Action::Done) }
        },
        default_error_policy,
        Default::default(),
    ));
    reconciled
}

/// Waits until `reconciled` reaches `objects`; then the time from `start`, the CPU from
/// `cpu0` (both in ms) and the peak RSS, as "reconciled_ms= reconciled_cpu_ms= peak_rss_kib=".
async fn all_reconciled(
    reconciled: &AtomicUsize,
    objects: usize,
    start: Instant,
    cpu0: Duration,
) -> String {
    while reconciled.load(Ordering::Relaxed) < objects {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    format!(
        "reconciled_ms={} reconciled_cpu_ms={} peak_rss_kib={}",
        start.elapsed().as_millis(),
        (measure::cpu_time() - cpu0).as_millis(),
        measure::proc_status("VmHWM"),
    )
}

async fn unsharded(args: &Args, client: Client) -> Result<(), Error> {
    let informer = factory(args, client, None, &CacheMetrics::new()).informer::<ConfigMap>();
    let controller = Controller::new("bench-shard-ring", informer.clone());
    let (cpu0, rx0, start) = (measure::cpu_time(), rx_bytes(), Instant::now());
    let reconciled = run_counting(controller);
    if !informer.wait_for_cache_sync().await {
        return Err("cache did not sync".into());
    }
    let synced = format!(
        "synced_ms={} cpu_ms={}",
        start.elapsed().as_millis(),
        (measure::cpu_time() - cpu0).as_millis()
    );
    let rx = rx_bytes() - rx0;
    let objects = informer.lister().list(&Default::default()).len();
    let done = all_reconciled(&reconciled, objects, start, cpu0).await;
    println!("RESULT side=unsharded objects={objects} {synced} {done} rx_bytes={rx}");
    Ok(())
}

/// Once the scope holds at least `expect` shards, waits until the informer listed them and
/// its cache holds what it listed; the shards held and the objects cached then.
async fn held_and_cached(
    scope: &ShardScope,
    informer: &SharedIndexInformer<ConfigMap>,
    expect: usize,
) -> (Vec<u32>, usize) {
    // Woken by the scope's changes, not by a timer: a 10 ms poll here was about half a
    // replica's CPU in the join window (no objects: 29-40 ms a replica polling, 14-18 ms
    // awaiting), which the unsharded side, awaiting its sync, did not pay (issue 51).
    let mut changes = scope.changes();
    loop {
        changes.borrow_and_update();
        let held = scope.held();
        if held.len() >= expect {
            let generation = scope.generation();
            scope.listed(generation).await;
            // The queue hands a list over as one batch, which leaves the queue before it has
            // reached the cache: the count must also have stopped changing (100 ms apart; the
            // times reported include that wait).
            let mut cached = usize::MAX;
            loop {
                let now = informer.lister().list(&Default::default()).len();
                if informer.queued_items() == 0 && now == cached {
                    break;
                }
                cached = now;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            if scope.generation() == generation {
                return (held, cached);
            }
            continue;
        }
        changes.changed().await.expect("the scope holds the sender");
    }
}

async fn replica(args: &Args, client: Client, identity: &str) -> Result<(), Error> {
    let scope = match &args.bounds {
        Some(bounds) => ShardScope::with_bounds(bounds.clone()),
        None => ShardScope::namespaces(args.shards)?,
    };
    let metrics = CacheMetrics::new();
    let informer =
        factory(args, client.clone(), Some(scope.clone()), &metrics).informer::<ConfigMap>();
    let ring = ShardRing::new(
        ShardingConfig {
            lease_duration: Duration::from_secs(4),
            renew_deadline: Duration::from_secs(3),
            retry_period: Duration::from_millis(500),
            ..ShardingConfig::new(args.ring.clone(), args.shards, identity)
        },
        LeaseRing::new(client, &args.lease_namespace),
    )?
    .watch_held_shards(scope.clone())?;
    let controller = Controller::new("bench-shard-ring", informer.clone()).sharding(ring);
    let (cpu0, rx0, start) = (measure::cpu_time(), rx_bytes(), Instant::now());
    let reconciled = run_counting(controller);
    let (mut held, objects) = held_and_cached(&scope, &informer, args.expect).await;
    let synced = format!(
        "synced_ms={} cpu_ms={}",
        start.elapsed().as_millis(),
        (measure::cpu_time() - cpu0).as_millis()
    );
    let rx = rx_bytes() - rx0;
    let done = all_reconciled(&reconciled, objects, start, cpu0).await;
    println!(
        "RESULT side=replica identity={identity} held={} objects={objects} {synced} {done} rx_bytes={rx}",
        list(&held),
    );
    let mut changes = scope.changes();
    loop {
        changes.borrow_and_update();
        let now = scope.held();
        if now.len() > held.len() {
            let (grew, listed0) = (Instant::now(), listed(&metrics));
            let (after, objects) = held_and_cached(&scope, &informer, now.len()).await;
            // What it holds more once cached: a shard acquired while the first was listed
            // is in this report, not another.
            let gained: Vec<u32> = after
                .iter()
                .filter(|s| !held.contains(s))
                .copied()
                .collect();
            println!(
                "TAKEOVER identity={identity} gained={} held={} objects={objects} listed_ms={} listed={}",
                list(&gained),
                list(&after),
                grew.elapsed().as_millis(),
                listed(&metrics) - listed0,
            );
            held = after;
        } else {
            held = now;
        }
        changes.changed().await.expect("the scope holds the sender");
    }
}

fn list(shards: &[u32]) -> String {
    shards
        .iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(",")
}
