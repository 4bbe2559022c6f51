//! `kubeloop vm-controller --vm-driver qemu` end to end: the real local control plane
//! (testenv), the real binary, kubectl, and real `qemu-system-x86_64` guests booting the
//! kernel and initramfs hack/setup-qemu builds (~/.cache/kubeloop/qemu, or
//! $KUBELOOP_QEMU_CACHE). kubeloop's own tests (client-go has no VM controller).
//!
//! Each test keeps its VMs in a state directory of its own (`--qemu-state-dir`), and every
//! QEMU left there is killed when the test ends, pass or fail ([`StateDirGuard`]).

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use kube_client::api::Api;
use kubeloop::controller::vm::{Phase, VirtualMachine, default_cache_dir};
use kubeloop_testenv::{self as testenv, Cluster};

use kubeloop_testenv::vm::{
    self, TEST_VM, apply_vm, delete_vm, install_crd, vm, wait_gone, wait_vm,
};
use kubeloop_testenv::{Kubectl, ManagedProcess};

// The QEMU driver's state directories and its QMP client are the driver's internals, not the
// library's API: this test compiles their files into itself (as tests/local/workqueue_loom.rs
// does with the queue's state), so it finds a VM's directory and asks QEMU the way the driver
// does. It uses part of each.
#[path = "../src/controller/vm/driver/qemu/qmp.rs"]
#[allow(dead_code)]
mod qmp;
#[path = "../src/controller/vm/driver/qemu/state.rs"]
#[allow(dead_code, unsafe_code)]
mod state;

use qmp::Qmp;
use state::{READY_LINE, ServerDir, StateRoot};

/// TCG boots take ~7 s alone on this project's 2-core machines, more with parallel tests.
const BOOT: Duration = Duration::from_secs(150);

/// Fails the test (never skips it) if hack/setup-qemu has not run.
fn require_qemu() {
    let cache = default_cache_dir();
    for file in ["vmlinuz", "initramfs.cpio.gz"] {
        assert!(
            cache.join(file).is_file(),
            "{} is missing: run hack/setup-qemu (hack/test does)",
            cache.join(file).display()
        );
    }
    let found = Command::new("qemu-system-x86_64")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        found,
        "qemu-system-x86_64 is not installed: run hack/setup-qemu"
    );
}

/// A `kubeloop vm-controller --vm-driver qemu` process keeping its VMs in `state`.
fn spawn_controller(cluster: &Cluster, ns: &str, state: &Path, identity: &str) -> ManagedProcess {
    vm::controller(
        cluster,
        cluster.kubeconfig_path(),
        &format!("vm-qemu-controller-{ns}-{identity}"),
    )
    .args(["--namespace", ns, "--leader-elect=false"])
    .args(["--vm-driver", "qemu", "--refresh-interval", "2s"])
    .arg("--qemu-state-dir")
    .arg(state)
    .start()
}

/// The test's state directory; on drop, SIGKILLs every QEMU still holding a pidfile in it
/// and removes it.
struct StateDirGuard {
    _tmp: tempfile::TempDir,
    path: PathBuf,
}

impl StateDirGuard {
    fn new() -> Self {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("qemu");
        Self { _tmp: tmp, path }
    }

    fn root(&self) -> StateRoot {
        StateRoot::new(self.path.clone()).unwrap()
    }

    /// The server directory of VM `ns/name` (exactly one).
    fn server(&self, ns: &str, name: &str) -> ServerDir {
        let dirs = self.root().of_vm(ns, name).unwrap();
        assert_eq!(
            dirs.len(),
            1,
            "one state directory for {ns}/{name}: {dirs:?}"
        );
        dirs.into_iter().next().unwrap()
    }
}

