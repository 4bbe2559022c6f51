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
//! With sharding (`sharding/`) each shard a replica holds is a term of its own, with
//! its own Lease; the gate knows which shards are open and hands a worker the term of the
//! key's shard. Everything below holds per shard.
//!
//! # The guarantee
//! Every reconcile (and leader task) started in a term has *ended* (returned, or been dropped
//! by its worker) before any other candidate can acquire the Lease, measured on this process's
//! clock. The arithmetic:
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

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::watch;
use tokio::time::{Instant, sleep_until};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::context::ReconcileContext;
use super::key::{ObjectKey, shard_of};
use crate::cache::ShardScope;
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

/// How keys are split into shards.
#[derive(Debug, Clone)]
pub(crate) enum ShardMap {
    /// By [`shard_of`] the key (`namespace/name`) over this many shards (1: no sharding).
    Keys(u32),
    /// By the namespace's hash range in the ring of this scope (the ranges its list-watches
    /// ask the apiserver for).
    Namespaces(ShardScope),
}

/// Where the workers stand: which shards this process holds a live term for, and the keys it
/// set aside for shards it does not hold.
///
/// Without sharding there is one shard, the whole key space: shard 0's term is the
/// leadership term (or the endless term of a controller without leader election). With
/// sharding (`sharding/`) each shard held through its Lease has its own term.
///
/// Invariants: a key is in `parked[s]` only if `shard_of(key) == s` and the key was taken from
/// the queue while `s` had no live term here; opening `s` hands those keys back to the queue
/// in the same critical section, so a key is never parked behind an open shard.
#[derive(Debug)]
struct GateInner {
    /// The runtime is stopping: workers return.
    closed: bool,
    /// Open terms by shard (possibly ended: see [`Term::is_over`]).
    terms: BTreeMap<u32, Term>,
    /// Keys taken while their shard had no live term here.
    parked: BTreeMap<u32, HashSet<ObjectKey>>,
}

/// The gate between leadership and the workers, shared by the runtime (which opens and closes
/// shards) and the workers (which wait for an open shard and ask, per key, for its term).
#[derive(Debug)]
pub(crate) struct Gate {
    /// How the key space is split into shards (one shard without sharding).
    shards: ShardMap,
    inner: Mutex<GateInner>,
    /// Bumped on every change of `inner`, to wake waiting workers.
    changed: watch::Sender<()>,
}

/// A worker's view of the gate.
#[derive(Debug)]
pub(crate) struct GateWatch {
    gate: Arc<Gate>,
    rx: watch::Receiver<()>,
}

/// What the gate says of one key taken from the queue.
pub(crate) enum Dispatch {
    /// Reconcile it in this term.
    Reconcile(Term),
    /// Its shard has no live term here: the key was set aside until the shard opens.
    Parked,
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
    /// A gate over `shards` shards (at least 1), none open.
    pub fn new(shards: ShardMap) -> Arc<Self> {
        Arc::new(Gate {
            shards,
            inner: Mutex::new(GateInner {
                closed: false,
                terms: BTreeMap::new(),
                parked: BTreeMap::new(),
            }),
            changed: watch::Sender::new(()),
        })
    }

    pub fn watch(self: &Arc<Self>) -> GateWatch {
        GateWatch {
            gate: self.clone(),
            rx: self.changed.subscribe(),
        }
    }

    /// Workers may take keys of `shard` for `term`. Returns the keys parked for that shard,
    /// which the caller puts back in the queue. Nothing opens once the gate is closed.
    pub fn open(&self, shard: u32, term: Term) -> Vec<ObjectKey> {
        let parked = {
            let mut inner = self.inner.lock();
            if inner.closed {
                return Vec::new();
            }
            inner.terms.insert(shard, term);
            inner.parked.remove(&shard).unwrap_or_default()
        };
        self.changed.send_replace(());
        parked.into_iter().collect()
    }

    /// `shard` goes back to standby: its keys are parked when taken.
    pub fn standby(&self, shard: u32) {
        self.inner.lock().terms.remove(&shard);
        self.changed.send_replace(());
    }

    /// Workers return.
    pub fn close(&self) {
        {
            let mut inner = self.inner.lock();
            inner.closed = true;
            inner.terms.clear();
            inner.parked.clear();
        }
        self.changed.send_replace(());
    }

    /// The shard a key belongs to.
    pub fn shard_of(&self, key: &ObjectKey) -> u32 {
        match &self.shards {
            ShardMap::Keys(shards) => shard_of(key.as_str(), *shards),
            ShardMap::Namespaces(scope) => {
                scope.shard_of_namespace(key.namespace().unwrap_or_default())
            }
        }
    }

    /// The term to reconcile `key` in, or [`Dispatch::Parked`] if its shard has no live term
    /// here (the key is then kept for when the shard opens).
    pub fn dispatch(&self, key: &ObjectKey) -> Dispatch {
        let shard = self.shard_of(key);
        let mut inner = self.inner.lock();
        if let Some(term) = inner.terms.get(&shard).filter(|t| !t.is_over()) {
            return Dispatch::Reconcile(term.clone());
        }
        if !inner.closed {
            inner.parked.entry(shard).or_default().insert(key.clone());
        }
        Dispatch::Parked
    }

    /// True if some shard has a live term.
    fn any_live(&self) -> bool {
        self.inner.lock().terms.values().any(|t| !t.is_over())
    }

    /// Resolves once no shard has a live term (all in standby, closed, or every term's
    /// entitlement lapsed).
    pub async fn until_not_open(&self) {
        let mut rx = self.changed.subscribe();
        loop {
            rx.borrow_and_update();
            if !self.any_live() {
                return;
            }
            if rx.changed().await.is_err() {
                return;
            }
        }
    }
}

impl GateWatch {
    /// Waits until some shard has a live term: `true`; `false` once the gate is closed.
    pub async fn next_open(&mut self) -> bool {
        loop {
            self.rx.borrow_and_update();
            {
                let inner = self.gate.inner.lock();
                if inner.closed {
                    return false;
                }
                if inner.terms.values().any(|t| !t.is_over()) {
                    return true;
                }
            }
            if self.rx.changed().await.is_err() {
                return false;
            }
        }
    }

    /// The gate itself.
    pub fn gate(&self) -> &Arc<Gate> {
        &self.gate
    }
}
