//! The noisy neighbour (issue 36): one namespace floods a controller with 10,000 new objects
//! while another creates one every 100 ms; how long does the quiet one wait, with the runtime's
//! fair queue on and off? `hack/bench-fairness` runs it.
//!
//! Starts its own local control plane (`kubeloop_testenv`, apiserver only). Each round runs a
//! controller on the runtime over ConfigMaps (2 workers; each reconcile sleeps `COST`, a
//! stand-in for the API calls of a real one), on the priority queue with fairness across
//! namespaces ([`QueueFairness::Namespace`], the default) or without ([`QueueFairness::Off`]).
//! Once its caches have synced (empty: the round's label selects nothing yet), the round
//! creates N ConfigMaps in a fresh namespace `busy-…`, CONCURRENCY create requests in flight,
//! and from the flood's first request until the last busy ConfigMap's reconcile has started,
//! one ConfigMap every 100 ms in a fresh namespace `quiet-…`. Rounds alternate fairness on and
//! off (on first in even rounds, off first in odd ones).
//!
//! The flood is created while the controller runs, not before it starts: the runtime queues
//! the initial list at low priority, below the quiet namespace's new objects, so a pre-created
//! flood would show the priority queue, not fairness. The flood is a backlog only if the
//! creates outrun the 2 workers (about 1,000 reconciles a second with a 1 ms sleep); the round
//! prints how deep the queue got (the maximum of the queue's `workqueue_depth` metric, sampled
//! every 5 ms).
//!
//! What a round measures, all on one process's monotonic clock:
//! - quiet latency: from the return of a quiet ConfigMap's create request (the object is
//!   stored; what follows is the apiserver's watch, the informer, the queue and a free worker)
//!   to the start of its reconcile; p50, p99 (nearest rank) and max over the round's quiet
//!   ConfigMaps. Also the p99 from just before the create request was sent (the apiserver's
//!   own time under the flood included);
//! - where quiet's time goes, each a p99 from the create's return or from the stage before:
//!   to its arrival on a watch of the quiet namespace alone (opened by the bench beside the
//!   informer's: no busy event is ahead of it on that stream, so this is the apiserver's
//!   share); then, from the runtime's own trace (`kubeloop::trace`, following the quiet keys),
//!   to the watch event's arrival at the informer's reflector, on to the key's add to the
//!   queue (the informer), and on to a worker taking it (the queue);
//! - busy drain: from just before the first busy create request is sent to the start of the
//!   last busy ConfigMap's reconcile; how long the flood's creates took; how many busy
//!   ConfigMaps were still to be reconciled when the last busy create returned, and the pace
//!   the workers cleared them at (what fairness could slow: the drain time as a whole follows
//!   the apiserver's create rate, which varies more between rounds than 5%);
//! - max depth: the most keys the queue held ready at once.
//!
//! Between rounds the round's ConfigMaps are deleted (the namespaces stay: the apiserver alone
//! does not finalize a namespace's deletion).
//!
//! ```text
//! cargo run --release --example bench_fairness -- [N] [ROUNDS] [CONCURRENCY]
//! ```

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::ConfigMap;
use kube_client::Client;
use kube_client::api::{
    Api, DeleteParams, ListParams, ObjectMeta, PostParams, WatchEvent, WatchParams,
};
use kubeloop::cache::{FactoryOptions, SharedInformerFactory};
use kubeloop::runtime::{Action, Controller, ObjectKey, QueueFairness, ReconcileContext};
use kubeloop::trace::{self, Stage};
use kubeloop::workqueue::MetricsProvider;
use kubeloop_testenv::{Cluster, ClusterOptions};
use parking_lot::Mutex;
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

/// What one reconcile costs.
const COST: Duration = Duration::from_millis(1);
/// How often the quiet namespace creates a ConfigMap.
const QUIET_EVERY: Duration = Duration::from_millis(100);
/// How often the queue's depth is sampled.
const DEPTH_EVERY: Duration = Duration::from_millis(5);
/// The label that gives each round's ConfigMaps to that round's controller only.
const ROUND_LABEL: &str = "bench-fairness-round";
/// Quiet ConfigMaps a round follows in the trace (300 s at one every 100 ms: as long as a
/// round may wait).
const MAX_QUIET: usize = 3000;
/// The controller's (and so its queue's) name.
const NAME: &str = "bench-fairness";

