//! A small hyper server for `/metrics`, `/healthz` and `/readyz`.
//!
//! Invariants: the registry is complete before serving starts (prometheus-client registries
//! are built, then shared read-only); checks run on every probe, never cached, so a probe
//! tells the state at the moment it is asked.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use http::{Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// One named health or readiness check.
pub trait Check: Send + Sync {
    /// The check's name, as `?verbose` lists it (`[+]name ok`).
    fn name(&self) -> &str;
    /// `Err(reason)` makes the endpoint answer 500 with the reason.
    fn check(&self) -> Result<(), String>;
}

/// A [`Check`] from a name and a closure.
pub struct CheckFn<F> {
    name: String,
    f: F,
}

impl<F: Fn() -> Result<(), String> + Send + Sync> CheckFn<F> {
    /// A check named `name` that runs `f`.
    pub fn new(name: impl Into<String>, f: F) -> Self {
        Self {
            name: name.into(),
            f,
        }
    }
}

impl<F: Fn() -> Result<(), String> + Send + Sync> Check for CheckFn<F> {
    fn name(&self) -> &str {
        &self.name
    }
    fn check(&self) -> Result<(), String> {
        (self.f)()
    }
}

/// What one server exposes. Metrics and probes can share a server or use two.
#[derive(Clone, Default)]
pub struct ServeConfig {
    /// Served on `/metrics` when present.
    pub registry: Option<Arc<Registry>>,
    /// Served on `/healthz` (and `/livez`) when non-empty.
    pub healthz: Vec<Arc<dyn Check>>,
    /// Served on `/readyz` when non-empty.
    pub readyz: Vec<Arc<dyn Check>>,
}

/// Why an ops server could not start.
#[derive(Debug, thiserror::Error)]
pub enum OpsServerError {
    /// The address is not `host:port`, `:port` or `0`.
    #[error("bind address {0:?} is not host:port (e.g. :8080, 127.0.0.1:8080, or 0 to disable)")]
    BadAddress(String),
    /// The address could not be bound.
    #[error("binding {addr}: {source}")]
    Bind {
        /// The address.
        addr: String,
        /// Why binding failed.
        source: std::io::Error,
    },
    /// A key given to trace is not `namespace/name`.
    #[error(transparent)]
    TraceKey(#[from] crate::trace::TraceKeyError),
}

/// A running server; it stops when the token given to [`OpsServer::start`] is cancelled.
pub struct OpsServer {
    addr: SocketAddr,
}

impl OpsServer {
    /// Parses a controller-runtime style bind address: `:8080` (all interfaces), `host:port`,
    /// or `0` / empty for "disabled" (`Ok(None)`).
    pub fn parse_bind_address(text: &str) -> Result<Option<SocketAddr>, OpsServerError> {
        let text = text.trim();
        if text.is_empty() || text == "0" {
            return Ok(None);
        }
        let full = if text.starts_with(':') {
            format!("0.0.0.0{text}")
        } else {
            text.to_owned()
        };
        full.parse()
            .map(Some)
            .map_err(|_| OpsServerError::BadAddress(text.to_owned()))
    }

    /// Binds `addr` and serves `config` until `stop` is cancelled.
    pub async fn start(
        addr: SocketAddr,
        config: ServeConfig,
        stop: CancellationToken,
    ) -> Result<Self, OpsServerError> {
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|source| OpsServerError::Bind {
                addr: addr.to_string(),
                source,
            })?;
        let addr = listener
            .local_addr()
            .map_err(|source| OpsServerError::Bind {
                addr: addr.to_string(),
                source,
            })?;
        let config = Arc::new(config);
        tokio::spawn(async move {
            loop {
                let (stream, _) = tokio::select! {
                    _ = stop.cancelled() => return,
                    accepted = listener.accept() => match accepted {
                        Ok(a) => a,
                        Err(e) => {
                            tracing::warn!(error = %e, "ops server: accept failed");
                            continue;
                        }
                    },
                };
                let config = config.clone();
                let stop = stop.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |req| {
                        let config = config.clone();
                        async move { Ok::<_, Infallible>(route(&config, req)) }
                    });
                    let conn =
                        http1::Builder::new().serve_connection(TokioIo::new(stream), service);
                    tokio::select! {
                        _ = conn => {}
                        _ = stop.cancelled() => {}
                    }
                });
            }
        });
        Ok(Self { addr })
    }

    /// The bound address (useful with port 0).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

