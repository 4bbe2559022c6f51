//! A rate-limiting work queue that hands out the highest-priority ready item first.
//! controller-runtime counterpart: `pkg/controller/priorityqueue/priorityqueue.go`
//! (`PriorityQueue[T]`, v0.24.1; design: `designs/priorityqueue.md`), the default queue of
//! controller-runtime's controllers since v0.23.
//!
//! Behaviour kept from controller-runtime:
//! - [`add_with_opts`](PriorityQueue::add_with_opts) takes a delay, a rate-limited flag and a
//!   priority (default 0, higher first); `add`, `add_after` and `add_rate_limited` are it
//!   with one option set. Rate-limited with a delay waits the shorter of the two.
//! - An item already queued (ready or waiting) keeps its highest priority and its earliest
//!   ready time. Raising its priority puts it at the back of the new priority's line.
//! - `get` returns the item and its priority: the highest priority among ready items, and
//!   within a priority the one that became ready first (FIFO). An item whose delay passes is
//!   ordered by when it became ready, not when it was added.
//! - An item is never handed to two workers at once: one added while a worker has it is
//!   ready (it counts in `len` and the depth metric) but is handed out only after `done`,
//!   in its place, once.
//! - `len` counts ready items, including those waiting for their worker's `done`; not
//!   items whose delay has not passed.
//! - After `shutdown`, adds are ignored and `get` returns `None` at once, even with items
//!   ready (controller-runtime issue #3239); delayed items are dropped.
//! - Metrics: the client-go families, with the depth labelled by priority (bounded, see
//!   `metrics.rs`); every add with a delay counts as a retry.
//! - The default rate limiter is per-item exponential, 5 ms to 1000 s
//!   ([`PriorityQueue::new`]).
//!
//! Fairness (kubeloop's own; controller-runtime#3261 proposes it, unmerged in v0.24.1): a
//! queue made with [`PriorityQueue::with_fairness`] gives each item fairness keys (say its
//! namespace) and, within one priority, hands out round-robin across the keys that have a
//! ready item no worker has, first in first out within a key, fair at each level of nested
//! keys (`fair.rs`). One tenant's 10,000 adds then delay another's one add by at most a turn
//! per busy key, not by 10,000 items. Priority still comes first: fairness orders items of
//! one priority only. Without an extractor a priority is one line, first in, first out.
//!
//! What differs on purpose:
//! - No goroutines: controller-runtime buffers adds and hands items to `Get` through channels
//!   served by four goroutines; here every add, get and done is one transition under the
//!   queue's one lock (`priority_state.rs`), `get` parks in the queue's own waiter list, and
//!   one timer task sleeps until the earliest ready time (`sleep_until(next)`), as the
//!   delaying queue's does. The timer runs on the tokio runtime of the add or `get` that
//!   started it, so share a queue only among tasks of runtimes that outlive it. An add is visible to `len` and `get` as soon as it returns
//!   (controller-runtime's add is asynchronous).
//! - `shutdown_with_drain` hands out what is ready until none is left and waits until every
//!   item handed out is `done`, as client-go's `ShutDownWithDrain` and the other kubeloop
//!   queues do, so a controller on this queue finishes its queued keys on shutdown
//!   (controller-runtime's just shuts down).
//! - Names follow the kubeloop queue family (`shutdown`, `is_shutting_down`), and `get`
//!   returns `Option<(item, priority)>` (controller-runtime: `GetWithPriority`).

use std::fmt;
use std::future::Future;
use std::hash::Hash;
use std::sync::Arc;
use std::time::Duration;

use super::delaying_queue::ensure_timer;
use super::fair::{FairnessDepth, FairnessExtractor, FairnessKeys};
use super::metrics::PriorityQueueMetrics;
use super::priority_state::{Add, PriorityHooks, PriorityItemStatus, PriorityState};
use super::queue::QueueConfig;
use super::rate_limiters::{ItemExponentialFailureRateLimiter, RateLimiter};
use super::shared::Shared;
use crate::trace::Stage;

