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
    let log: Arc<Mutex<Log>> = Arc::default();
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
            reconciles.lock().push(key.name());
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
            until(|| log.lock().reached(1) >= n).await;
            until(|| log.lock().reached(2) >= 200).await;
            2
        }
    };
    // Edit the ConfigMap listed last that this wave has not reached yet.
    let edited = {
        let log = log.lock();
        (0..n)
            .rev()
            .map(name)
            .find(|cm| log.count(cm) < wave)
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
    let new_sent = log.lock().watch(&new);
    api.create(&PostParams::default(), &cm).await.unwrap();
    let edit_sent = log.lock().watch(&edited);
    let patch = serde_json::json!({"data": {"v": format!("edited-{round}")}});
    api.patch(&edited, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    until(|| {
        let log = log.lock();
        log.seen(&new).is_some() && log.seen(&edited).is_some()
    })
    .await;
    shutdown.cancel();
    task.await.unwrap().unwrap();
    factory.shutdown().await;
    let _ = api.delete(&new, &Default::default()).await;

    let log = log.lock();
    let (new_at, edit_at) = (log.seen(&new).unwrap(), log.seen(&edited).unwrap());
    // The edited ConfigMap's own reconcile is not backlog left.
    let left = |at: usize| n - 1 - log.reached_before(at, wave).min(n - 1);
    Figures {
        new_latency: log.steps[new_at].1 - new_sent,
        edit_latency: log.steps[edit_at].1 - edit_sent,
        backlog_left_at_new: left(new_at),
        backlog_left_at_edit: left(edit_at),
    }
}

/// Every reconcile in order, with what the round polls for kept up to date as it grows, so
/// that a poll is a lookup, not a pass over thousands of steps under the lock the reconciles
/// take.
#[derive(Default)]
struct Log {
    /// Each reconcile: the ConfigMap, when it started, and the how-manieth of its reconciles.
    steps: Vec<(String, Instant, usize)>,
    counts: HashMap<String, usize>,
    /// `reached[w]`: backlog ConfigMaps (`cm-*`) whose `w`th reconcile has started.
    reached: Vec<usize>,
    /// ConfigMaps watched from an instant on, and where their first reconcile since stands.
    watches: Vec<(String, Instant, Option<usize>)>,
}

impl Log {
    fn push(&mut self, key: &str) {
        let now = Instant::now();
        let count = self.counts.entry(key.to_string()).or_default();
        *count += 1;
        let nth = *count;
        if key.starts_with("cm-") {
            if self.reached.len() <= nth {
                self.reached.resize(nth + 1, 0);
            }
            self.reached[nth] += 1;
        }
        for (watched, since, at) in &mut self.watches {
            if at.is_none() && watched == key && now >= *since {
                *at = Some(self.steps.len());
            }
        }
        self.steps.push((key.to_string(), now, nth));
    }

    fn count(&self, key: &str) -> usize {
        self.counts.get(key).copied().unwrap_or(0)
    }

    fn reached(&self, wave: usize) -> usize {
        self.reached.get(wave).copied().unwrap_or(0)
    }

    /// How many backlog ConfigMaps had their `wave`th reconcile before step `at`.
    fn reached_before(&self, at: usize, wave: usize) -> usize {
        self.steps[..at]
            .iter()
            .filter(|(key, _, nth)| key.starts_with("cm-") && *nth == wave)
            .count()
    }

    /// Watches `key` from now on; returns now.
    fn watch(&mut self, key: &str) -> Instant {
        let now = Instant::now();
        self.watches.push((key.to_string(), now, None));
        now
    }

    /// Where the first reconcile of `key` since it was watched stands.
    fn seen(&self, key: &str) -> Option<usize> {
        self.watches.iter().find(|(k, _, _)| k == key)?.2
    }
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
