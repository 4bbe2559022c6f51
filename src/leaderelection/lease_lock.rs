//! The coordination.k8s.io/v1 Lease lock (client-go: `resourcelock/leaselock.go`).
//!
//! Invariant: `Inner::lease` is the object as last returned by the apiserver (from get, create or
//! update). `update` writes the new spec onto *that* object, so the PUT carries its
//! resourceVersion and the apiserver rejects it with 409 if anyone wrote since: a lost race
//! surfaces as [`LockError::Conflict`], never as a silent overwrite.
//!
//! `Inner::written_version` is the resourceVersion of this lock's own last successful create or
//! update, so that after a `get` the lock can tell whether the object is still its own write
//! ([`ResourceLock::last_read_is_own_write`]) or was rewritten by someone else, even by a process
//! using the same identity.
//!
//! The parking_lot lock is never held across an `.await`: the object is cloned out, the request
//! is made, and the answer stored back.
//!
//! Creates and updates go as protobuf ([`WriteApi`]), as client-go's typed Lease client sends
//! them; the read is kube-client's `Api` (JSON).

use k8s_openapi::api::coordination::v1::Lease;
use kube_client::api::{Api, ObjectMeta};
use kube_client::{Client, Error as KubeError};
use parking_lot::Mutex;

use crate::client::WriteApi;

use super::resource_lock::{
    LeaderElectionRecord, LockError, ResourceLock, lease_spec_to_record, record_to_lease_spec,
};

/// A Lease named `namespace/name`, contended for by `identity`.
pub struct LeaseLock {
    api: Api<Lease>,
    writes: WriteApi<Lease>,
    namespace: String,
    name: String,
    identity: String,
    /// Labels written when this lock creates the Lease (a ring's Leases carry their role).
    labels: std::collections::BTreeMap<String, String>,
    inner: Mutex<Inner>,
}

struct Inner {
    /// The object last returned by the apiserver; `None` until the first get or create.
    lease: Option<Lease>,
    /// resourceVersion of the object returned by our last successful create or update.
    written_version: Option<String>,
}

impl LeaseLock {
    /// A lock on the Lease `namespace/name` for the candidate `identity`. The identity is
    /// checked (non-empty) when the elector is built.
    pub fn new(client: Client, namespace: &str, name: &str, identity: &str) -> Self {
        Self {
            writes: WriteApi::new(client.clone()),
            api: Api::namespaced(client, namespace),
            namespace: namespace.to_string(),
            name: name.to_string(),
            identity: identity.to_string(),
            labels: Default::default(),
            inner: Mutex::new(Inner {
                lease: None,
                written_version: None,
            }),
        }
    }

    /// Labels to put on the Lease when this lock creates it, and to set on it at each update
    /// (an existing Lease keeps its other labels).
    pub fn with_labels(mut self, labels: std::collections::BTreeMap<String, String>) -> Self {
        self.labels = labels;
        self
    }

    fn store(&self, lease: Lease) {
        self.inner.lock().lease = Some(lease);
    }

    /// Stores the answer to our own write and remembers its resourceVersion.
    fn store_written(&self, lease: Lease) {
        let mut inner = self.inner.lock();
        inner.written_version = lease.metadata.resource_version.clone();
        inner.lease = Some(lease);
    }
}

fn is_status(err: &KubeError, pred: impl Fn(&kube_client::core::Status) -> bool) -> bool {
    matches!(err, KubeError::Api(status) if pred(status))
}

impl ResourceLock for LeaseLock {
    async fn get(&self) -> Result<Option<LeaderElectionRecord>, LockError> {
        match self.api.get(&self.name).await {
            Ok(lease) => {
                let record = lease_spec_to_record(&lease.spec.clone().unwrap_or_default());
                self.store(lease);
                Ok(Some(record))
            }
            Err(e) if is_status(&e, |s| s.is_not_found()) => Ok(None),
            Err(source) => Err(LockError::Get {
                lock: self.describe(),
                source,
            }),
        }
    }

    async fn create(&self, record: &LeaderElectionRecord) -> Result<(), LockError> {
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                namespace: Some(self.namespace.clone()),
                labels: (!self.labels.is_empty()).then(|| self.labels.clone()),
                ..Default::default()
            },
            spec: Some(record_to_lease_spec(record)),
        };
        match self.writes.create(&lease).await {
            Ok(created) => {
                self.store_written(created);
                Ok(())
            }
            Err(e) if is_status(&e, |s| s.is_already_exists()) => Err(LockError::AlreadyExists {
                lock: self.describe(),
            }),
            Err(source) => Err(LockError::Create {
                lock: self.describe(),
                source,
            }),
        }
    }

    async fn update(&self, record: &LeaderElectionRecord) -> Result<(), LockError> {
        let Some(mut lease) = self.inner.lock().lease.clone() else {
            return Err(LockError::NotInitialized {
                lock: self.describe(),
            });
        };
        lease.spec = Some(record_to_lease_spec(record));
        if !self.labels.is_empty() {
            let labels = lease.metadata.labels.get_or_insert_default();
            labels.extend(self.labels.iter().map(|(k, v)| (k.clone(), v.clone())));
        }
        match self.writes.replace(&lease).await {
            Ok(updated) => {
                self.store_written(updated);
                Ok(())
            }
            Err(e) if is_status(&e, |s| s.is_conflict()) => Err(LockError::Conflict {
                lock: self.describe(),
            }),
            Err(source) => Err(LockError::Update {
                lock: self.describe(),
                source,
            }),
        }
    }

    fn last_read_is_own_write(&self) -> bool {
        let inner = self.inner.lock();
        let read = inner
            .lease
            .as_ref()
            .and_then(|l| l.metadata.resource_version.as_ref());
        read.is_some() && read == inner.written_version.as_ref()
    }

    fn identity(&self) -> &str {
        &self.identity
    }

    fn describe(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// The Lease, with the uid of its last read or write once there was one.
    fn reference(&self) -> Option<k8s_openapi::api::core::v1::ObjectReference> {
        let uid = self
            .inner
            .lock()
            .lease
            .as_ref()
            .and_then(|l| l.metadata.uid.clone());
        Some(k8s_openapi::api::core::v1::ObjectReference {
            api_version: Some("coordination.k8s.io/v1".into()),
            kind: Some("Lease".into()),
            namespace: Some(self.namespace.clone()),
            name: Some(self.name.clone()),
            uid,
            ..Default::default()
        })
    }
}
