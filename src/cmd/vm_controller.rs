//! `kubeloop vm-controller`: controller101's `cmd/main.go` with its flags, on kubeloop's stack.
//!
//! Leader election (on by default) wraps the controller: only the holder of the Lease
//! `--lease-lock-namespace/--lease-lock-name` runs it. SIGINT / SIGTERM stop the controller
//! (workers drained), release the Lease so a standby takes over at once, and exit 0. Losing
//! the Lease exits 1 (the process manager restarts it; client-go's `Run` also does not
//! re-contend).
//!
//! Differences from controller101 on purpose: the holder identity is never empty ($POD_NAME,
//! then the hostname, else an error); `--refresh-interval` drives the usage refresh; the
//! driver's engine is `$DOCKER_HOST` (default hack/setup-podman's socket).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::{ArgAction, ValueEnum};
use kube_client::Client;
use kube_client::config::{KubeConfigOptions, Kubeconfig};
use kubeloop::controller::vm::driver::{DockerDriver, DockerDriverConfig, Driver, FakeDriver};
use kubeloop::controller::vm::{self, VmControllerConfig};
use kubeloop::leaderelection::{
    LeaderCallbacks, LeaderElectionConfig, LeaderElector, LeaseLock, StopReason,
};
use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;
use tracing::{error, info};

/// Flags of `kubeloop vm-controller`.
#[derive(clap::Args, Debug)]
#[command(version)]
pub struct Args {
    /// Kubeconfig file (default: $KUBECONFIG, ~/.kube/config, or in-cluster).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// Number of worker threads reconciling VMs concurrently.
    #[arg(long, default_value_t = 2)]
    pub threads: usize,
    /// Run under leader election (`--leader-elect=false` to run unconditionally).
    #[arg(long, default_value_t = true, action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub leader_elect: bool,
    /// Identity written into the Lease (default: $POD_NAME, then the hostname).
    #[arg(long)]
    pub holder_identity: Option<String>,
    /// Name of the Lease.
    #[arg(long, default_value = "controller101")]
    pub lease_lock_name: String,
    /// Namespace of the Lease (default: $POD_NAMESPACE, then "default").
    #[arg(long)]
    pub lease_lock_namespace: Option<String>,
    /// Lease duration (seconds).
    #[arg(long, default_value = "15s", value_parser = parse_duration)]
    pub lease_duration: Duration,
    /// How long the leader retries renewing before it gives up.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub renew_deadline: Duration,
    /// Interval between election attempts.
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    pub retry_period: Duration,
    /// Where VMs run: docker ($DOCKER_HOST, default unix:///run/kubeloop/podman.sock) or fake (in memory).
    #[arg(long, value_enum, default_value_t = VmDriver::Docker)]
    pub vm_driver: VmDriver,
    /// How often the usage of Active VMs is refreshed (e.g. 20s, 500ms).
    #[arg(long, default_value = "20s", value_parser = parse_duration)]
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
    let client = client(args.kubeconfig.as_deref()).await?;
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
            )
            .await
        }
        VmDriver::Fake => run_with(args, client, FakeDriver::new(), config).await,
    }
}

async fn run_with<D: Driver + Clone>(
    args: Args,
    client: Client,
    driver: D,
    config: VmControllerConfig,
) -> anyhow::Result<()> {
    let shutdown = CancellationToken::new();
    stop_on_signals(shutdown.clone())?;
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

    let identity = holder_identity(args.holder_identity.as_deref())?;
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

async fn client(kubeconfig: Option<&std::path::Path>) -> anyhow::Result<Client> {
    let config = match kubeconfig {
        Some(path) => {
            let file = Kubeconfig::read_from(path)
                .with_context(|| format!("reading kubeconfig {}", path.display()))?;
            kube_client::Config::from_custom_kubeconfig(file, &KubeConfigOptions::default())
                .await
                .with_context(|| format!("loading kubeconfig {}", path.display()))?
        }
        None => kube_client::Config::infer()
            .await
            .context("finding a kubeconfig (use --kubeconfig)")?,
    };
    Client::try_from(config).context("building the Kubernetes client")
}

fn stop_on_signals(shutdown: CancellationToken) -> anyhow::Result<()> {
    let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    tokio::spawn(async move {
        tokio::select! {
            _ = term.recv() => info!("SIGTERM: stopping"),
            _ = int.recv() => info!("SIGINT: stopping"),
        }
        shutdown.cancel();
    });
    Ok(())
}

/// `--holder-identity`, else $POD_NAME, else the hostname; never empty.
fn holder_identity(flag: Option<&str>) -> anyhow::Result<String> {
    let candidates = [
        flag.map(str::to_string),
        std::env::var("POD_NAME").ok(),
        hostname(),
    ];
    match candidates
        .into_iter()
        .flatten()
        .map(|s| s.trim().to_string())
        .find(|s| !s.is_empty())
    {
        Some(identity) => Ok(identity),
        None => bail!(
            "no leader-election identity: --holder-identity, $POD_NAME and the hostname are all empty"
        ),
    }
}

fn hostname() -> Option<String> {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most buf.len() bytes into the buffer we own.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return None;
    }
    let end = buf.iter().position(|b| *b == 0).unwrap_or(buf.len());
    String::from_utf8(buf[..end].to_vec()).ok()
}

/// `20s`, `500ms`, `2m`, or plain seconds (`20`).
fn parse_duration(value: &str) -> Result<Duration, String> {
    let value = value.trim();
    let (number, unit) = match value.find(|c: char| !(c.is_ascii_digit() || c == '.')) {
        Some(i) => value.split_at(i),
        None => (value, "s"),
    };
    let n: f64 = number
        .parse()
        .map_err(|_| format!("{value:?} is not a duration like 20s or 500ms"))?;
    let seconds = match unit {
        "ms" => n / 1000.0,
        "s" => n,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        _ => {
            return Err(format!(
                "{value:?}: unknown unit {unit:?} (use ms, s, m or h)"
            ));
        }
    };
    if !(seconds > 0.0 && seconds.is_finite()) {
        return Err(format!("{value:?} must be greater than zero"));
    }
    Ok(Duration::from_secs_f64(seconds))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_with_units_and_refuse_zero_and_garbage() {
        assert_eq!(parse_duration("20s"), Ok(Duration::from_secs(20)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("3"), Ok(Duration::from_secs(3)));
        assert!(parse_duration("0s").is_err());
        assert!(parse_duration("fast").is_err());
        assert!(parse_duration("5d").is_err());
    }

    #[test]
    fn the_identity_is_the_flag_then_never_empty() {
        assert_eq!(holder_identity(Some("pod-a")).unwrap(), "pod-a");
        let fallback = holder_identity(Some("  ")).unwrap();
        assert!(!fallback.trim().is_empty());
    }
}
