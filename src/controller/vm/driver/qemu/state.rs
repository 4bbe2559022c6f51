//! The QEMU driver's state directories: one per VM under a root, the only place the driver
//! learns what exists (it never scans process names).
//!
//! ```text
//! <root>/<namespace>_<name>_<uid>/   one server (its id is this directory's name)
//!   vm.json        the VM it belongs to, what it was given, the managed-by marker
//!   qemu.pid       QEMU's -pidfile; QEMU holds a write lock on it while it lives
//!   qmp.sock       QMP (query-status, system_powerdown, quit)
//!   console.sock   the serial console (tests and the demo type commands into it)
//!   serial.log     everything the guest printed on the console this boot (.1: the boot before)
//!   qemu.log       QEMU's stderr
//!   cmdline        QEMU's argv, one argument a line
//!   started        when this boot was launched (unix seconds)
//!   exit           "<code> <unix seconds>", written by the monitor shell when QEMU ends
//!   ready          present once the readiness line was seen this boot
//! <root>/.creating-* and .deleting-*  a directory being created or removed (never listed)
//! ```
//!
//! Invariants:
//! - A server directory appears whole: it is made as `.creating-*`, `vm.json` written into it,
//!   then renamed into place; it goes by being renamed to `.deleting-*` first. So a directory
//!   with a server's name always carries its `vm.json`, whatever moment a crash hits.
//! - The uid in the name is the whole uid (it proves ownership); the `<namespace>_<name>` part
//!   is cut short when the socket paths inside would pass the 107 bytes a unix socket path may
//!   have, and `vm.json` then says which VM it is.
//! - Liveness is QEMU's lock on `qemu.pid` (`fcntl(F_GETLK)` names the holder's pid), so a pid
//!   reused by another process after QEMU died is never taken for the VM.
//! - Private: QMP is full control of a VM and the console a root shell in its guest, so the
//!   root is a directory of this process's user with mode 0700 (one of its own with a looser
//!   mode is tightened; one of another user's, or reached through another user's symlink, is
//!   refused), server directories are 0700, the files the driver writes 0600 and never
//!   written through a symlink, and QEMU and its monitor run with umask 077
//!   (`launch.rs`), so its sockets and logs are the user's alone.
//! - An id names a directory only if it is `<namespace>_<name>_<uid>` in the characters
//!   Kubernetes names have (no `/`, no leading `.`) and the `vm.json` inside belongs to that
//!   uid: an id read from a status that anyone with status rights may write cannot lead
//!   outside the root.

use std::fs;
use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use k8s_openapi::jiff::Timestamp;
use serde::{Deserialize, Serialize};

/// The line the guest's init prints on the serial console once httpd answers
/// (hack/setup-qemu's `/etc/rc`): [`ServerDir::ready`] looks for it in `serial.log`.
pub const READY_LINE: &str = "kubeloop-vm ready";

/// The longest path a unix socket may have (`sun_path` is 108 bytes with its NUL).
const SOCKET_PATH_MAX: usize = 107;
/// The longest file name inside a server directory that is a socket.
const LONGEST_SOCKET: &str = "console.sock";
/// A Kubernetes uid (a UUID) is 36 bytes.
const UID_LEN: usize = 36;

/// What `vm.json` records about a server.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VmRecord {
    /// The `kubeloop.dev/managed-by` value of the driver that made it.
    pub managed_by: String,
    /// The VM's namespace.
    pub namespace: String,
    /// The VM's name.
    pub name: String,
    /// The VM's uid.
    pub uid: String,
    /// The server name (`driver::server_name`).
    pub server: String,
    /// What the spec asked for.
    pub cpu_millis: u64,
    /// The memory the spec asked for, in bytes.
    pub memory_bytes: u64,
    /// What QEMU was given (`-smp`, `-m <MiB>M`).
    pub vcpus: u32,
    /// The memory QEMU was given (`-m`), in MiB.
    pub memory_mib: u64,
    /// `kvm` or `tcg`, as QMP `query-kvm` reported it once QEMU started (empty before).
    #[serde(default)]
    pub accelerator: String,
}

