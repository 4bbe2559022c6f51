//! The controller's writes to the apiserver, behind a small trait so that the phase machine can
//! be unit-tested against an in-memory apiserver (`fake_api.rs`) and run against the real one
//! ([`KubeVmApi`]).
//!
//! Differences from controller101 on purpose:
//! - The status goes through the status subresource (`PUT .../status`), never `Update` of the
//!   whole object; after a 409 Conflict the status is recomputed from a fresh GET (its
//!   conditions and their transition times against the fresh object's), or not written at all
//!   if the fresh object has a newer spec ([`write_status`]).
//! - The finalizer is added and removed by a merge patch of `metadata.finalizers` carrying the
//!   `resourceVersion` it was computed from, so a concurrent change of the list is a 409 that is
//!   retried, not a lost update ([`set_finalizer`]).
//!
//! Every helper returns `Ok(None)` when the object is gone: a deleted VM is not an error and is
//! not retried. Every helper is fenced: it calls [`ReconcileContext::check`] before each write
//! it sends (a conflict retry is a new write), and sends nothing once that fails
//! ([`ApiError::NotEntitled`]).

use std::future::Future;
use std::sync::Arc;

use kube_client::api::{Api, Patch, PatchParams, PostParams};
use kube_client::{Client, Error as KubeError};
use thiserror::Error;

use super::types::{FINALIZER, VirtualMachine, VirtualMachineStatus};
use crate::cache::Lister;
use crate::runtime::{Conflict, DEFAULT_RETRY, NotEntitled, ReconcileContext, retry_on_conflict};

/// How many times a write that hit a 409 is recomputed on fresh data before giving up (the
/// failure then goes back to the workqueue's rate limiter): client-go's `retry.DefaultRetry`.
pub(crate) const CONFLICT_RETRIES: usize = DEFAULT_RETRY.steps as usize;

/// An apiserver call that failed.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum ApiError {
    #[error("VirtualMachine {vm}: {operation} conflicted with a concurrent change")]
    /// The object changed since it was read (409).
    Conflict {
        /// The VM's `namespace/name`.
        vm: String,
        /// What was being done (e.g. `status update`, `create`).
        operation: &'static str,
    },
    #[error("VirtualMachine {vm}: not found during {operation}")]
    /// The object is gone (404).
    NotFound {
        /// The VM's `namespace/name`.
        vm: String,
        /// What was being done (e.g. `status update`, `create`).
        operation: &'static str,
    },
    #[error("VirtualMachine {vm}: {operation} failed: {message}")]
    /// Any other failure of the request.
    Other {
        /// The VM's `namespace/name`.
        vm: String,
        /// What was being done (e.g. `status update`, `create`).
        operation: &'static str,
        /// What the other side said.
        message: String,
    },
    #[error("VirtualMachine {vm}: {operation} still conflicted after {CONFLICT_RETRIES} attempts")]
    /// Every retry after a conflict conflicted again.
    ConflictRetriesExhausted {
        /// The VM's `namespace/name`.
        vm: String,
        /// What was being done (e.g. `status update`, `create`).
        operation: &'static str,
    },
    /// The write was not sent: the reconcile may no longer cause side effects.
    #[error("VirtualMachine {vm}: {operation} not sent: {reason}")]
    NotEntitled {
        /// The VM's `namespace/name`.
        vm: String,
        /// What was being done (e.g. `status update`, `create`).
        operation: &'static str,
        /// Why the context ended.
        reason: NotEntitled,
    },
}

/// `Ok` if `ctx` may still write, else the [`ApiError::NotEntitled`] for `operation` on `vm`.
pub(super) fn fence(
    ctx: &ReconcileContext,
    vm: &VirtualMachine,
    operation: &'static str,
) -> Result<(), ApiError> {
    ctx.check().map_err(|reason| ApiError::NotEntitled {
        vm: vm.key(),
        operation,
        reason,
    })
}

