//! Reconcile counts, errors and durations per controller, under controller-runtime's names
//! (`pkg/internal/controller/metrics`): `controller_runtime_reconcile_total{controller,result}`
//! with result `success`, `error`, `requeue_after` or `panic`, `controller_runtime_reconcile_errors_total{controller}`
//! and `controller_runtime_reconcile_time_seconds{controller}`; and read-your-writes' own
//! (`freshness.rs`): `kubeloop_reconcile_stale_total{controller}`, reconciles started on a
//! cache older than their key's last write, and `kubeloop_reconcile_freshness_wait_seconds{controller}`,
//! how long reconciles were held until their caches caught up.
//!
//! Like the workqueue's `MetricsProvider`, a [`ReconcileMetrics`] is a set of families the
//! binary registers in its registry; [`ReconcileMetrics::global`] is the process-wide one a
//! worker loop reports into without plumbing. Invariant: every outcome counted under `result`
//! is counted exactly once, and each `error` or `panic` also in `errors_total`.

use std::sync::OnceLock;
use std::time::Duration;

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// How one reconcile ended (the `result` label).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum ReconcileResult {
    /// The reconcile returned `Ok(Action::Done)`.
    success,
    /// The reconcile returned an error.
    error,
    /// The reconcile asked to run again after a delay.
    requeue_after,
    /// The reconcile panicked (caught; the key is retried rate-limited).
    panic,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    controller: String,
    result: ReconcileResult,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ControllerLabel {
    controller: String,
}

fn new_time_histogram() -> Histogram {
    // 5 ms .. ~82 s, as controller-runtime's buckets span.
    Histogram::new(exponential_buckets(0.005, 2.0, 15))
}

/// The reconcile metric families. Cloning gives a handle to the same families.
#[derive(Clone, Debug)]
pub struct ReconcileMetrics {
    total: Family<ResultLabels, Counter>,
    errors: Family<ControllerLabel, Counter>,
    time: Family<ControllerLabel, Histogram, fn() -> Histogram>,
    stale: Family<ControllerLabel, Counter>,
    held: Family<ControllerLabel, Histogram, fn() -> Histogram>,
}

impl Default for ReconcileMetrics {
    fn default() -> Self {
        Self {
            total: Family::default(),
            errors: Family::default(),
            time: Family::new_with_constructor(new_time_histogram),
            stale: Family::default(),
            held: Family::new_with_constructor(new_time_histogram),
        }
    }
}

impl ReconcileMetrics {
    /// Empty series, not registered anywhere yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// The process-wide families.
    pub fn global() -> &'static ReconcileMetrics {
        static GLOBAL: OnceLock<ReconcileMetrics> = OnceLock::new();
        GLOBAL.get_or_init(ReconcileMetrics::new)
    }

    /// Registers the three families (`_total` is added by the encoder for counters).
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "controller_runtime_reconcile",
            "Total number of reconciliations per controller",
            self.total.clone(),
        );
        registry.register(
            "controller_runtime_reconcile_errors",
            "Total number of reconciliation errors per controller",
            self.errors.clone(),
        );
        registry.register(
            "controller_runtime_reconcile_time_seconds",
            "Length of time per reconciliation per controller",
            self.time.clone(),
        );
        registry.register(
            "kubeloop_reconcile_stale",
            "Reconciles started on a cache older than their key's last write",
            self.stale.clone(),
        );
        registry.register(
            "kubeloop_reconcile_freshness_wait_seconds",
            "How long reconciles were held until their caches held their key's last writes",
            self.held.clone(),
        );
    }

    /// Counts one reconcile of `controller` that started on a stale cache.
    pub fn stale(&self, controller: &str) {
        self.stale.get_or_create(&label(controller)).inc();
    }

    /// How many reconciles of `controller` started on a stale cache so far.
    pub fn stale_count(&self, controller: &str) -> u64 {
        self.stale.get_or_create(&label(controller)).get()
    }

    /// One reconcile of `controller` held `waited` until its caches caught up.
    pub fn held(&self, controller: &str, waited: Duration) {
        self.held
            .get_or_create(&label(controller))
            .observe(waited.as_secs_f64());
    }

    /// Counts one reconcile of `controller` that ended with `result` after `took`.
    pub fn observe(&self, controller: &str, result: ReconcileResult, took: Duration) {
        self.total
            .get_or_create(&ResultLabels {
                controller: controller.to_string(),
                result,
            })
            .inc();
        let label = label(controller);
        if matches!(result, ReconcileResult::error | ReconcileResult::panic) {
            self.errors.get_or_create(&label).inc();
        }
        self.time.get_or_create(&label).observe(took.as_secs_f64());
    }
}

fn label(controller: &str) -> ControllerLabel {
    ControllerLabel {
        controller: controller.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encode(metrics: &ReconcileMetrics) -> String {
        let mut registry = Registry::default();
        metrics.register(&mut registry);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        text
    }

    #[test]
    fn each_outcome_is_counted_under_its_result_and_failures_also_as_errors() {
        let metrics = ReconcileMetrics::new();
        metrics.observe(
            "vm-controller",
            ReconcileResult::success,
            Duration::from_millis(3),
        );
        metrics.observe(
            "vm-controller",
            ReconcileResult::success,
            Duration::from_millis(4),
        );
        metrics.observe(
            "vm-controller",
            ReconcileResult::error,
            Duration::from_millis(7),
        );
        metrics.observe(
            "vm-controller",
            ReconcileResult::panic,
            Duration::from_millis(1),
        );
        metrics.observe(
            "sample-controller",
            ReconcileResult::requeue_after,
            Duration::from_secs(1),
        );
        let text = encode(&metrics);
        for line in [
            r#"controller_runtime_reconcile_total{controller="vm-controller",result="success"} 2"#,
            r#"controller_runtime_reconcile_total{controller="vm-controller",result="error"} 1"#,
            r#"controller_runtime_reconcile_total{controller="vm-controller",result="panic"} 1"#,
            r#"controller_runtime_reconcile_total{controller="sample-controller",result="requeue_after"} 1"#,
            r#"controller_runtime_reconcile_errors_total{controller="vm-controller"} 2"#,
            r#"controller_runtime_reconcile_time_seconds_count{controller="vm-controller"} 4"#,
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing {line} in:\n{text}"
            );
        }
        assert!(
            !text.contains(
                r#"controller_runtime_reconcile_errors_total{controller="sample-controller"}"#
            ),
            "a requeue is not an error:\n{text}"
        );
    }
}