/// The root holding every server directory of one QEMU driver
/// ([`QemuDriverConfig::state_dir`](super::QemuDriverConfig::state_dir)). The driver is its
/// only writer. Crate-private: tests/vm_qemu.rs compiles this file into itself to find a VM's
/// directory ([`Self::of_vm`]) and look inside it, as the driver does.
#[derive(Clone, Debug)]
pub struct StateRoot {
    root: PathBuf,
    /// How long `<namespace>_<name>` may be in a directory name.
    prefix_max: usize,
}

/// One server directory, `<root>/<namespace>_<name>_<uid>/`: `vm.json` ([`VmRecord`]),
/// `qemu.pid`, `qmp.sock` (QMP, `qmp.rs`), `console.sock` (the guest's serial console),
/// `serial.log`, `qemu.log`, `cmdline` (QEMU's argv, one argument a line).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerDir {
    /// The directory's name: the server's id.
    pub id: String,
    /// The directory.
    pub path: PathBuf,
    /// The uid its name carries.
    pub(crate) uid: String,
}

/// How a server's last QEMU run ended, from the `exit` file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Exit {
    /// The exit code (128 + the signal for a killed QEMU).
    pub(crate) code: i64,
    /// When it ended.
    pub(crate) at: Timestamp,
}

impl StateRoot {
    /// The root `root` (created if missing, mode 0700). Fails if it cannot be created, if it
    /// belongs to another user (see the module docs), or if it is so long that a socket inside
    /// a server directory would not fit a unix socket path.
    pub fn new(root: PathBuf) -> io::Result<Self> {
        if root.as_os_str().is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "no QEMU state directory: neither HOME nor XDG_STATE_HOME is set; give one \
                 (--qemu-state-dir or KUBELOOP_QEMU_STATE_DIR)",
            ));
        }
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&root)?;
        let root = root.canonicalize()?;
        make_private(&root)?;
        let fixed = root.as_os_str().len() + 1 + 1 + LONGEST_SOCKET.len() + 1 + UID_LEN;
        let prefix_max = SOCKET_PATH_MAX.saturating_sub(fixed);
        if prefix_max < 8 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "QEMU state directory {} is too long: the sockets inside its VM directories would pass the {SOCKET_PATH_MAX} bytes of a unix socket path",
                    root.display()
                ),
            ));
        }
        Ok(Self { root, prefix_max })
    }

    /// The root directory.
    pub(crate) fn path(&self) -> &Path {
        &self.root
    }

    /// `<namespace>_<name>`, cut to fit.
    fn prefix(&self, namespace: &str, name: &str) -> String {
        let mut prefix = format!("{namespace}_{name}");
        // Namespaces and names are ASCII (DNS labels and subdomains): any byte is a boundary.
        prefix.truncate(self.prefix_max);
        prefix
    }

    /// The directory (existing or not) of the server for VM `namespace/name` with `uid`.
    pub(crate) fn dir_for(&self, namespace: &str, name: &str, uid: &str) -> ServerDir {
        let id = format!("{}_{uid}", self.prefix(namespace, name));
        ServerDir {
            path: self.root.join(&id),
            id,
            uid: uid.to_string(),
        }
    }

    /// The server directory named `id`, if it exists and its `vm.json` is of the uid the id
    /// ends with (an id may come from a status anyone with status rights can write).
    pub(crate) fn by_id(&self, id: &str) -> Option<ServerDir> {
        let dir = self.present(id)?;
        let record = dir.record().ok()?;
        (record.uid == dir.uid).then_some(dir)
    }

    /// The directory `id` if its name is a server id and it holds a `vm.json` (one stat, no
    /// read: for listing the root, whose entries only this user can make).
    fn present(&self, id: &str) -> Option<ServerDir> {
        let (_, uid) = parse_id(id)?;
        let path = self.root.join(id);
        path.join("vm.json").is_file().then(|| ServerDir {
            id: id.to_string(),
            path,
            uid: uid.to_string(),
        })
    }

    /// Every server directory (those being created or removed left out).
    pub fn all(&self) -> io::Result<Vec<ServerDir>> {
        let mut dirs = Vec::new();
        for entry in fs::read_dir(&self.root)? {
            let entry = entry?;
            let Some(id) = entry.file_name().to_str().map(str::to_string) else {
                continue;
            };
            if id.starts_with('.') || !entry.file_type()?.is_dir() {
                continue;
            }
            if let Some(dir) = self.present(&id) {
                dirs.push(dir);
            }
        }
        dirs.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(dirs)
    }

    /// The server directories of VM `namespace/name`, whatever their uid.
    pub fn of_vm(&self, namespace: &str, name: &str) -> io::Result<Vec<ServerDir>> {
        let prefix = self.prefix(namespace, name);
        let exact = prefix.len() == namespace.len() + 1 + name.len();
        let mut found = Vec::new();
        for dir in self.all()? {
            if parse_id(&dir.id).map(|(p, _)| p) != Some(prefix.as_str()) {
                continue;
            }
            // A cut prefix may be shared by other VMs: vm.json decides.
            if !exact {
                match dir.record() {
                    Ok(r) if r.namespace == namespace && r.name == name => {}
                    _ => continue,
                }
            }
            found.push(dir);
        }
        Ok(found)
    }

    /// Makes the directory for `record` whole (see the module docs). `Ok(false)`: it already
    /// existed (and was left as it was).
    pub(crate) fn create(&self, dir: &ServerDir, record: &VmRecord) -> io::Result<bool> {
        if dir.path.exists() {
            return Ok(false);
        }
        let staging = self
            .root
            .join(format!(".creating-{}-{}", dir.id, uuid::Uuid::new_v4()));
        fs::DirBuilder::new().mode(0o700).create(&staging)?;
        let written = write_atomic(&staging.join("vm.json"), &record_json(record)?)
            .and_then(|()| fs::rename(&staging, &dir.path));
        match written {
            Ok(()) => Ok(true),
            Err(e) => {
                let _ = fs::remove_dir_all(&staging);
                // rename(2) onto a non-empty directory: made by someone else in between.
                if dir.path.join("vm.json").is_file() {
                    Ok(false)
                } else {
                    Err(e)
                }
            }
        }
    }

    /// Removes a server directory: renamed out of the way first (so it stops being the server
    /// at once), then deleted. Also removes what earlier removals left half done.
    pub(crate) fn remove(&self, dir: &ServerDir) -> io::Result<()> {
        let doomed = self.root.join(format!(".deleting-{}", dir.id));
        match fs::rename(&dir.path, &doomed) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            // A .deleting- of the same id from a removal cut short: finish that one first.
            Err(_) if doomed.exists() => {
                remove_tree(&doomed)?;
                fs::rename(&dir.path, &doomed)?;
            }
            Err(e) => return Err(e),
        }
        remove_tree(&doomed)?;
        self.remove_leftovers();
        Ok(())
    }

    /// Deletes `.creating-*` and `.deleting-*` directories that crashes left behind (best
    /// effort; a `.creating-` of a create in flight in another process loses its race and that
    /// create fails and is retried).
    pub(crate) fn remove_leftovers(&self) {
        let Ok(entries) = fs::read_dir(&self.root) else {
            return;
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if name.starts_with(".deleting-") {
                let _ = remove_tree(&entry.path());
            } else if name.starts_with(".creating-") {
                // Only ones older than a minute: a create takes milliseconds.
                let old = entry
                    .metadata()
                    .and_then(|m| m.modified())
                    .ok()
                    .and_then(|t| t.elapsed().ok())
                    .is_some_and(|age| age.as_secs() > 60);
                if old {
                    let _ = remove_tree(&entry.path());
                }
            }
        }
    }
}

