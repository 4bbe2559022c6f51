use super::*;
use crate::controller::vm::fixture::{REFRESH, SERVER, VmFixture, ctx, server_spec, settle};
use crate::controller::vm::types::FINALIZER;

#[tokio::test]
async fn a_new_vm_gets_the_finalizer_then_a_server_and_becomes_active_with_a_timed_requeue() {
    let f = VmFixture::new();
    let key = f
        .api
        .create(VirtualMachine::namespaced("ns", "vm", "2", "4G"));
    assert_eq!(f.reconcile(&key).await, Ok(Action::RequeueAfter(REFRESH)));
    let vm = f.api.object(&key).unwrap();
    assert!(vm.has_finalizer());
    assert_eq!(vm.phase(), Phase::Active);
    let server = f.driver.server(SERVER).expect("server created");
    assert_eq!(
        (server.spec.cpu_millis, server.spec.memory_bytes),
        (2000, 4_000_000_000)
    );
    assert_eq!(server.spec.vm_uid, "uid-vm");
    assert_eq!(vm.status.unwrap().server.unwrap().id, server.id);
    // Two status writes: Creating, then Active.
    assert_eq!(f.api.status_writes(), 2);
}

#[tokio::test]
async fn the_refresh_updates_usage_and_keeps_the_same_server() {
    let f = VmFixture::new();
    let key = f.create_vm();
    f.reconcile(&key).await.unwrap();
    f.driver.set_usage(SERVER, 97.123, 12.5);
    assert_eq!(f.reconcile(&key).await, Ok(Action::RequeueAfter(REFRESH)));
    let usage = f.status(&key).server.unwrap().usage;
    assert_eq!((usage.cpu, usage.memory), (97.12, 12.5));
    assert_eq!(f.driver.calls("create"), 1);
}

#[tokio::test]
async fn a_refresh_that_changes_nothing_a_user_sees_writes_no_status() {
    let f = VmFixture::new();
    let key = f.create_vm();
    f.reconcile(&key).await.unwrap();
    f.driver.set_usage(SERVER, 40.0, 10.0);
    f.reconcile(&key).await.unwrap();
    let writes = f.api.status_writes();
    // Below the threshold on both: still requeued, nothing written.
    f.driver
        .set_usage(SERVER, 40.0 + USAGE_WRITE_THRESHOLD / 2.0, 10.3);
    assert_eq!(f.reconcile(&key).await, Ok(Action::RequeueAfter(REFRESH)));
    assert_eq!(f.api.status_writes(), writes);
    // A move of the threshold or more is written.
    f.driver
        .set_usage(SERVER, 40.0 + USAGE_WRITE_THRESHOLD, 10.0);
    f.reconcile(&key).await.unwrap();
    assert_eq!(f.api.status_writes(), writes + 1);
    // So is a changed state, whatever the usage.
    f.driver.stop(SERVER);
    f.reconcile(&key).await.unwrap();
    assert!(f.api.status_writes() > writes + 1);
}

#[tokio::test]
async fn the_finalizer_is_added_before_the_server_is_created() {
    let f = VmFixture::new();
    let key = f.create_vm();
    // An engine outage on the first pass: the finalizer must already be there.
    f.driver.set_unreachable(true);
    assert!(f.reconcile(&key).await.is_err());
    assert!(f.api.object(&key).unwrap().has_finalizer());
    assert_eq!(f.driver.calls("create"), 0);
}

#[tokio::test]
async fn a_vm_deleted_while_creating_is_terminated_and_its_server_deleted() {
    let f = VmFixture::new();
    let key = f.create_vm();
    // The create fails after the Creating status was written: the VM sits in Creating/Failed
    // with its finalizer; put it back to Creating as a crash mid-create would leave it.
    f.driver.fail_creates(1);
    assert!(f.reconcile(&key).await.is_err());
    let mut vm = f.api.object(&key).unwrap();
    vm.status.as_mut().unwrap().phase = Phase::Creating;
    f.api.replace_status(&vm).await.unwrap();
    // A container the crashed create had already made.
    f.driver.insert(server_spec("ns", "vm", "uid-vm"));
    f.api.delete(&key);
    assert_eq!(
        f.phase(&key),
        Phase::Creating,
        "the finalizer holds the object"
    );
    assert_eq!(f.reconcile(&key).await, Ok(Action::Done));
    assert!(f.driver.server(SERVER).is_none(), "the server is deleted");
    assert!(
        f.api.object(&key).is_none(),
        "the finalizer was removed and the object is gone"
    );
}

