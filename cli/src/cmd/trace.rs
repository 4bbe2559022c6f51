//! `kubeloop trace`: prints one object's journey through a running controller, read from that
//! controller's metrics server (`/debug/trace`). The controller must have been started with
//! `--trace namespace/name` and `--metrics-bind-address`. Its default secure server is read with
//! `--ops-address https://HOST:PORT --token TOKEN` (a token whose user may `get`
//! `/debug/trace`, e.g. bound to deploy/'s `kubeloop:metrics-reader`) and the server's CA
//! (`--certificate-authority`) or `--insecure-skip-tls-verify` for its self-signed certificate;
//! a server started with `--metrics-secure=false` with `--ops-address HOST:PORT`.
//! See `kubeloop::trace`.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, bail};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio_rustls::rustls;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The object's key, namespace/name (name alone for a cluster-scoped object).
    key: String,
    /// The controller's metrics address (its --metrics-bind-address): https://host:port for
    /// its default secure server; host:port or :port for one run with --metrics-secure=false.
    #[arg(long, default_value = "127.0.0.1:8080")]
    ops_address: String,
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
    #[arg(long)]
    json: bool,
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    let (tls, address) = match args.ops_address.strip_prefix("https://") {
        Some(rest) => (Some(tls_config(&args)?), rest.trim_end_matches('/')),
        None => (None, args.ops_address.as_str()),
    };
    let address = match address.strip_prefix(':') {
        Some(port) => format!("127.0.0.1:{port}"),
        None => address.to_string(),
    };
    let path = format!(
        "/debug/trace?key={}&format=json",
        args.key.replace('/', "%2F")
    );
    let (status, body) = get(&address, &path, tls, args.token.as_deref())
        .await
        .with_context(|| format!("reading the trace of {} from {address}", args.key))?;
    if status != 200 {
        bail!(
            "{address} answered {status} for the trace of {}: {}",
            args.key,
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
        print!("{}", kubeloop::trace::render(&args.key, &steps));
    }
    Ok(())
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
