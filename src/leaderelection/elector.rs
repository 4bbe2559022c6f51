//! The elector (client-go: `tools/leaderelection/leaderelection.go`, `LeaderElector`).
//!
//! One candidate's life is an explicit loop over two phases:
//! - **acquire**: `try_acquire_or_renew` now, then every `retry_period * (1 + rand * 1.2)`
//!   (client-go `wait.JitterUntil`, sliding), until it holds the lease or is shut down;
//! - **lead**: the leader's work is spawned with a [`LeaderContext`]; every `retry_period` the
//!   lease is renewed. When `renew_deadline` has passed since the *send time* of the last
//!   successful write, or the record shows another holder, or the caller shuts down, the
//!   elector steps down: cancel the work's token, wait for the work to return (at most until the
//!   lease could pass to someone else, see [`super::config`]), call `on_stopped_leading`, and on
//!   a shutdown release the lease (empty holder, 1 s) so a successor takes over at once.
//!
//! With `recontend` the loop goes back to acquiring after a loss; client-go's `Run` returns.
//!
//! Invariants:
//! - Expiry of someone else's lease is judged by `Inner::observed_time`, the local monotonic
//!   instant at which this process saw the record *change*, plus the record's
//!   `leaseDurationSeconds`. `renewTime` / `acquireTime` are never read for decisions, so a
//!   holder with a skewed clock cannot cause an early takeover or an endless wait.
//! - Our own validity is measured from `Phase::Leading::renewed_at`, the instant *before* the
//!   last successful write was sent, which is never later than any other candidate's
//!   observation of that write.
//! - `Phase::Leading` holds exactly while the leader's work may run; `on_stopped_leading` runs
//!   only after a `Leading` phase (not for a candidate that never led).
//! - The parking_lot lock around `Inner` is never held across an `.await`.
//!
//! Cancel safety: dropping the future returned by [`LeaderElector::run`] stops contending but
//! neither cancels the work nor releases the lease; cancel the `shutdown` token and await `run`
//! for an orderly stop.

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use parking_lot::Mutex;
use thiserror::Error;
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep, sleep_until, timeout, timeout_at};
use tokio_util::sync::{CancellationToken, WaitForCancellationFuture};
use tracing::{debug, error, info, warn};

use super::clock::{Clock, SystemClock};
use super::config::{ConfigError, JITTER_FACTOR, LeaderElectionConfig, validate_identity};
use super::resource_lock::{LeaderElectionRecord, LockError, ResourceLock};

/// Contends for one lock. Cheap to clone: clones share the same state, so one clone can run
/// while others answer [`Self::is_leader`], [`Self::get_leader`] and [`Self::check`].
pub struct LeaderElector<L: ResourceLock> {
    shared: Arc<Shared<L>>,
}

/// What the elector calls. Both lifecycle callbacks are required by construction.
pub struct LeaderCallbacks {
    on_started_leading: Box<dyn FnMut(LeaderContext) -> BoxFuture<'static, ()> + Send>,
    on_stopped_leading: Box<dyn FnMut() + Send>,
    on_new_leader: Option<Box<dyn FnMut(&str) + Send>>,
}

/// Handed to the leader's work. The work must stop when [`Self::cancelled`] fires; for work made
/// of many small steps, checking [`Self::still_leading`] before each step makes a step after
/// the deadline impossible even if the elector task has not run yet (e.g. right after the
/// process was resumed from SIGSTOP).
#[derive(Clone)]
pub struct LeaderContext {
    token: CancellationToken,
    state: Arc<Mutex<Inner>>,
    term: u64,
    renew_deadline: Duration,
}

/// Why a leadership term (or [`LeaderElector::run`]) ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StopReason {
    /// The caller cancelled the shutdown token.
    Shutdown,
    /// No renewal succeeded within `renew_deadline` (apiserver unreachable, process paused...).
    RenewDeadlineExceeded,
    /// The record names another holder.
    LostTo(String),
}

/// [`LeaderElector::check`] failed.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum HealthError {
    #[error(
        "leader election {name:?}: this process believes it leads but last renewed {since:?} ago \
         (renew deadline {renew_deadline:?} + tolerance {tolerance:?})"
    )]
    RenewalOverdue { name: String, since: Duration, renew_deadline: Duration, tolerance: Duration },
}

