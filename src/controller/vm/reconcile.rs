//! The phase machine of one VirtualMachine (controller101's `controller.go` `syncHandler`,
//! `createServer`, `updateUsage`, `cleanup`), run by a worker for one `namespace/name` key.
//!
//! ```text
//!   ""  --finalizer patched--> Creating --create ok--> Active --every refresh_interval--> Active
//!                                 |                       |  server vanished: Failed(reason) -> Creating
//!                                 +--create fails--> Failed(reason) --rate-limited retry--> ...
//!   any phase + deletionTimestamp --> Terminating --server deleted--> finalizer removed (gone)
//! ```
//!
//! Rules (each fixes a bug of controller101, see SPEC.md section 8):
//! - The finalizer is added by a metadata patch BEFORE anything is created, so a VM deleted in
//!   any phase, even Creating, gets its server deleted.
//! - Creation adopts a server that already exists (same name), so a VM is never stuck in
//!   Creating because an earlier attempt created the container.
//! - Every driver error is returned (none ignored), after recording `Failed` with a reason that
//!   names the engine; the worker retries with backoff (see [`super::error_policy`]).
//! - An Active VM is requeued after `refresh_interval` to refresh usage and notice a vanished
//!   server; the requeue ends when the object is gone.
//! - Status writes go through the status subresource with conflict retry ([`super::api`]).
//! - Beyond controller101: a server whose limits differ from the spec (the spec was edited) is
//!   recreated with the new limits, since podman's Docker API has no live `update`.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use tracing::{debug, info, warn};

use super::api::{VmApi, set_finalizer, write_status};
use super::driver::{
    Driver, DriverError, ServerSpec, ServerStatus as DriverServerStatus, server_name,
};
use super::error_policy::ReconcileError;
use super::quantity::{Resources, resources_of};
use super::types::{Phase, ServerStatus, ServerUsage, VirtualMachine, VirtualMachineStatus};
pub use crate::controller::worker::Action;
use crate::record::{EventRecorder, EventType};

/// controller101 refreshed usage on a 20-30 s resync; we requeue each Active VM after this.
pub const DEFAULT_REFRESH_INTERVAL: Duration = Duration::from_secs(20);

/// Settings of the phase machine.
#[derive(Clone, Debug)]
pub struct ReconcilerConfig {
    /// How often an Active VM's usage is refreshed (`--refresh-interval`).
    pub refresh_interval: Duration,
}

impl Default for ReconcilerConfig {
    fn default() -> Self {
        Self {
            refresh_interval: DEFAULT_REFRESH_INTERVAL,
        }
    }
}

/// Reconciles VirtualMachines with a driver `D` through an apiserver `A`.
pub struct Reconciler<D, A> {
    driver: D,
    api: A,
    config: ReconcilerConfig,
    /// Events for `kubectl describe vm` (none in unit tests).
    recorder: Option<EventRecorder>,
}

impl<D: Driver, A: VmApi> Reconciler<D, A> {
    pub fn new(driver: D, api: A, config: ReconcilerConfig) -> Self {
        Self {
            driver,
            api,
            config,
            recorder: None,
        }
    }

    /// Also records Kubernetes Events about the VMs.
    pub fn with_recorder(mut self, recorder: EventRecorder) -> Self {
        self.recorder = Some(recorder);
        self
    }

    fn event(&self, vm: &VirtualMachine, event_type: EventType, reason: &str, message: &str) {
        if let Some(recorder) = &self.recorder {
            recorder.event(vm, event_type, reason, message);
        }
    }

    /// The driver (for tests and wiring).
    pub fn driver(&self) -> &D {
        &self.driver
    }

    /// One pass over the VM named by `key`.
    pub async fn reconcile(&self, key: &str) -> Result<Action, ReconcileError> {
        let Some((namespace, name)) = key
            .split_once('/')
            .filter(|(ns, n)| !ns.is_empty() && !n.is_empty() && !n.contains('/'))
        else {
            return Err(ReconcileError::InvalidKey {
                key: key.to_string(),
            });
        };
        let Some(cached) = self.api.cached(namespace, name) else {
            // Deleted (and, if it was ours, finalized): nothing to do, and nothing to requeue.
            debug!(vm = key, "VirtualMachine no longer exists");
            return Ok(Action::Done);
        };
        let vm = VirtualMachine::clone(&cached);
        if vm.is_deleting() {
            return self.finalize(vm).await;
        }
        let Some(vm) = set_finalizer(&self.api, &vm, true).await? else {
            return Ok(Action::Done);
        };
        // After a conflict the patch re-read the object, which may be deleting by now.
        if vm.is_deleting() {
            return self.finalize(vm).await;
        }
        self.ensure_server(vm).await
    }

