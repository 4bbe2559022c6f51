//! The hook: a kube [`Client`] whose every request passes through the harness on its way to
//! the apiserver. The controller under test gets it in place of its own client, so its
//! informers' lists and watches and its reconciles' writes all go through here; nothing in the
//! runtime changes, and a controller run without it pays nothing.
//!
//! What it does with them:
//! - records each accepted write ([`Write`]) and each watch event handed to an informer
//!   ([`Delivery`]);
//! - asks for JSON where the informer asked for protobuf (the informers follow each answer's
//!   `Content-Type`), so that it can read the events it hands on;
//! - fires the armed [`Perturbation`] once: after the apiserver accepted the chosen write it
//!   never hands the answer back and signals a crash ([`Hook::crashes`]: the harness drops the
//!   controller's runtime and starts a fresh one); at the chosen event it holds that
//!   resource's watch streams back for the hold, in order, while other resources' streams
//!   flow; or from the chosen event it parks that object's events for the window and hands
//!   on only the last (the others' events flow on).

use std::collections::{HashMap, VecDeque};
use std::pin::Pin;
use std::sync::Arc;

use futures::{StreamExt, TryStreamExt};
use http::{Method, Request, Response};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Bytes, Frame};
use kube_client::Client;
use kube_client::client::Body;
use parking_lot::Mutex;
use serde::Deserialize;
use tokio::sync::watch;

use super::log::{Delivery, Fired, RunLog, Write, stable_name};
use super::plan::Perturbation;

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type HookBody = UnsyncBoxBody<Bytes, BoxError>;

/// One run's hook: shared by every incarnation of the controller in that run, so counts and
/// the armed plan carry over a restart.
#[derive(Clone)]
pub struct Hook {
    shared: Arc<Shared>,
}

struct Shared {
    state: Mutex<State>,
    /// Bumped for every crash the harness must carry out.
    crash: watch::Sender<u32>,
}

#[derive(Default)]
struct State {
    log: RunLog,
    armed: Option<Perturbation>,
    writes: HashMap<(String, String), u32>,
    events: HashMap<(String, String, String), u32>,
    /// Until when a resource's streams are held back (tokio's clock).
    held_until: HashMap<String, tokio::time::Instant>,
    /// The object (resource, name) whose events are coalesced, until when.
    coalescing: Option<(String, String, tokio::time::Instant)>,
}

impl Hook {
    /// A hook that records, and fires `armed` once if given.
    pub fn new(armed: Option<Perturbation>) -> Self {
        Hook {
            shared: Arc::new(Shared {
                state: Mutex::new(State {
                    armed,
                    ..Default::default()
                }),
                crash: watch::channel(0).0,
            }),
        }
    }

    /// A client through this hook to where `config` points. Call it inside the runtime the
    /// client will live in (kube's client spawns its request buffer there).
    pub fn client(&self, config: kube_client::Config) -> Result<Client, kube_client::Error> {
        let base = Client::try_from(config)?;
        let namespace = base.default_namespace().to_string();
        let shared = self.shared.clone();
        let service = tower::service_fn(move |request: Request<Body>| {
            let (base, shared) = (base.clone(), shared.clone());
            async move { shared.handle(base, request).await }
        });
        Ok(Client::new(service, namespace))
    }

    /// Changes each time the controller must crash (a fired crash plan, or [`Hook::crash_now`]).
    pub fn crashes(&self) -> watch::Receiver<u32> {
        self.shared.crash.subscribe()
    }

    /// Asks for a crash now (a workload's restart step).
    pub fn crash_now(&self) {
        self.shared.state.lock().log.restarts += 1;
        self.shared.crash.send_modify(|n| *n += 1);
    }

    /// What the run recorded so far.
    pub fn log(&self) -> RunLog {
        self.shared.state.lock().log.clone()
    }

