//! Fault-injecting proxies on loopback, between a client and the apiserver. Point a client at
//! one with [`super::Cluster::client_config_via`]; it works as usual until a fault is injected.
//!
//! - [`FaultProxy`] works at the TCP level: TLS passes through untouched (the apiserver's
//!   serving certificate covers 127.0.0.1). [`FaultProxy::cut_all`] drops every open
//!   connection (a watch ends mid-stream), [`FaultProxy::set_blocked`] makes new connections
//!   fail at once, as a refused or unreachable apiserver would.
//! - [`HttpFaultProxy`] speaks HTTP: it terminates TLS with its own serving certificate for
//!   127.0.0.1, signed by the cluster's CA, and forwards each request to the apiserver with
//!   kube-client. It authenticates to the apiserver as the harness's admin user, whatever the
//!   client presented (a front proxy; the client's certificate is not asked for), so every
//!   request through it runs as admin. On top of the TCP faults it can answer the next watches
//!   of a path with 429, `Retry-After` and a `Status`, as the apiserver's watch cache does
//!   while it is not ready ([`HttpFaultProxy::throttle_watches`]), replace the next events of
//!   open watch streams with ones that are not events, in the stream's own wire (a JSON line,
//!   or a protobuf frame; [`HttpFaultProxy::corrupt_watch_events`]), delay what every
//!   watch stream delivers ([`HttpFaultProxy::delay_watches`]), and it records each
//!   request it handled, so a test can count LISTs and WATCHes ([`HttpFaultProxy::requests`]).
//!
//! Invariant of both: a connection ends as soon as [`FaultProxy::cut_all`] (or
//! [`HttpFaultProxy::cut_all`]) bumps the generation it was accepted in.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use futures::{Future, StreamExt, TryStreamExt};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Bytes, Frame, Incoming};
use hyper_util::rt::TokioIo;
use kube_client::Client;
use kube_client::client::Body;
use parking_lot::Mutex;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls;
use tokio_util::sync::CancellationToken;

use super::{Cluster, TestEnvError};

/// A TCP proxy in front of the apiserver that can cut every connection or refuse new ones,
/// to test what a client does when the network fails.
pub struct FaultProxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    stop: CancellationToken,
}

struct Shared {
    target: SocketAddr,
    conns: Connections,
}

/// What both proxies keep about their connections.
struct Connections {
    blocked: AtomicBool,
    /// Bumped by `cut_all`; each connection ends when it sees a generation newer than its own.
    generation: watch::Sender<u64>,
    accepted: AtomicU64,
}

impl Connections {
    fn new() -> Self {
        Self {
            blocked: AtomicBool::new(false),
            generation: watch::channel(0).0,
            accepted: AtomicU64::new(0),
        }
    }

    fn cut_all(&self) {
        self.generation.send_modify(|g| *g += 1);
    }

    /// Runs `conn` until it ends or the first `cut_all` after `born` (a receiver taken when
    /// the connection was accepted).
    async fn until_cut(mut born: watch::Receiver<u64>, conn: impl Future<Output = ()>) {
        tokio::select! {
            _ = conn => {}
            _ = born.changed() => {
                // Dropping the connection resets it: the client sees it end mid-stream.
            }
        }
    }
}

/// Spawns the loop that accepts connections until `stop`, counting each: a blocked one is
/// closed at once, the others are handed to `serve` on a task of their own.
fn spawn_accept_loop<S, Fut>(
    listener: TcpListener,
    shared: Arc<S>,
    conns: fn(&S) -> &Connections,
    stop: CancellationToken,
    serve: fn(TcpStream, Arc<S>) -> Fut,
) where
    S: Send + Sync + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                _ = stop.cancelled() => return,
                accepted = listener.accept() => accepted,
            };
            let Ok((inbound, _)) = accepted else { continue };
            let conns = conns(&shared);
            conns.accepted.fetch_add(1, Ordering::SeqCst);
            if conns.blocked.load(Ordering::SeqCst) {
                drop(inbound);
                continue;
            }
            // The generation is read here, not when the task first runs: a `cut_all` between
            // the two (say `set_blocked` then `cut_all` while this one was being accepted)
            // still cuts it, where it would otherwise outlive the outage it was meant to be
            // part of.
            let born = conns.generation.subscribe();
            let conn = serve(inbound, shared.clone());
            tokio::spawn(Connections::until_cut(born, conn));
        }
    });
}

