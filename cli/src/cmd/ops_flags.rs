//! The flags every controller binary shares, and starting the servers they ask for.
//!
//! Counterpart: controller-runtime's manager options `Metrics` (`metricsserver.Options`:
//! `BindAddress`, `SecureServing`, `FilterProvider`, `CertDir`/`CertName`/`KeyName`) and
//! `HealthProbeBindAddress`, under the flag names kubebuilder's scaffold gives them
//! (`--metrics-bind-address`, `--metrics-secure`, `--metrics-cert-path`, `--metrics-cert-name`,
//! `--metrics-cert-key`, `--health-probe-bind-address`), plus `--trace ns/name` (see
//! [`kubeloop::trace`]), served on the metrics address.
//! A subcommand adds them with `#[command(flatten)] ops: OpsArgs` and calls [`OpsArgs::serve`].
//!
//! Invariants: `0` (the default) turns a server off; metrics are HTTPS behind TokenReview and
//! SubjectAccessReview unless `--metrics-secure=false` says otherwise (then a warning is
//! logged); `/debug/trace` is served on the metrics server only, behind the same filter; equal
//! addresses share one server (metrics and probes on one port, the probes unauthenticated);
//! every server stops when the given token is cancelled.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

use kubeloop::ops::{
    AuthConfig, Authorizer, CertWatcher, Check, DEFAULT_CERT_POLL_INTERVAL, OpsServer,
    OpsServerError, ServeConfig, ServerLimits,
};

/// The metrics and probe flags.
#[derive(clap::Args, Debug, Clone)]
pub struct OpsArgs {
    /// Serve Prometheus metrics on /metrics (and /debug/trace) at this address, e.g. :8443 or
    /// 127.0.0.1:8443; 0 turns it off.
    #[arg(long, default_value = "0")]
    pub metrics_bind_address: String,
    /// Serve metrics over HTTPS, answering only bearer tokens the apiserver authenticates
    /// (TokenReview) whose user may `get` the path (SubjectAccessReview on the non-resource
    /// URL). --metrics-secure=false serves plain HTTP to anyone (a warning is logged).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, num_args = 0..=1,
          default_missing_value = "true", value_name = "BOOL")]
    pub metrics_secure: bool,
    /// A directory holding the metrics serving certificate and key (e.g. a mounted Secret);
    /// read again when they change. Without it a self-signed pair is generated at start.
    #[arg(long, value_name = "DIR")]
    pub metrics_cert_path: Option<PathBuf>,
    /// The certificate's file name in --metrics-cert-path.
    #[arg(long, default_value = "tls.crt", value_name = "FILE")]
    pub metrics_cert_name: String,
    /// The key's file name in --metrics-cert-path.
    #[arg(long, default_value = "tls.key", value_name = "FILE")]
    pub metrics_cert_key: String,
    /// Serve /healthz and /readyz at this address; 0 turns it off. May equal
    /// --metrics-bind-address to share one server. Also accepted as --health-bind-address.
    #[arg(long, default_value = "0", alias = "health-bind-address")]
    pub health_probe_bind_address: String,
    /// Record the journey of this object (namespace/name) through the controller: watch
    /// event, FIFO, indexer, handlers, workqueue, reconcile, status write. Repeatable. Read it
    /// on the metrics address at /debug/trace?key=namespace/name, or with `kubeloop trace`.
    #[arg(long = "trace", value_name = "NAMESPACE/NAME")]
    pub trace: Vec<String>,
    /// Timeouts, header limit and connection cap of both servers (not flags: the defaults are
    /// controller-runtime's; tests shorten them).
    #[arg(skip)]
    pub limits: ServerLimits,
    /// The authorization caches' lifetimes (controller-runtime's by default).
    #[arg(skip)]
    pub auth: AuthConfig,
    /// How often --metrics-cert-path is read again (10 s, controller-runtime's certwatcher).
    #[arg(skip = DEFAULT_CERT_POLL_INTERVAL)]
    pub cert_poll_interval: Duration,
}

