//! `kubeloop vm-controller`: controller101's `cmd/main.go` with its flags, on kubeloop's stack.
//!
//! Leader election (on by default) wraps the controller: only the holder of the Lease
//! `--lease-lock-namespace/--lease-lock-name` runs it. With `--shards N` the VMs are split
//! over N shards instead, each held through a Lease `<lease-lock-name>-shard-<i>`, and every
//! replica works on the shards it holds (`kubeloop::runtime::ShardRing`); with
//! `--watch-held-shards` each replica also caches only the VMs of those shards. SIGINT /
//! SIGTERM stop the controller (workers drained), release the Lease so a standby takes over
//! at once, and exit 0. Losing the Lease exits 1 (the process manager restarts it; client-go's
//! `Run` also does not re-contend).
//!
//! A second SIGINT / SIGTERM exits at once with status 1 (client-go's `SetupSignalHandler`).
//!
//! Differences from controller101 on purpose: the holder identity is never empty ($POD_NAME,
//! then hostname + "_" + a random suffix); `--refresh-interval` drives the usage refresh; the
//! driver's engine is `$DOCKER_HOST` (default hack/setup-podman's socket). Flags take one dash
//! or two and durations are Go's (see `common`).

use std::time::Duration;

use anyhow::{Context, bail};
use clap::{ArgAction, ValueEnum};
use kube_client::Client;
use kubeloop::cache::ShardScope;
use kubeloop::controller::vm::{
    self, Accel, DockerDriver, DockerDriverConfig, Driver, FakeDriver, QemuDriver,
    QemuDriverConfig, VmControllerConfig, VmControllerError,
};
use kubeloop::leaderelection::{LeaderElectionConfig, LeaderElector, LeaseLock};
use kubeloop::runtime::{LeaseRing, ShardRing, ShardingConfig};
use tokio_util::sync::CancellationToken;
use tracing::info;

use super::common::{self, ClusterArgs};

