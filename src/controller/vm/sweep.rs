//! Defence 3 of the three in `reconcile.rs` ("Safe failover"), the orphan sweep: the leader lists the servers it manages
//! and removes those whose VirtualMachine no longer exists.
//!
//! controller101 has nothing like it; controller-runtime and kube-runtime leave it to the
//! controller. The runtime calls [`sweep_orphans`] when a replica becomes leader and every
//! [`DEFAULT_SWEEP_INTERVAL`] while it leads.
//!
//! What it covers: a server whose create completed after its maker died (SIGKILL mid-create,
//! so compensation never ran, see [`super::compensation`]) or whose undo failed, and whose VM
//! has been deleted since (a VM that still exists adopts its server on its next reconcile);
//! a server left behind when a VM lost its finalizer by hand; the server of an earlier VM of
//! the same name (that VM is gone: its uid is not the uid of the VM now bearing the name).
//!
//! How it decides, per server carrying the driver's `kubeloop.dev/managed-by` value (within
//! the namespace, if the controller watches one):
//! - no `kubeloop.dev/vm-namespace`, `vm-name` or `vm-uid` label: kept (whose it is cannot be
//!   told; never guess);
//! - a GET of its VM *from the apiserver*, never from the informer's cache (a cache that has
//!   not seen a new VM yet would make its fresh server look orphaned): the VM exists with the
//!   server's uid, kept; the VM does not exist, or exists with another uid (a re-created VM),
//!   removed; the GET fails, kept (and logged);
//! - before each removal [`ReconcileContext::check`]: a sweep stops as soon as its leader is
//!   not entitled any more. Removal is by the engine id with the uid checked
//!   (`Driver::delete_server`), so a server re-created under that name meanwhile is never
//!   the one removed. Deciding on uids makes the race with a concurrent create harmless: a
//!   uid that is gone from the apiserver never comes back.
//!
//! Not covered: two clusters sharing one engine with the same managed-by value each see the
//! other's servers as orphans; give them distinct values (`DockerDriverConfig::managed_by`).

use std::time::Duration;

use thiserror::Error;
use tracing::{debug, warn};

use super::api::VmApi;
use super::driver::{DeleteOutcome, Driver, DriverError, ManagedServer};
use super::reconcile::until_cancelled;
use crate::runtime::{NotEntitled, ReconcileContext};

/// How often a leader sweeps (besides once when it becomes leader). Orphans are rare (a crash
/// mid-create, a failed undo) and cost only resources, so minutes are soon enough.
pub const DEFAULT_SWEEP_INTERVAL: Duration = Duration::from_secs(5 * 60);

/// What one sweep did. `examined == removed + kept`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SweepReport {
    /// Managed servers in scope.
    pub examined: usize,
    /// Orphans deleted (or found already gone when deleted).
    pub removed: usize,
    /// Servers of live VMs, servers whose VM cannot be told, and orphans whose removal failed.
    pub kept: usize,
}

/// Why a sweep did not finish.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum SweepError {
    #[error("orphan sweep: listing the managed servers failed: {0}")]
    /// Listing the engine's servers failed.
    List(DriverError),
    /// The context ended; `report` is what was done until then.
    #[error("orphan sweep stopped after examining {} servers: {reason}", report.examined)]
    NotEntitled {
        /// Why the context ended.
        reason: NotEntitled,
        /// What the sweep did before it stopped.
        report: SweepReport,
    },
}

/// Removes the managed servers whose VirtualMachine is gone (see the module docs); only those
/// labelled with VM namespace `namespace` if it is `Some`.
pub async fn sweep_orphans<D: Driver, A: VmApi>(
    driver: &D,
    api: &A,
    namespace: Option<&str>,
    ctx: &ReconcileContext,
) -> Result<SweepReport, SweepError> {
    let mut report = SweepReport::default();
    let stopped = |reason, report| SweepError::NotEntitled { reason, report };
    let servers = until_cancelled(ctx, driver.list_servers())
        .await
        .map_err(|reason| stopped(reason, report))?
        .map_err(SweepError::List)?;
    for server in servers {
        if namespace.is_some_and(|ns| server.vm_namespace.as_deref() != Some(ns)) {
            continue;
        }
        report.examined += 1;
        let removed = until_cancelled(ctx, sweep_one(driver, api, &server, ctx))
            .await
            .and_then(|removed| removed)
            .map_err(|reason| stopped(reason, report))?;
        if removed {
            report.removed += 1;
        } else {
            report.kept += 1;
        }
    }
    Ok(report)
}