struct Shared<L> {
    config: LeaderElectionConfig,
    lock: L,
    clock: Arc<dyn Clock>,
    state: Arc<Mutex<Inner>>,
}

struct Inner {
    /// The record as last read from or written to the lock (client-go `observedRecord`).
    observed_record: LeaderElectionRecord,
    /// Local instant at which `observed_record` last changed; `None` before the first
    /// observation (client-go `observedTime`). The only input, with the record's duration, to
    /// deciding that someone else's lease expired.
    observed_time: Option<Instant>,
    /// Holder last passed to `on_new_leader`; `None` before the first report.
    reported_leader: Option<String>,
    phase: Phase,
    /// Leadership terms started by this elector; a [`LeaderContext`] is valid for one term.
    term: u64,
}

#[derive(Clone, Copy, Debug)]
enum Phase {
    /// Not leading (contending, or never started).
    Following,
    /// Leading; `renewed_at` is when the last successful write was sent.
    Leading { renewed_at: Instant },
    /// Stepping down: the work is being cancelled; we do not lead any more.
    SteppingDown,
}

/// Outcome of one `try_acquire_or_renew`.
#[derive(Debug)]
enum Attempt {
    /// We hold the lease (acquired or renewed).
    Held,
    /// Another candidate holds an unexpired lease.
    HeldBy(String),
    /// The lock operation failed (conflict, network, ...); the caller decides when to retry.
    Failed(LockError),
}

impl<L: ResourceLock> Clone for LeaderElector<L> {
    fn clone(&self) -> Self {
        Self { shared: self.shared.clone() }
    }
}

impl<L: ResourceLock> LeaderElector<L> {
    /// Validates `config` and the lock's identity (client-go `NewLeaderElector`).
    pub fn new(config: LeaderElectionConfig, lock: L) -> Result<Self, ConfigError> {
        Self::with_clock(config, lock, Arc::new(SystemClock))
    }

    /// As [`Self::new`], stamping `acquireTime` / `renewTime` from `clock`.
    pub fn with_clock(config: LeaderElectionConfig, lock: L, clock: Arc<dyn Clock>) -> Result<Self, ConfigError> {
        config.validate()?;
        validate_identity(&config.name, lock.identity())?;
        let state = Arc::new(Mutex::new(Inner {
            observed_record: LeaderElectionRecord::default(),
            observed_time: None,
            reported_leader: None,
            phase: Phase::Following,
            term: 0,
        }));
        Ok(Self { shared: Arc::new(Shared { config, lock, clock, state }) })
    }

    /// Contends until `shutdown` is cancelled, or, without `recontend`, until the first
    /// leadership term ends. Returns why it stopped.
    pub async fn run(&self, mut callbacks: LeaderCallbacks, shutdown: CancellationToken) -> StopReason {
        loop {
            let Some(renewed_at) = self.acquire(&mut callbacks, &shutdown).await else {
                return StopReason::Shutdown;
            };
            let reason = self.lead(&mut callbacks, &shutdown, renewed_at).await;
            if reason == StopReason::Shutdown || !self.shared.config.recontend {
                return reason;
            }
            info!(lock = %self.shared.lock.describe(), ?reason, "lost the lease; contending again");
        }
    }

    /// True while this process leads (client-go `IsLeader`, but false as soon as the elector
    /// starts stepping down rather than when the record changes).
    pub fn is_leader(&self) -> bool {
        matches!(self.shared.state.lock().phase, Phase::Leading { .. })
    }

    /// Holder named by the last observed record ("" if none; client-go `GetLeader`).
    pub fn get_leader(&self) -> String {
        self.shared.state.lock().observed_record.holder_identity.clone()
    }

    /// Health check (client-go `Check`): fails if this process believes it leads but its last
    /// successful renewal is older than `renew_deadline + max_tolerable_expired_lease`. The
    /// elector steps down at `renew_deadline` by itself, so a failure means the elector is
    /// wedged (starved runtime, blocked thread) while its work may still be running.
    pub fn check(&self, max_tolerable_expired_lease: Duration) -> Result<(), HealthError> {
        let renewed_at = match self.shared.state.lock().phase {
            Phase::Leading { renewed_at } => renewed_at,
            Phase::Following | Phase::SteppingDown => return Ok(()),
        };
        let since = Instant::now().saturating_duration_since(renewed_at);
        let renew_deadline = self.shared.config.renew_deadline;
        if since > renew_deadline + max_tolerable_expired_lease {
            return Err(HealthError::RenewalOverdue {
                name: self.shared.config.name.clone(),
                since,
                renew_deadline,
                tolerance: max_tolerable_expired_lease,
            });
        }
        Ok(())
    }