async fn bind() -> Result<(TcpListener, SocketAddr), TestEnvError> {
    let io = |source| TestEnvError::Io {
        path: "127.0.0.1:0".into(),
        source,
    };
    let listener = TcpListener::bind("127.0.0.1:0").await.map_err(io)?;
    let addr = listener.local_addr().map_err(io)?;
    Ok((listener, addr))
}

impl FaultProxy {
    /// Listens on a free loopback port and forwards every connection to `target`.
    /// The accept loop runs on the current tokio runtime until the proxy is dropped.
    pub async fn start(target: SocketAddr) -> Result<Self, TestEnvError> {
        let (listener, addr) = bind().await?;
        let shared = Arc::new(Shared {
            target,
            conns: Connections::new(),
        });
        let stop = CancellationToken::new();
        spawn_accept_loop(
            listener,
            shared.clone(),
            |s| &s.conns,
            stop.clone(),
            forward,
        );
        Ok(Self { addr, shared, stop })
    }

    /// The address clients should connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Closes every connection open now. New connections are accepted as before.
    pub fn cut_all(&self) {
        self.shared.conns.cut_all();
    }

    /// While blocked, new connections are closed as soon as they are accepted.
    /// Open connections are left alone: combine with [`FaultProxy::cut_all`] for a full outage.
    pub fn set_blocked(&self, blocked: bool) {
        self.shared.conns.blocked.store(blocked, Ordering::SeqCst);
    }

    /// How many connections have been accepted (blocked ones included).
    pub fn connections_accepted(&self) -> u64 {
        self.shared.conns.accepted.load(Ordering::SeqCst)
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.cut_all();
        self.stop.cancel();
    }
}

async fn forward(mut inbound: TcpStream, shared: Arc<Shared>) {
    let Ok(mut outbound) = TcpStream::connect(shared.target).await else {
        return;
    };
    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
}

/// An HTTP proxy in front of the apiserver that can throttle watches, corrupt watch events,
/// and cut or refuse connections; it records every request it handles.
pub struct HttpFaultProxy {
    addr: SocketAddr,
    shared: Arc<HttpShared>,
    stop: CancellationToken,
}

/// How the proxy classified a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestKind {
    /// A GET with `watch=true` (or `watch=1`).
    Watch,
    /// Any other GET: a LIST when the path is a collection.
    Get,
    /// Any other method.
    Other,
}

/// One request the [`HttpFaultProxy`] handled.
#[derive(Debug, Clone)]
pub struct ProxiedRequest {
    /// What kind of request it was.
    pub kind: RequestKind,
    /// The URL path, e.g. `/api/v1/namespaces/ns/configmaps`.
    pub path: String,
    /// The query string as sent (not percent-decoded), "" if none.
    pub query: String,
    /// The status code of the answer (the apiserver's, or the proxy's own 429).
    pub status: u16,
    /// Whether the proxy answered it itself (an injected 429) instead of forwarding it.
    pub throttled: bool,
    /// When the request arrived.
    pub at: std::time::Instant,
}

impl ProxiedRequest {
    /// The raw value of query parameter `name`, if present.
    pub fn param(&self, name: &str) -> Option<&str> {
        query_param(&self.query, name)
    }

    /// A watch with `sendInitialEvents=true`: a streaming list.
    pub fn is_streaming_list(&self) -> bool {
        self.kind == RequestKind::Watch && self.param("sendInitialEvents") == Some("true")
    }
}

struct HttpShared {
    conns: Connections,
    tls: TlsAcceptor,
    /// The proxy's own client to the apiserver (the admin user).
    upstream: Client,
    faults: Mutex<HttpFaults>,
    log: Mutex<Vec<ProxiedRequest>>,
}

