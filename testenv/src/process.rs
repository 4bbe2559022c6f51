//! Child processes that never outlive the test binary: the control plane's components
//! (etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok, and on a node
//! cluster containerd, the kubelet and kube-proxy) and every program a test runs in the
//! background (the `kubeloop` binary through [`crate::Kubeloop`], the `le_candidate` example,
//! `podman system service`, a shell client).
//!
//! Every child is started with `PR_SET_PDEATHSIG = SIGKILL`, so the kernel kills it when
//! its parent goes away, even if the test binary panics, aborts or is SIGKILLed. The death
//! signal is tied to the *thread* that forked the child, not the process, and cargo's test
//! threads come and go; so all children are spawned from one dedicated thread that lives as
//! long as the process. [`ManagedProcess`] also kills its child on drop.
//!
//! A child's stdout and stderr go to one log file, which the test reads: whole
//! ([`ManagedProcess::log`]), waiting for a line ([`ManagedProcess::wait_for_line`]), or in a
//! failure message while it waits for something else ([`ManagedProcess::eventually`]). The
//! waiting methods panic with the log's last lines instead of returning errors: they are for
//! tests, where a panic with a message is the failure report.
//!
//! Invariant: once the child is reaped (`reaped` is set), its pid may belong to another
//! process, so [`ManagedProcess::signal`] refuses to send anything to it.

use std::fs::File;
use std::future::Future;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use kubeloop::testing::Ready;

use super::TestEnvError;

/// How often the waiting methods read the log or ask whether the child exited: often enough
/// that a test reacting to a line (a second SIGTERM during a drain) does so within tens of
/// milliseconds.
const PROCESS_POLL: Duration = Duration::from_millis(20);
/// How many of the log's last lines a failure message shows.
const TAIL_LINES: usize = 40;

/// A child process (a control-plane component, or a program under test) running, with its
/// stdout and stderr going to a log file; killed on drop.
pub struct ManagedProcess {
    name: String,
    child: Child,
    log_path: PathBuf,
    /// The log's temporary file when the caller gave no path ([`ManagedProcess::start_temp_log`]):
    /// removed on drop, unless `KUBELOOP_KEEP_TESTENV` is set.
    temp_log: Option<tempfile::TempPath>,
    /// Set once the child has been reaped (see the module docs).
    reaped: AtomicBool,
}

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

impl ManagedProcess {
    /// Starts `binary args...`, with stdout and stderr appended to `log_path`.
    pub fn spawn(
        name: &str,
        binary: &Path,
        args: &[String],
        log_path: &Path,
    ) -> Result<Self, TestEnvError> {
        let mut command = Command::new(binary);
        command.args(args);
        Self::start(name, command, log_path)
    }

    /// Starts `command` (its program, arguments, environment and working directory as the
    /// caller set them) with stdin from /dev/null and stdout and stderr appended to `log_path`;
    /// whatever `command` said about those three is replaced.
    pub fn start(name: &str, command: Command, log_path: &Path) -> Result<Self, TestEnvError> {
        Self::start_logged(name, command, log_path.to_owned(), None)
    }

    /// [`ManagedProcess::start`] with the log in a temporary file of its own, removed when the
    /// process is dropped (kept with `KUBELOOP_KEEP_TESTENV=1`), for a test without a cluster
    /// directory to put it in.
    pub fn start_temp_log(name: &str, command: Command) -> Result<Self, TestEnvError> {
        let file = tempfile::Builder::new()
            .prefix(&format!("kubeloop-{name}-"))
            .suffix(".log")
            .tempfile()
            .map_err(|source| TestEnvError::Io {
                path: std::env::temp_dir(),
                source,
            })?;
        let temp = file.into_temp_path();
        Self::start_logged(name, command, temp.to_path_buf(), Some(temp))
    }

