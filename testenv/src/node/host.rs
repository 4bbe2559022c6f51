//! What a node changes on the host, and how each change is undone: the bridge and the guard
//! rule ([`NodeNetwork`]), the iptables chains of the kubelet and kube-proxy, the `kubepods`
//! cgroups, the mounts under the node's directory, the sysctls the kubelet sets
//! ([`KernelTunables`]), and the containers of a run that was killed before it could clean up.
//!
//! Invariant: only one node cluster runs on a machine at a time ([`NodeNetwork`] holds the
//! lock), so whatever node state the host holds while the lock is ours belongs to this node or
//! to a run that is gone.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::Command;

use super::addresses::{BRIDGE, NODE_IP};
use crate::TestEnvError;

/// Held (flock) by the one node cluster this machine may run at a time.
const LOCK_FILE: &str = "/run/kubeloop/node.lock";

/// The sysctls the kubelet sets at start (its container manager's `setupKernelTunables`, as
/// `protectKernelDefaults: false` lets it).
const KERNEL_TUNABLES: [&str; 6] = [
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
];

/// The host side of the node: the lock, the bridge with [`NODE_IP`], and the rule that keeps
/// pod traffic on this machine. Made before the apiserver starts (it listens on the bridge's
/// address); undone on drop.
pub(crate) struct NodeNetwork {
    _lock: File,
}

impl NodeNetwork {
    /// Takes the machine's node lock (waiting while another node cluster runs), sweeps what a
    /// killed run left, then makes the bridge and the guard rule.
    pub(crate) fn create() -> Result<Self, TestEnvError> {
        let lock_path = Path::new(LOCK_FILE);
        if let Some(parent) = lock_path.parent() {
            crate::create_dir(parent)?;
        }
        let lock = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(lock_path)
            .map_err(|source| TestEnvError::Io {
                path: lock_path.to_owned(),
                source,
            })?;
        // SAFETY: flock(2) on a descriptor we own; it blocks until the other holder exits.
        if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) } != 0 {
            return Err(TestEnvError::Io {
                path: lock_path.to_owned(),
                source: std::io::Error::last_os_error(),
            });
        }
        sweep(&|path| is_a_node_dir_path(path));
        remove_network();
        let address = format!("{NODE_IP}/24");
        run("ip", &["link", "add", BRIDGE, "type", "bridge"])?;
        run("ip", &["addr", "add", &address, "dev", BRIDGE])?;
        run("ip", &["link", "set", BRIDGE, "up"])?;
        run("iptables", &guard_rule("-I"))?;
        Ok(Self { _lock: lock })
    }
}

impl Drop for NodeNetwork {
    fn drop(&mut self) {
        remove_network();
    }
}

/// The values of [`KERNEL_TUNABLES`] before the kubelet started, put back by [`Self::restore`]
/// so that the host keeps its own (this machine's kernel.panic comes from its command line).
pub(super) struct KernelTunables(Vec<(PathBuf, String)>);

impl KernelTunables {
    pub(super) fn save() -> Self {
        Self(
            KERNEL_TUNABLES
                .iter()
                .map(|name| Path::new("/proc/sys").join(name))
                .filter_map(|path| Some((path.clone(), std::fs::read_to_string(&path).ok()?)))
                .collect(),
        )
    }

    pub(super) fn restore(&self) {
        for (path, value) in &self.0 {
            let _ = std::fs::write(path, value);
        }
    }
}

/// Removes what a node leaves on the host besides its bridge, for the node directories
/// `in_scope` accepts: processes still in `kubepods` cgroups and containerd shims serving such
/// a directory are killed, the iptables chains go, then the cgroups and the mounts.
pub(super) fn sweep(in_scope: &dyn Fn(&str) -> bool) {
    kill_pod_processes(in_scope);
    remove_kube_chains();
    remove_pod_cgroups();
    detach_mounts(in_scope);
}

