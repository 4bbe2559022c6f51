//! What the controller must refuse or leave alone: specs the CRD schema refuses, a container
//! of another owner with the VM's name, limits the engine refuses.

use super::*;

#[tokio::test]
async fn invalid_specs_are_refused_by_the_crd_schema_and_nothing_is_created() {
    let PodmanTest {
        cluster,
        host,
        ns,
        _cleanup,
        ..
    } = PodmanTest::new("vm-invalid").await;
    let mut controller = spawn_controller(cluster, &ns, &host, "only", &["--leader-elect=false"]);

    let cases = [
        (
            "cpu-abc",
            "resource: {cpu: abc, memory: 4G}",
            "spec.resource.cpu: Invalid value: \"abc\": cpu must be a quantity greater than zero",
        ),
        (
            "cpu-zero",
            "resource: {cpu: \"0\", memory: 4G}",
            "cpu must be a quantity greater than zero",
        ),
        (
            "cpu-zero-int",
            "resource: {cpu: 0, memory: 4G}",
            "spec.resource.cpu: Invalid value: 0: spec.resource.cpu in body should be greater than or equal to 1",
        ),
        (
            "memory-negative",
            "resource: {cpu: 2, memory: \"-4G\"}",
            "spec.resource.memory: Invalid value: \"-4G\": memory must be a quantity greater than zero",
        ),
        (
            "memory-negative-int",
            "resource: {cpu: 2, memory: -4}",
            "spec.resource.memory: Invalid value: -4: spec.resource.memory in body should be greater than or equal to 1",
        ),
        ("no-resource", "", "spec.resource: Required value"),
        (
            "no-memory",
            "resource: {cpu: 2}",
            "spec.resource.memory: Required value",
        ),
        // More than the controller takes (quantity.rs's MAX_CPU_MILLIS, what the Docker API's
        // int64 NanoCpus holds, and MAX_MEMORY_BYTES): refused by the apiserver, not retried
        // as an engine error.
        (
            "cpu-too-large",
            "resource: {cpu: \"9223372037\", memory: 4G}",
            "cpu must be at most 9223372036854m, the most the Docker API's NanoCpus field holds",
        ),
        (
            "cpu-too-large-int",
            "resource: {cpu: 9223372037, memory: 4G}",
            "spec.resource.cpu in body should be less than or equal to 9223372036",
        ),
        (
            "memory-too-large",
            "resource: {cpu: 2, memory: 2Ei}",
            "memory must be at most 1Ei (1152921504606846976 bytes)",
        ),
        (
            "memory-too-large-int",
            "resource: {cpu: 2, memory: 1152921504606846977}",
            "memory must be at most 1Ei (1152921504606846976 bytes)",
        ),
    ];

    for (name, spec, expected) in cases {
        let manifest = format!(
            "apiVersion: cloudnative.tw/v1alpha1\nkind: VirtualMachine\nmetadata: {{name: {name}}}\nspec: {{{spec}}}\n"
        );
        let path = cluster.dir().join(format!("{ns}-{name}.yaml"));
        std::fs::write(&path, manifest).unwrap();
        let Kubectl {
            success: ok,
            stdout: out,
            stderr: err,
            ..
        } = cluster.kubectl(&["apply", "-n", &ns, "-f", path.to_str().unwrap()]);
        assert!(!ok, "{name} must be refused, kubectl said: {out}");
        println!("{name}: {}", err.trim().replace('\n', " | "));
        assert!(
            err.contains("is invalid") && err.contains(expected),
            "{name}: the message should name the problem ({expected}): {err}"
        );
    }
    // The valid example passes the same schema.
    let Kubectl {
        success: ok,
        stdout: out,
        stderr: err,
        ..
    } = cluster.kubectl(&["apply", "-n", &ns, "--dry-run=server", "-f", TEST_VM]);
    assert!(ok, "test-vm must be accepted: {out}{err}");

    let Kubectl {
        success: ok,
        stdout: out,
        stderr: err,
        ..
    } = cluster.kubectl(&["get", "vms", "-n", &ns, "-o", "name"]);
    assert!(ok, "{err}");
    assert_eq!(out.trim(), "", "no VirtualMachine was stored");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        labelled_containers(&ns),
        Vec::<String>::new(),
        "no container was created"
    );
    assert_eq!(controller.terminate(Duration::from_secs(30)), Some(0));
}

