//! The dedup work queue. client-go counterpart: `util/workqueue/queue.go` (`Typed[T]`).
//!
//! Behaviour kept from client-go:
//! - `add` of an item that is already waiting to be handed out (dirty) does nothing.
//! - An item is never handed to two workers at once: `get` marks it processing; an `add` while
//!   it is processing only marks it dirty, and `done` puts it back in line, once.
//! - After `shutdown`, `add` is ignored and `get` keeps returning items until the line is empty,
//!   then `None`. `shutdown_with_drain` also waits until every processing item is `done`; a later
//!   `shutdown` stops that wait.
//! - `len` is the number of items waiting to be handed out, as in client-go.
//!
//! What differs on purpose:
//! - One map, `items`, holds each item once with its state flags (dirty, processing, waiting
//!   for a ready time) and its metric timestamps, instead of client-go's `dirty` and
//!   `processing` sets plus two timestamp maps. One hash per operation, one clone per add.
//! - `get` is async: an empty queue parks the task on a [`Notify`], not a condition variable.
//!   A wake-up is only sent when some parked `get` has none coming (`idle_getters >
//!   pending_wakeups`), so the uncontended path is a lock, a map lookup and an unlock, and a
//!   burst of adds wakes each parked `get` once.
//! - The delaying queue's heap lives under this same lock (see `delaying_queue.rs`), so ready
//!   items move into the line without a channel and a second goroutine.
//! - `done` of an item that is not being processed is ignored; client-go would queue a dirty
//!   item a second time.
//! - No pluggable `Queue` backend (client-go's `Touch`/`Push`/`Pop` interface): FIFO only.
//!
//! Invariants (on [`Inner`]):
//! - Every element of `queue` has an entry in `items` with `dirty && !processing`, and appears
//!   in `queue` once.
//! - An entry of `items` has at least one of `dirty`, `processing`, `ready_at`.
//! - `processing` equals the number of entries with the processing flag.
//! - `pending_wakeups` counts `notify_one` calls not yet answered by a `get` looking at the
//!   queue again. While a stored `Notify` permit exists, `idle_getters <= pending_wakeups`
//!   (a `get` that registers consumes the permit), so a wake-up sent when
//!   `idle_getters > pending_wakeups` always reaches a parked `get` that had none coming.
//! - No lock guard is ever held across an `.await`; the locked sections are plain functions.

use std::collections::VecDeque;
use std::fmt;
use std::hash::Hash;
use std::num::NonZeroU64;
use std::pin::Pin;
use std::sync::Arc;

use hashbrown::HashMap;
use hashbrown::hash_map::{Entry, EntryRef};
use parking_lot::Mutex;
use tokio::sync::Notify;
use tokio::sync::futures::Notified;
use tokio::time::Instant;

use super::delaying_queue::WaitingHeap;
use super::metrics::{MetricsProvider, QueueMetrics};

/// How to build a queue. client-go: `TypedQueueConfig` (and the delaying and rate-limiting
/// configs, which only add fields we do not need).
#[derive(Clone, Debug, Default)]
pub struct QueueConfig {
    /// The queue's name, the `name` label of its metrics. Empty means no metrics, as in
    /// client-go.
    pub name: String,
    /// Where a named queue's metrics go. `None` uses [`MetricsProvider::global`], the analogue
    /// of client-go's global provider.
    pub metrics_provider: Option<MetricsProvider>,
}

impl QueueConfig {
    /// A config for a named queue reporting to the global metrics provider.
    pub fn named(name: impl Into<String>) -> Self {
        QueueConfig {
            name: name.into(),
            metrics_provider: None,
        }
    }
}

/// A work queue: deduplicates items, hands each to one worker at a time, and re-queues an item
/// added while it was processed once it is `done`. Cloning gives another handle to the same
/// queue.
///
/// # Examples
/// ```
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// use kubeloop::workqueue::Queue;
/// let queue = Queue::new();
/// queue.add("default/web".to_string());
/// queue.add("default/web".to_string()); // deduplicated
/// assert_eq!(queue.len(), 1);
/// let item = queue.get().await.unwrap();
/// // ... reconcile `item` ...
/// queue.done(&item);
/// queue.shutdown();
/// assert_eq!(queue.get().await, None);
/// # });
/// ```
pub struct Queue<T> {
    pub(super) shared: Arc<Shared<T>>,
}