    /// The acquire phase. Returns the send instant of the winning write, or `None` on shutdown.
    async fn acquire(&self, callbacks: &mut LeaderCallbacks, shutdown: &CancellationToken) -> Option<Instant> {
        let config = &self.shared.config;
        info!(lock = %self.shared.lock.describe(), identity = %self.shared.lock.identity(), "attempting to acquire the lease");
        loop {
            let sent = Instant::now();
            // Bound each attempt: a hung request must not stall the loop forever.
            let attempt = tokio::select! {
                biased;
                _ = shutdown.cancelled() => {
                    // The interrupted write may have landed; give it back if it did.
                    if config.release_on_cancel {
                        self.release().await;
                    }
                    return None;
                }
                r = timeout(config.renew_deadline, self.try_acquire_or_renew()) => r,
            };
            self.maybe_report_transition(callbacks);
            match attempt {
                Ok(Attempt::Held) => {
                    info!(lock = %self.shared.lock.describe(), identity = %self.shared.lock.identity(), "acquired the lease");
                    return Some(sent);
                }
                Ok(Attempt::HeldBy(holder)) => debug!(%holder, "lease is held and has not expired"),
                Ok(Attempt::Failed(e)) => debug!(error = %e, "failed to acquire the lease"),
                Err(_) => warn!(lock = %self.shared.lock.describe(), "acquire attempt timed out"),
            }
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => return None,
                _ = sleep(jittered(config.retry_period, JITTER_FACTOR)) => {}
            }
        }
    }

    /// The lead phase: start the work, renew, step down. See the module docs for the order.
    async fn lead(&self, callbacks: &mut LeaderCallbacks, shutdown: &CancellationToken, renewed_at: Instant) -> StopReason {
        let config = &self.shared.config;
        let term = {
            let mut inner = self.shared.state.lock();
            inner.phase = Phase::Leading { renewed_at };
            inner.term += 1;
            inner.term
        };
        let work_token = shutdown.child_token();
        let ctx = LeaderContext {
            token: work_token.clone(),
            state: self.shared.state.clone(),
            term,
            renew_deadline: config.renew_deadline,
        };
        let mut work: JoinHandle<()> = tokio::spawn((callbacks.on_started_leading)(ctx));

        let (reason, last_renewed) = self.renew(callbacks, shutdown, renewed_at).await;

        // Step down: from here on the work must wind down.
        self.shared.state.lock().phase = Phase::SteppingDown;
        work_token.cancel();
        let stop_by = last_renewed + config.lease_duration;
        match timeout_at(stop_by, &mut work).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => error!(error = %e, "the leader's work panicked or was aborted"),
            Err(_) => {
                error!(
                    lock = %self.shared.lock.describe(),
                    "the leader's work did not stop before the lease could pass to another holder; aborting it"
                );
                work.abort();
                let _ = work.await;
            }
        }
        info!(lock = %self.shared.lock.describe(), identity = %self.shared.lock.identity(), ?reason, "stopped leading");
        (callbacks.on_stopped_leading)();
        if reason == StopReason::Shutdown && config.release_on_cancel {
            self.release().await;
            self.maybe_report_transition(callbacks);
        }
        self.shared.state.lock().phase = Phase::Following;
        reason
    }

    /// Renews every `retry_period` until a stop condition. Returns the reason and the send
    /// instant of the last successful write.
    async fn renew(
        &self,
        callbacks: &mut LeaderCallbacks,
        shutdown: &CancellationToken,
        mut renewed_at: Instant,
    ) -> (StopReason, Instant) {
        let config = &self.shared.config;
        loop {
            let deadline = renewed_at + config.renew_deadline;
            let next = Instant::now() + config.retry_period;
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => return (StopReason::Shutdown, renewed_at),
                _ = sleep_until(next.min(deadline)) => {}
            }
            // Checked before writing: a process resumed after a long pause steps down here
            // without touching the lock.
            if Instant::now() >= deadline {
                warn!(lock = %self.shared.lock.describe(), "failed to renew the lease within the renew deadline");
                return (StopReason::RenewDeadlineExceeded, renewed_at);
            }
            let sent = Instant::now();
            let attempt = tokio::select! {
                biased;
                _ = shutdown.cancelled() => return (StopReason::Shutdown, renewed_at),
                r = timeout_at(deadline, self.try_acquire_or_renew()) => r,
            };
            self.maybe_report_transition(callbacks);
            match attempt {
                Ok(Attempt::Held) => {
                    renewed_at = sent;
                    if let Phase::Leading { renewed_at: r } = &mut self.shared.state.lock().phase {
                        *r = sent;
                    }
                }
                Ok(Attempt::HeldBy(holder)) => {
                    warn!(lock = %self.shared.lock.describe(), %holder, "the lease has another holder");
                    return (StopReason::LostTo(holder), renewed_at);
                }
                Ok(Attempt::Failed(e)) => warn!(error = %e, "failed to renew the lease; retrying until the renew deadline"),
                Err(_) => {
                    warn!(lock = %self.shared.lock.describe(), "renew attempt did not finish before the renew deadline");
                    return (StopReason::RenewDeadlineExceeded, renewed_at);
                }
            }
        }
    }

    /// client-go `tryAcquireOrRenew`: the fast path (leader updates against its last write),
    /// then get-or-create, the expiry check on local observation time, and the update.
    async fn try_acquire_or_renew(&self) -> Attempt {
        let lock = &self.shared.lock;
        let me = lock.identity();
        let now = self.shared.clock.now();
        let mut record = LeaderElectionRecord {
            holder_identity: me.to_string(),
            lease_duration_seconds: self.shared.config.lease_duration_seconds(),
            acquire_time: Some(now),
            renew_time: Some(now),
            leader_transitions: 0,
            strategy: None,
            preferred_holder: None,
        };

        // 1. Fast path: we hold it as far as we know, so update against what we last wrote.
        let fast = {
            let inner = self.shared.state.lock();
            (inner.observed_record.holder_identity == me && inner.lease_valid(Instant::now()))
                .then(|| inner.observed_record.clone())
        };
        if let Some(observed) = fast {
            carry_over(&mut record, &observed, true);
            match lock.update(&record).await {
                Ok(()) => {
                    self.set_observed(record);
                    return Attempt::Held;
                }
                Err(e) => debug!(error = %e, "fast-path renew failed, falling back to the slow path"),
            }
        }

        // 2. Read the record, or create the lock if there is none.
        let old = match lock.get().await {
            Ok(Some(old)) => old,
            Ok(None) => {
                return match lock.create(&record).await {
                    Ok(()) => {
                        self.set_observed(record);
                        Attempt::Held
                    }
                    Err(e) => Attempt::Failed(e),
                };
            }
            Err(e) => return Attempt::Failed(e),
        };

        // 3. A changed record restarts the expiry clock; an unchanged one keeps it running.
        let held_by_other = {
            let mut inner = self.shared.state.lock();
            if inner.observed_record != old {
                inner.observed_record = old.clone();
                inner.observed_time = Some(Instant::now());
            }
            !old.holder_identity.is_empty() && old.holder_identity != me && inner.lease_valid(Instant::now())
        };
        if held_by_other {
            return Attempt::HeldBy(old.holder_identity);
        }

        // 4. Take or keep it, against the version just read.
        carry_over(&mut record, &old, old.holder_identity == me);
        match lock.update(&record).await {
            Ok(()) => {
                self.set_observed(record);
                Attempt::Held
            }
            Err(e) => Attempt::Failed(e),
        }
    }

    /// client-go `release`: re-read first, and only if we still hold the lease write an empty
    /// holder with a 1 s duration. Never blocks longer than `renew_deadline`.
    async fn release(&self) -> bool {
        let lock = &self.shared.lock;
        let result = timeout(self.shared.config.renew_deadline, async {
            let Some(current) = lock.get().await? else { return Ok(false) };
            if current.holder_identity != lock.identity() {
                return Ok(false);
            }
            let now = self.shared.clock.now();
            let released = LeaderElectionRecord {
                holder_identity: String::new(),
                lease_duration_seconds: 1,
                acquire_time: Some(now),
                renew_time: Some(now),
                leader_transitions: current.leader_transitions,
                strategy: current.strategy.clone(),
                preferred_holder: current.preferred_holder.clone(),
            };
            lock.update(&released).await?;
            self.set_observed(released);
            Ok::<bool, LockError>(true)
        })
        .await;
        match result {
            Ok(Ok(released)) => {
                if released {
                    info!(lock = %lock.describe(), "released the lease");
                }
                true
            }
            Ok(Err(e)) => {
                warn!(error = %e, "failed to release the lease");
                false
            }
            Err(_) => {
                warn!(lock = %lock.describe(), "release timed out");
                false
            }
        }
    }

    fn set_observed(&self, record: LeaderElectionRecord) {
        let mut inner = self.shared.state.lock();
        inner.observed_record = record;
        inner.observed_time = Some(Instant::now());
    }

    /// client-go `maybeReportTransition`: tell `on_new_leader` when the observed holder
    /// changed ("" means the lease was released). Called on the elector task, in order.
    fn maybe_report_transition(&self, callbacks: &mut LeaderCallbacks) {
        let changed = {
            let mut inner = self.shared.state.lock();
            let holder = inner.observed_record.holder_identity.clone();
            if inner.observed_time.is_none() || inner.reported_leader.as_ref() == Some(&holder) {
                None
            } else {
                inner.reported_leader = Some(holder.clone());
                Some(holder)
            }
        };
        if let (Some(holder), Some(cb)) = (changed, callbacks.on_new_leader.as_mut()) {
            cb(&holder);
        }
    }

    #[cfg(test)]
    fn seed_observed(&self, record: LeaderElectionRecord, observed_time: Option<Instant>) {
        let mut inner = self.shared.state.lock();
        inner.observed_record = record;
        inner.observed_time = observed_time;
    }
}

