//! `kubeloop trace`: prints one object's journey through a running controller, read from that
//! controller's metrics server (`/debug/trace`). The controller must have been started with
//! `--trace namespace/name` and `--metrics-bind-address`. Its default secure server is read with
//! `--ops-address https://HOST:PORT --token TOKEN` (a token whose user may `get`
//! `/debug/trace`, e.g. bound to deploy/'s `kubeloop:metrics-reader`) and the server's CA
//! (`--certificate-authority`) or `--insecure-skip-tls-verify` for its self-signed certificate;
//! a server started with `--metrics-secure=false` with `--ops-address HOST:PORT`.
//! See `kubeloop::trace`.
//!
//! `kubeloop trace --serve` serves the journey page (`kubeloop::ops`' `/debug/journey`, the
//! same page and server) on a local port instead, with its data read through from the
//! controller (same flags), from several controllers on one page (`--ops-address` given more
//! than once: `merged.rs`), or from a saved `kubeloop trace --json` file (`--file`).

mod merged;

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, bail};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio_rustls::rustls;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The object's key, namespace/name (name alone for a cluster-scoped object). With
    /// --serve: the one key to show (all followed keys without it); with --file, the name the
    /// saved steps are shown under.
    #[arg(required_unless_present = "serve")]
    key: Option<String>,
    /// The controller's metrics address (its --metrics-bind-address): https://host:port for
    /// its default secure server; host:port or :port for one run with --metrics-secure=false.
    /// With --serve, give it once per controller to see several on one page (the token and
    /// TLS flags apply to each).
    #[arg(long, default_value = "127.0.0.1:8080")]
    ops_address: Vec<String>,
    /// A bearer token for a secure server (`kubectl create token SA`); its user needs `get` on
    /// /debug/trace (deploy/'s kubeloop:metrics-reader role).
    #[arg(long, env = "KUBELOOP_TRACE_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// The PEM CA that signed the server's certificate (its --metrics-cert-path pair).
    #[arg(long, value_name = "FILE")]
    certificate_authority: Option<PathBuf>,
    /// Accept any server certificate (the self-signed one a controller generates by default).
    #[arg(long)]
    insecure_skip_tls_verify: bool,
    /// Show the informer steps of this kind only (e.g. vm, Foo, Deployment); queue and
    /// reconcile steps are always shown.
    #[arg(long)]
    kind: Option<String>,
    /// Print the recorded steps as JSON instead of a table.
    #[arg(long, conflicts_with = "serve")]
    json: bool,
    /// Serve the journey page (/debug/journey) on --listen instead of printing, until Ctrl-C.
    #[arg(long)]
    serve: bool,
    /// With --serve: the local address to serve the page on (port 0 picks a free one).
    #[arg(long, default_value = "127.0.0.1:8090", requires = "serve")]
    listen: String,
    /// With --serve: show this saved `kubeloop trace --json` output instead of a controller's.
    #[arg(long, value_name = "FILE", requires = "serve")]
    file: Option<PathBuf>,
}

/// The controller's ops server, as `--ops-address` and its TLS flags name it.
#[derive(Clone)]
struct Controller {
    address: String,
    tls: Option<Arc<rustls::ClientConfig>>,
    token: Option<String>,
}

impl Controller {
    /// The controller at `ops_address` (one of `--ops-address`), with the flags' TLS and token.
    fn new(ops_address: &str, args: &Args) -> anyhow::Result<Self> {
        let (tls, address) = match ops_address.strip_prefix("https://") {
            Some(rest) => (Some(tls_config(args)?), rest.trim_end_matches('/')),
            None => (None, ops_address),
        };
        let address = match address.strip_prefix(':') {
            Some(port) => format!("127.0.0.1:{port}"),
            None => address.to_string(),
        };
        Ok(Self {
            address,
            tls,
            token: args.token.clone(),
        })
    }