/// How to add items: [`PriorityQueue::add_with_opts`]. The default adds now, at priority 0.
/// controller-runtime: `priorityqueue.AddOpts`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AddOpts {
    /// Add once this much time has passed (`None` or zero: now).
    pub after: Option<Duration>,
    /// Ask the rate limiter how long to wait (the shorter of its answer and `after` wins).
    pub rate_limited: bool,
    /// Higher is handed out first; `None` is 0.
    pub priority: Option<i32>,
}

/// A work queue ordered by priority, with delays and a rate limiter. Cloning gives another
/// handle to the same queue.
///
/// Delays fire from a task on the tokio runtime that is current when the first delayed item
/// is added (or the first `get` parks); construct and use the queue inside a runtime.
///
/// # Examples
/// ```
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// use kubeloop::workqueue::{AddOpts, LOW_PRIORITY, PriorityQueue};
/// let queue = PriorityQueue::new();
/// // The initial list: every existing object, at low priority.
/// let low = AddOpts {
///     priority: Some(LOW_PRIORITY),
///     ..AddOpts::default()
/// };
/// queue.add_with_opts(low, ["default/old"]);
/// // A user's edit comes later but goes first.
/// queue.add("default/edited");
/// assert_eq!(queue.get().await, Some(("default/edited", 0)));
/// queue.done(&"default/edited");
/// assert_eq!(queue.get().await, Some(("default/old", LOW_PRIORITY)));
/// # });
/// ```
pub struct PriorityQueue<T> {
    shared: Arc<Shared<PriorityState<T>>>,
    limiter: Arc<dyn RateLimiter<T>>,
}

impl<T> Clone for PriorityQueue<T> {
    fn clone(&self) -> Self {
        PriorityQueue {
            shared: Arc::clone(&self.shared),
            limiter: Arc::clone(&self.limiter),
        }
    }
}

impl<T> fmt::Debug for PriorityQueue<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.shared.inspect(|state| state.fmt(f))
    }
}

impl<T: Hash + Eq + Clone + Send + Sync + 'static> Default for PriorityQueue<T> {
    fn default() -> Self {
        PriorityQueue::new()
    }
}