/// What every handle of one queue shares.
pub(super) struct Shared<T> {
    pub(super) inner: Mutex<Inner<T>>,
    /// Parked `get` calls wait here.
    getters: Notify,
    /// `shutdown_with_drain` waits here for the last `done`.
    drained: Notify,
    /// The delaying queue's timer task waits here for an earlier ready time or shutdown. Its
    /// own `Arc` so the task can wait on it without keeping the queue alive.
    pub(super) timer: Arc<Notify>,
    pub(super) metrics: Option<QueueMetrics>,
}

/// The queue's state, behind the one lock.
pub(super) struct Inner<T> {
    /// Items ready to hand out, oldest first. Each is dirty and not processing.
    queue: VecDeque<T>,
    /// Every item the queue tracks, with its state.
    pub(super) items: HashMap<T, ItemState>,
    /// How many items are being processed (have the `processing` flag).
    processing: usize,
    pub(super) shutting_down: bool,
    /// `shutdown_with_drain` is waiting; `shutdown` clears it to stop that wait.
    drain: bool,
    /// `get` calls parked on `Shared::getters` that have not looked at the queue again yet.
    idle_getters: usize,
    /// Wake-ups sent to parked `get` calls and not yet answered.
    pending_wakeups: usize,
    /// Time zero of this queue's [`Stamp`]s.
    pub(super) epoch: Instant,
    /// The delaying queue's items that are not ready yet (empty for a plain queue).
    pub(super) waiting: WaitingHeap<T>,
    /// The timer task for `waiting`, once spawned. It can end without the queue knowing when
    /// its runtime shuts down; `timer_running` then says no, and the next user spawns anew.
    pub(super) timer: Option<tokio::task::JoinHandle<()>>,
}

/// What the queue knows about one item. 32 bytes: it is moved on every insert and removal.
#[derive(Debug, Default)]
pub(super) struct ItemState {
    /// Needs processing: in `queue`, or processing and to be re-queued at `done`.
    pub(super) dirty: bool,
    /// Handed out by `get` and not `done` yet.
    pub(super) processing: bool,
    /// The delaying queue will add the item at this time (the earliest one asked for).
    pub(super) ready_at: Option<Stamp>,
    /// When the item became dirty, for `workqueue_queue_duration_seconds`.
    pub(super) added_at: Option<Stamp>,
    /// When `get` handed it out, for `workqueue_work_duration_seconds` and the unfinished-work
    /// gauges.
    pub(super) started_at: Option<Stamp>,
}

/// A point in time as nanoseconds after the queue's epoch, plus one, so that `Option<Stamp>`
/// takes 8 bytes instead of an `Option<Instant>`'s 16. Covers 584 years.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Stamp(NonZeroU64);

/// The outcome of one locked look at the queue from `get`.
enum Take<T> {
    Item(T),
    ShutDown,
    Wait,
}

impl<T> Clone for Queue<T> {
    fn clone(&self) -> Self {
        Queue {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<T> fmt::Debug for Queue<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let inner = self.shared.inner.lock();
        f.debug_struct("Queue")
            .field("len", &inner.queue.len())
            .field("processing", &inner.processing)
            .field("waiting", &inner.waiting.len())
            .field("shutting_down", &inner.shutting_down)
            .finish()
    }
}

impl<T: Hash + Eq + Clone + Send + 'static> Default for Queue<T> {
    fn default() -> Self {
        Queue::new()
    }
}

