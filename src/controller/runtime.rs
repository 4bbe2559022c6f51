//! Running a declared [`Controller`]: informers, handlers -> queue, workers, readiness,
//! leadership and shutdown, in this order:
//!
//! 1. register the event handlers, start every informer, wait for every cache (a shutdown
//!    meanwhile returns [`ControllerError::CacheSync`] naming the informers not synced);
//! 2. readiness on; the workers start, behind the leadership gate ([`super::leadership`]);
//! 3. without leader election the gate opens at once for one endless term; with it, the
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
use super::leadership::{Gate, GateWatch, Term};
use super::worker::Action;
use crate::cache::{CacheObject, InformerError};
use crate::leaderelection::{LeaderCallbacks, StopReason};
use crate::ops::{ReconcileMetrics, ReconcileResult};
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

        let workers_ctx = Arc::new(WorkerShared {
            name: name.clone(),
            queue: queue.clone(),
            reconcile,
            error_policy,
        });
        let gate = Arc::new(Gate::new());
        let mut workers = JoinSet::new();
        info!(controller = %name, workers = self.options.workers, "starting workers");
        for id in 0..self.options.workers {
            workers.spawn(worker_loop(workers_ctx.clone(), gate.watch(), id));
        }
        let leader_tasks: Arc<Vec<LeaderTask>> = Arc::new(std::mem::take(&mut self.leader_tasks));

        let result = match self.leader_election.take() {
            None => {
                let term = Term::unfenced(shutdown.child_token());
                start_leader_tasks(&name, &term, &leader_tasks);
                gate.open(term.clone());
                shutdown.cancelled().await;
                self.ready.store(false, Ordering::SeqCst);
                info!(controller = %name, queued = queue.len(), "shutting down: draining the queue");
                queue.shutdown_with_drain().await;
                gate.close();
                term.end();
                term.wait_for_in_flight().await;
                Ok(())
            }
            Some(election) => {
                let elector_stop = CancellationToken::new();
                let callbacks = term_callbacks(name.clone(), gate.clone(), leader_tasks);
                let mut elector = tokio::spawn((election.run)(callbacks, elector_stop.clone()));
                let lost = tokio::select! {
                    _ = shutdown.cancelled() => None,
                    reason = &mut elector => Some(reason),
                };
                self.ready.store(false, Ordering::SeqCst);
                match lost {
                    None => {
                        info!(controller = %name, queued = queue.len(), "shutting down: draining what this leader has in flight and queued");
                        queue.shutdown_with_drain().await;
                        gate.close();
                        elector_stop.cancel();
                        match elector.await {
                            Ok(StopReason::Shutdown) | Err(_) => Ok(()),
                            Ok(reason) => Err(ControllerError::LeadershipLost(reason)),
                        }
                    }
                    Some(reason) => {
                        let reason = reason.unwrap_or(StopReason::Shutdown);
                        error!(controller = %name, ?reason, "leader election lost");
                        queue.shutdown();
                        gate.close();
                        Err(ControllerError::LeadershipLost(reason))
                    }
                }
            }
        };
        while let Some(joined) = workers.join_next().await {
            if let Err(e) = joined {
                error!(controller = %name, error = %e, "worker task ended abnormally");
            }
        }
        self.stop_informers().await;
        info!(controller = %name, "shut down");
        result
    }

    async fn stop_informers(&self) {
        futures::future::join_all(self.informers.iter().map(|i| i.shutdown())).await;
    }
}

/// What every worker shares.
pub(super) struct WorkerShared<F, P> {
    pub name: String,
    pub queue: RateLimitingQueue<String>,
    pub reconcile: F,
    pub error_policy: P,
}

/// The elector's callbacks: each term opens the gate, runs the leader tasks, and on its end
/// closes the gate and waits for everything it started.
fn term_callbacks(name: String, gate: Arc<Gate>, tasks: Arc<Vec<LeaderTask>>) -> LeaderCallbacks {
    let stopped_name = name.clone();
    let new_leader_name = name.clone();
    LeaderCallbacks::new(
        move |leader| {
            let (name, gate, tasks) = (name.clone(), gate.clone(), tasks.clone());
            async move {
                let term = Term::leading(leader);
                info!(controller = %name, "became the leader; starting workers");
                start_leader_tasks(&name, &term, &tasks);
                gate.open(term.clone());
                term.ended().await;
                gate.standby();
                let in_flight = term.in_flight();
                info!(controller = %name, in_flight, time_to_fence = ?term.time_to_fence(), "leadership ending: cancelled in-flight reconciles, waiting for them");
                term.wait_for_in_flight().await;
                info!(controller = %name, "every reconcile of the term has ended");
            }
        },
        move || info!(controller = %stopped_name, "stopped leading"),
    )
    .on_new_leader(move |holder| info!(controller = %new_leader_name, leader = %holder, "new leader elected"))
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

/// One worker: wait for a term, take keys while it lasts; return when the queue is shut down
/// and drained or the gate closes.
pub(super) async fn worker_loop<F, Fut, E, P>(shared: Arc<WorkerShared<F, P>>, mut gate: GateWatch, id: usize)
where
    F: Fn(String, ReconcileContext) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Action, E>> + Send + 'static,
    E: Display + Send + 'static,
    P: Fn(&E, &str, u32) -> ErrorAction + Send + Sync + 'static,
{
    debug!(controller = %shared.name, worker = id, "worker started");
    while let Some(term) = gate.next_term().await {
        loop {
            match process_next(&shared, &term).await {
                Next::Continue => {}
                Next::TermOver => break,
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
    TermOver,
    QueueDone,
}

/// Takes one key and reconciles it. sample-controller: `processNextWorkItem`.
pub(super) async fn process_next<F, Fut, E, P>(shared: &WorkerShared<F, P>, term: &Term) -> Next
where
    F: Fn(String, ReconcileContext) -> Fut,
    Fut: Future<Output = Result<Action, E>>,
    E: Display,
    P: Fn(&E, &str, u32) -> ErrorAction,
{
    let queue = &shared.queue;
    let name = shared.name.as_str();
    // `get` is cancel safe: a key is only taken in the poll that returns it.
    let key = tokio::select! {
        biased;
        _ = term.ended() => return Next::TermOver,
        key = queue.get() => key,
    };
    let Some(key) = key else {
        return Next::QueueDone;
    };
    // Re-checked after the wait: a process resumed after a long pause must not start work.
    if term.is_over() {
        queue.add(key.clone());
        queue.done(&key);
        return Next::TermOver;
    }
    let ctx = term.reconcile_context();
    let span = tracing::info_span!("reconcile", controller = %name, key = %key);
    let started = std::time::Instant::now();
    let reconcile = AssertUnwindSafe((shared.reconcile)(key.clone(), ctx.clone())).catch_unwind();
    let outcome = term.run(reconcile.instrument(span)).await;

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
        queue.done(&key);
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
    match outcome {
        Ok(Ok(Action::Done)) => {
            queue.forget(&key);
            debug!(controller = name, key = %key, "successfully synced");
        }
        Ok(Ok(Action::RequeueAfter(after))) => {
            queue.forget(&key);
            queue.add_after(key.clone(), after);
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
    queue.done(&key);
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