/// Faults armed by the test, keyed by URL path.
#[derive(Default)]
struct HttpFaults {
    /// Watches still to answer with 429, and the `Retry-After` seconds to send.
    throttle: HashMap<String, (u32, u32)>,
    /// Watch event lines still to replace with an undecodable line.
    corrupt: HashMap<String, u32>,
    /// How long every watch stream's bytes are held before they are passed on.
    watch_delay: std::time::Duration,
}

impl HttpFaults {
    /// Counts down one throttled watch of `path`: the `Retry-After` seconds to answer with.
    fn take_throttle(&mut self, path: &str) -> Option<u32> {
        let (left, secs) = self.throttle.get_mut(path)?;
        *left = left.checked_sub(1)?;
        Some(*secs)
    }

    /// Counts down one corrupted event of `path`: whether to corrupt this one.
    fn take_corrupt(&mut self, path: &str) -> bool {
        self.corrupt
            .get_mut(path)
            .and_then(|left| left.checked_sub(1).map(|n| *left = n))
            .is_some()
    }
}

/// What replaces a corrupted watch event: valid JSON with an event type, but its object is a
/// string, so no decoder can make an event of it.
pub const UNDECODABLE_EVENT_LINE: &str =
    r#"{"type":"MODIFIED","object":"kubeloop fault proxy: this is not an object"}"#;

type ProxyBody = UnsyncBoxBody<Bytes, Box<dyn std::error::Error + Send + Sync>>;

impl HttpFaultProxy {
    /// Listens on a free loopback port with a serving certificate from `cluster`'s CA and
    /// forwards every request to its apiserver as the admin user. Runs on the current tokio
    /// runtime until the proxy is dropped.
    pub async fn start(cluster: &Cluster) -> Result<Self, TestEnvError> {
        let (cert, key) = cluster.serving_identity("fault-proxy")?;
        let tls_error =
            |e: rustls::Error| TestEnvError::Certificates(format!("fault proxy TLS: {e}"));
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(tls_error)?
        .with_no_client_auth()
        .with_single_cert(
            vec![cert.into()],
            rustls::pki_types::PrivateKeyDer::Pkcs8(key.into()),
        )
        .map_err(tls_error)?;
        // The apiserver's own answers pass through as they are: no retry layer in between.
        let mut upstream = cluster.client_config();
        upstream.default_retry = false;
        let upstream = Client::try_from(upstream)?;
        let (listener, addr) = bind().await?;
        let shared = Arc::new(HttpShared {
            conns: Connections::new(),
            tls: TlsAcceptor::from(Arc::new(config)),
            upstream,
            faults: Mutex::default(),
            log: Mutex::default(),
        });
        let stop = CancellationToken::new();
        spawn_accept_loop(
            listener,
            shared.clone(),
            |s| &s.conns,
            stop.clone(),
            serve_http,
        );
        Ok(Self { addr, shared, stop })
    }

    /// The address clients should connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Answers the next `count` watch requests for `path` (the collection path, e.g.
    /// `/api/v1/namespaces/ns/configmaps`) itself, without asking the apiserver: `429 Too
    /// Many Requests` with `Retry-After: <retry_after_secs>` and a `Status` (reason
    /// `TooManyRequests`, code 429, `details.retryAfterSeconds`), the answer of the
    /// apiserver's watch cache while it is not ready (apiserver `cacher.go`'s
    /// `NewTooManyRequests`; `responsewriters.ErrorNegotiated` copies the delay into the
    /// header). Priority and fairness rejects with the same header and a plain-text body.
    /// Replaces what was armed for `path` before.
    pub fn throttle_watches(&self, path: &str, count: u32, retry_after_secs: u32) {
        self.shared
            .faults
            .lock()
            .throttle
            .insert(path.to_string(), (count, retry_after_secs));
    }

    /// Replaces the next `count` event lines (ADDED, MODIFIED, DELETED; bookmarks and errors
    /// pass) on the open and future watch streams of `path` with [`UNDECODABLE_EVENT_LINE`].
    pub fn corrupt_watch_events(&self, path: &str, count: u32) {
        self.shared
            .faults
            .lock()
            .corrupt
            .insert(path.to_string(), count);
    }