impl Inner {
    /// client-go `isLeaseValid`: observed locally less than `leaseDurationSeconds` ago.
    fn lease_valid(&self, now: Instant) -> bool {
        let Some(observed) = self.observed_time else { return false };
        let secs = u64::try_from(self.observed_record.lease_duration_seconds).unwrap_or(0);
        observed + Duration::from_secs(secs) > now
    }
}

/// Keeps `acquireTime` and the transition count when we already hold the lease; counts a
/// transition when we take it from someone (or from nobody).
fn carry_over(record: &mut LeaderElectionRecord, old: &LeaderElectionRecord, already_ours: bool) {
    if already_ours {
        record.acquire_time = old.acquire_time;
        record.leader_transitions = old.leader_transitions;
    } else {
        record.leader_transitions = old.leader_transitions.saturating_add(1);
    }
    record.strategy = old.strategy.clone();
    record.preferred_holder = old.preferred_holder.clone();
}

/// client-go `wait.Jitter`: `period + rand[0,1) * factor * period`.
fn jittered(period: Duration, factor: f64) -> Duration {
    period + period.mul_f64(rand::random::<f64>() * factor)
}

impl LeaderCallbacks {
    /// `on_started_leading` receives the term's [`LeaderContext`] and returns the work, which
    /// is spawned; `on_stopped_leading` runs after the work has returned (or was aborted).
    pub fn new<W, Fut, S>(mut on_started_leading: W, on_stopped_leading: S) -> Self
    where
        W: FnMut(LeaderContext) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
        S: FnMut() + Send + 'static,
    {
        Self {
            on_started_leading: Box::new(move |ctx| Box::pin(on_started_leading(ctx))),
            on_stopped_leading: Box::new(on_stopped_leading),
            on_new_leader: None,
        }
    }

    /// Called on the elector task whenever the observed holder changes; must not block.
    pub fn on_new_leader(mut self, f: impl FnMut(&str) + Send + 'static) -> Self {
        self.on_new_leader = Some(Box::new(f));
        self
    }
}

impl LeaderContext {
    /// The token cancelled when this term ends.
    pub fn token(&self) -> &CancellationToken {
        &self.token
    }

    /// Resolves when the work must stop.
    pub fn cancelled(&self) -> WaitForCancellationFuture<'_> {
        self.token.cancelled()
    }

    /// True if this term is still on and its last successful renewal is less than
    /// `renew_deadline` old *now*, independent of whether the elector task has run since.
    pub fn still_leading(&self) -> bool {
        if self.token.is_cancelled() {
            return false;
        }
        let inner = self.state.lock();
        match inner.phase {
            Phase::Leading { renewed_at } => inner.term == self.term && Instant::now() < renewed_at + self.renew_deadline,
            Phase::Following | Phase::SteppingDown => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
}