    async fn get(&self, path: &str) -> anyhow::Result<(u16, String)> {
        get(&self.address, path, self.tls.clone(), self.token.as_deref()).await
    }
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    if args.serve {
        return serve(args).await;
    }
    let key = args.key.clone().context("give the key to trace")?;
    let [ops_address] = args.ops_address.as_slice() else {
        bail!("give one --ops-address to print a trace (several only with --serve)");
    };
    let controller = Controller::new(ops_address, &args)?;
    let address = &controller.address;
    let path = format!("/debug/trace?key={}&format=json", key.replace('/', "%2F"));
    let (status, body) = controller
        .get(&path)
        .await
        .with_context(|| format!("reading the trace of {key} from {address}"))?;
    if status != 200 {
        bail!(
            "{address} answered {status} for the trace of {key}: {}",
            body.trim()
        );
    }
    let mut steps: Vec<kubeloop::trace::Step> = serde_json::from_str(&body)
        .with_context(|| format!("{address} sent a trace that is not kubeloop's JSON"))?;
    if let Some(kind) = &args.kind {
        let wanted = canonical_kind(kind);
        steps.retain(|s| s.kind.is_empty() || s.kind.eq_ignore_ascii_case(&wanted));
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&steps)?);
    } else {
        print!("{}", kubeloop::trace::render(&key, &steps));
    }
    Ok(())
}

/// `--serve`: the ops server's journey page on `--listen`, its data from `--file` or read
/// through from the controller, until SIGINT or SIGTERM.
async fn serve(args: Args) -> anyhow::Result<()> {
    use kubeloop::ops::{JourneySource, OpsServer, ServeConfig};
    let listen = OpsServer::parse_bind_address(&args.listen)
        .context("--listen")?
        .context("--listen 0 serves nothing; give host:port")?;
    let stop = tokio_util::sync::CancellationToken::new();
    let source: Arc<dyn JourneySource> = match (&args.file, args.ops_address.as_slice()) {
        (Some(path), _) => Arc::new(SavedTrace::read(path, args.key.clone())),
        (None, [one]) => Arc::new(ReadThrough {
            controller: Controller::new(one, &args)?,
        }),
        (None, several) => {
            let mut sources: Vec<(String, Arc<dyn JourneySource>)> = vec![];
            for address in several {
                if sources.iter().any(|(seen, _)| seen == address) {
                    continue; // one address given twice is one controller
                }
                let controller = Controller::new(address, &args)?;
                sources.push((address.clone(), Arc::new(ReadThrough { controller })));
            }
            Arc::new(merged::Merged::start(sources, stop.clone()))
        }
    };
    let config = ServeConfig {
        journey: Some(source),
        ..Default::default()
    };
    let server = OpsServer::start(listen, config, stop.clone())
        .await
        .with_context(|| format!("serving the journey page on {listen}"))?;
    let page = match &args.key {
        Some(key) if args.file.is_none() => format!("?key={}", key.replace('/', "%2F")),
        _ => String::new(),
    };
    println!(
        "journey page: http://{}/debug/journey{page}  (Ctrl-C stops)",
        server.addr()
    );
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    stop.cancel();
    Ok(())
}

/// A saved `kubeloop trace --json` file, read once; one that does not parse is shown on the
/// page as such.
struct SavedTrace {
    name: String,
    steps: Result<Vec<kubeloop::trace::Step>, String>,
}

impl SavedTrace {
    fn read(path: &std::path::Path, key: Option<String>) -> Self {
        let name = key.unwrap_or_else(|| path.display().to_string());
        let steps = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read the saved trace {}: {e}", path.display()))
            .and_then(|text| {
                serde_json::from_str(&text).map_err(|e| {
                    format!(
                        "the saved trace {} does not parse as `kubeloop trace --json` output \
                         (a list of steps): {e}",
                        path.display()
                    )
                })
            });
        if let Err(problem) = &steps {
            eprintln!("kubeloop trace --serve: {problem}");
        }
        Self { name, steps }
    }
}

