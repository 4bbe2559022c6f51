//! The phase machine of one VirtualMachine (controller101's `controller.go` `syncHandler`,
//! `createServer`, `updateUsage`, `cleanup`), run by a worker for one `namespace/name` key.
//!
//! ```text
//!   ""  --finalizer patched--> Creating --create ok--> Active --every refresh_interval--> Active
//!                                 |                       |  server vanished: Failed(reason) -> Creating
//!                                 +--create fails--> Failed(reason) --rate-limited retry--> ...
//!   server of that name with another uid: Failed(ServerNameTaken) --every refresh_interval--> ...
//!   any phase + deletionTimestamp --> Terminating --server deleted--> finalizer removed (gone)
//! ```
//!
//! Rules (each fixes a bug of controller101's original):
//! - The finalizer is added by a metadata patch BEFORE anything is created, so a VM deleted in
//!   any phase, even Creating, gets its server deleted.
//! - Creation adopts a server that already exists (same name and the VM's uid), so a VM is
//!   never stuck in Creating because an earlier attempt created the container.
//! - Every driver error is returned (none ignored), after recording `Failed` with a reason that
//!   names the engine; the worker retries with backoff (see [`super::error_policy`]).
//! - An Active VM is requeued after `refresh_interval` to refresh usage and notice a vanished
//!   server; the requeue ends when the object is gone.
//! - Status writes go through the status subresource with conflict retry ([`super::api`]).
//! - Beyond controller101: a server whose limits differ from the spec (the spec was edited) is
//!   recreated with the new limits, since podman's Docker API has no live `update`.
//!
//! Safe failover, three defences (the fence arithmetic is in `src/controller/leadership.rs`):
//! - Fencing: every side effect the reconcile causes (finalizer patch, status write, server
//!   create/start/delete) is preceded by [`ReconcileContext::check`]; once it fails the pass
//!   ends with [`ReconcileError::NotEntitled`], writing nothing more (no Failed status, no
//!   event). Every driver call is also abandoned when [`ReconcileContext::cancelled`] fires.
//! - Compensation: a create that completes after the context ended is undone by the task that
//!   made it ([`super::compensation`], which lists what that covers and what it does not).
//! - Ownership by uid only: a server is adopted, refreshed or deleted only if its
//!   `kubeloop.dev/vm-uid` label is the VM's uid. A server of the VM's name with another uid
//!   (a re-created VM of the same name, another cluster on the same engine) or none is never
//!   adopted nor deleted: the VM goes Failed with a reason naming the server and both uids and a
//!   `ServerNameTaken` Warning event, and looks again every `refresh_interval`; finalizing such
//!   a VM leaves the server, removes the finalizer and says why in a Warning event.
//! - The orphan sweep ([`super::sweep`]) removes servers whose VM is gone.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use tracing::{debug, info, warn};

use super::api::{VmApi, set_finalizer, write_status};
use super::compensation::create_fenced;
use super::conditions::{conditions_for, transition_event};
use super::driver::{
    DeleteOutcome, Driver, DriverError, ServerSpec, ServerStatus as DriverServerStatus,
    server_name, uid_label_text,
};
use super::error_policy::ReconcileError;
use super::quantity::{Resources, resources_of};
use super::types::{Phase, ServerStatus, ServerUsage, VirtualMachine, VirtualMachineStatus};
use crate::record::{EventRecorder, EventType};
pub use crate::runtime::Action;
use crate::runtime::{NotEntitled, ObjectKey, ReconcileContext};

/// controller101 refreshed usage on a 20-30 s resync; we requeue each Active VM after this.
pub const DEFAULT_REFRESH_INTERVAL: Duration = Duration::from_secs(20);

/// The Warning event reason when a server of the VM's name is not the VM's.
pub const REASON_SERVER_NAME_TAKEN: &str = "ServerNameTaken";

/// How long a VM the engine refused ([`DriverError::Refused`]: image missing, limits it
/// cannot apply) waits before the same spec is tried again; an edit of the spec tries at once.
pub const DEFAULT_REFUSED_RETRY_INTERVAL: Duration = Duration::from_secs(600);

/// The wait before the first restart of a server that exited; each further exit in a row
/// doubles it, up to [`CRASH_BACKOFF_MAX`] (the kubelet's container restart backoff).
pub const CRASH_BACKOFF_BASE: Duration = Duration::from_secs(10);
/// The longest wait before restarting a server that keeps exiting.
pub const CRASH_BACKOFF_MAX: Duration = Duration::from_secs(300);
/// After this many exits in a row the VM's phase is `CrashLoopBackOff` (before: `Failed`).
pub const CRASH_LOOP_AFTER: u32 = 3;
/// A server that has run this long since its last start has its restart count reset.
pub const CRASH_RESET_AFTER: Duration = Duration::from_secs(600);

/// Settings of the phase machine.
#[derive(Clone, Debug)]
pub struct ReconcilerConfig {
    /// How often an Active VM's usage is refreshed (`--refresh-interval`).
    pub refresh_interval: Duration,
    /// How long a VM the engine refused waits before the same spec is tried again.
    pub refused_retry_interval: Duration,
}

impl Default for ReconcilerConfig {
    fn default() -> Self {
        Self {
            refresh_interval: DEFAULT_REFRESH_INTERVAL,
            refused_retry_interval: DEFAULT_REFUSED_RETRY_INTERVAL,
        }
    }
}

/// The wait before restarting a server that has been restarted `restarts` times in a row:
/// [`CRASH_BACKOFF_BASE`] doubled per restart, at most [`CRASH_BACKOFF_MAX`].
pub fn crash_backoff(restarts: u32) -> Duration {
    CRASH_BACKOFF_BASE
        .saturating_mul(1u32 << restarts.min(16))
        .min(CRASH_BACKOFF_MAX)
}

/// What [`Reconciler::start`] came to.
enum Started {
    /// The server was started (or adopted); as the engine reports it right after.
    Server(DriverServerStatus),
    /// The start failed and the failure was recorded; this is the reconcile's result.
    Handled(Action),
}

/// Reconciles VirtualMachines with a driver `D` through an apiserver `A`.
pub struct Reconciler<D, A> {
    /// Shared with the create tasks, which outlive a cancelled reconcile to undo what they made.
    driver: Arc<D>,
    api: A,
    config: ReconcilerConfig,
    /// Events for `kubectl describe vm` (none in unit tests).
    recorder: Option<EventRecorder>,
}

/// A server of the VM's name that is not the VM's.
struct NameTaken<'a> {
    server: &'a str,
    id: &'a str,
    found_uid: Option<&'a str>,
}

