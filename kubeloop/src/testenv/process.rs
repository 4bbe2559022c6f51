//! Child processes that never outlive the test binary.
//!
//! Every component is started with `PR_SET_PDEATHSIG = SIGKILL`, so the kernel kills it when
//! its parent goes away, even if the test binary panics, aborts or is SIGKILLed. The death
//! signal is tied to the *thread* that forked the child, not the process, and cargo's test
//! threads come and go; so all children are spawned from one dedicated thread that lives as
//! long as the process. [`ManagedProcess`] also kills its child on drop.

use std::fs::File;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::sync::mpsc;
use std::time::Duration;

use super::TestEnvError;

type SpawnRequest = (Command, mpsc::Sender<std::io::Result<Child>>);

/// The long-lived thread that forks every child (see the module docs for why).
fn spawner() -> &'static mpsc::Sender<SpawnRequest> {
    static SPAWNER: OnceLock<mpsc::Sender<SpawnRequest>> = OnceLock::new();
    SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<SpawnRequest>();
        std::thread::Builder::new()
            .name("testenv-spawner".into())
            .spawn(move || {
                for (mut command, reply) in rx {
                    let _ = reply.send(command.spawn());
                }
                // The senders live in a static, so this loop never ends: parking keeps the
                // thread (and with it every child's parent-death link) alive regardless.
                loop {
                    std::thread::park();
                }
            })
            .expect("spawning the testenv spawner thread");
        tx
    })
}

/// A component of the local control plane, running, with its output going to a log file.
pub struct ManagedProcess {
    name: String,
    child: Child,
    log_path: PathBuf,
}

impl ManagedProcess {
    /// Starts `binary args...`, with stdout and stderr appended to `log_path`.
    pub fn spawn(
        name: &str,
        binary: &Path,
        args: &[String],
        log_path: &Path,
    ) -> Result<Self, TestEnvError> {
        let log = File::options()
            .create(true)
            .append(true)
            .open(log_path)
            .map_err(|source| TestEnvError::Io {
                path: log_path.to_owned(),
                source,
            })?;
        let log_err = log.try_clone().map_err(|source| TestEnvError::Io {
            path: log_path.to_owned(),
            source,
        })?;
        let mut command = Command::new(binary);
        command
            .args(args)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_err);
        let parent = std::process::id() as libc::pid_t;
        // SAFETY: only async-signal-safe calls (prctl, getppid, _exit) run between fork and exec.
        unsafe {
            command.pre_exec(move || {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // The parent may have died between fork and prctl: then nobody will signal us.
                if libc::getppid() != parent {
                    libc::_exit(1);
                }
                Ok(())
            });
        }
        let (tx, rx) = mpsc::channel();
        spawner()
            .send((command, tx))
            .map_err(|_| TestEnvError::Spawn {
                component: name.to_owned(),
                detail: "the spawner thread is gone".into(),
            })?;
        let child = rx
            .recv()
            .map_err(|_| TestEnvError::Spawn {
                component: name.to_owned(),
                detail: "the spawner thread is gone".into(),
            })?
            .map_err(|e| TestEnvError::Spawn {
                component: name.to_owned(),
                detail: format!("{}: {e}", binary.display()),
            })?;
        tracing::debug!(component = name, pid = child.id(), log = %log_path.display(), "started");
        Ok(Self {
            name: name.to_owned(),
            child,
            log_path: log_path.to_owned(),
        })
    }

    /// The component's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Where its stdout and stderr go.
    pub fn log_path(&self) -> &Path {
        &self.log_path
    }

    /// `Some(status)` if the process has exited.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// The last `n` lines of the process's log, for error messages.
    pub fn log_tail(&self, n: usize) -> String {
        log_tail(&self.log_path, n)
    }

    /// SIGTERM, then SIGKILL if it has not exited within `grace`. Blocks until it is gone.
    pub fn stop(&mut self, grace: Duration) {
        if self.exited().is_some() {
            return;
        }
        // SAFETY: plain kill(2) on our own child's pid, which we have not reaped yet.
        unsafe {
            libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM);
        }
        let deadline = std::time::Instant::now() + grace;
        while std::time::Instant::now() < deadline {
            if self.exited().is_some() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        tracing::debug!(component = %self.name, "stopped");
    }
}

impl Drop for ManagedProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The last `n` lines of a file, or a note that it could not be read.
pub fn log_tail(path: &Path, n: usize) -> String {
    match std::fs::read_to_string(path) {
        Ok(text) => {
            let lines: Vec<&str> = text.lines().collect();
            lines[lines.len().saturating_sub(n)..].join("\n")
        }
        Err(e) => format!("(could not read {}: {e})", path.display()),
    }
}