impl kubeloop::ops::JourneySource for SavedTrace {
    fn data(&self, query: kubeloop::ops::JourneyQuery) -> kubeloop::ops::JourneyFuture<'_> {
        use kubeloop::ops::{JourneyData, JourneyRefusal};
        use kubeloop::trace::{KeySteps, StepsSince};
        let answer = match &self.steps {
            Err(problem) => Err(JourneyRefusal {
                status: http::StatusCode::UNPROCESSABLE_ENTITY,
                words: problem.clone(),
            }),
            Ok(_) if query.key.as_ref().is_some_and(|k| *k != self.name) => Err(JourneyRefusal {
                status: http::StatusCode::NOT_FOUND,
                words: format!(
                    "{:?} is not in this saved trace; it holds {:?}",
                    query.key.unwrap_or_default(),
                    self.name
                ),
            }),
            Ok(steps) => {
                let kept = if query.since == 0 {
                    steps.clone()
                } else {
                    vec![]
                };
                let data = JourneyData {
                    source: format!("saved trace {}", self.name),
                    live: false,
                    steps: StepsSince {
                        next: steps.len() as u64,
                        keys: vec![KeySteps {
                            key: self.name.clone(),
                            steps: kept,
                        }],
                        more_keys: 0,
                    },
                    queues: vec![],
                };
                serde_json::to_string(&data).map_err(|e| JourneyRefusal {
                    status: http::StatusCode::INTERNAL_SERVER_ERROR,
                    words: format!("encoding the saved trace: {e}"),
                })
            }
        };
        Box::pin(std::future::ready(answer))
    }
}

/// A running controller's journey data, read through on each poll (with the token and TLS of
/// the flags, which the browser does not have).
struct ReadThrough {
    controller: Controller,
}

impl kubeloop::ops::JourneySource for ReadThrough {
    fn data(&self, query: kubeloop::ops::JourneyQuery) -> kubeloop::ops::JourneyFuture<'_> {
        use kubeloop::ops::JourneyRefusal;
        Box::pin(async move {
            let address = &self.controller.address;
            let path = format!("/debug/journey?{}", query.to_query());
            match self.controller.get(&path).await {
                Ok((200, body)) => {
                    let mut data: kubeloop::ops::JourneyData = serde_json::from_str(&body)
                        .map_err(|e| JourneyRefusal {
                            status: http::StatusCode::BAD_GATEWAY,
                            words: format!("{address} sent journey data that does not parse: {e}"),
                        })?;
                    data.source = format!("{} at {address}", data.source);
                    serde_json::to_string(&data).map_err(|e| JourneyRefusal {
                        status: http::StatusCode::INTERNAL_SERVER_ERROR,
                        words: format!("encoding the journeys: {e}"),
                    })
                }
                Ok((status, body)) => Err(JourneyRefusal {
                    status: http::StatusCode::from_u16(status)
                        .unwrap_or(http::StatusCode::BAD_GATEWAY),
                    words: format!(
                        "the controller at {address} answered {status}: {}",
                        body.trim()
                    ),
                }),
                Err(e) => Err(JourneyRefusal {
                    status: http::StatusCode::BAD_GATEWAY,
                    words: format!("cannot read the controller at {address}: {e:#}"),
                }),
            }
        })
    }
}

/// kubectl's short names for the two controllers' kinds.
fn canonical_kind(kind: &str) -> String {
    match kind.to_ascii_lowercase().as_str() {
        "vm" | "vms" | "virtualmachine" | "virtualmachines" => "VirtualMachine".into(),
        "foo" | "foos" => "Foo".into(),
        "deploy" | "deployment" | "deployments" => "Deployment".into(),
        _ => kind.to_string(),
    }
}