    fn start_logged(
        name: &str,
        mut command: Command,
        log_path: PathBuf,
        temp_log: Option<tempfile::TempPath>,
    ) -> Result<Self, TestEnvError> {
        let io_error = |source| TestEnvError::Io {
            path: log_path.clone(),
            source,
        };
        let log = File::options()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(io_error)?;
        let log_err = log.try_clone().map_err(io_error)?;
        command.stdin(Stdio::null()).stdout(log).stderr(log_err);
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
        let program = command.get_program().to_string_lossy().into_owned();
        let spawner_gone = || TestEnvError::Spawn {
            component: name.to_owned(),
            detail: "the spawner thread is gone".into(),
        };
        let (tx, rx) = mpsc::channel();
        spawner().send((command, tx)).map_err(|_| spawner_gone())?;
        let child = rx
            .recv()
            .map_err(|_| spawner_gone())?
            .map_err(|e| TestEnvError::Spawn {
                component: name.to_owned(),
                detail: format!("{program}: {e}"),
            })?;
        tracing::debug!(component = name, pid = child.id(), log = %log_path.display(), "started");
        Ok(Self {
            name: name.to_owned(),
            child,
            log_path,
            temp_log,
            reaped: AtomicBool::new(false),
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

    /// Everything it has written so far ("" if the log cannot be read).
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }

    /// The last `n` lines of the process's log, for error messages.
    pub fn log_tail(&self, n: usize) -> String {
        log_tail(&self.log_path, n)
    }

    /// The first line of the log holding every one of `needles`.
    pub fn find_line(&self, needles: &[&str]) -> Option<String> {
        self.log()
            .lines()
            .find(|line| needles.iter().all(|n| line.contains(n)))
            .map(str::to_owned)
    }

    /// `Some(status)` if the process has exited.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        let status = self.child.try_wait().ok().flatten();
        if status.is_some() {
            self.reaped.store(true, Ordering::SeqCst);
        }
        status
    }

    /// Sends `sig` (SIGTERM, SIGINT, SIGSTOP and SIGCONT, say). Panics, naming the process, if
    /// it has already been reaped or kill(2) fails.
    pub fn signal(&self, sig: libc::c_int) {
        assert!(
            !self.reaped.load(Ordering::SeqCst),
            "{} has exited: no signal {sig} for it",
            self.name
        );
        // SAFETY: kill(2) on our own child's pid, which we have not reaped yet.
        let rc = unsafe { libc::kill(self.child.id() as libc::pid_t, sig) };
        assert_eq!(
            rc,
            0,
            "kill({}, {sig}) of {}: {}",
            self.child.id(),
            self.name,
            std::io::Error::last_os_error()
        );
    }

    /// SIGKILL, and reap it (nothing if it has already exited).
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.reaped.store(true, Ordering::SeqCst);
    }

    /// SIGTERM, and wait (at most `timeout`) for it to exit; returns its exit code (`None` if
    /// a signal ended it). Panics with the log's tail if it is still running after `timeout`.
    pub fn terminate(&mut self, timeout: Duration) -> Option<i32> {
        self.signal(libc::SIGTERM);
        self.wait_blocking(timeout).code()
    }

    /// SIGTERM, then SIGKILL if it has not exited within `grace`. Blocks until it is gone.
    pub fn stop(&mut self, grace: Duration) {
        if self.exited().is_some() {
            return;
        }
        self.signal(libc::SIGTERM);
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if self.exited().is_some() {
                return;
            }
            std::thread::sleep(PROCESS_POLL);
        }
        self.kill();
        tracing::debug!(component = %self.name, "stopped");
    }

    /// Waits until the log has a line holding every one of `needles` and returns it; panics
    /// with the log's tail if the process exits first or `timeout` passes.
    pub async fn wait_for_line(&mut self, needles: &[&str], timeout: Duration) -> String {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if let Some(line) = self.line_unless_exited(needles) {
                return line;
            }
            if tokio::time::Instant::now() >= deadline {
                self.no_line_within(needles, timeout);
            }
            tokio::time::sleep(PROCESS_POLL).await;
        }
    }

    /// [`ManagedProcess::wait_for_line`] for code outside an async context.
    pub fn wait_for_line_blocking(&mut self, needles: &[&str], timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(line) = self.line_unless_exited(needles) {
                return line;
            }
            if Instant::now() >= deadline {
                self.no_line_within(needles, timeout);
            }
            std::thread::sleep(PROCESS_POLL);
        }
    }

    /// Waits until the process exits and returns its status; panics with the log's tail if it
    /// is still running after `timeout`.
    pub async fn wait(&mut self, timeout: Duration) -> ExitStatus {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if let Some(status) = self.exited() {
                return status;
            }
            if tokio::time::Instant::now() >= deadline {
                self.still_running_after(timeout);
            }
            tokio::time::sleep(PROCESS_POLL).await;
        }
    }

    /// [`ManagedProcess::wait`] for code outside an async context.
    pub fn wait_blocking(&mut self, timeout: Duration) -> ExitStatus {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.exited() {
                return status;
            }
            if Instant::now() >= deadline {
                self.still_running_after(timeout);
            }
            std::thread::sleep(PROCESS_POLL);
        }
    }

    /// [`kubeloop::testing::eventually`] whose failure message ends with the last lines of this
    /// process's log: what the program said while the test waited for it.
    pub async fn eventually<R, F, Fut>(&self, what: &str, timeout: Duration, check: F) -> R::Output
    where
        R: Ready,
        F: FnMut() -> Fut,
        Fut: Future<Output = R>,
    {
        kubeloop::testing::eventually_explained(what, timeout, || self.tail_for_failure(), check)
            .await
    }

    /// [`ManagedProcess::eventually`] for code outside an async context.
    pub fn eventually_blocking<R: Ready>(
        &self,
        what: &str,
        timeout: Duration,
        check: impl FnMut() -> R,
    ) -> R::Output {
        kubeloop::testing::eventually_explained_blocking(
            what,
            timeout,
            || self.tail_for_failure(),
            check,
        )
    }

    /// The log's last lines, introduced, for a failure message.
    fn tail_for_failure(&self) -> String {
        format!(
            "last lines of {} ({}):\n{}",
            self.name,
            self.log_path.display(),
            self.log_tail(TAIL_LINES)
        )
    }

    /// The line if it is there; a panic if it is not and the process has exited (it will
    /// never come).
    fn line_unless_exited(&mut self, needles: &[&str]) -> Option<String> {
        if let Some(line) = self.find_line(needles) {
            return Some(line);
        }
        let status = self.exited()?;
        // The line may have been written just before the exit.
        if let Some(line) = self.find_line(needles) {
            return Some(line);
        }
        panic!(
            "{} exited ({status}) without logging a line with {needles:?}; last lines of {}:\n{}",
            self.name,
            self.log_path.display(),
            self.log_tail(TAIL_LINES)
        );
    }

    fn no_line_within(&self, needles: &[&str], timeout: Duration) -> ! {
        panic!(
            "{} logged no line with {needles:?} within {timeout:?}; last lines of {}:\n{}",
            self.name,
            self.log_path.display(),
            self.log_tail(TAIL_LINES)
        );
    }

    fn still_running_after(&self, timeout: Duration) -> ! {
        panic!(
            "{} still running after {timeout:?}; last lines of {}:\n{}",
            self.name,
            self.log_path.display(),
            self.log_tail(TAIL_LINES)
        );
    }
}

