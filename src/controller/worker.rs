//! The worker loop every controller shares: sample-controller's `runWorker` /
//! `processNextWorkItem` (controller.go), plus the key helpers its event handlers use
//! (`enqueueFoo`, the tombstone branch of `handleObject`).
//!
//! A controller hands [`run_workers`] its [`RateLimitingQueue<String>`] of `namespace/name`
//! keys and an async reconcile function. Each of the N workers loops:
//! `get` a key -> reconcile it -> on `Ok(Action::Done)` `forget` it, on
//! `Ok(Action::RequeueAfter(d))` `forget` it and `add_after(key, d)`, on `Err` `add_rate_limited`
//! it -> always `done` it. A worker stops when `get` returns `None`, i.e. once the queue is shut
//! down and drained, so `queue.shutdown_with_drain()` is how a controller stops its workers.
//!
//! Invariants:
//! - every key a worker takes is `done` exactly once, even if reconcile panics (the panic is
//!   logged and treated as an error, where client-go's `HandleCrash` would crash the process);
//! - a successful reconcile resets the key's backoff (`forget`) before any timed requeue, so a
//!   periodic requeue is never stretched by earlier failures.
//!
//! Differs on purpose: client-go runs workers with `wait.UntilWithContext(.., time.Second)`,
//! restarting a worker that returned; here a worker only returns when the queue is done, so
//! there is nothing to restart.

use std::fmt::Display;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use kube_client::Resource;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::builder::{ErrorAction, default_error_policy};
use super::context::ReconcileContext;
use super::leadership::{Gate, Term};
use super::runtime::{Lane, Next, WorkerShared, process_next, worker_loop};

use crate::cache::{DeletedObject, ResourceEventHandlerFuncs, meta_namespace_key};
use crate::workqueue::RateLimitingQueue;

/// What a successful reconcile asks of the queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Nothing more to do until the next event for this key.
    Done,
    /// Look at this key again after this long (for example to refresh observed state that no
    /// watch event reports). The backoff is reset first, as for [`Action::Done`].
    RequeueAfter(Duration),
}

/// How [`run_workers`] runs.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// How many keys are reconciled at once (sample-controller's `--workers`, default 2).
    pub workers: usize,
    /// A name for logs (the controller's name).
    pub name: String,
}

impl Default for WorkerConfig {
    fn default() -> Self {
        // sample-controller's main.go runs `controller.Run(ctx, 2)`.
        WorkerConfig {
            workers: 2,
            name: "controller".to_string(),
        }
    }
}

/// Runs `config.workers` workers over `queue` until it is shut down and drained; returns when
/// the last one stops. `reconcile` gets each key; see the module docs for what its result does.
/// This is the runtime's worker loop without informers or leader election; a controller
/// declared with [`super::Controller`] gets it wired for it.
///
/// # Examples
/// ```
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// use kubeloop::controller::worker::{Action, WorkerConfig, run_workers};
/// use kubeloop::workqueue::{RateLimitingQueue, default_controller_rate_limiter};
/// let queue = RateLimitingQueue::<String>::new(default_controller_rate_limiter());
/// queue.add("default/web".to_string());
/// let workers = tokio::spawn(run_workers(queue.clone(), WorkerConfig::default(), |key: String| async move {
///     println!("reconciling {key}");
///     Ok::<_, std::convert::Infallible>(Action::Done)
/// }));
/// queue.shutdown_with_drain().await;
/// workers.await.unwrap();
/// # });
/// ```
pub async fn run_workers<F, Fut, E>(
    queue: RateLimitingQueue<String>,
    config: WorkerConfig,
    reconcile: F,
) where
    F: Fn(String) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Action, E>> + Send + 'static,
    E: Display + Send + 'static,
{
    let shared = Arc::new(shared(queue, config.name, reconcile));
    let gate = Gate::new(1);
    gate.open(0, Term::unfenced(CancellationToken::new()));
    let mut workers = JoinSet::new();
    for id in 0..config.workers.max(1) {
        workers.spawn(worker_loop(shared.clone(), Lane::Main, gate.watch(), id));
    }
    while let Some(joined) = workers.join_next().await {
        if let Err(e) = joined {
            // Only a cancelled runtime gets here: panics inside reconcile are caught.
            tracing::error!(controller = %shared.name, error = %e, "worker task ended abnormally");
        }
    }
}

/// Takes one key and reconciles it; `false` once the queue is shut down and empty.
/// sample-controller: `processNextWorkItem`.
pub async fn process_next_work_item<F, Fut, E>(
    queue: &RateLimitingQueue<String>,
    name: &str,
    reconcile: &F,
) -> bool
where
    F: Fn(String) -> Fut,
    Fut: Future<Output = Result<Action, E>>,
    E: Display,
{
    let shared = shared(queue.clone(), name.to_string(), reconcile);
    let gate = Gate::new(1);
    gate.open(0, Term::unfenced(CancellationToken::new()));
    !matches!(
        process_next(&shared, Lane::Main, &gate).await,
        Next::QueueDone
    )
}

