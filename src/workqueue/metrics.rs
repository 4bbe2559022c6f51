//! Workqueue metrics. client-go counterpart: `util/workqueue/metrics.go` (the hooks) and
//! `k8s.io/component-base/metrics/prometheus/workqueue` (the names, help texts and buckets).
//!
//! Names (label `name`, the queue's name), as component-base registers them:
//! `workqueue_depth`, `workqueue_adds_total`, `workqueue_queue_duration_seconds`,
//! `workqueue_work_duration_seconds`, `workqueue_unfinished_work_seconds`,
//! `workqueue_longest_running_processor_seconds`, `workqueue_retries_total`.
//! The two histograms use component-base's buckets, `ExponentialBuckets(10e-9, 10, 10)`:
//! 1e-8 s up to 10 s, as component-base's source has them (`10e-9` is 1e-8, not 1e-9: the
//! buckets are 1e-8 * 10^k).
//!
//! A priority queue (`priority_queue.rs`, controller-runtime's `priorityqueue`) reports the
//! same families, and its depth by priority: `workqueue_depth{name, priority}`, as
//! controller-runtime's `NewDepthMetricWithPriority` does; the other queues' depth series
//! carry no `priority` label. The number of priority labels per queue is bounded (see
//! `priority_state.rs`): after 25 distinct priorities, further ones share the label
//! `exceeded_cardinality_limit`.
//!
//! A priority queue with fairness keys (`fair.rs`) adds three gauges of its own, labelled by
//! `name` only, refreshed with the unfinished-work gauges: `workqueue_fairness_keys` (keys with
//! ready items), `workqueue_fairness_deepest_key_depth` (the ready items of the deepest key)
//! and `workqueue_fairness_longest_wait_seconds` (how long the oldest ready item of any key
//! has waited). No series is labelled by a key: a cluster with 10,000 namespaces would make
//! 10,000 series per queue. Three series a queue, however many keys; which keys are deep
//! and how long each has waited is [`super::PriorityQueue::fairness_depths`], read on demand
//! (and `kubeloop trace` shows the key each followed item was handed out under).
//!
//! What differs on purpose:
//! - A [`MetricsProvider`] is a set of prometheus-client metric families that a caller
//!   registers in its own [`Registry`]; [`MetricsProvider::global`] plays client-go's global
//!   provider. An unnamed queue has no metrics at all, as in client-go.
//! - Per-item timestamps live in the queue's item map (`ItemState`), not in two extra maps.
//!
//! Invariant: `workqueue_depth` counts the items that are dirty (added and not yet handed out),
//! which is what client-go's `Inc` on add and `Dec` on get amount to.

use std::hash::Hash;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

use prometheus_client::encoding::{EncodeLabelSet, LabelSetEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use tokio::time::{Instant, MissedTickBehavior};

use super::fair::FairnessDepth;
use super::priority_state::{PRIORITY_LABEL_OVERFLOW, PriorityHooks, PriorityState};
use super::shared::{Discipline, Hooks, Shared, Stamp};

/// How often a named queue refreshes its unfinished-work gauges. client-go:
/// `defaultUnfinishedWorkUpdatePeriod`.
pub const UNFINISHED_WORK_UPDATE_PERIOD: Duration = Duration::from_millis(500);

/// The metric families every named queue reports into. Cloning gives a handle to the same
/// families.
///
/// # Examples
/// ```
/// use prometheus_client::registry::Registry;
/// use kubeloop::workqueue::{MetricsProvider, Queue, QueueConfig};
/// let provider = MetricsProvider::new();
/// let mut registry = Registry::default();
/// provider.register(&mut registry);
/// let queue: Queue<String> = Queue::with_config(QueueConfig {
///     name: "pods".into(),
///     metrics_provider: Some(provider),
/// });
/// queue.add("default/web".into());
/// let mut text = String::new();
/// prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
/// assert!(text.contains(r#"workqueue_adds_total{name="pods"} 1"#));
/// ```
#[derive(Clone, Debug)]
pub struct MetricsProvider {
    depth: Family<DepthLabels, Gauge>,
    adds: Family<NameLabel, Counter>,
    queue_duration: Family<NameLabel, Histogram, fn() -> Histogram>,
    work_duration: Family<NameLabel, Histogram, fn() -> Histogram>,
    unfinished_work: Family<NameLabel, Gauge<f64, AtomicU64>>,
    longest_running_processor: Family<NameLabel, Gauge<f64, AtomicU64>>,
    retries: Family<NameLabel, Counter>,
    fairness_keys: Family<NameLabel, Gauge>,
    fairness_deepest: Family<NameLabel, Gauge>,
    fairness_longest_wait: Family<NameLabel, Gauge<f64, AtomicU64>>,
}

/// The `name` label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NameLabel {
    name: String,
}

