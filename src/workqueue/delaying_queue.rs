//! A queue that can add an item later. client-go counterpart: `util/workqueue/delaying_queue.go`
//! (`delayingType[T]`).
//!
//! Behaviour kept from client-go:
//! - `add_after(item, d)` adds now when `d` is zero, otherwise at `now + d`.
//! - An item waiting for its time keeps the earliest ready time asked for; a later
//!   `add_after` with a later time does nothing.
//! - Waiting is independent of the queue proper: an item can wait while it is dirty or being
//!   processed, and is added (with the usual dedup) when its time comes.
//! - `add_after` after shutdown is ignored; shutdown drops the waiting items.
//! - Every `add_after` before shutdown counts in `workqueue_retries_total`.
//!
//! What differs on purpose (a heap under the queue's own lock instead of client-go's goroutine
//! plumbing):
//! - No 1000-slot channel, no waiting-loop goroutine, no 10 s heartbeat. The waiting items are
//!   a binary heap inside the queue's state (`shared.rs`), under the queue's one lock.
//! - One timer task per delaying queue sleeps until the earliest ready time
//!   (`sleep_until(next)`) and is woken early only when an `add_after` brings that time
//!   forward, or on shutdown. It holds a weak reference and ends with the queue.
//! - `get` and `len` also move items whose time has passed, so a busy queue does not wait for
//!   the timer task to be scheduled.
//!
//! Invariant: at most one timer task per queue is alive (`Core::needs_timer`); a new one is
//! spawned, by [`ensure_timer`] only, when none is and the heap is not empty. The priority
//! queue's delays run on the same timer.

use std::future::Future;
use std::hash::Hash;
use std::ops::Deref;
use std::sync::{Arc, Weak};
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use tokio::sync::Notify;

use super::metrics::QueueMetrics;
use super::queue::{Queue, QueueConfig};
use super::shared::{Discipline, Shared};

/// A [`Queue`] that can also add an item after a delay. Derefs to the [`Queue`], as client-go's
/// `TypedDelayingInterface` embeds `TypedInterface`.
///
/// Delays fire from a task on the tokio runtime that is current when the first delayed item
/// is added (or the first `get` parks); construct and use the queue inside a runtime.
///
/// # Examples
/// ```
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// use std::time::Duration;
/// use kubeloop::workqueue::DelayingQueue;
/// let queue = DelayingQueue::new();
/// queue.add_after("default/web", Duration::from_millis(20));
/// assert_eq!(queue.len(), 0);
/// let item = queue.get().await.unwrap(); // about 20 ms later
/// queue.done(&item);
/// # });
/// ```
pub struct DelayingQueue<T> {
    queue: Queue<T>,
    /// `workqueue_retries_total{name}`, for a named queue.
    retries: Option<Counter>,
}

impl<T> Clone for DelayingQueue<T> {
    fn clone(&self) -> Self {
        DelayingQueue {
            queue: self.queue.clone(),
            retries: self.retries.clone(),
        }
    }
}

impl<T> std::fmt::Debug for DelayingQueue<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("DelayingQueue").field(&self.queue).finish()
    }
}

impl<T> Deref for DelayingQueue<T> {
    type Target = Queue<T>;

    fn deref(&self) -> &Queue<T> {
        &self.queue
    }
}

impl<T: Hash + Eq + Clone + Send + Sync + 'static> Default for DelayingQueue<T> {
    fn default() -> Self {
        DelayingQueue::new()
    }
}