/// The run's settings, from the command line.
#[derive(Clone, Copy, Debug)]
struct Settings {
    /// Busy ConfigMaps a round.
    n: usize,
    /// Rounds per fairness setting.
    rounds: usize,
    /// Busy create requests in flight.
    concurrency: usize,
}

/// The figures of one round.
#[derive(Clone, Debug)]
struct Figures {
    /// Quiet ConfigMaps created (and reconciled).
    quiet: usize,
    /// Each quiet ConfigMap's latency from its create's return to the start of its reconcile,
    /// sorted; likewise the next three.
    latency: Vec<Duration>,
    /// From just before the create was sent.
    from_send: Vec<Duration>,
    /// From the create's return to its arrival on the quiet namespace's own watch.
    to_quiet_watch: Vec<Duration>,
    /// From the create's return to the watch event's arrival at the informer's reflector.
    to_watch_event: Vec<Duration>,
    /// From the watch event's arrival to the key's add to the queue: the informer's part.
    informer: Vec<Duration>,
    /// From the add to the queue to a worker taking the key: the time in the queue.
    in_queue: Vec<Duration>,
    /// From the first busy create sent to the last busy create returned.
    flood_created: Duration,
    /// From the first busy create sent to the start of the last busy reconcile.
    drain: Duration,
    /// Busy ConfigMaps whose reconcile had not started when the last busy create returned.
    left_after_creates: usize,
    /// The most keys the queue held ready at once.
    max_depth: u64,
}

impl Figures {
    /// Reconciles a second from the last busy create's return to the last busy reconcile:
    /// the workers' pace on what was left once the creates stopped.
    fn drain_rate_after_creates(&self) -> f64 {
        let after = self.drain.saturating_sub(self.flood_created);
        self.left_after_creates as f64 / after.as_secs_f64().max(1e-3)
    }
}

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1);
    let settings = Settings {
        n: args.next().map_or(10_000, |a| a.parse().expect("N")),
        rounds: args.next().map_or(5, |a| a.parse().expect("ROUNDS")),
        concurrency: args.next().map_or(64, |a| a.parse().expect("CONCURRENCY")),
    };
    let cluster = Cluster::start(ClusterOptions::apiserver_only())
        .await
        .expect("a local control plane (run hack/build-control-plane)");
    let client = cluster
        .client()
        .await
        .expect("a client of the local apiserver");
    println!(
        "busy: {} ConfigMaps at once ({} create requests in flight), created while the controller runs; quiet: one ConfigMap every {:?}; 2 workers, {:?} per reconcile; {} rounds each, alternating",
        settings.n, settings.concurrency, QUIET_EVERY, COST, settings.rounds
    );
    println!(
        "quiet p50/p99/max: create returned -> reconcile started; p99 from send: create sent -> reconcile started; p99 to quiet-only watch: create returned -> it arrived on a watch of the quiet namespace alone; then where the informer's time went (trace): p99 to watch event: create returned -> the watch event reached the reflector; p99 informer: -> key added to the queue; p99 in queue: -> a worker took it; busy drain: first busy create sent -> last busy reconcile started; left after creates: busy not yet reconciled when the last busy create returned; max depth: most keys ready in the queue (workqueue_depth every 5 ms)"
    );
    println!("{}", header());
    let mut results: [Vec<Figures>; 2] = Default::default();
    for r in 0..settings.rounds {
        let order = if r % 2 == 0 {
            [true, false]
        } else {
            [false, true]
        };
        for fair in order {
            let id = r * 2 + usize::from(!fair);
            let figures = round(&cluster, &client, settings, fair, id).await;
            println!("{}", row(r, fair, &figures));
            results[usize::from(!fair)].push(figures);
        }
    }
    for fair in [true, false] {
        println!("{}", summary_row(fair, &results[usize::from(!fair)]));
    }
    let [on, off] = &results;
    println!(
        "median rows: median over rounds (min-max). Fairness on against off, medians: busy drain {:.3}x, drain rate after creates {:.3}x",
        median(on, |f| f.drain.as_secs_f64()) / median(off, |f| f.drain.as_secs_f64()),
        median(on, Figures::drain_rate_after_creates)
            / median(off, Figures::drain_rate_after_creates),
    );
}