#[tokio::test]
async fn an_active_vm_deleted_goes_terminating_then_its_server_and_object_go() {
    let f = VmFixture::new();
    let key = f.create_vm();
    f.reconcile(&key).await.unwrap();
    f.api.delete(&key);
    // The engine refuses the delete once: the VM is Terminating with the error as reason.
    f.driver.set_unreachable(true);
    assert!(f.reconcile(&key).await.is_err());
    assert_eq!(f.phase(&key), Phase::Terminating);
    assert!(
        f.reason(&key).contains("fake engine is unreachable"),
        "{}",
        f.reason(&key)
    );
    f.driver.set_unreachable(false);
    assert_eq!(f.reconcile(&key).await, Ok(Action::Done));
    assert!(f.driver.server_names().is_empty());
    assert!(f.api.object(&key).is_none());
}

#[tokio::test]
async fn a_failed_create_records_failed_and_the_retry_succeeds() {
    let f = VmFixture::new();
    let key = f.create_vm();
    f.driver.fail_creates(2);
    let first = f.reconcile(&key).await.unwrap_err();
    assert!(first.retry(), "driver errors go back to the rate limiter");
    assert_eq!(f.phase(&key), Phase::Failed);
    assert!(
        f.reason(&key).contains("injected failure"),
        "{}",
        f.reason(&key)
    );
    assert!(f.reconcile(&key).await.is_err());
    assert_eq!(f.reconcile(&key).await, Ok(Action::RequeueAfter(REFRESH)));
    assert_eq!(f.phase(&key), Phase::Active);
    assert_eq!(f.reason(&key), "");
    assert_eq!(f.driver.calls("create"), 3);
}

#[tokio::test]
async fn a_vanished_server_says_so_in_phase_and_reason_and_is_recreated() {
    let f = VmFixture::new();
    let key = f.create_vm();
    f.reconcile(&key).await.unwrap();
    let old_id = f.driver.server(SERVER).unwrap().id;
    assert!(f.driver.vanish(SERVER));
    let before = f.api.status_history().len();
    assert_eq!(f.reconcile(&key).await, Ok(Action::RequeueAfter(REFRESH)));
    let history = f.api.status_history()[before..].to_vec();
    let phases: Vec<Phase> = history.iter().map(|(p, _)| *p).collect();
    assert_eq!(phases, vec![Phase::Failed, Phase::Creating, Phase::Active]);
    assert_eq!(
        history[0].1,
        format!("server {SERVER} (id {old_id}) vanished; recreating it")
    );
    assert_ne!(f.driver.server(SERVER).unwrap().id, old_id, "a new server");
}

#[tokio::test]
async fn a_vanished_server_whose_recreation_fails_stays_failed_and_is_retried() {
    let f = VmFixture::new();
    let key = f.create_vm();
    f.reconcile(&key).await.unwrap();
    f.driver.vanish(SERVER);
    f.driver.fail_creates(1);
    assert!(f.reconcile(&key).await.unwrap_err().retry());
    assert_eq!(f.phase(&key), Phase::Failed);
    assert!(
        f.reason(&key).contains("injected failure"),
        "{}",
        f.reason(&key)
    );
    assert_eq!(f.reconcile(&key).await, Ok(Action::RequeueAfter(REFRESH)));
    assert_eq!(f.phase(&key), Phase::Active);
}

#[tokio::test]
async fn a_server_that_already_exists_is_adopted_not_stuck_in_creating() {
    let f = VmFixture::new();
    let key = f.create_vm();
    let id = f.driver.insert(server_spec("ns", "vm", "uid-vm"));
    // Left in Creating by an earlier controller that crashed after creating the server.
    f.api
        .replace_status(&f.vm_with_phase(&key, Phase::Creating))
        .await
        .unwrap();
    assert_eq!(f.reconcile(&key).await, Ok(Action::RequeueAfter(REFRESH)));
    let vm = f.api.object(&key).unwrap();
    assert_eq!(vm.phase(), Phase::Active);
    assert_eq!(vm.status.unwrap().server.unwrap().id, id);
    assert_eq!(f.driver.calls("create"), 0, "nothing to create");
}