    /// Creates, adopts, restarts or refreshes the VM's server.
    async fn ensure_server(&self, vm: VirtualMachine) -> Result<Action, ReconcileError> {
        let resources = match resources_of(&vm) {
            Ok(r) => r,
            Err(invalid) => {
                // The schema should have refused it; say so on the object and wait for an edit.
                warn!(error = %invalid, "invalid VirtualMachine spec");
                self.event(&vm, EventType::Warning, "InvalidSpec", &invalid.to_string());
                self.set_status(&vm, failed(&vm, invalid.to_string()))
                    .await?;
                return Ok(Action::Done);
            }
        };
        let server = server_name(vm.namespace(), vm.name());
        let observed = match self.driver.server_status(&server).await {
            Ok(observed) => observed,
            Err(e) => return self.fail(&vm, e).await,
        };
        let mut vm = vm;
        let mut recreate = false;
        let reason = match observed {
            Some(status) if status.running && limits_match(&status, &resources) => {
                return self.set_active(&vm, &status).await;
            }
            Some(status) if status.running => {
                // podman's Docker API has no `update`: a resize is a cold restart.
                recreate = true;
                let resize = format!(
                    "server {server} has cpu {}m and memory {} bytes but the spec asks for cpu {}m and memory {} bytes; recreating it",
                    status.cpu_millis,
                    status.memory_bytes,
                    resources.cpu_millis,
                    resources.memory_bytes
                );
                info!(vm = %vm.key(), "{resize}");
                self.event(&vm, EventType::Normal, "Resizing", &resize);
                resize
            }
            Some(status) => format!("server {server} is {}; starting it", status.state),
            None => match vm.status.as_ref().and_then(|s| s.server.as_ref()) {
                Some(previous) if vm.phase() != Phase::Creating => {
                    let vanished = format!(
                        "server {server} (id {}) vanished; recreating it",
                        previous.id
                    );
                    warn!(vm = %vm.key(), "{vanished}");
                    self.event(&vm, EventType::Warning, "ServerVanished", &vanished);
                    let status = failed(&vm, vanished.clone());
                    let Some(updated) = self.set_status(&vm, status).await? else {
                        return Ok(Action::Done);
                    };
                    vm = updated;
                    vanished
                }
                _ => format!("creating server {server}"),
            },
        };
        let creating = VirtualMachineStatus {
            phase: Phase::Creating,
            reason,
            server: None,
            last_update_time: Some(now()),
        };
        // The write may have re-read the object after a conflict: if that fresh copy is being
        // deleted, creating a server now would only leak it; finalize instead.
        let Some(vm) = self.set_status(&vm, creating).await? else {
            return Ok(Action::Done);
        };
        if vm.is_deleting() {
            return self.finalize(vm).await;
        }
        if recreate && let Err(e) = self.driver.delete_server(&server).await {
            return self.fail(&vm, e).await;
        }
        let spec = ServerSpec {
            name: server,
            vm_namespace: vm.namespace().to_string(),
            vm_name: vm.name().to_string(),
            vm_uid: vm.uid().to_string(),
            cpu_millis: resources.cpu_millis,
            memory_bytes: resources.memory_bytes,
        };
        match self.driver.create_server(&spec).await {
            Ok(status) => {
                info!(vm = %vm.key(), server = %spec.name, id = %status.id, "server running");
                self.event(
                    &vm,
                    EventType::Normal,
                    "ServerRunning",
                    &format!("server {} (id {}) is running", spec.name, status.id),
                );
                self.set_active(&vm, &status).await
            }
            Err(e) => self.fail(&vm, e).await,
        }
    }