/// One round: a fresh controller, a fresh pair of namespaces, the flood and the quiet
/// trickle; then the round's ConfigMaps are deleted.
async fn round(
    cluster: &Cluster,
    client: &Client,
    settings: Settings,
    fair: bool,
    id: usize,
) -> Figures {
    let busy = cluster
        .new_namespace(&format!("busy-{id}"))
        .await
        .expect("the busy namespace");
    let quiet = cluster
        .new_namespace(&format!("quiet-{id}"))
        .await
        .expect("the quiet namespace");
    let label = format!("{ROUND_LABEL}={id}");
    let factory = SharedInformerFactory::new(
        client.clone(),
        FactoryOptions {
            label_selector: Some(label.clone()),
            ..Default::default()
        },
    );
    let informer = factory.informer::<ConfigMap>();
    let metrics = MetricsProvider::new();
    let mut registry = Registry::default();
    metrics.register(&mut registry);
    let log: Arc<Mutex<Log>> = Arc::new(Mutex::new(Log::new(&quiet)));

    // Where a quiet ConfigMap's time goes: the runtime's own trace records when its watch
    // event arrived, when its key went into the queue and when a worker took it.
    trace::follow((0..MAX_QUIET).map(|i| format!("{quiet}/{}", quiet_name(i))))
        .expect("the quiet keys are namespace/name");
    let controller = Controller::new(NAME, informer)
        .workers(2)
        .queue_metrics(metrics)
        .fairness(if fair {
            QueueFairness::Namespace
        } else {
            QueueFairness::Off
        });
    let ready = controller.readiness();
    let shutdown = CancellationToken::new();
    let reconciles = log.clone();
    let controller = tokio::spawn(controller.run(
        move |key: ObjectKey, _ctx: ReconcileContext| {
            reconciles.lock().started(&key, Instant::now());
            async move {
                tokio::time::sleep(COST).await;
                Ok::<_, std::convert::Infallible>(Action::Done)
            }
        },
        kubeloop::runtime::default_error_policy,
        shutdown.clone(),
    ));
    until("the controller's caches to sync", || {
        ready.load(Ordering::SeqCst)
    })
    .await;

    let sampling = Arc::new(AtomicBool::new(true));
    let sampler = tokio::spawn(max_depth(registry, sampling.clone()));
    let busy_api: Api<ConfigMap> = Api::namespaced(client.clone(), &busy);
    let quiet_api: Api<ConfigMap> = Api::namespaced(client.clone(), &quiet);
    // A watch of the quiet namespace alone, beside the informer's of both: when the apiserver
    // sends it a quiet create, no busy event is ahead of it on that stream.
    let stop_watch = CancellationToken::new();
    let quiet_watch = quiet_api
        .watch(&WatchParams::default().labels(&label), "0")
        .await
        .expect("a watch of the quiet namespace");
    let quiet_watch = tokio::spawn(watch_quiet(quiet_watch, log.clone(), stop_watch.clone()));
    let start = Instant::now();
    let flood = tokio::spawn(flood(busy_api.clone(), label.clone(), settings));
    let drained = Arc::new(AtomicBool::new(false));
    let trickle = tokio::spawn(trickle(
        quiet_api.clone(),
        label.clone(),
        log.clone(),
        drained.clone(),
    ));
    until("the busy namespace's ConfigMaps to be reconciled", || {
        log.lock().busy.len() >= settings.n
    })
    .await;
    drained.store(true, Ordering::SeqCst);
    let flood_created = flood.await.expect("the flood task") - start;
    let quiet_created = trickle.await.expect("the quiet task");
    until("the quiet namespace's ConfigMaps to be reconciled", || {
        log.lock().quiet_started() >= quiet_created
    })
    .await;
    sampling.store(false, Ordering::SeqCst);
    let max_depth = sampler.await.expect("the depth sampler");
    stop_watch.cancel();
    quiet_watch.await.expect("the quiet watch task");
    shutdown.cancel();
    controller
        .await
        .expect("the controller task")
        .expect("the controller");
    factory.shutdown().await;

    let figures = log.lock().figures(start, flood_created, max_depth);

    for api in [busy_api, quiet_api] {
        api.delete_collection(
            &DeleteParams::default(),
            &ListParams::default().labels(&label),
        )
        .await
        .expect("the round's ConfigMaps deleted");
    }
    figures
}