impl Default for OpsArgs {
    fn default() -> Self {
        Self {
            metrics_bind_address: "0".into(),
            metrics_secure: true,
            metrics_cert_path: None,
            metrics_cert_name: "tls.crt".into(),
            metrics_cert_key: "tls.key".into(),
            health_probe_bind_address: "0".into(),
            trace: Vec::new(),
            limits: ServerLimits::default(),
            auth: AuthConfig::default(),
            cert_poll_interval: DEFAULT_CERT_POLL_INTERVAL,
        }
    }
}

/// What [`OpsArgs::serve`] started: the bound addresses (useful with port 0).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Serving {
    /// Where `/metrics` (and `/debug/trace`) is served, if it is.
    pub metrics: Option<SocketAddr>,
    /// Where `/healthz` and `/readyz` are served, if they are.
    pub probes: Option<SocketAddr>,
    /// Whether the metrics server is HTTPS behind TokenReview and SubjectAccessReview.
    pub secure: bool,
}

impl OpsArgs {
    /// Parses both addresses (an error names the flag and the text) and starts the servers.
    /// `registry` is built only if metrics are served; `client` sends the TokenReviews and
    /// SubjectAccessReviews of secure metrics (it needs `create` on both).
    pub async fn serve(
        &self,
        registry: impl FnOnce() -> Registry,
        healthz: Vec<Arc<dyn Check>>,
        readyz: Vec<Arc<dyn Check>>,
        client: Option<kube_client::Client>,
        stop: &CancellationToken,
    ) -> Result<Serving, OpsFlagError> {
        kubeloop::trace::follow(&self.trace).map_err(|e| OpsFlagError {
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
        let mut metrics_config = ServeConfig {
            limits: self.limits,
            ..Default::default()
        };
        let mut serving = Serving::default();
        if metrics.is_some() {
            metrics_config.registry = Some(Arc::new(registry()));
            metrics_config.trace = true;
            if self.metrics_secure {
                self.secure(&mut metrics_config, client, stop)?;
                serving.secure = true;
            } else {
                tracing::warn!(
                    addr = %self.metrics_bind_address,
                    "--metrics-secure=false: /metrics and /debug/trace are served over plain HTTP \
                     to anyone who can reach the address"
                );
            }
        }
        match (metrics, probes) {
            (Some(m), Some(p)) if m == p => {
                let config = ServeConfig {
                    healthz,
                    readyz,
                    ..metrics_config
                };
                let server = start("--metrics-bind-address", m, config, stop).await?;
                serving.metrics = Some(server);
                serving.probes = Some(server);
            }
            (m, p) => {
                if let Some(m) = m {
                    serving.metrics =
                        Some(start("--metrics-bind-address", m, metrics_config, stop).await?);
                }
                if let Some(p) = p {
                    let config = ServeConfig {
                        healthz,
                        readyz,
                        limits: self.limits,
                        ..Default::default()
                    };
                    serving.probes =
                        Some(start("--health-probe-bind-address", p, config, stop).await?);
                }
            }
        }
        Ok(serving)
    }

    /// HTTPS with the given or a generated pair, and the TokenReview/SubjectAccessReview filter.
    fn secure(
        &self,
        config: &mut ServeConfig,
        client: Option<kube_client::Client>,
        stop: &CancellationToken,
    ) -> Result<(), OpsFlagError> {
        let client = client.ok_or(OpsFlagError {
            flag: "--metrics-secure",
            source: OpsServerError::NoClient,
        })?;
        let cert_error = |e: kubeloop::ops::TlsError| OpsFlagError {
            flag: "--metrics-cert-path",
            source: e.into(),
        };
        let watcher = match &self.metrics_cert_path {
            Some(dir) => {
                let watcher = CertWatcher::from_files(
                    &dir.join(&self.metrics_cert_name),
                    &dir.join(&self.metrics_cert_key),
                )
                .map_err(cert_error)?;
                watcher.watch(self.cert_poll_interval, stop.clone());
                watcher
            }
            None => CertWatcher::self_signed().map_err(cert_error)?,
        };
        config.tls = Some(watcher.server_config().map_err(cert_error)?);
        config.auth = Some(Arc::new(Authorizer::new(client, self.auth)));
        Ok(())
    }
}

async fn start(
    flag: &'static str,
    addr: SocketAddr,
    config: ServeConfig,
    stop: &CancellationToken,
) -> Result<SocketAddr, OpsFlagError> {
    let https = config.tls.is_some();
    let server = OpsServer::start(addr, config, stop.clone())
        .await
        .map_err(|source| OpsFlagError { flag, source })?;
    tracing::info!(flag, addr = %server.addr(), https, "serving metrics / probes");
    Ok(server.addr())
}

/// A flag's value could not be used.
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

    use super::*;
    use kubeloop::ops::CheckFn;

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
            metrics_secure: false,
            ..Default::default()
        };
        let stop = CancellationToken::new();
        let serving = args
            .serve(registry, checks(), checks(), None, &stop)
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
            metrics_secure: false,
            ..Default::default()
        };
        let stop = CancellationToken::new();
        let serving = args
            .serve(registry, checks(), checks(), None, &stop)
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
                None,
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
            .serve(
                registry,
                checks(),
                checks(),
                None,
                &CancellationToken::new(),
            )
            .await
            .unwrap_err();
        assert!(
            err.to_string().starts_with("--metrics-bind-address: "),
            "{err}"
        );
        assert!(err.to_string().contains("\"localhost\""), "{err}");
    }
    #[test]
    fn metrics_are_secure_unless_turned_off_go_style() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            ops: OpsArgs,
        }
        let parse = |args: &[&str]| Cli::try_parse_from(args).unwrap().ops;
        assert!(parse(&["x"]).metrics_secure);
        assert!(
            OpsArgs::default().metrics_secure,
            "Default agrees with the flag"
        );
        assert!(parse(&["x", "--metrics-secure"]).metrics_secure);
        assert!(!parse(&["x", "--metrics-secure=false"]).metrics_secure);
        assert!(!parse(&["x", "--metrics-secure", "false"]).metrics_secure);
        let certs = parse(&["x", "--metrics-cert-path", "/certs"]);
        assert_eq!(
            (
                certs.metrics_cert_path.as_deref(),
                certs.metrics_cert_name.as_str(),
                certs.metrics_cert_key.as_str()
            ),
            (Some(std::path::Path::new("/certs")), "tls.crt", "tls.key")
        );
    }

    #[tokio::test]
    async fn secure_metrics_without_a_client_or_with_a_missing_certificate_name_their_flag() {
        let args = OpsArgs {
            metrics_bind_address: "127.0.0.1:0".into(),
            ..Default::default()
        };
        let stop = CancellationToken::new();
        let err = args
            .serve(registry, checks(), checks(), None, &stop)
            .await
            .unwrap_err();
        assert_eq!(err.flag, "--metrics-secure");
        assert!(err.to_string().contains("--metrics-secure=false"), "{err}");

        let client = kube_client::Client::try_from(kube_client::Config::new(
            "https://127.0.0.1:1".parse().unwrap(),
        ))
        .unwrap();
        let args = OpsArgs {
            metrics_bind_address: "127.0.0.1:0".into(),
            metrics_cert_path: Some("/nonexistent-certs".into()),
            ..Default::default()
        };
        let err = args
            .serve(registry, checks(), checks(), Some(client), &stop)
            .await
            .unwrap_err();
        assert_eq!(err.flag, "--metrics-cert-path");
        assert!(
            err.to_string().contains("/nonexistent-certs/tls.crt"),
            "{err}"
        );
        stop.cancel();
    }
}