/// Whether `path` lies in a node directory of some cluster of this harness (a run that was
/// killed leaves its directory behind).
fn is_a_node_dir_path(path: &str) -> bool {
    let temp = std::env::temp_dir();
    Path::new(path).strip_prefix(&temp).is_ok_and(|rest| {
        let mut parts = rest.components();
        let cluster = parts.next().map(|c| c.as_os_str().to_string_lossy());
        let node = parts.next().map(|c| c.as_os_str().to_string_lossy());
        cluster.is_some_and(|c| c.starts_with("kubeloop-testenv-"))
            && node.as_deref() == Some("node")
    })
}

/// `iptables <op> FORWARD ...`: drop what comes from the pods' bridge and leaves by another
/// interface. Pod-to-pod and pod-to-node traffic (the apiserver, through the `kubernetes`
/// Service) never takes FORWARD off the bridge, so it is untouched.
fn guard_rule(op: &str) -> Vec<&str> {
    vec![
        op,
        "FORWARD",
        "-i",
        BRIDGE,
        "!",
        "-o",
        BRIDGE,
        "-m",
        "comment",
        "--comment",
        "kubeloop node: pods stay on this machine",
        "-j",
        "DROP",
    ]
}

/// Removes the guard rule (every copy) and the bridge; quiet when they are not there.
fn remove_network() {
    while run("iptables", &guard_rule("-D")).is_ok() {}
    // Veths of pods the kubelet did not stop would keep their addresses: deleting one end of a
    // veth deletes the pair.
    if let Ok(ports) = std::fs::read_dir(format!("/sys/class/net/{BRIDGE}/brif")) {
        for port in ports.flatten() {
            let _ = run("ip", &["link", "del", &port.file_name().to_string_lossy()]);
        }
    }
    let _ = run("ip", &["link", "del", BRIDGE]);
}

/// SIGKILLs every process in a `kubepods` cgroup (the pods' containers, whatever hierarchy
/// holds them) and every containerd shim whose command line names an in-scope directory. The
/// shims of a killed run outlive its containerd; their containers outlive the shims.
fn kill_pod_processes(in_scope: &dyn Fn(&str) -> bool) {
    let mut pids = Vec::new();
    for dir in pod_cgroups() {
        if let Ok(procs) = std::fs::read_to_string(dir.join("cgroup.procs")) {
            pids.extend(procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()));
        }
    }
    if let Ok(entries) = std::fs::read_dir("/proc") {
        for entry in entries.flatten() {
            let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
                continue;
            };
            let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
                continue;
            };
            let args: Vec<String> = cmdline
                .split(|b| *b == 0)
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect();
            let is_shim = args
                .first()
                .is_some_and(|a| a.ends_with("containerd-shim-runc-v2"));
            if is_shim && args.iter().any(|a| in_scope(a)) {
                pids.push(pid);
            }
        }
    }
    for pid in pids {
        // SAFETY: kill(2) with a pid read just now; a pid that has gone only fails.
        unsafe {
            libc::kill(pid, libc::SIGKILL);
        }
    }
}

/// Every `kubepods` cgroup and its descendants in every hierarchy, children before parents.
fn pod_cgroups() -> Vec<PathBuf> {
    fn collect(dir: &Path, into: &mut Vec<PathBuf>) {
        if let Ok(entries) = std::fs::read_dir(dir) {
            for entry in entries.flatten() {
                if entry.file_type().is_ok_and(|t| t.is_dir()) {
                    collect(&entry.path(), into);
                }
            }
        }
        into.push(dir.to_owned());
    }
    let mut dirs = Vec::new();
    // cgroup v1 has a hierarchy per controller under /sys/fs/cgroup; v2 one at the top.
    let mut roots = vec![PathBuf::from("/sys/fs/cgroup/kubepods")];
    if let Ok(hierarchies) = std::fs::read_dir("/sys/fs/cgroup") {
        roots.extend(hierarchies.flatten().map(|h| h.path().join("kubepods")));
    }
    for root in roots {
        if root.is_dir() {
            collect(&root, &mut dirs);
        }
    }
    dirs
}

/// Removes the `kubepods` cgroups the kubelet made (cgroupfs driver) once their processes are
/// gone; a cgroup with a process left stays.
fn remove_pod_cgroups() {
    for dir in pod_cgroups() {
        let _ = std::fs::remove_dir(dir);
    }
}

