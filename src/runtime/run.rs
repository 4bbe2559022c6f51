//! Running a declared [`Controller`]: informers, handlers -> queue, workers, readiness,
//! leadership and shutdown, in this order:
//!
//! 1. register the event handlers, start every informer, wait for every cache (a shutdown
//!    meanwhile returns [`ControllerError::CacheSync`] naming the informers not synced; a
//!    cache not synced within the cache-sync timeout returns
//!    [`ControllerError::CacheSyncTimeout`] naming each and its last list error);
//! 2. readiness on; the workers start, behind the leadership gate (`leadership.rs`);
//! 3. without leader election the gate opens at once for one endless term; with sharding
//!    (`sharding/`) the ring runs one elector per shard this replica should hold, and
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
//! A worker's loop is sample-controller's `processNextWorkItem` (`worker.rs`); what the
//! reconcile's result does to the key is written on [`Action`] and [`ErrorAction`]. A key taken
//! after its term ended, or whose reconcile was ended by the loss of leadership, is put back
//! for the next leader without counting as a failure.

use std::fmt::Display;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use thiserror::Error;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{error, info};

use super::action::{Action, ErrorAction};
use super::builder::Controller;
use super::context::ReconcileContext;
use super::freshness::Freshness;
use super::key::ObjectKey;
use super::lanes::{Lane, Queues};
use super::leadership::{Gate, ShardMap, Term};
use super::sharding::{RingContext, Sharding};
use super::terms::{LeaderTask, ShardTerms, start_leader_tasks, term_callbacks};
use super::worker::{WorkerShared, worker_loop};
use crate::cache::{CacheObject, InformerError};
use crate::leaderelection::StopReason;

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
    /// A cache did not sync within the cache-sync timeout
    /// ([`Controller::cache_sync_timeout`]; controller-runtime: "failed to wait for caches to
    /// sync ... timed out waiting for cache to be synced").
    #[error("failed to wait for {controller} caches to sync: timed out after {timeout:?} waiting for {}", not_synced.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    CacheSyncTimeout {
        /// The controller's name.
        controller: String,
        /// The timeout that expired.
        timeout: std::time::Duration,
        /// Each informer that had not synced, with its last error.
        not_synced: Vec<NotSynced>,
    },
    /// Leadership ended and the elector does not contend again (client-go's `Run` returns).
    #[error("leader election lost: {0:?}")]
    LeadershipLost(StopReason),
}

/// An informer whose cache did not sync in time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotSynced {
    /// The resource: `group/version/plural` (`version/plural` for the core group).
    pub resource: String,
    /// The last list or watch error its reflector reported (`None`: none yet; the list may
    /// still be running).
    pub last_error: Option<String>,
}

impl Display for NotSynced {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.last_error {
            Some(error) => write!(f, "{} (last error: {error})", self.resource),
            None => write!(f, "{} (no list error reported)", self.resource),
        }
    }
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
        F: Fn(ObjectKey, ReconcileContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Action, E>> + Send + 'static,
        E: Display + Send + 'static,
        P: Fn(&E, &ObjectKey, u32) -> ErrorAction + Send + Sync + 'static,
    {
        let name = self.name.clone();
        let queue = self.make_queue();
        let freshness = Freshness::new(&name, self.options.freshness_wait);
        self.primary
            .add_event_handler(self.primary_handler(&queue))?;
        self.primary
            .add_event_handler(freshness.source(self.primary.lister(), true))?;
        for register in std::mem::take(&mut self.registrations) {
            register(&queue, &freshness)?;
        }

        for informer in &self.informers {
            informer.start();
        }
        info!(controller = %name, "waiting for informer caches to sync");
        let timeout = self.options.cache_sync_timeout;
        let synced = tokio::select! {
            synced = futures::future::join_all(self.informers.iter().map(|i| i.wait_for_cache_sync())) => synced,
            _ = shutdown.cancelled() => self.informers.iter().map(|i| i.has_synced()).collect(),
            _ = tokio::time::sleep(timeout) => {
                let not_synced: Vec<NotSynced> = self
                    .informers
                    .iter()
                    .filter(|i| !i.has_synced())
                    .map(|i| NotSynced { resource: i.type_name(), last_error: i.last_error() })
                    .collect();
                if !not_synced.is_empty() {
                    let err = ControllerError::CacheSyncTimeout { controller: name.clone(), timeout, not_synced };
                    error!(controller = %name, "{err}");
                    queue.shutdown();
                    self.stop_informers().await;
                    return Err(err);
                }
                vec![true; self.informers.len()]
            }
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
            freshness: Some(freshness),
            reconcile,
            error_policy,
        });
        let gate = Gate::new(match &self.sharding {
            None => ShardMap::Keys(1),
            Some(Sharding {
                scope: Some(scope), ..
            }) => ShardMap::Namespaces(scope.clone()),
            Some(sharding) => ShardMap::Keys(sharding.shards),
        });
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
                        scope: sharding.scope.clone(),
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
                        scope: None,
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

#[cfg(test)]
mod tests;
