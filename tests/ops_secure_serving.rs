//! The ops servers as a cluster's security review would try them, against the real local control
//! plane (RBAC on, ServiceAccount tokens from the TokenRequest API):
//! - `kubeloop sample-controller`, run as deploy/'s ServiceAccount with deploy/'s RBAC
//!   (`metrics-rbac.yaml` included), serves /metrics over HTTPS (the certificate given by
//!   `--metrics-cert-path`) and answers an anonymous or bogus token 401, a ServiceAccount
//!   without the `kubeloop:metrics-reader` role 403, and one bound to it 200; /debug/trace and
//!   /debug/queue (the controller's fair queue, named `Foos`) alike; its probe server serves
//!   /healthz and /readyz, never /debug/trace or /metrics;
//! - 100 clients that never finish their request head, and 100 that never finish the TLS
//!   handshake, are all disconnected by the servers within the (shortened) header-read timeout,
//!   while /healthz keeps answering.
//!
//! Counterpart: controller-runtime's `pkg/metrics/filters` suite ("should serve metrics in its
//! registry" with an authorized and an unauthorized ServiceAccount), here with real tokens.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kubeloop_testenv::{self as testenv, Cluster, Kubeloop, ManagedProcess};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::rustls::{self, pki_types::CertificateDer, pki_types::ServerName};

const DEPLOY_NS: &str = "kubeloop-system";

/// Applies the CRDs and deploy/'s namespace, the sample controller's RBAC and the metrics RBAC,
/// once per test binary.
fn install(cluster: &Cluster) {
    static INSTALLED: std::sync::OnceLock<()> = std::sync::OnceLock::new();
    INSTALLED.get_or_init(|| {
        cluster
            .kubectl(&[
                "apply",
                "-f",
                "crds/",
                "-f",
                "deploy/00-namespace.yaml",
                "-f",
                "deploy/sample-controller-rbac.yaml",
                "-f",
                "deploy/metrics-rbac.yaml",
            ])
            .ok();
        cluster
            .kubectl(&[
                "wait",
                "--for",
                "condition=established",
                "--timeout=60s",
                "crd/foos.samplecontroller.k8s.io",
            ])
            .ok();
    });
}

/// A token of ServiceAccount `ns/sa` from the TokenRequest API.
fn token(cluster: &Cluster, ns: &str, sa: &str) -> String {
    cluster
        .kubectl(&["create", "token", sa, "-n", ns, "--duration=1h"])
        .ok()
        .trim()
        .to_owned()
}

/// A kubeconfig for `cluster` that authenticates with `token`.
fn token_kubeconfig(cluster: &Cluster, token: &str, path: &Path) {
    let view = |field: &str| {
        cluster
            .kubectl(&[
                "config",
                "view",
                "--raw",
                "--minify",
                "-o",
                &format!("jsonpath={{.clusters[0].cluster.{field}}}"),
            ])
            .ok()
            .trim()
            .to_owned()
    };
    let server = view("server");
    let ca_data = view("certificate-authority-data");
    let ca_line = if ca_data.is_empty() {
        format!("certificate-authority: {}", view("certificate-authority"))
    } else {
        format!("certificate-authority-data: {ca_data}")
    };
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: local\n  cluster:\n    server: {server}\n    {ca_line}\n\
         users:\n- name: u\n  user:\n    token: {token}\ncontexts:\n- name: c\n  context:\n    cluster: local\n    user: u\n\
         current-context: c\n"
    );
    std::fs::write(path, text).unwrap();
}