fn ago(secs: i64) -> k8s_openapi::jiff::Timestamp {
    k8s_openapi::jiff::Timestamp::now() - k8s_openapi::jiff::SignedDuration::from_secs(secs)
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
    let f = VmFixture::new();
    let key = f.create_vm();
    f.reconcile(&key).await.unwrap();
    let id = f.driver.server(SERVER).unwrap().id;

    // Exit 1: Failed with the exit code, restart due 10 s after the exit.
    f.driver.exit(SERVER, 3);
    requeued_within(f.reconcile(&key).await, 9, 10);
    assert_eq!(f.phase(&key), Phase::Failed);
    assert!(
        f.reason(&key).contains("exited with code 3") && f.reason(&key).contains("exit 1 in a row"),
        "{}",
        f.reason(&key)
    );
    let (ready, ready_reason, _) = f.condition(&key, "Ready");
    assert_eq!((ready.as_str(), ready_reason.as_str()), ("False", "Failed"));
    let (running, running_reason, message) = f.condition(&key, "ServerRunning");
    assert_eq!(
        (running.as_str(), running_reason.as_str()),
        ("False", "Exited")
    );
    assert!(message.contains("exit code 3"), "{message}");
    assert_eq!(
        f.driver.calls("create"),
        1,
        "not restarted before its backoff"
    );
    // Looking again before it is due changes nothing and writes nothing.
    let writes = f.api.status_writes();
    requeued_within(f.reconcile(&key).await, 8, 10);
    assert_eq!(f.api.status_writes(), writes);

    // The backoff passed: started again (the same server), Active, restart 1 counted.
    f.driver.exit_at(SERVER, 3, ago(11));
    assert_eq!(f.reconcile(&key).await, Ok(Action::RequeueAfter(REFRESH)));
    assert_eq!(f.phase(&key), Phase::Active);
    let status = f.status(&key);
    assert_eq!(status.restarts, 1);
    assert_eq!(status.server.as_ref().unwrap().id, id);
    assert_eq!(status.server.unwrap().exit_code, None);

    // Exit 2 waits 20 s; exit 3 is a crash loop, waiting 40 s.
    f.driver.exit(SERVER, 3);
    requeued_within(f.reconcile(&key).await, 19, 20);
    assert_eq!(f.phase(&key), Phase::Failed);
    f.driver.exit_at(SERVER, 3, ago(21));
    f.reconcile(&key).await.unwrap();
    assert_eq!(f.status(&key).restarts, 2);
    f.driver.exit(SERVER, 137);
    requeued_within(f.reconcile(&key).await, 39, 40);
    assert_eq!(f.phase(&key), Phase::CrashLoopBackOff);
    assert!(f.reason(&key).contains("code 137"), "{}", f.reason(&key));
    assert_eq!(
        f.condition(&key, "Ready").1,
        "CrashLoopBackOff",
        "the condition names the crash loop"
    );
}

#[tokio::test]
async fn a_server_that_ran_ten_minutes_has_its_restarts_reset_and_the_backoff_is_capped() {
    let f = VmFixture::new();
    let key = f.create_vm();
    f.reconcile(&key).await.unwrap();
    f.driver.exit_at(SERVER, 1, ago(11));
    f.reconcile(&key).await.unwrap();
    assert_eq!(f.status(&key).restarts, 1);
    f.driver.set_started_at(SERVER, ago(601));
    f.reconcile(&key).await.unwrap();
    assert_eq!(f.status(&key).restarts, 0);
    assert_eq!(crash_backoff(0), Duration::from_secs(10));
    assert_eq!(crash_backoff(4), Duration::from_secs(160));
    assert_eq!(crash_backoff(5), CRASH_BACKOFF_MAX);
    assert_eq!(crash_backoff(i32::MAX), CRASH_BACKOFF_MAX);
    assert_eq!(crash_backoff(-1), CRASH_BACKOFF_BASE);
}

