//! What both controller subcommands share on the command line, so `sample-controller` and
//! `vm-controller` read their flags alike:
//!
//! - [`ClusterArgs`]: `--kubeconfig` / `--master`, resolved as client-go's clientcmd
//!   loading rules do (flag, `$KUBECONFIG`, `~/.kube/config`, in-cluster).
//! - [`duration`]: every duration flag in Go's `time.ParseDuration` grammar.
//! - [`shutdown_on_signals`]: client-go's `SetupSignalHandler` (first signal graceful, second
//!   exits 1).
//! - [`LogArgs`] / [`init_logging`]: `-v`/`-vv`, klog's `-v=N` and `-logtostderr`.
//! - [`normalize_args`]: Go-style one-dash long flags rewritten for clap.
//! - [`holder_identity`]: the leader-election identity default.
//! - [`check_shard_flags`]: `--watch-held-shards` only with a ring, `--shard-bounds` only
//!   with it and as many shards as `--shards`.
//!
//! The metrics / health flags are `crate::OpsArgs`, shared the same way.

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

use kubeloop::leaderelection::default_identity;

/// Serves `--metrics-bind-address` / `--health-probe-bind-address` for a controller: the
/// workqueue, reconcile and cache series (plus leader election's, if given); `/healthz` with
/// `ping` (plus leader election's check); `/readyz` with one check named `ready_check`
/// that passes while `ready` is set (caches synced, not shutting down). `client` sends the
/// TokenReviews and SubjectAccessReviews of secure metrics.
pub async fn serve_controller_ops(
    ops: &crate::OpsArgs,
    client: &kube_client::Client,
    cache_metrics: &kubeloop::cache::CacheMetrics,
    ready: std::sync::Arc<std::sync::atomic::AtomicBool>,
    ready_check: (&'static str, &'static str),
    leader: Option<(
        kubeloop::leaderelection::LeaderMetricsProvider,
        kubeloop::leaderelection::HealthzAdaptor,
    )>,
    shutdown: &tokio_util::sync::CancellationToken,
) -> anyhow::Result<()> {
    use kubeloop::ops::{Check, CheckFn};
    use std::sync::Arc;
    let (check_name, not_ready) = ready_check;
    let mut healthz: Vec<Arc<dyn Check>> = vec![Arc::new(CheckFn::new("ping", || Ok(())))];
    let leader_metrics = leader.as_ref().map(|(m, _)| m.clone());
    if let Some((_, health)) = leader {
        healthz.push(Arc::new(health));
    }
    let readyz: Vec<Arc<dyn Check>> = vec![Arc::new(CheckFn::new(check_name, move || {
        if ready.load(std::sync::atomic::Ordering::SeqCst) {
            Ok(())
        } else {
            Err(not_ready.to_string())
        }
    }))];
    let cache_metrics = cache_metrics.clone();
    ops.serve(
        || {
            let mut registry = prometheus_client::registry::Registry::default();
            kubeloop::workqueue::MetricsProvider::global().register(&mut registry);
            kubeloop::runtime::ReconcileMetrics::global().register(&mut registry);
            kubeloop::runtime::ShardMetrics::global().register(&mut registry);
            kubeloop::record::EventMetrics::global().register(&mut registry);
            cache_metrics.register(&mut registry);
            if let Some(m) = &leader_metrics {
                m.register(&mut registry);
            }
            registry
        },
        healthz,
        readyz,
        Some(client.clone()),
        shutdown,
    )
    .await?;
    Ok(())
}

/// Refuses `--watch-held-shards` without a ring: `--shards 0` (the default) turns sharding
/// off, and clap's `requires` is met by `--shards 0` written out, so the flag would otherwise
/// be ignored without a word. Refuses `--shard-bounds` that cut another number of shards
/// than `--shards`.
pub fn check_shard_flags(
    shards: u32,
    watch_held_shards: bool,
    bounds: Option<&kubeloop::cache::ShardBounds>,
) -> anyhow::Result<()> {
    if watch_held_shards && shards == 0 {
        anyhow::bail!(
            "--watch-held-shards needs --shards 1 or more: --shards 0 turns sharding off, so there are no held shards to watch"
        );
    }
    if let Some(bounds) = bounds
        && bounds.shards() != shards
    {
        anyhow::bail!(
            "--shard-bounds cuts {} shards ({} bounds), but --shards is {shards}: give --shards {} or bounds for {shards} shards (kubeloop shard-bounds --shards {shards})",
            bounds.shards(),
            bounds.shards() - 1,
            bounds.shards(),
        );
    }
    Ok(())
}

/// Held by every test that reads or writes the process environment (process-wide state).
#[cfg(test)]
pub static ENV_LOCK: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[cfg(test)]
#[allow(unsafe_code)] // `std::env::set_var`, under ENV_LOCK.
mod tests {
    use super::*;

    #[test]
    fn watch_held_shards_without_a_ring_is_refused_by_name() {
        let err = check_shard_flags(0, true, None).unwrap_err().to_string();
        assert!(
            err.contains("--watch-held-shards") && err.contains("--shards 0"),
            "{err}"
        );
        assert!(check_shard_flags(4, true, None).is_ok());
        assert!(check_shard_flags(0, false, None).is_ok());
    }

    #[test]
    fn shard_bounds_for_another_shard_count_are_refused_by_name() {
        let four = kubeloop::cache::ShardBounds::even(4).unwrap();
        let err = check_shard_flags(8, true, Some(&four))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("--shard-bounds cuts 4 shards (3 bounds), but --shards is 8"),
            "{err}"
        );
        assert!(check_shard_flags(4, true, Some(&four)).is_ok());
    }

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
        let host = gethostname::gethostname().to_string_lossy().into_owned();
        for id in [&first, &second] {
            let suffix = id
                .strip_prefix(&format!("{host}_"))
                .unwrap_or_else(|| panic!("{id} starts with {host}_"));
            assert!(!suffix.is_empty(), "{id}");
        }
        assert_ne!(first, second, "each process gets its own suffix");
    }
}
