//! A VM's life on the Docker-API engine and the fake driver: it becomes Active and reports
//! usage, follows a resize, and is cleaned up on delete (also when deleted while the
//! controller was down); the orphan sweep.

use super::*;

/// The usage column of `kubectl get vms` for `name`: (STATUS, CPU, MEMORY).
fn kubectl_columns(cluster: &Cluster, ns: &str, name: &str) -> (String, Vec<String>) {
    let Kubectl {
        success: ok,
        stdout: out,
        stderr: err,
        ..
    } = cluster.kubectl(&["get", "vms", "-n", ns]);
    assert!(ok, "kubectl get vms: {err}");
    let header = out.lines().next().unwrap_or_default().to_string();
    let row = out
        .lines()
        .find(|l| l.split_whitespace().next() == Some(name))
        .unwrap_or_else(|| panic!("{name} missing from kubectl get vms:\n{out}"));
    (header, row.split_whitespace().map(str::to_string).collect())
}

async fn start_busy_loop(docker: &Docker, container: &str) {
    let exec = docker
        .create_exec(
            container,
            CreateExecOptions {
                cmd: Some(vec!["sh", "-c", "while :; do :; done"]),
                ..Default::default()
            },
        )
        .await
        .expect("creating the exec");
    docker
        .start_exec(
            &exec.id,
            Some(StartExecOptions {
                detach: true,
                ..Default::default()
            }),
        )
        .await
        .expect("starting the exec");
}

