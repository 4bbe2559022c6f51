//! [`FakeRing`]: a sharded controller's Leases in memory, for unit tests of sharding without
//! an apiserver (the [`RingStore`] that [`LeaseRing`](super::LeaseRing) is on a cluster).

use std::collections::BTreeMap;
use std::sync::Arc;

use parking_lot::Mutex;

use super::lease_ring::{LAYOUT_LABEL, RingLease, RingRole, RingStore};
use crate::leaderelection::LockError;
use crate::testing::{FakeLock, FakeLockStore, Reach};

/// The Leases of shard rings, in memory: one [`FakeLockStore`] per Lease name, with its
/// labels, listed and deleted as [`crate::runtime::LeaseRing`] does on the apiserver.
/// Cheap to clone; clones share the Leases. [`FakeRing::set_reach`] cuts one identity off
/// every Lease of the ring, present and future (a replica whose renewals hang or fail).
#[derive(Clone, Default)]
pub struct FakeRing {
    inner: Arc<Mutex<FakeRingInner>>,
}

#[derive(Default)]
struct FakeRingInner {
    leases: BTreeMap<String, (FakeLockStore, BTreeMap<String, String>)>,
    reach: BTreeMap<String, Reach>,
}

impl FakeRing {
    /// A ring with no Leases.
    pub fn new() -> Self {
        Self::default()
    }

    /// How every Lease answers `identity` from now on.
    pub fn set_reach(&self, identity: &str, reach: Reach) {
        let mut inner = self.inner.lock();
        inner.reach.insert(identity.to_string(), reach);
        for (store, _) in inner.leases.values() {
            store.set_reach(identity, reach);
        }
    }

    /// The holder of the Lease `name` ("" if none or no such Lease).
    pub fn holder(&self, name: &str) -> String {
        self.inner
            .lock()
            .leases
            .get(name)
            .map(|(store, _)| store.holder())
            .unwrap_or_default()
    }
}

impl RingStore for FakeRing {
    type Lock = FakeLock;

    fn lock(&self, name: &str, identity: &str, labels: BTreeMap<String, String>) -> FakeLock {
        let mut inner = self.inner.lock();
        let reach = inner.reach.clone();
        let (store, kept) = inner.leases.entry(name.to_string()).or_insert_with(|| {
            let store = FakeLockStore::new();
            for (id, r) in &reach {
                store.set_reach(id, *r);
            }
            (store, BTreeMap::new())
        });
        // As LeaseLock's create and updates set them.
        kept.extend(labels);
        store.lock_for(identity)
    }

    async fn list(&self, ring: &str) -> Result<Vec<RingLease>, LockError> {
        let inner = self.inner.lock();
        Ok(inner
            .leases
            .iter()
            .filter_map(|(name, (store, labels))| {
                let role = RingRole::of(labels, ring)?;
                Some(RingLease {
                    name: name.clone(),
                    role,
                    record: store.record()?,
                    version: store.version()?.to_string(),
                    layout: labels.get(LAYOUT_LABEL).cloned(),
                })
            })
            .collect())
    }

    async fn delete(&self, name: &str, version: &str) -> Result<(), LockError> {
        let inner = self.inner.lock();
        let deleted = inner
            .leases
            .get(name)
            .zip(version.parse().ok())
            .is_some_and(|((store, _), v)| store.delete_if_version(v));
        if deleted {
            Ok(())
        } else {
            Err(LockError::Conflict {
                lock: name.to_string(),
            })
        }
    }
}