impl ServerDir {
    /// The path of the file `name` in this directory.
    pub fn file(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }

    /// The VM record written when the VM was created.
    pub fn record(&self) -> io::Result<VmRecord> {
        let text = fs::read(self.file("vm.json"))?;
        serde_json::from_slice(&text).map_err(|e| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{}: {e}", self.file("vm.json").display()),
            )
        })
    }

    /// Writes the VM record (atomically: a temporary file renamed over it).
    pub(crate) fn write_record(&self, record: &VmRecord) -> io::Result<()> {
        write_atomic(&self.file("vm.json"), &record_json(record)?)
    }

    /// The pid of the live QEMU holding the lock on `qemu.pid`, or `None` if none does.
    pub fn live_pid(&self) -> io::Result<Option<i32>> {
        let file = match fs::File::open(self.file("qemu.pid")) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        lock_holder(&file)
    }

    /// The `exit` file the monitor shell writes when QEMU ends.
    pub(crate) fn exit(&self) -> Option<Exit> {
        let text = fs::read_to_string(self.file("exit")).ok()?;
        parse_exit(&text)
    }

    /// When the current QEMU started (its pidfile's time), if one runs.
    pub(crate) fn started_at(&self) -> Option<Timestamp> {
        unix_time_file(&self.file("started"))
    }

    /// When the serial log last changed: the last sign of life of a QEMU that ended without
    /// its monitor recording it (both killed, or the host rebooted).
    pub(crate) fn last_output_at(&self) -> Option<Timestamp> {
        let modified = fs::metadata(self.file("serial.log"))
            .and_then(|m| m.modified())
            .ok()?;
        Timestamp::try_from(modified).ok()
    }

    /// True once the readiness line was seen this boot; looks for it in `serial.log` (and
    /// remembers it in `ready`) until then.
    pub(crate) fn ready(&self, line: &str) -> bool {
        if self.file("ready").exists() {
            return true;
        }
        let seen = fs::read(self.file("serial.log"))
            .map(|log| contains(&log, line.as_bytes()))
            .unwrap_or(false);
        if seen {
            let _ = write_private(&self.file("ready"), b"");
        }
        seen
    }

    /// The last `n` lines the guest printed (for error messages), lossily decoded.
    pub(crate) fn serial_tail(&self, n: usize) -> String {
        tail_lines(&fs::read(self.file("serial.log")).unwrap_or_default(), n)
    }

    /// The last `n` lines of QEMU's stderr.
    pub(crate) fn qemu_log_tail(&self, n: usize) -> String {
        tail_lines(&fs::read(self.file("qemu.log")).unwrap_or_default(), n)
    }

    /// Clears what belongs to the previous boot before a new one: its exit, readiness and
    /// pidfile; its serial log is kept as `serial.log.1`.
    pub(crate) fn reset_boot(&self) -> io::Result<()> {
        for name in ["exit", "exit.tmp", "ready", "qemu.pid", "started"] {
            match fs::remove_file(self.file(name)) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
        match fs::rename(self.file("serial.log"), self.file("serial.log.1")) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e),
        }
    }
}