/// Decides about one server and removes it if it is an orphan; `Ok(true)` if it is gone.
async fn sweep_one<D: Driver, A: VmApi>(
    driver: &D,
    api: &A,
    server: &ManagedServer,
    ctx: &ReconcileContext,
) -> Result<bool, NotEntitled> {
    let (Some(ns), Some(name), Some(uid)) = (
        server.vm_namespace.as_deref(),
        server.vm_name.as_deref(),
        server.vm_uid.as_deref(),
    ) else {
        debug!(server = %server.name, id = %server.id, "managed server without VM labels; kept");
        return Ok(false);
    };
    let vm = format!("{ns}/{name}");
    let why = match api.get(ns, name).await {
        Ok(Some(live)) if live.uid() == uid => return Ok(false),
        Ok(Some(live)) => format!(
            "VirtualMachine {vm} now has uid {}; the one with uid {uid} is gone",
            live.uid()
        ),
        Ok(None) => format!("VirtualMachine {vm} (uid {uid}) no longer exists"),
        Err(error) => {
            warn!(server = %server.name, vm = %vm, %error, "orphan sweep: cannot tell whether the VM exists; kept");
            return Ok(false);
        }
    };
    ctx.check()?;
    match driver.delete_server(&server.id, uid).await {
        Ok(DeleteOutcome::Deleted { id }) => {
            warn!(server = %server.name, id = %id, vm = %vm, "orphan sweep removed the server: {why}");
            Ok(true)
        }
        Ok(DeleteOutcome::Absent) => Ok(true),
        Ok(DeleteOutcome::NotOwned { found_uid, .. }) => {
            warn!(server = %server.name, vm = %vm, found_uid = ?found_uid, "orphan sweep: the server's uid changed under it; kept");
            Ok(false)
        }
        Err(error) => {
            warn!(server = %server.name, vm = %vm, %error, "orphan sweep: removing the server failed; kept");
            Ok(false)
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use tokio_util::sync::CancellationToken;

    use super::*;
    use crate::controller::vm::driver::{
        DEFAULT_MANAGED_BY, LABEL_MANAGED_BY, LABEL_NAME, LABEL_NAMESPACE, LABEL_UID, server_name,
    };
    use crate::controller::vm::fixture::{VmFixture, server_spec};
    use crate::controller::vm::types::VirtualMachine;

    #[tokio::test]
    async fn the_sweep_removes_only_servers_whose_vm_is_gone() {
        let VmFixture { driver, api, .. } = VmFixture::new();
        // FakeApi gives VM `name` the uid `uid-<name>`.
        api.create(VirtualMachine::namespaced("ns", "live", "1", "1Gi"));
        api.create(VirtualMachine::namespaced("ns", "reborn", "1", "1Gi"));
        driver.insert(server_spec("ns", "live", "uid-live"));
        driver.insert(server_spec("ns", "gone", "uid-gone"));
        // The server of an earlier VM of the same name.
        driver.insert(server_spec("ns", "reborn", "uid-old"));
        // Managed, but without a uid: whose it is cannot be told.
        let mut no_uid = BTreeMap::from([(LABEL_MANAGED_BY.into(), DEFAULT_MANAGED_BY.into())]);
        no_uid.insert(LABEL_NAMESPACE.into(), "ns".into());
        no_uid.insert(LABEL_NAME.into(), "nouid".into());
        driver.insert_with_labels(server_spec("ns", "nouid", ""), no_uid);
        // Another owner's (another cluster's managed-by value) and an unlabelled one.
        let mut foreign = BTreeMap::from([(LABEL_MANAGED_BY.into(), "someone-else".into())]);
        foreign.insert(LABEL_NAMESPACE.into(), "ns".into());
        foreign.insert(LABEL_NAME.into(), "theirs".into());
        foreign.insert(LABEL_UID.into(), "uid-theirs".into());
        driver.insert_with_labels(server_spec("ns", "theirs", "uid-theirs"), foreign);
        driver.insert_with_labels(server_spec("ns", "bare", "x"), BTreeMap::new());

        let report = sweep_orphans(&driver, &api, None, &ReconcileContext::detached())
            .await
            .unwrap();
        assert_eq!(
            report,
            SweepReport {
                examined: 4,
                removed: 2,
                kept: 2
            }
        );
        let mut left = driver.server_names();
        left.sort();
        assert_eq!(
            left,
            vec![
                server_name("ns", "bare"),
                server_name("ns", "live"),
                server_name("ns", "nouid"),
                server_name("ns", "theirs"),
            ]
        );
    }

    #[tokio::test]
    async fn the_sweep_decides_from_the_apiserver_not_from_a_cache_that_lags() {
        let VmFixture { driver, api, .. } = VmFixture::new();
        let key = api.create(VirtualMachine::namespaced("ns", "new", "1", "1Gi"));
        api.hide_from_cache(&key);
        driver.insert(server_spec("ns", "new", "uid-new"));
        let report = sweep_orphans(&driver, &api, None, &ReconcileContext::detached())
            .await
            .unwrap();
        assert_eq!((report.removed, report.kept), (0, 1));
        assert!(driver.server(&server_name("ns", "new")).is_some());
    }

    #[tokio::test]
    async fn the_sweep_stays_in_its_namespace() {
        let VmFixture { driver, api, .. } = VmFixture::new();
        driver.insert(server_spec("mine", "gone", "uid-a"));
        driver.insert(server_spec("other", "gone", "uid-b"));
        let report = sweep_orphans(&driver, &api, Some("mine"), &ReconcileContext::detached())
            .await
            .unwrap();
        assert_eq!((report.examined, report.removed), (1, 1));
        assert_eq!(driver.server_names(), vec![server_name("other", "gone")]);
    }

    #[tokio::test]
    async fn a_sweep_without_entitlement_removes_nothing() {
        let VmFixture { driver, api, .. } = VmFixture::new();
        driver.insert(server_spec("ns", "gone", "uid-gone"));
        let token = CancellationToken::new();
        token.cancel();
        let err = sweep_orphans(&driver, &api, None, &ReconcileContext::new(token))
            .await
            .unwrap_err();
        assert!(
            matches!(
                err,
                SweepError::NotEntitled {
                    reason: NotEntitled::Cancelled,
                    ..
                }
            ),
            "{err:?}"
        );
        assert_eq!(driver.server_names().len(), 1);
        assert_eq!(driver.calls("delete"), 0);
    }

    #[tokio::test]
    async fn an_engine_that_cannot_list_fails_the_sweep_naming_it() {
        let VmFixture { driver, api, .. } = VmFixture::new();
        driver.set_unreachable(true);
        let err = sweep_orphans(&driver, &api, None, &ReconcileContext::detached())
            .await
            .unwrap_err();
        assert!(
            err.to_string().contains("fake engine is unreachable"),
            "{err}"
        );
    }
}