/// The labels of `workqueue_depth`: `name`, and `priority` for a priority queue's series only
/// (controller-runtime gives plain queues `priority=""`; an absent label is the same to
/// Prometheus, and keeps the plain queues' series as client-go names them).
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
struct DepthLabels {
    name: String,
    priority: Option<String>,
}

impl EncodeLabelSet for DepthLabels {
    fn encode(&self, encoder: &mut LabelSetEncoder) -> Result<(), std::fmt::Error> {
        use prometheus_client::encoding::EncodeLabel;
        ("name", self.name.as_str()).encode(encoder.encode_label())?;
        if let Some(priority) = &self.priority {
            ("priority", priority.as_str()).encode(encoder.encode_label())?;
        }
        Ok(())
    }
}

/// One named queue's series, resolved once at construction so the hot path touches atomics
/// (and a histogram's lock) only.
pub(super) struct QueueMetrics {
    depth: Gauge,
    adds: Counter,
    queue_duration: Histogram,
    work_duration: Histogram,
    unfinished_work: Gauge<f64, AtomicU64>,
    longest_running_processor: Gauge<f64, AtomicU64>,
}

impl Default for MetricsProvider {
    fn default() -> Self {
        MetricsProvider::new()
    }
}

impl MetricsProvider {
    /// Fresh, empty families (nothing registered yet).
    pub fn new() -> Self {
        MetricsProvider {
            depth: Family::default(),
            adds: Family::default(),
            queue_duration: Family::new_with_constructor(duration_histogram),
            work_duration: Family::new_with_constructor(duration_histogram),
            unfinished_work: Family::default(),
            longest_running_processor: Family::default(),
            retries: Family::default(),
            fairness_keys: Family::default(),
            fairness_deepest: Family::default(),
            fairness_longest_wait: Family::default(),
        }
    }

    /// The provider named queues use when their config names none; register it once in the
    /// process's registry. client-go: the global provider set by `SetProvider`.
    pub fn global() -> &'static MetricsProvider {
        static GLOBAL: OnceLock<MetricsProvider> = OnceLock::new();
        GLOBAL.get_or_init(MetricsProvider::new)
    }

    /// Registers the seven families in `registry` under client-go's names and help texts,
    /// and the three fairness gauges of kubeloop's own (see the module docs).
    /// (prometheus-client appends `_total` to counters and a full stop to help texts itself.)
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "workqueue_depth",
            "Current depth of workqueue",
            self.depth.clone(),
        );
        registry.register(
            "workqueue_adds",
            "Total number of adds handled by workqueue",
            self.adds.clone(),
        );
        registry.register(
            "workqueue_queue_duration_seconds",
            "How long in seconds an item stays in workqueue before being requested",
            self.queue_duration.clone(),
        );
        registry.register(
            "workqueue_work_duration_seconds",
            "How long in seconds processing an item from workqueue takes",
            self.work_duration.clone(),
        );
        registry.register(
            "workqueue_unfinished_work_seconds",
            "How many seconds of work has done that is in progress and hasn't been observed by \
             work_duration. Large values indicate stuck threads. One can deduce the number of \
             stuck threads by observing the rate at which this increases",
            self.unfinished_work.clone(),
        );
        registry.register(
            "workqueue_longest_running_processor_seconds",
            "How many seconds has the longest running processor for workqueue been running",
            self.longest_running_processor.clone(),
        );
        registry.register(
            "workqueue_retries",
            "Total number of retries handled by workqueue",
            self.retries.clone(),
        );
        registry.register(
            "workqueue_fairness_keys",
            "How many fairness keys of a priority queue have ready items no worker has",
            self.fairness_keys.clone(),
        );
        registry.register(
            "workqueue_fairness_deepest_key_depth",
            "How many ready items the fairness key with the most has",
            self.fairness_deepest.clone(),
        );
        registry.register(
            "workqueue_fairness_longest_wait_seconds",
            "How many seconds the oldest ready item of any fairness key has waited",
            self.fairness_longest_wait.clone(),
        );
    }
}