impl Drop for ManagedProcess {
    fn drop(&mut self) {
        self.kill();
        if std::env::var_os("KUBELOOP_KEEP_TESTENV").is_some()
            && let Some(temp) = self.temp_log.take()
            && let Ok(kept) = temp.keep()
        {
            eprintln!("kept the log of {} at {}", self.name, kept.display());
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(script: &str) -> ManagedProcess {
        let mut command = Command::new("sh");
        command.args(["-c", script]);
        ManagedProcess::start_temp_log("sh", command).expect("starting sh")
    }

    #[tokio::test]
    async fn stdout_and_stderr_go_to_the_log_and_a_line_is_awaited() {
        let mut process = sh("echo out; echo 'ready at 1' >&2; sleep 30");
        let line = process
            .wait_for_line(&["ready", "at"], Duration::from_secs(10))
            .await;
        assert_eq!(line, "ready at 1");
        assert!(process.log().contains("out\n"), "{}", process.log());
    }

    #[tokio::test]
    async fn a_signal_reaches_the_process_and_wait_returns_its_status() {
        let mut process =
            sh("trap 'echo got TERM; exit 3' TERM; echo up; while :; do sleep 0.05; done");
        process
            .wait_for_line(&["up"], Duration::from_secs(10))
            .await;
        process.signal(libc::SIGTERM);
        let status = process.wait(Duration::from_secs(10)).await;
        assert_eq!(status.code(), Some(3), "{}", process.log());
        assert!(process.log().contains("got TERM"));
    }

    #[test]
    #[should_panic(
        expected = "waiting for a line that never comes: still nothing\nlast lines of sh"
    )]
    fn eventually_fails_with_the_log_tail() {
        let mut process = sh("echo 'the reason it is not coming'; sleep 30");
        process.wait_for_line_blocking(&["reason"], Duration::from_secs(10));
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            process.eventually_blocking(
                "a line that never comes",
                Duration::from_millis(300),
                || process.find_line(&["never"]),
            )
        }));
        let message = *result.unwrap_err().downcast::<String>().unwrap();
        assert!(message.contains("the reason it is not coming"), "{message}");
        std::panic::resume_unwind(Box::new(message));
    }

    #[test]
    #[should_panic(expected = "exited (exit status: 0) without logging a line with [\"never\"]")]
    fn waiting_for_a_line_fails_at_once_when_the_process_exits() {
        let mut process = sh("echo bye");
        process.wait_for_line_blocking(&["never"], Duration::from_secs(60));
    }

    #[test]
    fn drop_kills_the_process_and_removes_its_temporary_log() {
        let process = sh("sleep 30");
        let (pid, log) = (process.pid(), process.log_path().to_owned());
        drop(process);
        assert!(
            !Path::new(&format!("/proc/{pid}")).exists(),
            "{pid} still there"
        );
        if std::env::var_os("KUBELOOP_KEEP_TESTENV").is_none() {
            assert!(!log.exists(), "{} still there", log.display());
        }
    }
}