/// Splits a directory name `<prefix>_<uid>` (the uid has no `_`). The prefix must be a
/// `<namespace>_<name>` (cut short or not): lower-case letters, digits, `-`, `.` and one `_`,
/// starting with a letter or digit; so no id is a path of more than one component.
pub(crate) fn parse_id(id: &str) -> Option<(&str, &str)> {
    let (prefix, uid) = id.rsplit_once('_')?;
    let valid = prefix
        .bytes()
        .next()
        .is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        && prefix.bytes().filter(|&b| b == b'_').count() <= 1
        && prefix
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-._".contains(&b))
        && valid_uid(uid);
    valid.then_some((prefix, uid))
}

/// True if `uid` can name a directory (a UUID can; anything with `/`, `_` or `.` cannot).
pub(crate) fn valid_uid(uid: &str) -> bool {
    !uid.is_empty()
        && uid.len() <= UID_LEN
        && uid.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
}

fn parse_exit(text: &str) -> Option<Exit> {
    let mut words = text.split_whitespace();
    let code = words.next()?.parse().ok()?;
    let at = Timestamp::from_second(words.next()?.parse().ok()?).ok()?;
    Some(Exit { code, at })
}

fn unix_time_file(path: &Path) -> Option<Timestamp> {
    let text = fs::read_to_string(path).ok()?;
    Timestamp::from_second(text.trim().parse().ok()?).ok()
}