    /// Whether a held view is still held (the harness waits for it before judging).
    pub fn holding(&self) -> bool {
        let now = tokio::time::Instant::now();
        self.shared
            .state
            .lock()
            .held_until
            .values()
            .any(|until| *until > now)
    }
}

/// A request's target, from its method and path.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Target {
    /// `plural.group`, `/subresource` appended.
    resource: String,
    verb: &'static str,
}

impl Target {
    fn of(method: &Method, uri: &http::Uri) -> Option<Self> {
        let path = uri.path();
        let rest = if let Some(rest) = path.strip_prefix("/api/v1/") {
            (String::new(), rest)
        } else {
            let rest = path.strip_prefix("/apis/")?;
            let mut parts = rest.splitn(3, '/');
            let (group, _version, rest) = (parts.next()?, parts.next()?, parts.next()?);
            (group.to_string(), rest)
        };
        let (group, rest) = rest;
        let mut segments: Vec<&str> = rest.split('/').filter(|s| !s.is_empty()).collect();
        if segments.len() >= 3 && segments[0] == "namespaces" {
            segments.drain(..2);
        }
        let plural = *segments.first()?;
        let named = segments.len() >= 2;
        let mut resource = if group.is_empty() {
            plural.to_string()
        } else {
            format!("{plural}.{group}")
        };
        if let Some(sub) = segments.get(2) {
            resource = format!("{resource}/{sub}");
        }
        let watch = uri
            .query()
            .is_some_and(|q| q.split('&').any(|p| p == "watch=true" || p == "watch=1"));
        let verb = match *method {
            Method::POST => "create",
            Method::PUT => "update",
            Method::PATCH => "patch",
            Method::DELETE if named => "delete",
            Method::DELETE => "deletecollection",
            _ if watch => "watch",
            _ => "get",
        };
        Some(Target { resource, verb })
    }

    fn is_write(&self) -> bool {
        matches!(self.verb, "create" | "update" | "patch" | "delete")
    }
}

/// The fields of an object (or of a watch event's object) the hook reads.
#[derive(Deserialize, Default)]
struct Meta {
    #[serde(default)]
    name: String,
    #[serde(default, rename = "generateName")]
    generate_name: Option<String>,
    #[serde(default, rename = "resourceVersion")]
    resource_version: String,
}

#[derive(Deserialize)]
struct Object {
    #[serde(default)]
    metadata: Meta,
}

#[derive(Deserialize)]
struct Event {
    #[serde(rename = "type")]
    event_type: String,
    object: Object,
}

fn full(bytes: Bytes) -> HookBody {
    Full::new(bytes)
        .map_err(|never| match never {})
        .boxed_unsync()
}

/// An `Accept` without its protobuf media ranges (JSON if nothing is left).
fn json_only(accept: &str) -> String {
    let kept: Vec<&str> = accept
        .split(',')
        .map(str::trim)
        .filter(|range| !range.contains("protobuf"))
        .collect();
    if kept.is_empty() {
        "application/json".to_string()
    } else {
        kept.join(", ")
    }
}

impl Shared {
    async fn handle(
        self: Arc<Self>,
        base: Client,
        mut request: Request<Body>,
    ) -> Result<Response<HookBody>, BoxError> {
        let target = Target::of(request.method(), request.uri());
        if let Some(accept) = request.headers().get(http::header::ACCEPT)
            && let Ok(text) = accept.to_str()
            && text.contains("protobuf")
        {
            let json = http::HeaderValue::from_str(&json_only(text))?;
            request.headers_mut().insert(http::header::ACCEPT, json);
        }
        let response = base.send(request).await?;
        let Some(target) = target else {
            return Ok(response.map(|body| body.map_err(BoxError::from).boxed_unsync()));
        };
        let (parts, body) = response.into_parts();
        if target.is_write() {
            let bytes = body.collect_bytes().await?;
            if parts.status.is_success() && self.record_write(&target, &bytes) {
                // The write is in etcd; the process that sent it never learns so.
                futures::future::pending::<()>().await;
            }
            return Ok(Response::from_parts(parts, full(bytes)));
        }
        if target.verb == "watch" && parts.status.is_success() {
            let chunks = body.into_data_stream().map_err(BoxError::from);
            let body = self.events(target.resource, chunks);
            return Ok(Response::from_parts(parts, body));
        }
        Ok(Response::from_parts(
            parts,
            body.map_err(BoxError::from).boxed_unsync(),
        ))
    }

