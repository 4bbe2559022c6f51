//! The ops servers' listener and connections: bind, accept (with a cap and backoff), TLS when
//! configured, and hyper's HTTP/1.1 with the [`ServerLimits`](super::ServerLimits) on every
//! connection.
//!
//! Counterparts: controller-runtime's `pkg/metrics/server` (`defaultServer.Start`: an
//! `http.Server` with the limits, TLS from the certwatcher when `SecureServing`) and
//! `pkg/manager`'s health probe server (plain HTTP, probes only).
//!
//! Invariants: at most `limits.max_connections` connections are served at once (a permit is
//! taken before `accept` and held by the connection's task); every connection ends by the
//! header-read timeout (TLS handshake included) or the idle timeout if its client stalls, and
//! when the stop token is cancelled.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

use super::limits::{AcceptBackoff, Activity, IdleIo};
use super::routes::{ServeConfig, route};

/// Why an ops server could not start.
#[derive(Debug, thiserror::Error)]
pub enum OpsServerError {
    /// The address is not `host:port`, `:port` or `0`.
    #[error("bind address {0:?} is not host:port (e.g. :8443, 127.0.0.1:8443, or 0 to disable)")]
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
    /// The serving certificate could not be made or loaded.
    #[error(transparent)]
    Tls(#[from] super::tls::TlsError),
    /// Secure metrics were asked for without a client to send the reviews with.
    #[error(
        "secure metrics need an apiserver client for TokenReview and SubjectAccessReview; \
         pass one, or serve plain HTTP with --metrics-secure=false"
    )]
    NoClient,
}

/// A running server; it stops when the token given to [`OpsServer::start`] is cancelled.
pub struct OpsServer {
    addr: SocketAddr,
}

impl OpsServer {
    /// Parses a controller-runtime style bind address: `:8443` (all interfaces), `host:port`,
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
        let bind_error = |source| OpsServerError::Bind {
            addr: addr.to_string(),
            source,
        };
        let listener = TcpListener::bind(addr).await.map_err(bind_error)?;
        let addr = listener.local_addr().map_err(bind_error)?;
        tokio::spawn(accept_loop(listener, Arc::new(config), stop));
        Ok(Self { addr })
    }

    /// The bound address (useful with port 0).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

/// Takes a connection permit, then accepts; waits with [`AcceptBackoff`] after an accept error
/// instead of trying again at once (an EMFILE would otherwise spin a core).
async fn accept_loop(listener: TcpListener, config: Arc<ServeConfig>, stop: CancellationToken) {
    let permits = Arc::new(Semaphore::new(config.limits.max_connections));
    let mut backoff = AcceptBackoff::default();
    let mut saturated = false;
    loop {
        if permits.available_permits() == 0 && !saturated {
            saturated = true;
            tracing::warn!(
                max_connections = config.limits.max_connections,
                "ops server: connection cap reached; new connections wait in the listen backlog"
            );
        }
        let permit = tokio::select! {
            _ = stop.cancelled() => return,
            permit = permits.clone().acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => return,
            },
        };
        if permits.available_permits() > 0 {
            saturated = false;
        }
        let stream = tokio::select! {
            _ = stop.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    backoff.reset();
                    stream
                }
                Err(e) => {
                    let delay = backoff.next_delay();
                    tracing::warn!(error = %e, ?delay, "ops server: accept failed; waiting before the next");
                    tokio::select! {
                        _ = stop.cancelled() => return,
                        _ = tokio::time::sleep(delay) => continue,
                    }
                }
            },
        };
        tokio::spawn(serve_connection(
            stream,
            config.clone(),
            stop.clone(),
            permit,
        ));
    }
}

/// One connection, holding its permit until it ends: the TLS handshake (bounded by the
/// header-read timeout) if configured, then HTTP/1.1.
async fn serve_connection(
    stream: TcpStream,
    config: Arc<ServeConfig>,
    stop: CancellationToken,
    _permit: OwnedSemaphorePermit,
) {
    let activity = Activity::new();
    let io = IdleIo::new(stream, activity.clone());
    let Some(tls) = config.tls.clone() else {
        return serve_http(io, activity, config, stop).await;
    };
    let handshake = tokio::time::timeout(
        config.limits.read_header_timeout,
        TlsAcceptor::from(tls).accept(io),
    );
    let tls_stream = tokio::select! {
        _ = stop.cancelled() => return,
        done = handshake => match done {
            Ok(Ok(tls_stream)) => tls_stream,
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "ops server: TLS handshake failed");
                return;
            }
            Err(_) => {
                tracing::debug!("ops server: TLS handshake not done within the header-read timeout");
                return;
            }
        },
    };
    serve_http(tls_stream, activity, config, stop).await;
}