    /// Holds what every watch stream (open or future) delivers for `delay` before passing it
    /// on, in order: a slow informer, whose events arrive `delay` after the apiserver sent
    /// them. Zero turns it off.
    pub fn delay_watches(&self, delay: std::time::Duration) {
        self.shared.faults.lock().watch_delay = delay;
    }

    /// Every request handled so far, in arrival order.
    pub fn requests(&self) -> Vec<ProxiedRequest> {
        self.shared.log.lock().clone()
    }

    /// GETs of `path` that were not watches (LISTs, for a collection path).
    pub fn lists(&self, path: &str) -> usize {
        self.count(|r| r.kind == RequestKind::Get && r.path == path)
    }

    /// Watches of `path` forwarded to the apiserver (the throttled ones are not).
    pub fn watches(&self, path: &str) -> usize {
        self.count(|r| r.kind == RequestKind::Watch && r.path == path && !r.throttled)
    }

    fn count(&self, f: impl Fn(&ProxiedRequest) -> bool) -> usize {
        self.shared.log.lock().iter().filter(|r| f(r)).count()
    }

    /// Closes every connection open now (watches end mid-stream). New connections are
    /// accepted as before.
    pub fn cut_all(&self) {
        self.shared.conns.cut_all();
    }

    /// While blocked, new connections are closed as soon as they are accepted.
    pub fn set_blocked(&self, blocked: bool) {
        self.shared.conns.blocked.store(blocked, Ordering::SeqCst);
    }

    /// How many connections have been accepted (blocked ones included).
    pub fn connections_accepted(&self) -> u64 {
        self.shared.conns.accepted.load(Ordering::SeqCst)
    }
}

impl Drop for HttpFaultProxy {
    fn drop(&mut self) {
        self.cut_all();
        self.stop.cancel();
    }
}

async fn serve_http(inbound: TcpStream, shared: Arc<HttpShared>) {
    let Ok(tls) = shared.tls.accept(inbound).await else {
        return;
    };
    let service = hyper::service::service_fn(move |req| {
        let shared = shared.clone();
        async move { Ok::<_, Infallible>(handle(&shared, req).await) }
    });
    let _ = hyper::server::conn::http1::Builder::new()
        .serve_connection(TokioIo::new(tls), service)
        .await;
}

fn query_param<'q>(query: &'q str, name: &str) -> Option<&'q str> {
    query
        .split('&')
        .filter_map(|kv| kv.split_once('=').or(Some((kv, ""))))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
}

/// Headers that belong to one connection, not to the request or response (RFC 9110 7.6.1),
/// plus the ones the next hop sets itself.
fn end_to_end(headers: &http::HeaderMap) -> http::HeaderMap {
    use http::header::*;
    let mut out = headers.clone();
    for h in [
        CONNECTION,
        HOST,
        CONTENT_LENGTH,
        TRANSFER_ENCODING,
        TE,
        TRAILER,
        UPGRADE,
        PROXY_AUTHORIZATION,
        PROXY_AUTHENTICATE,
    ] {
        out.remove(h);
    }
    out.remove("keep-alive");
    out
}

fn full(body: impl Into<Bytes>) -> ProxyBody {
    Full::new(body.into())
        .map_err(|e| match e {})
        .boxed_unsync()
}

fn too_many_requests(retry_after_secs: u32) -> http::Response<ProxyBody> {
    let status = serde_json::json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": "kubeloop fault proxy: too many requests, please try again later",
        "reason": "TooManyRequests",
        "details": {"retryAfterSeconds": retry_after_secs},
        "code": 429,
    });
    let mut res = http::Response::new(full(status.to_string()));
    *res.status_mut() = http::StatusCode::TOO_MANY_REQUESTS;
    let headers = res.headers_mut();
    headers.insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    headers.insert(http::header::RETRY_AFTER, retry_after_secs.into());
    res
}