    /// Records an accepted write; true if it is the one the armed crash waits for.
    fn record_write(&self, target: &Target, answer: &[u8]) -> bool {
        let meta = serde_json::from_slice::<Object>(answer)
            .map(|o| o.metadata)
            .unwrap_or_default();
        let at_micros = kubeloop::trace::now_micros().unwrap_or(0);
        let mut state = self.state.lock();
        let nth = next_ordinal(
            &mut state.writes,
            (target.resource.clone(), target.verb.to_string()),
        );
        let name = stable_name(&meta.name, meta.generate_name.as_deref());
        state.log.writes.push(Write {
            at_micros,
            resource: target.resource.clone(),
            verb: target.verb.to_string(),
            name: name.clone(),
            resource_version: meta.resource_version.clone(),
            nth,
        });
        let fires = matches!(&state.armed, Some(Perturbation::CrashAfterWrite { resource, verb, nth: n })
            if *resource == target.resource && verb == target.verb && *n == nth);
        if !fires {
            return false;
        }
        let plan = state.armed.take().expect("armed").to_string();
        tracing::info!(%plan, object = %name, rv = %meta.resource_version, "perturbation: crash after the write");
        state.log.fired.push(Fired {
            at_micros,
            plan,
            object: format!("{}/{name}", target.resource),
            resource_version: meta.resource_version,
            lasted_micros: 0,
        });
        state.log.restarts += 1;
        drop(state);
        self.crash.send_modify(|n| *n += 1);
        true
    }

    /// A watch body handed on line by line (the hook asked for JSON), each event recorded as
    /// it is handed on; held back while the resource's view is held; a coalesced object's
    /// events parked and only the last of the window handed on when it ends.
    fn events<S>(self: Arc<Self>, resource: String, chunks: S) -> HookBody
    where
        S: futures::Stream<Item = Result<Bytes, BoxError>> + Send + 'static,
    {
        struct Lines {
            body: Pin<Box<dyn futures::Stream<Item = Result<Bytes, BoxError>> + Send>>,
            partial: Vec<u8>,
            ready: VecDeque<Bytes>,
            /// A coalesced object's latest event, handed on at the instant.
            parked: Option<(Bytes, Seen, tokio::time::Instant)>,
            ended: bool,
        }
        let state = Lines {
            body: Box::pin(chunks),
            partial: Vec::new(),
            ready: VecDeque::new(),
            parked: None,
            ended: false,
        };
        let lines = futures::stream::unfold(state, move |mut st| {
            let (shared, resource) = (self.clone(), resource.clone());
            async move {
                loop {
                    if let Some(line) = st.ready.pop_front() {
                        match shared.decide(&resource, &line) {
                            Decision::Pass { seen, wait } => {
                                if let Some(until) = wait {
                                    tokio::time::sleep_until(until).await;
                                }
                                if let Some(seen) = seen {
                                    shared.delivered(&resource, seen);
                                }
                                return Some((Ok(line), st));
                            }
                            Decision::Park { seen, until } => {
                                // A newer event of the object replaces the parked one: the
                                // informer never sees the state in between.
                                st.parked = Some((line, seen, until));
                                continue;
                            }
                        }
                    }
                    if st.ended {
                        if let Some((line, seen, _)) = st.parked.take() {
                            shared.delivered(&resource, seen);
                            return Some((Ok(line), st));
                        }
                        if st.partial.is_empty() {
                            return None;
                        }
                        let rest = Bytes::from(std::mem::take(&mut st.partial));
                        return Some((Ok(rest), st));
                    }
                    let due = st.parked.as_ref().map(|(_, _, until)| *until);
                    let next = match due {
                        Some(until) => tokio::select! {
                            next = st.body.next() => Some(next),
                            _ = tokio::time::sleep_until(until) => None,
                        },
                        None => Some(st.body.next().await),
                    };
                    match next {
                        None => {
                            let (line, seen, _) = st.parked.take().expect("parked");
                            shared.delivered(&resource, seen);
                            return Some((Ok(line), st));
                        }
                        Some(Some(Ok(chunk))) => {
                            st.partial.extend_from_slice(&chunk);
                            while let Some(end) = st.partial.iter().position(|b| *b == b'\n') {
                                let line: Vec<u8> = st.partial.drain(..=end).collect();
                                st.ready.push_back(Bytes::from(line));
                            }
                        }
                        Some(Some(Err(e))) => return Some((Err(e), st)),
                        Some(None) => st.ended = true,
                    }
                }
            }
        });
        StreamBody::new(lines.map(|line| line.map(Frame::data))).boxed_unsync()
    }