#[tokio::test]
async fn a_refused_spec_goes_failed_and_is_not_retried_until_the_long_interval() {
    let f = VmFixture::new();
    let key = f.create_vm();
    f.driver.refuse_creates(1);
    // Not an error (no hot backoff loop): a look again after the refused-retry interval.
    assert_eq!(
        f.reconcile(&key).await,
        Ok(Action::RequeueAfter(DEFAULT_REFUSED_RETRY_INTERVAL))
    );
    assert_eq!(f.phase(&key), Phase::Failed);
    assert!(f.reason(&key).contains("refused"), "{}", f.reason(&key));
    // The next try (after the interval, or on an edit) creates it.
    assert_eq!(f.reconcile(&key).await, Ok(Action::RequeueAfter(REFRESH)));
    assert_eq!(f.phase(&key), Phase::Active);
}

#[tokio::test]
async fn a_stopped_server_whose_limits_no_longer_match_the_spec_is_recreated_not_started() {
    let f = VmFixture::new();
    let key = f.create_vm();
    f.reconcile(&key).await.unwrap();
    let old = f.driver.server(SERVER).unwrap().id;
    f.driver.exit(SERVER, 1);
    let mut vm = f.api.object(&key).unwrap();
    vm.spec.resource.as_mut().unwrap().memory =
        k8s_openapi::apimachinery::pkg::api::resource::Quantity("2Gi".into());
    f.api.replace_spec(vm);
    f.reconcile(&key).await.unwrap();
    let server = f.driver.server(SERVER).unwrap();
    assert_ne!(server.id, old, "recreated");
    assert_eq!(server.spec.memory_bytes, 2 << 30);
    assert!(server.running);
    assert_eq!(f.phase(&key), Phase::Active);
}

#[tokio::test]
async fn a_vm_found_deleting_on_a_conflict_retry_is_finalized_instead_of_created() {
    let f = VmFixture::new();
    let key = f.create_vm();
    // Give it our finalizer, then let the informer's copy lag behind a deletion.
    let vm = f.api.object(&key).unwrap();
    let vm = set_finalizer(&f.api, &vm, true, &ctx())
        .await
        .unwrap()
        .unwrap();
    f.api.freeze_cache(&key, vm);
    f.api.delete(&key);
    assert_eq!(f.reconcile(&key).await, Ok(Action::Done));
    assert_eq!(
        f.driver.calls("create"),
        0,
        "no server for a VM being deleted"
    );
    assert!(f.api.object(&key).is_none(), "finalized");
}

#[tokio::test]
async fn a_spec_change_recreates_the_server_with_the_new_limits() {
    let f = VmFixture::new();
    let key = f.create_vm();
    f.reconcile(&key).await.unwrap();
    let old_id = f.driver.server(SERVER).unwrap().id;
    let mut vm = f.api.object(&key).unwrap();
    vm.spec = VirtualMachine::namespaced("ns", "vm", "2", "2Gi").spec;
    f.api.replace_spec(vm);
    let before = f.api.status_history().len();
    assert_eq!(f.reconcile(&key).await, Ok(Action::RequeueAfter(REFRESH)));
    let server = f.driver.server(SERVER).unwrap();
    assert_ne!(server.id, old_id, "a new server");
    assert_eq!(
        (server.spec.cpu_millis, server.spec.memory_bytes),
        (2000, 2 << 30)
    );
    let history = f.api.status_history()[before..].to_vec();
    assert_eq!(history[0].0, Phase::Creating);
    assert!(
        history[0]
            .1
            .contains("has cpu 1000m and memory 1073741824 bytes but the spec asks for cpu 2000m"),
        "{history:?}"
    );
    assert_eq!(history[1].0, Phase::Active);
    // Unchanged limits: no more recreation.
    assert_eq!(f.reconcile(&key).await, Ok(Action::RequeueAfter(REFRESH)));
    assert_eq!(f.driver.server(SERVER).unwrap().id, server.id);
}

#[tokio::test]
async fn an_object_deleted_while_queued_is_done_without_retry() {
    let f = VmFixture::new();
    let key = f.create_vm();
    f.api.delete(&key);
    assert!(
        f.api.object(&key).is_none(),
        "no finalizer yet, so it is gone at once"
    );
    assert_eq!(f.reconcile(&key).await, Ok(Action::Done));
    assert_eq!(f.driver.calls("status") + f.driver.calls("create"), 0);
}