fn bad_gateway(detail: String) -> http::Response<ProxyBody> {
    let mut res = http::Response::new(full(detail));
    *res.status_mut() = http::StatusCode::BAD_GATEWAY;
    res
}

async fn handle(
    shared: &Arc<HttpShared>,
    req: http::Request<Incoming>,
) -> http::Response<ProxyBody> {
    let path = req.uri().path().to_string();
    let query = req.uri().query().unwrap_or_default().to_string();
    let kind = if req.method() != http::Method::GET {
        RequestKind::Other
    } else if matches!(query_param(&query, "watch"), Some("true" | "1")) {
        RequestKind::Watch
    } else {
        RequestKind::Get
    };
    let mut entry = ProxiedRequest {
        kind,
        path: path.clone(),
        query,
        status: 0,
        throttled: false,
        at: std::time::Instant::now(),
    };
    let throttle = match kind {
        RequestKind::Watch => shared.faults.lock().take_throttle(&path),
        _ => None,
    };
    if let Some(secs) = throttle {
        entry.status = 429;
        entry.throttled = true;
        shared.log.lock().push(entry);
        return too_many_requests(secs);
    }
    let res = forward_http(shared, req).await;
    entry.status = res.status().as_u16();
    shared.log.lock().push(entry);
    if kind == RequestKind::Watch && res.status().is_success() {
        let (parts, body) = res.into_parts();
        let framing = Framing::of(&parts.headers);
        return http::Response::from_parts(parts, corrupting(body, framing, path, shared.clone()));
    }
    res
}

/// Sends the request on to the apiserver through the proxy's own client.
async fn forward_http(
    shared: &HttpShared,
    req: http::Request<Incoming>,
) -> http::Response<ProxyBody> {
    let (parts, body) = req.into_parts();
    let body = match body.collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => return bad_gateway(format!("reading the request body: {e}")),
    };
    let Some(path_and_query) = parts.uri.path_and_query().cloned() else {
        return bad_gateway("request without a path".into());
    };
    let mut upstream = http::Request::new(Body::from(body));
    *upstream.method_mut() = parts.method;
    *upstream.uri_mut() = path_and_query.into();
    *upstream.headers_mut() = end_to_end(&parts.headers);
    // The proxy's own credentials speak for the client: a token the client sent is not passed on.
    upstream.headers_mut().remove(http::header::AUTHORIZATION);
    match shared.upstream.send(upstream).await {
        Ok(res) => {
            let (mut parts, body) = res.into_parts();
            parts.headers = end_to_end(&parts.headers);
            http::Response::from_parts(parts, body.map_err(Into::into).boxed_unsync())
        }
        Err(e) => bad_gateway(format!("forwarding to the apiserver: {e}")),
    }
}

/// A watch body passed on event by event (JSON lines or protobuf frames, as `framing` says),
/// with the events the test armed for `path` replaced by ones that are not events, and held
/// for the armed delay.
fn corrupting(
    body: ProxyBody,
    framing: Framing,
    path: String,
    shared: Arc<HttpShared>,
) -> ProxyBody {
    struct Events {
        body: http_body_util::BodyDataStream<ProxyBody>,
        /// Bytes of an unfinished event.
        partial: Vec<u8>,
    }
    let state = Events {
        body: body.into_data_stream(),
        partial: Vec::new(),
    };
    let delay = shared.clone();
    let chunks = futures::stream::unfold(state, move |mut st| {
        let shared = shared.clone();
        let path = path.clone();
        async move {
            loop {
                match st.body.next().await {
                    Some(Ok(chunk)) => {
                        st.partial.extend_from_slice(&chunk);
                        let (out, whole) =
                            corrupt_events(framing, &st.partial, &path, &shared.faults);
                        if whole == 0 {
                            continue;
                        }
                        st.partial.drain(..whole);
                        return Some((Ok(Bytes::from(out)), st));
                    }
                    Some(Err(e)) => return Some((Err(e), st)),
                    None if st.partial.is_empty() => return None,
                    None => {
                        let rest = std::mem::take(&mut st.partial);
                        return Some((Ok(Bytes::from(rest)), st));
                    }
                }
            }
        }
    });
    StreamBody::new(delayed(chunks, delay).map_ok(Frame::data)).boxed_unsync()
}

