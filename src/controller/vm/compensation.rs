//! Defence 2 of the three in `reconcile.rs` ("Safe failover"), compensation: a server create that completes after its
//! reconcile lost the right to cause side effects is undone by the one who made it.
//!
//! A container engine cannot check a fencing token, and cancelling a request already sent does
//! not unsend it. So `create_fenced` runs `Driver::create_server` as a task of its own that
//! owns the driver (an `Arc`), the spec and a clone of the reconcile's context, and the reconcile
//! only waits for it (and stops waiting when the context is cancelled). The task alone decides,
//! when the create returns, who owns the server:
//! - the context still passes [`ReconcileContext::check`] and the reconcile still waits: the
//!   server is handed over (a oneshot send, which fails atomically if the reconcile has stopped
//!   waiting), and the reconcile records it;
//! - otherwise (the term ended or the reconcile was cancelled while the create was in flight,
//!   or the reconcile stopped waiting for any reason, including its future being dropped): the
//!   task deletes the server by the engine id the create returned, only if its
//!   `kubeloop.dev/vm-uid` label is the VM's, and logs it at warn level naming the VM.
//!
//! Covered: any create whose response arrives after the context ended, whether or not the
//! reconcile was still waiting, for as long as this process lives.
//!
//! Not covered, and who covers it:
//! - The process dies (SIGKILL, OOM, power) with a create in flight: nobody is left to undo it.
//!   The server carries the VM's uid; the next leader's reconcile adopts it if the VM still
//!   exists, and the orphan sweep (defence 3, [`super::sweep`]) removes it if not.
//! - A successor adopts the server between the create's completion and its undoing (the
//!   successor's reconcile saw it running with the VM's uid and recorded it Active): the undo
//!   still deletes it. The successor's next refresh (every `refresh_interval`) reports the
//!   server vanished and recreates it, so the VM converges, one restart later.
//! - A create that *adopted* an existing server (it was there before this call, with this VM's
//!   uid) is not undone: this call did not make it. Starting it is the only side effect; the
//!   next leader's reconcile decides about it (adopt, or finalize if the VM is being deleted).
//! - A server handed over in time whose reconcile then stops before recording it (the context
//!   ends right after the hand-over): it was made within the term and carries the VM's uid;
//!   the next leader adopts it or the sweep removes it, as for a crash.
//! - The undo itself fails (engine unreachable): logged; as for a crash.

use std::sync::Arc;

use tokio::sync::oneshot;
use tracing::warn;

use super::driver::{Created, DeleteOutcome, Driver, DriverError, ServerSpec};
use crate::runtime::{NotEntitled, ReconcileContext};

/// What the create task reports to the waiting reconcile: the create's outcome, or that the
/// context ended before the outcome could be handed over (the task then undid the create).
type Report = Result<Result<Created, DriverError>, NotEntitled>;

/// Creates the server for `spec` (of VM `vm`, `namespace/name`) in a task of its own and waits
/// for it while `ctx` is not cancelled. `Err(NotEntitled)`: the reconcile must stop; the task
/// undoes the create if it completes (see the module docs). The caller checks `ctx` before.
///
/// # Cancel safety
/// Dropping the returned future leaves the task running; it then undoes the create as if the
/// context had been cancelled.
pub(crate) async fn create_fenced<D: Driver>(
    driver: &Arc<D>,
    spec: ServerSpec,
    vm: &str,
    ctx: &ReconcileContext,
) -> Result<Result<Created, DriverError>, NotEntitled> {
    let (tx, rx) = oneshot::channel::<Report>();
    tokio::spawn(run_create(
        Arc::clone(driver),
        spec.clone(),
        vm.to_string(),
        ctx.clone(),
        tx,
    ));
    tokio::select! {
        // An outcome already handed over wins a tie with the cancellation: it is ours now.
        biased;
        report = rx => match report {
            Ok(report) => report,
            // The task ended without reporting: it panicked inside the driver.
            Err(_) => Ok(Err(DriverError::Engine {
                engine: driver.engine().to_string(),
                operation: "create",
                server: spec.name,
                message: "the create task ended without a result".into(),
            })),
        },
        () = ctx.cancelled() => Err(NotEntitled::Cancelled),
    }
}

/// The create task: create, then hand the server over or undo it.
async fn run_create<D: Driver>(
    driver: Arc<D>,
    spec: ServerSpec,
    vm: String,
    ctx: ReconcileContext,
    tx: oneshot::Sender<Report>,
) {
    let created = match driver.create_server(&spec).await {
        Ok(created) => created,
        Err(e) => {
            // Nothing was made (or adopted): nothing to undo.
            let _ = tx.send(Ok(Err(e)));
            return;
        }
    };
    let why = match ctx.check() {
        Ok(()) => match tx.send(Ok(Ok(created))) {
            Ok(()) => return,
            Err(Ok(Ok(created))) => {
                return undo(
                    &*driver,
                    &spec,
                    &vm,
                    created,
                    "its reconcile stopped waiting",
                )
                .await;
            }
            // Only `Ok(Ok(_))` was sent.
            Err(_) => return,
        },
        Err(reason) => {
            let _ = tx.send(Err(reason));
            reason
        }
    };
    undo(&*driver, &spec, &vm, created, &why.to_string()).await;
}