/// Flags of `kubeloop vm-controller`.
#[derive(clap::Args, Debug)]
#[command(version)]
pub struct Args {
    #[command(flatten)]
    pub cluster: ClusterArgs,
    /// Number of worker threads reconciling VMs concurrently.
    #[arg(long, default_value_t = 2)]
    pub threads: usize,
    /// Run under leader election (`--leader-elect=false` to run unconditionally).
    #[arg(long, default_value_t = true, action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub leader_elect: bool,
    /// Identity written into the Lease (default: $POD_NAME, then hostname_<random suffix>).
    #[arg(long)]
    pub holder_identity: Option<String>,
    /// Name of the Lease.
    #[arg(long, default_value = "controller101")]
    pub lease_lock_name: String,
    /// Namespace of the Lease (default: $POD_NAMESPACE, then "default").
    #[arg(long)]
    pub lease_lock_namespace: Option<String>,
    /// Lease duration, in Go's duration syntax (15s, 1m).
    #[arg(long, default_value = "15s", value_name = "DURATION", value_parser = common::duration::positive)]
    pub lease_duration: Duration,
    /// How long the leader retries renewing before it gives up.
    #[arg(long, default_value = "10s", value_name = "DURATION", value_parser = common::duration::positive)]
    pub renew_deadline: Duration,
    /// Interval between election attempts.
    #[arg(long, default_value = "2s", value_name = "DURATION", value_parser = common::duration::positive)]
    pub retry_period: Duration,
    /// Split the VMs over this many shards, each held through a Lease of its own, so that
    /// every replica works on its share at once instead of one leader on all (0: off, one
    /// leader under --leader-elect). The ring's Leases are named after --lease-lock-name in
    /// --lease-lock-namespace and use the same lease timings. Every replica must be given the
    /// same number.
    #[arg(long, default_value_t = 0)]
    pub shards: u32,
    /// With --shards: shard by the namespace's hash range and list and watch only the shards
    /// held (KEP-5866's shardSelector; filtered here on an apiserver without the
    /// ShardedListAndWatch gate). Every replica must agree. The orphan sweep still asks the
    /// apiserver, not this partial cache, whether a server's VM exists.
    #[arg(long, requires = "shards")]
    pub watch_held_shards: bool,
    /// With --watch-held-shards: where each shard of the namespace-hash ring starts, as
    /// `kubeloop shard-bounds` prints them (the starts of shards 1.., 0x and 16 hex digits,
    /// comma-separated), instead of equal ranges: bounds at the quantiles of the objects
    /// even the shards out. Every replica must be given the same; the ring gives a replica
    /// with other bounds no shard.
    #[arg(long, value_name = "BOUNDS", requires = "watch_held_shards")]
    pub shard_bounds: Option<kubeloop::cache::ShardBounds>,
    /// With --watch-held-shards: how long the ring's members a replica sees must stay
    /// unchanged before it takes its first shards (at most --lease-duration), so that
    /// replicas started together split the shards before any lists more than its share
    /// (default as Kafka's group.initial.rebalance.delay.ms).
    #[arg(long, default_value = "3s", value_name = "DURATION", value_parser = common::duration::non_negative, requires = "watch_held_shards")]
    pub shard_join_window: Duration,
    /// With --vm-driver fake: each status call (one per VM refresh) takes this long, standing
    /// in for a slow engine (e.g. 50ms).
    #[arg(long, default_value = "0s", value_name = "DURATION", value_parser = common::duration::non_negative)]
    pub fake_engine_latency: Duration,
    /// Where VMs run: docker ($DOCKER_HOST, default unix:///run/kubeloop/podman.sock), fake (in
    /// memory) or qemu (one qemu-system-x86_64 per VM; hack/setup-qemu).
    #[arg(long, value_enum, default_value_t = VmDriver::Docker)]
    pub vm_driver: VmDriver,
    /// With --vm-driver docker: the image each VM's container runs (hack/setup-podman builds
    /// the default: busybox httpd).
    #[arg(long, default_value = vm::DEFAULT_IMAGE)]
    pub vm_image: String,
    /// With --vm-driver qemu: the root of the per-VM state directories (default
    /// /var/lib/kubeloop/qemu as root, else $XDG_STATE_HOME/kubeloop/qemu).
    #[arg(long, env = "KUBELOOP_QEMU_STATE_DIR")]
    pub qemu_state_dir: Option<std::path::PathBuf>,
    /// With --vm-driver qemu: where hack/setup-qemu put vmlinuz and initramfs.cpio.gz
    /// (default ~/.cache/kubeloop/qemu).
    #[arg(long, env = "KUBELOOP_QEMU_CACHE")]
    pub qemu_cache: Option<std::path::PathBuf>,
    /// With --vm-driver qemu: auto (KVM if a probe guest boots under it, else TCG), kvm or tcg.
    #[arg(long, value_enum, env = "KUBELOOP_QEMU_ACCEL", default_value_t = QemuAccel::Auto)]
    pub qemu_accel: QemuAccel,
    /// How often the usage of Active VMs is refreshed (e.g. 20s, 500ms, 1m30s).
    #[arg(long, default_value = "20s", value_name = "DURATION", value_parser = common::duration::positive)]
    pub refresh_interval: Duration,
    /// Concurrent usage refreshes, apart from the --threads workers that create and delete
    /// (so refreshing many VMs never holds up a create or a delete).
    #[arg(long, default_value_t = vm::DEFAULT_REFRESH_WORKERS)]
    pub refresh_workers: usize,
    /// The longest a VM that failed for a reason that may pass (the engine is down) waits
    /// before its next try; the wait doubles from 5ms up to this.
    #[arg(long, default_value = "2m", value_name = "DURATION", value_parser = common::duration::positive)]
    pub max_retry_delay: Duration,
    /// Read-your-writes: how long a reconcile waits at most for the cache to hold its key's
    /// last writes (e.g. 5s); 0 turns the wait off (reconciles that start on a stale cache are
    /// still counted in kubeloop_reconcile_stale_total).
    #[arg(long, default_value = "5s", value_name = "DURATION", value_parser = common::duration::non_negative)]
    pub read_your_writes_wait: Duration,
    /// Only watch VMs in this namespace (default: all namespaces).
    #[arg(long)]
    pub namespace: Option<String>,
    #[command(flatten)]
    pub ops: crate::OpsArgs,
}

/// `--vm-driver`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum VmDriver {
    Docker,
    Fake,
    Qemu,
}

/// `--qemu-accel`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum QemuAccel {
    Auto,
    Kvm,
    Tcg,
}

/// Runs the controller until a signal (or a lost lease).
pub async fn run(args: Args) -> anyhow::Result<()> {
    common::check_shard_flags(
        args.shards,
        args.watch_held_shards,
        args.shard_bounds.as_ref(),
    )?;
    // Handlers first, before any await: a SIGTERM during start-up must stop us cleanly.
    let shutdown = common::shutdown_on_signals().context("installing SIGINT/SIGTERM handlers")?;
    let client = args.cluster.client().await?;
    let config = VmControllerConfig {
        workers: args.threads.max(1),
        refresh_interval: args.refresh_interval,
        refresh_workers: args.refresh_workers,
        max_retry_delay: args.max_retry_delay,
        freshness_wait: (!args.read_your_writes_wait.is_zero())
            .then_some(args.read_your_writes_wait),
        namespace: args.namespace.clone(),
        watch_held_shards: args.watch_held_shards,
        ..VmControllerConfig::default()
    };
    match args.vm_driver {
        VmDriver::Docker => {
            let driver = DockerDriver::new(DockerDriverConfig {
                image: args.vm_image.clone(),
                ..DockerDriverConfig::from_env()
            });
            run_with(args, client, driver, config, shutdown).await
        }
        VmDriver::Fake => {
            let driver = FakeDriver::new().with_status_latency(args.fake_engine_latency);
            run_with(args, client, driver, config, shutdown).await
        }
        VmDriver::Qemu => {
            let cache = args
                .qemu_cache
                .clone()
                .unwrap_or_else(vm::default_cache_dir);
            let qemu_config = QemuDriverConfig {
                state_dir: args
                    .qemu_state_dir
                    .clone()
                    .unwrap_or_else(vm::default_state_dir),
                kernel: cache.join("vmlinuz"),
                initrd: cache.join("initramfs.cpio.gz"),
                accel: match args.qemu_accel {
                    QemuAccel::Auto => Accel::Auto,
                    QemuAccel::Kvm => Accel::Kvm,
                    QemuAccel::Tcg => Accel::Tcg,
                },
                ..QemuDriverConfig::default()
            };
            let state_dir = qemu_config.state_dir.display().to_string();
            let driver = QemuDriver::new(qemu_config)
                .with_context(|| format!("QEMU state directory {state_dir}"))?;
            run_with(args, client, driver, config, shutdown).await
        }
    }
}

