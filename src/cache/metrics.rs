//! Cache metrics: client-go's reflector metrics (`tools/cache/reflector_metrics.go`, whose
//! provider is a no-op unless a component installs one) plus a per-handler backlog gauge that
//! client-go lacks (client-go#1326).
//!
//! One [`CacheMetrics`] is shared by every reflector and informer that is given it (cloning
//! shares the same series). Register it once with [`CacheMetrics::register`].
//!
//! Series (label `type`, e.g. `v1/configmaps`, and `handler` for the backlog):
//! - `kubeloop_reflector_lists_total`: LIST runs started (initial list and relists);
//! - `kubeloop_reflector_relists_total`: LIST runs after the first;
//! - `kubeloop_reflector_list_errors_total`: LIST runs that failed;
//! - `kubeloop_reflector_watches_total`: WATCH requests opened;
//! - `kubeloop_reflector_watch_events_total`: watch events received (bookmarks included);
//! - `kubeloop_reflector_last_resource_version`: the last resourceVersion synced, as a number;
//! - `kubeloop_reflector_undecodable_objects_total`: objects skipped because they do not
//!   decode into the informer's type or are over the size bound, one per list item or watch
//!   event skipped (client-go has no such series: it fails the list instead);
//! - `kubeloop_reflector_listed_objects_total`: objects received in LIST answers (after a
//!   shard scope's own filter; a streaming list's come as watch events);
//! - `kubeloop_informer_handler_backlog`: notifications queued for a handler, not yet handled.
//!
//! And client-go 1.36's informer series, with its names, labels (`name`, `group`, `version`,
//! `resource`) and buckets (component-base `metrics/prometheus/clientgo/fifo/metrics.go`),
//! published only by informers with a reserved [`InformerIdentity`] (a named factory's):
//! - `informer_queued_items`: items waiting in the informer's queue, read after each pop
//!   (client-go sets it on every push too);
//! - `informer_processing_latency_seconds`: time to apply a pop to the cache and hand its
//!   notifications to the handlers;
//! - `informer_store_resource_version`: the 15 least significant digits of the cache's
//!   resourceVersion.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;

use super::identity::InformerIdentity;

/// `informer_processing_latency_seconds`' buckets (component-base's).
pub const PROCESSING_LATENCY_BUCKETS: [f64; 12] = [
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// Label set of client-go's informer series.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct InformerLabels {
    pub name: String,
    pub group: String,
    pub version: String,
    pub resource: String,
}

type HistogramFamily = Family<InformerLabels, Histogram, fn() -> Histogram>;

fn latency_histogram() -> Histogram {
    Histogram::new(PROCESSING_LATENCY_BUCKETS)
}

/// One informer's client-go series, resolved once.
#[derive(Debug, Clone)]
pub(crate) struct InformerSeries {
    identity: InformerIdentity,
    queued_items: Gauge,
    processing_latency: Histogram,
    store_resource_version: Gauge,
}

impl InformerSeries {
    pub(crate) fn queued_items(&self, n: usize) {
        if self.identity.reserved() {
            self.queued_items.set(i64::try_from(n).unwrap_or(i64::MAX));
        }
    }
    pub(crate) fn processed(&self, took: std::time::Duration) {
        if self.identity.reserved() {
            self.processing_latency.observe(took.as_secs_f64());
        }
    }
    /// client-go `parseRVForMetricsWithTruncation`: the last 15 digits, so the value stays
    /// exact in a float64; a version that is not a number is not published.
    pub(crate) fn store_resource_version(&self, rv: &str) {
        let digits = &rv[rv.len().saturating_sub(15)..];
        if self.identity.reserved()
            && let Ok(n) = digits.parse::<i64>()
        {
            self.store_resource_version.set(n);
        }
    }
}
use prometheus_client::registry::Registry;

/// Label set of the reflector series.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct TypeLabels {
    /// The resource type (`apiVersion/plural`).
    pub r#type: String,
}

/// Label set of the handler backlog.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct HandlerLabels {
    /// The resource type.
    pub r#type: String,
    /// The handler's name (given at registration, or `handler-<n>`).
    pub handler: String,
}

/// All cache series. Cheap to clone; clones share values.
#[derive(Debug, Clone)]
pub struct CacheMetrics {
    queued_items: Family<InformerLabels, Gauge>,
    processing_latency: HistogramFamily,
    store_resource_version: Family<InformerLabels, Gauge>,
    lists: Family<TypeLabels, Counter>,
    relists: Family<TypeLabels, Counter>,
    list_errors: Family<TypeLabels, Counter>,
    watches: Family<TypeLabels, Counter>,
    watch_events: Family<TypeLabels, Counter>,
    last_resource_version: Family<TypeLabels, Gauge>,
    undecodable_objects: Family<TypeLabels, Counter>,
    listed_objects: Family<TypeLabels, Counter>,
    handler_backlog: Family<HandlerLabels, Gauge>,
}

