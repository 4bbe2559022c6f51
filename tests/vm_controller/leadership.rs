//! Leader election between replicas: only the leader acts and the other takes over when it
//! dies; the example RBAC is enough to run with leader election.

use super::*;

/// The notes of the events.k8s.io/v1 Events leader election recorded about the Lease.
async fn lease_event_notes(cluster: &Cluster, ns: &str) -> Vec<String> {
    use k8s_openapi::api::events::v1::Event;
    let events: Api<Event> = Api::namespaced(cluster.client().await.unwrap(), ns);
    events
        .list(&kube_client::api::ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| {
            e.regarding.as_ref().is_some_and(|r| {
                r.kind.as_deref() == Some("Lease") && r.name.as_deref() == Some("controller101")
            }) && e.reason.as_deref() == Some("LeaderElection")
                && e.reporting_controller.as_deref() == Some("vm-controller")
        })
        .filter_map(|e| e.note)
        .collect()
}

#[tokio::test]
async fn with_two_replicas_only_the_leader_acts_and_the_other_takes_over_when_it_dies() {
    let PodmanTest {
        cluster,
        host,
        docker,
        ns,
        api,
        _cleanup,
    } = PodmanTest::new("vm-ha").await;
    let timing = [
        "--lease-duration",
        "6s",
        "--renew-deadline",
        "4s",
        "--retry-period",
        "1s",
    ];

    let mut a = spawn_controller(cluster, &ns, &host, "replica-a", &timing);
    eventually("replica-a to lead", Duration::from_secs(30), || async {
        (lease_holder(cluster, &ns).await.as_deref() == Some("replica-a")).then_some(())
    })
    .await;
    let mut b = spawn_controller(cluster, &ns, &host, "replica-b", &timing);
    apply_vm(cluster, &ns, "first", "1", "64Mi");
    wait_phase(&api, "first", Phase::Active, START, &a).await;
    assert!(a.log().contains("became the leader"));
    let b_log = b.log();
    assert!(
        !b_log.contains("became the leader") && !b_log.contains("writing status"),
        "the standby must not act:\n{b_log}"
    );

    // The leader dies without releasing the lease; work arrives while nobody leads.
    a.kill();
    apply_vm(cluster, &ns, "second", "1", "64Mi");
    let killed_at = Instant::now();
    wait_phase(&api, "second", Phase::Active, START, &b).await;
    println!(
        "the standby finished the pending VM {:?} after the leader was killed",
        killed_at.elapsed()
    );
    assert_eq!(
        lease_holder(cluster, &ns).await.as_deref(),
        Some("replica-b")
    );
    assert!(container_exists(&docker, &container_name(&ns, "second")).await);
    // Both leaderships are on record as events.k8s.io/v1 Events about the Lease.
    eventually(
        "\"became leader\" Events of both replicas about the Lease",
        Duration::from_secs(30),
        || async {
            let notes = lease_event_notes(cluster, &ns).await;
            ["replica-a became leader", "replica-b became leader"]
                .iter()
                .all(|n| notes.iter().any(|seen| seen == n))
                .then_some(())
        },
    )
    .await;

    // The new leader also finishes the old leader's VMs: delete the first one.
    delete_vm(cluster, &ns, "first");
    // Cleaned up by replica-b.
    wait_gone(&api, "first", Duration::from_secs(60), &b).await;
    assert!(!container_exists(&docker, &container_name(&ns, "first")).await);

    // SIGTERM: the leader stops, releases the lease and exits 0.
    assert_eq!(b.terminate(Duration::from_secs(30)), Some(0));
    assert_eq!(
        lease_holder(cluster, &ns).await,
        None,
        "the lease was released"
    );
}

/// A kubeconfig for a user that has only what RBAC grants it: the admin kubeconfig with the
/// user's client certificate instead of the admin's.
fn restricted_kubeconfig(cluster: &Cluster, user: &str) -> PathBuf {
    let config = cluster.user_config(user, &[]).unwrap();
    let admin = std::fs::read_to_string(cluster.kubeconfig_path()).unwrap();
    let cert = config.auth_info.client_certificate.clone().unwrap();
    let key = config.auth_info.client_key.clone().unwrap();
    let text: Vec<String> = admin
        .lines()
        .map(|line| {
            if line.trim_start().starts_with("client-certificate:") {
                format!("    client-certificate: {cert}")
            } else if line.trim_start().starts_with("client-key:") {
                format!("    client-key: {key}")
            } else {
                line.to_string()
            }
        })
        .collect();
    let path = cluster.dir().join(format!("{user}.kubeconfig"));
    std::fs::write(&path, text.join("\n")).unwrap();
    path
}

#[tokio::test]
async fn the_example_rbac_is_enough_to_run_the_controller_with_leader_election() {
    let PodmanTest {
        cluster,
        host,
        ns,
        api,
        _cleanup,
        ..
    } = PodmanTest::new("vm-rbac").await;
    let user = format!("vm-controller-{ns}");
    let kubeconfig = restricted_kubeconfig(cluster, &user);

    // Without a binding the user can do nothing (the control for this test).
    let restricted = |args: &[&str]| {
        let out = cluster.kubectl_as(&kubeconfig, args);
        (out.success, out.stderr)
    };
    let (ok, err) = restricted(&["get", "vms", "-n", &ns]);
    assert!(!ok && err.contains("forbidden"), "{err}");

    let Kubectl {
        success: ok,
        stdout: out,
        stderr: err,
        ..
    } = cluster.kubectl(&["apply", "-f", RBAC]);
    assert!(ok, "{out}{err}");
    let binding = format!("vm-controller-test-{ns}");
    let Kubectl {
        success: ok,
        stdout: out,
        stderr: err,
        ..
    } = cluster.kubectl(&[
        "create",
        "clusterrolebinding",
        &binding,
        "--clusterrole=kubeloop-vm-controller",
        &format!("--user={user}"),
    ]);
    assert!(ok, "{out}{err}");
    eventually(
        "the binding to take effect",
        Duration::from_secs(30),
        || async { restricted(&["get", "vms", "-n", &ns]).0.then_some(()) },
    )
    .await;

    let controller = spawn_controller_as(cluster, &kubeconfig, &ns, &host, "restricted", &[]);
    apply_vm(cluster, &ns, "rbac", "1", "64Mi");
    wait_phase(&api, "rbac", Phase::Active, START, &controller).await;
    assert_eq!(
        lease_holder(cluster, &ns).await.as_deref(),
        Some("restricted")
    );
    delete_vm(cluster, &ns, "rbac");
    wait_gone(&api, "rbac", Duration::from_secs(60), &controller).await;
    let log = controller.log();
    assert!(
        !log.contains("forbidden") && !log.contains("Forbidden"),
        "no permission errors:\n{}",
        controller.log_tail(30)
    );
    cluster.kubectl(&["delete", "clusterrolebinding", &binding]);
}
