//! Status and conditions when the engine misbehaves: an engine outage, a container removed or
//! killed behind the controller's back, a server that keeps exiting (restart backoff,
//! crash-loop).

use super::*;

/// A podman service of this test's own on a temp socket, so it can be stopped and restarted
/// without touching the shared one.
struct PrivateEngine {
    socket: PathBuf,
    log: PathBuf,
    service: Option<ManagedProcess>,
}

impl PrivateEngine {
    fn new(dir: &Path) -> Self {
        let socket =
            std::env::temp_dir().join(format!("kubeloop-vm-engine-{}.sock", std::process::id()));
        Self {
            socket,
            log: dir.join(format!("podman-private-{}.log", std::process::id())),
            service: None,
        }
    }

    fn host(&self) -> String {
        format!("unix://{}", self.socket.display())
    }

    async fn start(&mut self) {
        let _ = std::fs::remove_file(&self.socket);
        let mut command = Command::new("podman");
        command
            .args(["system", "service", "--time=0"])
            .arg(self.host());
        let service = ManagedProcess::start("podman system service", command, &self.log)
            .expect("starting podman system service");
        self.service = Some(service);
        let host = self.host();
        eventually(
            "the private podman service to answer",
            Duration::from_secs(30),
            || {
                let host = host.clone();
                async move {
                    let docker = Docker::connect_with_host(&host).ok()?;
                    docker.ping().await.ok().map(|_| ())
                }
            },
        )
        .await;
    }

    /// SIGKILL, as an engine that crashes.
    fn stop(&mut self) {
        self.service = None;
    }
}

impl Drop for PrivateEngine {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_file(&self.socket);
    }
}

#[tokio::test]
async fn an_engine_outage_fails_the_vm_naming_the_engine_and_it_is_active_again_once_back() {
    let cluster = testenv::shared().await;
    install_crd(cluster).await;
    let ns = cluster.new_namespace("vm-outage").await.unwrap();
    let _cleanup = ContainerCleanup(ns.clone());
    let mut engine = PrivateEngine::new(cluster.dir());
    engine.start().await;
    let host = engine.host();
    let api: Api<VirtualMachine> = Api::namespaced(cluster.client().await.unwrap(), &ns);
    // Retries of a failing VM wait at most 3 s (the default is 2 min).
    let controller = spawn_controller(
        cluster,
        &ns,
        &host,
        "one",
        &["--refresh-interval", "2s", "--max-retry-delay", "3s"],
    );

    apply_vm(cluster, &ns, "outage", "1", "64Mi");
    let before = wait_phase(&api, "outage", Phase::Active, START, &controller).await;
    let id_before = before.status.unwrap().server.unwrap().id;

    engine.stop();
    let failed = wait_phase(
        &api,
        "outage",
        Phase::Failed,
        Duration::from_secs(30),
        &controller,
    )
    .await;
    let reason = failed.status.unwrap().reason;
    assert!(
        reason.contains(&format!("docker engine at {host} is unreachable")),
        "the reason names the engine: {reason}"
    );
    println!("reason while the engine is down: {reason}");
    // Down for 30 s: uncapped, the retries (5 ms doubling) would by now be about 30 s apart.
    tokio::time::sleep(Duration::from_secs(30)).await;

    engine.start().await;
    let back = Instant::now();
    let after = wait_phase(
        &api,
        "outage",
        Phase::Active,
        Duration::from_secs(60),
        &controller,
    )
    .await;
    let noticed = back.elapsed();
    println!("the recovered engine was noticed after {noticed:?}");
    assert!(
        noticed < Duration::from_secs(15),
        "with retries capped at 3 s the recovered engine is noticed within a few seconds, took {noticed:?}"
    );
    let status = after.status.unwrap();
    assert_eq!(status.reason, "");
    assert_eq!(
        status.server.unwrap().id,
        id_before,
        "the container survived the outage and was adopted"
    );
}