#[tokio::test]
async fn a_deleting_vm_without_our_finalizer_is_left_alone() {
    let f = VmFixture::new();
    let mut vm = VirtualMachine::namespaced("ns", "vm", "1", "1Gi");
    vm.metadata.finalizers = Some(vec!["someone.else/finalizer".into()]);
    let key = f.api.create(vm);
    f.api.delete(&key);
    assert_eq!(f.reconcile(&key).await, Ok(Action::Done));
    assert_eq!(f.driver.calls("delete"), 0);
    assert_eq!(
        f.api.object(&key).unwrap().metadata.finalizers,
        Some(vec!["someone.else/finalizer".to_string()])
    );
}

#[tokio::test]
async fn an_unreachable_engine_fails_the_vm_naming_the_engine_and_it_recovers() {
    let f = VmFixture::new();
    let key = f.create_vm();
    f.reconcile(&key).await.unwrap();
    f.driver.set_unreachable(true);
    let err = f.reconcile(&key).await.unwrap_err();
    assert!(err.retry());
    assert_eq!(f.phase(&key), Phase::Failed);
    assert!(f.reason(&key).contains("fake engine is unreachable"));
    // The same failure again does not rewrite the status.
    let writes = f.api.status_writes();
    assert!(f.reconcile(&key).await.is_err());
    assert_eq!(f.api.status_writes(), writes);
    f.driver.set_unreachable(false);
    assert_eq!(f.reconcile(&key).await, Ok(Action::RequeueAfter(REFRESH)));
    assert_eq!(f.phase(&key), Phase::Active);
    assert_eq!(
        f.driver.calls("create"),
        1,
        "the server survived the outage and is adopted, not recreated"
    );
}

#[tokio::test]
async fn status_conflicts_are_retried_on_fresh_data() {
    let f = VmFixture::new();
    let key = f.create_vm();
    f.api.inject_conflicts(3);
    assert_eq!(f.reconcile(&key).await, Ok(Action::RequeueAfter(REFRESH)));
    assert_eq!(f.phase(&key), Phase::Active);
    assert!(f.api.object(&key).unwrap().has_finalizer());
}

#[tokio::test]
async fn after_a_status_conflict_the_conditions_are_derived_from_the_fresh_object() {
    let f = VmFixture::new();
    let key = f.create_vm();
    assert_eq!(f.reconcile(&key).await, Ok(Action::RequeueAfter(REFRESH)));
    let active = f.api.object(&key).unwrap();
    let ready_since = |vm: &VirtualMachine| {
        let status = vm.status.as_ref().unwrap();
        let ready = status.conditions.iter().find(|c| c.type_ == "Ready");
        ready.unwrap().last_transition_time.clone()
    };
    let became_ready = ready_since(&active);
    // An informer that has not seen that write: its copy has no status yet, so the status
    // computed from it says Ready became True now.
    let mut stale = active.clone();
    stale.status = None;
    stale.metadata.resource_version = Some("1".into());
    f.api.freeze_cache(&key, stale);
    std::thread::sleep(Duration::from_millis(20));
    let writes = f.api.status_writes();
    assert_eq!(f.reconcile(&key).await, Ok(Action::RequeueAfter(REFRESH)));
    assert_eq!(
        f.api.status_writes(),
        writes + 1,
        "written once, after the conflict"
    );
    let written = f.api.object(&key).unwrap();
    assert_eq!(
        ready_since(&written),
        became_ready,
        "Ready was already True on the fresh object: its transition time stays"
    );
}

#[tokio::test]
async fn a_status_computed_for_a_spec_that_changed_meanwhile_is_not_written() {
    let f = VmFixture::new();
    let key = f.create_vm();
    assert_eq!(f.reconcile(&key).await, Ok(Action::RequeueAfter(REFRESH)));
    // The user edits the spec; the informer has not seen it, nor the last status write.
    let mut stale = f.api.object(&key).unwrap();
    f.api.replace_spec(stale.clone());
    let edited = f.api.object(&key).unwrap();
    stale.status = None;
    f.api.freeze_cache(&key, stale);

    let writes = f.api.status_writes();
    assert_eq!(f.reconcile(&key).await, Ok(Action::Done));
    assert_eq!(
        f.api.status_writes(),
        writes,
        "nothing written for the old spec"
    );
    let now = f.api.object(&key).unwrap();
    assert_eq!(now.status, edited.status);
    assert_eq!(now.metadata.generation, Some(2));
}