/// The series of one resource type, resolved once.
#[derive(Debug, Clone)]
pub struct ReflectorMetrics {
    pub(crate) lists: Counter,
    pub(crate) relists: Counter,
    pub(crate) list_errors: Counter,
    pub(crate) watches: Counter,
    pub(crate) watch_events: Counter,
    pub(crate) last_resource_version: Gauge,
    pub(crate) undecodable_objects: Counter,
    pub(crate) listed_objects: Counter,
}

impl Default for CacheMetrics {
    fn default() -> Self {
        CacheMetrics {
            queued_items: Family::default(),
            processing_latency: Family::new_with_constructor(latency_histogram),
            store_resource_version: Family::default(),
            lists: Family::default(),
            relists: Family::default(),
            list_errors: Family::default(),
            watches: Family::default(),
            watch_events: Family::default(),
            last_resource_version: Family::default(),
            undecodable_objects: Family::default(),
            listed_objects: Family::default(),
            handler_backlog: Family::default(),
        }
    }
}

impl CacheMetrics {
    /// Fresh, unregistered series.
    pub fn new() -> Self {
        Self::default()
    }

    /// client-go's series of the informer `identity` names; `None` when it is not reserved
    /// (no name, or a second informer of the name's resource).
    pub(crate) fn informer(&self, identity: &InformerIdentity) -> Option<InformerSeries> {
        if !identity.reserved() {
            return None;
        }
        let labels = InformerLabels {
            name: identity.name().to_string(),
            group: identity.group().to_string(),
            version: identity.version().to_string(),
            resource: identity.resource().to_string(),
        };
        Some(InformerSeries {
            identity: identity.clone(),
            queued_items: self.queued_items.get_or_create(&labels).clone(),
            processing_latency: self.processing_latency.get_or_create(&labels).clone(),
            store_resource_version: self.store_resource_version.get_or_create(&labels).clone(),
        })
    }

    /// Adds every series to `registry` (prefix it with `registry.sub_registry_with_prefix` if
    /// wanted; names already start with `kubeloop_`).
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "informer_queued_items",
            "Number of items currently queued in the FIFO.",
            self.queued_items.clone(),
        );
        registry.register(
            "informer_processing_latency_seconds",
            "Time taken to process events after popping from the queue.",
            self.processing_latency.clone(),
        );
        registry.register(
            "informer_store_resource_version",
            "The 15 least significant digits of the resource version of the store.",
            self.store_resource_version.clone(),
        );
        registry.register(
            "kubeloop_reflector_lists",
            "LIST runs started by reflectors",
            self.lists.clone(),
        );
        registry.register(
            "kubeloop_reflector_relists",
            "LIST runs after the first one",
            self.relists.clone(),
        );
        registry.register(
            "kubeloop_reflector_list_errors",
            "LIST runs that failed",
            self.list_errors.clone(),
        );
        registry.register(
            "kubeloop_reflector_watches",
            "WATCH requests opened by reflectors",
            self.watches.clone(),
        );
        registry.register(
            "kubeloop_reflector_watch_events",
            "Watch events received, bookmarks included",
            self.watch_events.clone(),
        );
        registry.register(
            "kubeloop_reflector_last_resource_version",
            "Last resourceVersion a reflector synced",
            self.last_resource_version.clone(),
        );
        registry.register(
            "kubeloop_reflector_undecodable_objects",
            "Objects skipped because they do not decode into the informer's type or are over the size bound",
            self.undecodable_objects.clone(),
        );
        registry.register(
            "kubeloop_reflector_listed_objects",
            "Objects received in LIST answers (after a shard scope's own filter)",
            self.listed_objects.clone(),
        );
        registry.register(
            "kubeloop_informer_handler_backlog",
            "Notifications queued for an event handler and not handled yet",
            self.handler_backlog.clone(),
        );
    }

    /// The reflector series of one type.
    pub fn reflector(&self, type_name: &str) -> ReflectorMetrics {
        let l = TypeLabels {
            r#type: type_name.to_string(),
        };
        ReflectorMetrics {
            lists: self.lists.get_or_create(&l).clone(),
            relists: self.relists.get_or_create(&l).clone(),
            list_errors: self.list_errors.get_or_create(&l).clone(),
            watches: self.watches.get_or_create(&l).clone(),
            watch_events: self.watch_events.get_or_create(&l).clone(),
            last_resource_version: self.last_resource_version.get_or_create(&l).clone(),
            undecodable_objects: self.undecodable_objects.get_or_create(&l).clone(),
            listed_objects: self.listed_objects.get_or_create(&l).clone(),
        }
    }

    /// The backlog gauge of one handler.
    pub fn handler_backlog(&self, type_name: &str, handler: &str) -> Gauge {
        self.handler_backlog
            .get_or_create(&HandlerLabels {
                r#type: type_name.to_string(),
                handler: handler.to_string(),
            })
            .clone()
    }
}