fn route(config: &ServeConfig, req: Request<Incoming>) -> Response<Full<Bytes>> {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return text(StatusCode::METHOD_NOT_ALLOWED, "only GET\n".into());
    }
    let verbose = req.uri().query().is_some_and(|q| {
        q.split('&')
            .any(|p| p == "verbose" || p.starts_with("verbose="))
    });
    match req.uri().path() {
        "/metrics" => match &config.registry {
            Some(registry) => {
                let mut body = String::new();
                match prometheus_client::encoding::text::encode(&mut body, registry) {
                    Ok(()) => {
                        let mut response = text(StatusCode::OK, body);
                        response.headers_mut().insert(
                            http::header::CONTENT_TYPE,
                            http::HeaderValue::from_static(
                                "application/openmetrics-text; version=1.0.0; charset=utf-8",
                            ),
                        );
                        response
                    }
                    Err(e) => text(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        format!("encoding metrics: {e}\n"),
                    ),
                }
            }
            None => text(
                StatusCode::NOT_FOUND,
                "metrics are not served here\n".into(),
            ),
        },
        "/healthz" | "/livez" if !config.healthz.is_empty() => probe(&config.healthz, verbose),
        "/readyz" if !config.readyz.is_empty() => probe(&config.readyz, verbose),
        "/debug/trace" => trace(req.uri().query().unwrap_or("")),
        _ => text(StatusCode::NOT_FOUND, "not found\n".into()),
    }
}

/// `/debug/trace?key=ns/name[&format=json]`: the steps [`crate::trace`] recorded for a
/// followed key, as a table (or JSON for `kubeloop trace`); without `key`, the followed keys.
fn trace(query: &str) -> Response<Full<Bytes>> {
    let mut key = None;
    let mut json = false;
    for pair in query.split('&') {
        match pair.split_once('=') {
            Some(("key", k)) => key = Some(percent_decode(k)),
            Some(("format", "json")) => json = true,
            _ => {}
        }
    }
    let followed = crate::trace::followed();
    let Some(key) = key else {
        if followed.is_empty() {
            return text(
                StatusCode::NOT_FOUND,
                "no key is traced: start the controller with --trace namespace/name\n".into(),
            );
        }
        return text(StatusCode::OK, format!("{}\n", followed.join("\n")));
    };
    let Some(steps) = crate::trace::timeline(&key) else {
        let hint = if followed.is_empty() {
            "no key is traced: start the controller with --trace namespace/name".to_string()
        } else {
            format!("traced keys: {}", followed.join(", "))
        };
        return text(
            StatusCode::NOT_FOUND,
            format!("{key:?} is not traced here; {hint}\n"),
        );
    };
    if json {
        match serde_json::to_string(&steps) {
            Ok(body) => text(StatusCode::OK, body),
            Err(e) => text(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("encoding the trace of {key}: {e}\n"),
            ),
        }
    } else {
        text(StatusCode::OK, crate::trace::render(&key, &steps))
    }
}

