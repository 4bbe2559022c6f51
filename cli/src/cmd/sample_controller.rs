//! `kubeloop sample-controller`: sample-controller's main.go. Flags as there (`--kubeconfig`,
//! `--master`, one dash or two) plus `--workers`, `--resync`, `--namespace` and
//! controller-runtime's `--metrics-bind-address` / `--health-probe-bind-address`; the cluster
//! is found as client-go's clientcmd loading rules find it (see `common::ClusterArgs`).
//! `--shards N` splits the Foos over N shards held through Leases, so that replicas share the
//! work (`kubeloop::runtime::ShardRing`). SIGINT/SIGTERM drain the queue and stop; a second signal exits at once with status 1
//! (client-go's `SetupSignalHandler`).

use std::time::Duration;

use crate::OpsArgs;
use anyhow::Context;
use kubeloop::controller::sample::{ControllerConfig, run as run_controller};
use kubeloop::runtime::ShardingConfig;

use super::common::{self, ClusterArgs};

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub cluster: ClusterArgs,
    /// Foos synced at once.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u16).range(1..))]
    pub workers: u16,
    /// Watch one namespace only (default: all namespaces, as sample-controller does).
    #[arg(long)]
    pub namespace: Option<String>,
    #[command(flatten)]
    pub ops: OpsArgs,
    /// Informer resync period in Go's duration syntax, e.g. 30s, 5m, 1m30s; 0 turns resyncs
    /// off.
    #[arg(long, default_value = "30s", value_name = "DURATION", value_parser = common::duration::non_negative)]
    pub resync: Duration,
    /// Read-your-writes: how long a reconcile waits at most for the cache to hold its key's
    /// last writes (e.g. 5s); 0 turns the wait off (reconciles that start on a stale cache are
    /// still counted in kubeloop_reconcile_stale_total).
    #[arg(long, default_value = "5s", value_name = "DURATION", value_parser = common::duration::non_negative)]
    pub read_your_writes_wait: Duration,
    /// Split the Foos over this many shards, each held through a Lease of its own, so that
    /// several replicas work at once (0: off, one process does everything). Every replica
    /// must be given the same number.
    #[arg(long, default_value_t = 0)]
    pub shards: u32,
    /// Name of the shard ring (prefix of its Leases).
    #[arg(long, default_value = "sample-controller")]
    pub shard_ring: String,
    /// Namespace of the shard ring's Leases (default: $POD_NAMESPACE, then "default").
    #[arg(long)]
    pub shard_lease_namespace: Option<String>,
    /// With --shards: shard by the namespace's hash range and list and watch only the shards
    /// held (KEP-5866's shardSelector; filtered here on an apiserver without the
    /// ShardedListAndWatch gate). Every replica must agree.
    #[arg(long, requires = "shards")]
    pub watch_held_shards: bool,
    /// With --watch-held-shards: where each shard of the namespace-hash ring starts, as
    /// `kubeloop shard-bounds` prints them (the starts of shards 1.., 0x and 16 hex digits,
    /// comma-separated), instead of equal ranges: bounds at the quantiles of the objects
    /// even the shards out. Every replica must be given the same; the ring gives a replica
    /// with other bounds no shard.
    #[arg(long, value_name = "BOUNDS", requires = "watch_held_shards")]
    pub shard_bounds: Option<kubeloop::cache::ShardBounds>,
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    common::check_shard_flags(
        args.shards,
        args.watch_held_shards,
        args.shard_bounds.as_ref(),
    )?;
    // Handlers first, before any await: a SIGTERM during start-up must stop us cleanly.
    let shutdown = common::shutdown_on_signals().context("installing SIGINT/SIGTERM handlers")?;
    let client = args.cluster.client().await?;
    let config = ControllerConfig {
        workers: usize::from(args.workers),
        resync: args.resync,
        freshness_wait: (!args.read_your_writes_wait.is_zero())
            .then_some(args.read_your_writes_wait),
        namespace: args.namespace.clone(),
        sharding: (args.shards > 0).then(|| {
            ShardingConfig::new(
                args.shard_ring.clone(),
                args.shards,
                common::holder_identity(None),
            )
        }),
        watch_held_shards: args.watch_held_shards,
        shard_bounds: args.shard_bounds.clone(),
        sharding_namespace: args
            .shard_lease_namespace
            .clone()
            .or_else(|| {
                std::env::var("POD_NAMESPACE")
                    .ok()
                    .filter(|s| !s.is_empty())
            })
            .unwrap_or_else(|| "default".to_string()),
        ..Default::default()
    };
    common::serve_controller_ops(
        &args.ops,
        &client,
        &config.cache_metrics,
        config.ready.clone(),
        (
            "informers-synced",
            "caches not synced yet, or shutting down",
        ),
        None,
        &shutdown,
    )
    .await?;
    run_controller(client, config, shutdown)
        .await
        .context("running the sample controller")?;
    Ok(())
}
