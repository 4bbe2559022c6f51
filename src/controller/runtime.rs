//! Running a declared [`Controller`]: informers, handlers -> queue, workers, readiness,
//! leadership and shutdown, in this order:
//!
//! 1. register the event handlers, start every informer, wait for every cache (a shutdown
//!    meanwhile returns [`ControllerError::CacheSync`] naming the informers not synced);
//! 2. readiness on; the workers start, behind the leadership gate ([`super::leadership`]);
//! 3. without leader election the gate opens at once for one endless term; with sharding
//!    ([`super::sharding`]) the ring runs one elector per shard this replica should hold, and
//!    each shard's term opens the gate for that shard's keys only (keys of other shards are
//!    parked until their shard opens here); with leader election the
//!    elector runs and each leadership term opens the gate and starts the leader tasks; when
//!    the term ends the gate goes back to standby, in-flight reconciles are cancelled through
//!    their context and the term waits until every one has ended (dropped at the fence if it
//!    must) before the elector may release or lose the Lease;
//! 4. on shutdown: readiness off, the queue is shut down with drain (a leader finishes what is
//!    queued and in flight while it still renews), the workers return, the elector is stopped
//!    (releasing the Lease), the informers are stopped.
//!
//! A worker's loop is sample-controller's `processNextWorkItem`; what the reconcile's result
//! does to the key is written on [`super::worker::Action`] and [`ErrorAction`]. A key taken
//! after its term ended, or whose reconcile was ended by the loss of leadership, is put back
//! for the next leader without counting as a failure.

use std::fmt::Display;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use futures::FutureExt;
use thiserror::Error;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, error, info, warn};

use super::builder::{Controller, ErrorAction, LeaderTask};
use super::context::ReconcileContext;
use super::leadership::{Dispatch, Gate, GateWatch, Term};
use super::sharding::RingContext;
use super::worker::Action;
use crate::cache::{CacheObject, InformerError};
use crate::leaderelection::{LeaderCallbacks, StopReason};
use crate::ops::{ReconcileMetrics, ReconcileResult};
use crate::trace::Stage;
use crate::workqueue::RateLimitingQueue;