/// component-base's `ExponentialBuckets(10e-9, 10, 10)`, multiplied out the same way.
fn duration_histogram() -> Histogram {
    let mut bound = 10e-9;
    let mut buckets = Vec::with_capacity(10);
    for _ in 0..10 {
        buckets.push(bound);
        bound *= 10.0;
    }
    Histogram::new(buckets)
}

impl QueueMetrics {
    /// The series for a queue called `name`, or `None` (no metrics) when `name` is empty.
    pub(super) fn for_queue(provider: Option<&MetricsProvider>, name: &str) -> Option<Self> {
        if name.is_empty() {
            return None;
        }
        let p = provider.unwrap_or_else(|| MetricsProvider::global());
        let label = NameLabel {
            name: name.to_owned(),
        };
        Some(QueueMetrics {
            depth: p.depth.get_or_create_owned(&DepthLabels {
                name: name.to_owned(),
                priority: None,
            }),
            adds: p.adds.get_or_create_owned(&label),
            queue_duration: p.queue_duration.get_or_create_owned(&label),
            work_duration: p.work_duration.get_or_create_owned(&label),
            unfinished_work: p.unfinished_work.get_or_create_owned(&label),
            longest_running_processor: p.longest_running_processor.get_or_create_owned(&label),
        })
    }

    /// The retries counter of a delaying queue called `name`, or `None` when unnamed.
    pub(super) fn retries_for(provider: Option<&MetricsProvider>, name: &str) -> Option<Counter> {
        if name.is_empty() {
            return None;
        }
        let p = provider.unwrap_or_else(|| MetricsProvider::global());
        Some(p.retries.get_or_create_owned(&NameLabel {
            name: name.to_owned(),
        }))
    }
}

impl Hooks for QueueMetrics {
    /// client-go: `defaultQueueMetrics.add`.
    fn added(&self, added_at: &mut Option<Stamp>, epoch: Instant) {
        self.adds.inc();
        self.depth.inc();
        if added_at.is_none() {
            *added_at = Some(Stamp::at(epoch, Instant::now()));
        }
    }

    /// client-go: `defaultQueueMetrics.get`.
    fn got(&self, added_at: &mut Option<Stamp>, started_at: &mut Option<Stamp>, epoch: Instant) {
        self.depth.dec();
        let now = Stamp::at(epoch, Instant::now());
        *started_at = Some(now);
        if let Some(added) = added_at.take() {
            self.queue_duration.observe(added.secs_until(now));
        }
    }

    /// client-go: `defaultQueueMetrics.done`.
    fn finished(&self, started_at: &mut Option<Stamp>, epoch: Instant) {
        if let Some(start) = started_at.take() {
            self.work_duration
                .observe(start.secs_until(Stamp::at(epoch, Instant::now())));
        }
    }

    /// client-go: `defaultQueueMetrics.updateUnfinishedWork`.
    fn unfinished(&self, total: f64, longest: f64) {
        self.unfinished_work.set(total);
        self.longest_running_processor.set(longest);
    }
}

