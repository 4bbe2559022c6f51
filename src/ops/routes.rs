//! What the ops servers answer: Prometheus metrics on `/metrics`, liveness on `/healthz` (and
//! `/livez`), readiness on `/readyz`, the followed keys' journeys on `/debug/trace` (as text)
//! and `/debug/journey` (a page, [`super::journey`]), the fair queues' keys on `/debug/queue`.
//!
//! Counterparts: component-base's `metrics/legacyregistry` (one registry a process exposes),
//! k8s.io/apiserver's `pkg/server/healthz` (named checks, `?verbose` lists each one), and
//! controller-runtime's metrics server, whose filter (here [`super::filters`]) runs before any
//! handler of a protected path.
//!
//! Invariants: the registry is complete before serving starts (prometheus-client registries
//! are built, then shared read-only); checks run on every probe, never cached, so a probe
//! tells the state at the moment it is asked; with an [`super::Authorizer`] configured,
//! `/metrics` and the `/debug/` pages answer nothing before it let the request through.

use std::sync::Arc;

use http::{Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use prometheus_client::registry::Registry;
use tokio_rustls::rustls;

use super::filters::Authorizer;
use super::journey::{JourneyQuery, JourneySource, LocalTrace};
use super::limits::ServerLimits;
use crate::leaderelection::HealthzAdaptor;

/// What one server exposes, and how. Metrics and probes can share a server or use two.
#[derive(Clone, Default)]
pub struct ServeConfig {
    /// Served on `/metrics` when present.
    pub registry: Option<Arc<Registry>>,
    /// Whether `/debug/trace`, `/debug/queue` and `/debug/journey` are served (the metrics
    /// server only: they show followed keys, resourceVersions, reconcile errors and
    /// namespaces).
    pub trace: bool,
    /// Where `/debug/journey` takes its data from when present (`kubeloop trace --serve`);
    /// with `trace` and none, this process's trace ([`super::journey::LocalTrace`]).
    pub journey: Option<Arc<dyn JourneySource>>,
    /// Served on `/healthz` (and `/livez`) when non-empty.
    pub healthz: Vec<Arc<dyn Check>>,
    /// Served on `/readyz` when non-empty.
    pub readyz: Vec<Arc<dyn Check>>,
    /// When present, `/metrics` and `/debug/trace` answer only requests it lets through (401,
    /// 403 otherwise). Probes never go through it: a kubelet has no token.
    pub auth: Option<Arc<Authorizer>>,
    /// HTTPS with this configuration when present; plain HTTP otherwise.
    pub tls: Option<Arc<rustls::ServerConfig>>,
    /// Timeouts, header size and connection cap.
    pub limits: ServerLimits,
}

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

/// Plugs leader election's health check straight into the ops server:
/// `healthz: vec![Arc::new(adaptor.clone())]`. The impl lives here, not beside the adaptor, so
/// that ops depends on leader election and never the reverse.
impl Check for HealthzAdaptor {
    fn name(&self) -> &str {
        HealthzAdaptor::name(self)
    }

    fn check(&self) -> Result<(), String> {
        HealthzAdaptor::check(self).map_err(|e| e.to_string())
    }
}

/// Answers one request: the protected paths go through the authorizer first (verb and path as
/// the request has them), then every path is routed.
pub(super) async fn route(config: &ServeConfig, req: Request<Incoming>) -> Response<Full<Bytes>> {
    let path = req.uri().path();
    let protected = match path {
        "/metrics" => config.registry.is_some(),
        "/debug/trace" | "/debug/queue" => config.trace,
        "/debug/journey" => config.trace || config.journey.is_some(),
        _ => false,
    };
    if let (true, Some(auth)) = (protected, &config.auth) {
        if let Err(refusal) = auth.check(req.method(), path, req.headers()).await {
            match refusal.status() {
                StatusCode::INTERNAL_SERVER_ERROR => {
                    tracing::error!(path, error = %refusal, "ops server: cannot authorize a request")
                }
                _ => tracing::debug!(path, refusal = %refusal, "ops server: request refused"),
            }
            return text(refusal.status(), format!("{refusal}\n"));
        }
    }
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
        "/debug/trace" if config.trace => trace(req.uri().query().unwrap_or("")),
        "/debug/journey" if config.trace || config.journey.is_some() => {
            journey(config, req.uri().query().unwrap_or("")).await
        }
        "/debug/queue" if config.trace => text(
            StatusCode::OK,
            fair_queues(&crate::workqueue::fairness_by_queue()),
        ),
        _ => text(StatusCode::NOT_FOUND, "not found\n".into()),
    }
}

/// Keys listed per queue on `/debug/queue`, deepest first; the rest are counted.
const QUEUE_KEYS_SHOWN: usize = 50;

