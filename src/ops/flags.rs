//! The two flags every controller binary shares, and starting the servers they ask for.
//!
//! Counterpart: controller-runtime's manager options `MetricsBindAddress` /
//! `HealthProbeBindAddress` (flags `--metrics-bind-address`, `--health-probe-bind-address`),
//! plus `--trace ns/name` (see [`crate::trace`]), served on the metrics address.
//! A subcommand adds them with `#[command(flatten)] ops: OpsArgs` and calls [`OpsArgs::serve`].
//!
//! Invariants: `0` (the default) turns a server off; equal addresses share one server (metrics
//! and probes on one port); every server stops when the given token is cancelled.

use std::net::SocketAddr;
use std::sync::Arc;

use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

use super::server::{Check, OpsServer, OpsServerError, ServeConfig};

/// `--metrics-bind-address` and `--health-probe-bind-address`.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct OpsArgs {
    /// Serve Prometheus metrics on /metrics at this address, e.g. :8080 or 127.0.0.1:8080;
    /// 0 turns it off.
    #[arg(long, default_value = "0")]
    pub metrics_bind_address: String,
    /// Serve /healthz and /readyz at this address; 0 turns it off. May equal
    /// --metrics-bind-address to share one server. Also accepted as --health-bind-address.
    #[arg(long, default_value = "0", alias = "health-bind-address")]
    pub health_probe_bind_address: String,
    /// Record the journey of this object (namespace/name) through the controller: watch
    /// event, FIFO, indexer, handlers, workqueue, reconcile, status write. Repeatable. Read it
    /// on the metrics address at /debug/trace?key=namespace/name, or with `kubeloop trace`.
    #[arg(long = "trace", value_name = "NAMESPACE/NAME")]
    pub trace: Vec<String>,
}

/// What [`OpsArgs::serve`] started: the bound addresses (useful with port 0).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Serving {
    /// Where `/metrics` (and `/debug/trace`) is served, if it is.
    pub metrics: Option<SocketAddr>,
    /// Where `/healthz` and `/readyz` are served, if they are.
    pub probes: Option<SocketAddr>,
}

impl OpsArgs {
    /// Parses both addresses (an error names the flag and the text) and starts the servers.
    /// `registry` is built only if metrics are served.
    pub async fn serve(
        &self,
        registry: impl FnOnce() -> Registry,
        healthz: Vec<Arc<dyn Check>>,
        readyz: Vec<Arc<dyn Check>>,
        stop: &CancellationToken,
    ) -> Result<Serving, OpsFlagError> {
        crate::trace::follow(&self.trace).map_err(|e| OpsFlagError {
            flag: "--trace",
            source: e.into(),
        })?;
        let metrics =
            OpsServer::parse_bind_address(&self.metrics_bind_address).map_err(|source| {
                OpsFlagError {
                    flag: "--metrics-bind-address",
                    source,
                }
            })?;
        let probes =
            OpsServer::parse_bind_address(&self.health_probe_bind_address).map_err(|source| {
                OpsFlagError {
                    flag: "--health-probe-bind-address",
                    source,
                }
            })?;
        let registry = metrics.map(|_| Arc::new(registry()));
        let mut serving = Serving::default();
        match (metrics, probes) {
            (Some(m), Some(p)) if m == p => {
                let server = start(
                    "--metrics-bind-address",
                    m,
                    ServeConfig {
                        registry,
                        healthz,
                        readyz,
                    },
                    stop,
                )
                .await?;
                serving = Serving {
                    metrics: Some(server),
                    probes: Some(server),
                };
            }
            (m, p) => {
                if let Some(m) = m {
                    let config = ServeConfig {
                        registry,
                        ..Default::default()
                    };
                    serving.metrics = Some(start("--metrics-bind-address", m, config, stop).await?);
                }
                if let Some(p) = p {
                    let config = ServeConfig {
                        registry: None,
                        healthz,
                        readyz,
                    };
                    serving.probes =
                        Some(start("--health-probe-bind-address", p, config, stop).await?);
                }
            }
        }
        Ok(serving)
    }
}

async fn start(
    flag: &'static str,
    addr: SocketAddr,
    config: ServeConfig,
    stop: &CancellationToken,
) -> Result<SocketAddr, OpsFlagError> {
    let server = OpsServer::start(addr, config, stop.clone())
        .await
        .map_err(|source| OpsFlagError { flag, source })?;
    tracing::info!(flag, addr = %server.addr(), "serving metrics / probes");
    Ok(server.addr())
}