    /// What to do with one event line before the informer gets it: counts it, fires a plan
    /// armed for it, and says whether it waits out a held view or is parked by a coalesced
    /// one.
    fn decide(&self, resource: &str, line: &[u8]) -> Decision {
        let Ok(event) = serde_json::from_slice::<Event>(line) else {
            return Decision::Pass {
                seen: None,
                wait: None,
            };
        };
        if !matches!(event.event_type.as_str(), "ADDED" | "MODIFIED" | "DELETED") {
            // Bookmarks and errors pass, in order, after any hold.
            let wait = self.state.lock().held_until.get(resource).copied();
            return Decision::Pass { seen: None, wait };
        }
        let meta = event.object.metadata;
        let name = stable_name(&meta.name, meta.generate_name.as_deref());
        let mut state = self.state.lock();
        let nth = next_ordinal(
            &mut state.events,
            (resource.to_string(), event.event_type.clone(), name.clone()),
        );
        let seen = Seen {
            event_type: event.event_type,
            name,
            resource_version: meta.resource_version,
            nth,
        };
        let fires = state
            .armed
            .as_ref()
            .and_then(|plan| plan.event_point())
            .is_some_and(|(r, event_type, name, n)| {
                r == resource && event_type == seen.event_type && name == seen.name && n == nth
            });
        let now = tokio::time::Instant::now();
        if fires {
            let plan = state.armed.take().expect("armed");
            let lasts = match &plan {
                Perturbation::StaleView { hold, .. } => {
                    state.held_until.insert(resource.to_string(), now + *hold);
                    *hold
                }
                Perturbation::Coalesce { window, .. } => {
                    state.coalescing =
                        Some((resource.to_string(), seen.name.clone(), now + *window));
                    *window
                }
                Perturbation::CrashAfterWrite { .. } => unreachable!("not an event's plan"),
            };
            tracing::info!(plan = %plan, object = %seen.name, rv = %seen.resource_version, "perturbation fired");
            state.log.fired.push(Fired {
                at_micros: kubeloop::trace::now_micros().unwrap_or(0),
                plan: plan.to_string(),
                object: format!("{resource}/{}", seen.name),
                resource_version: seen.resource_version.clone(),
                lasted_micros: lasts.as_micros() as u64,
            });
        }
        if let Some((r, name, until)) = &state.coalescing
            && r == resource
            && *name == seen.name
            && now < *until
        {
            let until = *until;
            return Decision::Park { seen, until };
        }
        let wait = state
            .held_until
            .get(resource)
            .copied()
            .filter(|until| *until > now);
        Decision::Pass {
            seen: Some(seen),
            wait,
        }
    }