    /// Deletion requested: Terminating, delete the server, then let the object go.
    async fn finalize(&self, vm: VirtualMachine) -> Result<Action, ReconcileError> {
        if !vm.has_finalizer() {
            return Ok(Action::Done);
        }
        let server = server_name(vm.namespace(), vm.name());
        let mut vm = vm;
        if vm.phase() != Phase::Terminating {
            let terminating = VirtualMachineStatus {
                phase: Phase::Terminating,
                reason: format!("deleting server {server}"),
                server: vm.status.as_ref().and_then(|s| s.server.clone()),
                last_update_time: Some(now()),
            };
            let Some(updated) = self.set_status(&vm, terminating).await? else {
                return Ok(Action::Done);
            };
            vm = updated;
        }
        if let Err(e) = self.driver.delete_server(&server).await {
            let mut status = vm.status.clone().unwrap_or_default();
            status.reason = format!("deleting server {server} failed: {e}");
            status.last_update_time = Some(now());
            if vm.status.as_ref().map(|s| &s.reason) != Some(&status.reason) {
                self.set_status(&vm, status).await?;
            }
            return Err(ReconcileError::Driver {
                vm: vm.key(),
                source: e,
            });
        }
        info!(vm = %vm.key(), server = %server, "server deleted; removing the finalizer");
        self.event(
            &vm,
            EventType::Normal,
            "ServerDeleted",
            &format!("server {server} deleted"),
        );
        set_finalizer(&self.api, &vm, false).await?;
        Ok(Action::Done)
    }

    async fn set_active(
        &self,
        vm: &VirtualMachine,
        server: &DriverServerStatus,
    ) -> Result<Action, ReconcileError> {
        let active = VirtualMachineStatus {
            phase: Phase::Active,
            reason: String::new(),
            server: Some(ServerStatus {
                id: server.id.clone(),
                state: server.state.clone(),
                usage: ServerUsage {
                    cpu: round2(server.cpu_percent),
                    memory: round2(server.memory_percent),
                },
            }),
            last_update_time: Some(now()),
        };
        match self.set_status(vm, active).await? {
            Some(_) => Ok(Action::RequeueAfter(self.config.refresh_interval)),
            None => Ok(Action::Done),
        }
    }

    /// Records `Failed` with the driver error as the reason (unless already recorded) and
    /// returns the error so the key is retried with backoff.
    async fn fail(
        &self,
        vm: &VirtualMachine,
        error: DriverError,
    ) -> Result<Action, ReconcileError> {
        warn!(vm = %vm.key(), %error, "driver call failed");
        let status = failed(vm, error.to_string());
        let unchanged = vm
            .status
            .as_ref()
            .is_some_and(|s| s.phase == Phase::Failed && s.reason == status.reason);
        if !unchanged {
            self.event(vm, EventType::Warning, "Failed", &status.reason);
            self.set_status(vm, status).await?;
        }
        Err(ReconcileError::Driver {
            vm: vm.key(),
            source: error,
        })
    }

    async fn set_status(
        &self,
        vm: &VirtualMachine,
        status: VirtualMachineStatus,
    ) -> Result<Option<VirtualMachine>, ReconcileError> {
        debug!(vm = %vm.key(), phase = %status.phase, reason = %status.reason, "writing status");
        Ok(write_status(&self.api, vm, status).await?)
    }
}

/// True if the server's limits are what the spec asks for (0 = the engine did not say).
fn limits_match(server: &DriverServerStatus, wanted: &Resources) -> bool {
    let cpu_ok = server.cpu_millis == 0 || server.cpu_millis == wanted.cpu_millis;
    let memory_ok = server.memory_bytes == 0 || server.memory_bytes == wanted.memory_bytes;
    cpu_ok && memory_ok
}

/// A Failed status that keeps the last known server (its id says which one failed).
fn failed(vm: &VirtualMachine, reason: String) -> VirtualMachineStatus {
    VirtualMachineStatus {
        phase: Phase::Failed,
        reason,
        server: vm.status.as_ref().and_then(|s| s.server.clone()),
        last_update_time: Some(now()),
    }
}

fn now() -> Time {
    Time(k8s_openapi::jiff::Timestamp::now())
}