impl<T: Hash + Eq + Clone + Send + 'static> Queue<T> {
    /// An unnamed queue (no metrics). client-go: `NewTyped`.
    pub fn new() -> Self {
        Queue::with_config(QueueConfig::default())
    }

    /// A queue built from `config`. client-go: `NewTypedWithConfig`.
    ///
    /// A named queue refreshes its unfinished-work gauges every 500 ms from a task on the
    /// current tokio runtime, like client-go's `updateUnfinishedWorkLoop`; outside a runtime
    /// those two gauges stay at zero.
    pub fn with_config(config: QueueConfig) -> Self {
        let metrics = QueueMetrics::for_queue(config.metrics_provider.as_ref(), &config.name);
        let shared = Arc::new(Shared {
            inner: Mutex::new(Inner {
                queue: VecDeque::new(),
                items: HashMap::new(),
                processing: 0,
                shutting_down: false,
                drain: false,
                idle_getters: 0,
                pending_wakeups: 0,
                epoch: Instant::now(),
                waiting: WaitingHeap::default(),
                timer: None,
            }),
            getters: Notify::new(),
            drained: Notify::new(),
            timer: Arc::new(Notify::new()),
            metrics,
        });
        if shared.metrics.is_some() {
            super::metrics::spawn_unfinished_work_updater(&shared);
        }
        Queue { shared }
    }

    /// Marks `item` as needing processing. Ignored after shutdown. client-go: `Add`.
    ///
    /// A parked `get` woken by this add is scheduled on the adding task's thread (tokio puts
    /// it in that thread's LIFO slot, which other threads do not steal). A task that adds in a
    /// long loop without awaiting therefore keeps workers waiting until the loop ends; such a
    /// loop should `tokio::task::consume_budget().await` between adds, as event handlers fed
    /// by a watch stream do anyway.
    pub fn add(&self, item: T) {
        let wake = {
            let mut inner = self.shared.inner.lock();
            if inner.shutting_down {
                return;
            }
            inner.add(item, self.shared.metrics.as_ref())
        };
        if wake {
            self.shared.getters.notify_one();
        }
    }

    /// The number of items waiting to be handed out (not counting items being processed or
    /// delayed items whose time has not come). For information only. client-go: `Len`.
    pub fn len(&self) -> usize {
        let mut inner = self.shared.inner.lock();
        if !inner.waiting.is_empty() {
            // A delayed item whose time has come counts, even if the timer task has not run.
            let now = inner.now();
            let queued = inner.promote_ready(now, self.shared.metrics.as_ref());
            let wake = inner.claim_wakeups(queued);
            let len = inner.queue.len();
            drop(inner);
            self.wake_getters(wake);
            return len;
        }
        inner.queue.len()
    }

    /// Whether no item is waiting to be handed out.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Waits for an item to process and marks it processing; the caller must call
    /// [`done`](Self::done) with it. Returns `None` once the queue is shut down and empty.
    /// client-go: `Get` (`shutdown == true` is `None`).
    ///
    /// # Cancel safety
    /// Cancel safe: an item is only taken in the poll that returns it, and a wake-up meant for
    /// a cancelled `get` passes to another parked `get`.
    pub async fn get(&self) -> Option<T> {
        match self.shared.take(None) {
            Take::Item(item) => return Some(item),
            Take::ShutDown => return None,
            Take::Wait => {}
        }
        let mut parked = Parked {
            shared: &self.shared,
            registered: false,
        };
        loop {
            let notified = self.shared.getters.notified();
            tokio::pin!(notified);
            match self.shared.take(Some((notified.as_mut(), &mut parked))) {
                Take::Item(item) => return Some(item),
                Take::ShutDown => return None,
                Take::Wait => notified.await,
            }
        }
    }

    /// Marks `item` as done processing; if it was added again meanwhile, it goes back in line.
    /// Ignored for an item that is not being processed. client-go: `Done`.
    pub fn done(&self, item: &T) {
        let (wake_getter, wake_drain) = {
            let mut inner = self.shared.inner.lock();
            inner.done(item, self.shared.metrics.as_ref())
        };
        if wake_getter {
            self.shared.getters.notify_one();
        }
        if wake_drain {
            self.shared.drained.notify_waiters();
        }
    }

    /// Stops the queue: new adds are ignored, delayed items are dropped, and `get` returns
    /// `None` once the remaining items are handed out. Wakes every parked `get` and stops a
    /// `shutdown_with_drain` wait. client-go: `ShutDown`.
    pub fn shutdown(&self) {
        {
            let mut inner = self.shared.inner.lock();
            inner.drain = false;
            inner.begin_shutdown();
        }
        self.shared.wake_all_for_shutdown();
    }

    /// Like [`shutdown`](Self::shutdown), then waits until every item being processed is
    /// `done` (or until `shutdown` is called). Workers must keep calling `done`.
    /// client-go: `ShutDownWithDrain`.
    pub async fn shutdown_with_drain(&self) {
        {
            let mut inner = self.shared.inner.lock();
            inner.drain = true;
            inner.begin_shutdown();
        }
        self.shared.wake_all_for_shutdown();
        loop {
            // Created before the check, so a `notify_waiters` after the check reaches it.
            let drained = self.shared.drained.notified();
            {
                let inner = self.shared.inner.lock();
                if inner.processing == 0 || !inner.drain {
                    return;
                }
            }
            drained.await;
        }
    }

    /// Whether `shutdown` or `shutdown_with_drain` was called. client-go: `ShuttingDown`.
    pub fn is_shutting_down(&self) -> bool {
        self.shared.inner.lock().shutting_down
    }

    /// Wakes up to `count` parked `get` calls.
    pub(super) fn wake_getters(&self, count: usize) {
        self.shared.wake_getters(count);
    }
}