/// One HTTP/1.1 GET with `Connection: close`, over TLS when `tls` is given; the ops server
/// answers with a length-delimited body, so reading to the end is the whole response.
async fn get(
    address: &str,
    path: &str,
    tls: Option<Arc<rustls::ClientConfig>>,
    token: Option<&str>,
) -> anyhow::Result<(u16, String)> {
    let stream = tokio::net::TcpStream::connect(address)
        .await
        .with_context(|| format!("connecting to {address} (is the controller running with --metrics-bind-address {address}?)"))?;
    let auth = token
        .map(|t| format!("Authorization: Bearer {}\r\n", t.trim()))
        .unwrap_or_default();
    let request =
        format!("GET {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n{auth}\r\n");
    let response = match tls {
        Some(config) => {
            let host = address
                .rsplit_once(':')
                .map_or(address, |(h, _)| h)
                .trim_matches(['[', ']']);
            let name = rustls::pki_types::ServerName::try_from(host.to_string())
                .with_context(|| format!("{host:?} is not a host name for TLS"))?;
            let stream = tokio_rustls::TlsConnector::from(config)
                .connect(name, stream)
                .await
                .with_context(|| format!("TLS with {address}"))?;
            exchange(stream, &request).await?
        }
        None => exchange(stream, &request).await?,
    };
    if !response.starts_with(b"HTTP/") {
        bail!(
            "{address} does not answer plain HTTP (it serves HTTPS: use --ops-address \
             https://{address} with --token)"
        );
    }
    let response = String::from_utf8_lossy(&response);
    let (head, body) = response
        .split_once("\r\n\r\n")
        .context("the response has no header end")?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .context("the response has no status code")?;
    Ok((status, body.to_string()))
}

async fn exchange<S: AsyncRead + AsyncWrite + Unpin>(
    mut stream: S,
    request: &str,
) -> anyhow::Result<Vec<u8>> {
    stream.write_all(request.as_bytes()).await?;
    let mut response = Vec::new();
    match stream.read_to_end(&mut response).await {
        Ok(_) => Ok(response),
        // A TLS peer closing without close_notify: what arrived is the response.
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof && !response.is_empty() => {
            Ok(response)
        }
        Err(e) => Err(e.into()),
    }
}

/// Trust `--certificate-authority`, or nothing at all with `--insecure-skip-tls-verify`.
fn tls_config(args: &Args) -> anyhow::Result<Arc<rustls::ClientConfig>> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()?;
    let config = match (&args.certificate_authority, args.insecure_skip_tls_verify) {
        (Some(path), _) => {
            use rustls::pki_types::pem::PemObject;
            let mut roots = rustls::RootCertStore::empty();
            for cert in rustls::pki_types::CertificateDer::pem_file_iter(path)
                .with_context(|| format!("reading --certificate-authority {}", path.display()))?
            {
                roots
                    .add(
                        cert.with_context(|| {
                            format!("--certificate-authority {}", path.display())
                        })?,
                    )
                    .with_context(|| format!("--certificate-authority {}", path.display()))?;
            }
            builder.with_root_certificates(roots).with_no_client_auth()
        }
        (None, true) => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AnyCertificate(provider)))
            .with_no_client_auth(),
        (None, false) => bail!(
            "--ops-address https://... needs --certificate-authority FILE, or \
             --insecure-skip-tls-verify for the controller's self-signed certificate"
        ),
    };
    Ok(Arc::new(config))
}

/// `--insecure-skip-tls-verify`: any certificate, signatures still checked.
#[derive(Debug)]
struct AnyCertificate(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &rustls::pki_types::CertificateDer<'_>,
        _intermediates: &[rustls::pki_types::CertificateDer<'_>],
        _server_name: &rustls::pki_types::ServerName<'_>,
        _ocsp_response: &[u8],
        _now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_names_map_to_kinds() {
        assert_eq!(canonical_kind("vm"), "VirtualMachine");
        assert_eq!(canonical_kind("Foos"), "Foo");
        assert_eq!(canonical_kind("ConfigMap"), "ConfigMap");
    }
}