/// Two decimals are plenty for a percentage column.
fn round2(x: f64) -> f64 {
    if x.is_finite() {
        (x * 100.0).round() / 100.0
    } else {
        0.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::vm::driver::FakeDriver;
    use crate::controller::vm::fake_api::FakeApi;
    use crate::controller::vm::types::FINALIZER;

    const REFRESH: Duration = Duration::from_secs(20);

    fn setup() -> (Reconciler<FakeDriver, FakeApi>, FakeDriver, FakeApi) {
        let driver = FakeDriver::new();
        let api = FakeApi::new();
        let reconciler = Reconciler::new(
            driver.clone(),
            api.clone(),
            ReconcilerConfig {
                refresh_interval: REFRESH,
            },
        );
        (reconciler, driver, api)
    }

    fn phase(api: &FakeApi, key: &str) -> Phase {
        api.object(key).expect("object exists").phase()
    }

    fn reason(api: &FakeApi, key: &str) -> String {
        api.object(key)
            .and_then(|o| o.status)
            .map(|s| s.reason)
            .unwrap_or_default()
    }

    const SERVER: &str = "kubeloop-vm_ns_vm";

    fn vm_with_phase(api: &FakeApi, key: &str, phase: Phase) -> VirtualMachine {
        let mut vm = api.object(key).unwrap();
        vm.status.get_or_insert_with(Default::default).phase = phase;
        vm
    }

    #[tokio::test]
    async fn a_new_vm_gets_the_finalizer_then_a_server_and_becomes_active_with_a_timed_requeue() {
        let (r, driver, api) = setup();
        let key = api.create(VirtualMachine::new("ns", "vm", "2", "4G"));
        assert_eq!(r.reconcile(&key).await, Ok(Action::RequeueAfter(REFRESH)));
        let vm = api.object(&key).unwrap();
        assert!(vm.has_finalizer());
        assert_eq!(vm.phase(), Phase::Active);
        let server = driver.server(SERVER).expect("server created");
        assert_eq!(
            (server.spec.cpu_millis, server.spec.memory_bytes),
            (2000, 4_000_000_000)
        );
        assert_eq!(server.spec.vm_uid, "uid-vm");
        assert_eq!(vm.status.unwrap().server.unwrap().id, server.id);
        // Two status writes: Creating, then Active.
        assert_eq!(api.status_writes(), 2);
    }

    #[tokio::test]
    async fn the_refresh_updates_usage_and_keeps_the_same_server() {
        let (r, driver, api) = setup();
        let key = api.create(VirtualMachine::new("ns", "vm", "1", "1Gi"));
        r.reconcile(&key).await.unwrap();
        driver.set_usage(SERVER, 97.123, 12.5);
        assert_eq!(r.reconcile(&key).await, Ok(Action::RequeueAfter(REFRESH)));
        let usage = api
            .object(&key)
            .unwrap()
            .status
            .unwrap()
            .server
            .unwrap()
            .usage;
        assert_eq!((usage.cpu, usage.memory), (97.12, 12.5));
        assert_eq!(driver.calls("create"), 1);
    }

    #[tokio::test]
    async fn the_finalizer_is_added_before_the_server_is_created() {
        let (r, driver, api) = setup();
        let key = api.create(VirtualMachine::new("ns", "vm", "1", "1Gi"));
        // An engine outage on the first pass: the finalizer must already be there.
        driver.set_unreachable(true);
        assert!(r.reconcile(&key).await.is_err());
        assert!(api.object(&key).unwrap().has_finalizer());
        assert_eq!(driver.calls("create"), 0);
    }

    #[tokio::test]
    async fn a_vm_deleted_while_creating_is_terminated_and_its_server_deleted() {
        let (r, driver, api) = setup();
        let key = api.create(VirtualMachine::new("ns", "vm", "1", "1Gi"));
        // The create fails after the Creating status was written: the VM sits in Creating/Failed
        // with its finalizer; put it back to Creating as a crash mid-create would leave it.
        driver.fail_creates(1);
        assert!(r.reconcile(&key).await.is_err());
        let mut vm = api.object(&key).unwrap();
        vm.status.as_mut().unwrap().phase = Phase::Creating;
        api.replace_status(&vm).await.unwrap();
        // A container the crashed create had already made.
        driver.insert(ServerSpec {
            name: SERVER.into(),
            vm_namespace: "ns".into(),
            vm_name: "vm".into(),
            vm_uid: "uid-vm".into(),
            cpu_millis: 1000,
            memory_bytes: 1 << 30,
        });
        api.delete(&key);
        assert_eq!(
            phase(&api, &key),
            Phase::Creating,
            "the finalizer holds the object"
        );
        assert_eq!(r.reconcile(&key).await, Ok(Action::Done));
        assert!(driver.server(SERVER).is_none(), "the server is deleted");
        assert!(
            api.object(&key).is_none(),
            "the finalizer was removed and the object is gone"
        );
    }

    #[tokio::test]
    async fn an_active_vm_deleted_goes_terminating_then_its_server_and_object_go() {
        let (r, driver, api) = setup();
        let key = api.create(VirtualMachine::new("ns", "vm", "1", "1Gi"));
        r.reconcile(&key).await.unwrap();
        api.delete(&key);
        // The engine refuses the delete once: the VM is Terminating with the error as reason.
        driver.set_unreachable(true);
        assert!(r.reconcile(&key).await.is_err());
        assert_eq!(phase(&api, &key), Phase::Terminating);
        assert!(
            reason(&api, &key).contains("fake engine is unreachable"),
            "{}",
            reason(&api, &key)
        );
        driver.set_unreachable(false);
        assert_eq!(r.reconcile(&key).await, Ok(Action::Done));
        assert!(driver.server_names().is_empty());
        assert!(api.object(&key).is_none());
    }

    #[tokio::test]
    async fn a_failed_create_records_failed_and_the_retry_succeeds() {
        let (r, driver, api) = setup();
        let key = api.create(VirtualMachine::new("ns", "vm", "1", "1Gi"));
        driver.fail_creates(2);
        let first = r.reconcile(&key).await.unwrap_err();
        assert!(first.retry(), "driver errors go back to the rate limiter");
        assert_eq!(phase(&api, &key), Phase::Failed);
        assert!(
            reason(&api, &key).contains("injected failure"),
            "{}",
            reason(&api, &key)
        );
        assert!(r.reconcile(&key).await.is_err());
        assert_eq!(r.reconcile(&key).await, Ok(Action::RequeueAfter(REFRESH)));
        assert_eq!(phase(&api, &key), Phase::Active);
        assert_eq!(reason(&api, &key), "");
        assert_eq!(driver.calls("create"), 3);
    }

    #[tokio::test]
    async fn a_vanished_server_says_so_in_phase_and_reason_and_is_recreated() {
        let (r, driver, api) = setup();
        let key = api.create(VirtualMachine::new("ns", "vm", "1", "1Gi"));
        r.reconcile(&key).await.unwrap();
        let old_id = driver.server(SERVER).unwrap().id;
        assert!(driver.vanish(SERVER));
        let before = api.status_history().len();
        assert_eq!(r.reconcile(&key).await, Ok(Action::RequeueAfter(REFRESH)));
        let history = api.status_history()[before..].to_vec();
        let phases: Vec<Phase> = history.iter().map(|(p, _)| *p).collect();
        assert_eq!(phases, vec![Phase::Failed, Phase::Creating, Phase::Active]);
        assert_eq!(
            history[0].1,
            format!("server {SERVER} (id {old_id}) vanished; recreating it")
        );
        assert_ne!(driver.server(SERVER).unwrap().id, old_id, "a new server");
    }

    #[tokio::test]
    async fn a_vanished_server_whose_recreation_fails_stays_failed_and_is_retried() {
        let (r, driver, api) = setup();
        let key = api.create(VirtualMachine::new("ns", "vm", "1", "1Gi"));
        r.reconcile(&key).await.unwrap();
        driver.vanish(SERVER);
        driver.fail_creates(1);
        assert!(r.reconcile(&key).await.unwrap_err().retry());
        assert_eq!(phase(&api, &key), Phase::Failed);
        assert!(
            reason(&api, &key).contains("injected failure"),
            "{}",
            reason(&api, &key)
        );
        assert_eq!(r.reconcile(&key).await, Ok(Action::RequeueAfter(REFRESH)));
        assert_eq!(phase(&api, &key), Phase::Active);
    }

    #[tokio::test]
    async fn a_server_that_already_exists_is_adopted_not_stuck_in_creating() {
        let (r, driver, api) = setup();
        let key = api.create(VirtualMachine::new("ns", "vm", "1", "1Gi"));
        let id = driver.insert(ServerSpec {
            name: SERVER.into(),
            vm_namespace: "ns".into(),
            vm_name: "vm".into(),
            vm_uid: "uid-vm".into(),
            cpu_millis: 1000,
            memory_bytes: 1 << 30,
        });
        // Left in Creating by an earlier controller that crashed after creating the server.
        api.replace_status(&vm_with_phase(&api, &key, Phase::Creating))
            .await
            .unwrap();
        assert_eq!(r.reconcile(&key).await, Ok(Action::RequeueAfter(REFRESH)));
        let vm = api.object(&key).unwrap();
        assert_eq!(vm.phase(), Phase::Active);
        assert_eq!(vm.status.unwrap().server.unwrap().id, id);
        assert_eq!(driver.calls("create"), 0, "nothing to create");
    }

    #[tokio::test]
    async fn a_stopped_server_is_started_again() {
        let (r, driver, api) = setup();
        let key = api.create(VirtualMachine::new("ns", "vm", "1", "1Gi"));
        r.reconcile(&key).await.unwrap();
        let id = driver.server(SERVER).unwrap().id;
        driver.stop(SERVER);
        let before = api.status_history().len();
        assert_eq!(r.reconcile(&key).await, Ok(Action::RequeueAfter(REFRESH)));
        let history = api.status_history()[before..].to_vec();
        assert_eq!(
            history[0],
            (
                Phase::Creating,
                format!("server {SERVER} is exited; starting it")
            )
        );
        let server = driver.server(SERVER).unwrap();
        assert!(server.running);
        assert_eq!(server.id, id, "the same server, started");
    }

    #[tokio::test]
    async fn a_vm_found_deleting_on_a_conflict_retry_is_finalized_instead_of_created() {
        let (r, driver, api) = setup();
        let key = api.create(VirtualMachine::new("ns", "vm", "1", "1Gi"));
        // Give it our finalizer, then let the informer's copy lag behind a deletion.
        let vm = api.object(&key).unwrap();
        let vm = set_finalizer(&api, &vm, true).await.unwrap().unwrap();
        api.freeze_cache(&key, vm);
        api.delete(&key);
        assert_eq!(r.reconcile(&key).await, Ok(Action::Done));
        assert_eq!(
            driver.calls("create"),
            0,
            "no server for a VM being deleted"
        );
        assert!(api.object(&key).is_none(), "finalized");
    }

    #[tokio::test]
    async fn a_spec_change_recreates_the_server_with_the_new_limits() {
        let (r, driver, api) = setup();
        let key = api.create(VirtualMachine::new("ns", "vm", "1", "1Gi"));
        r.reconcile(&key).await.unwrap();
        let old_id = driver.server(SERVER).unwrap().id;
        let mut vm = api.object(&key).unwrap();
        vm.spec = VirtualMachine::new("ns", "vm", "2", "2Gi").spec;
        api.replace_spec(vm);
        let before = api.status_history().len();
        assert_eq!(r.reconcile(&key).await, Ok(Action::RequeueAfter(REFRESH)));
        let server = driver.server(SERVER).unwrap();
        assert_ne!(server.id, old_id, "a new server");
        assert_eq!(
            (server.spec.cpu_millis, server.spec.memory_bytes),
            (2000, 2 << 30)
        );
        let history = api.status_history()[before..].to_vec();
        assert_eq!(history[0].0, Phase::Creating);
        assert!(
            history[0].1.contains(
                "has cpu 1000m and memory 1073741824 bytes but the spec asks for cpu 2000m"
            ),
            "{history:?}"
        );
        assert_eq!(history[1].0, Phase::Active);
        // Unchanged limits: no more recreation.
        assert_eq!(r.reconcile(&key).await, Ok(Action::RequeueAfter(REFRESH)));
        assert_eq!(driver.server(SERVER).unwrap().id, server.id);
    }

    #[tokio::test]
    async fn an_object_deleted_while_queued_is_done_without_retry() {
        let (r, driver, api) = setup();
        let key = api.create(VirtualMachine::new("ns", "vm", "1", "1Gi"));
        api.delete(&key);
        assert!(
            api.object(&key).is_none(),
            "no finalizer yet, so it is gone at once"
        );
        assert_eq!(r.reconcile(&key).await, Ok(Action::Done));
        assert_eq!(driver.calls("status") + driver.calls("create"), 0);
    }

    #[tokio::test]
    async fn a_deleting_vm_without_our_finalizer_is_left_alone() {
        let (r, driver, api) = setup();
        let mut vm = VirtualMachine::new("ns", "vm", "1", "1Gi");
        vm.metadata.finalizers = Some(vec!["someone.else/finalizer".into()]);
        let key = api.create(vm);
        api.delete(&key);
        assert_eq!(r.reconcile(&key).await, Ok(Action::Done));
        assert_eq!(driver.calls("delete"), 0);
        assert_eq!(
            api.object(&key).unwrap().metadata.finalizers,
            Some(vec!["someone.else/finalizer".to_string()])
        );
    }

    #[tokio::test]
    async fn an_unreachable_engine_fails_the_vm_naming_the_engine_and_it_recovers() {
        let (r, driver, api) = setup();
        let key = api.create(VirtualMachine::new("ns", "vm", "1", "1Gi"));
        r.reconcile(&key).await.unwrap();
        driver.set_unreachable(true);
        let err = r.reconcile(&key).await.unwrap_err();
        assert!(err.retry());
        assert_eq!(phase(&api, &key), Phase::Failed);
        assert!(reason(&api, &key).contains("fake engine is unreachable"));
        // The same failure again does not rewrite the status.
        let writes = api.status_writes();
        assert!(r.reconcile(&key).await.is_err());
        assert_eq!(api.status_writes(), writes);
        driver.set_unreachable(false);
        assert_eq!(r.reconcile(&key).await, Ok(Action::RequeueAfter(REFRESH)));
        assert_eq!(phase(&api, &key), Phase::Active);
        assert_eq!(
            driver.calls("create"),
            1,
            "the server survived the outage and is adopted, not recreated"
        );
    }

    #[tokio::test]
    async fn status_conflicts_are_retried_on_fresh_data() {
        let (r, _driver, api) = setup();
        let key = api.create(VirtualMachine::new("ns", "vm", "1", "1Gi"));
        api.inject_conflicts(3);
        assert_eq!(r.reconcile(&key).await, Ok(Action::RequeueAfter(REFRESH)));
        assert_eq!(phase(&api, &key), Phase::Active);
        assert!(api.object(&key).unwrap().has_finalizer());
    }

    #[tokio::test]
    async fn endless_conflicts_give_up_and_go_back_to_the_rate_limiter() {
        let (r, _driver, api) = setup();
        let key = api.create(VirtualMachine::new("ns", "vm", "1", "1Gi"));
        api.inject_conflicts(1000);
        let err = r.reconcile(&key).await.unwrap_err();
        assert!(err.retry());
        assert!(err.to_string().contains("still conflicted"), "{err}");
    }

    #[tokio::test]
    async fn an_invalid_spec_fails_the_vm_with_a_message_and_creates_nothing() {
        let (r, driver, api) = setup();
        let key = api.create(VirtualMachine::new("ns", "vm", "abc", "4G"));
        assert_eq!(r.reconcile(&key).await, Ok(Action::Done));
        assert_eq!(phase(&api, &key), Phase::Failed);
        assert!(
            reason(&api, &key).contains("VirtualMachine ns/vm: spec.resource.cpu \"abc\""),
            "{}",
            reason(&api, &key)
        );
        assert_eq!(driver.calls("create"), 0);
    }

    #[tokio::test]
    async fn a_bad_key_is_an_error_that_is_not_retried() {
        let (r, _driver, _api) = setup();
        for key in ["nokey", "a/b/c", "/x", "x/"] {
            let err = r.reconcile(key).await.unwrap_err();
            assert!(!err.retry(), "{key}");
        }
        assert_eq!(FINALIZER, "finalizer.cloudnative.tw");
    }
}
