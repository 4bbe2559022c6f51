//! A ring's settings and their checks; [`ShardRing`] is a checked ring on a store.

use std::sync::Arc;
use std::time::Duration;

use thiserror::Error;

use super::lease_ring::RingStore;
use crate::cache::ShardScope;
use crate::leaderelection::{ConfigError, LeaderElectionConfig};

/// How a controller is sharded. Build with [`ShardingConfig::new`] and adjust the timings
/// (the Kubernetes component defaults, as for leader election).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardingConfig {
    /// The ring's name: prefix of its Leases' names and value of [`super::RING_LABEL`]. Lowercase
    /// letters, digits, `-` and `.`, as Lease names need.
    pub ring: String,
    /// How many shards the key space is split into (fixed for the ring's life; more shards
    /// than replicas lets load spread evenly, e.g. 4x the largest replica count you expect).
    pub shards: u32,
    /// This replica's identity, unique per process ([`crate::leaderelection::default_identity`]).
    pub identity: String,
    /// As [`LeaderElectionConfig::lease_duration`], for every Lease of the ring.
    pub lease_duration: Duration,
    /// As [`LeaderElectionConfig::renew_deadline`].
    pub renew_deadline: Duration,
    /// As [`LeaderElectionConfig::retry_period`]; also how often the ring is listed.
    pub retry_period: Duration,
    /// How long the members a replica sees must stay unchanged before a replica whose
    /// informers watch only its held shards ([`ShardRing::watch_held_shards`]) takes its
    /// first shards; capped at `lease_duration` after it joined. Replicas started together
    /// thus split the shards before any lists more than its share, even when a busy machine
    /// starts them more than a `retry_period` apart. Default 3 s, as Kafka's
    /// `group.initial.rebalance.delay.ms`. Without `watch_held_shards` it does not apply: a
    /// replica that caches everything takes shards at once, since a shard taken early and
    /// handed over costs no list.
    pub join_window: Duration,
}

/// A [`ShardingConfig`] that cannot work.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum ShardingError {
    /// `shards` is zero.
    #[error("sharding ring {ring:?}: shards must be at least 1")]
    NoShards {
        /// The ring's name.
        ring: String,
    },
    /// The ring name cannot prefix a Lease name.
    #[error(
        "sharding ring {ring:?}: the ring name must be 1-200 lowercase letters, digits, '-' or \
         '.', starting and ending with a letter or digit (it prefixes Lease names)"
    )]
    BadRingName {
        /// The ring's name.
        ring: String,
    },
    /// The shard scope given to [`ShardRing::watch_held_shards`] has another shard count.
    #[error("sharding ring {ring:?} has {shards} shards, its shard scope {scope}")]
    ScopeMismatch {
        /// The ring's name.
        ring: String,
        /// The ring's shard count.
        shards: u32,
        /// The scope's.
        scope: u32,
    },
    /// The lease timings are invalid (the same rules as leader election's).
    #[error(transparent)]
    Timing(#[from] ConfigError),
}

impl ShardingConfig {
    /// `shards` shards in the ring `ring`, contended for as `identity`, with the Kubernetes
    /// components' lease timings (15 s / 10 s / 2 s) and a join window of 3 s.
    pub fn new(ring: impl Into<String>, shards: u32, identity: impl Into<String>) -> Self {
        let defaults = LeaderElectionConfig::default();
        ShardingConfig {
            ring: ring.into(),
            shards,
            identity: identity.into(),
            lease_duration: defaults.lease_duration,
            renew_deadline: defaults.renew_deadline,
            retry_period: defaults.retry_period,
            // Kafka's group.initial.rebalance.delay.ms default.
            join_window: Duration::from_secs(3),
        }
    }

    /// The checks of leader election, plus a usable ring name and at least one shard.
    pub fn validate(&self) -> Result<(), ShardingError> {
        if self.shards == 0 {
            return Err(ShardingError::NoShards {
                ring: self.ring.clone(),
            });
        }
        let r = self.ring.as_bytes();
        let ok_char =
            |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-' || *c == b'.';
        let ok_end =
            |c: Option<&u8>| c.is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
        if r.is_empty()
            || r.len() > 200
            || !r.iter().all(ok_char)
            || !ok_end(r.first())
            || !ok_end(r.last())
        {
            return Err(ShardingError::BadRingName {
                ring: self.ring.clone(),
            });
        }
        self.election(&self.ring).validate()?;
        crate::leaderelection::config::validate_identity(&self.ring, &self.identity)?;
        Ok(())
    }

