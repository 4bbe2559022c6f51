//! Issue 26's startup and resync scenarios, shared by `examples/bench_priority` (the bench
//! `hack/bench-priority` runs, several rounds, medians and maxima) and
//! `tests/priority_queue_startup.rs` (one round, asserts the order, never a time).
//!
//! A controller on the runtime over `n` existing ConfigMaps; each reconcile takes `COST` (a
//! stand-in for the API calls a real reconcile makes), with 2 workers. Once a backlog is queued
//! (the initial list at startup, or a resync's wave), a new ConfigMap is created and an existing
//! one, still waiting in the backlog, is edited; the figures are how long each took from the
//! request to the start of its reconcile, and how much of the backlog was still to come then.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::ConfigMap;
use kube_client::Client;
use kube_client::api::{Api, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use kubeloop::cache::{FactoryOptions, SharedInformerFactory};
use kubeloop::runtime::{Action, Controller, ObjectKey, ReconcileContext};
use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;

/// What one reconcile costs.
pub const COST: Duration = Duration::from_millis(1);
/// The resync period of the resync scenario: long enough for the initial wave to drain first.
pub const RESYNC: Duration = Duration::from_secs(10);

/// `cm-00000` .. : names in the order the apiserver lists them.
pub fn name(i: usize) -> String {
    format!("cm-{i:05}")
}

/// Creates ConfigMaps `0..n` in `namespace` (those missing; 32 requests at a time).
pub async fn create(client: &Client, namespace: &str, n: usize) {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    let have = api.list(&ListParams::default()).await.unwrap().items.len();
    futures::stream::iter(have..n)
        .map(|i| {
            let api = api.clone();
            async move {
                let cm = ConfigMap {
                    metadata: ObjectMeta {
                        name: Some(name(i)),
                        ..Default::default()
                    },
                    data: Some([("v".to_string(), "0".to_string())].into()),
                    ..Default::default()
                };
                match api.create(&PostParams::default(), &cm).await {
                    Ok(_) => Ok(()),
                    Err(kube_client::Error::Api(s)) if s.is_already_exists() => Ok(()),
                    Err(e) => Err(e),
                }
            }
        })
        .buffer_unordered(32)
        .try_collect::<Vec<()>>()
        .await
        .unwrap();
}

/// Which backlog the new object and the edit arrive behind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backlog {
    /// The initial list, one second after the caches synced.
    Startup,
    /// A resync's wave, once it has begun.
    Resync,
}

/// The figures of one round.
#[derive(Clone, Debug)]
pub struct Figures {
    /// From the create request to the start of the new object's reconcile.
    pub new_latency: Duration,
    /// From the edit request to the start of the edited object's next reconcile.
    pub edit_latency: Duration,
    /// ConfigMaps of the backlog still waiting for their reconcile of this wave when the new
    /// object's started.
    pub backlog_left_at_new: usize,
    /// The same when the edited object's started.
    pub backlog_left_at_edit: usize,
}

/// One round: the controller on the priority queue (or the plain one) over `n` ConfigMaps of
/// `namespace`, the new object and the edit behind `backlog`. Creates `new-<round>` and
/// edits one ConfigMap; `round` keeps rounds apart.
pub async fn round(
    client: &Client,
    namespace: &str,
    n: usize,
    plain: bool,
    backlog: Backlog,
    round: usize,
) -> Figures {
    let factory = SharedInformerFactory::new(
        client.clone(),
        FactoryOptions {
            namespace: Some(namespace.to_string()),
            resync_period: match backlog {
                Backlog::Startup => Duration::ZERO,
                Backlog::Resync => RESYNC,
            },
            ..Default::default()
        },
    );
    // Every reconcile's key and start, in order.
    let log: Arc<Mutex<Vec<(String, Instant)>>> = Arc::default();
    let mut controller = Controller::new("bench-priority", factory.informer::<ConfigMap>())
        .workers(2)
        .queue_name("");
    if plain {
        controller = controller.plain_queue();
    }
    let ready = controller.readiness();
    let shutdown = CancellationToken::new();
    let reconciles = log.clone();
    let task = tokio::spawn(controller.run(
        move |key: ObjectKey, _ctx: ReconcileContext| {
            reconciles
                .lock()
                .push((key.name().to_string(), Instant::now()));
            async move {
                tokio::time::sleep(COST).await;
                Ok::<_, std::convert::Infallible>(Action::Done)
            }
        },
        kubeloop::runtime::default_error_policy,
        shutdown.clone(),
    ));
    until(|| ready.load(Ordering::SeqCst)).await;
    // The wave the new object and the edit arrive behind: each ConfigMap's first reconcile at
    // startup, its second once the resync came.
    let wave = match backlog {
        Backlog::Startup => {
            tokio::time::sleep(Duration::from_secs(1)).await;
            1
        }
        Backlog::Resync => {
            until(|| reconciled_in(&log.lock(), 1) >= n).await;
            until(|| reconciled_in(&log.lock(), 2) >= 200).await;
            2
        }
    };
    // Edit the ConfigMap listed last that this wave has not reached yet.
    let edited = {
        let counts = counts(&log.lock());
        (0..n)
            .rev()
            .map(name)
            .find(|cm| counts.get(cm).copied().unwrap_or(0) < wave)
            .expect("the wave has not drained yet")
    };
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    let new = format!("new-{round}");
    let cm = ConfigMap {
        metadata: ObjectMeta {
            name: Some(new.clone()),
            ..Default::default()
        },
        ..Default::default()
    };
    let new_sent = Instant::now();
    api.create(&PostParams::default(), &cm).await.unwrap();
    let edit_sent = Instant::now();
    let patch = serde_json::json!({"data": {"v": format!("edited-{round}")}});
    api.patch(&edited, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    let started = |log: &[(String, Instant)], key: &str, after: Instant| {
        log.iter().position(|(k, at)| k == key && *at >= after)
    };
    until(|| {
        let log = log.lock();
        started(&log, &new, new_sent).is_some() && started(&log, &edited, edit_sent).is_some()
    })
    .await;
    shutdown.cancel();
    task.await.unwrap().unwrap();
    factory.shutdown().await;
    let _ = api.delete(&new, &Default::default()).await;

    let log = log.lock();
    let new_at = started(&log, &new, new_sent).unwrap();
    let edit_at = started(&log, &edited, edit_sent).unwrap();
    // The edited ConfigMap's own reconcile is not backlog left.
    let left = |at: usize| n - 1 - reconciled_in(&log[..at], wave).min(n - 1);
    Figures {
        new_latency: log[new_at].1 - new_sent,
        edit_latency: log[edit_at].1 - edit_sent,
        backlog_left_at_new: left(new_at),
        backlog_left_at_edit: left(edit_at),
    }
}

/// Reconciles per key.
fn counts(log: &[(String, Instant)]) -> HashMap<String, usize> {
    let mut counts = HashMap::new();
    for (key, _) in log {
        *counts.entry(key.clone()).or_default() += 1;
    }
    counts
}

/// How many ConfigMaps of the backlog (`cm-*`) have had their `wave`th reconcile.
fn reconciled_in(log: &[(String, Instant)], wave: usize) -> usize {
    counts(log)
        .iter()
        .filter(|(k, c)| k.starts_with("cm-") && **c >= wave)
        .count()
}

async fn until(mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(300);
    while !done() {
        assert!(
            Instant::now() < deadline,
            "the scenario did not finish in 300 s"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