/// `%2F` and friends in a query value (a key's `/` may come encoded).
fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => match (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                (Some(h), Some(l)) => {
                    out.push((h * 16 + l) as u8);
                    i += 3;
                    continue;
                }
                _ => out.push(b'%'),
            },
            b'+' => out.push(b' '),
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// k8s.io/apiserver healthz's format: `ok` when all pass; otherwise 500 and one line per check,
/// `[+]name ok` or `[-]name failed: reason`. `?verbose` lists the lines on success too.
fn probe(checks: &[Arc<dyn Check>], verbose: bool) -> Response<Full<Bytes>> {
    let mut lines = String::new();
    let mut failed = false;
    for check in checks {
        match check.check() {
            Ok(()) => lines.push_str(&format!("[+]{} ok\n", check.name())),
            Err(reason) => {
                failed = true;
                lines.push_str(&format!("[-]{} failed: {reason}\n", check.name()));
            }
        }
    }
    if failed {
        text(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("{lines}check failed\n"),
        )
    } else if verbose {
        text(StatusCode::OK, format!("{lines}check passed\n"))
    } else {
        text(StatusCode::OK, "ok".into())
    }
}

fn text(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use prometheus_client::metrics::counter::Counter;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    async fn get(addr: SocketAddr, path: &str) -> (u16, String) {
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        stream
            .write_all(
                format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
            )
            .await
            .unwrap();
        let mut raw = String::new();
        stream.read_to_string(&mut raw).await.unwrap();
        let status = raw[9..12].parse().unwrap();
        let body = raw
            .split_once("\r\n\r\n")
            .map(|(_, b)| b.to_owned())
            .unwrap_or_default();
        (status, body)
    }

    #[test]
    fn bind_addresses_follow_controller_runtime() {
        assert_eq!(OpsServer::parse_bind_address("0").unwrap(), None);
        assert_eq!(OpsServer::parse_bind_address("").unwrap(), None);
        assert_eq!(
            OpsServer::parse_bind_address(":8080").unwrap(),
            Some("0.0.0.0:8080".parse().unwrap())
        );
        assert_eq!(
            OpsServer::parse_bind_address("127.0.0.1:9").unwrap(),
            Some("127.0.0.1:9".parse().unwrap())
        );
        let err = OpsServer::parse_bind_address("localhost")
            .unwrap_err()
            .to_string();
        assert!(err.contains("\"localhost\""), "{err}");
    }

    #[tokio::test]
    async fn serves_metrics_and_probes_that_follow_their_checks() {
        let mut registry = Registry::default();
        let counter: Counter = Counter::default();
        registry.register("kubeloop_test_things", "Things counted", counter.clone());
        counter.inc_by(3);
        let healthy = Arc::new(AtomicBool::new(true));
        let h = healthy.clone();
        let config = ServeConfig {
            registry: Some(Arc::new(registry)),
            healthz: vec![Arc::new(CheckFn::new("leaderElection", move || {
                if h.load(Ordering::SeqCst) {
                    Ok(())
                } else {
                    Err("renewal overdue".into())
                }
            }))],
            readyz: vec![Arc::new(CheckFn::new("informers", || {
                Err("caches not synced".into())
            }))],
        };
        let stop = CancellationToken::new();
        let server = OpsServer::start("127.0.0.1:0".parse().unwrap(), config, stop.clone())
            .await
            .unwrap();

        let (status, body) = get(server.addr(), "/metrics").await;
        assert_eq!(status, 200);
        assert!(body.contains("kubeloop_test_things_total 3"), "{body}");

        assert_eq!(get(server.addr(), "/healthz").await, (200, "ok".into()));
        let (status, body) = get(server.addr(), "/healthz?verbose").await;
        assert_eq!(status, 200);
        assert!(body.contains("[+]leaderElection ok"), "{body}");

        healthy.store(false, Ordering::SeqCst);
        let (status, body) = get(server.addr(), "/healthz").await;
        assert_eq!(status, 500);
        assert!(
            body.contains("[-]leaderElection failed: renewal overdue"),
            "{body}"
        );

        let (status, body) = get(server.addr(), "/readyz").await;
        assert_eq!(status, 500);
        assert!(body.contains("caches not synced"), "{body}");
        assert_eq!(get(server.addr(), "/nope").await.0, 404);
        stop.cancel();
    }
}
