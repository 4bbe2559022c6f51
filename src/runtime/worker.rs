//! The worker loop every controller shares: sample-controller's `runWorker` /
//! `processNextWorkItem` (controller.go), and controller-runtime's `processNextWorkItem` /
//! `reconcileHandler` (`pkg/internal/controller/controller.go`).
//!
//! Each worker loops: wait until the gate (`leadership.rs`) has a live term -> `get` a
//! key and its priority -> ask the gate for the key's term (a key of a shard this process does
//! not hold is parked) -> reconcile it inside the term -> on `Ok(Action::Done)` `forget` it,
//! on `Ok(Action::RequeueAfter(d))` `forget` it and `add_after(key, d)` (to the requeue lane
//! if there is one), on `Err` do what the error policy says ([`ErrorAction`]) -> always `done`
//! it. Every key put back keeps the priority it was taken with, unless the reconcile asked for
//! another ([`Action::RequeueWithPriority`]), as controller-runtime's `reconcileHandler` does.
//! A worker stops when `get` returns `None`, i.e. once the queue is shut down and drained,
//! or when the gate closes. `run_workers` is the same loop without informers or leadership,
//! for unit tests.
//!
//! Invariants:
//! - every key a worker takes is `done` exactly once, even if reconcile panics (the panic is
//!   logged and treated as an error, where client-go's `HandleCrash` would crash the process);
//! - a successful reconcile resets the key's backoff (`forget`) before any timed requeue, so a
//!   periodic requeue is never stretched by earlier failures;
//! - a key taken after its term ended, whose term ended while it waited to start (for its
//!   claim or its caches), or whose reconcile was ended by the loss of leadership, is put
//!   back for the next leader without counting as a failure; no reconcile starts in a term
//!   that is over.
//!
//! Differs on purpose: client-go runs workers with `wait.UntilWithContext(.., time.Second)`,
//! restarting a worker that returned; here a worker only returns when the queue is done, so
//! there is nothing to restart.

use std::fmt::Display;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use futures::FutureExt;
use tracing::{Instrument, debug, error, info, warn};
#[cfg(test)]
use {
    super::action::default_error_policy, super::leadership::Term, tokio::task::JoinSet,
    tokio_util::sync::CancellationToken,
};

use super::action::{Action, ErrorAction};
use super::context::ReconcileContext;
use super::freshness::Freshness;
use super::key::ObjectKey;
use super::lanes::{BusyKeys, Lane};
#[cfg(test)]
use super::leadership::ShardMap;
use super::leadership::{Dispatch, Gate, GateWatch};
use super::queue::ControllerQueue;
use super::reconcile_metrics::{ReconcileMetrics, ReconcileResult};
use crate::trace::Stage;

/// How [`run_workers`] runs.
#[cfg(test)]
#[derive(Debug, Clone)]
pub(crate) struct WorkerConfig {
    /// How many keys are reconciled at once (sample-controller's `--workers`, default 2).
    pub workers: usize,
    /// A name for logs (the controller's name).
    pub name: String,
}

#[cfg(test)]
impl Default for WorkerConfig {
    fn default() -> Self {
        // sample-controller's main.go runs `controller.Run(ctx, 2)`.
        WorkerConfig {
            workers: 2,
            name: "controller".to_string(),
        }
    }
}

/// What every worker shares.
pub(crate) struct WorkerShared<F, P> {
    pub name: String,
    /// The controller's queue: keys from events, retries after errors, keys handed back.
    pub queue: ControllerQueue,
    /// Where [`Action::RequeueAfter`] puts a key: the requeue lane's queue when the controller
    /// has one ([`super::Controller::requeue_lane`]), else `queue`.
    pub later: ControllerQueue,
    /// Keys being reconciled in either lane (with a requeue lane only).
    pub busy: Option<Arc<BusyKeys>>,
    /// Read-your-writes (a controller's workers; not the key-only loop).
    pub freshness: Option<Arc<Freshness>>,
    pub reconcile: F,
    pub error_policy: P,
}

