//! The programs kubeloop's tests start beside the cluster: the `kubeloop` binary (package
//! `kubeloop-cli`, `cli/`) and the repository's examples (`examples/le_candidate.rs`, ...).
//!
//! The tests are the library's (the repository's root package), and cargo only tells a test
//! where its own package's binaries are (`CARGO_BIN_EXE_<name>`), so the harness builds what
//! they start, once per test process, with the cargo that runs the test: `cargo build
//! --workspace --all-features --bins --examples` in the repository's root. That is the feature
//! set `hack/test` builds the tests with (`--workspace --all-features`, examples included, so
//! the dev-dependencies' features too): after `hack/test`'s own build it is a no-op, and a
//! developer's `cargo test --test X` gets an up-to-date binary without naming it. The artifacts
//! are found beside the test's executable (`target/<profile>/deps/..`).

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

/// The `kubeloop` binary, built if it is missing or out of date.
pub fn kubeloop_binary() -> PathBuf {
    built().join("kubeloop")
}

/// The example `name` (`examples/<name>.rs` of the repository), built if it is missing or out
/// of date.
pub fn example(name: &str) -> PathBuf {
    built().join("examples").join(name)
}

/// `target/<profile>`, after one `cargo build` of the workspace's binaries and examples.
fn built() -> PathBuf {
    static PROFILE_DIR: OnceLock<PathBuf> = OnceLock::new();
    PROFILE_DIR
        .get_or_init(|| {
            let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
            let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
            let status = Command::new(&cargo)
                .args(["build", "--quiet", "--workspace", "--all-features", "--bins", "--examples"])
                .current_dir(root)
                .status()
                .unwrap_or_else(|e| panic!("running {cargo} build in {root}: {e}"));
            assert!(status.success(), "cargo build --bins --examples in {root} failed");
            let exe = std::env::current_exe().expect("the test's own path");
            exe.parent()
                .and_then(|deps| deps.parent())
                .expect("a test executable lives in target/<profile>/deps")
                .to_path_buf()
        })
        .clone()
}