impl<T: Hash + Eq + Clone + Send + Sync + 'static> DelayingQueue<T> {
    /// An unnamed delaying queue (no metrics). client-go: `NewTypedDelayingQueue`.
    pub fn new() -> Self {
        DelayingQueue::with_config(QueueConfig::default())
    }

    /// client-go: `NewTypedDelayingQueueWithConfig`.
    pub fn with_config(config: QueueConfig) -> Self {
        let retries = QueueMetrics::retries_for(config.metrics_provider.as_ref(), &config.name);
        DelayingQueue {
            queue: Queue::with_config(config),
            retries,
        }
    }

    /// Adds `item` once `delay` has passed; a zero delay adds it now. If the item is already
    /// waiting, the earlier of the two times wins. Ignored after shutdown. client-go: `AddAfter`.
    pub fn add_after(&self, item: T, delay: Duration) {
        if crate::trace::on() && !delay.is_zero() {
            if let Some(key) = crate::trace::item_key(&item) {
                crate::trace::record(key, crate::trace::Stage::QueueDelayed, "", || {
                    format!("ready in {delay:?}")
                });
            }
        }
        self.add_after_untraced(item, delay);
    }

    /// [`add_after`](Self::add_after) without its trace step (the rate-limiting queue
    /// records its own).
    pub(crate) fn add_after_untraced(&self, item: T, delay: Duration) {
        if delay.is_zero() {
            if self.queue.is_shutting_down() {
                return;
            }
            self.count_retry();
            self.queue.add(item);
            return;
        }
        let shared = &self.queue.shared;
        let Some(earliest) = shared.add_after(item, delay, ensure_timer) else {
            return; // shutting down
        };
        self.count_retry();
        if earliest {
            shared.timer.notify_one();
        }
    }

    /// Like [`Queue::get`], and starts the timer task if delayed items wait and none is alive
    /// (for items added outside a runtime, or on a runtime that has gone).
    ///
    /// # Cancel safety
    /// Cancel safe, as [`Queue::get`].
    pub fn get(&self) -> impl Future<Output = Option<T>> + Send + '_ {
        self.queue.shared.get(Some(ensure_timer))
    }

    /// Entries waiting for their time. An item whose time an earlier `add_after` brought
    /// forward counts twice until its old time passes (superseded entries are dropped lazily).
    pub fn waiting_len(&self) -> usize {
        self.queue.shared.waiting_len()
    }

    fn count_retry(&self) {
        if let Some(retries) = &self.retries {
            retries.inc();
        }
    }
}

/// Starts the timer task if the delaying heap has entries, none is alive, and a tokio runtime
/// is current: this queue's and the priority queue's. Without a runtime, waiting items still
/// move on the next `get` or `len`, and the next `get` that parks starts the task.
pub(super) fn ensure_timer<S: Discipline<Filter: Send + Sync> + Send + 'static>(
    shared: &Arc<Shared<S>>,
    state: &mut S,
) {
    if !state.core().needs_timer() {
        return;
    }
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let timer = run_timer(Arc::downgrade(shared), Arc::clone(&shared.timer));
    state.core_mut().set_timer(runtime.spawn(timer));
}

/// Sleeps until the earliest ready time, moves what is ready, repeats. Ends when the queue
/// shuts down or every handle to it is dropped.
async fn run_timer<S: Discipline>(queue: Weak<Shared<S>>, wake: Arc<Notify>) {
    loop {
        let next = {
            let Some(shared) = queue.upgrade() else {
                return;
            };
            let Some(next) = shared.promote_ready() else {
                return; // shutting down
            };
            next
        };
        match next {
            Some(at) => {
                tokio::select! {
                    _ = tokio::time::sleep_until(at) => {}
                    _ = wake.notified() => {}
                }
            }
            None => wake.notified().await,
        }
    }
}

#[cfg(test)]
mod tests {
    use tokio::time::Instant;

    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    // client-go: TestSimpleQueue
    #[tokio::test(start_paused = true)]
    async fn item_is_added_after_its_delay_and_not_again() {
        let q = DelayingQueue::new();
        q.add_after("foo", ms(50));
        assert_eq!(q.len(), 0, "should not have added");
        tokio::time::advance(ms(49)).await;
        assert_eq!(q.len(), 0, "one millisecond early");
        tokio::time::advance(ms(11)).await;
        assert_eq!(q.len(), 1, "should have added");
        let item = q.get().await.unwrap();
        q.done(&item);
        // Step past what was client-go's heartbeat: nothing comes back.
        tokio::time::advance(Duration::from_secs(10)).await;
        assert_eq!(q.len(), 0, "should not have added again");
        assert_eq!(q.waiting_len(), 0);
    }

    // client-go: TestDeduping
    #[tokio::test(start_paused = true)]
    async fn earliest_ready_time_wins() {
        let q = DelayingQueue::new();
        q.add_after("foo", ms(50));
        q.add_after("foo", ms(70));
        assert_eq!(q.len(), 0);
        tokio::time::advance(ms(60)).await;
        assert_eq!(q.len(), 1);
        let item = q.get().await.unwrap();
        q.done(&item);
        tokio::time::advance(ms(20)).await;
        assert_eq!(q.len(), 0, "the later time was dropped, not kept");

        // This time the earlier add comes second and overrides.
        q.add_after("foo", ms(50));
        q.add_after("foo", ms(30));
        assert_eq!(q.len(), 0);
        tokio::time::advance(ms(40)).await;
        assert_eq!(q.len(), 1);
        let item = q.get().await.unwrap();
        q.done(&item);
        tokio::time::advance(ms(20)).await;
        assert_eq!(
            q.len(),
            0,
            "the superseded 50 ms entry must not add it again"
        );
    }

