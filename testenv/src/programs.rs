//! The programs kubeloop's tests start beside the cluster: the `kubeloop` binary (package
//! `kubeloop-cli`, `cli/`) and the repository's examples (`examples/le_candidate.rs`, ...).
//! [`Kubeloop`] is the one way a test runs the binary: in the background as a
//! [`ManagedProcess`], or to completion for its output.
//!
//! The tests are the library's (the repository's root package), and cargo only tells a test
//! where its own package's binaries are (`CARGO_BIN_EXE_<name>`), so the harness builds what
//! they start, once per test process, with the cargo that runs the test: `cargo build
//! --workspace --all-features --bins --examples` in the repository's root. That is the feature
//! set `hack/test` builds the tests with (`--workspace --all-features`, examples included, so
//! the dev-dependencies' features too): after `hack/test`'s own build it is a no-op, and a
//! developer's `cargo test --test X` gets an up-to-date binary without naming it. The artifacts
//! are found beside the test's executable (`target/<profile>/deps/..`).

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use crate::{Cluster, ManagedProcess};

/// `kubeloop <args>` as a test runs it: [`Kubeloop::start`] in the background (a
/// [`ManagedProcess`]: killed when dropped, its stdout and stderr in a log file), or
/// [`Kubeloop::output`] to completion.
///
/// The environment is the test's own plus what [`Kubeloop::env`] adds; the binary colours
/// its log only on a terminal, so a test reads plain lines. The log goes to a temporary file
/// unless [`Kubeloop::log_in`] or [`Kubeloop::log_to`] names one that outlives the test (a
/// cluster's directory, kept with `KUBELOOP_KEEP_TESTENV=1`).
///
/// ```no_run
/// # async fn f(cluster: &kubeloop_testenv::Cluster) {
/// use std::time::Duration;
/// let mut controller = kubeloop_testenv::Kubeloop::new(["sample-controller", "--namespace", "ns"])
///     .kubeconfig(cluster.kubeconfig_path())
///     .env("RUST_LOG", "info")
///     .log_in(cluster)
///     .start();
/// controller.wait_for_line(&["caches synced"], Duration::from_secs(60)).await;
/// # }
/// ```
pub struct Kubeloop {
    name: String,
    command: Command,
    log: Option<PathBuf>,
}

impl Kubeloop {
    /// `kubeloop <args>`, named after its first argument (the subcommand) in messages and
    /// log file names.
    pub fn new<I, S>(args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let mut command = Command::new(kubeloop_binary());
        command.args(args);
        let name = command
            .get_args()
            .next()
            .map_or("kubeloop".into(), |a| a.to_string_lossy().into_owned());
        Self {
            name,
            command,
            log: None,
        }
    }

    /// One more argument.
    pub fn arg(mut self, arg: impl AsRef<OsStr>) -> Self {
        self.command.arg(arg);
        self
    }

    /// More arguments.
    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        self.command.args(args);
        self
    }

    /// `--kubeconfig <path>`.
    pub fn kubeconfig(self, path: impl AsRef<Path>) -> Self {
        let path = path.as_ref().as_os_str().to_owned();
        self.args([OsStr::new("--kubeconfig"), &path])
    }

    /// Sets an environment variable.
    pub fn env(mut self, key: impl AsRef<OsStr>, value: impl AsRef<OsStr>) -> Self {
        self.command.env(key, value);
        self
    }

    /// Removes an environment variable the test's own environment would pass on.
    pub fn env_remove(mut self, key: impl AsRef<OsStr>) -> Self {
        self.command.env_remove(key);
        self
    }

    /// The name in messages and log file names (the subcommand unless set).
    pub fn name(mut self, name: &str) -> Self {
        self.name = name.to_owned();
        self
    }

    /// The log in `path` (appended to).
    pub fn log_to(mut self, path: impl Into<PathBuf>) -> Self {
        self.log = Some(path.into());
        self
    }

    /// The log in the cluster's directory, as `<name>-<this test process's pid>.log`, beside
    /// the components' logs.
    pub fn log_in(self, cluster: &Cluster) -> Self {
        let path = cluster
            .dir()
            .join(format!("{}-{}.log", self.name, std::process::id()));
        self.log_to(path)
    }

    /// Starts it in the background; panics, naming it, if it cannot be started.
    pub fn start(self) -> ManagedProcess {
        let started = match &self.log {
            Some(path) => ManagedProcess::start(&self.name, self.command, path),
            None => ManagedProcess::start_temp_log(&self.name, self.command),
        };
        started.unwrap_or_else(|e| panic!("starting kubeloop {}: {e}", self.name))
    }

    /// Runs it to completion and returns its status, stdout and stderr; panics if it cannot
    /// be run.
    pub fn output(mut self) -> Output {
        self.command
            .output()
            .unwrap_or_else(|e| panic!("running kubeloop {}: {e}", self.name))
    }
}

/// The `kubeloop` binary, built if it is missing or out of date.
pub fn kubeloop_binary() -> PathBuf {
    built().join("kubeloop")
}

/// The example `name` (`examples/<name>.rs` of the repository), built if it is missing or out
/// of date.
pub fn example(name: &str) -> PathBuf {
    built().join("examples").join(name)
}

/// The variables (or their prefixes) cargo sets for the crate it runs, for [`built`] to
/// clear: cargo's "Environment variables Cargo sets for crates".
const CRATE_VARIABLES: [&str; 8] = [
    "CARGO_PKG_",
    "CARGO_MANIFEST_",
    "CARGO_CRATE_NAME",
    "CARGO_BIN_",
    "CARGO_PRIMARY_PACKAGE",
    "CARGO_TARGET_TMPDIR",
    "CARGO_RUSTC_CURRENT_DIR",
    "OUT_DIR",
];

/// `target/<profile>`, after one `cargo build` of the workspace's binaries and examples.
fn built() -> PathBuf {
    static PROFILE_DIR: OnceLock<PathBuf> = OnceLock::new();
    PROFILE_DIR
        .get_or_init(|| {
            let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
            let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
            let mut build = Command::new(&cargo);
            // `cargo test` gives a test the variables it sets for a crate (CARGO_PKG_NAME,
            // CARGO_MANIFEST_DIR, ...). Build scripts that watch them (ring's does) would see
            // them differ from a shell's build and rebuild, and the shell's next build would
            // rebuild again: about two minutes of hack/test each way. The build gets the
            // shell's environment back.
            for (name, _) in std::env::vars_os() {
                let text = name.to_string_lossy();
                if CRATE_VARIABLES.iter().any(|v| text.starts_with(v)) {
                    build.env_remove(&name);
                }
            }
            let status = build
                .args([
                    "build",
                    "--quiet",
                    "--workspace",
                    "--all-features",
                    "--bins",
                    "--examples",
                ])
                .current_dir(root)
                .status()
                .unwrap_or_else(|e| panic!("running {cargo} build in {root}: {e}"));
            assert!(
                status.success(),
                "cargo build --bins --examples in {root} failed"
            );
            let exe = std::env::current_exe().expect("the test's own path");
            exe.parent()
                .and_then(|deps| deps.parent())
                .expect("a test executable lives in target/<profile>/deps")
                .to_path_buf()
        })
        .clone()
}
