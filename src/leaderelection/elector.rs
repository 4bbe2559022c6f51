//! The elector (client-go: `tools/leaderelection/leaderelection.go`, `LeaderElector`).
//!
//! One candidate's life is an explicit loop over two phases:
//! - **acquire**: `try_acquire_or_renew` now, then every `retry_period * (1 + rand * 1.2)`
//!   (client-go `wait.JitterUntil`, sliding), until it holds the lease or is shut down. Unlike
//!   client-go, a follower also wakes at the instant the lease it observed expires, so a dead
//!   holder is replaced `lease_duration` after the follower last saw its record change rather
//!   than up to 2.2 retry periods later;
//! - **lead**: the leader's work is spawned with a [`LeaderContext`]; every `retry_period` the
//!   lease is renewed. When `renew_deadline` has passed since the *send time* of the last
//!   successful write, or the record shows another holder (or another process with our
//!   identity), or the caller shuts down, the elector steps down: cancel the work's token, wait
//!   for the work to return (at most until the lease could pass to someone else, see
//!   [`super::config`]), on a shutdown release the lease (empty holder, 1 s) so a successor takes
//!   over at once, then call `on_stopped_leading`. Releasing first (as client-go's `renew`
//!   releases before `Run`'s deferred `OnStoppedLeading`) means a program that exits inside
//!   `on_stopped_leading` has already given the lease back.
//!
//! With `recontend` the loop goes back to acquiring after a loss; client-go's `Run` returns.
//!
//! **Duplicate identity.** client-go lets two processes with one identity both lead: each reads
//! a record naming "itself" and renews it. Here a record naming our identity counts as ours only
//! if this process wrote it: the lock's resourceVersion is that of its own last write
//! ([`ResourceLock::last_read_is_own_write`]), or the record equals one this elector wrote
//! ([`OwnWrites`]: a write whose answer was lost, or a metadata-only change by someone else since).
//! Any other record naming us is a *namesake's* ([`Namesake`]): while leading, it means another
//! process wrote the Lease with our identity, and we step down with
//! [`StopReason::DuplicateIdentity`]; while acquiring, it is treated like any other holder's
//! record (taken only after it stayed unchanged for its lease duration, e.g. left by a dead
//! earlier incarnation of this candidate).
//!
//! Invariants:
//! - Expiry of someone else's lease is judged by `Inner::observed_time`, the local monotonic
//!   instant at which this process saw the record *change*, plus the record's
//!   `leaseDurationSeconds`. `renewTime` / `acquireTime` are never read for decisions, so a
//!   holder with a skewed clock cannot cause an early takeover or an endless wait.
//! - Our own validity is measured from `Term::renewed_at`, the instant *before* the last
//!   successful write was sent, which is never later than any other candidate's observation of
//!   that write.
//! - `Phase::Leading` holds exactly while the leader's work may run; `on_stopped_leading` runs
//!   only after a `Leading` phase (not for a candidate that never led).
//! - The fast path (update without reading first) is only taken when the observed record is our
//!   own write (`Inner::namesake` is `Absent`), so a namesake's record is never renewed blindly.
//! - `on_new_leader` runs on a task of its own, fed in order through a channel: the elector
//!   never waits for it.
//! - The parking_lot lock around `Inner` is never held across an `.await`; when both are taken,
//!   `Inner`'s lock comes before a `Term`'s.
//!
//! Cancel safety: dropping the future returned by [`LeaderElector::run`] stops contending but
//! neither cancels the work nor releases the lease; cancel the `shutdown` token and await `run`
//! for an orderly stop.

use std::collections::VecDeque;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use futures::future::BoxFuture;
use parking_lot::Mutex;
use thiserror::Error;
use tokio::sync::mpsc::{UnboundedSender, unbounded_channel};
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep_until, timeout, timeout_at};
use tokio_util::sync::{CancellationToken, WaitForCancellationFuture};
use tracing::{debug, error, info, warn};

use super::clock::{Clock, SystemClock};
use super::config::{ConfigError, JITTER_FACTOR, LeaderElectionConfig, validate_identity};
use super::metrics::{ElectionMetrics, LeaderMetricsProvider};
use super::resource_lock::{LeaderElectionRecord, LockError, ResourceLock};
use crate::backoff::jitter;
use crate::record::{AnyEventRecorder, EventType};