fn record_json(record: &VmRecord) -> io::Result<Vec<u8>> {
    serde_json::to_vec_pretty(record).map_err(io::Error::other)
}

/// Writes `path` whole or not at all (a private temp file renamed over it).
pub(crate) fn write_atomic(path: &Path, contents: &[u8]) -> io::Result<()> {
    let tmp = path.with_extension("tmp");
    write_private(&tmp, contents)?;
    fs::File::open(&tmp)?.sync_all()?;
    fs::rename(&tmp, path)
}

/// Writes `path` (created with mode 0600, or truncated), never through a symlink.
pub(crate) fn write_private(path: &Path, contents: &[u8]) -> io::Result<()> {
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)?;
    file.write_all(contents)
}

/// Checks that `root` (canonical) is a directory of this process's user and makes its mode
/// 0700; refuses one of another user's, whose owner could reach the VMs' sockets.
fn make_private(root: &Path) -> io::Result<()> {
    let meta = fs::symlink_metadata(root)?;
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    if !meta.is_dir() || meta.uid() != me {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "QEMU state directory {} belongs to uid {}, not to this process's uid {me}: \
                 its owner could reach the VMs' control sockets; give a directory of your own",
                root.display(),
                meta.uid()
            ),
        ));
    }
    if meta.mode() & 0o077 != 0 {
        fs::set_permissions(root, fs::Permissions::from_mode(0o700))?;
    }
    Ok(())
}

/// `remove_dir_all`, retried: the monitor shell may still write its `exit` file into a
/// directory being removed.
fn remove_tree(path: &Path) -> io::Result<()> {
    let mut last = None;
    for _ in 0..5 {
        match fs::remove_dir_all(path) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => last = Some(e),
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    Err(last.unwrap_or_else(|| io::Error::other("remove_dir_all failed")))
}

/// The pid holding a write-conflicting POSIX lock on `file` (QEMU's `lockf` on its pidfile).
fn lock_holder(file: &fs::File) -> io::Result<Option<i32>> {
    // SAFETY: a zeroed `flock` is a valid value; fcntl(F_GETLK) only fills it in.
    let mut lock: libc::flock = unsafe { std::mem::zeroed() };
    lock.l_type = libc::F_WRLCK as libc::c_short;
    lock.l_whence = libc::SEEK_SET as libc::c_short;
    lock.l_start = 0;
    lock.l_len = 0;
    // SAFETY: F_GETLK with a pointer to a live `flock` on an open descriptor.
    let rc = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GETLK, &mut lock) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((lock.l_type != libc::F_UNLCK as libc::c_short && lock.l_pid > 0).then_some(lock.l_pid))
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && haystack.windows(needle.len()).any(|w| w == needle)
}