/// `chunks` passed on each `watch_delay` (as armed when it arrives) after it arrived: a reader
/// task stamps them as they come, so a burst is delayed, not stretched.
fn delayed<S>(
    chunks: S,
    shared: Arc<HttpShared>,
) -> impl futures::Stream<Item = Result<Bytes, Box<dyn std::error::Error + Send + Sync>>>
where
    S: futures::Stream<Item = Result<Bytes, Box<dyn std::error::Error + Send + Sync>>>
        + Send
        + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        futures::pin_mut!(chunks);
        while let Some(chunk) = chunks.next().await {
            let due = tokio::time::Instant::now() + shared.faults.lock().watch_delay;
            if tx.send((due, chunk)).is_err() {
                return;
            }
        }
    });
    futures::stream::unfold(rx, |mut rx| async move {
        let (due, chunk) = rx.recv().await?;
        tokio::time::sleep_until(due).await;
        Some((chunk, rx))
    })
}

/// How a watch body is cut into events: JSON lines, or protobuf's frames (a 4-byte
/// big-endian length, then the `WatchEvent`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Framing {
    Lines,
    Frames,
}

impl Framing {
    fn of(headers: &http::HeaderMap) -> Self {
        let protobuf = headers
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with(kubeloop::protobuf::CONTENT_TYPE));
        if protobuf { Self::Frames } else { Self::Lines }
    }

    /// The events at the start of `buf` that have arrived whole, each as its bytes.
    fn events(self, buf: &[u8]) -> Vec<&[u8]> {
        match self {
            Self::Lines => buf
                .split_inclusive(|b| *b == b'\n')
                .filter(|line| line.ends_with(b"\n"))
                .collect(),
            Self::Frames => {
                let mut events = Vec::new();
                let mut at = 0;
                while let Some(head) = buf.get(at..at + 4) {
                    let len = u32::from_be_bytes(head.try_into().expect("4 bytes")) as usize;
                    let Some(frame) = buf.get(at..at + 4 + len) else {
                        break;
                    };
                    events.push(frame);
                    at += 4 + len;
                }
                events
            }
        }
    }

    /// Whether `event` (its bytes on the wire) is an `ADDED`, `MODIFIED` or `DELETED`.
    fn is_change(self, event: &[u8]) -> bool {
        let event_type = match self {
            // As the apiserver writes it: `{"type":"ADDED",...`.
            Self::Lines => event.strip_prefix(br#"{"type":""#).and_then(|rest| {
                let end = rest.iter().position(|b| *b == b'"')?;
                std::str::from_utf8(&rest[..end]).ok()
            }),
            Self::Frames => kubeloop::protobuf::RawWatchEvent::parse(&event[4..])
                .ok()
                .map(|e| e.event_type),
        };
        matches!(event_type, Some("ADDED" | "MODIFIED" | "DELETED"))
    }

    /// An event that is not one: [`UNDECODABLE_EVENT_LINE`], or a protobuf `WatchEvent`
    /// `MODIFIED` whose object is the same text where its envelope should be.
    fn undecodable(self) -> Vec<u8> {
        match self {
            Self::Lines => format!("{UNDECODABLE_EVENT_LINE}\n").into_bytes(),
            Self::Frames => {
                let text = b"kubeloop fault proxy: this is not an object";
                let delimited = |tag: u8, bytes: &[u8]| {
                    let mut field = vec![tag << 3 | 2, bytes.len() as u8];
                    field.extend_from_slice(bytes);
                    field
                };
                let event = [delimited(1, b"MODIFIED"), delimited(2, &delimited(1, text))].concat();
                [&(event.len() as u32).to_be_bytes()[..], &event].concat()
            }
        }
    }
}