/// The controller could not run, or stopped for another reason than shutdown.
#[derive(Debug, Error)]
pub enum ControllerError {
    /// An event handler could not be registered (the informer was already stopped).
    #[error("registering an event handler: {0}")]
    Handler(#[from] InformerError),
    /// Shut down before every cache synced.
    #[error("failed to wait for caches to sync: {}", not_synced.join(", "))]
    CacheSync {
        /// Type names of the informers that had not synced.
        not_synced: Vec<String>,
    },
    /// Leadership ended and the elector does not contend again (client-go's `Run` returns).
    #[error("leader election lost: {0:?}")]
    LeadershipLost(StopReason),
}

impl<K: CacheObject> Controller<K> {
    /// Runs until `shutdown` is cancelled (or, under leader election without re-contending,
    /// until leadership is lost). `reconcile` gets each key with its [`ReconcileContext`];
    /// `error_policy` decides what a failed reconcile does to its key
    /// ([`super::default_error_policy`] retries with the rate limiter).
    pub async fn run<F, Fut, E, P>(
        mut self,
        reconcile: F,
        error_policy: P,
        shutdown: CancellationToken,
    ) -> Result<(), ControllerError>
    where
        F: Fn(String, ReconcileContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Action, E>> + Send + 'static,
        E: Display + Send + 'static,
        P: Fn(&E, &str, u32) -> ErrorAction + Send + Sync + 'static,
    {
        let name = self.name.clone();
        let queue = self.make_queue();
        self.primary
            .add_event_handler(self.primary_handler(&queue))?;
        for register in std::mem::take(&mut self.registrations) {
            register(&queue)?;
        }

        for informer in &self.informers {
            informer.start();
        }
        info!(controller = %name, "waiting for informer caches to sync");
        let synced = tokio::select! {
            synced = futures::future::join_all(self.informers.iter().map(|i| i.wait_for_cache_sync())) => synced,
            _ = shutdown.cancelled() => self.informers.iter().map(|i| i.has_synced()).collect(),
        };
        let not_synced: Vec<String> = self
            .informers
            .iter()
            .zip(synced)
            .filter(|(_, synced)| !synced)
            .map(|(informer, _)| informer.type_name())
            .collect();
        if !not_synced.is_empty() {
            queue.shutdown();
            self.stop_informers().await;
            return Err(ControllerError::CacheSync { not_synced });
        }
        info!(controller = %name, "caches synced");
        self.ready.store(true, Ordering::SeqCst);

        let requeue_workers = self.options.requeue_workers;
        let later = (requeue_workers > 0).then(|| self.make_requeue_queue());
        let queues = Queues {
            main: queue.clone(),
            requeue: later.clone(),
        };
        let workers_ctx = Arc::new(WorkerShared {
            name: name.clone(),
            queue: queue.clone(),
            later: later.unwrap_or_else(|| queue.clone()),
            busy: (requeue_workers > 0).then(Arc::default),
            reconcile,
            error_policy,
        });
        let gate = Gate::new(self.sharding.as_ref().map_or(1, |s| s.shards));
        let mut workers = JoinSet::new();
        info!(controller = %name, workers = self.options.workers, requeue_workers, "starting workers");
        for id in 0..self.options.workers {
            workers.spawn(worker_loop(
                workers_ctx.clone(),
                Lane::Main,
                gate.watch(),
                id,
            ));
        }
        for id in 0..requeue_workers {
            let id = self.options.workers + id;
            workers.spawn(worker_loop(
                workers_ctx.clone(),
                Lane::Requeue,
                gate.watch(),
                id,
            ));
        }
        let leader_tasks: Arc<Vec<LeaderTask>> = Arc::new(std::mem::take(&mut self.leader_tasks));

        let result = match (self.leader_election.take(), self.sharding.take()) {
            (_, Some(sharding)) => {
                // Stopped after the drain, as the elector is: shards are held while the
                // queue drains.
                let ring_stop = CancellationToken::new();
                let ring = (sharding.run)(
                    RingContext {
                        controller: name.clone(),
                        gate: gate.clone(),
                        queue: queue.clone(),
                        leader_tasks,
                    },
                    ring_stop.clone(),
                );
                let mut ring = tokio::spawn(ring);
                let ended_early = tokio::select! {
                    _ = shutdown.cancelled() => None,
                    ended = &mut ring => Some(ended),
                };
                drain_while_open(&name, &self.ready, &queues, &gate, &mut workers).await;
                // The ring ends every shard's term, waits for its reconciles and releases
                // the Leases.
                ring_stop.cancel();
                let ended = match ended_early {
                    Some(ended) => ended,
                    None => ring.await,
                };
                if let Err(e) = ended {
                    error!(controller = %name, error = %e, "the shard ring ended abnormally");
                }
                Ok(())
            }
            (None, None) => {
                // Not a child of `shutdown`: the term outlives the drain that shutdown starts.
                let term = Term::unfenced(CancellationToken::new());
                start_leader_tasks(&name, &term, &leader_tasks);
                gate.open(0, term.clone());
                shutdown.cancelled().await;
                self.ready.store(false, Ordering::SeqCst);
                info!(controller = %name, queued = queues.len(), "shutting down: draining the queue");
                queues.shutdown_with_drain().await;
                // The workers hand out what is still queued, then see the queue done.
                join_workers(&name, &mut workers).await;
                gate.close();
                term.end();
                term.wait_for_in_flight().await;
                Ok(())
            }
            (Some(election), None) => {
                let elector_stop = CancellationToken::new();
                let callbacks = term_callbacks(
                    name.clone(),
                    ShardTerms {
                        shard: 0,
                        gate: gate.clone(),
                        queue: queue.clone(),
                        leader_tasks: Some(leader_tasks),
                    },
                );
                let mut elector = tokio::spawn((election.run)(callbacks, elector_stop.clone()));
                let lost = tokio::select! {
                    _ = shutdown.cancelled() => None,
                    reason = &mut elector => Some(reason),
                };
                match lost {
                    None => {
                        drain_while_open(&name, &self.ready, &queues, &gate, &mut workers).await;
                        elector_stop.cancel();
                        match elector.await {
                            Ok(StopReason::Shutdown) | Err(_) => Ok(()),
                            Ok(reason) => Err(ControllerError::LeadershipLost(reason)),
                        }
                    }
                    Some(reason) => {
                        self.ready.store(false, Ordering::SeqCst);
                        let reason = reason.unwrap_or(StopReason::Shutdown);
                        error!(controller = %name, ?reason, "leader election lost");
                        queues.shutdown();
                        gate.close();
                        Err(ControllerError::LeadershipLost(reason))
                    }
                }
            }
        };
        join_workers(&name, &mut workers).await;
        self.stop_informers().await;
        info!(controller = %name, "shut down");
        result
    }

    async fn stop_informers(&self) {
        futures::future::join_all(self.informers.iter().map(|i| i.shutdown())).await;
    }
}

/// Shutdown under leadership or sharding: readiness off, then the queue drains while this
/// process still holds its terms (the workers finish what is queued); workers of a standby, or
/// of terms that end meanwhile, stop at once. Then the gate closes.
async fn drain_while_open(
    name: &str,
    ready: &std::sync::atomic::AtomicBool,
    queues: &Queues,
    gate: &Gate,
    workers: &mut JoinSet<()>,
) {
    ready.store(false, Ordering::SeqCst);
    info!(controller = %name, queued = queues.len(), "shutting down: draining what this process holds in flight and queued");
    queues.shutdown_with_drain().await;
    tokio::select! {
        _ = join_workers(name, workers) => {}
        _ = gate.until_not_open() => {}
    }
    gate.close();
}

async fn join_workers(name: &str, workers: &mut JoinSet<()>) {
    while let Some(joined) = workers.join_next().await {
        if let Err(e) = joined {
            // Only a cancelled runtime gets here: panics inside reconcile are caught.
            error!(controller = %name, error = %e, "worker task ended abnormally");
        }
    }
}

/// What every worker shares.
pub(super) struct WorkerShared<F, P> {
    pub name: String,
    /// The controller's queue: keys from events, retries after errors, keys handed back.
    pub queue: RateLimitingQueue<String>,
    /// Where [`Action::RequeueAfter`] puts a key: the requeue lane's queue when the controller
    /// has one ([`Controller::requeue_lane`]), else `queue`.
    pub later: RateLimitingQueue<String>,
    /// Keys being reconciled in either lane (with a requeue lane only).
    pub busy: Option<Arc<BusyKeys>>,
    pub reconcile: F,
    pub error_policy: P,
}

/// Which queue a worker takes keys from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Lane {
    /// [`WorkerShared::queue`].
    Main,
    /// [`WorkerShared::later`]: timed requeues, served by workers of their own.
    Requeue,
}

/// The keys in reconcile in either lane, so that no key is reconciled twice at once.
#[derive(Default)]
pub(super) struct BusyKeys {
    keys: parking_lot::Mutex<std::collections::HashSet<String>>,
    released: tokio::sync::Notify,
}

/// A key claimed for one reconcile; released on drop.
pub(super) struct Claim {
    busy: Arc<BusyKeys>,
    key: String,
}

impl BusyKeys {
    /// Claims `key` if no worker of either lane holds it.
    fn try_claim(self: &Arc<Self>, key: &str) -> Option<Claim> {
        self.keys.lock().insert(key.to_string()).then(|| Claim {
            busy: Arc::clone(self),
            key: key.to_string(),
        })
    }