impl Drop for StateDirGuard {
    fn drop(&mut self) {
        let Ok(root) = StateRoot::new(self.path.clone()) else {
            return;
        };
        for dir in root.all().unwrap_or_default() {
            if let Ok(Some(pid)) = dir.live_pid() {
                // SAFETY: kill(2) of the QEMU holding this test's pidfile.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
    }
}

/// What every test here starts from (after checking QEMU is set up): the shared cluster with
/// the CRD, a namespace of its own with the VM API in it, and a state directory of its own.
struct QemuTest {
    cluster: &'static Cluster,
    ns: String,
    state: StateDirGuard,
    api: Api<VirtualMachine>,
}

impl QemuTest {
    async fn new(namespace_prefix: &str) -> Self {
        require_qemu();
        let cluster = testenv::shared().await;
        install_crd(cluster).await;
        let ns = cluster.new_namespace(namespace_prefix).await.unwrap();
        let state = StateDirGuard::new();
        let api = Api::namespaced(cluster.client().await.unwrap(), &ns);
        Self {
            cluster,
            ns,
            state,
            api,
        }
    }
}

fn cpu_of(v: &VirtualMachine) -> f64 {
    v.status
        .as_ref()
        .and_then(|s| s.server.as_ref())
        .map(|s| s.usage.cpu)
        .unwrap_or(0.0)
}

/// Types `line` into the guest's serial console (its shell).
fn console(dir: &ServerDir, line: &str) {
    let mut stream = UnixStream::connect(dir.file("console.sock")).expect("console socket");
    stream.write_all(format!("{line}\n").as_bytes()).unwrap();
    stream.flush().unwrap();
    // Let QEMU read it before the connection goes.
    std::thread::sleep(Duration::from_millis(300));
}

fn process_alive(pid: i32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
        && !std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .unwrap_or_default()
            .contains(") Z ")
}

async fn qmp(dir: &ServerDir) -> Qmp {
    Qmp::connect(&dir.file("qmp.sock"), Duration::from_secs(10))
        .await
        .expect("QMP")
}

#[tokio::test]
async fn test_vm_boots_to_active_with_2_vcpus_and_4g_shows_load_and_is_removed_on_delete() {
    let QemuTest {
        cluster,
        ns,
        state,
        api,
    } = QemuTest::new("vm-qemu").await;
    let controller = spawn_controller(cluster, &ns, &state.path, "a");

    let applied = Instant::now();
    let Kubectl {
        success: ok,
        stdout: out,
        stderr: err,
        ..
    } = cluster.kubectl(&["apply", "-n", &ns, "-f", TEST_VM]);
    assert!(ok, "{out}{err}");
    let creating = wait_vm(&api, "test-vm", "Creating", BOOT, &controller, |v| {
        v.phase() == Phase::Creating || v.phase() == Phase::Active
    })
    .await;
    let active = wait_vm(&api, "test-vm", "Active", BOOT, &controller, |v| {
        v.phase() == Phase::Active
    })
    .await;
    let boot = applied.elapsed();
    let server = active.status.as_ref().unwrap().server.clone().unwrap();
    assert_eq!(server.state, "running");
    let dir = state.server(&ns, "test-vm");
    assert_eq!(server.id, dir.id, "the server id is its state directory");
    assert!(
        dir.id.ends_with(active.metadata.uid.as_deref().unwrap()),
        "{}",
        dir.id
    );
    let serial = std::fs::read_to_string(dir.file("serial.log")).unwrap();
    assert!(serial.contains(READY_LINE), "{serial}");
    // QMP is full control of the VM and the console a root shell in its guest: the state
    // directory, and everything in it the driver, the monitor and QEMU made, are the user's
    // alone.
    {
        use std::os::unix::fs::MetadataExt;
        let mode = |path: &Path| std::fs::symlink_metadata(path).unwrap().mode() & 0o777;
        assert_eq!(mode(&state.path), 0o700, "{}", state.path.display());
        assert_eq!(mode(&dir.path), 0o700);
        for name in [
            "vm.json",
            "cmdline",
            "serial.log",
            "qemu.log",
            "started",
            "qmp.sock",
            "console.sock",
        ] {
            let m = mode(&dir.file(name));
            assert_eq!(m & 0o077, 0, "{name} has mode {m:o}");
        }
    }

    // The guest itself saw 2 vCPUs (its readiness line says so).
    assert!(serial.contains("2 vCPUs"), "{serial}");
    let record = dir.record().unwrap();
    eprintln!(
        "test-vm: apply -> Active in {boot:?} under {} (Creating seen: {:?})",
        record.accelerator,
        creating.phase()
    );
    assert!(
        ["kvm", "tcg"].contains(&record.accelerator.as_str()),
        "{record:?}"
    );
    // The VM's status says which: status.server.accelerator.
    assert_eq!(
        server.accelerator.as_deref(),
        Some(record.accelerator.as_str())
    );

    // QEMU was given 2 vCPUs and 4G (4,000,000,000 bytes, rounded up to 3815 MiB).
    let mut q = qmp(&dir).await;
    let cpus = q.execute("query-cpus-fast", None).await.unwrap();
    assert_eq!(cpus.as_array().map(Vec::len), Some(2), "{cpus}");
    let memory = q.execute("query-memory-size-summary", None).await.unwrap();
    assert_eq!(memory["base-memory"].as_u64(), Some(3815 << 20), "{memory}");
    drop(q);
    let cmdline = std::fs::read_to_string(dir.file("cmdline")).unwrap();
    assert!(cmdline.contains("\n-smp\n2\n"), "{cmdline}");
    assert!(cmdline.contains("\n-m\n3815M\n"), "{cmdline}");
    let pid = dir.live_pid().unwrap().expect("qemu holds its pidfile");

    // Idle, then two busy loops inside the guest: the CPU column follows.
    let idle = wait_vm(&api, "test-vm", "an idle refresh", BOOT, &controller, |v| {
        v.phase() == Phase::Active && cpu_of(v) < 60.0
    })
    .await;
    console(&dir, "burn 2");
    let busy = wait_vm(
        &api,
        "test-vm",
        "CPU above 80% with 2 busy vCPUs",
        Duration::from_secs(60),
        &controller,
        |v| cpu_of(v) > 80.0,
    )
    .await;
    let Kubectl {
        success: ok,
        stdout: out,
        ..
    } = cluster.kubectl(&["get", "vm", "test-vm", "-n", &ns]);
    assert!(ok);
    eprintln!(
        "CPU idle {} -> busy {}; kubectl get vm:\n{out}",
        cpu_of(&idle),
        cpu_of(&busy)
    );
    let memory_percent = busy.status.unwrap().server.unwrap().usage.memory;
    assert!(
        memory_percent > 0.0 && memory_percent < 100.0,
        "MEMORY% = RSS / 3815 MiB: {memory_percent}"
    );

    let Kubectl {
        success: ok,
        stdout: out,
        stderr: err,
        ..
    } = cluster.kubectl(&["delete", "vm", "test-vm", "-n", &ns]);
    assert!(ok, "{out}{err}");
    wait_gone(&api, "test-vm", Duration::from_secs(60), &controller).await;
    assert!(!process_alive(pid), "qemu {pid} is gone");
    assert!(!dir.path.exists(), "{} was removed", dir.path.display());
    let log = controller.log();
    assert!(
        log.contains("qemu stopped after system_powerdown"),
        "{}",
        controller.log_tail(30)
    );
}

#[tokio::test]
async fn a_sigkilled_qemu_is_detected_and_booted_again_and_a_restarted_controller_adopts_it() {
    let QemuTest {
        cluster,
        ns,
        state,
        api,
    } = QemuTest::new("vm-qemu-kill").await;
    let mut first = spawn_controller(cluster, &ns, &state.path, "a");
    apply_vm(cluster, &ns, "victim", "1", "256Mi");
    wait_vm(&api, "victim", "Active", BOOT, &first, |v| {
        v.phase() == Phase::Active
    })
    .await;
    let dir = state.server(&ns, "victim");
    let pid = dir.live_pid().unwrap().expect("qemu runs");

    // The VM outlives its controller, and the next one adopts it without a reboot.
    first.kill();
    assert!(process_alive(pid), "qemu survived the controller's SIGKILL");
    let second = spawn_controller(cluster, &ns, &state.path, "b");
    tokio::time::sleep(Duration::from_secs(6)).await;
    let adopted = vm(&api, "victim").await.unwrap();
    assert_eq!(adopted.phase(), Phase::Active);
    assert_eq!(
        dir.live_pid().unwrap(),
        Some(pid),
        "the same qemu, not a new boot"
    );

    // SIGKILL the qemu: seen as an exited server (code 137), booted again, Active again.
    // SAFETY: kill(2) of the qemu holding the VM's pidfile.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    let noticed = wait_vm(
        &api,
        "victim",
        "the dead qemu noticed",
        Duration::from_secs(30),
        &second,
        |v| v.phase() != Phase::Active,
    )
    .await;
    let reason = noticed.status.unwrap().reason;
    assert!(reason.contains("exited"), "{reason}");
    wait_vm(&api, "victim", "Active again", BOOT, &second, |v| {
        v.phase() == Phase::Active
    })
    .await;
    let new_pid = dir.live_pid().unwrap().expect("a new qemu runs");
    assert_ne!(new_pid, pid);
    assert!(
        std::fs::read_to_string(dir.file("serial.log.1"))
            .unwrap()
            .contains(READY_LINE),
        "the killed boot's console is kept"
    );
    let Kubectl {
        success: ok,
        stdout: out,
        stderr: err,
        ..
    } = cluster.kubectl(&["delete", "vm", "victim", "-n", &ns]);
    assert!(ok, "{out}{err}");
    wait_gone(&api, "victim", Duration::from_secs(60), &second).await;
    assert!(!process_alive(new_pid));
    assert!(state.root().all().unwrap().is_empty());
}

#[tokio::test]
async fn a_controller_killed_while_deleting_a_vm_finalizes_it_on_restart() {
    let QemuTest {
        cluster,
        ns,
        state,
        api,
    } = QemuTest::new("vm-qemu-del").await;
    let mut first = spawn_controller(cluster, &ns, &state.path, "a");
    apply_vm(cluster, &ns, "doomed", "1", "256Mi");
    wait_vm(&api, "doomed", "Active", BOOT, &first, |v| {
        v.phase() == Phase::Active
    })
    .await;
    let dir = state.server(&ns, "doomed");
    let pid = dir.live_pid().unwrap().expect("qemu runs");
    // The guest stops answering the power button, so the delete sits in its powerdown wait
    // (10 s) when the controller is killed.
    console(&dir, "killall acpid");

    delete_vm(cluster, &ns, "doomed");
    wait_vm(
        &api,
        "doomed",
        "Terminating",
        Duration::from_secs(30),
        &first,
        |v| v.phase() == Phase::Terminating,
    )
    .await;
    // Into the delete's powerdown wait.
    tokio::time::sleep(Duration::from_secs(2)).await;
    first.kill();
    assert!(
        process_alive(pid),
        "the controller died mid-delete, before qemu"
    );
    assert!(dir.path.exists());
    assert!(
        vm(&api, "doomed").await.is_some(),
        "the finalizer holds the object"
    );

    let second = spawn_controller(cluster, &ns, &state.path, "b");
    wait_gone(&api, "doomed", Duration::from_secs(90), &second).await;
    assert!(!process_alive(pid), "no qemu left");
    assert!(!dir.path.exists(), "no state directory left");
    assert!(state.root().all().unwrap().is_empty());
    let log = second.log();
    assert!(
        log.contains("server deleted; removing the finalizer"),
        "{}",
        second.log_tail(20)
    );
}
