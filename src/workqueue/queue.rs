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
//! - This file is a face: the state and every transition under the queue's one lock live in
//!   `shared.rs` and `state.rs` (one slot per item with its flags and metric timestamps, instead of
//!   client-go's `dirty` and `processing` sets plus two timestamp maps; two hashes and one
//!   clone of the key per add, get, done round).
//! - `get` is async: an empty queue parks the task in the queue's own list of waiters, under
//!   the same lock, instead of a condition variable; an add wakes one parked `get`, and only
//!   when one is parked.
//! - `done` of an item that is not being processed is ignored; client-go would queue a dirty
//!   item a second time.
//! - No pluggable `Queue` backend (client-go's `Touch`/`Push`/`Pop` interface): FIFO only.
//! - A plain queue has no timer: only the delaying face (`delaying_queue.rs`) starts one.

use std::fmt;
use std::future::Future;
use std::hash::Hash;
use std::sync::Arc;

use super::metrics::{MetricsProvider, QueueMetrics};
use super::shared::{Hooks, Shared};
use super::state::{ItemStatus, State};
use crate::trace::Stage;

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
    pub(super) shared: Arc<Shared<State<T>>>,
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
        self.shared.inspect(|state| state.fmt(f))
    }
}

impl<T: Hash + Eq + Clone + Send + Sync + 'static> Default for Queue<T> {
    fn default() -> Self {
        Queue::new()
    }
}