/// Reads and writes of VirtualMachines.
pub trait VmApi: Send + Sync + 'static {
    /// The informer's copy (may be stale).
    fn cached(&self, namespace: &str, name: &str) -> Option<Arc<VirtualMachine>>;

    /// A GET from the apiserver, never answered from the informer's cache (conflict retries
    /// and the orphan sweep decide on it); `None` if it does not exist.
    fn get(
        &self,
        namespace: &str,
        name: &str,
    ) -> impl Future<Output = Result<Option<VirtualMachine>, ApiError>> + Send;

    /// Sets `metadata.finalizers` to `finalizers` if the object is still at
    /// `vm.metadata.resourceVersion` (else [`ApiError::Conflict`]).
    fn patch_finalizers(
        &self,
        vm: &VirtualMachine,
        finalizers: Vec<String>,
    ) -> impl Future<Output = Result<VirtualMachine, ApiError>> + Send;

    /// `PUT` of the status subresource with `vm.status`, at `vm.metadata.resourceVersion`.
    fn replace_status(
        &self,
        vm: &VirtualMachine,
    ) -> impl Future<Output = Result<VirtualMachine, ApiError>> + Send;
}

/// Writes the status `status_of` computes for the VM, re-reading the VM and computing the
/// status again from the fresh copy after a conflict. `Ok(None)`: nothing was written, because
/// the VM is gone or because its spec changed since `vm` was read (a status computed for the
/// old spec would report on a spec the VM no longer has; the change's own watch event
/// reconciles the VM again).
pub(crate) async fn write_status<A: VmApi>(
    api: &A,
    vm: &VirtualMachine,
    status_of: impl Fn(&VirtualMachine) -> VirtualMachineStatus + Sync,
    ctx: &ReconcileContext,
) -> Result<Option<VirtualMachine>, ApiError> {
    let status_of = &status_of;
    let written = retry_on_conflict(DEFAULT_RETRY, |attempt| async move {
        let Some(mut current) = current_or_fresh(api, vm, attempt).await? else {
            return Ok(None);
        };
        if current.metadata.generation != vm.metadata.generation {
            tracing::debug!(
                vm = %vm.key(),
                "the spec changed since the status was computed; not writing it"
            );
            return Ok(None);
        }
        current.status = Some(status_of(&current));

        fence(ctx, vm, "status update")?;
        match api.replace_status(&current).await {
            Ok(updated) => {
                ctx.wrote(&updated);
                crate::trace::status_written(
                    &vm.key(),
                    "VirtualMachine",
                    &current.metadata,
                    &updated.metadata,
                    || {
                        format!(
                            "phase {}",
                            updated.status.as_ref().map_or("", |s| s.phase.as_str())
                        )
                    },
                );
                Ok(Some(updated))
            }
            Err(ApiError::NotFound { .. }) => Ok(None),
            Err(other) => Err(other),
        }
    })
    .await;
    exhausted(written, vm, "status update")
}

/// Adds (`present = true`) or removes our finalizer, re-reading after a conflict. Returns the
/// updated object, or `Ok(None)` if it is gone (removing the last finalizer of a deleting
/// object makes it disappear).
pub(crate) async fn set_finalizer<A: VmApi>(
    api: &A,
    vm: &VirtualMachine,
    present: bool,
    ctx: &ReconcileContext,
) -> Result<Option<VirtualMachine>, ApiError> {
    let written = retry_on_conflict(DEFAULT_RETRY, |attempt| async move {
        let Some(current) = current_or_fresh(api, vm, attempt).await? else {
            return Ok(None);
        };
        let mut finalizers = current.metadata.finalizers.clone().unwrap_or_default();
        let has = finalizers.iter().any(|f| f == FINALIZER);
        if has == present {
            return Ok(Some(current));
        }
        if present {
            finalizers.push(FINALIZER.to_string());
        } else {
            finalizers.retain(|f| f != FINALIZER);
        }
        fence(ctx, vm, "finalizer patch")?;
        let change = if present { "adding" } else { "removing" };
        let (key, step) = (vm.key(), crate::trace::Stage::FinalizerWritten);
        crate::trace::record(&key, step, "VirtualMachine", || {
            format!("{change} {FINALIZER}")
        });
        match api.patch_finalizers(&current, finalizers).await {
            Ok(updated) => {
                ctx.wrote(&updated);
                Ok(Some(updated))
            }
            Err(ApiError::NotFound { .. }) => Ok(None),
            Err(other) => Err(other),
        }
    })
    .await;
    exhausted(written, vm, "finalizer patch")
}