/// The whole events at the start of `buf` in `framing`, the armed ones replaced, and how many
/// bytes of `buf` they took (the rest is an event still arriving).
fn corrupt_events(
    framing: Framing,
    buf: &[u8],
    path: &str,
    faults: &Mutex<HttpFaults>,
) -> (Vec<u8>, usize) {
    let mut out = Vec::with_capacity(buf.len());
    let mut whole = 0;
    for event in framing.events(buf) {
        whole += event.len();
        if framing.is_change(event) && faults.lock().take_corrupt(path) {
            tracing::info!(%path, "fault proxy: corrupting a watch event");
            out.extend(framing.undecodable());
        } else {
            out.extend_from_slice(event);
        }
    }
    (out, whole)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_params_are_found_by_name() {
        let q = "watch=1&resourceVersion=42&sendInitialEvents=true&allowWatchBookmarks";
        assert_eq!(query_param(q, "watch"), Some("1"));
        assert_eq!(query_param(q, "resourceVersion"), Some("42"));
        assert_eq!(query_param(q, "allowWatchBookmarks"), Some(""));
        assert_eq!(query_param(q, "limit"), None);
        assert_eq!(query_param("", "watch"), None);
    }

    #[test]
    fn throttles_count_down_per_path() {
        let mut faults = HttpFaults::default();
        faults.throttle.insert("/p".into(), (2, 3));
        assert_eq!(faults.take_throttle("/p"), Some(3));
        assert_eq!(faults.take_throttle("/other"), None);
        assert_eq!(faults.take_throttle("/p"), Some(3));
        assert_eq!(faults.take_throttle("/p"), None);
    }

    #[test]
    fn only_the_armed_number_of_event_lines_is_corrupted() {
        let faults = Mutex::new(HttpFaults::default());
        faults.lock().corrupt.insert("/p".into(), 1);
        let bookmark = r#"{"type":"BOOKMARK","object":{"kind":"ConfigMap","metadata":{"resourceVersion":"9"}}}"#;
        let added = r#"{"type":"ADDED","object":{"kind":"ConfigMap","metadata":{"name":"a"}}}"#;
        let lines = format!("{bookmark}\n{added}\n{added}\n");
        let (out, _) = corrupt_events(Framing::Lines, lines.as_bytes(), "/p", &faults);
        let expected = format!("{bookmark}\n{UNDECODABLE_EVENT_LINE}\n{added}\n");
        assert_eq!(String::from_utf8(out).unwrap(), expected);
        // Another path's stream is left alone.
        faults.lock().corrupt.insert("/p".into(), 1);
        let (out, _) = corrupt_events(Framing::Lines, lines.as_bytes(), "/q", &faults);
        assert_eq!(out, lines.as_bytes());
    }

    #[test]
    fn a_protobuf_stream_is_cut_into_frames_and_the_armed_one_replaced() {
        use kubeloop::protobuf::{Frames, RawWatchEvent};
        let frame = |event: &[u8]| [&(event.len() as u32).to_be_bytes()[..], event].concat();
        // {type: ADDED, object: {raw: k8s\0 + Unknown{typeMeta: {v1, ConfigMap}}}}.
        let object = b"k8s\0\x0a\x0f\x0a\x02v1\x12\x09ConfigMap";
        let mut added = b"\x0a\x05ADDED\x12\x17\x0a\x15".to_vec();
        added.extend_from_slice(object);
        assert!(RawWatchEvent::parse(&added).is_ok());
        let stream = [frame(&added), frame(&added)].concat();
        let faults = Mutex::new(HttpFaults::default());
        // A frame still arriving is left for the next chunk.
        let (_, whole) =
            corrupt_events(Framing::Frames, &stream[..stream.len() - 1], "/p", &faults);
        assert_eq!(whole, stream.len() / 2);
        faults.lock().corrupt.insert("/p".into(), 1);
        let (out, _) = corrupt_events(Framing::Frames, &stream, "/p", &faults);
        let mut frames = Frames::new();
        frames.push(&out);
        let first = frames.next_frame().unwrap().to_vec();
        let err = RawWatchEvent::parse(&first).unwrap_err();
        assert!(err.to_string().contains("k8s"), "{err}");
        assert_eq!(frames.next_frame().unwrap(), &added[..]);
    }
}
