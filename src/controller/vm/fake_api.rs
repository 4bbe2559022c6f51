//! An in-memory apiserver for VirtualMachines, for the phase machine's unit tests only. It
//! keeps what matters to the controller: resourceVersion preconditions (409), the status
//! subresource writing only the status, and deletion with finalizers (a deleting object goes
//! away when its last finalizer is removed). The real apiserver is exercised in
//! tests/vm_controller/.

use crate::runtime::ObjectKey;
use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::events::v1::Event as V1Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use parking_lot::Mutex;

use super::api::{ApiError, VmApi};
use super::types::{Phase, VirtualMachine};

#[derive(Clone, Default)]
pub struct FakeApi {
    inner: Arc<Mutex<Inner>>,
}

#[derive(Default)]
struct Inner {
    objects: BTreeMap<String, VirtualMachine>,
    resource_version: u64,
    /// The next this-many writes fail with 409 after a concurrent writer bumped the object.
    conflicts: u32,
    status_writes: usize,
    /// Informer copies that lag behind `objects` (see [`FakeApi::freeze_cache`]).
    frozen_cache: BTreeMap<String, VirtualMachine>,
    /// Keys the informer has not seen yet (see [`FakeApi::hide_from_cache`]).
    hidden_from_cache: std::collections::BTreeSet<String>,
    /// (phase, reason) of every successful status write, in order.
    history: Vec<(Phase, String)>,
}

impl Inner {
    fn bump(&mut self, vm: &mut VirtualMachine) {
        self.resource_version += 1;
        vm.metadata.resource_version = Some(self.resource_version.to_string());
    }

    /// The stored object for a write at `vm`'s resourceVersion, or the error the apiserver gives.
    fn precondition(
        &mut self,
        vm: &VirtualMachine,
        operation: &'static str,
    ) -> Result<VirtualMachine, ApiError> {
        let key = vm.key();
        let Some(mut stored) = self.objects.get(&key).cloned() else {
            return Err(ApiError::NotFound { vm: key, operation });
        };
        if self.conflicts > 0 {
            self.conflicts -= 1;
            self.bump(&mut stored);
            self.objects.insert(key.clone(), stored);
            return Err(ApiError::Conflict { vm: key, operation });
        }
        if stored.metadata.resource_version != vm.metadata.resource_version {
            return Err(ApiError::Conflict { vm: key, operation });
        }
        Ok(stored)
    }
}

impl FakeApi {
    pub fn new() -> Self {
        Self::default()
    }

    /// Creates `vm` (uid and resourceVersion assigned) and returns its key.
    pub fn create(&self, mut vm: VirtualMachine) -> ObjectKey {
        let mut inner = self.inner.lock();
        vm.metadata.uid = Some(format!("uid-{}", vm.name()));
        inner.bump(&mut vm);
        let key = vm.key();
        inner.objects.insert(key.clone(), vm);
        ObjectKey::parse(&key).expect("a VM's key")
    }

    /// `kubectl delete`: sets deletionTimestamp if finalizers remain, else removes the object.
    pub fn delete(&self, key: impl AsRef<str>) {
        let key = key.as_ref();
        let mut inner = self.inner.lock();
        let Some(mut vm) = inner.objects.remove(key) else {
            return;
        };
        if vm
            .metadata
            .finalizers
            .as_ref()
            .is_some_and(|f| !f.is_empty())
        {
            vm.metadata
                .deletion_timestamp
                .get_or_insert(Time(k8s_openapi::jiff::Timestamp::now()));
            inner.bump(&mut vm);
            inner.objects.insert(key.to_string(), vm);
        }
    }

    /// The stored object.
    pub fn object(&self, key: impl AsRef<str>) -> Option<VirtualMachine> {
        self.inner.lock().objects.get(key.as_ref()).cloned()
    }

    /// `kubectl edit` of the spec: stores `vm.spec` and bumps generation and resourceVersion.
    pub fn replace_spec(&self, vm: VirtualMachine) {
        let mut inner = self.inner.lock();
        let key = vm.key();
        let Some(mut stored) = inner.objects.get(&key).cloned() else {
            return;
        };
        stored.spec = vm.spec;
        stored.metadata.generation = Some(stored.metadata.generation.unwrap_or(1) + 1);
        inner.bump(&mut stored);
        inner.objects.insert(key, stored);
    }

