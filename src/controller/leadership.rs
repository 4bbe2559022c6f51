//! The gate between the elector and the workers: who may take keys, and until when a
//! reconcile may run.
//!
//! Counterpart: controller-runtime starts a controller's workers only once the manager leads
//! and exits the process when leadership is lost (`pkg/manager/internal.go`); client-go's
//! `leaderelection.RunOrDie` runs `OnStartedLeading` and cancels its context. Neither waits for
//! in-flight reconciles. kube-runtime has no leader election. Here leadership comes in
//! **terms**: a [`Term`] is opened when this process starts leading and ended when the elector
//! steps down. Workers take keys only during a term; every reconcile runs inside the term's
//! task tracker, with a [`ReconcileContext`] whose token is a child of the term's.
//!
//! # The guarantee
//! Every reconcile (and leader task) started in a term has *ended* (returned, or been dropped
//! by its worker) before any other candidate can acquire the Lease, measured on this process's
//! clock. The arithmetic, from `shared/RUNTIME-NOTES.md`:
//! - a follower acquires only after seeing the Lease unchanged for `lease_duration`, counted
//!   from when it *observed* our last renewal, which was sent at `t_send`; so no successor
//!   acquires before `t_send + lease_duration` ([`LeaderContext::lease_valid_until`]);
//! - the elector stops renewing, and cancels the term's token, at `t_send + renew_deadline` at
//!   the latest (earlier if it sees another holder, a duplicate of its identity, or shutdown);
//! - a reconcile that has not returned by the **fence**, `t_send + renew_deadline +
//!   (lease_duration - renew_deadline) / 2`, is dropped by its worker (its future is never
//!   polled again). With the 15/10 s defaults: cancelled at 10 s, dropped at 12.5 s, successor
//!   at 15 s at the earliest; half the window is left as safety margin.
//! - [`ReconcileContext::check`] fails from `t_send + renew_deadline` on by this process's own
//!   clock, so a reconcile that checks before each side effect causes none after that, even if
//!   the elector task has not run yet (a process resumed from SIGSTOP past its lease: the fence
//!   has passed, the worker drops the reconcile at its next poll, and the check fails anyway).
//!
//! Assumptions: clocks of the candidates run at the same rate (client-go makes the same
//! assumption; a rate difference of x% eats x% of `lease_duration` from the margin); the
//! runtime's threads are not starved for longer than the margin while the process runs (a
//! reconcile that blocks a thread without awaiting cannot be dropped); and what a reconcile
//! already *sent* to an outside system cannot be recalled: a request in flight at the fence may
//! still land. Those side effects need defences of their own (fencing tokens where the system
//! can compare them, compensation, an orphan sweep: see the VM controller).

use std::time::Duration;

use tokio::sync::watch;
use tokio::time::{Instant, sleep_until};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::context::ReconcileContext;
use crate::leaderelection::LeaderContext;

/// One period during which this process may reconcile: a leadership term, or, without leader
/// election, the whole run. Cheap to clone.
#[derive(Clone)]
pub struct Term {
    /// Cancelled when the term ends.
    token: CancellationToken,
    /// `None` without leader election (the term never ends by itself).
    leader: Option<LeaderContext>,
    /// Every reconcile and leader task of this term.
    tracker: TaskTracker,
}

impl std::fmt::Debug for Term {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Term")
            .field("leader_election", &self.leader.is_some())
            .field("ended", &self.token.is_cancelled())
            .field("in_flight", &self.tracker.len())
            .finish()
    }
}

/// Where the workers stand.
#[derive(Clone, Debug)]
enum GateState {
    /// Waiting for leadership (caches stay warm, keys pile up deduplicated).
    Standby,
    /// Leading: take keys.
    Open(Term),
    /// The runtime is stopping: workers return.
    Closed,
}

impl GateState {
    /// The open term, if the gate is open and the term has not ended.
    fn live_term(&self) -> Option<&Term> {
        match self {
            GateState::Open(term) if !term.is_over() => Some(term),
            _ => None,
        }
    }
}

/// The sending side, held by the runtime; workers hold [`GateWatch`]es.
#[derive(Debug)]
pub(crate) struct Gate {
    tx: watch::Sender<GateState>,
}

/// A worker's view of the gate.
#[derive(Clone, Debug)]
pub(crate) struct GateWatch {
    rx: watch::Receiver<GateState>,
}

impl Term {
    /// The one endless term of a controller without leader election; `token` ends it.
    pub fn unfenced(token: CancellationToken) -> Self {
        Term {
            token,
            leader: None,
            tracker: TaskTracker::new(),
        }
    }