/// Deletes the server a create made after its reconcile lost entitlement (`why`).
async fn undo<D: Driver>(driver: &D, spec: &ServerSpec, vm: &str, created: Created, why: &str) {
    let id = &created.status.id;
    if created.adopted {
        warn!(
            vm,
            server = %spec.name,
            id = %id,
            "a create completed after {why}; it adopted a server that existed before, which is left for the next leader"
        );
        return;
    }
    match driver.delete_server(id, &spec.vm_uid).await {
        Ok(DeleteOutcome::Deleted { .. }) => warn!(
            vm,
            server = %spec.name,
            id = %id,
            "a create completed after {why}; deleted the server it made"
        ),
        Ok(DeleteOutcome::Absent) => warn!(
            vm,
            server = %spec.name,
            id = %id,
            "a create completed after {why}; the server it made is already gone"
        ),
        Ok(DeleteOutcome::NotOwned { found_uid, .. }) => warn!(
            vm,
            server = %spec.name,
            id = %id,
            found_uid = ?found_uid,
            "a create completed after {why}; the server no longer carries the VM's uid, left alone"
        ),
        Err(error) => warn!(
            vm,
            server = %spec.name,
            id = %id,
            %error,
            "a create completed after {why}; deleting the server it made failed (the orphan sweep or the next leader will see it)"
        ),
    }
}

#[cfg(test)]
mod tests {
    use tokio::task::JoinHandle;
    use tokio_util::sync::CancellationToken;

    use super::*;
    use crate::controller::vm::driver::FakeDriver;
    use crate::controller::vm::fixture::{SERVER, server_spec, settle};

    fn spec() -> ServerSpec {
        server_spec("ns", "vm", "uid-vm")
    }

    /// A `create_fenced` of `ns/vm`'s server in a task of its own, held in flight by `driver`
    /// (release it with `release_creates`), and the token that cancels its context.
    async fn create_in_flight(driver: &FakeDriver) -> (JoinHandle<Report>, CancellationToken) {
        let shared = Arc::new(driver.clone());
        let token = CancellationToken::new();
        let ctx = ReconcileContext::new(token.clone());
        driver.hold_creates();
        let waiting =
            tokio::spawn(async move { create_fenced(&shared, spec(), "ns/vm", &ctx).await });
        settle().await;
        (waiting, token)
    }

    #[tokio::test]
    async fn a_create_in_flight_when_the_reconcile_is_cancelled_is_undone_when_it_completes() {
        let driver = FakeDriver::new();
        let (waiting, token) = create_in_flight(&driver).await;
        assert_eq!(driver.calls("create"), 1, "the create is in flight");
        token.cancel();
        assert_eq!(waiting.await.unwrap(), Err(NotEntitled::Cancelled));
        driver.release_creates();
        settle().await;
        assert!(
            driver.server_names().is_empty(),
            "the late create was undone"
        );
        assert_eq!(driver.calls("delete"), 1);
    }

    #[tokio::test]
    async fn a_create_whose_reconcile_was_dropped_is_undone_when_it_completes() {
        // The reconcile future is dropped (a runtime aborting it) while the context stays
        // entitled: the hand-over fails, so the task undoes what it made.
        let driver = FakeDriver::new();
        let (waiting, _token) = create_in_flight(&driver).await;
        waiting.abort();
        assert!(waiting.await.unwrap_err().is_cancelled());
        // Still entitled, but nobody waits any more: the task undoes what it made.
        driver.release_creates();
        settle().await;
        assert!(driver.server_names().is_empty());
    }

    #[tokio::test]
    async fn a_create_that_adopted_an_existing_server_is_not_undone() {
        let driver = FakeDriver::new();
        let id = driver.insert(spec());
        let (waiting, token) = create_in_flight(&driver).await;
        token.cancel();
        assert_eq!(waiting.await.unwrap(), Err(NotEntitled::Cancelled));
        driver.release_creates();
        settle().await;
        assert_eq!(driver.server(SERVER).unwrap().id, id);
        assert_eq!(driver.calls("delete"), 0);
    }

    #[tokio::test]
    async fn a_create_finished_in_time_is_handed_over_and_kept() {
        let driver = FakeDriver::new();
        let ctx = ReconcileContext::detached();
        let created = create_fenced(&Arc::new(driver.clone()), spec(), "ns/vm", &ctx)
            .await
            .unwrap()
            .unwrap();
        assert!(!created.adopted);
        settle().await;
        assert_eq!(driver.server(SERVER).unwrap().id, created.status.id);
    }
}