/// A named priority queue's series: those of [`QueueMetrics`] but the depth, which goes by
/// priority, plus its retries (controller-runtime's `queueMetrics` counts them itself).
pub(super) struct PriorityQueueMetrics {
    name: String,
    depth: Family<DepthLabels, Gauge>,
    adds: Counter,
    queue_duration: Histogram,
    work_duration: Histogram,
    unfinished_work: Gauge<f64, AtomicU64>,
    longest_running_processor: Gauge<f64, AtomicU64>,
    retries: Counter,
    /// The fairness gauges' families; the series are made at the first refresh of a queue
    /// with fairness keys, so other queues have none.
    fairness_families: MetricsProvider,
    fairness: OnceLock<(Gauge, Gauge, Gauge<f64, AtomicU64>)>,
}

impl PriorityQueueMetrics {
    /// The series for a priority queue called `name`, or `None` when `name` is empty.
    pub(super) fn for_queue(provider: Option<&MetricsProvider>, name: &str) -> Option<Self> {
        if name.is_empty() {
            return None;
        }
        let p = provider.unwrap_or_else(|| MetricsProvider::global());
        let label = NameLabel {
            name: name.to_owned(),
        };
        Some(PriorityQueueMetrics {
            name: name.to_owned(),
            depth: p.depth.clone(),
            adds: p.adds.get_or_create_owned(&label),
            queue_duration: p.queue_duration.get_or_create_owned(&label),
            work_duration: p.work_duration.get_or_create_owned(&label),
            unfinished_work: p.unfinished_work.get_or_create_owned(&label),
            longest_running_processor: p.longest_running_processor.get_or_create_owned(&label),
            retries: p.retries.get_or_create_owned(&label),
            fairness_families: p.clone(),
            fairness: OnceLock::new(),
        })
    }
}

impl Hooks for PriorityQueueMetrics {
    fn added(&self, added_at: &mut Option<Stamp>, epoch: Instant) {
        self.adds.inc();
        if added_at.is_none() {
            *added_at = Some(Stamp::at(epoch, Instant::now()));
        }
    }

    fn got(&self, added_at: &mut Option<Stamp>, started_at: &mut Option<Stamp>, epoch: Instant) {
        let now = Stamp::at(epoch, Instant::now());
        *started_at = Some(now);
        if let Some(added) = added_at.take() {
            self.queue_duration.observe(added.secs_until(now));
        }
    }

    fn finished(&self, started_at: &mut Option<Stamp>, epoch: Instant) {
        if let Some(start) = started_at.take() {
            self.work_duration
                .observe(start.secs_until(Stamp::at(epoch, Instant::now())));
        }
    }

    fn unfinished(&self, total: f64, longest: f64) {
        self.unfinished_work.set(total);
        self.longest_running_processor.set(longest);
    }
}

impl PriorityHooks for PriorityQueueMetrics {
    fn retry(&self) {
        self.retries.inc();
    }

    fn fairness(&self, keys: usize, deepest: usize, longest_wait: f64) {
        let (keys_gauge, deepest_gauge, wait_gauge) = self.fairness.get_or_init(|| {
            let p = &self.fairness_families;
            let label = NameLabel {
                name: self.name.clone(),
            };
            (
                p.fairness_keys.get_or_create_owned(&label),
                p.fairness_deepest.get_or_create_owned(&label),
                p.fairness_longest_wait.get_or_create_owned(&label),
            )
        });
        keys_gauge.set(i64::try_from(keys).unwrap_or(i64::MAX));
        deepest_gauge.set(i64::try_from(deepest).unwrap_or(i64::MAX));
        wait_gauge.set(longest_wait);
    }

    fn depth_gauge(&self, priority: Option<i32>) -> Gauge {
        let priority = match priority {
            Some(p) => p.to_string(),
            None => PRIORITY_LABEL_OVERFLOW.to_owned(),
        };
        self.depth.get_or_create_owned(&DepthLabels {
            name: self.name.clone(),
            priority: Some(priority),
        })
    }
}

