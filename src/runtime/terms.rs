//! What a term of leadership (or of one shard) starts and ends: the gate opens for the
//! shard, the keys parked meanwhile go back to the queue, the leader tasks run; when the term
//! ends the shard goes back to standby and the term waits for every reconcile it started.
//! The elector's callbacks for one Lease ([`term_callbacks`]) and the sharding ring's
//! per-shard electors both serve their terms through [`ShardTerms::serve`].
//!
//! Counterpart: controller-runtime's leader-election runnables (`pkg/manager/internal.go`),
//! which start with leadership and are never waited for; here a term ends only after what it
//! started has ended (see `leadership.rs` for the fence).

use std::sync::Arc;

use futures::future::BoxFuture;
use tracing::{info, warn};

use super::context::ReconcileContext;
use super::leadership::{Gate, Term};
use super::queue::ControllerQueue;
use crate::cache::ShardScope;
use crate::leaderelection::LeaderCallbacks;

/// A task that runs only while this process leads (controller-runtime's
/// `LeaderElectionRunnable`), started with each term and ended before the term's fence.
pub(crate) struct LeaderTask {
    pub name: String,
    pub run: Arc<dyn Fn(ReconcileContext) -> BoxFuture<'static, ()> + Send + Sync>,
}

/// What one shard's terms open and close: the gate for that shard, the queue its parked keys
/// go back to, and (for the shard that carries them) the leader tasks.
pub(crate) struct ShardTerms {
    pub shard: u32,
    pub gate: Arc<Gate>,
    pub queue: ControllerQueue,
    pub leader_tasks: Option<Arc<Vec<LeaderTask>>>,
    /// The informers' shard scope, when they cache only the shards held
    /// ([`crate::runtime::ShardRing::watch_held_shards`]).
    pub scope: Option<ShardScope>,
}

impl ShardTerms {
    /// One term, from the elector's start to the end of every reconcile it started: opens the
    /// shard (its parked keys go back to the queue), runs the leader tasks, and when the
    /// term's token is cancelled puts the shard back in standby and waits for what it started.
    ///
    /// With a shard scope, the term first holds its shard in the scope and waits until the
    /// informers listed its range (a term that ends meanwhile releases it and returns), and
    /// releases it once the term's reconciles ended.
    pub async fn serve(&self, name: &str, term: Term) {
        if let Some(scope) = &self.scope {
            let generation = scope.hold(self.shard);
            info!(controller = %name, shard = self.shard, "listing the shard's range before its term opens");
            tokio::select! {
                () = scope.listed(generation) => {}
                () = term.ended() => {
                    scope.release(self.shard);
                    return;
                }
            }
        }
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
        if let Some(scope) = &self.scope {
            scope.release(self.shard);
        }
    }
}

/// The elector's callbacks: each term is served by [`ShardTerms::serve`].
pub(crate) fn term_callbacks(name: String, terms: ShardTerms) -> LeaderCallbacks {
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

pub(crate) fn start_leader_tasks(name: &str, term: &Term, tasks: &Arc<Vec<LeaderTask>>) {
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