#[tokio::test]
async fn test_vm_becomes_active_shows_usage_follows_load_and_is_cleaned_up_on_delete() {
    let PodmanTest {
        cluster,
        host,
        docker,
        ns,
        api,
        _cleanup,
    } = PodmanTest::new("vm-life").await;
    let refresh = Duration::from_secs(3);
    let mut controller =
        spawn_controller(cluster, &ns, &host, "one", &["--refresh-interval", "3s"]);

    let Kubectl {
        success: ok,
        stdout: out,
        stderr: err,
        ..
    } = cluster.kubectl(&["apply", "-n", &ns, "-f", TEST_VM]);
    assert!(ok, "{out}{err}");
    let applied_at = Instant::now();
    let active = wait_phase(&api, "test-vm", Phase::Active, START, &controller).await;
    println!(
        "test-vm Active {:?} after kubectl apply",
        applied_at.elapsed()
    );
    assert!(active.has_finalizer());
    let server = active.status.as_ref().unwrap().server.clone().unwrap();
    assert_eq!(server.state, "running");

    // The container: exact name, limits in engine units, labels naming the VM.
    let name = container_name(&ns, "test-vm");
    let inspected = docker
        .inspect_container(&name, None::<InspectContainerOptions>)
        .await
        .expect("the container exists");
    assert_eq!(inspected.id.as_deref(), Some(server.id.as_str()));
    let host_config = inspected.host_config.unwrap();
    assert_eq!(host_config.memory, Some(4_000_000_000));
    assert_eq!(host_config.nano_cpus, Some(2_000_000_000));
    let labels = inspected.config.unwrap().labels.unwrap();
    assert_eq!(labels.get("kubeloop.dev/vm-namespace"), Some(&ns));
    assert_eq!(
        labels.get("kubeloop.dev/vm-name").map(String::as_str),
        Some("test-vm")
    );
    assert_eq!(
        labels.get("kubeloop.dev/vm-uid"),
        active.metadata.uid.as_ref()
    );

    // The controller said so in an Event.
    eventually(
        "an Event about the VM going Active",
        Duration::from_secs(20),
        || {
            let Kubectl {
                success: ok,
                stdout: out,
                ..
            } = cluster.kubectl(&[
                "get",
                "events",
                "-n",
                &ns,
                "--field-selector",
                "involvedObject.name=test-vm",
            ]);
            async move { (ok && out.contains("Creating -> Active")).then_some(()) }
        },
    )
    .await;

    // kubectl shows the printer columns filled.
    let (header, row) = kubectl_columns(cluster, &ns, "test-vm");
    assert_eq!(
        header.split_whitespace().collect::<Vec<_>>(),
        vec!["NAME", "STATUS", "CPU", "MEMORY", "AGE"]
    );
    assert_eq!(row[1], "Active", "{row:?}");
    let idle_cpu: f64 = row[2]
        .parse()
        .unwrap_or_else(|_| panic!("CPU column is a number: {row:?}"));
    let memory: f64 = row[3]
        .parse()
        .unwrap_or_else(|_| panic!("MEMORY column is a number: {row:?}"));
    assert!(memory > 0.0, "a running httpd uses some memory: {row:?}");
    assert!(idle_cpu < 50.0, "idle httpd: {row:?}");

    // Load it: the CPU column follows within a refresh period (plus the stats sample and the
    // kubectl poll). One busy loop is 100% of a core on an idle host; on these shared 2-core
    // machines it gets far less when other builds run, so the bar is "clearly above idle".
    start_busy_loop(&docker, &name).await;
    let loaded_at = Instant::now();
    let threshold = (idle_cpu + 5.0).max(10.0);
    let busy_cpu = eventually(
        &format!("the CPU column to rise above {threshold}"),
        refresh * 3,
        || async {
            let (_, row) = kubectl_columns(cluster, &ns, "test-vm");
            row[2].parse::<f64>().ok().filter(|cpu| *cpu > threshold)
        },
    )
    .await;
    let rose_after = loaded_at.elapsed();
    println!(
        "CPU column: idle {idle_cpu} -> loaded {busy_cpu} after {rose_after:?} (refresh interval {refresh:?})"
    );

    // Delete: Terminating, then the container goes, then the object.
    let list = api.list(&Default::default()).await.unwrap();
    let rv = list.metadata.resource_version.unwrap();
    let mut events = api
        .watch(&WatchParams::default(), &rv)
        .await
        .unwrap()
        .boxed();
    delete_vm(cluster, &ns, "test-vm");
    let mut phases = Vec::new();
    let deleted = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(event) = events.try_next().await.expect("watch") {
            match event {
                WatchEvent::Modified(vm) => phases.push(vm.phase()),
                WatchEvent::Deleted(vm) => return vm,
                _ => {}
            }
        }
        panic!("watch ended")
    })
    .await
    .unwrap_or_else(|_| {
        panic!(
            "test-vm was not deleted; phases seen {phases:?}; log:\n{}",
            controller.log_tail(30)
        )
    });
    assert!(
        phases.contains(&Phase::Terminating),
        "phases seen while deleting: {phases:?}"
    );
    assert_eq!(deleted.phase(), Phase::Terminating);
    let gone = docker
        .inspect_container(&name, None::<InspectContainerOptions>)
        .await;
    assert!(
        matches!(
            gone,
            Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 404,
                ..
            })
        ),
        "the container is gone before the object: {gone:?}"
    );
    assert!(vm(&api, "test-vm").await.is_none());
    assert_eq!(controller.terminate(Duration::from_secs(30)), Some(0));
}

#[tokio::test]
async fn a_vm_deleted_while_the_controller_is_down_is_cleaned_up_when_it_comes_back() {
    let PodmanTest {
        cluster,
        host,
        docker,
        ns,
        api,
        _cleanup,
    } = PodmanTest::new("vm-zombie").await;
    let name = container_name(&ns, "zombie");

    let mut first = spawn_controller(cluster, &ns, &host, "first", &[]);
    apply_vm(cluster, &ns, "zombie", "1", "64Mi");
    wait_phase(&api, "zombie", Phase::Active, START, &first).await;
    assert_eq!(
        first.terminate(Duration::from_secs(30)),
        Some(0),
        "SIGTERM stops the controller cleanly"
    );

    // controller101 removed nothing here: the container outlived its VM for good.
    delete_vm(cluster, &ns, "zombie");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let held = vm(&api, "zombie")
        .await
        .expect("the finalizer keeps the object while no controller runs");
    assert!(held.metadata.deletion_timestamp.is_some());
    assert!(
        container_exists(&docker, &name).await,
        "nothing deleted the container yet"
    );

    let second = spawn_controller(cluster, &ns, &host, "second", &[]);
    wait_gone(&api, "zombie", Duration::from_secs(60), &second).await;
    assert!(
        !container_exists(&docker, &name).await,
        "the restarted controller deleted the container"
    );
    assert!(
        second
            .log()
            .contains("server deleted; removing the finalizer"),
        "{}",
        second.log_tail(20)
    );
}