    /// Claims `key`, waiting until the worker that holds it lets it go.
    async fn claim(self: &Arc<Self>, key: &str) -> Claim {
        loop {
            let released = self.released.notified();
            tokio::pin!(released);
            released.as_mut().enable();
            if let Some(claim) = self.try_claim(key) {
                return claim;
            }
            released.await;
        }
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        self.busy.keys.lock().remove(&self.key);
        self.busy.released.notify_waiters();
    }
}

/// The controller's queue and, with a requeue lane, the lane's queue: shut down together.
#[derive(Clone)]
pub(super) struct Queues {
    pub main: RateLimitingQueue<String>,
    pub requeue: Option<RateLimitingQueue<String>>,
}

impl Queues {
    fn len(&self) -> usize {
        self.main.len() + self.requeue.as_ref().map_or(0, |q| q.len())
    }

    fn shutdown(&self) {
        self.main.shutdown();
        if let Some(q) = &self.requeue {
            q.shutdown();
        }
    }

    async fn shutdown_with_drain(&self) {
        match &self.requeue {
            Some(q) => {
                futures::join!(self.main.shutdown_with_drain(), q.shutdown_with_drain());
            }
            None => self.main.shutdown_with_drain().await,
        }
    }
}

/// What one shard's terms open and close: the gate for that shard, the queue its parked keys
/// go back to, and (for the shard that carries them) the leader tasks.
pub(super) struct ShardTerms {
    pub shard: u32,
    pub gate: Arc<Gate>,
    pub queue: RateLimitingQueue<String>,
    pub leader_tasks: Option<Arc<Vec<LeaderTask>>>,
}

impl ShardTerms {
    /// One term, from the elector's start to the end of every reconcile it started: opens the
    /// shard (its parked keys go back to the queue), runs the leader tasks, and when the
    /// term's token is cancelled puts the shard back in standby and waits for what it started.
    pub async fn serve(&self, name: &str, term: Term) {
        if let Some(tasks) = &self.leader_tasks {
            start_leader_tasks(name, &term, tasks);
        }
        let parked = self.gate.open(self.shard, term.clone());
        for key in parked {
            self.queue.add(key);
        }
        term.ended().await;
        self.gate.standby(self.shard);
        let in_flight = term.in_flight();
        info!(controller = %name, shard = self.shard, in_flight, time_to_fence = ?term.time_to_fence(), "term ending: cancelled in-flight reconciles, waiting for them");
        term.wait_for_in_flight().await;
        info!(controller = %name, shard = self.shard, "every reconcile of the term has ended");
    }
}

/// The elector's callbacks: each term is served by [`ShardTerms::serve`].
fn term_callbacks(name: String, terms: ShardTerms) -> LeaderCallbacks {
    let stopped_name = name.clone();
    let new_leader_name = name.clone();
    let terms = Arc::new(terms);
    LeaderCallbacks::new(
        move |leader| {
            let (name, terms) = (name.clone(), terms.clone());
            async move {
                info!(controller = %name, "became the leader; starting workers");
                terms.serve(&name, Term::leading(leader)).await;
            }
        },
        move || info!(controller = %stopped_name, "stopped leading"),
    )
    .on_new_leader(
        move |holder| info!(controller = %new_leader_name, leader = %holder, "new leader elected"),
    )
}

fn start_leader_tasks(name: &str, term: &Term, tasks: &Arc<Vec<LeaderTask>>) {
    for task in tasks.iter() {
        let (term_for_task, run, task_name) = (term.clone(), task.run.clone(), task.name.clone());
        let controller = name.to_string();
        tokio::spawn(async move {
            let ctx = term_for_task.reconcile_context();
            if term_for_task.run(run(ctx)).await.is_none() {
                warn!(controller = %controller, task = %task_name, "leader task did not stop by the fence; dropped it");
            }
        });
    }
}

/// One worker: wait for an open shard, take keys while one is open; return when the queue is shut down
/// and drained or the gate closes.
pub(super) async fn worker_loop<F, Fut, E, P>(
    shared: Arc<WorkerShared<F, P>>,
    lane: Lane,
    mut gate: GateWatch,
    id: usize,
) where
    F: Fn(String, ReconcileContext) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Action, E>> + Send + 'static,
    E: Display + Send + 'static,
    P: Fn(&E, &str, u32) -> ErrorAction + Send + Sync + 'static,
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

pub(super) enum Next {
    Continue,
    /// No shard has a live term: wait for one.
    NotOpen,
    QueueDone,
}

/// Takes one key and reconciles it. sample-controller: `processNextWorkItem`.
pub(super) async fn process_next<F, Fut, E, P>(
    shared: &WorkerShared<F, P>,
    lane: Lane,
    gate: &Gate,
) -> Next
where
    F: Fn(String, ReconcileContext) -> Fut,
    Fut: Future<Output = Result<Action, E>>,
    E: Display,
    P: Fn(&E, &str, u32) -> ErrorAction,
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
    let key = tokio::select! {
        biased;
        _ = gate.until_not_open() => return Next::NotOpen,
        key = taken_from.get() => key,
    };
    let Some(key) = key else {
        return Next::QueueDone;
    };
    crate::trace::record(&key, Stage::WorkerTook, "", || format!("controller {name}"));
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
            _ = ctx.cancelled() => {
                queue.add(key.clone());
                taken_from.done(&key);
                return Next::Continue;
            }
        },
    };
    // The start and end of every reconcile, for tests that check that no two replicas'
    // reconciles ever overlap (tests/vm_controller.rs, the chaos test).
    debug!(controller = name, key = %key, "reconcile started");
    let span = tracing::info_span!("reconcile", controller = %name, key = %key);
    let started = std::time::Instant::now();
    crate::trace::record(&key, Stage::ReconcileStarted, "", String::new);
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
        queue.add(key.clone());
        taken_from.done(&key);
        return Next::Continue;
    }
    let outcome = outcome.expect("not cut short");
    let result = match &outcome {
        Ok(Ok(Action::Done)) => ReconcileResult::success,
        Ok(Ok(Action::RequeueAfter(_))) => ReconcileResult::requeue_after,
        Ok(Err(_)) => ReconcileResult::error,
        Err(_) => ReconcileResult::panic,
    };
    ReconcileMetrics::global().observe(name, result, started.elapsed());
    crate::trace::record(&key, Stage::ReconcileFinished, "", || match &outcome {
        Ok(Ok(Action::RequeueAfter(after))) => {
            format!("requeue after {after:?}, took {:.1?}", started.elapsed())
        }
        Ok(Err(e)) => format!("error after {:.1?}: {e}", started.elapsed()),
        _ => format!("{result:?} in {:.1?}", started.elapsed()),
    });
    match outcome {
        Ok(Ok(Action::Done)) => {
            queue.forget(&key);
            debug!(controller = name, key = %key, "successfully synced");
        }
        Ok(Ok(Action::RequeueAfter(after))) => {
            queue.forget(&key);
            shared.later.add_after(key.clone(), after);
            debug!(controller = name, key = %key, ?after, "synced, requeued");
        }
        Ok(Err(e)) => match (shared.error_policy)(&e, &key, queue.num_requeues(&key)) {
            ErrorAction::RateLimited => {
                queue.add_rate_limited(key.clone());
                error!(controller = name, key = %key, requeues = queue.num_requeues(&key), error = %e, "error syncing, requeuing");
            }
            ErrorAction::RequeueAfter(after) => {
                queue.add_after(key.clone(), after);
                error!(controller = name, key = %key, ?after, error = %e, "error syncing, requeuing after a fixed delay");
            }
            ErrorAction::Drop => {
                queue.forget(&key);
                error!(controller = name, key = %key, error = %e, "dropping key");
            }
        },
        Err(panic) => {
            queue.add_rate_limited(key.clone());
            error!(controller = name, key = %key, panic = panic_message(&panic), "reconcile panicked, requeuing");
        }
    }
    taken_from.done(&key);
    Next::Continue
}