/// Creates the busy namespace's N ConfigMaps, `concurrency` requests in flight; returns when
/// the last create returned.
async fn flood(api: Api<ConfigMap>, label: String, settings: Settings) -> Instant {
    futures::stream::iter(0..settings.n)
        .map(|i| {
            let (api, cm) = (api.clone(), config_map(format!("busy-{i:05}"), &label));
            async move { api.create(&PostParams::default(), &cm).await }
        })
        .buffer_unordered(settings.concurrency)
        .for_each(|created| async move {
            created.expect("a busy ConfigMap created");
        })
        .await;
    Instant::now()
}

/// Creates a quiet ConfigMap every [`QUIET_EVERY`], each in a task of its own so that a slow
/// create does not delay the next, until `drained`; returns how many it created.
async fn trickle(
    api: Api<ConfigMap>,
    label: String,
    log: Arc<Mutex<Log>>,
    drained: Arc<AtomicBool>,
) -> usize {
    let mut tick = tokio::time::interval(QUIET_EVERY);
    let mut creates = Vec::new();
    for i in 0.. {
        tick.tick().await;
        if drained.load(Ordering::SeqCst) {
            break;
        }
        let (api, log) = (api.clone(), log.clone());
        let name = quiet_name(i);
        let cm = config_map(name.clone(), &label);
        creates.push(tokio::spawn(async move {
            log.lock().sent(&name, Instant::now());
            api.create(&PostParams::default(), &cm)
                .await
                .expect("a quiet ConfigMap created");
            log.lock().returned(&name, Instant::now());
        }));
    }
    let created = creates.len();
    for create in creates {
        create.await.expect("a quiet create task");
    }
    created
}

/// Records when each quiet ConfigMap's create arrives on `events` (a watch of the quiet
/// namespace alone), until `stop`.
async fn watch_quiet(
    events: impl Stream<Item = kube_client::Result<WatchEvent<ConfigMap>>>,
    log: Arc<Mutex<Log>>,
    stop: CancellationToken,
) {
    let mut events = std::pin::pin!(events);
    loop {
        let event = tokio::select! {
            _ = stop.cancelled() => return,
            event = events.next() => event,
        };
        match event {
            Some(Ok(WatchEvent::Added(cm))) => {
                let now = Instant::now();
                if let Some(name) = cm.metadata.name.as_deref() {
                    log.lock().watched(name, now);
                }
            }
            Some(Ok(WatchEvent::Error(status))) => panic!("the quiet watch failed: {status:?}"),
            Some(Ok(_)) => {}
            Some(Err(e)) => panic!("the quiet watch failed: {e}"),
            None => panic!("the quiet watch ended before the round did"),
        }
    }
}

/// Samples the queue's `workqueue_depth` (summed over its priorities) until `sampling` turns
/// false; returns the largest.
async fn max_depth(registry: Registry, sampling: Arc<AtomicBool>) -> u64 {
    let mut tick = tokio::time::interval(DEPTH_EVERY);
    let mut max = 0;
    let mut text = String::new();
    let series = format!("name=\"{NAME}\"");
    while sampling.load(Ordering::SeqCst) {
        tick.tick().await;
        text.clear();
        prometheus_client::encoding::text::encode(&mut text, &registry)
            .expect("the queue's metrics encoded");
        let depth: u64 = text
            .lines()
            .filter(|line| line.starts_with("workqueue_depth{") && line.contains(&series))
            .filter_map(|line| line.rsplit(' ').next()?.parse::<u64>().ok())
            .sum();
        max = max.max(depth);
    }
    max
}

fn quiet_name(i: usize) -> String {
    format!("quiet-{i:04}")
}

fn config_map(name: String, label: &str) -> ConfigMap {
    let (key, value) = label.split_once('=').expect("a label key=value");
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name),
            labels: Some([(key.to_string(), value.to_string())].into()),
            ..Default::default()
        },
        data: Some([("v".to_string(), "0".to_string())].into()),
        ..Default::default()
    }
}

/// What a round records as it runs.
struct Log {
    /// The round's quiet namespace; every other ConfigMap the controller sees is busy.
    quiet_ns: String,
    /// Busy ConfigMaps whose reconcile has started.
    busy: HashSet<String>,
    /// When each of them started, in order.
    busy_starts: Vec<Instant>,
    /// Each quiet ConfigMap's times, by name.
    quiet: HashMap<String, Quiet>,
}

