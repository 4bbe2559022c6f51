//! Where a ring's Leases live, and how a Lease says what it stands for: the labels of a
//! ring's Leases, [`RingRole`], the [`RingStore`] trait and its apiserver implementation
//! [`LeaseRing`].

use std::collections::BTreeMap;

use k8s_openapi::api::coordination::v1::Lease;
use kube_client::Client;
use kube_client::api::{Api, DeleteParams, ListParams, Preconditions};

use crate::leaderelection::{
    LeaderElectionRecord, LeaseLock, LockError, ResourceLock, lease_spec_to_record,
};

/// Label naming the ring a Lease belongs to.
pub const RING_LABEL: &str = "kubeloop.dev/ring";
/// Label saying what a ring's Lease is: `shard` or `member`.
pub const ROLE_LABEL: &str = "kubeloop.dev/ring-role";
/// Label carrying a shard Lease's shard number.
pub const SHARD_LABEL: &str = "kubeloop.dev/shard";
/// Label of a member Lease naming how its replica splits keys into shards: `keys-<shards>`
/// for the hash of `namespace/name`, `ns-<digest>` for namespace-hash ranges
/// ([`crate::cache::ShardBounds::digest`]). Replicas of one ring must agree on it.
pub const LAYOUT_LABEL: &str = "kubeloop.dev/shard-layout";

/// One Lease of a ring, as listed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RingLease {
    /// The Lease's name.
    pub name: String,
    /// What it stands for (from its labels).
    pub role: RingRole,
    /// Its holder record.
    pub record: LeaderElectionRecord,
    /// Changes with every write (the resourceVersion).
    pub version: String,
    /// Its [`LAYOUT_LABEL`], if it has one.
    pub layout: Option<String>,
}

/// What a ring's Lease stands for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RingRole {
    /// A replica's membership Lease (one per replica).
    Member,
    /// The Lease of shard N (0-based).
    Shard(u32),
}

impl RingRole {
    /// The labels a Lease of `ring` in this role is created with.
    pub fn labels(self, ring: &str) -> BTreeMap<String, String> {
        let mut labels = BTreeMap::from([(RING_LABEL.to_string(), ring.to_string())]);
        match self {
            RingRole::Member => {
                labels.insert(ROLE_LABEL.to_string(), "member".to_string());
            }
            RingRole::Shard(shard) => {
                labels.insert(ROLE_LABEL.to_string(), "shard".to_string());
                labels.insert(SHARD_LABEL.to_string(), shard.to_string());
            }
        }
        labels
    }

    /// The role a Lease's labels give it, if they make it a Lease of `ring`.
    pub fn of(labels: &BTreeMap<String, String>, ring: &str) -> Option<RingRole> {
        if labels.get(RING_LABEL).map(String::as_str) != Some(ring) {
            return None;
        }
        match labels.get(ROLE_LABEL).map(String::as_str) {
            Some("member") => Some(RingRole::Member),
            Some("shard") => Some(RingRole::Shard(labels.get(SHARD_LABEL)?.parse().ok()?)),
            _ => None,
        }
    }
}

/// Where a ring's Leases live: the apiserver ([`LeaseRing`]) or, in unit tests,
/// [`FakeRing`](super::FakeRing).
pub trait RingStore: Send + Sync + 'static {
    /// The lock type of one Lease.
    type Lock: ResourceLock;
    /// A lock on the Lease `name` for `identity`, creating it with `labels`.
    fn lock(&self, name: &str, identity: &str, labels: BTreeMap<String, String>) -> Self::Lock;
    /// Every Lease of `ring`.
    fn list(&self, ring: &str) -> impl Future<Output = Result<Vec<RingLease>, LockError>> + Send;
    /// Deletes the Lease `name` if it is still at `version`.
    fn delete(
        &self,
        name: &str,
        version: &str,
    ) -> impl Future<Output = Result<(), LockError>> + Send;
}

/// A ring on the apiserver's coordination.k8s.io/v1 Leases in one namespace.
#[derive(Clone)]
pub struct LeaseRing {
    client: Client,
    namespace: String,
}

impl LeaseRing {
    /// The ring's Leases in `namespace`.
    pub fn new(client: Client, namespace: &str) -> Self {
        LeaseRing {
            client,
            namespace: namespace.to_string(),
        }
    }
}

impl RingStore for LeaseRing {
    type Lock = LeaseLock;

    fn lock(&self, name: &str, identity: &str, labels: BTreeMap<String, String>) -> LeaseLock {
        LeaseLock::new(self.client.clone(), &self.namespace, name, identity).with_labels(labels)
    }

    async fn list(&self, ring: &str) -> Result<Vec<RingLease>, LockError> {
        let api: Api<Lease> = Api::namespaced(self.client.clone(), &self.namespace);
        let list = api
            .list(&ListParams::default().labels(&format!("{RING_LABEL}={ring}")))
            .await
            .map_err(|source| LockError::Get {
                lock: format!("leases -l {RING_LABEL}={ring} in {}", self.namespace),
                source,
            })?;
        Ok(list
            .items
            .into_iter()
            .filter_map(|lease| {
                let labels = lease.metadata.labels.as_ref()?;
                let role = RingRole::of(labels, ring)?;
                let layout = labels.get(LAYOUT_LABEL).cloned();
                Some(RingLease {
                    layout,
                    name: lease.metadata.name.clone()?,
                    role,
                    record: lease_spec_to_record(&lease.spec.clone().unwrap_or_default()),
                    version: lease.metadata.resource_version.clone()?,
                })
            })
            .collect())
    }

    async fn delete(&self, name: &str, version: &str) -> Result<(), LockError> {
        let api: Api<Lease> = Api::namespaced(self.client.clone(), &self.namespace);
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                resource_version: Some(version.to_string()),
                uid: None,
            }),
            ..DeleteParams::default()
        };
        match api.delete(name, &params).await {
            Ok(_) => Ok(()),
            Err(source) => Err(LockError::Update {
                lock: format!("{}/{name}", self.namespace),
                source,
            }),
        }
    }
}