    /// The elector settings of one of the ring's Leases.
    pub(super) fn election(&self, name: &str) -> LeaderElectionConfig {
        LeaderElectionConfig {
            lease_duration: self.lease_duration,
            renew_deadline: self.renew_deadline,
            retry_period: self.retry_period,
            release_on_cancel: true,
            recontend: true,
            name: name.to_string(),
        }
    }
}

/// A validated ring on a store, for [`crate::runtime::Controller::sharding`].
pub struct ShardRing<R: RingStore> {
    pub(super) config: ShardingConfig,
    pub(super) store: Arc<R>,
    pub(super) scope: Option<ShardScope>,
}

impl<R: RingStore> ShardRing<R> {
    /// Checks `config` ([`ShardingConfig::validate`]).
    pub fn new(config: ShardingConfig, store: R) -> Result<Self, ShardingError> {
        config.validate()?;
        Ok(ShardRing {
            config,
            store: Arc::new(store),
            scope: None,
        })
    }

    /// Each replica caches only the shards it holds: keys are split by their namespace's
    /// hash range (the ranges of `scope`'s ring, [`crate::cache::HashRange::ring`]) instead
    /// of the hash of `namespace/name`, and the informers made with `scope`
    /// ([`crate::cache::FactoryOptions::shard_scope`]) ask the apiserver for the ranges of
    /// the shards this replica holds (KEP-5866; filtered here on a server without it). A
    /// shard's term opens only once those informers have listed its range, and a shard
    /// given up leaves the caches with the next list, after its term's reconciles ended.
    ///
    /// Every replica of a ring must agree on this: a ring sharded by key and one sharded by
    /// namespace assign keys differently.
    pub fn watch_held_shards(mut self, scope: ShardScope) -> Result<Self, ShardingError> {
        if scope.shards() != self.config.shards {
            return Err(ShardingError::ScopeMismatch {
                ring: self.config.ring.clone(),
                shards: self.config.shards,
                scope: scope.shards(),
            });
        }
        self.scope = Some(scope);
        Ok(self)
    }

    /// [`watch_held_shards`](Self::watch_held_shards) with a new scope of this ring's shard
    /// count ([`ShardScope::namespaces`]), unless the ring has a scope already. A controller
    /// makes its informers with the same scope, read back with
    /// [`shard_scope`](Self::shard_scope).
    pub fn with_shard_scope(self) -> Self {
        if self.scope.is_some() {
            return self;
        }
        // `new` checked that the ring has at least one shard.
        let scope = ShardScope::namespaces(self.config.shards).expect("a checked ring has shards");
        self.watch_held_shards(scope)
            .expect("a scope of the ring's own shard count")
    }

    /// The scope the ring watches the held shards with, if it does
    /// ([`watch_held_shards`](Self::watch_held_shards)): what the controller's informers
    /// must be made with ([`crate::cache::FactoryOptions::shard_scope`]).
    pub fn shard_scope(&self) -> Option<&ShardScope> {
        self.scope.as_ref()
    }

    /// How this replica splits keys into shards, as its member Lease says it
    /// ([`super::LAYOUT_LABEL`]): `keys-<shards>`, or `ns-<digest of the scope's bounds>`.
    pub fn layout(&self) -> String {
        match &self.scope {
            Some(scope) => format!("ns-{}", scope.bounds().digest()),
            None => format!("keys-{}", self.config.shards),
        }
    }

    /// The configuration this ring runs with.
    pub fn config(&self) -> &ShardingConfig {
        &self.config
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::FakeRing;

    fn ring(shards: u32) -> ShardRing<FakeRing> {
        ShardRing::new(ShardingConfig::new("vms", shards, "a"), FakeRing::new()).unwrap()
    }

    #[test]
    fn with_shard_scope_gives_a_scope_of_the_rings_shard_count_and_keeps_one_given() {
        assert!(ring(6).shard_scope().is_none(), "no scope unless asked");
        let scoped = ring(6).with_shard_scope();
        assert_eq!(scoped.shard_scope().map(ShardScope::shards), Some(6));

        let given = ShardScope::namespaces(6).unwrap();
        given.hold(2);
        let kept = ring(6)
            .watch_held_shards(given.clone())
            .unwrap()
            .with_shard_scope();
        assert_eq!(
            kept.shard_scope().map(ShardScope::held),
            Some(vec![2]),
            "the scope given is the one the informers must share"
        );
    }
}