pub(super) fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_string()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::time::Duration;

    use k8s_openapi::api::core::v1::{ConfigMap, Secret};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
    use kube_client::core::ObjectMeta;
    use parking_lot::Mutex;
    use tokio::time::Instant;

    use super::*;
    use crate::cache::fake_source::FakeControllerSource;
    use crate::cache::{InformerConfig, SharedIndexInformer};
    use crate::controller::default_error_policy;
    use crate::leaderelection::fake_lock::{FakeLockStore, Reach};
    use crate::leaderelection::{LeaderElectionConfig, LeaderElector};
    use crate::testing::settle;

    fn cm(name: &str) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta {
                namespace: Some("ns".into()),
                name: Some(name.into()),
                uid: Some(format!("uid-{name}")),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    fn informer<K: CacheObject>(source: &FakeControllerSource<K>) -> SharedIndexInformer<K>
    where
        FakeControllerSource<K>: crate::cache::ListerWatcher<K>,
    {
        SharedIndexInformer::new(source.clone(), InformerConfig::default())
    }

    /// Every reconcile: (key, start, end) on the paused clock.
    #[derive(Clone, Default)]
    struct Log(Arc<Mutex<Vec<Entry>>>);

    /// (key, started, ended).
    type Entry = (String, Instant, Option<Instant>);

    impl Log {
        fn keys(&self) -> Vec<String> {
            self.0.lock().iter().map(|(k, _, _)| k.clone()).collect()
        }
        fn start(&self, key: &str) -> usize {
            let mut log = self.0.lock();
            log.push((key.to_string(), Instant::now(), None));
            log.len() - 1
        }
        fn end(&self, i: usize) {
            self.0.lock()[i].2 = Some(Instant::now());
        }
    }

    /// A reconcile that records itself and takes `work` (returning early, with an error, if
    /// its context is cancelled and `honours_cancel`).
    fn recording(
        log: Log,
        work: Duration,
        honours_cancel: bool,
    ) -> impl Fn(
        String,
        ReconcileContext,
    ) -> futures::future::BoxFuture<'static, Result<Action, String>>
    + Send
    + Sync
    + 'static {
        move |key, ctx| {
            let log = log.clone();
            Box::pin(async move {
                let i = log.start(&key);
                let result = if honours_cancel {
                    tokio::select! {
                        _ = ctx.cancelled() => Err("cancelled".to_string()),
                        _ = tokio::time::sleep(work) => Ok(Action::Done),
                    }
                } else {
                    tokio::time::sleep(work).await;
                    Ok(Action::Done)
                };
                log.end(i);
                result
            })
        }
    }

    #[tokio::test(start_paused = true)]
    async fn primary_owned_and_watched_events_each_reconcile_the_right_key() {
        let primary = FakeControllerSource::<ConfigMap>::new();
        let owned = FakeControllerSource::<Secret>::new();
        primary.add(cm("a"));
        primary.add(cm("b"));
        let log = Log::default();
        let watched_map = |s: &Secret| {
            s.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get("for"))
                .map(|name| vec![format!("ns/{name}")])
                .unwrap_or_default()
        };
        let controller = Controller::new("test", informer(&primary))
            .owns(informer(&owned))
            .watches(informer(&owned), watched_map);
        let ready = controller.readiness();
        let shutdown = CancellationToken::new();
        let run = tokio::spawn(controller.run(
            recording(log.clone(), Duration::from_millis(1), true),
            default_error_policy,
            shutdown.clone(),
        ));
        settle().await;
        assert!(ready.load(Ordering::SeqCst), "ready once the caches synced");
        let mut first = log.keys();
        first.sort();
        assert_eq!(
            first,
            ["ns/a", "ns/b"],
            "the initial list reconciles every primary"
        );

        // An owned Secret whose controller is ConfigMap a: a's key.
        let mut secret = Secret {
            metadata: ObjectMeta {
                namespace: Some("ns".into()),
                name: Some("s".into()),
                owner_references: Some(vec![OwnerReference {
                    api_version: "v1".into(),
                    kind: "ConfigMap".into(),
                    name: "a".into(),
                    uid: "uid-a".into(),
                    controller: Some(true),
                    ..Default::default()
                }]),
                ..Default::default()
            },
            ..Default::default()
        };
        owned.add(secret.clone());
        settle().await;
        assert_eq!(log.keys()[2..], ["ns/a"]);
        // Owned by an uncached ConfigMap, or by another kind: nothing.
        secret.metadata.name = Some("t".into());
        secret.metadata.owner_references.as_mut().unwrap()[0].name = "gone".into();
        owned.add(secret.clone());
        secret.metadata.name = Some("u".into());
        secret.metadata.owner_references.as_mut().unwrap()[0] = OwnerReference {
            api_version: "apps/v1".into(),
            kind: "ConfigMap".into(),
            name: "a".into(),
            controller: Some(true),
            ..Default::default()
        };
        owned.add(secret.clone());
        settle().await;
        assert_eq!(log.keys().len(), 3);
        // The watch mapping: a Secret labelled for b.
        let mut labelled = Secret::default();
        labelled.metadata.namespace = Some("ns".into());
        labelled.metadata.name = Some("l".into());
        labelled.metadata.labels = Some(BTreeMap::from([("for".into(), "b".into())]));
        owned.add(labelled);
        settle().await;
        assert_eq!(log.keys()[3..], ["ns/b"]);
        // A primary deletion reconciles its key by default.
        primary.delete(cm("a"));
        settle().await;
        assert_eq!(log.keys()[4..], ["ns/a"]);

        shutdown.cancel();
        run.await.unwrap().unwrap();
        assert!(
            !ready.load(Ordering::SeqCst),
            "not ready once shutdown started"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn with_a_requeue_lane_event_work_never_waits_behind_timed_requeues_and_no_key_runs_twice_at_once()
     {
        // 40 keys that ask to come back every second, each reconcile taking 100 ms: 4 s of
        // periodic work per second, far more than the lane's 2 workers do. A new key's event
        // must still be reconciled at once, not behind that backlog.
        let primary = FakeControllerSource::<ConfigMap>::new();
        for i in 0..40 {
            primary.add(cm(&format!("p{i}")));
        }
        let log = Log::default();
        let recorder = log.clone();
        let reconcile = move |key: String, _ctx: ReconcileContext| {
            let log = recorder.clone();
            Box::pin(async move {
                let i = log.start(&key);
                tokio::time::sleep(Duration::from_millis(100)).await;
                log.end(i);
                if key.starts_with("ns/p") {
                    Ok(Action::RequeueAfter(Duration::from_secs(1)))
                } else {
                    Ok::<_, String>(Action::Done)
                }
            }) as futures::future::BoxFuture<'static, Result<Action, String>>
        };
        let controller = Controller::new("test", informer(&primary))
            .workers(2)
            .requeue_lane(2);
        let shutdown = CancellationToken::new();
        let run = tokio::spawn(controller.run(reconcile, default_error_policy, shutdown.clone()));
        // The initial 40 go through the main lane (2 s), then keep the requeue lane busy.
        tokio::time::sleep(Duration::from_secs(5)).await;
        let added = Instant::now();
        primary.add(cm("new"));
        tokio::time::sleep(Duration::from_secs(1)).await;
        let entries = log.0.lock().clone();
        let (_, started, ended) = entries
            .iter()
            .find(|(k, _, _)| k == "ns/new")
            .expect("the new key was reconciled")
            .clone();
        assert!(
            started - added < Duration::from_millis(20),
            "the new key waited {:?} behind timed requeues",
            started - added
        );
        assert!(ended.is_some());
        // Timed requeues ran in their own lane meanwhile (at most 2 at once: 20 a second).
        let requeued = entries
            .iter()
            .filter(|(k, s, _)| k.starts_with("ns/p") && *s > added)
            .count();
        assert!(
            (15..=21).contains(&requeued),
            "{requeued} timed requeues in the second after the add"
        );
        // No key was ever in two reconciles at once.
        let mut by_key: std::collections::HashMap<&str, Vec<(Instant, Instant)>> =
            Default::default();
        for (k, s, e) in &entries {
            by_key
                .entry(k.as_str())
                .or_default()
                .push((*s, e.unwrap_or(Instant::now())));
        }
        for (key, mut spans) in by_key {
            spans.sort();
            for w in spans.windows(2) {
                assert!(w[0].1 <= w[1].0, "{key} reconciled twice at once: {w:?}");
            }
        }
        shutdown.cancel();
        run.await.unwrap().unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_timed_requeue_of_a_key_in_reconcile_waits_for_it_and_errors_go_to_the_rate_limiter()
    {
        // Key a asks back after 50 ms and takes 10 ms; an update event at 55 ms makes the main
        // lane reconcile it while (or just after) the requeue lane does: never at once. Key b
        // fails once: its retry comes from the controller's queue with backoff.
        let primary = FakeControllerSource::<ConfigMap>::new();
        primary.add(cm("a"));
        primary.add(cm("b"));
        let log = Log::default();
        let recorder = log.clone();
        let failures = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let failed = failures.clone();
        let reconcile = move |key: String, _ctx: ReconcileContext| {
            let log = recorder.clone();
            let failed = failed.clone();
            Box::pin(async move {
                let i = log.start(&key);
                tokio::time::sleep(Duration::from_millis(10)).await;
                log.end(i);
                match key.as_str() {
                    "ns/a" => Ok(Action::RequeueAfter(Duration::from_millis(50))),
                    _ if failed.fetch_add(1, Ordering::SeqCst) == 0 => Err("boom".to_string()),
                    _ => Ok(Action::Done),
                }
            }) as futures::future::BoxFuture<'static, Result<Action, String>>
        };
        let controller = Controller::new("test", informer(&primary))
            .workers(1)
            .requeue_lane(1);
        let shutdown = CancellationToken::new();
        let run = tokio::spawn(controller.run(reconcile, default_error_policy, shutdown.clone()));
        tokio::time::sleep(Duration::from_millis(65)).await;
        let mut a = cm("a");
        a.data = Some(BTreeMap::from([("k".into(), "v".into())]));
        primary.modify(a);
        tokio::time::sleep(Duration::from_millis(300)).await;
        let entries = log.0.lock().clone();
        let a_spans: Vec<(Instant, Instant)> = entries
            .iter()
            .filter(|(k, _, _)| k == "ns/a")
            .map(|(_, s, e)| (*s, e.unwrap_or(Instant::now())))
            .collect();
        assert!(a_spans.len() >= 5, "{a_spans:?}");
        for w in a_spans.windows(2) {
            assert!(w[0].1 <= w[1].0, "a reconciled twice at once: {w:?}");
        }
        let b_runs = entries.iter().filter(|(k, _, _)| k == "ns/b").count();
        assert_eq!(b_runs, 2, "b failed once and was retried once");
        shutdown.cancel();
        run.await.unwrap().unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn an_update_filter_and_enqueue_deletes_off_keep_those_events_out() {
        let primary = FakeControllerSource::<ConfigMap>::new();
        primary.add(cm("a"));
        let log = Log::default();
        let controller = Controller::new("test", informer(&primary))
            .update_filter(|old: &ConfigMap, new: &ConfigMap| old.data != new.data)
            .enqueue_deletes(false);
        let shutdown = CancellationToken::new();
        let run = tokio::spawn(controller.run(
            recording(log.clone(), Duration::from_millis(1), true),
            default_error_policy,
            shutdown.clone(),
        ));
        settle().await;
        let mut labelled = cm("a");
        labelled.metadata.labels = Some(BTreeMap::from([("x".into(), "y".into())]));
        primary.modify(labelled.clone());
        settle().await;
        assert_eq!(
            log.keys(),
            ["ns/a"],
            "a label change does not pass the filter"
        );
        labelled.data = Some(BTreeMap::from([("k".into(), "v".into())]));
        primary.modify(labelled.clone());
        settle().await;
        assert_eq!(log.keys(), ["ns/a", "ns/a"], "a data change does");
        primary.delete(labelled);
        settle().await;
        assert_eq!(log.keys().len(), 2, "deletes are not enqueued");
        shutdown.cancel();
        run.await.unwrap().unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn the_error_policy_decides_between_backoff_fixed_delay_and_drop() {
        let primary = FakeControllerSource::<ConfigMap>::new();
        for name in ["backoff", "fixed", "drop"] {
            primary.add(cm(name));
        }
        let calls = Arc::new(Mutex::new(BTreeMap::<String, Vec<Instant>>::new()));
        let c = calls.clone();
        let reconcile = move |key: String, _ctx: ReconcileContext| {
            let c = c.clone();
            async move {
                c.lock()
                    .entry(key.clone())
                    .or_default()
                    .push(Instant::now());
                Err::<Action, _>(key)
            }
        };
        let policy = |key: &String, _: &str, retries: u32| match key.as_str() {
            "ns/fixed" => ErrorAction::RequeueAfter(Duration::from_secs(10)),
            "ns/drop" => ErrorAction::Drop,
            _ => {
                assert!(retries < 100);
                ErrorAction::RateLimited
            }
        };
        let controller = Controller::new("test", informer(&primary));
        let shutdown = CancellationToken::new();
        let run = tokio::spawn(controller.run(reconcile, policy, shutdown.clone()));
        tokio::time::sleep(Duration::from_secs(25)).await;
        shutdown.cancel();
        run.await.unwrap().unwrap();
        let calls = calls.lock();
        assert_eq!(calls["ns/drop"].len(), 1, "dropped after one failure");
        assert_eq!(calls["ns/fixed"].len(), 3, "at 0, 10 and 20 s");
        // 5 ms doubling: 0, 5, 15, 35, ... ms; 13 attempts by 25 s (5 ms * 2^12 = 20 s).
        assert!(
            (12..=14).contains(&calls["ns/backoff"].len()),
            "{:?}",
            calls["ns/backoff"].len()
        );
    }

    #[tokio::test(start_paused = true)]
    async fn shutdown_drains_queued_and_in_flight_keys() {
        let primary = FakeControllerSource::<ConfigMap>::new();
        for i in 0..10 {
            primary.add(cm(&format!("c{i}")));
        }
        let log = Log::default();
        let controller = Controller::new("test", informer(&primary)).workers(2);
        let shutdown = CancellationToken::new();
        let run = tokio::spawn(controller.run(
            recording(log.clone(), Duration::from_secs(1), false),
            default_error_policy,
            shutdown.clone(),
        ));
        tokio::time::sleep(Duration::from_millis(1500)).await;
        shutdown.cancel();
        run.await.unwrap().unwrap();
        let log = log.0.lock();
        assert_eq!(
            log.len(),
            10,
            "every queued key was reconciled before stopping"
        );
        assert!(
            log.iter().all(|(_, _, end)| end.is_some()),
            "none was cut off"
        );
    }

    /// lease 4 s, renew deadline 3 s, retry 0.5 s: fence = last renew + 3.5 s.
    fn election() -> LeaderElectionConfig {
        LeaderElectionConfig {
            lease_duration: Duration::from_secs(4),
            renew_deadline: Duration::from_secs(3),
            retry_period: Duration::from_millis(500),
            release_on_cancel: true,
            recontend: true,
            name: "ns/test".into(),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_standby_keeps_its_cache_warm_and_reconciles_only_once_it_leads() {
        let primary = FakeControllerSource::<ConfigMap>::new();
        primary.add(cm("a"));
        let store = FakeLockStore::new();
        // Someone else holds the lease and keeps it until we cut them off.
        let other = LeaderElector::new(election(), store.lock_for("other")).unwrap();
        let other_stop = CancellationToken::new();
        let other_run = tokio::spawn({
            let stop = other_stop.clone();
            async move {
                other
                    .run(
                        crate::leaderelection::LeaderCallbacks::new(|_| async {}, || {}),
                        stop,
                    )
                    .await
            }
        });
        settle().await;
        assert_eq!(store.holder(), "other");

        let log = Log::default();
        let elector = LeaderElector::new(election(), store.lock_for("me")).unwrap();
        let controller = Controller::new("test", informer(&primary)).leader_election(elector);
        let ready = controller.readiness();
        let lister = controller.primary_lister();
        let shutdown = CancellationToken::new();
        let run = tokio::spawn(controller.run(
            recording(log.clone(), Duration::from_millis(1), true),
            default_error_policy,
            shutdown.clone(),
        ));
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert!(
            ready.load(Ordering::SeqCst),
            "a standby is ready once its caches synced"
        );
        assert!(lister.get("ns", "a").is_some(), "and its cache is warm");
        assert!(log.keys().is_empty(), "but it reconciles nothing");

        // The leader dies (stops renewing without releasing): we take over after the lease.
        store.set_reach("other", Reach::Hang);
        let died = Instant::now();
        tokio::time::sleep(Duration::from_secs(6)).await;
        assert_eq!(store.holder(), "me");
        let first = log.0.lock()[0].1;
        assert!(
            first - died <= Duration::from_millis(5000),
            "took over within lease + retry"
        );
        assert_eq!(log.keys(), ["ns/a"]);
        other_stop.cancel();
        let _ = other_run.await;
        shutdown.cancel();
        run.await.unwrap().unwrap();
        assert_eq!(store.holder(), "", "released on shutdown");
    }

    #[tokio::test(start_paused = true)]
    async fn losing_the_lease_cancels_in_flight_reconciles_and_ends_them_before_anyone_can_acquire()
    {
        let primary = FakeControllerSource::<ConfigMap>::new();
        primary.add(cm("obeys"));
        primary.add(cm("ignores"));
        let store = FakeLockStore::new();
        let log = Log::default();
        let elector = LeaderElector::new(election(), store.lock_for("me")).unwrap();
        let controller = Controller::new("test", informer(&primary))
            .workers(2)
            .leader_election(elector);
        let shutdown = CancellationToken::new();
        // "ns/obeys" returns when cancelled; "ns/ignores" never looks at its context.
        let l = log.clone();
        let reconcile = move |key: String, ctx: ReconcileContext| {
            let l = l.clone();
            async move {
                let i = l.start(&key);
                if key == "ns/obeys" {
                    ctx.cancelled().await;
                } else {
                    tokio::time::sleep(Duration::from_secs(3600)).await;
                }
                l.end(i);
                Err::<Action, _>("cancelled".to_string())
            }
        };
        let run = tokio::spawn(controller.run(reconcile, default_error_policy, shutdown.clone()));
        settle().await;
        assert_eq!(store.holder(), "me");
        assert_eq!(log.keys().len(), 2, "both reconciles started");

        // The apiserver goes away: renewals fail from now on.
        store.set_reach("me", Reach::Refuse);
        let cut = Instant::now();
        // Another candidate comes up and takes the lease as soon as it may.
        let rival = LeaderElector::new(election(), store.lock_for("rival")).unwrap();
        let rival_started = Arc::new(Mutex::new(None::<Instant>));
        let rs = rival_started.clone();
        let rival_stop = CancellationToken::new();
        let rival_run = tokio::spawn({
            let stop = rival_stop.clone();
            async move {
                rival
                    .run(
                        crate::leaderelection::LeaderCallbacks::new(
                            move |_| {
                                *rs.lock() = Some(Instant::now());
                                async {}
                            },
                            || {},
                        ),
                        stop,
                    )
                    .await
            }
        });
        tokio::time::sleep(Duration::from_secs(10)).await;
        let rival_led = rival_started.lock().expect("the rival acquired");
        let log = log.0.lock().clone();
        let obeys = log.iter().find(|(k, _, _)| k == "ns/obeys").unwrap();
        let end = obeys.2.expect("the cancelled reconcile returned");
        assert!(
            end - cut <= Duration::from_secs(3),
            "cancelled by the renew deadline: {:?}",
            end - cut
        );
        let ignores = log.iter().find(|(k, _, _)| k == "ns/ignores").unwrap();
        assert!(
            ignores.2.is_none(),
            "the stubborn one was dropped, never finished"
        );
        assert!(rival_led > end, "no successor before every reconcile ended");
        // Nothing of ours runs after the rival leads: the dropped future is gone.
        assert!(
            rival_led - cut >= Duration::from_secs(3),
            "{:?}",
            rival_led - cut
        );
        rival_stop.cancel();
        let _ = rival_run.await;
        shutdown.cancel();
        let _ = run.await.unwrap();
    }
}