/// The VM one attempt of a write works on: the caller's copy first, a fresh GET after a
/// conflict (`None`: the VM is gone).
async fn current_or_fresh<A: VmApi>(
    api: &A,
    vm: &VirtualMachine,
    attempt: u32,
) -> Result<Option<VirtualMachine>, ApiError> {
    if attempt == 0 {
        return Ok(Some(vm.clone()));
    }
    api.get(vm.namespace(), vm.name()).await
}

/// A conflict left after the last attempt, said as such.
fn exhausted<T>(
    written: Result<T, ApiError>,
    vm: &VirtualMachine,
    operation: &'static str,
) -> Result<T, ApiError> {
    written.map_err(|e| match e {
        ApiError::Conflict { .. } => ApiError::ConflictRetriesExhausted {
            vm: vm.key(),
            operation,
        },
        other => other,
    })
}

/// A write that lost a race is retried on a fresh read ([`retry_on_conflict`]).
impl Conflict for ApiError {
    fn is_conflict(&self) -> bool {
        matches!(self, ApiError::Conflict { .. })
    }
}

/// [`VmApi`] over the real apiserver and the informer's lister.
#[derive(Clone)]
pub struct KubeVmApi {
    client: Client,
    lister: Lister<VirtualMachine>,
}

impl KubeVmApi {
    /// The apiserver through `client`, with `lister` (the informer's cache) for reads.
    pub fn new(client: Client, lister: Lister<VirtualMachine>) -> Self {
        Self { client, lister }
    }

    fn api(&self, namespace: &str) -> Api<VirtualMachine> {
        Api::namespaced(self.client.clone(), namespace)
    }
}

fn classify(vm: &VirtualMachine, operation: &'static str, error: KubeError) -> ApiError {
    match error {
        KubeError::Api(status) if status.code == 409 => ApiError::Conflict {
            vm: vm.key(),
            operation,
        },
        KubeError::Api(status) if status.is_not_found() => ApiError::NotFound {
            vm: vm.key(),
            operation,
        },
        other => ApiError::Other {
            vm: vm.key(),
            operation,
            message: other.to_string(),
        },
    }
}

impl VmApi for KubeVmApi {
    fn cached(&self, namespace: &str, name: &str) -> Option<Arc<VirtualMachine>> {
        self.lister.get(namespace, name)
    }

    async fn get(&self, namespace: &str, name: &str) -> Result<Option<VirtualMachine>, ApiError> {
        self.api(namespace)
            .get_opt(name)
            .await
            .map_err(|e| ApiError::Other {
                vm: format!("{namespace}/{name}"),
                operation: "get",
                message: e.to_string(),
            })
    }

    async fn patch_finalizers(
        &self,
        vm: &VirtualMachine,
        finalizers: Vec<String>,
    ) -> Result<VirtualMachine, ApiError> {
        // A merge patch replaces the whole list; the resourceVersion makes it conditional.
        let patch = serde_json::json!({
            "metadata": {"finalizers": finalizers, "resourceVersion": vm.metadata.resource_version}
        });
        self.api(vm.namespace())
            .patch(vm.name(), &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(|e| classify(vm, "finalizer patch", e))
    }

    async fn replace_status(&self, vm: &VirtualMachine) -> Result<VirtualMachine, ApiError> {
        self.api(vm.namespace())
            .replace_status(vm.name(), &PostParams::default(), vm)
            .await
            .map_err(|e| classify(vm, "status update", e))
    }
}