/// Contends for one lock. Cheap to clone: clones share the same state, so one clone can run
/// while others answer [`Self::is_leader`], [`Self::get_leader`] and [`Self::check`].
pub struct LeaderElector<L: ResourceLock> {
    shared: Arc<Shared<L>>,
}

/// What the elector calls. Both lifecycle callbacks are required by construction.
pub struct LeaderCallbacks {
    on_started_leading: StartedLeading,
    on_stopped_leading: Box<dyn FnMut() + Send>,
    on_new_leader: NewLeaderDelivery,
}

type StartedLeading = Box<dyn FnMut(LeaderContext) -> BoxFuture<'static, ()> + Send>;
type NewLeader = Box<dyn FnMut(String) -> BoxFuture<'static, ()> + Send>;

/// How reports of a new leader reach `on_new_leader`.
enum NewLeaderDelivery {
    /// No callback (or its delivery task died with a panicking call).
    Off,
    /// A callback that was not called yet; its task starts with the first report.
    Idle(NewLeader),
    /// The delivery task calls the callback for each holder sent here, one call at a time.
    Running(UnboundedSender<String>),
}

/// Handed to the leader's work. The work must stop when [`Self::cancelled`] fires; for work made
/// of many small steps, checking [`Self::still_leading`] before each step makes a step after
/// the deadline impossible even if the elector task has not run yet (e.g. right after the
/// process was resumed from SIGSTOP).
#[derive(Clone)]
pub struct LeaderContext {
    token: CancellationToken,
    state: Arc<Mutex<Inner>>,
    term: Arc<Term>,
    lease_duration: Duration,
    renew_deadline: Duration,
    /// `leaseTransitions` of the record this term was acquired with.
    fencing_token: i32,
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
    /// Another process wrote the lease under this candidate's identity (the identity named
    /// here): two processes were started with one identity. Give each process its own, e.g.
    /// [`super::default_identity`].
    DuplicateIdentity(String),
}

/// [`LeaderElector::check`] failed.
/// Why [`LeaderElector::check`] reports the elector unhealthy (client-go: the healthz adaptor).
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum HealthError {
    /// The leader has not renewed for longer than its renew deadline plus the tolerance.
    #[error(
        "leader election {name:?}: this process believes it leads but last renewed {since:?} ago \
         (renew deadline {renew_deadline:?} + tolerance {tolerance:?})"
    )]
    RenewalOverdue {
        /// The election's name.
        name: String,
        /// Time since the last renewal.
        since: Duration,
        /// The configured renew deadline.
        renew_deadline: Duration,
        /// The tolerance the check allows beyond it.
        tolerance: Duration,
    },
}

struct Shared<L> {
    config: LeaderElectionConfig,
    lock: L,
    clock: Arc<dyn Clock>,
    state: Arc<Mutex<Inner>>,
    /// Set once by `report_metrics_to`.
    metrics: OnceLock<ElectionMetrics>,
    /// Set once by `record_events_to`.
    events: OnceLock<AnyEventRecorder>,
}

struct Inner {
    /// The record as last read from or written to the lock (client-go `observedRecord`).
    observed_record: LeaderElectionRecord,
    /// Local instant at which `observed_record` last changed; `None` before the first
    /// observation (client-go `observedTime`). The only input, with the record's duration, to
    /// deciding that someone else's lease expired.
    observed_time: Option<Instant>,
    /// Whether `observed_record` names our identity without being our own write.
    namesake: Namesake,
    /// `namesake` as last logged, so that each change is logged once, not every retry.
    reported_namesake: Namesake,
    /// Holder last passed to `on_new_leader`; `None` before the first report.
    reported_leader: Option<String>,
    /// What this elector wrote, to recognise its own records when it reads them back.
    own_writes: OwnWrites,
    phase: Phase,
}

#[derive(Clone, Debug)]
enum Phase {
    /// Not leading (contending, or never started).
    Following,
    /// Leading; the term's contexts share the `Term`.
    Leading(Arc<Term>),
    /// Stepping down: the work is being cancelled; we do not lead any more.
    SteppingDown,
}

/// One leadership term, shared by the elector and the term's [`LeaderContext`]s.
#[derive(Debug)]
struct Term {
    /// Send instant of the term's last successful write (the acquiring write, then each
    /// renewal). Written by the elector only, while the term lasts; final once it ended.
    renewed_at: Mutex<Instant>,
}

