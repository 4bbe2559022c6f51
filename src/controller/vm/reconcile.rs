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
//! Safe failover, three defences (the fence arithmetic is in `src/runtime/leadership.rs`):
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
    DeleteOutcome, Driver, DriverError, DriverServerStatus, ServerSpec, server_name, uid_label_text,
};
use super::error_policy::ReconcileError;
use super::quantity::{Resources, resources_of};
use super::types::{Phase, ServerStatus, ServerUsage, VirtualMachine, VirtualMachineStatus};
use crate::record::{AnyEventRecorder, EventType};
use crate::runtime::Action;
use crate::runtime::{NotEntitled, ObjectKey, ReconcileContext};

/// controller101 refreshed usage on a 20-30 s resync; we requeue each Active VM after this.
pub const DEFAULT_REFRESH_INTERVAL: Duration = Duration::from_secs(20);

/// The Warning event reason when a server of the VM's name is not the VM's.
pub(crate) const REASON_SERVER_NAME_TAKEN: &str = "ServerNameTaken";

/// How long a VM the engine refused ([`DriverError::Refused`]: image missing, limits it
/// cannot apply) waits before the same spec is tried again; an edit of the spec tries at once.
pub(crate) const DEFAULT_REFUSED_RETRY_INTERVAL: Duration = Duration::from_secs(600);

/// The wait before the first restart of a server that exited; each further exit in a row
/// doubles it, up to [`CRASH_BACKOFF_MAX`] (the kubelet's container restart backoff).
pub(crate) const CRASH_BACKOFF_BASE: Duration = Duration::from_secs(10);
/// The longest wait before restarting a server that keeps exiting.
pub(crate) const CRASH_BACKOFF_MAX: Duration = Duration::from_secs(300);
/// After this many exits in a row the VM's phase is `CrashLoopBackOff` (before: `Failed`).
pub(crate) const CRASH_LOOP_AFTER: i32 = 3;
/// A server that has run this long since its last start has its restart count reset.
pub(crate) const CRASH_RESET_AFTER: Duration = Duration::from_secs(600);

/// Settings of the phase machine.
#[derive(Clone, Debug)]
pub(crate) struct ReconcilerConfig {
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
pub(crate) fn crash_backoff(restarts: i32) -> Duration {
    CRASH_BACKOFF_BASE
        .saturating_mul(1u32 << restarts.clamp(0, 16))
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
pub(crate) struct Reconciler<D, A> {
    /// Shared with the create tasks, which outlive a cancelled reconcile to undo what they made.
    driver: Arc<D>,
    api: A,
    config: ReconcilerConfig,
    /// Events for `kubectl describe vm` (none in unit tests).
    recorder: Option<AnyEventRecorder>,
}

/// A server of the VM's name that is not the VM's.
struct NameTaken<'a> {
    server: &'a str,
    id: &'a str,
    found_uid: Option<&'a str>,
}

impl<D: Driver, A: VmApi> Reconciler<D, A> {
    /// A reconciler creating servers through `driver` and writing through `api`.
    pub(crate) fn new(driver: D, api: A, config: ReconcilerConfig) -> Self {
        Self {
            driver: Arc::new(driver),
            api,
            config,
            recorder: None,
        }
    }

    /// Also records Kubernetes Events about the VMs.
    pub(crate) fn with_recorder(mut self, recorder: AnyEventRecorder) -> Self {
        self.recorder = Some(recorder);
        self
    }

    /// Records that `action` was taken on the VM for `reason`, unless the reconcile may no
    /// longer cause side effects.
    fn event(
        &self,
        ctx: &ReconcileContext,
        vm: &VirtualMachine,
        event_type: EventType,
        reason: &str,
        action: &str,
        message: &str,
    ) {
        if let Some(recorder) = &self.recorder
            && ctx.is_entitled()
        {
            recorder.event(vm, None, event_type, reason, action, message);
        }
    }

    /// The apiserver access (for tests and wiring).
    pub(crate) fn api(&self) -> &A {
        &self.api
    }

    /// The driver (for tests and wiring).
    pub(crate) fn driver(&self) -> &D {
        &self.driver
    }

    /// One pass over the VM named by `key`, entitled to side effects while `ctx` is.
    pub(crate) async fn reconcile(
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
                    "Validate",
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
                self.event(ctx, &vm, EventType::Normal, "Resizing", "Resize", &resize);
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
                    self.event(
                        ctx,
                        &vm,
                        EventType::Warning,
                        "ServerVanished",
                        "Refresh",
                        &vanished,
                    );
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
        restarts: i32,
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
            restarts.saturating_add(1)
        );
        info!(vm = %vm.key(), "{message}");
        self.event(
            ctx,
            vm,
            EventType::Normal,
            "Restarting",
            "Restart",
            &message,
        );
        let started = match self.start(vm, server, resources, ctx).await? {
            Started::Server(started) => started,
            Started::Handled(action) => return Ok(action),
        };
        self.after_start(vm, server, &started, restarts.saturating_add(1), ctx)
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
        restarts: i32,
        ctx: &ReconcileContext,
    ) -> Result<Action, ReconcileError> {
        let at = k8s_openapi::jiff::Timestamp::now();
        let (due, wait) = restart_due(status, restarts, at).unwrap_or((at, Duration::ZERO));
        let phase = if restarts.saturating_add(1) >= CRASH_LOOP_AFTER {
            Phase::CrashLoopBackOff
        } else {
            Phase::Failed
        };
        let reason = format!(
            "server {server} {}; exit {} in a row; restarting it at {due:.0}",
            exit_text(status),
            restarts.saturating_add(1)
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
                "Create",
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
                    "Delete",
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
                    "Delete",
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
                        "Delete",
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
        restarts: i32,
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
                self.event(
                    ctx,
                    vm,
                    EventType::Warning,
                    "Failed",
                    "Reconcile",
                    &status.reason,
                );
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
        // After a conflict, the conditions are derived again from the fresh object.
        let written = write_status(
            &self.api,
            vm,
            |current| with_conditions(current, status.clone()),
            ctx,
        )
        .await?;

        if written.is_some()
            && let Some((event_type, reason, message)) = transition
        {
            self.event(ctx, vm, event_type, reason, "SetPhase", &message);
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
pub(crate) const USAGE_WRITE_THRESHOLD: f64 = 1.0;

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
fn restarts_of(vm: &VirtualMachine) -> i32 {
    vm.status.as_ref().map_or(0, |s| s.restarts)
}

/// For a stopped server restarted `restarts` times in a row: `Some((when it is due, how long
/// from now))` if its restart is still ahead, `None` if it is due.
fn restart_due(
    status: &DriverServerStatus,
    restarts: i32,
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
mod tests;