impl<T: Hash + Eq + Clone + Send + Sync + 'static> PriorityQueue<T> {
    /// An unnamed queue (no metrics) with controller-runtime's default rate limiter,
    /// per-item exponential from 5 ms to 1000 s. controller-runtime: `New` without options.
    pub fn new() -> Self {
        PriorityQueue::with_config(
            ItemExponentialFailureRateLimiter::new(
                Duration::from_millis(5),
                Duration::from_secs(1000),
            ),
            QueueConfig::default(),
        )
    }

    /// A queue with `limiter` for `add_rate_limited`, named (for metrics) by `config`.
    /// controller-runtime: `New(name, WithRateLimiter, WithMetricProvider)`.
    ///
    /// A named queue refreshes its unfinished-work gauges every 500 ms from a task on the
    /// current tokio runtime.
    pub fn with_config(limiter: impl RateLimiter<T> + 'static, config: QueueConfig) -> Self {
        PriorityQueue::build(limiter, config, None)
    }

    /// [`with_config`](Self::with_config), handing out fairly across the fairness keys
    /// `fairness` gives each item (see the module docs).
    ///
    /// # Examples
    /// ```
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// use kubeloop::workqueue::{FairnessKeys, PriorityQueue, QueueConfig};
    /// use kubeloop::workqueue::default_controller_rate_limiter;
    /// // Fair across namespaces: the text before the `/` of a `namespace/name` key.
    /// let queue = PriorityQueue::<String>::with_fairness(
    ///     default_controller_rate_limiter(),
    ///     QueueConfig::default(),
    ///     |key: &String| FairnessKeys::one(key.split_once('/').map_or("", |(ns, _)| ns)),
    /// );
    /// for name in ["a", "b", "c"] {
    ///     queue.add(format!("busy/{name}"));
    /// }
    /// queue.add("quiet/x".to_owned());
    /// assert_eq!(queue.get().await.unwrap().0, "busy/a");
    /// assert_eq!(queue.get().await.unwrap().0, "quiet/x", "quiet's turn, not busy/b's");
    /// # });
    /// ```
    pub fn with_fairness(
        limiter: impl RateLimiter<T> + 'static,
        config: QueueConfig,
        fairness: impl for<'a> Fn(&'a T) -> FairnessKeys<'a> + Send + Sync + 'static,
    ) -> Self {
        PriorityQueue::build(limiter, config, Some(Arc::new(fairness)))
    }

    fn build(
        limiter: impl RateLimiter<T> + 'static,
        config: QueueConfig,
        fairness: Option<Arc<FairnessExtractor<T>>>,
    ) -> Self {
        let metrics =
            PriorityQueueMetrics::for_queue(config.metrics_provider.as_ref(), &config.name);
        let named = metrics.is_some();
        let hooks = metrics.map(|m| Box::new(m) as Box<dyn PriorityHooks>);
        let fair = fairness.is_some();
        let shared = Arc::new(Shared::new(PriorityState::new(fairness, named), hooks));
        if named && fair {
            let weak = Arc::downgrade(&shared);
            super::metrics::register_fair_queue(&config.name, weak);
        }
        if named {
            super::metrics::spawn_unfinished_work_updater(&shared);
        }
        PriorityQueue {
            shared,
            limiter: Arc::new(limiter),
        }
    }

    /// Adds `items` with `opts`, under one lock. An item already queued keeps the higher of
    /// its priorities and the earlier of its ready times. Ignored after shutdown.
    /// controller-runtime: `AddWithOpts`.
    pub fn add_with_opts(&self, opts: AddOpts, items: impl IntoIterator<Item = T>) {
        let mut items = items.into_iter();
        let Some(first) = items.next() else {
            return;
        };
        let first = self.prepare(&opts, first);
        // One item (the common case) without allocating; more are prepared before the lock.
        let earliest = match items.next() {
            None => self.shared.add_all([first], ensure_timer),
            Some(second) => {
                let mut adds = vec![first, self.prepare(&opts, second)];
                adds.extend(items.map(|item| self.prepare(&opts, item)));
                self.shared.add_all(adds, ensure_timer)
            }
        };
        if earliest {
            self.shared.timer.notify_one();
        }
    }

    /// One add of `add_with_opts`, worked out before the queue's lock is taken: its hash,
    /// priority and delay (asking the rate limiter, which counts the try).
    fn prepare(&self, opts: &AddOpts, item: T) -> (u64, Add<T>) {
        let priority = opts.priority.unwrap_or(0);
        let mut after = opts.after.unwrap_or(Duration::ZERO);
        if opts.rate_limited {
            let limited = self.limiter.when(&item);
            if after.is_zero() || limited < after {
                after = limited;
            }
        }
        if crate::trace::on() {
            self.trace_add(&item, priority, after, opts.rate_limited);
        }
        let hash = self.shared.hash(&item);
        (
            hash,
            Add {
                item,
                priority,
                after,
            },
        )
    }

    /// Adds `item` now at priority 0. controller-runtime: `Add`.
    pub fn add(&self, item: T) {
        self.add_with_opts(AddOpts::default(), [item]);
    }

    /// Adds `item` once `delay` has passed. controller-runtime: `AddAfter`.
    pub fn add_after(&self, item: T, delay: Duration) {
        self.add_with_opts(
            AddOpts {
                after: Some(delay),
                ..AddOpts::default()
            },
            [item],
        );
    }

    /// Adds `item` after the wait the rate limiter decides. controller-runtime:
    /// `AddRateLimited`.
    pub fn add_rate_limited(&self, item: T) {
        self.add_with_opts(
            AddOpts {
                rate_limited: true,
                ..AddOpts::default()
            },
            [item],
        );
    }

    /// Tells the rate limiter to stop tracking `item`; `done` is still needed.
    /// controller-runtime: `Forget`.
    pub fn forget(&self, item: &T) {
        self.limiter.forget(item);
    }

    /// How many times `item` was rate-limited since it was last forgotten.
    /// controller-runtime: `NumRequeues`.
    pub fn num_requeues(&self, item: &T) -> u32 {
        self.limiter.num_requeues(item)
    }

    /// Waits for the highest-priority ready item, marks it processing and returns it with its
    /// priority; the caller must call [`done`](Self::done) with it. Returns `None` once the
    /// queue is shut down (after `shutdown_with_drain`, once nothing ready is left).
    /// controller-runtime: `GetWithPriority`.
    ///
    /// # Cancel safety
    /// Cancel safe: an item is only taken in the poll that returns it, and a wake-up meant for
    /// a cancelled `get` passes to another parked `get`.
    pub fn get(&self) -> impl Future<Output = Option<(T, i32)>> + Send + '_ {
        self.shared.get(Some(ensure_timer))
    }

    /// Marks `item` as done processing; if it was added again meanwhile, it becomes
    /// available in its place. Ignored for an item that is not being processed.
    /// controller-runtime: `Done`.
    pub fn done(&self, item: &T) {
        self.shared.done(item);
    }

    /// The number of ready items, including those a worker still has; not items whose delay
    /// has not passed. controller-runtime: `Len`.
    pub fn len(&self) -> usize {
        self.shared.len()
    }

    /// Whether no item is ready.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Entries waiting for their time (superseded entries count until their time passes).
    pub fn waiting_len(&self) -> usize {
        self.shared.waiting_len()
    }

    /// Stops the queue: adds are ignored, delayed items dropped, and every `get` returns
    /// `None` from now on. controller-runtime: `ShutDown`.
    pub fn shutdown(&self) {
        self.shared.shutdown(false);
    }

    /// Stops the queue like [`shutdown`](Self::shutdown), except that `get` still hands out
    /// the items that are ready (none added from now on), then waits until every item handed
    /// out is `done` (or until `shutdown` is called). client-go: `ShutDownWithDrain`
    /// (controller-runtime's just shuts down).
    pub async fn shutdown_with_drain(&self) {
        self.shared.shutdown(true);
        self.shared.wait_drained().await;
    }

    /// Whether `shutdown` or `shutdown_with_drain` was called. controller-runtime:
    /// `ShuttingDown`.
    pub fn is_shutting_down(&self) -> bool {
        self.shared.is_shutting_down()
    }

    /// Each fairness key with ready items that no worker has: how many (summed over the
    /// priorities) and how long its oldest has waited, deepest first. Empty for a queue
    /// without fairness keys. Walks every key under the queue's lock: for a look now and
    /// then (a debug page, a test), not for every item. A named queue times the waits from
    /// the start; an unnamed one from its first call here (an item ready before that call
    /// has waited since it), so that until then its adds read no clock.
    pub fn fairness_depths(&self) -> Vec<FairnessDepth> {
        self.shared.fairness_depths()
    }

    /// The fairness keys of `item` as text (`a / b`; `(none)` for none), `None` for a queue
    /// without fairness keys.
    pub fn fairness_of(&self, item: &T) -> Option<String> {
        self.shared.fairness_of(item)
    }

    /// Records an add for a followed key (see [`crate::trace`]), with its priority.
    #[cold]
    #[inline(never)]
    fn trace_add(&self, item: &T, priority: i32, after: Duration, rate_limited: bool) {
        let Some(key) = crate::trace::item_key(item).filter(|k| crate::trace::is_followed(k))
        else {
            return;
        };
        let status = self.shared.status(item);
        let (stage, detail) = if rate_limited {
            (
                Stage::QueueRateLimited,
                format!(
                    "the rate limiter says wait {after:?} (requeue {})",
                    self.limiter.num_requeues(item)
                ),
            )
        } else if !after.is_zero() {
            (Stage::QueueDelayed, format!("ready in {after:?}"))
        } else {
            match status {
                PriorityItemStatus::Absent | PriorityItemStatus::Waiting(_) => {
                    (Stage::QueueAdded, "into line".to_owned())
                }
                PriorityItemStatus::Ready(p) => (
                    Stage::QueueDeduplicated,
                    format!("already in line at priority {p}: merged"),
                ),
                PriorityItemStatus::Processing => (
                    Stage::QueueWhileProcessing,
                    "a worker has it: queued again at its done".to_owned(),
                ),
            }
        };
        crate::trace::record(key, stage, "", || format!("{detail} (priority {priority})"));
    }
}

#[cfg(test)]
#[path = "priority_queue_tests.rs"]
mod tests;
