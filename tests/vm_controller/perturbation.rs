//! The VM controller under perturbation campaigns (kubeloop_testenv::perturb): a crash, a held
//! view and a coalescing, on the fake engine and on podman.

use super::*;

/// A VM campaign on `engine`: the first generated plan of each kind must fire and pass.
async fn vm_campaign_passes(engine: kubeloop_testenv::perturb::VmEngine) {
    let cluster = testenv::shared().await;
    install_crd(cluster).await;
    let (workload, controller) = kubeloop_testenv::perturb::vm(engine);
    let campaign = kubeloop_testenv::perturb::Campaign::new(
        cluster.client_config(),
        workload,
        controller,
        Default::default(),
    );
    let checked = campaign
        .check(kubeloop_testenv::perturb::Reference::first_of_each_kind, 3)
        .await
        .expect("the reference run passes and generates plans");
    assert!(
        checked.findings.is_empty(),
        "findings:\n{}",
        checked.findings.join("\n")
    );
    // A crash, a held view and a coalescing, each fired: a plan that never fired checked
    // nothing the reference run did not.
    assert_eq!(checked.passed.len(), 3, "{}", checked.tally());
    assert!(checked.never_fired.is_empty(), "{}", checked.tally());
}

/// The VM controller on its fake engine passes the first generated plan of each kind
/// (kubeloop_testenv::perturb: a crash between two writes of a reconcile, a view held back, a VM's
/// events coalesced), with no orphaned server left on the engine. Every plan:
/// `hack/perturb --workload vm-fake` (a few minutes).
#[tokio::test(flavor = "multi_thread")]
async fn the_vm_controller_passes_a_crash_a_held_view_and_a_coalescing_on_the_fake_engine() {
    vm_campaign_passes(kubeloop_testenv::perturb::VmEngine::Fake).await;
}

/// The same on podman through the Docker API: real containers, and none left behind.
#[tokio::test(flavor = "multi_thread")]
async fn the_vm_controller_passes_a_crash_a_held_view_and_a_coalescing_on_podman() {
    vm_campaign_passes(kubeloop_testenv::perturb::VmEngine::Podman).await;
}
