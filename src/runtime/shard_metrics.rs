//! Per-replica metrics of a sharded controller (`sharding`):
//! `kubeloop_shards_held{controller}` (shards this replica holds a Lease for),
//! `kubeloop_shard_ring_members{controller}` (live replicas this one sees) and
//! `kubeloop_shard_moves_total{controller,direction}` with direction `acquired` or `released`
//! (every rebalance is one release here and one acquisition elsewhere). Keys reconciled per
//! replica are `controller_runtime_reconcile_total` ([`super::ReconcileMetrics`]).
//!
//! As [`super::ReconcileMetrics`], a set of families the binary registers;
//! [`ShardMetrics::global`] is the process-wide one the ring reports into.

use std::sync::OnceLock;

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// Which way a shard moved (the `direction` label).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
enum Direction {
    acquired,
    released,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ControllerLabel {
    controller: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MoveLabels {
    controller: String,
    direction: Direction,
}

/// The shard metric families. Cloning gives a handle to the same families.
#[derive(Clone, Debug, Default)]
pub struct ShardMetrics {
    held: Family<ControllerLabel, Gauge>,
    members: Family<ControllerLabel, Gauge>,
    moves: Family<MoveLabels, Counter>,
}

/// One controller's series.
#[derive(Clone, Debug)]
pub struct ShardMetricsHandle {
    held: Gauge,
    members: Gauge,
    acquired: Counter,
    released: Counter,
}

impl ShardMetrics {
    /// Empty series, not registered anywhere yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// The process-wide families.
    pub fn global() -> &'static ShardMetrics {
        static GLOBAL: OnceLock<ShardMetrics> = OnceLock::new();
        GLOBAL.get_or_init(ShardMetrics::new)
    }

    /// Registers the three families (`_total` is added by the encoder for counters).
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "kubeloop_shards_held",
            "Shards this replica holds the Lease of",
            self.held.clone(),
        );
        registry.register(
            "kubeloop_shard_ring_members",
            "Live replicas in the shard ring, as this replica sees them",
            self.members.clone(),
        );
        registry.register(
            "kubeloop_shard_moves",
            "Shards this replica acquired or released",
            self.moves.clone(),
        );
    }

    /// The series of `controller`.
    pub fn for_controller(&self, controller: &str) -> ShardMetricsHandle {
        let label = ControllerLabel {
            controller: controller.to_string(),
        };
        let moves = |direction| MoveLabels {
            controller: controller.to_string(),
            direction,
        };
        // One statement each: a family's guard lives to the end of its statement, and a second
        // `get_or_create` on the same family while it lives would wait for itself.
        let held = self.held.get_or_create(&label).clone();
        let members = self.members.get_or_create(&label).clone();
        let acquired = self
            .moves
            .get_or_create(&moves(Direction::acquired))
            .clone();
        let released = self
            .moves
            .get_or_create(&moves(Direction::released))
            .clone();
        ShardMetricsHandle {
            held,
            members,
            acquired,
            released,
        }
    }
}

impl ShardMetricsHandle {
    /// Sets `kubeloop_shards_held`.
    pub fn set_held(&self, shards: usize) {
        self.held.set(i64::try_from(shards).unwrap_or(i64::MAX));
    }

    /// Sets `kubeloop_shard_ring_members`.
    pub fn set_members(&self, members: usize) {
        self.members.set(i64::try_from(members).unwrap_or(i64::MAX));
    }

    /// One shard acquired (`true`) or released (`false`).
    pub fn moved(&self, acquired: bool) {
        if acquired {
            self.acquired.inc();
        } else {
            self.released.inc();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn moves_and_holdings_are_reported_per_controller() {
        let metrics = ShardMetrics::new();
        let vm = metrics.for_controller("vm-controller");
        vm.set_held(3);
        vm.set_members(2);
        vm.moved(true);
        vm.moved(true);
        vm.moved(false);
        let mut registry = Registry::default();
        metrics.register(&mut registry);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        for line in [
            "kubeloop_shards_held{controller=\"vm-controller\"} 3",
            "kubeloop_shard_ring_members{controller=\"vm-controller\"} 2",
            "kubeloop_shard_moves_total{controller=\"vm-controller\",direction=\"acquired\"} 2",
            "kubeloop_shard_moves_total{controller=\"vm-controller\",direction=\"released\"} 1",
        ] {
            assert!(text.contains(line), "{line} missing from\n{text}");
        }
    }
}