/// A flag's address could not be parsed or bound.
#[derive(Debug, thiserror::Error)]
#[error("{flag}: {source}")]
pub struct OpsFlagError {
    /// The flag at fault.
    pub flag: &'static str,
    /// What is wrong with it.
    #[source]
    pub source: OpsServerError,
}

#[cfg(test)]
mod tests {
    use prometheus_client::metrics::gauge::Gauge;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::super::server::CheckFn;
    use super::*;

    async fn status(addr: SocketAddr, path: &str) -> u16 {
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        stream
            .write_all(
                format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
            )
            .await
            .unwrap();
        let mut raw = String::new();
        stream.read_to_string(&mut raw).await.unwrap();
        raw[9..12].parse().unwrap()
    }

    fn registry() -> Registry {
        let mut registry = Registry::default();
        registry.register("kubeloop_test_up", "Up", Gauge::<i64>::default());
        registry
    }

    fn checks() -> Vec<Arc<dyn Check>> {
        vec![Arc::new(CheckFn::new("ping", || Ok(())))]
    }

    #[tokio::test]
    async fn equal_addresses_share_one_server_with_every_path() {
        let args = OpsArgs {
            metrics_bind_address: "127.0.0.1:0".into(),
            health_probe_bind_address: "127.0.0.1:0".into(),
            ..Default::default()
        };
        let stop = CancellationToken::new();
        let serving = args
            .serve(registry, checks(), checks(), &stop)
            .await
            .unwrap();
        assert_eq!(serving.metrics, serving.probes);
        let addr = serving.metrics.unwrap();
        for path in ["/metrics", "/healthz", "/readyz"] {
            assert_eq!(status(addr, path).await, 200, "{path}");
        }
        stop.cancel();
    }

    #[tokio::test]
    async fn distinct_addresses_split_metrics_from_probes_and_zero_turns_one_off() {
        let args = OpsArgs {
            metrics_bind_address: "127.0.0.1:0".into(),
            health_probe_bind_address: "0".into(),
            ..Default::default()
        };
        let stop = CancellationToken::new();
        let serving = args
            .serve(registry, checks(), checks(), &stop)
            .await
            .unwrap();
        assert_eq!(serving.probes, None);
        let metrics = serving.metrics.unwrap();
        assert_eq!(status(metrics, "/metrics").await, 200);
        assert_eq!(
            status(metrics, "/healthz").await,
            404,
            "probes are not on the metrics server"
        );

        let port_taken = metrics.to_string();
        let args = OpsArgs {
            metrics_bind_address: "0".into(),
            health_probe_bind_address: port_taken.clone(),
            ..Default::default()
        };
        let err = args
            .serve(
                || panic!("no metrics server, so no registry is built"),
                checks(),
                checks(),
                &stop,
            )
            .await
            .unwrap_err();
        assert_eq!(err.flag, "--health-probe-bind-address");
        assert!(err.to_string().contains(&port_taken), "{err}");
        stop.cancel();
    }

    #[test]
    fn the_flags_parse_with_their_defaults_and_the_short_health_alias() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            ops: OpsArgs,
        }
        let defaults = Cli::try_parse_from(["x"]).unwrap().ops;
        assert_eq!(
            (
                defaults.metrics_bind_address.as_str(),
                defaults.health_probe_bind_address.as_str()
            ),
            ("0", "0")
        );
        let cli = Cli::try_parse_from([
            "x",
            "--metrics-bind-address",
            ":8080",
            "--health-bind-address",
            ":8081",
        ])
        .unwrap();
        assert_eq!(cli.ops.metrics_bind_address, ":8080");
        assert_eq!(cli.ops.health_probe_bind_address, ":8081");
    }

    #[tokio::test]
    async fn a_bad_address_names_its_flag() {
        let args = OpsArgs {
            metrics_bind_address: "localhost".into(),
            health_probe_bind_address: "0".into(),
            ..Default::default()
        };
        let err = args
            .serve(registry, checks(), checks(), &CancellationToken::new())
            .await
            .unwrap_err();
        assert!(
            err.to_string().starts_with("--metrics-bind-address: "),
            "{err}"
        );
        assert!(err.to_string().contains("\"localhost\""), "{err}");
    }
}