impl<D: Driver, A: VmApi> Reconciler<D, A> {
    /// A reconciler creating servers through `driver` and writing through `api`.
    pub fn new(driver: D, api: A, config: ReconcilerConfig) -> Self {
        Self {
            driver: Arc::new(driver),
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

    /// Records an event, unless the reconcile may no longer cause side effects.
    fn event(
        &self,
        ctx: &ReconcileContext,
        vm: &VirtualMachine,
        event_type: EventType,
        reason: &str,
        message: &str,
    ) {
        if let Some(recorder) = &self.recorder
            && ctx.is_entitled()
        {
            recorder.event(vm, event_type, reason, message);
        }
    }

    /// The driver (for tests and wiring).
    pub fn api(&self) -> &A {
        &self.api
    }

    /// The driver (for tests and wiring).
    pub fn driver(&self) -> &D {
        &self.driver
    }

    /// One pass over the VM named by `key`, entitled to side effects while `ctx` is.
    pub async fn reconcile(
        &self,
        key: &ObjectKey,
        ctx: &ReconcileContext,
    ) -> Result<Action, ReconcileError> {
        // VirtualMachines are namespaced: a key without a namespace names none.
        let Some(namespace) = key.namespace() else {
            return Err(ReconcileError::InvalidKey {
                key: key.to_string(),
            });
        };
        let Some(cached) = self.api.cached(namespace, key.name()) else {
            // Deleted (and, if it was ours, finalized): nothing to do, and nothing to requeue.
            debug!(vm = %key, "VirtualMachine no longer exists");
            return Ok(Action::Done);
        };
        let vm = VirtualMachine::clone(&cached);
        if vm.is_deleting() {
            return self.finalize(vm, ctx).await;
        }
        let Some(vm) = set_finalizer(&self.api, &vm, true, ctx).await? else {
            return Ok(Action::Done);
        };
        // After a conflict the patch re-read the object, which may be deleting by now.
        if vm.is_deleting() {
            return self.finalize(vm, ctx).await;
        }
        self.ensure_server(vm, ctx).await
    }

    /// Creates, adopts, restarts or refreshes the VM's server.
    async fn ensure_server(
        &self,
        vm: VirtualMachine,
        ctx: &ReconcileContext,
    ) -> Result<Action, ReconcileError> {
        let resources = match resources_of(&vm) {
            Ok(r) => r,
            Err(invalid) => {
                // The schema should have refused it; say so on the object and wait for an edit.
                warn!(error = %invalid, "invalid VirtualMachine spec");
                self.event(
                    ctx,
                    &vm,
                    EventType::Warning,
                    "InvalidSpec",
                    &invalid.to_string(),
                );
                self.set_status(&vm, failed(&vm, invalid.to_string()), ctx)
                    .await?;
                return Ok(Action::Done);
            }
        };
        let server = server_name(vm.namespace(), vm.name());
        let observed = match until_cancelled(ctx, self.driver.server_status(&server)).await? {
            Ok(observed) => observed,
            Err(e) => return self.fail(&vm, e, ctx).await,
        };
        if let Some(status) = &observed
            && status.vm_uid.as_deref() != Some(vm.uid())
        {
            let taken = NameTaken {
                server: &server,
                id: &status.id,
                found_uid: status.vm_uid.as_deref(),
            };
            return self.name_taken(&vm, taken, ctx).await;
        }
        let mut vm = vm;
        // The id of a server to delete before creating anew.
        let mut recreate = None;
        let reason = match observed {
            Some(status) if status.running && limits_match(&status, &resources) => {
                return self.set_active(&vm, &status, restarts_of(&vm), ctx).await;
            }
            Some(status) if !limits_match(&status, &resources) => {
                // podman's Docker API has no `update`: a resize is a cold restart (of a
                // stopped server too: starting it would run the old limits).
                recreate = Some(status.id.clone());
                let resize = format!(
                    "server {server} has cpu {}m and memory {} bytes but the spec asks for cpu {}m and memory {} bytes; recreating it",
                    status.cpu_millis,
                    status.memory_bytes,
                    resources.cpu_millis,
                    resources.memory_bytes
                );
                info!(vm = %vm.key(), "{resize}");
                self.event(ctx, &vm, EventType::Normal, "Resizing", &resize);
                resize
            }
            Some(status) if status.exited() => {
                return self
                    .after_exit(&vm, &server, &status, &resources, ctx)
                    .await;
            }
            Some(status) => format!("server {server} is {}; starting it", status.state),
            None => match vm.status.as_ref().and_then(|s| s.server.as_ref()) {
                Some(previous) if vm.phase() != Phase::Creating => {
                    let vanished = format!(
                        "server {server} (id {}) vanished; recreating it",
                        previous.id
                    );
                    warn!(vm = %vm.key(), "{vanished}");
                    self.event(ctx, &vm, EventType::Warning, "ServerVanished", &vanished);
                    let status = failed(&vm, vanished.clone());
                    let Some(updated) = self.set_status(&vm, status, ctx).await? else {
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
            restarts: restarts_of(&vm),
            last_update_time: Some(now()),
            conditions: Vec::new(),
        };
        // The write may have re-read the object after a conflict: if that fresh copy is being
        // deleted, creating a server now would only leak it; finalize instead.
        let Some(vm) = self.set_status(&vm, creating, ctx).await? else {
            return Ok(Action::Done);
        };
        if vm.is_deleting() {
            return self.finalize(vm, ctx).await;
        }
        if let Some(id) = recreate {
            ctx.check()?;
            match until_cancelled(ctx, self.driver.delete_server(&id, vm.uid())).await? {
                Ok(DeleteOutcome::Deleted { .. } | DeleteOutcome::Absent) => {}
                Ok(DeleteOutcome::NotOwned { id, found_uid }) => {
                    let taken = NameTaken {
                        server: &server,
                        id: &id,
                        found_uid: found_uid.as_deref(),
                    };
                    return self.name_taken(&vm, taken, ctx).await;
                }
                Err(e) => return self.fail(&vm, e, ctx).await,
            }
        }
        let status = match self.start(&vm, &server, &resources, ctx).await? {
            Started::Server(status) => status,
            Started::Handled(action) => return Ok(action),
        };
        if status.running {
            // The transition event to Active says so; no event of its own (with thousands of
            // VMs created at once every apiserver request counts).
            info!(vm = %vm.key(), server = %server, id = %status.id, "server running");
        }
        self.after_start(&vm, &server, &status, restarts_of(&vm), ctx)
            .await
    }

    /// Creates and starts the VM's server, or adopts and starts the VM's existing one.
    async fn start(
        &self,
        vm: &VirtualMachine,
        server: &str,
        resources: &Resources,
        ctx: &ReconcileContext,
    ) -> Result<Started, ReconcileError> {
        let spec = ServerSpec {
            name: server.to_string(),
            vm_namespace: vm.namespace().to_string(),
            vm_name: vm.name().to_string(),
            vm_uid: vm.uid().to_string(),
            cpu_millis: resources.cpu_millis,
            memory_bytes: resources.memory_bytes,
        };
        ctx.check()?;
        match create_fenced(&self.driver, spec, &vm.key(), ctx).await? {
            Ok(created) => Ok(Started::Server(created.status)),
            // Someone else's server took the name between our look and the create.
            Err(DriverError::NameTaken { id, found_uid, .. }) => {
                let taken = NameTaken {
                    server,
                    id: &id,
                    found_uid: found_uid.as_deref(),
                };
                self.name_taken(vm, taken, ctx).await.map(Started::Handled)
            }
            Err(e) => self.fail(vm, e, ctx).await.map(Started::Handled),
        }
    }

    /// A server just started: Active if it runs; if it already stopped again, the wait of
    /// [`Self::after_exit`] (`restarts` counts this start if it was a restart).
    async fn after_start(
        &self,
        vm: &VirtualMachine,
        server: &str,
        status: &DriverServerStatus,
        restarts: u32,
        ctx: &ReconcileContext,
    ) -> Result<Action, ReconcileError> {
        if status.exited() {
            return self
                .wait_to_restart(vm, server, status, restarts, ctx)
                .await;
        }
        self.set_active(vm, status, restarts, ctx).await
    }

    /// The server ran and stopped (exited, crashed, was killed behind the controller's back):
    /// the VM is not Active. Once [`crash_backoff`] of its restarts so far has passed since it
    /// stopped, it is started again (the restart counted); until then the VM waits in
    /// [`Self::wait_to_restart`].
    async fn after_exit(
        &self,
        vm: &VirtualMachine,
        server: &str,
        status: &DriverServerStatus,
        resources: &Resources,
        ctx: &ReconcileContext,
    ) -> Result<Action, ReconcileError> {
        let restarts = restarts_of(vm);
        if restart_due(status, restarts, k8s_openapi::jiff::Timestamp::now()).is_some() {
            return self
                .wait_to_restart(vm, server, status, restarts, ctx)
                .await;
        }
        let message = format!(
            "VirtualMachine {}: server {server} {}; starting it again (restart {})",
            vm.key(),
            exit_text(status),
            restarts + 1
        );
        info!(vm = %vm.key(), "{message}");
        self.event(ctx, vm, EventType::Normal, "Restarting", &message);
        let started = match self.start(vm, server, resources, ctx).await? {
            Started::Server(started) => started,
            Started::Handled(action) => return Ok(action),
        };
        self.after_start(vm, server, &started, restarts + 1, ctx)
            .await
    }

    /// A stopped server waiting for its restart: `Failed` (`CrashLoopBackOff` once it has
    /// exited [`CRASH_LOOP_AFTER`] times in a row) with the exit code and when it restarts,
    /// and a look again then.
    async fn wait_to_restart(
        &self,
        vm: &VirtualMachine,
        server: &str,
        status: &DriverServerStatus,
        restarts: u32,
        ctx: &ReconcileContext,
    ) -> Result<Action, ReconcileError> {
        let at = k8s_openapi::jiff::Timestamp::now();
        let (due, wait) = restart_due(status, restarts, at).unwrap_or((at, Duration::ZERO));
        let phase = if restarts + 1 >= CRASH_LOOP_AFTER {
            Phase::CrashLoopBackOff
        } else {
            Phase::Failed
        };
        let reason = format!(
            "server {server} {}; exit {} in a row; restarting it at {due:.0}",
            exit_text(status),
            restarts + 1
        );
        let unchanged = vm
            .status
            .as_ref()
            .is_some_and(|s| s.phase == phase && s.reason == reason);
        if !unchanged {
            warn!(vm = %vm.key(), "{reason}");
            let waiting = VirtualMachineStatus {
                phase,
                reason,
                server: Some(ServerStatus {
                    id: status.id.clone(),
                    state: status.state.clone(),
                    exit_code: status.exit_code,
                    accelerator: status.accelerator.clone(),
                    usage: ServerUsage::default(),
                }),
                restarts,
                last_update_time: Some(now()),
                conditions: Vec::new(),
            };
            if self.set_status(vm, waiting, ctx).await?.is_none() {
                return Ok(Action::Done);
            }
        }
        // At least a second: the engine's times have a second's precision in some engines.
        Ok(Action::RequeueAfter(wait.max(Duration::from_secs(1))))
    }

    /// A server of the VM's name is not the VM's: Failed with a reason naming it and both
    /// uids, a Warning event, and a look again after `refresh_interval` (the name may be freed:
    /// by its owner, or by the orphan sweep if its VM is gone).
    async fn name_taken(
        &self,
        vm: &VirtualMachine,
        taken: NameTaken<'_>,
        ctx: &ReconcileContext,
    ) -> Result<Action, ReconcileError> {
        let reason = format!(
            "server {} (id {}) is not this VirtualMachine's: it has {} but this VirtualMachine's uid is {}; it is neither adopted nor deleted",
            taken.server,
            taken.id,
            uid_label_text(taken.found_uid),
            vm.uid()
        );
        let unchanged = vm
            .status
            .as_ref()
            .is_some_and(|s| s.phase == Phase::Failed && s.reason == reason);
        if !unchanged {
            warn!(vm = %vm.key(), "{reason}");
            self.event(
                ctx,
                vm,
                EventType::Warning,
                REASON_SERVER_NAME_TAKEN,
                &reason,
            );
            if self
                .set_status(vm, failed(vm, reason), ctx)
                .await?
                .is_none()
            {
                return Ok(Action::Done);
            }
        }
        Ok(Action::RequeueAfter(self.config.refresh_interval))
    }

    /// Deletion requested: Terminating, delete the server (if it is the VM's), then let the
    /// object go.
    async fn finalize(
        &self,
        vm: VirtualMachine,
        ctx: &ReconcileContext,
    ) -> Result<Action, ReconcileError> {
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
                restarts: restarts_of(&vm),
                last_update_time: Some(now()),
                conditions: Vec::new(),
            };
            let Some(updated) = self.set_status(&vm, terminating, ctx).await? else {
                return Ok(Action::Done);
            };
            vm = updated;
        }
        ctx.check()?;
        match until_cancelled(ctx, self.driver.delete_server(&server, vm.uid())).await? {
            Ok(DeleteOutcome::Deleted { .. } | DeleteOutcome::Absent) => {
                info!(vm = %vm.key(), server = %server, "server deleted; removing the finalizer");
                self.event(
                    ctx,
                    &vm,
                    EventType::Normal,
                    "ServerDeleted",
                    &format!("server {server} deleted"),
                );
            }
            Ok(DeleteOutcome::NotOwned { id, found_uid }) => {
                let message = format!(
                    "server {server} (id {id}) is not this VirtualMachine's: it has {} but this VirtualMachine's uid is {}; it is left in place and the finalizer removed",
                    uid_label_text(found_uid.as_deref()),
                    vm.uid()
                );
                warn!(vm = %vm.key(), "{message}");
                self.event(
                    ctx,
                    &vm,
                    EventType::Warning,
                    REASON_SERVER_NAME_TAKEN,
                    &message,
                );
            }
            Err(e) => {
                let mut status = vm.status.clone().unwrap_or_default();
                status.reason = format!("deleting server {server} failed: {e}");
                status.last_update_time = Some(now());
                if vm.status.as_ref().map(|s| &s.reason) != Some(&status.reason) {
                    self.event(
                        ctx,
                        &vm,
                        EventType::Warning,
                        "DeleteFailed",
                        &format!("VirtualMachine {}: {}", vm.key(), status.reason),
                    );
                    self.set_status(&vm, status, ctx).await?;
                }
                return Err(ReconcileError::Driver {
                    vm: vm.key(),
                    source: e,
                });
            }
        }
        set_finalizer(&self.api, &vm, false, ctx).await?;
        Ok(Action::Done)
    }

    /// Active on `server`, with `restarts` (reset once the server has run
    /// [`CRASH_RESET_AFTER`] since its last start).
    async fn set_active(
        &self,
        vm: &VirtualMachine,
        server: &DriverServerStatus,
        restarts: u32,
        ctx: &ReconcileContext,
    ) -> Result<Action, ReconcileError> {
        let ran_long_enough = server.started_at.is_some_and(|started| {
            k8s_openapi::jiff::Timestamp::now()
                .duration_since(started)
                .as_secs()
                >= CRASH_RESET_AFTER.as_secs() as i64
        });
        let restarts = if ran_long_enough { 0 } else { restarts };
        let active = with_conditions(
            vm,
            VirtualMachineStatus {
                phase: Phase::Active,
                reason: String::new(),
                server: Some(ServerStatus {
                    id: server.id.clone(),
                    state: server.state.clone(),
                    exit_code: None,
                    accelerator: server.accelerator.clone(),
                    usage: ServerUsage {
                        cpu: round2(server.cpu_percent),
                        memory: round2(server.memory_percent),
                    },
                }),
                restarts,
                last_update_time: Some(now()),
                conditions: Vec::new(),
            },
        );
        if vm
            .status
            .as_ref()
            .is_some_and(|s| same_to_a_user(s, &active))
        {
            // Nothing a user would see changed: no write (with hundreds of VMs refreshed every
            // few seconds, unchanged writes would be most of the apiserver's load).
            return Ok(Action::RequeueAfter(self.config.refresh_interval));
        }
        match self.write_prepared(vm, active, ctx).await? {
            Some(_) => Ok(Action::RequeueAfter(self.config.refresh_interval)),
            None => Ok(Action::Done),
        }
    }

    /// Records `Failed` with the driver error as the reason (unless already recorded) and
    /// returns the error so the key is retried with backoff; an error retrying will not fix
    /// ([`DriverError::is_permanent`]) is not returned: the VM is looked at again after
    /// `refused_retry_interval` (or at once when its spec is edited).
    async fn fail(
        &self,
        vm: &VirtualMachine,
        error: DriverError,
        ctx: &ReconcileContext,
    ) -> Result<Action, ReconcileError> {
        warn!(vm = %vm.key(), %error, "driver call failed");
        let status = failed(vm, error.to_string());
        let unchanged = vm
            .status
            .as_ref()
            .is_some_and(|s| s.phase == Phase::Failed && s.reason == status.reason);
        if !unchanged {
            // Into Failed: set_status's transition event says so; a new reason while Failed
            // gets its own.
            if vm.phase() == Phase::Failed {
                self.event(ctx, vm, EventType::Warning, "Failed", &status.reason);
            }
            self.set_status(vm, status, ctx).await?;
        }
        if error.is_permanent() {
            return Ok(Action::RequeueAfter(self.config.refused_retry_interval));
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
        ctx: &ReconcileContext,
    ) -> Result<Option<VirtualMachine>, ReconcileError> {
        self.write_prepared(vm, with_conditions(vm, status), ctx)
            .await
    }

    /// Writes a status that already carries its conditions; on success, the event of its
    /// phase change (if any).
    async fn write_prepared(
        &self,
        vm: &VirtualMachine,
        status: VirtualMachineStatus,
        ctx: &ReconcileContext,
    ) -> Result<Option<VirtualMachine>, ReconcileError> {
        let transition = transition_event(vm, &status);
        // Checked before the log line too, so "writing status" is never logged by a reconcile
        // that may no longer write (one resumed past its fence and polled before its worker
        // dropped it); `write_status` checks again before each attempt.
        super::api::fence(ctx, vm, "status update")?;
        debug!(vm = %vm.key(), phase = %status.phase, reason = %status.reason, "writing status");
        let written = write_status(&self.api, vm, status, ctx).await?;
        if written.is_some()
            && let Some((event_type, reason, message)) = transition
        {
            self.event(ctx, vm, event_type, reason, &message);
        }
        Ok(written)
    }
}

/// `status` with the conditions it implies for `vm`, stamped at its `lastUpdateTime`.
fn with_conditions(vm: &VirtualMachine, mut status: VirtualMachineStatus) -> VirtualMachineStatus {
    let at = status.last_update_time.clone().unwrap_or_else(now);
    status.conditions = conditions_for(vm, &status, &at);
    status
}

/// A usage change smaller than this (percentage points) is not worth a status write.
pub const USAGE_WRITE_THRESHOLD: f64 = 1.0;

/// True if `new` would show a user nothing that `old` does not: the same phase, reason,
/// conditions (generation included) and server, and CPU and memory within
/// [`USAGE_WRITE_THRESHOLD`] points (`lastUpdateTime` is
/// then the time of the last change that was written).
fn same_to_a_user(old: &VirtualMachineStatus, new: &VirtualMachineStatus) -> bool {
    let (Some(o), Some(n)) = (&old.server, &new.server) else {
        return false;
    };
    old.phase == new.phase
        && old.reason == new.reason
        && old.restarts == new.restarts
        && o.exit_code == n.exit_code
        && old.conditions == new.conditions
        && o.id == n.id
        && o.state == n.state
        && (o.usage.cpu - n.usage.cpu).abs() < USAGE_WRITE_THRESHOLD
        && (o.usage.memory - n.usage.memory).abs() < USAGE_WRITE_THRESHOLD
}

/// Awaits `call`, or stops waiting once `ctx` is cancelled (a call that finished wins a tie).
pub(super) async fn until_cancelled<T>(
    ctx: &ReconcileContext,
    call: impl Future<Output = T>,
) -> Result<T, NotEntitled> {
    tokio::select! {
        biased;
        out = call => Ok(out),
        () = ctx.cancelled() => Err(NotEntitled::Cancelled),
    }
}

/// True if the server's limits are what the spec asks for (0 = the engine did not say).
fn limits_match(server: &DriverServerStatus, wanted: &Resources) -> bool {
    let cpu_ok = server.cpu_millis == 0 || server.cpu_millis == wanted.cpu_millis;
    let memory_ok = server.memory_bytes == 0 || server.memory_bytes == wanted.memory_bytes;
    cpu_ok && memory_ok
}

/// The VM's restarts so far ([`VirtualMachineStatus::restarts`]).
fn restarts_of(vm: &VirtualMachine) -> u32 {
    vm.status.as_ref().map_or(0, |s| s.restarts)
}

/// For a stopped server restarted `restarts` times in a row: `Some((when it is due, how long
/// from now))` if its restart is still ahead, `None` if it is due.
fn restart_due(
    status: &DriverServerStatus,
    restarts: u32,
    now: k8s_openapi::jiff::Timestamp,
) -> Option<(k8s_openapi::jiff::Timestamp, Duration)> {
    let stopped = status.finished_at.unwrap_or(now);
    let backoff = k8s_openapi::jiff::SignedDuration::try_from(crash_backoff(restarts)).ok()?;
    let due = stopped.checked_add(backoff).ok()?;
    let wait = Duration::try_from(due.duration_since(now)).ok()?;
    (!wait.is_zero()).then_some((due, wait))
}

/// `exited with code 3 at 2026-11-22T10:00:00Z` (`with an unknown code` if the engine did not
/// say).
fn exit_text(status: &DriverServerStatus) -> String {
    let code = status
        .exit_code
        .map_or("an unknown code".to_string(), |c| format!("code {c}"));
    match status.finished_at {
        Some(at) => format!("exited with {code} at {at:.0}"),
        None => format!("exited with {code}"),
    }
}

/// A Failed status that keeps the last known server (its id says which one failed).
fn failed(vm: &VirtualMachine, reason: String) -> VirtualMachineStatus {
    VirtualMachineStatus {
        phase: Phase::Failed,
        reason,
        server: vm.status.as_ref().and_then(|s| s.server.clone()),
        restarts: restarts_of(vm),
        last_update_time: Some(now()),
        conditions: Vec::new(),
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

    /// A context that stays entitled.
    fn ctx() -> ReconcileContext {
        ReconcileContext::detached()
    }

    fn setup() -> (Reconciler<FakeDriver, FakeApi>, FakeDriver, FakeApi) {
        let driver = FakeDriver::new();
        let api = FakeApi::new();
        let reconciler = Reconciler::new(
            driver.clone(),
            api.clone(),
            ReconcilerConfig {
                refresh_interval: REFRESH,
                ..ReconcilerConfig::default()
            },
        );
        (reconciler, driver, api)
    }

    fn phase(api: &FakeApi, key: impl AsRef<str>) -> Phase {
        api.object(key).expect("object exists").phase()
    }

    fn reason(api: &FakeApi, key: impl AsRef<str>) -> String {
        api.object(key)
            .and_then(|o| o.status)
            .map(|s| s.reason)
            .unwrap_or_default()
    }

    const SERVER: &str = "kubeloop-vm_ns_vm";

    fn vm_with_phase(api: &FakeApi, key: impl AsRef<str>, phase: Phase) -> VirtualMachine {
        let mut vm = api.object(key).unwrap();
        vm.status.get_or_insert_with(Default::default).phase = phase;
        vm
    }

    #[tokio::test]
    async fn a_new_vm_gets_the_finalizer_then_a_server_and_becomes_active_with_a_timed_requeue() {
        let (r, driver, api) = setup();
        let key = api.create(VirtualMachine::new("ns", "vm", "2", "4G"));
        assert_eq!(
            r.reconcile(&key, &ctx()).await,
            Ok(Action::RequeueAfter(REFRESH))
        );
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
        r.reconcile(&key, &ctx()).await.unwrap();
        driver.set_usage(SERVER, 97.123, 12.5);
        assert_eq!(
            r.reconcile(&key, &ctx()).await,
            Ok(Action::RequeueAfter(REFRESH))
        );
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
    async fn a_refresh_that_changes_nothing_a_user_sees_writes_no_status() {
        let (r, driver, api) = setup();
        let key = api.create(VirtualMachine::new("ns", "vm", "1", "1Gi"));
        r.reconcile(&key, &ctx()).await.unwrap();
        driver.set_usage(SERVER, 40.0, 10.0);
        r.reconcile(&key, &ctx()).await.unwrap();
        let writes = api.status_writes();
        // Below the threshold on both: still requeued, nothing written.
        driver.set_usage(SERVER, 40.0 + USAGE_WRITE_THRESHOLD / 2.0, 10.3);
        assert_eq!(
            r.reconcile(&key, &ctx()).await,
            Ok(Action::RequeueAfter(REFRESH))
        );
        assert_eq!(api.status_writes(), writes);
        // A move of the threshold or more is written.
        driver.set_usage(SERVER, 40.0 + USAGE_WRITE_THRESHOLD, 10.0);
        r.reconcile(&key, &ctx()).await.unwrap();
        assert_eq!(api.status_writes(), writes + 1);
        // So is a changed state, whatever the usage.
        driver.stop(SERVER);
        r.reconcile(&key, &ctx()).await.unwrap();
        assert!(api.status_writes() > writes + 1);
    }

    #[tokio::test]
    async fn the_finalizer_is_added_before_the_server_is_created() {
        let (r, driver, api) = setup();
        let key = api.create(VirtualMachine::new("ns", "vm", "1", "1Gi"));
        // An engine outage on the first pass: the finalizer must already be there.
        driver.set_unreachable(true);
        assert!(r.reconcile(&key, &ctx()).await.is_err());
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
        assert!(r.reconcile(&key, &ctx()).await.is_err());
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
        assert_eq!(r.reconcile(&key, &ctx()).await, Ok(Action::Done));
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
        r.reconcile(&key, &ctx()).await.unwrap();
        api.delete(&key);
        // The engine refuses the delete once: the VM is Terminating with the error as reason.
        driver.set_unreachable(true);
        assert!(r.reconcile(&key, &ctx()).await.is_err());
        assert_eq!(phase(&api, &key), Phase::Terminating);
        assert!(
            reason(&api, &key).contains("fake engine is unreachable"),
            "{}",
            reason(&api, &key)
        );
        driver.set_unreachable(false);
        assert_eq!(r.reconcile(&key, &ctx()).await, Ok(Action::Done));
        assert!(driver.server_names().is_empty());
        assert!(api.object(&key).is_none());
    }

    #[tokio::test]
    async fn a_failed_create_records_failed_and_the_retry_succeeds() {
        let (r, driver, api) = setup();
        let key = api.create(VirtualMachine::new("ns", "vm", "1", "1Gi"));
        driver.fail_creates(2);
        let first = r.reconcile(&key, &ctx()).await.unwrap_err();
        assert!(first.retry(), "driver errors go back to the rate limiter");
        assert_eq!(phase(&api, &key), Phase::Failed);
        assert!(
            reason(&api, &key).contains("injected failure"),
            "{}",
            reason(&api, &key)
        );
        assert!(r.reconcile(&key, &ctx()).await.is_err());
        assert_eq!(
            r.reconcile(&key, &ctx()).await,
            Ok(Action::RequeueAfter(REFRESH))
        );
        assert_eq!(phase(&api, &key), Phase::Active);
        assert_eq!(reason(&api, &key), "");
        assert_eq!(driver.calls("create"), 3);
    }

    #[tokio::test]
    async fn a_vanished_server_says_so_in_phase_and_reason_and_is_recreated() {
        let (r, driver, api) = setup();
        let key = api.create(VirtualMachine::new("ns", "vm", "1", "1Gi"));
        r.reconcile(&key, &ctx()).await.unwrap();
        let old_id = driver.server(SERVER).unwrap().id;
        assert!(driver.vanish(SERVER));
        let before = api.status_history().len();
        assert_eq!(
            r.reconcile(&key, &ctx()).await,
            Ok(Action::RequeueAfter(REFRESH))
        );
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
        r.reconcile(&key, &ctx()).await.unwrap();
        driver.vanish(SERVER);
        driver.fail_creates(1);
        assert!(r.reconcile(&key, &ctx()).await.unwrap_err().retry());
        assert_eq!(phase(&api, &key), Phase::Failed);
        assert!(
            reason(&api, &key).contains("injected failure"),
            "{}",
            reason(&api, &key)
        );
        assert_eq!(
            r.reconcile(&key, &ctx()).await,
            Ok(Action::RequeueAfter(REFRESH))
        );
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
        assert_eq!(
            r.reconcile(&key, &ctx()).await,
            Ok(Action::RequeueAfter(REFRESH))
        );
        let vm = api.object(&key).unwrap();
        assert_eq!(vm.phase(), Phase::Active);
        assert_eq!(vm.status.unwrap().server.unwrap().id, id);
        assert_eq!(driver.calls("create"), 0, "nothing to create");
    }

    fn ago(secs: i64) -> k8s_openapi::jiff::Timestamp {
        k8s_openapi::jiff::Timestamp::now() - k8s_openapi::jiff::SignedDuration::from_secs(secs)
    }

    fn condition(api: &FakeApi, key: impl AsRef<str>, type_: &str) -> (String, String, String) {
        let vm = api.object(key).unwrap();
        let c = vm
            .status
            .unwrap()
            .conditions
            .into_iter()
            .find(|c| c.type_ == type_)
            .unwrap();
        (c.status, c.reason, c.message)
    }

    fn requeued_within(action: Result<Action, ReconcileError>, low: u64, high: u64) {
        match action {
            Ok(Action::RequeueAfter(d)) => assert!(
                (Duration::from_secs(low)..=Duration::from_secs(high)).contains(&d),
                "requeued after {d:?}, expected {low}..={high} s"
            ),
            other => panic!("expected a timed requeue, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn a_server_that_exits_is_not_active_and_is_restarted_with_a_growing_backoff_then_crash_looping()
     {
        let (r, driver, api) = setup();
        let key = api.create(VirtualMachine::new("ns", "vm", "1", "1Gi"));
        r.reconcile(&key, &ctx()).await.unwrap();
        let id = driver.server(SERVER).unwrap().id;

        // Exit 1: Failed with the exit code, restart due 10 s after the exit.
        driver.exit(SERVER, 3);
        requeued_within(r.reconcile(&key, &ctx()).await, 9, 10);
        assert_eq!(phase(&api, &key), Phase::Failed);
        assert!(
            reason(&api, &key).contains("exited with code 3")
                && reason(&api, &key).contains("exit 1 in a row"),
            "{}",
            reason(&api, &key)
        );
        let (ready, ready_reason, _) = condition(&api, &key, "Ready");
        assert_eq!((ready.as_str(), ready_reason.as_str()), ("False", "Failed"));
        let (running, running_reason, message) = condition(&api, &key, "ServerRunning");
        assert_eq!(
            (running.as_str(), running_reason.as_str()),
            ("False", "Exited")
        );
        assert!(message.contains("exit code 3"), "{message}");
        assert_eq!(
            driver.calls("create"),
            1,
            "not restarted before its backoff"
        );
        // Looking again before it is due changes nothing and writes nothing.
        let writes = api.status_writes();
        requeued_within(r.reconcile(&key, &ctx()).await, 8, 10);
        assert_eq!(api.status_writes(), writes);

        // The backoff passed: started again (the same server), Active, restart 1 counted.
        driver.exit_at(SERVER, 3, ago(11));
        assert_eq!(
            r.reconcile(&key, &ctx()).await,
            Ok(Action::RequeueAfter(REFRESH))
        );
        assert_eq!(phase(&api, &key), Phase::Active);
        let status = api.object(&key).unwrap().status.unwrap();
        assert_eq!(status.restarts, 1);
        assert_eq!(status.server.as_ref().unwrap().id, id);
        assert_eq!(status.server.unwrap().exit_code, None);

        // Exit 2 waits 20 s; exit 3 is a crash loop, waiting 40 s.
        driver.exit(SERVER, 3);
        requeued_within(r.reconcile(&key, &ctx()).await, 19, 20);
        assert_eq!(phase(&api, &key), Phase::Failed);
        driver.exit_at(SERVER, 3, ago(21));
        r.reconcile(&key, &ctx()).await.unwrap();
        assert_eq!(api.object(&key).unwrap().status.unwrap().restarts, 2);
        driver.exit(SERVER, 137);
        requeued_within(r.reconcile(&key, &ctx()).await, 39, 40);
        assert_eq!(phase(&api, &key), Phase::CrashLoopBackOff);
        assert!(
            reason(&api, &key).contains("code 137"),
            "{}",
            reason(&api, &key)
        );
        assert_eq!(
            condition(&api, &key, "Ready").1,
            "CrashLoopBackOff",
            "the condition names the crash loop"
        );
    }

    #[tokio::test]
    async fn a_server_that_ran_ten_minutes_has_its_restarts_reset_and_the_backoff_is_capped() {
        let (r, driver, api) = setup();
        let key = api.create(VirtualMachine::new("ns", "vm", "1", "1Gi"));
        r.reconcile(&key, &ctx()).await.unwrap();
        driver.exit_at(SERVER, 1, ago(11));
        r.reconcile(&key, &ctx()).await.unwrap();
        assert_eq!(api.object(&key).unwrap().status.unwrap().restarts, 1);
        driver.set_started_at(SERVER, ago(601));
        r.reconcile(&key, &ctx()).await.unwrap();
        assert_eq!(api.object(&key).unwrap().status.unwrap().restarts, 0);
        assert_eq!(crash_backoff(0), Duration::from_secs(10));
        assert_eq!(crash_backoff(4), Duration::from_secs(160));
        assert_eq!(crash_backoff(5), CRASH_BACKOFF_MAX);
        assert_eq!(crash_backoff(u32::MAX), CRASH_BACKOFF_MAX);
    }

    #[tokio::test]
    async fn a_refused_spec_goes_failed_and_is_not_retried_until_the_long_interval() {
        let (r, driver, api) = setup();
        let key = api.create(VirtualMachine::new("ns", "vm", "1", "1Gi"));
        driver.refuse_creates(1);
        // Not an error (no hot backoff loop): a look again after the refused-retry interval.
        assert_eq!(
            r.reconcile(&key, &ctx()).await,
            Ok(Action::RequeueAfter(DEFAULT_REFUSED_RETRY_INTERVAL))
        );
        assert_eq!(phase(&api, &key), Phase::Failed);
        assert!(
            reason(&api, &key).contains("refused"),
            "{}",
            reason(&api, &key)
        );
        // The next try (after the interval, or on an edit) creates it.
        assert_eq!(
            r.reconcile(&key, &ctx()).await,
            Ok(Action::RequeueAfter(REFRESH))
        );
        assert_eq!(phase(&api, &key), Phase::Active);
    }

    #[tokio::test]
    async fn a_stopped_server_whose_limits_no_longer_match_the_spec_is_recreated_not_started() {
        let (r, driver, api) = setup();
        let key = api.create(VirtualMachine::new("ns", "vm", "1", "1Gi"));
        r.reconcile(&key, &ctx()).await.unwrap();
        let old = driver.server(SERVER).unwrap().id;
        driver.exit(SERVER, 1);
        let mut vm = api.object(&key).unwrap();
        vm.spec.resource.as_mut().unwrap().memory =
            k8s_openapi::apimachinery::pkg::api::resource::Quantity("2Gi".into());
        api.replace_spec(vm);
        r.reconcile(&key, &ctx()).await.unwrap();
        let server = driver.server(SERVER).unwrap();
        assert_ne!(server.id, old, "recreated");
        assert_eq!(server.spec.memory_bytes, 2 << 30);
        assert!(server.running);
        assert_eq!(phase(&api, &key), Phase::Active);
    }

    #[tokio::test]
    async fn a_vm_found_deleting_on_a_conflict_retry_is_finalized_instead_of_created() {
        let (r, driver, api) = setup();
        let key = api.create(VirtualMachine::new("ns", "vm", "1", "1Gi"));
        // Give it our finalizer, then let the informer's copy lag behind a deletion.
        let vm = api.object(&key).unwrap();
        let vm = set_finalizer(&api, &vm, true, &ctx())
            .await
            .unwrap()
            .unwrap();
        api.freeze_cache(&key, vm);
        api.delete(&key);
        assert_eq!(r.reconcile(&key, &ctx()).await, Ok(Action::Done));
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
        r.reconcile(&key, &ctx()).await.unwrap();
        let old_id = driver.server(SERVER).unwrap().id;
        let mut vm = api.object(&key).unwrap();
        vm.spec = VirtualMachine::new("ns", "vm", "2", "2Gi").spec;
        api.replace_spec(vm);
        let before = api.status_history().len();
        assert_eq!(
            r.reconcile(&key, &ctx()).await,
            Ok(Action::RequeueAfter(REFRESH))
        );
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
        assert_eq!(
            r.reconcile(&key, &ctx()).await,
            Ok(Action::RequeueAfter(REFRESH))
        );
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
        assert_eq!(r.reconcile(&key, &ctx()).await, Ok(Action::Done));
        assert_eq!(driver.calls("status") + driver.calls("create"), 0);
    }

    #[tokio::test]
    async fn a_deleting_vm_without_our_finalizer_is_left_alone() {
        let (r, driver, api) = setup();
        let mut vm = VirtualMachine::new("ns", "vm", "1", "1Gi");
        vm.metadata.finalizers = Some(vec!["someone.else/finalizer".into()]);
        let key = api.create(vm);
        api.delete(&key);
        assert_eq!(r.reconcile(&key, &ctx()).await, Ok(Action::Done));
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
        r.reconcile(&key, &ctx()).await.unwrap();
        driver.set_unreachable(true);
        let err = r.reconcile(&key, &ctx()).await.unwrap_err();
        assert!(err.retry());
        assert_eq!(phase(&api, &key), Phase::Failed);
        assert!(reason(&api, &key).contains("fake engine is unreachable"));
        // The same failure again does not rewrite the status.
        let writes = api.status_writes();
        assert!(r.reconcile(&key, &ctx()).await.is_err());
        assert_eq!(api.status_writes(), writes);
        driver.set_unreachable(false);
        assert_eq!(
            r.reconcile(&key, &ctx()).await,
            Ok(Action::RequeueAfter(REFRESH))
        );
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
        assert_eq!(
            r.reconcile(&key, &ctx()).await,
            Ok(Action::RequeueAfter(REFRESH))
        );
        assert_eq!(phase(&api, &key), Phase::Active);
        assert!(api.object(&key).unwrap().has_finalizer());
    }

    #[tokio::test]
    async fn endless_conflicts_give_up_and_go_back_to_the_rate_limiter() {
        let (r, _driver, api) = setup();
        let key = api.create(VirtualMachine::new("ns", "vm", "1", "1Gi"));
        api.inject_conflicts(1000);
        let err = r.reconcile(&key, &ctx()).await.unwrap_err();
        assert!(err.retry());
        assert!(err.to_string().contains("still conflicted"), "{err}");
    }

    #[tokio::test]
    async fn an_invalid_spec_fails_the_vm_with_a_message_and_creates_nothing() {
        let (r, driver, api) = setup();
        let key = api.create(VirtualMachine::new("ns", "vm", "abc", "4G"));
        assert_eq!(r.reconcile(&key, &ctx()).await, Ok(Action::Done));
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
        // A key without a namespace names no VirtualMachine (they are namespaced).
        let err = r
            .reconcile(&ObjectKey::new("", "nokey"), &ctx())
            .await
            .unwrap_err();
        assert!(!err.retry(), "{err}");
        // Malformed keys cannot be queued at all: the runtime's keys are parsed once.
        for key in ["a/b/c", "/x", "x/"] {
            assert!(ObjectKey::parse(key).is_err(), "{key}");
        }
        assert_eq!(FINALIZER, "finalizer.cloudnative.tw");
    }

    // --- Safe failover: fencing, compensation, ownership by uid. ---

    use std::collections::BTreeMap;

    use tokio_util::sync::CancellationToken;

    use crate::controller::vm::driver::DEFAULT_MANAGED_BY;
    use crate::controller::vm::driver::{LABEL_MANAGED_BY, LABEL_NAME, LABEL_NAMESPACE};
    use crate::controller::vm::fake_api::MemoryEvents;
    use crate::record::{BroadcasterConfig, EventBroadcaster, EventSource};

    /// A reconciler that records events into memory; `shutdown` the broadcaster to flush them.
    fn setup_with_events() -> (
        Reconciler<FakeDriver, FakeApi>,
        FakeDriver,
        FakeApi,
        EventBroadcaster,
        MemoryEvents,
    ) {
        let (r, driver, api) = setup();
        let events = MemoryEvents::default();
        let broadcaster = EventBroadcaster::start(events.clone(), BroadcasterConfig::default());
        let r = r.with_recorder(broadcaster.new_recorder(EventSource {
            component: "vm-controller".into(),
            host: None,
        }));
        (r, driver, api, broadcaster, events)
    }

    fn server_spec(uid: &str) -> ServerSpec {
        ServerSpec {
            name: SERVER.into(),
            vm_namespace: "ns".into(),
            vm_name: "vm".into(),
            vm_uid: uid.into(),
            cpu_millis: 1000,
            memory_bytes: 1 << 30,
        }
    }

    /// Lets spawned tasks run (the tests run on one thread).
    async fn settle() {
        for _ in 0..20 {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test]
    async fn a_cancelled_context_causes_no_side_effect_at_all() {
        let (r, driver, api, broadcaster, events) = setup_with_events();
        let key = api.create(VirtualMachine::new("ns", "vm", "1", "1Gi"));
        let token = CancellationToken::new();
        token.cancel();
        let err = r
            .reconcile(&key, &ReconcileContext::new(token))
            .await
            .unwrap_err();
        assert_eq!(err, ReconcileError::NotEntitled(NotEntitled::Cancelled));
        assert!(!err.retry());
        assert!(
            !api.object(&key).unwrap().has_finalizer(),
            "no finalizer patch"
        );
        assert_eq!(api.status_writes(), 0);
        assert_eq!(driver.calls("create"), 0);
        broadcaster.shutdown().await;
        assert_eq!(events.seen(), vec![]);
    }

    #[tokio::test]
    async fn a_reconcile_cancelled_during_the_create_writes_nothing_more_and_the_late_server_is_deleted()
     {
        let (r, driver, api, broadcaster, events) = setup_with_events();
        let key = api.create(VirtualMachine::new("ns", "vm", "1", "1Gi"));
        let token = CancellationToken::new();
        let term = ReconcileContext::new(token.clone());
        driver.hold_creates();
        let r = Arc::new(r);
        let pass = tokio::spawn({
            let (r, key) = (r.clone(), key.clone());
            async move { r.reconcile(&key, &term).await }
        });
        settle().await;
        assert_eq!(driver.calls("create"), 1, "the create is in flight");
        token.cancel();
        assert_eq!(
            pass.await.unwrap(),
            Err(ReconcileError::NotEntitled(NotEntitled::Cancelled)),
            "the reconcile stops waiting at once"
        );
        // The create completes after the cancellation: the task that made it deletes it.
        driver.release_creates();
        settle().await;
        assert!(driver.server_names().is_empty(), "the late server is gone");
        assert_eq!(driver.calls("delete"), 1);
        // Only the Creating write happened: no Active, and no Failed for a VM that did not fail.
        let phases: Vec<Phase> = api.status_history().iter().map(|(p, _)| *p).collect();
        assert_eq!(phases, vec![Phase::Creating]);
        broadcaster.shutdown().await;
        assert!(
            events.seen().iter().all(|(t, _, _)| t != "Warning"),
            "{:?}",
            events.seen()
        );
        // The next leader creates it afresh.
        assert_eq!(
            r.reconcile(&key, &ctx()).await,
            Ok(Action::RequeueAfter(REFRESH))
        );
        assert_eq!(phase(&api, &key), Phase::Active);
    }

    #[tokio::test]
    async fn a_server_of_the_vms_name_with_another_uid_is_reported_and_never_adopted_or_deleted() {
        let (r, driver, api, broadcaster, events) = setup_with_events();
        let key = api.create(VirtualMachine::new("ns", "vm", "1", "1Gi"));
        let id = driver.insert(server_spec("uid-of-an-older-vm"));
        assert_eq!(
            r.reconcile(&key, &ctx()).await,
            Ok(Action::RequeueAfter(REFRESH)),
            "looked at again later, in case the name is freed"
        );
        assert_eq!(phase(&api, &key), Phase::Failed);
        assert_eq!(
            reason(&api, &key),
            format!(
                "server {SERVER} (id {id}) is not this VirtualMachine's: it has label kubeloop.dev/vm-uid=uid-of-an-older-vm but this VirtualMachine's uid is uid-vm; it is neither adopted nor deleted"
            )
        );
        assert_eq!(
            driver.server(SERVER).unwrap().spec.vm_uid,
            "uid-of-an-older-vm"
        );
        assert_eq!(driver.calls("create") + driver.calls("delete"), 0);
        // Once reported, a refresh does not rewrite the status.
        let writes = api.status_writes();
        r.reconcile(&key, &ctx()).await.unwrap();
        assert_eq!(api.status_writes(), writes);
        broadcaster.shutdown().await;
        let warnings: Vec<_> = events
            .seen()
            .into_iter()
            .filter(|(t, reason, _)| t == "Warning" && reason == REASON_SERVER_NAME_TAKEN)
            .collect();
        assert_eq!(warnings.len(), 1, "{:?}", events.seen());
        assert!(warnings[0].2.contains(&id), "{warnings:?}");

        // Finalizing the VM leaves the foreign server and still lets the object go.
        api.delete(&key);
        assert_eq!(r.reconcile(&key, &ctx()).await, Ok(Action::Done));
        assert!(api.object(&key).is_none(), "the finalizer was removed");
        assert_eq!(
            driver.server(SERVER).unwrap().id,
            id,
            "the server is still there"
        );
    }

    #[tokio::test]
    async fn a_server_of_the_vms_name_without_a_uid_label_is_reported_and_left() {
        let (r, driver, api) = setup();
        let key = api.create(VirtualMachine::new("ns", "vm", "1", "1Gi"));
        let labels = BTreeMap::from([
            (LABEL_NAMESPACE.to_string(), "ns".to_string()),
            (LABEL_NAME.to_string(), "vm".to_string()),
            (LABEL_MANAGED_BY.to_string(), DEFAULT_MANAGED_BY.to_string()),
        ]);
        let id = driver.insert_with_labels(server_spec("uid-vm"), labels);
        r.reconcile(&key, &ctx()).await.unwrap();
        assert_eq!(phase(&api, &key), Phase::Failed);
        assert!(
            reason(&api, &key).contains(&format!(
                "server {SERVER} (id {id}) is not this VirtualMachine's: it has no kubeloop.dev/vm-uid label but this VirtualMachine's uid is uid-vm"
            )),
            "{}",
            reason(&api, &key)
        );
        assert_eq!(driver.calls("create"), 0);
        assert!(driver.server(SERVER).is_some());
    }

    #[tokio::test]
    async fn finalizing_deletes_only_a_server_with_the_vms_uid_and_says_why_it_left_another() {
        let (r, driver, api, broadcaster, events) = setup_with_events();
        let key = api.create(VirtualMachine::new("ns", "vm", "1", "1Gi"));
        r.reconcile(&key, &ctx()).await.unwrap();
        // The VM's own server is replaced behind its back by another owner's of the same name.
        driver.vanish(SERVER);
        let foreign = driver.insert(server_spec("uid-elsewhere"));
        api.delete(&key);
        assert_eq!(r.reconcile(&key, &ctx()).await, Ok(Action::Done));
        assert!(api.object(&key).is_none());
        assert_eq!(driver.server(SERVER).unwrap().id, foreign);
        broadcaster.shutdown().await;
        let seen = events.seen();
        let warning = seen
            .iter()
            .find(|(t, reason, _)| t == "Warning" && reason == REASON_SERVER_NAME_TAKEN)
            .unwrap_or_else(|| panic!("no ServerNameTaken warning in {seen:?}"));
        assert!(
            warning.2.contains("uid-elsewhere") && warning.2.contains("left in place"),
            "{warning:?}"
        );
        assert!(
            !seen.iter().any(|(_, reason, _)| reason == "ServerDeleted"),
            "{seen:?}"
        );
    }

    #[tokio::test]
    async fn a_foreign_server_taking_the_name_during_the_create_is_reported_not_adopted() {
        let (r, driver, api) = setup();
        let key = api.create(VirtualMachine::new("ns", "vm", "1", "1Gi"));
        driver.hold_creates();
        let r = Arc::new(r);
        let pass = tokio::spawn({
            let (r, key) = (r.clone(), key.clone());
            async move { r.reconcile(&key, &ctx()).await }
        });
        settle().await;
        let id = driver.insert(server_spec("uid-racer"));
        driver.release_creates();
        assert_eq!(pass.await.unwrap(), Ok(Action::RequeueAfter(REFRESH)));
        assert_eq!(phase(&api, &key), Phase::Failed);
        assert!(
            reason(&api, &key).contains("uid-racer"),
            "{}",
            reason(&api, &key)
        );
        assert_eq!(driver.server(SERVER).unwrap().id, id);
    }
}