/// Whether the observed record names our identity although this process did not write it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Namesake {
    /// No: the record is our own write, names someone else, or nobody.
    Absent,
    /// Yes, and it has not changed since we first read it: perhaps left by a dead earlier
    /// incarnation of this candidate, perhaps a live process with our identity.
    Unchanged,
    /// Yes, and it was written after an earlier read of ours: another live process is using
    /// our identity.
    Live,
}

/// The records this elector wrote, so that it recognises them when it reads them back even
/// where the lock's version check cannot: the answer to the write was lost (timeout, broken
/// connection) although the write landed, or someone changed only the object's metadata since.
///
/// A write refused for certain (409 Conflict, AlreadyExists, not sent) is forgotten at once: a
/// process with our identity that wrote the same record in the same microsecond must not make
/// our lost race look like a win.
#[derive(Default)]
struct OwnWrites {
    /// The record of our last confirmed write.
    confirmed: Option<LeaderElectionRecord>,
    /// Records sent after it whose outcome is unknown, oldest first, at most
    /// [`MAX_UNCONFIRMED_WRITES`].
    unconfirmed: VecDeque<LeaderElectionRecord>,
}

/// Bound on [`OwnWrites::unconfirmed`]; a leader steps down after a few failed renewals anyway.
const MAX_UNCONFIRMED_WRITES: usize = 8;

/// Outcome of one `try_acquire_or_renew`.
#[derive(Debug)]
enum Attempt {
    /// We hold the lease (acquired or renewed).
    Held,
    /// Another candidate holds an unexpired lease.
    HeldBy(String),
    /// The record names our identity but another process wrote it, and it has not expired.
    HeldByNamesake,
    /// The lock operation failed (conflict, network, ...); the caller decides when to retry.
    Failed(LockError),
}

/// Which write `LeaderElector::write` makes.
#[derive(Clone, Copy, Debug)]
enum Write {
    Create,
    Update,
}

impl<L: ResourceLock> Clone for LeaderElector<L> {
    fn clone(&self) -> Self {
        Self {
            shared: self.shared.clone(),
        }
    }
}

impl<L: ResourceLock> LeaderElector<L> {
    /// Validates `config` and the lock's identity (client-go `NewLeaderElector`).
    pub fn new(config: LeaderElectionConfig, lock: L) -> Result<Self, ConfigError> {
        Self::with_clock(config, lock, Arc::new(SystemClock))
    }