/// Removes every `KUBE-*` chain, and the rules that jump to one, from the host's iptables and
/// ip6tables: what the kubelet made (KUBE-FIREWALL, which drops non-loopback packets to
/// 127.0.0.0/8, and its canary chains) and whatever kube-proxy's own clean-up left.
fn remove_kube_chains() {
    for program in ["iptables", "ip6tables"] {
        for table in ["filter", "nat", "mangle"] {
            let Ok(rules) = run(program, &["-t", table, "-S"]) else {
                continue;
            };
            for rule in rules.lines() {
                let words = rule_words(rule);
                let jumps_to_kube = words
                    .windows(2)
                    .any(|w| w[0] == "-j" && w[1].starts_with("KUBE-"));
                if words.first().map(String::as_str) == Some("-A") && jumps_to_kube {
                    let mut delete = vec!["-t", table, "-D"];
                    delete.extend(words[1..].iter().map(String::as_str));
                    let _ = run(program, &delete);
                }
            }
            for rule in rules.lines() {
                if let Some(chain) = rule.strip_prefix("-N KUBE-") {
                    let chain = format!("KUBE-{chain}");
                    let _ = run(program, &["-t", table, "-F", &chain]);
                    let _ = run(program, &["-t", table, "-X", &chain]);
                }
            }
        }
    }
}

/// The words of a rule as `iptables -S` prints it, double-quoted ones (comments) as one word.
fn rule_words(rule: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut quoted = false;
    for c in rule.chars() {
        match c {
            '"' => quoted = !quoted,
            ' ' if !quoted => {
                if !word.is_empty() {
                    words.push(std::mem::take(&mut word));
                }
            }
            c => word.push(c),
        }
    }
    if !word.is_empty() {
        words.push(word);
    }
    words
}

/// Detaches every in-scope mount (the pods' volumes, containerd's root filesystems, sandbox
/// shm, network namespaces), deepest first, so that the directories can be removed.
fn detach_mounts(in_scope: &dyn Fn(&str) -> bool) {
    let Ok(table) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return;
    };
    let mut mounts: Vec<&str> = table
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .filter(|point| in_scope(point))
        .collect();
    mounts.sort_by_key(|point| std::cmp::Reverse(point.len()));
    for point in mounts {
        let Ok(path) = std::ffi::CString::new(point) else {
            continue;
        };
        // SAFETY: umount2(2) with a NUL-terminated path we own.
        unsafe {
            libc::umount2(path.as_ptr(), libc::MNT_DETACH);
        }
    }
}

/// Runs a host tool; its stdout, or an error with its stderr.
pub(super) fn run(program: &str, args: &[&str]) -> Result<String, TestEnvError> {
    let out = Command::new(program)
        .args(args)
        .output()
        .map_err(|e| TestEnvError::HostCommand(format!("running {program}: {e}")))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(TestEnvError::HostCommand(format!(
            "{program} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::{is_a_node_dir_path, rule_words};

    #[test]
    fn a_rule_splits_into_words_with_its_quoted_comment_as_one() {
        let rule = r#"-A KUBE-FIREWALL ! -s 127.0.0.0/8 -m comment --comment "block incoming localnet connections" -j DROP"#;
        assert_eq!(
            rule_words(rule),
            [
                "-A",
                "KUBE-FIREWALL",
                "!",
                "-s",
                "127.0.0.0/8",
                "-m",
                "comment",
                "--comment",
                "block incoming localnet connections",
                "-j",
                "DROP"
            ]
        );
    }

    #[test]
    fn only_paths_in_a_clusters_node_directory_are_swept() {
        let temp = std::env::temp_dir();
        let node = temp.join("kubeloop-testenv-AbC123/node/kubelet/pods");
        let etcd = temp.join("kubeloop-testenv-AbC123/etcd");
        let other = temp.join("something-else/node/x");
        assert!(is_a_node_dir_path(&node.display().to_string()));
        assert!(!is_a_node_dir_path(&etcd.display().to_string()));
        assert!(!is_a_node_dir_path(&other.display().to_string()));
        assert!(!is_a_node_dir_path("/var/lib/kubelet"));
    }
}