/// `/debug/queue`: each named fair queue's fairness keys with ready items, how many each has
/// and how long its oldest has waited (the per-key view the metrics leave out, see
/// `workqueue/metrics.rs`).
fn fair_queues(queues: &[(String, Vec<crate::workqueue::FairnessDepth>)]) -> String {
    use std::fmt::Write;
    if queues.is_empty() {
        return "no named queue with fairness keys in this process\n".to_owned();
    }
    let mut out = String::new();
    for (name, keys) in queues {
        let _ = writeln!(
            out,
            "queue {name}: {} fairness keys with ready items",
            keys.len()
        );
        for key in keys.iter().take(QUEUE_KEYS_SHOWN) {
            let shown = match key.keys.as_slice() {
                [] => "(none)".to_owned(),
                keys => keys.join(" / "),
            };
            let _ = writeln!(
                out,
                "  {shown:<40} {:>8} ready, oldest waiting {:.3}s",
                key.depth,
                key.longest_wait.as_secs_f64()
            );
        }
        if keys.len() > QUEUE_KEYS_SHOWN {
            let _ = writeln!(out, "  ... and {} more keys", keys.len() - QUEUE_KEYS_SHOWN);
        }
    }
    out
}

/// `/debug/trace?key=ns/name[&format=json]`: the steps [`crate::trace`] recorded for a
/// followed key, as a table (or JSON for `kubeloop trace`); without `key`, the followed keys.
fn trace(query: &str) -> Response<Full<Bytes>> {
    let mut key = None;
    let mut json = false;
    for pair in query.split('&') {
        match pair.split_once('=') {
            Some(("key", k)) => key = Some(super::journey::percent_decode(k)),
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

/// `/debug/journey`: the page, or with `format=json` the steps since `since` (of `key` only
/// if given) and the queues' depths, from the configured source.
async fn journey(config: &ServeConfig, query: &str) -> Response<Full<Bytes>> {
    if !query.split('&').any(|p| p == "format=json") {
        let mut response = text(StatusCode::OK, super::journey::page().to_owned());
        let headers = response.headers_mut();
        headers.insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("text/html; charset=utf-8"),
        );
        // Everything the page runs is in it; it may only fetch its own data.
        headers.insert(
            http::header::CONTENT_SECURITY_POLICY,
            http::HeaderValue::from_static(
                "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; \
                 connect-src 'self'",
            ),
        );
        return response;
    }
    let query = JourneyQuery::parse(query);
    let answer = match &config.journey {
        Some(source) => source.data(query).await,
        None => {
            LocalTrace {
                registry: config.registry.clone(),
            }
            .data(query)
            .await
        }
    };
    match answer {
        Ok(body) => {
            let mut response = text(StatusCode::OK, body);
            response.headers_mut().insert(
                http::header::CONTENT_TYPE,
                http::HeaderValue::from_static("application/json"),
            );
            response
        }
        Err(refusal) => text(refusal.status, format!("{}\n", refusal.words)),
    }
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
    use std::time::Duration;

    use tokio_util::sync::CancellationToken;

    use super::*;
    use crate::leaderelection::fake_lock::FakeLockStore;
    use crate::leaderelection::{LeaderCallbacks, LeaderElectionConfig, LeaderElector};

    /// The adaptor is a `Check` whose name and failure the probe reports; its verdicts are
    /// tested with the elector (leaderelection/elector/tests.rs).
    #[tokio::test(flavor = "current_thread")]
    async fn a_leader_election_adaptor_is_a_check_that_fails_once_its_leader_stalls() {
        let adaptor = HealthzAdaptor::new(Duration::from_millis(100));
        let check: &dyn Check = &adaptor;
        assert_eq!(check.name(), "leaderElection");
        assert_eq!(check.check(), Ok(()), "an unwired adaptor is healthy");

        let config = LeaderElectionConfig {
            lease_duration: Duration::from_secs(1),
            renew_deadline: Duration::from_millis(200),
            retry_period: Duration::from_millis(50),
            name: "ops".into(),
            ..Default::default()
        };
        let store = FakeLockStore::new();
        let elector = LeaderElector::new(config, store.lock_for("a")).unwrap();
        adaptor.set_leader_election(&elector);
        let leading = std::sync::Arc::new(tokio::sync::Notify::new());
        let started = leading.clone();
        let callbacks = LeaderCallbacks::new(
            move |ctx| {
                started.notify_one();
                async move { ctx.cancelled().await }
            },
            || {},
        );
        let stop = CancellationToken::new();
        let run = tokio::spawn({
            let (elector, stop) = (elector.clone(), stop.clone());
            async move { elector.run(callbacks, stop).await }
        });
        leading.notified().await;
        assert_eq!(
            check.check(),
            Ok(()),
            "a leader that just renewed is healthy"
        );

        // The process stalls (a blocking call on the runtime's only thread): no renewal runs,
        // and the leader's renewal is overdue past the deadline and the tolerance.
        std::thread::sleep(Duration::from_millis(400));
        let reason = check.check().unwrap_err();
        assert!(reason.contains("believes it leads"), "{reason}");
        assert!(reason.contains("\"ops\""), "{reason}");
        stop.cancel();
        run.await.unwrap();
    }
}