/// A `get` that has counted itself in `idle_getters`. Dropping it (a cancelled `get`) takes
/// it out of the count again.
struct Parked<'a, T> {
    shared: &'a Shared<T>,
    registered: bool,
}

impl<T> Drop for Parked<'_, T> {
    fn drop(&mut self) {
        if self.registered {
            self.shared.inner.lock().idle_getters -= 1;
        }
    }
}

impl<T: Hash + Eq + Clone + Send + 'static> Shared<T> {
    /// One locked look from `get`: promote ready delayed items, take the oldest item, or (with
    /// `park`) register the `Notified` and count the caller as parked.
    fn take(
        self: &Arc<Self>,
        park: Option<(Pin<&mut Notified<'_>>, &mut Parked<'_, T>)>,
    ) -> Take<T> {
        let mut inner = self.inner.lock();
        let mut park = park;
        if let Some((_, parked)) = park.as_mut() {
            if parked.registered {
                // Woken: this answers one wake-up (or shutdown's broadcast).
                parked.registered = false;
                inner.idle_getters -= 1;
                inner.pending_wakeups = inner.pending_wakeups.saturating_sub(1);
            }
        }
        let mut queued = 0;
        if !inner.waiting.is_empty() {
            let now = inner.now();
            queued = inner.promote_ready(now, self.metrics.as_ref());
        }
        let outcome = if let Some(item) = inner.queue.pop_front() {
            inner.start_processing(&item, self.metrics.as_ref());
            queued = queued.saturating_sub(1);
            Take::Item(item)
        } else if inner.shutting_down {
            Take::ShutDown
        } else {
            if let Some((notified, parked)) = park {
                // Registered under the lock: an add after this unlock finds us parked.
                notified.enable();
                inner.idle_getters += 1;
                parked.registered = true;
                if !inner.waiting.is_empty() && !inner.timer_running() {
                    super::delaying_queue::spawn_timer(self, &mut inner);
                }
            }
            Take::Wait
        };
        let wake = inner.claim_wakeups(queued);
        drop(inner);
        self.wake_getters(wake);
        outcome
    }

    fn wake_all_for_shutdown(&self) {
        self.getters.notify_waiters();
        self.drained.notify_waiters();
        self.timer.notify_one();
    }
}

impl<T> Shared<T> {
    pub(super) fn wake_getters(&self, count: usize) {
        for _ in 0..count {
            self.getters.notify_one();
        }
    }
}

impl<T> Drop for Shared<T> {
    fn drop(&mut self) {
        // The timer task holds only a weak reference; wake it so it sees the queue is gone.
        self.timer.notify_one();
    }
}

impl<T> Inner<T> {
    /// Claims wake-ups for up to `items` newly queued items, one per parked `get` that has
    /// none coming. Returns how many `notify_one` calls to make (after unlocking).
    pub(super) fn claim_wakeups(&mut self, items: usize) -> usize {
        let free = self.idle_getters.saturating_sub(self.pending_wakeups);
        let wake = items.min(free);
        self.pending_wakeups += wake;
        wake
    }

    /// Parked `get` calls (for tests).
    #[cfg(test)]
    pub(super) fn idle_getters(&self) -> usize {
        self.idle_getters
    }

    /// Items being processed (for tests).
    #[cfg(test)]
    pub(super) fn processing(&self) -> usize {
        self.processing
    }

    /// Whether a timer task for `waiting` is alive.
    pub(super) fn timer_running(&self) -> bool {
        self.timer.as_ref().is_some_and(|t| !t.is_finished())
    }

    /// The current time as a [`Stamp`] of this queue.
    pub(super) fn now(&self) -> Stamp {
        Stamp::at(self.epoch, Instant::now())
    }
}

impl Stamp {
    /// `t` as a stamp of a queue whose epoch is `epoch` (saturating at both ends).
    pub(super) fn at(epoch: Instant, t: Instant) -> Stamp {
        let nanos =
            u64::try_from(t.saturating_duration_since(epoch).as_nanos()).unwrap_or(u64::MAX - 1);
        Stamp(NonZeroU64::MIN.saturating_add(nanos))
    }

    /// This stamp plus `d` (saturating).
    pub(super) fn after(self, d: std::time::Duration) -> Stamp {
        let nanos = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        Stamp(self.0.saturating_add(nanos))
    }