    // client-go: TestAddTwoFireEarly
    #[tokio::test(start_paused = true)]
    async fn earlier_item_fires_first_and_later_adds_keep_their_time() {
        let q = DelayingQueue::new();
        q.add_after("foo", Duration::from_secs(1));
        q.add_after("bar", ms(50));
        assert_eq!(q.len(), 0);
        tokio::time::advance(ms(60)).await;
        assert_eq!(q.len(), 1);
        assert_eq!(q.get().await, Some("bar"));
        q.add_after("baz", Duration::from_secs(2));
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(q.len(), 1);
        assert_eq!(q.get().await, Some("foo"));
        tokio::time::advance(Duration::from_secs(2)).await;
        assert_eq!(q.len(), 1);
        assert_eq!(q.get().await, Some("baz"));
    }

    // client-go: TestCopyShifting
    #[tokio::test(start_paused = true)]
    async fn items_come_out_in_ready_time_order() {
        let q = DelayingQueue::new();
        q.add_after("foo", Duration::from_secs(1));
        q.add_after("bar", ms(500));
        q.add_after("baz", ms(250));
        assert_eq!(q.len(), 0);
        tokio::time::advance(Duration::from_secs(2)).await;
        assert_eq!(q.len(), 3);
        assert_eq!(q.get().await, Some("baz"));
        assert_eq!(q.get().await, Some("bar"));
        assert_eq!(q.get().await, Some("foo"));
    }