/// A named queue with fairness keys, as [`fairness_by_queue`] reads it.
pub(super) trait FairnessDepths: Send + Sync {
    fn fairness_depths(&self) -> Vec<FairnessDepth>;
}

/// The named queues with fairness keys in this process, by name; dropped queues are skipped
/// and forgotten at the next registration.
static FAIR_QUEUES: std::sync::Mutex<Vec<(String, Weak<dyn FairnessDepths>)>> =
    std::sync::Mutex::new(Vec::new());

impl<T: Hash + Eq + Clone + Send> FairnessDepths for Shared<PriorityState<T>> {
    fn fairness_depths(&self) -> Vec<FairnessDepth> {
        Shared::fairness_depths(self)
    }
}

/// Makes `queue` (named `name`) one that [`fairness_by_queue`] reports.
pub(super) fn register_fair_queue(name: &str, queue: Weak<dyn FairnessDepths>) {
    let mut queues = FAIR_QUEUES.lock().unwrap_or_else(|e| e.into_inner());
    queues.retain(|(_, q)| q.strong_count() > 0);
    queues.push((name.to_owned(), queue));
}

/// Every live named priority queue with fairness keys in this process (a controller's queue
/// is named after the controller), with its keys' depths and longest waits, deepest first:
/// what the ops server's `/debug/queue` shows.
pub fn fairness_by_queue() -> Vec<(String, Vec<FairnessDepth>)> {
    let queues: Vec<_> = FAIR_QUEUES
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .filter_map(|(name, q)| Some((name.clone(), q.upgrade()?)))
        .collect();
    queues
        .into_iter()
        .map(|(name, q)| (name, q.fairness_depths()))
        .collect()
}

