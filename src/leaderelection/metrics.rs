//! Leader-election metrics. client-go counterpart: `tools/leaderelection/metrics.go` (the hooks)
//! and `k8s.io/component-base/metrics/prometheus/clientgo/leaderelection` (names, help texts).
//!
//! Names (label `name`, the election's [`super::LeaderElectionConfig::name`]):
//! `leader_election_master_status` (1 while this process leads, else 0) and
//! `leader_election_slowpath_total` (renewals that had to re-read the Lease because the fast
//! path failed). As with the workqueue, a [`LeaderMetricsProvider`] is a set of families the
//! caller registers in its own registry; an elector reports into one only when told to with
//! [`super::LeaderElector::report_metrics_to`].

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// The metric families electors report into. Cloning gives a handle to the same families.
#[derive(Clone, Debug, Default)]
pub struct LeaderMetricsProvider {
    master_status: Family<NameLabel, Gauge>,
    slowpath: Family<NameLabel, Counter>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NameLabel {
    name: String,
}

/// One election's series, resolved once.
pub(super) struct ElectionMetrics {
    master_status: Gauge,
    slowpath: Counter,
}

impl LeaderMetricsProvider {
    /// A provider with no elections registered yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers both families under component-base's names and help texts.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "leader_election_master_status",
            "Gauge of if the reporting system is master of the relevant lease, 0 indicates backup, 1 indicates master. 'name' is the string used to identify the lease. Please make sure to group by name",
            self.master_status.clone(),
        );
        registry.register(
            "leader_election_slowpath",
            "Total number of slow path exercised in renewing leader leases. 'name' is the string used to identify the lease. Please make sure to group by name",
            self.slowpath.clone(),
        );
    }

    pub(super) fn for_election(&self, name: &str) -> ElectionMetrics {
        let label = NameLabel {
            name: name.to_string(),
        };
        ElectionMetrics {
            master_status: self.master_status.get_or_create(&label).clone(),
            slowpath: self.slowpath.get_or_create(&label).clone(),
        }
    }
}

impl ElectionMetrics {
    pub(super) fn leader_on(&self) {
        self.master_status.set(1);
    }

    pub(super) fn leader_off(&self) {
        self.master_status.set(0);
    }

    pub(super) fn slowpath_exercised(&self) {
        self.slowpath.inc();
    }
}
