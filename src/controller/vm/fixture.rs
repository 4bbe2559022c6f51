//! What the VM unit tests set up again and again, in one place: a [`FakeDriver`] and a
//! [`FakeApi`] with a [`Reconciler`] over them ([`VmFixture`]), the VM most tests use
//! (`ns/vm`, 1 CPU, 1 GiB, its server [`SERVER`]), and what the tests read back from the fake
//! apiserver (phase, reason, a condition). Test-only (`#[cfg(test)]` in `mod.rs`); the
//! real-cluster tests have their own set-up in `tests/vm_common`.

use std::sync::Arc;
use std::time::Duration;

use super::driver::{FakeDriver, ServerSpec, server_name};
use super::error_policy::ReconcileError;
use super::fake_api::{FakeApi, MemoryEvents};
use super::reconcile::{Reconciler, ReconcilerConfig};
use super::types::{Phase, VirtualMachine, VirtualMachineStatus};
use crate::record::{AnyEventRecorder, EventsV1Broadcaster, EventsV1Config};
use crate::runtime::{Action, ObjectKey, ReconcileContext};

/// The fixture reconciler's `refresh_interval`: an Active VM is requeued after this. The
/// same as [`super::reconcile::DEFAULT_REFRESH_INTERVAL`] today, but the tests name their own.
pub const REFRESH: Duration = Duration::from_secs(20);

/// The server of [`VmFixture::create_vm`]'s VM, `ns/vm`.
pub const SERVER: &str = "kubeloop-vm_ns_vm";

/// A reconciler over in-memory fakes, with handles on both fakes to steer and inspect them.
/// The driver and the API are clones of the ones the reconciler owns (they share state).
pub struct VmFixture {
    pub driver: FakeDriver,
    pub api: FakeApi,
    /// In an `Arc` so that a test can run a reconcile in a task of its own, or give it to
    /// workers.
    pub reconciler: Arc<Reconciler<FakeDriver, FakeApi>>,
    /// With [`VmFixture::with_events`]: the broadcaster the reconciler records through and the
    /// sink it writes to.
    events: Option<(EventsV1Broadcaster, MemoryEvents)>,
}

impl VmFixture {
    /// No VM yet, a refresh every [`REFRESH`], no events recorded.
    pub fn new() -> Self {
        let (driver, api) = (FakeDriver::new(), FakeApi::new());
        let reconciler = Self::reconciler(&driver, &api);
        Self {
            driver,
            api,
            reconciler: Arc::new(reconciler),
            events: None,
        }
    }

    /// As [`VmFixture::new`], and the reconciler records Events into memory (read them with
    /// [`VmFixture::events`]). Needs a tokio runtime (the broadcaster's writer is a task).
    pub fn with_events() -> Self {
        let (driver, api) = (FakeDriver::new(), FakeApi::new());
        let sink = MemoryEvents::default();
        let broadcaster = EventsV1Broadcaster::start(sink.clone(), EventsV1Config::default());
        let recorder = broadcaster.new_recorder_as("vm-controller", "vm-controller-test");
        let reconciler =
            Self::reconciler(&driver, &api).with_recorder(AnyEventRecorder::V1(recorder));
        Self {
            driver,
            api,
            reconciler: Arc::new(reconciler),
            events: Some((broadcaster, sink)),
        }
    }

    fn reconciler(driver: &FakeDriver, api: &FakeApi) -> Reconciler<FakeDriver, FakeApi> {
        Reconciler::new(
            driver.clone(),
            api.clone(),
            ReconcilerConfig {
                refresh_interval: REFRESH,
                ..ReconcilerConfig::default()
            },
        )
    }

    /// Creates VM `ns/vm` asking for 1 CPU and 1 GiB (uid `uid-vm`, server [`SERVER`]).
    pub fn create_vm(&self) -> ObjectKey {
        self.api
            .create(VirtualMachine::namespaced("ns", "vm", "1", "1Gi"))
    }

    /// One reconcile of `key` with a context that stays entitled.
    pub async fn reconcile(&self, key: &ObjectKey) -> Result<Action, ReconcileError> {
        self.reconciler.reconcile(key, &ctx()).await
    }

    /// Flushes the Events recorded so far and returns (type, reason, message) of each; after
    /// this the reconciler records no more. Panics without [`VmFixture::with_events`].
    pub async fn events(&self) -> Vec<(String, String, String)> {
        let (broadcaster, sink) = self
            .events
            .as_ref()
            .expect("a fixture made with VmFixture::with_events");
        broadcaster.shutdown().await;
        sink.seen()
    }

    /// The stored VM's status (panics if there is no VM or no status).
    pub fn status(&self, key: impl AsRef<str>) -> VirtualMachineStatus {
        self.api
            .object(key)
            .and_then(|vm| vm.status)
            .expect("a VM with a status")
    }

    /// The stored VM's phase.
    pub fn phase(&self, key: impl AsRef<str>) -> Phase {
        self.api.object(key).expect("object exists").phase()
    }

    /// The stored VM's `status.reason` ("" without a status).
    pub fn reason(&self, key: impl AsRef<str>) -> String {
        self.api
            .object(key)
            .and_then(|o| o.status)
            .map(|s| s.reason)
            .unwrap_or_default()
    }

    /// (status, reason, message) of the stored VM's condition `type_`.
    pub fn condition(&self, key: impl AsRef<str>, type_: &str) -> (String, String, String) {
        let c = self
            .status(key)
            .conditions
            .into_iter()
            .find(|c| c.type_ == type_)
            .unwrap();
        (c.status, c.reason, c.message)
    }

    /// The stored VM with its phase set to `phase` (to write back as a status).
    pub fn vm_with_phase(&self, key: impl AsRef<str>, phase: Phase) -> VirtualMachine {
        let mut vm = self.api.object(key).unwrap();
        vm.status.get_or_insert_with(Default::default).phase = phase;
        vm
    }
}

/// A context that stays entitled.
pub fn ctx() -> ReconcileContext {
    ReconcileContext::detached()
}

/// The spec of VM `ns/name`'s server labelled with `uid`, at 1 CPU and 1 GiB (what
/// [`VmFixture::create_vm`]'s VM asks for).
pub fn server_spec(ns: &str, name: &str, uid: &str) -> ServerSpec {
    ServerSpec {
        name: server_name(ns, name),
        vm_namespace: ns.into(),
        vm_name: name.into(),
        vm_uid: uid.into(),
        cpu_millis: 1000,
        memory_bytes: 1 << 30,
    }
}

/// Lets spawned tasks run (the tests run on one thread).
pub async fn settle() {
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
}