/// Starts the task refreshing the unfinished-work gauges every
/// [`UNFINISHED_WORK_UPDATE_PERIOD`], if a tokio runtime is current. It ends at shutdown or when
/// the queue is dropped. client-go: `updateUnfinishedWorkLoop`.
pub(super) fn spawn_unfinished_work_updater<S: Discipline<Filter: Send + Sync> + Send + 'static>(
    shared: &Arc<Shared<S>>,
) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let queue = Arc::downgrade(shared);
    runtime.spawn(async move {
        let period = UNFINISHED_WORK_UPDATE_PERIOD;
        let mut ticker = tokio::time::interval_at(Instant::now() + period, period);
        ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            ticker.tick().await;
            let Some(shared) = queue.upgrade() else {
                return;
            };
            if !shared.update_unfinished_work() {
                return;
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use prometheus_client::encoding::text::encode;

    use super::*;
    use crate::workqueue::{DelayingQueue, Queue, QueueConfig};

    fn scrape(registry: &Registry) -> String {
        let mut text = String::new();
        encode(&mut text, registry).unwrap();
        text
    }

    /// The value of the sample line starting with `series ` in `text`.
    fn sample(text: &str, series: &str) -> f64 {
        let prefix = format!("{series} ");
        let line = text
            .lines()
            .find(|l| l.starts_with(&prefix))
            .unwrap_or_else(|| panic!("no sample {series} in:\n{text}"));
        line[prefix.len()..].trim().parse().unwrap()
    }

    /// The count of the `name="test"` bucket of `histogram` whose bound is about `le`.
    fn bucket(text: &str, histogram: &str, le: f64) -> f64 {
        let prefix = format!("{histogram}_bucket{{le=\"");
        for line in text.lines().filter(|l| l.starts_with(&prefix)) {
            let bound = line[prefix.len()..].split('"').next().unwrap();
            if bound != "+Inf" && (bound.parse::<f64>().unwrap() / le - 1.0).abs() < 1e-9 {
                return line.rsplit(' ').next().unwrap().parse().unwrap();
            }
        }
        panic!("no bucket {le} of {histogram} in:\n{text}")
    }

    fn named(name: &str, provider: &MetricsProvider) -> QueueConfig {
        QueueConfig {
            name: name.into(),
            metrics_provider: Some(provider.clone()),
        }
    }

    // client-go: TestMetrics (with the registry encoded to text, as a scrape would see it)
    #[tokio::test(start_paused = true)]
    async fn queue_metrics_move_as_items_flow() {
        let provider = MetricsProvider::new();
        let mut registry = Registry::default();
        provider.register(&mut registry);
        let q = Queue::with_config(named("test", &provider));

        q.add("foo");
        let text = scrape(&registry);
        assert_eq!(sample(&text, r#"workqueue_adds_total{name="test"}"#), 1.0);
        assert_eq!(sample(&text, r#"workqueue_depth{name="test"}"#), 1.0);

        tokio::time::advance(Duration::from_micros(50)).await;
        let i = q.get().await.unwrap();
        let text = scrape(&registry);
        assert_eq!(
            sample(
                &text,
                r#"workqueue_queue_duration_seconds_count{name="test"}"#
            ),
            1.0
        );
        assert_eq!(
            sample(
                &text,
                r#"workqueue_queue_duration_seconds_sum{name="test"}"#
            ),
            5e-5
        );
        // Bounds print as Go's multiplied-out values do (9.999999999999999e-05 and so on).
        assert_eq!(bucket(&text, "workqueue_queue_duration_seconds", 1e-4), 1.0);
        assert_eq!(bucket(&text, "workqueue_queue_duration_seconds", 1e-5), 0.0);

        // Add it back while processing; multiple adds of the same item are de-duped.
        for _ in 0..5 {
            q.add(i);
        }
        let text = scrape(&registry);
        assert_eq!(sample(&text, r#"workqueue_adds_total{name="test"}"#), 2.0);
        assert_eq!(sample(&text, r#"workqueue_depth{name="test"}"#), 1.0);

        tokio::time::advance(Duration::from_micros(25)).await;
        q.done(&i);
        let text = scrape(&registry);
        assert_eq!(
            sample(
                &text,
                r#"workqueue_work_duration_seconds_count{name="test"}"#
            ),
            1.0
        );
        assert_eq!(
            sample(&text, r#"workqueue_work_duration_seconds_sum{name="test"}"#),
            2.5e-5
        );
        assert_eq!(sample(&text, r#"workqueue_depth{name="test"}"#), 1.0);

        let i = q.get().await.unwrap();
        let handed_out = Instant::now();
        let text = scrape(&registry);
        assert_eq!(
            sample(
                &text,
                r#"workqueue_queue_duration_seconds_count{name="test"}"#
            ),
            2.0
        );
        // The second wait began at the re-add, 25 us before `done` put it back in line.
        assert!(
            (sample(
                &text,
                r#"workqueue_queue_duration_seconds_sum{name="test"}"#
            ) - 7.5e-5)
                .abs()
                < 1e-12
        );

        // The updater task refreshes the unfinished-work gauges every 500 ms; its last tick
        // before we look is at t = 1000 ms (the timer wheel may fire it up to 1 ms late), and
        // the item was handed out at t = 75 us.
        tokio::time::sleep(Duration::from_millis(1001)).await;
        let text = scrape(&registry);
        let unfinished = sample(&text, r#"workqueue_unfinished_work_seconds{name="test"}"#);
        assert!((0.999925..=1.001).contains(&unfinished), "{unfinished}");
        let longest = sample(
            &text,
            r#"workqueue_longest_running_processor_seconds{name="test"}"#,
        );
        assert_eq!(longest, unfinished, "one item processing: total == longest");

        q.done(&i);
        let text = scrape(&registry);
        assert_eq!(
            sample(
                &text,
                r#"workqueue_work_duration_seconds_count{name="test"}"#
            ),
            2.0
        );
        let want = 2.5e-5 + handed_out.elapsed().as_secs_f64();
        let sum = sample(&text, r#"workqueue_work_duration_seconds_sum{name="test"}"#);
        assert!((sum - want).abs() < 1e-9 && sum > 1.001, "{sum} != {want}");
        assert_eq!(sample(&text, r#"workqueue_depth{name="test"}"#), 0.0);
    }

    #[tokio::test(start_paused = true)]
    async fn unfinished_work_sums_every_processing_item() {
        let provider = MetricsProvider::new();
        let mut registry = Registry::default();
        provider.register(&mut registry);
        let q = Queue::with_config(named("busy", &provider));
        q.add(1);
        q.add(2);
        let a = q.get().await.unwrap();
        tokio::time::advance(Duration::from_secs(2)).await;
        let b = q.get().await.unwrap();
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(q.shared.update_unfinished_work());
        let text = scrape(&registry);
        assert_eq!(
            sample(&text, r#"workqueue_unfinished_work_seconds{name="busy"}"#),
            4.0
        );
        assert_eq!(
            sample(
                &text,
                r#"workqueue_longest_running_processor_seconds{name="busy"}"#
            ),
            3.0
        );
        q.done(&a);
        q.done(&b);
        q.shutdown();
        assert!(
            !q.shared.update_unfinished_work(),
            "no updates after shutdown"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn retries_count_every_add_after_before_shutdown() {
        let provider = MetricsProvider::new();
        let mut registry = Registry::default();
        provider.register(&mut registry);
        let q = DelayingQueue::with_config(named("retry", &provider));
        q.add_after("a", Duration::from_millis(5));
        q.add_after("a", Duration::from_millis(1));
        q.add_after("b", Duration::ZERO);
        let text = scrape(&registry);
        assert_eq!(
            sample(&text, r#"workqueue_retries_total{name="retry"}"#),
            3.0
        );
        assert_eq!(
            sample(&text, r#"workqueue_depth{name="retry"}"#),
            1.0,
            "only b is in line"
        );
        tokio::time::advance(Duration::from_millis(1)).await;
        assert_eq!(q.len(), 2);
        let text = scrape(&registry);
        assert_eq!(sample(&text, r#"workqueue_depth{name="retry"}"#), 2.0);
        assert_eq!(sample(&text, r#"workqueue_adds_total{name="retry"}"#), 2.0);
        q.shutdown();
        q.add_after("c", Duration::from_millis(1));
        assert_eq!(
            sample(
                &scrape(&registry),
                r#"workqueue_retries_total{name="retry"}"#
            ),
            3.0
        );
    }

    #[tokio::test]
    async fn unnamed_queue_reports_nothing() {
        let provider = MetricsProvider::new();
        let mut registry = Registry::default();
        provider.register(&mut registry);
        let q = DelayingQueue::with_config(QueueConfig {
            name: String::new(),
            metrics_provider: Some(provider.clone()),
        });
        q.add(1);
        q.add_after(2, Duration::from_millis(1));
        let text = scrape(&registry);
        assert!(
            !text.contains("name="),
            "an unnamed queue must not create series:\n{text}"
        );
        assert!(!q.shared.has_hooks());
    }

    #[test]
    fn histogram_buckets_are_component_bases() {
        let provider = MetricsProvider::new();
        let mut registry = Registry::default();
        provider.register(&mut registry);
        let label = NameLabel { name: "b".into() };
        provider.work_duration.get_or_create(&label).observe(0.5);
        let text = scrape(&registry);
        let bounds: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("workqueue_work_duration_seconds_bucket"))
            .map(|l| l.split("le=\"").nth(1).unwrap().split('"').next().unwrap())
            .collect();
        let parsed: Vec<f64> = bounds
            .iter()
            .filter(|b| **b != "+Inf")
            .map(|b| b.parse().unwrap())
            .collect();
        assert_eq!(parsed.len(), 10, "{bounds:?}");
        for (k, b) in parsed.iter().enumerate() {
            let want = 1e-8 * 10f64.powi(k as i32);
            assert!((b / want - 1.0).abs() < 1e-9, "bucket {k}: {b} != {want}");
        }
        assert_eq!(bounds.last(), Some(&"+Inf"));
        assert!(text.contains("# HELP workqueue_work_duration_seconds How long in seconds processing an item from workqueue takes.\n"));
    }
}