#[tokio::test]
async fn a_container_removed_behind_the_controllers_back_is_reported_and_recreated() {
    let PodmanTest {
        cluster,
        host,
        docker,
        ns,
        api,
        _cleanup,
    } = PodmanTest::new("vm-vanish").await;
    let controller = spawn_controller(cluster, &ns, &host, "one", &["--refresh-interval", "2s"]);

    apply_vm(cluster, &ns, "ghost", "500m", "64Mi");
    let active = wait_phase(&api, "ghost", Phase::Active, START, &controller).await;
    let old_id = active.status.unwrap().server.unwrap().id;

    let rv = api
        .get("ghost")
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let mut events = api
        .watch(&WatchParams::default(), &rv)
        .await
        .unwrap()
        .boxed();
    let name = container_name(&ns, "ghost");
    let out = Command::new("podman")
        .args(["rm", "-f", "-t", "0", &name])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "podman rm: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    let mut seen = Vec::new();
    let new_id = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(WatchEvent::Modified(vm)) = events.try_next().await.expect("watch") {
            let status = vm.status.clone().unwrap_or_default();
            seen.push((status.phase, status.reason.clone()));
            if status.phase == Phase::Active
                && let Some(server) = status.server.filter(|s| s.id != old_id)
            {
                return server.id;
            }
        }
        panic!("watch ended")
    })
    .await
    .unwrap_or_else(|_| panic!("not recreated; seen {seen:?}\n{}", controller.log_tail(30)));
    let vanished = seen
        .iter()
        .find(|(phase, _)| *phase == Phase::Failed)
        .unwrap_or_else(|| panic!("no Failed phase in {seen:?}"));
    assert!(
        vanished
            .1
            .contains(&format!("server {name} (id {old_id}) vanished")),
        "{vanished:?}"
    );
    let inspected = docker
        .inspect_container(&name, None::<InspectContainerOptions>)
        .await
        .unwrap();
    assert_eq!(inspected.id.as_deref(), Some(new_id.as_str()));
    assert_eq!(inspected.host_config.unwrap().nano_cpus, Some(500_000_000));
}

#[tokio::test]
async fn a_container_killed_behind_the_controllers_back_is_failed_with_its_exit_code_then_restarted_after_its_backoff()
 {
    let PodmanTest {
        cluster,
        host,
        ns,
        api,
        _cleanup,
        ..
    } = PodmanTest::new("vm-killed").await;
    let controller = spawn_controller(cluster, &ns, &host, "one", &["--refresh-interval", "1s"]);

    apply_vm(cluster, &ns, "victim", "500m", "64Mi");
    let active = wait_phase(&api, "victim", Phase::Active, START, &controller).await;
    let id = active.status.unwrap().server.unwrap().id;
    let name = container_name(&ns, "victim");
    let out = Command::new("podman")
        .args(["kill", "--signal", "KILL", &name])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "podman kill: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    // Noticed on the next refresh: not Active, the exit code (SIGKILL: 137) in the reason and
    // the conditions, the same container kept for its restart.
    let failed = wait_phase(
        &api,
        "victim",
        Phase::Failed,
        Duration::from_secs(20),
        &controller,
    )
    .await;
    let status = failed.status.clone().unwrap();
    assert!(
        status.reason.contains("exited with code 137"),
        "{}",
        status.reason
    );
    assert_eq!(status.server.as_ref().unwrap().exit_code, Some(137));
    let (ready, ready_reason, _) = vm_condition(&failed, "Ready");
    assert_eq!((ready.as_str(), ready_reason.as_str()), ("False", "Failed"));
    let (running, running_reason, message) = vm_condition(&failed, "ServerRunning");
    assert_eq!(
        (running.as_str(), running_reason.as_str()),
        ("False", "Exited")
    );
    assert!(message.contains("exit code 137"), "{message}");

    // Restarted once its 10 s backoff passed: Active again on the same container, one restart.
    let restarted = wait_vm(
        &api,
        "victim",
        "Active again after one restart",
        Duration::from_secs(40),
        &controller,
        |v| v.phase() == Phase::Active && v.status.as_ref().is_some_and(|s| s.restarts == 1),
    )
    .await;
    assert_eq!(restarted.status.unwrap().server.unwrap().id, id);

    // The transitions are events, and `kubectl describe` shows them with the conditions.
    let events = eventually("the transition events", Duration::from_secs(10), || async {
        let events = vm_events(cluster, &ns, "victim").await;
        let reasons: Vec<&str> = events.iter().map(|(_, r, _)| r.as_str()).collect();
        (reasons.contains(&"Failed")
            && reasons.contains(&"Restarting")
            && reasons.iter().filter(|r| **r == "Active").count() >= 2)
            .then_some(events)
    })
    .await;
    let failed_event = events.iter().find(|(_, r, _)| r == "Failed").unwrap();
    assert_eq!(failed_event.0, "Warning");
    assert!(
        failed_event
            .2
            .contains(&format!("VirtualMachine {ns}/victim: Active -> Failed"))
            && failed_event.2.contains("code 137"),
        "{failed_event:?}"
    );
    let Kubectl {
        success: ok,
        stdout: described,
        stderr: err,
        ..
    } = cluster.kubectl(&["describe", "vm", "-n", &ns, "victim"]);
    assert!(ok, "{err}");
    for wanted in [
        "Conditions:",
        "ServerRunning",
        "Restarting",
        "Active -> Failed",
    ] {
        assert!(described.contains(wanted), "no {wanted:?} in:\n{described}");
    }
    drop(controller);
}