async fn run_with<D: Driver>(
    args: Args,
    client: Client,
    driver: D,
    config: VmControllerConfig,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    info!(
        driver = driver.engine(),
        leader_elect = args.leader_elect,
        "kubeloop vm-controller starting"
    );
    // A standby keeps its informer synced, so every replica is ready once its cache is.
    let ready_check = (
        "informer-sync",
        "the VirtualMachine informer has not synced",
    );
    let namespace = args
        .lease_lock_namespace
        .clone()
        .or_else(|| {
            std::env::var("POD_NAMESPACE")
                .ok()
                .filter(|s| !s.is_empty())
        })
        .unwrap_or_else(|| "default".to_string());
    if args.shards > 0 || !args.leader_elect {
        // Sharded, or one replica doing everything: no leader-election health check.
        let ring = if args.shards > 0 {
            let identity = common::holder_identity(args.holder_identity.as_deref());
            let sharding = ShardingConfig {
                lease_duration: args.lease_duration,
                renew_deadline: args.renew_deadline,
                retry_period: args.retry_period,
                join_window: args.shard_join_window,
                ..ShardingConfig::new(args.lease_lock_name.clone(), args.shards, identity.clone())
            };
            info!(identity = %identity, ring = %args.lease_lock_name, namespace = %namespace, shards = args.shards, watch_held_shards = args.watch_held_shards, "joining the shard ring");
            let ring = ShardRing::new(sharding, LeaseRing::new(client.clone(), &namespace))
                .context("invalid sharding settings")?;
            Some(match args.shard_bounds.clone() {
                Some(bounds) => ring
                    .watch_held_shards(ShardScope::with_bounds(bounds))
                    .context("invalid sharding settings")?,
                None => ring,
            })
        } else {
            None
        };
        common::serve_controller_ops(
            &args.ops,
            &client,
            &config.cache_metrics,
            config.ready.clone(),
            ready_check,
            None,
            &shutdown,
        )
        .await?;
        match ring {
            Some(ring) => {
                vm::run_sharded(client, driver, config, shutdown, ring).await?;
                info!("shut down; shard Leases released");
            }
            None => {
                vm::run(
                    client,
                    driver,
                    config,
                    shutdown,
                    None::<LeaderElector<LeaseLock>>,
                )
                .await?
            }
        }
        return Ok(());
    }

    let identity = common::holder_identity(args.holder_identity.as_deref());
    let election = LeaderElectionConfig {
        lease_duration: args.lease_duration,
        renew_deadline: args.renew_deadline,
        retry_period: args.retry_period,
        release_on_cancel: true,
        recontend: false,
        name: format!("{namespace}/{}", args.lease_lock_name),
    };
    let lock = LeaseLock::new(client.clone(), &namespace, &args.lease_lock_name, &identity);
    let elector = LeaderElector::new(election, lock).context("invalid leader election settings")?;
    let leader_metrics = kubeloop::leaderelection::LeaderMetricsProvider::new();
    elector.report_metrics_to(&leader_metrics);
    let health = kubeloop::leaderelection::HealthzAdaptor::new(Duration::from_secs(20));
    health.set_leader_election(&elector);
    common::serve_controller_ops(
        &args.ops,
        &client,
        &config.cache_metrics,
        config.ready.clone(),
        ready_check,
        Some((leader_metrics, health)),
        &shutdown,
    )
    .await?;
    info!(identity = %identity, lease = %format!("{namespace}/{}", args.lease_lock_name), "contending for the lease");
    match vm::run(client, driver, config, shutdown, Some(elector)).await {
        Ok(()) => {
            info!("shut down; lease released");
            Ok(())
        }
        Err(VmControllerError::LeadershipLost(reason)) => bail!("leader election lost: {reason:?}"),
        Err(e) => Err(e.into()),
    }
}