impl<T: Hash + Eq + Clone + Send + Sync + 'static> Queue<T> {
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
        let named = metrics.is_some();
        let hooks = metrics.map(|m| Box::new(m) as Box<dyn Hooks>);
        let shared = Arc::new(Shared::new(State::new(), hooks));
        if named {
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
        if crate::trace::on() {
            self.trace_add(&item);
        }
        self.shared.add(item);
    }

    /// [`add`](Self::add) for a caller that keeps its key: the queue clones `item` only when
    /// it must keep a copy (a key it does not track yet, or once when it publishes a queued
    /// key for adds without the lock). An add of a key already in line then costs no clone,
    /// and no lock (see `state.rs`); with `add(key.clone())` every add pays a clone and a
    /// drop, an allocation for a `String`. Rust's counterpart of Go's `Add(key)`, which
    /// copies a string header and never the text.
    pub fn add_ref(&self, item: &T) {
        if crate::trace::on() {
            self.trace_add(item);
        }
        self.shared.add_ref(item);
    }

    /// Records an add for a process that follows keys (see [`crate::trace`]): whether the key
    /// goes into line, is merged with a queued one, or waits for its worker's `done`. Called
    /// before the add (a worker woken by it records its take right away) and with a borrow,
    /// so the untraced path moves `item` exactly as before.
    #[cold]
    #[inline(never)]
    fn trace_add(&self, item: &T) {
        let Some(key) = crate::trace::item_key(item).filter(|k| crate::trace::is_followed(k))
        else {
            return;
        };
        let (stage, detail) = match self.shared.status(item) {
            ItemStatus::Absent | ItemStatus::Waiting => (Stage::QueueAdded, "into line"),
            ItemStatus::Queued => (Stage::QueueDeduplicated, "already in line: merged"),
            ItemStatus::Processing => (
                Stage::QueueWhileProcessing,
                "a worker has it: queued again at its done",
            ),
        };
        let ahead = self.shared.len();
        crate::trace::record(key, stage, "", || {
            format!("{detail} ({ahead} keys in line before)")
        });
    }

    /// The number of items waiting to be handed out (not counting items being processed or
    /// delayed items whose time has not come). For information only. client-go: `Len`.
    pub fn len(&self) -> usize {
        self.shared.len()
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
    pub fn get(&self) -> impl Future<Output = Option<T>> + Send + '_ {
        self.shared.get(None)
    }

    /// Marks `item` as done processing; if it was added again meanwhile, it goes back in line.
    /// Ignored for an item that is not being processed. client-go: `Done`.
    pub fn done(&self, item: &T) {
        self.shared.done(item);
    }

    /// Stops the queue: new adds are ignored, delayed items are dropped, and `get` returns
    /// `None` once the remaining items are handed out. Wakes every parked `get` and stops a
    /// `shutdown_with_drain` wait. client-go: `ShutDown`.
    pub fn shutdown(&self) {
        self.shared.shutdown(false);
    }

    /// Like [`shutdown`](Self::shutdown), then waits until every item being processed is
    /// `done` (or until `shutdown` is called). Workers must keep calling `done`.
    /// client-go: `ShutDownWithDrain`.
    pub async fn shutdown_with_drain(&self) {
        self.shared.shutdown(true);
        self.shared.wait_drained().await;
    }

    /// Whether `shutdown` or `shutdown_with_drain` was called. client-go: `ShuttingDown`.
    pub fn is_shutting_down(&self) -> bool {
        self.shared.is_shutting_down()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap as StdHashMap;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use parking_lot::Mutex;

    use super::*;
    use crate::workqueue::shared::Discipline;

    /// The slot arena and the delaying heap grow fourfold: each time an add finds one full,
    /// it makes room for four times its length (doubling grows twice as often and copies
    /// three times as much, every copy into pages the process has not touched yet).
    #[test]
    fn the_slot_arena_and_the_delaying_heap_grow_fourfold() {
        use crate::workqueue::shared::Core;
        let mut core = Core::<usize, ()>::new();
        let at = core.now();
        let mut growths = 0;
        for k in 0..10_000 {
            let before = (core.slots.capacity(), core.waiting_capacity());
            let (i, _) = core.slot_for(k as u64, k);
            core.wait_until(i, at);
            let after = (core.slots.capacity(), core.waiting_capacity());
            if k > 0 && after != before {
                assert_eq!(after, (4 * k, 4 * k), "grew at length {k}");
                growths += 1;
            }
        }
        assert_eq!(growths, 6, "from room for 4 to room for 16384");
    }

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

    // kubeloop's own (issue 53): a duplicate add publishes its key, and adds of it return
    // without the lock while, and only while, it is dirty: through a get, re-adds while
    // processing, done, and its slot freed and the key tracked anew.
    #[tokio::test]
    async fn a_published_key_is_merged_without_the_lock_only_while_dirty() {
        let q = Queue::new();
        let unlocked = |q: &Queue<u32>| q.shared.filter.holds_dirty(q.shared.hash(&1), &1);
        q.add(1u32);
        assert!(!unlocked(&q), "a first add publishes nothing");
        q.add(1);
        assert!(unlocked(&q), "a duplicate publishes the key");
        q.add(1);
        assert_eq!(q.len(), 1);
        let one = q.get().await.unwrap();
        assert!(!unlocked(&q), "taken by get: not dirty");
        q.add(1);
        assert!(unlocked(&q), "added while processing: dirty again");
        q.add(1);
        q.done(&one);
        assert_eq!(q.len(), 1, "back in line once");
        let again = q.get().await.unwrap();
        q.done(&again);
        assert!(q.shared.inspect(|s| s.core().tracked() == 0));
        assert!(!unlocked(&q), "forgotten: its entry says not dirty");
        q.add(1);
        assert_eq!(q.len(), 1, "tracked anew");
        assert!(!unlocked(&q), "a new slot keeps no old entry");
        q.add(2);
        q.add(2);
        assert!(q.shared.filter.holds_dirty(q.shared.hash(&2), &2));
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
            q.shared.inspect(|s| s.core().tracked() == 0),
            "finished items are forgotten"
        );
    }

    /// A key that counts its clones.
    #[derive(Debug, PartialEq, Eq, Hash)]
    struct Counted(&'static str);

    static CLONES: AtomicUsize = AtomicUsize::new(0);

    impl Clone for Counted {
        fn clone(&self) -> Self {
            CLONES.fetch_add(1, Ordering::Relaxed);
            Counted(self.0)
        }
    }

    #[tokio::test]
    async fn add_ref_clones_a_key_only_when_the_queue_keeps_it() {
        let clones = || CLONES.load(Ordering::Relaxed);
        let q = Queue::new();
        let key = Counted("a");
        q.add_ref(&key);
        assert_eq!(clones(), 1, "a new key is kept: one clone");
        q.add_ref(&key); // in line: merged under the lock, and published (a second clone)
        assert_eq!(clones(), 2);
        for _ in 0..3 {
            q.add_ref(&key);
        }
        assert_eq!(clones(), 2, "adds of a key in line clone nothing");
        let item = q.get().await.unwrap(); // `get` hands out a clone
        assert_eq!(clones(), 3);
        q.add_ref(&key); // processing: dirty again, with the slot's own copy
        assert_eq!(clones(), 3);
        q.done(&item);
        assert_eq!(q.len(), 1, "an add_ref while processing comes back at done");
        let again = q.get().await.unwrap();
        q.done(&again);
        assert_eq!(q.len(), 0);
        assert!(q.shared.inspect(|s| s.core().tracked() == 0));
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
        assert_eq!(q.shared.inspect(|s| s.core().parked()), 8);
        assert!(getters.iter().all(|g| !g.is_finished()));
        q.shutdown();
        for g in getters {
            assert_eq!(g.await.unwrap(), None);
        }
        assert_eq!(q.shared.inspect(|s| s.core().parked()), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_cancelled_get_does_not_swallow_an_item() {
        let q: Queue<u32> = Queue::new();
        let cancelled = tokio::time::timeout(Duration::from_millis(5), q.get()).await;
        assert!(cancelled.is_err());
        assert_eq!(
            q.shared.inspect(|s| s.core().parked()),
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
        q.shared.inspect(|s| {
            assert_eq!(s.core().parked(), 0, "every parked get was woken");
            assert_eq!(
                s.core().wakeups(),
                4,
                "one wake-up per parked get, not per add"
            );
        });
        let mut got: Vec<u32> = Vec::new();
        for g in getters {
            got.push(g.await.unwrap().unwrap());
        }
        got.sort();
        assert_eq!(got, vec![0, 1, 2, 3]);
        q.shared.inspect(|s| {
            assert_eq!((s.core().parked(), s.core().wakeups()), (0, 4));
            assert_eq!(s.line_len(), 6);
        });
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
            while !q.is_empty() || q.shared.inspect(|s| s.core().processing()) > 0 {
                tokio::task::yield_now().await;
            }
            q.shutdown();
        }
        for t in worker_tasks {
            t.await.unwrap();
        }
        assert_eq!(q.len(), 0);
        q.shared.inspect(|s| {
            assert_eq!(s.core().processing(), 0);
            assert!(
                s.core().tracked() == 0,
                "queue ends empty, left {}",
                s.core().tracked()
            );
            assert_eq!(s.core().parked(), 0);
        });
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
        q.shared.inspect(|s| {
            assert_eq!(s.core().processing(), 0);
            assert!(s.core().tracked() == 0);
        });
        assert!(handled.load(Ordering::Relaxed) > 0);
    }
}
