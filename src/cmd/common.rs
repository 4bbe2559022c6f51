//! What both controller subcommands share on the command line, so `sample-controller` and
//! `vm-controller` read their flags alike:
//!
//! - [`ClusterArgs`]: `--kubeconfig` / `--master`, resolved as controller-runtime's
//!   `GetConfig` does (flag, `$KUBECONFIG`, in-cluster, `~/.kube/config`).
//! - [`duration`]: every duration flag in Go's `time.ParseDuration` grammar.
//! - [`shutdown_on_signals`]: client-go's `SetupSignalHandler` (first signal graceful, second
//!   exits 1).
//! - [`LogArgs`] / [`init_logging`]: `-v`/`-vv`, klog's `-v=N` and `-logtostderr`.
//! - [`normalize_args`]: Go-style one-dash long flags rewritten for clap.
//! - [`holder_identity`]: the leader-election identity default.
//!
//! The metrics / health flags are `kubeloop::ops::OpsArgs`, shared the same way.

mod argv;
pub mod duration;
mod kubeconfig;
mod logging;
mod signals;

pub use argv::normalize_args;
pub use kubeconfig::ClusterArgs;
pub use logging::{LogArgs, init_logging};
pub use signals::shutdown_on_signals;

/// The leader-election identity: `--holder-identity`, else `$POD_NAME` (the Downward API's
/// pod name, as controller101 uses), else hostname + "_" + a random suffix, as client-go's
/// examples and controller-runtime build it (two processes on one host never collide).
pub fn holder_identity(flag: Option<&str>) -> String {
    [flag.map(str::to_string), std::env::var("POD_NAME").ok()]
        .into_iter()
        .flatten()
        .map(|s| s.trim().to_string())
        .find(|s| !s.is_empty())
        .unwrap_or_else(default_identity)
}

// TODO(lead): use leaderelection::default_identity once merged
fn default_identity() -> String {
    use rand::distr::{Alphanumeric, SampleString};
    let host = hostname().unwrap_or_else(|| "kubeloop".to_string());
    let suffix = Alphanumeric
        .sample_string(&mut rand::rng(), 8)
        .to_ascii_lowercase();
    format!("{host}_{suffix}")
}

fn hostname() -> Option<String> {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most buf.len() bytes into the buffer we own.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return None;
    }
    let end = buf.iter().position(|b| *b == 0).unwrap_or(buf.len());
    String::from_utf8(buf[..end].to_vec())
        .ok()
        .filter(|h| !h.is_empty())
}

/// Held by every test that reads or writes the process environment (process-wide state).
#[cfg(test)]
pub static ENV_LOCK: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_identity_is_the_flag_then_pod_name_then_host_and_suffix() {
        let _env = ENV_LOCK.lock().await;
        let saved = std::env::var_os("POD_NAME");
        // SAFETY: every test that reads or writes the environment holds ENV_LOCK.
        unsafe { std::env::set_var("POD_NAME", "pod-from-env") };
        let with_flag = holder_identity(Some("pod-a"));
        let from_env = holder_identity(Some("  "));
        // SAFETY: as above.
        unsafe { std::env::remove_var("POD_NAME") };
        let first = holder_identity(None);
        let second = holder_identity(None);
        // SAFETY: as above.
        unsafe {
            if let Some(v) = saved {
                std::env::set_var("POD_NAME", v);
            }
        }

        assert_eq!(with_flag, "pod-a");
        assert_eq!(from_env, "pod-from-env");
        let host = hostname().unwrap_or_else(|| "kubeloop".to_string());
        for id in [&first, &second] {
            let suffix = id
                .strip_prefix(&format!("{host}_"))
                .unwrap_or_else(|| panic!("{id} starts with {host}_"));
            assert_eq!(suffix.len(), 8, "{id}");
        }
        assert_ne!(first, second, "each process gets its own suffix");
    }
}
