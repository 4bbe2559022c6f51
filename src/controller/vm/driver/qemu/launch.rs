//! Starting one QEMU: its argv, the monitor shell that outlives the controller, and the probe
//! that decides between KVM and TCG.
//!
//! QEMU runs in the foreground of a small `sh` (the monitor) started in a session of its own
//! and detached from the controller (`setsid`, then `&` in an outer shell that exits at once,
//! so init adopts it): the VM survives the controller, and when QEMU ends, however it ends,
//! the monitor writes `exit` (`<code> <unix seconds>`; 137 after a SIGKILL) into the state
//! directory. QEMU itself still writes `-pidfile` and keeps it locked while it lives.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::process::Command;

use super::state::ServerDir;

/// What to start.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct LaunchSpec {
    /// The `qemu-system-x86_64` to run.
    pub qemu_binary: PathBuf,
    /// The kernel (`vmlinuz`).
    pub kernel: PathBuf,
    /// The initramfs.
    pub initrd: PathBuf,
    /// `kvm` or `tcg`.
    pub accelerator: &'static str,
    /// `-smp`.
    pub vcpus: u32,
    /// `-m`, in MiB.
    pub memory_mib: u64,
    /// TCG's translation buffer in MiB (QEMU's default, 1 GiB, would show in every VM's RSS).
    pub tcg_tb_size_mib: u32,
    /// `-name`.
    pub name: String,
}

/// The guest kernel's command line: console on the first serial port, and a panic ends QEMU
/// (with `-no-reboot`) instead of hanging, so a guest that cannot boot is a dead server.
pub(crate) const KERNEL_CMDLINE: &str = "console=ttyS0 panic=-1 quiet";

