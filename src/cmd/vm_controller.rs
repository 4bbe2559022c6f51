//! `kubeloop vm-controller`: controller101's `cmd/main.go` with its flags, on kubeloop's stack.
//!
//! Leader election (on by default) wraps the controller: only the holder of the Lease
//! `--lease-lock-namespace/--lease-lock-name` runs it. SIGINT / SIGTERM stop the controller
//! (workers drained), release the Lease so a standby takes over at once, and exit 0. Losing
//! the Lease exits 1 (the process manager restarts it; client-go's `Run` also does not
//! re-contend).
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
use kubeloop::controller::vm::driver::{DockerDriver, DockerDriverConfig, Driver, FakeDriver};
use kubeloop::controller::vm::{self, VmControllerConfig};
use kubeloop::leaderelection::{
    LeaderCallbacks, LeaderElectionConfig, LeaderElector, LeaseLock, StopReason,
};
use tokio_util::sync::CancellationToken;
use tracing::{error, info};

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
    /// Where VMs run: docker ($DOCKER_HOST, default unix:///run/kubeloop/podman.sock) or fake (in memory).
    #[arg(long, value_enum, default_value_t = VmDriver::Docker)]
    pub vm_driver: VmDriver,
    /// How often the usage of Active VMs is refreshed (e.g. 20s, 500ms, 1m30s).
    #[arg(long, default_value = "20s", value_name = "DURATION", value_parser = common::duration::positive)]
    pub refresh_interval: Duration,
    /// Only watch VMs in this namespace (default: all namespaces).
    #[arg(long)]
    pub namespace: Option<String>,
    #[command(flatten)]
    pub ops: kubeloop::ops::OpsArgs,
}

/// `--vm-driver`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum VmDriver {
    Docker,
    Fake,
}

/// Runs the controller until a signal (or a lost lease).
pub async fn run(args: Args) -> anyhow::Result<()> {
    // Handlers first, before any await: a SIGTERM during start-up must stop us cleanly.
    let shutdown = common::shutdown_on_signals().context("installing SIGINT/SIGTERM handlers")?;
    let client = args.cluster.client().await?;
    let config = VmControllerConfig {
        workers: args.threads.max(1),
        refresh_interval: args.refresh_interval,
        namespace: args.namespace.clone(),
        cache_metrics: kubeloop::cache::CacheMetrics::default(),
        ready: Default::default(),
    };
    match args.vm_driver {
        VmDriver::Docker => {
            run_with(
                args,
                client,
                DockerDriver::new(DockerDriverConfig::from_env()),
                config,
                shutdown,
            )
            .await
        }
        VmDriver::Fake => run_with(args, client, FakeDriver::new(), config, shutdown).await,
    }
}

async fn run_with<D: Driver + Clone>(
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

    if !args.leader_elect {
        serve_ops(&args, &config, None, || false, &shutdown).await?;
        vm::run(client, driver, config, shutdown, None).await?;
        return Ok(());
    }

    let identity = common::holder_identity(args.holder_identity.as_deref());
    let namespace = args
        .lease_lock_namespace
        .clone()
        .or_else(|| {
            std::env::var("POD_NAMESPACE")
                .ok()
                .filter(|s| !s.is_empty())
        })
        .unwrap_or_else(|| "default".to_string());
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
    let standby = elector.clone();
    serve_ops(&args, &config, Some((leader_metrics, health)), move || !standby.is_leader(), &shutdown).await?;
    info!(identity = %identity, lease = %format!("{namespace}/{}", args.lease_lock_name), "contending for the lease");

    let me = identity.clone();
    let callbacks = LeaderCallbacks::new(
        move |ctx| {
            let (client, driver, config) = (client.clone(), driver.clone(), config.clone());
            async move {
                info!("became the leader; starting the controller");
                if let Err(e) =
                    vm::run(client, driver, config, ctx.token().clone(), Some(ctx)).await
                {
                    error!(error = %e, "the controller stopped with an error");
                }
            }
        },
        || info!("stopped leading"),
    )
    .on_new_leader(move |holder| {
        if holder != me {
            info!(leader = %holder, "new leader elected");
        }
    });
    match elector.run(callbacks, shutdown).await {
        StopReason::Shutdown => {
            info!("shut down; lease released");
            Ok(())
        }
        other => bail!("leader election lost: {other:?}"),
    }
}

/// `--metrics-bind-address` / `--health-probe-bind-address`: workqueue, reflector/informer,
/// reconcile and leader-election series; /healthz with the leaderElection check.
async fn serve_ops(
    args: &Args,
    config: &VmControllerConfig,
    leader: Option<(kubeloop::leaderelection::LeaderMetricsProvider, kubeloop::leaderelection::HealthzAdaptor)>,
    leader_is_standby: impl Fn() -> bool + Send + Sync + 'static,
    shutdown: &CancellationToken,
) -> anyhow::Result<()> {
    use kubeloop::ops::{Check, CheckFn};
    use std::sync::Arc;
    let mut healthz: Vec<Arc<dyn Check>> = vec![Arc::new(CheckFn::new("ping", || Ok(())))];
    let metrics = leader.as_ref().map(|(m, _)| m.clone());
    let cache_metrics = config.cache_metrics.clone();
    if let Some((_, health)) = leader {
        healthz.push(Arc::new(health));
    }
    // A standby runs no informer, so it is ready by standing by; the leader (or a controller
    // without leader election) is ready once its informer has synced.
    let ready = config.ready.clone();
    let standby = leader_is_standby;
    let readyz: Vec<Arc<dyn Check>> = vec![Arc::new(CheckFn::new("informer-sync", move || {
        if ready.load(std::sync::atomic::Ordering::SeqCst) || standby() {
            Ok(())
        } else {
            Err("the VirtualMachine informer has not synced".into())
        }
    }))];
    args.ops
        .serve(
            || {
                let mut registry = prometheus_client::registry::Registry::default();
                kubeloop::workqueue::MetricsProvider::global().register(&mut registry);
                kubeloop::ops::ReconcileMetrics::global().register(&mut registry);
                cache_metrics.register(&mut registry);
                if let Some(m) = &metrics {
                    m.register(&mut registry);
                }
                registry
            },
            healthz,
            readyz,
            shutdown,
        )
        .await?;
    Ok(())
}