    /// The term of one leadership: ends when the elector cancels `leader`'s token.
    pub fn leading(leader: LeaderContext) -> Self {
        Term {
            token: leader.token().clone(),
            leader: Some(leader),
            tracker: TaskTracker::new(),
        }
    }

    /// A context for one reconcile of this term (its token is a child of the term's).
    pub fn reconcile_context(&self) -> ReconcileContext {
        let token = self.token.child_token();
        match &self.leader {
            Some(leader) => ReconcileContext::for_term(token, leader.clone()),
            None => ReconcileContext::new(token),
        }
    }

    /// Ends the term (the runtime does so for the endless term of a controller without leader
    /// election; a leadership term ends when the elector cancels its token).
    pub fn end(&self) {
        self.token.cancel()
    }

    /// True once the term has ended (or, with leader election, its entitlement lapsed by this
    /// process's clock even if the elector has not said so yet).
    pub fn is_over(&self) -> bool {
        self.token.is_cancelled() || self.leader.as_ref().is_some_and(|l| !l.still_leading())
    }

    /// Resolves when the term's token is cancelled.
    pub async fn ended(&self) {
        self.token.cancelled().await
    }

    /// The instant by which every reconcile of this term must have ended (see the module
    /// docs); moves later with every renewal. `None` without leader election.
    pub fn fence(&self) -> Option<Instant> {
        let leader = self.leader.as_ref()?;
        let valid_until = leader.lease_valid_until();
        let deadline = leader.renew_deadline_at();
        Some(deadline + valid_until.saturating_duration_since(deadline) / 2)
    }

    /// Resolves once the fence has passed (never without leader election).
    pub async fn fence_reached(&self) {
        loop {
            let Some(fence) = self.fence() else {
                return std::future::pending().await;
            };
            sleep_until(fence).await;
            // A renewal in the meantime moved the fence later: wait again.
            if self.fence().is_none_or(|f| Instant::now() >= f) {
                return;
            }
        }
    }

    /// Runs `fut` as part of this term: counted until it ends, dropped at the fence.
    /// `None` if it was dropped at the fence.
    pub async fn run<F: Future>(&self, fut: F) -> Option<F::Output> {
        let tracked = self.tracker.track_future(fut);
        tokio::select! {
            biased;
            _ = self.fence_reached() => None,
            out = tracked => Some(out),
        }
    }

    /// Waits until every reconcile and task of this term has ended. Call once the term's token
    /// is cancelled; nothing can join the term afterwards.
    pub async fn wait_for_in_flight(&self) {
        self.tracker.close();
        self.tracker.wait().await
    }

    /// How many reconciles and tasks of this term are running.
    pub fn in_flight(&self) -> usize {
        self.tracker.len()
    }

    /// Time left before the fence (for logs), `None` without leader election.
    pub fn time_to_fence(&self) -> Option<Duration> {
        self.fence()
            .map(|f| f.saturating_duration_since(Instant::now()))
    }
}

impl Gate {
    /// A gate in standby.
    pub fn new() -> Self {
        Gate {
            tx: watch::Sender::new(GateState::Standby),
        }
    }

    pub fn watch(&self) -> GateWatch {
        GateWatch {
            rx: self.tx.subscribe(),
        }
    }

    /// Workers may take keys for `term`.
    pub fn open(&self, term: Term) {
        self.tx.send_if_modified(|state| {
            if matches!(state, GateState::Closed) {
                return false;
            }
            *state = GateState::Open(term);
            true
        });
    }

    /// Back to standby (unless closed).
    pub fn standby(&self) {
        self.tx.send_if_modified(|state| {
            if matches!(state, GateState::Closed) {
                return false;
            }
            *state = GateState::Standby;
            true
        });
    }

    /// Resolves once the gate is not open for a live term (standby, closed, or the term's
    /// entitlement lapsed).
    pub async fn until_not_open(&self) {
        let mut rx = self.tx.subscribe();
        loop {
            if rx.borrow_and_update().live_term().is_none() {
                return;
            }
            if rx.changed().await.is_err() {
                return;
            }
        }
    }

    /// Workers return.
    pub fn close(&self) {
        self.tx.send_replace(GateState::Closed);
    }
}

impl GateWatch {
    /// Waits for a term that has not ended; `None` once the gate is closed.
    pub async fn next_term(&mut self) -> Option<Term> {
        loop {
            {
                let state = self.rx.borrow_and_update();
                if matches!(*state, GateState::Closed) {
                    return None;
                }
                if let Some(term) = state.live_term() {
                    return Some(term.clone());
                }
            }
            if self.rx.changed().await.is_err() {
                return None;
            }
        }
    }
}