/// One quiet ConfigMap's times.
#[derive(Default)]
struct Quiet {
    sent: Option<Instant>,
    returned: Option<Instant>,
    /// When its create arrived on the quiet namespace's own watch.
    watched: Option<Instant>,
    started: Option<Instant>,
}

impl Log {
    fn new(quiet_ns: &str) -> Self {
        Log {
            quiet_ns: quiet_ns.to_string(),
            busy: HashSet::new(),
            busy_starts: Vec::new(),
            quiet: HashMap::new(),
        }
    }

    fn started(&mut self, key: &ObjectKey, now: Instant) {
        if key.namespace() == Some(self.quiet_ns.as_str()) {
            let quiet = self.quiet.entry(key.name().to_string()).or_default();
            quiet.started.get_or_insert(now);
        } else if self.busy.insert(key.name().to_string()) {
            self.busy_starts.push(now);
        }
    }

    fn sent(&mut self, name: &str, now: Instant) {
        self.quiet.entry(name.to_string()).or_default().sent = Some(now);
    }

    fn returned(&mut self, name: &str, now: Instant) {
        self.quiet.entry(name.to_string()).or_default().returned = Some(now);
    }

    /// The round's figures, once every ConfigMap was reconciled; `start` is when the first
    /// busy create was sent.
    fn watched(&mut self, name: &str, now: Instant) {
        let quiet = self.quiet.entry(name.to_string()).or_default();
        quiet.watched.get_or_insert(now);
    }

    fn figures(&self, start: Instant, flood_created: Duration, max_depth: u64) -> Figures {
        let last_busy = *self.busy_starts.last().expect("a busy reconcile");
        let flood_end = start + flood_created;
        let mut figures = Figures {
            quiet: self.quiet.len(),
            latency: Vec::new(),
            from_send: Vec::new(),
            to_quiet_watch: Vec::new(),
            to_watch_event: Vec::new(),
            informer: Vec::new(),
            in_queue: Vec::new(),
            flood_created,
            drain: last_busy - start,
            left_after_creates: self.busy_starts.iter().filter(|&&t| t > flood_end).count(),
            max_depth,
        };
        for (name, q) in &self.quiet {
            let started = q.started.expect("every quiet ConfigMap was reconciled");
            let sent = q.sent.expect("every quiet create was sent");
            let returned = q.returned.expect("every quiet create returned");
            let watched = q
                .watched
                .expect("every quiet create came on the quiet watch");
            // The watch event can come through before the create's response does.
            let latency = started.saturating_duration_since(returned);
            figures.latency.push(latency);
            figures.from_send.push(started - sent);
            figures
                .to_quiet_watch
                .push(watched.saturating_duration_since(returned));
            let Some(stages) = Stages::of(&format!("{}/{name}", self.quiet_ns)) else {
                continue;
            };
            // The trace's clock is its own: its reconcile start is this log's `started`.
            figures
                .to_watch_event
                .push(latency.saturating_sub(stages.reconcile_started - stages.watch_event));
            figures
                .informer
                .push(stages.queue_added - stages.watch_event);
            figures
                .in_queue
                .push(stages.worker_took - stages.queue_added);
        }
        for v in [
            &mut figures.latency,
            &mut figures.from_send,
            &mut figures.to_quiet_watch,
            &mut figures.to_watch_event,
            &mut figures.informer,
            &mut figures.in_queue,
        ] {
            v.sort();
        }
        figures
    }

    fn quiet_started(&self) -> usize {
        self.quiet.values().filter(|q| q.started.is_some()).count()
    }
}

fn fairness(fair: bool) -> &'static str {
    if fair { "on" } else { "off" }
}

