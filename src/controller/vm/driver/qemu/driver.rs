//! [`QemuDriver`]: the [`Driver`] whose servers are `qemu-system-x86_64` processes.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::OnceCell;
use tracing::{info, warn};

use super::launch::{LaunchSpec, probe_kvm, spawn_detached};
use super::qmp::{Qmp, QmpError, query_accelerator, query_status};
use super::state::{READY_LINE, ServerDir, StateRoot, VmRecord, valid_uid};
use super::usage::{self, CpuSample};
use crate::controller::vm::driver::{
    Created, DEFAULT_MANAGED_BY, DeleteOutcome, Driver, DriverError, DriverServerStatus,
    ManagedServer, ServerSpec,
};

/// The least memory a VM may have: the guest kernel and the unpacked initramfs need about
/// 96 MiB (64 MiB panics at boot); with a margin.
pub const MIN_MEMORY_MIB: u64 = 128;
/// The most vCPUs QEMU's `pc` machine takes.
pub const MAX_VCPUS: u32 = 255;

/// `--qemu-accel`: how VMs run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Accel {
    /// KVM if a probe guest boots under it, else TCG (decided once per driver).
    #[default]
    Auto,
    /// Hardware virtualization (`-accel kvm`).
    Kvm,
    /// QEMU's emulation (`-accel tcg`).
    Tcg,
}

/// Where the QEMU driver keeps its VMs and what it boots.
#[derive(Clone, Debug)]
pub struct QemuDriverConfig {
    /// The root of the per-VM state directories.
    pub state_dir: PathBuf,
    /// The guest kernel and initramfs (hack/setup-qemu's cache).
    pub kernel: PathBuf,
    /// The initramfs hack/setup-qemu builds.
    pub initrd: PathBuf,
    /// The `qemu-system-x86_64` to run.
    pub qemu_binary: PathBuf,
    /// KVM, TCG, or a probe to choose.
    pub accel: Accel,
    /// How long a create waits for the readiness line; past it the create fails (the VM stays
    /// booting and the next pass adopts it and waits again).
    pub boot_timeout: Duration,
    /// How long a delete waits for the guest to power off after the ACPI power button.
    pub powerdown_timeout: Duration,
    /// How long it then waits after QMP `quit` before SIGKILL.
    pub quit_timeout: Duration,
    /// Each QMP exchange.
    pub qmp_timeout: Duration,
    /// TCG's translation buffer (MiB).
    pub tcg_tb_size_mib: u32,
    /// The `kubeloop.dev/managed-by` value written into every `vm.json` and listed by.
    pub managed_by: String,
}

/// `$KUBELOOP_QEMU_STATE_DIR`, else `/var/lib/kubeloop/qemu` for root, else
/// `$XDG_STATE_HOME/kubeloop/qemu` (`~/.local/state/kubeloop/qemu`). Empty when none of these
/// is set ([`QemuDriver::new`] then refuses, saying so): never a fixed place under `/tmp`,
/// which another local user could create first.
pub fn default_state_dir() -> PathBuf {
    if let Some(dir) = env_path("KUBELOOP_QEMU_STATE_DIR") {
        return dir;
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        return PathBuf::from("/var/lib/kubeloop/qemu");
    }
    env_path("XDG_STATE_HOME")
        .or_else(|| env_path("HOME").map(|h| h.join(".local/state")))
        .map(|state| state.join("kubeloop/qemu"))
        .unwrap_or_default()
}

/// `$KUBELOOP_QEMU_CACHE`, else `$KUBELOOP_CACHE/qemu`, else `~/.cache/kubeloop/qemu` (where
/// hack/setup-qemu builds).
pub fn default_cache_dir() -> PathBuf {
    env_path("KUBELOOP_QEMU_CACHE")
        .or_else(|| env_path("KUBELOOP_CACHE").map(|c| c.join("qemu")))
        .or_else(|| env_path("HOME").map(|h| h.join(".cache/kubeloop/qemu")))
        .unwrap_or_else(|| PathBuf::from("/tmp/kubeloop/qemu"))
}