/// Builds (once) an image like the VM image whose command exits with 3 at once.
fn exiting_image() -> String {
    let image = "localhost/kubeloop/vm-exit3:latest".to_string();
    let exists = Command::new("podman")
        .args(["image", "exists", &image])
        .status()
        .unwrap();
    if exists.success() {
        return image;
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("Containerfile"),
        format!(
            "FROM {}\nCMD [\"/bin/sh\", \"-c\", \"exit 3\"]\n",
            kubeloop::controller::vm::DEFAULT_IMAGE
        ),
    )
    .unwrap();
    let out = Command::new("podman")
        .args(["build", "-t", &image])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "podman build: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    image
}

#[tokio::test]
async fn a_server_that_keeps_exiting_is_restarted_with_a_growing_backoff_and_goes_crash_loop_back_off()
 {
    let PodmanTest {
        cluster,
        host,
        ns,
        api,
        _cleanup,
        ..
    } = PodmanTest::new("vm-crashloop").await;
    let image = exiting_image();
    let controller = spawn_controller(
        cluster,
        &ns,
        &host,
        "one",
        &["--refresh-interval", "1s", "--vm-image", &image],
    );
    let started = Instant::now();
    apply_vm(cluster, &ns, "crasher", "100m", "32Mi");

    // Exits at once each time: waits of 10 s then 20 s, and after the third exit in a row
    // CrashLoopBackOff (waiting 40 s), with the exit code.
    let looping = wait_phase(
        &api,
        "crasher",
        Phase::CrashLoopBackOff,
        Duration::from_secs(75),
        &controller,
    )
    .await;
    let took = started.elapsed();
    let status = looping.status.clone().unwrap();
    assert_eq!(status.restarts, 2, "{status:?}");
    assert!(
        status.reason.contains("exited with code 3") && status.reason.contains("exit 3 in a row"),
        "{}",
        status.reason
    );
    assert_eq!(vm_condition(&looping, "Ready").1, "CrashLoopBackOff");
    assert!(
        took >= Duration::from_secs(30),
        "two restarts must wait 10 s + 20 s, took {took:?}"
    );
    // No hot restarts: 15 s later (inside the 40 s wait) still 2 restarts.
    tokio::time::sleep(Duration::from_secs(15)).await;
    let later = vm(&api, "crasher").await.unwrap();
    assert_eq!(later.status.as_ref().unwrap().restarts, 2);
    assert_eq!(later.phase(), Phase::CrashLoopBackOff);
    let events = vm_events(cluster, &ns, "crasher").await;
    let crash_loop = events
        .iter()
        .find(|(_, r, _)| r == "CrashLoopBackOff")
        .unwrap_or_else(|| panic!("no CrashLoopBackOff event in {events:?}"));
    assert_eq!(crash_loop.0, "Warning");
    let restarting = events.iter().filter(|(_, r, _)| r == "Restarting").count();
    assert_eq!(restarting, 2, "{events:?}");
}