async fn serve_http<S>(io: S, activity: Activity, config: Arc<ServeConfig>, stop: CancellationToken)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let limits = config.limits;
    let service = service_fn(move |req| {
        let config = config.clone();
        async move { Ok::<_, Infallible>(route(&config, req).await) }
    });
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.read_header_timeout)
        .max_header_size(limits.max_header_bytes)
        // The read buffer must hold a whole head of the largest size, or hyper refuses it
        // before the header limit speaks; 8 KiB is hyper's minimum.
        .max_buf_size((limits.max_header_bytes + 4096).max(8192));
    let conn = builder.serve_connection(TokioIo::new(io), service);
    tokio::select! {
        done = conn => if let Err(e) = done {
            tracing::debug!(error = %e, "ops server: connection ended with an error");
        },
        _ = activity.idle_for(limits.idle_timeout) => {
            tracing::debug!(idle_timeout = ?limits.idle_timeout, "ops server: idle connection closed");
        }
        _ = stop.cancelled() => {}
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use prometheus_client::metrics::counter::Counter;
    use prometheus_client::registry::Registry;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::super::limits::ServerLimits;
    use super::super::routes::CheckFn;
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
            ..Default::default()
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

    fn probes_only(limits: ServerLimits) -> ServeConfig {
        ServeConfig {
            healthz: vec![Arc::new(CheckFn::new("ping", || Ok(())))],
            limits,
            ..Default::default()
        }
    }

    /// A probes-only server with `limits` on a free loopback port, and its stop token.
    async fn start_probes(limits: ServerLimits) -> (OpsServer, CancellationToken) {
        let stop = CancellationToken::new();
        let addr = "127.0.0.1:0".parse().unwrap();
        let server = OpsServer::start(addr, probes_only(limits), stop.clone())
            .await
            .unwrap();
        (server, stop)
    }

    /// Reads until the server closes the connection (EOF or reset).
    async fn closed_by_server(stream: &mut tokio::net::TcpStream) {
        let mut sink = Vec::new();
        let _ = stream.read_to_end(&mut sink).await;
    }

    #[tokio::test]
    async fn a_client_that_never_finishes_its_head_is_cut_off_and_others_are_served() {
        let limits = ServerLimits {
            read_header_timeout: std::time::Duration::from_millis(300),
            ..Default::default()
        };
        let (server, stop) = start_probes(limits).await;
        let mut slow = tokio::net::TcpStream::connect(server.addr()).await.unwrap();
        slow.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
            .await
            .unwrap();
        assert_eq!(get(server.addr(), "/healthz").await.0, 200);
        tokio::time::timeout(
            std::time::Duration::from_secs(20),
            closed_by_server(&mut slow),
        )
        .await
        .expect("the server closes a head unfinished after 300 ms long before 20 s");
        stop.cancel();
    }

    #[tokio::test]
    async fn a_connection_moving_no_byte_is_closed_after_the_idle_timeout() {
        // A header timeout far beyond the test's patience: only the idle timeout can close it.
        let limits = ServerLimits {
            read_header_timeout: std::time::Duration::from_secs(600),
            idle_timeout: std::time::Duration::from_millis(300),
            ..Default::default()
        };
        let (server, stop) = start_probes(limits).await;
        let mut silent = tokio::net::TcpStream::connect(server.addr()).await.unwrap();
        tokio::time::timeout(
            std::time::Duration::from_secs(20),
            closed_by_server(&mut silent),
        )
        .await
        .expect("closed by the 300 ms idle timeout, not the 600 s header timeout");
        stop.cancel();
    }

    #[tokio::test]
    async fn connections_beyond_the_cap_wait_until_one_ends() {
        let limits = ServerLimits {
            max_connections: 1,
            read_header_timeout: std::time::Duration::from_secs(600),
            ..Default::default()
        };
        let (server, stop) = start_probes(limits).await;
        let mut holder = tokio::net::TcpStream::connect(server.addr()).await.unwrap();
        holder
            .write_all(b"GET /healthz HTTP/1.1\r\n")
            .await
            .unwrap();
        let addr = server.addr();
        let waiting = tokio::spawn(async move { get(addr, "/healthz").await });
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        assert!(
            !waiting.is_finished(),
            "the second connection is not served while the first holds the only slot"
        );
        drop(holder);
        let answered = tokio::time::timeout(std::time::Duration::from_secs(20), waiting)
            .await
            .expect("served once the first connection ended")
            .unwrap();
        assert_eq!(answered.0, 200);
        stop.cancel();
    }

    #[tokio::test]
    async fn a_head_over_the_size_limit_gets_431() {
        let limits = ServerLimits {
            max_header_bytes: 16 * 1024,
            ..Default::default()
        };
        let (server, stop) = start_probes(limits).await;
        let mut stream = tokio::net::TcpStream::connect(server.addr()).await.unwrap();
        let big = "a".repeat(32 * 1024);
        let request = format!("GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: {big}\r\n\r\n");
        let _ = stream.write_all(request.as_bytes()).await;
        let mut raw = Vec::new();
        let _ = stream.read_to_end(&mut raw).await;
        let raw = String::from_utf8_lossy(&raw);
        assert!(raw.starts_with("HTTP/1.1 431"), "{raw}");
        assert_eq!(
            get(server.addr(), "/healthz").await.0,
            200,
            "a normal head still passes"
        );
        stop.cancel();
    }

    #[tokio::test]
    async fn the_probe_server_serves_no_trace_and_no_metrics() {
        let (server, stop) = start_probes(ServerLimits::default()).await;
        assert_eq!(get(server.addr(), "/debug/trace").await.0, 404);
        assert_eq!(get(server.addr(), "/debug/queue").await.0, 404);
        assert_eq!(get(server.addr(), "/metrics").await.0, 404);
        assert_eq!(get(server.addr(), "/healthz").await.0, 200);
        stop.cancel();
    }

    #[tokio::test]
    async fn debug_journey_serves_the_page_and_new_steps_and_words_for_an_unfollowed_key() {
        crate::trace::follow(["ops-journey/foo"]).unwrap();
        crate::trace::record(
            "ops-journey/foo",
            crate::trace::Stage::WatchEvent,
            "Foo",
            || "ADDED rv=1".into(),
        );
        let config = ServeConfig {
            trace: true,
            ..Default::default()
        };
        let stop = CancellationToken::new();
        let server = OpsServer::start("127.0.0.1:0".parse().unwrap(), config, stop.clone())
            .await
            .unwrap();
        let (status, page) = get(server.addr(), "/debug/journey").await;
        assert_eq!(status, 200);
        assert!(
            page.contains("<script>") && page.contains("renderKey"),
            "{page}"
        );

        let (status, body) = get(
            server.addr(),
            "/debug/journey?format=json&key=ops-journey%2Ffoo&since=0",
        )
        .await;
        assert_eq!(status, 200, "{body}");
        let data: crate::ops::JourneyData = serde_json::from_str(&body).unwrap();
        assert!(data.live);
        assert_eq!(data.steps.keys.len(), 1);
        assert_eq!(data.steps.keys[0].steps[0].detail, "ADDED rv=1");
        crate::trace::record(
            "ops-journey/foo",
            crate::trace::Stage::FifoQueued,
            "Foo",
            || "Added".into(),
        );
        let path = format!(
            "/debug/journey?format=json&key=ops-journey%2Ffoo&since={}",
            data.steps.next
        );
        let (_, body) = get(server.addr(), &path).await;
        let newer: crate::ops::JourneyData = serde_json::from_str(&body).unwrap();
        let details: Vec<&str> = newer.steps.keys[0]
            .steps
            .iter()
            .map(|s| s.detail.as_str())
            .collect();
        assert_eq!(details, ["Added"], "only the step after `since`");

        let (status, body) = get(
            server.addr(),
            "/debug/journey?format=json&key=ops-journey%2Fnope",
        )
        .await;
        assert_eq!(status, 404);
        assert!(
            body.contains("\"ops-journey/nope\" is not traced here"),
            "{body}"
        );
        stop.cancel();
    }

    #[tokio::test]
    async fn debug_queue_lists_a_named_fair_queue_s_keys_deepest_first() {
        use crate::workqueue::{FairnessKeys, PriorityQueue, QueueConfig};
        let queue = PriorityQueue::<String>::with_fairness(
            crate::workqueue::default_controller_rate_limiter(),
            QueueConfig {
                name: "ops-test-fair".into(),
                metrics_provider: Some(crate::workqueue::MetricsProvider::new()),
            },
            |key: &String| FairnessKeys::one(key.split_once('/').map_or("", |(ns, _)| ns)),
        );
        for name in ["a", "b", "c"] {
            queue.add(format!("ops-busy/{name}"));
        }
        queue.add("ops-quiet/x".to_owned());
        let config = ServeConfig {
            trace: true,
            ..Default::default()
        };
        let stop = CancellationToken::new();
        let server = OpsServer::start("127.0.0.1:0".parse().unwrap(), config, stop.clone())
            .await
            .unwrap();
        let (status, body) = get(server.addr(), "/debug/queue").await;
        assert_eq!(status, 200);
        let page: Vec<&str> = body
            .lines()
            .skip_while(|l| !l.starts_with("queue ops-test-fair:"))
            .take(3)
            .collect();
        assert_eq!(page.len(), 3, "{body}");
        assert_eq!(
            page[0],
            "queue ops-test-fair: 2 fairness keys with ready items"
        );
        assert!(
            page[1].trim_start().starts_with("ops-busy ") && page[1].contains(" 3 ready"),
            "{body}"
        );
        assert!(
            page[2].trim_start().starts_with("ops-quiet ") && page[2].contains(" 1 ready"),
            "{body}"
        );
        stop.cancel();
    }
}