#[tokio::test]
async fn a_container_of_another_owner_with_the_vms_name_is_reported_and_never_adopted_or_deleted() {
    use k8s_openapi::api::events::v1::Event;
    use kube_client::api::ListParams;

    let PodmanTest {
        cluster,
        host,
        docker,
        ns,
        api,
        _cleanup,
    } = PodmanTest::new("vm-taken").await;
    let name = container_name(&ns, "taken");
    // Another cluster's VM of the same namespace/name on the same engine: its own uid and its
    // own managed-by value (so no orphan sweep of ours may take it either).
    let foreign_id = create_labelled_container(
        &docker,
        &name,
        &[
            ("kubeloop.dev/vm-namespace", ns.as_str()),
            ("kubeloop.dev/vm-name", "taken"),
            ("kubeloop.dev/vm-uid", "uid-in-another-cluster"),
            (
                "kubeloop.dev/managed-by",
                "kubeloop-vm-controller@another-cluster",
            ),
        ],
    )
    .await;

    let mut controller =
        spawn_controller(cluster, &ns, &host, "one", &["--refresh-interval", "2s"]);
    apply_vm(cluster, &ns, "taken", "500m", "64Mi");
    let failed = wait_phase(&api, "taken", Phase::Failed, START, &controller).await;
    let uid = failed.metadata.uid.clone().unwrap();
    let reason = failed.status.unwrap().reason;
    for part in [
        name.as_str(),
        foreign_id.as_str(),
        "uid-in-another-cluster",
        uid.as_str(),
    ] {
        assert!(reason.contains(part), "{part:?} not in reason {reason:?}");
    }

    let events: Api<Event> = Api::namespaced(cluster.client().await.unwrap(), &ns);
    let warning = eventually(
        "a ServerNameTaken Warning event",
        Duration::from_secs(30),
        || async {
            events
                .list(&ListParams::default())
                .await
                .expect("listing events")
                .items
                .into_iter()
                .find(|e| {
                    e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("taken")
                        && e.reason.as_deref() == Some("ServerNameTaken")
                        && e.type_.as_deref() == Some("Warning")
                })
        },
    )
    .await;
    assert!(
        warning
            .note
            .as_deref()
            .is_some_and(|m| m.contains("uid-in-another-cluster")),
        "{warning:?}"
    );

    // A few refreshes later it is still Failed and the container untouched.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(vm(&api, "taken").await.unwrap().phase(), Phase::Failed);
    assert_eq!(container_id(&docker, &name).await, Some(foreign_id.clone()));

    // Deleting the VM lets the object go without touching the container.
    delete_vm(cluster, &ns, "taken");
    wait_gone(&api, "taken", Duration::from_secs(60), &controller).await;
    assert_eq!(
        container_id(&docker, &name).await,
        Some(foreign_id),
        "the other owner's container still exists\n{}",
        controller.log_tail(20)
    );
    assert_eq!(controller.terminate(Duration::from_secs(30)), Some(0));
}

#[tokio::test]
async fn limits_the_engine_refuses_give_a_failed_vm_that_is_not_retried_hot_and_an_edit_fixes_it() {
    let PodmanTest {
        cluster,
        host,
        ns,
        api,
        _cleanup,
        ..
    } = PodmanTest::new("vm-refused").await;
    let controller = spawn_controller(cluster, &ns, &host, "one", &["--refresh-interval", "1s"]);

    // 1 MiB is less than the container's init already uses: the OCI runtime refuses to start.
    apply_vm(cluster, &ns, "tiny", "100m", "1Mi");
    let failed = wait_phase(
        &api,
        "tiny",
        Phase::Failed,
        Duration::from_secs(60),
        &controller,
    )
    .await;
    let reason = failed.status.clone().unwrap().reason;
    assert!(
        reason.contains("refused to start") && reason.contains("memory limit"),
        "{reason}"
    );
    // The user who can fix it is told, on the object: a condition and a Warning event that
    // say what was refused and why.
    let (ready, ready_reason, message) = vm_condition(&failed, "Ready");
    assert_eq!((ready.as_str(), ready_reason.as_str()), ("False", "Failed"));
    assert!(message.contains("memory limit"), "{message}");
    let events = vm_events(cluster, &ns, "tiny").await;
    assert!(
        events
            .iter()
            .any(|(t, r, m)| t == "Warning" && r == "Failed" && m.contains("memory limit")),
        "no Warning event naming the memory limit in {events:?}"
    );

    // The add and the finalizer patch's update may each give one attempt; then none for
    // ten minutes. Over 10 s (ten refresh intervals): no attempt and no write.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let failed = vm(&api, "tiny").await.unwrap();
    assert_eq!(failed.phase(), Phase::Failed);
    let rv = failed.metadata.resource_version.clone();
    let attempts = || controller.log().matches("driver call failed").count();
    let before = attempts();
    tokio::time::sleep(Duration::from_secs(10)).await;
    let still = vm(&api, "tiny").await.unwrap();
    assert_eq!(
        still.metadata.resource_version, rv,
        "no status write: {:?}",
        still.status
    );
    assert_eq!(
        attempts(),
        before,
        "tried again within 10 s:\n{}",
        controller.log_tail(20)
    );

    // An edit of the spec is tried at once and recreates the container with the new limit.
    apply_vm(cluster, &ns, "tiny", "100m", "64Mi");
    let active = wait_phase(
        &api,
        "tiny",
        Phase::Active,
        Duration::from_secs(60),
        &controller,
    )
    .await;
    assert_eq!(vm_condition(&active, "Ready").0, "True");
}