#[tokio::test]
async fn endless_conflicts_give_up_and_go_back_to_the_rate_limiter() {
    let f = VmFixture::new();
    let key = f.create_vm();
    f.api.inject_conflicts(1000);
    let err = f.reconcile(&key).await.unwrap_err();
    assert!(err.retry());
    assert!(err.to_string().contains("still conflicted"), "{err}");
}

#[tokio::test]
async fn an_invalid_spec_fails_the_vm_with_a_message_and_creates_nothing() {
    let f = VmFixture::new();
    let key = f
        .api
        .create(VirtualMachine::namespaced("ns", "vm", "abc", "4G"));
    assert_eq!(f.reconcile(&key).await, Ok(Action::Done));
    assert_eq!(f.phase(&key), Phase::Failed);
    assert!(
        f.reason(&key)
            .contains("VirtualMachine ns/vm: spec.resource.cpu \"abc\""),
        "{}",
        f.reason(&key)
    );
    assert_eq!(f.driver.calls("create"), 0);
}

#[tokio::test]
async fn a_bad_key_is_an_error_that_is_not_retried() {
    let f = VmFixture::new();
    // A key without a namespace names no VirtualMachine (they are namespaced).
    let err = f.reconcile(&ObjectKey::new("", "nokey")).await.unwrap_err();
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

#[tokio::test]
async fn a_cancelled_context_causes_no_side_effect_at_all() {
    let f = VmFixture::with_events();
    let key = f.create_vm();
    let token = CancellationToken::new();
    token.cancel();
    let err = f
        .reconciler
        .reconcile(&key, &ReconcileContext::new(token))
        .await
        .unwrap_err();
    assert_eq!(err, ReconcileError::NotEntitled(NotEntitled::Cancelled));
    assert!(!err.retry());
    assert!(
        !f.api.object(&key).unwrap().has_finalizer(),
        "no finalizer patch"
    );
    assert_eq!(f.api.status_writes(), 0);
    assert_eq!(f.driver.calls("create"), 0);
    assert_eq!(f.events().await, vec![]);
}

#[tokio::test]
async fn a_reconcile_cancelled_during_the_create_writes_nothing_more_and_the_late_server_is_deleted()
 {
    let f = VmFixture::with_events();
    let key = f.create_vm();
    let token = CancellationToken::new();
    let term = ReconcileContext::new(token.clone());
    f.driver.hold_creates();
    let pass = tokio::spawn({
        let (r, key) = (f.reconciler.clone(), key.clone());
        async move { r.reconcile(&key, &term).await }
    });
    settle().await;
    assert_eq!(f.driver.calls("create"), 1, "the create is in flight");
    token.cancel();
    assert_eq!(
        pass.await.unwrap(),
        Err(ReconcileError::NotEntitled(NotEntitled::Cancelled)),
        "the reconcile stops waiting at once"
    );
    // The create completes after the cancellation: the task that made it deletes it.
    f.driver.release_creates();
    settle().await;
    assert!(
        f.driver.server_names().is_empty(),
        "the late server is gone"
    );
    assert_eq!(f.driver.calls("delete"), 1);
    // Only the Creating write happened: no Active, and no Failed for a VM that did not fail.
    let phases: Vec<Phase> = f.api.status_history().iter().map(|(p, _)| *p).collect();
    assert_eq!(phases, vec![Phase::Creating]);
    let seen = f.events().await;
    assert!(seen.iter().all(|(t, _, _)| t != "Warning"), "{seen:?}");
    // The next leader creates it afresh.
    assert_eq!(f.reconcile(&key).await, Ok(Action::RequeueAfter(REFRESH)));
    assert_eq!(f.phase(&key), Phase::Active);
}

#[tokio::test]
async fn a_server_of_the_vms_name_with_another_uid_is_reported_and_never_adopted_or_deleted() {
    let f = VmFixture::with_events();
    let key = f.create_vm();
    let id = f
        .driver
        .insert(server_spec("ns", "vm", "uid-of-an-older-vm"));
    assert_eq!(
        f.reconcile(&key).await,
        Ok(Action::RequeueAfter(REFRESH)),
        "looked at again later, in case the name is freed"
    );
    assert_eq!(f.phase(&key), Phase::Failed);
    assert_eq!(
        f.reason(&key),
        format!(
            "server {SERVER} (id {id}) is not this VirtualMachine's: it has label kubeloop.dev/vm-uid=uid-of-an-older-vm but this VirtualMachine's uid is uid-vm; it is neither adopted nor deleted"
        )
    );
    assert_eq!(
        f.driver.server(SERVER).unwrap().spec.vm_uid,
        "uid-of-an-older-vm"
    );
    assert_eq!(f.driver.calls("create") + f.driver.calls("delete"), 0);
    // Once reported, a refresh does not rewrite the status.
    let writes = f.api.status_writes();
    f.reconcile(&key).await.unwrap();
    assert_eq!(f.api.status_writes(), writes);
    let seen = f.events().await;
    let warnings: Vec<_> = seen
        .iter()
        .filter(|(t, reason, _)| t == "Warning" && reason == REASON_SERVER_NAME_TAKEN)
        .collect();
    assert_eq!(warnings.len(), 1, "{seen:?}");
    assert!(warnings[0].2.contains(&id), "{warnings:?}");

    // Finalizing the VM leaves the foreign server and still lets the object go.
    f.api.delete(&key);
    assert_eq!(f.reconcile(&key).await, Ok(Action::Done));
    assert!(f.api.object(&key).is_none(), "the finalizer was removed");
    assert_eq!(
        f.driver.server(SERVER).unwrap().id,
        id,
        "the server is still there"
    );
}

#[tokio::test]
async fn a_server_of_the_vms_name_without_a_uid_label_is_reported_and_left() {
    let f = VmFixture::new();
    let key = f.create_vm();
    let labels = BTreeMap::from([
        (LABEL_NAMESPACE.to_string(), "ns".to_string()),
        (LABEL_NAME.to_string(), "vm".to_string()),
        (LABEL_MANAGED_BY.to_string(), DEFAULT_MANAGED_BY.to_string()),
    ]);
    let id = f
        .driver
        .insert_with_labels(server_spec("ns", "vm", "uid-vm"), labels);
    f.reconcile(&key).await.unwrap();
    assert_eq!(f.phase(&key), Phase::Failed);
    assert!(
        f.reason(&key).contains(&format!(
            "server {SERVER} (id {id}) is not this VirtualMachine's: it has no kubeloop.dev/vm-uid label but this VirtualMachine's uid is uid-vm"
        )),
        "{}",
        f.reason(&key)
    );
    assert_eq!(f.driver.calls("create"), 0);
    assert!(f.driver.server(SERVER).is_some());
}

#[tokio::test]
async fn finalizing_deletes_only_a_server_with_the_vms_uid_and_says_why_it_left_another() {
    let f = VmFixture::with_events();
    let key = f.create_vm();
    f.reconcile(&key).await.unwrap();
    // The VM's own server is replaced behind its back by another owner's of the same name.
    f.driver.vanish(SERVER);
    let foreign = f.driver.insert(server_spec("ns", "vm", "uid-elsewhere"));
    f.api.delete(&key);
    assert_eq!(f.reconcile(&key).await, Ok(Action::Done));
    assert!(f.api.object(&key).is_none());
    assert_eq!(f.driver.server(SERVER).unwrap().id, foreign);
    let seen = f.events().await;
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
    let f = VmFixture::new();
    let key = f.create_vm();
    f.driver.hold_creates();
    let pass = tokio::spawn({
        let (r, key) = (f.reconciler.clone(), key.clone());
        async move { r.reconcile(&key, &ctx()).await }
    });
    settle().await;
    let id = f.driver.insert(server_spec("ns", "vm", "uid-racer"));
    f.driver.release_creates();
    assert_eq!(pass.await.unwrap(), Ok(Action::RequeueAfter(REFRESH)));
    assert_eq!(f.phase(&key), Phase::Failed);
    assert!(f.reason(&key).contains("uid-racer"), "{}", f.reason(&key));
    assert_eq!(f.driver.server(SERVER).unwrap().id, id);
}