    /// As [`Self::new`], stamping `acquireTime` / `renewTime` from `clock`.
    pub fn with_clock(
        config: LeaderElectionConfig,
        lock: L,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, ConfigError> {
        config.validate()?;
        validate_identity(&config.name, lock.identity())?;
        let state = Arc::new(Mutex::new(Inner {
            observed_record: LeaderElectionRecord::default(),
            observed_time: None,
            namesake: Namesake::Absent,
            reported_namesake: Namesake::Absent,
            reported_leader: None,
            own_writes: OwnWrites::default(),
            phase: Phase::Following,
        }));
        Ok(Self {
            shared: Arc::new(Shared {
                config,
                lock,
                clock,
                state,
                metrics: OnceLock::new(),
                events: OnceLock::new(),
            }),
        })
    }

    /// Contends until `shutdown` is cancelled, or, without `recontend`, until the first
    /// leadership term ends. Returns why it stopped. Call it once at a time per elector (clones
    /// share one state; two concurrent runs would contend as one identity and confuse it).
    pub async fn run(
        &self,
        mut callbacks: LeaderCallbacks,
        shutdown: CancellationToken,
    ) -> StopReason {
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

    /// Reports `leader_election_master_status` and `leader_election_slowpath_total` for this
    /// election (label `name` = the config's name) into `provider`; only the first call counts.
    pub fn report_metrics_to(&self, provider: &LeaderMetricsProvider) {
        let metrics = provider.for_election(&self.shared.config.name);
        if self.is_leader() {
            metrics.leader_on();
        } else {
            metrics.leader_off();
        }
        let _ = self.shared.metrics.set(metrics);
    }

    /// Records "became leader" and "stopped leading" about the lock object (a Lease) with
    /// `recorder`: events.k8s.io/v1 when it records there (client-go's leader election still
    /// writes core/v1 events, kubernetes#82846), type Normal, reason `LeaderElection`, the
    /// note `<identity> became leader`; only the first call counts. client-go:
    /// `ResourceLockConfig.EventRecorder` and `LeaseLock.RecordEvent`.
    pub fn record_events_to(&self, recorder: AnyEventRecorder) {
        let _ = self.shared.events.set(recorder);
    }

    /// Records `what` happened to this candidate's leadership, if events are recorded and the
    /// lock is an object. client-go: `LeaderElector.acquire`/`renew`'s `RecordEvent`.
    fn record_event(&self, action: &str, what: &str) {
        let (Some(recorder), Some(lease)) =
            (self.shared.events.get(), self.shared.lock.reference())
        else {
            return;
        };
        let note = format!("{} {what}", self.shared.lock.identity());
        recorder.event_for(
            lease,
            None,
            EventType::Normal,
            "LeaderElection",
            action,
            &note,
        );
    }

    /// True while this process leads (client-go `IsLeader`, but false as soon as the elector
    /// starts stepping down rather than when the record changes).
    pub fn is_leader(&self) -> bool {
        matches!(self.shared.state.lock().phase, Phase::Leading(_))
    }

    /// Holder named by the last observed record ("" if none; client-go `GetLeader`).
    pub fn get_leader(&self) -> String {
        self.shared
            .state
            .lock()
            .observed_record
            .holder_identity
            .clone()
    }

    /// Health check (client-go `Check`): fails if this process believes it leads but its last
    /// successful renewal is older than `renew_deadline + max_tolerable_expired_lease`. The
    /// elector steps down at `renew_deadline` by itself, so a failure means the elector is
    /// wedged (starved runtime, blocked thread) while its work may still be running.
    pub fn check(&self, max_tolerable_expired_lease: Duration) -> Result<(), HealthError> {
        let renewed_at = match &self.shared.state.lock().phase {
            Phase::Leading(term) => *term.renewed_at.lock(),
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
    async fn acquire(
        &self,
        callbacks: &mut LeaderCallbacks,
        shutdown: &CancellationToken,
    ) -> Option<Instant> {
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
            self.maybe_report_namesake();
            match attempt {
                Ok(Attempt::Held) => {
                    info!(lock = %self.shared.lock.describe(), identity = %self.shared.lock.identity(), "acquired the lease");
                    self.record_event("Acquire", "became leader");
                    return Some(sent);
                }
                Ok(Attempt::HeldBy(holder)) => debug!(%holder, "lease is held and has not expired"),
                Ok(Attempt::HeldByNamesake) => {
                    debug!(
                        "lease is held under our identity by another process and has not expired"
                    )
                }
                Ok(Attempt::Failed(e)) => warn!(error = %e, "failed to acquire the lease"),
                Err(_) => warn!(lock = %self.shared.lock.describe(), "acquire attempt timed out"),
            }
            // client-go waits a jittered retry period. We also wake when the lease we saw
            // expires (by our own observation), so a dead holder is replaced within
            // lease_duration of our last observation of it, not up to 2.2 retry periods later.
            // Only a future expiry counts: a failing lock must never turn this into a hot loop.
            let now = Instant::now();
            let mut wake = now + jitter(config.retry_period, JITTER_FACTOR);
            if let Some(expiry) = self.shared.state.lock().expiry().filter(|e| *e > now) {
                wake = wake.min(expiry);
            }
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => return None,
                _ = sleep_until(wake) => {}
            }
        }
    }

    /// The lead phase: start the work, renew, step down. See the module docs for the order.
    async fn lead(
        &self,
        callbacks: &mut LeaderCallbacks,
        shutdown: &CancellationToken,
        renewed_at: Instant,
    ) -> StopReason {
        let config = &self.shared.config;
        let term = Arc::new(Term {
            renewed_at: Mutex::new(renewed_at),
        });
        let fencing_token = {
            let mut inner = self.shared.state.lock();
            inner.phase = Phase::Leading(term.clone());
            inner.observed_record.leader_transitions
        };
        let work_token = shutdown.child_token();
        let ctx = LeaderContext {
            token: work_token.clone(),
            state: self.shared.state.clone(),
            term: term.clone(),
            lease_duration: config.lease_duration,
            renew_deadline: config.renew_deadline,
            fencing_token,
        };
        if let Some(m) = self.shared.metrics.get() {
            m.leader_on();
        }
        let mut work: JoinHandle<()> = tokio::spawn((callbacks.on_started_leading)(ctx));

        let reason = self.renew(callbacks, shutdown, &term).await;

        // Step down: from here on the work must wind down.
        self.shared.state.lock().phase = Phase::SteppingDown;
        if let Some(m) = self.shared.metrics.get() {
            m.leader_off();
        }
        work_token.cancel();
        let stop_by = *term.renewed_at.lock() + config.lease_duration;
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
        self.record_event("Release", "stopped leading");
        // Release before on_stopped_leading, so a program that exits inside the callback has
        // already given the lease back (client-go: `renew` releases before `Run`'s deferred
        // `OnStoppedLeading`).
        if reason == StopReason::Shutdown && config.release_on_cancel {
            self.release().await;
        }
        (callbacks.on_stopped_leading)();
        // A released lease is reported to on_new_leader ("") after on_stopped_leading.
        self.maybe_report_transition(callbacks);
        self.shared.state.lock().phase = Phase::Following;
        reason
    }

    /// Renews every `retry_period` until a stop condition, recording the send instant of each
    /// successful write in `term`. Returns why the term ends.
    async fn renew(
        &self,
        callbacks: &mut LeaderCallbacks,
        shutdown: &CancellationToken,
        term: &Term,
    ) -> StopReason {
        let config = &self.shared.config;
        let mut renewed_at = *term.renewed_at.lock();
        loop {
            let deadline = renewed_at + config.renew_deadline;
            let next = Instant::now() + config.retry_period;
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => return StopReason::Shutdown,
                _ = sleep_until(next.min(deadline)) => {}
            }
            // Checked before writing: a process resumed after a long pause steps down here
            // without touching the lock.
            if Instant::now() >= deadline {
                warn!(lock = %self.shared.lock.describe(), "failed to renew the lease within the renew deadline");
                return StopReason::RenewDeadlineExceeded;
            }
            let sent = Instant::now();
            let attempt = tokio::select! {
                biased;
                _ = shutdown.cancelled() => return StopReason::Shutdown,
                r = timeout_at(deadline, self.try_acquire_or_renew()) => r,
            };
            self.maybe_report_transition(callbacks);
            match attempt {
                Ok(Attempt::Held) => {
                    renewed_at = sent;
                    *term.renewed_at.lock() = sent;
                }
                Ok(Attempt::HeldBy(holder)) => {
                    warn!(lock = %self.shared.lock.describe(), %holder, "the lease has another holder");
                    return StopReason::LostTo(holder);
                }
                Ok(Attempt::HeldByNamesake) => {
                    let (lock, me) = (self.shared.lock.describe(), self.shared.lock.identity());
                    error!(
                        %lock,
                        identity = %me,
                        "another process is using the leader-election identity {me:?} for lease {lock}; stepping down"
                    );
                    self.shared.state.lock().reported_namesake = Namesake::Live;
                    return StopReason::DuplicateIdentity(me.to_string());
                }
                Ok(Attempt::Failed(e)) => {
                    warn!(error = %e, "failed to renew the lease; retrying until the renew deadline")
                }
                Err(_) => {
                    warn!(lock = %self.shared.lock.describe(), "renew attempt did not finish before the renew deadline");
                    return StopReason::RenewDeadlineExceeded;
                }
            }
        }
    }

    /// client-go `tryAcquireOrRenew`: the fast path (leader updates against its last write),
    /// then get-or-create, the expiry check on local observation time, and the update. Unlike
    /// client-go, a record naming our identity is ours only if this process wrote it.
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
            (inner.observed_record.holder_identity == me
                && inner.namesake == Namesake::Absent
                && inner.lease_valid(Instant::now()))
            .then(|| inner.observed_record.clone())
        };
        if let Some(observed) = fast {
            carry_over(&mut record, &observed, true);
            match self.write(&record, Write::Update).await {
                Ok(()) => return Attempt::Held,
                Err(e) => {
                    debug!(error = %e, "fast-path renew failed, falling back to the slow path")
                }
            }
        }