fn tail_lines(bytes: &[u8], n: usize) -> String {
    let text = String::from_utf8_lossy(bytes);
    let lines: Vec<&str> = text
        .lines()
        .map(|l| l.trim_end_matches('\r'))
        .filter(|l| !l.trim().is_empty())
        .collect();
    lines[lines.len().saturating_sub(n)..].join(" | ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(ns: &str, name: &str, uid: &str) -> VmRecord {
        VmRecord {
            managed_by: "m".into(),
            namespace: ns.into(),
            name: name.into(),
            uid: uid.into(),
            server: format!("kubeloop-vm_{ns}_{name}"),
            cpu_millis: 1000,
            memory_bytes: 1 << 28,
            vcpus: 1,
            memory_mib: 256,
            accelerator: String::new(),
        }
    }

    const UID: &str = "0b3f5a9e-1c2d-4e5f-8a9b-0c1d2e3f4a5b";

    #[test]
    fn a_directory_is_named_from_namespace_name_and_uid_and_found_by_vm_or_id() {
        let tmp = tempfile::tempdir().unwrap();
        let root = StateRoot::new(tmp.path().join("qemu")).unwrap();
        let dir = root.dir_for("ns", "vm", UID);
        assert_eq!(dir.id, format!("ns_vm_{UID}"));
        assert!(root.create(&dir, &record("ns", "vm", UID)).unwrap());
        assert!(
            !root.create(&dir, &record("ns", "vm", UID)).unwrap(),
            "a second create finds it"
        );
        assert_eq!(root.of_vm("ns", "vm").unwrap(), vec![dir.clone()]);
        // Injective like server_name: a-b/c and a/b-c differ.
        assert!(root.of_vm("ns", "v").unwrap().is_empty());
        assert_eq!(root.by_id(&dir.id), Some(dir.clone()));
        assert_eq!(root.all().unwrap().len(), 1);
        root.remove(&dir).unwrap();
        assert!(root.all().unwrap().is_empty());
        assert!(!dir.path.exists());
        root.remove(&dir).unwrap();
    }

    #[test]
    fn long_names_are_cut_to_fit_a_socket_path_and_vm_json_tells_them_apart() {
        let tmp = tempfile::tempdir().unwrap();
        let root = StateRoot::new(tmp.path().join("qemu")).unwrap();
        let long_a = format!("{}a", "x".repeat(120));
        let long_b = format!("{}b", "x".repeat(120));
        let a = root.dir_for("ns", &long_a, UID);
        let uid_b = "1b3f5a9e-1c2d-4e5f-8a9b-0c1d2e3f4a5b";
        let b = root.dir_for("ns", &long_b, uid_b);
        assert!(a.path.join(LONGEST_SOCKET).as_os_str().len() <= SOCKET_PATH_MAX);
        root.create(&a, &record("ns", &long_a, UID)).unwrap();
        root.create(&b, &record("ns", &long_b, uid_b)).unwrap();
        assert_eq!(root.of_vm("ns", &long_a).unwrap(), vec![a]);
        assert_eq!(root.of_vm("ns", &long_b).unwrap(), vec![b]);
    }

    #[test]
    fn a_root_too_long_for_socket_paths_is_refused_naming_it() {
        let tmp = tempfile::tempdir().unwrap();
        let err = StateRoot::new(tmp.path().join("d".repeat(90))).unwrap_err();
        assert!(err.to_string().contains("too long"), "{err}");
    }

    #[test]
    fn the_exit_file_gives_code_and_time_and_ids_parse_to_prefix_and_uid() {
        assert_eq!(
            parse_exit("137 1795375926\n"),
            Some(Exit {
                code: 137,
                at: Timestamp::from_second(1_795_375_926).unwrap()
            })
        );
        assert_eq!(parse_exit("garbage"), None);
        assert_eq!(parse_id(&format!("ns_vm_{UID}")), Some(("ns_vm", UID)));
        assert_eq!(parse_id("no-uid"), None);
        assert!(!valid_uid("../etc"));
        assert!(valid_uid(UID));
    }

    #[test]
    fn a_missing_or_stale_pidfile_nobody_locks_is_no_live_qemu() {
        let tmp = tempfile::tempdir().unwrap();
        let root = StateRoot::new(tmp.path().to_path_buf()).unwrap();
        let dir = root.dir_for("ns", "vm", UID);
        root.create(&dir, &record("ns", "vm", UID)).unwrap();
        assert_eq!(dir.live_pid().unwrap(), None, "no pidfile");
        fs::write(dir.file("qemu.pid"), "4242\n").unwrap();
        assert_eq!(
            dir.live_pid().unwrap(),
            None,
            "a stale pidfile is not a live QEMU"
        );
        // A live holder is QEMU itself: tests/vm_qemu.rs.
    }

    fn mode(path: &Path) -> u32 {
        fs::symlink_metadata(path).unwrap().mode() & 0o777
    }

    #[test]
    fn the_root_server_directories_and_written_files_are_the_users_alone() {
        let tmp = tempfile::tempdir().unwrap();
        let root = StateRoot::new(tmp.path().join("a/qemu")).unwrap();
        assert_eq!(mode(root.path()), 0o700);
        let dir = root.dir_for("ns", "vm", UID);
        root.create(&dir, &record("ns", "vm", UID)).unwrap();
        assert_eq!(mode(&dir.path), 0o700);
        assert_eq!(mode(&dir.file("vm.json")), 0o600);
        write_private(&dir.file("cmdline"), b"qemu\n").unwrap();
        assert_eq!(mode(&dir.file("cmdline")), 0o600);

        // A root of the user's own with a looser mode is tightened.
        let loose = tmp.path().join("loose");
        fs::create_dir(&loose).unwrap();
        fs::set_permissions(&loose, fs::Permissions::from_mode(0o755)).unwrap();
        StateRoot::new(loose.clone()).unwrap();
        assert_eq!(mode(&loose), 0o700);
    }

    #[test]
    fn a_root_of_another_user_is_refused_and_left_alone() {
        let tmp = tempfile::tempdir().unwrap();
        let theirs = tmp.path().join("theirs");
        fs::create_dir(&theirs).unwrap();
        fs::set_permissions(&theirs, fs::Permissions::from_mode(0o755)).unwrap();
        // SAFETY: geteuid has no preconditions.
        let other = if unsafe { libc::geteuid() } == 0 {
            let path = std::ffi::CString::new(theirs.as_os_str().as_encoded_bytes()).unwrap();
            // SAFETY: chown(2) of a directory this test made, by a NUL-terminated path.
            assert_eq!(unsafe { libc::chown(path.as_ptr(), 4242, 4242) }, 0);
            theirs.clone()
        } else {
            // Not root: a directory of root's stands in for another user's.
            PathBuf::from("/")
        };
        let before = mode(&other);
        let err = StateRoot::new(other.clone()).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::PermissionDenied);
        assert!(err.to_string().contains("belongs to uid"), "{err}");
        assert_eq!(mode(&other), before, "not changed");

        // Nor through a symlink of the user's own pointing at it.
        let link = tmp.path().join("link");
        std::os::unix::fs::symlink(&other, &link).unwrap();
        assert!(StateRoot::new(link).is_err());
    }

    #[test]
    fn no_state_directory_is_an_error_saying_what_to_set() {
        let err = StateRoot::new(PathBuf::new()).unwrap_err();
        assert!(err.to_string().contains("--qemu-state-dir"), "{err}");
    }

    #[test]
    fn ids_that_are_not_a_namespace_name_and_uid_name_no_directory() {
        let tmp = tempfile::tempdir().unwrap();
        let root = StateRoot::new(tmp.path().join("qemu")).unwrap();
        let dir = root.dir_for("ns", "vm.a-1", UID);
        root.create(&dir, &record("ns", "vm.a-1", UID)).unwrap();
        assert!(root.by_id(&dir.id).is_some());
        for bad in [
            format!("../qemu/ns_vm.a-1_{UID}"),
            format!("ns/../ns_vm.a-1_{UID}"),
            format!(".hidden_{UID}"),
            format!("a_b_c_{UID}"),
            format!("NS_vm_{UID}"),
            format!("ns_vm.a-1_{UID}/"),
            "ns_vm_not a uid".to_string(),
        ] {
            assert_eq!(parse_id(&bad), None, "{bad}");
            assert!(root.by_id(&bad).is_none(), "{bad}");
        }
        // A directory whose vm.json is of another uid is not that id's.
        let other = "11111111-2222-3333-4444-555555555555";
        let forged = root.root.join(format!("ns_vm_{other}"));
        fs::create_dir(&forged).unwrap();
        write_private(
            &forged.join("vm.json"),
            &record_json(&record("ns", "vm", UID)).unwrap(),
        )
        .unwrap();
        assert!(root.by_id(&format!("ns_vm_{other}")).is_none());
    }
}
