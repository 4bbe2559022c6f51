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

/// The VirtualMachine CRD's `openAPIV3Schema`, as committed.
fn vm_schema() -> serde_json::Value {
    let yaml = std::fs::read_to_string(vm::CRD).expect("reading crds/virtualmachine.yaml");
    let crd: serde_json::Value =
        serde_saphyr::from_str(&yaml).expect("crds/virtualmachine.yaml parses");
    crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"].clone()
}

/// The VM controller on podman under the changes generated from the VirtualMachine CRD's
/// schema (kubeloop_testenv::perturb::vm_state): `cpu` at its bounds 1 and 9223372036 (0 and
/// 9223372037 refused by the apiserver), `memory` at its bound 1 (0 refused), and each field
/// removed (refused: all are required), each applied and reverted. 1 CPU reaches the
/// implied state (Active, Ready for the VM's generation, a running container with those
/// limits) and one more reconcile writes nothing; 9223372036 CPUs and 1 byte of memory are
/// accepted by the apiserver but refused by podman, and the controller must say so on the VM
/// (a condition or a Warning event naming the CPU or the memory limit) and change nothing
/// else; after each revert the VM comes back. Every case passes, and the VM is deleted with
/// no container left. `KUBELOOP_STATE_CHANGE=<pointer>` runs one field's changes.
#[tokio::test(flavor = "multi_thread")]
async fn state_campaign_the_vm_controller_on_podman_reaches_refuses_and_returns() {
    let cluster = testenv::shared().await;
    install_crd(cluster).await;
    let (workload, controller) = kubeloop_testenv::perturb::vm_state(
        kubeloop_testenv::perturb::VmEngine::Podman,
        vm_schema(),
    );
    let campaign = kubeloop_testenv::perturb::StateCampaign::new(
        cluster.client_config(),
        workload,
        controller,
        Default::default(),
    );
    let (changes, misoperations) = campaign.cases(None);
    let report = campaign
        .run(&changes, &misoperations)
        .await
        .expect("the campaign runs");
    assert!(
        report.findings.is_empty(),
        "findings:\n{}",
        report.findings.join("\n")
    );
    if std::env::var_os("KUBELOOP_STATE_CHANGE").is_none() {
        assert_eq!(
            (report.cases, report.refused, report.must_refuse),
            (9, 6, 2),
            "{report:?}"
        );
    }
}