/// QEMU's argv (without the binary) for `spec` in `dir`.
pub(crate) fn qemu_args(spec: &LaunchSpec, dir: &Path) -> Vec<String> {
    let path = |name: &str| escape_commas(&dir.join(name).display().to_string());
    let (accel, cpu) = match spec.accelerator {
        "kvm" => ("kvm".to_string(), "host"),
        _ => (format!("tcg,tb-size={}", spec.tcg_tb_size_mib), "max"),
    };
    let mut args: Vec<String> = [
        "-name",
        &escape_commas(&spec.name),
        "-machine",
        "pc",
        "-accel",
        &accel,
        "-cpu",
        cpu,
        "-smp",
        &spec.vcpus.to_string(),
        "-m",
        &format!("{}M", spec.memory_mib),
        "-nodefaults",
        "-no-user-config",
        "-display",
        "none",
        "-vga",
        "none",
        "-no-reboot",
        "-kernel",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.push(spec.kernel.display().to_string());
    args.push("-initrd".into());
    args.push(spec.initrd.display().to_string());
    args.extend([
        "-append".to_string(),
        KERNEL_CMDLINE.to_string(),
        "-chardev".to_string(),
        format!(
            "socket,id=console,path={},server=on,wait=off,logfile={}",
            path("console.sock"),
            path("serial.log")
        ),
        "-serial".to_string(),
        "chardev:console".to_string(),
        "-chardev".to_string(),
        format!("socket,id=qmp,path={},server=on,wait=off", path("qmp.sock")),
        "-mon".to_string(),
        "chardev=qmp,mode=control".to_string(),
        "-pidfile".to_string(),
        dir.join("qemu.pid").display().to_string(),
    ]);
    args
}

/// QEMU's option parser splits on `,`; a literal comma is doubled.
fn escape_commas(text: &str) -> String {
    text.replace(',', ",,")
}

/// The monitor: `$1` is the state directory, the rest QEMU's argv.
const MONITOR: &str = r#"dir=$1; shift
cd "$dir" || exit 1
date +%s > started
"$@" </dev/null >/dev/null 2>>qemu.log
code=$?
echo "$code $(date +%s)" > exit.tmp && mv exit.tmp exit
"#;

/// Starts QEMU for `spec` under the monitor in `dir`, detached. Returns once the detaching
/// shell has exited (QEMU is then starting; wait for its QMP socket).
pub(crate) async fn spawn_detached(spec: &LaunchSpec, dir: &ServerDir) -> std::io::Result<()> {
    let args = qemu_args(spec, &dir.path);
    let cmdline = std::iter::once(spec.qemu_binary.display().to_string())
        .chain(args.iter().cloned())
        .collect::<Vec<_>>()
        .join("\n")
        + "\n";
    super::state::write_private(&dir.file("cmdline"), cmdline.as_bytes())?;

    // The outer shell starts the monitor in the background and exits: the monitor is
    // re-parented to init and is nobody's zombie here.
    let outer = format!(
        "sh -c '{}' monitor \"$@\" </dev/null >/dev/null 2>&1 &",
        MONITOR.replace('\'', r"'\''")
    );
    let mut command = Command::new("sh");
    command
        .arg("-c")
        .arg(outer)
        .arg("detach")
        .arg(&dir.path)
        .arg(&spec.qemu_binary)
        .args(&args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    // SAFETY: setsid(2) and umask(2) are async-signal-safe. setsid makes the child a session
    // leader, so a signal to the controller's process group or terminal never reaches the VM;
    // umask 077 makes what the monitor and QEMU create (logs, `exit`, the QMP and console
    // sockets) the user's alone.
    unsafe {
        command.pre_exec(|| {
            libc::setsid();
            libc::umask(0o077);
            Ok(())
        });
    }

    let status = command.status().await?;
    if status.success() {
        Ok(())
    } else {
        Err(std::io::Error::other(format!(
            "the shell detaching QEMU exited with {status}"
        )))
    }
}

/// Decides the accelerator: `kvm` if `/dev/kvm` opens read-write and a KVM guest gets as far
/// as the kernel printing its banner within `bound`, else `tcg`, with the reason.
///
/// Opening `/dev/kvm` is not enough: under some nested hypervisors KVM creates VMs whose
/// guests hang before the kernel's first line (seen on this project's build machines), or
/// QEMU aborts setting an MSR the host refuses.
pub(crate) async fn probe_kvm(
    qemu_binary: &Path,
    kernel: &Path,
    bound: Duration,
) -> (&'static str, String) {
    if let Err(e) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
    {
        return ("tcg", format!("/dev/kvm cannot be opened read-write: {e}"));
    }
    let Ok(tmp) = tempfile_dir() else {
        return ("tcg", "no temporary directory for the KVM probe".into());
    };
    let log = tmp.join("probe.log");
    let child = Command::new(qemu_binary)
        .args([
            "-machine",
            "pc",
            "-accel",
            "kvm",
            "-cpu",
            "host",
            "-smp",
            "1",
            "-m",
            "128M",
            "-nodefaults",
            "-no-user-config",
            "-display",
            "none",
            "-vga",
            "none",
            "-no-reboot",
            "-kernel",
        ])
        .arg(kernel)
        .args(["-append", "console=ttyS0 earlyprintk=serial panic=-1"])
        .arg("-serial")
        .arg(format!("file:{}", log.display()))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) => {
            let _ = std::fs::remove_dir_all(&tmp);
            return ("tcg", format!("starting {}: {e}", qemu_binary.display()));
        }
    };
    let deadline = tokio::time::Instant::now() + bound;
    let verdict = loop {
        let printed = std::fs::read(&log).unwrap_or_default();
        if printed.windows(13).any(|w| w == b"Linux version") {
            break ("kvm", "a KVM guest booted its kernel".to_string());
        }
        if let Ok(Some(status)) = child.try_wait() {
            let mut stderr = String::new();
            if let Some(mut err) = child.stderr.take() {
                use tokio::io::AsyncReadExt;
                let _ = err.read_to_string(&mut stderr).await;
            }
            break (
                "tcg",
                format!(
                    "QEMU with KVM exited ({status}) before the guest kernel printed anything: {}",
                    stderr.lines().next().unwrap_or("").trim()
                ),
            );
        }
        if tokio::time::Instant::now() >= deadline {
            break (
                "tcg",
                format!(
                    "a KVM guest printed no kernel banner within {bound:?} (KVM is there but does not run guests here)"
                ),
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let _ = child.kill().await;
    let _ = std::fs::remove_dir_all(&tmp);
    verdict
}

fn tempfile_dir() -> std::io::Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!("kubeloop-kvm-probe-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir(&dir)?;
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(accelerator: &'static str) -> LaunchSpec {
        LaunchSpec {
            qemu_binary: "qemu-system-x86_64".into(),
            kernel: "/k/vmlinuz".into(),
            initrd: "/k/initramfs.cpio.gz".into(),
            accelerator,
            vcpus: 2,
            memory_mib: 3815,
            tcg_tb_size_mib: 32,
            name: "kubeloop-vm_ns_vm".into(),
        }
    }

    fn after<'a>(args: &'a [String], flag: &str) -> &'a str {
        let i = args.iter().position(|a| a == flag).expect(flag);
        &args[i + 1]
    }

    #[test]
    fn the_argv_gives_the_vcpus_memory_accelerator_and_state_files() {
        let dir = Path::new("/state/ns_vm_uid");
        let tcg = qemu_args(&spec("tcg"), dir);
        assert_eq!(after(&tcg, "-smp"), "2");
        assert_eq!(after(&tcg, "-m"), "3815M");
        assert_eq!(after(&tcg, "-accel"), "tcg,tb-size=32");
        assert_eq!(after(&tcg, "-cpu"), "max");
        assert_eq!(after(&tcg, "-pidfile"), "/state/ns_vm_uid/qemu.pid");
        assert!(
            after(&tcg, "-chardev").contains("logfile=/state/ns_vm_uid/serial.log"),
            "{tcg:?}"
        );
        let kvm = qemu_args(&spec("kvm"), dir);
        assert_eq!(
            (after(&kvm, "-accel"), after(&kvm, "-cpu")),
            ("kvm", "host")
        );
    }

    #[test]
    fn commas_in_paths_are_doubled_for_qemus_option_parser() {
        let args = qemu_args(&spec("tcg"), Path::new("/a,b/ns_vm_uid"));
        assert!(
            after(&args, "-chardev").contains("path=/a,,b/ns_vm_uid/console.sock,"),
            "{args:?}"
        );
    }
}