    /// Records an event as handed to the informer.
    fn delivered(&self, resource: &str, seen: Seen) {
        self.state.lock().log.deliveries.push(Delivery {
            at_micros: kubeloop::trace::now_micros().unwrap_or(0),
            resource: resource.to_string(),
            event_type: seen.event_type,
            name: seen.name,
            resource_version: seen.resource_version,
            nth: seen.nth,
        });
    }
}

/// Counts one more of `key` in `counts`: its ordinal in the run, from 1.
fn next_ordinal<K: std::hash::Hash + Eq>(counts: &mut HashMap<K, u32>, key: K) -> u32 {
    let count = counts.entry(key).or_default();
    *count += 1;
    *count
}

/// An event line as [`Shared::decide`] read it.
struct Seen {
    event_type: String,
    name: String,
    resource_version: String,
    nth: u32,
}

enum Decision {
    /// Hand it on (after `wait`, a held view's end); `seen` if it is a change event.
    Pass {
        seen: Option<Seen>,
        wait: Option<tokio::time::Instant>,
    },
    /// Park it (replacing a parked event of the same object) until `until`.
    Park {
        seen: Seen,
        until: tokio::time::Instant,
    },
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn target(method: Method, uri: &str) -> Target {
        Target::of(&method, &uri.parse().unwrap()).unwrap()
    }

    #[test]
    fn targets_name_the_resource_group_subresource_and_verb() {
        let t = target(
            Method::POST,
            "/apis/apps/v1/namespaces/ns/deployments?fieldManager=x",
        );
        assert_eq!(
            (t.resource.as_str(), t.verb),
            ("deployments.apps", "create")
        );
        let t = target(
            Method::PUT,
            "/apis/samplecontroller.k8s.io/v1alpha1/namespaces/ns/foos/f/status",
        );
        assert_eq!(
            (t.resource.as_str(), t.verb),
            ("foos.samplecontroller.k8s.io/status", "update")
        );
        let t = target(
            Method::GET,
            "/api/v1/namespaces/ns/configmaps?watch=true&rv=1",
        );
        assert_eq!((t.resource.as_str(), t.verb), ("configmaps", "watch"));
        let t = target(Method::DELETE, "/api/v1/namespaces/ns");
        assert_eq!((t.resource.as_str(), t.verb), ("namespaces", "delete"));
        let t = target(Method::PATCH, "/api/v1/nodes/n1/status");
        assert_eq!((t.resource.as_str(), t.verb), ("nodes/status", "patch"));
        assert_eq!(Target::of(&Method::GET, &"/version".parse().unwrap()), None);
    }

    #[test]
    fn protobuf_is_taken_out_of_an_accept() {
        assert_eq!(
            json_only("application/vnd.kubernetes.protobuf, application/json"),
            "application/json"
        );
        assert_eq!(
            json_only(
                "application/vnd.kubernetes.protobuf;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"
            ),
            "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"
        );
        assert_eq!(
            json_only("application/vnd.kubernetes.protobuf"),
            "application/json"
        );
    }

    fn line(event_type: &str, name: &str, rv: u32) -> String {
        format!(
            r#"{{"type":"{event_type}","object":{{"metadata":{{"name":"{name}","generateName":"dep-","resourceVersion":"{rv}"}}}}}}"#
        ) + "\n"
    }

    /// Sends `lines` through the hook's watch stream at their times (paused clock); what came
    /// out, each with when it came out.
    async fn through(hook: &Hook, lines: Vec<(u64, String)>) -> Vec<(u64, String)> {
        let (tx, rx) = futures::channel::mpsc::unbounded::<Result<Bytes, BoxError>>();
        let start = tokio::time::Instant::now();
        tokio::spawn(async move {
            for (at, line) in lines {
                tokio::time::sleep_until(start + Duration::from_secs(at)).await;
                tx.unbounded_send(Ok(Bytes::from(line))).unwrap();
            }
        });
        let mut body = hook
            .shared
            .clone()
            .events("deployments.apps".into(), rx)
            .into_data_stream();
        let mut out = Vec::new();
        while let Some(chunk) = body.next().await {
            let text = String::from_utf8(chunk.unwrap().to_vec()).unwrap();
            out.push((start.elapsed().as_secs(), text));
        }
        out
    }