/// A CA and a serving pair for `localhost` / 127.0.0.1 signed by it, written as `tls.crt` and
/// `tls.key` into `dir` (and the CA as `ca.crt`); returns the CA certificate a client trusts.
fn serving_files(dir: &Path) -> CertificateDer<'static> {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_cert = ca_params.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca_params, ca_key);
    let leaf_key = KeyPair::generate().unwrap();
    let leaf = CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()])
        .unwrap()
        .signed_by(&leaf_key, &issuer)
        .unwrap();
    std::fs::write(dir.join("tls.crt"), leaf.pem()).unwrap();
    std::fs::write(dir.join("tls.key"), leaf_key.serialize_pem()).unwrap();
    std::fs::write(dir.join("ca.crt"), ca_cert.pem()).unwrap();
    ca_cert.der().clone()
}

/// `GET path` over TLS to `addr`, trusting `ca`, with `Authorization: Bearer token` if given.
async fn https_get(
    addr: SocketAddr,
    path: &str,
    token: Option<&str>,
    ca: &CertificateDer<'static>,
) -> (u16, String) {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.clone()).unwrap();
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let tcp = TcpStream::connect(addr).await.unwrap();
    let mut tls = TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .expect("the server's certificate is the one given by --metrics-cert-path");
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    tls.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n{auth}\r\n")
            .as_bytes(),
    )
    .await
    .unwrap();
    let mut raw = Vec::new();
    // A peer may close without close_notify; what arrived is the response.
    let _ = tls.read_to_end(&mut raw).await;
    parse_response(&raw)
}

/// `GET path` over plain HTTP.
async fn http_get(addr: SocketAddr, path: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(
            format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .unwrap();
    let mut raw = Vec::new();
    let _ = stream.read_to_end(&mut raw).await;
    parse_response(&raw)
}

fn parse_response(raw: &[u8]) -> (u16, String) {
    let raw = String::from_utf8_lossy(raw);
    let status = raw
        .get(9..12)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP response: {raw:?}"));
    let body = raw
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (status, body)
}

/// The address of the server `process` logged as started for `flag`.
async fn served_addr(process: &mut ManagedProcess, flag: &str) -> SocketAddr {
    let line = process
        .wait_for_line(&["serving metrics", flag], Duration::from_secs(60))
        .await;
    line.split("addr=")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("no address in {line:?}"))
}

/// A loopback address with a free port (`127.0.0.1:0` twice would be one shared server).
fn free_addr() -> String {
    format!("127.0.0.1:{}", testenv::free_port().expect("a free port"))
}