/// One worker: wait for an open shard, take keys while one is open; return when the queue is
/// shut down and drained or the gate closes.
pub(crate) async fn worker_loop<F, Fut, E, P>(
    shared: Arc<WorkerShared<F, P>>,
    lane: Lane,
    mut gate: GateWatch,
    id: usize,
) where
    F: Fn(ObjectKey, ReconcileContext) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Action, E>> + Send + 'static,
    E: Display + Send + 'static,
    P: Fn(&E, &ObjectKey, u32) -> ErrorAction + Send + Sync + 'static,
{
    debug!(controller = %shared.name, worker = id, "worker started");
    while gate.next_open().await {
        loop {
            match process_next(&shared, lane, gate.gate()).await {
                Next::Continue => {}
                Next::NotOpen => break,
                Next::QueueDone => {
                    debug!(controller = %shared.name, worker = id, "worker stopped");
                    return;
                }
            }
        }
    }
    debug!(controller = %shared.name, worker = id, "worker stopped");
}

enum Next {
    Continue,
    /// No shard has a live term: wait for one.
    NotOpen,
    QueueDone,
}

/// Takes one key and reconciles it. sample-controller: `processNextWorkItem`.
async fn process_next<F, Fut, E, P>(shared: &WorkerShared<F, P>, lane: Lane, gate: &Gate) -> Next
where
    F: Fn(ObjectKey, ReconcileContext) -> Fut,
    Fut: Future<Output = Result<Action, E>>,
    E: Display,
    P: Fn(&E, &ObjectKey, u32) -> ErrorAction,
{
    // Failures, retries and keys handed back always go to the controller's queue (its rate
    // limiter keeps each key's backoff); the lane's queue is where this worker takes keys.
    let queue = &shared.queue;
    let taken_from = match lane {
        Lane::Main => &shared.queue,
        Lane::Requeue => &shared.later,
    };
    let name = shared.name.as_str();
    // `get` is cancel safe: a key is only taken in the poll that returns it.
    let taken = tokio::select! {
        biased;
        _ = gate.until_not_open() => return Next::NotOpen,
        taken = taken_from.get() => taken,
    };
    let Some((key, priority)) = taken else {
        return Next::QueueDone;
    };
    crate::trace::record(key.as_str(), Stage::WorkerTook, "", || {
        match taken_from.fairness_of(&key) {
            Some(keys) => format!("controller {name}, priority {priority}, fairness key {keys}"),
            None => format!("controller {name}, priority {priority}"),
        }
    });
    // Every way back into the queue keeps the priority the key was taken with.
    let priority = Some(priority);
    // Asked after the wait: a process resumed after a long pause must not start work, and a
    // key of a shard this process does not hold is set aside until it does.
    let term = match gate.dispatch(&key) {
        Dispatch::Reconcile(term) => term,
        Dispatch::Parked => {
            taken_from.done(&key);
            return Next::Continue;
        }
    };
    let ctx = term.reconcile_context();
    // A key this term will not reconcile goes back (at its priority) for the next leader.
    let hand_back = || {
        queue.add_with_priority(key.clone(), priority);
        taken_from.done(&key);
        Next::Continue
    };
    // With two lanes a key is reconciled by one worker at a time. A timed requeue of a key
    // the main lane is reconciling is dropped: that reconcile looks at the key now and says
    // itself when to look next. A key from the main lane waits for the requeue lane's
    // reconcile of it (one refresh) to end.
    let _claim = match (&shared.busy, lane) {
        (None, _) => None,
        (Some(busy), Lane::Requeue) => match busy.try_claim(&key) {
            Some(claim) => Some(claim),
            None => {
                debug!(controller = name, key = %key, "timed requeue skipped: the key is in reconcile");
                taken_from.done(&key);
                return Next::Continue;
            }
        },
        (Some(busy), Lane::Main) => tokio::select! {
            claim = busy.claim(&key) => Some(claim),
            _ = ctx.cancelled() => return hand_back(),
        },
    };
    // Not on a cache older than this key's own last writes (`freshness.rs`).
    let ctx = match &shared.freshness {
        Some(freshness) => {
            freshness.hold(&key, ctx.token()).await;
            ctx.recording_writes(Arc::clone(freshness), key.clone())
        }
        None => ctx,
    };
    // Asked again after those waits (the key's claim, its caches): the term may have ended
    // meanwhile (the Lease lost, or the process paused past its deadline), and no reconcile
    // starts in a term that is over. The key waits for the next leader, as one cut short does.
    if term.is_over() {
        info!(controller = name, key = %key, "the term ended while the key waited to start; key left for the next leader");
        return hand_back();
    }
    // The start and end of every reconcile, for tests that check that no two replicas'
    // reconciles ever overlap (tests/vm_controller/chaos.rs).
    debug!(controller = name, key = %key, "reconcile started");
    let span = tracing::info_span!("reconcile", controller = %name, key = %key);
    let started = std::time::Instant::now();
    crate::trace::record(key.as_str(), Stage::ReconcileStarted, "", String::new);
    let reconcile = AssertUnwindSafe((shared.reconcile)(key.clone(), ctx.clone())).catch_unwind();
    let outcome = term.run(reconcile.instrument(span)).await;
    debug!(controller = name, key = %key, dropped = outcome.is_none(), "reconcile ended");

    // A reconcile ended by the loss of leadership (dropped at the fence, or failing after its
    // context lost entitlement) is not the key's failure: the next leader takes it again.
    let cut_short = match &outcome {
        None => true,
        Some(Ok(Ok(_))) => false,
        Some(_) => ctx.check().is_err(),
    };
    if cut_short {
        if outcome.is_none() {
            warn!(controller = name, key = %key, "reconcile did not stop by the leadership fence; dropped it");
        } else {
            info!(controller = name, key = %key, "reconcile ended with the leadership term; key left for the next leader");
        }
        return hand_back();
    }
    let outcome = outcome.expect("not cut short");
    let result = match &outcome {
        Ok(Ok(action)) if action.requeue().is_some() => ReconcileResult::requeue_after,
        Ok(Ok(_)) => ReconcileResult::success,
        Ok(Err(_)) => ReconcileResult::error,
        Err(_) => ReconcileResult::panic,
    };
    ReconcileMetrics::global().observe(name, result, started.elapsed());
    crate::trace::record(
        key.as_str(),
        Stage::ReconcileFinished,
        "",
        || match &outcome {
            Ok(Ok(action)) if let Some((after, asked)) = action.requeue() => {
                let at = asked
                    .map(|p| format!(" at priority {p}"))
                    .unwrap_or_default();
                format!(
                    "requeue after {after:?}{at}, took {:.1?}",
                    started.elapsed()
                )
            }
            Ok(Err(e)) => format!("error after {:.1?}: {e}", started.elapsed()),
            _ => format!("{result:?} in {:.1?}", started.elapsed()),
        },
    );
    match outcome {
        Ok(Ok(action)) => {
            queue.forget(&key);
            match action.requeue() {
                None => debug!(controller = name, key = %key, "successfully synced"),
                Some((after, asked)) => {
                    shared
                        .later
                        .add_after(key.clone(), after, asked.or(priority));
                    debug!(controller = name, key = %key, ?after, ?asked, "synced, requeued");
                }
            }
        }
        Ok(Err(e)) => match (shared.error_policy)(&e, &key, queue.num_requeues(&key)) {
            ErrorAction::RateLimited => {
                queue.add_rate_limited(key.clone(), priority);
                error!(controller = name, key = %key, requeues = queue.num_requeues(&key), error = %e, "error syncing, requeuing");
            }
            ErrorAction::RequeueAfter(after) => {
                queue.add_after(key.clone(), after, priority);
                error!(controller = name, key = %key, ?after, error = %e, "error syncing, requeuing after a fixed delay");
            }
            ErrorAction::Drop => {
                queue.forget(&key);
                error!(controller = name, key = %key, error = %e, "dropping key");
            }
        },
        Err(panic) => {
            queue.add_rate_limited(key.clone(), priority);
            error!(controller = name, key = %key, panic = panic_message(&panic), "reconcile panicked, requeuing");
        }
    }
    taken_from.done(&key);
    Next::Continue
}

fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_string()
    }
}

/// Runs `config.workers` workers over `queue` until it is shut down and drained; returns when
/// the last one stops. `reconcile` gets each key; see the module docs for what its result does.
/// This is the runtime's worker loop without informers or leader election, for unit tests; a
/// controller declared with [`super::Controller`] gets it wired for it.
#[cfg(test)]
pub(crate) async fn run_workers<F, Fut, E>(
    queue: impl Into<ControllerQueue>,
    config: WorkerConfig,
    reconcile: F,
) where
    F: Fn(ObjectKey) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Action, E>> + Send + 'static,
    E: Display + Send + 'static,
{
    let shared = Arc::new(shared(queue.into(), config.name, reconcile));
    let gate = Gate::new(ShardMap::Keys(1));
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
#[cfg(test)]
pub(crate) async fn process_next_work_item<F, Fut, E>(
    queue: impl Into<ControllerQueue>,
    name: &str,
    reconcile: &F,
) -> bool
where
    F: Fn(ObjectKey) -> Fut,
    Fut: Future<Output = Result<Action, E>>,
    E: Display,
{
    let shared = shared(queue.into(), name.to_string(), reconcile);
    let gate = Gate::new(ShardMap::Keys(1));
    gate.open(0, Term::unfenced(CancellationToken::new()));
    !matches!(
        process_next(&shared, Lane::Main, &gate).await,
        Next::QueueDone
    )
}

/// The error policy of the key-only loop.
#[cfg(test)]
type Policy<E> = fn(&E, &ObjectKey, u32) -> ErrorAction;

/// A key-only reconcile as the runtime's worker state, with the default error policy.
#[cfg(test)]
fn shared<F, Fut, E>(
    queue: ControllerQueue,
    name: String,
    reconcile: F,
) -> WorkerShared<impl Fn(ObjectKey, ReconcileContext) -> Fut, Policy<E>>
where
    F: Fn(ObjectKey) -> Fut,
{
    WorkerShared {
        name,
        later: queue.clone(),
        queue,
        busy: None,
        freshness: None,
        reconcile: move |key: ObjectKey, _ctx: ReconcileContext| reconcile(key),
        error_policy: default_error_policy::<E>,
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use parking_lot::Mutex;

    use std::time::Duration;

    use super::*;
    use crate::workqueue::{
        ItemExponentialFailureRateLimiter, LOW_PRIORITY, PriorityQueue, RateLimitingQueue,
        default_controller_rate_limiter,
    };

    fn queue() -> RateLimitingQueue<ObjectKey> {
        RateLimitingQueue::new(ItemExponentialFailureRateLimiter::new(
            Duration::from_millis(5),
            Duration::from_secs(10),
        ))
    }

    #[tokio::test(start_paused = true)]
    async fn a_successful_key_is_forgotten_and_done() {
        let q = queue();
        q.add(ObjectKey::new("ns", "a"));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s = seen.clone();
        let reconcile = move |key: ObjectKey| {
            let s = s.clone();
            async move {
                s.lock().push(key);
                Ok::<_, String>(Action::Done)
            }
        };
        assert!(process_next_work_item(q.clone(), "t", &reconcile).await);
        assert_eq!(*seen.lock(), vec![ObjectKey::new("ns", "a")]);
        assert_eq!(q.num_requeues(&ObjectKey::new("ns", "a")), 0);
        assert_eq!(q.len(), 0);
        // Done: adding it again makes it available at once (it is no longer processing).
        q.add(ObjectKey::new("ns", "a"));
        assert_eq!(q.get().await, Some(ObjectKey::new("ns", "a")));
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_key_comes_back_after_the_rate_limited_delay() {
        let q = queue();
        q.add(ObjectKey::new("ns", "a"));
        let reconcile = |_key: ObjectKey| async { Err::<Action, _>("boom") };
        assert!(process_next_work_item(q.clone(), "t", &reconcile).await);
        assert_eq!(q.num_requeues(&ObjectKey::new("ns", "a")), 1);
        assert_eq!(q.len(), 0, "waiting 5 ms, not ready yet");
        tokio::time::sleep(Duration::from_millis(6)).await;
        assert_eq!(q.len(), 1);
        assert!(process_next_work_item(q.clone(), "t", &reconcile).await);
        assert_eq!(q.num_requeues(&ObjectKey::new("ns", "a")), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn requeue_after_resets_the_backoff_and_comes_back_at_the_asked_time() {
        let q = queue();
        let key = ObjectKey::new("ns", "a");
        q.add(key.clone());
        let fail = |_key: ObjectKey| async { Err::<Action, _>("boom") };
        process_next_work_item(q.clone(), "t", &fail).await;
        tokio::time::sleep(Duration::from_millis(6)).await;
        let later = |_key: ObjectKey| async {
            Ok::<_, String>(Action::RequeueAfter(Duration::from_secs(20)))
        };
        process_next_work_item(q.clone(), "t", &later).await;
        assert_eq!(q.num_requeues(&key), 0);
        tokio::time::sleep(Duration::from_secs(19)).await;
        assert_eq!(q.len(), 0);
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(q.len(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_retried_key_keeps_its_priority_unless_the_reconcile_asks_for_another() {
        let q = PriorityQueue::new();
        let (low, edited) = (ObjectKey::new("ns", "low"), ObjectKey::new("ns", "edited"));
        q.add_with_opts(
            crate::workqueue::AddOpts {
                priority: Some(LOW_PRIORITY),
                ..Default::default()
            },
            [low.clone()],
        );
        let fail = |_key: ObjectKey| async { Err::<Action, _>("boom") };
        assert!(process_next_work_item(q.clone(), "t", &fail).await);
        tokio::time::sleep(Duration::from_millis(6)).await;
        assert_eq!(
            q.get().await,
            Some((low.clone(), LOW_PRIORITY)),
            "retried at its priority"
        );
        q.done(&low);

        q.add(edited.clone());
        let raise = |_key: ObjectKey| async {
            Ok::<_, String>(Action::RequeueWithPriority {
                after: Duration::from_secs(1),
                priority: 7,
            })
        };
        assert!(process_next_work_item(q.clone(), "t", &raise).await);
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(q.get().await, Some((edited, 7)));
    }

    #[tokio::test(start_paused = true)]
    async fn a_panicking_reconcile_is_retried_and_the_key_is_done() {
        let q = queue();
        let key = ObjectKey::new("ns", "a");
        q.add(key.clone());
        let calls = Arc::new(AtomicUsize::new(0));
        let c = calls.clone();
        let reconcile = move |_key: ObjectKey| {
            let c = c.clone();
            async move {
                if c.fetch_add(1, Ordering::SeqCst) == 0 {
                    panic!("first call panics");
                }
                Ok::<_, String>(Action::Done)
            }
        };
        assert!(process_next_work_item(q.clone(), "t", &reconcile).await);
        assert_eq!(q.num_requeues(&key), 1);
        tokio::time::sleep(Duration::from_millis(6)).await;
        assert!(process_next_work_item(q.clone(), "t", &reconcile).await);
        assert_eq!(calls.load(Ordering::SeqCst), 2);
        assert_eq!(q.num_requeues(&key), 0);
    }

    #[tokio::test]
    async fn workers_drain_queued_keys_then_stop_on_shutdown() {
        let q = RateLimitingQueue::<ObjectKey>::new(default_controller_rate_limiter());
        for i in 0..50 {
            q.add(ObjectKey::new("ns", &i.to_string()));
        }
        let counts = Arc::new(Mutex::new(HashMap::<ObjectKey, usize>::new()));
        let in_flight = Arc::new(AtomicUsize::new(0));
        let max_in_flight = Arc::new(AtomicUsize::new(0));
        let (c, f, m) = (counts.clone(), in_flight.clone(), max_in_flight.clone());
        let workers = tokio::spawn(run_workers(
            q.clone(),
            WorkerConfig {
                workers: 3,
                name: "t".into(),
            },
            move |key: ObjectKey| {
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
}