impl ReflectorMetrics {
    /// LIST runs started.
    pub fn lists(&self) -> u64 {
        self.lists.get()
    }
    /// LIST runs after the first.
    pub fn relists(&self) -> u64 {
        self.relists.get()
    }
    /// Failed LIST runs.
    pub fn list_errors(&self) -> u64 {
        self.list_errors.get()
    }
    /// WATCH requests opened.
    pub fn watches(&self) -> u64 {
        self.watches.get()
    }
    /// Watch events received.
    pub fn watch_events(&self) -> u64 {
        self.watch_events.get()
    }
    /// The last synced resourceVersion (0 if not numeric or none yet).
    pub fn last_resource_version(&self) -> i64 {
        self.last_resource_version.get()
    }

    /// Objects skipped as undecodable (list items and watch events).
    pub fn undecodable_objects(&self) -> u64 {
        self.undecodable_objects.get()
    }

    /// Objects received in LIST answers (not a streaming list's, which are watch events).
    pub fn listed_objects(&self) -> u64 {
        self.listed_objects.get()
    }

    pub(crate) fn set_resource_version(&self, rv: &str) {
        if let Ok(n) = rv.parse::<i64>() {
            self.last_resource_version.set(n);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::encoding::text::encode;

    #[test]
    fn registered_series_are_exposed_with_type_labels() {
        let m = CacheMetrics::new();
        let mut reg = Registry::default();
        m.register(&mut reg);
        let r = m.reflector("v1/configmaps");
        r.lists.inc();
        r.watch_events.inc_by(3);
        r.set_resource_version("1234");
        r.set_resource_version("not-a-number");
        r.undecodable_objects.inc();
        m.handler_backlog("v1/configmaps", "h1").set(7);
        let mut out = String::new();
        encode(&mut out, &reg).unwrap();
        assert!(
            out.contains("kubeloop_reflector_lists_total{type=\"v1/configmaps\"} 1"),
            "{out}"
        );
        assert!(out.contains("kubeloop_reflector_watch_events_total{type=\"v1/configmaps\"} 3"));
        assert!(
            out.contains("kubeloop_reflector_last_resource_version{type=\"v1/configmaps\"} 1234")
        );
        assert!(
            out.contains("kubeloop_reflector_undecodable_objects_total{type=\"v1/configmaps\"} 1"),
            "{out}"
        );
        assert!(out.contains(
            "kubeloop_informer_handler_backlog{type=\"v1/configmaps\",handler=\"h1\"} 7"
        ));
        // A clone shares the series.
        assert_eq!(m.clone().reflector("v1/configmaps").lists(), 1);
    }

    // component-base: metrics/prometheus/clientgo/fifo (names, labels, buckets).
    #[test]
    fn client_gos_informer_series_carry_its_names_labels_and_buckets() {
        let m = CacheMetrics::new();
        let mut reg = Registry::default();
        m.register(&mut reg);
        let name = super::super::identity::InformerName::new("metrics-test").unwrap();
        assert!(m.informer(&InformerIdentity::default()).is_none());
        let series = m
            .informer(&name.with_resource("apps", "v1", "deployments"))
            .unwrap();
        series.queued_items(3);
        series.processed(std::time::Duration::from_millis(3));
        series.store_resource_version("1234567890123456789");
        let mut out = String::new();
        encode(&mut out, &reg).unwrap();
        let labels = r#"name="metrics-test",group="apps",version="v1",resource="deployments""#;
        for line in [
            format!("informer_queued_items{{{labels}}} 3"),
            format!("informer_store_resource_version{{{labels}}} 567890123456789"),
            format!("informer_processing_latency_seconds_count{{{labels}}} 1"),
        ] {
            assert!(out.contains(&line), "{line} in\n{out}");
        }
        let buckets: Vec<(&str, &str)> = out
            .lines()
            .filter(|l| {
                l.starts_with("informer_processing_latency_seconds_bucket") && l.contains(labels)
            })
            .filter_map(|l| {
                let le = l.split("le=\"").nth(1)?.split('"').next()?;
                Some((le, l.rsplit(' ').next()?))
            })
            .collect();
        let les: Vec<f64> = buckets.iter().map(|(le, _)| le.parse().unwrap()).collect();
        let mut expected = PROCESSING_LATENCY_BUCKETS.to_vec();
        expected.push(f64::INFINITY);
        assert_eq!(les, expected, "{out}");
        let counts: Vec<&str> = buckets.iter().map(|(_, n)| *n).collect();
        assert_eq!(
            counts[..3],
            ["0", "1", "1"],
            "3 ms falls in the 5 ms bucket: {out}"
        );
        name.release();
        series.queued_items(9);
        let mut out = String::new();
        encode(&mut out, &reg).unwrap();
        assert!(
            out.contains(&format!("informer_queued_items{{{labels}}} 3")),
            "released: frozen"
        );
    }
}