fn tempdir(name: &str) -> PathBuf {
    let dir =
        std::env::temp_dir().join(format!("kubeloop-ops-secure-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Two ServiceAccounts in a fresh namespace: `reader`, bound to `kubeloop:metrics-reader`, and
/// `stranger`, bound to nothing. Returns the namespace and their tokens.
async fn scrapers(cluster: &Cluster) -> (String, String, String) {
    let ns = cluster.new_namespace("ops-scrapers").await.unwrap();
    cluster
        .kubectl(&["create", "serviceaccount", "reader", "-n", &ns])
        .ok();
    cluster
        .kubectl(&["create", "serviceaccount", "stranger", "-n", &ns])
        .ok();
    cluster
        .kubectl(&[
            "create",
            "clusterrolebinding",
            &format!("{ns}-metrics-reader"),
            "--clusterrole=kubeloop:metrics-reader",
            &format!("--serviceaccount={ns}:reader"),
        ])
        .ok();
    let reader = token(cluster, &ns, "reader");
    let stranger = token(cluster, &ns, "stranger");
    (ns, reader, stranger)
}

/// The sample controller as deploy/ runs it (secure metrics, its ServiceAccount, deploy/'s
/// RBAC), with a serving certificate from files: 401 anonymous or bogus, 403 unbound, 200 for
/// the metrics reader, on /metrics and /debug/trace; the probe server serves probes only.
#[tokio::test(flavor = "multi_thread")]
async fn metrics_answer_only_a_token_whose_user_may_read_them_and_probes_serve_only_probes() {
    let cluster = testenv::shared().await;
    install(cluster);
    let (ns, reader, stranger) = scrapers(cluster).await;
    let dir = tempdir("controller");
    let ca = serving_files(&dir);
    let controller_token = token(cluster, DEPLOY_NS, "sample-controller");
    let kubeconfig = dir.join("sample-controller.kubeconfig");
    token_kubeconfig(cluster, &controller_token, &kubeconfig);

    let mut controller = Kubeloop::new([
        "sample-controller",
        "--kubeconfig",
        kubeconfig.to_str().unwrap(),
        "--namespace",
        &ns,
        "--metrics-bind-address",
        "127.0.0.1:0",
        "--metrics-cert-path",
        dir.to_str().unwrap(),
        "--health-probe-bind-address",
        &free_addr(),
        "--trace",
        &format!("{ns}/example-foo"),
    ])
    .env("RUST_LOG", "info")
    .start();
    let metrics = served_addr(&mut controller, "--metrics-bind-address").await;
    let probes = served_addr(&mut controller, "--health-probe-bind-address").await;
    assert_ne!(metrics, probes);

    for path in ["/metrics", "/debug/trace", "/debug/queue"] {
        let (status, body) = https_get(metrics, path, None, &ca).await;
        assert_eq!(status, 401, "anonymous {path}: {body}");
        let (status, body) = https_get(metrics, path, Some("not-a-token"), &ca).await;
        assert_eq!(status, 401, "bogus token on {path}: {body}");
        let (status, body) = https_get(metrics, path, Some(&stranger), &ca).await;
        assert_eq!(status, 403, "unbound ServiceAccount on {path}: {body}");
        assert!(
            body.contains(&format!("system:serviceaccount:{ns}:stranger")),
            "the refusal names the user: {body}"
        );
    }
    // The reader's `get` (lower-cased from GET, as RBAC's verbs are) is allowed.
    let (status, body) = https_get(metrics, "/metrics", Some(&reader), &ca).await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("workqueue_adds_total"), "{body}");
    let (status, body) = https_get(metrics, "/debug/trace", Some(&reader), &ca).await;
    assert_eq!(status, 200, "{body}");
    assert!(
        body.contains(&format!("{ns}/example-foo")),
        "the followed key: {body}"
    );
    let (status, body) = https_get(metrics, "/debug/queue", Some(&reader), &ca).await;
    assert_eq!(status, 200, "{body}");
    assert!(
        body.contains("queue Foos: "),
        "the sample controller's queue is fair by namespace: {body}"
    );

    // `kubeloop trace` reads the same over HTTPS with the reader's token, and names the
    // refusal with the stranger's.
    let trace = |token: &str, tls: &[&str]| {
        let mut args = vec![
            "trace".to_string(),
            format!("{ns}/example-foo"),
            "--ops-address".into(),
            format!("https://{metrics}"),
            "--token".into(),
            token.to_string(),
        ];
        args.extend(tls.iter().map(|s| s.to_string()));
        Kubeloop::new(&args).output()
    };
    let ca_file = dir.join("ca.crt");
    let ca_file = ca_file.to_str().unwrap();
    for tls in [
        &["--certificate-authority", ca_file][..],
        &["--insecure-skip-tls-verify"][..],
    ] {
        let out = trace(&reader, tls);
        assert!(
            out.status.success()
                && String::from_utf8_lossy(&out.stdout).contains(&format!("{ns}/example-foo")),
            "kubeloop trace {tls:?}: {out:?}"
        );
    }
    let out = trace(&stranger, &["--certificate-authority", ca_file]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("403"), "{stderr}");

    // Plain HTTP to the HTTPS port gets no metrics.
    let mut plain = TcpStream::connect(metrics).await.unwrap();
    plain
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut raw = Vec::new();
    let _ = plain.read_to_end(&mut raw).await;
    assert!(
        !String::from_utf8_lossy(&raw).contains("workqueue"),
        "plain HTTP got metrics"
    );

    // The probe server: probes, unauthenticated, and nothing else.
    assert_eq!(http_get(probes, "/healthz").await.0, 200);
    kubeloop::testing::eventually("/readyz ok", Duration::from_secs(30), || async {
        (http_get(probes, "/readyz").await.0 == 200).then_some(())
    })
    .await;
    assert_eq!(http_get(probes, "/debug/trace").await.0, 404);
    assert_eq!(
        http_get(probes, &format!("/debug/trace?key={ns}/example-foo"))
            .await
            .0,
        404
    );
    assert_eq!(http_get(probes, "/metrics").await.0, 404);
    drop(controller);
    let _ = std::fs::remove_dir_all(dir);
}

/// Reads until the server closes the connection; when it did, measured from `since`.
async fn closed_after(mut stream: TcpStream, since: Instant) -> Duration {
    let mut sink = [0u8; 512];
    loop {
        match stream.read(&mut sink).await {
            Ok(0) | Err(_) => return since.elapsed(),
            Ok(_) => {}
        }
    }
}

/// 100 clients that send part of a head to the probe server and 100 that never start the TLS
/// handshake with the metrics server are all cut off by the 2 s header-read timeout, while
/// /healthz keeps answering on the probe server.
#[tokio::test(flavor = "multi_thread")]
async fn clients_that_never_finish_their_headers_are_disconnected_while_healthz_answers() {
    use kubeloop::ops::{Check, CheckFn, ServerLimits};
    use kubeloop_cli::OpsArgs;

    let cluster = testenv::shared().await;
    let header_timeout = Duration::from_secs(2);
    let ops = OpsArgs {
        metrics_bind_address: "127.0.0.1:0".into(),
        health_probe_bind_address: free_addr(),
        limits: ServerLimits {
            read_header_timeout: header_timeout,
            ..Default::default()
        },
        ..Default::default()
    };
    let stop = tokio_util::sync::CancellationToken::new();
    let checks = || -> Vec<Arc<dyn Check>> { vec![Arc::new(CheckFn::new("ping", || Ok(())))] };
    let serving = ops
        .serve(
            prometheus_client::registry::Registry::default,
            checks(),
            checks(),
            Some(cluster.client().await.unwrap()),
            &stop,
        )
        .await
        .unwrap();
    assert!(serving.secure);
    let (metrics, probes) = (serving.metrics.unwrap(), serving.probes.unwrap());

    let started = Instant::now();
    let mut slow = Vec::new();
    for i in 0..100 {
        let mut stream = TcpStream::connect(probes).await.unwrap();
        stream
            .write_all(format!("GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: {i}\r\n").as_bytes())
            .await
            .unwrap();
        slow.push(tokio::spawn(closed_after(stream, started)));
        let silent = TcpStream::connect(metrics).await.unwrap();
        slow.push(tokio::spawn(closed_after(silent, started)));
    }

    let mut answered = 0;
    while slow.iter().any(|s| !s.is_finished()) && started.elapsed() < Duration::from_secs(60) {
        let (status, _) = http_get(probes, "/healthz").await;
        assert_eq!(status, 200, "/healthz while 200 clients stall");
        answered += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut closed = Vec::new();
    for s in slow {
        closed.push(
            tokio::time::timeout(Duration::from_secs(1), s)
                .await
                .expect("every stalled client is disconnected by the server within 60 s")
                .unwrap(),
        );
    }
    closed.sort();
    eprintln!(
        "200 stalled clients disconnected after {:?} (first) to {:?} (last) with a {header_timeout:?} \
         header-read timeout; /healthz answered {answered} times meanwhile",
        closed[0],
        closed[closed.len() - 1]
    );
    assert!(answered > 0);
    assert!(
        closed[0] >= header_timeout,
        "no client is cut off before the timeout: {:?}",
        closed[0]
    );
    assert_eq!(http_get(probes, "/healthz").await.0, 200);
    stop.cancel();
}
