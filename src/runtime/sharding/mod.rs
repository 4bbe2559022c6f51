//! Sharding: more than one active replica, each reconciling the keys of the shards it holds.
//!
//! Leader election gives a controller high availability, not scale: one replica works. Here
//! the key space is split into a fixed number of shards by a stable hash of `namespace/name`
//! ([`crate::runtime::shard_of`]); each shard is held through a coordination.k8s.io/v1
//! Lease of its own, with the elector, the lease arithmetic and the fence of leader election
//! (`leadership.rs`): every shard a replica holds is a term, and a key is reconciled only
//! inside the term of its shard. client-go, controller-runtime and kube-runtime have nothing built in;
//! kubernetes-controller-sharding adds it to controller-runtime with an external sharder that
//! labels objects. This ring needs nothing but Leases and has no central sharder.
//!
//! # The Leases of a ring (`kubectl get leases -l kubeloop.dev/ring=<ring>`)
//! - `<ring>-shard-<i>` for i in 0..shards: held by the replica that owns shard i (labels
//!   `kubeloop.dev/ring=<ring>`, `kubeloop.dev/ring-role=shard`, `kubeloop.dev/shard=<i>`), so
//!   `kubectl get leases` reads as the shard map;
//! - `<ring>-member-<hash of identity>`: one per replica, renewed while it runs
//!   (`kubeloop.dev/ring-role=member`); released on a clean stop, deleted by the others once it
//!   has stayed unchanged for twice its lease duration.
//!
//! # How shards move
//! Every replica lists the ring's Leases every `retry_period` (and at the instant a Lease it
//! watches would expire) and judges each one as the elector does: expired when unchanged for
//! its `leaseDurationSeconds` by this process's clock since the replica saw it change. From
//! the live members and the live holders it computes the same assignment every other replica
//! with the same view computes ([`assign`]: each member gets its fair share, `shards / members`
//! rounded up or down; a shard stays with a live holder within its share; the rest go to their
//! home member, the `i mod members`-th by identity, while it has room, then to the members
//! with the most room). It then runs an elector for each shard assigned to it and stops
//! the elector of each shard it holds that is assigned elsewhere.
//!
//! Safety does not rest on the assignment (views differ for a moment while a replica joins or
//! dies): a shard is reconciled only by the holder of its Lease, within its term. Handing a
//! shard over is a graceful step-down: the term ends, the workers stop taking its keys, its
//! in-flight reconciles are cancelled and waited for (dropped at the fence if they must), and
//! only then is the Lease released, so the next owner's first reconcile starts after the last
//! one of the previous owner ended. A dead or paused owner's shard is taken only after its Lease
//! expired, which is after the old owner's fence (see `leadership.rs`).
//!
//! Liveness: a member that dies stops renewing its Leases; within `lease_duration` of its last
//! renewal (by each observer's clock) the others see its member Lease expired and reassign its
//! shards; the new owner's elector starts with the ring's observation of the shard's Lease
//! ([`LeaderElector::assume_observed`]), so it takes the shard as soon as that Lease expires,
//! within `lease_duration + retry_period` of the death, not a second lease duration later.
//!
//! Keys of shards a replica does not hold are set aside when taken from the queue and handed
//! back when it acquires the shard, with the keys it saw change meanwhile (the gate's parked
//! set): a new owner reconciles every key of a shard it takes over, as a new leader does.
//! Leader tasks (the VM controller's orphan sweep) run in the term of shard 0.
//!
//! Informers run on every replica and cache everything, so taking over a shard is warm; unless
//! the ring watches only the shards held ([`ShardRing::watch_held_shards`]): keys are then
//! split by their namespace's hash range, each replica's informers list and watch only its
//! shards' ranges (KEP-5866's `shardSelector`, `crate::cache::ShardScope`), and a shard's term
//! opens once its range is listed (`terms.rs`).

mod assign;
mod config;
mod fake_ring;
mod lease_ring;
mod ring;

pub use assign::{assign, member_lease_name, shard_lease_name};
pub use config::{ShardRing, ShardingConfig, ShardingError};
pub use fake_ring::FakeRing;
pub use lease_ring::{
    LAYOUT_LABEL, LeaseRing, RING_LABEL, ROLE_LABEL, RingLease, RingRole, RingStore, SHARD_LABEL,
};
pub(crate) use ring::{RingContext, Sharding};

#[cfg(test)]
mod tests;
