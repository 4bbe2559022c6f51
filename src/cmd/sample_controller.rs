//! `kubeloop sample-controller`: sample-controller's main.go. Flags as there (`--kubeconfig`,
//! `--master`) plus `--workers`, `--resync`, `--namespace` and controller-runtime's
//! `--metrics-bind-address` / `--health-probe-bind-address`; in-cluster configuration when neither
//! `--kubeconfig` nor `--master` is given. SIGINT/SIGTERM drain the queue and stop; a second
//! signal exits at once with status 1 (client-go's `SetupSignalHandler`).

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use anyhow::Context;
use kube_client::config::{KubeConfigOptions, Kubeconfig};
use kube_client::{Client, Config};
use kubeloop::controller::sample::{ControllerConfig, run as run_controller};
use kubeloop::ops::{Check, CheckFn, OpsServer, ServeConfig};
use kubeloop::workqueue::MetricsProvider;
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Path to a kubeconfig. Only required if out-of-cluster.
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// The address of the Kubernetes API server. Overrides any value in kubeconfig. Only
    /// required if out-of-cluster.
    #[arg(long)]
    master: Option<String>,
    /// Foos synced at once.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u16).range(1..))]
    workers: u16,
    /// Watch one namespace only (default: all namespaces, as sample-controller does).
    #[arg(long)]
    namespace: Option<String>,
    /// Serve Prometheus metrics (workqueue and informer series) on /metrics at this address,
    /// e.g. :8080 or 127.0.0.1:8080; 0 turns it off.
    #[arg(long, default_value = "0")]
    metrics_bind_address: String,
    /// Serve /healthz and /readyz (ready once the caches synced) at this address; 0 turns it
    /// off. May equal --metrics-bind-address to share one server.
    #[arg(long, default_value = "0")]
    health_probe_bind_address: String,
    /// Informer resync period, e.g. 30s, 5m, 1m30s; 0 turns resyncs off.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    resync: Duration,
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    // Handlers first, before any await: a SIGTERM during start-up must stop us cleanly.
    let shutdown = CancellationToken::new();
    let signals = install_signal_handlers().context("installing SIGINT/SIGTERM handlers")?;
    tokio::spawn(handle_signals(signals, shutdown.clone()));
    let config = client_config(&args).await?;
    let client = Client::try_from(config).context("building the Kubernetes client")?;
    let config = ControllerConfig {
        workers: usize::from(args.workers),
        resync: args.resync,
        namespace: args.namespace.clone(),
        ..Default::default()
    };
    start_ops_servers(&args, &config, &shutdown).await?;
    run_controller(client, config, shutdown)
        .await
        .context("running the sample controller")?;
    Ok(())
}

/// `/metrics`, `/healthz` and `/readyz`, on one server or two, if asked for.
async fn start_ops_servers(
    args: &Args,
    config: &ControllerConfig,
    shutdown: &CancellationToken,
) -> anyhow::Result<()> {
    let metrics_addr = OpsServer::parse_bind_address(&args.metrics_bind_address)
        .context("--metrics-bind-address")?;
    let probe_addr = OpsServer::parse_bind_address(&args.health_probe_bind_address)
        .context("--health-probe-bind-address")?;
    let registry = metrics_addr.map(|_| {
        let mut registry = Registry::default();
        MetricsProvider::global().register(&mut registry);
        kubeloop::ops::ReconcileMetrics::global().register(&mut registry);
        config.cache_metrics.register(&mut registry);
        Arc::new(registry)
    });
    let ready = config.ready.clone();
    let healthz: Vec<Arc<dyn Check>> = vec![Arc::new(CheckFn::new("ping", || Ok(())))];
    let readyz: Vec<Arc<dyn Check>> = vec![Arc::new(CheckFn::new("informers-synced", move || {
        if ready.load(Ordering::SeqCst) {
            Ok(())
        } else {
            Err("caches not synced yet, or shutting down".to_string())
        }
    }))];
    let mut servers = Vec::new();
    match (metrics_addr, probe_addr) {
        (Some(m), Some(p)) if m == p => {
            servers.push((
                m,
                ServeConfig {
                    registry,
                    healthz,
                    readyz,
                },
            ));
        }
        (m, p) => {
            if let Some(m) = m {
                servers.push((
                    m,
                    ServeConfig {
                        registry,
                        ..Default::default()
                    },
                ));
            }
            if let Some(p) = p {
                servers.push((
                    p,
                    ServeConfig {
                        registry: None,
                        healthz,
                        readyz,
                    },
                ));
            }
        }
    }
    for (addr, serve) in servers {
        let server = OpsServer::start(addr, serve, shutdown.clone()).await?;
        tracing::info!(addr = %server.addr(), "serving metrics / probes");
    }
    Ok(())
}