    /// Back to an `Instant`, for `sleep_until`.
    pub(super) fn instant(self, epoch: Instant) -> Instant {
        epoch + std::time::Duration::from_nanos(self.0.get() - 1)
    }

    /// Seconds from `self` to `later` (zero if `later` is earlier).
    pub(super) fn secs_until(self, later: Stamp) -> f64 {
        std::time::Duration::from_nanos(later.0.get().saturating_sub(self.0.get())).as_secs_f64()
    }
}

impl<T: Hash + Eq + Clone> Inner<T> {
    /// `add` under the lock. Returns whether a parked `get` should be woken.
    fn add(&mut self, item: T, metrics: Option<&QueueMetrics>) -> bool {
        let epoch = self.epoch;
        match self.items.entry(item) {
            Entry::Occupied(mut entry) => {
                let state = entry.get_mut();
                if state.dirty {
                    return false;
                }
                state.dirty = true;
                if let Some(m) = metrics {
                    m.added(&mut state.added_at, epoch);
                }
                if state.processing {
                    return false;
                }
                self.queue.push_back(entry.key().clone());
            }
            Entry::Vacant(entry) => {
                self.queue.push_back(entry.key().clone());
                let state = entry.insert(ItemState {
                    dirty: true,
                    ..ItemState::default()
                });
                if let Some(m) = metrics {
                    m.added(&mut state.added_at, epoch);
                }
            }
        }
        self.claim_wakeups(1) == 1
    }

    /// Makes an owned, already-tracked item dirty and puts it in line (the delaying queue's
    /// promotion). Returns whether it went into `queue`.
    pub(super) fn add_tracked(&mut self, item: T, metrics: Option<&QueueMetrics>) -> bool {
        let epoch = self.epoch;
        let Some(state) = self.items.get_mut(&item) else {
            return false;
        };
        if state.dirty {
            return false;
        }
        state.dirty = true;
        if let Some(m) = metrics {
            m.added(&mut state.added_at, epoch);
        }
        if state.processing {
            return false;
        }
        self.queue.push_back(item);
        true
    }

    /// `get` took `item` from `queue`: mark it processing.
    fn start_processing(&mut self, item: &T, metrics: Option<&QueueMetrics>) {
        self.processing += 1;
        let epoch = self.epoch;
        if let Some(state) = self.items.get_mut(item) {
            state.dirty = false;
            state.processing = true;
            if let Some(m) = metrics {
                m.got(&mut state.added_at, &mut state.started_at, epoch);
            }
        }
    }

    /// `done` under the lock. Returns (wake a parked get, wake the drain waiter).
    fn done(&mut self, item: &T, metrics: Option<&QueueMetrics>) -> (bool, bool) {
        let epoch = self.epoch;
        let EntryRef::Occupied(mut entry) = self.items.entry_ref(item) else {
            return (false, false);
        };
        let state = entry.get_mut();
        if !state.processing {
            return (false, false);
        }
        state.processing = false;
        if let Some(m) = metrics {
            m.finished(&mut state.started_at, epoch);
        }
        let mut wake_getter = false;
        if state.dirty {
            self.queue.push_back(entry.key().clone());
            wake_getter = self.claim_wakeups(1) == 1;
        } else if state.ready_at.is_none() {
            entry.remove();
        }
        self.processing -= 1;
        (wake_getter, self.processing == 0 && self.drain)
    }

    fn begin_shutdown(&mut self) {
        self.shutting_down = true;
        // client-go's waiting loop exits on shutdown and its pending items are never added.
        if !self.waiting.is_empty() {
            self.waiting.clear();
            self.items.retain(|_, state| {
                state.ready_at = None;
                state.dirty || state.processing
            });
        }
    }