    /// Makes `cached` return `vm` for `key` from now on, whatever is stored: an informer
    /// that has not seen the latest writes.
    pub fn freeze_cache(&self, key: impl AsRef<str>, vm: VirtualMachine) {
        self.inner
            .lock()
            .frozen_cache
            .insert(key.as_ref().to_string(), vm);
    }

    /// Makes `cached` answer `None` for `key`: an informer that has not seen it yet.
    pub fn hide_from_cache(&self, key: impl AsRef<str>) {
        self.inner
            .lock()
            .hidden_from_cache
            .insert(key.as_ref().to_string());
    }

    /// The next `n` writes fail with 409 (someone else wrote the object in between).
    pub fn inject_conflicts(&self, n: u32) {
        self.inner.lock().conflicts = n;
    }

    /// (phase, reason) of every status write so far.
    pub fn status_history(&self) -> Vec<(Phase, String)> {
        self.inner.lock().history.clone()
    }

    /// Status writes that succeeded.
    pub fn status_writes(&self) -> usize {
        self.inner.lock().status_writes
    }
}

impl VmApi for FakeApi {
    fn cached(&self, namespace: &str, name: &str) -> Option<Arc<VirtualMachine>> {
        let key = format!("{namespace}/{name}");
        let inner = self.inner.lock();
        if inner.hidden_from_cache.contains(&key) {
            return None;
        }
        inner
            .frozen_cache
            .get(&key)
            .or_else(|| inner.objects.get(&key))
            .cloned()
            .map(Arc::new)
    }

    async fn get(&self, namespace: &str, name: &str) -> Result<Option<VirtualMachine>, ApiError> {
        Ok(self
            .inner
            .lock()
            .objects
            .get(&format!("{namespace}/{name}"))
            .cloned())
    }

    async fn patch_finalizers(
        &self,
        vm: &VirtualMachine,
        finalizers: Vec<String>,
    ) -> Result<VirtualMachine, ApiError> {
        let mut inner = self.inner.lock();
        let mut stored = inner.precondition(vm, "finalizer patch")?;
        stored.metadata.finalizers = Some(finalizers);
        inner.bump(&mut stored);
        let key = stored.key();
        let gone = stored.metadata.deletion_timestamp.is_some()
            && stored
                .metadata
                .finalizers
                .as_ref()
                .is_some_and(|f| f.is_empty());
        if gone {
            inner.objects.remove(&key);
        } else {
            inner.objects.insert(key, stored.clone());
        }
        Ok(stored)
    }

    async fn replace_status(&self, vm: &VirtualMachine) -> Result<VirtualMachine, ApiError> {
        let mut inner = self.inner.lock();
        let mut stored = inner.precondition(vm, "status update")?;
        stored.status = vm.status.clone();
        inner.bump(&mut stored);
        inner.status_writes += 1;
        let entry = stored
            .status
            .as_ref()
            .map(|s| (s.phase, s.reason.clone()))
            .unwrap_or_default();
        inner.history.push(entry);
        inner.objects.insert(stored.key(), stored.clone());
        Ok(stored)
    }
}

/// Events as a test sees them: (type, reason, message) of each Event written, in order.
#[derive(Clone, Default)]
pub struct MemoryEvents {
    events: Arc<Mutex<Vec<V1Event>>>,
}

impl MemoryEvents {
    /// (type, reason, note) of every Event created so far (a repeat counts once).
    pub fn seen(&self) -> Vec<(String, String, String)> {
        self.events
            .lock()
            .iter()
            .map(|e| {
                (
                    e.type_.clone().unwrap_or_default(),
                    e.reason.clone().unwrap_or_default(),
                    e.note.clone().unwrap_or_default(),
                )
            })
            .collect()
    }
}

impl crate::record::EventsV1Sink for MemoryEvents {
    async fn create(&self, event: &V1Event) -> Result<(), crate::record::RecordError> {
        self.events.lock().push(event.clone());
        Ok(())
    }

    async fn patch_series(&self, _event: &V1Event) -> Result<(), crate::record::RecordError> {
        Ok(())
    }
}