    #[tokio::test(start_paused = true)]
    async fn a_blocked_get_wakes_at_the_ready_time() {
        let q = DelayingQueue::new();
        let start = Instant::now();
        q.add_after("foo", ms(250));
        assert_eq!(q.get().await, Some("foo"));
        assert_eq!(
            start.elapsed(),
            ms(250),
            "woken exactly at the ready time (paused clock)"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_earlier_add_after_rearms_a_sleeping_timer() {
        let q = DelayingQueue::new();
        let start = Instant::now();
        q.add_after("late", Duration::from_secs(60));
        let q2 = q.clone();
        let getter = tokio::spawn(async move { q2.get().await });
        tokio::time::sleep(ms(10)).await;
        q.add_after("early", ms(40));
        assert_eq!(getter.await.unwrap(), Some("early"));
        assert_eq!(start.elapsed(), ms(50));
    }

    #[tokio::test(start_paused = true)]
    async fn zero_delay_adds_now() {
        let q = DelayingQueue::new();
        q.add_after(1, Duration::ZERO);
        assert_eq!(q.len(), 1);
        assert_eq!(q.waiting_len(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn waiting_item_being_processed_is_requeued_after_done() {
        let q = DelayingQueue::new();
        q.add("foo");
        let item = q.get().await.unwrap();
        q.add_after("foo", ms(10));
        tokio::time::advance(ms(20)).await;
        assert_eq!(q.len(), 0, "processing: only marked dirty");
        q.done(&item);
        assert_eq!(q.len(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn shutdown_drops_waiting_items_and_ignores_new_ones() {
        let q = DelayingQueue::new();
        q.add_after("foo", ms(10));
        q.shutdown();
        q.add_after("bar", ms(10));
        q.add_after("baz", Duration::ZERO);
        tokio::time::advance(ms(50)).await;
        assert_eq!(q.len(), 0);
        assert_eq!(q.get().await, None);
        assert!(
            q.shared.inspect(|s| s.core().tracked() == 0),
            "dropped items are forgotten"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn timer_task_ends_when_the_queue_is_dropped() {
        let q = DelayingQueue::new();
        q.add_after("foo", Duration::from_secs(3600));
        let weak = Arc::downgrade(&q.queue.shared);
        drop(q);
        tokio::time::sleep(ms(1)).await;
        assert!(
            weak.upgrade().is_none(),
            "the timer task must not keep the queue alive"
        );
    }

    #[test]
    fn a_new_runtime_gets_a_new_timer_when_the_old_one_is_gone() {
        let q: DelayingQueue<&str> = DelayingQueue::new();
        let first = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        first.block_on(async { q.add_after("early", Duration::from_secs(3600)) });
        drop(first); // the timer task dies with its runtime
        let second = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let got = second.block_on(async {
            q.add_after("soon", ms(5));
            tokio::time::timeout(Duration::from_secs(30), q.get()).await
        });
        assert_eq!(
            got,
            Ok(Some("soon")),
            "a blocked get must be woken by a live timer"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn huge_delay_does_not_panic() {
        let q = DelayingQueue::new();
        q.add_after("foo", Duration::MAX);
        assert_eq!(q.waiting_len(), 1);
        assert_eq!(q.len(), 0);
    }

    /// Producers mix `add` and `add_after` (0-2 ms), workers cancel their `get` at random
    /// (timeouts) and re-add what they process, all on 4 threads. Every key must be processed
    /// after its last add, never by two workers at once, and the queue must end empty.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn stress_delayed_adds_cancelled_gets_and_drain() {
        use std::collections::HashMap as StdHashMap;
        use std::sync::atomic::{AtomicUsize, Ordering};

        use parking_lot::Mutex;

        const KEYS: u32 = 64;
        for round in 0..3u64 {
            let q: DelayingQueue<u32> = DelayingQueue::new();
            let in_flight: Arc<Vec<AtomicUsize>> =
                Arc::new((0..KEYS).map(|_| AtomicUsize::new(0)).collect());
            // key -> processed since its last add
            let fresh: Arc<Mutex<StdHashMap<u32, bool>>> = Arc::default();
            let mut workers = Vec::new();
            for w in 0..8u64 {
                let (q, in_flight, fresh) = (q.clone(), in_flight.clone(), fresh.clone());
                workers.push(tokio::spawn(async move {
                    let mut seed = round * 1000 + w;
                    loop {
                        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
                        let patience = Duration::from_micros(50 + (seed >> 33) % 500);
                        let item = match tokio::time::timeout(patience, q.get()).await {
                            Err(_) => continue, // cancelled get
                            Ok(None) => return,
                            Ok(Some(item)) => item,
                        };
                        let prev = in_flight[item as usize].fetch_add(1, Ordering::SeqCst);
                        assert_eq!(prev, 0, "key {item} handed to two workers at once");
                        fresh.lock().insert(item, true);
                        if (seed >> 40) % 5 == 0 {
                            q.add_after(item, Duration::from_micros((seed >> 20) % 300));
                        }
                        tokio::task::yield_now().await;
                        in_flight[item as usize].fetch_sub(1, Ordering::SeqCst);
                        q.done(&item);
                    }
                }));
            }
            let mut producers = Vec::new();
            for p in 0..6u64 {
                let (q, fresh) = (q.clone(), fresh.clone());
                producers.push(tokio::spawn(async move {
                    let mut seed = round * 77 + p;
                    for _ in 0..2_000 {
                        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(3);
                        let key = ((seed >> 33) % KEYS as u64) as u32;
                        fresh.lock().insert(key, false);
                        match (seed >> 50) % 3 {
                            0 => q.add(key),
                            1 => q.add_after(key, Duration::ZERO),
                            _ => q.add_after(key, Duration::from_micros((seed >> 24) % 2_000)),
                        }
                        if (seed >> 45) % 8 == 0 {
                            tokio::task::yield_now().await;
                        }
                    }
                }));
            }
            for p in producers {
                p.await.unwrap();
            }
            // Let every delay expire and the line empty, then drain what is in flight.
            while q.waiting_len() > 0 || !q.is_empty() {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            q.shutdown_with_drain().await;
            for w in workers {
                w.await.unwrap();
            }
            let fresh = fresh.lock();
            assert_eq!(fresh.len(), KEYS as usize);
            assert!(
                fresh.values().all(|&done| done),
                "a key was not processed after its last add"
            );
            q.shared.inspect(|s| {
                assert!(s.core().tracked() == 0, "{} items left", s.core().tracked());
                assert_eq!((s.core().parked(), s.core().processing()), (0, 0));
            });
        }
    }

    // client-go: BenchmarkDelayingQueue_AddAfter, as a correctness check at 10k items.
    #[tokio::test(start_paused = true)]
    async fn ten_thousand_random_delays_all_arrive_in_time_order() {
        let q = DelayingQueue::new();
        let mut seed: u64 = 42;
        for n in 0..10_000u32 {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            q.add_after(n, Duration::from_millis(1 + (seed >> 33) % 600_000));
        }
        tokio::time::advance(Duration::from_secs(11 * 60)).await;
        assert_eq!(q.len(), 10_000);
        let mut got = std::collections::HashSet::new();
        for _ in 0..10_000 {
            let item = q.get().await.unwrap();
            q.done(&item);
            assert!(got.insert(item));
        }
        assert_eq!(q.len(), 0);
    }
}