    /// Seconds of unfinished work and of the longest-running item, at `now`.
    pub(super) fn unfinished_work(&self, now: Stamp) -> (f64, f64) {
        let mut total = 0.0;
        let mut longest: f64 = 0.0;
        for state in self.items.values() {
            if let Some(start) = state.started_at {
                let age = start.secs_until(now);
                total += age;
                longest = longest.max(age);
            }
        }
        (total, longest)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap as StdHashMap;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use super::*;

    // client-go: TestLen
    #[tokio::test]
    async fn len_counts_distinct_waiting_items() {
        let q = Queue::new();
        q.add("foo");
        assert_eq!(q.len(), 1);
        q.add("bar");
        assert_eq!(q.len(), 2);
        q.add("foo"); // should not increase the queue length
        assert_eq!(q.len(), 2);
    }

    // client-go: TestReinsert
    #[tokio::test]
    async fn item_added_while_processing_comes_back_after_done() {
        let q = Queue::new();
        q.add("foo");
        let item = q.get().await.unwrap();
        assert_eq!(item, "foo");
        q.add(item);
        assert_eq!(q.len(), 0, "not handed out again while processing");
        q.done(&item);
        assert_eq!(q.len(), 1);
        let again = q.get().await.unwrap();
        assert_eq!(again, "foo");
        q.done(&again);
        assert_eq!(q.len(), 0);
        assert!(
            q.shared.inner.lock().items.is_empty(),
            "finished items are forgotten"
        );
    }

    // client-go: TestCollapse
    #[tokio::test]
    async fn adding_twice_before_get_hands_out_once() {
        let q = Queue::new();
        q.add("bar");
        q.add("bar");
        let item = q.get().await.unwrap();
        assert_eq!(item, "bar");
        q.done(&item);
        assert_eq!(q.len(), 0);
    }

    // client-go: TestCollapseWhileProcessing
    #[tokio::test(start_paused = true)]
    async fn second_worker_waits_until_first_is_done() {
        let q = Queue::new();
        q.add("foo");
        let item = q.get().await.unwrap();
        q.add("foo");
        q.add("foo");
        let q2 = q.clone();
        let worker = tokio::spawn(async move {
            let item = q2.get().await.unwrap();
            q2.done(&item);
            item
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!worker.is_finished(), "worker must be blocked until done");
        q.done(&item);
        assert_eq!(worker.await.unwrap(), "foo");
        assert_eq!(q.len(), 0);
    }

    // client-go: TestQueueDrainageUsingShutDownWithDrain
    #[tokio::test(start_paused = true)]
    async fn shutdown_with_drain_waits_for_processing_items() {
        let q = Queue::new();
        q.add("foo");
        q.add("bar");
        let first = q.get().await.unwrap();
        let second = q.get().await.unwrap();
        let q2 = q.clone();
        let drain = tokio::spawn(async move { q2.shutdown_with_drain().await });
        while q.get().await.is_some() {}
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(
            !drain.is_finished(),
            "drain returned with items still processing"
        );
        q.done(&first);
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(
            !drain.is_finished(),
            "drain returned with one item still processing"
        );
        q.done(&second);
        drain.await.unwrap();
    }

    // client-go: TestNoQueueDrainageUsingShutDown
    #[tokio::test]
    async fn shutdown_does_not_wait_for_processing_items() {
        let q = Queue::new();
        q.add("foo");
        q.add("bar");
        q.get().await.unwrap();
        q.get().await.unwrap();
        q.shutdown();
        assert!(q.is_shutting_down());
        assert_eq!(q.get().await, None);
    }

    // client-go: TestForceQueueShutdownUsingShutDown
    #[tokio::test(start_paused = true)]
    async fn shutdown_stops_a_drain_wait() {
        let q = Queue::new();
        q.add("foo");
        q.add("bar");
        q.get().await.unwrap();
        q.get().await.unwrap();
        let q2 = q.clone();
        let drain = tokio::spawn(async move { q2.shutdown_with_drain().await });
        while q.get().await.is_some() {}
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(!drain.is_finished());
        q.shutdown();
        drain.await.unwrap();
    }

    // client-go: TestQueueDrainageUsingShutDownWithDrainWithDirtyItem
    #[tokio::test(start_paused = true)]
    async fn drain_hands_out_an_item_made_dirty_before_shutdown() {
        let q = Queue::new();
        q.add("foo");
        let gotten = q.get().await.unwrap();
        q.add("foo");
        let q2 = q.clone();
        let drain = tokio::spawn(async move { q2.shutdown_with_drain().await });
        while q.get().await.is_some() {}
        q.done(&gotten);
        let again = q.get().await;
        assert_eq!(
            again,
            Some("foo"),
            "done re-queues the dirty item even while draining"
        );
        q.add("bar");
        assert_eq!(q.len(), 0, "adds after shutdown are ignored");
        q.done(&again.unwrap());
        assert_eq!(q.get().await, None);
        drain.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn shutdown_wakes_every_blocked_get() {
        let q: Queue<u32> = Queue::new();
        let mut getters = Vec::new();
        for _ in 0..8 {
            let q = q.clone();
            getters.push(tokio::spawn(async move { q.get().await }));
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(q.shared.inner.lock().idle_getters, 8);
        assert!(getters.iter().all(|g| !g.is_finished()));
        q.shutdown();
        for g in getters {
            assert_eq!(g.await.unwrap(), None);
        }
        assert_eq!(q.shared.inner.lock().idle_getters, 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_cancelled_get_does_not_swallow_an_item() {
        let q: Queue<u32> = Queue::new();
        let cancelled = tokio::time::timeout(Duration::from_millis(5), q.get()).await;
        assert!(cancelled.is_err());
        assert_eq!(
            q.shared.inner.lock().idle_getters,
            0,
            "cancelled get uncounted"
        );
        let q2 = q.clone();
        let waiter = tokio::spawn(async move { q2.get().await });
        tokio::time::sleep(Duration::from_millis(1)).await;
        q.add(7);
        assert_eq!(waiter.await.unwrap(), Some(7));
    }

    #[tokio::test(start_paused = true)]
    async fn a_burst_of_adds_wakes_each_parked_get_once() {
        let q: Queue<u32> = Queue::new();
        let getters: Vec<_> = (0..4)
            .map(|_| {
                let q = q.clone();
                tokio::spawn(async move { q.get().await })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(1)).await;
        for i in 0..10 {
            q.add(i);
        }
        {
            let inner = q.shared.inner.lock();
            assert_eq!(inner.idle_getters, 4);
            assert_eq!(
                inner.pending_wakeups, 4,
                "one wake-up per parked get, not per add"
            );
        }
        let mut got: Vec<u32> = Vec::new();
        for g in getters {
            got.push(g.await.unwrap().unwrap());
        }
        got.sort();
        assert_eq!(got, vec![0, 1, 2, 3]);
        let inner = q.shared.inner.lock();
        assert_eq!((inner.idle_getters, inner.pending_wakeups), (0, 0));
        assert_eq!(inner.queue.len(), 6);
    }

    #[tokio::test(start_paused = true)]
    async fn a_wake_up_for_a_cancelled_get_is_not_lost() {
        let q: Queue<u32> = Queue::new();
        let q2 = q.clone();
        let doomed = tokio::spawn(async move { q2.get().await });
        tokio::time::sleep(Duration::from_millis(1)).await;
        q.add(1); // wakes `doomed`...
        doomed.abort(); // ...which is cancelled before it runs: the wake-up becomes a permit.
        assert!(doomed.await.unwrap_err().is_cancelled());
        assert_eq!(q.get().await, Some(1), "the item is still there");
        let q3 = q.clone();
        let getter = tokio::spawn(async move { q3.get().await });
        tokio::time::sleep(Duration::from_millis(1)).await; // parks (after eating the permit)
        q.add(2);
        assert_eq!(getter.await.unwrap(), Some(2));
    }

    #[tokio::test]
    async fn done_of_an_item_not_processing_is_ignored() {
        let q = Queue::new();
        q.add("foo");
        q.done(&"foo");
        q.done(&"never-added");
        assert_eq!(q.len(), 1, "a dirty item is not queued twice");
        let item = q.get().await.unwrap();
        q.done(&item);
        q.shutdown();
        assert_eq!(q.get().await, None);
    }

    #[tokio::test]
    async fn hands_out_items_in_fifo_order() {
        let q = Queue::new();
        for i in 0..5 {
            q.add(i);
        }
        for i in 0..5 {
            assert_eq!(q.get().await, Some(i));
        }
    }

    /// Runs `producers` tasks adding keys and `workers` tasks processing them (re-adding each
    /// key once while processing it), and checks the queue's promises.
    async fn many_producers_and_workers(producers: usize, workers: usize, drain: bool) {
        const KEYS: usize = 40;
        const ADDS_PER_PRODUCER: usize = 300;
        let q: Queue<usize> = Queue::new();
        let in_flight: Arc<Mutex<StdHashMap<usize, usize>>> = Arc::default();
        let processed = Arc::new(AtomicUsize::new(0));
        let last_processed_after_add: Arc<Mutex<StdHashMap<usize, bool>>> = Arc::default();

        let mut worker_tasks = Vec::new();
        for w in 0..workers {
            let q = q.clone();
            let in_flight = in_flight.clone();
            let processed = processed.clone();
            let seen_after_add = last_processed_after_add.clone();
            worker_tasks.push(tokio::spawn(async move {
                let mut readded = StdHashMap::new();
                while let Some(item) = q.get().await {
                    {
                        let mut f = in_flight.lock();
                        let n = f.entry(item).or_default();
                        assert_eq!(*n, 0, "item {item} handed to two workers at once");
                        *n += 1;
                    }
                    seen_after_add.lock().insert(item, true);
                    if (item + w) % 3 == 0 && readded.insert(item, ()).is_none() {
                        q.add(item); // dirty while processing
                    }
                    tokio::task::yield_now().await;
                    *in_flight.lock().get_mut(&item).unwrap() -= 1;
                    processed.fetch_add(1, Ordering::Relaxed);
                    q.done(&item);
                }
            }));
        }
        let mut producer_tasks = Vec::new();
        for p in 0..producers {
            let q = q.clone();
            let seen_after_add = last_processed_after_add.clone();
            producer_tasks.push(tokio::spawn(async move {
                for j in 0..ADDS_PER_PRODUCER {
                    let key = (p * 7 + j) % KEYS;
                    // Must be processed at least once after this add.
                    seen_after_add.lock().insert(key, false);
                    q.add(key);
                    if j % 16 == 0 {
                        tokio::task::yield_now().await;
                    }
                }
            }));
        }
        for t in producer_tasks {
            t.await.unwrap();
        }
        // Every add before shutdown must still be processed.
        if drain {
            // Wait for the line to empty, then drain the in-flight work.
            while !q.is_empty() {
                tokio::task::yield_now().await;
            }
            q.shutdown_with_drain().await;
        } else {
            while !q.is_empty() || q.shared.inner.lock().processing > 0 {
                tokio::task::yield_now().await;
            }
            q.shutdown();
        }
        for t in worker_tasks {
            t.await.unwrap();
        }
        assert_eq!(q.len(), 0);
        let inner = q.shared.inner.lock();
        assert_eq!(inner.processing, 0);
        assert!(
            inner.items.is_empty(),
            "queue ends empty, left {}",
            inner.items.len()
        );
        assert_eq!(inner.idle_getters, 0);
        drop(inner);
        let seen = last_processed_after_add.lock();
        assert_eq!(seen.len(), KEYS);
        assert!(
            seen.values().all(|&s| s),
            "an added item was never processed after its add"
        );
        assert!(processed.load(Ordering::Relaxed) >= KEYS);
    }

    // client-go: TestBasic, TestAddWhileProcessing (with many threads instead of goroutines)
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn stress_many_producers_and_workers_shutdown() {
        for _ in 0..5 {
            many_producers_and_workers(50, 10, false).await;
        }
    }

    // client-go: TestBasic, TestAddWhileProcessing with ShutDownWithDrain
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn stress_many_producers_and_workers_drain() {
        for _ in 0..5 {
            many_producers_and_workers(16, 16, true).await;
        }
    }

    /// Plain OS threads hammering one queue through a runtime each, so lock hand-offs happen
    /// between truly parallel callers in every order the scheduler finds.
    #[test]
    fn stress_os_threads_never_hand_an_item_out_twice() {
        const THREADS: usize = 8;
        const ROUNDS: usize = 3_000;
        let q: Queue<u16> = Queue::new();
        let in_flight: Arc<Vec<AtomicUsize>> =
            Arc::new((0..64).map(|_| AtomicUsize::new(0)).collect());
        let handled = Arc::new(AtomicUsize::new(0));
        std::thread::scope(|s| {
            for t in 0..THREADS {
                let q = q.clone();
                let in_flight = in_flight.clone();
                let handled = handled.clone();
                s.spawn(move || {
                    let rt = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .unwrap();
                    rt.block_on(async {
                        for r in 0..ROUNDS {
                            q.add(((t * 31 + r) % 64) as u16);
                            if r % 2 == 0 {
                                continue;
                            }
                            // Others may have taken everything: never block for good.
                            let got =
                                tokio::time::timeout(Duration::from_millis(20), q.get()).await;
                            let Ok(Some(item)) = got else { continue };
                            let prev = in_flight[item as usize].fetch_add(1, Ordering::SeqCst);
                            assert_eq!(prev, 0, "item {item} processed twice at once");
                            std::hint::spin_loop();
                            in_flight[item as usize].fetch_sub(1, Ordering::SeqCst);
                            handled.fetch_add(1, Ordering::Relaxed);
                            q.done(&item);
                        }
                    });
                });
            }
        });
        // Whatever is left is in line (nobody is processing); hand it out and finish.
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            q.shutdown();
            while let Some(item) = q.get().await {
                q.done(&item);
            }
        });
        let inner = q.shared.inner.lock();
        assert_eq!(inner.processing, 0);
        assert!(inner.items.is_empty());
        assert!(handled.load(Ordering::Relaxed) > 0);
    }
}