        // 2. Read the record, or create the lock if there is none.
        let old = match lock.get().await {
            Ok(Some(old)) => old,
            Ok(None) => {
                return match self.write(&record, Write::Create).await {
                    Ok(()) => Attempt::Held,
                    Err(e) => Attempt::Failed(e),
                };
            }
            Err(e) => return Attempt::Failed(e),
        };
        let names_me = old.holder_identity == me;
        let ours = names_me && self.is_own_write(&old);

        // 3. A changed record restarts the expiry clock; an unchanged one keeps it running. A
        //    record naming us that we did not write is a namesake's: someone else's lease.
        let holder_valid = {
            let mut inner = self.shared.state.lock();
            let first_look = inner.observed_time.is_none();
            let changed = inner.observed_record != old;
            if changed {
                inner.observed_record = old.clone();
                inner.observed_time = Some(Instant::now());
            }
            inner.namesake = match (names_me && !ours, inner.namesake) {
                (false, _) => Namesake::Absent,
                (true, _) if changed && !first_look => Namesake::Live,
                (true, Namesake::Live) => Namesake::Live,
                (true, _) => Namesake::Unchanged,
            };
            !old.holder_identity.is_empty() && inner.lease_valid(Instant::now())
        };
        if holder_valid && !names_me {
            return Attempt::HeldBy(old.holder_identity);
        }
        if holder_valid && !ours {
            return Attempt::HeldByNamesake;
        }