#[tokio::test]
async fn the_fake_driver_runs_vms_without_any_engine() {
    let cluster = testenv::shared().await;
    install_crd(cluster).await;
    let ns = cluster.new_namespace("vm-fake").await.unwrap();
    let api: Api<VirtualMachine> = Api::namespaced(cluster.client().await.unwrap(), &ns);
    // An engine address where nothing listens: the fake driver must not need it.
    let mut controller = spawn_controller(
        cluster,
        &ns,
        "unix:///nonexistent/kubeloop.sock",
        "fake",
        &["--vm-driver", "fake", "--leader-elect=false"],
    );
    let Kubectl {
        success: ok,
        stdout: out,
        stderr: err,
        ..
    } = cluster.kubectl(&["apply", "-n", &ns, "-f", TEST_VM]);
    assert!(ok, "{out}{err}");
    let active = wait_phase(
        &api,
        "test-vm",
        Phase::Active,
        Duration::from_secs(60),
        &controller,
    )
    .await;
    let status = active.status.unwrap();
    let server = status.server.clone().unwrap();
    assert!(server.id.starts_with("fake-"), "{server:?}");
    // Conditions in the Kubernetes convention, and an event for each phase change, as
    // `kubectl describe` shows them.
    let ready = status
        .conditions
        .iter()
        .find(|c| c.type_ == "Ready")
        .expect("a Ready condition");
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("True", "Active")
    );
    assert_eq!(ready.observed_generation, active.metadata.generation);
    let describe = eventually("both transition events", Duration::from_secs(30), || {
        let Kubectl { stdout: out, .. } =
            cluster.kubectl(&["describe", "vm", "test-vm", "-n", &ns]);
        let ok = out.contains("(new) -> Creating") && out.contains("Creating -> Active");
        async move { ok.then_some(out) }
    })
    .await;
    for expected in [
        "Type:",
        "Ready",
        "ServerRunning",
        "Last Transition Time:",
        "Observed Generation:",
    ] {
        assert!(
            describe.contains(expected),
            "{expected} missing from kubectl describe:\n{describe}"
        );
    }
    let Kubectl {
        success: ok,
        stdout: out,
        stderr: err,
        ..
    } = cluster.kubectl(&["delete", "vm", "test-vm", "-n", &ns, "--timeout=60s"]);
    assert!(ok, "{out}{err}");
    assert!(vm(&api, "test-vm").await.is_none());
    assert_eq!(controller.terminate(Duration::from_secs(30)), Some(0));
}