/// The error policy of the key-only loop.
type Policy<E> = fn(&E, &str, u32) -> ErrorAction;

/// A key-only reconcile as the runtime's worker state, with the default error policy.
fn shared<F, Fut, E>(
    queue: RateLimitingQueue<String>,
    name: String,
    reconcile: F,
) -> WorkerShared<impl Fn(String, ReconcileContext) -> Fut, Policy<E>>
where
    F: Fn(String) -> Fut,
{
    WorkerShared {
        name,
        later: queue.clone(),
        queue,
        busy: None,
        reconcile: move |key: String, _ctx: ReconcileContext| reconcile(key),
        error_policy: default_error_policy::<E>,
    }
}

/// The cache key (`namespace/name`) of an object, logged and `None` if it has no name.
pub fn key_of<K: Resource>(obj: &K) -> Option<String> {
    match meta_namespace_key(obj) {
        Ok(key) => Some(key),
        Err(e) => {
            tracing::error!(error = %e, "cannot enqueue object");
            None
        }
    }
}

/// The key of a deleted object: a tombstone carries its own key (the last known object may be
/// stale), a plain deletion is keyed like any object. client-go:
/// `DeletionHandlingMetaNamespaceKeyFunc`.
pub fn key_of_deleted<K: Resource>(deleted: &DeletedObject<K>) -> Option<String> {
    match deleted {
        DeletedObject::Unknown(tombstone) => Some(tombstone.key.clone()),
        DeletedObject::Object(obj) => key_of(obj.as_ref()),
    }
}

/// Adds the key of `obj` to `queue`. sample-controller: `enqueueFoo`.
pub fn enqueue<K: Resource>(queue: &RateLimitingQueue<String>, obj: &K) {
    if let Some(key) = key_of(obj) {
        queue.add(key);
    }
}