    #[tokio::test(start_paused = true)]
    async fn a_held_view_fires_once_and_holds_the_events_after_it() {
        let hook = Hook::new(Some(
            "stale:deployments.apps:ADDED:dep-*:1:6000ms"
                .parse()
                .unwrap(),
        ));
        let out = through(
            &hook,
            vec![
                (0, line("MODIFIED", "dep-abc", 1)),
                (1, line("ADDED", "dep-abc", 2)),
                (2, line("ADDED", "dep-xyz", 3)),
                (9, line("ADDED", "dep-xyz", 4)),
            ],
        )
        .await;
        let times: Vec<u64> = out.iter().map(|(at, _)| *at).collect();
        // Held from the armed event (t=1) for 6 s, in order; fired once, so t=9 passes at once.
        assert_eq!(times, vec![0, 7, 7, 9]);
        let log = hook.log();
        assert_eq!(log.fired.len(), 1);
        assert_eq!(log.fired[0].object, "deployments.apps/dep-*");
        assert_eq!(log.fired[0].resource_version, "2");
        assert_eq!(
            log.deliveries.iter().map(|d| d.nth).collect::<Vec<_>>(),
            vec![1, 1, 2, 3]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_coalesced_object_hands_on_only_its_last_event_of_the_window() {
        let hook = Hook::new(Some(
            "coalesce:deployments.apps:MODIFIED:a:1:3000ms"
                .parse()
                .unwrap(),
        ));
        let out = through(
            &hook,
            vec![
                (0, line("MODIFIED", "a", 1)),
                (1, line("MODIFIED", "b", 2)),
                (2, line("MODIFIED", "a", 3)),
                (5, line("MODIFIED", "a", 4)),
            ],
        )
        .await;
        let got: Vec<(u64, &str)> = out
            .iter()
            .map(|(at, l)| {
                (
                    *at,
                    if l.contains(r#""name":"a""#) {
                        "a"
                    } else {
                        "b"
                    },
                )
            })
            .collect();
        // a's rv 1 is dropped: rv 3 comes out when the window ends (t=3); b is not held.
        assert_eq!(got, vec![(1, "b"), (3, "a"), (5, "a")]);
        assert!(out[1].1.contains(r#""resourceVersion":"3""#));
        let log = hook.log();
        assert_eq!(log.fired.len(), 1);
        assert_eq!(log.deliveries.len(), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn a_stream_that_ends_hands_on_its_parked_event() {
        let hook = Hook::new(Some(
            "coalesce:deployments.apps:MODIFIED:a:1:3000ms"
                .parse()
                .unwrap(),
        ));
        let out = through(&hook, vec![(0, line("MODIFIED", "a", 1))]).await;
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].0, 0);
    }

    #[test]
    fn a_crash_fires_after_the_armed_write_only() {
        let hook = Hook::new(Some(Perturbation::CrashAfterWrite {
            resource: "deployments.apps".into(),
            verb: "create".into(),
            nth: 2,
        }));
        let crashes = hook.crashes();
        let create = Target {
            resource: "deployments.apps".into(),
            verb: "create",
        };
        let answer = br#"{"metadata":{"name":"d","resourceVersion":"9"}}"#;
        assert!(!hook.shared.record_write(&create, answer));
        assert!(!crashes.has_changed().unwrap());
        assert!(hook.shared.record_write(&create, answer));
        assert!(crashes.has_changed().unwrap());
        assert!(!hook.shared.record_write(&create, answer));
        let log = hook.log();
        assert_eq!(log.writes.len(), 3);
        assert_eq!(log.fired[0].plan, "crash:deployments.apps:create:2");
        assert_eq!(log.fired[0].resource_version, "9");
        assert_eq!(log.restarts, 1);
    }
}