#[tokio::test]
async fn editing_the_resources_recreates_the_container_with_the_new_limits() {
    let PodmanTest {
        cluster,
        host,
        docker,
        ns,
        api,
        _cleanup,
    } = PodmanTest::new("vm-resize").await;
    let controller = spawn_controller(cluster, &ns, &host, "one", &[]);
    apply_vm(cluster, &ns, "grow", "500m", "64Mi");
    let active = wait_phase(&api, "grow", Phase::Active, START, &controller).await;
    let old_id = active.status.unwrap().server.unwrap().id;

    let Kubectl {
        success: ok,
        stdout: out,
        stderr: err,
        ..
    } = cluster.kubectl(&[
        "patch",
        "vm",
        "grow",
        "-n",
        &ns,
        "--type=merge",
        "-p",
        r#"{"spec":{"resource":{"cpu":"1500m","memory":"128Mi"}}}"#,
    ]);
    assert!(ok, "{out}{err}");
    let name = container_name(&ns, "grow");
    let new_id = eventually("a resized container", Duration::from_secs(60), || async {
        let vm = vm(&api, "grow").await?;
        let server = vm.status.filter(|s| s.phase == Phase::Active)?.server?;
        (server.id != old_id).then_some(server.id)
    })
    .await;
    let host_config = docker
        .inspect_container(&name, None::<InspectContainerOptions>)
        .await
        .unwrap();
    assert_eq!(host_config.id.as_deref(), Some(new_id.as_str()));
    let limits = host_config.host_config.unwrap();
    assert_eq!(limits.nano_cpus, Some(1_500_000_000));
    assert_eq!(limits.memory, Some(128 * 1024 * 1024));
}

#[tokio::test]
async fn the_orphan_sweep_removes_a_labelled_container_whose_vm_does_not_exist() {
    use kubeloop::cache::{Lister, ThreadSafeStore};
    use kubeloop::controller::vm::{
        DockerDriver, DockerDriverConfig, KubeVmApi, SweepReport, sweep_orphans,
    };
    use kubeloop::runtime::ReconcileContext;

    let PodmanTest {
        cluster,
        host,
        docker,
        ns,
        api,
        _cleanup,
    } = PodmanTest::new("vm-sweep").await;

    // A live VM (no controller runs, so nothing else touches its container) and its container.
    apply_vm(cluster, &ns, "alive", "500m", "64Mi");
    let alive_uid = vm(&api, "alive").await.unwrap().metadata.uid.unwrap();
    let managed = "kubeloop-vm-controller";
    let alive = container_name(&ns, "alive");
    create_labelled_container(
        &docker,
        &alive,
        &[
            ("kubeloop.dev/vm-namespace", ns.as_str()),
            ("kubeloop.dev/vm-name", "alive"),
            ("kubeloop.dev/vm-uid", alive_uid.as_str()),
            ("kubeloop.dev/managed-by", managed),
        ],
    )
    .await;
    // The container of a VM that no longer exists (its maker died mid-create, say).
    let orphan = container_name(&ns, "gone");
    create_labelled_container(
        &docker,
        &orphan,
        &[
            ("kubeloop.dev/vm-namespace", ns.as_str()),
            ("kubeloop.dev/vm-name", "gone"),
            ("kubeloop.dev/vm-uid", "uid-of-a-deleted-vm"),
            ("kubeloop.dev/managed-by", managed),
        ],
    )
    .await;
    // Someone else's container without our managed-by label.
    let unmanaged = container_name(&ns, "unmanaged");
    create_labelled_container(
        &docker,
        &unmanaged,
        &[
            ("kubeloop.dev/vm-namespace", ns.as_str()),
            ("kubeloop.dev/vm-name", "unmanaged"),
            ("kubeloop.dev/vm-uid", "uid-of-someone-else"),
        ],
    )
    .await;

    let driver = DockerDriver::new(DockerDriverConfig {
        host: host.clone(),
        ..DockerDriverConfig::default()
    });
    // An informer cache that has seen nothing: the sweep must decide from live GETs.
    let vm_api = KubeVmApi::new(
        cluster.client().await.unwrap(),
        Lister::new(ThreadSafeStore::new(Default::default()).reader()),
    );
    let report = sweep_orphans(&driver, &vm_api, Some(&ns), &ReconcileContext::detached())
        .await
        .expect("the sweep runs");
    assert_eq!(
        report,
        SweepReport {
            examined: 2,
            removed: 1,
            kept: 1
        }
    );
    assert!(
        !container_exists(&docker, &orphan).await,
        "the orphan is removed"
    );
    assert!(
        container_exists(&docker, &alive).await,
        "the live VM's container stays"
    );
    assert!(
        container_exists(&docker, &unmanaged).await,
        "an unmanaged container stays"
    );
}