/// Event handlers that enqueue the object's own key on add, update (resyncs included) and
/// delete (tombstones included): what sample-controller registers on the Foo informer.
pub fn enqueue_handler<K: Resource + Send + Sync + 'static>(
    queue: RateLimitingQueue<String>,
) -> ResourceEventHandlerFuncs<K> {
    let (q_add, q_update, q_delete) = (queue.clone(), queue.clone(), queue);
    ResourceEventHandlerFuncs::new()
        .on_add(move |obj: &Arc<K>, _| enqueue(&q_add, obj.as_ref()))
        .on_update(move |_old: &Arc<K>, new: &Arc<K>| enqueue(&q_update, new.as_ref()))
        .on_delete(move |deleted: &DeletedObject<K>| {
            if let Some(key) = key_of_deleted(deleted) {
                q_delete.add(key);
            }
        })
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use k8s_openapi::api::core::v1::ConfigMap;
    use kube_client::core::ObjectMeta;
    use parking_lot::Mutex;

    use super::*;
    use crate::cache::{DeletedFinalStateUnknown, ResourceEventHandler};
    use crate::workqueue::{ItemExponentialFailureRateLimiter, default_controller_rate_limiter};

    fn cm(ns: &str, name: &str) -> Arc<ConfigMap> {
        Arc::new(ConfigMap {
            metadata: ObjectMeta {
                namespace: Some(ns.into()),
                name: Some(name.into()),
                ..Default::default()
            },
            ..Default::default()
        })
    }

    fn queue() -> RateLimitingQueue<String> {
        RateLimitingQueue::new(ItemExponentialFailureRateLimiter::new(
            Duration::from_millis(5),
            Duration::from_secs(10),
        ))
    }

    #[tokio::test(start_paused = true)]
    async fn a_successful_key_is_forgotten_and_done() {
        let q = queue();
        q.add("ns/a".to_string());
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s = seen.clone();
        let reconcile = move |key: String| {
            let s = s.clone();
            async move {
                s.lock().push(key);
                Ok::<_, String>(Action::Done)
            }
        };
        assert!(process_next_work_item(&q, "t", &reconcile).await);
        assert_eq!(*seen.lock(), vec!["ns/a".to_string()]);
        assert_eq!(q.num_requeues(&"ns/a".to_string()), 0);
        assert_eq!(q.len(), 0);
        // Done: adding it again makes it available at once (it is no longer processing).
        q.add("ns/a".to_string());
        assert_eq!(q.get().await.as_deref(), Some("ns/a"));
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_key_comes_back_after_the_rate_limited_delay() {
        let q = queue();
        q.add("ns/a".to_string());
        let reconcile = |_key: String| async { Err::<Action, _>("boom") };
        assert!(process_next_work_item(&q, "t", &reconcile).await);
        assert_eq!(q.num_requeues(&"ns/a".to_string()), 1);
        assert_eq!(q.len(), 0, "waiting 5 ms, not ready yet");
        tokio::time::sleep(Duration::from_millis(6)).await;
        assert_eq!(q.len(), 1);
        assert!(process_next_work_item(&q, "t", &reconcile).await);
        assert_eq!(q.num_requeues(&"ns/a".to_string()), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn requeue_after_resets_the_backoff_and_comes_back_at_the_asked_time() {
        let q = queue();
        let key = "ns/a".to_string();
        q.add(key.clone());
        let fail = |_key: String| async { Err::<Action, _>("boom") };
        process_next_work_item(&q, "t", &fail).await;
        tokio::time::sleep(Duration::from_millis(6)).await;
        let later =
            |_key: String| async { Ok::<_, String>(Action::RequeueAfter(Duration::from_secs(20))) };
        process_next_work_item(&q, "t", &later).await;
        assert_eq!(q.num_requeues(&key), 0);
        tokio::time::sleep(Duration::from_secs(19)).await;
        assert_eq!(q.len(), 0);
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(q.len(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_panicking_reconcile_is_retried_and_the_key_is_done() {
        let q = queue();
        let key = "ns/a".to_string();
        q.add(key.clone());
        let calls = Arc::new(AtomicUsize::new(0));
        let c = calls.clone();
        let reconcile = move |_key: String| {
            let c = c.clone();
            async move {
                if c.fetch_add(1, Ordering::SeqCst) == 0 {
                    panic!("first call panics");
                }
                Ok::<_, String>(Action::Done)
            }
        };
        assert!(process_next_work_item(&q, "t", &reconcile).await);
        assert_eq!(q.num_requeues(&key), 1);
        tokio::time::sleep(Duration::from_millis(6)).await;
        assert!(process_next_work_item(&q, "t", &reconcile).await);
        assert_eq!(calls.load(Ordering::SeqCst), 2);
        assert_eq!(q.num_requeues(&key), 0);
    }

    #[tokio::test]
    async fn workers_drain_queued_keys_then_stop_on_shutdown() {
        let q = RateLimitingQueue::<String>::new(default_controller_rate_limiter());
        for i in 0..50 {
            q.add(format!("ns/{i}"));
        }
        let counts = Arc::new(Mutex::new(HashMap::<String, usize>::new()));
        let in_flight = Arc::new(AtomicUsize::new(0));
        let max_in_flight = Arc::new(AtomicUsize::new(0));
        let (c, f, m) = (counts.clone(), in_flight.clone(), max_in_flight.clone());
        let workers = tokio::spawn(run_workers(
            q.clone(),
            WorkerConfig {
                workers: 3,
                name: "t".into(),
            },
            move |key: String| {
                let (c, f, m) = (c.clone(), f.clone(), m.clone());
                async move {
                    let now = f.fetch_add(1, Ordering::SeqCst) + 1;
                    m.fetch_max(now, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    *c.lock().entry(key).or_default() += 1;
                    f.fetch_sub(1, Ordering::SeqCst);
                    Ok::<_, String>(Action::Done)
                }
            },
        ));
        q.shutdown_with_drain().await;
        tokio::time::timeout(Duration::from_secs(10), workers)
            .await
            .expect("workers stop")
            .expect("no panic");
        let counts = counts.lock();
        assert_eq!(
            counts.len(),
            50,
            "every queued key was reconciled before stopping"
        );
        assert!(counts.values().all(|&n| n == 1));
        let max = max_in_flight.load(Ordering::SeqCst);
        assert!(
            (2..=3).contains(&max),
            "3 workers ran in parallel, at most 3 at once (saw {max})"
        );
    }

    #[test]
    fn a_tombstone_is_keyed_by_its_own_key() {
        let plain = DeletedObject::Object(cm("ns", "a"));
        assert_eq!(key_of_deleted(&plain).as_deref(), Some("ns/a"));
        let tombstone = DeletedObject::Unknown(DeletedFinalStateUnknown {
            key: "ns/b".into(),
            obj: cm("ns", "stale"),
        });
        assert_eq!(key_of_deleted(&tombstone).as_deref(), Some("ns/b"));
    }

    #[test]
    fn an_object_without_a_name_is_not_enqueued() {
        let q = queue();
        enqueue(&q, &ConfigMap::default());
        assert_eq!(q.len(), 0);
        enqueue(&q, cm("ns", "a").as_ref());
        assert_eq!(q.len(), 1);
    }

    #[test]
    fn the_enqueue_handler_enqueues_adds_updates_and_deletes_once_each() {
        let q = queue();
        let handler = enqueue_handler::<ConfigMap>(q.clone());
        let h: &dyn ResourceEventHandler<ConfigMap> = &handler;
        h.on_add(&cm("ns", "a"), true);
        h.on_update(&cm("ns", "b"), &cm("ns", "b"));
        h.on_delete(&DeletedObject::Unknown(DeletedFinalStateUnknown {
            key: "ns/c".into(),
            obj: cm("ns", "c"),
        }));
        h.on_add(&cm("ns", "a"), false);
        assert_eq!(q.len(), 3, "ns/a, ns/b, ns/c with ns/a deduplicated");
    }
}