/// client-go's `clientcmd.BuildConfigFromFlags(master, kubeconfig)`.
async fn client_config(args: &Args) -> anyhow::Result<Config> {
    let mut config = match (&args.kubeconfig, &args.master) {
        (Some(path), _) => {
            let kubeconfig = Kubeconfig::read_from(path)
                .with_context(|| format!("reading kubeconfig {}", path.display()))?;
            Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
                .await
                .with_context(|| format!("loading kubeconfig {}", path.display()))?
        }
        (None, Some(master)) => Config::new(
            master
                .parse()
                .with_context(|| format!("--master {master:?} is not a URL"))?,
        ),
        (None, None) => {
            tracing::warn!(
                "neither --kubeconfig nor --master was given; using the in-cluster configuration"
            );
            Config::incluster()
                .context("in-cluster configuration (outside a Pod, pass --kubeconfig)")?
        }
    };
    if let (Some(_), Some(master)) = (&args.kubeconfig, &args.master) {
        config.cluster_url = master
            .parse()
            .with_context(|| format!("--master {master:?} is not a URL"))?;
    }
    Ok(config)
}

struct Signals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

impl Signals {
    async fn next(&mut self) -> &'static str {
        tokio::select! {
            _ = self.term.recv() => "SIGTERM",
            _ = self.int.recv() => "SIGINT",
        }
    }
}

fn install_signal_handlers() -> std::io::Result<Signals> {
    use tokio::signal::unix::{SignalKind, signal};
    Ok(Signals {
        term: signal(SignalKind::terminate())?,
        int: signal(SignalKind::interrupt())?,
    })
}

/// First SIGINT/SIGTERM cancels `shutdown`; a second one exits the process at once.
async fn handle_signals(mut signals: Signals, shutdown: CancellationToken) {
    let first = signals.next().await;
    tracing::info!(
        signal = first,
        "shutting down: finishing queued work (send another signal to exit at once)"
    );
    shutdown.cancel();
    let second = signals.next().await;
    eprintln!("received {second} again, exiting at once");
    std::process::exit(1);
}

/// Parses Go-style durations: `30s`, `5m`, `1m30s`, `500ms`, `2h`, or `0`.
fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    if text == "0" {
        return Ok(Duration::ZERO);
    }
    let bad = || format!("invalid duration {text:?}: want e.g. 30s, 5m, 1m30s, 500ms");
    let mut total = Duration::ZERO;
    let mut rest = text;
    if rest.is_empty() {
        return Err(bad());
    }
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit() && c != '.')
            .unwrap_or(rest.len());
        if digits == 0 {
            return Err(bad());
        }
        let number: f64 = rest[..digits].parse().map_err(|_| bad())?;
        rest = &rest[digits..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(rest.len());
        let seconds_per_unit = match &rest[..unit_len] {
            "ms" => 0.001,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return Err(bad()),
        };
        rest = &rest[unit_len..];
        total += Duration::try_from_secs_f64(number * seconds_per_unit).map_err(|_| bad())?;
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_style_durations_parse() {
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2h"), Ok(Duration::from_secs(7200)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
    }

    #[test]
    fn bad_durations_are_refused_with_the_text_in_the_message() {
        for bad in ["", "30", "s", "30x", "1m30", "-5s"] {
            let err = parse_duration(bad).unwrap_err();
            assert!(err.contains(&format!("{bad:?}")), "{bad}: {err}");
        }
    }
}