fn env_path(name: &str) -> Option<PathBuf> {
    std::env::var_os(name)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

impl Default for QemuDriverConfig {
    fn default() -> Self {
        let cache = default_cache_dir();
        Self {
            state_dir: default_state_dir(),
            kernel: cache.join("vmlinuz"),
            initrd: cache.join("initramfs.cpio.gz"),
            qemu_binary: PathBuf::from("qemu-system-x86_64"),
            accel: Accel::Auto,
            boot_timeout: Duration::from_secs(120),
            powerdown_timeout: Duration::from_secs(10),
            quit_timeout: Duration::from_secs(5),
            qmp_timeout: Duration::from_secs(5),
            tcg_tb_size_mib: 32,
            managed_by: DEFAULT_MANAGED_BY.to_string(),
        }
    }
}

/// The driver. Cheap to clone; all clones share the accelerator decision and CPU samples.
#[derive(Clone)]
pub struct QemuDriver {
    config: Arc<QemuDriverConfig>,
    root: StateRoot,
    engine: String,
    /// `kvm` or `tcg`, decided at the first launch.
    accelerator: Arc<OnceCell<&'static str>>,
    /// The last CPU sample of each server (by id); an entry goes when the driver deletes it.
    samples: Arc<Mutex<HashMap<String, CpuSample>>>,
}

impl QemuDriver {
    /// A driver keeping its VMs under `config.state_dir` (created if missing). Fails if that
    /// directory cannot be made or is too long for the sockets inside it.
    pub fn new(config: QemuDriverConfig) -> std::io::Result<Self> {
        let root = StateRoot::new(config.state_dir.clone())?;
        let engine = format!("qemu at {}", root.path().display());
        Ok(Self {
            config: Arc::new(config),
            root,
            engine,
            accelerator: Arc::default(),
            samples: Arc::default(),
        })
    }

    /// The state directory root.
    pub fn state_root(&self) -> &std::path::Path {
        self.root.path()
    }

    fn engine_error(&self, operation: &'static str, server: &str, message: String) -> DriverError {
        DriverError::Engine {
            engine: self.engine.clone(),
            operation,
            server: server.to_string(),
            message,
        }
    }

    fn refused(&self, operation: &'static str, server: &str, message: String) -> DriverError {
        DriverError::Refused {
            engine: self.engine.clone(),
            operation,
            server: server.to_string(),
            message,
        }
    }

    fn io_error(&self, operation: &'static str, server: &str, e: std::io::Error) -> DriverError {
        self.engine_error(operation, server, e.to_string())
    }

    async fn accelerator(&self) -> &'static str {
        *self
            .accelerator
            .get_or_init(|| async {
                match self.config.accel {
                    Accel::Kvm => "kvm",
                    Accel::Tcg => "tcg",
                    Accel::Auto => {
                        let (accel, why) = probe_kvm(
                            &self.config.qemu_binary,
                            &self.config.kernel,
                            Duration::from_secs(5),
                        )
                        .await;
                        info!(accelerator = accel, reason = %why, "QEMU driver: accelerator chosen");
                        accel
                    }
                }
            })
            .await
    }

    async fn qmp(&self, dir: &ServerDir) -> Result<Qmp, QmpError> {
        Qmp::connect(&dir.file("qmp.sock"), self.config.qmp_timeout).await
    }

    /// The server directory of VM `name` (a server name), whatever its uid: the one, or the
    /// first if several (only possible after a crash mid-create of another uid).
    fn find(&self, name: &str) -> Result<Option<ServerDir>, DriverError> {
        let Some((namespace, vm_name)) = split_server_name(name) else {
            return Ok(None);
        };
        let found = self
            .root
            .of_vm(namespace, vm_name)
            .map_err(|e| self.io_error("inspect", name, e))?;
        Ok(found.into_iter().next())
    }

    /// The status of the server in `dir`.
    async fn status_of(&self, dir: &ServerDir) -> Result<DriverServerStatus, DriverError> {
        let server = dir.id.clone();
        let record = dir
            .record()
            .map_err(|e| self.io_error("inspect", &server, e))?;
        let pid = dir
            .live_pid()
            .map_err(|e| self.io_error("inspect", &server, e))?;
        let mut status = DriverServerStatus {
            id: dir.id.clone(),
            state: String::new(),
            running: false,
            cpu_percent: 0.0,
            memory_percent: 0.0,
            cpu_millis: record.cpu_millis,
            memory_bytes: record.memory_bytes,
            vm_uid: Some(dir.uid.clone()),
            started_at: dir.started_at(),
            finished_at: None,
            exit_code: None,
            accelerator: Some(record.accelerator.clone()).filter(|a| !a.is_empty()),
        };
        let Some(pid) = pid else {
            // Dead (or never started): the monitor's record of the end, else the last output.
            match (dir.exit(), status.started_at) {
                (Some(exit), _) => {
                    status.state = "exited".into();
                    status.finished_at = Some(exit.at);
                    status.exit_code = Some(exit.code);
                }
                (None, Some(_)) => {
                    status.state = "exited".into();
                    status.finished_at = dir.last_output_at().or(status.started_at);
                }
                (None, None) => status.state = "created".into(),
            }
            self.samples.lock().remove(&dir.id);
            return Ok(status);
        };
        if !dir.ready(READY_LINE) {
            status.state = "booting".into();
            return Ok(status);
        }
        let mut qmp = self
            .qmp(dir)
            .await
            .map_err(|e| self.engine_error("inspect", &server, e.to_string()))?;
        status.state = query_status(&mut qmp)
            .await
            .map_err(|e| self.engine_error("inspect", &server, e.to_string()))?;
        drop(qmp);
        status.running = status.state == "running";
        if status.running {
            let (cpu, memory) = self.usage(dir, pid, record.memory_mib << 20);
            status.cpu_percent = cpu;
            status.memory_percent = memory;
        }
        Ok(status)
    }

    /// (CPU%, MEMORY%) of the QEMU process `pid` (see [`super::usage`]); zeros if /proc
    /// cannot be read (the process just ended).
    fn usage(&self, dir: &ServerDir, pid: i32, guest_bytes: u64) -> (f64, f64) {
        let ticks = usage::ticks_per_second();
        let Ok(now) = usage::sample(pid) else {
            return (0.0, 0.0);
        };
        let previous = self.samples.lock().insert(dir.id.clone(), now);
        let cpu = match previous {
            Some(before) if before.pid == now.pid && before.start_ticks == now.start_ticks => {
                usage::cpu_percent_between(&before, &now, ticks)
            }
            _ => usage::uptime_seconds()
                .map(|up| usage::cpu_percent_since_start(&now, up, ticks))
                .unwrap_or(0.0),
        };
        let memory = usage::rss_bytes(pid)
            .map(|rss| usage::memory_percent(rss, guest_bytes))
            .unwrap_or(0.0);
        (cpu, memory)
    }

    /// Starts QEMU in `dir` (no QEMU runs there) and waits until its QMP answers; records the
    /// accelerator QMP reports.
    async fn launch(&self, dir: &ServerDir, record: &mut VmRecord) -> Result<(), DriverError> {
        let server = record.server.clone();
        let accelerator = self.accelerator().await;
        dir.reset_boot()
            .map_err(|e| self.io_error("create", &server, e))?;
        let spec = LaunchSpec {
            qemu_binary: self.config.qemu_binary.clone(),
            kernel: self.config.kernel.clone(),
            initrd: self.config.initrd.clone(),
            accelerator,
            vcpus: record.vcpus,
            memory_mib: record.memory_mib,
            tcg_tb_size_mib: self.config.tcg_tb_size_mib,
            name: server.clone(),
        };
        for file in [&spec.kernel, &spec.initrd] {
            if !file.is_file() {
                return Err(self.refused(
                    "create",
                    &server,
                    format!("{} is missing (run hack/setup-qemu)", file.display()),
                ));
            }
        }
        spawn_detached(&spec, dir).await.map_err(|e| {
            self.engine_error(
                "create",
                &server,
                format!("starting {}: {e}", spec.qemu_binary.display()),
            )
        })?;
        let deadline = tokio::time::Instant::now() + self.config.qmp_timeout * 2;
        loop {
            if let Some(exit) = dir.exit() {
                // QEMU refused its command line (memory it cannot map, an accelerator that
                // fails): the same spec fails again.
                return Err(self.refused(
                    "create",
                    &server,
                    format!(
                        "qemu exited with code {} at start: {}",
                        exit.code,
                        dir.qemu_log_tail(3)
                    ),
                ));
            }
            if let Ok(mut qmp) = self.qmp(dir).await {
                let accel = query_accelerator(&mut qmp)
                    .await
                    .map_err(|e| self.engine_error("create", &server, e.to_string()))?;
                record.accelerator = accel.to_string();
                dir.write_record(record)
                    .map_err(|e| self.io_error("create", &server, e))?;
                return Ok(());
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(self.engine_error(
                    "create",
                    &server,
                    format!(
                        "qemu did not open its QMP socket within {:?}; its log: {}",
                        self.config.qmp_timeout * 2,
                        dir.qemu_log_tail(3)
                    ),
                ));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits (bounded) for the readiness line of the QEMU in `dir`.
    async fn wait_ready(&self, dir: &ServerDir, server: &str) -> Result<(), DriverError> {
        let deadline = tokio::time::Instant::now() + self.config.boot_timeout;
        loop {
            if dir.ready(READY_LINE) {
                return Ok(());
            }
            let alive = dir
                .live_pid()
                .map_err(|e| self.io_error("create", server, e))?
                .is_some();
            if !alive {
                // Give the monitor a moment to record the end.
                for _ in 0..20 {
                    if dir.exit().is_some() {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                let console = dir.serial_tail(5);
                let message = format!(
                    "qemu exited while the guest booted (exit code {}); its console: {console}; qemu: {}",
                    dir.exit().map(|e| e.code).unwrap_or(-1),
                    dir.qemu_log_tail(2)
                );
                // A guest that panics at boot panics again with the same memory and kernel.
                return Err(if console.contains("Kernel panic") || console.is_empty() {
                    self.refused("create", server, message)
                } else {
                    self.engine_error("create", server, message)
                });
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(self.engine_error(
                    "create",
                    server,
                    format!(
                        "no readiness line on the serial console within {:?} (the guest is still booting; the next attempt waits for it again); console: {}",
                        self.config.boot_timeout,
                        dir.serial_tail(3)
                    ),
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Stops the QEMU in `dir` if one runs: ACPI power button, then `quit`, then SIGKILL,
    /// each after its bound; then waits (briefly) for the monitor's `exit`.
    async fn stop(&self, dir: &ServerDir) -> Result<(), DriverError> {
        let server = dir.id.clone();
        let live = |d: &ServerDir| {
            d.live_pid()
                .map_err(|e| self.io_error("delete", &server, e))
        };
        if live(dir)?.is_none() {
            return Ok(());
        }
        for (command, bound) in [
            ("system_powerdown", self.config.powerdown_timeout),
            ("quit", self.config.quit_timeout),
        ] {
            match self.qmp(dir).await {
                Ok(mut qmp) => {
                    if let Err(e) = qmp.execute(command, None).await {
                        // `quit` may close the socket before answering.
                        if !matches!(e, QmpError::Closed { .. }) {
                            warn!(server = %server, error = %e, "QMP {command} failed");
                        }
                    }
                }
                Err(e) => warn!(server = %server, error = %e, "QMP unreachable for {command}"),
            }
            if self.wait_dead(dir, bound).await? {
                info!(server = %server, "qemu stopped after {command}");
                return Ok(());
            }
        }
        if let Some(pid) = live(dir)? {
            warn!(server = %server, pid, "qemu ignored powerdown and quit; sending SIGKILL");
            // SAFETY: kill(2); the pid holds the lock on this VM's pidfile, so it is its QEMU.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        if !self.wait_dead(dir, Duration::from_secs(5)).await? {
            return Err(self.engine_error(
                "delete",
                &server,
                "qemu survived SIGKILL for 5s".into(),
            ));
        }
        Ok(())
    }

    /// Waits up to `bound` for QEMU to be gone (and its monitor to record it, up to a second
    /// more). `Ok(false)`: still alive.
    async fn wait_dead(&self, dir: &ServerDir, bound: Duration) -> Result<bool, DriverError> {
        let deadline = tokio::time::Instant::now() + bound;
        loop {
            let alive = dir
                .live_pid()
                .map_err(|e| self.io_error("delete", &dir.id, e))?
                .is_some();
            if !alive {
                let monitor_deadline = tokio::time::Instant::now() + Duration::from_secs(1);
                while dir.exit().is_none() && tokio::time::Instant::now() < monitor_deadline {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                return Ok(true);
            }
            if tokio::time::Instant::now() >= deadline {
                return Ok(false);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The record a new server for `spec` gets, or why the spec cannot run.
    fn record_for(&self, spec: &ServerSpec) -> Result<VmRecord, DriverError> {
        let vcpus = spec.cpu_millis.div_ceil(1000);
        if vcpus == 0 || vcpus > u64::from(MAX_VCPUS) {
            return Err(self.refused(
                "create",
                &spec.name,
                format!(
                    "cpu {}m gives {vcpus} vCPUs; QEMU's pc machine takes 1 to {MAX_VCPUS}",
                    spec.cpu_millis
                ),
            ));
        }
        let memory_mib = spec.memory_bytes.div_ceil(1 << 20);
        if memory_mib < MIN_MEMORY_MIB {
            return Err(self.refused(
                "create",
                &spec.name,
                format!(
                    "memory {} bytes is below the {MIN_MEMORY_MIB} MiB the guest kernel and initramfs need",
                    spec.memory_bytes
                ),
            ));
        }
        if !valid_uid(&spec.vm_uid) {
            return Err(self.refused(
                "create",
                &spec.name,
                format!("uid {:?} cannot name a state directory", spec.vm_uid),
            ));
        }
        Ok(VmRecord {
            managed_by: self.config.managed_by.clone(),
            namespace: spec.vm_namespace.clone(),
            name: spec.vm_name.clone(),
            uid: spec.vm_uid.clone(),
            server: spec.name.clone(),
            cpu_millis: spec.cpu_millis,
            memory_bytes: spec.memory_bytes,
            vcpus: vcpus as u32,
            memory_mib,
            accelerator: String::new(),
        })
    }
}

/// `kubeloop-vm_<namespace>_<name>` -> (namespace, name).
fn split_server_name(name: &str) -> Option<(&str, &str)> {
    let rest = name.strip_prefix("kubeloop-vm_")?;
    let (namespace, vm) = rest.split_once('_')?;
    (!namespace.is_empty() && !vm.is_empty() && !vm.contains('_')).then_some((namespace, vm))
}

impl Driver for QemuDriver {
    fn engine(&self) -> &str {
        &self.engine
    }

    async fn create_server(&self, spec: &ServerSpec) -> Result<Created, DriverError> {
        let mut record = self.record_for(spec)?;
        let existing = self
            .root
            .of_vm(&spec.vm_namespace, &spec.vm_name)
            .map_err(|e| self.io_error("create", &spec.name, e))?;
        if let Some(other) = existing.iter().find(|d| d.uid != spec.vm_uid) {
            return Err(DriverError::NameTaken {
                engine: self.engine.clone(),
                server: spec.name.clone(),
                id: other.id.clone(),
                wanted_uid: spec.vm_uid.clone(),
                found_uid: Some(other.uid.clone()),
            });
        }
        let dir = self
            .root
            .dir_for(&spec.vm_namespace, &spec.vm_name, &spec.vm_uid);
        let made = self
            .root
            .create(&dir, &record)
            .map_err(|e| self.io_error("create", &spec.name, e))?;
        let adopted = !made;
        let alive = dir
            .live_pid()
            .map_err(|e| self.io_error("create", &spec.name, e))?
            .is_some();
        if alive {
            info!(server = %spec.name, id = %dir.id, "qemu already runs for this VM; adopting it");
            // A paused VM (someone ran `stop` on its QMP) is resumed, as a stopped container
            // is started.
            if dir.ready(READY_LINE)
                && let Ok(mut qmp) = self.qmp(&dir).await
                && query_status(&mut qmp).await.ok().as_deref() == Some("paused")
            {
                let _ = qmp.execute("cont", None).await;
            }
        } else {
            if adopted {
                info!(server = %spec.name, id = %dir.id, "qemu of this VM is not running; booting it again");
            }
            // A relaunch takes the spec of this call (a stopped container would keep its old
            // limits; nothing runs here to keep).
            dir.write_record(&record)
                .map_err(|e| self.io_error("create", &spec.name, e))?;
            self.launch(&dir, &mut record).await?;
        }
        self.wait_ready(&dir, &spec.name).await?;
        let status = self.status_of(&dir).await?;
        Ok(Created { status, adopted })
    }

    async fn delete_server(
        &self,
        name_or_id: &str,
        uid: &str,
    ) -> Result<DeleteOutcome, DriverError> {
        let dir = match self.root.by_id(name_or_id) {
            Some(dir) => Some(dir),
            None => {
                let Some((namespace, name)) = split_server_name(name_or_id) else {
                    return Ok(DeleteOutcome::Absent);
                };
                let dirs = self
                    .root
                    .of_vm(namespace, name)
                    .map_err(|e| self.io_error("delete", name_or_id, e))?;
                dirs.iter().find(|d| d.uid == uid).or(dirs.first()).cloned()
            }
        };
        let Some(dir) = dir else {
            return Ok(DeleteOutcome::Absent);
        };
        if dir.uid != uid {
            return Ok(DeleteOutcome::NotOwned {
                id: dir.id,
                found_uid: Some(dir.uid),
            });
        }
        self.stop(&dir).await?;
        self.root
            .remove(&dir)
            .map_err(|e| self.io_error("delete", name_or_id, e))?;
        self.samples.lock().remove(&dir.id);
        Ok(DeleteOutcome::Deleted { id: dir.id })
    }

    async fn list_servers(&self) -> Result<Vec<ManagedServer>, DriverError> {
        self.root.remove_leftovers();
        let dirs = self
            .root
            .all()
            .map_err(|e| self.io_error("list", "all", e))?;
        Ok(dirs
            .into_iter()
            .filter_map(|dir| {
                let record = dir.record().ok()?;
                (record.managed_by == self.config.managed_by).then(|| ManagedServer {
                    id: dir.id.clone(),
                    name: record.server,
                    vm_namespace: Some(record.namespace),
                    vm_name: Some(record.name),
                    vm_uid: Some(dir.uid),
                })
            })
            .collect())
    }

    async fn server_exists(&self, name: &str) -> Result<bool, DriverError> {
        Ok(self.find(name)?.is_some())
    }

    async fn server_status(&self, name: &str) -> Result<Option<DriverServerStatus>, DriverError> {
        match self.find(name)? {
            Some(dir) => self.status_of(&dir).await.map(Some),
            None => Ok(None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const UID: &str = "0b3f5a9e-1c2d-4e5f-8a9b-0c1d2e3f4a5b";

    fn driver(dir: &std::path::Path) -> QemuDriver {
        QemuDriver::new(QemuDriverConfig {
            state_dir: dir.join("state"),
            kernel: dir.join("absent-vmlinuz"),
            initrd: dir.join("absent-initrd"),
            accel: Accel::Tcg,
            ..QemuDriverConfig::default()
        })
        .unwrap()
    }

    fn spec(cpu_millis: u64, memory_bytes: u64) -> ServerSpec {
        ServerSpec {
            name: "kubeloop-vm_ns_vm".into(),
            vm_namespace: "ns".into(),
            vm_name: "vm".into(),
            vm_uid: UID.into(),
            cpu_millis,
            memory_bytes,
        }
    }

    #[test]
    fn millicores_round_up_to_whole_vcpus_and_memory_up_to_whole_mib() {
        let tmp = tempfile::tempdir().unwrap();
        let d = driver(tmp.path());
        let r = d.record_for(&spec(1500, 4_000_000_000)).unwrap();
        assert_eq!((r.vcpus, r.memory_mib), (2, 3815));
        let r = d.record_for(&spec(100, 256 << 20)).unwrap();
        assert_eq!((r.vcpus, r.memory_mib), (1, 256));
    }

    #[test]
    fn specs_qemu_cannot_run_are_refused_naming_the_problem() {
        let tmp = tempfile::tempdir().unwrap();
        let d = driver(tmp.path());
        let err = d.record_for(&spec(1000, 64 << 20)).unwrap_err();
        assert!(err.is_permanent(), "{err:?}");
        assert!(err.to_string().contains("below the 128 MiB"), "{err}");
        let err = d.record_for(&spec(300_000, 1 << 30)).unwrap_err();
        assert!(err.to_string().contains("300 vCPUs"), "{err}");
    }

    #[tokio::test]
    async fn a_missing_kernel_is_refused_and_the_vm_has_a_dead_server_to_delete() {
        let tmp = tempfile::tempdir().unwrap();
        let d = driver(tmp.path());
        let err = d.create_server(&spec(1000, 256 << 20)).await.unwrap_err();
        assert!(err.is_permanent(), "{err:?}");
        assert!(err.to_string().contains("run hack/setup-qemu"), "{err}");
        // The directory was made (with vm.json) and is listed, never-started.
        let status = d.server_status("kubeloop-vm_ns_vm").await.unwrap().unwrap();
        assert_eq!((status.state.as_str(), status.running), ("created", false));
        assert_eq!(status.vm_uid.as_deref(), Some(UID));
        assert_eq!(d.list_servers().await.unwrap().len(), 1);
        // Another uid's delete leaves it; the owner's removes it, twice without error.
        assert!(matches!(
            d.delete_server("kubeloop-vm_ns_vm", "other").await.unwrap(),
            DeleteOutcome::NotOwned { .. }
        ));
        assert!(matches!(
            d.delete_server("kubeloop-vm_ns_vm", UID).await.unwrap(),
            DeleteOutcome::Deleted { .. }
        ));
        assert_eq!(
            d.delete_server("kubeloop-vm_ns_vm", UID).await.unwrap(),
            DeleteOutcome::Absent
        );
        assert!(
            d.server_status("kubeloop-vm_ns_vm")
                .await
                .unwrap()
                .is_none()
        );
    }

    #[tokio::test]
    async fn another_uids_directory_makes_the_name_taken() {
        let tmp = tempfile::tempdir().unwrap();
        let d = driver(tmp.path());
        let _ = d.create_server(&spec(1000, 256 << 20)).await;
        let mut other = spec(1000, 256 << 20);
        other.vm_uid = "1b3f5a9e-1c2d-4e5f-8a9b-0c1d2e3f4a5b".into();
        let err = d.create_server(&other).await.unwrap_err();
        assert!(matches!(err, DriverError::NameTaken { .. }), "{err:?}");
    }

    #[test]
    fn server_names_split_into_namespace_and_name() {
        assert_eq!(
            split_server_name("kubeloop-vm_ns_test-vm"),
            Some(("ns", "test-vm"))
        );
        assert_eq!(split_server_name("other"), None);
    }
}