/// A column of the table: its name, a round's figure in it, and how that prints.
type Column = (&'static str, fn(&Figures) -> f64, Show);

/// The table's columns after the round and the setting.
const COLUMNS: &[Column] = &[
    ("quiet n", |f| f.quiet as f64, Show::Count),
    ("quiet p50", |f| ms(percentile(&f.latency, 50)), Show::Ms),
    ("quiet p99", |f| ms(percentile(&f.latency, 99)), Show::Ms),
    (
        "quiet max",
        |f| ms(f.latency[f.latency.len() - 1]),
        Show::Ms,
    ),
    (
        "p99 from send",
        |f| ms(percentile(&f.from_send, 99)),
        Show::Ms,
    ),
    (
        "p99 to quiet-only watch",
        |f| ms(percentile(&f.to_quiet_watch, 99)),
        Show::Ms,
    ),
    (
        "p99 to watch event",
        |f| ms(percentile(&f.to_watch_event, 99)),
        Show::Ms,
    ),
    (
        "p99 informer",
        |f| ms(percentile(&f.informer, 99)),
        Show::Ms,
    ),
    (
        "p99 in queue",
        |f| ms(percentile(&f.in_queue, 99)),
        Show::Ms,
    ),
    (
        "busy created in",
        |f| f.flood_created.as_secs_f64(),
        Show::Secs,
    ),
    ("busy drain", |f| f.drain.as_secs_f64(), Show::Secs),
    (
        "left after creates",
        |f| f.left_after_creates as f64,
        Show::Count,
    ),
    (
        "drain rate after creates",
        |f| f.drain_rate_after_creates(),
        Show::PerSec,
    ),
    ("max depth", |f| f.max_depth as f64, Show::Count),
];

/// How a column's figures print.
#[derive(Clone, Copy)]
enum Show {
    Count,
    Ms,
    Secs,
    PerSec,
}

impl Show {
    fn format(self, v: f64) -> String {
        match self {
            Show::Count => format!("{v:.0}"),
            Show::Ms => format!("{v:.1} ms"),
            Show::Secs => format!("{v:.2} s"),
            Show::PerSec => format!("{v:.0}/s"),
        }
    }
}

fn header() -> String {
    let names: Vec<&str> = COLUMNS.iter().map(|(name, _, _)| *name).collect();
    format!(
        "| round | fairness | {} |\n|---|---|{}",
        names.join(" | "),
        "---|".repeat(names.len())
    )
}

fn row(round: usize, fair: bool, f: &Figures) -> String {
    let cells: Vec<String> = COLUMNS
        .iter()
        .map(|(_, figure, show)| show.format(figure(f)))
        .collect();
    format!("| {round} | {} | {} |", fairness(fair), cells.join(" | "))
}

/// Each column's median over rounds, with the min-max spread.
fn summary_row(fair: bool, rounds: &[Figures]) -> String {
    let cells: Vec<String> = COLUMNS
        .iter()
        .map(|(_, figure, show)| {
            let mut v: Vec<f64> = rounds.iter().map(figure).collect();
            v.sort_by(f64::total_cmp);
            format!(
                "{} ({}-{})",
                show.format(v[v.len() / 2]),
                show.format(v[0]),
                show.format(v[v.len() - 1])
            )
        })
        .collect();
    format!("| median | {} | {} |", fairness(fair), cells.join(" | "))
}

/// The median of the rounds' `figure`.
fn median(rounds: &[Figures], figure: fn(&Figures) -> f64) -> f64 {
    let mut v: Vec<f64> = rounds.iter().map(figure).collect();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// When a followed key passed the stages the figures split its latency at, on the trace's
/// clock: the first of each since it was followed (a quiet ConfigMap is added once).
struct Stages {
    watch_event: Duration,
    queue_added: Duration,
    worker_took: Duration,
    reconcile_started: Duration,
}

impl Stages {
    /// `None` if the key was not followed or did not pass every stage.
    fn of(key: &str) -> Option<Stages> {
        let steps = trace::timeline(key)?;
        let at = |stage: Stage| {
            steps
                .iter()
                .find(|step| step.stage == stage)
                .map(|step| Duration::from_micros(step.mono_micros))
        };
        Some(Stages {
            watch_event: at(Stage::WatchEvent)?,
            queue_added: at(Stage::QueueAdded)?,
            worker_took: at(Stage::WorkerTook)?,
            reconcile_started: at(Stage::ReconcileStarted)?,
        })
    }
}

/// The nearest-rank percentile `p` (0-100) of sorted `v`.
fn percentile(v: &[Duration], p: usize) -> Duration {
    v[(v.len() * p).div_ceil(100).clamp(1, v.len()) - 1]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Polls `done` every 5 ms; panics after 300 s, naming what it waited for.
async fn until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(300);
    while !done() {
        assert!(
            Instant::now() < deadline,
            "waited 300 s for {what}; the round is stuck"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