        // 4. Take or keep it, against the version just read.
        if ours && let Some(m) = self.shared.metrics.get() {
            m.slowpath_exercised();
        }
        carry_over(&mut record, &old, ours);
        match self.write(&record, Write::Update).await {
            Ok(()) => Attempt::Held,
            Err(e) => Attempt::Failed(e),
        }
    }

    /// client-go `release`: re-read first, and only if we still hold the lease (a record naming
    /// us that we wrote) write an empty holder with a 1 s duration. Never blocks longer than
    /// `renew_deadline`.
    async fn release(&self) -> bool {
        let lock = &self.shared.lock;
        let result = timeout(self.shared.config.renew_deadline, async {
            let Some(current) = lock.get().await? else { return Ok(false) };
            if current.holder_identity != lock.identity() {
                return Ok(false);
            }
            if !self.is_own_write(&current) {
                warn!(lock = %lock.describe(), "not releasing the lease: another process with our identity wrote it");
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
            self.write(&released, Write::Update).await?;
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

    /// Creates or updates the lock with `record`, remembering it as our own write (unconfirmed
    /// until the answer comes; forgotten if refused for certain). On success `record` becomes
    /// the observed record.
    async fn write(&self, record: &LeaderElectionRecord, write: Write) -> Result<(), LockError> {
        self.shared.state.lock().own_writes.sending(record);
        let result = match write {
            Write::Create => self.shared.lock.create(record).await,
            Write::Update => self.shared.lock.update(record).await,
        };
        let mut inner = self.shared.state.lock();
        match &result {
            Ok(()) => {
                inner.own_writes.confirmed(record);
                inner.observed_record = record.clone();
                inner.observed_time = Some(Instant::now());
                inner.namesake = Namesake::Absent;
            }
            Err(
                LockError::Conflict { .. }
                | LockError::AlreadyExists { .. }
                | LockError::NotInitialized { .. },
            ) => {
                inner.own_writes.refused(record);
            }
            // Network errors, server errors: the write may have landed.
            Err(_) => {}
        }
        result
    }

    /// True if `read` (just returned by the lock's `get`) is a record this elector wrote.
    fn is_own_write(&self, read: &LeaderElectionRecord) -> bool {
        self.shared.lock.last_read_is_own_write()
            || self.shared.state.lock().own_writes.contains(read)
    }

    /// client-go `maybeReportTransition`: tell `on_new_leader` when the observed holder
    /// changed ("" means the lease was released). Reports are queued in order; the callback
    /// runs on its own task.
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
        if let Some(holder) = changed {
            callbacks.deliver_new_leader(holder);
        }
    }

    /// Logs, once per change, that the lease names our identity but another process wrote it.
    /// (While leading, `renew` logs the step-down itself.)
    fn maybe_report_namesake(&self) {
        let namesake = {
            let mut inner = self.shared.state.lock();
            if inner.namesake == inner.reported_namesake {
                return;
            }
            inner.reported_namesake = inner.namesake;
            inner.namesake
        };
        let (lock, me) = (self.shared.lock.describe(), self.shared.lock.identity());
        match namesake {
            Namesake::Absent => {}
            Namesake::Unchanged => warn!(
                %lock,
                identity = %me,
                "the lease {lock} names this candidate's identity {me:?} but this process did not write it \
                 (an earlier incarnation, or another process with the same identity); it is taken only after \
                 it stayed unchanged for its lease duration, as any holder's"
            ),
            Namesake::Live => error!(
                %lock,
                identity = %me,
                "another process is using the leader-election identity {me:?} for lease {lock}; \
                 not taking the lease while that process renews it"
            ),
        }
    }

    /// Tells a candidate that `record` has been seen unchanged since `since` by someone in this
    /// process that watches the Lease (a shard ring lists its Leases every retry period), so
    /// that it expires `leaseDurationSeconds` after `since` rather than after this elector's
    /// own first read. Ignored once the elector has observed a record itself. The record never
    /// counts as this elector's own write, so this cannot make a candidate renew a lease it
    /// does not hold; and `since` must be an instant at or after which the record was read, so
    /// the expiry is never earlier than the elector's own observation would have given.
    pub fn assume_observed(&self, record: LeaderElectionRecord, since: Instant) {
        let mut inner = self.shared.state.lock();
        if inner.observed_time.is_some() {
            return;
        }
        inner.observed_record = record;
        inner.observed_time = Some(since);
    }

    /// Seeds the elector's memory as client-go's tests set `observedRecord`: the record counts
    /// as observed at `observed_time` and, as there, as this elector's own last write.
    #[cfg(test)]
    fn seed_observed(&self, record: LeaderElectionRecord, observed_time: Option<Instant>) {
        let mut inner = self.shared.state.lock();
        inner.own_writes.confirmed(&record);
        inner.observed_record = record;
        inner.observed_time = observed_time;
    }
}

impl Inner {
    /// client-go `isLeaseValid`: observed locally less than `leaseDurationSeconds` ago.
    fn lease_valid(&self, now: Instant) -> bool {
        self.expiry().is_some_and(|expiry| expiry > now)
    }

    /// When the observed lease expires by local observation; `None` if never observed.
    fn expiry(&self) -> Option<Instant> {
        let observed = self.observed_time?;
        let secs = u64::try_from(self.observed_record.lease_duration_seconds).unwrap_or(0);
        Some(observed + Duration::from_secs(secs))
    }
}

impl OwnWrites {
    /// `record` is about to be sent; until its answer comes, it may land or not.
    fn sending(&mut self, record: &LeaderElectionRecord) {
        if self.unconfirmed.len() == MAX_UNCONFIRMED_WRITES {
            self.unconfirmed.pop_front();
        }
        self.unconfirmed.push_back(record.clone());
    }

    /// `record` was written: it is now the only record of ours the lock can hold.
    fn confirmed(&mut self, record: &LeaderElectionRecord) {
        self.unconfirmed.clear();
        self.confirmed = Some(record.clone());
    }

    /// `record` was certainly not written.
    fn refused(&mut self, record: &LeaderElectionRecord) {
        if let Some(i) = self.unconfirmed.iter().rposition(|r| r == record) {
            self.unconfirmed.remove(i);
        }
    }

    fn contains(&self, record: &LeaderElectionRecord) -> bool {
        self.confirmed.as_ref() == Some(record) || self.unconfirmed.contains(record)
    }
}

/// Keeps `acquireTime` and the transition count when we already hold the lease; counts a
/// transition when we take it from someone (or from nobody, or from a namesake).
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

impl LeaderCallbacks {
    /// `on_started_leading` receives the term's [`LeaderContext`] and returns the work, which
    /// is spawned; `on_stopped_leading` runs after the work has returned (or was aborted) and,
    /// on a shutdown with `release_on_cancel`, after the lease was released.
    pub fn new<W, Fut, S>(mut on_started_leading: W, on_stopped_leading: S) -> Self
    where
        W: FnMut(LeaderContext) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
        S: FnMut() + Send + 'static,
    {
        Self {
            on_started_leading: Box::new(move |ctx| Box::pin(on_started_leading(ctx))),
            on_stopped_leading: Box::new(on_stopped_leading),
            on_new_leader: NewLeaderDelivery::Off,
        }
    }

    /// Called with the holder's identity whenever the observed holder changes ("" when the
    /// lease was released). Calls are made in order, one at a time, on a task of their own
    /// (client-go: a goroutine per call, in no order), so the elector never waits for them.
    /// As on any tokio task, the callback must not block its thread; for work that waits, use
    /// [`Self::on_new_leader_async`].
    pub fn on_new_leader(self, mut f: impl FnMut(&str) + Send + 'static) -> Self {
        self.on_new_leader_async(move |holder| {
            f(&holder);
            std::future::ready(())
        })
    }

    /// As [`Self::on_new_leader`], with a callback that may await (send a message, write an
    /// Event). A slow call delays the next report, never the elector's renewals.
    pub fn on_new_leader_async<F, Fut>(mut self, mut f: F) -> Self
    where
        F: FnMut(String) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        self.on_new_leader = NewLeaderDelivery::Idle(Box::new(move |holder| Box::pin(f(holder))));
        self
    }

    /// Queues `holder` for `on_new_leader`, starting the delivery task at the first report.
    fn deliver_new_leader(&mut self, holder: String) {
        let sender = match std::mem::replace(&mut self.on_new_leader, NewLeaderDelivery::Off) {
            NewLeaderDelivery::Off => return,
            NewLeaderDelivery::Running(sender) => sender,
            NewLeaderDelivery::Idle(mut callback) => {
                let (sender, mut receiver) = unbounded_channel::<String>();
                tokio::spawn(async move {
                    while let Some(holder) = receiver.recv().await {
                        callback(holder).await;
                    }
                });
                sender
            }
        };
        if sender.send(holder).is_err() {
            error!("on_new_leader panicked earlier; it is not called any more");
            return;
        }
        self.on_new_leader = NewLeaderDelivery::Running(sender);
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

    /// The Lease's `leaseTransitions` when this term began. Every change of holder increases
    /// it, so a downstream system that remembers the highest token it has seen can refuse writes
    /// from a deposed leader (client-go offers no fencing at all). Only as strong as every
    /// candidate following this protocol.
    pub fn fencing_token(&self) -> i32 {
        self.fencing_token
    }

    /// True if this term is still on and its last successful renewal is less than
    /// `renew_deadline` old *now*, independent of whether the elector task has run since.
    pub fn still_leading(&self) -> bool {
        if self.token.is_cancelled() {
            return false;
        }
        let inner = self.state.lock();
        match &inner.phase {
            Phase::Leading(term) => {
                Arc::ptr_eq(term, &self.term) && Instant::now() < self.renew_deadline_at()
            }
            Phase::Following | Phase::SteppingDown => false,
        }
    }

    /// The earliest instant at which another candidate following the protocol can acquire the
    /// lease: `S + lease_duration`, where `S` is the local instant at which this term's last
    /// successful write (the acquisition or a renewal) was *sent*.
    ///
    /// Why: a successor takes over only after it saw the record unchanged for `lease_duration`,
    /// counted from its own observation `O` of our last write, and `O >= S` because the write
    /// had to be sent before anyone could see it (clocks may disagree on the time, but must run
    /// at about the same rate). The value keeps its last setting after the term ended, so a
    /// runtime can still fence the term's late side effects with it. Not a bound for a process
    /// that ignores the protocol (e.g. one sharing our identity, see
    /// [`StopReason::DuplicateIdentity`]), and a lease released at shutdown (after the work
    /// stopped) can pass on sooner.
    pub fn lease_valid_until(&self) -> Instant {
        *self.term.renewed_at.lock() + self.lease_duration
    }

    /// `S + renew_deadline` (see [`Self::lease_valid_until`] for `S`): the instant at which the
    /// elector steps down if no renewal succeeds before, and after which [`Self::still_leading`]
    /// is false. The work has `lease_valid_until() - renew_deadline_at()` (`lease_duration -
    /// renew_deadline`, 5 s at the 15/10/2 defaults) to wind down before a successor can start.
    pub fn renew_deadline_at(&self) -> Instant {
        *self.term.renewed_at.lock() + self.renew_deadline
    }
}

#[cfg(test)]
mod tests;
